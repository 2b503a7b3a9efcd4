//! The planner as it was before #58, kept as the oracle of the new one
//! while it takes over: a property test asserts both plan alike. Test
//! builds only; deleted once the new planner has taken over.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::{
    AVAILABLE, Action, Cluster, DEFAULT_DEADLINE, Inputs, LABELS_UNKNOWN, MAX_SPAN, NOT_REGISTERED,
    PROGRESSING, Plan, ROLLED_BACK,
};
use crate::domain::conditions::{self, Status, Verdict};
use crate::domain::duration::parse_bounded;
use crate::rollout::analysis::{self, Judgement};
use crate::rollout::approval;
use crate::rollout::failover::choose::{self, Candidate, Placed};
use crate::rollout::gate::{self, Evidence, Gate, left, stamp};
use crate::rollout::leaving::{self, Leave, Leaver};
use crate::rollout::placement::{self, Labels, digest, member_spec, selects};
use crate::rollout::revision::Revision;
use crate::rollout::spec::{
    Approval, CLUSTER_UNREACHABLE, CheckState, CheckStatus, ClusterState, ClusterStatus,
    DnsStrategy, FleetMicroserviceSpec, FleetMicroserviceStatus, OnFailure, RolloutPhase,
    WaveState, WaveStatus,
};
use crate::rollout::trouble::Trouble;
use crate::status::view::EntryState;

/// The rollout settings, checked.
struct Settings {
    /// The first declared wave must pass, not be skipped, before any other starts.
    require_canary: bool,
    bake: Duration,
    deadline: Duration,
    max_failed: usize,
    on_failure: OnFailure,
    /// With `numberOfClusters`.
    counted: Option<choose::Settings>,
    windows: Vec<crate::rollout::window::Checked>,
}

fn settings(name: &str, spec: &FleetMicroserviceSpec) -> Result<Settings, String> {
    let r = &spec.rollout;
    let duration = |what: &str, v: &Option<String>, default: Duration| match v {
        None => Ok(default),
        Some(s) => parse_bounded(s, MAX_SPAN).map_err(|e| format!("rollout.{what}: {e}")),
    };
    placement::check_selector(
        "placement.clusterSelector",
        &spec.placement.cluster_selector,
    )?;
    analysis::check_all(&r.analysis)?;
    let windows = crate::rollout::window::check(&r.windows)?;
    for (i, o) in spec.overrides.iter().enumerate() {
        placement::check_selector(
            &format!("overrides[{i}].clusterSelector"),
            &o.cluster_selector,
        )?;
    }
    check_dns(spec)?;
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
    // An override is checked as the spec it makes, so a reserved env name
    // or a bad replica count is an InvalidSpec now, not a canary that
    // fails later (review L8). All of them at once too: a cluster may be
    // selected by every one.
    let mut all = spec.template.clone();
    for (i, o) in spec.overrides.iter().enumerate() {
        let mut one = spec.template.clone();
        placement::apply(&mut one, o);
        crate::domain::validate::validate(name, &one)
            .map_err(|e| format!("overrides[{i}]: {e}"))?;
        placement::apply(&mut all, o);
    }
    crate::domain::validate::validate(name, &all).map_err(|e| format!("overrides: {e}"))?;
    if r.max_failed_clusters < 0 {
        return Err("rollout.maxFailedClusters must not be negative".into());
    }
    let counted = counted(&spec.placement)?;
    Ok(Settings {
        counted,
        require_canary: r.require_canary.unwrap_or(!r.waves.is_empty()),
        bake: duration("bake", &r.bake, Duration::ZERO)?,
        deadline: duration("progressDeadline", &r.progress_deadline, DEFAULT_DEADLINE)?,
        max_failed: r.max_failed_clusters as usize,
        on_failure: r.on_failure,
        windows,
    })
}

/// `numberOfClusters` and its failover timers, checked.
fn counted(p: &crate::rollout::spec::Placement) -> Result<Option<choose::Settings>, String> {
    let Some(count) = p.number_of_clusters else {
        return match p.failover {
            Some(_) => Err("placement.failover needs placement.numberOfClusters".into()),
            None => Ok(None),
        };
    };
    if !(1..=1000).contains(&count) {
        return Err(format!(
            "placement.numberOfClusters must be 1 to 1000, not {count}"
        ));
    }
    let f = p.failover.clone().unwrap_or_default();
    let duration = |what: &str, v: &Option<String>, default: Duration| match v {
        None => Ok(default),
        Some(s) => {
            parse_bounded(s, MAX_SPAN).map_err(|e| format!("placement.failover.{what}: {e}"))
        }
    };
    Ok(Some(choose::Settings {
        count: count as usize,
        unreachable_after: duration(
            "unreachableAfter",
            &f.unreachable_after,
            choose::UNREACHABLE_AFTER,
        )?,
        unavailable_after: duration(
            "unavailableAfter",
            &f.unavailable_after,
            choose::UNAVAILABLE_AFTER,
        )?,
        failback: f.failback,
        failback_after: duration("failbackAfter", &f.failback_after, choose::FAILBACK_AFTER)?,
    }))
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
    /// Reachable, and its member object not Unknown (a feed that lost it).
    fn answering(&self) -> bool {
        self.c.reachable
            && self
                .c
                .member
                .as_ref()
                .is_none_or(|m| m.state != EntryState::Unknown)
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
    // The revision that ran to completion last, if any.
    let last_good = prev
        .last_good_revision
        .clone()
        .or_else(|| i.update.memory.good_before.clone())
        .filter(|n| revisions.contains_key(n.as_str()));
    let counted = settings
        .counted
        .as_ref()
        .map(|s| counted_placement(i, s, &revisions, last_good.as_deref()));

    // Classify: placed, outside the placement (ours to delete), replaced
    // but kept for now, or unknown.
    let mut rows: Vec<Row> = Vec::new();
    let mut leaving: Vec<&Cluster> = Vec::new();
    let mut kept: Vec<&Cluster> = Vec::new();
    let mut unknown: Vec<&Cluster> = Vec::new();
    for c in i.clusters {
        let Some(labels) = &c.labels else {
            if c.member.as_ref().is_some_and(|m| m.ours) {
                unknown.push(c);
            }
            continue;
        };
        let placed = match &counted {
            Some(p) => p.chosen.contains(&c.name),
            None => selects(&i.spec.placement.cluster_selector, labels),
        };
        let ours = c.member.as_ref().filter(|m| m.ours);
        if !placed {
            match ours {
                Some(_) if counted.as_ref().is_some_and(|p| p.kept.contains(&c.name)) => {
                    kept.push(c)
                }
                Some(_) => leaving.push(c),
                None => {}
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
                gate::trusted(&p.since, settings.bake, i.term_started)
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
    let row_of = |name: &str| rows.iter().find(|r| r.c.name == name);
    // The trouble of the last write of `rev` to this row, while the spec
    // that revision gives it is still the one that was written.
    let trouble = |r: &Row, rev: &str| {
        let t = i.troubles.get(&r.c.name).filter(|t| t.revision == rev)?;
        let data = &revisions.get(rev)?.data;
        let labels = r.c.labels.as_ref()?;
        (t.digest == digest(&member_spec(&data.template, &data.overrides, labels))).then_some(t)
    };
    let ghosts = hold_members(&mut wave_list, prev, same_update, |n| {
        i.clusters.iter().any(|c| c.name == n)
    });
    let prev_wave = |name: &str| {
        prev.waves
            .iter()
            .find(|w| w.name == name)
            .filter(|_| same_update)
    };
    let wave_finished_before = |name: &str| prev_wave(name).and_then(|w| w.finished.clone());

    // Failures of the update revision. The last good one: the status
    // remembers; its revisions do too, for a status that was lost (review L13).
    let is_good = last_good.as_deref() == Some(update);
    let resumed = !i.spec.paused
        && prev
            .conditions
            .iter()
            .any(|c| c.type_ == PROGRESSING && c.reason == "Paused");
    let failed_before = prev.failed_revision_number == Some(i.update.number) || i.update.failed();
    let mut failures: BTreeMap<&str, (String, String)> = BTreeMap::new();
    let mut requeue: Option<Duration> = None;
    let mut soon = |d: Duration| requeue = Some(requeue.map_or(d, |r: Duration| r.min(d)));
    if let Some(d) = counted.as_ref().and_then(|p| p.requeue) {
        soon(d);
    }
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
            // The member refuses the write, or cannot hold what is written:
            // failed now, not at the deadline (review M1, M2).
            if let Some(t) = trouble(r, update).filter(|t| t.permanent())
                && !is_good
            {
                failures.insert(&r.c.name, (t.reason().into(), t.message()));
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
                        "ProgressDeadlineExceeded" | CLUSTER_UNREACHABLE
                    )
            });
            if let Some(p) = missed.filter(|_| !r.done_at_update) {
                failures.insert(&r.c.name, (p.reason.clone(), p.message.clone()));
                continue;
            }
            let targeted = r.prev_target() == Some(update) || r.at == Some(update);
            // Once good, a cluster that joins, or stops being done, still
            // owes it within the deadline (review L5): counted from when it
            // stopped being done (`targeted` restarts then, below), so a
            // blip is not a failure. It degrades the rollout; it never
            // rolls back a revision that completed.
            if !targeted || r.done_at_update || (finished && !is_good) {
                continue;
            }
            // Paused, the clock stops; the round that resumes restarts it.
            if i.spec.paused {
                continue;
            }
            // Done until this round: its deadline starts now (the row's
            // `targeted` restarts below).
            let was_done = r.prev.is_some_and(|p| {
                same_update && p.state == ClusterState::Done && p.target.as_deref() == Some(update)
            });
            if resumed || was_done {
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
            let since = gate::trusted(&since, settings.deadline, i.term_started);
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
                        CLUSTER_UNREACHABLE.into(),
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
    // A cluster gone from the registry mid-wave, or whose labels cannot be
    // read, fails after the deadline: a decommissioned canary or a broken
    // labels file cannot hold a rollout forever (review H3, M7).
    let in_a_wave = |n: &str| wave_list.iter().any(|(_, m)| m.iter().any(|x| x == n));
    let absent: Vec<(&str, &str)> = ghosts
        .iter()
        .map(|g| (*g, NOT_REGISTERED))
        .chain(
            unknown
                .iter()
                .filter(|c| in_a_wave(&c.name))
                .map(|c| (c.name.as_str(), LABELS_UNKNOWN)),
        )
        .collect();
    for (g, why) in absent.iter().filter(|_| !failed_before && !i.spec.paused) {
        let g = *g;
        let p = prev_of(g).filter(|p| same_update && p.reason == *why);
        match p {
            Some(p) if p.state == ClusterState::Failed => {
                failures.insert(g, (p.reason.clone(), p.message.clone()));
            }
            Some(p) => match left(
                i.now,
                &gate::trusted(&p.since, settings.deadline, i.term_started),
                settings.deadline,
            ) {
                Some(rest) => soon(rest),
                None => {
                    let what = if *why == NOT_REGISTERED {
                        "left the registry while its wave ran"
                    } else {
                        "its labels cannot be read, so its placement is unknown"
                    };
                    failures.insert(
                        g,
                        (
                            why.to_string(),
                            format!(
                                "{what}, and did not recover within the progress deadline ({:?})",
                                settings.deadline
                            ),
                        ),
                    );
                }
            },
            None => soon(settings.deadline + Duration::from_secs(1)),
        }
    }

    // The wave gates, on evidence only.
    let canary = i.spec.rollout.waves.first().map(|w| w.name.as_str());
    let evidence = |name: &str| match row_of(name) {
        _ if failures.contains_key(name) => Evidence::Failed,
        Some(r) if r.done_at_update => Evidence::Done(done_since(r)),
        _ => Evidence::Pending,
    };
    let mut gates: Vec<Gate> = wave_list
        .iter()
        .map(|(wave, members)| {
            let evidence: Vec<Evidence> = members.iter().map(|n| evidence(n)).collect();
            gate::gate(
                &evidence,
                canary == Some(wave.as_str()),
                wave_finished_before(wave).as_ref(),
                settings.bake,
                i.now,
            )
        })
        .collect();
    // Analysis (#35): a wave whose clusters are done passes only on its
    // checks' evidence, and fails on their failures.
    let mut checks: Vec<analysis::Due> = Vec::new();
    let mut judged: BTreeMap<&str, Vec<CheckStatus>> = BTreeMap::new();
    let analysing = !i.spec.rollout.analysis.is_empty() && !failed_before && !i.spec.paused;
    for (g, (wave, members)) in gates.iter_mut().zip(&wave_list).filter(|_| analysing) {
        if wave_finished_before(wave).is_some() || !matches!(g, Gate::Baking(_) | Gate::Done(_)) {
            continue;
        }
        let wave_rows: Vec<&Row> = members.iter().filter_map(|n| row_of(n)).collect();
        let evidence = analysis::Evidence {
            revision: update.to_string(),
            wave: wave.clone(),
            generations: wave_rows
                .iter()
                .filter_map(|r| Some((r.c.name.clone(), r.c.member.as_ref()?.generation)))
                .collect(),
        };
        let settled = wave_rows
            .iter()
            .filter(|r| r.done_at_update)
            .map(|r| done_since(r).0)
            .max()
            .unwrap_or(i.now);
        // As the gate counts it: a second after the whole-second stamp.
        let bake_end = match settings.bake.is_zero() {
            true => settled,
            false => jiff::SignedDuration::try_from(settings.bake + Duration::from_secs(1))
                .ok()
                .and_then(|d| settled.checked_add(d).ok())
                .unwrap_or(settled),
        };
        let (judgement, statuses, due) = analysis::judge(
            &analysis::check_all(&i.spec.rollout.analysis).unwrap_or_default(),
            i.runs,
            &evidence,
            (settled, bake_end),
            i.now,
        );
        match judgement {
            Judgement::Passed => {}
            Judgement::Failed { .. } => *g = Gate::Failed,
            Judgement::Waiting(next) => {
                soon(next);
                *g = Gate::Baking(next);
            }
        }
        checks.extend(due);
        judged.insert(wave.as_str(), statuses);
    }
    let over_budget = failures.len() > settings.max_failed || gates.contains(&Gate::Failed);
    // Past the budget, or once failed, no wave newly passes.
    let counting = !failed_before && !over_budget;
    for (g, (wave, _)) in gates.iter_mut().zip(&wave_list) {
        match g {
            Gate::Baking(rest) if counting => soon(*rest),
            Gate::Done(_) if counting || wave_finished_before(wave).is_some() => {}
            Gate::Baking(_) | Gate::Done(_) => *g = Gate::Progressing,
            _ => {}
        }
    }
    // Without a canary that passed, nothing else starts.
    let no_canary =
        settings.require_canary && !rows.is_empty() && gates.first() == Some(&Gate::Skipped);

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
    // A `Manual` wave whose turn came without an approval for this revision.
    let mut awaiting: Option<&str> = None;
    // A wave whose turn came outside its time windows.
    let mut closed: Option<(&str, crate::rollout::window::Closed)> = None;
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
            // Every cluster goes back to the good revision: the one the
            // failed revision reached, and one left on a release that was
            // superseded before it completed (no one asks for it any more,
            // and it was never judged; found by `make chaos`). A cluster
            // already there is not written again.
            for r in rows.iter().filter(|r| !r.foreign) {
                targets.insert(&r.c.name, Some(good.clone()));
            }
        }
        Mode::Progress => {
            let mut open = true;
            for ((wave, members), g) in wave_list.iter().zip(&gates) {
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
                match g {
                    Gate::Skipped if no_canary => {
                        current_wave = Some(wave.clone());
                        open = false;
                        continue;
                    }
                    Gate::Skipped => continue,
                    Gate::Done(_) | Gate::Baking(_) => {
                        for r in wave_rows {
                            targets.insert(&r.c.name, Some(update.to_string()));
                        }
                        if matches!(g, Gate::Baking(_)) {
                            current_wave = Some(wave.clone());
                            open = false;
                        }
                        continue;
                    }
                    Gate::Progressing | Gate::Failed => {}
                }
                current_wave = Some(wave.clone());
                open = false;
                let wave_spec = i.spec.rollout.waves.iter().find(|w| &w.name == wave);
                let given = |r: &Row| r.at == Some(update) || r.prev_target() == Some(update);
                // Held until approved for this revision; a wave already
                // under way goes on (its writes were approved when they began).
                let manual = wave_spec.is_some_and(|w| w.approval == Approval::Manual);
                if manual
                    && !wave_rows.iter().any(|r| given(r))
                    && approval::granted(&i.approvals.given, wave, update).is_none()
                {
                    awaiting = Some(wave.as_str());
                    for r in wave_rows {
                        let keep = (r.at == Some(update)).then(|| update.to_string());
                        targets.insert(&r.c.name, keep);
                    }
                    continue;
                }
                // A wave starts only inside its time windows; one under way
                // goes on.
                if !wave_rows.iter().any(|r| given(r))
                    && let Err(shut) = crate::rollout::window::may_start(&settings.windows, i.now)
                {
                    if let Some(wait) = shut
                        .until
                        .and_then(|u| Duration::try_from(u.duration_since(i.now)).ok())
                    {
                        soon(wait.max(Duration::from_secs(1)));
                    }
                    closed = Some((wave.as_str(), shut));
                    for r in wave_rows {
                        let keep = (r.at == Some(update)).then(|| update.to_string());
                        targets.insert(&r.c.name, keep);
                    }
                    continue;
                }
                let limit = placement::max_parallel(
                    wave_spec.and_then(|w| w.max_parallel.as_ref()),
                    wave_rows.len(),
                )
                .unwrap_or(1);
                let in_flight = wave_rows
                    .iter()
                    .filter(|r| {
                        given(r) && !r.done_at_update && !failures.contains_key(r.c.name.as_str())
                    })
                    .count();
                let mut slots = limit.saturating_sub(in_flight);
                for r in wave_rows {
                    // A cluster that is down when its turn comes takes no
                    // slot: it would hold it for the deadline, then fail a
                    // release it never received (review M4).
                    let take = if given(r) {
                        true
                    } else if slots > 0 && r.answering() {
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
    // A failover is not a release: its replacement gets the running
    // revision at once, whatever wave it falls in.
    if let (Some(p), Some(good), Mode::Progress | Mode::HeldOnFailure) =
        (&counted, &last_good, &mode)
    {
        for name in &p.replacements {
            if let Some(t @ None) = targets.get_mut(name.as_str()) {
                *t = Some(good.clone());
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
                && !trouble(r, t).is_some_and(Trouble::permanent)
            {
                actions.push(Action::Apply {
                    cluster: r.c.name.clone(),
                    revision: t.clone(),
                });
            }
        }
    }
    // Leaving the placement goes wave by wave too (review M6).
    // With a count, clusters leave by failover as much as by edits: one that
    // cannot be reached (a replaced cluster that is down for good) must not
    // hold the waves' removals, or every later replaced cluster would keep
    // running (N + 2 and more). It is removed when it answers again.
    let leavers: Vec<Leaver> = leaving
        .iter()
        .filter(|c| counted.is_none() || c.reachable)
        .filter_map(|c| {
            Some(Leaver {
                name: &c.name,
                labels: c.labels.as_ref()?,
                reachable: c.reachable,
            })
        })
        .collect();
    let removals = leaving::removals(&i.spec.rollout.waves, &leavers);
    if !i.spec.paused {
        for (name, leave) in &removals {
            if *leave == Leave::Now {
                actions.push(Action::Delete {
                    cluster: name.to_string(),
                });
            }
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
                    _ if !r.answering() => CLUSTER_UNREACHABLE,
                    _ => "WaitingForWave",
                };
                (ClusterState::Pending, why.to_string(), String::new())
            } else if !r.c.reachable || member.is_some_and(|m| m.state == EntryState::Unknown) {
                (
                    ClusterState::Unknown,
                    CLUSTER_UNREACHABLE.to_string(),
                    member.map(|m| m.message.clone()).unwrap_or_default(),
                )
            } else if target.as_deref().is_some_and(|t| r.at_is(t)) && r.done() {
                let m = member.expect("done implies a member");
                (ClusterState::Done, m.reason.clone(), m.message.clone())
            } else if target.as_deref().is_some_and(|t| r.at_is(t)) {
                let m = member.expect("in sync implies a member");
                (ClusterState::Updating, m.reason.clone(), m.message.clone())
            } else if let Some(t) = target.as_deref().and_then(|t| trouble(r, t)) {
                (ClusterState::Updating, t.reason().to_string(), t.message())
            } else {
                (ClusterState::Updating, "Writing".to_string(), String::new())
            };
        // After a rollback, a cluster the failed revision reached says which
        // one failed, at every step of going back, not only where it is now.
        let name = r.c.name.as_str();
        let here = failures.contains_key(name)
            || (failed_before && prev.failed_clusters.iter().any(|f| f == name));
        let (reason, message) = match &mode {
            Mode::RollBack(good)
                if state != ClusterState::Failed
                    && (here
                        || r.at == Some(update)
                        || r.prev_target() == Some(update)
                        || r.prev.is_some_and(|p| p.reason == ROLLED_BACK)) =>
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
            .map_or_else(|| now.clone(), |p| p.since.clone());
        // The deadline counts from the target's choice, and again from when
        // a done cluster stops being done (review L5); resuming restarts
        // it for what is not done yet.
        let restart = !done && (resumed || carried.is_some_and(|p| p.state == ClusterState::Done));
        clusters.push(ClusterStatus {
            name: r.c.name.clone(),
            revision: r.at.map(str::to_string),
            since,
            targeted: target.as_ref().map(|_| {
                carried
                    .and_then(|p| p.targeted.clone())
                    .filter(|_| !restart)
                    .unwrap_or_else(|| now.clone())
            }),
            target,
            state,
            reason,
            message,
        });
    }
    for c in unknown.iter().chain(leaving.iter()) {
        let (state, reason, message) = match removals.get(c.name.as_str()) {
            _ if let Some((_, message)) = failures.get(c.name.as_str()) => {
                (ClusterState::Failed, LABELS_UNKNOWN, message.clone())
            }
            _ if c.labels.is_none() => (ClusterState::Unknown, LABELS_UNKNOWN, String::new()),
            Some(Leave::Waits(wave)) => (
                ClusterState::Removing,
                "WaitingToLeave",
                format!("left the placement; removed after the clusters of wave {wave} that leave"),
            ),
            _ => (ClusterState::Removing, "LeftPlacement", String::new()),
        };
        let prev_c = prev_of(&c.name).filter(|p| p.state == state);
        clusters.push(ClusterStatus {
            name: c.name.clone(),
            revision: c.member.as_ref().and_then(|m| m.revision.clone()),
            target: None,
            state,
            reason: reason.into(),
            message,
            since: prev_c.map_or_else(|| now.clone(), |p| p.since.clone()),
            targeted: None,
        });
    }
    for c in &kept {
        let why = counted
            .as_ref()
            .and_then(|p| p.status.clusters.iter().find(|p| p.name == c.name));
        let prev_c = prev_of(&c.name).filter(|p| p.state == ClusterState::Removing);
        clusters.push(ClusterStatus {
            name: c.name.clone(),
            revision: c.member.as_ref().and_then(|m| m.revision.clone()),
            target: None,
            state: ClusterState::Removing,
            reason: "Replaced".into(),
            message: format!(
                "{}; its Microservice stays until the cluster that took its place is available and this one answers",
                why.map_or("replaced", |w| w.message.as_str())
            ),
            since: prev_c.map_or_else(|| now.clone(), |p| p.since.clone()),
            targeted: None,
        });
    }
    for g in &ghosts {
        let p = prev_of(g);
        let (state, reason, message) = match failures.get(g) {
            Some((reason, message)) => (ClusterState::Failed, reason.clone(), message.clone()),
            None => (
                ClusterState::Unknown,
                NOT_REGISTERED.to_string(),
                "left the registry while its wave ran; the wave waits for it until the progress deadline".to_string(),
            ),
        };
        clusters.push(ClusterStatus {
            name: g.to_string(),
            revision: p.and_then(|p| p.revision.clone()),
            target: p.and_then(|p| p.target.clone()),
            since: p
                .filter(|p| p.reason == reason && p.state == state)
                .map_or_else(|| now.clone(), |p| p.since.clone()),
            targeted: p.and_then(|p| p.targeted.clone()),
            state,
            reason,
            message,
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
            let g = &gates[wave_list
                .iter()
                .position(|(n, _)| n == name)
                .expect("listed")];
            let finished = match g {
                Gate::Done(t) => Some(t.clone()),
                _ => None,
            };
            let state = match g {
                _ if awaiting == Some(name.as_str()) => WaveState::AwaitingApproval,
                Gate::Done(_) => WaveState::Done,
                Gate::Baking(_) => WaveState::Baking,
                Gate::Skipped => WaveState::Skipped,
                Gate::Failed => WaveState::Failed,
                Gate::Progressing if started.is_some() => WaveState::Progressing,
                Gate::Progressing => WaveState::Pending,
            };
            // The approval that opened it, kept once the annotation drops it.
            let approval = approval::granted(&i.approvals.given, name, update)
                .cloned()
                .or_else(|| before.and_then(|w| w.approval.clone()))
                .filter(|a| a.revision == update);
            // This round's checks, or the last ones written for this release.
            let analysis = judged
                .get(name.as_str())
                .cloned()
                .or_else(|| before.map(|w| w.analysis.clone()))
                .unwrap_or_default();
            WaveStatus {
                name: name.clone(),
                clusters: members.clone(),
                state,
                started,
                finished,
                approval,
                analysis,
            }
        })
        .collect();

    // The whole.
    let placed = rows.len();
    let updated = rows.iter().filter(|r| r.at_is(update)).count();
    let available = rows.iter().filter(|r| r.done()).count();
    // Every cluster that is not failed or in the way runs the update, done.
    let settled = rows
        .iter()
        .filter(|r| !r.foreign && !failures.contains_key(r.c.name.as_str()))
        .all(|r| r.done_at_update);
    let finished = settled
        && match mode {
            Mode::Steady => true,
            Mode::Progress => !no_canary && gates.iter().all(Gate::passed),
            _ => false,
        };
    // A revision is good only once it ran somewhere: an empty placement or
    // wave proves nothing.
    let proven = rows.iter().any(|r| r.done_at_update);
    // Complete is the whole truth: every placed cluster runs it, done.
    let complete = finished && proven && failures.is_empty() && ghosts.is_empty();
    let degraded = finished && !complete;
    let phase = match &mode {
        Mode::Paused | Mode::HeldOnFailure => RolloutPhase::Paused,
        Mode::RollBack(_) => RolloutPhase::RolledBack,
        Mode::Failed => RolloutPhase::Failed,
        _ if complete => RolloutPhase::Complete,
        _ if degraded => RolloutPhase::Degraded,
        _ => RolloutPhase::Progressing,
    };
    // Once a failure is recorded, later rounds no longer evaluate it: the
    // status keeps which clusters failed.
    let failed_clusters: Vec<String> = if failures.is_empty() && failed_before {
        prev.failed_clusters.clone()
    } else {
        failures.keys().map(|k| k.to_string()).collect()
    };
    // A failed check is named where clusters would be (#35).
    let failed_check = waves.iter().find_map(|w| {
        let c = w.analysis.iter().find(|c| c.state == CheckState::Failed)?;
        Some(format!(
            "analysis {} of wave {} ({})",
            c.name, w.name, c.answer
        ))
    });
    let failed_list = match (failed_clusters.is_empty(), &failed_check) {
        (true, Some(check)) => check.clone(),
        _ => failed_clusters.join(", "),
    };
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
        _ if degraded && placed == 0 => Verdict::new(
            PROGRESSING,
            Status::False,
            "NoClusterPlaced",
            format!("the placement selects no cluster: revision {update} runs nowhere"),
        ),
        _ if degraded => Verdict::new(
            PROGRESSING,
            Status::False,
            "RolloutDegraded",
            format!(
                "revision {update} went through every wave but is not done in {}: available in {available}/{placed}",
                if failed_list.is_empty() {
                    "every cluster".to_string()
                } else {
                    failed_list.clone()
                }
            ),
        ),
        _ if no_canary => Verdict::new(
            PROGRESSING,
            Status::True,
            "WaitingForCanary",
            format!(
                "wave {} selects no cluster; requireCanary holds the other waves",
                canary.unwrap_or("-")
            ),
        ),
        _ if let Some((wave, shut)) = &closed => Verdict::new(
            PROGRESSING,
            Status::True,
            shut.reason,
            format!("wave {wave} waits: {}", shut.message),
        ),
        _ if let Some(wave) = awaiting => Verdict::new(
            PROGRESSING,
            Status::True,
            "AwaitingApproval",
            format!(
                "wave {wave} waits for approval of revision {update} (flotilla rollout approve NAMESPACE/{} --wave {wave}){}",
                i.name,
                i.approvals
                    .unreadable
                    .as_deref()
                    .map(|e| format!("; {e}"))
                    .unwrap_or_default()
            ),
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
    let reached = reached(prev, i.clusters, &targets);
    // The revision our clusters agree on; an object in the way is not
    // ours and says nothing about it (review L10).
    let ours: Vec<&Row> = rows.iter().filter(|r| !r.foreign).collect();
    let uniform = ours
        .first()
        .and_then(|r| r.at.filter(|_| r.in_sync))
        .filter(|first| ours.iter().all(|r| r.at_is(first)));
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
        reached_clusters: reached,
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
        placement: counted.map(|p| p.status),
        conditions: conditions::transition(&prev.conditions, &verdicts, i.generation, &now),
    };
    actions.sort();
    Plan {
        actions,
        status,
        requeue_after: requeue.filter(|_| writing || matches!(mode, Mode::HeldOnFailure)),
        checks: match mode {
            Mode::Progress => checks,
            _ => Vec::new(),
        },
    }
}

/// The counted placement of this round (#32), from what the index shows.
fn counted_placement(
    i: &Inputs,
    s: &choose::Settings,
    revisions: &BTreeMap<&str, &Revision>,
    last_good: Option<&str>,
) -> Placed {
    let candidates: Vec<Candidate> = i
        .clusters
        .iter()
        .map(|c| {
            let ours = c.member.as_ref().filter(|m| m.ours);
            // Without labels the spec it should hold is unknown: Done at
            // the running revision is all that can be said.
            let available = match (ours, last_good.and_then(|g| revisions.get(g))) {
                (Some(m), Some(good)) => {
                    m.state == EntryState::Done
                        && m.revision.as_deref() == Some(good.name.as_str())
                        && c.labels.as_ref().is_none_or(|labels| {
                            m.digest
                                == digest(&member_spec(
                                    &good.data.template,
                                    &good.data.overrides,
                                    labels,
                                ))
                        })
                }
                _ => false,
            };
            Candidate {
                name: &c.name,
                matches: c
                    .labels
                    .as_ref()
                    .is_some_and(|l| selects(&i.spec.placement.cluster_selector, l)),
                answering: c.reachable
                    && c.member
                        .as_ref()
                        .is_none_or(|m| m.state != EntryState::Unknown),
                known: c.labels.is_some(),
                holds: ours.is_some(),
                foreign: c.member.as_ref().is_some_and(|m| !m.ours),
                available,
            }
        })
        .collect();
    choose::place(&choose::Inputs {
        uid: i.uid,
        settings: s,
        clusters: &candidates,
        previous: &i.previous.placement.clone().unwrap_or_default(),
        running: last_good.is_some(),
        // No release under way: the update is the good one, or it failed
        // and the clusters are back on (or going back to) the good one.
        steady: last_good == Some(i.update.name.as_str())
            || i.previous.failed_revision_number == Some(i.update.number)
            || i.update.failed(),
        paused: i.spec.paused,
        now: i.now,
        term_started: i.term_started,
    })
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
    for c in clusters {
        let ours = c.member.as_ref().is_some_and(|m| m.ours);
        let written_lately = prev
            .clusters
            .iter()
            .any(|p| p.name == c.name && (p.target.is_some() || p.revision.is_some()));
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

/// Holds each cluster in the wave it was in for this update revision once
/// that wave started, so relabelling or unregistering a cluster cannot
/// empty a running wave (review H3). Returns the clusters that are gone
/// from the registry (`registered` says who is there): they stay in their
/// wave as not done.
fn hold_members<'a>(
    wave_list: &mut Vec<(String, Vec<String>)>,
    prev: &'a FleetMicroserviceStatus,
    same_update: bool,
    registered: impl Fn(&str) -> bool,
) -> Vec<&'a str> {
    let mut ghosts = Vec::new();
    let running = prev
        .waves
        .iter()
        .filter(|w| same_update && w.started.is_some() && w.finished.is_none());
    for was in running {
        let at = match wave_list.iter().position(|(n, _)| *n == was.name) {
            Some(at) => at,
            None if was.name == placement::REMAINING => {
                wave_list.push((was.name.clone(), Vec::new()));
                wave_list.len() - 1
            }
            None => continue,
        };
        for name in &was.clusters {
            let now_in = wave_list.iter().position(|(_, m)| m.contains(name));
            if now_in == Some(at) {
                continue;
            }
            let gone = !registered(name);
            // A registered cluster outside every wave left the placement:
            // it is removed, not evidence.
            if now_in.is_none() && !gone {
                continue;
            }
            if let Some(from) = now_in {
                wave_list[from].1.retain(|n| n != name);
            }
            wave_list[at].1.push(name.clone());
            if gone {
                ghosts.push(name.as_str());
            }
        }
    }
    for (_, members) in wave_list.iter_mut() {
        members.sort();
    }
    ghosts
}

/// `Failover` needs its primaries, and only it has them.
fn check_dns(spec: &FleetMicroserviceSpec) -> Result<(), String> {
    let Some(dns) = &spec.dns else { return Ok(()) };
    match (dns.strategy, &dns.primary) {
        (DnsStrategy::Failover, None) => {
            Err("dns.strategy Failover needs dns.primary.clusterSelector".into())
        }
        (DnsStrategy::RoundRobin, Some(_)) => {
            Err("dns.primary applies only to dns.strategy Failover".into())
        }
        (_, Some(p)) => {
            placement::check_selector("dns.primary.clusterSelector", &p.cluster_selector)
        }
        (_, None) => Ok(()),
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
        checks: Vec::new(),
    }
}
