//! How the status commands print: aligned tables for people, JSON for
//! scripts. Pure functions of the API's messages.

use serde_json::{Value, json};

use crate::api::pb;

fn reach(r: i32) -> &'static str {
    match pb::Reachability::try_from(r).unwrap_or_default() {
        pb::Reachability::Connecting => "Connecting",
        pb::Reachability::Reachable => "Reachable",
        pb::Reachability::Unreachable => "Unreachable",
        pb::Reachability::Invalid => "Invalid",
        pb::Reachability::Unspecified => "-",
    }
}

fn state(s: i32) -> &'static str {
    match pb::EntryState::try_from(s).unwrap_or_default() {
        pb::EntryState::Done => "Done",
        pb::EntryState::Progressing => "Progressing",
        pb::EntryState::Failed => "Failed",
        pb::EntryState::Unknown => "Unknown",
        pb::EntryState::Unspecified => "-",
    }
}

pub fn result(r: i32) -> &'static str {
    match pb::RolloutResult::try_from(r).unwrap_or_default() {
        pb::RolloutResult::InProgress => "InProgress",
        pb::RolloutResult::Succeeded => "Succeeded",
        pb::RolloutResult::Failed => "Failed",
        pb::RolloutResult::DeadlineExceeded => "DeadlineExceeded",
        pb::RolloutResult::Unspecified => "-",
    }
}

fn time(t: &Option<prost_types::Timestamp>) -> Value {
    match t {
        Some(t) => jiff::Timestamp::new(t.seconds, t.nanos)
            .map(|ts| json!(ts.to_string()))
            .unwrap_or(Value::Null),
        None => Value::Null,
    }
}

/// Columns padded to their widest cell.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect();
        padded.join("  ").trim_end().to_string() + "\n"
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    for row in rows {
        out.push_str(&line(row.clone()));
    }
    out
}

/// The registration's labels, without the name label every cluster has.
fn cluster_labels(c: &pb::Cluster) -> String {
    let mut pairs: Vec<String> = c
        .labels
        .iter()
        .filter(|(k, _)| k.as_str() != crate::rollout::spec::CLUSTER_NAME_LABEL)
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    pairs.sort();
    if !c.labels_error.is_empty() {
        pairs.push("(labels file unreadable)".into());
    }
    if pairs.is_empty() {
        "-".into()
    } else {
        pairs.join(",")
    }
}

pub fn clusters_table(r: &pb::ListClustersResponse) -> String {
    let rows: Vec<Vec<String>> = r
        .clusters
        .iter()
        .map(|c| {
            vec![
                c.name.clone(),
                reach(c.reachability).into(),
                if c.synced { "yes" } else { "no" }.into(),
                if c.lease_holder.is_empty() {
                    "-".into()
                } else {
                    c.lease_holder.clone()
                },
                if c.lease_holder.is_empty() {
                    "-".into()
                } else {
                    c.epoch.to_string()
                },
                c.microservices.to_string(),
                cluster_labels(c),
                if c.reason.is_empty() {
                    c.source.clone()
                } else {
                    c.reason.clone()
                },
            ]
        })
        .collect();
    format!(
        "{}(answered by {})\n",
        table(
            &[
                "CLUSTER",
                "REACHABILITY",
                "SYNCED",
                "LEADER",
                "EPOCH",
                "MICROSERVICES",
                "LABELS",
                "SOURCE / REASON"
            ],
            &rows
        ),
        r.replica_id
    )
}

fn ready(e: &pb::ClusterEntry) -> String {
    e.replicas
        .as_ref()
        .map_or("-".into(), |r| format!("{}/{}", r.available, r.desired))
}

fn entry_rows(entries: &[pb::ClusterEntry]) -> Vec<Vec<String>> {
    entries
        .iter()
        .map(|e| {
            let mut st = state(e.state).to_string();
            if e.deleting {
                st.push_str(", deleting");
            }
            if !e.registered.is_empty() {
                st.push_str(if e.registered == "True" {
                    ", registered"
                } else {
                    ", not registered"
                });
            }
            let reason = if !e.cleanup_blocked.is_empty() {
                format!("CleanupBlocked: {}", e.cleanup_blocked)
            } else if e.reason.is_empty() {
                "-".into()
            } else {
                e.reason.clone()
            };
            vec![
                e.cluster.clone(),
                st,
                format!("{}/{}", e.observed_generation, e.generation),
                e.image.clone(),
                ready(e),
                reason,
            ]
        })
        .collect()
}

const ENTRY_HEADER: [&str; 6] = [
    "CLUSTER",
    "STATE",
    "OBSERVED/GEN",
    "IMAGE",
    "AVAILABLE",
    "REASON",
];

pub fn microservice_table(m: &pb::Microservice) -> String {
    let summary = m.aggregate.as_ref().map_or("", |a| a.summary.as_str());
    let dns = match &m.dns {
        Some(d) if d.error.is_empty() => format!("DNS: {}\n", d.summary),
        Some(d) => format!("DNS: {}\n", d.error),
        None => String::new(),
    };
    format!(
        "{}/{}: {summary}\n{dns}{}",
        m.namespace,
        m.name,
        table(&ENTRY_HEADER, &entry_rows(&m.clusters))
    )
}

/// `flotilla dns`: the summary, then one row per candidate cluster.
pub fn dns_table(d: &pb::DnsAnswer) -> String {
    let rows: Vec<Vec<String>> = d
        .clusters
        .iter()
        .map(|c| {
            vec![
                c.cluster.clone(),
                if c.listed { "yes" } else { "no" }.to_string(),
                c.health.clone(),
                if c.primary { "yes" } else { "no" }.to_string(),
                c.address.clone(),
                c.reason.clone(),
            ]
        })
        .collect();
    let degraded = if d.degraded {
        "\nFleetDnsDegraded: True (no cluster is healthy; every record is kept)"
    } else {
        ""
    };
    format!(
        "{} ({}){degraded}\n{}",
        d.summary,
        d.strategy,
        table(
            &[
                "CLUSTER", "LISTED", "HEALTH", "PRIMARY", "ADDRESS", "REASON"
            ],
            &rows
        )
    )
}

pub fn dns_json(d: &pb::DnsAnswer) -> Value {
    json!({
        "name": d.name, "strategy": d.strategy, "degraded": d.degraded, "summary": d.summary,
        "clusters": d.clusters.iter().map(|c| json!({
            "cluster": c.cluster, "listed": c.listed, "address": c.address,
            "health": c.health, "primary": c.primary, "reason": c.reason,
        })).collect::<Vec<_>>(),
    })
}

pub fn list_table(items: &[pb::Microservice]) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|m| {
            let a = m.aggregate.clone().unwrap_or_default();
            vec![
                m.namespace.clone(),
                m.name.clone(),
                format!("{}/{}", a.done, a.clusters),
                a.summary,
            ]
        })
        .collect();
    table(&["NAMESPACE", "NAME", "DONE", "SUMMARY"], &rows)
}

pub fn progress_text(p: &pb::RolloutProgress, elapsed_secs: f64) -> String {
    let mut out = format!(
        "[{elapsed_secs:6.1}s] {}: {}\n",
        result(p.result),
        p.summary
    );
    for row in entry_rows(&p.clusters) {
        out.push_str(&format!("           {}\n", row.join("  ")));
    }
    out
}

/// What a person watching a rollout cares about: the result, and each
/// cluster's state, reason and generations.
pub fn progress_signature(p: &pb::RolloutProgress) -> Vec<String> {
    let mut sig = vec![result(p.result).to_string()];
    sig.extend(p.clusters.iter().map(|e| {
        format!(
            "{} {} {} {}/{}",
            e.cluster, e.state, e.reason, e.observed_generation, e.generation
        )
    }));
    sig
}

pub fn cluster_json(c: &pb::Cluster) -> Value {
    json!({
        "name": c.name, "source": c.source, "reachability": reach(c.reachability),
        "reason": c.reason, "lastSeen": time(&c.last_seen), "leaseHolder": c.lease_holder,
        "epoch": c.epoch, "ledByThisReplica": c.led_by_this_replica,
        "microservices": c.microservices, "synced": c.synced,
    })
}

/// "ROLLOUT_PHASE_ROLLED_BACK" less `prefix` as "RolledBack": an enum
/// value as the status text spells it.
pub fn camel(value: &str, prefix: &str) -> String {
    value
        .strip_prefix(prefix)
        .unwrap_or(value)
        .split('_')
        .map(|w| {
            let mut cs = w.chars();
            cs.next().map_or(String::new(), |c| {
                c.to_string() + &cs.as_str().to_ascii_lowercase()
            })
        })
        .collect()
}

/// A state as text: the enum's, or the deprecated text field's from a
/// server that sets no enum (one release older).
pub fn named(value: Option<&str>, prefix: &str, text: &str) -> String {
    match value {
        Some(v) if !v.ends_with("_UNSPECIFIED") => camel(v, prefix),
        _ => text.to_string(),
    }
}

/// The entry's phase, from its enum or (a server one release older) text.
#[allow(deprecated)]
fn entry_phase(e: &pb::ClusterEntry) -> String {
    let p = pb::MicroservicePhase::try_from(e.microservice_phase).ok();
    named(p.map(|p| p.as_str_name()), "MICROSERVICE_PHASE_", &e.phase)
}

fn entry_json(e: &pb::ClusterEntry) -> Value {
    json!({
        "cluster": e.cluster, "state": state(e.state), "generation": e.generation,
        "observedGeneration": e.observed_generation, "image": e.image, "phase": entry_phase(e),
        "replicas": e.replicas.as_ref().map(|r| json!({
            "desired": r.desired, "updated": r.updated, "ready": r.ready, "available": r.available,
        })),
        "reachability": reach(e.reachability), "lastSeen": time(&e.last_seen),
        "reason": e.reason, "message": e.message, "labels": e.labels,
        "deleting": e.deleting, "registered": e.registered, "cleanupBlocked": e.cleanup_blocked,
        "conditions": e.conditions.iter().map(|c| json!({
            "type": c.r#type, "status": c.status, "reason": c.reason, "message": c.message,
            "observedGeneration": c.observed_generation,
            "lastTransitionTime": time(&c.last_transition_time),
        })).collect::<Vec<_>>(),
    })
}

fn aggregate_json(a: &Option<pb::Aggregate>) -> Value {
    let a = a.clone().unwrap_or_default();
    json!({
        "clusters": a.clusters, "done": a.done, "progressing": a.progressing,
        "failed": a.failed, "unknown": a.unknown, "allDone": a.all_done, "summary": a.summary,
    })
}

pub fn microservice_json(m: &pb::Microservice) -> Value {
    json!({
        "namespace": m.namespace, "name": m.name, "revision": m.revision,
        "clusters": m.clusters.iter().map(entry_json).collect::<Vec<_>>(),
        "aggregate": aggregate_json(&m.aggregate),
    })
}

pub fn progress_json(p: &pb::RolloutProgress) -> Value {
    json!({
        "result": result(p.result), "summary": p.summary, "revision": p.revision,
        "failedClusters": p.failed_clusters,
        "clusters": p.clusters.iter().map(entry_json).collect::<Vec<_>>(),
        "aggregate": aggregate_json(&p.aggregate),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(cluster: &str, st: pb::EntryState) -> pb::ClusterEntry {
        pb::ClusterEntry {
            cluster: cluster.into(),
            state: st as i32,
            generation: 2,
            observed_generation: 1,
            image: "ghcr.io/acme/todo:2".into(),
            replicas: Some(pb::ReplicaCounts {
                desired: 2,
                updated: 1,
                ready: 1,
                available: 1,
            }),
            reason: "GenerationNotObserved".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_deletion_waiting_on_the_registry_shows_in_the_row_and_json() {
        let mut e = entry("member-1", pb::EntryState::Done);
        e.deleting = true;
        e.registered = "True".into();
        e.cleanup_blocked = "ExternalUnavailable".into();
        let row = &entry_rows(std::slice::from_ref(&e))[0];
        assert_eq!(row[1], "Done, deleting, registered");
        assert_eq!(row[5], "CleanupBlocked: ExternalUnavailable");
        let j = entry_json(&e);
        assert_eq!(j["deleting"], true);
        assert_eq!(j["cleanupBlocked"], "ExternalUnavailable");
    }

    #[test]
    fn tables_align_columns() {
        let t = table(&["A", "LONGER"], &[vec!["wide-cell".into(), "x".into()]]);
        assert_eq!(t, "A          LONGER\nwide-cell  x\n");
    }

    #[test]
    fn a_dns_answer_prints_each_cluster_and_says_when_it_is_degraded() {
        let cluster = |name: &str, listed: bool| pb::DnsCluster {
            cluster: name.into(),
            listed,
            address: "10.0.0.1:80".into(),
            health: "Unhealthy".into(),
            primary: true,
            reason: "listed: no cluster is healthy (fail-open)".into(),
        };
        let mut d = pb::DnsAnswer {
            name: "api.shop.fleet.example".into(),
            strategy: "RoundRobin".into(),
            degraded: true,
            clusters: vec![cluster("member-1", true), cluster("member-2", false)],
            summary: "api.shop.fleet.example lists member-1".into(),
            error: String::new(),
        };
        let text = dns_table(&d);
        assert!(
            text.starts_with(
                "api.shop.fleet.example lists member-1 (RoundRobin)\nFleetDnsDegraded: True"
            ),
            "{text}"
        );
        assert!(text.contains("member-2  no "), "{text}");
        d.degraded = false;
        assert!(!dns_table(&d).contains("FleetDnsDegraded"));
        assert_eq!(dns_json(&d)["clusters"][1]["listed"], false);
    }

    #[test]
    fn a_microservice_prints_its_summary_and_one_row_per_cluster() {
        let m = pb::Microservice {
            namespace: "shop".into(),
            name: "todo-api".into(),
            clusters: vec![entry("member-1", pb::EntryState::Progressing)],
            aggregate: Some(pb::Aggregate {
                summary: "Available in 0/1 clusters at their current generation".into(),
                ..Default::default()
            }),
            revision: 3,
            dns: None,
        };
        let text = microservice_table(&m);
        assert!(
            text.starts_with("shop/todo-api: Available in 0/1"),
            "{text}"
        );
        assert!(text.contains("member-1  Progressing  1/2"), "{text}");
        assert!(text.contains("ghcr.io/acme/todo:2  1/2"), "{text}");
        let j = microservice_json(&m);
        assert_eq!(j["clusters"][0]["state"], "Progressing");
        assert_eq!(j["clusters"][0]["replicas"]["available"], 1);
    }

    #[test]
    fn rollout_progress_names_the_result() {
        let p = pb::RolloutProgress {
            result: pb::RolloutResult::Failed as i32,
            failed_clusters: vec!["member-2".into()],
            summary: "failed in member-2".into(),
            clusters: vec![entry("member-2", pb::EntryState::Failed)],
            ..Default::default()
        };
        assert!(progress_text(&p, 1.5).contains("Failed: failed in member-2"));
        // Replica counts alone do not make a new line for people.
        let mut q = p.clone();
        q.clusters[0].replicas = None;
        assert_eq!(progress_signature(&p), progress_signature(&q));
        q.clusters[0].observed_generation = 2;
        assert_ne!(progress_signature(&p), progress_signature(&q));
        assert_eq!(progress_json(&p)["result"], "Failed");
    }
}
