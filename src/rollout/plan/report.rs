//! Stage 5: the status that says what this round decided, and the plan.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::failures::{Cause, Failures};
use super::gates::{Gates, Hold};
use super::round::{PAUSED, Round};
use super::rows::{Row, Rows};
use super::targets::{Chosen, Mode, Writes};
use super::{AVAILABLE, Cluster, LABELS_UNKNOWN, PROGRESSING, Plan, ROLLED_BACK, Soon};
use crate::domain::conditions::{self, Status, Verdict};
use crate::rollout::approval;
use crate::rollout::failover::choose::Placed;
use crate::rollout::gate::Gate;
use crate::rollout::leaving::Leave;
use crate::rollout::spec::{
    CLUSTER_UNREACHABLE, CheckState, ClusterState, ClusterStatus, FleetMicroserviceStatus,
    RolloutPhase, WaveState, WaveStatus,
};

/// Everything the stages before decided.
pub struct Decided<'r, 'a> {
    pub round: &'r Round<'a>,
    pub rows: &'r Rows<'a>,
    pub failures: &'r Failures<'a>,
    pub gates: Gates,
    pub mode: Mode,
    pub chosen: Chosen<'r>,
    pub writes: Writes<'a>,
    pub counted: Option<Placed>,
    pub soon: Soon,
}

/// Why a placed cluster is given nothing yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Waiting {
    Paused,
    HeldOnFailure,
    Unreachable,
    ForWave,
}

impl Waiting {
    fn reason(self) -> &'static str {
        match self {
            Waiting::Paused => PAUSED,
            Waiting::HeldOnFailure => "HeldOnFailure",
            Waiting::Unreachable => CLUSTER_UNREACHABLE,
            Waiting::ForWave => "WaitingForWave",
        }
    }
}

/// How far the update revision got, over the placed clusters.
struct Whole {
    placed: usize,
    updated: usize,
    available: usize,
    complete: bool,
    degraded: bool,
    proven: bool,
    phase: RolloutPhase,
}

pub fn plan(d: Decided) -> Plan {
    let round = d.round;
    let mut clusters: Vec<ClusterStatus> = d.rows.placed.iter().map(|r| placed(&d, r)).collect();
    clusters.extend(unplaced(&d));
    clusters.sort_by(|a, b| a.name.cmp(&b.name));
    let waves = waves(&d, &clusters);
    let whole = whole(&d);
    let failed_clusters = failed_clusters(&d);
    let verdicts = verdicts(&d, &whole, &failed_clusters, &waves);
    let prev = round.i.previous;
    let status = FleetMicroserviceStatus {
        observed_generation: Some(round.i.generation),
        current_revision: uniform(d.rows)
            .map(str::to_string)
            .or_else(|| prev.current_revision.clone()),
        update_revision: Some(round.update.to_string()),
        update_revision_number: Some(round.i.update.number),
        last_good_revision: if whole.complete && whole.proven {
            Some(round.update.to_string())
        } else {
            round.last_good.clone()
        },
        reached_clusters: reached(prev, round.i.clusters, &d.chosen.targets),
        failed_clusters: match &d.mode {
            Mode::RollBack(_) | Mode::Failed => failed_clusters,
            _ => Vec::new(),
        },
        failed_revision_number: match &d.mode {
            Mode::RollBack(_) | Mode::Failed => Some(round.i.update.number),
            _ => prev
                .failed_revision_number
                .filter(|n| *n == round.i.update.number),
        },
        phase: Some(whole.phase),
        wave: d.chosen.current_wave.clone().filter(|_| {
            matches!(
                whole.phase,
                RolloutPhase::Progressing | RolloutPhase::Paused
            )
        }),
        updated: Some(format!("{}/{}", whole.updated, whole.placed)),
        available: Some(format!("{}/{}", whole.available, whole.placed)),
        waves,
        clusters,
        placement: d.counted.map(|p| p.status),
        conditions: conditions::transition(
            &prev.conditions,
            &verdicts,
            round.i.generation,
            &round.now,
        ),
    };
    Plan {
        actions: d.writes.actions,
        status,
        requeue_after: d
            .soon
            .0
            .filter(|_| d.mode.writes() || matches!(d.mode, Mode::HeldOnFailure)),
        checks: match d.mode {
            Mode::Progress => d.gates.checks,
            _ => Vec::new(),
        },
    }
}

/// A placed cluster's state.
fn placed(d: &Decided, r: &Row) -> ClusterStatus {
    let round = d.round;
    let update = round.update;
    let target = d.chosen.targets.get(r.name()).cloned().flatten();
    let member = r.c.member.as_ref();
    let at_target = target.as_deref().is_some_and(|t| r.at_is(t));
    let (state, reason, message) = if let Some(f) = d.failures.get(r.name()) {
        (
            ClusterState::Failed,
            f.cause.reason().to_string(),
            f.message.clone(),
        )
    } else if target.is_none() {
        let why = match d.mode {
            Mode::Paused => Waiting::Paused,
            Mode::HeldOnFailure => Waiting::HeldOnFailure,
            _ if !r.answering() => Waiting::Unreachable,
            _ => Waiting::ForWave,
        };
        (
            ClusterState::Pending,
            why.reason().to_string(),
            String::new(),
        )
    } else if !r.answering() {
        (
            ClusterState::Unknown,
            CLUSTER_UNREACHABLE.to_string(),
            member.map(|m| m.message.clone()).unwrap_or_default(),
        )
    } else if let Some(m) = member.filter(|_| at_target) {
        let state = match r.done() {
            true => ClusterState::Done,
            false => ClusterState::Updating,
        };
        (state, m.reason.clone(), m.message.clone())
    } else if let Some(t) = target.as_deref().and_then(|t| r.trouble(round, t)) {
        (ClusterState::Updating, t.reason().to_string(), t.message())
    } else {
        (ClusterState::Updating, "Writing".to_string(), String::new())
    };
    // After a rollback, a cluster the failed revision reached says which
    // one failed, at every step of going back, not only where it is now.
    let here = d.failures.contains_key(r.name())
        || (round.failed_before
            && round
                .i
                .previous
                .failed_clusters
                .iter()
                .any(|f| f == r.name()));
    let (reason, message) = match &d.mode {
        Mode::RollBack(good)
            if state != ClusterState::Failed
                && (here || r.given(update) || r.prev.is_some_and(|p| p.reason == ROLLED_BACK)) =>
        {
            (
                ROLLED_BACK.to_string(),
                format!(
                    "revision {update} failed{}; {} {good}",
                    if here { " here" } else { "" },
                    if state == ClusterState::Done {
                        "back on"
                    } else {
                        "going back to"
                    }
                ),
            )
        }
        _ => (reason, message),
    };
    let carried = r.prev.filter(|p| p.target == target);
    let done = state == ClusterState::Done;
    // A done cluster whose member's reason changes is still done since
    // then: its bake goes on (review L11).
    let since = carried
        .filter(|p| p.state == state && (done || p.reason == reason))
        .map_or_else(|| round.now.clone(), |p| p.since.clone());
    // The deadline counts from the target's choice, and again from when a
    // done cluster stops being done (review L5); resuming restarts it for
    // what is not done yet.
    let restart =
        !done && (round.resumed || carried.is_some_and(|p| p.state == ClusterState::Done));
    ClusterStatus {
        name: r.c.name.clone(),
        revision: r.at.map(str::to_string),
        since,
        targeted: target.as_ref().map(|_| {
            carried
                .and_then(|p| p.targeted.clone())
                .filter(|_| !restart)
                .unwrap_or_else(|| round.now.clone())
        }),
        target,
        state,
        reason,
        message,
    }
}

/// The clusters that are not placed: unknown, leaving, kept, and ghosts.
fn unplaced(d: &Decided) -> Vec<ClusterStatus> {
    let rows = d.rows;
    let mut out: Vec<ClusterStatus> = rows
        .unknown
        .iter()
        .chain(rows.leaving.iter())
        .map(|c| leaving(d, c))
        .collect();
    out.extend(rows.kept.iter().map(|c| kept(d, c)));
    out.extend(rows.ghosts.iter().map(|g| ghost(d, g)));
    out
}

/// A cluster of unknown labels, or one leaving the placement.
fn leaving(d: &Decided, c: &Cluster) -> ClusterStatus {
    let (state, reason, message) = match d.writes.removals.get(c.name.as_str()) {
        _ if let Some(f) = d.failures.get(c.name.as_str()) => {
            (ClusterState::Failed, LABELS_UNKNOWN, f.message.clone())
        }
        _ if c.labels.is_none() => (ClusterState::Unknown, LABELS_UNKNOWN, String::new()),
        Some(Leave::Waits(wave)) => (
            ClusterState::Removing,
            "WaitingToLeave",
            format!("left the placement; removed after the clusters of wave {wave} that leave"),
        ),
        _ => (ClusterState::Removing, "LeftPlacement", String::new()),
    };
    ClusterStatus {
        name: c.name.clone(),
        revision: c.member.as_ref().and_then(|m| m.revision.clone()),
        target: None,
        since: since_in(d.round, &c.name, state),
        state,
        reason: reason.into(),
        message,
        targeted: None,
    }
}

/// A cluster a counted placement replaced, kept until its successor is up.
fn kept(d: &Decided, c: &Cluster) -> ClusterStatus {
    let why = d
        .counted
        .as_ref()
        .and_then(|p| p.status.clusters.iter().find(|p| p.name == c.name));
    ClusterStatus {
        name: c.name.clone(),
        revision: c.member.as_ref().and_then(|m| m.revision.clone()),
        target: None,
        state: ClusterState::Removing,
        reason: "Replaced".into(),
        message: format!(
            "{}; its Microservice stays until the cluster that took its place is available and this one answers",
            why.map_or("replaced", |w| w.message.as_str())
        ),
        since: since_in(d.round, &c.name, ClusterState::Removing),
        targeted: None,
    }
}

/// Since when the cluster has been in this state, by the last status.
fn since_in(round: &Round, name: &str, state: ClusterState) -> Time {
    round
        .prev_of(name)
        .filter(|p| p.state == state)
        .map_or_else(|| round.now.clone(), |p| p.since.clone())
}

/// A cluster gone from the registry while its wave ran.
fn ghost(d: &Decided, g: &str) -> ClusterStatus {
    let p = d.round.prev_of(g);
    let (state, reason, message) = match d.failures.get(g) {
        Some(f) => (ClusterState::Failed, f.cause.reason().to_string(), f.message.clone()),
        None => (
            ClusterState::Unknown,
            Cause::NotRegistered.reason().to_string(),
            "left the registry while its wave ran; the wave waits for it until the progress deadline".to_string(),
        ),
    };
    ClusterStatus {
        name: g.to_string(),
        revision: p.and_then(|p| p.revision.clone()),
        target: p.and_then(|p| p.target.clone()),
        since: p
            .filter(|p| p.reason == reason && p.state == state)
            .map_or_else(|| d.round.now.clone(), |p| p.since.clone()),
        targeted: p.and_then(|p| p.targeted.clone()),
        state,
        reason,
        message,
    }
}

/// Each wave's status.
fn waves(d: &Decided, clusters: &[ClusterStatus]) -> Vec<WaveStatus> {
    let round = d.round;
    let update = round.update;
    let targeted: std::collections::BTreeSet<&str> = clusters
        .iter()
        .filter(|c| c.target.as_deref() == Some(update))
        .map(|c| c.name.as_str())
        .collect();
    d.rows
        .waves
        .iter()
        .zip(&d.gates.per_wave)
        .map(|((name, members), g)| {
            let before = round.prev_wave(name);
            // Only a wave its rules opened, or one that passed, starts:
            // whatever its clusters hold (one may have come into it holding
            // the release, #59), in any mode.
            let opens = d.chosen.opened.as_deref() == Some(name.as_str())
                || matches!(g, Gate::Done(_) | Gate::Baking(_));
            let started_now = opens && members.iter().any(|n| targeted.contains(n.as_str()));
            let started = before
                .and_then(|w| w.started.clone())
                .or_else(|| started_now.then(|| round.now.clone()));
            let awaiting = d.chosen.hold == Some(Hold::Approval)
                && d.chosen.current_wave.as_deref() == Some(name.as_str());
            let state = match g {
                _ if awaiting => WaveState::AwaitingApproval,
                Gate::Done(_) => WaveState::Done,
                Gate::Baking(_) => WaveState::Baking,
                Gate::Skipped => WaveState::Skipped,
                Gate::Failed => WaveState::Failed,
                Gate::Progressing if started.is_some() => WaveState::Progressing,
                Gate::Progressing => WaveState::Pending,
            };
            // The approval that opened it, kept once the annotation drops
            // it; recorded only once the wave started, so an approval taken
            // back before then opens nothing (#59).
            let approval = approval::granted(&round.i.approvals.given, name, round.attempt())
                .cloned()
                .or_else(|| before.and_then(|w| w.approval.clone()))
                .filter(|a| a.opens(round.attempt()) && started.is_some());
            // This round's checks, or the last ones written for this release.
            let analysis = d
                .gates
                .judged
                .get(name)
                .cloned()
                .or_else(|| before.map(|w| w.analysis.clone()))
                .unwrap_or_default();
            WaveStatus {
                name: name.clone(),
                clusters: members.clone(),
                state,
                started,
                finished: match g {
                    Gate::Done(t) => Some(t.clone()),
                    _ => None,
                },
                approval,
                analysis,
            }
        })
        .collect()
}

fn whole(d: &Decided) -> Whole {
    let rows = &d.rows.placed;
    let placed = rows.len();
    // Every cluster that is not failed or in the way runs the update, done.
    let settled = rows
        .iter()
        .filter(|r| !r.foreign && !d.failures.contains_key(r.name()))
        .all(|r| r.done_at_update);
    let finished = settled
        && match d.mode {
            Mode::Steady => true,
            Mode::Progress => !d.gates.no_canary && d.gates.per_wave.iter().all(Gate::passed),
            _ => false,
        };
    // A revision is good only once it ran somewhere: an empty placement or
    // wave proves nothing.
    let proven = rows.iter().any(|r| r.done_at_update);
    // Complete is the whole truth: every placed cluster runs it, done.
    let complete = finished && proven && d.failures.is_empty() && d.rows.ghosts.is_empty();
    let degraded = finished && !complete;
    let phase = match &d.mode {
        Mode::Paused | Mode::HeldOnFailure => RolloutPhase::Paused,
        Mode::RollBack(_) => RolloutPhase::RolledBack,
        Mode::Failed => RolloutPhase::Failed,
        _ if complete => RolloutPhase::Complete,
        _ if degraded => RolloutPhase::Degraded,
        _ => RolloutPhase::Progressing,
    };
    Whole {
        placed,
        updated: rows.iter().filter(|r| r.at_is(d.round.update)).count(),
        available: rows.iter().filter(|r| r.done()).count(),
        complete,
        degraded,
        proven,
        phase,
    }
}

/// Once a failure is recorded, later rounds no longer evaluate it: the
/// status keeps which clusters failed.
fn failed_clusters(d: &Decided) -> Vec<String> {
    if d.failures.is_empty() && d.round.failed_before {
        d.round.i.previous.failed_clusters.clone()
    } else {
        d.failures.keys().map(|k| k.to_string()).collect()
    }
}

fn verdicts(
    d: &Decided,
    w: &Whole,
    failed_clusters: &[String],
    waves: &[WaveStatus],
) -> Vec<Verdict> {
    let update = d.round.update;
    // A failed check is named where clusters would be (#35).
    let failed_check = waves.iter().find_map(|w| {
        let c = w.analysis.iter().find(|c| c.state == CheckState::Failed)?;
        Some(format!(
            "analysis {} of wave {} ({})",
            c.name, w.name, c.answer
        ))
    });
    let failed_list = match (failed_clusters.is_empty(), failed_check) {
        (true, Some(check)) => check,
        _ => failed_clusters.join(", "),
    };
    let (placed, available) = (w.placed, w.available);
    vec![
        progressing(d, w, &failed_list),
        if available == placed && placed > 0 {
            Verdict::new(
                AVAILABLE,
                Status::True,
                "AllClustersAvailable",
                format!("available in {available}/{placed} clusters"),
            )
        } else {
            Verdict::new(
                AVAILABLE,
                Status::False,
                "ClustersNotAvailable",
                format!("available in {available}/{placed} clusters"),
            )
        },
        match &d.mode {
            Mode::RollBack(good) => Verdict::new(
                ROLLED_BACK,
                Status::True,
                "RolledBack",
                format!("revision {update} failed in {failed_list}; rolled back to {good}"),
            ),
            _ => Verdict::new(ROLLED_BACK, Status::False, "NotRolledBack", ""),
        },
    ]
}

/// The Progressing condition.
fn progressing(d: &Decided, w: &Whole, failed_list: &str) -> Verdict {
    let update = d.round.update;
    let (placed, available) = (w.placed, w.available);
    let (status, reason, message) = match &d.mode {
        Mode::Paused => (
            Status::Unknown,
            PAUSED,
            "spec.paused is set; nothing is written".to_string(),
        ),
        Mode::HeldOnFailure => (
            Status::Unknown,
            "ClusterFailed",
            format!(
                "held: failed clusters ({failed_list}) exceed maxFailedClusters {}",
                d.round.spec.max_failed
            ),
        ),
        Mode::RollBack(good) => (
            Status::False,
            "RolledBack",
            format!("revision {update} failed; clusters that got it are back on {good}"),
        ),
        Mode::Failed => (
            Status::False,
            "RolloutFailed",
            format!(
                "revision {update} failed in {failed_list}, and no earlier revision completed to go back to"
            ),
        ),
        _ if w.complete => (
            Status::False,
            "RolloutComplete",
            format!("revision {update} is done in every wave"),
        ),
        _ if w.degraded && placed == 0 => (
            Status::False,
            "NoClusterPlaced",
            format!("the placement selects no cluster: revision {update} runs nowhere"),
        ),
        _ if w.degraded => (
            Status::False,
            "RolloutDegraded",
            format!(
                "revision {update} went through every wave but is not done in {}: available in {available}/{placed}",
                if failed_list.is_empty() {
                    "every cluster"
                } else {
                    failed_list
                }
            ),
        ),
        _ if d.gates.no_canary => (
            Status::True,
            "WaitingForCanary",
            format!(
                "wave {} selects no cluster; requireCanary holds the other waves",
                d.round.spec.canary().unwrap_or("-")
            ),
        ),
        _ => return waiting(d, w),
    };
    Verdict::new(PROGRESSING, status, reason, message)
}

/// Progressing while a release goes on: held at a wave, or under way.
fn waiting(d: &Decided, w: &Whole) -> Verdict {
    let update = d.round.update;
    let wave = d.chosen.current_wave.as_deref().unwrap_or("-");
    let (reason, message) = match &d.chosen.hold {
        Some(Hold::Window(shut)) => (shut.reason, format!("wave {wave} waits: {}", shut.message)),
        Some(Hold::Approval) => (
            "AwaitingApproval",
            format!(
                "wave {wave} waits for approval of revision {update} (flotilla rollout approve NAMESPACE/{} --wave {wave}){}",
                d.round.i.name,
                d.round
                    .i
                    .approvals
                    .unreadable
                    .as_deref()
                    .map(|e| format!("; {e}"))
                    .unwrap_or_default()
            ),
        ),
        None => (
            "RolloutInProgress",
            format!("wave {wave}: {}/{} clusters updated", w.updated, w.placed),
        ),
    };
    Verdict::new(PROGRESSING, Status::True, reason, message)
}

/// The revision our clusters agree on; an object in the way is not ours
/// and says nothing about it (review L10).
fn uniform<'a>(rows: &'a Rows) -> Option<&'a str> {
    let ours: Vec<&Row> = rows.placed.iter().filter(|r| !r.foreign).collect();
    ours.first()
        .and_then(|r| r.at.filter(|_| r.in_sync))
        .filter(|first| ours.iter().all(|r| r.at_is(first)))
}

/// The clusters that may hold this object (review H5): those in the last
/// status, those seen holding it, and those being given a revision. One
/// leaves the record only once it is seen without the object, with nothing
/// written there in the last round (the index may lag a write).
fn reached(
    prev: &FleetMicroserviceStatus,
    clusters: &[Cluster],
    targets: &BTreeMap<&str, Option<String>>,
) -> Vec<String> {
    let mut out: std::collections::BTreeSet<String> =
        prev.reached_clusters.iter().cloned().collect();
    let lately: std::collections::BTreeSet<&str> = prev
        .clusters
        .iter()
        .filter(|p| p.target.is_some() || p.revision.is_some())
        .map(|p| p.name.as_str())
        .collect();
    for c in clusters {
        let ours = c.member.as_ref().is_some_and(|m| m.ours);
        let written_lately = lately.contains(c.name.as_str());
        if ours {
            out.insert(c.name.clone());
        } else if c.reachable && c.synced && !written_lately {
            out.remove(&c.name);
        }
    }
    for (name, target) in targets {
        if target.is_some() {
            out.insert(name.to_string());
        }
    }
    out.into_iter().collect()
}
