//! The Events a rollout emits, found by comparing the status before and
//! after a plan: each phase change, each wave's outcome (done, skipped,
//! failed) and each cluster that failed. Every other step of a cluster or
//! a wave is in the status only: an Event per step cost five home writes
//! per member per release. Pure.

use super::spec::{ClusterState, FleetMicroserviceStatus, RolloutPhase, WaveState};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub warning: bool,
    /// A stable CamelCase reason.
    pub reason: &'static str,
    pub message: String,
}

pub fn changes(before: &FleetMicroserviceStatus, after: &FleetMicroserviceStatus) -> Vec<Note> {
    let mut notes = Vec::new();
    if before.phase != after.phase
        && let Some(phase) = after.phase
    {
        let (warning, reason) = match phase {
            RolloutPhase::Progressing => (false, "RolloutProgressing"),
            RolloutPhase::Paused => (true, "RolloutPaused"),
            RolloutPhase::Complete => (false, "RolloutComplete"),
            RolloutPhase::Degraded => (true, "RolloutDegraded"),
            RolloutPhase::RolledBack => (true, "RolledBack"),
            RolloutPhase::Failed => (true, "RolloutFailed"),
        };
        let why = after
            .conditions
            .iter()
            .find(|c| c.type_ == super::plan::PROGRESSING)
            .map(|c| c.message.clone())
            .unwrap_or_default();
        notes.push(Note {
            warning,
            reason,
            message: format!(
                "revision {}: {}: {why}",
                after.update_revision.as_deref().unwrap_or("-"),
                phase.as_str()
            ),
        });
    }
    for w in &after.waves {
        let old = before.waves.iter().find(|b| b.name == w.name);
        let (warning, reason) = match w.state {
            WaveState::Done => (false, "WaveDone"),
            WaveState::Skipped => (false, "WaveSkipped"),
            WaveState::Failed => (true, "WaveFailed"),
            // Someone has to act: the Event is the notice.
            WaveState::AwaitingApproval => (false, "WaveAwaitingApproval"),
            _ => continue,
        };
        if old.map(|o| o.state) != Some(w.state) {
            notes.push(Note {
                warning,
                reason,
                message: format!(
                    "wave {} is {:?} at revision {}{}",
                    w.name,
                    w.state,
                    after.update_revision.as_deref().unwrap_or("-"),
                    // The check that failed it, with its answer (#35).
                    w.analysis
                        .iter()
                        .find(|c| c.state == super::spec::CheckState::Failed)
                        .map(|c| format!(": analysis {} failed ({})", c.name, c.answer))
                        .unwrap_or_default()
                ),
            });
        }
    }
    for c in &after.clusters {
        let old = before.clusters.iter().find(|b| b.name == c.name);
        let newly_failed = c.state == ClusterState::Failed
            && old.map(|o| (o.state, &o.target)) != Some((c.state, &c.target));
        if newly_failed {
            notes.push(Note {
                warning: true,
                reason: "ClusterFailed",
                // The revision that failed there, not the one a rollback
                // now gives it.
                message: format!(
                    "cluster {} failed revision {} ({}){}",
                    c.name,
                    after.update_revision.as_deref().unwrap_or("-"),
                    c.reason,
                    match c.target.as_deref() {
                        Some(t) if Some(t) != after.update_revision.as_deref() => {
                            format!("; going back to {t}")
                        }
                        _ => String::new(),
                    }
                ),
            });
        }
    }
    // Each failover or failback decided since (the history is bounded,
    // so a change is new when the history before does not hold it).
    let old = before
        .placement
        .as_ref()
        .map(|p| p.history.as_slice())
        .unwrap_or_default();
    for h in after.placement.iter().flat_map(|p| &p.history) {
        if !old.contains(h) {
            notes.push(Note {
                warning: h.reason != "FailedBack",
                reason: if h.reason == "FailedBack" {
                    "FailedBack"
                } else {
                    "FailedOver"
                },
                message: format!("placement moved from {} to {}: {}", h.from, h.to, h.message),
            });
        }
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::spec::ClusterStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    /// Cluster m1 in `state`, at `revision` and given `target`.
    fn m1(state: ClusterState, revision: &str, target: &str, reason: &str) -> ClusterStatus {
        ClusterStatus {
            name: "m1".into(),
            revision: Some(revision.into()),
            target: Some(target.into()),
            state,
            reason: reason.into(),
            message: String::new(),
            since: Time("2026-01-01T00:00:00Z".parse().unwrap()),
            targeted: None,
        }
    }

    /// A release through a wave: the steps of clusters and waves are status
    /// only; the wave's outcome and the phase are Events.
    #[test]
    fn a_failover_is_one_event() {
        use crate::rollout::spec::{PlacementChange, PlacementStatus};
        let change = PlacementChange {
            time: Time("2026-01-01T00:00:00Z".parse().unwrap()),
            reason: "Unreachable".into(),
            from: "m1".into(),
            to: "m3".into(),
            message: "unreachable for 60s; replaced by m3".into(),
        };
        let before = FleetMicroserviceStatus::default();
        let after = FleetMicroserviceStatus {
            placement: Some(PlacementStatus {
                history: vec![change],
                ..Default::default()
            }),
            ..Default::default()
        };
        let notes = changes(&before, &after);
        assert_eq!(notes.len(), 1);
        assert_eq!(notes[0].reason, "FailedOver");
        assert!(notes[0].warning);
        assert!(changes(&after, &after).is_empty(), "once");
    }

    #[test]
    fn steps_are_status_and_outcomes_are_events() {
        use crate::rollout::spec::WaveStatus;
        let cluster = |state| m1(state, "api-2", "api-2", "");
        let wave = |state| WaveStatus {
            name: "canary".into(),
            clusters: vec!["m1".into()],
            state,
            started: None,
            finished: None,
            approval: None,
            analysis: vec![],
        };
        let status = |c, w, phase| FleetMicroserviceStatus {
            update_revision: Some("api-2".into()),
            phase: Some(phase),
            clusters: vec![cluster(c)],
            waves: vec![wave(w)],
            ..Default::default()
        };
        let pending = status(
            ClusterState::Pending,
            WaveState::Pending,
            RolloutPhase::Progressing,
        );
        let updating = status(
            ClusterState::Updating,
            WaveState::Progressing,
            RolloutPhase::Progressing,
        );
        let baking = status(
            ClusterState::Done,
            WaveState::Baking,
            RolloutPhase::Progressing,
        );
        let done = status(ClusterState::Done, WaveState::Done, RolloutPhase::Complete);
        assert!(changes(&pending, &updating).is_empty());
        assert!(changes(&updating, &baking).is_empty());
        let reasons: Vec<_> = changes(&baking, &done).iter().map(|n| n.reason).collect();
        assert_eq!(reasons, ["RolloutComplete", "WaveDone"]);
    }

    /// Review: after a rollback, the ClusterFailed Event named the last good
    /// revision (the cluster's new target) as the one that failed.
    #[test]
    fn a_failed_cluster_event_names_the_revision_that_failed() {
        let cluster =
            |state, target: &str| m1(state, "api-bad", target, "ProgressDeadlineExceeded");
        let before = FleetMicroserviceStatus {
            update_revision: Some("api-bad".into()),
            clusters: vec![cluster(ClusterState::Updating, "api-bad")],
            ..Default::default()
        };
        let after = FleetMicroserviceStatus {
            update_revision: Some("api-bad".into()),
            clusters: vec![cluster(ClusterState::Failed, "api-good")],
            ..Default::default()
        };
        let notes = changes(&before, &after);
        let failed = notes.iter().find(|n| n.reason == "ClusterFailed").unwrap();
        assert!(failed.warning);
        assert_eq!(
            failed.message,
            "cluster m1 failed revision api-bad (ProgressDeadlineExceeded); going back to api-good"
        );
    }
}
