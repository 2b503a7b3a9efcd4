//! Stage 2: which clusters failed the update revision, and why, as data.
//!
//! A failure has a cause (an enum the later stages decide on) and a
//! message for people. Once failed, a cluster stays failed until it is
//! done: a budget must not leak.

use std::collections::BTreeMap;
use std::time::Duration;

use super::Soon;
use super::round::Round;
use super::rows::{Row, Rows};
use super::{LABELS_UNKNOWN, NOT_REGISTERED};
use crate::rollout::gate::{self, left};
use crate::rollout::spec::{CLUSTER_UNREACHABLE, ClusterState};
use crate::rollout::trouble::Trouble;
use crate::status::view::EntryState;

const DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";
const OWNERSHIP_CONFLICT: &str = "OwnershipConflict";

/// Why a cluster failed the update revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cause {
    /// A Microservice this FleetMicroservice did not create is in the way.
    OwnershipConflict,
    /// The member object failed at the update revision, for this reason.
    Member(String),
    /// The member refuses the write, or cannot hold what is written.
    Write(&'static str),
    /// Not done within the progress deadline.
    Deadline,
    /// Not answering, and not done within the progress deadline.
    Unreachable,
    /// It left the registry while its wave ran, and did not come back.
    NotRegistered,
    /// Its labels cannot be read, and did not recover.
    LabelsUnknown,
}

impl Cause {
    /// The reason the status shows.
    pub fn reason(&self) -> &str {
        match self {
            Cause::OwnershipConflict => OWNERSHIP_CONFLICT,
            Cause::Member(reason) => reason,
            Cause::Write(reason) => reason,
            Cause::Deadline => DEADLINE_EXCEEDED,
            Cause::Unreachable => CLUSTER_UNREACHABLE,
            Cause::NotRegistered => NOT_REGISTERED,
            Cause::LabelsUnknown => LABELS_UNKNOWN,
        }
    }

    /// A failure that a deadline decided, as the last status wrote it:
    /// these are carried until the cluster is done.
    fn of_deadline(reason: &str) -> Option<Cause> {
        match reason {
            DEADLINE_EXCEEDED => Some(Cause::Deadline),
            CLUSTER_UNREACHABLE => Some(Cause::Unreachable),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub cause: Cause,
    /// For people.
    pub message: String,
}

impl Failure {
    fn new(cause: Cause, message: impl Into<String>) -> Self {
        Failure {
            cause,
            message: message.into(),
        }
    }
}

pub type Failures<'a> = BTreeMap<&'a str, Failure>;

pub fn find<'a>(round: &Round<'a>, rows: &'a Rows<'a>, soon: &mut Soon) -> Failures<'a> {
    let mut failures = Failures::new();
    for (wave, members) in &rows.waves {
        let finished = round.finished_before(wave).is_some();
        for r in rows.of_wave(members) {
            if let Some(f) = of_row(round, r, finished, soon) {
                failures.insert(r.name(), f);
            }
        }
    }
    // A cluster gone from the registry mid-wave, or whose labels cannot be
    // read, fails after the deadline: a decommissioned canary or a broken
    // labels file cannot hold a rollout forever (review H3, M7).
    if round.failed_before || round.spec.paused {
        return failures;
    }
    let absent = rows
        .ghosts
        .iter()
        .map(|g| (*g, Cause::NotRegistered))
        .chain(
            rows.unknown
                .iter()
                .filter(|c| rows.in_a_wave(&c.name))
                .map(|c| (c.name.as_str(), Cause::LabelsUnknown)),
        );
    for (name, cause) in absent {
        if let Some(f) = of_absent(round, name, cause, soon) {
            failures.insert(name, f);
        }
    }
    failures
}

/// The failure of one placed cluster, if it failed.
fn of_row(round: &Round, r: &Row, finished: bool, soon: &mut Soon) -> Option<Failure> {
    if r.foreign {
        return Some(Failure::new(
            Cause::OwnershipConflict,
            "a Microservice this FleetMicroservice did not create is in the way; it is never overwritten",
        ));
    }
    if round.failed_before {
        return None;
    }
    let update = round.update;
    let member = r.c.member.as_ref();
    if r.at_is(update)
        && let Some(m) = member.filter(|m| m.state == EntryState::Failed)
    {
        return Some(Failure::new(Cause::Member(m.reason.clone()), &m.message));
    }
    // The member refuses the write, or cannot hold what is written:
    // failed now, not at the deadline (review M1, M2).
    if let Some(t) = r.trouble(round, update).filter(|t| t.permanent())
        && !round.is_good
    {
        return Some(refused(t));
    }
    // A deadline missed stays missed until the cluster is done, even once
    // its wave finished: the budget must not leak.
    let missed = r.prev.filter(|p| {
        round.same_update && p.state == ClusterState::Failed && p.target.as_deref() == Some(update)
    });
    if let Some(p) = missed.filter(|_| !r.done_at_update)
        && let Some(cause) = Cause::of_deadline(&p.reason)
    {
        return Some(Failure::new(cause, &p.message));
    }
    deadline(round, r, finished, soon)
}

fn refused(t: &Trouble) -> Failure {
    Failure::new(Cause::Write(t.reason()), t.message())
}

/// The progress deadline of a cluster given the update revision.
fn deadline(round: &Round, r: &Row, finished: bool, soon: &mut Soon) -> Option<Failure> {
    let spec = round.spec;
    let targeted = r.given(round.update);
    // Once good, a cluster that joins, or stops being done, still owes it
    // within the deadline (review L5): counted from when it stopped being
    // done (`targeted` restarts then, in the report), so a blip is not a
    // failure. It degrades the rollout; it never rolls back a revision
    // that completed.
    if !targeted || r.done_at_update || (finished && !round.is_good) {
        return None;
    }
    // Paused, the clock stops; the round that resumes restarts it.
    if spec.paused {
        return None;
    }
    // Done until this round: its deadline starts now.
    if round.resumed || r.prev.is_some_and(|p| round.was_done(p)) {
        soon.at(spec.deadline + Duration::from_secs(1));
        return None;
    }
    let since = r
        .prev
        .filter(|_| round.same_update)
        .and_then(|p| p.targeted.clone())?;
    let since = gate::trusted(&since, spec.deadline, round.i.term_started);
    if let Some(rest) = left(round.i.now, &since, spec.deadline) {
        soon.at(rest);
        return None;
    }
    Some(if !r.answering() {
        Failure::new(
            Cause::Unreachable,
            format!(
                "not answering, and not done within the progress deadline ({:?})",
                spec.deadline
            ),
        )
    } else {
        Failure::new(
            Cause::Deadline,
            format!(
                "not done within the progress deadline ({:?})",
                spec.deadline
            ),
        )
    })
}

/// A cluster gone from the registry or of unreadable labels, in a wave.
fn of_absent(round: &Round, name: &str, cause: Cause, soon: &mut Soon) -> Option<Failure> {
    let deadline = round.spec.deadline;
    let p = round
        .prev_of(name)
        .filter(|p| round.same_update && p.reason == cause.reason());
    let Some(p) = p else {
        soon.at(deadline + Duration::from_secs(1));
        return None;
    };
    if p.state == ClusterState::Failed {
        return Some(Failure::new(cause, &p.message));
    }
    let since = gate::trusted(&p.since, deadline, round.i.term_started);
    if let Some(rest) = left(round.i.now, &since, deadline) {
        soon.at(rest);
        return None;
    }
    let what = match cause {
        Cause::NotRegistered => "left the registry while its wave ran",
        _ => "its labels cannot be read, so its placement is unknown",
    };
    Some(Failure::new(
        cause,
        format!("{what}, and did not recover within the progress deadline ({deadline:?})"),
    ))
}
