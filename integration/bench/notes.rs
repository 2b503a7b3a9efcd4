//! What the reconciler remembers after many Microservices have come and
//! gone, on one real member cluster.
//!
//! `make bench-notes` (fleet up). An in-process controller watches one
//! namespace while FLOTILLA_BENCH_CYCLES (10,000) Microservices are each
//! created, reconciled (`Reconciled=True`) and deleted, 16 at a time, with
//! no replicas (the controller's work, not the pods'). Every 1,000 cycles
//! the process's resident memory is sampled; after the last one and the
//! next prune, every note map (`flotilla_reconciler_notes`) must be empty.
//! Results in .fleet/bench/notes.json.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use kube::api::{DeleteParams, PostParams};
use serde_json::json;
use support::{Operator, TestNamespace, client, ensure_crd, from_json, settings};

use flotilla::crd::Microservice;
use flotilla::domain::conditions::find;
use flotilla::reconciler::Hooks;

const CLUSTER: &str = "member-3";

fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

/// One Microservice created, reconciled and deleted.
async fn cycle(api: &kube::Api<Microservice>, i: usize) {
    let name = format!("n-{i:05}");
    let ms: Microservice = from_json(json!({
        "apiVersion": "platform.example.io/v1alpha1", "kind": "Microservice",
        "metadata": {"name": name},
        "spec": {"image": "ghcr.io/acme/notes:1", "port": 8080, "replicas": 0},
    }));
    api.create(&PostParams::default(), &ms)
        .await
        .expect("create");
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let reconciled = api.get(&name).await.ok().is_some_and(|m| {
            m.status.as_ref().is_some_and(|s| {
                s.observed_generation == m.metadata.generation
                    && find(&s.conditions, "Reconciled").is_some_and(|c| c.status == "True")
            })
        });
        if reconciled {
            break;
        }
        assert!(Instant::now() < until, "{name} not reconciled within 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    api.delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
}

/// The controller's note counts for `cluster`, from the metrics registry.
fn notes(cluster: &str) -> Vec<(String, f64)> {
    let text = flotilla::telemetry::metrics::METRICS.encode();
    text.lines()
        .filter(|l| l.starts_with("flotilla_reconciler_notes{"))
        .filter(|l| l.contains(&format!("cluster=\"{cluster}\"")))
        .filter_map(|l| {
            let map = l.split("map=\"").nth(1)?.split('"').next()?.to_string();
            let n = l.rsplit(' ').next()?.parse().ok()?;
            Some((map, n))
        })
        .collect()
}

#[tokio::main]
async fn main() {
    let cycles: usize = std::env::var("FLOTILLA_BENCH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let client = client(CLUSTER).await;
    ensure_crd(&client).await;
    let ns = TestNamespace::create(&client, CLUSTER, "bench-notes").await;
    let api = ns.api::<Microservice>();
    let mut s = settings(CLUSTER, &ns.name);
    s.resync = Duration::from_secs(3600);
    let op = Operator::start(&client, s, Hooks::default());

    let started = Instant::now();
    let mut samples = vec![(0usize, rss_mib())];
    for chunk in (0..cycles).collect::<Vec<_>>().chunks(1000) {
        stream::iter(chunk.iter().copied())
            .for_each_concurrent(16, |i| {
                let api = api.clone();
                async move { cycle(&api, i).await }
            })
            .await;
        let done = chunk.last().map_or(0, |l| l + 1);
        samples.push((done, rss_mib()));
        println!(
            "{done} cycles in {:.0} s: RSS {:.1} MiB",
            started.elapsed().as_secs_f64(),
            rss_mib()
        );
    }
    let took = started.elapsed().as_secs_f64();
    // The controller prunes its notes every 60 s.
    tokio::time::sleep(Duration::from_secs(65)).await;
    let counts = notes(CLUSTER);
    let rss_after = rss_mib();
    println!("after the next prune: RSS {rss_after:.1} MiB; notes {counts:?}");
    op.stop().await;

    let out = json!({
        "cycles": cycles,
        "seconds": took,
        "rss_mib_by_cycles": samples,
        "rss_mib_after_prune": rss_after,
        "notes_after_prune": counts.iter().map(|(m, n)| (m.clone(), *n)).collect::<std::collections::BTreeMap<_, _>>(),
    });
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".fleet/bench");
    std::fs::create_dir_all(&dir).expect("bench dir");
    std::fs::write(dir.join("notes.json"), format!("{out:#}")).expect("write results");
    assert!(
        !counts.is_empty(),
        "the controller published no note counts"
    );
    let left: Vec<_> = counts.iter().filter(|(_, n)| *n > 0.0).collect();
    assert!(
        left.is_empty(),
        "notes left for Microservices that are gone: {left:?}"
    );
}
