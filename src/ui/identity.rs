//! A Kubernetes identity on the dashboard (#34). With `--grpc-kube-auth`,
//! a browser signs in with a token the home cluster accepts; it then sees
//! only the namespaces that identity may list, and the rollout buttons for
//! the verbs it holds, each asked of the home cluster as the gRPC API asks
//! (the same reviews, caches and limits).
//!
//! The session cookie carries the token itself (HttpOnly, SameSite=Strict,
//! `__Host-` over TLS): any replica can check it, nothing is stored, and a
//! revoked token or deleted ServiceAccount ends the session within the
//! review cache's 10 s.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use tonic::Status;

use crate::authz::AuthzError;
use crate::authz::access::{self, Access, Caller, Resource, User};
use crate::authz::doors::Token;
use crate::authz::gate::Gate;
use crate::authz::review::Reviews;
use crate::rollout::run::cache::RolloutCache;
use crate::status::hub::Hub;

/// The cookie in plaintext (development) mode.
pub const COOKIE: &str = "flotilla_ui_k8s";
/// The cookie over TLS.
pub const TLS_COOKIE: &str = "__Host-flotilla_ui_k8s";
/// For the denial counter and the log.
const METHOD: &str = "Dashboard";
/// The verbs the rollout buttons need, one button each.
pub const EDIT_VERBS: [&str; 4] = [access::PAUSE, access::RESUME, access::UNDO, access::APPROVE];

/// What one identity sees: `None` is every namespace.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sight {
    pub microservices: Option<Arc<BTreeSet<String>>>,
    pub rollouts: Option<Arc<BTreeSet<String>>>,
    /// The fleet bar: `list` on `memberclusters`.
    pub clusters: bool,
}

impl Sight {
    /// A static token's: everything.
    pub fn everything() -> Self {
        Sight {
            microservices: None,
            rollouts: None,
            clusters: true,
        }
    }

    pub fn shows_rollouts_of(&self, ns: &str) -> bool {
        self.rollouts.as_ref().is_none_or(|v| v.contains(ns))
    }
}

pub struct KubeAuth {
    gate: Gate,
    reviews: Arc<Reviews>,
}

impl KubeAuth {
    pub fn new(home: kube::Client) -> Self {
        let reviews = Arc::new(Reviews::new(home));
        KubeAuth {
            gate: Gate::new(Some(reviews.clone()), false),
            reviews,
        }
    }

    /// Who `token` is. A refusal is charged to `peer` when given (at
    /// sign-in; a page's own requests and rechecks are not charged, so a
    /// client sharing its address cannot sign other browsers out). A token
    /// no cookie could carry is refused unasked.
    pub async fn who(&self, token: &str, peer: Option<IpAddr>) -> Result<User, AuthzError> {
        if !cookie_safe(token) {
            return Err(AuthzError::Unauthenticated(
                "not a token the home cluster could vouch for".into(),
            ));
        }
        self.reviews
            .authenticate(&Token(token.to_string()), peer)
            .await
    }

    /// Ok when `user` holds `access`; the refusal otherwise (counted).
    pub async fn require(&self, user: &User, access: &Access) -> Result<(), Status> {
        let caller = Caller::User(user.clone());
        Ok(self.gate.require(&caller, access, METHOD).await?)
    }

    /// What `user` sees of what the hub and the rollout cache hold now.
    pub async fn sight(
        &self,
        user: &User,
        hub: &Hub,
        rollouts: Option<&RolloutCache>,
    ) -> Result<Sight, Status> {
        let caller = Caller::User(user.clone());
        let present = hub.read(|ix| ix.snapshot()).namespaces();
        let microservices = self
            .gate
            .visible(&caller, "list", Resource::Microservices, present, METHOD)
            .await?;
        let present = rollouts.map(|c| c.namespaces()).unwrap_or_default();
        let rollouts = self
            .gate
            .visible(
                &caller,
                "list",
                Resource::FleetMicroservices,
                present,
                METHOD,
            )
            .await?;
        let clusters = self
            .gate
            .holds(&caller, &Access::new("list", Resource::MemberClusters))
            .await
            .map_err(Status::from)?;
        Ok(Sight {
            microservices: microservices.map(Arc::new),
            rollouts: rollouts.map(Arc::new),
            clusters,
        })
    }

    /// Of the namespaces `user` sees rollouts in, the edit verbs it holds
    /// in each (namespaces where it holds none are left out).
    pub async fn verbs(
        &self,
        user: &User,
        sight: &Sight,
        rollouts: Option<&RolloutCache>,
    ) -> Result<BTreeMap<String, Vec<&'static str>>, Status> {
        let caller = Caller::User(user.clone());
        let namespaces = rollouts.map(|c| c.namespaces()).unwrap_or_default();
        let asked: Vec<(String, &'static str)> = namespaces
            .into_iter()
            .filter(|ns| sight.shows_rollouts_of(ns))
            .flat_map(|ns| EDIT_VERBS.map(|verb| (ns.clone(), verb)))
            .collect();
        // At once: the reviews' own limit bounds what reaches the home
        // apiserver.
        let answers = futures::future::try_join_all(
            asked
                .iter()
                .map(|(ns, verb)| self.holds_verb(&caller, ns, verb)),
        )
        .await
        .map_err(Status::from)?;
        let held: Vec<(String, &'static str, bool)> = asked
            .into_iter()
            .zip(answers)
            .map(|((ns, verb), ok)| (ns, verb, ok))
            .collect();
        let mut out: BTreeMap<String, Vec<&'static str>> = BTreeMap::new();
        for (ns, verb, ok) in held {
            if ok {
                out.entry(ns).or_default().push(verb);
            }
        }
        // In the order of the buttons.
        for verbs in out.values_mut() {
            verbs.sort_by_key(|v| EDIT_VERBS.iter().position(|e| e == v));
        }
        Ok(out)
    }
}

impl KubeAuth {
    async fn holds_verb(
        &self,
        caller: &Caller,
        ns: &str,
        verb: &'static str,
    ) -> Result<bool, AuthzError> {
        let access = Access::new(verb, Resource::FleetMicroservices).in_namespace(ns);
        self.gate.holds(caller, &access).await
    }
}

/// The cookie that carries a signed-in identity's token.
pub fn set_cookie(token: &str, secure: bool) -> String {
    super::auth::cookie_header(COOKIE, token, secure, super::auth::MAX_AGE)
}

/// The `Set-Cookie` that ends it in this browser.
pub fn clear_cookie(secure: bool) -> String {
    super::auth::cookie_header(COOKIE, "", secure, 0)
}

/// Whether `token` may go in a cookie as it is: a JWT is base64url and
/// dots; anything else is refused at sign-in rather than mangled.
pub fn cookie_safe(token: &str) -> bool {
    !token.is_empty()
        && token.len() <= 3800
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_token_a_cookie_carries_unchanged_is_kept_in_one() {
        assert!(cookie_safe("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln-_"));
        for bad in ["", "a;b", "a b", "a=b", "a,b", "a\"b", &"x".repeat(4000)] {
            assert!(!cookie_safe(bad), "{bad:?}");
        }
    }

    #[test]
    fn the_cookie_is_host_only_and_unreadable_by_script() {
        let tls = set_cookie("t", true);
        assert!(tls.starts_with("__Host-flotilla_ui_k8s=t;"), "{tls}");
        for part in ["HttpOnly", "SameSite=Strict", "Secure", "Path=/"] {
            assert!(tls.contains(part), "{tls}");
        }
        assert!(clear_cookie(false).contains("Max-Age=0"));
    }

    #[test]
    fn a_static_token_sees_everything() {
        let all = Sight::everything();
        assert!(all.clusters && all.shows_rollouts_of("any"));
        let some = Sight {
            rollouts: Some(Arc::new(["team-a".to_string()].into())),
            ..Sight::default()
        };
        assert!(some.shows_rollouts_of("team-a") && !some.shows_rollouts_of("team-b"));
        assert!(!some.clusters);
    }
}
