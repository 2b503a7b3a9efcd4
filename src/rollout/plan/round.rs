//! What every stage of one round reads: the inputs, the checked spec, and
//! the facts about the update revision that the last status holds.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::{Checked, Inputs, PROGRESSING};
use crate::rollout::approval::Attempt;
use crate::rollout::gate::stamp;
use crate::rollout::revision::Revision;
use crate::rollout::spec::{ClusterState, ClusterStatus, WaveStatus};

/// The Progressing reason a paused round writes; read back to know that
/// this round resumes.
pub const PAUSED: &str = "Paused";

pub struct Round<'a> {
    pub i: &'a Inputs<'a>,
    pub spec: &'a Checked,
    /// `now` as a status stamp.
    pub now: Time,
    /// The update revision's name.
    pub update: &'a str,
    /// The last status was planned for this same update revision.
    pub same_update: bool,
    pub revisions: BTreeMap<&'a str, &'a Revision>,
    /// The revision that ran to completion last, if any: the status
    /// remembers; its revisions do too, for a status that was lost (review L13).
    pub last_good: Option<String>,
    /// The update revision is the last good one.
    pub is_good: bool,
    /// The update revision failed before (recorded in the status or on it).
    pub failed_before: bool,
    /// The last round was paused and this one is not.
    pub resumed: bool,
    /// The last status's clusters and waves by name: each looked up once
    /// per row or wave, so a round stays near linear in both (#59).
    prev_clusters: BTreeMap<&'a str, &'a ClusterStatus>,
    prev_waves: BTreeMap<&'a str, &'a WaveStatus>,
}

impl<'a> Round<'a> {
    pub fn new(i: &'a Inputs<'a>, spec: &'a Checked) -> Self {
        let prev = i.previous;
        let update = i.update.name.as_str();
        let revisions: BTreeMap<&str, &Revision> =
            i.revisions.iter().map(|r| (r.name.as_str(), r)).collect();
        let last_good = prev
            .last_good_revision
            .clone()
            .or_else(|| i.update.memory.good_before.clone())
            .filter(|n| revisions.contains_key(n.as_str()));
        Round {
            i,
            spec,
            now: stamp(i.now),
            update,
            same_update: prev.update_revision.as_deref() == Some(update)
                && prev.update_revision_number == Some(i.update.number),
            is_good: last_good.as_deref() == Some(update),
            last_good,
            failed_before: prev.failed_revision_number == Some(i.update.number)
                || i.update.failed(),
            resumed: !spec.paused
                && prev
                    .conditions
                    .iter()
                    .any(|c| c.type_ == PROGRESSING && c.reason == PAUSED),
            revisions,
            prev_clusters: prev.clusters.iter().map(|c| (c.name.as_str(), c)).collect(),
            prev_waves: prev.waves.iter().map(|w| (w.name.as_str(), w)).collect(),
        }
    }

    /// The attempt at the update revision: approvals name it (#59).
    pub fn attempt(&self) -> Attempt<'a> {
        Attempt {
            revision: self.update,
            number: self.i.update.number,
        }
    }

    /// The cluster's entry in the last status.
    pub fn prev_of(&self, name: &str) -> Option<&'a ClusterStatus> {
        self.prev_clusters.get(name).copied()
    }

    /// The wave's entry in the last status, for this same update revision.
    pub fn prev_wave(&self, name: &str) -> Option<&'a WaveStatus> {
        self.prev_waves
            .get(name)
            .copied()
            .filter(|_| self.same_update)
    }

    /// When the wave passed for this update revision, if it did.
    pub fn finished_before(&self, wave: &str) -> Option<Time> {
        self.prev_wave(wave).and_then(|w| w.finished.clone())
    }

    /// The last status had this cluster done at this update revision.
    pub fn was_done(&self, p: &ClusterStatus) -> bool {
        self.same_update
            && p.state == ClusterState::Done
            && p.target.as_deref() == Some(self.update)
    }
}
