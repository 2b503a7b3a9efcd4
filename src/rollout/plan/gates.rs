//! Stage 3: every rule a wave obeys, one function each (#58).
//!
//! `decide` applies the rules that judge a wave's evidence (the canary and
//! bake gate, analysis, the failure budget, the canary requirement); the
//! rules that hold a wave whose turn came (approval, time windows,
//! maxParallel) are here too, and `targets` asks them.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;

use super::Soon;
use super::failures::Failures;
use super::round::Round;
use super::rows::Rows;
use crate::rollout::analysis::{self, Judgement};
use crate::rollout::approval::{self, Approvals, Attempt};
use crate::rollout::checked::{self, Parallel};
use crate::rollout::gate::{self, Evidence, Gate};
use crate::rollout::spec::{Approval, CheckStatus, WaveApproval};
use crate::rollout::window;

/// Each wave's gate, and what the checks said.
pub struct Gates {
    /// One per wave of `Rows::waves`, in the same order.
    pub per_wave: Vec<Gate>,
    /// Each analysed wave's checks, this round.
    pub judged: BTreeMap<String, Vec<CheckStatus>>,
    /// Analysis checks to run now.
    pub checks: Vec<analysis::Due>,
    /// Failures over `maxFailedClusters`, or a wave failed.
    pub over_budget: bool,
    /// requireCanary, and the canary wave selects no cluster.
    pub no_canary: bool,
}

/// Why a wave whose turn came does not start.
#[derive(Clone, Debug, PartialEq)]
pub enum Hold {
    /// A `Manual` wave without an approval for this revision.
    Approval,
    /// Outside its time windows.
    Window(window::Closed),
}

pub fn decide(round: &Round, rows: &Rows, failures: &Failures, soon: &mut Soon) -> Gates {
    let mut per_wave: Vec<Gate> = rows
        .waves
        .iter()
        .map(|(wave, members)| bake(round, rows, failures, wave, members))
        .collect();
    let mut checks = Vec::new();
    let mut judged = BTreeMap::new();
    let analysing = !round.spec.analysis.is_empty() && !round.failed_before && !round.spec.paused;
    for (g, (wave, members)) in per_wave.iter_mut().zip(&rows.waves) {
        if !analysing || round.finished_before(wave).is_some() {
            continue;
        }
        if let Some((judgement, statuses, due)) = analyse(round, rows, g, wave, members) {
            *g = analysed(g.clone(), judgement, soon);
            checks.extend(due);
            judged.insert(wave.clone(), statuses);
        }
    }
    let over_budget = over_budget(failures.len(), round.spec.max_failed, &per_wave);
    let counting = !round.failed_before && !over_budget;
    for (g, (wave, _)) in per_wave.iter_mut().zip(&rows.waves) {
        *g = budget(
            g.clone(),
            counting,
            round.finished_before(wave).is_some(),
            soon,
        );
    }
    let no_canary = canary_missing(
        round.spec.require_canary,
        !rows.placed.is_empty(),
        per_wave.first(),
    );
    Gates {
        per_wave,
        judged,
        checks,
        over_budget,
        no_canary,
    }
}

/// The canary and bake rule, on evidence only ([`gate::gate`]): a failed
/// cluster fails the canary wave, and every done one is done for the bake.
fn bake(round: &Round, rows: &Rows, failures: &Failures, wave: &str, members: &[String]) -> Gate {
    let evidence: Vec<Evidence> = members
        .iter()
        .map(|name| match rows.row(name) {
            _ if failures.contains_key(name.as_str()) => Evidence::Failed,
            Some(r) if r.done_at_update => Evidence::Done(r.done_since(round)),
            _ => Evidence::Pending,
        })
        .collect();
    gate::gate(
        &evidence,
        round.spec.canary() == Some(wave),
        round.finished_before(wave).as_ref(),
        round.spec.bake,
        round.i.now,
    )
}

type Analysed = (Judgement, Vec<CheckStatus>, Vec<analysis::Due>);

/// Analysis (#35): a wave whose clusters are done passes only on its
/// checks' evidence; `None` for a wave not yet done.
fn analyse(
    round: &Round,
    rows: &Rows,
    g: &Gate,
    wave: &str,
    members: &[String],
) -> Option<Analysed> {
    if !matches!(g, Gate::Baking(_) | Gate::Done(_)) {
        return None;
    }
    let now = round.i.now;
    let evidence = analysis::Evidence {
        revision: round.update.to_string(),
        wave: wave.to_string(),
        generations: rows
            .of_wave(members)
            .filter_map(|r| Some((r.c.name.clone(), r.c.member.as_ref()?.generation)))
            .collect(),
    };
    let settled = rows
        .of_wave(members)
        .filter(|r| r.done_at_update)
        .map(|r| r.done_since(round).0)
        .max()
        .unwrap_or(now);
    let bake_end = bake_end(settled, round.spec.bake);
    Some(analysis::judge(
        &round.spec.analysis,
        round.i.runs,
        &evidence,
        (settled, bake_end),
        now,
    ))
}

/// When a bake that began at `settled` ends, as the gate counts it: a
/// second after the whole-second stamp.
fn bake_end(settled: Timestamp, bake: Duration) -> Timestamp {
    if bake.is_zero() {
        return settled;
    }
    jiff::SignedDuration::try_from(bake + Duration::from_secs(1))
        .ok()
        .and_then(|d| settled.checked_add(d).ok())
        .unwrap_or(settled)
}

/// The analysis rule: the checks' judgement over a done wave's gate.
pub fn analysed(g: Gate, judgement: Judgement, soon: &mut Soon) -> Gate {
    match judgement {
        Judgement::Passed => g,
        Judgement::Failed { .. } => Gate::Failed,
        Judgement::Waiting(next) => {
            soon.at(next);
            Gate::Baking(next)
        }
    }
}

/// The failure budget: more failed clusters than `maxFailedClusters`, or
/// any wave failed.
pub fn over_budget(failed: usize, max_failed: usize, gates: &[Gate]) -> bool {
    failed > max_failed || gates.contains(&Gate::Failed)
}

/// Past the budget, or once failed (`counting` false), no wave newly
/// passes; one that passed before stays passed.
pub fn budget(g: Gate, counting: bool, finished_before: bool, soon: &mut Soon) -> Gate {
    match g {
        Gate::Baking(rest) if counting => {
            soon.at(rest);
            g
        }
        Gate::Done(_) if counting || finished_before => g,
        Gate::Baking(_) | Gate::Done(_) => Gate::Progressing,
        _ => g,
    }
}

/// requireCanary: without a canary that passed, nothing else starts. A
/// canary wave that selects no cluster holds the rest while any is placed.
pub fn canary_missing(require: bool, placed_any: bool, first: Option<&Gate>) -> bool {
    require && placed_any && first == Some(&Gate::Skipped)
}

/// The approval rule: a `Manual` wave is held until approved for this
/// attempt, by an approval in the annotation or the one its last status
/// recorded (kept once the annotation drops it). Nothing else opens it: a
/// cluster that came into the wave already holding the release opens
/// nothing (#59).
pub fn approval(
    wave: Option<&checked::Wave>,
    recorded: Option<&WaveApproval>,
    approvals: &Approvals,
    attempt: Attempt,
) -> Result<(), Hold> {
    let Some(w) = wave.filter(|w| w.approval == Approval::Manual) else {
        return Ok(());
    };
    if recorded.is_some_and(|a| a.opens(attempt))
        || approval::granted(&approvals.given, &w.name, attempt).is_some()
    {
        return Ok(());
    }
    Err(Hold::Approval)
}

/// The window rule: a wave starts only inside its time windows; one that
/// started for this attempt (its last status says so) goes on.
pub fn window(
    windows: &[window::Checked],
    started: bool,
    now: Timestamp,
) -> Result<(), window::Closed> {
    match started {
        true => Ok(()),
        false => window::may_start(windows, now),
    }
}

/// The maxParallel rule: how many more clusters of a wave of `size` may
/// start, with `in_flight` given and not yet done or failed.
pub fn slots(parallel: Parallel, size: usize, in_flight: usize) -> usize {
    parallel.of(size).saturating_sub(in_flight)
}

#[cfg(test)]
#[path = "gates_tests.rs"]
mod tests;
