//! The gRPC edge: `flotilla.v1.FleetStatus` over tonic, with health,
//! reflection, TLS and a bearer token; plus the client the CLI uses.

pub mod auth;
pub mod catch_panic;
pub mod client;
pub mod convert;
pub mod deadline;
pub mod fleet_wait;
pub mod fresh;
pub mod replies;
pub mod request;
pub mod rollout_convert;
pub mod rollout_watch;
pub mod rollouts;
pub mod server;
pub mod service;
pub mod wait;
pub mod watch;

/// The refusals every gRPC service answers; kept with `serve`, which ends
/// streams with them too.
pub use crate::serve::errors;

/// Generated from `proto/flotilla/v1/fleet.proto`.
pub mod pb {
    tonic::include_proto!("flotilla.v1");

    /// For server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("flotilla_v1_descriptor");
}

/// Errors of the API layer.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A call refused with a stable reason, answered with its code and
    /// details (`errors`).
    #[error("{0}")]
    Refused(errors::Refusal),
    #[error("server configuration: {0}")]
    Config(String),
    #[error("serving: {0}")]
    Transport(String),
}

impl ApiError {
    /// A bounded label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            ApiError::Refused(r) => r.reason.as_str(),
            ApiError::Config(_) => "Config",
            ApiError::Transport(_) => "Transport",
        }
    }
}

impl ApiError {
    /// A malformed request: `field` is wrong.
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        ApiError::Refused(errors::Refusal::invalid(field, message))
    }

    pub fn refused(reason: errors::Reason, message: impl Into<String>) -> Self {
        ApiError::Refused(errors::Refusal::new(reason, message))
    }
}

impl From<errors::Refusal> for ApiError {
    fn from(r: errors::Refusal) -> Self {
        ApiError::Refused(r)
    }
}

impl From<crate::serve::ServeError> for ApiError {
    fn from(e: crate::serve::ServeError) -> Self {
        match e {
            crate::serve::ServeError::Config(m) => ApiError::Config(m),
        }
    }
}

/// A refusal of the authorization layer, as gRPC says it.
impl From<crate::authz::AuthzError> for tonic::Status {
    fn from(e: crate::authz::AuthzError) -> Self {
        use crate::authz::AuthzError as E;
        use errors::{Reason, Refusal};
        match e {
            E::Unauthenticated(m) => errors::status(Reason::Unauthenticated, m),
            E::Denied(m) => errors::status(Reason::PermissionDenied, m),
            e @ E::Unavailable(_) => errors::status(Reason::ReviewUnavailable, e.to_string()),
            E::Throttled { message, retry } => Refusal::new(Reason::TokensThrottled, message)
                .retry(retry)
                .into_status(),
        }
    }
}

impl From<ApiError> for tonic::Status {
    fn from(e: ApiError) -> Self {
        match e {
            ApiError::Refused(r) => r.into_status(),
            other => tonic::Status::internal(other.to_string()),
        }
    }
}
