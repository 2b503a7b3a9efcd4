//! The status API under load (`cargo bench --bench status_api`; no fleet
//! needed). The product's own server (`api::server::serve`) on a loopback
//! socket, fed an index directly, loaded by ghz, the gRPC load client
//! (`go install github.com/bojand/ghz/cmd/ghz@v0.121.0`).
//!
//! 1. ListMicroservices, 100 per page, 16 concurrent clients, 600 entries
//!    (200 Microservices in 3 clusters); GetMicroservice alike.
//! 2. A watch snapshot of 1,500 entries: the time the index lock is held
//!    (taking the snapshot) and the time spent outside it (building and
//!    encoding every view).
//! 3. GetMicroservice while 16 watchers stream a 1,500-entry snapshot over
//!    and over.
//!
//! FLOTILLA_BENCH_SECONDS (10) per ghz run; GHZ overrides the ghz binary.

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "common/mod.rs"]
mod common;

use common::ghz::{ghz, ghz_at};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use prost::Message;
use serde_json::{Value, json};

use flotilla::api::client::{ClientOptions, connect};
use flotilla::api::server::{ServerOptions, bind, serve};
use flotilla::api::{convert, pb};
use flotilla::status::hub::Hub;
use flotilla::status::index::Filter;
use flotilla::status::view::{Facts, Reach, Replicas};

const CLUSTERS: [&str; 3] = ["member-1", "member-2", "member-3"];

fn condition(type_: &str, reason: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: "True".into(),
        reason: reason.into(),
        message: format!("{type_} because {reason}: 2/2 replicas available, 2 ready endpoints"),
        observed_generation: Some(3),
        last_transition_time: Time(jiff::Timestamp::now()),
    }
}

/// An index of `names` Microservices, each in every cluster.
fn hub(names: usize) -> Arc<Hub> {
    let hub = Hub::new("bench");
    hub.update(|ix| {
        ix.registry_read();
        for c in CLUSTERS {
            ix.update_cluster(c, "file", |i| {
                i.reach = Reach::Reachable;
                i.synced = true;
                i.last_seen = Some(SystemTime::now());
            });
        }
        for n in 0..names {
            let key = ("shop".to_string(), format!("service-{n:05}"));
            for c in CLUSTERS {
                let facts = Facts {
                    generation: 3,
                    observed_generation: 3,
                    image: format!("ghcr.io/acme/service-{n}:1.4.2"),
                    fleet_revision: None,
                    spec_digest: 0,
                    deleting: false,
                    labels: BTreeMap::from([
                        ("team".to_string(), format!("team-{}", n % 7)),
                        ("tier".to_string(), "backend".to_string()),
                    ]),
                    conditions: vec![
                        condition("Accepted", "SpecValid"),
                        condition("Reconciled", "ChildrenApplied"),
                        condition("Available", "ReplicasAvailable"),
                        condition("Progressing", "RolloutComplete"),
                    ],
                    phase: "Available".into(),
                };
                ix.upsert_microservice(c, key.clone(), facts);
                ix.upsert_replicas(
                    c,
                    key.clone(),
                    Replicas {
                        desired: 2,
                        updated: 2,
                        ready: 2,
                        available: 2,
                    },
                );
            }
        }
    });
    hub
}

/// A runtime of 2 workers, as many as the machine has cores.
fn two_workers() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Serves `hub` on a loopback port from a runtime of its own (2 workers,
/// as many as the machine has cores); returns the address.
fn start(hub: Arc<Hub>) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = two_workers();
        rt.block_on(async move {
            let mut opts = ServerOptions::new("127.0.0.1:0".parse().unwrap());
            opts.insecure = true;
            // Its figures are for pages of 100 whatever their bytes, as
            // they always were; the byte budget and the List room are
            // measured elsewhere. A reply is at most max_response_bytes.
            opts.max_page_bytes = opts.max_response_bytes;
            opts.max_list_bytes_in_flight = usize::MAX;
            opts.max_list_bytes_per_connection = usize::MAX;
            let listener = bind(&opts).await.unwrap();
            tx.send(listener.local_addr().unwrap().to_string()).unwrap();
            serve(hub, None, opts, listener, std::future::pending())
                .await
                .unwrap();
        });
    });
    rx.recv().unwrap()
}

/// 16 tonic clients calling `call` back to back for `seconds`, on a
/// runtime of their own; returns (p50 ms, p99 ms, requests/s). prost decodes
/// far cheaper than ghz's dynamic messages, so on 2 cores this shows the
/// server rather than the load client.
fn tonic_load<F, Fut>(addr: &str, seconds: u64, call: F) -> (f64, f64, f64)
where
    F: Fn(flotilla::api::client::Client) -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let url = format!("http://{addr}");
    let rt = two_workers();
    rt.block_on(async move {
        let until = Instant::now() + Duration::from_secs(seconds);
        let mut tasks = Vec::new();
        for _ in 0..16 {
            let url = url.clone();
            let call = call.clone();
            tasks.push(tokio::spawn(async move {
                let client = connect(&ClientOptions {
                    server: url,
                    ..Default::default()
                })
                .await
                .unwrap();
                let mut took = Vec::new();
                while Instant::now() < until {
                    let t0 = Instant::now();
                    call(client.clone()).await;
                    took.push(t0.elapsed().as_secs_f64() * 1e3);
                }
                took
            }));
        }
        let all: Vec<f64> = futures::future::join_all(tasks)
            .await
            .into_iter()
            .flat_map(|t| t.unwrap())
            .collect();
        (
            common::percentile(&all, 0.5),
            common::percentile(&all, 0.99),
            all.len() as f64 / seconds as f64,
        )
    })
}

async fn list_page(mut c: flotilla::api::client::Client) {
    let r = c
        .list_microservices(pb::ListMicroservicesRequest {
            page_size: 100,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.items.len(), 100);
}

/// The rate of the paced FULL run: half of what 16 ghz clients reach
/// unpaced on 2 cores, so the figure is latency rather than queueing.
const PACED_RPS: u32 = 50;
/// The same for BASIC pages: half of their unpaced rate.
const BASIC_PACED_RPS: u32 = 150;

/// The encoded size of one page of 100, FULL and BASIC.
fn page_bytes(hub: &Hub) -> (usize, usize) {
    let snap = hub.read(|ix| ix.snapshot());
    let page: Vec<_> = snap.list(&Filter::default(), None, 100).collect();
    let size = |f: fn(&flotilla::status::index::MicroserviceView) -> pb::Microservice| {
        pb::ListMicroservicesResponse {
            items: page.iter().map(f).collect(),
            ..Default::default()
        }
        .encoded_len()
    };
    (
        size(convert::microservice),
        size(convert::basic_microservice),
    )
}

async fn basic_page(mut c: flotilla::api::client::Client) {
    let r = c
        .list_microservices(pb::ListMicroservicesRequest {
            page_size: 100,
            view: pb::MicroserviceView::Basic as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.items.len(), 100);
}

fn main() {
    let seconds = common::env_usize("FLOTILLA_BENCH_SECONDS", 10) as u64;
    let mut results = serde_json::Map::new();

    // 1. List and Get over 600 entries.
    let addr = start(hub(200));
    let me = std::process::id();
    let cpu0 = common::cpu_seconds(me);
    let list = ghz(
        &addr,
        "ListMicroservices",
        json!({"page_size": 100}),
        seconds,
    );
    let server_cpu_ms = (common::cpu_seconds(me) - cpu0) * 1e3 / (list.2 * seconds as f64);
    println!(
        "ListMicroservices: the server spent {server_cpu_ms:.2} ms of CPU per call (the rest of the 2 cores went to ghz)"
    );
    println!(
        "ListMicroservices (100/page, 600 entries, 16 clients): p50 {:.1} ms, p99 {:.1} ms, {:.0} req/s, {} errors",
        list.0, list.1, list.2, list.3
    );
    let cpu0 = common::cpu_seconds(me);
    let basic = ghz(
        &addr,
        "ListMicroservices",
        json!({"page_size": 100, "view": "MICROSERVICE_VIEW_BASIC"}),
        seconds,
    );
    let basic_cpu_ms = (common::cpu_seconds(me) - cpu0) * 1e3 / (basic.2 * seconds as f64);
    println!(
        "ListMicroservices, BASIC view (16 clients): p50 {:.1} ms, p99 {:.1} ms, {:.0} req/s, {} errors; the server spent {basic_cpu_ms:.2} ms of CPU per call",
        basic.0, basic.1, basic.2, basic.3
    );
    // FULL pages at a fixed rate below what ghz can decode on these cores.
    let paced = ghz_at(
        &addr,
        "ListMicroservices",
        json!({"page_size": 100}),
        seconds,
        Some(PACED_RPS),
    );
    println!(
        "ListMicroservices, FULL, 16 clients paced at {PACED_RPS} req/s: p50 {:.1} ms, p99 {:.1} ms, {:.0} req/s, {} errors",
        paced.0, paced.1, paced.2, paced.3
    );
    let basic_paced = ghz_at(
        &addr,
        "ListMicroservices",
        json!({"page_size": 100, "view": "MICROSERVICE_VIEW_BASIC"}),
        seconds,
        Some(BASIC_PACED_RPS),
    );
    println!(
        "ListMicroservices, BASIC, 16 clients paced at {BASIC_PACED_RPS} req/s: p50 {:.1} ms, p99 {:.1} ms, {:.0} req/s, {} errors",
        basic_paced.0, basic_paced.1, basic_paced.2, basic_paced.3
    );
    results.insert(
        "list_basic_paced".into(),
        json!({"p50_ms": basic_paced.0, "p99_ms": basic_paced.1, "rps": basic_paced.2, "target_rps": BASIC_PACED_RPS}),
    );
    let (full_bytes, basic_bytes) = page_bytes(&hub(100));
    println!("a page of 100: FULL {full_bytes} bytes, BASIC {basic_bytes} bytes");
    results.insert(
        "list_basic".into(),
        json!({"p50_ms": basic.0, "p99_ms": basic.1, "rps": basic.2, "server_cpu_ms": basic_cpu_ms, "page_bytes": basic_bytes}),
    );
    results.insert(
        "list_full_paced".into(),
        json!({"p50_ms": paced.0, "p99_ms": paced.1, "rps": paced.2, "target_rps": PACED_RPS, "page_bytes": full_bytes}),
    );
    let get = ghz(
        &addr,
        "GetMicroservice",
        json!({"namespace": "shop", "name": "service-00042"}),
        seconds,
    );
    println!(
        "GetMicroservice (600 entries, 16 clients): p50 {:.2} ms, p99 {:.2} ms, {:.0} req/s, {} errors",
        get.0, get.1, get.2, get.3
    );
    let rust = tonic_load(&addr, seconds, list_page);
    println!(
        "ListMicroservices, 16 tonic clients: p50 {:.1} ms, p99 {:.1} ms, {:.0} req/s",
        rust.0, rust.1, rust.2
    );
    let rust_basic = tonic_load(&addr, seconds, basic_page);
    println!(
        "ListMicroservices, BASIC, 16 tonic clients: p50 {:.1} ms, p99 {:.1} ms, {:.0} req/s",
        rust_basic.0, rust_basic.1, rust_basic.2
    );
    results.insert(
        "list_basic_tonic".into(),
        json!({"p50_ms": rust_basic.0, "p99_ms": rust_basic.1, "rps": rust_basic.2}),
    );
    results.insert(
        "list_tonic".into(),
        json!({"p50_ms": rust.0, "p99_ms": rust.1, "rps": rust.2}),
    );
    results.insert(
        "list".into(),
        json!({"p50_ms": list.0, "p99_ms": list.1, "rps": list.2}),
    );
    results.insert(
        "get".into(),
        json!({"p50_ms": get.0, "p99_ms": get.1, "rps": get.2}),
    );

    // 2. A 1,500-entry snapshot: under the lock, and outside it.
    let big = hub(500);
    let (mut locked, mut outside) = (Vec::new(), Vec::new());
    let (mut views, mut converted) = (Vec::new(), Vec::new());
    for _ in 0..50 {
        let t0 = Instant::now();
        let snap = big.read(|ix| ix.snapshot());
        locked.push(t0.elapsed().as_secs_f64() * 1e6);
        let t1 = Instant::now();
        let filter = Filter::default();
        let bytes: usize = snap
            .list(&filter, None, usize::MAX)
            .map(|v| convert::microservice(&v).encode_to_vec().len())
            .sum();
        outside.push(t1.elapsed().as_secs_f64() * 1e3);
        assert!(bytes > 0);
        // Where the time goes: the views alone, then their conversion.
        let t2 = Instant::now();
        let all: Vec<_> = snap.list(&filter, None, usize::MAX).collect();
        views.push(t2.elapsed().as_secs_f64() * 1e3);
        let t3 = Instant::now();
        let pbs: Vec<_> = all.iter().map(convert::microservice).collect();
        converted.push(t3.elapsed().as_secs_f64() * 1e3);
        assert_eq!(pbs.len(), 500);
    }
    let (l, o) = (
        common::percentile(&locked, 0.5),
        common::percentile(&outside, 0.5),
    );
    println!(
        "watch snapshot of 1,500 entries: lock held {l:.1} µs (taking the snapshot); built and encoded outside it in {o:.1} ms (views {:.1} ms, conversion {:.1} ms)",
        common::percentile(&views, 0.5),
        common::percentile(&converted, 0.5)
    );
    results.insert(
        "snapshot_1500".into(),
        json!({"lock_held_us_p50": l, "outside_ms_p50": o}),
    );

    // 3. Get while 16 watchers stream 1,500-entry snapshots.
    let addr = start(big.clone());
    let streamed = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = streamed.clone();
    let url = format!("http://{addr}");
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let mut tasks = Vec::new();
            for _ in 0..16 {
                let url = url.clone();
                let counter = counter.clone();
                tasks.push(tokio::spawn(async move {
                    let mut c = connect(&ClientOptions {
                        server: url,
                        ..Default::default()
                    })
                    .await
                    .unwrap();
                    loop {
                        let mut s = c
                            .watch_microservices(pb::WatchMicroservicesRequest::default())
                            .await
                            .unwrap()
                            .into_inner();
                        while let Some(Ok(e)) = s.next().await {
                            if e.r#type == pb::WatchEventType::Synced as i32 {
                                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                break;
                            }
                        }
                    }
                }));
            }
            futures::future::join_all(tasks).await;
        });
    });
    std::thread::sleep(Duration::from_secs(1));
    let before = streamed.load(std::sync::atomic::Ordering::Relaxed);
    let busy = ghz(
        &addr,
        "GetMicroservice",
        json!({"namespace": "shop", "name": "service-00042"}),
        seconds,
    );
    let snapshots = streamed.load(std::sync::atomic::Ordering::Relaxed) - before;
    println!(
        "GetMicroservice while 16 watchers stream 1,500-entry snapshots ({snapshots} snapshots in {seconds} s): p50 {:.2} ms, p99 {:.2} ms, {:.0} req/s, {} errors",
        busy.0, busy.1, busy.2, busy.3
    );
    results.insert(
        "get_during_snapshots".into(),
        json!({"p50_ms": busy.0, "p99_ms": busy.1, "rps": busy.2, "snapshots": snapshots}),
    );
    common::write_json("status_api", &Value::Object(results));
}
