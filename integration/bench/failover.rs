//! Failover figures (`make bench-failover`, fleet up): three release-built
//! replicas over three members, with LeaseDuration 2s, RenewDeadline 1.5s
//! and RetryPeriod 300ms. Each trial kills (SIGKILL, or SIGTERM) the replica
//! that leads member-1 right after changing a Microservice there, and times:
//! - until member-1's Lease names another holder;
//! - until the change reaches the Deployment (the next successful write).
//!
//! It also counts Lease writes per member from the audit log, and reads the
//! replicas' resident memory.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use support::replicas::*;
use support::{eventually, fleet_dir, from_json, wait_all_true};
use tokio::time::Instant;

use flotilla::crd::Microservice;

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

fn lease_writes(cluster: &str, lease: &str) -> usize {
    let path = fleet_dir()
        .join("logs")
        .join(format!("{cluster}-audit.log"));
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            l.contains("\"resource\":\"leases\"") && l.contains(&format!("\"name\":\"{lease}\""))
        })
        .count()
}

fn main() {
    let trials: usize = std::env::var("FLOTILLA_BENCH_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async move {
        let clients = member_clients().await;
        let (ns, _guards) = namespaces(&clients, "bench-failover").await;
        let mut replicas = Replicas::new(&ns, &MEMBERS);
        for id in ["r1", "r2", "r3"] {
            replicas.start(id);
        }
        let lease = replicas.lease_name();
        balanced(&clients, &lease, &["r1", "r2", "r3"]).await;
        let m1 = clients["member-1"].clone();
        let api = Api::<Microservice>::namespaced(m1.clone(), &ns);
        let deployments = Api::<Deployment>::namespaced(m1.clone(), &ns);
        let ms: Microservice = from_json(json!({
            "apiVersion": "platform.example.io/v1alpha1", "kind": "Microservice",
            "metadata": {"name": "probe"}, "spec": {"image": "ghcr.io/acme/probe:0", "port": 8080, "replicas": 1},
        }));
        api.create(&PostParams::default(), &ms).await.expect("create probe");
        wait_all_true(&api, 1, "Reconciled", Duration::from_secs(60)).await;

        // Lease write rate in a steady window.
        let before = lease_writes("member-1", &lease);
        tokio::time::sleep(Duration::from_secs(10)).await;
        let lease_rate = (lease_writes("member-1", &lease) - before) as f64 / 10.0;
        let rss: Vec<f64> = replicas.pids().into_iter().map(rss_mib).collect();

        let mut results: Vec<(&str, Vec<f64>, Vec<f64>)> = Vec::new();
        let mut tag = 0;
        for kind in ["SIGKILL", "SIGTERM"] {
            let (mut to_leader, mut to_write) = (Vec::new(), Vec::new());
            for _ in 0..trials {
                let held = balanced(&clients, &lease, &["r1", "r2", "r3"]).await;
                let victim = held["member-1"].clone();
                tag += 1;
                let image = format!("ghcr.io/acme/probe:{tag}");
                let t0 = Instant::now();
                if kind == "SIGKILL" {
                    replicas.kill_9(&victim);
                } else {
                    let mut child = replicas.sigterm(&victim);
                    tokio::task::spawn_blocking(move || child.wait()).await.ok();
                }
                api.patch("probe", &PatchParams::default(), &Patch::Merge(json!({"spec": {"image": image}})))
                    .await
                    .expect("patch");
                eventually("new leader", Duration::from_secs(30), || async {
                    holder(&m1, &lease).await.filter(|h| *h != victim)
                })
                .await;
                to_leader.push(t0.elapsed().as_secs_f64());
                eventually("change applied", Duration::from_secs(30), || async {
                    let d = deployments.get("probe").await.ok()?;
                    let img = d.spec?.template.spec?.containers.first()?.image.clone()?;
                    (img == image).then_some(())
                })
                .await;
                to_write.push(t0.elapsed().as_secs_f64());
                replicas.start(&victim);
            }
            eprintln!("{kind}: to leader {to_leader:?}, to write {to_write:?}");
            results.push((kind, to_leader, to_write));
        }

        println!("failover benchmark: 3 replicas, 3 members, LeaseDuration 2s, RenewDeadline 1.5s, RetryPeriod 300ms, {trials} trials each (median [min, max], seconds)");
        for (kind, leader, write) in &results {
            let (m, lo, hi) = median(leader.clone());
            println!("  {kind:<8} new leader of member-1      {m:>6.2}  [{lo:.2}, {hi:.2}]");
            let (m, lo, hi) = median(write.clone());
            println!("  {kind:<8} next successful write       {m:>6.2}  [{lo:.2}, {hi:.2}]");
        }
        println!("  Lease writes per member per second (steady)  {lease_rate:.2}");
        println!("  replica RSS at idle (MiB)                    {rss:.1?}");
        let out = fleet_dir().join("bench");
        std::fs::create_dir_all(&out).expect("bench dir");
        let json = json!({
            "trials": trials,
            "results": results.iter().map(|(k, l, w)| json!({"kind": k, "to_leader": l, "to_write": w})).collect::<Vec<_>>(),
            "lease_writes_per_second": lease_rate,
            "replica_rss_mib": rss,
        });
        std::fs::write(out.join("failover.json"), serde_json::to_vec_pretty(&json).expect("json")).expect("write");
    });
}
