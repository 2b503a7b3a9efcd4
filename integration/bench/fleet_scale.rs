//! Fleet-scale figures (`make bench-fleet`, fleet up): four release-built
//! replicas over three members, N Microservices (1 replica each) per member.
//! Three replicas lead one member each; the fourth leads none, so its memory
//! is the status index and watch feeds alone. It reports:
//! - time until every Microservice is done in every member, via the API;
//! - each replica's RSS and idle CPU once everything has settled;
//! - GetMicroservice and ListMicroservices latency and throughput with 16
//!   concurrent clients;
//! - latency from a spec change in a member to the Watch event.

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "common/mod.rs"]
mod common;

use std::time::Duration;

use futures::{StreamExt, stream};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use support::replicas::*;
use support::{eventually, microservice};

use common::{Spread, cpu_seconds, env_usize, namespace_gone, percentile, rss_mib, write_json};
use tokio::time::Instant;

use flotilla::api::client::{Client as GrpcClient, ClientOptions, connect};
use flotilla::api::pb;
use flotilla::crd::Microservice;

async fn done_count(client: &mut GrpcClient, ns: &str) -> (usize, usize) {
    let (mut done, mut total, mut token) = (0, 0, String::new());
    loop {
        let Ok(r) = client
            .list_microservices(pb::ListMicroservicesRequest {
                namespace: ns.into(),
                page_size: 1000,
                page_token: token.clone(),
                ..Default::default()
            })
            .await
        else {
            return (0, 0);
        };
        let r = r.into_inner();
        for m in &r.items {
            let a = m.aggregate.clone().unwrap_or_default();
            done += a.done as usize;
            total += a.clusters as usize;
        }
        if r.next_page_token.is_empty() {
            return (done, total);
        }
        token = r.next_page_token;
    }
}

/// 16 clients calling `call` for `window`; latencies in ms and calls/s.
async fn hammer<F, Fut>(client: &GrpcClient, window: Duration, call: F) -> (Vec<f64>, f64)
where
    F: Fn(GrpcClient, usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let start = Instant::now();
    let tasks: Vec<_> = (0..16)
        .map(|w| {
            let (client, call) = (client.clone(), call.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut i = w;
                while start.elapsed() < window {
                    let t = Instant::now();
                    call(client.clone(), i).await;
                    lat.push(t.elapsed().as_secs_f64() * 1000.0);
                    i += 16;
                }
                lat
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("worker"));
    }
    let rate = all.len() as f64 / start.elapsed().as_secs_f64();
    (all, rate)
}

/// One run: a fresh namespace in every member, four replicas, N objects each.
async fn run(n: usize) -> serde_json::Value {
    {
        let clients = member_clients().await;
        let (ns, guards) = namespaces(&clients, "bench-fleet").await;
        let mut replicas = Replicas::new(&ns, &MEMBERS);
        let ids = ["r1", "r2", "r3", "r4"];
        for id in ids {
            replicas.start(id);
        }
        let held = balanced(&clients, &replicas.lease_name(), &ids).await;
        let idle = ids
            .iter()
            .find(|id| !held.values().any(|h| h == *id))
            .unwrap()
            .to_string();
        let pids: Vec<(String, u32)> = ids
            .iter()
            .map(|id| id.to_string())
            .zip(replicas.pids())
            .collect();
        let url = replicas.grpc_url(&idle);
        let mut client = eventually("gRPC up", Duration::from_secs(30), || async {
            connect(&ClientOptions {
                server: url.clone(),
                ..Default::default()
            })
            .await
            .ok()
        })
        .await;
        let idle_pid = pids.iter().find(|(id, _)| *id == idle).unwrap().1;
        let rss_empty = rss_mib(idle_pid);

        // Convergence.
        let t0 = Instant::now();
        let creates = MEMBERS.iter().flat_map(|m| (0..n).map(move |i| (*m, i)));
        stream::iter(creates)
            .for_each_concurrent(32, |(m, i)| {
                let api = Api::<Microservice>::namespaced(clients[m].clone(), &ns);
                async move {
                    api.create(
                        &PostParams::default(),
                        &microservice(&format!("svc-{i:04}"), "ghcr.io/acme/svc:1", 8080, Some(1)),
                    )
                    .await
                    .expect("create");
                }
            })
            .await;
        let created = t0.elapsed().as_secs_f64();
        let want = 3 * n;
        loop {
            let (done, total) = done_count(&mut client, &ns).await;
            if done == want && total == want {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(900),
                "not converged: {done}/{want}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let converged = t0.elapsed().as_secs_f64();
        eprintln!("all {want} done after {converged:.1}s (created in {created:.1}s)");

        // Settle, then memory and idle CPU.
        tokio::time::sleep(Duration::from_secs(10)).await;
        let cpu0: Vec<f64> = pids.iter().map(|(_, p)| cpu_seconds(*p)).collect();
        tokio::time::sleep(Duration::from_secs(20)).await;
        let idle_cpu: Vec<f64> = pids
            .iter()
            .zip(cpu0)
            .map(|((_, p), c)| (cpu_seconds(*p) - c) / 20.0 * 100.0)
            .collect();
        let rss: Vec<(String, f64)> = pids
            .iter()
            .map(|(id, p)| (id.clone(), rss_mib(*p)))
            .collect();
        let rss_full = rss_mib(idle_pid);

        // Unary latency and throughput.
        let ns_get = ns.clone();
        let (get_lat, get_rate) = hammer(&client, Duration::from_secs(10), move |mut c, i| {
            let ns = ns_get.clone();
            async move {
                c.get_microservice(pb::GetMicroserviceRequest {
                    namespace: ns,
                    name: format!("svc-{:04}", i % n),
                })
                .await
                .expect("get");
            }
        })
        .await;
        let ns_list = ns.clone();
        let (list_lat, list_rate) = hammer(&client, Duration::from_secs(10), move |mut c, _| {
            let ns = ns_list.clone();
            async move {
                c.list_microservices(pb::ListMicroservicesRequest {
                    namespace: ns,
                    page_size: 100,
                    ..Default::default()
                })
                .await
                .expect("list");
            }
        })
        .await;

        // Change-to-Watch-event latency.
        let mut watch = client
            .watch_microservices(pb::WatchMicroservicesRequest {
                namespace: ns.clone(),
                ..Default::default()
            })
            .await
            .expect("watch")
            .into_inner();
        while let Some(e) = watch.next().await {
            if e.expect("event").r#type == pb::WatchEventType::Synced as i32 {
                break;
            }
        }
        let mut watch_lat = Vec::new();
        for k in 0..60 {
            let m = MEMBERS[k % 3];
            let name = format!("svc-{:04}", k % n);
            let image = format!("ghcr.io/acme/svc:w{k}");
            let api = Api::<Microservice>::namespaced(clients[m].clone(), &ns);
            let t = Instant::now();
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"image": image}})),
            )
            .await
            .expect("patch");
            loop {
                let e = tokio::time::timeout(Duration::from_secs(30), watch.next())
                    .await
                    .expect("event in time")
                    .expect("open")
                    .expect("event");
                let hit = e.microservice.is_some_and(|ms| {
                    ms.name == name
                        && ms
                            .clusters
                            .iter()
                            .any(|c| c.cluster == m && c.image == image)
                });
                if hit {
                    watch_lat.push(t.elapsed().as_secs_f64() * 1000.0);
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }

        let index_mib = rss_full - rss_empty;
        let leaders: Vec<f64> = rss
            .iter()
            .filter(|(id, _)| *id != idle)
            .map(|(_, m)| *m)
            .collect();
        let idle_rss = rss
            .iter()
            .find(|(id, _)| *id == idle)
            .map(|(_, m)| *m)
            .unwrap_or(f64::NAN);
        let leader_cpu: Vec<f64> = pids
            .iter()
            .zip(&idle_cpu)
            .filter(|((id, _), _)| *id != idle)
            .map(|(_, c)| *c)
            .collect();
        let run = json!({
            "objects_per_member": n, "created_s": created, "converged_s": converged,
            "leader_rss_mib": leaders, "idle_replica_rss_mib": idle_rss,
            "leader_idle_cpu_percent": leader_cpu, "index_mib": index_mib,
            "index_kib_per_entry": index_mib * 1024.0 / want as f64,
            "get": {"p50_ms": percentile(&get_lat, 0.5), "p99_ms": percentile(&get_lat, 0.99), "rps": get_rate},
            "list": {"p50_ms": percentile(&list_lat, 0.5), "p99_ms": percentile(&list_lat, 0.99), "rps": list_rate},
            "watch": {"p50_ms": percentile(&watch_lat, 0.5), "p99_ms": percentile(&watch_lat, 0.99), "changes": watch_lat.len()},
        });
        eprintln!("{run}");
        drop(replicas);
        drop(guards);
        for c in clients.values() {
            namespace_gone(c, &ns).await;
        }
        run
    }
}

fn main() {
    let n = env_usize("FLOTILLA_BENCH_OBJECTS", 500);
    let runs = env_usize("FLOTILLA_BENCH_FLEET_RUNS", 2);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let results: Vec<serde_json::Value> = rt.block_on(async {
        let mut out = Vec::new();
        for _ in 0..runs {
            out.push(run(n).await);
        }
        out
    });
    let col = |f: &dyn Fn(&serde_json::Value) -> Vec<f64>| {
        Spread::of(&results.iter().flat_map(f).collect::<Vec<_>>())
    };
    let one = |path: &'static str| {
        move |r: &serde_json::Value| {
            vec![r.pointer(path).and_then(|v| v.as_f64()).unwrap_or(f64::NAN)]
        }
    };
    let many = |key: &'static str| {
        move |r: &serde_json::Value| {
            r[key]
                .as_array()
                .map(|a| a.iter().filter_map(|v| v.as_f64()).collect())
                .unwrap_or_default()
        }
    };
    let summary = json!({
        "converged_s": col(&one("/converged_s")),
        "leader_rss_mib": col(&many("leader_rss_mib")),
        "idle_replica_rss_mib": col(&one("/idle_replica_rss_mib")),
        "leader_idle_cpu_percent": col(&many("leader_idle_cpu_percent")),
        "index_kib_per_entry": col(&one("/index_kib_per_entry")),
        "get_p50_ms": col(&one("/get/p50_ms")), "get_p99_ms": col(&one("/get/p99_ms")), "get_rps": col(&one("/get/rps")),
        "list_p50_ms": col(&one("/list/p50_ms")), "list_p99_ms": col(&one("/list/p99_ms")), "list_rps": col(&one("/list/rps")),
        "watch_p50_ms": col(&one("/watch/p50_ms")), "watch_p99_ms": col(&one("/watch/p99_ms")),
    });
    let get = |k: &str| -> Spread { serde_json::from_value(summary[k].clone()).expect("spread") };
    println!(
        "fleet scale: 4 replicas (release; 3 lead a member, 1 leads none), 3 members x {n} Microservices, 1 pod each, {runs} runs (median [min, max])"
    );
    println!(
        "  all {} observed and Available (s)        {:.1}",
        3 * n,
        get("converged_s")
    );
    println!(
        "  RSS of a replica leading a member (MiB)   {:.1}",
        get("leader_rss_mib")
    );
    println!(
        "  RSS of the replica leading none (MiB)     {:.1}",
        get("idle_replica_rss_mib")
    );
    println!(
        "  idle CPU of a leader (% of a core)        {:.2}",
        get("leader_idle_cpu_percent")
    );
    println!(
        "  status index per entry (KiB)              {:.1}",
        get("index_kib_per_entry")
    );
    println!(
        "  GetMicroservice, 16 clients   p50 (ms) {:.1}  p99 (ms) {:.1}  req/s {:.0}",
        get("get_p50_ms"),
        get("get_p99_ms"),
        get("get_rps")
    );
    println!(
        "  ListMicroservices (page 100)  p50 (ms) {:.1}  p99 (ms) {:.1}  req/s {:.0}",
        get("list_p50_ms"),
        get("list_p99_ms"),
        get("list_rps")
    );
    println!(
        "  change in a member to Watch   p50 (ms) {:.1}  p99 (ms) {:.1}",
        get("watch_p50_ms"),
        get("watch_p99_ms")
    );
    write_json(
        "fleet_scale",
        &json!({"objects_per_member": n, "runs": results, "summary": summary}),
    );
}
