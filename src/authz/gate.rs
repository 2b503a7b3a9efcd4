//! What each gRPC call asks before it answers: who is calling (the door
//! the interceptor chose, finished with a TokenReview), and whether they
//! hold the right (the static grant, or a SubjectAccessReview). Every
//! refusal is counted and logged with the caller's name, never its token.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use tonic::Request;

use super::AuthzError;
use super::access::{Access, Caller, Resource};
use super::doors::{Door, Token};
use super::review::Reviews;
use crate::telemetry::metrics::METRICS;

/// Namespaces checked at once for one call.
const CONCURRENT_REVIEWS: usize = 8;

#[derive(Clone, Default)]
pub struct Gate {
    /// `None` without `--grpc-kube-auth`: no token is sent to anyone.
    reviews: Option<Arc<Reviews>>,
    /// Whether a write token is set, for a refusal that says how to get one.
    write_token: bool,
}

impl Gate {
    pub fn new(reviews: Option<Arc<Reviews>>, write_token: bool) -> Self {
        Gate {
            reviews,
            write_token,
        }
    }

    /// The caller of `req`, whose door the interceptor chose. Recorded on
    /// the call's span as `enduser.id`.
    pub async fn caller<T>(
        &self,
        req: &Request<T>,
        method: &'static str,
    ) -> Result<Caller, AuthzError> {
        Ok(self.standing(req, method).await?.caller)
    }

    /// The caller, with the token it came with: a long stream asks about
    /// both again while it runs.
    pub async fn standing<T>(
        &self,
        req: &Request<T>,
        method: &'static str,
    ) -> Result<Standing, AuthzError> {
        let door = req.extensions().get::<Door>().cloned();
        let (caller, token) = match (door, &self.reviews) {
            (Some(Door::Decided(c)), _) => (c, None),
            (Some(Door::Review(token)), Some(reviews)) => {
                let peer = req.remote_addr().map(|a| a.ip());
                match reviews.authenticate(&token, peer).await {
                    Ok(user) => (Caller::User(user), Some(token)),
                    Err(e) => return Err(refused(method, "unknown", e)),
                }
            }
            // Fail closed: a service reached without its interceptor.
            _ => {
                return Err(refused(
                    method,
                    "unknown",
                    AuthzError::Unauthenticated("no credential was checked".into()),
                ));
            }
        };
        tracing::Span::current().record("enduser.id", caller.name());
        Ok(Standing {
            gate: self.clone(),
            caller,
            token,
        })
    }

    /// Ok when `caller` holds `access`; PERMISSION_DENIED naming the right
    /// otherwise; UNAVAILABLE when the home cluster cannot say.
    pub async fn require(
        &self,
        caller: &Caller,
        access: &Access,
        method: &'static str,
    ) -> Result<(), AuthzError> {
        match self.allows(caller, access).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(refused(
                method,
                caller.name(),
                AuthzError::Denied(self.denial(caller, access)),
            )),
            Err(e) => Err(refused(method, caller.name(), e)),
        }
    }

    /// Of `namespaces`, those where `caller` may `verb` `resource`; `None`
    /// when the right holds in every namespace.
    pub async fn visible(
        &self,
        caller: &Caller,
        verb: &'static str,
        resource: Resource,
        namespaces: impl IntoIterator<Item = String>,
        method: &'static str,
    ) -> Result<Option<BTreeSet<String>>, AuthzError> {
        let everywhere = Access::new(verb, resource);
        let wrap = |e| refused(method, caller.name(), e);
        if self.allows(caller, &everywhere).await.map_err(wrap)? {
            return Ok(None);
        }
        let checked: Vec<(String, bool)> = futures::stream::iter(namespaces)
            .map(|ns| async move {
                let ok = self
                    .allows(caller, &Access::new(verb, resource).in_namespace(&ns))
                    .await?;
                Ok::<_, AuthzError>((ns, ok))
            })
            .buffer_unordered(CONCURRENT_REVIEWS)
            .try_collect()
            .await
            .map_err(wrap)?;
        Ok(Some(
            checked
                .into_iter()
                .filter(|(_, ok)| *ok)
                .map(|(ns, _)| ns)
                .collect(),
        ))
    }

    /// Whether `caller` holds `access`, asked without counting a denial:
    /// for showing what may be done, not for doing it.
    pub async fn holds(&self, caller: &Caller, access: &Access) -> Result<bool, AuthzError> {
        self.allows(caller, access).await
    }

    async fn allows(&self, caller: &Caller, access: &Access) -> Result<bool, AuthzError> {
        if let Some(granted) = caller.static_grant(access) {
            return Ok(granted);
        }
        match (caller, &self.reviews) {
            (Caller::User(user), Some(reviews)) => reviews.allowed(user, access).await,
            _ => Ok(false),
        }
    }

    fn denial(&self, caller: &Caller, access: &Access) -> String {
        match caller {
            Caller::User(u) => format!(
                "{} may not {} (the home cluster's RBAC)",
                u.username,
                access.describe()
            ),
            _ if !self.write_token => format!(
                "{} may not change rollouts: that needs the write token (--grpc-write-token-file, not set here) or a Kubernetes identity with the right (--grpc-kube-auth)",
                caller.name()
            ),
            _ => "this call changes a rollout and needs the write token".into(),
        }
    }
}

/// A caller as a long stream holds it (#34): the token is reviewed again
/// (a deleted ServiceAccount ends the stream) and the right asked again.
#[derive(Clone)]
pub struct Standing {
    gate: Gate,
    pub caller: Caller,
    /// The token the home cluster vouched for; none for a static door.
    token: Option<Token>,
}

impl Standing {
    /// Only a Kubernetes identity's standing can change while a stream
    /// runs; a static door's ends with its credential (`Revocation`).
    pub fn may_change(&self) -> bool {
        self.token.is_some()
    }

    /// Ok while the token still authenticates and the right still holds.
    pub async fn recheck(&self, access: &Access, method: &'static str) -> Result<(), AuthzError> {
        self.authenticated(method).await?;
        self.gate.require(&self.caller, access, method).await
    }

    /// Of `asked`, the namespaces where this caller may `verb` `resource`
    /// now (`None`: everywhere), its token reviewed again first: what a
    /// long unscoped stream may keep sending.
    pub async fn visible_now(
        &self,
        verb: &'static str,
        resource: Resource,
        asked: BTreeSet<String>,
        method: &'static str,
    ) -> Result<Option<BTreeSet<String>>, AuthzError> {
        self.authenticated(method).await?;
        self.gate
            .visible(&self.caller, verb, resource, asked, method)
            .await
    }

    /// Ok while the token still authenticates (cached as any review).
    pub async fn authenticated(&self, method: &'static str) -> Result<(), AuthzError> {
        match (&self.token, &self.gate.reviews) {
            (Some(token), Some(reviews)) => match reviews.authenticate(token, None).await {
                Ok(_) => Ok(()),
                Err(e) => Err(refused(method, self.caller.name(), e)),
            },
            _ => Ok(()),
        }
    }
}

/// A refusal, counted and logged where it happens.
fn refused(method: &'static str, who: &str, e: AuthzError) -> AuthzError {
    if matches!(e, AuthzError::Denied(_)) {
        METRICS.authz_denied_total.inc(&[method]);
    }
    tracing::info!(
        enduser.id = who,
        rpc.method = method,
        category = e.category(),
        "{e}"
    );
    e
}
