//! Stage 4: the mode of the round, the revision each placed cluster is
//! given, and the writes that follow.

use std::collections::BTreeMap;
use std::time::Duration;

use super::failures::Failures;
use super::gates::{self, Gates, Hold};
use super::round::Round;
use super::rows::{Row, Rows};
use super::{Action, Soon};
use crate::rollout::checked::Parallel;
use crate::rollout::failover::choose::Placed;
use crate::rollout::gate::Gate;
use crate::rollout::leaving::{self, Leave, Leaver};
use crate::rollout::spec::OnFailure;
use crate::rollout::trouble::Trouble;

/// What the planner decided for the update revision.
#[derive(Clone, Debug, PartialEq)]
pub enum Mode {
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

impl Mode {
    /// Whether this mode writes to members at all.
    pub fn writes(&self) -> bool {
        !matches!(self, Mode::Paused | Mode::Failed)
    }
}

pub fn mode(round: &Round, over_budget: bool) -> Mode {
    if round.spec.paused {
        Mode::Paused
    } else if round.is_good {
        Mode::Steady
    } else if round.failed_before || (over_budget && round.spec.on_failure == OnFailure::Rollback) {
        match &round.last_good {
            Some(good) => Mode::RollBack(good.clone()),
            None => Mode::Failed,
        }
    } else if over_budget {
        Mode::HeldOnFailure
    } else {
        Mode::Progress
    }
}

/// Which revision each placed cluster is being given.
pub struct Chosen<'a> {
    /// By cluster: the revision it is given, or none. A cluster in the way
    /// has no entry while a release progresses.
    pub targets: BTreeMap<&'a str, Option<String>>,
    /// The wave whose turn it is.
    pub current_wave: Option<String>,
    /// That wave does not start, and why.
    pub hold: Option<Hold>,
    /// The wave its rules let start this round: only it, or a wave that
    /// passed, is recorded as started (#59).
    pub opened: Option<String>,
}

pub fn choose<'a>(
    round: &Round,
    rows: &'a Rows<'a>,
    gates: &Gates,
    failures: &Failures,
    mode: &Mode,
    soon: &mut Soon,
) -> Chosen<'a> {
    let mut chosen = Chosen {
        targets: BTreeMap::new(),
        current_wave: None,
        hold: None,
        opened: None,
    };
    let ours = || rows.placed.iter().filter(|r| !r.foreign);
    match mode {
        Mode::Paused | Mode::HeldOnFailure | Mode::Failed => {
            for r in &rows.placed {
                chosen
                    .targets
                    .insert(r.name(), r.prev_target().map(str::to_string));
            }
        }
        Mode::Steady => {
            for r in ours() {
                chosen
                    .targets
                    .insert(r.name(), Some(round.update.to_string()));
            }
        }
        // Every cluster goes back to the good revision: the one the failed
        // revision reached, and one left on a release that was superseded
        // before it completed (no one asks for it any more, and it was
        // never judged; found by `make chaos`). A cluster already there is
        // not written again.
        Mode::RollBack(good) => {
            for r in ours() {
                chosen.targets.insert(r.name(), Some(good.clone()));
            }
        }
        Mode::Progress => progress(round, rows, gates, failures, soon, &mut chosen),
    }
    chosen
}

/// Wave by wave: passed waves have the update, the wave whose turn it is
/// starts what its rules allow, later waves wait.
fn progress<'a>(
    round: &Round,
    rows: &'a Rows<'a>,
    gates: &Gates,
    failures: &Failures,
    soon: &mut Soon,
    chosen: &mut Chosen<'a>,
) {
    let update = round.update;
    let mut turn_taken = false;
    for ((wave, members), g) in rows.waves.iter().zip(&gates.per_wave) {
        let wave_rows: Vec<&Row> = rows.of_wave(members).filter(|r| !r.foreign).collect();
        if turn_taken {
            keep(&mut chosen.targets, &wave_rows, update);
            continue;
        }
        match g {
            Gate::Skipped if gates.no_canary => {}
            Gate::Skipped => continue,
            Gate::Done(_) | Gate::Baking(_) => {
                for r in &wave_rows {
                    chosen.targets.insert(r.name(), Some(update.to_string()));
                }
                if matches!(g, Gate::Done(_)) {
                    continue;
                }
            }
            Gate::Progressing | Gate::Failed => {}
        }
        chosen.current_wave = Some(wave.clone());
        turn_taken = true;
        if matches!(g, Gate::Skipped | Gate::Baking(_)) {
            continue;
        }
        match start(round, wave, &wave_rows, failures, soon) {
            Ok(started) => {
                chosen.targets.extend(started);
                chosen.opened = Some(wave.clone());
            }
            Err(hold) => {
                chosen.hold = Some(hold);
                keep(&mut chosen.targets, &wave_rows, update);
            }
        }
    }
}

/// The wave whose turn came: its hold, or what each of its clusters is given.
fn start<'a>(
    round: &Round,
    wave: &str,
    wave_rows: &[&'a Row<'a>],
    failures: &Failures,
    soon: &mut Soon,
) -> Result<Vec<(&'a str, Option<String>)>, Hold> {
    let update = round.update;
    let spec = round.spec.wave(wave);
    // Only the wave's own last status says it started: a cluster that came
    // into it already holding the release (relabelled, or a selector edit)
    // does not (#59).
    let before = round.prev_wave(wave);
    let recorded = before.and_then(|w| w.approval.as_ref());
    gates::approval(spec, recorded, round.i.approvals, round.attempt())?;
    let started = before.is_some_and(|w| w.started.is_some());
    if let Err(shut) = gates::window(&round.spec.windows, started, round.i.now) {
        if let Some(wait) = shut
            .until
            .and_then(|u| Duration::try_from(u.duration_since(round.i.now)).ok())
        {
            soon.at(wait.max(Duration::from_secs(1)));
        }
        return Err(Hold::Window(shut));
    }
    let in_flight = wave_rows
        .iter()
        .filter(|r| r.given(update) && !r.done_at_update && !failures.contains_key(r.name()))
        .count();
    let parallel = spec.map_or(Parallel::All, |w| w.parallel);
    let mut slots = gates::slots(parallel, wave_rows.len(), in_flight);
    Ok(wave_rows
        .iter()
        .map(|r| {
            // A cluster that is down when its turn comes takes no slot: it
            // would hold it for the deadline, then fail a release it never
            // received (review M4).
            let take = if r.given(update) {
                true
            } else if slots > 0 && r.answering() {
                slots -= 1;
                true
            } else {
                false
            };
            (r.name(), take.then(|| update.to_string()))
        })
        .collect())
}

/// Waiting: what already has the update keeps it.
fn keep<'a>(targets: &mut BTreeMap<&'a str, Option<String>>, rows: &[&'a Row<'a>], update: &str) {
    for r in rows {
        targets.insert(r.name(), (r.at == Some(update)).then(|| update.to_string()));
    }
}

/// A failover is not a release: its replacement gets the running revision
/// at once, whatever wave it falls in.
pub fn fail_over<'a>(
    mut chosen: Chosen<'a>,
    round: &Round,
    counted: Option<&Placed>,
    mode: &Mode,
) -> Chosen<'a> {
    if let (Some(p), Some(good), Mode::Progress | Mode::HeldOnFailure) =
        (counted, &round.last_good, mode)
    {
        for name in &p.replacements {
            if let Some(t @ None) = chosen.targets.get_mut(name.as_str()) {
                *t = Some(good.clone());
            }
        }
    }
    chosen
}

/// The writes of the round, and the decision for each leaving cluster.
pub struct Writes<'a> {
    pub actions: Vec<Action>,
    pub removals: BTreeMap<&'a str, Leave>,
}

pub fn writes<'a>(
    round: &Round,
    rows: &'a Rows<'a>,
    chosen: &Chosen,
    mode: &Mode,
    counted: bool,
) -> Writes<'a> {
    let mut actions = Vec::new();
    // Held on failure, the clusters already given the update may still get
    // it (one that was down may come back and turn done, clearing the
    // failure); no new cluster is started.
    if mode.writes() {
        for r in rows.placed.iter().filter(|r| !r.foreign && r.c.reachable) {
            if let Some(Some(t)) = chosen.targets.get(r.name())
                && !r.at_is(t)
                && !r.trouble(round, t).is_some_and(Trouble::permanent)
            {
                actions.push(Action::Apply {
                    cluster: r.c.name.clone(),
                    revision: t.clone(),
                });
            }
        }
    }
    // Leaving the placement goes wave by wave too (review M6). With a
    // count, clusters leave by failover as much as by edits: one that
    // cannot be reached (a replaced cluster that is down for good) must not
    // hold the waves' removals, or every later replaced cluster would keep
    // running (N + 2 and more). It is removed when it answers again.
    let leavers: Vec<Leaver> = rows
        .leaving
        .iter()
        .filter(|c| !counted || c.reachable)
        .filter_map(|c| {
            Some(Leaver {
                name: &c.name,
                labels: c.labels.as_ref()?,
                reachable: c.reachable,
            })
        })
        .collect();
    let removals = leaving::removals(&round.spec.waves, &leavers);
    if !round.spec.paused {
        for (name, leave) in &removals {
            if *leave == Leave::Now {
                actions.push(Action::Delete {
                    cluster: name.to_string(),
                });
            }
        }
    }
    actions.sort();
    Writes { actions, removals }
}
