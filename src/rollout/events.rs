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
                message: format!(
                    "cluster {} is {:?} at {} ({})",
                    c.name,
                    c.state,
                    c.target.as_deref().unwrap_or("no revision"),
                    c.reason
                ),
            });
        }
    }
    notes
}
