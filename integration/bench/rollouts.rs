//! Many fleet rollouts at once (`make bench-rollouts`): K FleetMicroservices
//! over N real members (defaults 100 and 50, `FLOTILLA_BENCH_ROLLOUTS`,
//! `FLOTILLA_BENCH_MEMBERS`), three waves (a one-cluster canary, half the
//! fleet, the rest), no bake, three release-built replicas.
//!
//! - first release: every object created, until all are Complete;
//! - clean: every image edited at once; per object, edit to `Complete`
//!   (p50, p90, max), and home and member writes per rollout;
//! - black hole: the last member's apiserver stopped (SIGSTOP: it accepts
//!   connections and answers nothing), ten more objects placed on it alone, and
//!   every measured image edited again. The measured objects are placed on
//!   every member but that one, so their p90 shows whether one hung member
//!   slows the others.
//!
//! With `FLOTILLA_BENCH_ANALYSIS=1`, every FleetMicroservice also has a
//! webhook check (interval 1 s) served by the bench, answering 200 at once:
//! the clean release then reports the gate's decision latency, from the
//! last answer a wave's check gave to the next wave's first member write
//! (member audit logs), p50 and p99 over every rollout and wave boundary,
//! and the writes per rollout show what the checks add.
//!
//! Results: `.fleet/bench/rollouts.json`. The fleet is put back at 3 members.

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use futures::{StreamExt, stream};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::time::Instant;

use common::{apiserver_pid, env_usize, write_json};
use support::replicas::*;
use support::rollout::{controller_writes, fleet_microservice};
use support::{client, ensure_crd, ensure_fleet_crd, eventually, fleet_cmd, from_json, percentile};

use flotilla::rollout::spec::{FleetMicroservice, RolloutPhase};

/// The bench's analysis webhook: answers 200 at once, and keeps when it
/// answered each (FleetMicroservice, revision, wave).
#[derive(Clone, Default)]
struct Gate {
    url: String,
    answers: std::sync::Arc<std::sync::Mutex<Vec<Answered>>>,
}

/// (FleetMicroservice, revision, wave, when the webhook answered).
type Answered = (String, String, String, jiff::Timestamp);

impl Gate {
    async fn serve() -> Gate {
        let mut gate = Gate::default();
        let answers = gate.answers.clone();
        let app = axum::Router::new().route(
            "/gate",
            axum::routing::post(move |body: axum::body::Bytes| {
                let answers = answers.clone();
                async move {
                    let b: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
                    answers.lock().unwrap().push((
                        text(&b["fleetMicroservice"]["name"]),
                        text(&b["revision"]),
                        text(&b["wave"]),
                        jiff::Timestamp::now(),
                    ));
                    http::StatusCode::OK
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        gate.url = format!("http://{}/gate", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.ok() });
        gate
    }

    /// Seconds from the last answer of each wave's check to the next
    /// wave's first member write, per rollout of `items` and boundary.
    fn latencies(
        &self,
        items: &[FleetMicroservice],
        namespace: &str,
        members: &[&str],
    ) -> Vec<f64> {
        let answers = self.answers.lock().unwrap().clone();
        // (name, revision, member) -> first write.
        let mut first: BTreeMap<(String, String, String), jiff::Timestamp> = BTreeMap::new();
        for m in members {
            for w in support::rollout::fleet_writes(m, namespace) {
                let Some(rev) = w.revision else { continue };
                first
                    .entry((w.name, rev, m.to_string()))
                    .or_insert(w.received);
            }
        }
        let mut out = Vec::new();
        for f in items {
            let name = f.metadata.name.clone().unwrap_or_default();
            let Some(st) = &f.status else { continue };
            let Some(rev) = st.update_revision.clone() else {
                continue;
            };
            for pair in st.waves.windows(2) {
                let opened = pair[1]
                    .clusters
                    .iter()
                    .filter_map(|c| first.get(&(name.clone(), rev.clone(), c.clone())))
                    .min();
                let Some(opened) = opened else { continue };
                let last = answers
                    .iter()
                    .filter(|(n, r, w, at)| {
                        n == &name && r == &rev && w == &pair[0].name && at <= opened
                    })
                    .map(|(_, _, _, at)| *at)
                    .max();
                if let Some(last) = last {
                    out.push(opened.duration_since(last).as_secs_f64());
                }
            }
        }
        out
    }
}

/// The bench webhook's URL, when the run has analysis.
static GATE_URL: std::sync::OnceLock<String> = std::sync::OnceLock::new();

fn analysed() -> bool {
    std::env::var("FLOTILLA_BENCH_ANALYSIS").is_ok_and(|v| v == "1")
}

fn manifest(name: &str, image: &str, skip: Option<&str>) -> serde_json::Value {
    let mut m = fleet_microservice(
        name,
        image,
        json!({"waves": [
            {"name": "canary", "clusterSelector": {"matchLabels": {"ring": "canary"}}},
            {"name": "early", "clusterSelector": {"matchLabels": {"ring": "early"}}},
        ]}),
    );
    m["spec"]["template"]["replicas"] = json!(0);
    if let Some(url) = GATE_URL.get() {
        m["spec"]["rollout"]["analysis"] =
            json!([{"name": "gate", "webhook": {"url": url}, "interval": "1s"}]);
    }
    if let Some(member) = skip {
        m["spec"]["placement"] = json!({"clusterSelector": {"matchExpressions": [{
            "key": "platform.example.io/cluster-name", "operator": "NotIn", "values": [member],
        }]}});
    }
    m
}

/// Sets every named object's image at once; returns when each edit landed.
async fn release(
    api: &Api<FleetMicroservice>,
    names: &[String],
    image: &str,
) -> BTreeMap<String, Instant> {
    stream::iter(names.iter().cloned())
        .map(|n| {
            let api = api.clone();
            let image = image.to_string();
            async move {
                api.patch(
                    &n,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"template": {"image": image}}})),
                )
                .await
                .expect("edit");
                (n, Instant::now())
            }
        })
        .buffer_unordered(16)
        .collect()
        .await
}

/// Seconds from each object's edit to `Complete` at its generation.
async fn until_complete(
    api: &Api<FleetMicroservice>,
    edited: &BTreeMap<String, Instant>,
    limit: Duration,
) -> Vec<f64> {
    let mut done: BTreeMap<String, f64> = BTreeMap::new();
    let until = Instant::now() + limit;
    while done.len() < edited.len() && Instant::now() < until {
        if let Ok(list) = api.list(&ListParams::default()).await {
            for f in list.items {
                let name = f.metadata.name.clone().unwrap_or_default();
                let Some(at) = edited.get(&name) else {
                    continue;
                };
                let st = f.status.as_ref();
                let complete = st.is_some_and(|s| {
                    s.observed_generation == f.metadata.generation
                        && s.phase == Some(RolloutPhase::Complete)
                });
                if complete && !done.contains_key(&name) {
                    done.insert(name, at.elapsed().as_secs_f64());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(
        done.len(),
        edited.len(),
        "only {} of {} rollouts completed within {limit:?}",
        done.len(),
        edited.len()
    );
    done.into_values().collect()
}

fn figures(times: &mut [f64]) -> serde_json::Value {
    times.sort_by(|a, b| a.total_cmp(b));
    json!({
        "p50_s": percentile(times, 0.5),
        "p90_s": percentile(times, 0.9),
        "max_s": times.last().copied().unwrap_or(f64::NAN),
    })
}

async fn writes_per_rollout(
    replicas: &Replicas,
    before: &(BTreeMap<String, f64>, f64),
    k: usize,
) -> serde_json::Value {
    let (home, members) = controller_writes(replicas).await;
    let per = |v: f64| v / k as f64;
    let home_total: f64 = home.values().sum::<f64>() - before.0.values().sum::<f64>();
    let by_kind: BTreeMap<String, f64> = home
        .iter()
        .map(|(kind, v)| {
            (
                kind.clone(),
                per(v - before.0.get(kind).copied().unwrap_or(0.0)),
            )
        })
        .collect();
    json!({
        "home_writes_per_rollout": per(home_total),
        "home_writes_by_kind_per_rollout": by_kind,
        "member_writes_per_rollout": per(members - before.1),
    })
}

async fn run(n: usize, k: usize) -> serde_json::Value {
    fleet_cmd(&["up", "--clusters", &n.to_string()]);
    let names: Vec<String> = (1..=n).map(|i| format!("member-{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut clients = BTreeMap::new();
    for m in &refs {
        let c = client(m).await;
        ensure_crd(&c).await;
        clients.insert(*m, c);
    }
    let home = client("home").await;
    ensure_fleet_crd(&home).await;
    let (ns, _guards) = namespaces(&clients, "bench-rollouts").await;
    let mut replicas = Replicas::new(&ns, &refs);
    // Lease timings as installed (15 s, 10 s, 2 s): the tests' 2 s Leases
    // are renewed every 300 ms, 150 requests a second per replica at 50
    // members, and miss their 1.5 s deadline on a loaded machine.
    if std::env::var("FLOTILLA_BENCH_FAST_ELECTION").is_err() {
        replicas.election = Vec::new();
    }
    std::fs::write(replicas.dir.join("member-1.labels"), "ring: canary\n").expect("labels");
    for m in &refs[1..n / 2] {
        std::fs::write(replicas.dir.join(format!("{m}.labels")), "ring: early\n").expect("labels");
    }
    for id in REPLICA_IDS {
        replicas.start(id);
    }
    let lease = replicas.lease_name();
    eventually("every member led", Duration::from_secs(300), || {
        let (clients, lease) = (&clients, lease.clone());
        async move {
            holders(clients, &lease)
                .await
                .values()
                .all(Option::is_some)
                .then_some(())
        }
    })
    .await;
    let api: Api<FleetMicroservice> = Api::namespaced(home.clone(), &ns);
    let leases: Api<Lease> = Api::namespaced(home.clone(), &ns);
    let rollout_lease = format!("flotilla-{}-rollouts", replicas.fleet);
    let handovers = || {
        let (leases, name) = (leases.clone(), rollout_lease.clone());
        async move {
            leases
                .get_opt(&name)
                .await
                .ok()
                .flatten()
                .and_then(|l| l.spec?.lease_transitions)
                .unwrap_or(0)
        }
    };
    let last = names.last().expect("a member").clone();
    let gate = match analysed() {
        true => {
            let g = Gate::serve().await;
            GATE_URL.set(g.url.clone()).ok();
            Some(g)
        }
        false => None,
    };
    let measured: Vec<String> = (0..k).map(|i| format!("svc-{i}")).collect();

    // First release: created.
    let started = Instant::now();
    let created: BTreeMap<String, Instant> = stream::iter(measured.iter().cloned())
        .map(|name| {
            let api = api.clone();
            let last = last.clone();
            async move {
                let obj: FleetMicroservice =
                    from_json(manifest(&name, "ghcr.io/acme/svc:1", Some(&last)));
                api.create(&PostParams::default(), &obj)
                    .await
                    .expect("create");
                (name, Instant::now())
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let handed = handovers().await;
    let mut first = until_complete(&api, &created, Duration::from_secs(1800)).await;
    let first_handovers = handovers().await - handed;
    let first_all = started.elapsed().as_secs_f64();
    eprintln!("first release: {k} rollouts Complete in {first_all:.1} s");

    // Clean: every image at once.
    let before = controller_writes(&replicas).await;
    let handed = handovers().await;
    let edited = release(&api, &measured, "ghcr.io/acme/svc:2").await;
    let mut clean = until_complete(&api, &edited, Duration::from_secs(1800)).await;
    let clean_writes = writes_per_rollout(&replicas, &before, k).await;
    let clean_handovers = handovers().await - handed;
    eprintln!("clean: {}", figures(&mut clean));
    let gate_latency = match &gate {
        Some(g) => {
            let items = api.list(&ListParams::default()).await.expect("list").items;
            let mut l = g.latencies(&items, &ns, &refs);
            l.sort_by(f64::total_cmp);
            let calls = g.answers.lock().unwrap().len();
            json!({
                "boundaries": l.len(),
                "p50_s": percentile(&l, 0.5),
                "p99_s": percentile(&l, 0.99),
                "max_s": l.last().copied().unwrap_or(f64::NAN),
                "webhook_calls_per_rollout_all_releases": calls as f64 / k as f64,
            })
        }
        None => json!(null),
    };

    // One member black-holed, ten objects placed on it too.
    let pid = apiserver_pid(&last);
    let signal = |s: &str| {
        let ok = std::process::Command::new("kill")
            .args([&format!("-{s}"), &pid.to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill -{s} {pid}");
    };
    signal("STOP");
    // Placed on the black-holed member alone: they add writes that hang
    // and no work on the other members, so the measured objects' p90
    // shows the hung member's effect, not ten more rollouts' load.
    for i in 0..10 {
        let mut m = manifest(&format!("stuck-{i}"), "ghcr.io/acme/stuck:1", None);
        m["spec"]["placement"] = json!({"clusterSelector": {"matchExpressions": [{
            "key": "platform.example.io/cluster-name", "operator": "In", "values": [last],
        }]}});
        let obj: FleetMicroservice = from_json(m);
        api.create(&PostParams::default(), &obj)
            .await
            .expect("create");
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = controller_writes(&replicas).await;
    let handed = handovers().await;
    let edited = release(&api, &measured, "ghcr.io/acme/svc:3").await;
    let blackholed = until_complete(&api, &edited, Duration::from_secs(1800)).await;
    let blackholed_writes = writes_per_rollout(&replicas, &before, k).await;
    let blackholed_handovers = handovers().await - handed;
    signal("CONT");
    let mut blackholed = blackholed;
    let result = json!({
        "members": n,
        "rollouts": k,
        "waves": ["canary (1)", format!("early ({})", n / 2 - 1), format!("remaining ({})", n - n / 2)],
        "first_release": figures(&mut first),
        "first_release_all_s": first_all,
        "election": if replicas.election.is_empty() { "as installed (15 s / 10 s / 2 s)" } else { "tests' (2 s / 1.5 s / 300 ms)" },
        "rollout_lease_handovers": {"first": first_handovers, "clean": clean_handovers, "black_holed": blackholed_handovers},
        "clean": figures(&mut clean),
        "clean_writes": clean_writes,
        "analysis": if gate.is_some() { "a webhook check per FleetMicroservice, interval 1s" } else { "none" },
        "gate_latency": gate_latency,
        "one_member_black_holed": figures(&mut blackholed),
        "black_holed_writes": blackholed_writes,
    });
    // Deleted while the replicas run, so their finalizers are taken off
    // and the namespace can go.
    api.delete_collection(&Default::default(), &ListParams::default())
        .await
        .expect("delete FleetMicroservices");
    let gone = tokio::time::timeout(Duration::from_secs(180), async {
        while !api
            .list(&ListParams::default())
            .await
            .is_ok_and(|l| l.items.is_empty())
        {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
    .await;
    if gone.is_err() {
        eprintln!("some FleetMicroservices were not deleted within 180 s");
    }
    drop(replicas);
    result
}

fn main() {
    let n = env_usize("FLOTILLA_BENCH_MEMBERS", 50);
    let k = env_usize("FLOTILLA_BENCH_ROLLOUTS", 100);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let result = rt.block_on(run(n, k));
    write_json("rollouts", &result);
    println!("{}", serde_json::to_string_pretty(&result).expect("json"));
    // The test bed back at its usual size.
    fleet_cmd(&["up", "--clusters", "3"]);
}
