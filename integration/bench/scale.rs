//! Fleet scale (`make bench-scale`): the test bed and the operator at 3, 20
//! and 50 real members (`SCALE_SIZES`), and a linear model of a replica's
//! cost fitted to them.
//!
//! For each size N:
//! - the test bed: bring-up time, memory (PSS, so shared binaries count
//!   once) and idle CPU of every process of the fleet;
//! - three release replicas with the default Lease timings, and an
//!   observer: a fourth replica that heartbeats in a namespace of its own,
//!   so it watches every member for the index but leads none (it starts
//!   once every member is led, and only follows). A leader's cost less
//!   the observer's is what leading costs;
//! - time until every member is led, balance, and one Microservice
//!   Available in every member;
//! - per replica, idle: RSS, CPU, Lease reads and writes per second,
//!   connections to members, open file descriptors;
//! - kill -9 of the replica with the biggest share: time until each of its
//!   members is led again, and whether any other member changed leader;
//! - a live registry change (N >= 20): 10 kubeconfigs removed, then added
//!   back, timed until every replica forgot them and until all are led again.
//!
//! Results: `.fleet/bench/scale.json` and `.fleet/bench/scale.md`.

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "common/mod.rs"]
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use tokio::time::Instant;

use common::{bench_dir, cpu_seconds, rss_mib, write_json};
use support::replicas::holders;
use support::{client, ensure_crd, eventually, fleet_cmd, fleet_dir, from_json, microservice};

use flotilla::crd::Microservice;

/// The production defaults: what a replica costs as shipped.
const LEASE_DURATION: Duration = Duration::from_secs(15);
const RETRY_PERIOD: Duration = Duration::from_secs(2);
const IDLE_WINDOW: Duration = Duration::from_secs(30);
const LEADERS: [&str; 3] = ["r1", "r2", "r3"];
const OBSERVER: &str = "obs";
/// Member apiservers listen on 17000 + 10 i (integration/fleet); home is 17000.
const MEMBER_PORTS: std::ops::RangeInclusive<u16> = 17010..=17999;

struct Replica {
    child: Child,
    metrics: u16,
}

fn spawn(id: &str, fleet: &str, home_ns: &str, dir: &Path, bench: &str) -> Replica {
    let grpc = support::replicas::free_port();
    let metrics = support::replicas::free_port();
    let log = fleet_dir().join("logs").join(format!("{bench}-{id}.log"));
    let out = std::fs::File::create(&log).expect("replica log");
    let child = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["run", "--kubeconfig-dir"])
        .arg(dir)
        .arg("--home-kubeconfig")
        .arg(support::kubeconfig_path("home"))
        .args(["--fleet-name", fleet, "--replica-id", id])
        .args(["--home-namespace", home_ns, "--namespace", bench])
        .args([
            "--grpc-insecure",
            "--grpc-addr",
            &format!("127.0.0.1:{grpc}"),
        ])
        .args(["--metrics-addr", &format!("127.0.0.1:{metrics}")])
        .env("RUST_LOG", "info,kube=warn")
        .stdout(Stdio::null())
        .stderr(out)
        .spawn()
        .expect("start replica");
    Replica { child, metrics }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

/// Sum of `flotilla_api_requests_total` by verb, over every cluster.
async fn requests_by_verb(port: u16) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let Some((_, text)) = support::http_get(&format!("http://127.0.0.1:{port}/metrics")).await
    else {
        return out;
    };
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("flotilla_api_requests_total{") else {
            continue;
        };
        let verb = rest
            .split("verb=\"")
            .nth(1)
            .and_then(|v| v.split('"').next())
            .unwrap_or_default();
        let value: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        *out.entry(verb.to_string()).or_default() += value;
    }
    out
}

/// Established TCP connections of `pid` to member apiservers.
fn member_connections(pid: u32) -> usize {
    let inodes: BTreeSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| {
                let link = std::fs::read_link(e.ok()?.path()).ok()?;
                let l = link.to_string_lossy();
                Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
            })
            .collect()
        })
        .unwrap_or_default();
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let port = f
                .get(2)
                .and_then(|r| r.split(':').nth(1))
                .and_then(|p| u16::from_str_radix(p, 16).ok())
                .unwrap_or(0);
            f.get(3) == Some(&"01") && MEMBER_PORTS.contains(&port) && inodes.contains(f[9])
        })
        .count()
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Pids of every test-bed process (integration/fleet's pid files).
fn fleet_pids() -> Vec<u32> {
    std::fs::read_dir(fleet_dir().join("run"))
        .map(|d| {
            d.filter_map(|e| {
                let p = e.ok()?.path();
                let name = p.file_name()?.to_str()?.to_string();
                if !name.ends_with(".pid") || name.starts_with("operator-") {
                    return None;
                }
                std::fs::read_to_string(&p)
                    .ok()?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .collect()
        })
        .unwrap_or_default()
}

fn pss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Pss:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

/// The fleet's memory and its idle CPU in % of one core over the window.
async fn testbed_idle() -> (f64, f64) {
    let pids = fleet_pids();
    let cpu0: f64 = pids.iter().map(|p| cpu_seconds(*p)).sum();
    tokio::time::sleep(IDLE_WINDOW).await;
    let cpu1: f64 = pids.iter().map(|p| cpu_seconds(*p)).sum();
    let pss: f64 = pids.iter().map(|p| pss_mib(*p)).sum();
    (pss, 100.0 * (cpu1 - cpu0) / IDLE_WINDOW.as_secs_f64())
}

/// One replica's idle figures over the window.
#[derive(serde::Serialize, serde::Deserialize, Clone)]
struct Idle {
    id: String,
    led: usize,
    rss_mib: f64,
    cpu_pct: f64,
    lease_writes_per_s: f64,
    gets_per_s: f64,
    member_connections: usize,
    fds: usize,
}

async fn replicas_idle(
    replicas: &BTreeMap<String, Replica>,
    led: &BTreeMap<String, usize>,
) -> Vec<Idle> {
    let start: Vec<(f64, BTreeMap<String, f64>)> = futures::future::join_all(
        replicas
            .values()
            .map(|r| async { (cpu_seconds(r.child.id()), requests_by_verb(r.metrics).await) }),
    )
    .await;
    tokio::time::sleep(IDLE_WINDOW).await;
    let mut out = Vec::new();
    for ((id, r), (cpu0, req0)) in replicas.iter().zip(start) {
        let req1 = requests_by_verb(r.metrics).await;
        let rate = |verb: &str| {
            (req1.get(verb).unwrap_or(&0.0) - req0.get(verb).unwrap_or(&0.0))
                / IDLE_WINDOW.as_secs_f64()
        };
        let pid = r.child.id();
        out.push(Idle {
            id: id.clone(),
            led: led.get(id).copied().unwrap_or(0),
            rss_mib: rss_mib(pid),
            cpu_pct: 100.0 * (cpu_seconds(pid) - cpu0) / IDLE_WINDOW.as_secs_f64(),
            // In steady state nothing else writes: every update is a renewal.
            lease_writes_per_s: rate("update"),
            gets_per_s: rate("get"),
            member_connections: member_connections(pid),
            fds: open_fds(pid),
        });
    }
    out
}

fn shares(held: &BTreeMap<String, Option<String>>) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (m, h) in held {
        if let Some(r) = h {
            out.entry(r.clone()).or_default().push(m.clone());
        }
    }
    out
}

/// Whether any replica still reports `cluster` on /metrics.
async fn reported_anywhere(replicas: &BTreeMap<String, Replica>, cluster: &str) -> bool {
    let needle = format!("flotilla_cluster_leader{{cluster=\"{cluster}\"}}");
    for r in replicas.values() {
        if let Some((_, text)) =
            support::http_get(&format!("http://127.0.0.1:{}/metrics", r.metrics)).await
            && text.contains(&needle)
        {
            return true;
        }
    }
    false
}

async fn run(n: usize) -> serde_json::Value {
    eprintln!("=== {n} members");
    let t = Instant::now();
    fleet_cmd(&["up", "--clusters", &n.to_string()]);
    let bring_up = t.elapsed().as_secs_f64();
    // Let start-up work (controllers' first syncs) settle.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let (fleet_pss, fleet_cpu) = testbed_idle().await;
    eprintln!(
        "test bed: up in {bring_up:.0} s, {fleet_pss:.0} MiB PSS, idle {fleet_cpu:.1}% of a core"
    );

    let bench = format!("bench-scale-{:06x}", rand::random::<u32>() & 0xffffff);
    let names: Vec<String> = (1..=n).map(|i| format!("member-{i}")).collect();
    let mut clients = BTreeMap::new();
    for m in &names {
        let c = client(m).await;
        ensure_crd(&c).await;
        Api::<Namespace>::all(c.clone())
            .create(
                &PostParams::default(),
                &from_json(json!({"metadata": {"name": bench}})),
            )
            .await
            .expect("namespace");
        clients.insert(m.clone(), c);
    }
    let home = client("home").await;
    for ns in [bench.clone(), format!("{bench}-obs")] {
        Api::<Namespace>::all(home.clone())
            .create(
                &PostParams::default(),
                &from_json(json!({"metadata": {"name": ns}})),
            )
            .await
            .expect("home namespace");
    }
    let dir: PathBuf = fleet_dir().join("test-kubeconfigs").join(&bench);
    std::fs::create_dir_all(&dir).expect("dir");
    for m in &names {
        std::fs::copy(support::kubeconfig_path(m), dir.join(format!("{m}.yaml"))).expect("copy");
    }

    let t = Instant::now();
    let mut replicas: BTreeMap<String, Replica> = LEADERS
        .iter()
        .map(|id| (id.to_string(), spawn(id, &bench, &bench, &dir, &bench)))
        .collect();
    let lease = format!("flotilla-{bench}");
    let held = eventually(
        "every member led, balanced",
        Duration::from_secs(300),
        || async {
            let h = holders(&clients, &lease).await;
            let s = shares(&h);
            let sizes: Vec<usize> = s.values().map(Vec::len).collect();
            let all = h.values().all(Option::is_some);
            let balanced = s.len() == 3 && sizes.iter().max()? - sizes.iter().min()? <= 1;
            (all && balanced).then_some(h)
        },
    )
    .await;
    let led_after = t.elapsed().as_secs_f64();
    let share = shares(&held);
    let sizes: Vec<usize> = share.values().map(Vec::len).collect();
    eprintln!("every member led after {led_after:.1} s: {sizes:?}");
    // The observer counts itself alone, so it is every member's assignee:
    // started once every Lease is held and renewed, it only follows.
    replicas.insert(
        OBSERVER.into(),
        spawn(OBSERVER, &bench, &format!("{bench}-obs"), &dir, &bench),
    );

    let t = Instant::now();
    futures::future::join_all(clients.values().map(|c| {
        let api = Api::<Microservice>::namespaced(c.clone(), &bench);
        async move {
            api.create(
                &PostParams::default(),
                &microservice("web", "ghcr.io/acme/web:1", 8080, Some(1)),
            )
            .await
            .expect("create");
            support::wait_all_true(&api, 1, "Available", Duration::from_secs(300)).await;
        }
    }))
    .await;
    let converged = t.elapsed().as_secs_f64();
    eprintln!("Available in all {n} members after {converged:.1} s");

    tokio::time::sleep(Duration::from_secs(10)).await;
    let led: BTreeMap<String, usize> = share.iter().map(|(r, ms)| (r.clone(), ms.len())).collect();
    let idle = replicas_idle(&replicas, &led).await;
    for i in &idle {
        eprintln!(
            "{}: leads {}, {:.1} MiB, {:.2}% CPU, {:.2} lease writes/s, {:.2} gets/s, {} connections, {} fds",
            i.id,
            i.led,
            i.rss_mib,
            i.cpu_pct,
            i.lease_writes_per_s,
            i.gets_per_s,
            i.member_connections,
            i.fds
        );
    }

    // The observer goes before the failover: it would contest as everyone's assignee.
    replicas.remove(OBSERVER);
    let (victim, victims) = share
        .iter()
        .max_by_key(|(_, ms)| ms.len())
        .map(|(r, ms)| (r.clone(), ms.clone()))
        .expect("a share");
    let t = Instant::now();
    drop(replicas.remove(&victim));
    let after = eventually(
        "the victim's members led again",
        Duration::from_secs(120),
        || async {
            let h = holders(&clients, &lease).await;
            victims
                .iter()
                .all(|m| h[m].as_ref().is_some_and(|r| *r != victim))
                .then_some(h)
        },
    )
    .await;
    let failover = t.elapsed().as_secs_f64();
    let others_moved = held
        .iter()
        .filter(|(m, r)| r.as_deref() != Some(victim.as_str()) && after[*m] != **r)
        .count();
    eprintln!(
        "kill -9 of {victim} leading {}: all led again after {failover:.1} s; {others_moved} others changed leader",
        victims.len()
    );

    // A live registry change: the last 10 members go, then come back.
    let registry = if n >= 20 {
        let moved: Vec<String> = names[n - 10..].to_vec();
        let t = Instant::now();
        for m in &moved {
            std::fs::rename(
                dir.join(format!("{m}.yaml")),
                dir.join(format!(".{m}.yaml.off")),
            )
            .expect("remove");
        }
        eventually(
            "10 members forgotten by every replica",
            Duration::from_secs(120),
            || async {
                for m in &moved {
                    if reported_anywhere(&replicas, m).await {
                        return None;
                    }
                }
                Some(())
            },
        )
        .await;
        let removed = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for m in &moved {
            std::fs::rename(
                dir.join(format!(".{m}.yaml.off")),
                dir.join(format!("{m}.yaml")),
            )
            .expect("add");
        }
        let live: BTreeSet<String> = replicas.keys().cloned().collect();
        eventually("10 members led again", Duration::from_secs(120), || async {
            let h = holders(&clients, &lease).await;
            moved
                .iter()
                .all(|m| h[m].as_ref().is_some_and(|r| live.contains(r)))
                .then_some(())
        })
        .await;
        let added = t.elapsed().as_secs_f64();
        eprintln!("registry: 10 removed in {removed:.1} s, 10 added and led in {added:.1} s");
        json!({"removed_s": removed, "added_and_led_s": added})
    } else {
        json!(null)
    };
    drop(replicas);
    std::fs::remove_dir_all(&dir).ok();
    for c in clients.values() {
        Api::<Namespace>::all(c.clone())
            .delete(&bench, &Default::default())
            .await
            .ok();
    }
    json!({
        "members": n,
        "testbed": {"bring_up_s": bring_up, "pss_mib": fleet_pss, "idle_cpu_pct": fleet_cpu},
        "led_after_s": led_after,
        "shares": sizes,
        "converged_s": converged,
        "idle": idle,
        "failover": {
            "victim_led": victims.len(),
            "all_led_again_s": failover,
            "bound_s": (LEASE_DURATION + RETRY_PERIOD).as_secs_f64(),
            "others_changed_leader": others_moved,
        },
        "registry": registry,
    })
}

/// Least squares y = a + b x.
fn fit(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let b = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    (my - b * mx, b)
}

fn idle_of(run: &serde_json::Value) -> Vec<Idle> {
    serde_json::from_value(run["idle"].clone()).expect("idle figures")
}

fn model(runs: &[serde_json::Value]) -> String {
    let members = |r: &serde_json::Value| r["members"].as_f64().unwrap();
    // Watching: the observer, as a function of the member count.
    let obs = |col: fn(&Idle) -> f64| -> Vec<(f64, f64)> {
        runs.iter()
            .map(|r| {
                let o = idle_of(r).into_iter().find(|i| i.id == OBSERVER).unwrap();
                (members(r), col(&o))
            })
            .collect()
    };
    let (rss0, rss_w) = fit(&obs(|i| i.rss_mib));
    let (cpu0, cpu_w) = fit(&obs(|i| i.cpu_pct));
    let (conn0, conn_w) = fit(&obs(|i| i.member_connections as f64));
    let (fd0, fd_w) = fit(&obs(|i| i.fds as f64));
    // Leading: a leader's excess over the observer's line, per member led,
    // fitted through the origin (leading nothing costs nothing more).
    let per_led = |col: fn(&Idle) -> f64, base: (f64, f64)| {
        let mut pts = Vec::new();
        for r in runs {
            for i in idle_of(r).into_iter().filter(|i| i.id != OBSERVER) {
                pts.push((i.led as f64, col(&i) - (base.0 + base.1 * members(r))));
            }
        }
        let sxy: f64 = pts.iter().map(|(x, y)| x * y).sum();
        let sxx: f64 = pts.iter().map(|(x, _)| x * x).sum();
        sxy / sxx
    };
    let rss_l = per_led(|i| i.rss_mib, (rss0, rss_w));
    let cpu_l = per_led(|i| i.cpu_pct, (cpu0, cpu_w));
    let writes_l = per_led(|i| i.lease_writes_per_s, (0.0, 0.0));
    let conn_l = per_led(|i| i.member_connections as f64, (conn0, conn_w));
    let mut out = String::new();
    out.push_str("\n### Model, per replica (least squares over the runs above)\n\n");
    out.push_str("| cost | fixed | per member watched | per member led |\n|---|---|---|---|\n");
    out.push_str(&format!(
        "| RSS (MiB) | {rss0:.1} | {rss_w:.3} | {rss_l:.3} |\n| idle CPU (% of a core) | {cpu0:.2} | {cpu_w:.3} | {cpu_l:.3} |\n| Lease writes/s | 0 | 0 | {writes_l:.3} |\n| connections to members | {conn0:.1} | {conn_w:.2} | {conn_l:.2} |\n| open fds | {fd0:.0} | {fd_w:.2} | {conn_l:.2} |\n"
    ));
    out.push_str("\n### Predictions, per replica\n\n| members | replicas | led each | RSS (MiB) | idle CPU (% core) | Lease writes/s | connections | fds |\n|---|---|---|---|---|---|---|---|\n");
    for m in [100.0f64, 1000.0] {
        for r in [3.0, 10.0, 30.0] {
            let led = (m / r).ceil();
            out.push_str(&format!(
                "| {m} | {r} | {led} | {:.0} | {:.1} | {:.1} | {:.0} | {:.0} |\n",
                rss0 + rss_w * m + rss_l * led,
                cpu0 + cpu_w * m + cpu_l * led,
                writes_l * led,
                conn0 + conn_w * m + conn_l * led,
                fd0 + fd_w * m + conn_l * led,
            ));
        }
    }
    out
}

fn table(runs: &[serde_json::Value]) -> String {
    let bound = (LEASE_DURATION + RETRY_PERIOD).as_secs();
    let mut out = format!(
        "## Fleet scale (`make bench-scale`)\n\n| members | test bed up (s) | test bed PSS (MiB) | test bed idle CPU (% core) | all led (s) | shares | all Available (s) | kill -9: members | led again (s; bound {bound}) | others moved | registry −10 (s) | +10 led (s) |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in runs {
        let reg = |k: &str| {
            r["registry"][k]
                .as_f64()
                .map_or("—".to_string(), |v| format!("{v:.1}"))
        };
        out.push_str(&format!(
            "| {} | {:.0} | {:.0} | {:.1} | {:.1} | {} | {:.1} | {} | {:.1} | {} | {} | {} |\n",
            r["members"],
            r["testbed"]["bring_up_s"].as_f64().unwrap(),
            r["testbed"]["pss_mib"].as_f64().unwrap(),
            r["testbed"]["idle_cpu_pct"].as_f64().unwrap(),
            r["led_after_s"].as_f64().unwrap(),
            r["shares"],
            r["converged_s"].as_f64().unwrap(),
            r["failover"]["victim_led"],
            r["failover"]["all_led_again_s"].as_f64().unwrap(),
            r["failover"]["others_changed_leader"],
            reg("removed_s"),
            reg("added_and_led_s"),
        ));
    }
    out.push_str("\n### Each replica, idle, after convergence\n\n| members | replica | leads | RSS (MiB) | CPU (% core) | Lease writes/s | GETs/s | connections to members | fds |\n|---|---|---|---|---|---|---|---|---|\n");
    for r in runs {
        for i in r["idle"].as_array().unwrap() {
            out.push_str(&format!(
                "| {} | {} | {} | {:.1} | {:.2} | {:.2} | {:.2} | {} | {} |\n",
                r["members"],
                i["id"].as_str().unwrap(),
                i["led"],
                i["rss_mib"].as_f64().unwrap(),
                i["cpu_pct"].as_f64().unwrap(),
                i["lease_writes_per_s"].as_f64().unwrap(),
                i["gets_per_s"].as_f64().unwrap(),
                i["member_connections"],
                i["fds"],
            ));
        }
    }
    out
}

#[tokio::main]
async fn main() {
    let sizes: Vec<usize> = std::env::var("SCALE_SIZES")
        .unwrap_or_else(|_| "3,20,50".into())
        .split(',')
        .map(|s| s.trim().parse().expect("SCALE_SIZES: numbers"))
        .collect();
    let before: usize = std::fs::read_to_string(fleet_dir().join("members"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(3);
    let mut runs = Vec::new();
    for n in sizes {
        runs.push(run(n).await);
        write_json("scale", &runs);
    }
    fleet_cmd(&["up", "--clusters", &before.to_string()]);
    let mut md = table(&runs);
    if runs.len() >= 2 {
        md.push_str(&model(&runs));
    }
    std::fs::write(bench_dir().join("scale.md"), &md).expect("scale.md");
    println!("{md}");
}
