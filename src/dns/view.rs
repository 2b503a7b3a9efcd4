//! What a fleet-wide name answers and why (#31), for `flotilla dns`, the
//! gRPC view and the dashboard: the records etcd holds now, explained by
//! what this replica's index says of each cluster. Pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::registry::records::Record;
use crate::rollout::placement::selects;
use crate::status::index::{MicroserviceView, Snapshot};
use crate::status::view::EntryState;

use super::health::Seen;

/// What the index says of a Microservice (`view`, built once per object)
/// in `cluster`.
pub fn seen(snap: &Snapshot, view: Option<&MicroserviceView>, cluster: &str) -> Seen {
    let reachable = snap
        .clusters()
        .get(cluster)
        .is_some_and(|c| c.absence_is_known());
    if !reachable {
        return Seen::Unreachable;
    }
    let entry = view.and_then(|v| v.entries.iter().find(|e| e.cluster == cluster));
    match entry {
        Some(e) if e.state == EntryState::Done && !e.facts.deleting => Seen::Healthy,
        Some(e) if e.state == EntryState::Unknown => Seen::Unreachable,
        _ => Seen::Unhealthy,
    }
}

/// Whether `cluster` is preferred by a name whose primaries are `primaries`
/// (`None`: `RoundRobin`, every cluster is).
pub fn is_primary(snap: &Snapshot, primaries: Option<&LabelSelector>, cluster: &str) -> bool {
    primaries.is_none_or(|sel| {
        snap.clusters()
            .get(cluster)
            .is_some_and(|i| selects(sel, &i.labels))
    })
}

/// One cluster, as read.
#[derive(Debug, Clone)]
pub struct Row<'a> {
    pub cluster: &'a str,
    /// Its leader's record of its own Service: what makes it a candidate.
    pub own: Option<&'a Record>,
    /// Its record in the fleet-wide name, if listed.
    pub listed: Option<&'a Record>,
    pub seen: Seen,
    pub primary: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ClusterDns {
    pub cluster: String,
    pub listed: bool,
    pub address: Option<String>,
    pub health: &'static str,
    pub primary: bool,
    pub reason: String,
}

/// Serialized as the dashboard reads it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DnsView {
    pub name: String,
    pub strategy: &'static str,
    pub degraded: bool,
    pub clusters: Vec<ClusterDns>,
    pub summary: String,
}

fn health(s: Seen) -> &'static str {
    match s {
        Seen::Healthy => "Healthy",
        Seen::Unhealthy => "Unhealthy",
        Seen::Unreachable => "Unreachable",
    }
}

/// Explains `name`'s answer. `failover`: the strategy is `Failover`.
pub fn explain(name: &str, failover: bool, rows: &[Row]) -> DnsView {
    let degraded = rows.iter().any(|r| r.listed.is_some_and(|l| l.fail_open));
    let primary_listed = rows
        .iter()
        .any(|r| r.primary && r.listed.is_some() && r.seen == Seen::Healthy);
    let clusters: Vec<ClusterDns> = rows
        .iter()
        .filter(|r| r.own.is_some() || r.listed.is_some())
        .map(|r| {
            let reason = match (r.listed.is_some(), r.seen) {
                (true, _) if degraded => "listed: no cluster is healthy (fail-open)".into(),
                (true, Seen::Healthy) => "Available at its current generation".into(),
                (true, Seen::Unhealthy) => {
                    "not Available at its current generation: leaves after --dns-withdraw-after"
                        .into()
                }
                (true, Seen::Unreachable) => {
                    "not answering: leaves after --dns-withdraw-after, or stays with --dns-unreachable=keep"
                        .into()
                }
                (false, _) if r.own.is_none() => {
                    "no record of its own: not registered in this cluster".into()
                }
                (false, Seen::Healthy) if failover && !r.primary && primary_listed => {
                    "standby (Failover): listed only while no primary is healthy".into()
                }
                (false, Seen::Healthy) => "healthy: returns after --dns-restore-after".into(),
                (false, Seen::Unhealthy) => "not Available at its current generation".into(),
                (false, Seen::Unreachable) => "not answering".into(),
            };
            let address = r.own.or(r.listed).map(|x| format!("{}:{}", x.host, x.port));
            ClusterDns {
                cluster: r.cluster.to_string(),
                listed: r.listed.is_some(),
                address,
                health: health(r.seen),
                primary: r.primary,
                reason,
            }
        })
        .collect();
    let listed: Vec<&str> = clusters
        .iter()
        .filter(|c| c.listed)
        .map(|c| c.cluster.as_str())
        .collect();
    let summary = match (listed.is_empty(), degraded) {
        (true, _) => format!("{name} lists no cluster"),
        (false, false) => format!("{name} lists {}", listed.join(", ")),
        (false, true) => format!(
            "{name} lists {} (degraded: no cluster is healthy)",
            listed.join(", ")
        ),
    };
    DnsView {
        name: name.to_string(),
        strategy: if failover { "Failover" } else { "RoundRobin" },
        degraded,
        clusters,
        summary,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::records::Writer;

    fn rec(host: &str, fail_open: bool) -> Record {
        Record {
            host: host.into(),
            port: 80,
            ttl: 10,
            object: "ns/web".into(),
            writer: Writer::fleet("prod", 1),
            fail_open,
            uid: String::new(),
        }
    }

    fn row<'a>(
        cluster: &'a str,
        own: Option<&'a Record>,
        listed: Option<&'a Record>,
        seen: Seen,
        primary: bool,
    ) -> Row<'a> {
        Row {
            cluster,
            own,
            listed,
            seen,
            primary,
        }
    }

    #[test]
    fn each_cluster_says_why_it_is_in_or_out() {
        let (a, b, c) = (
            rec("10.0.0.1", false),
            rec("10.0.0.2", false),
            rec("10.0.0.3", false),
        );
        let rows = [
            row("m1", Some(&a), Some(&a), Seen::Healthy, true),
            row("m2", Some(&b), None, Seen::Unreachable, true),
            row("m3", Some(&c), None, Seen::Healthy, true),
            row("m4", None, None, Seen::Healthy, true),
        ];
        let v = explain("web.ns.fleet.example", false, &rows);
        assert_eq!(v.summary, "web.ns.fleet.example lists m1");
        assert!(!v.degraded);
        assert_eq!(
            v.clusters.len(),
            3,
            "a cluster with no record is not a candidate"
        );
        assert_eq!(v.clusters[0].address.as_deref(), Some("10.0.0.1:80"));
        assert_eq!(v.clusters[1].reason, "not answering");
        assert!(
            v.clusters[2].reason.contains("restore"),
            "{}",
            v.clusters[2].reason
        );
    }

    #[test]
    fn failover_names_standbys_and_fail_open_says_degraded() {
        let (a, b) = (rec("10.0.0.1", false), rec("10.0.0.2", false));
        let rows = [
            row("m1", Some(&a), Some(&a), Seen::Healthy, true),
            row("m2", Some(&b), None, Seen::Healthy, false),
        ];
        let v = explain("web.ns.z", true, &rows);
        assert_eq!(v.strategy, "Failover");
        assert!(
            v.clusters[1].reason.starts_with("standby"),
            "{}",
            v.clusters[1].reason
        );

        let (a, b) = (rec("10.0.0.1", true), rec("10.0.0.2", true));
        let rows = [
            row("m1", Some(&a), Some(&a), Seen::Unhealthy, true),
            row("m2", Some(&b), Some(&b), Seen::Unreachable, true),
        ];
        let v = explain("web.ns.z", false, &rows);
        assert!(v.degraded);
        assert!(v.summary.contains("degraded"), "{}", v.summary);
        assert!(v.clusters.iter().all(|c| c.reason.contains("fail-open")));
    }
}
