//! The operator as users install it: `kubectl apply -k` of deploy/home
//! (through integration/pods), from the image `make image` writes, as three
//! Pods on a real node of the home cluster (containerd, runc, kubelet and
//! kube-proxy; `integration/fleet node up`). In-cluster credentials only.
//! - the Pods become Ready, elect, shard, reconcile, and answer
//!   `flotilla clusters` through their Service;
//! - their ServiceAccount is refused what it was not granted, in practice;
//! - a rolling restart of the Deployment leaves no member unled for longer
//!   than a retry period, every member write inside its writer's Lease, and
//!   the PodDisruptionBudget refuses a second eviction;
//! - a SIGKILLed leader is succeeded within lease + retry;
//! - a frozen replica is restarted by its liveness probe.
//!
//! The tests share the one installation, so they run one at a time.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{EvictParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use support::replicas::holder;
use support::{
    assert_writes_inside_leadership, audit_log_with, client, eventually, fleet_dir, fleet_script,
    from_json, kubeconfig_path, kubectl, lease_writes,
};

use flotilla::crd::Microservice;

const SYSTEM: &str = "flotilla-system";
/// The namespace the Pods reconcile (integration/pods sets FLOTILLA_NAMESPACE).
const WORKLOADS: &str = "flotilla-pods";
/// The member Lease of deploy/home's fleet, "default".
const LEASE: &str = "flotilla-default";
const SA: &str = "system:serviceaccount:flotilla-system:flotilla";
/// The Pods' own members (apiservers only), which no other test disturbs.
const MEMBERS: [&str; 3] = ["pods-1", "pods-2", "pods-3"];
/// deploy/home's Lease timings: the operator's defaults.
const LEASE_DURATION: Duration = Duration::from_secs(15);
const RENEW_DEADLINE: Duration = Duration::from_secs(10);
const RETRY_PERIOD: Duration = Duration::from_secs(2);

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs a command within `limit` (coreutils' timeout ends it past that):
/// whether it succeeded, and its output.
fn run(program: &std::path::Path, args: &[&str], limit: Duration) -> (bool, String) {
    let out = Command::new("timeout")
        .args(["--kill-after=5", &format!("{}", limit.as_secs())])
        .arg(program)
        .args(args)
        .output()
        .expect("timeout(1)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn fleet(args: &[&str], limit: Duration) -> String {
    let (ok, out) = run(&fleet_script(), args, limit);
    assert!(ok, "integration/fleet {args:?}: {out}");
    out
}

/// kubectl against home.
fn k(args: &[&str]) -> (bool, String) {
    let home = kubeconfig_path("home").display().to_string();
    let mut all = vec!["--kubeconfig", &home];
    all.extend_from_slice(args);
    run(&kubectl(), &all, Duration::from_secs(60))
}

/// The operator's Pods: name -> (Ready, restarts, node).
async fn pods(home: &Client) -> BTreeMap<String, (bool, i32, String)> {
    let api = Api::<Pod>::namespaced(home.clone(), SYSTEM);
    let list = api
        .list(&ListParams::default().labels("app.kubernetes.io/name=flotilla"))
        .await
        .expect("list the operator's Pods");
    list.items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let status = p.status.unwrap_or_default();
            let ready = status
                .conditions
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let restarts = status
                .container_statuses
                .unwrap_or_default()
                .iter()
                .map(|c| c.restart_count)
                .sum();
            let node = p.spec.and_then(|s| s.node_name).unwrap_or_default();
            (p.metadata.name.unwrap_or_default(), (ready, restarts, node))
        })
        .collect()
}

async fn members() -> BTreeMap<&'static str, Client> {
    let mut out = BTreeMap::new();
    for m in MEMBERS {
        out.insert(m, client(m).await);
    }
    out
}

async fn leaders(members: &BTreeMap<&'static str, Client>) -> BTreeMap<&'static str, String> {
    let mut out = BTreeMap::new();
    for (m, c) in members {
        if let Some(h) = holder(c, LEASE).await {
            out.insert(*m, h);
        }
    }
    out
}

/// Three Ready Pods on the real node, each leading one member.
async fn steady(
    home: &Client,
    members: &BTreeMap<&'static str, Client>,
) -> BTreeMap<&'static str, String> {
    eventually(
        "three Ready Pods, each leading one member",
        Duration::from_secs(180),
        || async {
            let pods = pods(home).await;
            let ready: BTreeSet<&String> =
                pods.iter().filter(|(_, p)| p.0).map(|(n, _)| n).collect();
            if ready.len() != 3 || pods.len() != 3 {
                return None;
            }
            assert!(
                pods.values().all(|p| p.2 == "flotilla-node"),
                "an operator Pod ran off the real node: {pods:?}"
            );
            let leaders = leaders(members).await;
            let by: BTreeSet<&String> = leaders.values().collect();
            (leaders.len() == MEMBERS.len()
                && by.len() == 3
                && by.iter().all(|h| ready.contains(h)))
            .then_some(leaders)
        },
    )
    .await
}

/// The node and the Pods, as `integration/fleet` starts them (idempotent).
async fn installed() -> (Client, BTreeMap<&'static str, Client>) {
    let image = support::image_tarball();
    assert!(
        image.is_file(),
        "no image at {}: run `make image` (run-tests builds it)",
        image.display()
    );
    // Once per process: the tests that follow find it installed (and
    // `steady` waits for whatever the previous test disturbed to heal).
    static INSTALLED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    INSTALLED.get_or_init(|| {
        fleet(&["node", "up"], Duration::from_secs(600));
        fleet(
            &["pods", "up", &image.display().to_string()],
            Duration::from_secs(300),
        );
    });
    let home = client("home").await;
    let members = members().await;
    for c in members.values() {
        let ns: Namespace = from_json(json!({"metadata": {"name": WORKLOADS}}));
        match Api::<Namespace>::all(c.clone())
            .create(&PostParams::default(), &ns)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("namespace {WORKLOADS}: {e}"),
        }
    }
    (home, members)
}

fn container_pid(pod: &str) -> u32 {
    let id = fleet(
        &[
            "node",
            "crictl",
            "ps",
            "-q",
            "--name",
            "flotilla",
            "--pod",
            &pod_id(pod),
        ],
        Duration::from_secs(30),
    );
    let id = id
        .lines()
        .rfind(|l| !l.trim().is_empty() && !l.contains("level="))
        .expect("container id");
    let inspect = fleet(
        &["node", "crictl", "inspect", id.trim()],
        Duration::from_secs(30),
    );
    let json_start = inspect.find('{').expect("crictl inspect JSON");
    let v: serde_json::Value = serde_json::Deserializer::from_str(&inspect[json_start..])
        .into_iter()
        .next()
        .and_then(Result::ok)
        .unwrap_or_else(|| panic!("crictl inspect JSON: {inspect}"));
    v["info"]["pid"].as_u64().expect("the container's pid") as u32
}

fn pod_id(pod: &str) -> String {
    let out = fleet(
        &[
            "node", "crictl", "pods", "-q", "--name", pod, "--state", "ready",
        ],
        Duration::from_secs(30),
    );
    out.lines()
        .rfind(|l| !l.trim().is_empty() && !l.contains("level="))
        .unwrap_or_else(|| panic!("no sandbox for {pod}: {out}"))
        .trim()
        .to_string()
}

fn signal(pid: u32, sig: &str) {
    let st = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(st.success(), "kill {sig} {pid}");
}

/// The longest time `member` had no live leader between `from` and `to`,
/// from the Lease writes its apiserver recorded. A holder is known alive at
/// each of its writes (acquire, renewal, release); the member is unled from
/// the last write of one holder to the first write of the next (or of the
/// same one taking the Lease again after a release). A holder that died
/// leads nothing while its Lease runs out: that time counts.
fn longest_unled(member: &str, from: jiff::Timestamp, to: jiff::Timestamp) -> Duration {
    let mut longest = jiff::SignedDuration::ZERO;
    // (holder, when it was last seen alive); the holder is "" once released.
    let mut current: Option<(String, jiff::Timestamp)> = None;
    for w in lease_writes(member, SYSTEM, LEASE)
        .iter()
        .filter(|w| w.received <= to)
    {
        match &current {
            Some((h, seen)) if w.holder.is_empty() || *h != w.holder => {
                if !w.holder.is_empty() {
                    let gap = w.received.duration_since((*seen).max(from));
                    longest = longest.max(gap);
                }
                if !(h.is_empty() && w.holder.is_empty()) {
                    current = Some((w.holder.clone(), w.received));
                }
            }
            _ => current = Some((w.holder.clone(), w.received)),
        }
    }
    Duration::try_from(longest).unwrap_or_default()
}

/// Where home's apiserver listens, from its kubeconfig.
fn home_server() -> String {
    let text = std::fs::read_to_string(kubeconfig_path("home")).expect("home kubeconfig");
    text.lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .expect("a server in the home kubeconfig")
        .to_string()
}

fn web(replicas: i32) -> Microservice {
    from_json(json!({
        "apiVersion": "platform.example.io/v1alpha1",
        "kind": "Microservice",
        "metadata": {"name": "web", "namespace": WORKLOADS},
        "spec": {"image": "registry.example/web:1", "replicas": replicas, "port": 8080}
    }))
}

#[tokio::test]
async fn three_pods_from_deploy_home_elect_shard_reconcile_and_answer_through_their_service() {
    let _serial = SERIAL.lock().await;
    let (home, members) = installed().await;
    steady(&home, &members).await;

    // Writes reach a member through the Pod network: a Microservice in the
    // Pods' namespace becomes a Deployment, written by pods-1's leader.
    let ms = Api::<Microservice>::namespaced(members["pods-1"].clone(), WORKLOADS);
    let _ = ms.delete("web", &Default::default()).await;
    eventually("the old web to go", Duration::from_secs(30), || async {
        ms.get_opt("web").await.ok()?.is_none().then_some(())
    })
    .await;
    ms.create(&PostParams::default(), &web(2))
        .await
        .expect("create web");
    let deployments = Api::<Deployment>::namespaced(members["pods-1"].clone(), WORKLOADS);
    eventually(
        "pods-1's leader to write web's Deployment",
        Duration::from_secs(60),
        || async { deployments.get_opt("web").await.ok()?.map(|_| ()) },
    )
    .await;

    // `flotilla clusters` through the Service's ClusterIP (kube-proxy), over
    // TLS with the token deploy/home's Secrets hold.
    let svc = Api::<Service>::namespaced(home.clone(), SYSTEM)
        .get("flotilla-grpc")
        .await
        .expect("the gRPC Service");
    let ip = svc.spec.and_then(|s| s.cluster_ip).expect("a ClusterIP");
    let pods_dir = fleet_dir().join("pods");
    let ask = || {
        run(
            std::path::Path::new(env!("CARGO_BIN_EXE_flotilla")),
            &[
                "clusters",
                "--server",
                &format!("https://{ip}:50051"),
                "--ca",
                &fleet_dir().join("pki/ca.crt").display().to_string(),
                "--tls-server-name",
                "flotilla-grpc.flotilla-system.svc",
                "--token-file",
                &pods_dir.join("token").display().to_string(),
            ],
            Duration::from_secs(30),
        )
    };
    // A replica learns of a Lease's new holder through its watch: after an
    // earlier test's restart, its view may trail the Leases by a moment.
    eventually(
        "flotilla clusters through the Service to name each member's leader",
        Duration::from_secs(30),
        || async {
            let (ok, out) = ask();
            assert!(ok, "flotilla clusters through the Service: {out}");
            let names: BTreeSet<String> = pods(&home).await.into_keys().collect();
            let leaders = leaders(&members).await;
            let agrees = leaders.iter().all(|(m, h)| {
                out.lines()
                    .find(|l| l.starts_with(m))
                    .is_some_and(|l| l.contains("Reachable") && l.contains(h.as_str()))
            });
            let answered = names
                .iter()
                .any(|p| out.contains(&format!("answered by {p}")));
            (leaders.len() == MEMBERS.len() && agrees && answered).then_some(())
        },
    )
    .await;

    // In-cluster credentials only: every request the Pods made to home
    // came as their ServiceAccount.
    let pod_names: BTreeSet<String> = pods(&home).await.into_keys().collect();
    let mut seen = 0;
    for e in audit_log_with("home", SYSTEM) {
        let agent = e["userAgent"].as_str().unwrap_or_default();
        if let Some(id) = agent.strip_prefix("flotilla/")
            && pod_names.contains(id)
        {
            assert_eq!(
                e["user"]["username"], SA,
                "a Pod called home as someone else: {e}"
            );
            seen += 1;
        }
    }
    assert!(seen > 0, "no request from the Pods in home's audit log");
}

/// Can the operator's ServiceAccount do this in home? (kubectl auth can-i)
fn can(args: &[&str]) -> bool {
    let mut all = vec!["auth", "can-i"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--as", SA]);
    let (_, out) = k(&all);
    out.lines().map(str::trim).any(|l| l == "yes")
}

#[tokio::test]
async fn the_pods_service_account_is_refused_what_it_was_not_granted() {
    let _serial = SERIAL.lock().await;
    let (home, members) = installed().await;
    steady(&home, &members).await;
    for (args, want) in [
        (&["list", "secrets", "-n", "flotilla-members"][..], true),
        (
            &["create", "leases.coordination.k8s.io", "-n", SYSTEM][..],
            true,
        ),
        (&["get", "secrets", "-n", SYSTEM][..], false),
        (&["get", "secrets", "-n", "flotilla-members"][..], false),
        (&["create", "pods", "-n", SYSTEM][..], false),
        (&["delete", "deployments.apps", "-n", SYSTEM][..], false),
    ] {
        assert_eq!(can(args), want, "can-i {args:?} as {SA}");
    }

    // A real attempt, with a token of the account the Pods run as.
    let (ok, token) = k(&[
        "-n",
        SYSTEM,
        "create",
        "token",
        "flotilla",
        "--duration",
        "10m",
    ]);
    assert!(ok, "token: {token}");
    let marker = format!("flotilla-grpc-token-{:08x}", rand::random::<u32>());
    let server = home_server();
    let (ok, out) = run(
        &kubectl(),
        &[
            "--kubeconfig",
            "/dev/null",
            "--server",
            &server,
            "--certificate-authority",
            &fleet_dir().join("pki/ca.crt").display().to_string(),
            "--token",
            token.trim(),
            "-n",
            SYSTEM,
            "get",
            "secret",
            &marker,
        ],
        Duration::from_secs(30),
    );
    assert!(
        !ok && out.contains("Forbidden"),
        "reading a Secret in {SYSTEM} was not refused: {out}"
    );
    let refused = eventually(
        "the refusal in home's audit log",
        Duration::from_secs(30),
        || async {
            audit_log_with("home", &marker).into_iter().find(|e| {
                e["user"]["username"] == SA
                    && e["objectRef"]["resource"] == "secrets"
                    && e["responseStatus"]["code"] == 403
            })
        },
    )
    .await;
    assert_eq!(refused["verb"], "get", "{refused}");
}

#[tokio::test]
async fn a_rolling_restart_keeps_every_member_led_and_the_disruption_budget_holds() {
    let _serial = SERIAL.lock().await;
    let (home, members) = installed().await;
    let before = steady(&home, &members).await;
    let old: BTreeSet<String> = pods(&home).await.into_keys().collect();
    let ms = Api::<Microservice>::namespaced(members["pods-2"].clone(), WORKLOADS);
    let _ = ms.create(&PostParams::default(), &web(1)).await;

    let from = jiff::Timestamp::now();
    let (ok, out) = k(&["-n", SYSTEM, "rollout", "restart", "deploy/flotilla"]);
    assert!(ok, "rollout restart: {out}");
    // While it rolls: pods-2's Microservice changes every second, so that
    // the leaders write, and the Deployment's available replicas are watched.
    let deployments = Api::<Deployment>::namespaced(home.clone(), SYSTEM);
    let mut fewest_available = i32::MAX;
    let mut replicas = 1;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
    loop {
        replicas = replicas % 3 + 1;
        let patch = json!({"spec": {"replicas": replicas}});
        let _ = ms
            .patch(
                "web",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await;
        let d = deployments.get("flotilla").await.expect("deploy/flotilla");
        let status = d.status.unwrap_or_default();
        fewest_available = fewest_available.min(status.available_replicas.unwrap_or_default());
        let generation = d.metadata.generation.unwrap_or_default();
        let done = status.observed_generation.unwrap_or_default() >= generation
            && status.updated_replicas == Some(3)
            && status.available_replicas == Some(3)
            && status.replicas == Some(3);
        let now: BTreeSet<String> = pods(&home).await.into_keys().collect();
        if done && now.is_disjoint(&old) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the rolling restart did not finish in 240 s"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let after = steady(&home, &members).await;
    let to = jiff::Timestamp::now();
    assert!(
        after.values().all(|h| !old.contains(h)),
        "old Pods still lead: {before:?} -> {after:?}"
    );
    assert!(
        fewest_available >= 2,
        "the rollout took {} of 3 replicas down at once",
        3 - fewest_available
    );

    let mut gaps = BTreeMap::new();
    let mut writes = 0;
    for m in MEMBERS {
        gaps.insert(m, longest_unled(m, from, to));
        writes += assert_writes_inside_leadership(
            m,
            WORKLOADS,
            LEASE,
            RENEW_DEADLINE,
            Duration::from_millis(500),
        );
    }
    eprintln!(
        "rolling restart: longest unled gap per member {gaps:?}; {writes} member writes, each inside its writer's Lease"
    );
    assert!(
        writes > 0,
        "no member write to check: the Microservice edits reached no leader"
    );
    // A replica shutting down leaves the live set first, its successors ask
    // for its Leases and watch them, and each release is taken as it lands:
    // well inside a retry period. Polling alone took up to 3.8 s (2 s retry);
    // a release that never lands costs about the Lease duration (13-15 s).
    for (m, gap) in &gaps {
        assert!(
            *gap <= RETRY_PERIOD,
            "{m} had no leader for {gap:?} during the rolling restart (retry period {RETRY_PERIOD:?})"
        );
    }

    // The PodDisruptionBudget (maxUnavailable 1): a second eviction while
    // the first Pod's replacement is not Ready is refused. The node is
    // cordoned first, so that the replacement stays Pending: a Pod of this
    // image can be Ready within a second, before the second request.
    let api = Api::<Pod>::namespaced(home.clone(), SYSTEM);
    let names: Vec<String> = pods(&home).await.into_keys().collect();
    let budgets = Api::<PodDisruptionBudget>::namespaced(home.clone(), SYSTEM);
    eventually(
        "the disruption controller to allow one eviction of three",
        Duration::from_secs(60),
        || async {
            let s = budgets.get("flotilla").await.ok()?.status?;
            (s.disruptions_allowed == Some(1)
                && s.current_healthy == Some(3)
                && s.expected_pods == Some(3))
            .then_some(())
        },
    )
    .await;
    let (ok, out) = k(&["cordon", "flotilla-node"]);
    assert!(ok, "cordon: {out}");
    api.evict(&names[0], &EvictParams::default())
        .await
        .expect("the first eviction");
    match api.evict(&names[1], &EvictParams::default()).await {
        Err(kube::Error::Api(e)) if e.code == 429 => {}
        other => panic!(
            "a second eviction was not refused by the budget: {other:?}; evicted {names:?}; budget {:?}; pods {:?}",
            budgets.get("flotilla").await.ok().and_then(|b| b.status),
            pods(&home).await
        ),
    }
    let (ok, out) = k(&["uncordon", "flotilla-node"]);
    assert!(ok, "uncordon: {out}");
    // The scheduler may leave a Pod it found unschedulable for up to 5
    // minutes after the node opens again; its ReplicaSet replaces it at once.
    for (name, (ready, _, node)) in pods(&home).await {
        if !ready && node.is_empty() {
            let _ = api.delete(&name, &Default::default()).await;
        }
    }
    steady(&home, &members).await;
}

#[tokio::test]
async fn a_killed_leader_is_succeeded_within_lease_and_retry() {
    let _serial = SERIAL.lock().await;
    let (home, members) = installed().await;
    let leaders = steady(&home, &members).await;
    let victim = leaders["pods-3"].clone();
    let restarts = pods(&home).await[&victim].1;
    let from = jiff::Timestamp::now();
    signal(container_pid(&victim), "-KILL");
    let took = eventually(
        "pods-3 led again after the kill",
        Duration::from_secs(60),
        || async {
            let w = lease_writes("pods-3", SYSTEM, LEASE);
            w.iter()
                .find(|w| w.received > from && !w.holder.is_empty())
                .map(|w| w.received.duration_since(from))
        },
    )
    .await;
    let took = Duration::try_from(took).unwrap_or_default();
    eprintln!("SIGKILL of pods-3's leader {victim}: led again after {took:?}");
    assert!(
        took <= LEASE_DURATION + RETRY_PERIOD + Duration::from_secs(2),
        "pods-3 unled for {took:?} after its leader was killed"
    );
    eventually(
        "the killed container restarted",
        Duration::from_secs(60),
        || async { (pods(&home).await.get(&victim)?.1 > restarts).then_some(()) },
    )
    .await;
    steady(&home, &members).await;
}

#[tokio::test]
async fn the_liveness_probe_restarts_a_frozen_replica() {
    let _serial = SERIAL.lock().await;
    let (home, members) = installed().await;
    let leaders = steady(&home, &members).await;
    let victim = leaders["pods-1"].clone();
    let restarts = pods(&home).await[&victim].1;
    let from = jiff::Timestamp::now();
    // Frozen: the process lives, its port accepts, nothing answers; only
    // the liveness probe (6 misses, 10 s apart) can tell.
    signal(container_pid(&victim), "-STOP");
    let taken = eventually(
        "another Pod to take pods-1",
        Duration::from_secs(60),
        || async {
            let h = holder(&members["pods-1"], LEASE).await?;
            (h != victim).then(|| jiff::Timestamp::now().duration_since(from))
        },
    )
    .await;
    eventually(
        "the kubelet to restart the frozen container",
        Duration::from_secs(180),
        || async { (pods(&home).await.get(&victim)?.1 > restarts).then_some(()) },
    )
    .await;
    let restarted = jiff::Timestamp::now().duration_since(from);
    eprintln!(
        "SIGSTOP of {victim}: pods-1 taken over after {taken:?}, container restarted after {restarted:?}"
    );
    let events = k(&[
        "-n",
        SYSTEM,
        "get",
        "events",
        "--field-selector",
        &format!("involvedObject.name={victim}"),
    ])
    .1;
    assert!(
        events.contains("Liveness probe failed"),
        "no liveness failure recorded for {victim}:\n{events}"
    );
    steady(&home, &members).await;
}

/// A blob of the image's OCI layout, as JSON.
fn blob(layout: &std::path::Path, digest: &str) -> serde_json::Value {
    let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
    let path = layout.join("blobs/sha256").join(hex);
    serde_json::from_slice(
        &std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .expect("a JSON blob")
}

/// The Dockerfile's values for `instruction`, in order (continuation lines
/// left out: none of the instructions checked spans lines).
fn dockerfile_all(instruction: &str) -> Vec<String> {
    let text =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("Dockerfile"))
            .expect("Dockerfile");
    text.lines()
        .filter_map(|l| l.strip_prefix(&format!("{instruction} ")))
        .map(|v| v.trim().to_string())
        .collect()
}

/// The Dockerfile's one value for `instruction` (USER, EXPOSE, ENTRYPOINT).
fn dockerfile(instruction: &str) -> String {
    match dockerfile_all(instruction).as_slice() {
        [one] => one.clone(),
        all => panic!("{instruction} in the Dockerfile: {all:?}, want one"),
    }
}

/// The image has no base: one layer, the static binary and CA roots. It
/// runs the binary the Dockerfile's image runs, as the same user, with the
/// same ports; and packing the same binary again gives the same digest.
#[test]
fn the_image_runs_what_the_dockerfile_runs_and_packs_to_the_same_digest() {
    let out = support::image_tarball()
        .parent()
        .expect("image dir")
        .to_path_buf();
    let layout = out.join("oci");
    let index: serde_json::Value = serde_json::from_slice(
        &std::fs::read(layout.join("index.json")).expect("the image's index.json"),
    )
    .expect("index.json");
    let digest = index["manifests"][0]["digest"]
        .as_str()
        .expect("a manifest")
        .to_string();
    let manifest = blob(&layout, &digest);
    assert_eq!(
        manifest["layers"].as_array().map(Vec::len),
        Some(1),
        "a base layer crept in: {manifest}"
    );
    let config = blob(
        &layout,
        manifest["config"]["digest"].as_str().expect("config"),
    )["config"]
        .clone();

    assert_eq!(config["User"], dockerfile("USER"));
    let entrypoint: serde_json::Value =
        serde_json::from_str(&dockerfile("ENTRYPOINT")).expect("exec form");
    assert_eq!(config["Entrypoint"], entrypoint);
    let exposed: BTreeSet<String> = config["ExposedPorts"]
        .as_object()
        .expect("exposed ports")
        .keys()
        .map(|p| p.trim_end_matches("/tcp").to_string())
        .collect();
    let want: BTreeSet<String> = dockerfile("EXPOSE")
        .split_whitespace()
        .map(String::from)
        .collect();
    assert_eq!(exposed, want);
    // The same build: the Dockerfile runs integration/image's own build
    // (static, paths remapped) and its runtime stage, with no libc, takes
    // the binary that build writes for release.
    let script = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("integration/image"),
    )
    .expect("integration/image");
    let build = "cargo build --profile \"$profile\" --locked --target \"$triple\" --bin flotilla";
    assert!(
        script.contains(build),
        "integration/image builds no static binary"
    );
    assert!(
        script.contains("--binary-only) pack=0"),
        "no build-only mode"
    );
    let runs = dockerfile_all("RUN");
    assert!(
        runs.iter().any(|r| r == "integration/image --binary-only"),
        "the Dockerfile builds otherwise than integration/image: {runs:?}"
    );
    let copies = dockerfile_all("COPY");
    assert!(
        copies.iter().any(|c| c
            == "--from=build /src/target/x86_64-unknown-linux-gnu/release/flotilla /usr/local/bin/flotilla"),
        "the Dockerfile's image takes another binary: {copies:?}"
    );
    let bases = dockerfile_all("FROM");
    assert!(
        bases
            .last()
            .and_then(|b| b.split_whitespace().find(|w| !w.starts_with("--")))
            .is_some_and(|image| image.starts_with("gcr.io/distroless/static-")),
        "a static binary on a base with a libc it does not use: {bases:?}"
    );

    let profile = std::fs::read_to_string(out.join("profile")).expect("the image's profile");
    let again = std::env::temp_dir().join(format!("flotilla-image-{:08x}", rand::random::<u32>()));
    // The binary lies in the target directory the image was built from.
    let target = out.parent().expect("the image's target directory");

    // Built anywhere, the same bytes: the binary names no path of the
    // checkout, the target directory or the cargo home (panic locations
    // would carry them; the build remaps them).
    let dir = if profile.trim() == "dev" {
        "debug"
    } else {
        "release"
    };
    let binary = target
        .join("x86_64-unknown-linux-gnu")
        .join(dir)
        .join("flotilla");
    assert!(binary.is_file(), "no binary at {}", binary.display());
    let cargo_home = PathBuf::from(
        std::env::var("CARGO_HOME")
            .unwrap_or_else(|_| format!("{}/.cargo", std::env::var("HOME").expect("HOME"))),
    );
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    // Each as written and with its links resolved.
    let mut paths = BTreeSet::new();
    for p in [here, target.to_path_buf(), cargo_home] {
        paths.insert(std::path::absolute(&p).expect("an absolute path"));
        paths.insert(std::fs::canonicalize(&p).unwrap_or(p));
    }
    for path in paths {
        let needle = format!("{}/", path.display());
        let status = Command::new("timeout")
            .args(["60", "grep", "-a", "-F", "-q", &needle])
            .arg(&binary)
            .status()
            .expect("grep");
        // 1: not found; 0: found; anything else: grep could not tell.
        assert_eq!(
            status.code(),
            Some(1),
            "{} names {needle} (0), or could not be read: built elsewhere, it would differ",
            binary.display()
        );
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("integration/image");
    let (ok, printed) = run(
        std::path::Path::new("env"),
        &[
            &format!("CARGO_TARGET_DIR={}", target.display()),
            &script.display().to_string(),
            "--profile",
            profile.trim(),
            "--no-build",
            "--out",
            &again.display().to_string(),
        ],
        Duration::from_secs(300),
    );
    let _ = std::fs::remove_dir_all(&again);
    assert!(ok, "packing again: {printed}");
    assert_eq!(
        printed.lines().last().map(str::trim),
        Some(digest.as_str()),
        "{printed}"
    );
}
