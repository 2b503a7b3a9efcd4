//! `flotilla cluster add` and `remove`: registering a member cluster as
//! `argocd cluster add` or `clusteradm join` would. In the member: the CRD,
//! the operator's namespace, ServiceAccount, RBAC and admission policy, and
//! a token bound to that ServiceAccount. In the home cluster: the labelled
//! member Secret, whose kubeconfig carries only that token and the member's
//! CA, never the credentials that ran the command. `plan` decides (pure);
//! `apply` talks to both apiservers.

pub mod apply;
pub mod manifests;
pub mod plan;

/// Why a registration was not written (or removed).
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// Not a DNS label.
    #[error("{0:?} is not a valid cluster name (lowercase letters, digits and '-', at most 63)")]
    InvalidName(String),
    /// A `--label` flag that Kubernetes or Flotilla would refuse.
    #[error("--label: {0}")]
    InvalidLabel(String),
    /// The member's URL is not one the operator may dial.
    #[error("member server: {0}")]
    Server(String),
    /// A kubeconfig given to the command, or the one written, is unusable.
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    /// Neither the member kubeconfig nor the token Secret had a CA.
    #[error(
        "no CA certificate for the member: neither its kubeconfig nor the token Secret carries one"
    )]
    NoCa,
    /// The member's token controller did not fill in the token Secret.
    #[error(
        "the member issued no token for its flotilla ServiceAccount (is kube-controller-manager's serviceaccount-token controller running?)"
    )]
    TokenNotIssued,
    /// The cluster is already registered under another name.
    #[error(
        "this cluster is already registered as {other:?}; remove that first (flotilla cluster remove {other}) or reuse the name"
    )]
    RegisteredAs { cluster: String, other: String },
    /// The name registers another cluster.
    #[error(
        "{name:?} already registers another cluster (id {cluster_id}); choose another name or remove it first"
    )]
    NameTaken { name: String, cluster_id: String },
    /// A Secret of that name that `cluster add` did not write.
    #[error(
        "the Secret {name:?} was not written by flotilla cluster add; it is left alone: delete it or choose another name"
    )]
    NotWrittenByAdd { name: String },
    /// `remove --purge` would act on a cluster other than the registered one.
    #[error(
        "the member kubeconfig reaches cluster {found}, but {name:?} registers {registered}: nothing purged"
    )]
    WrongCluster {
        name: String,
        found: String,
        registered: String,
    },
    /// `remove --purge` of a registration written by hand: which cluster it
    /// registers cannot be checked.
    #[error(
        "{name:?} was registered by hand, so which cluster it is cannot be checked: remove it without --purge, then purge"
    )]
    UncheckedPurge { name: String },
    /// A Secret in the member's way: not a token of the operator's
    /// ServiceAccount.
    #[error(
        "the member's Secret flotilla-system/flotilla-member-token is not a ServiceAccount token; it is left alone: delete it to let cluster add write it"
    )]
    NotAToken,
    /// The home cluster lacks what the registration goes into.
    #[error("the home cluster has no namespace {0:?}: apply deploy/home first (docs/install.md)")]
    NoMembersNamespace(String),
    /// An apiserver refused or failed a call.
    #[error("{cluster}: {action}: {source}")]
    Api {
        cluster: &'static str,
        action: String,
        #[source]
        source: kube::Error,
    },
    /// The command ran past `--timeout`.
    #[error(
        "not finished within {0:?}; what is done stays done, and running the command again completes it"
    )]
    Timeout(std::time::Duration),
}

impl JoinError {
    /// A bounded label for metrics and logs.
    pub fn category(&self) -> &'static str {
        match self {
            JoinError::InvalidName(_)
            | JoinError::InvalidLabel(_)
            | JoinError::Server(_)
            | JoinError::Kubeconfig(_)
            | JoinError::NoCa => "InvalidInput",
            JoinError::RegisteredAs { .. }
            | JoinError::NameTaken { .. }
            | JoinError::NotWrittenByAdd { .. }
            | JoinError::WrongCluster { .. }
            | JoinError::UncheckedPurge { .. }
            | JoinError::NotAToken => "Conflict",
            JoinError::NoMembersNamespace(_) => "InvalidInput",
            JoinError::TokenNotIssued | JoinError::Timeout(_) => "Timeout",
            JoinError::Api { .. } => "ApiError",
        }
    }
}
