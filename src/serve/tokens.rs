//! The static bearer tokens (read and write), replaceable while the
//! server runs (`tls::watch_files` reloads them), for the gRPC API and the
//! dashboard alike.

use std::sync::{Arc, RwLock};

use subtle::ConstantTimeEq;
use tokio::sync::watch;
use tonic::Request;

pub use crate::domain::digest::Digest;
use crate::domain::digest::sha256 as digest;

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

/// The credentials of an `authorization` value with the `Bearer` scheme,
/// which RFC 9110 makes case-insensitive.
pub fn bearer(value: &str) -> Option<&str> {
    let (scheme, rest) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| rest.trim_start_matches(' '))
}
