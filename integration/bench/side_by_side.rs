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
//! 5/10; Flotilla: 100/200), and with FLOTILLA_BENCH_EQUAL=1 also both at 5/10
//! (FLOTILLA_BENCH_EQUAL=only: just that).

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use futures::{StreamExt, stream};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use support::replicas::{FAST_ELECTION, local_server_args};
use support::{client, ensure_crd, fleet_dir, kubeconfig_path, kubectl, microservice};
use tokio::time::Instant;

use flotilla::crd::Microservice;

const CLUSTER: &str = "member-3";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Who {
    Flotilla,
    Sample,
}

impl Who {
    fn name(self) -> &'static str {
        match self {
            Who::Flotilla => "flotilla",
            Who::Sample => "sample-controller",
        }
    }
    fn user_agent(self) -> &'static str {
        match self {
            Who::Flotilla => "flotilla/",
            Who::Sample => "sample-controller/",
        }
    }
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        // SIGTERM first, so Flotilla releases its Lease; then make sure.
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        for _ in 0..50 {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.0.kill().ok();
        self.0.wait().ok();
    }
}

fn sample_dir() -> PathBuf {
    let out = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/integration/bench/build-sample-controller.sh"
    ))
    .output()
    .expect("build sample-controller");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn start(who: Who, ns: &str, equal_limits: bool, sample: &Path, tag: &str) -> Proc {
    let logs = fleet_dir().join("logs");
    let log = std::fs::File::create(logs.join(format!("bench-{}-{tag}.log", who.name()))).unwrap();
    let child = match who {
        Who::Sample => Command::new(sample.join("sample-controller"))
            .arg("-kubeconfig")
            .arg(kubeconfig_path(CLUSTER))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn(),
        Who::Flotilla => {
            let dir = fleet_dir().join("bench").join(format!("members-{tag}"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::copy(
                kubeconfig_path(CLUSTER),
                dir.join(format!("{CLUSTER}.yaml")),
            )
            .unwrap();
            let (qps, burst) = if equal_limits {
                ("5", "10")
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
                .args(FAST_ELECTION)
                .args(["--cluster-qps", qps, "--cluster-burst", burst])
                .args(local_server_args())
                .env("RUST_LOG", "warn")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
        }
    };
    Proc(child.expect("start controller"))
}

fn foo_resource() -> kube::api::ApiResource {
    kube::api::ApiResource {
        group: "samplecontroller.k8s.io".into(),
        version: "v1alpha1".into(),
        api_version: "samplecontroller.k8s.io/v1alpha1".into(),
        kind: "Foo".into(),
        plural: "foos".into(),
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
                    Who::Sample => {
                        let object = kube::api::DynamicObject::new(&name, &foo_resource())
                            .data(json!({"spec": {"deploymentName": name, "replicas": 1}}));
                        let api: Api<kube::api::DynamicObject> =
                            Api::namespaced_with(c, ns, &foo_resource());
                        api.create(&PostParams::default(), &object)
                            .await
                            .expect("create Foo");
                    }
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

#[derive(Debug, Clone, serde::Serialize)]
struct Trial {
    controller: &'static str,
    limits: &'static str,
    children_s: f64,
    converged_s: f64,
    resync_reads: usize,
    resync_writes: usize,
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

    let t0 = Instant::now();
    let mut proc = Some(start(who, &ns_name, equal, sample, tag));
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
    // Let rollouts settle, then restart over the converged objects.
    tokio::time::sleep(Duration::from_secs(5)).await;
    drop(proc.take());
    let from = audit_lines().len();
    let restarted = start(who, &ns_name, equal, sample, &format!("{tag}r"));
    // Counted until the controller has been quiet for 5 s (at most 3 min).
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
            || started.elapsed() > Duration::from_secs(180)
        {
            break;
        }
    }
    drop(restarted);
    namespaces.delete(&ns_name, &Default::default()).await.ok();
    // The next trial starts on a clean cluster: wait until the namespace is gone.
    let deadline = Instant::now() + Duration::from_secs(300);
    while namespaces.get_opt(&ns_name).await.ok().flatten().is_some() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Trial {
        controller: who.name(),
        limits: if equal { "5/10 both" } else { "defaults" },
        children_s: children_s.unwrap_or(converged_s),
        converged_s,
        resync_reads: last.0,
        resync_writes: last.1,
    }
}

fn stats(v: &[f64]) -> (f64, f64, f64) {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() {
    let n: usize = std::env::var("FLOTILLA_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    let trials: usize = std::env::var("FLOTILLA_BENCH_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let equal = std::env::var("FLOTILLA_BENCH_EQUAL").unwrap_or_default();
    let sample = sample_dir();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let results: Vec<Trial> = rt.block_on(async {
        let c = client(CLUSTER).await;
        ensure_crd(&c).await;
        let status = Command::new(kubectl())
            .arg("--kubeconfig")
            .arg(kubeconfig_path(CLUSTER))
            .args(["apply", "--server-side", "-f"])
            .arg(sample.join("crd.yaml"))
            .stdout(Stdio::null())
            .status()
            .expect("kubectl");
        assert!(status.success(), "Foo CRD");
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
            for t in 0..trials {
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
        "side by side on {CLUSTER}: {n} objects, {trials} trials each, alternating (median [min, max])"
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
    keys.dedup();
    keys.sort();
    keys.dedup();
    for (who, limits) in keys {
        let rs: Vec<&Trial> = results
            .iter()
            .filter(|r| r.controller == who && r.limits == limits)
            .collect();
        let col = |f: fn(&Trial) -> f64| stats(&rs.iter().map(|r| f(r)).collect::<Vec<_>>());
        let fmt = |(m, lo, hi): (f64, f64, f64)| format!("{m:.1} [{lo:.1}, {hi:.1}]");
        println!(
            "  {who:<18} {limits:<10} {:>24} {:>24} {:>14} {:>14}",
            fmt(col(|r| r.children_s)),
            fmt(col(|r| r.converged_s)),
            fmt(col(|r| r.resync_reads as f64)),
            fmt(col(|r| r.resync_writes as f64)),
        );
    }
    let dir = fleet_dir().join("bench");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("side_by_side.json"),
        serde_json::to_vec_pretty(&json!({"n": n, "trials": results})).unwrap(),
    )
    .unwrap();
}
