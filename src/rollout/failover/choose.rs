//! A counted placement: which N clusters run the object, and when one that
//! stopped serving is replaced (#32). Pure: the planner gives it what the
//! index shows and the placement last written, and writes what it returns
//! before acting on it, so a successor continues the same decision.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::rank;
use super::types::{Failback, PlacedCluster, PlacementChange, PlacementStatus, Role};
use crate::rollout::gate::{left, stamp, trusted};

/// How many failovers and failbacks the status remembers.
pub const HISTORY: usize = 10;
pub const UNREACHABLE_AFTER: Duration = Duration::from_secs(60);
pub const UNAVAILABLE_AFTER: Duration = Duration::from_secs(300);
pub const FAILBACK_AFTER: Duration = Duration::from_secs(300);

/// The checked `spec.placement` of a counted placement.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub count: usize,
    pub unreachable_after: Duration,
    pub unavailable_after: Duration,
    pub failback: Failback,
    pub failback_after: Duration,
}

/// One registered cluster, as the planner sees it now.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate<'a> {
    pub name: &'a str,
    /// Its labels are known and the placement's selector selects them.
    pub matches: bool,
    /// Its labels can be read: a chosen cluster whose labels cannot stays
    /// chosen (neither written nor emptied, as everywhere in rollouts).
    pub known: bool,
    /// Reachable, and its member object not Unknown.
    pub answering: bool,
    /// Our Microservice is there, as last seen.
    pub holds: bool,
    /// A Microservice that is not ours is in the way.
    pub foreign: bool,
    /// Ours is Available, in sync, at the running revision.
    pub available: bool,
}

pub struct Inputs<'a> {
    pub uid: &'a str,
    pub settings: &'a Settings,
    pub clusters: &'a [Candidate<'a>],
    pub previous: &'a PlacementStatus,
    /// A revision completed, so there is something to fail over with.
    pub running: bool,
    /// No release is under way: the update is the running revision, so a
    /// cluster not Available at it is failing, not updating.
    pub steady: bool,
    /// spec.paused: the placement holds; timers keep counting.
    pub paused: bool,
    pub now: Timestamp,
    pub term_started: Timestamp,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Placed {
    pub status: PlacementStatus,
    /// The clusters that run it.
    pub chosen: BTreeSet<String>,
    /// Replaced clusters whose Microservice must stay for now.
    pub kept: BTreeSet<String>,
    /// Chosen by a failover, this round or earlier, and not yet holding
    /// it: they get the running revision at once, not by waves.
    pub replacements: BTreeSet<String>,
    /// When a timer or the failover gap ends.
    pub requeue: Option<Duration>,
}

/// One round's placement: the last one carried to now, at most one
/// failover or failback, filled or trimmed to N, and what must stay.
pub fn place(i: &Inputs) -> Placed {
    let r = Round::new(i);
    let mut soon = Soon::default();
    let mut state = carry(&r);
    let moved = fail_over(&r, &mut state, &mut soon);
    if !moved {
        fail_back(&r, &mut state, &mut soon);
    }
    fill(&r, &mut state);
    finish(&r, state, soon)
}

/// What a round reads.
struct Round<'a> {
    i: &'a Inputs<'a>,
    s: &'a Settings,
    now: Time,
    by_name: BTreeMap<&'a str, &'a Candidate<'a>>,
    /// `failback: WhenHealthy`.
    back_later: bool,
    /// Not paused, and a revision completed: a failover or failback may act.
    acting: bool,
}

impl<'a> Round<'a> {
    fn new(i: &'a Inputs<'a>) -> Self {
        Round {
            i,
            s: i.settings,
            now: stamp(i.now),
            by_name: i.clusters.iter().map(|c| (c.name, c)).collect(),
            back_later: i.settings.failback == Failback::WhenHealthy,
            acting: !i.paused && i.running,
        }
    }

    fn available(&self, n: &str) -> bool {
        self.by_name.get(n).is_some_and(|c| c.available)
    }

    fn since(&self, t: &Option<Time>, span: Duration) -> Option<Time> {
        t.as_ref().map(|t| trusted(t, span, self.i.term_started))
    }

    /// Replaced clusters that still serve it (answer, hold it, Available)
    /// while the cluster that took their place is not yet available: each
    /// is one more than N running, and worth keeping. One that serves
    /// nothing holds nothing up: it may go when the next failover needs
    /// its slot.
    fn waiting(&self, st: &State) -> usize {
        st.replaced
            .iter()
            .filter(|r| {
                self.by_name
                    .get(r.name.as_str())
                    .is_some_and(|c| c.holds && c.answering && c.available)
                    && end_of(&r.name, &st.replaced, &st.chosen)
                        .is_some_and(|end| !self.available(end))
            })
            .count()
    }

    /// The clusters that may take a place (selected, answering, not
    /// blocked), by rank, those it failed in lately last.
    fn free(&self, st: &State) -> Vec<&'a str> {
        let eligible = self.i.clusters.iter().filter(|c| {
            c.matches && c.answering && !c.foreign && !st.chosen.iter().any(|p| p.name == c.name)
        });
        avoiding(
            rank::ranked(self.i.uid, eligible.map(|c| c.name)),
            &st.history,
        )
    }

    /// The best of `free`: one that already runs it available (one
    /// replaced earlier) first, else the best ranked.
    fn pick(&self, free: &[&str]) -> Option<String> {
        free.iter()
            .find(|n| self.by_name[*n].holds && self.by_name[*n].available)
            .or(free.first())
            .map(|n| n.to_string())
    }

    /// What is left of the gap since the last failover, if any.
    fn gap(&self, st: &State) -> Option<Duration> {
        let span = self.s.unreachable_after;
        st.last
            .as_ref()
            .and_then(|t| left(self.i.now, &trusted(t, span, self.i.term_started), span))
    }
}

/// The placement as this round changes it.
struct State {
    chosen: Vec<PlacedCluster>,
    replaced: Vec<PlacedCluster>,
    history: Vec<PlacementChange>,
    last: Option<Time>,
}

#[derive(Default)]
struct Soon(Option<Duration>);

impl Soon {
    fn at(&mut self, d: Duration) {
        self.0 = Some(self.0.map_or(d, |r| r.min(d)));
    }
}

/// The chosen that still match, with their timers brought up to now. A
/// cluster gone from the registry, or no longer selected, just leaves:
/// the first cannot be written, the second leaves by the waves.
fn carry(r: &Round) -> State {
    let (i, now) = (r.i, &r.now);
    let mut st = State {
        chosen: Vec::new(),
        replaced: Vec::new(),
        history: i.previous.history.clone(),
        last: i.previous.last_failover.clone(),
    };
    for p in &i.previous.clusters {
        let Some(c) = r.by_name.get(p.name.as_str()) else {
            continue;
        };
        match p.role {
            Role::Chosen if c.matches || !c.known => {
                let counts = i.running && i.steady;
                st.chosen.push(PlacedCluster {
                    unreachable_since: (!c.answering)
                        .then(|| p.unreachable_since.clone().unwrap_or_else(|| now.clone())),
                    // Unknown does not reset it: only Available does.
                    unavailable_since: (counts && !c.available)
                        .then(|| p.unavailable_since.clone().unwrap_or_else(|| now.clone())),
                    ..p.clone()
                })
            }
            Role::Chosen => {}
            // Seen without it: nothing left to remove, and, unless it may
            // take its place back, nothing to remember.
            Role::Replaced if c.answering && !c.holds && !(r.back_later && original(p)) => {}
            Role::Replaced => st.replaced.push(PlacedCluster {
                healthy_since: c
                    .answering
                    .then(|| p.healthy_since.clone().unwrap_or_else(|| now.clone())),
                ..p.clone()
            }),
        }
    }
    st
}

/// A chosen cluster whose timer ran out: (since, index, why, what).
type Due = (Time, usize, &'static str, String);

/// The chosen clusters whose timers ran out, failing longest first.
fn due(r: &Round, st: &State, soon: &mut Soon) -> Vec<Due> {
    let s = r.s;
    let mut due: Vec<Due> = Vec::new();
    for (k, p) in st.chosen.iter().enumerate() {
        let timers = [
            (
                r.since(&p.unreachable_since, s.unreachable_after),
                s.unreachable_after,
                "Unreachable",
            ),
            (
                r.since(&p.unavailable_since, s.unavailable_after),
                s.unavailable_after,
                "Unavailable",
            ),
        ];
        // While it does not answer, only unreachableAfter decides (the
        // unavailable timer keeps counting for when it answers again).
        let dark = p.unreachable_since.is_some();
        for (t, span, why) in timers {
            let Some(t) = t.filter(|_| !dark || why == "Unreachable") else {
                continue;
            };
            match left(r.i.now, &t, span) {
                Some(rest) => soon.at(rest),
                None => due.push((t, k, why, format!("{} for {span:?}", why.to_lowercase()))),
            }
        }
    }
    due.sort_by(|a, b| a.0.0.cmp(&b.0.0).then(a.1.cmp(&b.1)));
    due
}

/// At most one failover per gap, the cluster failing longest first.
/// Returns whether one moved.
fn fail_over(r: &Round, st: &mut State, soon: &mut Soon) -> bool {
    let due = due(r, st, soon);
    let gap = r.gap(st);
    let to = r.pick(&r.free(st));
    // A cluster that still answers stays running until its replacement is
    // available: so while another replaced cluster waits, it waits too
    // (never more than N + 1 running), unless that one is the replacement;
    // an unreachable one never waits.
    let busy = r.waiting(st) > 0
        && !to
            .as_ref()
            .is_some_and(|t| st.replaced.iter().any(|p| &p.name == t));
    let first = due
        .iter()
        .find(|d| !(busy && r.by_name[st.chosen[d.1].name.as_str()].answering));
    if busy && first.is_none() && !due.is_empty() {
        soon.at(Duration::from_secs(5));
    }
    let Some((_, k, why, what)) = first.cloned().filter(|_| r.acting) else {
        return false;
    };
    let to = match (gap, to) {
        (Some(rest), _) => {
            soon.at(rest);
            return false;
        }
        (None, None) => {
            st.chosen[k].message =
                format!("{what}; no other selected cluster answers to replace it");
            return false;
        }
        (None, Some(to)) => to,
    };
    let now = &r.now;
    let from = st.chosen.remove(k);
    let c = r.by_name[from.name.as_str()];
    let message = format!("{what}; replaced by {to}");
    if c.holds || !c.answering {
        st.replaced.push(PlacedCluster {
            role: Role::Replaced,
            reason: why.to_string(),
            message: message.clone(),
            since: now.clone(),
            unreachable_since: None,
            unavailable_since: None,
            healthy_since: c.answering.then(|| now.clone()),
            replaced_by: Some(to.clone()),
            name: from.name.clone(),
        });
    }
    st.replaced.retain(|p| p.name != to);
    st.chosen.push(entry(
        &to,
        "Replacement",
        format!("replaces {} ({what})", from.name),
        now,
    ));
    st.history.push(change(now, why, &from.name, &to, message));
    st.last = Some(now.clone());
    if due.len() > 1 {
        soon.at(r.s.unreachable_after);
    }
    true
}

/// Failback: a replaced cluster that answered long enough takes its place
/// back, within the same gap.
fn fail_back(r: &Round, st: &mut State, soon: &mut Soon) {
    if !(r.back_later && r.acting && r.waiting(st) == 0) {
        return;
    }
    let s = r.s;
    // Only a cluster lost as a whole: one whose Microservice failed there
    // says nothing about it by answering again, and moving back to it
    // would swing between the two.
    let back = st.replaced.iter().position(|p| {
        p.reason == "Unreachable"
            && r.by_name
                .get(p.name.as_str())
                .is_some_and(|c| c.matches && !c.foreign)
            && p.replaced_by
                .as_ref()
                .is_some_and(|to| st.chosen.iter().any(|c| &c.name == to))
            && r.since(&p.healthy_since, s.failback_after)
                .is_some_and(|t| match left(r.i.now, &t, s.failback_after) {
                    Some(rest) => {
                        soon.at(rest);
                        false
                    }
                    None => true,
                })
    });
    let Some(k) = back else { return };
    if let Some(rest) = r.gap(st) {
        soon.at(rest);
        return;
    }
    let now = &r.now;
    let back = st.replaced.remove(k);
    let to = back.replaced_by.clone().expect("checked");
    let at = st
        .chosen
        .iter()
        .position(|p| p.name == to)
        .expect("checked");
    let out = st.chosen.remove(at);
    let message = format!(
        "{} answered for {:?}; {to} is released",
        back.name, s.failback_after
    );
    st.replaced.push(PlacedCluster {
        role: Role::Replaced,
        reason: "FailedBack".into(),
        message: message.clone(),
        since: now.clone(),
        unreachable_since: None,
        unavailable_since: None,
        healthy_since: None,
        replaced_by: Some(back.name.clone()),
        name: out.name,
    });
    st.chosen
        .push(entry(&back.name, "FailedBack", message.clone(), now));
    st.history
        .push(change(now, "FailedBack", &to, &back.name, message));
    st.last = Some(now.clone());
}

/// Fill to N by rank, and trim beyond it: the lowest ranked leave.
/// Clusters that already hold it rank first, so a new count moves little.
fn fill(r: &Round, st: &mut State) {
    while st.chosen.len() < r.s.count {
        let ranked = r.free(st);
        let Some(name) = r.pick(&ranked) else { break };
        let rank = ranked.iter().position(|n| *n == name).unwrap_or(0) + 1;
        st.replaced.retain(|p| p.name != name);
        st.chosen.push(entry(
            &name,
            "Ranked",
            format!("rank {rank} of {} free clusters", ranked.len()),
            &r.now,
        ));
    }
    if st.chosen.len() > r.s.count {
        let order = rank::ranked(r.i.uid, st.chosen.iter().map(|p| p.name.as_str()));
        let keep: BTreeSet<String> = order
            .iter()
            .take(r.s.count)
            .map(|n| n.to_string())
            .collect();
        st.chosen.retain(|p| keep.contains(&p.name));
    }
}

/// What the round comes to: replacements, what replaced clusters keep,
/// and the status.
fn finish(r: &Round, mut st: State, soon: Soon) -> Placed {
    let by_name = &r.by_name;
    // Replacements not yet holding it get the running revision at once.
    let replacements: BTreeSet<String> = st
        .chosen
        .iter()
        .filter(|p| matches!(p.reason.as_str(), "Replacement" | "FailedBack"))
        .filter(|p| by_name.get(p.name.as_str()).is_some_and(|c| !c.holds))
        .map(|p| p.name.clone())
        .collect();
    // A replaced cluster keeps its Microservice until the cluster that
    // took its place is Available; only then may the waves remove it.
    // With WhenHealthy, an original is remembered (not kept running) while
    // its replacement holds its place, so it can take it back.
    let chosen = &st.chosen;
    st.replaced.retain(|p| {
        let c = by_name.get(p.name.as_str());
        c.is_none_or(|c| c.holds || !c.answering)
            || (r.back_later
                && original(p)
                && p.replaced_by
                    .as_ref()
                    .is_some_and(|to| chosen.iter().any(|c| &c.name == to)))
    });
    let kept = kept(r, &st);
    st.chosen.sort_by(|a, b| a.name.cmp(&b.name));
    st.replaced.sort_by(|a, b| a.name.cmp(&b.name));
    let names: BTreeSet<String> = st.chosen.iter().map(|p| p.name.clone()).collect();
    let skip = st.history.len().saturating_sub(HISTORY);
    st.history.drain(..skip);
    Placed {
        status: PlacementStatus {
            clusters: st.chosen.into_iter().chain(st.replaced).collect(),
            history: st.history,
            last_failover: st.last,
        },
        chosen: names,
        kept,
        replacements,
        requeue: soon.0,
    }
}

/// Every holder that does not answer is kept (nothing is removed from a
/// cluster whose state is unknown); of those that answer, one at most: a
/// chain of failovers (a replacement that failed too) must not leave N + 2
/// running. The one kept is available if one is, else the last replaced.
fn kept(r: &Round, st: &State) -> BTreeSet<String> {
    let holds = |p: &PlacedCluster| r.by_name.get(p.name.as_str()).is_some_and(|c| c.holds);
    let answers = |p: &PlacedCluster| r.by_name.get(p.name.as_str()).is_some_and(|c| c.answering);
    let waits: Vec<&PlacedCluster> = st
        .replaced
        .iter()
        .filter(|p| holds(p))
        .filter(|p| {
            !answers(p)
                || end_of(&p.name, &st.replaced, &st.chosen).is_some_and(|end| !r.available(end))
        })
        .collect();
    let one = waits
        .iter()
        .filter(|p| answers(p))
        .max_by_key(|p| (r.available(&p.name), p.since.0))
        .map(|p| p.name.clone());
    waits
        .iter()
        .filter(|p| !answers(p) || Some(&p.name) == one.as_ref())
        .map(|p| p.name.clone())
        .collect()
}

/// `ranked`, with the clusters its Microservice failed in lately last:
/// two clusters where it cannot run must not take turns while a third
/// could.
fn avoiding<'a>(ranked: Vec<&'a str>, history: &[PlacementChange]) -> Vec<&'a str> {
    let failed = |n: &str| {
        history
            .iter()
            .any(|h| h.reason == "Unavailable" && h.from == n)
    };
    let (bad, mut good): (Vec<&str>, Vec<&str>) = ranked.into_iter().partition(|n| failed(n));
    good.extend(bad);
    good
}

/// Replaced by a failover, not released by a failback.
fn original(r: &PlacedCluster) -> bool {
    matches!(r.reason.as_str(), "Unreachable" | "Unavailable")
}

/// The chosen cluster at the end of `from`'s chain of replacements, if
/// the chain ends in one (a replacement may itself have been replaced).
fn end_of<'a>(
    from: &str,
    replaced: &'a [PlacedCluster],
    chosen: &'a [PlacedCluster],
) -> Option<&'a str> {
    let mut at = from;
    for _ in 0..=replaced.len() {
        let next = replaced
            .iter()
            .find(|r| r.name == at)?
            .replaced_by
            .as_deref()?;
        if chosen.iter().any(|p| p.name == next) {
            return Some(next);
        }
        at = next;
    }
    None
}

fn entry(name: &str, reason: &str, message: String, now: &Time) -> PlacedCluster {
    PlacedCluster {
        name: name.to_string(),
        role: Role::Chosen,
        reason: reason.to_string(),
        message,
        since: now.clone(),
        unreachable_since: None,
        unavailable_since: None,
        healthy_since: None,
        replaced_by: None,
    }
}

fn change(now: &Time, reason: &str, from: &str, to: &str, message: String) -> PlacementChange {
    PlacementChange {
        time: now.clone(),
        reason: reason.to_string(),
        from: from.to_string(),
        to: to.to_string(),
        message,
    }
}

#[cfg(test)]
#[path = "choose_tests.rs"]
mod tests;
