//! Who calls, and what they may do (#34): a caller's bearer token is a
//! Kubernetes identity, checked with a TokenReview against the home
//! cluster, and every call with a SubjectAccessReview there, so one RBAC
//! policy governs kubectl and Flotilla alike. `access`, `doors` and
//! `cache` are pure; `review` asks the home apiserver; `gate` is what the
//! gRPC services call.

pub mod access;
pub mod cache;
pub mod doors;
pub mod flight;
pub mod gate;
pub mod review;
pub mod sign_ins;

/// Errors of the authorization layer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AuthzError {
    /// No identity: no credential, or one nobody vouches for.
    #[error("{0}")]
    Unauthenticated(String),
    /// A known identity without the right.
    #[error("{0}")]
    Denied(String),
    /// The home apiserver could not be asked. Never read as "allowed".
    #[error("the home cluster could not check this caller, so the call is refused: {0}; retry")]
    Unavailable(String),
    /// This client sent too many tokens the home cluster refused; its
    /// unknown tokens wait out the window.
    #[error("{message}")]
    Throttled {
        message: String,
        /// When this address's refused tokens leave the window.
        retry: std::time::Duration,
    },
}

impl AuthzError {
    /// A bounded label for metrics and logs.
    pub fn category(&self) -> &'static str {
        match self {
            AuthzError::Unauthenticated(_) => "Unauthenticated",
            AuthzError::Denied(_) => "Denied",
            AuthzError::Unavailable(_) => "Unavailable",
            AuthzError::Throttled { .. } => "Throttled",
        }
    }
}
