//! The home cluster's answers: a TokenReview says who a token is, a
//! SubjectAccessReview whether they hold a right. Both are cached briefly
//! and bounded; an apiserver that does not answer is an error, never a
//! "yes" (fail closed).

use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};

use super::AuthzError;
use super::access::{Access, GROUP, User};
use super::cache::Expiring;
use super::doors::Token;
use super::flight::Flights;
use super::sign_ins::SignIns;

/// How long the home cluster's word on a token holds: a revoked token
/// works at most this long after its revocation.
pub const TOKEN_GOOD_FOR: Duration = Duration::from_secs(10);
/// A refused token is asked about again soon: it may have just been issued.
pub const TOKEN_BAD_FOR: Duration = Duration::from_secs(2);
/// How long a right, granted or refused, holds.
pub const RIGHT_FOR: Duration = Duration::from_secs(5);
/// Entries in each cache, whoever sends tokens.
pub const MAX_ENTRIES: usize = 4096;
/// The longest one review may take, waiting for a turn included.
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);
/// Reviews in flight at once: a flood of made-up tokens waits its turn
/// (and times out) instead of queueing without bound at the home
/// apiserver, which also serves this replica's own Leases and edits.
pub const CONCURRENT_REVIEWS: usize = 16;
/// Tokens the home cluster refused, per client address, before that
/// address's unknown tokens are refused without a review until the
/// window ends: one client sending made-up tokens cannot hold every
/// review turn, which would leave real callers `UNAVAILABLE`.
pub const REFUSED_PER_ADDRESS: u32 = 20;
pub const REFUSED_WINDOW: Duration = Duration::from_secs(10);

use crate::domain::digest::Digest;

fn digest(token: &Token) -> Digest {
    crate::domain::digest::sha256(token.0.as_bytes())
}

pub struct Reviews {
    home: Client,
    /// By the token's digest: the token itself is never kept.
    tokens: Mutex<Expiring<Digest, Result<User, String>>>,
    rights: Mutex<Expiring<(User, Access), bool>>,
    turns: tokio::sync::Semaphore,
    /// Reviews under way, shared by the calls asking the same thing.
    token_flights: Flights<Digest, Result<Result<User, String>, AuthzError>>,
    refused: Mutex<SignIns>,
    right_flights: Flights<(User, Access), Result<bool, AuthzError>>,
}

/// Who the home cluster says the token is, or why it refused it. Pure.
pub fn user_of(status: TokenReviewStatus) -> Result<User, String> {
    let user = status.user.unwrap_or_default();
    match (status.authenticated, user.username) {
        (Some(true), Some(username)) if !username.is_empty() => Ok(User {
            username,
            uid: user.uid.unwrap_or_default(),
            groups: user.groups.unwrap_or_default(),
            extra: user.extra.unwrap_or_default(),
        }),
        _ => Err(match status.error {
            Some(e) if !e.is_empty() => format!("the home cluster refused the bearer token: {e}"),
            _ => "the home cluster refused the bearer token".into(),
        }),
    }
}

/// The SubjectAccessReview that asks whether `user` holds `access`. Pure.
pub fn review_of(user: &User, access: &Access) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.username.clone()),
            uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
            groups: Some(user.groups.clone()),
            extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
            resource_attributes: Some(ResourceAttributes {
                group: Some(GROUP.into()),
                resource: Some(access.resource.plural().into()),
                verb: Some(access.verb.into()),
                namespace: access.namespace.clone(),
                name: access.name.clone(),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

impl Reviews {
    /// One review, bounded in time and in how many run at once. The
    /// caller learns which review failed; the details (the apiserver's
    /// address, the operator's own identity) stay in the log.
    async fn bounded<T>(
        &self,
        what: &'static str,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, AuthzError> {
        let answer = tokio::time::timeout(REVIEW_TIMEOUT, async {
            let _turn = self.turns.acquire().await;
            crate::telemetry::metrics::METRICS
                .authz_reviews_total
                .inc(&[what]);
            call.await
        })
        .await;
        let detail = match answer {
            Ok(Ok(t)) => return Ok(t),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {REVIEW_TIMEOUT:?}"),
        };
        tracing::warn!(review = what, error = %detail, "a review of a caller failed; the call is refused");
        Err(AuthzError::Unavailable(format!(
            "the {what} did not complete"
        )))
    }
}

impl Reviews {
    pub fn new(home: Client) -> Self {
        Reviews {
            home,
            tokens: Mutex::new(Expiring::new(MAX_ENTRIES)),
            rights: Mutex::new(Expiring::new(MAX_ENTRIES)),
            turns: tokio::sync::Semaphore::new(CONCURRENT_REVIEWS),
            token_flights: Flights::default(),
            refused: Mutex::new(SignIns::new(
                REFUSED_PER_ADDRESS,
                REFUSED_WINDOW,
                MAX_ENTRIES,
            )),
            right_flights: Flights::default(),
        }
    }

    /// Who `token` is. `peer`, the client's address, is charged for each
    /// token the home cluster refuses; a known token passes whatever its
    /// address has sent.
    pub async fn authenticate(
        &self,
        token: &Token,
        peer: Option<IpAddr>,
    ) -> Result<User, AuthzError> {
        let key = digest(token);
        let cached = lock(&self.tokens).get(&key, Instant::now());
        let outcome = match cached {
            Some(o) => o,
            None => {
                let now = tokio::time::Instant::now().into_std();
                if let Some(wait) = peer.and_then(|p| lock(&self.refused).wait(p, now)) {
                    return Err(AuthzError::Throttled {
                        message: format!(
                            "too many refused tokens from this address; retry in {} s",
                            wait.as_secs().max(1)
                        ),
                        retry: wait,
                    });
                }
                let ask = self.review_token(token, key, peer);
                self.token_flights.share(key, ask).await?
            }
        };
        outcome.map_err(AuthzError::Unauthenticated)
    }

    /// Asks the home cluster about `token`; a refusal is charged to `peer`
    /// here, once per review, however many calls shared it.
    async fn review_token(
        &self,
        token: &Token,
        key: Digest,
        peer: Option<IpAddr>,
    ) -> Result<Result<User, String>, AuthzError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.0.clone(),
                audiences: None,
            },
            ..Default::default()
        };
        let api = Api::<TokenReview>::all(self.home.clone());
        // Kept from when it was asked: the answer is no newer.
        let asked = Instant::now();
        let params = PostParams::default();
        let call = api.create(&params, &review);
        let answer = self.bounded("TokenReview", call).await?;
        let o = user_of(answer.status.unwrap_or_default());
        let ttl = if o.is_ok() {
            TOKEN_GOOD_FOR
        } else {
            TOKEN_BAD_FOR
        };
        lock(&self.tokens).insert(key, o.clone(), ttl, asked);
        if let (Err(_), Some(p)) = (&o, peer) {
            lock(&self.refused).failed(p, tokio::time::Instant::now().into_std());
        }
        Ok(o)
    }

    pub async fn allowed(&self, user: &User, access: &Access) -> Result<bool, AuthzError> {
        let key = (user.clone(), access.clone());
        if let Some(ok) = lock(&self.rights).get(&key, Instant::now()) {
            return Ok(ok);
        }
        let ask = self.review_right(user, access, key.clone());
        self.right_flights.share(key, ask).await
    }

    async fn review_right(
        &self,
        user: &User,
        access: &Access,
        key: (User, Access),
    ) -> Result<bool, AuthzError> {
        let api = Api::<SubjectAccessReview>::all(self.home.clone());
        let asked = Instant::now();
        let review = review_of(user, access);
        let params = PostParams::default();
        let call = api.create(&params, &review);
        let answer = self.bounded("SubjectAccessReview", call).await?;
        let ok = answer.status.is_some_and(|s| s.allowed);
        lock(&self.rights).insert(key, ok, RIGHT_FOR, asked);
        Ok(ok)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authz::access::{PAUSE, Resource};
    use k8s_openapi::api::authentication::v1::UserInfo;

    #[test]
    fn only_an_authenticated_named_user_is_a_user() {
        let named = TokenReviewStatus {
            authenticated: Some(true),
            user: Some(UserInfo {
                username: Some("system:serviceaccount:team-a:ci".into()),
                groups: Some(vec!["system:serviceaccounts".into()]),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            user_of(named).unwrap().username,
            "system:serviceaccount:team-a:ci"
        );
        let refused = TokenReviewStatus {
            authenticated: Some(false),
            error: Some("token has expired".into()),
            ..Default::default()
        };
        assert!(user_of(refused).unwrap_err().contains("token has expired"));
        let nameless = TokenReviewStatus {
            authenticated: Some(true),
            user: Some(UserInfo::default()),
            ..Default::default()
        };
        assert!(user_of(nameless).is_err());
        assert!(user_of(TokenReviewStatus::default()).is_err());
    }

    #[test]
    fn a_review_asks_for_the_custom_verb_in_the_group() {
        let user = User {
            username: "alice".into(),
            uid: String::new(),
            groups: vec!["team-a".into()],
            extra: Default::default(),
        };
        let access = Access::new(PAUSE, Resource::FleetMicroservices)
            .in_namespace("team-a")
            .named("web");
        let r = review_of(&user, &access).spec;
        let a = r.resource_attributes.unwrap();
        assert_eq!(a.group.as_deref(), Some("platform.example.io"));
        assert_eq!(a.verb.as_deref(), Some("pause"));
        assert_eq!(a.resource.as_deref(), Some("fleetmicroservices"));
        assert_eq!(a.namespace.as_deref(), Some("team-a"));
        assert_eq!(a.name.as_deref(), Some("web"));
        assert_eq!(r.groups, Some(vec!["team-a".to_string()]));
        assert_eq!(r.uid, None);
    }
}
