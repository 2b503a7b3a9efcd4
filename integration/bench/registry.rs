//! The fleet service registry's figures (`make bench-registry`; needs the
//! local fleet and its registry: `integration/fleet registry up`):
//! - create to resolvable by DNS, per Microservice, p50 and p99;
//! - steady state: registry writes and etcd revisions over several resyncs
//!   with nothing changing (goal: 0);
//! - cleanup delay: deletions made while the registry's etcd is stopped,
//!   timed from etcd's return until every object is gone.
//!
//! An in-process controller on member-1 (registration on, 2 s resync);
//! FLOTILLA_BENCH_REGISTRY_N (100) Microservices, created 10 at a time.

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use futures::{StreamExt, stream};
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;
use tokio::time::Instant;

use common::{Spread, env_usize, percentile, write_json};
use flotilla::crd::Microservice;
use flotilla::reconciler::Hooks;
use flotilla::registry::Registration;
use support::registry::{StoppedEtcd, rcode, registration, zone};
use support::{Operator, TestNamespace, client, ensure_crd, microservice, settings};

const CLUSTER: &str = "member-1";

/// The registry etcd's current revision: it moves with every write.
fn etcd_revision() -> i64 {
    let endpoint = support::registry::config().endpoints[0].clone();
    // A range read of "/skydns/" (base64), one key: its header says.
    let body = json!({"key": "L3NreWRucy8=", "limit": 1});
    let out = std::process::Command::new("curl")
        .args([
            "-sf",
            &format!("{endpoint}/v3/kv/range"),
            "-d",
            &body.to_string(),
        ])
        .output()
        .expect("curl");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["header"]["revision"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .unwrap_or(-1)
}

fn registry_writes() -> f64 {
    flotilla::telemetry::metrics::METRICS
        .encode()
        .lines()
        .filter(|l| l.starts_with("flotilla_registry_writes_total") && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn main() {
    let n = env_usize("FLOTILLA_BENCH_REGISTRY_N", 100);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let out = rt.block_on(async {
        let c = client(CLUSTER).await;
        ensure_crd(&c).await;
        let ns = TestNamespace::create(&c, CLUSTER, "bench-reg").await;
        assert!(matches!(registration().await, Registration::Ready(_)));
        let mut s = settings(CLUSTER, &ns.name);
        s.registry = Some(registration().await);
        s.resync = Duration::from_secs(2);
        s.registry_sweep = Duration::from_secs(3600);
        let op = Operator::start(&c, s, Hooks::default());
        let api = ns.api::<Microservice>();
        let z = zone();

        // Create to resolvable.
        let latencies: Vec<f64> = stream::iter(0..n)
            .map(|i| {
                let (api, name) = (api.clone(), format!("svc-{i:03}"));
                let dns = format!("{name}.{}.{CLUSTER}.cluster.{z}", ns.name);
                async move {
                    let ms = microservice(&name, "ghcr.io/acme/s:1", 8080, Some(1));
                    let t0 = Instant::now();
                    api.create(&PostParams::default(), &ms)
                        .await
                        .expect("create");
                    while rcode(&dns, "A") != "NOERROR" {
                        assert!(
                            t0.elapsed() < Duration::from_secs(120),
                            "{dns} never resolved"
                        );
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    t0.elapsed().as_secs_f64() * 1000.0
                }
            })
            .buffer_unordered(10)
            .collect()
            .await;

        // Steady state: several resyncs with nothing changing.
        tokio::time::sleep(Duration::from_secs(10)).await;
        let (writes0, rev0) = (registry_writes(), etcd_revision());
        let window = Duration::from_secs(30);
        tokio::time::sleep(window).await;
        let (writes1, rev1) = (registry_writes(), etcd_revision());

        // Cleanup delay after etcd returns.
        let mut stopped = StoppedEtcd::stop();
        let doomed = 10.min(n);
        for i in 0..doomed {
            api.delete(&format!("svc-{i:03}"), &DeleteParams::default())
                .await
                .expect("delete");
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        let blocked = api
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .iter()
            .filter(|m| m.metadata.deletion_timestamp.is_some())
            .count();
        stopped.start();
        let back = Instant::now();
        loop {
            let left = api
                .list(&ListParams::default())
                .await
                .map(|l| l.items.len())
                .unwrap_or(n);
            if left <= n - doomed {
                break;
            }
            assert!(
                back.elapsed() < Duration::from_secs(120),
                "cleanup never completed"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let cleanup_s = back.elapsed().as_secs_f64();
        drop(stopped);

        for i in doomed..n {
            api.delete(&format!("svc-{i:03}"), &DeleteParams::default())
                .await
                .ok();
        }
        while !api
            .list(&ListParams::default())
            .await
            .map(|l| l.items.is_empty())
            .unwrap_or(false)
        {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        op.stop().await;
        BTreeMap::from([
            ("objects", json!(n)),
            ("create_to_dns_p50_ms", json!(percentile(&latencies, 0.5))),
            ("create_to_dns_p99_ms", json!(percentile(&latencies, 0.99))),
            ("create_to_dns_ms", json!(Spread::of(&latencies))),
            ("steady_window_s", json!(window.as_secs())),
            ("steady_registry_writes", json!(writes1 - writes0)),
            ("steady_etcd_revisions", json!(rev1 - rev0)),
            ("deletions_blocked", json!(blocked)),
            ("cleanup_after_etcd_returned_s", json!(cleanup_s)),
        ])
    });
    println!("{}", serde_json::to_string_pretty(&out).unwrap());
    write_json("registry", &out);
}
