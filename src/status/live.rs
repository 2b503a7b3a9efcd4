//! What a wait needs from the members themselves, not from the index: the
//! generation each cluster's live object has when the wait starts. The
//! index may lag a write the caller has just made; a consistent read of
//! the member cannot.

use std::fmt;
use std::sync::Arc;

/// Reads a Microservice's generation from a member's apiserver.
#[tonic::async_trait]
pub trait LiveReads: Send + Sync {
    /// `ns/name`'s generation in `cluster` now; `None` when it is not
    /// there. The error says, without credentials, why it could not be read.
    async fn generation(&self, cluster: &str, ns: &str, name: &str) -> Result<Option<i64>, String>;
}

/// The server's handle on the member reads.
#[derive(Clone)]
pub struct Live(pub Arc<dyn LiveReads>);

impl fmt::Debug for Live {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Live")
    }
}
