//! The optional bearer token: every FleetStatus call must carry
//! `authorization: Bearer <token>` when the server has one.

use std::sync::Arc;

use tonic::service::Interceptor;
use tonic::{Request, Status};

#[derive(Clone, Default)]
pub struct BearerToken(Option<Arc<[u8]>>);

impl BearerToken {
    pub fn new(token: Option<&str>) -> Self {
        BearerToken(token.map(|t| Arc::from(t.trim().as_bytes())))
    }
}

/// Compares without returning early, so timing does not reveal a prefix.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Interceptor for BearerToken {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(want) = &self.0 else {
            return Ok(request);
        };
        let got = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match got {
            Some(token) if same(token.as_bytes(), want) => Ok(request),
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
        assert!(guarded.call(with(Some("Bearer s3cret"))).is_ok());
        for bad in [
            None,
            Some("Bearer nope"),
            Some("s3cret"),
            Some("Bearer s3cret2"),
        ] {
            let err = guarded.call(with(bad)).unwrap_err();
            assert_eq!(err.code(), tonic::Code::Unauthenticated, "{bad:?}");
        }
    }
}
