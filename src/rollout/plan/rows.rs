//! Stage 1: classify the clusters. Each one is placed (a row, in a wave),
//! outside the placement (ours to delete), replaced but kept for now, of
//! unknown labels, or gone from the registry while its wave ran (a ghost).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::Cluster;
use super::round::Round;
use crate::rollout::failover::choose::{self, Candidate, Placed};
use crate::rollout::gate;
use crate::rollout::placement::{self, Labels, digest, member_spec, selects};
use crate::rollout::spec::{ClusterStatus, FleetMicroserviceStatus};
use crate::rollout::trouble::Trouble;
use crate::status::view::EntryState;

/// One placed cluster, classified.
pub struct Row<'a> {
    pub c: &'a Cluster,
    pub prev: Option<&'a ClusterStatus>,
    /// The revision of our member object, if any.
    pub at: Option<&'a str>,
    /// Our member object holds exactly what its revision gives this cluster.
    pub in_sync: bool,
    /// At the update revision, in sync and done.
    pub done_at_update: bool,
    /// A Microservice someone else made is in the way.
    pub foreign: bool,
}

impl Row<'_> {
    pub fn name(&self) -> &str {
        &self.c.name
    }
    pub fn at_is(&self, rev: &str) -> bool {
        self.at == Some(rev) && self.in_sync
    }
    pub fn done(&self) -> bool {
        self.in_sync && self.member_state() == Some(EntryState::Done)
    }
    fn member_state(&self) -> Option<EntryState> {
        self.c.member.as_ref().map(|m| m.state)
    }
    /// Reachable, and its member object not Unknown (a feed that lost it).
    pub fn answering(&self) -> bool {
        self.c.reachable && self.member_state() != Some(EntryState::Unknown)
    }
    pub fn prev_target(&self) -> Option<&str> {
        self.prev.and_then(|p| p.target.as_deref())
    }
    /// The trouble of the last write of `rev` to this row, while the spec
    /// that revision gives it is still the one that was written.
    pub fn trouble<'r>(&self, round: &Round<'r>, rev: &str) -> Option<&'r Trouble> {
        let t = round
            .i
            .troubles
            .get(&self.c.name)
            .filter(|t| t.revision == rev)?;
        let data = &round.revisions.get(rev)?.data;
        let labels = self.c.labels.as_ref()?;
        (t.digest == digest(&member_spec(&data.template, &data.overrides, labels))).then_some(t)
    }

    /// Since when the row has been done at the update revision (for bake).
    pub fn done_since(&self, round: &Round) -> Time {
        match self.prev {
            Some(p) if round.was_done(p) => {
                gate::trusted(&p.since, round.spec.bake, round.i.term_started)
            }
            _ => round.now.clone(),
        }
    }

    /// Given `rev` already: it holds it, or the last status targeted it.
    pub fn given(&self, rev: &str) -> bool {
        self.at == Some(rev) || self.prev_target() == Some(rev)
    }
}

/// Every cluster of the round, classified.
pub struct Rows<'a> {
    /// The placed clusters, by name.
    pub placed: Vec<Row<'a>>,
    /// Outside the placement, holding our object.
    pub leaving: Vec<&'a Cluster>,
    /// Replaced by a counted placement, kept until the replacement is up.
    pub kept: Vec<&'a Cluster>,
    /// Labels unreadable, holding our object.
    pub unknown: Vec<&'a Cluster>,
    /// Each wave, in order, with its clusters' names.
    pub waves: Vec<(String, Vec<String>)>,
    /// Gone from the registry while their wave ran: they stay in it, not done.
    pub ghosts: Vec<&'a str>,
    /// Where each placed cluster's row is in `placed`.
    index: BTreeMap<&'a str, usize>,
    /// Every cluster of every wave.
    waved: BTreeSet<String>,
}

impl Rows<'_> {
    pub fn row(&self, name: &str) -> Option<&Row<'_>> {
        self.index.get(name).map(|&i| &self.placed[i])
    }

    pub fn in_a_wave(&self, name: &str) -> bool {
        self.waved.contains(name)
    }

    /// A wave's placed rows, in order.
    pub fn of_wave<'s>(&'s self, members: &'s [String]) -> impl Iterator<Item = &'s Row<'s>> {
        members.iter().filter_map(|n| self.row(n))
    }
}

pub fn classify<'a>(round: &Round<'a>, counted: Option<&Placed>) -> Rows<'a> {
    let i = round.i;
    let mut rows = Rows {
        placed: Vec::new(),
        leaving: Vec::new(),
        kept: Vec::new(),
        unknown: Vec::new(),
        waves: Vec::new(),
        ghosts: Vec::new(),
        index: BTreeMap::new(),
        waved: BTreeSet::new(),
    };
    for c in i.clusters {
        let Some(labels) = &c.labels else {
            if c.member.as_ref().is_some_and(|m| m.ours) {
                rows.unknown.push(c);
            }
            continue;
        };
        let placed = match counted {
            Some(p) => p.chosen.contains(&c.name),
            None => selects(&round.spec.selector, labels),
        };
        let ours = c.member.as_ref().filter(|m| m.ours);
        if !placed {
            match ours {
                Some(_) if counted.is_some_and(|p| p.kept.contains(&c.name)) => rows.kept.push(c),
                Some(_) => rows.leaving.push(c),
                None => {}
            }
            continue;
        }
        rows.placed.push(row(round, c, labels));
    }
    rows.placed.sort_by(|a, b| a.c.name.cmp(&b.c.name));
    rows.index = rows
        .placed
        .iter()
        .enumerate()
        .map(|(at, r)| (r.c.name.as_str(), at))
        .collect();
    rows.waves = waves(round, &rows.placed, &rows.unknown);
    let registered: BTreeSet<&str> = i.clusters.iter().map(|c| c.name.as_str()).collect();
    rows.ghosts = hold_members(&mut rows.waves, i.previous, round.same_update, |n| {
        registered.contains(n)
    });
    rows.waved = rows
        .waves
        .iter()
        .flat_map(|(_, m)| m.iter().cloned())
        .collect();
    rows
}

fn row<'a>(round: &Round<'a>, c: &'a Cluster, labels: &Labels) -> Row<'a> {
    let ours = c.member.as_ref().filter(|m| m.ours);
    let at = ours.and_then(|m| m.revision.as_deref());
    let in_sync = match (ours, at.and_then(|a| round.revisions.get(a))) {
        (Some(m), Some(r)) => {
            m.digest == digest(&member_spec(&r.data.template, &r.data.overrides, labels))
        }
        _ => false,
    };
    let mut row = Row {
        c,
        prev: round.prev_of(&c.name),
        at,
        in_sync,
        done_at_update: false,
        foreign: c.member.as_ref().is_some_and(|m| !m.ours),
    };
    row.done_at_update = row.at_is(round.update) && row.done();
    row
}

/// The waves the placed clusters fall in. A cluster whose labels cannot
/// be read stays in the wave it was in, not done: an emptied wave must
/// not count as finished.
fn waves(round: &Round, placed: &[Row], unknown: &[&Cluster]) -> Vec<(String, Vec<String>)> {
    let labels_of: Vec<(&str, &Labels)> = placed
        .iter()
        .filter_map(|r| r.c.labels.as_ref().map(|l| (r.c.name.as_str(), l)))
        .collect();
    let mut list = placement::waves(&round.spec.waves, labels_of);
    for c in unknown {
        let was = round
            .i
            .previous
            .waves
            .iter()
            .find(|w| w.clusters.contains(&c.name));
        if let Some(w) = was.and_then(|was| list.iter_mut().find(|(n, _)| *n == was.name)) {
            w.1.push(c.name.clone());
        }
    }
    list
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
    // Which wave each cluster is in now, kept as clusters move.
    let mut membership: BTreeMap<String, usize> = wave_list
        .iter()
        .enumerate()
        .flat_map(|(at, (_, m))| m.iter().map(move |n| (n.clone(), at)))
        .collect();
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
            let now_in = membership.get(name).copied();
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
            membership.insert(name.clone(), at);
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

/// The counted placement of this round (#32), from what the index shows.
pub fn counted_placement(round: &Round, s: &choose::Settings) -> Placed {
    let i = round.i;
    let good = round
        .last_good
        .as_deref()
        .and_then(|g| round.revisions.get(g));
    let candidates: Vec<Candidate> = i
        .clusters
        .iter()
        .map(|c| {
            let ours = c.member.as_ref().filter(|m| m.ours);
            // Without labels the spec it should hold is unknown: Done at
            // the running revision is all that can be said.
            let available = match (ours, good) {
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
                    .is_some_and(|l| selects(&round.spec.selector, l)),
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
    let last_good = round.last_good.as_deref();
    choose::place(&choose::Inputs {
        uid: i.uid,
        settings: s,
        clusters: &candidates,
        previous: &i.previous.placement.clone().unwrap_or_default(),
        running: last_good.is_some(),
        // No release under way: the update is the good one, or it failed
        // and the clusters are back on (or going back to) the good one.
        steady: last_good == Some(round.update) || round.failed_before,
        paused: round.spec.paused,
        now: i.now,
        term_started: i.term_started,
    })
}
