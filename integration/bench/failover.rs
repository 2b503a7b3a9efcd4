//! Failover drills (`make bench`, fleet up): three release-built replicas
//! over three members, with LeaseDuration 2s, RenewDeadline 1.5s and
//! RetryPeriod 300ms, FLOTILLA_BENCH_FAILOVER_TRIALS (10) trials of each:
//! - SIGKILL, then SIGTERM, of the replica that leads member-1, right after a
//!   Microservice there changed: time until member-1's Lease names another
//!   holder, and until the change reaches the Deployment (the next write);
//! - a fourth replica joins and then leaves (SIGTERM): for the cluster that
//!   moves each way, the time from the old holder's last renewal to the new
//!   holder's acquisition, from the apiserver's audit log (the handoff
//!   through the Lease, with no lease duration waited out);
//! - member-2's apiserver stopped: change-to-applied latency in member-1 and
//!   member-3 (5 changes/s for 10 s) during the outage, against the same
//!   measure taken just before it.
//!
//! Every drill starts from a settled fleet: each member led by the replica
//! the assignment names.
//!
//! It also counts Lease writes per member from the audit log, and reads the
//! replicas' resident memory.

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "common/mod.rs"]
mod common;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use support::replicas::*;
use support::{StoppedMember, eventually, fleet_dir, from_json, microservice, wait_all_true};
use tokio::time::Instant;

use common::latency::{Latency, Observed, Target, drive, no_pods, settle};
use common::sample::microservice_resource;
use common::{Spread, env_usize, rss_mib, write_json};
use flotilla::crd::Microservice;

/// Objects changed per healthy member in the outage drill.
const OUTAGE_OBJECTS: usize = 5;
const OUTAGE_RATE: f64 = 5.0;
const OUTAGE_WINDOW: Duration = Duration::from_secs(10);

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

/// Milliseconds from the previous holder's last renewal to `to`'s first
/// acquisition of the member's Lease after `since`, on the apiserver's
/// clock; `None` when there is no such acquisition.
fn handoff_ms(member: &str, lease: &str, since: jiff::Timestamp, to: &str) -> Option<f64> {
    let writes = support::lease_writes(member, LEASE_NAMESPACE, lease);
    let acquired = writes
        .iter()
        .position(|w| w.received >= since && w.holder == to && w.writer == to)?;
    let last = writes[..acquired]
        .iter()
        .rev()
        .find(|w| !w.holder.is_empty() && w.holder == w.writer)?;
    Some(
        writes[acquired]
            .received
            .duration_since(last.received)
            .as_secs_f64()
            * 1000.0,
    )
}

/// Waits until every member is led by the replica the assignment names,
/// so that a drill never starts while a restarted replica is still being
/// handed its clusters back.
async fn settled(
    clients: &std::collections::BTreeMap<&str, kube::Client>,
    lease: &str,
) -> std::collections::BTreeMap<String, String> {
    let clusters = MEMBERS.iter().map(|m| m.to_string()).collect();
    let live = REPLICA_IDS.iter().map(|r| r.to_string()).collect();
    let want: std::collections::BTreeMap<String, String> =
        flotilla::fleet::shard::assign(&clusters, &live)
            .into_iter()
            .map(|(c, r)| (c, r.to_string()))
            .collect();
    eventually(
        "every member led by its owner",
        Duration::from_secs(60),
        || async {
            let held = holders(clients, lease).await;
            let now: std::collections::BTreeMap<String, String> = held
                .into_iter()
                .filter_map(|(m, h)| h.map(|h| (m, h)))
                .collect();
            (now == want).then_some(now)
        },
    )
    .await
}

fn main() {
    let trials = env_usize("FLOTILLA_BENCH_FAILOVER_TRIALS", 10);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async move {
        let clients = member_clients().await;
        let (ns, _guards) = namespaces(&clients, "bench-failover").await;
        let mut replicas = Replicas::new(&ns, &MEMBERS);
        for id in REPLICA_IDS {
            replicas.start(id);
        }
        let lease = replicas.lease_name();
        balanced(&clients, &lease, &REPLICA_IDS).await;
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

        let mut kills = Vec::new();
        let mut tag = 0;
        for kind in ["SIGKILL", "SIGTERM"] {
            let (mut to_leader, mut to_write) = (Vec::new(), Vec::new());
            for _ in 0..trials {
                let held = settled(&clients, &lease).await;
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
            kills.push((kind, to_leader, to_write));
        }

        // Join and leave: the moved cluster's handoff, from the audit log.
        let (joiner, moved) = joiner_taking_one_member();
        let mc = clients[moved.as_str()].clone();
        let (mut joins, mut leaves) = (Vec::new(), Vec::new());
        for _ in 0..trials {
            settled(&clients, &lease).await;
            let since = jiff::Timestamp::now();
            replicas.start(&joiner);
            eventually("the joiner leading", Duration::from_secs(30), || async {
                (holder(&mc, &lease).await? == joiner).then_some(())
            })
            .await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            joins.extend(handoff_ms(&moved, &lease, since, &joiner));
            let since = jiff::Timestamp::now();
            let mut child = replicas.sigterm(&joiner);
            tokio::task::spawn_blocking(move || child.wait()).await.ok();
            let back = eventually("the cluster led again", Duration::from_secs(30), || async {
                holder(&mc, &lease).await.filter(|h| *h != joiner)
            })
            .await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            leaves.extend(handoff_ms(&moved, &lease, since, &back));
        }
        eprintln!("handoff on join {joins:?} ms, on leave {leaves:?} ms");

        // Member outage: the healthy members' latency, before and during.
        let healthy = ["member-1", "member-3"];
        let mut targets = Vec::new();
        for m in healthy {
            no_pods(&clients[m], &ns).await;
            let objects = Api::<Microservice>::namespaced(clients[m].clone(), &ns);
            for i in 0..OUTAGE_OBJECTS {
                let name = format!("lat-{i}");
                objects
                    .create(&PostParams::default(), &microservice(&name, "ghcr.io/acme/lat:1", 8080, Some(1)))
                    .await
                    .expect("create");
                targets.push(Target {
                    cluster: m.to_string(),
                    api: Api::namespaced_with(clients[m].clone(), &ns, &microservice_resource()),
                    name,
                });
            }
            wait_all_true(&objects, OUTAGE_OBJECTS + usize::from(m == "member-1"), "Reconciled", Duration::from_secs(60)).await;
        }
        let members: Vec<(String, kube::Client)> =
            healthy.iter().map(|m| (m.to_string(), clients[m].clone())).collect();
        let observed = Observed::start(&members, &ns).await;
        let mut values = vec![1i64; targets.len()];
        let (mut baseline, mut outage): (Vec<Latency>, Vec<Latency>) = (Vec::new(), Vec::new());
        for t in 0..trials {
            balanced(&clients, &lease, &REPLICA_IDS).await;
            let (changes, refused) = drive(&targets, &mut values, OUTAGE_RATE, OUTAGE_WINDOW).await;
            baseline.push(settle(&observed, &changes, refused, Duration::from_secs(60)).await);
            let stopped = StoppedMember::stop("member-2");
            let (changes, refused) = drive(&targets, &mut values, OUTAGE_RATE, OUTAGE_WINDOW).await;
            outage.push(settle(&observed, &changes, refused, Duration::from_secs(60)).await);
            drop(stopped);
            eprintln!("outage {t}: before {:?}, during {:?}", baseline[t], outage[t]);
        }

        println!("failover drills: 3 replicas, 3 members, LeaseDuration 2s, RenewDeadline 1.5s, RetryPeriod 300ms, {trials} trials each (median [min, max])");
        let mut kill_json = Vec::new();
        for (kind, leader, write) in &kills {
            let (l, w) = (Spread::of(leader), Spread::of(write));
            println!("  {kind:<8} new leader of member-1 (s)           {l:.2}");
            println!("  {kind:<8} next successful write (s)            {w:.2}");
            kill_json.push(json!({"kind": kind, "to_leader_s": l, "to_write_s": w, "to_leader": leader, "to_write": write}));
        }
        let p99 = |v: &[Latency]| Spread::of(&v.iter().map(|l| l.p99_ms).collect::<Vec<_>>());
        let p50 = |v: &[Latency]| Spread::of(&v.iter().map(|l| l.p50_ms).collect::<Vec<_>>());
        let applied = |v: &[Latency]| format!("{}/{}", v.iter().map(|l| l.applied).sum::<usize>(), v.iter().map(|l| l.changes).sum::<usize>());
        println!("  member-2 down: member-1 and member-3 change-to-applied, {OUTAGE_RATE} changes/s for {}s per phase", OUTAGE_WINDOW.as_secs());
        println!("    baseline  p50 (ms) {:.0}   p99 (ms) {:.0}   applied {}", p50(&baseline), p99(&baseline), applied(&baseline));
        println!("    outage    p50 (ms) {:.0}   p99 (ms) {:.0}   applied {}", p50(&outage), p99(&outage), applied(&outage));
        println!("  handoff on join (ms)                         {:.0}", Spread::of(&joins));
        println!("  handoff on leave (ms)                        {:.0}", Spread::of(&leaves));
        println!("  Lease writes per member per second (steady)  {lease_rate:.2}");
        println!("  replica RSS at idle (MiB)                    {rss:.1?}");
        write_json("failover", &json!({
            "trials": trials,
            "kills": kill_json,
            "outage": {
                "baseline_p50_ms": p50(&baseline), "baseline_p99_ms": p99(&baseline),
                "outage_p50_ms": p50(&outage), "outage_p99_ms": p99(&outage),
                "baseline": baseline, "during": outage,
            },
            "handoff_join_ms": Spread::of(&joins), "handoff_leave_ms": Spread::of(&leaves),
            "handoff_join": joins, "handoff_leave": leaves,
            "lease_writes_per_second": lease_rate,
            "replica_rss_mib": rss,
        }));
    });
}
