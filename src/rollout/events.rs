//! The Events a rollout emits: one per state change, found by comparing
//! the status before and after a plan. Pure.

use super::spec::{ClusterState, FleetMicroserviceStatus, RolloutPhase};

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
        if old.map(|o| o.state) != Some(w.state) {
            notes.push(Note {
                warning: false,
                reason: "WaveStateChanged",
                message: format!("wave {} is {:?}", w.name, w.state),
            });
        }
    }
    for c in &after.clusters {
        let old = before.clusters.iter().find(|b| b.name == c.name);
        if old.map(|o| (o.state, &o.target)) != Some((c.state, &c.target)) {
            notes.push(Note {
                warning: c.state == ClusterState::Failed,
                reason: if c.state == ClusterState::Failed {
                    "ClusterFailed"
                } else {
                    "ClusterStateChanged"
                },
                message: if c.state == ClusterState::Failed {
                    // The revision that failed there, not the one a rollback
                    // now gives it.
                    format!(
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
                    )
                } else {
                    format!(
                        "cluster {} is {:?} at {} ({})",
                        c.name,
                        c.state,
                        c.target.as_deref().unwrap_or("no revision"),
                        c.reason
                    )
                },
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

    /// Review: after a rollback, the ClusterFailed Event named the last good
    /// revision (the cluster's new target) as the one that failed.
    #[test]
    fn a_failed_cluster_event_names_the_revision_that_failed() {
        let at = Time("2026-01-01T00:00:00Z".parse().unwrap());
        let cluster = |state, target: &str| ClusterStatus {
            name: "m1".into(),
            revision: Some("api-bad".into()),
            target: Some(target.into()),
            state,
            reason: "ProgressDeadlineExceeded".into(),
            message: String::new(),
            since: at.clone(),
            targeted: None,
        };
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
