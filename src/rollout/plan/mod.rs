//! The rollout planner: from what is observed now to what to write next.
//!
//! Pure and level-triggered. The inputs are the checked spec, the
//! revisions, every cluster's labels and its member object as the status
//! index sees it, the status last written (which holds the decisions that
//! must survive: the last good revision, a failed revision, when each
//! cluster was targeted and since when it is done), and the clock. A new
//! leader that reads the same inputs makes the same plan, so it continues
//! where the old one stopped. The edge writes the status before it acts on
//! the plan.
//!
//! One round is a pipeline of pure stages (#58), each in its own file:
//! `rows` classifies the clusters, `failures` finds what failed and why
//! (as data), `gates` decides each wave's gate (every rule a wave obeys is
//! a function there), `targets` chooses the revision each cluster is given
//! and the writes, and `report` says it all in the status.

mod bound;
mod failures;
mod gates;
mod report;
mod round;
mod rows;
mod targets;

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;

pub use self::failures::{Cause, Failure};
use super::analysis;
use super::approval::Approvals;
pub use super::checked::{Checked, DEFAULT_DEADLINE, MAX_SPAN};
use super::gate::stamp;
use super::placement::Labels;
use super::revision::Revision;
use super::spec::{FleetMicroserviceStatus, RolloutPhase};
use super::trouble::Trouble;
use crate::domain::conditions::{self, Status, Verdict};
use crate::status::view::EntryState;

pub const PROGRESSING: &str = conditions::PROGRESSING;
pub const AVAILABLE: &str = conditions::AVAILABLE;
pub const ROLLED_BACK: &str = "RolledBack";
/// The reason of a cluster that left the registry while its wave ran.
pub const NOT_REGISTERED: &str = "NotRegistered";
/// The reason of a cluster whose labels cannot be read.
pub const LABELS_UNKNOWN: &str = "LabelsUnknown";

/// A member's Microservice, as the status index sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Member {
    /// It carries this FleetMicroservice's label; anything else is never written.
    pub ours: bool,
    /// Its revision annotation.
    pub revision: Option<String>,
    /// The digest of its spec ([`super::placement::digest`]).
    pub digest: u64,
    /// Its metadata.generation: analysis evidence is bound to it (#35).
    pub generation: i64,
    /// Its truthful state at its own generation (reachability folded in).
    pub state: EntryState,
    pub reason: String,
    pub message: String,
}

/// One registered member cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct Cluster {
    pub name: String,
    /// `None` when its labels cannot be read: it is neither written nor emptied.
    pub labels: Option<Labels>,
    pub reachable: bool,
    /// Its caches were listed at least once, so `member` is known.
    pub synced: bool,
    pub member: Option<Member>,
}

pub struct Inputs<'a> {
    /// The FleetMicroservice's name, which the member objects carry.
    pub name: &'a str,
    /// Its uid: a counted placement ranks clusters by it.
    pub uid: &'a str,
    pub generation: i64,
    /// The spec of this generation, checked once ([`super::checked::check`]),
    /// or why it cannot be planned.
    pub checked: Result<&'a Checked, &'a str>,
    /// The revision of the spec as it is now.
    pub update: &'a Revision,
    /// Every stored revision, the update revision included.
    pub revisions: &'a [Revision],
    pub previous: &'a FleetMicroserviceStatus,
    pub clusters: &'a [Cluster],
    /// What the last write to each cluster found, when it went wrong.
    pub troubles: &'a BTreeMap<String, Trouble>,
    /// The clock; status stamps keep its whole seconds.
    pub now: Timestamp,
    /// When this leader's term began, on the same clock: stamps older than
    /// it may come from another replica's clock.
    pub term_started: Timestamp,
    /// The approvals given for `Manual` waves (#35), from the object's annotation.
    pub approvals: &'a Approvals,
    /// This term's analysis runs for this object (#35).
    pub runs: &'a [analysis::Run],
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Action {
    /// Write the member object from this revision (create or replace).
    Apply { cluster: String, revision: String },
    /// Delete this FleetMicroservice's member object.
    Delete { cluster: String },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub actions: Vec<Action>,
    pub status: FleetMicroserviceStatus,
    /// Plan again after this long even if nothing changes: a bake or a
    /// deadline ends then.
    pub requeue_after: Option<Duration>,
    /// Analysis checks to run now (#35).
    pub checks: Vec<analysis::Due>,
}

/// The soonest time to plan again, as the stages find reasons to.
#[derive(Clone, Copy, Debug, Default)]
struct Soon(Option<Duration>);

impl Soon {
    fn at(&mut self, d: Duration) {
        self.0 = Some(self.0.map_or(d, |r| r.min(d)));
    }
}

/// One planning round: the stages, chained.
pub fn plan(i: &Inputs) -> Plan {
    let spec = match i.checked {
        Ok(spec) => spec,
        Err(message) => return invalid(i, message.to_string()),
    };
    let round = round::Round::new(i, spec);
    let mut soon = Soon::default();
    let counted = spec
        .counted
        .as_ref()
        .map(|s| rows::counted_placement(&round, s));
    if let Some(d) = counted.as_ref().and_then(|p| p.requeue) {
        soon.at(d);
    }
    let rows = rows::classify(&round, counted.as_ref());
    let failures = failures::find(&round, &rows, &mut soon);
    let gates = gates::decide(&round, &rows, &failures, &mut soon);
    let mode = targets::mode(&round, gates.over_budget);
    let chosen = targets::choose(&round, &rows, &gates, &failures, &mode, &mut soon);
    let chosen = targets::fail_over(chosen, &round, counted.as_ref(), &mode);
    let writes = targets::writes(&round, &rows, &chosen, &mode, counted.is_some());
    let mut p = report::plan(report::Decided {
        round: &round,
        rows: &rows,
        failures: &failures,
        gates,
        mode,
        chosen,
        writes,
        counted,
        soon,
    });
    p.status = bound::status(p.status);
    p
}

/// [`plan`] behind a catch-panic boundary: a defect that one spec
/// triggers fails that FleetMicroservice (`InvalidSpec`, nothing written)
/// and leaves the replica and every other rollout running (review H2).
pub fn plan_guarded(i: &Inputs) -> Plan {
    guarded(i, || {
        #[cfg(feature = "fault-hooks")]
        if crate::supervise::plan_panic(i.name) {
            panic!("injected planner fault");
        }
        plan(i)
    })
}

fn guarded(i: &Inputs, planner: impl FnOnce() -> Plan) -> Plan {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(planner)) {
        Ok(p) => p,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".into());
            tracing::error!(flotilla.fleet_microservice = i.name, panic = %what, "the rollout planner panicked");
            invalid(
                i,
                format!(
                    "the planner failed on this spec ({what}); nothing is written until it changes"
                ),
            )
        }
    }
}

/// A spec that cannot be planned: say why, and write nothing.
fn invalid(i: &Inputs, message: String) -> Plan {
    let now = stamp(i.now);
    let verdicts = [Verdict::new(
        PROGRESSING,
        Status::False,
        "InvalidSpec",
        message,
    )];
    let mut status = i.previous.clone();
    status.observed_generation = Some(i.generation);
    status.phase = Some(RolloutPhase::Failed);
    status.conditions =
        conditions::transition(&i.previous.conditions, &verdicts, i.generation, &now);
    Plan {
        actions: Vec::new(),
        status: bound::status(status),
        requeue_after: None,
        checks: Vec::new(),
    }
}

#[cfg(test)]
mod tests;
