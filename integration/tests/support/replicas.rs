//! Flotilla replica processes for fleet tests, and Lease helpers.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};

use super::{TestNamespace, client, ensure_crd, eventually, fleet_dir, kubeconfig_path};

pub const MEMBERS: [&str; 3] = ["member-1", "member-2", "member-3"];
pub const LEASE_DURATION: Duration = Duration::from_secs(2);
pub const RETRY_PERIOD: Duration = Duration::from_millis(300);
pub const LEASE_NAMESPACE: &str = "flotilla-system";

/// Replica processes of one test fleet, killed when dropped.
pub struct Replicas {
    pub fleet: String,
    pub dir: PathBuf,
    pub namespace: String,
    /// gRPC flags besides the address; plaintext unless a test sets TLS.
    pub grpc_args: Vec<String>,
    /// Each running replica's gRPC port.
    pub grpc_ports: BTreeMap<String, u16>,
    /// Each running replica's /metrics, /healthz and /readyz port.
    pub metrics_ports: BTreeMap<String, u16>,
    /// Replicas that serve the dashboard (plain HTTP), on these ports.
    pub ui_ports: BTreeMap<String, u16>,
    /// Extra environment, e.g. OTEL_* variables.
    pub env: Vec<(String, String)>,
    /// Lease timings: FAST_ELECTION unless a caller wants the defaults.
    pub election: Vec<String>,
    /// Any further `run` flags, e.g. a request budget.
    pub extra_args: Vec<String>,
    /// Replicas that read a kubeconfig directory of their own.
    pub own_dirs: BTreeMap<String, PathBuf>,
    /// Replicas that reach home through a kubeconfig of their own (a proxy).
    pub home_kubeconfigs: BTreeMap<String, PathBuf>,
    children: BTreeMap<String, Child>,
}

/// Lease timings short enough for tests: LeaseDuration + 2 x RetryPeriod < 3 s.
pub const FAST_ELECTION: [&str; 6] = [
    "--lease-duration",
    "2s",
    "--renew-deadline",
    "1500ms",
    "--retry-period",
    "300ms",
];

/// Lease timings for tests that stop no replica but must not see the
/// Lease change hands under a loaded machine's stalls.
pub const STEADY_ELECTION: [&str; 6] = [
    "--lease-duration",
    "4s",
    "--renew-deadline",
    "3s",
    "--retry-period",
    "500ms",
];

/// Plaintext gRPC and metrics on ports of their own.
pub fn local_server_args() -> Vec<String> {
    vec![
        "--grpc-insecure".into(),
        "--grpc-addr".into(),
        format!("127.0.0.1:{}", free_port()),
        "--metrics-addr".into(),
        format!("127.0.0.1:{}", free_port()),
    ]
}

/// A port nothing listens on right now, and never handed out before in
/// this process: a replica binds it only once it has started, and the
/// kernel may offer a just-released port again to the next caller.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        if GIVEN.lock().unwrap_or_else(|e| e.into_inner()).insert(port) {
            return port;
        }
    }
}

impl Replicas {
    pub fn new(namespace: &str, members: &[&str]) -> Self {
        let fleet = format!("t{:08x}", rand::random::<u32>());
        let dir = fleet_dir().join("test-kubeconfigs").join(&fleet);
        std::fs::create_dir_all(&dir).expect("kubeconfig dir");
        let r = Replicas {
            fleet,
            dir,
            namespace: namespace.to_string(),
            grpc_args: vec!["--grpc-insecure".into()],
            grpc_ports: BTreeMap::new(),
            metrics_ports: BTreeMap::new(),
            ui_ports: BTreeMap::new(),
            env: Vec::new(),
            election: FAST_ELECTION.iter().map(|a| a.to_string()).collect(),
            extra_args: Vec::new(),
            own_dirs: BTreeMap::new(),
            home_kubeconfigs: BTreeMap::new(),
            children: BTreeMap::new(),
        };
        for m in members {
            r.add_member(m);
        }
        r
    }

    pub fn add_member(&self, member: &str) {
        std::fs::copy(
            kubeconfig_path(member),
            self.dir.join(format!("{member}.yaml")),
        )
        .expect("copy kubeconfig");
    }

    pub fn start(&mut self, id: &str) {
        let port = free_port();
        self.grpc_ports.insert(id.to_string(), port);
        let metrics_port = free_port();
        self.metrics_ports.insert(id.to_string(), metrics_port);
        self.spawn(id);
    }

    /// SIGTERM, wait for the exit, and start again on the same ports: a
    /// rolling restart, as a Deployment does it behind one Service.
    pub fn restart(&mut self, id: &str) {
        let status = self.restart_status(id);
        assert!(status.success(), "{id} exited {status:?} on SIGTERM");
    }

    /// The same, returning how the old process ended instead of judging it.
    pub fn restart_status(&mut self, id: &str) -> std::process::ExitStatus {
        let mut child = self.sigterm(id);
        let status = child.wait().expect("reap");
        self.spawn(id);
        status
    }

    fn spawn(&mut self, id: &str) {
        let log = fleet_dir()
            .join("logs")
            .join(format!("test-{}-{id}.log", self.fleet));
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("replica log");
        let port = self.grpc_ports[id];
        let metrics_port = self.metrics_ports[id];
        let dir = self.own_dirs.get(id).unwrap_or(&self.dir);
        let home =
            (self.home_kubeconfigs.get(id).cloned()).unwrap_or_else(|| kubeconfig_path("home"));
        let child = Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .args(["run", "--kubeconfig-dir"])
            .arg(dir)
            .arg("--home-kubeconfig")
            .arg(home)
            .args([
                "--fleet-name",
                &self.fleet,
                "--replica-id",
                id,
                "--namespace",
                &self.namespace,
            ])
            // Heartbeats and member Secrets of this test only.
            .args(["--home-namespace", &self.namespace])
            .args(&self.election)
            .args(&self.extra_args)
            .args(["--takeover-grace", "3s", "--resync", "30s"])
            // Analysis calls the test's own listeners on 127.0.0.1 only; a
            // test's 127.0.0.2 is outside the platform's allow-list (#59).
            .args(["--egress-allow", "127.0.0.1"])
            .arg("--grpc-addr")
            .arg(format!("127.0.0.1:{port}"))
            .args(&self.grpc_args)
            .arg("--metrics-addr")
            .arg(format!("127.0.0.1:{metrics_port}"))
            .args(self.ui_ports.get(id).into_iter().flat_map(|p| {
                [
                    "--ui-insecure".to_string(),
                    "--ui-addr".into(),
                    format!("127.0.0.1:{p}"),
                ]
            }))
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            // FLOTILLA_TEST_RUST_LOG: more detail for one run, by hand.
            .env(
                "RUST_LOG",
                std::env::var("FLOTILLA_TEST_RUST_LOG").unwrap_or_else(|_| "info,kube=warn".into()),
            )
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .expect("start replica");
        self.children.insert(id.to_string(), child);
    }

    /// Waits up to `limit` for replica `id` to exit by itself.
    pub fn exit_within(
        &mut self,
        id: &str,
        limit: std::time::Duration,
    ) -> Option<std::process::ExitStatus> {
        let until = std::time::Instant::now() + limit;
        let child = self.children.get_mut(id).expect("known replica");
        while std::time::Instant::now() < until {
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.children.remove(id);
                return Some(status);
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        None
    }

    pub fn kill_9(&mut self, id: &str) {
        let mut child = self.children.remove(id).expect("known replica");
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
    }

    pub fn sigterm(&mut self, id: &str) -> Child {
        let child = self.children.remove(id).expect("known replica");
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        child
    }

    /// Gives replica `id` a kubeconfig directory of its own, holding these
    /// members only: a replica with a different view of the cluster set.
    pub fn own_dir(&mut self, id: &str, members: &[&str]) -> PathBuf {
        let dir = self.dir.join(format!("only-{id}"));
        std::fs::create_dir_all(&dir).expect("own kubeconfig dir");
        for m in members {
            std::fs::copy(kubeconfig_path(m), dir.join(format!("{m}.yaml")))
                .expect("copy kubeconfig");
        }
        self.own_dirs.insert(id.to_string(), dir.clone());
        dir
    }

    /// Sends a signal (e.g. "STOP", "CONT") to a running replica.
    pub fn signal(&self, id: &str, signal: &str) {
        let pid = self.children[id].id();
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{signal} {pid}");
    }

    /// The process id of replica `id`.
    pub fn pid(&self, id: &str) -> u32 {
        self.children[id].id()
    }

    /// Process ids of the running replicas.
    pub fn pids(&self) -> Vec<u32> {
        self.children.values().map(Child::id).collect()
    }

    /// The replica's plaintext gRPC address.
    pub fn grpc_url(&self, id: &str) -> String {
        format!("http://127.0.0.1:{}", self.grpc_ports[id])
    }

    /// The replica's metrics and health endpoint.
    pub fn metrics_url(&self, id: &str) -> String {
        format!("http://127.0.0.1:{}", self.metrics_ports[id])
    }

    pub fn lease_name(&self) -> String {
        format!("flotilla-{}", self.fleet)
    }

    /// The replica's log as plain text: its colour codes removed, so a
    /// test can match "home_lease: leading" as a reader sees it.
    pub fn log(&self, id: &str) -> String {
        let raw = std::fs::read_to_string(
            fleet_dir()
                .join("logs")
                .join(format!("test-{}-{id}.log", self.fleet)),
        )
        .unwrap_or_default();
        without_colour(&raw)
    }
}

/// `text` without ANSI escape sequences (`ESC [ ... final-byte`).
pub fn without_colour(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            // Parameters and intermediates, up to the final byte.
            for c in chars.by_ref() {
                if ('\u{40}'..='\u{7e}').contains(&c) {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

impl Drop for Replicas {
    fn drop(&mut self) {
        for (_, mut c) in std::mem::take(&mut self.children) {
            c.kill().ok();
            c.wait().ok();
        }
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

pub async fn holder(client: &Client, lease: &str) -> Option<String> {
    holder_in(client, LEASE_NAMESPACE, lease).await
}

/// The holder of a Lease in `namespace` (the home cluster's rollout Lease
/// lives in the fleet's home namespace).
pub async fn holder_in(client: &Client, namespace: &str, lease: &str) -> Option<String> {
    let l = Api::<Lease>::namespaced(client.clone(), namespace)
        .get_opt(lease)
        .await
        .ok()??;
    l.spec?.holder_identity.filter(|h| !h.is_empty())
}

/// Every member's Lease holder, read together: tests and benches poll this
/// over up to fifty members.
pub async fn holders<K: AsRef<str>>(
    clients: &BTreeMap<K, Client>,
    lease: &str,
) -> BTreeMap<String, Option<String>> {
    futures::future::join_all(
        clients
            .iter()
            .map(|(m, c)| async move { (m.as_ref().to_string(), holder(c, lease).await) }),
    )
    .await
    .into_iter()
    .collect()
}

pub async fn member_clients() -> BTreeMap<&'static str, Client> {
    let mut out = BTreeMap::new();
    for m in MEMBERS {
        let c = client(m).await;
        ensure_crd(&c).await;
        out.insert(m, c);
    }
    out
}

/// The same namespace in every member and in home.
pub async fn namespaces(
    clients: &BTreeMap<&str, Client>,
    prefix: &str,
) -> (String, Vec<TestNamespace>) {
    let name = format!("{prefix}-{:08x}", rand::random::<u32>());
    // Home too: the replicas keep their heartbeats and member Secrets there.
    let mut out = vec![TestNamespace::create_named(&client("home").await, "home", &name).await];
    for (m, c) in clients {
        out.push(TestNamespace::create_named(c, m, &name).await);
    }
    (name, out)
}

/// Waits until every member has a holder and the spread over `replicas` is at most one.
pub async fn balanced(
    clients: &BTreeMap<&str, Client>,
    lease: &str,
    replicas: &[&str],
) -> BTreeMap<String, String> {
    eventually(
        "one holder per member, balanced",
        Duration::from_secs(60),
        || async {
            let h = holders(clients, lease).await;
            let held: BTreeMap<String, String> = h
                .into_iter()
                .filter_map(|(m, h)| h.map(|h| (m, h)))
                .collect();
            if held.len() != clients.len() {
                return None;
            }
            let counts: Vec<usize> = replicas
                .iter()
                .map(|r| held.values().filter(|h| h == r).count())
                .collect();
            let (min, max) = (counts.iter().min()?, counts.iter().max()?);
            (max - min <= 1).then_some(held)
        },
    )
    .await
}

/// Waits until every member is held by the replica the assignment gives
/// it (`fleet::shard::assign` over `replicas`): settled past the hand-overs
/// to replicas that started after the first, which `balanced` may not be
/// (four replicas over three members are "balanced" before the last
/// hand-over too).
pub async fn assigned(
    clients: &BTreeMap<&str, Client>,
    lease: &str,
    replicas: &[&str],
) -> BTreeMap<String, String> {
    let clusters: std::collections::BTreeSet<String> =
        clients.keys().map(|m| m.to_string()).collect();
    let live: std::collections::BTreeSet<String> = replicas.iter().map(|r| r.to_string()).collect();
    let want: BTreeMap<String, String> = flotilla::fleet::shard::assign(&clusters, &live)
        .into_iter()
        .map(|(c, r)| (c, r.to_string()))
        .collect();
    eventually(
        "every member held by its assigned replica",
        Duration::from_secs(60),
        || async {
            let held: BTreeMap<String, String> = holders(clients, lease)
                .await
                .into_iter()
                .filter_map(|(m, h)| h.map(|h| (m, h)))
                .collect();
            (held == want).then_some(held)
        },
    )
    .await
}

pub const REPLICA_IDS: [&str; 3] = ["r1", "r2", "r3"];

/// A fourth replica id that the assignment gives exactly one of the three
/// members when it joins REPLICA_IDS, and that member.
pub fn joiner_taking_one_member() -> (String, String) {
    let clusters: std::collections::BTreeSet<String> =
        MEMBERS.iter().map(|m| m.to_string()).collect();
    (4..)
        .find_map(|i| {
            let id = format!("r{i}");
            let mut live: std::collections::BTreeSet<String> =
                REPLICA_IDS.iter().map(|r| r.to_string()).collect();
            live.insert(id.clone());
            let a = flotilla::fleet::shard::assign(&clusters, &live);
            let mine: Vec<String> = a
                .iter()
                .filter(|(_, r)| **r == id.as_str())
                .map(|(c, _)| c.clone())
                .collect();
            (mine.len() == 1).then(|| (id, mine[0].clone()))
        })
        .expect("an id that takes one member")
}

/// Three replicas over the three members, settled: one leader per member.
pub struct ThreeReplicaFleet {
    pub clients: BTreeMap<&'static str, Client>,
    pub namespace: String,
    /// Keeps the test namespaces alive (home and every member).
    pub guards: Vec<TestNamespace>,
    pub replicas: Replicas,
    /// Member -> the replica that leads it.
    pub held: BTreeMap<String, String>,
}

pub async fn three_replica_fleet(prefix: &str) -> ThreeReplicaFleet {
    let clients = member_clients().await;
    let (namespace, guards) = namespaces(&clients, prefix).await;
    let mut replicas = Replicas::new(&namespace, &MEMBERS);
    for id in REPLICA_IDS {
        replicas.start(id);
    }
    let held = balanced(&clients, &replicas.lease_name(), &REPLICA_IDS).await;
    ThreeReplicaFleet {
        clients,
        namespace,
        guards,
        replicas,
        held,
    }
}

/// A client of a replica just started, once it serves: connected, and the
/// registry read (until then every call is UNAVAILABLE).
pub async fn serving(url: &str) -> flotilla::api::client::Client {
    use flotilla::api::client::{ClientOptions, connect};
    use flotilla::api::pb;
    eventually(
        &format!("{url} answers"),
        Duration::from_secs(30),
        || async {
            let options = ClientOptions {
                server: url.to_string(),
                ..Default::default()
            };
            let mut api = connect(&options).await.ok()?;
            api.list_clusters(pb::ListClustersRequest {}).await.ok()?;
            Some(api)
        },
    )
    .await
}
