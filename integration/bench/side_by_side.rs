//! Flotilla against client-go's sample-controller, on the same member
//! (member-3), in one run, alternating A and B (`make bench`).
//!
//! Each trial, for each controller in turn: N objects (Microservices, or Foos
//! with one replica) are created with no controller running; the controller
//! starts as its own process, and we time until every Deployment exists (and,
//! for Flotilla, every object is `Reconciled=True`). Then the controller is
//! restarted over the converged objects, which makes each one reconcile every
//! object again, and the apiserver's audit log counts that controller's
//! reads and writes (by user agent) until it has been quiet for a while.
//!
//! QPS limits: each controller's defaults (sample-controller: client-go's
//! 5/10 on each of its two clients; Flotilla: 100/200), and with
//! FLOTILLA_BENCH_EQUAL=1 also at an equal total (FLOTILLA_BENCH_EQUAL=only:
//! just that): sample-controller's two buckets of 5/10 against Flotilla's one
//! of 10/20. Flotilla's Events keep their own 5/50 bucket; sample-controller's
//! share its Deployment client.
//!
//! Each run also records the member apiserver's CPU time and the
//! controller's CPU time and RSS from its start to convergence.

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "common/mod.rs"]
mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use futures::{StreamExt, stream};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use support::replicas::local_server_args;
use support::{client, ensure_crd, fleet_dir, kubeconfig_path, microservice};

use common::sample::{Proc, Who, create_foo, install_foo_crd, sample_dir, start_sample};
use common::{Spread, apiserver_pid, cpu_seconds, env_usize, namespace_gone, rss_mib, write_json};
use tokio::time::Instant;

use flotilla::crd::Microservice;

const CLUSTER: &str = "member-3";
/// The restart's requests are counted for at most this long: four of
/// sample-controller's 30 s resyncs.
const RESYNC_WINDOW: Duration = Duration::from_secs(120);

fn start(who: Who, ns: &str, equal_limits: bool, sample: &Path, tag: &str) -> Proc {
    match who {
        Who::Sample => start_sample(sample, CLUSTER, tag),
        Who::Flotilla => {
            let log = std::fs::File::create(
                fleet_dir()
                    .join("logs")
                    .join(format!("bench-flotilla-{tag}.log")),
            )
            .unwrap();
            let dir = fleet_dir().join("bench").join(format!("members-{tag}"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::copy(
                kubeconfig_path(CLUSTER),
                dir.join(format!("{CLUSTER}.yaml")),
            )
            .unwrap();
            let (qps, burst) = if equal_limits {
                ("10", "20")
            } else {
                ("100", "200")
            };
            Command::new(env!("CARGO_BIN_EXE_flotilla"))
                .args(["run", "--kubeconfig-dir"])
                .arg(&dir)
                .arg("--home-kubeconfig")
                .arg(kubeconfig_path("home"))
                .args([
                    "--home-namespace",
                    "flotilla-bench",
                    "--fleet-name",
                    &format!("bench{tag}"),
                ])
                .args(["--replica-id", "bench", "--namespace", ns])
                // Default Lease timings, as users run it.
                .args(["--cluster-qps", qps, "--cluster-burst", burst])
                .args(local_server_args())
                .env("RUST_LOG", "warn")
                // As `deploy/home` runs it.
                .env("MALLOC_ARENA_MAX", "2")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .map(Proc)
                .expect("start flotilla")
        }
    }
}

async fn create_objects(c: &Client, who: Who, ns: &str, n: usize) {
    stream::iter(0..n)
        .for_each_concurrent(16, |i| {
            let c = c.clone();
            async move {
                let name = format!("obj-{i:04}");
                match who {
                    Who::Flotilla => {
                        Api::<Microservice>::namespaced(c, ns)
                            .create(
                                &PostParams::default(),
                                &microservice(&name, "ghcr.io/acme/bench:1", 8080, Some(1)),
                            )
                            .await
                            .expect("create Microservice");
                    }
                    Who::Sample => create_foo(c, ns, &name, 1).await,
                }
            }
        })
        .await;
}

async fn converged(c: &Client, who: Who, ns: &str, n: usize) -> bool {
    let deployments = Api::<Deployment>::namespaced(c.clone(), ns)
        .list(&ListParams::default())
        .await
        .map(|l| l.items.len())
        .unwrap_or(0);
    if deployments < n {
        return false;
    }
    if who == Who::Sample {
        return true;
    }
    let Ok(list) = Api::<Microservice>::namespaced(c.clone(), ns)
        .list(&ListParams::default())
        .await
    else {
        return false;
    };
    list.items
        .iter()
        .filter(|m| {
            m.status.as_ref().is_some_and(|s| {
                s.observed_generation == m.metadata.generation
                    && s.conditions
                        .iter()
                        .any(|c| c.type_ == "Reconciled" && c.status == "True")
            })
        })
        .count()
        == n
}

fn audit_lines() -> Vec<String> {
    std::fs::read_to_string(
        fleet_dir()
            .join("logs")
            .join(format!("{CLUSTER}-audit.log")),
    )
    .unwrap_or_default()
    .lines()
    .map(str::to_string)
    .collect()
}

/// (reads, writes) a controller sent to `ns` in audit lines from `from` on.
fn requests(who: Who, ns: &str, from: usize) -> (usize, usize) {
    let (mut reads, mut writes) = (0, 0);
    for l in audit_lines().into_iter().skip(from) {
        let Ok(e) = serde_json::from_str::<serde_json::Value>(&l) else {
            continue;
        };
        let ua = e["userAgent"].as_str().unwrap_or_default();
        let in_ns = e["objectRef"]["namespace"] == ns || e["objectRef"]["namespace"].is_null();
        if !ua.starts_with(who.user_agent()) || !in_ns || e["stage"] != "ResponseComplete" {
            continue;
        }
        match e["verb"].as_str() {
            Some("get" | "list") => reads += 1,
            Some("create" | "update" | "patch" | "delete") => writes += 1,
            _ => {}
        }
    }
    (reads, writes)
}

/// Every request a controller sent to `ns` in audit lines from `from` on,
/// by "verb resource[/subresource]", Events included.
fn requests_by_kind(who: Who, ns: &str, from: usize) -> std::collections::BTreeMap<String, usize> {
    let mut out = std::collections::BTreeMap::new();
    for l in audit_lines().into_iter().skip(from) {
        let Ok(e) = serde_json::from_str::<serde_json::Value>(&l) else {
            continue;
        };
        let ua = e["userAgent"].as_str().unwrap_or_default();
        if !ua.starts_with(who.user_agent()) || e["objectRef"]["namespace"] != ns {
            continue;
        }
        let (Some(verb), Some(resource)) =
            (e["verb"].as_str(), e["objectRef"]["resource"].as_str())
        else {
            continue;
        };
        if verb == "watch" {
            continue;
        }
        let sub = e["objectRef"]["subresource"]
            .as_str()
            .map(|s| format!("/{s}"))
            .unwrap_or_default();
        *out.entry(format!("{verb} {resource}{sub}")).or_default() += 1;
    }
    out
}

#[derive(Debug, Clone, serde::Serialize)]
struct Trial {
    controller: &'static str,
    limits: &'static str,
    children_s: f64,
    converged_s: f64,
    resync_reads: usize,
    resync_writes: usize,
    /// From the start until converged and settled, per object.
    per_object: f64,
    per_object_without_events: f64,
    converge_requests: std::collections::BTreeMap<String, usize>,
    /// CPU seconds from the controller's start to convergence.
    apiserver_cpu_s: f64,
    controller_cpu_s: f64,
    /// The controller's RSS once converged.
    controller_rss_mib: f64,
}

async fn trial(c: &Client, who: Who, equal: bool, n: usize, sample: &Path, tag: &str) -> Trial {
    let ns_name = format!("bench-{}-{tag}", who.name());
    let namespaces: Api<Namespace> = Api::all(c.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": ns_name}})).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .expect("namespace");
    create_objects(c, who, &ns_name, n).await;

    let converge_from = audit_lines().len();
    let apiserver = apiserver_pid(CLUSTER);
    let apiserver_cpu0 = cpu_seconds(apiserver);
    let t0 = Instant::now();
    let mut proc = Some(start(who, &ns_name, equal, sample, tag));
    let pid = proc.as_ref().map(|p| p.0.id()).unwrap_or_default();
    let mut children_s = None;
    loop {
        let deps = Api::<Deployment>::namespaced(c.clone(), &ns_name)
            .list(&ListParams::default())
            .await
            .map(|l| l.items.len())
            .unwrap_or(0);
        if children_s.is_none() && deps >= n {
            children_s = Some(t0.elapsed().as_secs_f64());
        }
        if converged(c, who, &ns_name, n).await {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(1800),
            "{} did not converge",
            who.name()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let converged_s = t0.elapsed().as_secs_f64();
    let apiserver_cpu_s = cpu_seconds(apiserver) - apiserver_cpu0;
    let (controller_cpu_s, controller_rss_mib) = (cpu_seconds(pid), rss_mib(pid));
    // Let rollouts settle (past Flotilla's 5 s hold on count-only status),
    // then restart over the converged objects.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let converge_requests = requests_by_kind(who, &ns_name, converge_from);
    let total: usize = converge_requests.values().sum();
    let events: usize = converge_requests
        .iter()
        .filter(|(k, _)| k.ends_with(" events"))
        .map(|(_, v)| v)
        .sum();
    drop(proc.take());
    let from = audit_lines().len();
    let restarted = start(who, &ns_name, equal, sample, &format!("{tag}r"));
    // Counted until the controller has been quiet for 5 s (at most RESYNC_WINDOW).
    let (mut last, mut quiet_since, started) = ((0, 0), Instant::now(), Instant::now());
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = requests(who, &ns_name, from);
        if now != last {
            last = now;
            quiet_since = Instant::now();
        }
        if (quiet_since.elapsed() > Duration::from_secs(5)
            && started.elapsed() > Duration::from_secs(10))
            || started.elapsed() > RESYNC_WINDOW
        {
            break;
        }
    }
    drop(restarted);
    namespaces.delete(&ns_name, &Default::default()).await.ok();
    // The next trial starts on a clean cluster.
    namespace_gone(c, &ns_name).await;
    Trial {
        controller: who.name(),
        limits: if equal { "equal total" } else { "defaults" },
        children_s: children_s.unwrap_or(converged_s),
        converged_s,
        resync_reads: last.0,
        resync_writes: last.1,
        per_object: total as f64 / n as f64,
        per_object_without_events: (total - events) as f64 / n as f64,
        converge_requests,
        apiserver_cpu_s,
        controller_cpu_s,
        controller_rss_mib,
    }
}

fn main() {
    let n = env_usize("FLOTILLA_BENCH_N", 500);
    let trials = env_usize("FLOTILLA_BENCH_TRIALS", 3);
    // At 5 qps, Flotilla needs about 20 minutes for 500 objects: one trial.
    let equal_trials = env_usize("FLOTILLA_BENCH_EQUAL_TRIALS", 1);
    let equal = std::env::var("FLOTILLA_BENCH_EQUAL").unwrap_or_default();
    let sample = sample_dir();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let results: Vec<Trial> = rt.block_on(async {
        let c = client(CLUSTER).await;
        ensure_crd(&c).await;
        install_foo_crd(&sample, CLUSTER);
        let home = client("home").await;
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": "flotilla-bench"}})).unwrap();
        Api::<Namespace>::all(home)
            .create(&PostParams::default(), &ns)
            .await
            .ok();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut out = Vec::new();
        let modes: Vec<bool> = match equal.as_str() {
            "1" => vec![false, true],
            "only" => vec![true],
            _ => vec![false],
        };
        for equal in modes {
            for t in 0..(if equal { equal_trials } else { trials }) {
                // Alternate which controller goes first.
                let order = if t % 2 == 0 {
                    [Who::Flotilla, Who::Sample]
                } else {
                    [Who::Sample, Who::Flotilla]
                };
                for who in order {
                    let tag = format!(
                        "{}{t}{}",
                        if equal { "e" } else { "d" },
                        rand::random::<u16>()
                    );
                    let r = trial(&c, who, equal, n, &sample, &tag).await;
                    eprintln!("{r:?}");
                    out.push(r);
                }
            }
        }
        out
    });

    println!(
        "side by side on {CLUSTER}: {n} objects, {trials} trials each at default limits, {equal_trials} at equal limits, alternating (median [min, max])"
    );
    println!(
        "  {:<18} {:<10} {:>24} {:>24} {:>14} {:>14}",
        "controller",
        "limits",
        "all children (s)",
        "converged (s)",
        "resync reads",
        "resync writes"
    );
    let mut keys: Vec<(&str, &str)> = results.iter().map(|r| (r.controller, r.limits)).collect();
    keys.sort();
    keys.dedup();
    let mut summary = Vec::new();
    for (who, limits) in keys {
        let rs: Vec<&Trial> = results
            .iter()
            .filter(|r| r.controller == who && r.limits == limits)
            .collect();
        let col = |f: fn(&Trial) -> f64| Spread::of(&rs.iter().map(|r| f(r)).collect::<Vec<_>>());
        let (children, converged) = (col(|r| r.children_s), col(|r| r.converged_s));
        let (reads, writes) = (
            col(|r| r.resync_reads as f64),
            col(|r| r.resync_writes as f64),
        );
        let (per, per_no_events) = (col(|r| r.per_object), col(|r| r.per_object_without_events));
        let (apiserver_cpu, cpu, rss) = (
            col(|r| r.apiserver_cpu_s),
            col(|r| r.controller_cpu_s),
            col(|r| r.controller_rss_mib),
        );
        println!(
            "  {who:<18} {limits:<10} to convergence: apiserver CPU {apiserver_cpu:.1} s, controller CPU {cpu:.1} s, controller RSS {rss:.1} MiB"
        );
        println!(
            "  {who:<18} {limits:<10} requests per converged object: {per:.2} ({per_no_events:.2} without Events); first trial: {:?}",
            rs[0].converge_requests
        );
        println!(
            "  {who:<18} {limits:<10} {:>24} {:>24} {:>14} {:>14}",
            format!("{children:.1}"),
            format!("{converged:.1}"),
            format!("{reads:.0}"),
            format!("{writes:.0}"),
        );
        summary.push(json!({
            "controller": who, "limits": limits, "trials": rs.len(),
            "children_s": children, "converged_s": converged,
            "resync_reads": reads, "resync_writes": writes,
            "per_object": per, "per_object_without_events": per_no_events,
            "apiserver_cpu_s": apiserver_cpu, "controller_cpu_s": cpu, "controller_rss_mib": rss,
        }));
    }
    write_json(
        "side_by_side",
        &json!({"n": n, "resync_window_s": RESYNC_WINDOW.as_secs(), "summary": summary, "trials": results}),
    );
}
