//! What the last write of a revision to a member found, as the planner
//! needs it (review M1, M2). Pure. The edge records it; the planner shows
//! it in the cluster's state and stops writing when writing again cannot
//! help until something changes.

/// The last write of `revision` (whose spec there has `digest`) to one
/// cluster went wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trouble {
    pub revision: String,
    pub digest: u64,
    pub kind: Kind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The member's apiserver answered with this status.
    Refused { code: u16, message: String },
    /// No answer, or no client.
    Failed { message: String },
    /// The write succeeded but the member stored a different spec: a field
    /// it does not know was pruned, or an admission webhook changed it.
    Altered { times: u32 },
}

impl Trouble {
    /// Writing the same again cannot help: a permanent refusal, or a spec
    /// the member altered twice (the first may have been a race).
    pub fn permanent(&self) -> bool {
        match &self.kind {
            Kind::Refused { code, .. } => matches!(code, 400 | 403 | 404 | 405 | 422),
            Kind::Failed { .. } => false,
            Kind::Altered { times } => *times >= 2,
        }
    }

    pub fn reason(&self) -> &'static str {
        match self.kind {
            Kind::Altered { .. } => "SpecRejected",
            _ => "WriteFailed",
        }
    }

    pub fn message(&self) -> String {
        match &self.kind {
            Kind::Refused { code, message } => {
                format!(
                    "writing revision {} was refused (HTTP {code}): {message}",
                    self.revision
                )
            }
            Kind::Failed { message } => {
                format!("writing revision {} failed: {message}", self.revision)
            }
            Kind::Altered { times } => format!(
                "the member stored a different spec than revision {} gives it ({times} times): a field its Microservice CRD does not know, or an admission webhook that changes it; not written again until the spec or the member changes",
                self.revision
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(kind: Kind) -> Trouble {
        Trouble {
            revision: "api-1".into(),
            digest: 1,
            kind,
        }
    }

    #[test]
    fn permanent_refusals_and_a_twice_altered_spec_stop_the_writes() {
        let refused = |code| {
            t(Kind::Refused {
                code,
                message: "no".into(),
            })
        };
        for code in [400, 403, 404, 422] {
            assert!(refused(code).permanent(), "{code}");
        }
        for code in [409, 429, 500, 503] {
            assert!(!refused(code).permanent(), "{code}");
        }
        assert!(
            !t(Kind::Failed {
                message: "timeout".into()
            })
            .permanent()
        );
        assert!(!t(Kind::Altered { times: 1 }).permanent(), "one retry");
        let twice = t(Kind::Altered { times: 2 });
        assert!(twice.permanent());
        assert_eq!(twice.reason(), "SpecRejected");
        assert!(refused(403).message().contains("HTTP 403"));
    }
}
