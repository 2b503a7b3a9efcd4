//! Reconcile throughput, API cost and memory on one real member cluster.
//!
//! `make bench-reconcile` (fleet up). For each run: N Microservices are
//! created with no controller running; then a controller starts and we time
//! until every one is `Reconciled=True` at its generation ("changed": both
//! children created, status written). A second controller then starts over
//! the same, now in-sync objects, and we time N reconciles ("in sync").
//! API requests are counted on the operator's own client (watches left
//! out); reconciles are
//! counted from the controller's `reconcile` spans.

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use kube::api::PostParams;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde_json::json;
use support::{
    Operator, RequestCounter, TestNamespace, client, counting_client, ensure_crd, eventually,
    from_json, settings, wait_all_true,
};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

use flotilla::crd::Microservice;
use flotilla::reconciler::Hooks;

const CLUSTER: &str = "member-3";

static RECONCILES: AtomicU64 = AtomicU64::new(0);

/// Counts finished `reconcile` spans.
struct ReconcileCounter;

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for ReconcileCounter {
    fn on_close(&self, id: tracing::span::Id, ctx: Context<'_, S>) {
        if ctx.span(&id).is_some_and(|s| s.name() == "reconcile") {
            RECONCILES.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

const WRITES: &[&str] = &["POST", "PUT", "PATCH", "DELETE"];

fn count(counts: &std::collections::BTreeMap<String, u64>, verbs: &[&str]) -> f64 {
    verbs
        .iter()
        .map(|v| counts.get(*v).copied().unwrap_or(0))
        .sum::<u64>() as f64
}

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|kb| kb.parse::<f64>().ok())
            })
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

#[derive(Debug, serde::Serialize)]
struct Run {
    changed_seconds: f64,
    changed_per_second: f64,
    changed_reconciles: u64,
    changed_writes_per_object: f64,
    changed_gets_per_object: f64,
    in_sync_seconds: f64,
    in_sync_per_second: f64,
    in_sync_writes: f64,
    in_sync_gets: f64,
}

async fn one_run(
    client: &kube::Client,
    op_client: &kube::Client,
    requests: &RequestCounter,
    n: usize,
) -> Run {
    let ns = TestNamespace::create(client, CLUSTER, "bench-rec").await;
    let api = ns.api::<Microservice>();
    stream::iter(0..n)
        .for_each_concurrent(16, |i| {
            let api = api.clone();
            async move {
                let ms: Microservice = from_json(json!({
                    "apiVersion": "platform.example.io/v1alpha1", "kind": "Microservice",
                    "metadata": {"name": format!("ms-{i:04}")},
                    "spec": {"image": "ghcr.io/acme/bench:1", "port": 8080, "replicas": 1},
                }));
                api.create(&PostParams::default(), &ms)
                    .await
                    .expect("create");
            }
        })
        .await;

    let mut s = settings(CLUSTER, &ns.name);
    s.resync = Duration::from_secs(3600);

    let before = requests.snapshot();
    let r0 = RECONCILES.load(Ordering::Relaxed);
    let t0 = Instant::now();
    let op = Operator::start(op_client, s.clone(), Hooks::default());
    wait_all_true(&api, n, "Reconciled", Duration::from_secs(600)).await;
    let changed = t0.elapsed().as_secs_f64();
    let changed_requests = requests.since(&before);
    let changed_reconciles = RECONCILES.load(Ordering::Relaxed) - r0;
    op.stop().await;

    // Let child status updates settle, then reconcile everything again from scratch.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before_sync = requests.snapshot();
    let r1 = RECONCILES.load(Ordering::Relaxed);
    let t1 = Instant::now();
    let op = Operator::start(op_client, s, Hooks::default());
    eventually("N in-sync reconciles", Duration::from_secs(600), || async {
        (RECONCILES.load(Ordering::Relaxed) - r1 >= n as u64).then_some(())
    })
    .await;
    let in_sync = t1.elapsed().as_secs_f64();
    let sync_requests = requests.since(&before_sync);
    op.stop().await;

    let n_f = n as f64;
    Run {
        changed_seconds: changed,
        changed_per_second: n_f / changed,
        changed_reconciles,
        changed_writes_per_object: count(&changed_requests, WRITES) / n_f,
        changed_gets_per_object: count(&changed_requests, &["GET"]) / n_f,
        in_sync_seconds: in_sync,
        in_sync_per_second: n_f / in_sync,
        in_sync_writes: count(&sync_requests, WRITES),
        in_sync_gets: count(&sync_requests, &["GET"]),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Whether spans go to the OTLP exporter right now (tracing comparison only).
static EXPORTING: AtomicBool = AtomicBool::new(false);
static EXPORTED: AtomicU64 = AtomicU64::new(0);

/// An OTLP trace receiver that counts what it is sent.
struct CountingReceiver;

#[tonic::async_trait]
impl TraceService for CountingReceiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans: usize = request
            .into_inner()
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len())
            .sum();
        EXPORTED.fetch_add(spans as u64, Ordering::Relaxed);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// A receiver on a local port, and a tracer provider exporting to it in batches.
async fn otlp_pipeline() -> SdkTracerProvider {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(CountingReceiver))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(format!("http://127.0.0.1:{port}"))
        .build()
        .expect("exporter");
    SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .build()
}

fn main() {
    let n = env_usize("FLOTILLA_BENCH_N", 500);
    let runs = env_usize("FLOTILLA_BENCH_RUNS", 3);
    // FLOTILLA_BENCH_TRACING=compare alternates runs without and with the
    // OTLP exporter (a real receiver in this process), in one fleet, one run.
    let compare = std::env::var("FLOTILLA_BENCH_TRACING").is_ok_and(|v| v == "compare");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let provider = compare.then(|| rt.block_on(otlp_pipeline()));
    let otel = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("bench"))
            // The operator's own default levels, as `flotilla run` exports them.
            .with_filter(EnvFilter::new("info,kube=warn"))
            .with_filter(filter_fn(|_| EXPORTING.load(Ordering::Relaxed)))
    });
    let subscriber = tracing_subscriber::registry()
        .with(ReconcileCounter)
        .with(otel);
    tracing::subscriber::set_global_default(subscriber).expect("subscriber");
    let mut modes: Vec<bool> = Vec::new();
    let results: Vec<Run> = rt.block_on(async {
        let client = client(CLUSTER).await;
        ensure_crd(&client).await;
        // The operator's own client, whose requests are counted (watches excluded).
        let (op_client, requests) = counting_client(CLUSTER).await;
        let mut results = Vec::new();
        let total = if compare { 2 * runs } else { runs };
        for i in 0..total {
            let exporting = compare && i % 2 == 1;
            EXPORTING.store(exporting, Ordering::Relaxed);
            let r = one_run(&client, &op_client, &requests, n).await;
            eprintln!(
                "run {} (exporter {}): {r:?}",
                i + 1,
                if exporting { "on" } else { "off" }
            );
            modes.push(exporting);
            results.push(r);
        }
        results
    });
    if let Some(p) = provider {
        p.shutdown().ok();
        let pick = |on: bool, f: fn(&Run) -> f64| {
            median(
                results
                    .iter()
                    .zip(&modes)
                    .filter(|(_, m)| **m == on)
                    .map(|(r, _)| f(r))
                    .collect(),
            )
        };
        println!(
            "tracing overhead: {n} Microservices on {CLUSTER}, {runs} runs each, alternating (median)"
        );
        println!("  {:<40} {:>10} {:>10}", "", "off", "on");
        type Col = (&'static str, fn(&Run) -> f64);
        let cols: [Col; 2] = [
            ("changed: Microservices/s", |r| r.changed_per_second),
            ("in sync: reconciles/s", |r| r.in_sync_per_second),
        ];
        for (label, f) in cols {
            println!(
                "  {label:<40} {:>10.1} {:>10.1}",
                pick(false, f),
                pick(true, f)
            );
        }
        println!(
            "  spans received by the OTLP receiver: {}",
            EXPORTED.load(Ordering::Relaxed)
        );
        return;
    }
    let col = |f: fn(&Run) -> f64| {
        let v: Vec<f64> = results.iter().map(f).collect();
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, f64::MIN), |(l, h), x| (l.min(*x), h.max(*x)));
        (median(v), lo, hi)
    };
    type Row = (&'static str, fn(&Run) -> f64);
    let rows: [Row; 8] = [
        ("changed: seconds to all Reconciled", |r| r.changed_seconds),
        ("changed: Microservices/s", |r| r.changed_per_second),
        ("changed: reconciles run", |r| r.changed_reconciles as f64),
        ("changed: writes per Microservice", |r| {
            r.changed_writes_per_object
        }),
        ("changed: GETs per Microservice", |r| {
            r.changed_gets_per_object
        }),
        ("in sync: reconciles/s", |r| r.in_sync_per_second),
        ("in sync: writes (total)", |r| r.in_sync_writes),
        ("in sync: GETs (total)", |r| r.in_sync_gets),
    ];
    println!(
        "reconcile benchmark: {n} Microservices on {CLUSTER}, {runs} runs (median [min, max])"
    );
    for (label, f) in rows {
        let (m, lo, hi) = col(f);
        println!("  {label:<40} {m:>10.2}  [{lo:.2}, {hi:.2}]");
    }
    let rss = peak_rss_mib();
    println!("  {:<40} {rss:>10.1}", "peak RSS of the process (MiB)");
    let out = support::fleet_dir().join("bench");
    std::fs::create_dir_all(&out).expect("bench dir");
    let json = json!({"n": n, "runs": results, "peak_rss_mib": rss});
    std::fs::write(
        out.join("reconcile.json"),
        serde_json::to_vec_pretty(&json).expect("json"),
    )
    .expect("write");
}
