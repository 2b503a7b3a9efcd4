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

use std::time::Duration;

use futures::{StreamExt, stream};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use support::replicas::*;
use support::{eventually, fleet_dir, microservice};
use tokio::time::Instant;

use flotilla::api::client::{Client as GrpcClient, ClientOptions, connect};
use flotilla::api::pb;
use flotilla::crd::Microservice;

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn proc_status(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

/// utime + stime, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    ticks / 100.0
}

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

fn main() {
    let n: usize = std::env::var("FLOTILLA_BENCH_OBJECTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async move {
        let clients = member_clients().await;
        let (ns, _guards) = namespaces(&clients, "bench-fleet").await;
        let mut replicas = Replicas::new(&ns, &MEMBERS);
        let ids = ["r1", "r2", "r3", "r4"];
        for id in ids {
            replicas.start(id);
        }
        let held = balanced(&clients, &replicas.lease_name(), &ids).await;
        let idle = ids.iter().find(|id| !held.values().any(|h| h == *id)).unwrap().to_string();
        let pids: Vec<(String, u32)> = ids
            .iter()
            .map(|id| id.to_string())
            .zip(replicas.pids())
            .collect();
        let url = replicas.grpc_url(&idle);
        let mut client = eventually("gRPC up", Duration::from_secs(30), || async {
            connect(&ClientOptions { server: url.clone(), ..Default::default() }).await.ok()
        })
        .await;
        let idle_pid = pids.iter().find(|(id, _)| *id == idle).unwrap().1;
        let rss_empty = proc_status(idle_pid, "VmRSS:");

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
            assert!(t0.elapsed() < Duration::from_secs(900), "not converged: {done}/{want}");
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
        let rss: Vec<(String, f64)> = pids.iter().map(|(id, p)| (id.clone(), proc_status(*p, "VmRSS:"))).collect();
        let rss_full = proc_status(idle_pid, "VmRSS:");

        // Unary latency and throughput.
        let ns_get = ns.clone();
        let (mut get_lat, get_rate) = hammer(&client, Duration::from_secs(10), move |mut c, i| {
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
        let (mut list_lat, list_rate) = hammer(&client, Duration::from_secs(10), move |mut c, _| {
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
            .watch_microservices(pb::WatchMicroservicesRequest { namespace: ns.clone(), ..Default::default() })
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
            let name = format!("svc-{:04}", k);
            let image = format!("ghcr.io/acme/svc:w{k}");
            let api = Api::<Microservice>::namespaced(clients[m].clone(), &ns);
            let t = Instant::now();
            api.patch(&name, &PatchParams::default(), &Patch::Merge(json!({"spec": {"image": image}})))
                .await
                .expect("patch");
            loop {
                let e = tokio::time::timeout(Duration::from_secs(30), watch.next())
                    .await
                    .expect("event in time")
                    .expect("open")
                    .expect("event");
                let hit = e.microservice.is_some_and(|ms| {
                    ms.name == name && ms.clusters.iter().any(|c| c.cluster == m && c.image == image)
                });
                if hit {
                    watch_lat.push(t.elapsed().as_secs_f64() * 1000.0);
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }

        let index_mib = rss_full - rss_empty;
        println!("fleet-scale benchmark: 4 replicas (release), 3 members x {n} Microservices, 1 pod each");
        println!("  created {want} in {created:.1}s; all done (observed + Available) after {converged:.1}s");
        for (id, mib) in &rss {
            let role = if *id == idle { "leads nothing" } else { "leads one member" };
            println!("  RSS {id} ({role}): {mib:.1} MiB");
        }
        println!("  idle CPU per replica (% of one core): {idle_cpu:.2?}");
        println!("  index + feeds on the idle replica: {index_mib:.1} MiB for {want} entries ({:.1} KiB each)", index_mib * 1024.0 / want as f64);
        let (g50, g99) = (percentile(&mut get_lat, 0.5), percentile(&mut get_lat, 0.99));
        let (l50, l99) = (percentile(&mut list_lat, 0.5), percentile(&mut list_lat, 0.99));
        let (w50, w99) = (percentile(&mut watch_lat, 0.5), percentile(&mut watch_lat, 0.99));
        println!("  GetMicroservice, 16 clients: p50 {g50:.2} ms, p99 {g99:.2} ms, {get_rate:.0} req/s");
        println!("  ListMicroservices (page 100), 16 clients: p50 {l50:.2} ms, p99 {l99:.2} ms, {list_rate:.0} req/s");
        println!("  change in a member to Watch event: p50 {w50:.1} ms, p99 {w99:.1} ms ({} changes)", watch_lat.len());
        let out = fleet_dir().join("bench");
        std::fs::create_dir_all(&out).expect("bench dir");
        let json = json!({
            "objects_per_member": n, "created_s": created, "converged_s": converged,
            "rss_mib": rss, "idle_cpu_percent": idle_cpu, "index_mib": index_mib,
            "get": {"p50_ms": g50, "p99_ms": g99, "rps": get_rate},
            "list": {"p50_ms": l50, "p99_ms": l99, "rps": list_rate},
            "watch": {"p50_ms": w50, "p99_ms": w99},
        });
        std::fs::write(out.join("fleet_scale.json"), serde_json::to_vec_pretty(&json).expect("json")).expect("write");
    });
}
