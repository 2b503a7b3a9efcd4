//! The interceptor that picks each call's door among the static bearer
//! tokens (`serve::tokens`), the home cluster's TokenReview and a client
//! certificate (`authz::doors`).

use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::authz::doors::{self, Door, Setup};
pub use crate::serve::tokens::{BearerToken, bearer};

/// Chooses each call's door (`authz::doors`) and leaves it on the
/// request, for the service to finish: a token for the home cluster to
/// judge is reviewed there, in the call, not in this synchronous hook.
#[derive(Clone)]
pub struct Doors {
    pub read: BearerToken,
    pub write: BearerToken,
    /// `--grpc-kube-auth`: other bearer tokens go to a TokenReview.
    pub kube: bool,
    /// Every connection carries a certificate the client CA signed.
    pub client_certs: bool,
}

impl Doors {
    fn door<T>(&self, request: &Request<T>) -> Result<Door, Status> {
        let token = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(bearer)
            .map(str::trim);
        // The same comparison as `accepts`, so every door trims alike.
        let door = doors::choose(
            token,
            token.is_some_and(|t| self.read.accepts(t)),
            token.is_some_and(|t| self.write.accepts(t)),
            Setup {
                read_token: self.read.configured(),
                kube: self.kube,
                client_certs: self.client_certs,
            },
        )?;
        Ok(door)
    }
}

impl Interceptor for Doors {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let door = self.door(&request)?;
        request.extensions_mut().insert(door);
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authz::access::Caller;

    fn with(header: Option<&str>) -> Request<()> {
        let mut r = Request::new(());
        if let Some(h) = header {
            r.metadata_mut().insert("authorization", h.parse().unwrap());
        }
        r
    }

    fn doors(read: Option<&str>, write: Option<&str>) -> Doors {
        Doors {
            read: BearerToken::new(read),
            write: BearerToken::new(write),
            kube: false,
            client_certs: false,
        }
    }

    fn caller(d: &mut Doors, header: Option<&str>) -> Result<Caller, tonic::Code> {
        match d.call(with(header)) {
            Ok(r) => match r.extensions().get::<Door>() {
                Some(Door::Decided(c)) => Ok(c.clone()),
                other => panic!("{other:?}"),
            },
            Err(s) => Err(s.code()),
        }
    }

    #[test]
    fn tokens_are_required_only_when_configured() {
        let mut open = doors(None, None);
        assert_eq!(caller(&mut open, None), Ok(Caller::Open));
        let mut guarded = doors(Some("s3cret\n"), None);
        for good in ["Bearer s3cret", "bearer s3cret", "BEARER s3cret"] {
            assert_eq!(
                caller(&mut guarded, Some(good)),
                Ok(Caller::ReadToken),
                "{good}"
            );
        }
        for bad in [
            None,
            Some("Bearer nope"),
            Some("s3cret"),
            Some("Bearer s3cret2"),
            Some("Bearers3cret"),
            Some("Basic s3cret"),
        ] {
            assert_eq!(
                caller(&mut guarded, bad),
                Err(tonic::Code::Unauthenticated),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn either_token_is_a_caller_and_only_the_write_token_is_a_writer() {
        let mut d = doors(Some("reader"), Some("writer"));
        assert_eq!(caller(&mut d, Some("Bearer reader")), Ok(Caller::ReadToken));
        assert_eq!(
            caller(&mut d, Some("Bearer writer")),
            Ok(Caller::WriteToken)
        );
        assert!(caller(&mut d, Some("Bearer other")).is_err());
    }

    #[test]
    fn with_kube_auth_an_unknown_token_goes_to_review() {
        let mut d = doors(Some("reader"), None);
        d.kube = true;
        let r = d.call(with(Some("Bearer eyJhbGciOi"))).unwrap();
        assert!(matches!(
            r.extensions().get::<Door>(),
            Some(Door::Review(_))
        ));
        assert_eq!(caller(&mut d, Some("Bearer reader")), Ok(Caller::ReadToken));
    }

    #[test]
    fn a_replaced_token_takes_effect_at_once() {
        let t = BearerToken::new(Some("old"));
        let mut shared = Doors {
            read: t.clone(),
            ..doors(None, None)
        };
        t.set(Some("new"));
        assert!(caller(&mut shared, Some("Bearer old")).is_err());
        assert_eq!(
            caller(&mut shared, Some("Bearer new")),
            Ok(Caller::ReadToken)
        );
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
        let t = BearerToken::new(Some("tok"));
        assert!(t.accepts("tok "));
        assert!(t.admits(&with(Some("Bearer tok "))));
        let mut d = doors(Some("tok"), None);
        assert_eq!(caller(&mut d, Some("Bearer tok ")), Ok(Caller::ReadToken));
    }
}
