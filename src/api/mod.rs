//! The gRPC edge: `flotilla.v1.FleetStatus` over tonic, with health,
//! reflection, TLS and a bearer token; plus the client the CLI uses.

pub mod auth;
pub mod catch_panic;
pub mod client;
pub mod convert;
pub mod deadline;
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
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    /// Not answerable yet (the registry is not read): retry.
    #[error("{0}")]
    Unavailable(String),
    /// A bounded resource is full: retry later.
    #[error("{0}")]
    ResourceExhausted(String),
    #[error("server configuration: {0}")]
    Config(String),
    #[error("serving: {0}")]
    Transport(String),
}

impl ApiError {
    /// A bounded label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            ApiError::InvalidArgument(_) => "InvalidArgument",
            ApiError::NotFound(_) => "NotFound",
            ApiError::Unavailable(_) => "Unavailable",
            ApiError::ResourceExhausted(_) => "ResourceExhausted",
            ApiError::Config(_) => "Config",
            ApiError::Transport(_) => "Transport",
        }
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
        match e {
            crate::authz::AuthzError::Unauthenticated(m) => tonic::Status::unauthenticated(m),
            crate::authz::AuthzError::Denied(m) => tonic::Status::permission_denied(m),
            e @ crate::authz::AuthzError::Unavailable(_) => {
                tonic::Status::unavailable(e.to_string())
            }
            crate::authz::AuthzError::Throttled(m) => tonic::Status::resource_exhausted(m),
        }
    }
}

impl From<ApiError> for tonic::Status {
    fn from(e: ApiError) -> Self {
        match e {
            ApiError::InvalidArgument(m) => tonic::Status::invalid_argument(m),
            ApiError::NotFound(m) => tonic::Status::not_found(m),
            ApiError::Unavailable(m) => tonic::Status::unavailable(m),
            ApiError::ResourceExhausted(m) => tonic::Status::resource_exhausted(m),
            other => tonic::Status::internal(other.to_string()),
        }
    }
}
