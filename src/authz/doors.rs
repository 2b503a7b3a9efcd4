//! Which credential a call came through. The static tokens are checked
//! first, then the home cluster (a TokenReview, later); a client
//! certificate alone admits a caller only where no token is asked for
//! (decisions.md). Pure.

use super::AuthzError;
use super::access::Caller;

/// A bearer token the home cluster is to judge. Its `Debug` hides it, so
/// no log line or error can carry it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(pub String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

/// What the interceptor leaves on a request for the service to finish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Door {
    Decided(Caller),
    Review(Token),
}

/// How the server is set up.
#[derive(Debug, Clone, Copy, Default)]
pub struct Setup {
    pub read_token: bool,
    /// Tokens are reviewed by the home cluster (`--grpc-kube-auth`).
    pub kube: bool,
    /// Every connection carries a certificate the client CA signed.
    pub client_certs: bool,
}

/// Longer bearer tokens are refused without asking anyone (OIDC tokens
/// with many groups run to a few KiB).
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// The door of a request that presented `bearer` (if any), which matched
/// the static read or write token or neither. An empty token is none.
pub fn choose(
    bearer: Option<&str>,
    read_ok: bool,
    write_ok: bool,
    setup: Setup,
) -> Result<Door, AuthzError> {
    if write_ok {
        return Ok(Door::Decided(Caller::WriteToken));
    }
    if read_ok {
        return Ok(Door::Decided(Caller::ReadToken));
    }
    let bearer = bearer.filter(|t| !t.is_empty());
    if bearer.is_some_and(|t| t.len() > MAX_TOKEN_BYTES) {
        return Err(AuthzError::Unauthenticated(format!(
            "the bearer token is longer than {MAX_TOKEN_BYTES} bytes"
        )));
    }
    match bearer {
        Some(t) if setup.kube => Ok(Door::Review(Token(t.to_string()))),
        Some(_) if setup.read_token => Err(AuthzError::Unauthenticated(
            "the bearer token is not valid".into(),
        )),
        // A token, when one is set or reviewed, is required on top of a
        // certificate: with kube auth, RBAC decides every read.
        None if setup.read_token || setup.kube => Err(AuthzError::Unauthenticated(
            "a bearer token is required (authorization: Bearer <token>)".into(),
        )),
        // Nothing to check a token against: what the server allows anyone.
        _ if setup.client_certs => Ok(Door::Decided(Caller::Certificate)),
        _ => Ok(Door::Decided(Caller::Open)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kube(client_certs: bool) -> Setup {
        Setup {
            read_token: false,
            kube: true,
            client_certs,
        }
    }

    #[test]
    fn static_tokens_win_before_the_home_cluster_is_asked() {
        let s = Setup {
            read_token: true,
            ..kube(false)
        };
        assert_eq!(
            choose(Some("w"), false, true, s).unwrap(),
            Door::Decided(Caller::WriteToken)
        );
        assert_eq!(
            choose(Some("r"), true, false, s).unwrap(),
            Door::Decided(Caller::ReadToken)
        );
        assert_eq!(
            choose(Some("sa-token"), false, false, s).unwrap(),
            Door::Review(Token("sa-token".into()))
        );
    }

    #[test]
    fn with_kube_auth_a_call_without_a_credential_is_refused() {
        let err = choose(None, false, false, kube(false)).unwrap_err();
        assert!(matches!(err, AuthzError::Unauthenticated(_)));
        // Behind mTLS too: RBAC decides, so a certificate alone is not enough.
        assert!(choose(None, false, false, kube(true)).is_err());
        assert!(choose(Some(""), false, false, kube(true)).is_err(), "empty");
        let huge = "x".repeat(MAX_TOKEN_BYTES + 1);
        assert!(choose(Some(&huge), false, false, kube(false)).is_err());
    }

    #[test]
    fn a_set_read_token_is_required_on_top_of_a_certificate() {
        for kube in [false, true] {
            let s = Setup {
                read_token: true,
                kube,
                client_certs: true,
            };
            assert!(choose(None, false, false, s).is_err(), "kube {kube}");
        }
        let no_token = Setup {
            client_certs: true,
            ..Default::default()
        };
        assert_eq!(
            choose(None, false, false, no_token).unwrap(),
            Door::Decided(Caller::Certificate)
        );
    }

    #[test]
    fn without_kube_auth_the_old_doors_hold() {
        let token = Setup {
            read_token: true,
            ..Default::default()
        };
        assert!(choose(Some("x"), false, false, token).is_err());
        assert!(choose(None, false, false, token).is_err());
        let open = Setup::default();
        assert_eq!(
            choose(Some("x"), false, false, open).unwrap(),
            Door::Decided(Caller::Open)
        );
        assert_eq!(
            choose(None, false, false, open).unwrap(),
            Door::Decided(Caller::Open)
        );
    }

    #[test]
    fn a_token_is_never_printed() {
        let d = Door::Review(Token("s3cret".into()));
        assert!(!format!("{d:?}").contains("s3cret"));
    }
}
