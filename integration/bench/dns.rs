//! Health-aware fleet DNS figures (`make bench-dns`; the local fleet and
//! its registry, which make starts): three release-built replicas with the
//! defaults (`--dns-withdraw-after 5s`, `--dns-restore-after 5s`, TTL 10 s)
//! and the tests' 2 s Leases.
//!
//! - withdraw: member-2's apiserver killed, to the fleet-wide answer
//!   without it, over FLOTILLA_BENCH_DNS_TRIALS (10) trials, split into
//!   detection (to the DNS writer's own index no longer seeing `web`
//!   healthy there, read from its gRPC `dns` field),
//!   window, decision and etcd write (to member-2's key gone from etcd,
//!   less the window), and CoreDNS visibility (to `dig` without it), all
//!   from a kill -9 of the apiserver; then the time back after it is
//!   started again;
//! - blips: FLOTILLA_BENCH_DNS_BLIPS (20) SIGSTOPs of member-2's apiserver
//!   for 3 s, shorter than the window: how many the fleet saw, and how many
//!   withdrew member-2 (goal 0);
//! - takeover: kill -9 of the DNS writer while a new Microservice becomes
//!   Available, to its fleet-wide name resolving;
//! - steady: FLOTILLA_BENCH_DNS_OBJECTS (500) Microservices in each member
//!   (1,500 in all), all Available, then FLOTILLA_BENCH_DNS_STEADY_SECONDS
//!   (120) with nothing changing: registry writes (extrapolated to a day,
//!   goal 0) and the DNS writer's CPU.
//!
//! Results: `.fleet/bench/dns.json`.

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use futures::{StreamExt, stream};
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::json;
use tokio::time::Instant;

use common::{apiserver_pid, cpu_seconds, env_usize, write_json};
use flotilla::api::client::{Client as GrpcClient, ClientOptions, connect};
use flotilla::api::pb;
use flotilla::crd::Microservice;
use flotilla::registry::{Registration, Registry};
use support::registry::{dig, zone};
use support::replicas::*;
use support::{client, eventually, http_get, microservice, percentile};

const WAIT: Duration = Duration::from_secs(180);
const WINDOW_S: f64 = 5.0;

async fn metric(replicas: &Replicas, id: &str, series: &str) -> Option<f64> {
    let (_, body) = http_get(&format!("{}/metrics", replicas.metrics_url(id))).await?;
    body.lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse().ok())
}

async fn dns_writer(replicas: &Replicas, ns: &str) -> String {
    let home = client("home").await;
    let lease = format!("{}-dns", replicas.lease_name());
    eventually("a DNS writer", WAIT, || {
        let (home, lease) = (home.clone(), lease.clone());
        async move { holder_in(&home, ns, &lease).await }
    })
    .await
}

async fn present(registry: &Registry, key: &str) -> bool {
    registry
        .read(&[key.to_string()])
        .await
        .is_ok_and(|v| !v.is_empty())
}

async fn service_ip(c: &Client, ns: &str, name: &str) -> String {
    let s = Api::<k8s_openapi::api::core::v1::Service>::namespaced(c.clone(), ns)
        .get(name)
        .await
        .expect("the Service");
    s.spec.and_then(|s| s.cluster_ip).expect("a ClusterIP")
}

async fn create_available(members: &BTreeMap<&str, Client>, ns: &str, name: &str, replicas: i32) {
    for c in members.values() {
        Api::<Microservice>::namespaced(c.clone(), ns)
            .create(
                &PostParams::default(),
                &microservice(name, "ghcr.io/acme/web:1", 8080, Some(replicas)),
            )
            .await
            .expect("create");
    }
    for c in members.values() {
        let api = Api::<Microservice>::namespaced(c.clone(), ns);
        support::wait_condition(&api, name, "Available", "True", None).await;
        support::wait_condition(&api, name, "Registered", "True", None).await;
    }
}

fn spread(v: &mut [f64]) -> serde_json::Value {
    v.sort_by(f64::total_cmp);
    json!({
        "p50_s": percentile(v, 0.5),
        "p99_s": percentile(v, 0.99),
        "max_s": v.last().copied().unwrap_or(f64::NAN),
    })
}

/// How the DNS writer's own index sees `cluster` for `ns/web` now
/// ("Healthy", "Unhealthy", "Unreachable"), from its gRPC `dns` field.
async fn health(grpc: &mut GrpcClient, ns: &str, cluster: &str) -> Option<String> {
    let m = grpc
        .get_microservice(pb::GetMicroserviceRequest {
            namespace: ns.to_string(),
            name: "web".into(),
        })
        .await
        .ok()?
        .into_inner();
    m.dns?
        .clusters
        .into_iter()
        .find(|c| c.cluster == cluster)
        .map(|c| c.health)
}

/// One withdrawal: member-2's apiserver killed until its address leaves
/// the answer, then started until it is back. Seconds from the kill:
/// detect, decide+write beyond the window, visible, total; and back, from
/// the start command.
#[allow(clippy::too_many_arguments)]
async fn trial(
    replicas: &Replicas,
    writer: &str,
    registry: &Registry,
    ns: &str,
    key: &str,
    name: &str,
    ip2: &str,
) -> [f64; 5] {
    let mut grpc = connect(&ClientOptions {
        server: replicas.grpc_url(writer),
        ..Default::default()
    })
    .await
    .expect("connect to the DNS writer");
    // kill -9: the apiserver is gone at once (`fleet stop` gives it 10 s
    // of SIGTERM first, and it stops answering somewhere inside them).
    let pid = apiserver_pid("member-2");
    let t0 = Instant::now();
    signal(pid, "KILL");
    let (mut detect, mut written, mut visible) = (None, None, None);
    while visible.is_none() && t0.elapsed() < WAIT {
        let at = t0.elapsed().as_secs_f64();
        if detect.is_none()
            && health(&mut grpc, ns, "member-2")
                .await
                .is_some_and(|h| h != "Healthy")
        {
            detect = Some(at);
        }
        if written.is_none() && !present(registry, key).await {
            written = Some(at);
        }
        if written.is_some() && !dig(name, "A").contains(&ip2.to_string()) {
            visible = Some(t0.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (detect, written, visible) = (
        detect.expect("member-2 seen unreachable"),
        written.expect("member-2's key withdrawn"),
        visible.expect("member-2 gone from the answer"),
    );
    let back = Instant::now();
    support::fleet_cmd(&["start", "member-2"]);
    eventually("member-2 back in the answer", WAIT, || {
        let got = dig(name, "A");
        async move { got.contains(&ip2.to_string()).then_some(()) }
    })
    .await;
    [
        detect,
        written - detect - WINDOW_S,
        visible - written,
        visible,
        back.elapsed().as_secs_f64(),
    ]
}

/// For `seconds`: whether the DNS writer saw member-2 unhealthy, and
/// whether member-2's key left the fleet-wide name.
async fn observe(
    grpc: &mut GrpcClient,
    registry: &Registry,
    ns: &str,
    key: &str,
    seconds: u64,
) -> (bool, bool) {
    let t0 = Instant::now();
    let (mut saw, mut lost) = (false, false);
    while t0.elapsed() < Duration::from_secs(seconds) {
        saw |= health(grpc, ns, "member-2")
            .await
            .is_some_and(|h| h != "Healthy");
        lost |= !present(registry, key).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (saw, lost)
}

fn signal(pid: u32, s: &str) {
    let ok = std::process::Command::new("kill")
        .args([&format!("-{s}"), &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -{s} {pid}");
}

async fn run() -> serde_json::Value {
    let trials = env_usize("FLOTILLA_BENCH_DNS_TRIALS", 10);
    let blips = env_usize("FLOTILLA_BENCH_DNS_BLIPS", 20);
    let objects = env_usize("FLOTILLA_BENCH_DNS_OBJECTS", 500);
    let steady_s = env_usize("FLOTILLA_BENCH_DNS_STEADY_SECONDS", 120) as u64;
    let members = member_clients().await;
    let (ns, _guards) = namespaces(&members, "bench-dns").await;
    let mut replicas = Replicas::new(&ns, &MEMBERS);
    replicas.env.extend(support::registry::env());
    replicas
        .extra_args
        .extend(["--registry-sweep-period", "1h"].map(String::from));
    for id in REPLICA_IDS {
        replicas.start(id);
    }
    balanced(&members, &replicas.lease_name(), &REPLICA_IDS).await;
    let Registration::Ready(registry) = support::registry::registration().await else {
        panic!("the test bed's registry config is valid");
    };
    let registry = registry.as_ref().clone();
    create_available(&members, &ns, "web", 1).await;
    let name = format!("web.{ns}.{}", zone());
    let ip2 = service_ip(&members["member-2"], &ns, "web").await;
    let key = format!("{}/{ns}/web/member-2", registry.zone().prefix);
    eventually("web listed everywhere", WAIT, || {
        let got = dig(&name, "A");
        async move { (got.len() == 3).then_some(()) }
    })
    .await;

    // Withdrawals.
    let mut parts: [Vec<f64>; 5] = Default::default();
    for i in 0..trials {
        let writer = dns_writer(&replicas, &ns).await;
        let t = trial(&replicas, &writer, &registry, &ns, &key, &name, &ip2).await;
        eprintln!(
            "trial {i}: detect {:.2} s, decide+write {:.2} s beyond the window, visible {:.2} s, total {:.2} s, back {:.2} s",
            t[0], t[1], t[2], t[3], t[4]
        );
        for (v, x) in parts.iter_mut().zip(t) {
            v.push(x);
        }
    }

    // Blips shorter than the window: SIGSTOP, 3 s, SIGCONT.
    let writer = dns_writer(&replicas, &ns).await;
    let mut grpc = connect(&ClientOptions {
        server: replicas.grpc_url(&writer),
        ..Default::default()
    })
    .await
    .expect("connect to the DNS writer");
    let (mut seen, mut withdrawn) = (0, 0);
    for _ in 0..blips {
        let pid = apiserver_pid("member-2");
        signal(pid, "STOP");
        let (saw, lost) = observe(&mut grpc, &registry, &ns, &key, 3).await;
        signal(pid, "CONT");
        // Watch through the recovery, past the window.
        let (saw_after, lost_after) = observe(&mut grpc, &registry, &ns, &key, 8).await;
        let (saw, lost) = (saw || saw_after, lost || lost_after);
        seen += usize::from(saw);
        withdrawn += usize::from(lost);
    }
    eprintln!("blips: {seen}/{blips} seen by the fleet, {withdrawn} withdrew member-2");

    // Takeover: kill -9 of the writer while a new name becomes Available.
    let writer = dns_writer(&replicas, &ns).await;
    let t0 = Instant::now();
    replicas.kill_9(&writer);
    let home = client("home").await;
    let lease = format!("{}-dns", replicas.lease_name());
    let (successor, lease_s) = {
        let (home, lease, ns, writer) = (&home, &lease, &ns, &writer);
        let successor = eventually("a successor holds the DNS Lease", WAIT, || async move {
            holder_in(home, ns, lease).await.filter(|h| h != writer)
        })
        .await;
        (successor, t0.elapsed().as_secs_f64())
    };
    create_available(&members, &ns, "fresh", 1).await;
    let available = Instant::now();
    let available_s = t0.elapsed().as_secs_f64();
    let fresh = format!("fresh.{ns}.{}", zone());
    eventually("fresh resolves", WAIT, || {
        let got = dig(&fresh, "A");
        async move { (got.len() == 3).then_some(()) }
    })
    .await;
    let listed_s = available.elapsed().as_secs_f64();
    let takeover_s = t0.elapsed().as_secs_f64();
    eprintln!(
        "takeover: {writer} killed; {successor} held the Lease after {lease_s:.2} s; fresh Available everywhere at {available_s:.2} s and listed {listed_s:.2} s later"
    );
    replicas.start(&writer);

    // Steady: many names, nothing changing.
    let names: Vec<String> = (0..objects).map(|i| format!("svc-{i:04}")).collect();
    for c in members.values() {
        let api = Api::<Microservice>::namespaced(c.clone(), &ns);
        stream::iter(names.clone())
            .map(|n| {
                let api = api.clone();
                async move {
                    api.create(
                        &PostParams::default(),
                        &microservice(&n, "ghcr.io/acme/svc:1", 8080, Some(0)),
                    )
                    .await
                    .expect("create");
                }
            })
            .buffer_unordered(8)
            .collect::<Vec<()>>()
            .await;
    }
    let expected = 3 * (objects + 2);
    let writer = dns_writer(&replicas, &ns).await;
    let listed = "flotilla_dns_records{state=\"listed\"}";
    eventually(
        "every name listed in every member",
        Duration::from_secs(1800),
        || {
            let (replicas, writer) = (&replicas, &writer);
            async move {
                let n = metric(replicas, writer, listed).await.unwrap_or(0.0);
                (n as usize >= expected).then_some(())
            }
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let writes = "flotilla_dns_writes_total{result=\"applied\"}";
    let before_writes = metric(&replicas, &writer, writes).await.unwrap_or(0.0);
    let zone_before = registry.read_zone().await.expect("zone");
    // Every replica's CPU: the others are the baseline the writer's
    // extra work shows against (each leads one member).
    let ids: Vec<String> = REPLICA_IDS.iter().map(|s| s.to_string()).collect();
    let cpu_before: Vec<f64> = ids.iter().map(|id| cpu_seconds(replicas.pid(id))).collect();
    tokio::time::sleep(Duration::from_secs(steady_s)).await;
    let cpus: BTreeMap<String, f64> = ids
        .iter()
        .zip(&cpu_before)
        .map(|(id, b)| (id.clone(), cpu_seconds(replicas.pid(id)) - b))
        .collect();
    let cpu = cpus[&writer];
    let zone_after = registry.read_zone().await.expect("zone");
    let after_writes = metric(&replicas, &writer, writes).await.unwrap_or(0.0);
    let revisions = |z: &[flotilla::registry::records::Existing]| -> BTreeMap<String, i64> {
        z.iter().map(|e| (e.key.clone(), e.mod_revision)).collect()
    };
    let changed = revisions(&zone_before)
        .iter()
        .filter(|(k, r)| revisions(&zone_after).get(*k) != Some(r))
        .count();
    let per_day = |n: f64| n * 86_400.0 / steady_s as f64;
    eprintln!(
        "steady: {} fleet DNS writes and {changed} keys changed in {steady_s} s; writer CPU {cpu:.1} s",
        after_writes - before_writes
    );

    let [detect, decide, visible, total, back] = parts;
    let mut detect = detect;
    let mut decide = decide;
    let mut visible = visible;
    let mut total = total;
    let mut back = back;
    let result = json!({
        "settings": {"withdraw_after_s": WINDOW_S, "restore_after_s": 5, "ttl_s": 10, "leases": "tests' (2 s / 1.5 s / 300 ms)"},
        "withdraw": {
            "trials": trials,
            "detect": spread(&mut detect),
            "decide_and_write_beyond_window": spread(&mut decide),
            "coredns_visible_after_write": spread(&mut visible),
            "stop_to_answer_without_it": spread(&mut total),
            "client_worst_case_s": percentile(&total, 0.99) + 10.0,
            "back_after_start": spread(&mut back),
        },
        "blips": {"count": blips, "length_s": 3, "seen_by_fleet": seen, "premature_withdrawals": withdrawn},
        "takeover": {
            "kill_9_to_successor_holding_lease_s": lease_s,
            "new_name_available_to_listed_s": listed_s,
            "kill_9_to_new_name_resolving_s": takeover_s,
            "from": writer,
            "to": successor,
        },
        "steady": {
            "microservices": 3 * (objects + 2),
            "seconds": steady_s,
            "fleet_dns_writes": after_writes - before_writes,
            "fleet_dns_writes_per_day": per_day(after_writes - before_writes),
            "zone_keys": zone_after.len(),
            "zone_keys_changed": changed,
            "writer": writer,
            "writer_cpu_s": cpu,
            "writer_cpu_share": cpu / steady_s as f64,
            "replica_cpu_s": cpus,
        },
    });
    // Deleted while the replicas run, so the registry's finalizers come
    // off and the namespace can go.
    for c in members.values() {
        let api = Api::<Microservice>::namespaced(c.clone(), &ns);
        api.delete_collection(&Default::default(), &Default::default())
            .await
            .expect("delete Microservices");
    }
    let gone = tokio::time::timeout(Duration::from_secs(600), async {
        for c in members.values() {
            let api = Api::<Microservice>::namespaced(c.clone(), &ns);
            while !api
                .list(&Default::default())
                .await
                .is_ok_and(|l| l.items.is_empty())
            {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    })
    .await;
    if gone.is_err() {
        eprintln!("some Microservices were not deleted within 600 s");
    }
    drop(replicas);
    result
}

fn main() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let result = rt.block_on(run());
    write_json("dns", &result);
    println!("{}", serde_json::to_string_pretty(&result).expect("json"));
}
