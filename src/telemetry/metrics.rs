//! Prometheus metrics: a small registry of labelled counters, gauges and
//! histograms, and the text exposition format. Labels are bounded by
//! construction: clusters, verbs, codes, results and method names only.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::{LazyLock, Mutex};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

#[derive(Debug, Clone, PartialEq)]
enum Series {
    Value(f64),
    Histogram {
        counts: Vec<u64>,
        sum: f64,
        count: u64,
    },
}

pub struct Family {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    labels: &'static [&'static str],
    buckets: &'static [f64],
    series: Mutex<BTreeMap<Vec<String>, Series>>,
}

/// Waves take seconds to hours.
const WAVE_SECONDS: &[f64] = &[
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
];

const SECONDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

impl Family {
    const fn new(
        name: &'static str,
        help: &'static str,
        kind: Kind,
        labels: &'static [&'static str],
    ) -> Self {
        Family {
            name,
            help,
            kind,
            labels,
            buckets: SECONDS,
            series: Mutex::new(BTreeMap::new()),
        }
    }

    const fn with_buckets(mut self, buckets: &'static [f64]) -> Self {
        self.buckets = buckets;
        self
    }

    fn with<R>(&self, values: &[&str], f: impl FnOnce(&mut Series) -> R) -> R {
        debug_assert_eq!(values.len(), self.labels.len(), "{}", self.name);
        let mut series = self.series.lock().unwrap_or_else(|e| e.into_inner());
        let key: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        let entry = series.entry(key).or_insert_with(|| match self.kind {
            Kind::Histogram => Series::Histogram {
                counts: vec![0; self.buckets.len()],
                sum: 0.0,
                count: 0,
            },
            _ => Series::Value(0.0),
        });
        f(entry)
    }

    pub fn inc(&self, values: &[&str]) {
        self.with(values, |s| {
            if let Series::Value(v) = s {
                *v += 1.0;
            }
        })
    }

    pub fn set(&self, values: &[&str], value: f64) {
        self.with(values, |s| *s = Series::Value(value))
    }

    pub fn observe(&self, values: &[&str], value: f64) {
        let buckets = self.buckets;
        self.with(values, |s| {
            if let Series::Histogram { counts, sum, count } = s {
                for (i, le) in buckets.iter().enumerate() {
                    if value <= *le {
                        counts[i] += 1;
                    }
                }
                *sum += value;
                *count += 1;
            }
        })
    }

    /// Drops every series whose first label is `first` (a removed cluster).
    pub fn forget(&self, first: &str) {
        let mut series = self.series.lock().unwrap_or_else(|e| e.into_inner());
        series.retain(|k, _| k.first().map(String::as_str) != Some(first));
    }

    fn encode(&self, out: &mut String) {
        let kind = match self.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} {kind}", self.name);
        let series = self.series.lock().unwrap_or_else(|e| e.into_inner());
        for (values, s) in series.iter() {
            let labels = |extra: Option<(&str, String)>| {
                let mut pairs: Vec<String> = self
                    .labels
                    .iter()
                    .zip(values)
                    .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                    .collect();
                if let Some((k, v)) = extra {
                    pairs.push(format!("{k}=\"{v}\""));
                }
                if pairs.is_empty() {
                    String::new()
                } else {
                    format!("{{{}}}", pairs.join(","))
                }
            };
            match s {
                Series::Value(v) => {
                    let _ = writeln!(out, "{}{} {v}", self.name, labels(None));
                }
                Series::Histogram { counts, sum, count } => {
                    for (le, c) in self.buckets.iter().zip(counts) {
                        let _ = writeln!(
                            out,
                            "{}_bucket{} {c}",
                            self.name,
                            labels(Some(("le", le.to_string())))
                        );
                    }
                    let _ = writeln!(
                        out,
                        "{}_bucket{} {count}",
                        self.name,
                        labels(Some(("le", "+Inf".into())))
                    );
                    let _ = writeln!(out, "{}_sum{} {sum}", self.name, labels(None));
                    let _ = writeln!(out, "{}_count{} {count}", self.name, labels(None));
                }
            }
        }
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

pub struct Metrics {
    pub reconcile_total: Family,
    pub reconcile_duration: Family,
    pub api_requests_total: Family,
    pub cluster_leader: Family,
    pub lease_transitions_total: Family,
    pub cluster_reachable: Family,
    pub grpc_requests_total: Family,
    pub grpc_duration: Family,
    pub fenced_writes_total: Family,
    pub grpc_panics_total: Family,
    pub rollout_phase_total: Family,
    pub rollout_failures_total: Family,
    pub rollout_wave_duration: Family,
    pub rollout_home_writes_total: Family,
    pub rollout_member_writes_total: Family,
}

impl Metrics {
    const fn new() -> Self {
        use Kind::*;
        Metrics {
            reconcile_total: Family::new(
                "flotilla_reconcile_total",
                "Reconciles, by cluster and result.",
                Counter,
                &["cluster", "result"],
            ),
            reconcile_duration: Family::new(
                "flotilla_reconcile_duration_seconds",
                "How long each reconcile took.",
                Histogram,
                &["cluster"],
            ),
            api_requests_total: Family::new(
                "flotilla_api_requests_total",
                "Requests to member apiservers, by cluster, verb and HTTP status code.",
                Counter,
                &["cluster", "verb", "code"],
            ),
            cluster_leader: Family::new(
                "flotilla_cluster_leader",
                "1 while this replica leads the cluster.",
                Gauge,
                &["cluster"],
            ),
            lease_transitions_total: Family::new(
                "flotilla_lease_transitions_total",
                "Times this replica gained or lost the lead of a cluster.",
                Counter,
                &["cluster"],
            ),
            cluster_reachable: Family::new(
                "flotilla_cluster_reachable",
                "1 while the cluster answers.",
                Gauge,
                &["cluster"],
            ),
            grpc_requests_total: Family::new(
                "flotilla_grpc_requests_total",
                "Status API calls, by method and gRPC status code.",
                Counter,
                &["method", "code"],
            ),
            grpc_duration: Family::new(
                "flotilla_grpc_request_duration_seconds",
                "Status API call latency (for streams: until the response starts).",
                Histogram,
                &["method"],
            ),
            fenced_writes_total: Family::new(
                "flotilla_fenced_writes_total",
                "Writes withheld at the wire because this replica did not lead the cluster, by reason.",
                Counter,
                &["cluster", "reason"],
            ),
            grpc_panics_total: Family::new(
                "flotilla_grpc_panics_total",
                "Status API handlers that panicked and were answered INTERNAL.",
                Counter,
                &["method"],
            ),
            rollout_phase_total: Family::new(
                "flotilla_rollout_phase_total",
                "FleetMicroservice phase changes, by the phase entered.",
                Counter,
                &["phase"],
            ),
            rollout_failures_total: Family::new(
                "flotilla_rollout_failures_total",
                "Failed update revisions, by what followed: rollback, pause or failed (nothing to go back to).",
                Counter,
                &["action"],
            ),
            rollout_wave_duration: Family::new(
                "flotilla_rollout_wave_duration_seconds",
                "From a wave's first write to the end of its bake.",
                Histogram,
                &[],
            )
            .with_buckets(WAVE_SECONDS),
            rollout_home_writes_total: Family::new(
                "flotilla_rollout_home_writes_total",
                "Writes of the fleet controller to the home cluster, by kind.",
                Counter,
                &["kind"],
            ),
            rollout_member_writes_total: Family::new(
                "flotilla_rollout_member_writes_total",
                "Member Microservice writes of the fleet controller, by cluster and verb.",
                Counter,
                &["cluster", "verb"],
            ),
        }
    }

    fn families(&self) -> [&Family; 15] {
        [
            &self.reconcile_total,
            &self.reconcile_duration,
            &self.api_requests_total,
            &self.cluster_leader,
            &self.lease_transitions_total,
            &self.cluster_reachable,
            &self.grpc_requests_total,
            &self.grpc_duration,
            &self.fenced_writes_total,
            &self.grpc_panics_total,
            &self.rollout_phase_total,
            &self.rollout_failures_total,
            &self.rollout_wave_duration,
            &self.rollout_home_writes_total,
            &self.rollout_member_writes_total,
        ]
    }

    /// The Prometheus text exposition format, version 0.0.4.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        for f in self.families() {
            f.encode(&mut out);
        }
        out
    }

    /// A cluster left the registry: its series go too.
    pub fn forget_cluster(&self, cluster: &str) {
        for f in [
            &self.reconcile_total,
            &self.reconcile_duration,
            &self.api_requests_total,
            &self.cluster_leader,
            &self.lease_transitions_total,
            &self.cluster_reachable,
            &self.rollout_member_writes_total,
            &self.fenced_writes_total,
        ] {
            f.forget(cluster);
        }
    }
}

/// The process's metrics; every layer records into it.
pub static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_gauges_and_histograms_encode_as_prometheus_text() {
        let m = Metrics::new();
        m.reconcile_total.inc(&["member-1", "Applied"]);
        m.reconcile_total.inc(&["member-1", "Applied"]);
        m.cluster_leader.set(&["member-1"], 1.0);
        m.reconcile_duration.observe(&["member-1"], 0.003);
        m.reconcile_duration.observe(&["member-1"], 0.2);
        let text = m.encode();
        assert!(text.contains("# TYPE flotilla_reconcile_total counter\n"));
        assert!(
            text.contains("flotilla_reconcile_total{cluster=\"member-1\",result=\"Applied\"} 2\n")
        );
        assert!(text.contains("flotilla_cluster_leader{cluster=\"member-1\"} 1\n"));
        assert!(text.contains(
            "flotilla_reconcile_duration_seconds_bucket{cluster=\"member-1\",le=\"0.0025\"} 0\n"
        ));
        assert!(text.contains(
            "flotilla_reconcile_duration_seconds_bucket{cluster=\"member-1\",le=\"0.005\"} 1\n"
        ));
        assert!(text.contains(
            "flotilla_reconcile_duration_seconds_bucket{cluster=\"member-1\",le=\"+Inf\"} 2\n"
        ));
        assert!(
            text.contains("flotilla_reconcile_duration_seconds_count{cluster=\"member-1\"} 2\n")
        );
    }

    #[test]
    fn a_removed_cluster_takes_its_series_along_and_values_are_escaped() {
        let m = Metrics::new();
        m.cluster_reachable.set(&["member-1"], 1.0);
        m.cluster_reachable.set(&["member-2"], 0.0);
        m.forget_cluster("member-1");
        let text = m.encode();
        assert!(!text.contains("member-1"));
        assert!(text.contains("flotilla_cluster_reachable{cluster=\"member-2\"} 0"));
        m.grpc_requests_total.inc(&["a\"b", "OK"]);
        assert!(m.encode().contains("method=\"a\\\"b\""));
    }
}
