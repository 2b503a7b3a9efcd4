//! Serving, for the gRPC API and the dashboard alike: TLS material that
//! rotates (`tls`), bounded connections (`conns`), bounded streams that
//! end on revocation (`streams`) and the static bearer tokens (`tokens`).

pub mod conns;
pub mod errors;
pub mod streams;
pub mod tls;
pub mod tokens;

/// Errors of the serving layer.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ServeError {
    /// Serving cannot start or go on with this configuration (TLS files).
    #[error("server configuration: {0}")]
    Config(String),
}

impl ServeError {
    /// A bounded label for metrics and logs.
    pub fn category(&self) -> &'static str {
        match self {
            ServeError::Config(_) => "Config",
        }
    }
}
