//! The pure core's views as protobuf messages.

use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::pb;
use crate::domain::conditions;
use crate::status::index::MicroserviceView;
use crate::status::view::{Aggregate, ClusterInfo, Entry, EntryState, Reach, Replicas};

pub fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    prost_types::Timestamp::from(t)
}

pub fn reachability(r: Reach) -> pb::Reachability {
    match r {
        Reach::Connecting => pb::Reachability::Connecting,
        Reach::Reachable => pb::Reachability::Reachable,
        Reach::Unreachable => pb::Reachability::Unreachable,
        Reach::Invalid => pb::Reachability::Invalid,
    }
}

pub fn entry_state(s: EntryState) -> pb::EntryState {
    match s {
        EntryState::Done => pb::EntryState::Done,
        EntryState::Progressing => pb::EntryState::Progressing,
        EntryState::Failed => pb::EntryState::Failed,
        EntryState::Unknown => pb::EntryState::Unknown,
    }
}

pub fn cluster(name: &str, c: &ClusterInfo, microservices: usize) -> pb::Cluster {
    pb::Cluster {
        name: name.to_string(),
        source: c.source.clone(),
        reachability: reachability(c.reach) as i32,
        reason: c.reason.clone(),
        last_seen: c.last_seen.map(timestamp),
        lease_holder: c.holder.clone().unwrap_or_default(),
        epoch: c.epoch.unwrap_or_default(),
        led_by_this_replica: c.led_here,
        microservices: microservices as u32,
        synced: c.synced,
        labels: c.labels.clone().into_iter().collect(),
        labels_error: c.labels_error.clone().unwrap_or_default(),
    }
}

pub fn condition(c: &Condition) -> pb::Condition {
    pb::Condition {
        r#type: c.type_.clone(),
        status: c.status.clone(),
        reason: c.reason.clone(),
        message: c.message.clone(),
        observed_generation: c.observed_generation.unwrap_or_default(),
        last_transition_time: Some(timestamp(SystemTime::from(c.last_transition_time.0))),
    }
}

fn replicas(r: Replicas) -> pb::ReplicaCounts {
    pb::ReplicaCounts {
        desired: r.desired,
        updated: r.updated,
        ready: r.ready,
        available: r.available,
    }
}

/// A full entry: the BASIC row plus conditions, message, labels and last_seen.
pub fn entry(e: &Entry) -> pb::ClusterEntry {
    pb::ClusterEntry {
        conditions: e.facts.conditions.iter().map(condition).collect(),
        last_seen: e.last_seen.map(timestamp),
        message: e.message.clone(),
        labels: e.facts.labels.clone().into_iter().collect(),
        ..basic_entry(e)
    }
}

/// The status.phase text as its enum; a phase this version does not know
/// is UNSPECIFIED, never a guess.
pub fn microservice_phase(text: &str) -> pb::MicroservicePhase {
    use crate::crd::Phase;
    use pb::MicroservicePhase as P;
    [
        (Phase::Accepted, P::Accepted),
        (Phase::ResourcesApplied, P::ResourcesApplied),
        (Phase::Available, P::Available),
        (Phase::Failed, P::Failed),
    ]
    .into_iter()
    .find(|(p, _)| p.as_str() == text)
    .map_or(P::Unspecified, |(_, e)| e)
}

/// An entry in the BASIC view: what a row shows, without the conditions,
/// messages and labels that make up most of a full entry's bytes.
// `phase` is deprecated in the proto and still set, for one release.
#[allow(deprecated)]
pub fn basic_entry(e: &Entry) -> pb::ClusterEntry {
    pb::ClusterEntry {
        cluster: e.cluster.clone(),
        state: entry_state(e.state) as i32,
        generation: e.facts.generation,
        observed_generation: e.facts.observed_generation,
        image: e.facts.image.clone(),
        replicas: e.replicas.map(replicas),
        phase: e.facts.phase.clone(),
        microservice_phase: microservice_phase(&e.facts.phase) as i32,
        reachability: reachability(e.reach) as i32,
        reason: e.reason.clone(),
        deleting: e.facts.deleting,
        registered: conditions::find(&e.facts.conditions, conditions::REGISTERED)
            .map(|c| c.status.clone())
            .unwrap_or_default(),
        cleanup_blocked: conditions::find(&e.facts.conditions, conditions::CLEANUP_BLOCKED)
            .filter(|c| c.status == "True")
            .map(|c| c.reason.clone())
            .unwrap_or_default(),
        ..Default::default()
    }
}

pub fn aggregate(a: &Aggregate) -> pb::Aggregate {
    pb::Aggregate {
        clusters: a.clusters,
        done: a.done,
        progressing: a.progressing,
        failed: a.failed,
        unknown: a.unknown,
        all_done: a.all_done,
        summary: a.summary.clone(),
    }
}

/// A fleet-wide name's answer, or why it could not be read.
pub fn dns(answer: Result<crate::dns::view::DnsView, String>) -> pb::DnsAnswer {
    match answer {
        Err(error) => pb::DnsAnswer {
            error,
            ..Default::default()
        },
        Ok(v) => pb::DnsAnswer {
            name: v.name,
            strategy: v.strategy.to_string(),
            degraded: v.degraded,
            clusters: v
                .clusters
                .into_iter()
                .map(|c| pb::DnsCluster {
                    cluster: c.cluster,
                    listed: c.listed,
                    address: c.address.unwrap_or_default(),
                    health: c.health.to_string(),
                    primary: c.primary,
                    reason: c.reason,
                })
                .collect(),
            summary: v.summary,
            error: String::new(),
        },
    }
}

pub fn microservice(v: &MicroserviceView) -> pb::Microservice {
    with_entries(v, entry)
}

/// The BASIC view of a Microservice (see `MicroserviceView` in the proto).
pub fn basic_microservice(v: &MicroserviceView) -> pb::Microservice {
    with_entries(v, basic_entry)
}

fn with_entries(v: &MicroserviceView, entry: fn(&Entry) -> pb::ClusterEntry) -> pb::Microservice {
    pb::Microservice {
        namespace: v.namespace.clone(),
        name: v.name.clone(),
        clusters: v.entries.iter().map(entry).collect(),
        aggregate: Some(aggregate(&v.aggregate)),
        revision: v.revision,
        dns: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_microservice_phase_maps_to_its_enum_and_an_unknown_one_to_unspecified() {
        use pb::MicroservicePhase as P;
        assert_eq!(microservice_phase("Accepted"), P::Accepted);
        assert_eq!(microservice_phase("ResourcesApplied"), P::ResourcesApplied);
        assert_eq!(microservice_phase("Available"), P::Available);
        assert_eq!(microservice_phase("Failed"), P::Failed);
        assert_eq!(microservice_phase(""), P::Unspecified);
        assert_eq!(microservice_phase("Exploded"), P::Unspecified);
    }
}
