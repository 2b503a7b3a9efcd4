//! WaitForFleetRollout (#61): the rollout of one generation (or revision)
//! of a FleetMicroservice, followed in this replica's rollout cache until
//! the rollout controller's verdict on it. A verdict counts only once the
//! controller has observed the target: the phase it wrote for an earlier
//! generation never ends a wait. `goal` and `judge` are pure.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::errors::{self, Reason, Refusal};
use super::pb::{self, FleetRolloutResult as R};
use super::rollout_convert::rollout;
use crate::rollout::revision::Revision;
use crate::rollout::run::cache::RolloutCache;
use crate::rollout::spec::{FleetMicroservice, RolloutPhase};
use crate::serve::streams::{self, Outbox};

/// What a wait waits for: the controller has observed at least this
/// generation, or made at least this revision number its update revision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Goal {
    Generation(i64),
    Revision(i64),
}

/// The request's target, against the object as the cache holds it (after
/// the freshness barrier, so no older than the home cluster was when
/// asked) and its stored revisions.
pub fn goal(
    target: Option<&pb::wait_for_fleet_rollout_request::Target>,
    f: &FleetMicroservice,
    history: &[Revision],
) -> Result<Goal, Refusal> {
    use pb::wait_for_fleet_rollout_request::Target as T;
    match target {
        None => Err(Refusal::invalid(
            "target",
            "a target is required: generation, revision or current",
        )),
        Some(T::Generation(g)) if *g < 1 => Err(Refusal::invalid(
            "generation",
            format!("generation must be at least 1, got {g}"),
        )),
        Some(T::Generation(g)) => Ok(Goal::Generation(*g)),
        Some(T::Current(false)) => Err(Refusal::invalid(
            "current",
            "current must be true when it is the target",
        )),
        Some(T::Current(true)) => Ok(Goal::Generation(f.metadata.generation.unwrap_or(1))),
        Some(T::Revision(r)) => history
            .iter()
            .find(|h| &h.name == r || r.parse() == Ok(h.number))
            .map(|h| Goal::Revision(h.number))
            .ok_or_else(|| {
                let stored: Vec<String> = history.iter().map(|h| h.number.to_string()).collect();
                Refusal::invalid(
                    "revision",
                    format!(
                        "revision {r:?} is not stored; stored: {}",
                        if stored.is_empty() {
                            "none".into()
                        } else {
                            stored.join(", ")
                        }
                    ),
                )
            }),
    }
}

/// The verdict on `goal`, and a line for people.
pub fn judge(f: &FleetMicroservice, goal: Goal) -> (R, String) {
    let st = f.status.clone().unwrap_or_default();
    let observed = st.observed_generation.unwrap_or(0);
    let reached = match goal {
        Goal::Generation(g) => observed >= g,
        Goal::Revision(n) => st.update_revision_number.is_some_and(|u| u >= n),
    };
    if !reached {
        let what = match goal {
            Goal::Generation(g) => {
                format!("generation {g} (it has observed {observed})")
            }
            Goal::Revision(n) => format!(
                "revision {n} (its update revision is {})",
                st.update_revision_number.unwrap_or(0)
            ),
        };
        return (
            R::InProgress,
            format!("waiting for the rollout controller to observe {what}"),
        );
    }
    let counts = format!(
        "updated {}, available {}",
        st.updated.as_deref().unwrap_or("-"),
        st.available.as_deref().unwrap_or("-")
    );
    let at = format!("at generation {observed}");
    match st.phase {
        Some(RolloutPhase::Complete) => (R::Succeeded, format!("Complete {at}: {counts}")),
        Some(p @ (RolloutPhase::Failed | RolloutPhase::Degraded)) => (
            R::Failed,
            format!(
                "{} {at}; failed clusters: {}",
                p.as_str(),
                if st.failed_clusters.is_empty() {
                    "none named".into()
                } else {
                    st.failed_clusters.join(", ")
                }
            ),
        ),
        Some(RolloutPhase::RolledBack) => (
            R::RolledBack,
            format!(
                "RolledBack {at}: back on {}",
                st.last_good_revision
                    .as_deref()
                    .unwrap_or("the last good revision")
            ),
        ),
        Some(p) => (
            R::InProgress,
            format!(
                "{} {at}{}: {counts}",
                p.as_str(),
                st.wave.map(|w| format!(", wave {w}")).unwrap_or_default()
            ),
        ),
        None => (R::InProgress, format!("not yet planned {at}")),
    }
}

fn message(
    f: &FleetMicroservice,
    history: &[Revision],
    goal: Goal,
) -> pb::WaitForFleetRolloutResponse {
    let (result, summary) = judge(f, goal);
    let (target_generation, target_revision) = match goal {
        Goal::Generation(g) => (g, 0),
        Goal::Revision(n) => (0, n),
    };
    pb::WaitForFleetRolloutResponse {
        result: result as i32,
        rollout: Some(rollout(f, history, false)),
        target_generation,
        target_revision,
        summary,
    }
}

/// One wait's stream.
pub struct Wait {
    pub cache: Arc<RolloutCache>,
    pub key: (String, String),
    pub goal: Goal,
    pub until: Instant,
    pub wait: Duration,
}

impl Wait {
    /// Sends progress on each change of the object until a verdict, the
    /// deadline, its deletion, the caller's loss of the right, or shutdown.
    pub async fn run(
        self,
        mut out: Outbox<pb::WaitForFleetRolloutResponse>,
        mut shutdown: watch::Receiver<bool>,
        mut revoked: streams::Revocation,
    ) {
        let (ns, name) = &self.key;
        let mut changed = self.cache.subscribe();
        let mut last: Option<pb::WaitForFleetRolloutResponse> = None;
        loop {
            let Some(f) = self.cache.get(ns, name) else {
                return out.end(errors::status(
                    Reason::FleetMicroserviceNotFound,
                    format!("FleetMicroservice {ns}/{name} was deleted while waiting"),
                ));
            };
            let msg = message(&f, &self.cache.history(&f), self.goal);
            if last.as_ref() != Some(&msg) {
                if out.send(msg.clone()).await.is_err() {
                    return;
                }
                last = Some(msg.clone());
            }
            if msg.result != R::InProgress as i32 {
                return;
            }
            tokio::select! {
                _ = out.closed() => return,
                _ = streams::shutting_down(&mut shutdown) => {
                    return out.end(errors::status(
                        Reason::ShuttingDown,
                        "the replica is shutting down; ask another replica",
                    ));
                }
                status = revoked.changed() => return out.end(status),
                c = changed.changed() => if c.is_err() { return },
                _ = tokio::time::sleep_until(self.until) => {
                    let mut end = msg;
                    end.result = R::DeadlineExceeded as i32;
                    end.summary = format!("deadline of {:?} exceeded: {}", self.wait, end.summary);
                    let _ = out.send(end).await;
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::spec::FleetMicroserviceStatus;

    fn fms(
        generation: i64,
        observed: Option<i64>,
        phase: Option<RolloutPhase>,
    ) -> FleetMicroservice {
        let mut f: FleetMicroservice = serde_json::from_value(serde_json::json!({
            "apiVersion": "platform.example.io/v1alpha1",
            "kind": "FleetMicroservice",
            "metadata": {"name": "api", "namespace": "team", "generation": generation},
            "spec": {"template": {"image": "registry.example/api:1", "port": 8080}},
        }))
        .expect("a FleetMicroservice");
        f.status = Some(FleetMicroserviceStatus {
            observed_generation: observed,
            phase,
            update_revision_number: observed,
            ..Default::default()
        });
        f
    }

    #[test]
    fn a_verdict_on_an_earlier_generation_never_ends_the_wait() {
        // Just applied: the cache shows generation 3, the controller's
        // status is still the Complete it wrote for generation 2.
        let f = fms(3, Some(2), Some(RolloutPhase::Complete));
        let (r, why) = judge(&f, Goal::Generation(3));
        assert_eq!(r, R::InProgress, "{why}");
        assert!(why.contains("observe generation 3"), "{why}");
        // The cache itself may lag the apiserver: generation 2 everywhere.
        let f = fms(2, Some(2), Some(RolloutPhase::Complete));
        assert_eq!(judge(&f, Goal::Generation(3)).0, R::InProgress);
        // Once observed, the phase decides.
        let f = fms(3, Some(3), Some(RolloutPhase::Progressing));
        assert_eq!(judge(&f, Goal::Generation(3)).0, R::InProgress);
        let f = fms(3, Some(3), Some(RolloutPhase::Complete));
        assert_eq!(judge(&f, Goal::Generation(3)).0, R::Succeeded);
    }

    #[test]
    fn each_terminal_phase_has_its_result_and_a_later_generation_counts() {
        for (phase, want) in [
            (RolloutPhase::Complete, R::Succeeded),
            (RolloutPhase::Failed, R::Failed),
            (RolloutPhase::Degraded, R::Failed),
            (RolloutPhase::RolledBack, R::RolledBack),
            (RolloutPhase::Paused, R::InProgress),
            (RolloutPhase::Progressing, R::InProgress),
        ] {
            let f = fms(5, Some(5), Some(phase));
            assert_eq!(judge(&f, Goal::Generation(4)).0, want, "{phase:?}");
            assert_eq!(judge(&f, Goal::Revision(5)).0, want, "{phase:?}");
        }
        assert_eq!(
            judge(&fms(5, Some(5), None), Goal::Generation(5)).0,
            R::InProgress
        );
        assert_eq!(
            judge(
                &fms(5, Some(4), Some(RolloutPhase::Complete)),
                Goal::Revision(5)
            )
            .0,
            R::InProgress
        );
    }

    #[test]
    fn targets_resolve_or_name_the_field_at_fault() {
        use pb::wait_for_fleet_rollout_request::Target as T;
        let f = fms(7, Some(6), None);
        let history = vec![Revision {
            name: "api-5d8f".into(),
            number: 4,
            data: crate::rollout::revision::RevisionData::of(&f.spec),
            memory: Default::default(),
        }];
        assert_eq!(
            goal(Some(&T::Current(true)), &f, &history),
            Ok(Goal::Generation(7))
        );
        assert_eq!(
            goal(Some(&T::Generation(9)), &f, &history),
            Ok(Goal::Generation(9))
        );
        assert_eq!(
            goal(Some(&T::Revision("4".into())), &f, &history),
            Ok(Goal::Revision(4))
        );
        assert_eq!(
            goal(Some(&T::Revision("api-5d8f".into())), &f, &history),
            Ok(Goal::Revision(4))
        );
        for (bad, field) in [
            (None, "target"),
            (Some(T::Generation(0)), "generation"),
            (Some(T::Current(false)), "current"),
            (Some(T::Revision("9".into())), "revision"),
        ] {
            let refusal = goal(bad.as_ref(), &f, &history).unwrap_err();
            assert_eq!(refusal.reason, Reason::InvalidRequest);
            assert_eq!(refusal.fields[0].0, field);
        }
    }
}
