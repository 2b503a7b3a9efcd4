//! The dashboard: a page every replica serves on `--ui-addr`, read from
//! the same status index as the gRPC API, kept live over Server-Sent
//! Events. The page, its script and its styles are embedded in the binary.

pub mod assets;
pub mod auth;
pub mod events;
pub mod identity;
pub mod json;
pub mod limits;
pub mod origin;
pub mod server;
pub mod warnings;

/// Errors of the dashboard's edge.
#[derive(Debug, thiserror::Error)]
pub enum UiError {
    #[error("dashboard configuration: {0}")]
    Config(String),
    #[error("dashboard server: {0}")]
    Serve(String),
}

impl UiError {
    /// A bounded label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            UiError::Config(_) => "Config",
            UiError::Serve(_) => "Serve",
        }
    }
}
