//! Change-to-applied latency, side by side (`make bench`, fleet up).
//!
//! Each trial, for each controller in turn (alternating which goes first):
//! 60 objects per member in a fresh namespace of each of the three members,
//! then 25 spec changes per second for 60 s, round robin over all of them,
//! each timed until the member's Deployment shows it (see `common::latency`).
//! Flotilla runs as three replicas, one leading each member; sample-controller,
//! which serves one cluster, runs as one process per member. Both at their
//! default client limits, Flotilla with its default Lease timings. A ResourceQuota of zero pods keeps the Deployments
//! from making pods, so the figure is the controller's and not the pod churn's.
//!
//! Foo allows 1 to 10 replicas, and every change raises them by one, so the
//! objects are many enough for each to change at most 9 times.
//!
//! FLOTILLA_BENCH_TRIALS (3), FLOTILLA_BENCH_LATENCY_OBJECTS (60 per member),
//! FLOTILLA_BENCH_LATENCY_SECONDS (60), FLOTILLA_BENCH_LATENCY_RATE (25).

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use futures::{StreamExt, stream};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use support::replicas::{MEMBERS, REPLICA_IDS, Replicas, balanced, member_clients, namespaces};
use support::{eventually, microservice};

use common::latency::{Latency, Observed, Target, drive, no_pods, settle};
use common::namespace_gone;
use common::sample::{
    Proc, Who, create_foo, foo_resource, install_foo_crd, microservice_resource, sample_dir,
    start_sample,
};
use common::{Spread, apiserver_pid, cpu_seconds, env_usize, write_json};

/// Every object starts at this many replicas; Foo's schema allows 1 to 10.
const FROM: i64 = 1;
const MAX_FOO_REPLICAS: i64 = 10;

/// The running controller(s) of one trial, held only to be stopped when dropped.
#[allow(dead_code)]
enum Running {
    Flotilla(Box<Replicas>),
    Sample(Vec<Proc>),
}

async fn create_objects(clients: &BTreeMap<&'static str, Client>, who: Who, ns: &str, n: usize) {
    for c in clients.values() {
        no_pods(c, ns).await;
    }
    let all = clients
        .iter()
        .flat_map(|(m, c)| (0..n).map(move |i| (*m, c.clone(), i)));
    stream::iter(all)
        .for_each_concurrent(16, |(_, c, i)| async move {
            let name = format!("obj-{i:03}");
            match who {
                Who::Flotilla => {
                    Api::<flotilla::crd::Microservice>::namespaced(c, ns)
                        .create(
                            &PostParams::default(),
                            &microservice(&name, "ghcr.io/acme/lat:1", 8080, Some(FROM as i32)),
                        )
                        .await
                        .expect("create Microservice");
                }
                Who::Sample => create_foo(c, ns, &name, FROM).await,
            }
        })
        .await;
}

async fn start(
    who: Who,
    clients: &BTreeMap<&'static str, Client>,
    ns: &str,
    sample: &Path,
    tag: &str,
) -> Running {
    match who {
        Who::Flotilla => {
            let mut replicas = Replicas::new(ns, &MEMBERS);
            // Production Lease timings: the tests' 2 s Lease cannot ride out
            // the apiserver delays this load causes on two cores.
            replicas.election.clear();
            for id in REPLICA_IDS {
                replicas.start(id);
            }
            balanced(clients, &replicas.lease_name(), &REPLICA_IDS).await;
            Running::Flotilla(Box::new(replicas))
        }
        Who::Sample => Running::Sample(
            MEMBERS
                .iter()
                .map(|m| start_sample(sample, m, &format!("lat-{tag}-{m}")))
                .collect(),
        ),
    }
}

async fn trial(
    clients: &BTreeMap<&'static str, Client>,
    who: Who,
    n: usize,
    rate: f64,
    window: Duration,
    sample: &Path,
    tag: &str,
) -> Latency {
    let (ns, guards) = namespaces(clients, &format!("bench-lat-{tag}")).await;
    create_objects(clients, who, &ns, n).await;
    let running = start(who, clients, &ns, sample, tag).await;
    eventually(
        "every Deployment created",
        Duration::from_secs(600),
        || async {
            for c in clients.values() {
                let have = Api::<Deployment>::namespaced(c.clone(), &ns)
                    .list(&ListParams::default())
                    .await
                    .ok()?
                    .items
                    .len();
                if have < n {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
    let members: Vec<(String, Client)> = clients
        .iter()
        .map(|(m, c)| (m.to_string(), c.clone()))
        .collect();
    let observed = Observed::start(&members, &ns).await;
    let resource = match who {
        Who::Flotilla => microservice_resource(),
        Who::Sample => foo_resource(),
    };
    // Interleaved by member, so the changes spread evenly across the three.
    let targets: Vec<Target> = (0..n)
        .flat_map(|i| members.iter().map(move |(m, c)| (i, m.clone(), c.clone())))
        .map(|(i, cluster, c)| Target {
            cluster,
            api: Api::namespaced_with(c, &ns, &resource),
            name: format!("obj-{i:03}"),
        })
        .collect();
    let apiserver_cpu = || -> f64 { MEMBERS.iter().map(|m| cpu_seconds(apiserver_pid(m))).sum() };
    let (cpu0, t0) = (apiserver_cpu(), std::time::Instant::now());
    let (changes, refused) = drive(&targets, &mut vec![FROM; targets.len()], rate, window).await;
    let mut result = settle(&observed, &changes, refused, Duration::from_secs(120)).await;
    // The same window for both: a controller that settles sooner does not
    // get a shorter span of its background (Leases, resyncs, probes).
    let span = window + TAIL;
    if let Some(rest) = span.checked_sub(t0.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    let cpu = apiserver_cpu() - cpu0;
    result.apiserver_cores = cpu / t0.elapsed().as_secs_f64();
    result.apiserver_ms_per_change = cpu * 1000.0 / changes.len().max(1) as f64;
    drop(running);
    drop(guards);
    // The next trial starts on members done deleting this one's objects:
    // that cleanup is neither controller's cost per change.
    for c in clients.values() {
        namespace_gone(c, &ns).await;
    }
    eprintln!("{} {tag}: {result:?}", who.name());
    result
}

/// After the last change, how long the apiservers' CPU is still counted.
const TAIL: Duration = Duration::from_secs(15);

fn main() {
    let trials = env_usize("FLOTILLA_BENCH_TRIALS", 3);
    let n = env_usize("FLOTILLA_BENCH_LATENCY_OBJECTS", 60);
    let seconds = env_usize("FLOTILLA_BENCH_LATENCY_SECONDS", 60);
    let rate = env_usize("FLOTILLA_BENCH_LATENCY_RATE", 25) as f64;
    let window = Duration::from_secs(seconds as u64);
    let per_object = (rate * seconds as f64 / (3 * n) as f64).ceil() as i64;
    assert!(
        FROM + per_object <= MAX_FOO_REPLICAS,
        "{per_object} changes per object would take Foo past {MAX_FOO_REPLICAS} replicas: use more objects"
    );
    let sample = sample_dir();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let results: Vec<(Who, Latency)> = rt.block_on(async {
        let clients = member_clients().await;
        for m in MEMBERS {
            install_foo_crd(&sample, m);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut out = Vec::new();
        for t in 0..trials {
            let order = if t % 2 == 0 {
                [Who::Flotilla, Who::Sample]
            } else {
                [Who::Sample, Who::Flotilla]
            };
            for who in order {
                let tag = format!("{}{t}", &who.name()[..1]);
                out.push((
                    who,
                    trial(&clients, who, n, rate, window, &sample, &tag).await,
                ));
            }
        }
        out
    });

    println!(
        "change-to-applied latency: {rate} changes/s for {seconds} s over 3 members x {n} objects, {trials} trials each, alternating (median [min, max])"
    );
    println!(
        "  {:<18} {:>26} {:>26} {:>26} {:>16}",
        "controller", "p50 (ms)", "p99 (ms)", "max (ms)", "applied"
    );
    let mut summary = Vec::new();
    for who in [Who::Flotilla, Who::Sample] {
        let rs: Vec<&Latency> = results
            .iter()
            .filter(|(w, _)| *w == who)
            .map(|(_, l)| l)
            .collect();
        let col = |f: fn(&Latency) -> f64| Spread::of(&rs.iter().map(|l| f(l)).collect::<Vec<_>>());
        let (p50, p99, max) = (col(|l| l.p50_ms), col(|l| l.p99_ms), col(|l| l.max_ms));
        let apiserver = col(|l| l.apiserver_cores);
        let per_change = col(|l| l.apiserver_ms_per_change);
        let applied: usize = rs.iter().map(|l| l.applied).sum();
        let changes: usize = rs.iter().map(|l| l.changes).sum();
        println!(
            "  {:<18} {:>26} {:>26} {:>26} {:>16}",
            who.name(),
            format!("{p50:.0}"),
            format!("{p99:.0}"),
            format!("{max:.0}"),
            format!("{applied}/{changes}")
        );
        println!(
            "  {:<18} apiserver CPU, 3 members: {apiserver:.2} cores, {per_change:.1} ms per change",
            who.name()
        );
        summary.push(json!({"controller": who.name(), "p50_ms": p50, "p99_ms": p99, "max_ms": max, "applied": applied, "changes": changes, "apiserver_cores": apiserver, "apiserver_ms_per_change": per_change}));
    }
    write_json(
        "latency",
        &json!({
            "rate_per_s": rate, "seconds": seconds, "objects_per_member": n, "trials": trials,
            "summary": summary,
            "runs": results.iter().map(|(w, l)| json!({"controller": w.name(), "result": l})).collect::<Vec<_>>(),
        }),
    );
}
