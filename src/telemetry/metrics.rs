//! Prometheus metrics on `prometheus-client`: labelled counters, gauges and
//! histograms in one registry, served as OpenMetrics text. Labels are
//! bounded by construction: clusters, verbs, codes, results and method
//! names only. `Family` keeps the calls short (`inc(&[cluster, result])`)
//! and remembers its label sets, so a removed cluster's series can go.

use std::collections::BTreeSet;
use std::sync::atomic::AtomicI64;
use std::sync::{LazyLock, Mutex};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family as Series;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

type Labels = Vec<(&'static str, String)>;

#[derive(Debug, Clone)]
enum Inner {
    Counter(Series<Labels, Counter>),
    Gauge(Series<Labels, Gauge<i64, AtomicI64>>),
    Histogram(Series<Labels, Histogram, fn() -> Histogram>),
}

pub struct Family {
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
    inner: Inner,
    /// Every label set recorded, for `forget`.
    seen: Mutex<BTreeSet<Vec<String>>>,
}

/// Waves take seconds to hours.
fn wave_seconds() -> Histogram {
    Histogram::new([
        1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
    ])
}

fn seconds() -> Histogram {
    Histogram::new([
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ])
}

impl Family {
    fn new(
        name: &'static str,
        help: &'static str,
        kind: Kind,
        labels: &'static [&'static str],
    ) -> Self {
        let inner = match kind {
            Kind::Counter => Inner::Counter(Series::default()),
            Kind::Gauge => Inner::Gauge(Series::default()),
            Kind::Histogram => {
                Inner::Histogram(Series::new_with_constructor(seconds as fn() -> Histogram))
            }
        };
        Family {
            name,
            help,
            labels,
            inner,
            seen: Mutex::new(BTreeSet::new()),
        }
    }

    fn with_buckets(mut self, buckets: fn() -> Histogram) -> Self {
        self.inner = Inner::Histogram(Series::new_with_constructor(buckets));
        self
    }

    fn labels(&self, values: &[&str]) -> Labels {
        debug_assert_eq!(values.len(), self.labels.len(), "{}", self.name);
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(values.iter().map(|v| v.to_string()).collect());
        self.labels
            .iter()
            .zip(values)
            .map(|(k, v)| (*k, v.to_string()))
            .collect()
    }

    pub fn inc(&self, values: &[&str]) {
        if let Inner::Counter(f) = &self.inner {
            f.get_or_create(&self.labels(values)).inc();
        }
    }

    /// Gauges hold whole numbers (0/1 states and counts).
    pub fn set(&self, values: &[&str], value: f64) {
        if let Inner::Gauge(f) = &self.inner {
            f.get_or_create(&self.labels(values))
                .set(value.round() as i64);
        }
    }

    pub fn observe(&self, values: &[&str], value: f64) {
        if let Inner::Histogram(f) = &self.inner {
            f.get_or_create(&self.labels(values)).observe(value);
        }
    }

    /// Drops every series whose first label is `first` (a removed cluster).
    pub fn forget(&self, first: &str) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let gone: Vec<Vec<String>> = seen
            .iter()
            .filter(|k| k.first().map(String::as_str) == Some(first))
            .cloned()
            .collect();
        for values in gone {
            seen.remove(&values);
            let labels: Labels = self.labels.iter().copied().zip(values).collect();
            match &self.inner {
                Inner::Counter(f) => f.remove(&labels),
                Inner::Gauge(f) => f.remove(&labels),
                Inner::Histogram(f) => f.remove(&labels),
            };
        }
    }

    fn register(&self, registry: &mut Registry) {
        // The library ends every help text with a full stop of its own.
        let help = self.help.strip_suffix('.').unwrap_or(self.help);
        match &self.inner {
            // OpenMetrics names the counter family without its `_total`,
            // and adds it to the sample.
            Inner::Counter(f) => registry.register(
                self.name.strip_suffix("_total").unwrap_or(self.name),
                help,
                f.clone(),
            ),
            Inner::Gauge(f) => registry.register(self.name, help, f.clone()),
            Inner::Histogram(f) => registry.register(self.name, help, f.clone()),
        }
    }
}

/// Declares every family once: its field, kind, name, labels (and
/// histogram buckets) and help make the struct, its constructor and the
/// list the registry takes.
macro_rules! metrics {
    ($($field:ident: $kind:ident $name:literal [$($label:literal),*] $(buckets $b:ident)? $help:literal;)*) => {
        pub struct Metrics {
            registry: Registry,
            $(pub $field: Family,)*
        }

        impl Metrics {
            fn new() -> Self {
                let mut m = Metrics {
                    registry: Registry::default(),
                    $($field: Family::new($name, $help, Kind::$kind, &[$($label),*])$(.with_buckets($b))?,)*
                };
                let mut registry = Registry::default();
                for f in m.families() {
                    f.register(&mut registry);
                }
                m.registry = registry;
                m
            }

            fn families(&self) -> Vec<&Family> {
                vec![$(&self.$field),*]
            }
        }
    };
}

metrics! {
    reconcile_total: Counter "flotilla_reconcile_total" ["cluster", "result"]
        "Reconciles, by cluster and result.";
    reconcile_duration: Histogram "flotilla_reconcile_duration_seconds" ["cluster"]
        "How long each reconcile took.";
    api_requests_total: Counter "flotilla_api_requests_total" ["cluster", "verb", "code"]
        "Requests to member apiservers, by cluster, verb and HTTP status code.";
    cluster_leader: Gauge "flotilla_cluster_leader" ["cluster"]
        "1 while this replica leads the cluster.";
    lease_transitions_total: Counter "flotilla_lease_transitions_total" ["cluster"]
        "Times this replica gained or lost the lead of a cluster.";
    cluster_reachable: Gauge "flotilla_cluster_reachable" ["cluster"]
        "1 while the cluster answers.";
    grpc_requests_total: Counter "flotilla_grpc_requests_total" ["method", "code"]
        "Status API calls, by method and gRPC status code.";
    grpc_duration: Histogram "flotilla_grpc_request_duration_seconds" ["method"]
        "Status API call latency (for streams: until the response starts).";
    fenced_writes_total: Counter "flotilla_fenced_writes_total" ["cluster", "reason"]
        "Writes withheld at the wire because this replica did not lead the cluster, by reason.";
    grpc_panics_total: Counter "flotilla_grpc_panics_total" ["method"]
        "Status API handlers that panicked and were answered INTERNAL.";
    rollout_phase_total: Counter "flotilla_rollout_phase_total" ["phase"]
        "FleetMicroservice phase changes, by the phase entered.";
    rollout_failures_total: Counter "flotilla_rollout_failures_total" ["action"]
        "Failed update revisions, by what followed: rollback, pause or failed (nothing to go back to).";
    rollout_wave_duration: Histogram "flotilla_rollout_wave_duration_seconds" [] buckets wave_seconds
        "From a wave's first write to the end of its bake.";
    rollout_home_writes_total: Counter "flotilla_rollout_home_writes_total" ["kind"]
        "Writes of the fleet controller to the home cluster, by kind.";
    rollout_member_writes_total: Counter "flotilla_rollout_member_writes_total" ["cluster", "verb"]
        "Member Microservice writes of the fleet controller, by cluster and verb.";
    tls_certificate_expiry: Gauge "flotilla_tls_certificate_expiry_timestamp_seconds" []
        "When the serving certificate in use (gRPC and dashboard) expires, in Unix seconds; alert well before it.";
    rollout_clock_ahead: Gauge "flotilla_rollout_clock_ahead_seconds" []
        "On the rollout leader, how far the newest stamp in the FleetMicroservice statuses it planned with in its last pass is ahead of its own clock: another replica's clock running ahead. Bakes and deadlines trust an inherited stamp for at most 30 s.";
    dns_records: Gauge "flotilla_dns_records" ["state"]
        "On the fleet DNS writer, the clusters' places in fleet-wide names after its last pass: listed (healthy), withdrawn, or failopen (listed though unhealthy, because no cluster of that name is healthy).";
    dns_writes_total: Counter "flotilla_dns_writes_total" ["result"]
        "The fleet DNS writer's etcd transactions, one per fleet-wide name changed, by result: applied, conflict (a key or the term moved since it was read), error, refused (not sent: this replica's term was over at the wire).";
    registry_up: Gauge "flotilla_registry_up" ["cluster"]
        "1 while the service registry's etcd answered the last call of this cluster's leader.";
    registry_writes_total: Counter "flotilla_registry_writes_total" ["cluster", "result"]
        "Writes to the service registry, by cluster and result: applied, conflict (a key changed since read), error, refused (a newer term or a record not ours held the key).";
    watch_errors_total: Counter "flotilla_watch_errors_total" ["cluster", "resource"]
        "Errors of the leader's child watches, by cluster and resource, and ends of each status feed (resource status-feed: an error or a proven stall); a child watch failing past 10 s makes its Microservices' Available Unknown (CachesStale).";
    reconciler_notes: Gauge "flotilla_reconciler_notes" ["cluster", "map"]
        "Objects the leader's controller keeps a note of, by cluster and map, after each prune (every 60 s): bounded by the Microservices its store holds.";
    tls_reload_errors_total: Counter "flotilla_tls_reload_errors_total" []
        "Changed TLS files (certificate, key, client CA) that did not load; the previous ones stay in force.";
    connections_cut_total: Counter "flotilla_connections_cut_total" ["port", "reason"]
        "Connections the server closed before the client did, by port (grpc, ui) and reason: handshake (TLS not done in time), silent (no request in time), idle (no bytes either way for the idle limit).";
    ui_streams_ended_total: Counter "flotilla_ui_streams_ended_total" ["reason"]
        "Dashboard event streams the server ended, by reason: stalled (the browser read nothing for the stall limit), age (the maximum age), revoked (a token or certificate it was admitted with changed), shutdown.";
    authz_denied_total: Counter "flotilla_authz_denied_total" ["method"]
        "Calls refused because the caller lacks the right (the home cluster's RBAC, or a static token that cannot change rollouts), by gRPC method.";
    authz_reviews_total: Counter "flotilla_authz_reviews_total" ["kind"]
        "TokenReviews and SubjectAccessReviews sent to the home apiserver (cache misses; calls asking the same question at once share one), by kind.";
}

impl Metrics {
    /// The OpenMetrics text format (`CONTENT_TYPE`).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &self.registry);
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
            &self.watch_errors_total,
            &self.reconciler_notes,
        ] {
            f.forget(cluster);
        }
    }
}

/// What `encode` returns.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The process's metrics; every layer records into it.
pub static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_gauges_and_histograms_encode_as_openmetrics_text() {
        let m = Metrics::new();
        m.reconcile_total.inc(&["member-1", "Applied"]);
        m.reconcile_total.inc(&["member-1", "Applied"]);
        m.cluster_leader.set(&["member-1"], 1.0);
        m.reconcile_duration.observe(&["member-1"], 0.003);
        m.reconcile_duration.observe(&["member-1"], 0.2);
        let text = m.encode();
        assert!(
            text.contains("# TYPE flotilla_reconcile counter\n"),
            "{text}"
        );
        assert!(
            text.contains("flotilla_reconcile_total{cluster=\"member-1\",result=\"Applied\"} 2\n")
        );
        assert!(text.contains("flotilla_cluster_leader{cluster=\"member-1\"} 1\n"));
        assert!(text.contains(
            "flotilla_reconcile_duration_seconds_bucket{le=\"0.0025\",cluster=\"member-1\"} 0\n"
        ));
        assert!(text.contains(
            "flotilla_reconcile_duration_seconds_bucket{le=\"0.005\",cluster=\"member-1\"} 1\n"
        ));
        assert!(text.contains(
            "flotilla_reconcile_duration_seconds_bucket{le=\"+Inf\",cluster=\"member-1\"} 2\n"
        ));
        assert!(
            text.contains("flotilla_reconcile_duration_seconds_count{cluster=\"member-1\"} 2\n")
        );
        assert!(text.contains(
            "# HELP flotilla_reconcile_duration_seconds How long each reconcile took.\n"
        ));
        assert!(text.ends_with("# EOF\n"));
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
