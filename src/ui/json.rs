//! What the dashboard is sent: the status index's views as JSON. Pure.
//! Every string is data for the page to set as text, never markup.

use std::time::SystemTime;

use serde_json::{Value, json};

use kube::ResourceExt;

use crate::rollout::revision::Revision;
use crate::rollout::spec::FleetMicroservice;
use crate::status::index::MicroserviceView;
use crate::status::view::{self, ClusterInfo, Entry, EntryState, Reach, RolloutResult};

fn time(t: Option<SystemTime>) -> Value {
    t.and_then(|t| jiff::Timestamp::try_from(t).ok())
        .map_or(Value::Null, |t| Value::String(t.to_string()))
}

pub fn state(s: EntryState) -> &'static str {
    match s {
        EntryState::Done => "Done",
        EntryState::Progressing => "Progressing",
        EntryState::Failed => "Failed",
        EntryState::Unknown => "Unknown",
    }
}

pub fn reach(r: Reach) -> &'static str {
    match r {
        Reach::Connecting => "Connecting",
        Reach::Reachable => "Reachable",
        Reach::Unreachable => "Unreachable",
        Reach::Invalid => "Invalid",
    }
}

/// One cluster of the fleet bar.
pub fn cluster(name: &str, c: &ClusterInfo) -> Value {
    json!({
        "name": name,
        "reach": reach(c.reach),
        "reason": c.reason,
        "lastSeen": time(c.last_seen),
        "leader": c.holder,
        "epoch": c.epoch,
        "labels": c.labels,
        "feedError": c.feed_error,
    })
}

/// One matrix cell: what a row shows of one cluster.
fn cell(e: &Entry) -> Value {
    json!({
        "cluster": e.cluster,
        "state": state(e.state),
        "generation": e.facts.generation,
        "observedGeneration": e.facts.observed_generation,
        "image": e.facts.image,
        "ready": e.replicas.map(|r| r.ready),
        "desired": e.replicas.map(|r| r.desired),
        "reason": e.reason,
        "lastSeen": time(e.last_seen),
        "deleting": e.facts.deleting,
    })
}

/// One matrix row. Labels come along so the page can filter by them.
pub fn row(v: &MicroserviceView) -> Value {
    let labels = v.entries.first().map(|e| e.facts.labels.clone());
    json!({
        "namespace": v.namespace,
        "name": v.name,
        "labels": labels.unwrap_or_default(),
        "cells": v.entries.iter().map(cell).collect::<Vec<_>>(),
        "summary": v.aggregate.summary,
    })
}

/// What `flotilla wait` would answer now, for every cluster that has it.
pub fn wait_verdict(v: &MicroserviceView) -> Value {
    let (verdict, failed) = match view::rollout_result(&v.entries) {
        RolloutResult::Succeeded => ("Succeeded", vec![]),
        RolloutResult::InProgress => ("InProgress", vec![]),
        RolloutResult::Failed(clusters) => ("Failed", clusters),
    };
    json!({"verdict": verdict, "failed": failed, "summary": v.aggregate.summary})
}

/// The detail view: every cluster's conditions and message.
pub fn detail(v: &MicroserviceView) -> Value {
    let clusters: Vec<Value> = v
        .entries
        .iter()
        .map(|e| {
            let mut c = cell(e);
            c["message"] = json!(e.message);
            c["phase"] = json!(e.facts.phase);
            c["labels"] = json!(e.facts.labels);
            c["conditions"] = e
                .facts
                .conditions
                .iter()
                .map(|c| {
                    json!({
                        "type": c.type_,
                        "status": c.status,
                        "reason": c.reason,
                        "message": c.message,
                        "observedGeneration": c.observed_generation,
                        "lastTransitionTime": c.last_transition_time.0.to_string(),
                    })
                })
                .collect();
            c
        })
        .collect();
    json!({
        "namespace": v.namespace,
        "name": v.name,
        "clusters": clusters,
        "wait": wait_verdict(v),
    })
}

/// One FleetMicroservice for the rollouts view: its status as stored (waves,
/// clusters, revisions, conditions), and its revision history newest first.
pub fn rollout(f: &FleetMicroservice, history: &[Revision]) -> Value {
    let mut newest_first: Vec<&Revision> = history.iter().collect();
    newest_first.sort_by_key(|r| std::cmp::Reverse(r.number));
    json!({
        "namespace": f.namespace().unwrap_or_default(),
        "name": f.name_any(),
        "generation": f.metadata.generation,
        "image": f.spec.template.image,
        "paused": f.spec.paused,
        "bake": f.spec.rollout.bake,
        "deleting": f.metadata.deletion_timestamp.is_some(),
        "status": f.status,
        "history": newest_first
            .iter()
            .map(|r| json!({"name": r.name, "number": r.number, "image": r.data.template.image}))
            .collect::<Vec<_>>(),
    })
}

/// A fleet-wide name's answer for the detail view, or why it is unknown.
pub fn dns(answer: Result<crate::dns::view::DnsView, String>) -> Value {
    match answer {
        Err(e) => json!({ "error": e }),
        Ok(v) => serde_json::to_value(v).unwrap_or_else(|e| json!({ "error": e.to_string() })),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::status::view::{Facts, entry};

    fn reachable() -> ClusterInfo {
        ClusterInfo {
            reach: Reach::Reachable,
            synced: true,
            ..ClusterInfo::new("file")
        }
    }

    fn view_of(facts: Facts) -> MicroserviceView {
        let entries = vec![entry("member-1", &facts, None, Some(&reachable()))];
        MicroserviceView {
            namespace: "default".into(),
            name: "todo-api".into(),
            aggregate: view::aggregate(&entries),
            entries,
            revision: 7,
        }
    }

    #[test]
    fn a_row_carries_state_generations_and_labels_as_data() {
        let facts = Facts {
            generation: 2,
            observed_generation: 1,
            image: "img:2".into(),
            labels: BTreeMap::from([("team".into(), "<script>x</script>".into())]),
            ..Default::default()
        };
        let row = row(&view_of(facts));
        let cell = &row["cells"][0];
        assert_eq!(cell["state"], "Progressing");
        assert_eq!(
            (
                cell["observedGeneration"].as_i64(),
                cell["generation"].as_i64()
            ),
            (Some(1), Some(2))
        );
        // The page escapes; the JSON keeps the value exactly.
        assert_eq!(row["labels"]["team"], "<script>x</script>");
    }

    #[test]
    fn the_wait_verdict_is_the_rollout_result() {
        let v = view_of(Facts {
            generation: 1,
            observed_generation: 1,
            ..Default::default()
        });
        assert_eq!(wait_verdict(&v)["verdict"], "InProgress");
        let unreachable = ClusterInfo {
            reach: Reach::Unreachable,
            last_seen: Some(SystemTime::UNIX_EPOCH),
            ..ClusterInfo::new("file")
        };
        let json = cluster("member-2", &unreachable);
        assert_eq!(json["reach"], "Unreachable");
        assert_eq!(json["lastSeen"], "1970-01-01T00:00:00Z");
    }
}
