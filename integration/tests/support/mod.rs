//! Connects integration tests to the running local fleet (`integration/fleet up`).
//!
//! There is no fallback: when the fleet is not there, every test that asks for
//! it panics with the command that starts it. A test that cannot reach real
//! apiservers has proven nothing, so it must not pass.
#![allow(dead_code)] // each test binary uses a different part of this module

pub mod authz;
pub mod browser;
pub mod gate;
pub mod lag;
pub mod policy;
pub mod prometheus;
pub mod raw_grpc;
pub mod registry;
pub mod replicas;
pub mod rollout;

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

/// Where `integration/fleet` writes its state.
pub fn fleet_dir() -> PathBuf {
    std::env::var_os("FLOTILLA_FLEET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".fleet"))
}

pub fn kubeconfig_path(cluster: &str) -> PathBuf {
    fleet_dir()
        .join("kubeconfigs")
        .join(format!("{cluster}.yaml"))
}

/// The image `make image` (or run-tests) wrote, for the Pod and install tests.
pub fn image_tarball() -> PathBuf {
    if let Some(p) = std::env::var_os("FLOTILLA_IMAGE_TAR") {
        return p.into();
    }
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("image/flotilla.tar")
}

/// The fleet's own `integration/fleet` script, for tests that stop and start clusters.
pub fn fleet_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("integration/fleet")
}

/// The kubectl built with the fleet, so its version matches the apiservers.
pub fn kubectl() -> PathBuf {
    let bindir = std::fs::read_to_string(fleet_dir().join("bindir"))
        .expect("the local fleet is not up: run `integration/fleet up` (or `make test`)");
    PathBuf::from(bindir.trim()).join("kubectl")
}

/// A client for one cluster of the fleet, e.g. `home` or `member-2`.
pub async fn client(cluster: &str) -> Client {
    let path = kubeconfig_path(cluster);
    let kubeconfig = Kubeconfig::read_from(&path).unwrap_or_else(|e| {
        panic!(
            "the local fleet is not up ({} unreadable: {e}); run `integration/fleet up` or `make test`",
            path.display()
        )
    });
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("kubeconfig {} is unusable: {e}", path.display()));
    let client = Client::try_from(config).expect("client from fleet kubeconfig");
    client
        .apiserver_version()
        .await
        .unwrap_or_else(|e| panic!("cluster {cluster} does not answer ({e}); is the fleet up?"));
    client
}

/// A namespace of its own for one test, deleted when the test drops it.
pub struct TestNamespace {
    pub name: String,
    pub client: Client,
    cluster: String,
}

impl TestNamespace {
    pub async fn create(client: &Client, cluster: &str, prefix: &str) -> Self {
        let name = format!("{prefix}-{:08x}", rand::random::<u32>());
        Self::create_named(client, cluster, &name).await
    }

    /// A namespace with a given name, e.g. the same one in several clusters.
    pub async fn create_named(client: &Client, cluster: &str, name: &str) -> Self {
        let name = name.to_string();
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": {"flotilla.test/owned": "true"}},
        }))
        .expect("namespace manifest");
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("creating test namespace {name}: {e}"));
        TestNamespace {
            name,
            client: client.clone(),
            cluster: cluster.to_string(),
        }
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        // Drop cannot await. Delete from a short-lived runtime on its own
        // thread, with a client of its own: the test's client is driven by the
        // test's runtime, which is blocked while this runs.
        let name = self.name.clone();
        let cluster = self.cluster.clone();
        let cleanup = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("cleanup runtime");
            rt.block_on(async move {
                let client = client(&cluster).await;
                Api::<Namespace>::all(client)
                    .delete(&name, &DeleteParams::background())
                    .await
                    .map(|_| ())
            })
        });
        match cleanup.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("warning: test namespace {} not deleted: {e}", self.name),
            Err(_) => eprintln!("warning: cleanup of test namespace {} panicked", self.name),
        }
    }
}

/// Polls `check` until it returns `Some`, or panics with `what` after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Builds a typed object from JSON, for compact test manifests.
pub fn from_json<K: serde::de::DeserializeOwned>(value: serde_json::Value) -> K {
    serde_json::from_value(value).expect("test manifest matches its type")
}

/// Installs (or updates) the Microservice CRD in a cluster and waits until
/// the API server serves it.
pub async fn ensure_crd(client: &Client) {
    use kube::CustomResourceExt;
    ensure_crd_of(client, flotilla::crd::Microservice::crd()).await;
}

/// Installs (or updates) the FleetMicroservice CRD, for the home cluster.
pub async fn ensure_fleet_crd(client: &Client) {
    ensure_crd_of(client, flotilla::rollout::spec::crd()).await;
}

async fn ensure_crd_of(
    client: &Client,
    crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Patch, PatchParams};

    let name = crd.metadata.name.clone().expect("crd name");
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    api.patch(
        &name,
        &PatchParams::apply("flotilla-tests").force(),
        &Patch::Apply(&crd),
    )
    .await
    .expect("apply CRD");
    eventually("CRD established", Duration::from_secs(30), || {
        let api = api.clone();
        let name = name.clone();
        async move {
            let crd = api.get(&name).await.ok()?;
            let established = crd
                .status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            established.then_some(())
        }
    })
    .await;
}

/// The controller, run in-process against one test namespace, stopped on drop.
pub struct Operator {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Operator {
    pub fn start(
        client: &Client,
        settings: flotilla::reconciler::Settings,
        hooks: flotilla::reconciler::Hooks,
    ) -> Self {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let shutdown = async move {
            let _ = rx.await;
        };
        let task = tokio::spawn(flotilla::reconciler::run(
            client.clone(),
            settings,
            hooks,
            shutdown,
        ));
        Operator {
            stop: Some(tx),
            task: Some(task),
        }
    }

    /// Stops the controller and waits for in-flight reconciles to finish.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("controller task panicked");
        }
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Settings for a controller that only sees `namespace`.
pub fn settings(cluster: &str, namespace: &str) -> flotilla::reconciler::Settings {
    let mut s = flotilla::reconciler::Settings::new(
        cluster,
        flotilla::reconciler::WriterIdentity {
            holder: format!("test-{namespace}"),
            epoch: None,
            lease: None,
        },
    );
    s.namespace = Some(namespace.to_string());
    s
}

/// Counts the requests one client sends, by verb, leaving out watches: the
/// operator's own API cost, unmixed with what the cluster's controllers do.
#[derive(Clone, Default)]
pub struct RequestCounter(
    std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, u64>>>,
    /// Every counted request, as "VERB path".
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
);

impl RequestCounter {
    fn record(&self, method: &http::Method, uri: &http::Uri) {
        let query = uri.query().unwrap_or_default();
        if query
            .split('&')
            .any(|kv| kv == "watch=true" || kv == "watch=1")
        {
            return;
        }
        let verb = match *method {
            http::Method::GET => "GET",
            http::Method::POST => "POST",
            http::Method::PUT => "PUT",
            http::Method::PATCH => "PATCH",
            http::Method::DELETE => "DELETE",
            _ => "OTHER",
        };
        *self
            .0
            .lock()
            .expect("counter lock")
            .entry(verb.to_string())
            .or_insert(0) += 1;
        self.1
            .lock()
            .expect("counter lock")
            .push(format!("{verb} {}", uri.path()));
    }

    /// Requests so far of `verb` whose path ends with `suffix`.
    pub fn count(&self, verb: &str, suffix: &str) -> usize {
        let prefix = format!("{verb} ");
        self.1
            .lock()
            .expect("counter lock")
            .iter()
            .filter(|r| r.starts_with(&prefix) && r.ends_with(suffix))
            .count()
    }

    /// Every request so far, as "VERB path".
    pub fn all(&self) -> Vec<String> {
        self.1.lock().expect("counter lock").clone()
    }

    pub fn snapshot(&self) -> std::collections::BTreeMap<String, u64> {
        self.0.lock().expect("counter lock").clone()
    }

    /// Requests (watches excluded) since `before`.
    pub fn since(
        &self,
        before: &std::collections::BTreeMap<String, u64>,
    ) -> std::collections::BTreeMap<String, u64> {
        self.snapshot()
            .into_iter()
            .map(|(k, v)| {
                let d = v - before.get(&k).copied().unwrap_or(0);
                (k, d)
            })
            .filter(|(_, d)| *d > 0)
            .collect()
    }
}

/// The user agent of `counting_client`'s requests, in audit logs.
pub const COUNTED_AGENT: &str = "flotilla-test/counted";

/// A client for `cluster` whose every request is counted.
pub async fn counting_client(cluster: &str) -> (Client, RequestCounter) {
    counting_client_with(cluster, None).await
}

/// A counting client whose watches of one resource lag (see `lag.rs`).
/// The member's client config, with the user agent the counting clients
/// share (audit checks tell the test's own controller by it).
async fn counted_config(cluster: &str) -> Config {
    let path = kubeconfig_path(cluster);
    let kubeconfig = Kubeconfig::read_from(&path).expect("fleet kubeconfig (is the fleet up?)");
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(COUNTED_AGENT),
    ));
    config
}

/// A member client whose watches of one resource fail on demand.
pub async fn failing_client(cluster: &str, fail: lag::FailLayer) -> Client {
    failing_client_with(cluster, fail, None).await
}

/// A failing client whose watches of one resource may also lag.
pub async fn failing_client_with(
    cluster: &str,
    fail: lag::FailLayer,
    lag: Option<lag::LagLayer>,
) -> Client {
    let builder = kube::client::ClientBuilder::try_from(counted_config(cluster).await)
        .expect("client builder");
    match lag {
        Some(lag) => builder.with_layer(&lag).with_layer(&fail).build(),
        None => builder.with_layer(&fail).build(),
    }
}

pub async fn counting_client_with(
    cluster: &str,
    lag: Option<lag::LagLayer>,
) -> (Client, RequestCounter) {
    let config = counted_config(cluster).await;
    let counter = RequestCounter::default();
    let recorder = counter.clone();
    let layer = tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
        recorder.record(req.method(), req.uri());
        req
    });
    let builder = kube::client::ClientBuilder::try_from(config).expect("client builder");
    let client = match lag {
        Some(lag) => builder.with_layer(&lag).with_layer(&layer).build(),
        None => builder.with_layer(&layer).build(),
    };
    (client, counter)
}

/// Waits until `n` Microservices behind `api` have condition `type_`=True
/// at their current generation.
pub async fn wait_all_true(
    api: &Api<flotilla::crd::Microservice>,
    n: usize,
    type_: &str,
    timeout: Duration,
) {
    let what = format!("{n} Microservices with {type_}=True at their generation");
    eventually(&what, timeout, || {
        let api = api.clone();
        async move {
            let list = api.list(&kube::api::ListParams::default()).await.ok()?;
            let done = list
                .items
                .iter()
                .filter(|m| {
                    m.status.as_ref().is_some_and(|s| {
                        s.observed_generation == m.metadata.generation
                            && flotilla::domain::conditions::is_true(&s.conditions, type_)
                    })
                })
                .count();
            (done == n).then_some(())
        }
    })
    .await;
}

/// One successful write recorded in a cluster's audit log.
#[derive(Debug, Clone)]
pub struct AuditedWrite {
    /// When the apiserver received it (one server clock: comparable).
    pub received: String,
    pub user_agent: String,
    pub verb: String,
    pub resource: String,
    pub name: String,
    /// The address it came from (chaos's late-delivery path has its own).
    pub source: String,
}

/// Successful writes to Deployments, Services and Microservices in
/// `namespace` of `cluster`, in the order the apiserver received them.
pub fn audited_writes(cluster: &str, namespace: &str) -> Vec<AuditedWrite> {
    let path = fleet_dir()
        .join("logs")
        .join(format!("{cluster}-audit.log"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("audit log {}: {e}", path.display()));
    let mut out: Vec<AuditedWrite> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["objectRef"]["namespace"] == namespace)
        .filter(|e| {
            matches!(
                e["verb"].as_str(),
                Some("create" | "update" | "patch" | "delete")
            )
        })
        .filter(|e| {
            e["responseStatus"]["code"]
                .as_u64()
                .is_some_and(|c| c < 300)
        })
        .filter(|e| {
            matches!(
                e["objectRef"]["resource"].as_str(),
                Some("deployments" | "services" | "microservices")
            )
        })
        .map(|e| AuditedWrite {
            received: e["requestReceivedTimestamp"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            user_agent: e["userAgent"].as_str().unwrap_or_default().to_string(),
            verb: e["verb"].as_str().unwrap_or_default().to_string(),
            resource: e["objectRef"]["resource"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            name: e["objectRef"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            source: source_ip(&e),
        })
        .collect();
    // RFC 3339 with fixed-width microseconds in UTC sorts as text.
    out.sort_by(|a, b| a.received.cmp(&b.received));
    out
}

/// (verb, resource) of every request `agent` sent to `namespace` of
/// `cluster` that its audit log records (watches are not recorded).
pub fn audited_requests(cluster: &str, namespace: &str, agent: &str) -> Vec<(String, String)> {
    audit_log(cluster)
        .into_iter()
        .filter(|e| e["objectRef"]["namespace"] == namespace && e["userAgent"] == agent)
        .filter(|e| e["verb"] != "watch")
        .map(|e| {
            (
                e["verb"].as_str().unwrap_or_default().to_string(),
                e["objectRef"]["resource"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}

/// The split-brain check: operator writes to `namespace` in `cluster` come
/// in one unbroken run per writer, so no two replicas' leadership
/// intervals overlap there. Returns the writers in the order they took over.
pub fn assert_one_writer_at_a_time(cluster: &str, namespace: &str) -> Vec<String> {
    let writes: Vec<AuditedWrite> = audited_writes(cluster, namespace)
        .into_iter()
        .filter(|w| w.user_agent.starts_with("flotilla/"))
        .collect();
    let mut runs: Vec<String> = Vec::new();
    for w in &writes {
        if runs.last() != Some(&w.user_agent) {
            assert!(
                !runs.contains(&w.user_agent),
                "split brain in {cluster}: {} wrote again after {:?} took over: {writes:#?}",
                w.user_agent,
                runs.last()
            );
            runs.push(w.user_agent.clone());
        }
    }
    runs
}

/// One successful write of a Lease, with the holder it named (the audit
/// policy records Lease writes with their bodies).
#[derive(Debug, Clone)]
pub struct LeaseWrite {
    pub received: jiff::Timestamp,
    pub writer: String,
    /// Empty when the write released the Lease.
    pub holder: String,
    /// The address it came from.
    pub source: String,
}

/// The first address an audit event names as its source.
pub fn source_ip(e: &serde_json::Value) -> String {
    e["sourceIPs"][0].as_str().unwrap_or_default().to_string()
}

/// Every entry of `cluster`'s audit log.
pub fn audit_log(cluster: &str) -> Vec<serde_json::Value> {
    audit_log_with(cluster, "")
}

/// The events of lines holding `needle` (a namespace): only those lines
/// are parsed, since late in a run the home log is large.
pub fn audit_log_with(cluster: &str, needle: &str) -> Vec<serde_json::Value> {
    let path = fleet_dir()
        .join("logs")
        .join(format!("{cluster}-audit.log"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("audit log {}: {e}", path.display()));
    text.lines()
        .filter(|l| l.contains(needle))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .collect()
}

pub fn audit_events(cluster: &str) -> Vec<serde_json::Value> {
    audit_events_with(cluster, "")
}

/// The successful events among `audit_log_with`'s.
pub fn audit_events_with(cluster: &str, needle: &str) -> Vec<serde_json::Value> {
    audit_log_with(cluster, needle)
        .into_iter()
        .filter(|e| {
            e["responseStatus"]["code"]
                .as_u64()
                .is_some_and(|c| c < 300)
        })
        .collect()
}

pub fn received(e: &serde_json::Value) -> jiff::Timestamp {
    e["requestReceivedTimestamp"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .expect("audit event with a timestamp")
}

/// Successful writes of one Lease in `cluster`, in the order received.
pub fn lease_writes(cluster: &str, namespace: &str, lease: &str) -> Vec<LeaseWrite> {
    let mut out: Vec<LeaseWrite> = audit_events_with(cluster, lease)
        .into_iter()
        .filter(|e| e["objectRef"]["resource"] == "leases")
        .filter(|e| e["objectRef"]["namespace"] == namespace && e["objectRef"]["name"] == lease)
        .filter(|e| matches!(e["verb"].as_str(), Some("create" | "update")))
        .map(|e| LeaseWrite {
            received: received(&e),
            writer: e["userAgent"]
                .as_str()
                .unwrap_or_default()
                .trim_start_matches("flotilla/")
                .to_string(),
            holder: e["requestObject"]["spec"]["holderIdentity"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            source: source_ip(&e),
        })
        .collect();
    out.sort_by_key(|w| w.received);
    out
}

/// The single-writer property, from the apiserver's own clock: every
/// operator write to `namespace` in `cluster` was received while its writer
/// held the Lease. That is, after a Lease write by that writer naming itself
/// holder, with no write naming another holder (or none) in between, and
/// within `renew_deadline` (plus `slack` for the network) of it. Returns the
/// number of operator writes checked.
pub fn assert_writes_inside_leadership(
    cluster: &str,
    namespace: &str,
    lease: &str,
    renew_deadline: Duration,
    slack: Duration,
) -> usize {
    let leases = lease_writes(cluster, LEASE_NAMESPACE_FOR_AUDIT, lease);
    let writes = audited_writes(cluster, namespace);
    let mut checked = 0;
    for w in writes
        .iter()
        .filter(|w| w.user_agent.starts_with("flotilla/"))
    {
        let writer = w.user_agent.trim_start_matches("flotilla/");
        let at: jiff::Timestamp = w.received.parse().expect("timestamp");
        let last = leases.iter().rev().find(|l| l.received <= at);
        let ok = match last {
            Some(l) if l.holder == writer => {
                let renewed = leases
                    .iter()
                    .rev()
                    .find(|r| r.received <= at && r.writer == writer && r.holder == writer)
                    .expect("a Lease write by the holder");
                let age = at.duration_since(renewed.received);
                age <= jiff::SignedDuration::try_from(renew_deadline + slack).expect("duration")
            }
            _ => false,
        };
        assert!(
            ok,
            "split brain in {cluster}: {writer} wrote {} {} at {at} outside its leadership; \
             last Lease write before it: {last:?}",
            w.resource, w.name
        );
        checked += 1;
    }
    checked
}

/// Where the fleet's member Leases live.
pub const LEASE_NAMESPACE_FOR_AUDIT: &str = "flotilla-system";

/// Runs `integration/fleet ARGS`, failing the test if it fails.
pub fn fleet_cmd(args: &[&str]) {
    let status = wait_within(
        std::process::Command::new(fleet_script()).args(args),
        Duration::from_secs(180),
    );
    assert!(status.success(), "integration/fleet {args:?} failed");
}

/// Runs `cmd` to its end, inheriting stdout and stderr, and panics (after
/// killing it) if it runs past `limit`: a hung child fails its test, not CI.
pub fn wait_within(cmd: &mut std::process::Command, limit: Duration) -> std::process::ExitStatus {
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    reap_within(child, cmd, limit)
}

/// `Command::output`, bounded by `limit` like [`wait_within`].
pub fn output_within(cmd: &mut std::process::Command, limit: Duration) -> std::process::Output {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    // Drained beside the wait, so a child that fills a pipe still ends.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let err = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let status = reap_within(child, cmd, limit);
    std::process::Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

fn reap_within(
    mut child: std::process::Child,
    cmd: &std::process::Command,
    limit: Duration,
) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("wait for a child") {
            return status;
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} still running after {limit:?}; killed");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Stops a member's apiserver; starts it again when dropped, whatever the
/// test's outcome, so the tests that follow find the fleet whole.
pub struct StoppedMember(&'static str);

impl StoppedMember {
    pub fn stop(cluster: &'static str) -> Self {
        fleet_cmd(&["stop", cluster]);
        StoppedMember(cluster)
    }

    /// kill -9: down at a known moment. `stop` can spend its 10 s of
    /// SIGTERM not answering, and a timer started by the first failed
    /// read may run out before it returns.
    pub fn crash(cluster: &'static str) -> Self {
        fleet_cmd(&["crash", cluster]);
        StoppedMember(cluster)
    }
}

impl Drop for StoppedMember {
    fn drop(&mut self) {
        fleet_cmd(&["start", self.0]);
    }
}

/// A Microservice manifest; `replicas: None` leaves the CRD default.
pub fn microservice(
    name: &str,
    image: &str,
    port: i32,
    replicas: Option<i32>,
) -> flotilla::crd::Microservice {
    let mut spec = serde_json::json!({"image": image, "port": port});
    if let Some(r) = replicas {
        spec["replicas"] = serde_json::json!(r);
    }
    from_json(serde_json::json!({
        "apiVersion": "platform.example.io/v1alpha1",
        "kind": "Microservice",
        "metadata": {"name": name},
        "spec": spec,
    }))
}

/// A plain HTTP/1.1 GET: the status code and body.
pub async fn http_get(url: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://")?;
    let (host, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_string()), |(h, p)| (h, format!("/{p}")));
    let mut stream = tokio::net::TcpStream::connect(host).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((code, body))
}

/// The reconciler tests' cluster, and a fresh namespace in it.
pub async fn setup(prefix: &str) -> (Client, TestNamespace) {
    let client = client("member-1").await;
    ensure_crd(&client).await;
    let ns = TestNamespace::create(&client, "member-1", prefix).await;
    (client, ns)
}

/// Waits until `name` has condition `type_` with `status` (and `reason`, if
/// given) at its current generation; returns the object.
pub async fn wait_condition(
    api: &Api<flotilla::crd::Microservice>,
    name: &str,
    type_: &str,
    status: &str,
    reason: Option<&str>,
) -> flotilla::crd::Microservice {
    let what = format!("{name}: {type_}={status} {reason:?} at the current generation");
    eventually(&what, Duration::from_secs(90), || {
        let api = api.clone();
        async move {
            let ms = api.get(name).await.ok()?;
            let st = ms.status.as_ref()?;
            let generation = ms.metadata.generation?;
            let c = flotilla::domain::conditions::find(&st.conditions, type_)?;
            let ok = st.observed_generation == Some(generation)
                && c.observed_generation == Some(generation)
                && c.status == status
                && reason.is_none_or(|r| c.reason == r);
            ok.then_some(ms.clone())
        }
    })
    .await
}

/// Creates Microservice `name` (image `image`, one replica) and waits until
/// it is Available at its generation; returns that condition.
pub async fn create_available(
    api: &Api<flotilla::crd::Microservice>,
    name: &str,
    image: &str,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    api.create(
        &PostParams::default(),
        &microservice(name, image, 8080, Some(1)),
    )
    .await
    .expect("create");
    let ms = wait_condition(api, name, "Available", "True", None).await;
    flotilla::domain::conditions::find(&ms.status.expect("status").conditions, "Available")
        .expect("Available")
        .clone()
}

/// The `p` quantile (0..=1) by nearest rank; NaN when there is nothing.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// Runs a bash script (`-e`) in `dir`, failing the test with its stderr.
pub fn sh_in(dir: &std::path::Path, script: &str) {
    let ok = output_within(
        std::process::Command::new("bash")
            .arg("-ec")
            .arg(script)
            .current_dir(dir),
        Duration::from_secs(120),
    );
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
}

/// A CA, a server certificate for 127.0.0.1, a client certificate from that
/// CA, and a client certificate from a CA the server does not know.
pub fn certificates(dir: &std::path::Path) {
    let sh = |script: &str| sh_in(dir, script);
    sh(r#"
      for ca in ca other-ca; do
        openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=$ca" -keyout $ca.key -out $ca.crt 2>/dev/null
      done
      printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' > server.ext
      openssl req -newkey rsa:2048 -nodes -subj "/CN=flotilla" -keyout server.key -out server.csr 2>/dev/null
      openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile server.ext -out server.crt 2>/dev/null
      printf 'extendedKeyUsage=clientAuth\n' > client.ext
      for who in client:ca stranger:other-ca; do
        name=${who%%:*}; signer=${who##*:}
        openssl req -newkey rsa:2048 -nodes -subj "/CN=$name" -keyout $name.key -out $name.csr 2>/dev/null
        openssl x509 -req -in $name.csr -CA $signer.crt -CAkey $signer.key -CAcreateserial -days 2 -extfile client.ext -out $name.crt 2>/dev/null
      done
      printf 'let-me-in\n' > token
    "#);
}

/// Waits until Deployment `name` behind `api` runs `image`.
pub async fn wait_deployment_image(
    api: &Api<k8s_openapi::api::apps::v1::Deployment>,
    name: &str,
    image: &str,
    timeout: Duration,
) {
    eventually(&format!("{name} running {image}"), timeout, || async {
        let d = api.get(name).await.ok()?;
        let now = d.spec?.template.spec?.containers.first()?.image.clone()?;
        (now == image).then_some(())
    })
    .await;
}

/// The member's kubeconfig, pointed at `127.0.0.1:port` instead; and the
/// member's own address, for a proxy to forward to.
pub fn kubeconfig_via(member: &str, port: u16) -> (String, String) {
    let text = std::fs::read_to_string(kubeconfig_path(member)).expect("kubeconfig");
    let mut kc: serde_yaml::Value = serde_yaml::from_str(&text).expect("yaml");
    let server = kc["clusters"][0]["cluster"]["server"]
        .as_str()
        .expect("server")
        .to_string();
    let upstream = server.trim_start_matches("https://").to_string();
    kc["clusters"][0]["cluster"]["server"] = format!("https://127.0.0.1:{port}").into();
    (serde_yaml::to_string(&kc).expect("yaml"), upstream)
}

/// Reads an HTTP/1.1 response's status line, byte by byte (nothing after
/// it), and returns its code.
pub async fn status_line(s: &mut tokio::net::TcpStream) -> u16 {
    use tokio::io::AsyncReadExt;
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\r\n") {
        s.read_exact(&mut byte).await.expect("a status line");
        line.push(byte[0]);
    }
    String::from_utf8_lossy(&line)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status code")
}

/// An event stream of the dashboard at `addr` whose client reads nothing
/// after the status line: a 4 KiB receive window, from `source` (a
/// loopback address of its own, so per-client shares do not refuse it).
/// Returns the status code and the connection, held open.
pub async fn stalled_event_stream(
    addr: &str,
    source: std::net::IpAddr,
) -> (u16, tokio::net::TcpStream) {
    use tokio::io::AsyncWriteExt;
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("receive window");
    socket
        .bind(std::net::SocketAddr::new(source, 0))
        .expect("bind the source address");
    let mut s = socket
        .connect(addr.parse().expect("an address"))
        .await
        .expect("connect");
    s.write_all(format!("GET /api/events HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .expect("request");
    let code = status_line(&mut s).await;
    (code, s)
}
