//! FleetMicroservices, their revisions and rollout state as protobuf
//! messages. Pure.

use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use std::sync::Arc;

use super::convert::{condition, timestamp};
use super::pb;
use crate::rollout::approval;
use crate::rollout::revision::Revision;
use crate::rollout::run::cache::{Key, RolloutCache};
use crate::rollout::run::home::revisions_of;
use crate::rollout::spec::{
    Approval, CheckState, ClusterState, FleetMicroservice, PlacementStatus, RolloutPhase, WaveState,
};

fn time(t: &Time) -> prost_types::Timestamp {
    timestamp(SystemTime::from(t.0))
}

fn revision_ref(name: Option<&String>, history: &[Revision]) -> Option<pb::RevisionRef> {
    name.map(|n| pb::RevisionRef {
        name: n.clone(),
        number: history
            .iter()
            .find(|r| &r.name == n)
            .map_or(0, |r| r.number),
    })
}

fn phase(p: RolloutPhase) -> pb::RolloutPhase {
    use pb::RolloutPhase as P;
    match p {
        RolloutPhase::Progressing => P::Progressing,
        RolloutPhase::Paused => P::Paused,
        RolloutPhase::Complete => P::Complete,
        RolloutPhase::Degraded => P::Degraded,
        RolloutPhase::RolledBack => P::RolledBack,
        RolloutPhase::Failed => P::Failed,
    }
}

fn wave_state(s: WaveState) -> pb::WaveState {
    use pb::WaveState as P;
    match s {
        WaveState::Pending => P::Pending,
        WaveState::AwaitingApproval => P::AwaitingApproval,
        WaveState::Progressing => P::Progressing,
        WaveState::Baking => P::Baking,
        WaveState::Done => P::Done,
        WaveState::Skipped => P::Skipped,
        WaveState::Failed => P::Failed,
    }
}

fn check_state(s: CheckState) -> pb::AnalysisCheckState {
    use pb::AnalysisCheckState as P;
    match s {
        CheckState::Running => P::Running,
        CheckState::Passed => P::Passed,
        CheckState::Failed => P::Failed,
    }
}

fn cluster_state(s: ClusterState) -> pb::ClusterRolloutState {
    use pb::ClusterRolloutState as P;
    match s {
        ClusterState::Pending => P::Pending,
        ClusterState::Updating => P::Updating,
        ClusterState::Done => P::Done,
        ClusterState::Failed => P::Failed,
        ClusterState::Unknown => P::Unknown,
        ClusterState::Removing => P::Removing,
    }
}

/// "2/3" as (2, 3): the status's count text, written by the planner
/// (`plan::report`); anything else is (0, 0).
fn count(text: Option<&str>) -> (u32, u32) {
    text.and_then(|t| t.split_once('/'))
        .and_then(|(n, of)| Some((n.parse().ok()?, of.parse().ok()?)))
        .unwrap_or((0, 0))
}

/// One FleetMicroservice; `history` is its stored revisions, and goes into
/// the message only when `with_history`.
// The text forms are deprecated in the proto and still set, for one release.
#[allow(deprecated)]
pub fn rollout(f: &FleetMicroservice, history: &[Revision], with_history: bool) -> pb::Rollout {
    let st = f.status.clone().unwrap_or_default();
    let approvals = approval::read(f.metadata.annotations.as_ref());
    let mut newest_first: Vec<&Revision> = history.iter().collect();
    newest_first.sort_by_key(|r| std::cmp::Reverse(r.number));
    let (updated, placed) = count(st.updated.as_deref());
    let (available, _) = count(st.available.as_deref());
    pb::Rollout {
        namespace: f.namespace().unwrap_or_default(),
        name: f.name_any(),
        generation: f.metadata.generation.unwrap_or_default(),
        observed_generation: st.observed_generation.unwrap_or_default(),
        phase: st.phase.map(|p| p.as_str().to_string()).unwrap_or_default(),
        rollout_phase: st.phase.map_or(pb::RolloutPhase::Unspecified, phase) as i32,
        clusters_placed: placed,
        clusters_updated: updated,
        clusters_available: available,
        wave: st.wave.clone().unwrap_or_default(),
        image: f.spec.template.image.clone(),
        paused: f.spec.paused,
        update_revision: revision_ref(st.update_revision.as_ref(), history),
        current_revision: revision_ref(st.current_revision.as_ref(), history),
        last_good_revision: revision_ref(st.last_good_revision.as_ref(), history),
        updated: st.updated.clone().unwrap_or_default(),
        available: st.available.clone().unwrap_or_default(),
        waves: st
            .waves
            .iter()
            .map(|w| pb::Wave {
                name: w.name.clone(),
                clusters: w.clusters.clone(),
                state: format!("{:?}", w.state),
                wave_state: wave_state(w.state) as i32,
                started: w.started.as_ref().map(time),
                finished: w.finished.as_ref().map(time),
                manual: f
                    .spec
                    .rollout
                    .waves
                    .iter()
                    .any(|s| s.name == w.name && s.approval == Approval::Manual),
                // Given but not yet used (its wave's turn has not come, or the
                // leader has not planned since): shown too.
                approval: w
                    .approval
                    .as_ref()
                    .or_else(|| {
                        let attempt = approval::Attempt {
                            revision: st.update_revision.as_deref()?,
                            number: st.update_revision_number?,
                        };
                        approval::granted(&approvals.given, &w.name, attempt)
                    })
                    .map(|a| pb::WaveApproval {
                        revision: a.revision.clone(),
                        attempt: a.attempt.unwrap_or_default(),
                        by: a.by.clone(),
                        at: Some(time(&a.at)),
                    }),
                analysis: w
                    .analysis
                    .iter()
                    .map(|c| pb::AnalysisCheck {
                        name: c.name.clone(),
                        state: format!("{:?}", c.state),
                        check_state: check_state(c.state) as i32,
                        failures: c.failures,
                        answer: c.answer.clone(),
                    })
                    .collect(),
            })
            .collect(),
        clusters: st
            .clusters
            .iter()
            .map(|c| pb::ClusterRollout {
                cluster: c.name.clone(),
                revision: c.revision.clone().unwrap_or_default(),
                target: c.target.clone().unwrap_or_default(),
                state: format!("{:?}", c.state),
                cluster_state: cluster_state(c.state) as i32,
                reason: c.reason.clone(),
                message: c.message.clone(),
                since: Some(time(&c.since)),
            })
            .collect(),
        conditions: st.conditions.iter().map(condition).collect(),
        history: if with_history {
            newest_first
                .into_iter()
                .map(|r| pb::RevisionInfo {
                    name: r.name.clone(),
                    number: r.number,
                    image: r.data.template.image.clone(),
                    replicas: r.data.template.replicas,
                    overrides: r.data.overrides.len() as u32,
                })
                .collect()
        } else {
            Vec::new()
        },
        deleting: f.metadata.deletion_timestamp.is_some(),
        placement: st.placement.as_ref().map(|p| placement(f, p)),
    }
}

fn placement(f: &FleetMicroservice, p: &PlacementStatus) -> pb::Placement {
    pb::Placement {
        number_of_clusters: f.spec.placement.number_of_clusters.unwrap_or_default(),
        clusters: p
            .clusters
            .iter()
            .map(|c| pb::PlacedCluster {
                cluster: c.name.clone(),
                role: format!("{:?}", c.role),
                reason: c.reason.clone(),
                message: c.message.clone(),
                since: Some(time(&c.since)),
                unreachable_since: c.unreachable_since.as_ref().map(time),
                unavailable_since: c.unavailable_since.as_ref().map(time),
                replaced_by: c.replaced_by.clone().unwrap_or_default(),
            })
            .collect(),
        history: p
            .history
            .iter()
            .map(|h| pb::PlacementChange {
                time: Some(time(&h.time)),
                reason: h.reason.clone(),
                from: h.from.clone(),
                to: h.to.clone(),
                message: h.message.clone(),
            })
            .collect(),
        last_failover: p.last_failover.as_ref().map(time),
    }
}

/// A DELETE event's rollout: its key only.
pub fn deleted(namespace: &str, name: &str) -> pb::Rollout {
    pb::Rollout {
        namespace: namespace.to_string(),
        name: name.to_string(),
        ..Default::default()
    }
}

/// The rollouts whose namespace `shows` admits, after `after`, ordered by
/// key, with revision numbers. Each is built as it is taken, so a page
/// builds only what it sends; the stored revisions are read once, not
/// once per rollout.
pub fn listed(
    cache: &RolloutCache,
    shows: impl Fn(&str) -> bool,
    after: Option<&Key>,
) -> impl Iterator<Item = pb::Rollout> {
    let key = |f: &FleetMicroservice| (f.namespace().unwrap_or_default(), f.name_any());
    let mut chosen: Vec<(Key, Arc<FleetMicroservice>)> = cache
        .fleet
        .state()
        .into_iter()
        .map(|f| (key(&f), f))
        .filter(|((ns, _), _)| shows(ns))
        .filter(|(k, _)| after.is_none_or(|a| k > a))
        .collect();
    chosen.sort_by(|a, b| a.0.cmp(&b.0));
    let stored = cache.revisions.state();
    chosen.into_iter().map(move |(_, f)| {
        let history: Vec<Revision> = revisions_of(&f, stored.iter().map(|r| r.as_ref()))
            .into_iter()
            .map(|(r, _)| r)
            .collect();
        rollout(&f, &history, false)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_read_from_the_planners_text_and_nothing_else() {
        assert_eq!(count(Some("2/3")), (2, 3));
        assert_eq!(count(Some("0/0")), (0, 0));
        for bad in [None, Some(""), Some("2"), Some("a/3"), Some("-1/3")] {
            assert_eq!(count(bad), (0, 0), "{bad:?}");
        }
    }

    #[test]
    fn every_phase_and_state_has_its_own_enum_value() {
        use std::collections::BTreeSet;
        let phases = [
            RolloutPhase::Progressing,
            RolloutPhase::Paused,
            RolloutPhase::Complete,
            RolloutPhase::Degraded,
            RolloutPhase::RolledBack,
            RolloutPhase::Failed,
        ];
        let values: BTreeSet<i32> = phases.iter().map(|p| phase(*p) as i32).collect();
        assert_eq!(values.len(), phases.len());
        assert!(!values.contains(&0));
        // The enum's name and the status text agree, so a client may show either.
        for p in phases {
            let name = phase(p).as_str_name().replace('_', "");
            assert_eq!(name, format!("ROLLOUTPHASE{}", p.as_str().to_uppercase()));
        }
        assert_eq!(
            wave_state(WaveState::AwaitingApproval),
            pb::WaveState::AwaitingApproval
        );
        assert_eq!(
            check_state(CheckState::Failed),
            pb::AnalysisCheckState::Failed
        );
        assert_eq!(
            cluster_state(ClusterState::Removing),
            pb::ClusterRolloutState::Removing
        );
    }
}
