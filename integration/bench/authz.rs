//! What Kubernetes-native authorization costs (#34), on a running fleet
//! (`integration/fleet up`; `make bench-authz`). The product's server on a
//! loopback socket, fed an index directly (200 Microservices in one
//! namespace), with `--grpc-kube-auth` and a static read token, asking the
//! fleet's real home apiserver:
//!
//! 1. GetMicroservice under 16 tonic clients for FLOTILLA_BENCH_SECONDS
//!    (10): the static token, then a ServiceAccount token (reviews cached,
//!    200 names), with the reviews sent per second; then ghz on one name
//!    (`go install github.com/bojand/ghz/cmd/ghz@v0.121.0`), both tokens;
//! 2. the first call of a token never seen (a TokenReview and a
//!    SubjectAccessReview), 10 times;
//! 3. revocation: a RoleBinding deleted under an open watch of its
//!    namespace, 5 times: the home cluster's RBAC saying no, and the
//!    stream's end, each from the delete.

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::Client;

use flotilla::api::client::{ClientOptions, connect};
use flotilla::api::pb;
use flotilla::api::server::{RolloutSource, ServerOptions, bind, serve};
use flotilla::rollout::run::cache::RolloutCache;
use flotilla::status::hub::Hub;
use flotilla::status::view::{Facts, Reach};
use support::authz::{grant, revoke, rules, service_account, token, until_rbac_says};

const STATIC: &str = "bench-static-token";

fn hub(ns: &str, names: usize) -> Arc<Hub> {
    let hub = Hub::new("bench-authz");
    hub.update(|ix| {
        ix.registry_read();
        for c in ["member-1", "member-2", "member-3"] {
            ix.update_cluster(c, "file", |i| {
                i.reach = Reach::Reachable;
                i.synced = true;
            });
            for n in 0..names {
                let facts = Facts {
                    generation: 1,
                    observed_generation: 1,
                    image: format!("ghcr.io/acme/service-{n}:1"),
                    labels: BTreeMap::new(),
                    ..Default::default()
                };
                ix.upsert_microservice(c, (ns.into(), format!("service-{n:05}")), facts);
            }
        }
    });
    hub
}

async fn start(hub: Arc<Hub>, home: Client) -> String {
    let mut opts = ServerOptions::new("127.0.0.1:0".parse().unwrap());
    opts.insecure = true;
    opts.kube_auth = true;
    opts.token = Some(STATIC.into());
    let listener = bind(&opts).await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (cache, watches) = RolloutCache::start(
        home.clone(),
        Some("bench-none"),
        "bench",
        std::future::pending(),
    );
    tokio::spawn(watches);
    tokio::spawn(async move {
        let source = RolloutSource { cache, home };
        serve(hub, Some(source), opts, listener, std::future::pending())
            .await
            .unwrap();
    });
    url
}

async fn client(url: &str, token: &str) -> flotilla::api::client::Client {
    connect(&ClientOptions {
        server: url.into(),
        token: Some(token.into()),
        ..Default::default()
    })
    .await
    .unwrap()
}

fn get(ns: &str, n: usize) -> pb::GetMicroserviceRequest {
    pb::GetMicroserviceRequest {
        namespace: ns.into(),
        name: format!("service-{:05}", n % 200),
    }
}

/// TokenReviews and SubjectAccessReviews this process has sent.
fn reviews_sent() -> f64 {
    flotilla::telemetry::metrics::METRICS
        .encode()
        .lines()
        .filter(|l| l.starts_with("flotilla_authz_reviews_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// 16 clients calling GetMicroservice back to back: (p50 ms, p99 ms, req/s).
async fn load(url: &str, ns: &str, token: &str, seconds: u64) -> (f64, f64, f64) {
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for w in 0..16 {
        let mut c = client(url, token).await;
        let ns = ns.to_string();
        tasks.push(tokio::spawn(async move {
            let mut took = Vec::new();
            let mut n = w;
            while Instant::now() < until {
                let t0 = Instant::now();
                c.get_microservice(get(&ns, n)).await.expect("allowed");
                took.push(t0.elapsed().as_secs_f64() * 1e3);
                n += 16;
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
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let seconds = common::env_usize("FLOTILLA_BENCH_SECONDS", 10) as u64;
    let home = support::client("home").await;
    let ns_guard = support::TestNamespace::create(&home, "home", "bench-authz").await;
    let ns = ns_guard.name.clone();
    service_account(&home, &ns, "reader").await;
    let reading = rules(&["get", "list", "watch"], &[]);
    grant(&home, &ns, "reader", reading.clone(), (&ns, "reader")).await;
    until_rbac_says(&home, (&ns, "reader"), "get", "microservices", &ns, true).await;
    let url = start(hub(&ns, 200), home.clone()).await;
    let sa = token(&home, &ns, "reader").await;
    client(&url, &sa)
        .await
        .get_microservice(get(&ns, 0))
        .await
        .expect("warm");

    let fixed = load(&url, &ns, STATIC, seconds).await;
    println!(
        "GetMicroservice, static token, 16 clients: p50 {:.2} ms, p99 {:.2} ms, {:.0} req/s",
        fixed.0, fixed.1, fixed.2
    );
    let sent = reviews_sent();
    let kube = load(&url, &ns, &sa, seconds).await;
    let per_second = (reviews_sent() - sent) / seconds as f64;
    println!(
        "GetMicroservice, ServiceAccount token (reviews cached), 16 clients over 200 names: p50 {:.2} ms, p99 {:.2} ms, {:.0} req/s; {per_second:.1} reviews/s to the home apiserver",
        kube.0, kube.1, kube.2
    );
    // ghz, one name: the added latency per call with warm caches.
    for (what, t) in [
        ("static token", STATIC.to_string()),
        ("ServiceAccount token", sa.clone()),
    ] {
        let addr = url.trim_start_matches("http://").to_string();
        let data = serde_json::json!({"namespace": ns, "name": "service-00042"});
        let metadata = serde_json::json!({"authorization": format!("Bearer {t}")});
        let sent = reviews_sent();
        let (p50, p99, rps, errors) = tokio::task::spawn_blocking(move || {
            common::ghz::ghz_with(
                &addr,
                "GetMicroservice",
                data,
                seconds,
                None,
                Some(metadata),
            )
        })
        .await
        .unwrap();
        let per_second = (reviews_sent() - sent) / seconds as f64;
        println!(
            "ghz GetMicroservice, {what}, 16 clients: p50 {p50:.2} ms, p99 {p99:.2} ms, {rps:.0} req/s, {errors} errors; {per_second:.1} reviews/s"
        );
    }

    // A token never seen, once the right's cache has lapsed: both reviews.
    let mut first = Vec::new();
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(5200)).await;
        let fresh = token(&home, &ns, "reader").await;
        let mut c = client(&url, &fresh).await;
        let t0 = Instant::now();
        c.get_microservice(get(&ns, 1)).await.expect("allowed");
        first.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    println!(
        "first call of a new token (TokenReview + SubjectAccessReview), 10 calls: p50 {:.1} ms, max {:.1} ms",
        common::percentile(&first, 0.5),
        first.iter().cloned().fold(0.0, f64::max)
    );

    // Revocation under an open watch of the namespace.
    let (mut rbac, mut ended) = (Vec::new(), Vec::new());
    for i in 0..5 {
        let name = format!("watcher-{i}");
        service_account(&home, &ns, &name).await;
        grant(&home, &ns, &name, reading.clone(), (&ns, &name)).await;
        until_rbac_says(&home, (&ns, &name), "watch", "microservices", &ns, true).await;
        let t = token(&home, &ns, &name).await;
        let mut c = client(&url, &t).await;
        let request = pb::WatchMicroservicesRequest {
            namespace: ns.clone(),
            ..Default::default()
        };
        let mut stream = c.watch_microservices(request).await.unwrap().into_inner();
        stream.next().await.expect("open").expect("reset");
        revoke(&home, &ns, &name).await;
        let t0 = Instant::now();
        let ended_at = tokio::spawn(async move {
            loop {
                match tokio::time::timeout(Duration::from_secs(60), stream.next()).await {
                    Ok(Some(Ok(_))) => continue,
                    Ok(Some(Err(s))) => {
                        assert_eq!(s.code(), tonic::Code::PermissionDenied, "{s}");
                        return t0.elapsed();
                    }
                    other => panic!("the stream did not end: {other:?}"),
                }
            }
        });
        until_rbac_says(&home, (&ns, &name), "watch", "microservices", &ns, false).await;
        rbac.push(t0.elapsed().as_secs_f64());
        ended.push(ended_at.await.unwrap().as_secs_f64());
    }
    println!(
        "revocation, 5 trials (s from the RoleBinding's delete): home RBAC says no {:.2?}; the watch ends {:.2?}",
        rbac, ended
    );
}
