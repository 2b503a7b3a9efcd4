//! The fleet-wide names as the fleet's DNS writer keeps them (#31): from
//! the zone as read (each member leader's record of its own cluster's
//! Service) and which clusters belong in each answer, the conditional etcd
//! writes that make `NAME.NAMESPACE.ZONE` list exactly those. Pure.

use std::collections::{BTreeMap, BTreeSet};

use super::health::{Candidate, Judged};

use crate::registry::records::{
    CLUSTER_TREE, Existing, Op, Record, Refusal, Writer, Zone, newer_term,
};

/// A Microservice: (namespace, name).
pub type Object = (String, String);

/// Where a key sits in the zone.
#[derive(Debug, PartialEq, Eq)]
enum Place<'a> {
    /// `<zone>/cluster/CLUSTER/NS/NAME`: a member leader's own name.
    Own {
        cluster: &'a str,
        ns: &'a str,
        name: &'a str,
    },
    /// `<zone>/NS/NAME/CLUSTER`: one cluster's place in a fleet-wide name.
    FleetWide {
        ns: &'a str,
        name: &'a str,
        cluster: &'a str,
    },
}

fn place<'a>(zone: &Zone, key: &'a str) -> Option<Place<'a>> {
    let rest = key.strip_prefix(&zone.key_prefix())?;
    let parts: Vec<&str> = rest.split('/').collect();
    match parts.as_slice() {
        [tree, cluster, ns, name] if *tree == CLUSTER_TREE => {
            Some(Place::Own { cluster, ns, name })
        }
        [ns, name, cluster] if *ns != CLUSTER_TREE => Some(Place::FleetWide { ns, name, cluster }),
        _ => None,
    }
}

/// What the zone holds for the fleet's Microservices.
#[derive(Debug, Default)]
pub struct Zoned<'a> {
    /// Per object, per cluster of the fleet: the record its leader wrote of
    /// its own Service (the candidates, and where their address comes from).
    pub sources: BTreeMap<Object, BTreeMap<String, &'a Existing>>,
    /// Per object, per cluster: the key in its fleet-wide name.
    pub fleet_wide: BTreeMap<Object, BTreeMap<String, &'a Existing>>,
}

/// Sorts the zone as read. Only clusters of this fleet are candidates;
/// a source must be its own cluster leader's record of that object.
pub fn zoned<'a>(zone: &Zone, existing: &'a [Existing], clusters: &BTreeSet<String>) -> Zoned<'a> {
    let mut z = Zoned::default();
    for e in existing {
        match place(zone, &e.key) {
            Some(Place::Own { cluster, ns, name }) => {
                let genuine = e.record.as_ref().is_some_and(|r| {
                    r.writer.cluster == cluster && r.object == format!("{ns}/{name}")
                });
                if genuine && clusters.contains(cluster) {
                    z.sources
                        .entry((ns.to_string(), name.to_string()))
                        .or_default()
                        .insert(cluster.to_string(), e);
                }
            }
            Some(Place::FleetWide { ns, name, cluster }) => {
                z.fleet_wide
                    .entry((ns.to_string(), name.to_string()))
                    .or_default()
                    .insert(cluster.to_string(), e);
            }
            None => {}
        }
    }
    z
}

/// Whether a fleet-wide record is one this writer may replace or remove:
/// its own (any term not newer), or the cluster leader's own from before
/// a fleet DNS writer ran. Another fleet's, and anything else, is not.
fn ours(record: &Record, me: &Writer, cluster: &str, clusters: &BTreeSet<String>) -> bool {
    record.writer.cluster == me.cluster
        || (record.writer.cluster == cluster && clusters.contains(cluster))
}

/// One object's fleet-wide answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub object: Object,
    /// The clusters whose records the name lists.
    pub listed: Vec<String>,
    /// Every cluster with a record of its own, healthy or not.
    pub candidates: Vec<String>,
    /// No candidate is healthy, so every one is listed (fail-open).
    pub degraded: bool,
}

/// The writes of one object, applied together, and its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub answer: Answer,
    pub ops: Vec<Op>,
}

/// The steps for every object of the fleet (`objects`, as the index knows
/// them) and for every object this writer listed and the index no longer
/// knows. `judge(object, cluster)` gives the health rule's verdict and
/// the object's strategy ([`super::health::answer`]).
pub fn plan(
    zone: &Zone,
    z: &Zoned,
    me: &Writer,
    ttl: u32,
    clusters: &BTreeSet<String>,
    objects: &BTreeSet<Object>,
    judge: impl Fn(&Object, &str) -> Judged,
) -> Result<Vec<Step>, Refusal> {
    let none = BTreeMap::new();
    let mut all: BTreeSet<&Object> = objects.iter().collect();
    // Objects gone from the index whose records are still ours.
    for (object, keys) in &z.fleet_wide {
        let mine = keys.values().any(|e| {
            e.record
                .as_ref()
                .is_some_and(|r| r.writer.cluster == me.cluster)
        });
        if mine {
            all.insert(object);
        }
    }
    let mut steps = Vec::new();
    for object in all {
        let known = objects.contains(object);
        let listed_now = z.fleet_wide.get(object).unwrap_or(&none);
        // Unknown to the index is gone, or only unseen: a writer whose
        // status caches have not listed a cluster yet knows none of its
        // objects (#62). Withdrawn only once every cluster of the fleet
        // that the name lists, or that has a record of it, is known not
        // to have it; until then nothing is written, nothing is claimed.
        if !known {
            let recorded = z.sources.get(object).into_iter().flat_map(|s| s.keys());
            let unseen = listed_now
                .keys()
                .chain(recorded)
                .any(|c| clusters.contains(c) && !judge(object, c).reachable);
            if unseen {
                continue;
            }
        }
        let sources = z.sources.get(object).filter(|_| known).unwrap_or(&none);
        let verdicts: Vec<Candidate> = sources
            .keys()
            .map(|c| {
                let Judged {
                    in_answer,
                    primary,
                    reachable,
                } = judge(object, c);
                Candidate {
                    cluster: c.as_str(),
                    in_answer,
                    primary,
                    reachable,
                }
            })
            .collect();
        // No candidate at all for a name the fleet still has, while it
        // lists some (#59): every registration gone at once is likelier a
        // registry fault than a fleet with no service. The answer stays,
        // degraded.
        if known && verdicts.is_empty() && !listed_now.is_empty() {
            steps.push(Step {
                answer: Answer {
                    object: object.clone(),
                    listed: listed_now.keys().cloned().collect(),
                    candidates: Vec::new(),
                    degraded: true,
                },
                ops: Vec::new(),
            });
            continue;
        }
        let (listed, degraded) = super::health::answer(&verdicts, !listed_now.is_empty());
        let mut ops = Vec::new();
        for cluster in &listed {
            let source = sources[*cluster];
            let Some(from) = &source.record else { continue };
            let want = Record {
                host: from.host.clone(),
                port: from.port,
                ttl,
                object: format!("{}/{}", object.0, object.1),
                writer: me.clone(),
                fail_open: degraded,
                uid: from.uid.clone(),
            };
            let key = format!("{}/{}/{}/{cluster}", zone.prefix, object.0, object.1);
            let mod_revision = match listed_now.get(*cluster) {
                None => 0,
                Some(found) => match &found.record {
                    Some(r) if ours(r, me, cluster, clusters) => {
                        newer_term(&found.key, r, me)?;
                        if r.writer.cluster == me.cluster && same_answer(r, &want) {
                            continue;
                        }
                        found.mod_revision
                    }
                    // Not ours: left as it is.
                    _ => continue,
                },
            };
            ops.push(Op::Put {
                key,
                record: want,
                mod_revision,
            });
            // Written only while the address it copies is still the one read.
            ops.push(Op::Check {
                key: source.key.clone(),
                mod_revision: source.mod_revision,
            });
        }
        for (cluster, found) in listed_now {
            if listed.contains(&cluster.as_str()) {
                continue;
            }
            // Of an object the index does not know, only our own records
            // go: a member's own are its leader's to remove.
            if let Some(r) = &found.record
                && ours(r, me, cluster, clusters)
                && (known || r.writer.cluster == me.cluster)
            {
                newer_term(&found.key, r, me)?;
                ops.push(Op::Delete {
                    key: found.key.clone(),
                    mod_revision: found.mod_revision,
                });
            }
        }
        steps.push(Step {
            answer: Answer {
                object: object.clone(),
                listed: listed.iter().map(|c| c.to_string()).collect(),
                candidates: sources.keys().cloned().collect(),
                degraded,
            },
            ops,
        });
    }
    Ok(steps)
}

/// The same for DNS clients, and as degraded or not (a term's change
/// alone is no reason to write).
fn same_answer(a: &Record, b: &Record) -> bool {
    a.host == b.host
        && a.port == b.port
        && a.ttl == b.ttl
        && a.object == b.object
        && a.fail_open == b.fail_open
        && a.uid == b.uid
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
