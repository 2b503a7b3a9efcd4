//! The rollout planner: from what is observed now to what to write next.
//!
//! Pure and level-triggered. The inputs are the spec, the revisions, every
//! cluster's labels and its member object as the status index sees it, the
//! status last written (which holds the decisions that must survive: the
//! last good revision, a failed revision, when each cluster was targeted
//! and since when it is done), and the clock. A new leader that reads the
//! same inputs makes the same plan, so it continues where the old one
//! stopped. The edge writes the status before it acts on the plan.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::placement::{self, Labels, digest, member_spec, selects};
use super::revision::Revision;
use super::spec::{
    ClusterState, ClusterStatus, FleetMicroserviceSpec, FleetMicroserviceStatus, OnFailure,
    RolloutPhase, WaveState, WaveStatus,
};
use crate::cli::parse_duration;
use crate::domain::conditions::{self, Status, Verdict};
use crate::status::view::EntryState;

pub const PROGRESSING: &str = conditions::PROGRESSING;
pub const AVAILABLE: &str = conditions::AVAILABLE;
pub const ROLLED_BACK: &str = "RolledBack";
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(600);

/// A member's Microservice, as the status index sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Member {
    /// It carries this FleetMicroservice's label; anything else is never written.
    pub ours: bool,
    /// Its revision annotation.
    pub revision: Option<String>,
    /// The digest of its spec ([`placement::digest`]).
    pub digest: u64,
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
    pub generation: i64,
    pub spec: &'a FleetMicroserviceSpec,
    /// The revision of the spec as it is now.
    pub update: &'a Revision,
    /// Every stored revision, the update revision included.
    pub revisions: &'a [Revision],
    pub previous: &'a FleetMicroserviceStatus,
    pub clusters: &'a [Cluster],
    /// The clock; status stamps keep its whole seconds.
    pub now: Timestamp,
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
}

/// The rollout settings, checked.
struct Settings {
    bake: Duration,
    deadline: Duration,
    max_failed: usize,
    on_failure: OnFailure,
}

fn settings(name: &str, spec: &FleetMicroserviceSpec) -> Result<Settings, String> {
    let r = &spec.rollout;
    let duration = |what: &str, v: &Option<String>, default: Duration| match v {
        None => Ok(default),
        Some(s) => parse_duration(s).map_err(|e| format!("rollout.{what}: {e}")),
    };
    placement::check_selector(
        "placement.clusterSelector",
        &spec.placement.cluster_selector,
    )?;
    for (i, o) in spec.overrides.iter().enumerate() {
        placement::check_selector(
            &format!("overrides[{i}].clusterSelector"),
            &o.cluster_selector,
        )?;
    }
    let mut names = std::collections::BTreeSet::new();
    for w in &r.waves {
        placement::check_selector(&format!("wave {}", w.name), &w.cluster_selector)?;
        placement::max_parallel(w.max_parallel.as_ref(), 1)
            .map_err(|e| format!("wave {}: {e}", w.name))?;
        if !names.insert(w.name.as_str()) || w.name == placement::REMAINING {
            return Err(format!(
                "wave name {:?} is repeated or reserved ({:?} is the implicit last wave)",
                w.name,
                placement::REMAINING
            ));
        }
    }
    crate::domain::validate::validate(name, &spec.template)
        .map_err(|e| format!("template: {e}"))?;
    if r.max_failed_clusters < 0 {
        return Err("rollout.maxFailedClusters must not be negative".into());
    }
    Ok(Settings {
        bake: duration("bake", &r.bake, Duration::ZERO)?,
        deadline: duration("progressDeadline", &r.progress_deadline, DEFAULT_DEADLINE)?,
        max_failed: r.max_failed_clusters as usize,
        on_failure: r.on_failure,
    })
}

/// What is left of `span` counted from `since`, or `None` once it is over.
/// Stamps keep whole seconds (as the apiserver's Time does), so the real
/// start may be up to a second after `since`: count from a second later,
/// so that a bake is never cut short and a deadline never fires early.
fn left(now: Timestamp, since: &Time, span: Duration) -> Option<Duration> {
    let end = since.0.as_millisecond() + 1000 + span.as_millis() as i64;
    let ms = end - now.as_millisecond();
    (ms > 0).then(|| Duration::from_millis(ms as u64))
}

/// `now` in whole seconds, as a status stamp.
fn stamp(now: Timestamp) -> Time {
    Time(Timestamp::from_second(now.as_second()).unwrap_or(now))
}

/// What the planner decided for the update revision.
#[derive(Clone, Debug, PartialEq)]
enum Mode {
    /// spec.paused: write nothing.
    Paused,
    /// Failures over budget with `onFailure: Pause`: write nothing until they clear.
    HeldOnFailure,
    /// The update revision completed before: every placed cluster gets it.
    Steady,
    /// Wave by wave.
    Progress,
    /// The update revision failed: clusters that got it go back to this one.
    RollBack(String),
    /// It failed and there is nothing to go back to.
    Failed,
}

/// One placed cluster, classified.
struct Row<'a> {
    c: &'a Cluster,
    prev: Option<&'a ClusterStatus>,
    /// The revision of our member object, if any.
    at: Option<&'a str>,
    /// Our member object holds exactly what its revision gives this cluster.
    in_sync: bool,
    /// At the update revision, in sync and done.
    done_at_update: bool,
    foreign: bool,
}

impl Row<'_> {
    fn at_is(&self, rev: &str) -> bool {
        self.at == Some(rev) && self.in_sync
    }
    fn done(&self) -> bool {
        self.in_sync
            && self
                .c
                .member
                .as_ref()
                .is_some_and(|m| m.state == EntryState::Done)
    }
    fn prev_target(&self) -> Option<&str> {
        self.prev.and_then(|p| p.target.as_deref())
    }
}

pub fn plan(i: &Inputs) -> Plan {
    let prev = i.previous;
    let now = stamp(i.now);
    let update = i.update.name.as_str();
    let same_update = prev.update_revision.as_deref() == Some(update)
        && prev.update_revision_number == Some(i.update.number);
    let revisions: BTreeMap<&str, &Revision> =
        i.revisions.iter().map(|r| (r.name.as_str(), r)).collect();
    let settings = match settings(i.name, i.spec) {
        Ok(s) => s,
        Err(message) => return invalid(i, message),
    };
    let prev_of = |name: &str| prev.clusters.iter().find(|c| c.name == name);

    // Classify: placed, outside the placement (ours to delete), or unknown.
    let mut rows: Vec<Row> = Vec::new();
    let mut leaving: Vec<&Cluster> = Vec::new();
    let mut unknown: Vec<&Cluster> = Vec::new();
    for c in i.clusters {
        let Some(labels) = &c.labels else {
            if c.member.as_ref().is_some_and(|m| m.ours) {
                unknown.push(c);
            }
            continue;
        };
        let placed = selects(&i.spec.placement.cluster_selector, labels).unwrap_or(false);
        let ours = c.member.as_ref().filter(|m| m.ours);
        if !placed {
            if ours.is_some() {
                leaving.push(c);
            }
            continue;
        }
        let at = ours.and_then(|m| m.revision.as_deref());
        let in_sync = match (ours, at.and_then(|a| revisions.get(a))) {
            (Some(m), Some(r)) => {
                m.digest == digest(&member_spec(&r.data.template, &r.data.overrides, labels))
            }
            _ => false,
        };
        let row = Row {
            c,
            prev: prev_of(&c.name),
            at,
            in_sync,
            done_at_update: false,
            foreign: c.member.as_ref().is_some_and(|m| !m.ours),
        };
        let done_at_update = row.at_is(update) && row.done();
        rows.push(Row {
            done_at_update,
            ..row
        });
    }
    rows.sort_by(|a, b| a.c.name.cmp(&b.c.name));

    // Since when each cluster has been done at the update revision (for bake).
    let done_since = |r: &Row| -> Time {
        match r.prev {
            Some(p)
                if same_update
                    && p.state == ClusterState::Done
                    && p.target.as_deref() == Some(update) =>
            {
                p.since.clone()
            }
            _ => now.clone(),
        }
    };
    let labels_of: Vec<(&str, &Labels)> = rows
        .iter()
        .filter_map(|r| r.c.labels.as_ref().map(|l| (r.c.name.as_str(), l)))
        .collect();
    let mut wave_list = placement::waves(&i.spec.rollout.waves, labels_of);
    // A cluster whose labels cannot be read stays in the wave it was in,
    // not done: an emptied wave must not count as finished.
    for c in &unknown {
        let was = prev.waves.iter().find(|w| w.clusters.contains(&c.name));
        if let Some(w) = was.and_then(|was| wave_list.iter_mut().find(|(n, _)| *n == was.name)) {
            w.1.push(c.name.clone());
        }
    }
    let prev_wave = |name: &str| {
        prev.waves
            .iter()
            .find(|w| w.name == name)
            .filter(|_| same_update)
    };
    let row_of = |name: &str| rows.iter().find(|r| r.c.name == name);
    let wave_finished_before = |name: &str| prev_wave(name).and_then(|w| w.finished.clone());

    // Failures of the update revision.
    let last_good = prev
        .last_good_revision
        .clone()
        .filter(|n| revisions.contains_key(n.as_str()));
    let is_good = last_good.as_deref() == Some(update);
    let resumed = !i.spec.paused
        && prev
            .conditions
            .iter()
            .any(|c| c.type_ == PROGRESSING && c.reason == "Paused");
    let failed_before = prev.failed_revision_number == Some(i.update.number);
    let mut failures: BTreeMap<&str, (String, String)> = BTreeMap::new();
    let mut requeue: Option<Duration> = None;
    let mut soon = |d: Duration| requeue = Some(requeue.map_or(d, |r: Duration| r.min(d)));
    for (wave, members) in &wave_list {
        let finished = wave_finished_before(wave).is_some();
        for name in members {
            let Some(r) = row_of(name) else { continue };
            if r.foreign {
                failures.insert(
                    &r.c.name,
                    (
                        "OwnershipConflict".into(),
                        "a Microservice this FleetMicroservice did not create is in the way; it is never overwritten".into(),
                    ),
                );
                continue;
            }
            if failed_before {
                continue;
            }
            let member = r.c.member.as_ref();
            if r.at_is(update) && member.is_some_and(|m| m.state == EntryState::Failed) {
                let m = member.expect("checked");
                failures.insert(&r.c.name, (m.reason.clone(), m.message.clone()));
                continue;
            }
            // A deadline missed stays missed until the cluster is done,
            // even once its wave finished: the budget must not leak.
            let missed = r.prev.filter(|p| {
                same_update
                    && p.state == ClusterState::Failed
                    && p.target.as_deref() == Some(update)
                    && matches!(
                        p.reason.as_str(),
                        "ProgressDeadlineExceeded" | "ClusterUnreachable"
                    )
            });
            if let Some(p) = missed.filter(|_| !r.done_at_update && !is_good) {
                failures.insert(&r.c.name, (p.reason.clone(), p.message.clone()));
                continue;
            }
            let targeted = r.prev_target() == Some(update) || r.at == Some(update);
            if is_good || !targeted || r.done_at_update || finished {
                continue;
            }
            // Paused, the clock stops; the round that resumes restarts it.
            if i.spec.paused {
                continue;
            }
            if resumed {
                soon(settings.deadline + Duration::from_secs(1));
                continue;
            }
            let Some(since) = r
                .prev
                .filter(|_| same_update)
                .and_then(|p| p.targeted.clone())
            else {
                continue;
            };
            if let Some(rest) = left(i.now, &since, settings.deadline) {
                soon(rest);
                continue;
            }
            let unreachable =
                !r.c.reachable || member.is_some_and(|m| m.state == EntryState::Unknown);
            failures.insert(
                &r.c.name,
                if unreachable {
                    (
                        "ClusterUnreachable".into(),
                        format!(
                            "not answering, and not done within the progress deadline ({:?})",
                            settings.deadline
                        ),
                    )
                } else {
                    (
                        "ProgressDeadlineExceeded".into(),
                        format!(
                            "not done within the progress deadline ({:?})",
                            settings.deadline
                        ),
                    )
                },
            );
        }
    }
    let over_budget = failures.len() > settings.max_failed;

    let mode = if i.spec.paused {
        Mode::Paused
    } else if is_good {
        Mode::Steady
    } else if failed_before || (over_budget && settings.on_failure == OnFailure::Rollback) {
        match &last_good {
            Some(good) => Mode::RollBack(good.clone()),
            None => Mode::Failed,
        }
    } else if over_budget {
        Mode::HeldOnFailure
    } else {
        Mode::Progress
    };

    // Targets: which revision each placed cluster is being given.
    let mut targets: BTreeMap<&str, Option<String>> = BTreeMap::new();
    let mut actions: Vec<Action> = Vec::new();
    let mut current_wave: Option<String> = None;
    let mut finished_waves: BTreeMap<&str, Time> = BTreeMap::new();
    let mut baking: BTreeMap<&str, bool> = BTreeMap::new();
    for (wave, members) in &wave_list {
        // Done (or failed within budget) for the bake time, once or before.
        if let Some(t) = wave_finished_before(wave) {
            finished_waves.insert(wave, t);
            continue;
        }
        let mut all_done = true;
        let mut baked = true;
        for name in members {
            let Some(r) = row_of(name) else {
                all_done = false;
                continue;
            };
            if failures.contains_key(name.as_str()) {
                continue;
            }
            if !r.done_at_update {
                all_done = false;
                continue;
            }
            if let Some(rest) = left(i.now, &done_since(r), settings.bake)
                && !settings.bake.is_zero()
            {
                baked = false;
                soon(rest);
            }
        }
        // Failures count towards a wave only within the failure budget.
        let counting = !failed_before && !over_budget;
        if all_done && baked && counting {
            finished_waves.insert(wave, now.clone());
        } else if all_done && counting {
            baking.insert(wave, true);
        }
    }
    match &mode {
        Mode::Paused | Mode::HeldOnFailure | Mode::Failed => {
            for r in &rows {
                targets.insert(&r.c.name, r.prev_target().map(str::to_string));
            }
        }
        Mode::Steady => {
            for r in rows.iter().filter(|r| !r.foreign) {
                targets.insert(&r.c.name, Some(update.to_string()));
            }
        }
        Mode::RollBack(good) => {
            for r in rows.iter().filter(|r| !r.foreign) {
                let gave_update = r.at == Some(update) || r.prev_target() == Some(update);
                let target = if gave_update || r.at.is_none() || r.prev_target() == Some(good) {
                    Some(good.clone())
                } else {
                    r.at.map(str::to_string)
                };
                targets.insert(&r.c.name, target);
            }
        }
        Mode::Progress => {
            let mut open = true;
            for (wave, members) in &wave_list {
                let wave_rows: Vec<&Row> = members
                    .iter()
                    .filter_map(|n| row_of(n))
                    .filter(|r| !r.foreign)
                    .collect();
                if !open {
                    // Later waves wait; what already has the update keeps it.
                    for r in wave_rows {
                        let keep = (r.at == Some(update)).then(|| update.to_string());
                        targets.insert(&r.c.name, keep);
                    }
                    continue;
                }
                if finished_waves.contains_key(wave.as_str()) || baking.contains_key(wave.as_str())
                {
                    for r in wave_rows {
                        targets.insert(&r.c.name, Some(update.to_string()));
                    }
                    if baking.contains_key(wave.as_str()) {
                        current_wave = Some(wave.clone());
                        open = false;
                    }
                    continue;
                }
                current_wave = Some(wave.clone());
                open = false;
                let wave_spec = i.spec.rollout.waves.iter().find(|w| &w.name == wave);
                let limit = placement::max_parallel(
                    wave_spec.and_then(|w| w.max_parallel.as_ref()),
                    wave_rows.len(),
                )
                .unwrap_or(1);
                let given = |r: &Row| r.at == Some(update) || r.prev_target() == Some(update);
                let in_flight = wave_rows
                    .iter()
                    .filter(|r| {
                        given(r) && !r.done_at_update && !failures.contains_key(r.c.name.as_str())
                    })
                    .count();
                let mut slots = limit.saturating_sub(in_flight);
                for r in wave_rows {
                    let take = if given(r) {
                        true
                    } else if slots > 0 {
                        slots -= 1;
                        true
                    } else {
                        false
                    };
                    targets.insert(&r.c.name, take.then(|| update.to_string()));
                }
            }
        }
    }
    // Held on failure, the clusters already given the update may still get
    // it (one that was down may come back and turn done, clearing the
    // failure); no new cluster is started.
    let writing = !matches!(mode, Mode::Paused | Mode::Failed);
    if writing {
        for r in rows.iter().filter(|r| !r.foreign && r.c.reachable) {
            if let Some(Some(t)) = targets.get(r.c.name.as_str())
                && !r.at_is(t)
            {
                actions.push(Action::Apply {
                    cluster: r.c.name.clone(),
                    revision: t.clone(),
                });
            }
        }
    }
    if !i.spec.paused {
        for c in leaving.iter().filter(|c| c.reachable) {
            actions.push(Action::Delete {
                cluster: c.name.clone(),
            });
        }
    }

    // Each cluster's state.
    let mut clusters: Vec<ClusterStatus> = Vec::new();
    for r in &rows {
        let target = targets.get(r.c.name.as_str()).cloned().flatten();
        let member = r.c.member.as_ref();
        let (state, reason, message) =
            if let Some((reason, message)) = failures.get(r.c.name.as_str()) {
                (ClusterState::Failed, reason.clone(), message.clone())
            } else if target.is_none() {
                let why = match mode {
                    Mode::Paused => "Paused",
                    Mode::HeldOnFailure => "HeldOnFailure",
                    _ => "WaitingForWave",
                };
                (ClusterState::Pending, why.to_string(), String::new())
            } else if !r.c.reachable || member.is_some_and(|m| m.state == EntryState::Unknown) {
                (
                    ClusterState::Unknown,
                    "ClusterUnreachable".to_string(),
                    member.map(|m| m.message.clone()).unwrap_or_default(),
                )
            } else if target.as_deref().is_some_and(|t| r.at_is(t)) && r.done() {
                let m = member.expect("done implies a member");
                (ClusterState::Done, m.reason.clone(), m.message.clone())
            } else if target.as_deref().is_some_and(|t| r.at_is(t)) {
                let m = member.expect("in sync implies a member");
                (ClusterState::Updating, m.reason.clone(), m.message.clone())
            } else {
                (ClusterState::Updating, "Writing".to_string(), String::new())
            };
        let carried = r.prev.filter(|p| p.target == target);
        clusters.push(ClusterStatus {
            name: r.c.name.clone(),
            revision: r.at.map(str::to_string),
            since: carried
                .filter(|p| p.state == state && p.reason == reason)
                .map_or_else(|| now.clone(), |p| p.since.clone()),
            // Resuming restarts the deadline of what is not done yet.
            targeted: target.as_ref().map(|_| {
                carried
                    .and_then(|p| p.targeted.clone())
                    .filter(|_| !(resumed && state != ClusterState::Done))
                    .unwrap_or_else(|| now.clone())
            }),
            target,
            state,
            reason,
            message,
        });
    }
    for c in unknown.iter().chain(leaving.iter()) {
        let (state, reason) = if c.labels.is_none() {
            (ClusterState::Unknown, "LabelsUnknown")
        } else {
            (ClusterState::Removing, "LeftPlacement")
        };
        let prev_c = prev_of(&c.name).filter(|p| p.state == state);
        clusters.push(ClusterStatus {
            name: c.name.clone(),
            revision: c.member.as_ref().and_then(|m| m.revision.clone()),
            target: None,
            state,
            reason: reason.into(),
            message: String::new(),
            since: prev_c.map_or_else(|| now.clone(), |p| p.since.clone()),
            targeted: None,
        });
    }
    clusters.sort_by(|a, b| a.name.cmp(&b.name));

    // Waves, for the status.
    let waves: Vec<WaveStatus> = wave_list
        .iter()
        .map(|(name, members)| {
            let before = prev_wave(name);
            let started_now = members.iter().any(|n| {
                clusters
                    .iter()
                    .any(|c| &c.name == n && c.target.as_deref() == Some(update))
            });
            let started = before
                .and_then(|w| w.started.clone())
                .or_else(|| started_now.then(|| now.clone()));
            let finished = finished_waves.get(name.as_str()).cloned();
            let state = if finished.is_some() {
                WaveState::Done
            } else if baking.contains_key(name.as_str()) {
                WaveState::Baking
            } else if started.is_some() {
                WaveState::Progressing
            } else {
                WaveState::Pending
            };
            WaveStatus {
                name: name.clone(),
                clusters: members.clone(),
                state,
                started,
                finished,
            }
        })
        .collect();

    // The whole.
    let placed = rows.len();
    let updated = rows.iter().filter(|r| r.at_is(update)).count();
    let available = rows.iter().filter(|r| r.done()).count();
    let all_waves_done = wave_list
        .iter()
        .all(|(w, _)| finished_waves.contains_key(w.as_str()));
    let complete = match mode {
        Mode::Steady => rows.iter().all(|r| r.foreign || r.done_at_update),
        Mode::Progress => all_waves_done,
        _ => false,
    };
    // A revision is good only once it ran somewhere: an empty placement or
    // wave proves nothing.
    let proven = rows.iter().any(|r| r.done_at_update);
    let phase = match &mode {
        Mode::Paused | Mode::HeldOnFailure => RolloutPhase::Paused,
        Mode::RollBack(_) => RolloutPhase::RolledBack,
        Mode::Failed => RolloutPhase::Failed,
        Mode::Steady | Mode::Progress if complete => RolloutPhase::Complete,
        _ => RolloutPhase::Progressing,
    };
    // Once a failure is recorded, later rounds no longer evaluate it: the
    // status keeps which clusters failed.
    let failed_clusters: Vec<String> = if failures.is_empty() && failed_before {
        prev.failed_clusters.clone()
    } else {
        failures.keys().map(|k| k.to_string()).collect()
    };
    let failed_list = failed_clusters.join(", ");
    let mut verdicts = vec![match &mode {
        Mode::Paused => Verdict::new(
            PROGRESSING,
            Status::Unknown,
            "Paused",
            "spec.paused is set; nothing is written",
        ),
        Mode::HeldOnFailure => Verdict::new(
            PROGRESSING,
            Status::Unknown,
            "ClusterFailed",
            format!(
                "held: failed clusters ({failed_list}) exceed maxFailedClusters {}",
                settings.max_failed
            ),
        ),
        Mode::RollBack(good) => Verdict::new(
            PROGRESSING,
            Status::False,
            "RolledBack",
            format!("revision {update} failed; clusters that got it are back on {good}"),
        ),
        Mode::Failed => Verdict::new(
            PROGRESSING,
            Status::False,
            "RolloutFailed",
            format!(
                "revision {update} failed in {failed_list}, and no earlier revision completed to go back to"
            ),
        ),
        _ if complete => Verdict::new(
            PROGRESSING,
            Status::False,
            "RolloutComplete",
            format!("revision {update} is done in every wave"),
        ),
        _ => Verdict::new(
            PROGRESSING,
            Status::True,
            "RolloutInProgress",
            format!(
                "wave {}: {updated}/{placed} clusters updated",
                current_wave.as_deref().unwrap_or("-")
            ),
        ),
    }];
    verdicts.push(if available == placed && placed > 0 {
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
    });
    verdicts.push(match &mode {
        Mode::RollBack(good) => Verdict::new(
            ROLLED_BACK,
            Status::True,
            "RolledBack",
            format!("revision {update} failed in {failed_list}; rolled back to {good}"),
        ),
        _ => Verdict::new(ROLLED_BACK, Status::False, "NotRolledBack", ""),
    });
    let uniform = rows
        .first()
        .and_then(|r| r.at.filter(|_| r.in_sync))
        .filter(|first| rows.iter().all(|r| r.at_is(first)));
    let status = FleetMicroserviceStatus {
        observed_generation: Some(i.generation),
        current_revision: uniform
            .map(str::to_string)
            .or_else(|| prev.current_revision.clone()),
        update_revision: Some(update.to_string()),
        update_revision_number: Some(i.update.number),
        last_good_revision: if complete && proven {
            Some(update.to_string())
        } else {
            last_good
        },
        failed_clusters: match &mode {
            Mode::RollBack(_) | Mode::Failed => failed_clusters.clone(),
            _ => Vec::new(),
        },
        failed_revision_number: match (&mode, settings.on_failure) {
            (Mode::RollBack(_) | Mode::Failed, _) => Some(i.update.number),
            _ => prev
                .failed_revision_number
                .filter(|n| *n == i.update.number),
        },
        phase: Some(phase),
        wave: current_wave
            .filter(|_| phase == RolloutPhase::Progressing || phase == RolloutPhase::Paused),
        updated: Some(format!("{updated}/{placed}")),
        available: Some(format!("{available}/{placed}")),
        waves,
        clusters,
        conditions: conditions::transition(&prev.conditions, &verdicts, i.generation, &now),
    };
    actions.sort();
    Plan {
        actions,
        status,
        requeue_after: requeue.filter(|_| writing || matches!(mode, Mode::HeldOnFailure)),
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
        status,
        requeue_after: None,
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
