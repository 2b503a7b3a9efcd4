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

pub fn place(i: &Inputs) -> Placed {
    let s = i.settings;
    let now = stamp(i.now);
    let by_name: BTreeMap<&str, &Candidate> = i.clusters.iter().map(|c| (c.name, c)).collect();
    let back_later = s.failback == Failback::WhenHealthy;
    let available = |n: &str| by_name.get(n).is_some_and(|c| c.available);
    // Replaced clusters that still serve it (answer, hold it, Available)
    // while the cluster that took their place is not yet available: each is
    // one more than N running, and worth keeping. One that serves nothing
    // holds nothing up: it may go when the next failover needs its slot.
    let waiting = |replaced: &[PlacedCluster], chosen: &[PlacedCluster]| {
        replaced
            .iter()
            .filter(|r| {
                by_name
                    .get(r.name.as_str())
                    .is_some_and(|c| c.holds && c.answering && c.available)
                    && end_of(&r.name, replaced, chosen).is_some_and(|end| !available(end))
            })
            .count()
    };
    let mut requeue: Option<Duration> = None;
    let mut soon = |d: Duration| requeue = Some(requeue.map_or(d, |r: Duration| r.min(d)));
    let since =
        |t: &Option<Time>, span: Duration| t.as_ref().map(|t| trusted(t, span, i.term_started));

    // The chosen that still match, with their timers brought up to now. A
    // cluster gone from the registry, or no longer selected, just leaves:
    // the first cannot be written, the second leaves by the waves.
    let mut chosen: Vec<PlacedCluster> = Vec::new();
    let mut replaced: Vec<PlacedCluster> = Vec::new();
    for p in &i.previous.clusters {
        let Some(c) = by_name.get(p.name.as_str()) else {
            continue;
        };
        match p.role {
            Role::Chosen if c.matches || !c.known => {
                let counts = i.running && i.steady;
                chosen.push(PlacedCluster {
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
            Role::Replaced if c.answering && !c.holds && !(back_later && original(p)) => {}
            Role::Replaced => replaced.push(PlacedCluster {
                healthy_since: c
                    .answering
                    .then(|| p.healthy_since.clone().unwrap_or_else(|| now.clone())),
                ..p.clone()
            }),
        }
    }
    let mut history = i.previous.history.clone();
    let mut last = i.previous.last_failover.clone();
    let mut replacements: BTreeSet<String> = BTreeSet::new();

    // A cluster that may take a place: selected, answering, not blocked.
    let free = |chosen: &[PlacedCluster]| -> Vec<&str> {
        let eligible = i.clusters.iter().filter(|c| {
            c.matches && c.answering && !c.foreign && !chosen.iter().any(|p| p.name == c.name)
        });
        rank::ranked(i.uid, eligible.map(|c| c.name))
    };
    let gap = last.as_ref().and_then(|t| {
        left(
            i.now,
            &trusted(t, s.unreachable_after, i.term_started),
            s.unreachable_after,
        )
    });
    let acting = !i.paused && i.running;

    // At most one failover per gap, the cluster failing longest first.
    let mut due: Vec<(Time, usize, &'static str, String)> = Vec::new();
    for (k, p) in chosen.iter().enumerate() {
        let timers = [
            (
                since(&p.unreachable_since, s.unreachable_after),
                s.unreachable_after,
                "Unreachable",
            ),
            (
                since(&p.unavailable_since, s.unavailable_after),
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
            match left(i.now, &t, span) {
                Some(rest) => soon(rest),
                None => due.push((t, k, why, format!("{} for {span:?}", why.to_lowercase()))),
            }
        }
    }
    due.sort_by(|a, b| a.0.0.cmp(&b.0.0).then(a.1.cmp(&b.1)));
    let mut moved = false;
    // The replacement: a cluster that already runs it available (one
    // replaced earlier) first, else the best ranked that answers.
    let free_now = avoiding(free(&chosen), &history);
    let to = free_now
        .iter()
        .find(|n| by_name[*n].holds && by_name[*n].available)
        .or(free_now.first())
        .map(|n| n.to_string());
    // A cluster that still answers stays running until its replacement is
    // available: so while another replaced cluster waits, it waits too
    // (never more than N + 1 running), unless that one is the replacement;
    // an unreachable one never waits.
    let busy = waiting(&replaced, &chosen) > 0
        && !to
            .as_ref()
            .is_some_and(|t| replaced.iter().any(|r| &r.name == t));
    let first = due
        .iter()
        .find(|d| !(busy && by_name[chosen[d.1].name.as_str()].answering));
    if busy && first.is_none() && !due.is_empty() {
        soon(Duration::from_secs(5));
    }
    if let Some((_, k, why, what)) = first.cloned().filter(|_| acting) {
        match (gap, to) {
            (Some(rest), _) => soon(rest),
            (None, None) => {
                chosen[k].message =
                    format!("{what}; no other selected cluster answers to replace it");
            }
            (None, Some(to)) => {
                let from = chosen.remove(k);
                let c = by_name[from.name.as_str()];
                let message = format!("{what}; replaced by {to}");
                if c.holds || !c.answering {
                    replaced.push(PlacedCluster {
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
                replaced.retain(|r| r.name != to);
                chosen.push(entry(
                    &to,
                    "Replacement",
                    format!("replaces {} ({what})", from.name),
                    &now,
                ));
                history.push(change(&now, why, &from.name, &to, message));
                last = Some(now.clone());
                moved = true;
                if due.len() > 1 {
                    soon(s.unreachable_after);
                }
            }
        }
    }

    // Failback: a replaced cluster that answered long enough takes its
    // place back, within the same gap.
    if back_later && acting && !moved && waiting(&replaced, &chosen) == 0 {
        // Only a cluster lost as a whole: one whose Microservice failed
        // there says nothing about it by answering again, and moving back
        // to it would swing between the two.
        let back = replaced.iter().position(|r| {
            r.reason == "Unreachable"
                && by_name
                    .get(r.name.as_str())
                    .is_some_and(|c| c.matches && !c.foreign)
                && r.replaced_by
                    .as_ref()
                    .is_some_and(|to| chosen.iter().any(|p| &p.name == to))
                && since(&r.healthy_since, s.failback_after).is_some_and(|t| {
                    match left(i.now, &t, s.failback_after) {
                        Some(rest) => {
                            soon(rest);
                            false
                        }
                        None => true,
                    }
                })
        });
        match (back, gap) {
            (Some(_), Some(rest)) => soon(rest),
            (Some(k), None) => {
                let back = replaced.remove(k);
                let to = back.replaced_by.clone().expect("checked");
                let at = chosen.iter().position(|p| p.name == to).expect("checked");
                let out = chosen.remove(at);
                let message = format!(
                    "{} answered for {:?}; {to} is released",
                    back.name, s.failback_after
                );
                replaced.push(PlacedCluster {
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
                chosen.push(entry(&back.name, "FailedBack", message.clone(), &now));
                history.push(change(&now, "FailedBack", &to, &back.name, message));
                last = Some(now.clone());
            }
            (None, _) => {}
        }
    }

    // Fill to N by rank, and trim beyond it: the lowest ranked leave.
    // Clusters that already hold it rank first, so a new count moves little.
    while chosen.len() < s.count {
        let ranked = avoiding(free(&chosen), &history);
        let pick = ranked
            .iter()
            .find(|n| by_name[*n].holds && by_name[*n].available)
            .or(ranked.first())
            .map(|n| n.to_string());
        let Some(name) = pick else { break };
        let rank = ranked.iter().position(|n| *n == name).unwrap_or(0) + 1;
        replaced.retain(|r| r.name != name);
        chosen.push(entry(
            &name,
            "Ranked",
            format!("rank {rank} of {} free clusters", ranked.len()),
            &now,
        ));
    }
    if chosen.len() > s.count {
        let order = rank::ranked(i.uid, chosen.iter().map(|p| p.name.as_str()));
        let keep: BTreeSet<String> = order.iter().take(s.count).map(|n| n.to_string()).collect();
        chosen.retain(|p| keep.contains(&p.name));
    }

    // Replacements not yet holding it get the running revision at once.
    for p in &chosen {
        let fresh = matches!(p.reason.as_str(), "Replacement" | "FailedBack");
        if fresh && by_name.get(p.name.as_str()).is_some_and(|c| !c.holds) {
            replacements.insert(p.name.clone());
        }
    }
    // A replaced cluster keeps its Microservice until the cluster that
    // took its place is Available; only then may the waves remove it.
    // With WhenHealthy, an original is remembered (not kept running) while
    // its replacement holds its place, so it can take it back.
    replaced.retain(|r| {
        let c = by_name.get(r.name.as_str());
        c.is_none_or(|c| c.holds || !c.answering)
            || (back_later
                && original(r)
                && r.replaced_by
                    .as_ref()
                    .is_some_and(|to| chosen.iter().any(|p| &p.name == to)))
    });
    // Every holder that does not answer is kept (nothing is removed from a
    // cluster whose state is unknown); of those that answer, one at most: a
    // chain of failovers (a replacement that failed too) must not leave
    // N + 2 running. The one kept is available if one is, else the last
    // replaced.
    let holds = |r: &PlacedCluster| by_name.get(r.name.as_str()).is_some_and(|c| c.holds);
    let answers = |r: &PlacedCluster| by_name.get(r.name.as_str()).is_some_and(|c| c.answering);
    let waits: Vec<&PlacedCluster> = replaced
        .iter()
        .filter(|r| holds(r))
        .filter(|r| {
            !answers(r) || end_of(&r.name, &replaced, &chosen).is_some_and(|end| !available(end))
        })
        .collect();
    let one = waits
        .iter()
        .filter(|r| answers(r))
        .max_by_key(|r| (available(&r.name), r.since.0))
        .map(|r| r.name.clone());
    let kept: BTreeSet<String> = waits
        .iter()
        .filter(|r| !answers(r) || Some(&r.name) == one.as_ref())
        .map(|r| r.name.clone())
        .collect();

    chosen.sort_by(|a, b| a.name.cmp(&b.name));
    replaced.sort_by(|a, b| a.name.cmp(&b.name));
    let names: BTreeSet<String> = chosen.iter().map(|p| p.name.clone()).collect();
    let skip = history.len().saturating_sub(HISTORY);
    history.drain(..skip);
    Placed {
        status: PlacementStatus {
            clusters: chosen.into_iter().chain(replaced).collect(),
            history,
            last_failover: last,
        },
        chosen: names,
        kept,
        replacements,
        requeue,
    }
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
