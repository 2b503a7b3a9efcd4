//! The dashboard's figures (`make bench-dashboard`; no fleet needed): the
//! product's UI server over an index fed directly with 3 clusters ×
//! FLOTILLA_BENCH_UI_N (500) Microservices, opened in headless Chromium.
//! - first render: navigation start to the first full matrix, from the
//!   page's Performance API, and the JS heap then (FLOTILLA_BENCH_TRIALS,
//!   3, fresh page loads);
//! - a change in the index to its cell on screen, p50 and p99 over 20;
//! - bytes per update on the event stream; page weight.

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::json;

use common::{Spread, env_usize, percentile, write_json};
use flotilla::status::hub::Hub;
use flotilla::status::view::{Facts, Reach, Replicas};
use flotilla::ui::server::{UiOptions, serve};
use support::browser::{Browser, wall_ms};
use support::replicas::free_port;

const CLUSTERS: [&str; 3] = ["member-1", "member-2", "member-3"];

fn facts(image: &str) -> Facts {
    Facts {
        generation: 3,
        observed_generation: 3,
        image: image.into(),
        labels: BTreeMap::from([("team".into(), "shop".into())]),
        conditions: vec![Condition {
            type_: "Available".into(),
            status: "True".into(),
            reason: "MinimumReplicasAvailable".into(),
            message: "2 of 2 replicas are available".into(),
            observed_generation: Some(3),
            last_transition_time: Time(jiff::Timestamp::now()),
        }],
        phase: "Running".into(),
        ..Default::default()
    }
}

#[tokio::main]
async fn main() {
    let n = env_usize("FLOTILLA_BENCH_UI_N", 500);
    let trials = env_usize("FLOTILLA_BENCH_TRIALS", 3);
    let hub = Hub::new("bench-ui");
    hub.update(|ix| {
        ix.registry_read();
        for c in CLUSTERS {
            ix.update_cluster(c, "file", |i| {
                i.reach = Reach::Reachable;
                i.synced = true;
            });
            for i in 0..n {
                let key = ("shop".to_string(), format!("svc-{i:04}"));
                ix.upsert_microservice(c, key.clone(), facts("ghcr.io/acme/shop:1"));
                let r = Replicas {
                    desired: 2,
                    updated: 2,
                    ready: 2,
                    available: 2,
                };
                ix.upsert_replicas(c, key, r);
            }
        }
    });
    let port = free_port();
    let mut opts = UiOptions::new(format!("127.0.0.1:{port}").parse().unwrap());
    opts.insecure = true;
    opts.max_streams = 100;
    let listener = flotilla::ui::server::bind(&opts).await.expect("bind");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let server = tokio::spawn(serve(hub.clone(), opts, listener, None, None, stop_rx));
    let url = format!("http://127.0.0.1:{port}/");

    let browser = Browser::start("bench", None).await;
    let (mut renders, mut heaps) = (Vec::new(), Vec::new());
    for _ in 0..trials {
        browser.client.goto(&url).await.unwrap();
        let m = browser
            .until(
                "the first render",
                Duration::from_secs(120),
                "const f = window.flotilla; return f && f.firstRender !== null ? { render: f.firstRender, heap: performance.memory.usedJSHeapSize, rows: document.querySelectorAll('#matrix-body tr').length } : null;",
            )
            .await;
        assert_eq!(m["rows"].as_u64(), Some(n as u64), "{m}");
        renders.push(m["render"].as_f64().unwrap());
        heaps.push(m["heap"].as_f64().unwrap() / (1024.0 * 1024.0));
    }

    // Changes to one object, index to cell (browser clock).
    let key = "shop/svc-0250";
    let mut latencies = Vec::new();
    let mut bytes = Vec::new();
    for i in 2..22 {
        let image = format!("ghcr.io/acme/shop:{i}");
        browser
            .js(
                "const [key, image] = arguments; window.__seen = null; if (window.__obs) window.__obs.disconnect(); window.__obs = new MutationObserver(() => { const c = document.querySelector(`td[data-key=\"${key}\"][data-cluster=\"member-2\"] .image`); if (window.__seen === null && c && c.textContent === image) window.__seen = Date.now(); }); window.__obs.observe(document.getElementById('matrix-body'), { childList: true, subtree: true });",
                vec![json!(key), json!(image)],
            )
            .await;
        let at = wall_ms();
        hub.update(|ix| {
            ix.upsert_microservice(
                "member-2",
                ("shop".into(), "svc-0250".into()),
                facts(&image),
            )
        });
        let seen = browser
            .until(
                "the change on screen",
                Duration::from_secs(30),
                "return window.__seen;",
            )
            .await;
        latencies.push(seen.as_f64().unwrap() - at);
        bytes.push(
            browser
                .js("return window.flotilla.lastUpdateBytes;", vec![])
                .await
                .as_f64()
                .unwrap(),
        );
    }
    browser.screenshot("bench-1500").await;
    let render = Spread::of(&renders);
    let heap = Spread::of(&heaps);
    let weight = flotilla::ui::assets::page_weight();
    println!(
        "dashboard, {} × {n} Microservices: first render {render:.0} ms, JS heap {heap:.1} MiB; change to cell p50 {:.1} ms, p99 {:.1} ms (20 changes); bytes per update {:.0}; page weight {weight} bytes",
        CLUSTERS.len(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        percentile(&bytes, 0.5),
    );
    write_json(
        "dashboard",
        &json!({
            "objects_per_cluster": n,
            "clusters": CLUSTERS.len(),
            "first_render_ms": render,
            "js_heap_mib": heap,
            "change_to_cell_ms_p50": percentile(&latencies, 0.5),
            "change_to_cell_ms_p99": percentile(&latencies, 0.99),
            "bytes_per_update": percentile(&bytes, 0.5),
            "page_weight_bytes": weight,
        }),
    );
    drop(browser);
    stalled_streams(&hub, port, n).await;
    stop_tx.send(true).ok();
    server.await.ok();
}

/// #30 H1: 50 event streams that never read, each from its own loopback
/// address (so the per-client share does not refuse them), while the
/// index keeps changing: this process's RSS (the server and the index)
/// before, at its peak, and after; and how many streams were cut.
async fn stalled_streams(hub: &std::sync::Arc<Hub>, port: u16, n: usize) {
    let me = std::process::id();
    let before = common::rss_mib(me);
    let mut held = Vec::new();
    let addr = format!("127.0.0.1:{port}");
    for i in 0..50u8 {
        let (code, s) = support::stalled_event_stream(&addr, [127, 0, 1, i + 1].into()).await;
        assert_eq!(code, 200);
        held.push(s);
    }
    let mut peak = before;
    for round in 0..400 {
        hub.update(|ix| {
            for i in 0..50 {
                let key = (
                    "shop".to_string(),
                    format!("svc-{:04}", (round * 50 + i) % n),
                );
                ix.upsert_microservice(
                    "member-1",
                    key,
                    facts(&format!("ghcr.io/acme/shop:r{round}")),
                );
            }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        if round % 10 == 0 {
            peak = peak.max(common::rss_mib(me));
        }
    }
    let after = common::rss_mib(me);
    let metrics = flotilla::telemetry::metrics::METRICS.encode();
    let cut = metrics
        .lines()
        .find(|l| l.starts_with("flotilla_ui_streams_ended_total{reason=\"stalled\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .unwrap_or("0")
        .to_string();
    println!(
        "50 stalled event streams over {} entries, 20 s of changes: RSS {before:.1} MiB before, peak {peak:.1}, after {after:.1}; {cut} streams cut as stalled",
        CLUSTERS.len() * n
    );
    write_json(
        "dashboard-stalled",
        &json!({"streams": 50, "entries": CLUSTERS.len() * n, "rss_before_mib": before, "rss_peak_mib": peak, "rss_after_mib": after, "cut_stalled": cut}),
    );
    drop(held);
}
