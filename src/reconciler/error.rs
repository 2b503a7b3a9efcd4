//! Errors of the reconciler layer.

use crate::domain::DomainError;

pub type Result<T, E = ReconcileError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// A call to the member cluster's API failed (network, 5xx, permission).
    #[error("{verb} {kind} failed: {source}")]
    Api {
        verb: &'static str,
        kind: &'static str,
        #[source]
        source: kube::Error,
    },
    /// The API server refused the object as invalid (422): an immutable
    /// field, an admission policy. Retrying the same write cannot help.
    #[error("the API server rejected the {kind} ({verb}): {message}")]
    Rejected {
        verb: &'static str,
        kind: &'static str,
        message: String,
    },
    /// A conditional write lost a race: re-read and retry, never overwrite.
    #[error("{kind} changed while we wrote it; retrying from a fresh read")]
    Conflict { kind: &'static str },
    /// This replica no longer leads the cluster: the write was not sent.
    #[error("not the leader of this cluster any more; write withheld")]
    NotLeader,
    /// The object lacks metadata the API server always sets.
    #[error(transparent)]
    Domain(#[from] DomainError),
}

impl ReconcileError {
    pub fn api(verb: &'static str, kind: &'static str, source: kube::Error) -> Self {
        match &source {
            _ if crate::lease::fence::is_fenced(&source) => ReconcileError::NotLeader,
            kube::Error::Api(s) if s.is_conflict() => ReconcileError::Conflict { kind },
            kube::Error::Api(s) if s.code == 422 => ReconcileError::Rejected {
                verb,
                kind,
                message: s.message.clone(),
            },
            _ => ReconcileError::Api { verb, kind, source },
        }
    }

    /// A bounded label for metrics and Event reasons.
    pub fn category(&self) -> &'static str {
        match self {
            ReconcileError::Api {
                source: kube::Error::Api(s),
                ..
            } if s.is_forbidden() => "Forbidden",
            ReconcileError::Api {
                source: kube::Error::Api(_),
                ..
            } => "ApiError",
            ReconcileError::Api { .. } => "ConnectionError",
            ReconcileError::Rejected { .. } => "Invalid",
            ReconcileError::Conflict { .. } => "Conflict",
            ReconcileError::NotLeader => "NotLeader",
            ReconcileError::Domain(e) => e.category(),
        }
    }
}
