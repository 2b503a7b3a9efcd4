//! Workload failover figures (`make bench-failover-workload`): three
//! release-built replicas with the tests' 2 s Leases, FleetMicroservices
//! with `numberOfClusters`.
//!
//! - stop: FLOTILLA_BENCH_FAILOVER_TRIALS (10) trials of `numberOfClusters:
//!   2` of the 3 members at `unreachableAfter: 10s`; a chosen member's
//!   apiserver stopped, to the third running it Available (goal ≤ 10 s + 15 s);
//! - blips: FLOTILLA_BENCH_FAILOVER_BLIPS (20) holds of a chosen member's
//!   traffic (a loopback proxy that answers nothing) for 5 s, half of
//!   `unreachableAfter`: how many the placement saw, and how many failed
//!   over (goal 0);
//! - moved: FLOTILLA_BENCH_FAILOVER_OBJECTS (100) objects with
//!   `numberOfClusters: 3` over FLOTILLA_BENCH_FAILOVER_MEMBERS (50) real
//!   members; one member unregistered: how many objects moved, against how
//!   many were placed there (goal: only those). 0 members skips it.
//!
//! Results: `.fleet/bench/failover_workload.json`. The fleet is put back at 3 members.

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "common/mod.rs"]
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::{StreamExt, stream};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};
use tokio::time::Instant;

use common::{env_usize, write_json};
use flotilla::rollout::spec::{FleetMicroservice, Role, RolloutPhase};
use support::replicas::*;
use support::rollout::{done, fleet_microservice};
use support::{
    StoppedMember, client, ensure_crd, ensure_fleet_crd, eventually, fleet_cmd, from_json,
    percentile,
};

const WAIT: Duration = Duration::from_secs(180);

fn counted(name: &str, n: usize, unreachable_after: &str) -> FleetMicroservice {
    let mut m = fleet_microservice(name, "ghcr.io/acme/api:1", json!({}));
    m["spec"]["template"]["replicas"] = json!(0);
    m["spec"]["placement"] =
        json!({"numberOfClusters": n, "failover": {"unreachableAfter": unreachable_after}});
    from_json(m)
}

fn chosen(f: &FleetMicroservice) -> BTreeSet<String> {
    f.status
        .as_ref()
        .and_then(|s| s.placement.as_ref())
        .map(|p| {
            p.clusters
                .iter()
                .filter(|c| c.role == Role::Chosen)
                .map(|c| c.name.clone())
                .collect()
        })
        .unwrap_or_default()
}

async fn complete(api: &Api<FleetMicroservice>, name: &str) -> FleetMicroservice {
    eventually(&format!("{name} Complete"), WAIT, || {
        let api = api.clone();
        async move {
            let f = api.get(name).await.ok()?;
            let st = f.status.as_ref()?;
            (st.observed_generation == f.metadata.generation
                && st.phase == Some(RolloutPhase::Complete))
            .then_some(f)
        }
    })
    .await
}

async fn delete(api: &Api<FleetMicroservice>, name: &str) {
    api.delete(name, &DeleteParams::default()).await.ok();
    eventually(&format!("{name} deleted"), WAIT, || {
        let api = api.clone();
        async move { api.get_opt(name).await.ok()?.is_none().then_some(()) }
    })
    .await;
}

fn stamp(f: &FleetMicroservice) -> usize {
    f.status
        .as_ref()
        .and_then(|s| s.placement.as_ref())
        .map_or(0, |p| p.history.len())
}

async fn fleet3(
    prefix: &str,
    prepare: impl FnOnce(&mut Replicas),
) -> (Replicas, String, Vec<support::TestNamespace>, kube::Client) {
    let members = member_clients().await;
    let home = client("home").await;
    ensure_fleet_crd(&home).await;
    let (ns, guards) = namespaces(&members, prefix).await;
    let mut replicas = Replicas::new(&ns, &MEMBERS);
    prepare(&mut replicas);
    for id in REPLICA_IDS {
        replicas.start(id);
    }
    balanced(&members, &replicas.lease_name(), &REPLICA_IDS).await;
    (replicas, ns, guards, home)
}

async fn stop_trials(trials: usize) -> Value {
    let (replicas, ns, _guards, home) = fleet3("bench-fo-stop", |_| {}).await;
    let api: Api<FleetMicroservice> = Api::namespaced(home, &ns);
    let mut times = Vec::new();
    for t in 0..trials {
        let name = format!("api-{t}");
        api.create(&PostParams::default(), &counted(&name, 2, "10s"))
            .await
            .expect("create");
        let f = complete(&api, &name).await;
        let on = chosen(&f);
        let victim = *MEMBERS.iter().find(|m| on.contains(**m)).unwrap();
        let spare = *MEMBERS.iter().find(|m| !on.contains(**m)).unwrap();
        let good = f.status.unwrap().last_good_revision.unwrap();
        let spare_api: Api<flotilla::crd::Microservice> = Api::namespaced(client(spare).await, &ns);
        let at = Instant::now();
        let stopped = StoppedMember::stop(victim);
        eventually(&format!("trial {t}: {spare} runs {name}"), WAIT, || {
            let (spare_api, name, good) = (spare_api.clone(), name.clone(), good.clone());
            async move {
                let ms = spare_api.get_opt(&name).await.ok()??;
                let rev = ms
                    .metadata
                    .annotations
                    .as_ref()?
                    .get(flotilla::rollout::spec::REVISION_ANNOTATION)?;
                (rev == &good && done(&ms)).then_some(())
            }
        })
        .await;
        times.push(at.elapsed().as_secs_f64());
        println!(
            "trial {t}: {victim} stopped to {spare} Available: {:.2} s",
            times[t]
        );
        drop(stopped);
        complete(&api, &name).await;
        delete(&api, &name).await;
    }
    drop(replicas);
    times.sort_by(|a, b| a.total_cmp(b));
    json!({
        "trials": trials,
        "unreachable_after_s": 10,
        "p50_s": percentile(&times, 0.5),
        "p99_s": percentile(&times, 0.99),
        "max_s": times.last().copied().unwrap_or(f64::NAN),
        "all_s": times,
    })
}

async fn blips(count: usize) -> Value {
    let mut gates = BTreeMap::new();
    for m in MEMBERS {
        let upstream = support::kubeconfig_via(m, 0).1;
        gates.insert(m, support::gate::Gate::start(upstream).await);
    }
    let kubeconfigs: Vec<(&str, String)> = gates
        .iter()
        .map(|(m, g)| (*m, support::kubeconfig_via(m, g.port).0))
        .collect();
    let (replicas, ns, _guards, home) = fleet3("bench-fo-blips", |r| {
        for (m, kc) in &kubeconfigs {
            std::fs::write(r.dir.join(format!("{m}.yaml")), kc).expect("kubeconfig");
        }
    })
    .await;
    let api: Api<FleetMicroservice> = Api::namespaced(home, &ns);
    api.create(&PostParams::default(), &counted("api", 2, "10s"))
        .await
        .expect("create");
    let f = complete(&api, "api").await;
    let on = chosen(&f);
    let victim = *MEMBERS.iter().find(|m| on.contains(**m)).unwrap();
    let mut seen = 0;
    for _ in 0..count {
        gates[victim].hold();
        let until = Instant::now() + Duration::from_secs(5);
        let mut noticed = false;
        while Instant::now() < until {
            if let Ok(f) = api.get("api").await {
                noticed |= f
                    .status
                    .as_ref()
                    .and_then(|s| s.placement.as_ref())
                    .and_then(|p| p.clusters.iter().find(|c| c.name == victim))
                    .is_some_and(|c| c.unreachable_since.is_some());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        gates[victim].release();
        seen += usize::from(noticed);
        // Answering again before the next blip.
        eventually("answers again", WAIT, || {
            let api = api.clone();
            async move {
                let f = api.get("api").await.ok()?;
                let p = f.status?.placement?;
                let me = p.clusters.into_iter().find(|c| c.name == victim)?;
                me.unreachable_since.is_none().then_some(())
            }
        })
        .await;
    }
    let f = api.get("api").await.expect("api");
    let failovers = stamp(&f);
    delete(&api, "api").await;
    drop(replicas);
    json!({"blips": count, "held_s": 5, "unreachable_after_s": 10, "seen_unreachable": seen, "failovers": failovers})
}

async fn moved(members: usize, objects: usize) -> Value {
    fleet_cmd(&["up", "--clusters", &members.to_string()]);
    let names: Vec<String> = (1..=members).map(|i| format!("member-{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut clients = BTreeMap::new();
    for m in &refs {
        let c = client(m).await;
        ensure_crd(&c).await;
        clients.insert(*m, c);
    }
    let home = client("home").await;
    ensure_fleet_crd(&home).await;
    let (ns, _guards) = namespaces(&clients, "bench-fo-moved").await;
    let mut replicas = Replicas::new(&ns, &refs);
    // Lease timings as installed: the tests' are too tight at 50 members.
    replicas.election = Vec::new();
    for id in REPLICA_IDS {
        replicas.start(id);
    }
    let api: Api<FleetMicroservice> = Api::namespaced(home.clone(), &ns);
    let all: Vec<String> = (0..objects).map(|k| format!("svc-{k}")).collect();
    stream::iter(all.clone())
        .map(|n| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &counted(&n, 3, "60s"))
                    .await
                    .expect("create")
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    let placed = |api: Api<FleetMicroservice>| async move {
        let list = api.list(&ListParams::default()).await.ok()?;
        let done: BTreeMap<String, BTreeSet<String>> = list
            .items
            .iter()
            .filter(|f| {
                f.status.as_ref().is_some_and(|s| {
                    s.phase == Some(RolloutPhase::Complete) && chosen(f).len() == 3
                })
            })
            .map(|f| (f.metadata.name.clone().unwrap_or_default(), chosen(f)))
            .collect();
        Some(done)
    };
    let before = eventually(
        "every object Complete on 3",
        Duration::from_secs(900),
        || {
            let api = api.clone();
            async move { placed(api).await.filter(|d| d.len() == objects) }
        },
    )
    .await;
    let gone = "member-17";
    let there: BTreeSet<&String> = before
        .iter()
        .filter(|(_, c)| c.contains(gone))
        .map(|(n, _)| n)
        .collect();
    let at = Instant::now();
    std::fs::remove_file(replicas.dir.join(format!("{gone}.yaml"))).expect("unregister");
    let after = eventually("settled without it", Duration::from_secs(600), || {
        let api = api.clone();
        async move {
            placed(api)
                .await
                .filter(|d| d.len() == objects && d.values().all(|c| !c.contains(gone)))
        }
    })
    .await;
    let settle_s = at.elapsed().as_secs_f64();
    let changed: Vec<&String> = before
        .iter()
        .filter(|(n, c)| after.get(*n) != Some(c))
        .map(|(n, _)| n)
        .collect();
    let moved_elsewhere = changed.iter().filter(|n| !there.contains(**n)).count();
    let kept = changed
        .iter()
        .filter(|n| before[**n].intersection(&after[**n]).count() == 2)
        .count();
    api.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .ok();
    tokio::time::sleep(Duration::from_secs(20)).await;
    drop(replicas);
    json!({
        "members": members, "objects": objects, "number_of_clusters": 3,
        "removed": gone,
        "placed_there": there.len(),
        "moved": changed.len(),
        "moved_without_cause": moved_elsewhere,
        "moved_keeping_the_other_two": kept,
        "settled_s": settle_s,
    })
}

fn main() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let trials = env_usize("FLOTILLA_BENCH_FAILOVER_TRIALS", 10);
    let count = env_usize("FLOTILLA_BENCH_FAILOVER_BLIPS", 20);
    let members = env_usize("FLOTILLA_BENCH_FAILOVER_MEMBERS", 50);
    let objects = env_usize("FLOTILLA_BENCH_FAILOVER_OBJECTS", 100);
    let mut result = json!({});
    result["stop"] = rt.block_on(stop_trials(trials));
    println!("{}", result["stop"]);
    result["blips"] = rt.block_on(blips(count));
    println!("{}", result["blips"]);
    if members > 0 {
        result["moved"] = rt.block_on(moved(members, objects));
        fleet_cmd(&["up", "--clusters", "3"]);
    }
    write_json("failover_workload", &result);
    println!("{}", serde_json::to_string_pretty(&result).expect("json"));
}
