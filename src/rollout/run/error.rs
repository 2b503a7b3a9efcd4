//! The fleet controller's errors.

use crate::lease::fence;

#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    /// A call to the home cluster failed.
    #[error("home cluster: {verb} {kind}: {source}")]
    Home {
        verb: &'static str,
        kind: &'static str,
        #[source]
        source: kube::Error,
    },
    /// A call to a member cluster failed.
    #[error("cluster {cluster}: {verb} Microservice: {source}")]
    Member {
        cluster: String,
        verb: &'static str,
        #[source]
        source: kube::Error,
    },
    /// The member is registered but no client can be built for it.
    #[error("cluster {cluster}: no client ({reason})")]
    NoClient { cluster: String, reason: String },
    /// The stored revisions cannot be used.
    #[error("revisions: {0}")]
    Revision(String),
}

pub type Result<T, E = RolloutError> = std::result::Result<T, E>;

impl RolloutError {
    pub fn home(verb: &'static str, kind: &'static str, source: kube::Error) -> Self {
        RolloutError::Home { verb, kind, source }
    }

    pub fn member(cluster: &str, verb: &'static str, source: kube::Error) -> Self {
        RolloutError::Member {
            cluster: cluster.to_string(),
            verb,
            source,
        }
    }

    fn source(&self) -> Option<&kube::Error> {
        match self {
            RolloutError::Home { source, .. } | RolloutError::Member { source, .. } => Some(source),
            _ => None,
        }
    }

    /// What a failed member write tells the planner: the apiserver's
    /// status when it answered, else the failure.
    pub fn trouble(&self) -> crate::rollout::trouble::Kind {
        use crate::rollout::trouble::Kind;
        match self.source() {
            Some(e @ kube::Error::Api(s)) if !fence::is_fenced(e) => Kind::Refused {
                code: s.code,
                message: s.message.clone(),
            },
            _ => Kind::Failed {
                message: self.to_string(),
            },
        }
    }

    /// How the write log takes a failed member write.
    pub fn failed(&self) -> crate::rollout::write_log::Failed {
        match self.fenced() {
            true => crate::rollout::write_log::Failed::Fenced,
            false => crate::rollout::write_log::Failed::Member(self.trouble()),
        }
    }

    /// This replica's own fence stopped the write: its term ended.
    pub fn fenced(&self) -> bool {
        self.source().is_some_and(fence::is_fenced)
    }

    /// A bounded label for metrics and logs.
    pub fn category(&self) -> &'static str {
        match self.source() {
            _ if self.fenced() => "not_leader",
            Some(kube::Error::Api(s)) if s.is_conflict() => "conflict",
            _ => match self {
                RolloutError::Home { .. } => "home_api",
                RolloutError::Member { .. } => "member_api",
                RolloutError::NoClient { .. } => "no_client",
                RolloutError::Revision(_) => "revision",
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::trouble::Kind;
    use crate::rollout::write_log::Failed;

    #[test]
    fn a_write_the_fence_stopped_is_fenced_and_a_refusal_is_the_members() {
        use crate::lease::fence::FenceError;
        for fence in [
            FenceError::NotLeading { armed: Some(0) },
            FenceError::TermEnded,
        ] {
            let e = RolloutError::member("m1", "create", kube::Error::Service(Box::new(fence)));
            assert_eq!(e.failed(), Failed::Fenced);
        }
        let refused = RolloutError::member(
            "m1",
            "create",
            kube::Error::Api(
                kube::core::Status::failure("no", "Forbidden")
                    .with_code(403)
                    .boxed(),
            ),
        );
        assert!(matches!(
            refused.failed(),
            Failed::Member(Kind::Refused { code: 403, .. })
        ));
    }
}
