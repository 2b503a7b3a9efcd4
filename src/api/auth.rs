//! The optional bearer token: every FleetStatus call must carry
//! `authorization: Bearer <token>` when the server has one. The token can
//! be replaced while the server runs (see `reload`).

use std::sync::{Arc, RwLock};

use subtle::ConstantTimeEq;
use tonic::service::Interceptor;
use tonic::{Request, Status};

/// SHA-256 of a token. Comparing digests of equal length in constant time
/// reveals neither a prefix nor the token's length.
type Digest = [u8; 32];

fn digest(token: &[u8]) -> Digest {
    let d = ring::digest::digest(&ring::digest::SHA256, token);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// The token the server accepts now; shared with the reloader.
#[derive(Clone, Default)]
pub struct BearerToken(Arc<RwLock<Option<Digest>>>);

impl BearerToken {
    pub fn new(token: Option<&str>) -> Self {
        let t = BearerToken::default();
        t.set(token);
        t
    }

    /// Replaces the accepted token; calls already admitted are unaffected.
    pub fn set(&self, token: Option<&str>) {
        let d = token.map(|t| digest(t.trim().as_bytes()));
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = d;
    }

    fn want(&self) -> Option<Digest> {
        *self.0.read().unwrap_or_else(|e| e.into_inner())
    }
}

/// The credentials of an `authorization` value with the `Bearer` scheme,
/// which RFC 9110 makes case-insensitive.
fn bearer(value: &str) -> Option<&str> {
    let (scheme, rest) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| rest.trim_start_matches(' '))
}

impl Interceptor for BearerToken {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(want) = self.want() else {
            return Ok(request);
        };
        let got = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(bearer);
        match got {
            Some(token) if bool::from(digest(token.as_bytes()).ct_eq(&want)) => Ok(request),
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
    fn a_replaced_token_takes_effect_at_once() {
        let mut t = BearerToken::new(Some("old"));
        let mut shared = t.clone();
        t.set(Some("new"));
        assert!(shared.call(with(Some("Bearer old"))).is_err());
        assert!(shared.call(with(Some("Bearer new"))).is_ok());
        assert!(t.call(with(Some("Bearer new"))).is_ok());
    }
}
