//! The optional bearer token: every FleetStatus call must carry
//! `authorization: Bearer <token>` when the server has one. The token can
//! be replaced while the server runs (see `reload`).

use std::sync::{Arc, RwLock};

use subtle::ConstantTimeEq;
use tokio::sync::watch;
use tonic::service::Interceptor;
use tonic::{Request, Status};

/// SHA-256 of a token. Comparing digests of equal length in constant time
/// reveals neither a prefix nor the token's length.
pub type Digest = [u8; 32];

fn digest(token: &[u8]) -> Digest {
    let d = ring::digest::digest(&ring::digest::SHA256, token);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// The token the server accepts now; shared with the reloader.
#[derive(Clone)]
pub struct BearerToken(Arc<Inner>);

struct Inner {
    want: RwLock<Option<Digest>>,
    /// Counts replacements, so what the old token admitted (a session, an
    /// open stream) can end when it changes.
    changed: watch::Sender<u64>,
}

impl BearerToken {
    pub fn new(token: Option<&str>) -> Self {
        let t = BearerToken(Arc::new(Inner {
            want: RwLock::new(None),
            changed: watch::Sender::new(0),
        }));
        t.set(token);
        t
    }

    /// Replaces the accepted token. Calls already admitted are unaffected;
    /// streams that follow `subscribe` end.
    pub fn set(&self, token: Option<&str>) {
        let d = token.map(|t| digest(t.trim().as_bytes()));
        let mut want = self.0.want.write().unwrap_or_else(|e| e.into_inner());
        if *want != d {
            *want = d;
            self.0.changed.send_modify(|n| *n += 1);
        }
    }

    /// Changes each time a different token takes effect.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.0.changed.subscribe()
    }

    fn want(&self) -> Option<Digest> {
        *self.0.want.read().unwrap_or_else(|e| e.into_inner())
    }

    /// A short, non-secret name for the token in force (the first bytes of
    /// its digest's digest), to tell callers apart in logs and caps.
    pub fn fingerprint(token: &str) -> String {
        let d = digest(&digest(token.trim().as_bytes()));
        d[..6].iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn configured(&self) -> bool {
        self.want().is_some()
    }

    /// Whether `token` is the one in force (never, when none is set).
    pub fn accepts(&self, token: &str) -> bool {
        self.want()
            .is_some_and(|want| bool::from(digest(token.trim().as_bytes()).ct_eq(&want)))
    }

    /// A value bound to the token in force and to `purpose`: HMAC-SHA256
    /// keyed by the token's digest. It changes when the token does, and
    /// reveals nothing of it.
    pub fn derive(&self, purpose: &str) -> Option<Digest> {
        let want = self.want()?;
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &want);
        let tag = ring::hmac::sign(&key, purpose.as_bytes());
        let mut out = [0u8; 32];
        out.copy_from_slice(tag.as_ref());
        Some(out)
    }

    /// Whether the request carries this token (never, when none is set).
    pub fn admits<T>(&self, request: &Request<T>) -> bool {
        request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(bearer)
            .is_some_and(|t| self.accepts(t))
    }
}

/// FleetRollouts: reads take the read token or the write token.
#[derive(Clone)]
pub struct ReadOrWrite {
    pub read: BearerToken,
    pub write: BearerToken,
}

impl Interceptor for ReadOrWrite {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        if self.write.admits(&request) {
            return Ok(request);
        }
        self.read.call(request)
    }
}

/// Mutations need the write token; the read token is not enough.
pub fn require_write<T>(write: &BearerToken, request: &Request<T>) -> Result<(), Status> {
    if !write.configured() {
        return Err(Status::permission_denied(
            "this server takes no rollout mutations: it has no write token (--grpc-write-token-file)",
        ));
    }
    if write.admits(request) {
        Ok(())
    } else {
        Err(Status::permission_denied(
            "this call changes a rollout and needs the write token",
        ))
    }
}

/// The credentials of an `authorization` value with the `Bearer` scheme,
/// which RFC 9110 makes case-insensitive.
pub fn bearer(value: &str) -> Option<&str> {
    let (scheme, rest) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| rest.trim_start_matches(' '))
}

impl Interceptor for BearerToken {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        if !self.configured() {
            return Ok(request);
        }
        let got = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(bearer);
        match got {
            // The same comparison as `accepts`, so every door trims alike.
            Some(token) if self.accepts(token) => Ok(request),
            Some(_) => Err(Status::unauthenticated("the bearer token is not valid")),
            None => Err(Status::unauthenticated(
                "a bearer token is required (authorization: Bearer <token>)",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(header: Option<&str>) -> Request<()> {
        let mut r = Request::new(());
        if let Some(h) = header {
            r.metadata_mut().insert("authorization", h.parse().unwrap());
        }
        r
    }

    #[test]
    fn tokens_are_required_only_when_configured() {
        let mut open = BearerToken::new(None);
        assert!(open.call(with(None)).is_ok());
        let mut guarded = BearerToken::new(Some("s3cret\n"));
        for good in ["Bearer s3cret", "bearer s3cret", "BEARER s3cret"] {
            assert!(guarded.call(with(Some(good))).is_ok(), "{good}");
        }
        for bad in [
            None,
            Some("Bearer nope"),
            Some("s3cret"),
            Some("Bearer s3cret2"),
            Some("Bearers3cret"),
            Some("Basic s3cret"),
        ] {
            let err = guarded.call(with(bad)).unwrap_err();
            assert_eq!(err.code(), tonic::Code::Unauthenticated, "{bad:?}");
        }
    }

    #[test]
    fn mutations_need_the_write_token_and_reads_take_either() {
        let read = BearerToken::new(Some("reader"));
        let write = BearerToken::new(Some("writer"));
        let mut either = ReadOrWrite {
            read: read.clone(),
            write: write.clone(),
        };
        assert!(either.call(with(Some("Bearer reader"))).is_ok());
        assert!(either.call(with(Some("Bearer writer"))).is_ok());
        assert!(either.call(with(Some("Bearer other"))).is_err());
        let denied = require_write(&write, &with(Some("Bearer reader"))).unwrap_err();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied);
        assert!(require_write(&write, &with(Some("Bearer writer"))).is_ok());
        let none =
            require_write(&BearerToken::new(None), &with(Some("Bearer writer"))).unwrap_err();
        assert_eq!(none.code(), tonic::Code::PermissionDenied);
        assert!(none.message().contains("--grpc-write-token-file"));
    }

    #[test]
    fn a_replaced_token_takes_effect_at_once() {
        let mut t = BearerToken::new(Some("old"));
        let mut shared = t.clone();
        t.set(Some("new"));
        assert!(shared.call(with(Some("Bearer old"))).is_err());
        assert!(shared.call(with(Some("Bearer new"))).is_ok());
        assert!(t.call(with(Some("Bearer new"))).is_ok());
    }

    #[test]
    fn only_a_different_token_counts_as_a_change() {
        let t = BearerToken::new(Some("old"));
        let rx = t.subscribe();
        t.set(Some("old\n"));
        assert!(!rx.has_changed().unwrap(), "the same token, trimmed");
        t.set(Some("new"));
        assert!(rx.has_changed().unwrap());
    }

    #[test]
    fn every_door_trims_alike() {
        let mut t = BearerToken::new(Some("tok"));
        assert!(t.accepts("tok "));
        assert!(t.admits(&with(Some("Bearer tok "))));
        assert!(t.call(with(Some("Bearer tok "))).is_ok());
    }
}
