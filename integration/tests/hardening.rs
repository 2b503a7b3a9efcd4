//! Hardening of leadership and credentials, against the real fleet:
//! - a deposed leader with a write backlog writes nothing once its successor
//!   holds the Lease (the fence at the wire), proven from the audit log;
//! - a black-holed member costs the Lease within the renew deadline, and
//!   shutdown still completes (every Lease round is bounded);
//! - a replica that took a cluster over from an owner that cannot contest
//!   keeps it (no flapping), and a joining replica gets its share handed
//!   over without waiting out the Lease;
//! - fleet replicas need an identity of their own;
//! - kubeconfigs from Secrets are data: commands, files, proxies and
//!   skipped TLS checks make them Invalid, and nothing they name is touched.
//!
//! The timing tests run one at a time: they measure handoffs in fractions of
//! a second on two shared cores.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::json;
use support::replicas::*;
use support::{
    TestNamespace, assert_writes_inside_leadership, audited_writes, client, eventually, from_json,
    http_get, kubeconfig_path, kubeconfig_via, lease_writes, microservice, output_within,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use flotilla::api::client::{ClientOptions, connect};
use flotilla::api::pb;
use flotilla::crd::Microservice;

const RENEW_DEADLINE: Duration = Duration::from_millis(1500);

/// Each test has its own runtime; tokio's Mutex serves them all.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn only(member: &'static str) -> BTreeMap<&'static str, Client> {
    let c = client(member).await;
    support::ensure_crd(&c).await;
    BTreeMap::from([(member, c)])
}

async fn lease(client: &Client, name: &str) -> Option<Lease> {
    Api::<Lease>::namespaced(client.clone(), LEASE_NAMESPACE)
        .get_opt(name)
        .await
        .ok()
        .flatten()
}

fn transitions(l: &Lease) -> i32 {
    l.spec
        .as_ref()
        .and_then(|s| s.lease_transitions)
        .unwrap_or_default()
}

/// The value of one series on a replica's /metrics, if present.
async fn metric(replicas: &Replicas, id: &str, series: &str) -> Option<f64> {
    let (_, body) = http_get(&format!("{}/metrics", replicas.metrics_url(id))).await?;
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

async fn sum_metric(replicas: &Replicas, id: &str, prefix: &str) -> f64 {
    let Some((_, body)) = http_get(&format!("{}/metrics", replicas.metrics_url(id))).await else {
        return 0.0;
    };
    body.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn a_deposed_leader_with_a_backlog_writes_nothing_once_its_successor_holds_the_lease() {
    let _serial = SERIAL.lock().await;
    let clients = only("member-1").await;
    let (ns, _guards) = namespaces(&clients, "fence").await;
    let member = clients["member-1"].clone();
    let mut replicas = Replicas::new(&ns, &["member-1"]);
    // A budget so small that writes queue behind it.
    replicas.extra_args = ["--cluster-qps", "2", "--cluster-burst", "1"]
        .map(String::from)
        .to_vec();
    replicas.start("fa");
    replicas.start("fb");
    let name = replicas.lease_name();
    // Whichever starts first takes the Lease, then hands it to the owner the
    // assignment gives member-1 once it sees the other: stopping the first
    // holder could stop a replica that no longer writes.
    let (leader, successor) = settled_owner("member-1", ["fa", "fb"]);
    eventually(
        "the assigned owner holding member-1",
        Duration::from_secs(30),
        || {
            let (member, name) = (member.clone(), name.clone());
            async move { (holder(&member, &name).await.as_deref() == Some(leader)).then_some(()) }
        },
    )
    .await;

    let api: Api<Microservice> = Api::namespaced(member.clone(), &ns);
    for i in 0..20 {
        api.create(
            &PostParams::default(),
            &microservice(&format!("svc-{i}"), "ghcr.io/acme/app:1", 8080, Some(1)),
        )
        .await
        .expect("create");
    }
    let ua = format!("flotilla/{leader}");
    eventually(
        "the leader writing its backlog",
        Duration::from_secs(30),
        || {
            let n = audited_writes("member-1", &ns)
                .iter()
                .filter(|w| w.user_agent == ua)
                .count();
            async move { (n >= 2).then_some(()) }
        },
    )
    .await;

    replicas.signal(leader, "STOP");
    let stopped = Instant::now();
    let successor_ua = format!("flotilla/{successor}");
    eventually(
        "the successor holding the Lease and writing",
        Duration::from_secs(60),
        || {
            let wrote = audited_writes("member-1", &ns)
                .iter()
                .any(|w| w.user_agent == successor_ua);
            let (member, name) = (member.clone(), name.clone());
            async move {
                let held = holder(&member, &name).await.as_deref() == Some(successor);
                (held && wrote).then_some(())
            }
        },
    )
    .await;
    let to_successor_write = stopped.elapsed();
    let stopped_at = jiff::Timestamp::now() - to_successor_write;
    let acquired = lease_writes("member-1", LEASE_NAMESPACE, &name)
        .into_iter()
        .find(|w| w.holder == successor && w.writer == successor && w.received > stopped_at)
        .expect("the successor's acquisition");
    let to_acquisition = acquired.received.duration_since(stopped_at);
    replicas.signal(leader, "CONT");
    // The old leader wakes with its queue full: give it time to try.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let fenced = sum_metric(&replicas, leader, "flotilla_fenced_writes_total{").await;
    drop(replicas);

    let checked = assert_writes_inside_leadership(
        "member-1",
        &ns,
        &name,
        RENEW_DEADLINE,
        Duration::from_millis(200),
    );
    assert!(checked > 2, "only {checked} operator writes were checked");
    println!(
        "figure: SIGSTOP to the successor's acquisition {:.2} s, to its first write {:.2} s (at 2 qps); writes fenced at the old leader {fenced}; operator writes checked {checked}",
        to_acquisition.as_secs_f64(),
        to_successor_write.as_secs_f64()
    );
}

/// The replica the assignment gives `member` when both run, and the other.
fn settled_owner(member: &str, pair: [&'static str; 2]) -> (&'static str, &'static str) {
    let clusters = BTreeSet::from([member.to_string()]);
    let live: BTreeSet<String> = pair.iter().map(|r| r.to_string()).collect();
    let owner = flotilla::fleet::shard::assign(&clusters, &live)[member].to_string();
    if owner == pair[0] {
        (pair[0], pair[1])
    } else {
        (pair[1], pair[0])
    }
}

/// A loopback TCP proxy that can stop forwarding without closing anything:
/// bytes are read and dropped, so requests neither fail nor get answers.
struct BlackHole {
    port: u16,
    swallow: Arc<AtomicBool>,
}

impl BlackHole {
    async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let swallow = Arc::new(AtomicBool::new(false));
        let s = swallow.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pump(cr, sw, s.clone()));
                tokio::spawn(pump(sr, cw, s.clone()));
            }
        });
        BlackHole { port, swallow }
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    swallow: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if swallow.load(Ordering::SeqCst) {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

// Two workers: the proxy runs in this runtime, and reading the audit log
// blocks the thread that reads it. On one thread, a long log starved the
// proxy and cost the replica its Lease before the test began.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_member_costs_the_lease_within_the_renew_deadline_and_shutdown_completes() {
    let _serial = SERIAL.lock().await;
    let clients = only("member-2").await;
    let (ns, _guards) = namespaces(&clients, "stall").await;
    let member = clients["member-2"].clone();
    let (_, upstream) = kubeconfig_via("member-2", 0);
    let proxy = BlackHole::start(upstream).await;
    let mut replicas = Replicas::new(&ns, &[]);
    let (kc, _) = kubeconfig_via("member-2", proxy.port);
    std::fs::write(replicas.dir.join("member-2.yaml"), kc).expect("write kubeconfig");
    replicas.start("stalled");
    let name = replicas.lease_name();
    eventually(
        "stalled leads member-2",
        Duration::from_secs(30),
        || async {
            let held = holder(&member, &name).await.as_deref() == Some("stalled");
            let gauge = metric(
                &replicas,
                "stalled",
                "flotilla_cluster_leader{cluster=\"member-2\"}",
            )
            .await;
            (held && gauge == Some(1.0)).then_some(())
        },
    )
    .await;
    // Keep it busy, so that writes are on their way when the line goes quiet.
    let api: Api<Microservice> = Api::namespaced(member.clone(), &ns);
    let create = |i: usize| {
        let api = api.clone();
        async move {
            api.create(
                &PostParams::default(),
                &microservice(&format!("stall-{i}"), "ghcr.io/acme/app:1", 8080, Some(1)),
            )
            .await
            .expect("create");
        }
    };
    create(0).await;
    eventually("stalled writing", Duration::from_secs(30), || {
        let wrote = audited_writes("member-2", &ns)
            .iter()
            .any(|w| w.user_agent == "flotilla/stalled");
        async move { wrote.then_some(()) }
    })
    .await;
    for i in 1..6 {
        create(i).await;
    }

    proxy.swallow.store(true, Ordering::SeqCst);
    let silenced = Instant::now();
    eventually("stalled stepping down", Duration::from_secs(30), || async {
        let gauge = metric(
            &replicas,
            "stalled",
            "flotilla_cluster_leader{cluster=\"member-2\"}",
        )
        .await;
        (gauge == Some(0.0)).then_some(())
    })
    .await;
    let stepped_down = silenced.elapsed();
    assert!(
        stepped_down <= RENEW_DEADLINE + RETRY_PERIOD + Duration::from_millis(500),
        "stepped down {stepped_down:?} after the member went silent"
    );

    let mut child = replicas.sigterm("stalled");
    let asked = Instant::now();
    let exited = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            asked.elapsed() < Duration::from_secs(15),
            "shutdown hangs on the silent member"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(exited.success(), "{exited:?}");
    let shutdown = asked.elapsed();
    let checked = assert_writes_inside_leadership(
        "member-2",
        &ns,
        &name,
        RENEW_DEADLINE,
        Duration::from_millis(200),
    );
    assert!(checked > 0, "no operator write was checked");
    println!(
        "figure: silent member to step-down {:.2} s; SIGTERM to exit {:.2} s; operator writes checked {checked}",
        stepped_down.as_secs_f64(),
        shutdown.as_secs_f64()
    );
}

#[tokio::test]
async fn a_replica_that_took_over_from_an_owner_that_cannot_contest_keeps_the_cluster() {
    let _serial = SERIAL.lock().await;
    let clients = only("member-3").await;
    let (ns, _guards) = namespaces(&clients, "keep").await;
    let member = clients["member-3"].clone();
    // Two replicas where the assignment gives member-3 to the one that does
    // not even know member-3: only the other can lead it, after the grace.
    let (taker, owner) = (0..)
        .map(|i| (format!("taker-{i}"), format!("owner-{i}")))
        .find(|(t, o)| {
            let clusters = BTreeSet::from(["member-3".to_string()]);
            let live = BTreeSet::from([t.clone(), o.clone()]);
            flotilla::fleet::shard::assign(&clusters, &live)["member-3"] == o.as_str()
        })
        .expect("some pair of ids");
    let mut replicas = Replicas::new(&ns, &["member-3"]);
    replicas.own_dir(&owner, &[]);
    replicas.start(&owner);
    replicas.start(&taker);
    let name = replicas.lease_name();
    let first = eventually(
        "the non-owner taking member-3",
        Duration::from_secs(60),
        || async {
            let l = lease(&member, &name).await?;
            let h = l.spec.as_ref()?.holder_identity.clone()?;
            (h == taker).then_some(l)
        },
    )
    .await;
    let epoch = transitions(&first);
    // Three lease durations without a single gap: same holder, same epoch,
    // renewed all along, and the taker leading throughout.
    let renewed = |l: &Lease| l.spec.as_ref().and_then(|s| s.renew_time.clone());
    let mut last_renewal = (renewed(&first), Instant::now());
    let watched = Instant::now();
    while watched.elapsed() < 3 * LEASE_DURATION {
        let l = lease(&member, &name).await.expect("the Lease exists");
        let h = l
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.clone())
            .unwrap_or_default();
        let at = watched.elapsed();
        assert_eq!(
            (h.as_str(), transitions(&l)),
            (taker.as_str(), epoch),
            "member-3 changed hands {at:?} after the takeover"
        );
        if renewed(&l) != last_renewal.0 {
            last_renewal = (renewed(&l), Instant::now());
        }
        assert!(
            last_renewal.1.elapsed() < LEASE_DURATION,
            "{taker} stopped renewing member-3 {at:?} after the takeover"
        );
        let gauge = metric(
            &replicas,
            &taker,
            "flotilla_cluster_leader{cluster=\"member-3\"}",
        )
        .await;
        assert_eq!(
            gauge,
            Some(1.0),
            "{taker} not leading member-3 {at:?} after the takeover"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_joining_replica_gets_its_share_handed_over_without_waiting_out_the_lease() {
    let _serial = SERIAL.lock().await;
    let ThreeReplicaFleet {
        clients,
        namespace: ns,
        guards: _guards,
        mut replicas,
        held,
    } = three_replica_fleet("join").await;
    let (joiner, moved) = joiner_taking_one_member();
    let name = replicas.lease_name();
    let from = held[&moved].clone();
    replicas.start(&joiner);
    let member = clients[moved.as_str()].clone();
    eventually(
        "the joiner leading its cluster",
        Duration::from_secs(30),
        || {
            let (member, name, joiner) = (member.clone(), name.clone(), joiner.clone());
            async move { (holder(&member, &name).await? == joiner).then_some(()) }
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let writes = lease_writes(&moved, LEASE_NAMESPACE, &name);
    let acquired = writes
        .iter()
        .position(|w| w.holder == joiner && w.writer == joiner)
        .expect("the joiner's acquiring write");
    let last_old = writes[..acquired]
        .iter()
        .rev()
        .find(|w| w.holder == from && w.writer == from)
        .expect("the old holder's last renewal");
    let released = writes[..acquired]
        .iter()
        .any(|w| w.writer == from && w.holder.is_empty());
    let gap = writes[acquired]
        .received
        .duration_since(last_old.received)
        .unsigned_abs();
    assert!(released, "{from} never released {moved}: {writes:#?}");
    assert!(
        gap <= RETRY_PERIOD + Duration::from_secs(1),
        "{moved} went {gap:?} from {from}'s last renewal to {joiner}'s acquisition"
    );
    for m in clients.keys() {
        assert_writes_inside_leadership(m, &ns, &name, RENEW_DEADLINE, Duration::from_millis(200));
    }
    println!(
        "figure: join handoff of {moved} from {from} to {joiner}: {:.0} ms from the last renewal to the acquisition",
        gap.as_secs_f64() * 1000.0
    );
}

#[test]
fn fleet_replicas_without_an_identity_refuse_to_start() {
    for _ in 0..2 {
        let out = output_within(
            Command::new(env!("CARGO_BIN_EXE_flotilla"))
                .args(["run", "--fleet", "--grpc-insecure"])
                .args([
                    "--grpc-addr",
                    "127.0.0.1:0",
                    "--metrics-addr",
                    "127.0.0.1:0",
                ])
                .env_remove("POD_NAME")
                .env_remove("FLOTILLA_REPLICA_ID"),
            Duration::from_secs(60),
        );
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("replica id") && err.contains("POD_NAME"),
            "{err}"
        );
    }
}

#[test]
fn the_manifests_give_every_replica_its_pod_name_as_identity() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/home/deployment.yaml");
    let text = std::fs::read_to_string(&path).expect("deployment manifest");
    let deployment = serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde_yaml::Value::deserialize(d).expect("yaml"))
        .find(|d| d["kind"] == "Deployment")
        .expect("a Deployment");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    assert!(args.contains(&"--replica-id=$(POD_NAME)"), "{args:?}");
    let pod_name = container["env"]
        .as_sequence()
        .expect("env")
        .iter()
        .find(|e| e["name"] == "POD_NAME")
        .expect("POD_NAME in env");
    assert_eq!(
        pod_name["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name",
        "POD_NAME must come from the pod's own name"
    );
    // The allocator setting the memory figures are measured with (#37).
    let arenas = container["env"]
        .as_sequence()
        .expect("env")
        .iter()
        .find(|e| e["name"] == "MALLOC_ARENA_MAX")
        .expect("MALLOC_ARENA_MAX in env");
    assert_eq!(arenas["value"], "2");
}

use serde::Deserialize as _;

/// A loopback listener that counts connections: the server hostile
/// kubeconfigs name. Nothing may ever connect to it.
async fn counting_listener() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    tokio::spawn(async move {
        while let Ok((_conn, _)) = listener.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
        }
    });
    (port, count)
}

fn hostile_kubeconfig(port: u16, cluster_extra: &str, user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{port}\n{cluster_extra}users:\n- name: u\n  user:\n{user}contexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n"
    )
}

#[tokio::test]
async fn hostile_member_secrets_are_invalid_and_nothing_they_name_is_touched() {
    let home = client("home").await;
    let ns = TestNamespace::create(&home, "home", "hostile").await;
    let (port, connections) = counting_listener().await;
    let tag = format!("hostile{:08x}", rand::random::<u32>());
    let work = std::env::temp_dir().join(&tag);
    std::fs::create_dir_all(&work).unwrap();
    let marker = work.join("ran");
    let script = work.join("plugin.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ntouch {}\necho '{{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{{\"token\":\"{tag}\"}}}}'\n",
            marker.display()
        ),
    )
    .unwrap();
    Command::new("chmod")
        .arg("+x")
        .arg(&script)
        .status()
        .unwrap();
    let token_file = work.join("token");
    std::fs::write(&token_file, format!("{tag}-file-token")).unwrap();
    let key_file = work.join("client.key");
    std::fs::write(&key_file, format!("{tag}-key")).unwrap();
    let inline = format!("    token: {tag}-inline\n");
    let cases = [
        (
            "hostile-exec",
            String::new(),
            format!(
                "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: {}\n      interactiveMode: Never\n",
                script.display()
            ),
            "exec",
        ),
        (
            "hostile-auth-provider",
            String::new(),
            format!(
                "    auth-provider:\n      name: gcp\n      config: {{cmd-path: {}, cmd-args: x}}\n",
                script.display()
            ),
            "auth-provider",
        ),
        (
            "hostile-token-file",
            String::new(),
            format!("    tokenFile: {}\n", token_file.display()),
            "tokenFile",
        ),
        (
            "hostile-key-file",
            String::new(),
            format!(
                "    client-certificate-data: {}\n    client-key: {}\n",
                "Zm9v",
                key_file.display()
            ),
            "client-key",
        ),
        (
            "hostile-proxy",
            format!("    proxy-url: http://127.0.0.1:{port}/{tag}\n"),
            inline.clone(),
            "proxy-url",
        ),
        (
            "hostile-insecure",
            "    insecure-skip-tls-verify: true\n".to_string(),
            inline.clone(),
            "insecure-skip-tls-verify",
        ),
        // #30 M6: the token would cross in cleartext.
        (
            "hostile-plaintext",
            String::new(),
            inline.clone(),
            "server (plaintext http)",
        ),
        // #30 M6: the counting listener itself, outside the allow-list.
        ("hostile-elsewhere", String::new(), inline.clone(), "server"),
    ];
    let secrets: Api<Secret> = Api::namespaced(home.clone(), &ns.name);
    for (name, cluster, user, _) in &cases {
        let kc = hostile_kubeconfig(port, cluster, user);
        let kc = if *name == "hostile-plaintext" {
            kc.replace("server: https://", "server: http://")
        } else {
            kc
        };
        let secret: Secret = from_json(json!({
            "metadata": {"name": name, "labels": {"platform.example.io/member-cluster": "true"}},
            "stringData": {"kubeconfig": kc},
        }));
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .expect("create Secret");
    }
    let mut replicas = Replicas::new(&ns.name, &[]);
    // No member of this test lives there: only hostile-elsewhere is refused
    // for its address alone (the others are refused first for a field).
    replicas.extra_args = vec![
        "--member-server-allow".into(),
        "127.0.0.2/32,member.test".into(),
    ];
    replicas.start("guard");
    let url = replicas.grpc_url("guard");
    let reasons: BTreeMap<String, String> = eventually(
        "every hostile cluster Invalid",
        Duration::from_secs(60),
        || async {
            let mut api = connect(&ClientOptions {
                server: url.clone(),
                ..Default::default()
            })
            .await
            .ok()?;
            let list = api
                .list_clusters(pb::ListClustersRequest {})
                .await
                .ok()?
                .into_inner();
            let invalid: BTreeMap<String, String> = list
                .clusters
                .into_iter()
                .filter(|c| c.reachability == pb::Reachability::Invalid as i32)
                .map(|c| (c.name, c.reason))
                .collect();
            (invalid.len() == cases.len()).then_some(invalid)
        },
    )
    .await;
    for (name, _, _, field) in &cases {
        let reason = &reasons[*name];
        assert!(
            reason.contains(&format!("{field} ")) && reason.contains("not allowed"),
            "{name}: {reason}"
        );
        assert!(
            !reason.contains(&tag),
            "{name}: the reason quotes the Secret: {reason}"
        );
    }
    // Several registry rounds later, still nothing has been acted on.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        !marker.exists(),
        "a credential plugin ran inside the operator"
    );
    assert_eq!(
        connections.load(Ordering::SeqCst),
        0,
        "the operator connected to a server named by a hostile kubeconfig"
    );
    let log = replicas.log("guard");
    assert!(!log.is_empty(), "the replica logged nothing");
    assert!(!log.contains(&tag), "the log holds bytes of a Secret");
    drop(replicas);
    std::fs::remove_dir_all(&work).ok();
}

#[tokio::test]
async fn a_single_cluster_controller_names_its_replica_in_every_write() {
    let member = client("member-3").await;
    support::ensure_crd(&member).await;
    let ns = TestNamespace::create(&member, "member-3", "agent").await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .arg("run")
        .arg("--kubeconfig")
        .arg(kubeconfig_path("member-3"))
        .args(["--namespace", &ns.name, "--replica-id", "solo-agent"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the controller");
    Api::<Microservice>::namespaced(member.clone(), &ns.name)
        .create(
            &PostParams::default(),
            &microservice("agent", "ghcr.io/acme/app:1", 8080, Some(1)),
        )
        .await
        .expect("create");
    // Everything but the test's own create of the Microservice.
    let writes = eventually("the controller's writes", Duration::from_secs(60), || {
        let w: Vec<_> = audited_writes("member-3", &ns.name)
            .into_iter()
            .filter(|w| !(w.resource == "microservices" && w.verb == "create"))
            .collect();
        async move { (w.len() >= 3).then_some(w) }
    })
    .await;
    child.kill().ok();
    child.wait().ok();
    for w in &writes {
        assert_eq!(w.user_agent, "flotilla/solo-agent", "{w:?}");
    }
}

/// Each critical task of a replica, failed on purpose (a fault hook that
/// exists in test builds only): the replica exits non-zero, naming it, so
/// that Kubernetes restarts it, instead of staying up and Ready while doing
/// nothing.
#[tokio::test]
async fn a_replica_whose_critical_task_ends_exits_non_zero_and_names_it() {
    let clients = member_clients().await;
    let (ns, _guards) = namespaces(&clients, "supervise").await;
    for (fault, named) in [
        ("grpc", "gRPC server"),
        ("metrics", "metrics endpoint"),
        ("heartbeat", "heartbeat"),
        ("registry", "registry"),
    ] {
        let mut replicas = Replicas::new(&ns, &["member-1"]);
        replicas.env = vec![("FLOTILLA_FAULT".into(), fault.into())];
        replicas.start("r1");
        // Blocking is fine: nothing else runs on this test's runtime.
        let status = replicas
            .exit_within("r1", std::time::Duration::from_secs(60))
            .unwrap_or_else(|| panic!("a replica with a failed {named} is still running"));
        assert!(!status.success(), "{fault}: exited {status:?}");
        let log = replicas.log("r1");
        assert!(
            log.contains(named) && log.contains("injected fault"),
            "{fault}: the log does not name the failed task:\n{log}"
        );
    }
}
