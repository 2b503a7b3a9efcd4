//! The workload the nemesis runs against: plain Microservices created,
//! edited and deleted in every member; FleetMicroservice releases (good
//! and never-ready), pauses and undos; `flotilla wait` and `flotilla
//! rollout wait` against random replicas; a gRPC watch kept open and
//! resumed. Every answer is recorded with its time.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio::time::Instant;

use crate::check::Answer;
use crate::schedule::MEMBERS;
use flotilla::crd::Microservice;
use flotilla::rollout::spec::{FleetMicroservice, WaveState};

/// Plain Microservices per worker, and workers.
pub const PLAIN_WORKERS: usize = 2;
pub const PER_WORKER: usize = 3;
pub const FLEET_OBJECTS: usize = 3;
/// The FleetMicroservice whose second wave, `rest`, is Manual: the
/// approver task approves it over gRPC (and someone without the right
/// tries first).
pub const MANUAL: usize = 2;
pub const MANUAL_WAVE: &str = "rest";
/// Who may approve in the chaos fleet: the write token's caller.
pub const APPROVERS: [&str; 1] = ["write-token"];
pub const NEVER_READY: &str = "never-ready";
/// The FleetMicroservice placed by count (`numberOfClusters`), with
/// failover: `placed_worker` moves its count between 1 and 2.
pub const PLACED: &str = "placed";
pub const PLACED_IMAGE: &str = "ghcr.io/acme/placed:1";
/// Its `unreachableAfter`.
pub const UNREACHABLE_AFTER: Duration = Duration::from_secs(5);
/// The FleetMicroservice whose fleet name answers `Failover`: the canary
/// is its primary.
pub const DNS_FAILOVER: usize = 1;
/// The FleetMicroservice whose waves ask a webhook at the end of each bake;
/// `verdict_flipper` turns its answer between pass and fail.
pub const ANALYZED: usize = 0;

/// What the workload did and was told, shared by its tasks.
#[derive(Default)]
pub struct Record {
    pub answers: Mutex<Vec<Answer>>,
    /// (time, what): every operation, for the history excerpt.
    pub ops: Mutex<Vec<(Timestamp, String)>>,
    /// Plain Microservice -> its last image, None once deleted.
    pub plain: Mutex<BTreeMap<String, Option<String>>>,
    /// FleetMicroservice -> its releases, oldest first.
    pub releases: Mutex<BTreeMap<String, Vec<Release>>>,
    /// The gRPC watch client's view: name -> cluster -> image.
    pub watch: Mutex<BTreeMap<String, BTreeMap<String, String>>>,
    pub watch_resumes: Mutex<usize>,
    /// The dashboard event stream's view, the same way.
    pub dashboard: Mutex<BTreeMap<String, BTreeMap<String, String>>>,
    pub dashboard_resumes: Mutex<usize>,
    /// Each deletion seen complete in a member, with when it began and
    /// ended (#67's orphan-record check); `Err` when etcd's revision could
    /// not be read after it (unverifiable).
    pub gone: Mutex<Vec<Result<Deleted, String>>>,
    /// Approve calls made with the read token, which lacks the right.
    pub forbidden: Mutex<Vec<crate::check::Forbidden>>,
    /// `PLACED`'s numberOfClusters as patched, oldest first.
    pub counts: Mutex<Vec<crate::placement::Count>>,
    /// Whether the analysis webhook answers 503 now.
    pub failing: std::sync::atomic::AtomicBool,
    /// How many times the webhook was asked, and failed.
    pub asked: std::sync::atomic::AtomicUsize,
    pub refused: std::sync::atomic::AtomicUsize,
}

/// A deletion seen complete, and when it began and ended.
pub type Deleted = (crate::check::Gone, Instant, Instant);

#[derive(Debug, Clone)]
pub struct Release {
    pub image: String,
    /// Its `rollout wait` exit code, once answered.
    pub code: Option<i32>,
}

impl Record {
    pub fn op(&self, what: String) {
        self.ops.lock().unwrap().push((Timestamp::now(), what));
    }
}

/// Where the workload reaches the fleet.
#[derive(Clone)]
pub struct Target {
    pub namespace: String,
    pub home: Client,
    pub members: BTreeMap<&'static str, Client>,
    /// Each replica's gRPC URL, kept current by the nemesis.
    pub urls: Arc<Mutex<BTreeMap<String, String>>>,
    pub read_token: String,
    pub write_token: String,
    /// Each replica's dashboard, host:port.
    pub dashboards: Vec<String>,
    /// The analysis webhook (`verdict_server`).
    pub verdict_url: String,
}

impl Target {
    fn url(&self, rng: &mut StdRng) -> String {
        let urls = self.urls.lock().unwrap();
        let all: Vec<&String> = urls.values().collect();
        all[rng.random_range(0..all.len())].clone()
    }
}

pub fn plain_name(worker: usize, k: usize) -> String {
    format!("svc-{worker}-{k}")
}

pub fn fleet_name(f: usize) -> String {
    format!("fleet-{f}")
}

/// `flotilla ARGS`, killed after `limit`: the exit code (-1 when killed).
pub async fn cli(args: &[String], limit: Duration) -> (i32, String) {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_flotilla"));
    cmd.args(args).kill_on_drop(true);
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let Ok(child) = cmd.spawn() else {
        return (-1, "could not start flotilla".into());
    };
    match tokio::time::timeout(limit, child.wait_with_output()).await {
        Ok(Ok(out)) => (
            out.status.code().unwrap_or(-1),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        ),
        _ => (-1, format!("no answer within {limit:?}")),
    }
}

/// Applies `spec` to `name` in every member (create or update), retrying
/// each member for up to three minutes: the nemesis stops an apiserver for
/// up to 30 s, and stopping and starting it takes about 15 s more, back to
/// back with the next member fault.
async fn apply_everywhere(t: &Target, name: &str, image: &str) {
    for m in MEMBERS {
        apply_in(t, m, name, image).await;
    }
}

/// Applies `image` to `name` in one member, retried like `apply_everywhere`.
pub async fn apply_in(t: &Target, member: &str, name: &str, image: &str) {
    let body = json!({
        "apiVersion": "platform.example.io/v1alpha1",
        "kind": "Microservice",
        "metadata": {"name": name},
        "spec": {"image": image, "port": 8080, "replicas": 1},
    });
    let api: Api<Microservice> = Api::namespaced(t.members[member].clone(), &t.namespace);
    let pp = PatchParams::apply("chaos-workload").force();
    let patch = Patch::Apply(&body);
    retry(|| api.patch(name, &pp, &patch)).await;
}

/// The Microservices the nemesis edits all at once in one member before it
/// stops that member's leader (`Fault::PauseLeader`); in every member.
pub const BURST: usize = 6;

pub fn burst_name(i: usize) -> String {
    format!("burst-{i}")
}

/// Every burst Microservice in `member` set to `image`, the edits at once.
pub async fn burst_in(t: &Target, member: &str, image: &str) {
    let names: Vec<String> = (0..BURST).map(burst_name).collect();
    futures::future::join_all(names.iter().map(|n| apply_in(t, member, n, image))).await;
}

/// Deletes `name` in every member and waits until it is gone: a
/// Microservice whose registry cleanup is held stays while its finalizer
/// does, and an apply to it then would not create it again.
async fn delete_everywhere(t: &Target, rec: &Record, name: &str) {
    let began = Instant::now();
    let mut uids = Vec::new();
    for m in MEMBERS {
        let api: Api<Microservice> = Api::namespaced(t.members[m].clone(), &t.namespace);
        if let Ok(Some(ms)) = api.get_opt(name).await
            && let Some(uid) = ms.metadata.uid
        {
            uids.push((m, uid));
        }
        retry(|| async {
            match api.delete(name, &DeleteParams::default()).await {
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                r => r.map(|_| ()),
            }
        })
        .await;
    }
    let until = Instant::now() + Duration::from_secs(120);
    for m in MEMBERS {
        let api: Api<Microservice> = Api::namespaced(t.members[m].clone(), &t.namespace);
        while !matches!(api.get_opt(name).await, Ok(None)) {
            assert!(
                Instant::now() < until,
                "{name} still in {m} two minutes after its deletion"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    // Every write of these objects' records in etcd is before this
    // revision, or after their deletion was seen.
    let revision = crate::registry_history::revision_retrying(60).await;
    let ended = Instant::now();
    let mut gone = rec.gone.lock().unwrap();
    for (m, uid) in uids {
        gone.push(revision.clone().map(|revision| {
            let g = crate::check::Gone {
                uid,
                object: format!("{m} {}/{name}", t.namespace),
                revision,
                during_registry_stop: false,
            };
            (g, began, ended)
        }));
    }
}

async fn retry<T, F, Fut>(mut call: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let until = Instant::now() + Duration::from_secs(180);
    loop {
        match tokio::time::timeout(Duration::from_secs(10), call()).await {
            Ok(Ok(_)) => return,
            _ if Instant::now() > until => panic!("a workload write failed for three minutes"),
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// `flotilla wait` for `name` at `image` in every member, recorded.
/// A wait's timeout: `most`, but none runs more than a minute past the end
/// of the run (the quiet period judges what is left).
fn tail(until: Instant, most: Duration) -> Duration {
    let left = until.saturating_duration_since(Instant::now()) + Duration::from_secs(60);
    most.min(left).max(Duration::from_secs(5))
}

async fn wait_for(
    t: &Target,
    rec: &Record,
    rng: &mut StdRng,
    (name, image): (&str, &str),
    created: bool,
    until: Instant,
) {
    let server = t.url(rng);
    let mut args: Vec<String> = ["wait", &format!("{}/{name}", t.namespace), "--image", image]
        .iter()
        .map(|s| s.to_string())
        .collect();
    // Half the waits after an edit name every member; the rest, and every
    // wait after a create (a new service, whose clusters a user does not
    // list), name none. The replica must then know every cluster that
    // holds it (the NotListed rule and the live reads): a create into a
    // member gone silent after the deletion was seen is what tests that.
    // It is in every member either way.
    let named = !created && rng.random_bool(0.5);
    if named {
        for m in MEMBERS {
            args.extend(["--cluster".into(), m.into()]);
        }
    }
    let limit = tail(until, Duration::from_secs(60));
    args.extend([
        "--timeout".into(),
        format!("{}s", limit.as_secs()),
        "--server".into(),
        server.clone(),
        "--token-file".into(),
        t.read_token.clone(),
    ]);
    let started = Timestamp::now();
    let (code, _) = cli(&args, limit + Duration::from_secs(30)).await;
    rec.answers.lock().unwrap().push(Answer {
        command: if named { "wait" } else { "wait (no --cluster)" }.into(),
        name: name.into(),
        image: image.into(),
        clusters: MEMBERS.iter().map(|m| m.to_string()).collect(),
        server,
        started,
        answered: Timestamp::now(),
        code,
    });
}

/// One plain worker: its own Microservices, one operation at a time, each
/// create or edit followed by a wait (so no edit races its own wait).
pub async fn plain_worker(t: Target, rec: Arc<Record>, seed: u64, worker: usize, until: Instant) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut tag = 100;
    while Instant::now() < until {
        let name = plain_name(worker, rng.random_range(0..PER_WORKER));
        let exists = rec
            .plain
            .lock()
            .unwrap()
            .get(&name)
            .cloned()
            .flatten()
            .is_some();
        if exists && rng.random_bool(0.4) {
            rec.op(format!("delete {name} everywhere"));
            delete_everywhere(&t, &rec, &name).await;
            rec.plain.lock().unwrap().insert(name.clone(), None);
            rec.op(format!("deleted {name} everywhere"));
        } else {
            tag += 1;
            let image = format!("ghcr.io/acme/{name}:{tag}");
            rec.op(format!("apply {name} {image} everywhere"));
            apply_everywhere(&t, &name, &image).await;
            rec.plain
                .lock()
                .unwrap()
                .insert(name.clone(), Some(image.clone()));
            wait_for(&t, &rec, &mut rng, (&name, &image), !exists, until).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..2000))).await;
    }
}

/// Creates the plain Microservices and FleetMicroservices the run starts with.
pub async fn seed_objects(t: &Target, rec: &Record) {
    for w in 0..PLAIN_WORKERS {
        for k in 0..PER_WORKER {
            let name = plain_name(w, k);
            let image = format!("ghcr.io/acme/{name}:1");
            apply_everywhere(t, &name, &image).await;
            rec.plain.lock().unwrap().insert(name, Some(image));
        }
    }
    for i in 0..BURST {
        let image = "ghcr.io/acme/burst:1";
        apply_everywhere(t, &burst_name(i), image).await;
        rec.plain
            .lock()
            .unwrap()
            .insert(burst_name(i), Some(image.into()));
    }
    let api: Api<FleetMicroservice> = Api::namespaced(t.home.clone(), &t.namespace);
    for f in 0..FLEET_OBJECTS {
        let name = fleet_name(f);
        let image = format!("ghcr.io/acme/{name}:1");
        let mut waves =
            vec![json!({"name": "canary", "clusterSelector": {"matchLabels": {"ring": "canary"}}})];
        if f == MANUAL {
            waves.push(json!({
                "name": MANUAL_WAVE,
                "clusterSelector": {"matchLabels": {"ring": "rest"}},
                "approval": "Manual",
            }));
        }
        let mut spec = json!({
            "template": {"image": image, "port": 8080, "replicas": 1},
            "rollout": {
                "waves": waves,
                "bake": format!("{}s", crate::BAKE.as_secs()),
                "progressDeadline": "30s",
                "onFailure": "Rollback",
                "windows": windows_of(f),
            },
        });
        if f == ANALYZED {
            spec["rollout"]["analysis"] = json!([{
                "name": "verdict",
                "webhook": {"url": t.verdict_url, "timeout": "2s"},
                "interval": "1s",
                "failureLimit": 1,
            }]);
        }
        if f == DNS_FAILOVER {
            spec["dns"] = json!({
                "strategy": "Failover",
                "primary": {"clusterSelector": {"matchLabels": {"ring": "canary"}}},
            });
        }
        let fms: FleetMicroservice = crate::support::from_json(json!({
            "apiVersion": "platform.example.io/v1alpha1",
            "kind": "FleetMicroservice",
            "metadata": {"name": name},
            "spec": spec,
        }));
        api.create(&Default::default(), &fms)
            .await
            .expect("create FleetMicroservice");
        rec.releases
            .lock()
            .unwrap()
            .insert(name, vec![Release { image, code: None }]);
    }
    let placed: FleetMicroservice = crate::support::from_json(json!({
        "apiVersion": "platform.example.io/v1alpha1",
        "kind": "FleetMicroservice",
        "metadata": {"name": PLACED},
        "spec": {
            "template": {"image": PLACED_IMAGE, "port": 8080, "replicas": 1},
            "placement": {
                "numberOfClusters": 1,
                "failover": {
                    "unreachableAfter": format!("{}s", UNREACHABLE_AFTER.as_secs()),
                    "unavailableAfter": "60s",
                },
            },
            "rollout": {"progressDeadline": "30s", "onFailure": "Rollback"},
        }
    }));
    api.create(&Default::default(), &placed)
        .await
        .expect("create the placed FleetMicroservice");
    rec.counts.lock().unwrap().push(crate::placement::Count {
        at: Timestamp::now(),
        n: 1,
    });
}

/// Moves `PLACED`'s numberOfClusters between 1 and 2 every 15–30 s, so
/// clusters are added and removed (and deletes judged) whatever the faults
/// hit; failovers come from the member faults. Ends at 1.
pub async fn placed_worker(t: Target, rec: Arc<Record>, seed: u64, until: Instant) {
    let mut rng = StdRng::seed_from_u64(seed);
    let api: Api<FleetMicroservice> = Api::namespaced(t.home.clone(), &t.namespace);
    let mut n = 1;
    loop {
        let pause = Duration::from_millis(rng.random_range(15_000..30_000));
        let last = Instant::now() + pause >= until;
        if last && n == 1 {
            break;
        }
        tokio::time::sleep(pause.min(until.saturating_duration_since(Instant::now()))).await;
        n = 3 - n;
        let body = json!({"spec": {"placement": {"numberOfClusters": n}}});
        let (pp, patch) = (PatchParams::default(), Patch::Merge(&body));
        retry(|| api.patch(PLACED, &pp, &patch)).await;
        let at = Timestamp::now();
        rec.counts
            .lock()
            .unwrap()
            .push(crate::placement::Count { at, n: n as usize });
        rec.op(format!("placement {PLACED} numberOfClusters {n}"));
        if last {
            break;
        }
    }
}

/// The FleetMicroservices whose waves keep time windows, from their
/// creation on: fleet-0 starts waves only in odd minutes (an Allow window),
/// fleet-1 never in odd minutes (a Deny window). Each opens and shuts
/// every minute. (Set and lifted by patches mid-run instead, a replica's
/// rollout view of the patched object went stale for minutes: a product
/// issue still open, see docs/decisions.md.)
pub const WINDOWED: [(usize, &str); 2] = [(0, "Allow"), (1, "Deny")];
const ODD_MINUTES: &str = "1-59/2 * * * *";

/// The windows object `f` is created with, if any.
fn windows_of(f: usize) -> serde_json::Value {
    match WINDOWED.iter().find(|(w, _)| *w == f) {
        Some((_, kind)) => json!([{"kind": kind, "schedule": ODD_MINUTES, "duration": "1m"}]),
        None => json!([]),
    }
}

/// When the object `f` with a window of `kind` may start no wave between
/// `from` and `to`: the even minutes for the Allow window, the odd ones for
/// the Deny window. Worked out here from the minutes, not by the product's
/// cron.
pub fn shut(f: usize, kind: &str, from: Timestamp, to: Timestamp) -> Vec<crate::check::Shut> {
    let mut out = Vec::new();
    let mut minute = from.as_second().div_euclid(60);
    while minute * 60 < to.as_second() + 1 {
        if (minute % 2 == 1) == (kind == "Deny") {
            let start = Timestamp::from_second(minute * 60)
                .expect("a minute")
                .max(from);
            let end = Timestamp::from_second(minute * 60 + 60)
                .expect("a minute")
                .min(to);
            if start < end {
                out.push(crate::check::Shut {
                    name: fleet_name(f),
                    from: start,
                    to: end,
                });
            }
        }
        minute += 1;
    }
    out
}

/// One FleetMicroservice's releases: good images, never-ready ones, pauses
/// and undos, each release followed by `flotilla rollout wait`.
pub async fn fleet_worker(t: Target, rec: Arc<Record>, seed: u64, f: usize, until: Instant) {
    let mut rng = StdRng::seed_from_u64(seed);
    let name = fleet_name(f);
    let key = format!("{}/{name}", t.namespace);
    let api: Api<FleetMicroservice> = Api::namespaced(t.home.clone(), &t.namespace);
    let mut tag = 1;
    while Instant::now() < until {
        let roll = rng.random_range(0..100);
        let image = if roll < 15 {
            // Undo: the spec takes a stored revision's template back.
            let (code, out) = cli(
                &rollout_args(&t, &mut rng, "undo", &key, &t.write_token),
                Duration::from_secs(60),
            )
            .await;
            rec.op(format!("rollout undo {name}: exit {code}: {}", out.trim()));
            if code != 0 {
                continue;
            }
            let Ok(fms) = api.get(&name).await else {
                continue;
            };
            fms.spec.template.image.clone()
        } else if roll < 30 {
            let (code, _) = cli(
                &rollout_args(&t, &mut rng, "pause", &key, &t.write_token),
                Duration::from_secs(60),
            )
            .await;
            rec.op(format!("rollout pause {name}: exit {code}"));
            tokio::time::sleep(Duration::from_millis(rng.random_range(1000..5000))).await;
            // Resume until it takes: a pause left behind would hold the rollout.
            loop {
                let (code, _) = cli(
                    &rollout_args(&t, &mut rng, "resume", &key, &t.write_token),
                    Duration::from_secs(60),
                )
                .await;
                rec.op(format!("rollout resume {name}: exit {code}"));
                if code == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            continue;
        } else {
            tag += 1;
            let tag = if roll < 45 {
                NEVER_READY.to_string()
            } else {
                tag.to_string()
            };
            let image = format!("ghcr.io/acme/{name}:{tag}");
            let body = json!({"spec": {"template": {"image": image}}});
            let (pp, patch) = (PatchParams::default(), Patch::Merge(&body));
            retry(|| api.patch(&name, &pp, &patch)).await;
            rec.op(format!("release {name} {image}"));
            image
        };
        let started = Timestamp::now();
        rec.releases
            .lock()
            .unwrap()
            .entry(name.clone())
            .or_default()
            .push(Release {
                image: image.clone(),
                code: None,
            });
        let server = t.url(&mut rng);
        let limit = tail(until, Duration::from_secs(100));
        let mut args = vec![
            "rollout".to_string(),
            "wait".into(),
            key.clone(),
            "--timeout".into(),
        ];
        args.push(format!("{}s", limit.as_secs()));
        args.extend([
            "--server".into(),
            server.clone(),
            "--token-file".into(),
            t.read_token.clone(),
        ]);
        let (code, _) = cli(&args, limit + Duration::from_secs(30)).await;
        let answered = Timestamp::now();
        if let Some(r) = rec
            .releases
            .lock()
            .unwrap()
            .get_mut(&name)
            .and_then(|v| v.last_mut())
        {
            r.code = Some(code);
        }
        rec.answers.lock().unwrap().push(Answer {
            command: "rollout wait".into(),
            name: name.clone(),
            image,
            clusters: MEMBERS.iter().map(|m| m.to_string()).collect(),
            server,
            started,
            answered,
            code,
        });
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..2000))).await;
    }
}

/// Approves the Manual wave of the `MANUAL` object whenever it awaits
/// approval, until `stop`: late on purpose, by up to 3 s (a wave opened
/// without its approval is then written before it), and each time after
/// an attempt with the read token, which must be refused.
pub async fn approver(
    t: Target,
    rec: Arc<Record>,
    seed: u64,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let name = fleet_name(MANUAL);
    let key = format!("{}/{name}", t.namespace);
    let api: Api<FleetMicroservice> = Api::namespaced(t.home.clone(), &t.namespace);
    while !*stop.borrow() {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Ok(Ok(f)) = tokio::time::timeout(Duration::from_secs(5), api.get(&name)).await else {
            continue;
        };
        if !awaits_approval(&f) {
            continue;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..3000))).await;
        let mut args = rollout_args(&t, &mut rng, "approve", &key, &t.read_token);
        args.extend(["--wave".into(), MANUAL_WAVE.into()]);
        let at = Timestamp::now();
        let (code, out) = cli(&args, Duration::from_secs(30)).await;
        rec.op(format!("approve {name} with the read token: exit {code}"));
        rec.forbidden.lock().unwrap().push(crate::check::Forbidden {
            at,
            code,
            answer: out.trim().to_string(),
        });
        let mut args = rollout_args(&t, &mut rng, "approve", &key, &t.write_token);
        args.extend(["--wave".into(), MANUAL_WAVE.into()]);
        let (code, out) = cli(&args, Duration::from_secs(30)).await;
        rec.op(format!("approve {name}: exit {code}: {}", out.trim()));
    }
}

/// The Manual wave's turn has come for the generation the status observed.
fn awaits_approval(f: &FleetMicroservice) -> bool {
    f.status.as_ref().is_some_and(|s| {
        s.observed_generation == f.metadata.generation
            && s.waves
                .iter()
                .any(|w| w.name == MANUAL_WAVE && w.state == WaveState::AwaitingApproval)
    })
}

fn rollout_args(t: &Target, rng: &mut StdRng, verb: &str, key: &str, token: &str) -> Vec<String> {
    [
        "rollout",
        verb,
        key,
        "--server",
        &t.url(rng),
        "--token-file",
        token,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// A gRPC watch of the namespace, kept open and resumed against random
/// replicas until `stop`; its view is kept in `rec.watch`.
pub async fn watcher(
    t: Target,
    rec: Arc<Record>,
    seed: u64,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    use flotilla::api::client::{ClientOptions, connect};
    use flotilla::api::pb;
    use futures::StreamExt;
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut resume, mut index) = (0u64, String::new());
    let token = std::fs::read_to_string(&t.read_token)
        .unwrap_or_default()
        .trim()
        .to_string();
    while !*stop.borrow() {
        let server = t.url(&mut rng);
        let opts = ClientOptions {
            server,
            token: Some(token.clone()),
            ..Default::default()
        };
        let stream = async {
            let mut c = connect(&opts).await.ok()?;
            let req = pb::WatchMicroservicesRequest {
                namespace: t.namespace.clone(),
                resume_revision: resume,
                index_id: index.clone(),
                ..Default::default()
            };
            Some(c.watch_microservices(req).await.ok()?.into_inner())
        };
        let Ok(Some(mut stream)) = tokio::time::timeout(Duration::from_secs(10), stream).await
        else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        *rec.watch_resumes.lock().unwrap() += 1;
        // A bookmark comes every 20 s on an idle stream: 45 s of nothing is a dead one.
        while let Ok(Some(Ok(e))) =
            tokio::time::timeout(Duration::from_secs(45), stream.next()).await
        {
            if *stop.borrow() {
                return;
            }
            let kind = pb::WatchEventType::try_from(e.r#type).unwrap_or_default();
            let mut view = rec.watch.lock().unwrap();
            match kind {
                pb::WatchEventType::Reset => {
                    view.clear();
                    resume = 0;
                }
                pb::WatchEventType::Snapshot | pb::WatchEventType::Upsert => {
                    if let Some(m) = &e.microservice {
                        let clusters = m
                            .clusters
                            .iter()
                            .map(|c| (c.cluster.clone(), c.image.clone()))
                            .collect();
                        view.insert(m.name.clone(), clusters);
                    }
                }
                pb::WatchEventType::Delete => {
                    if let Some(m) = &e.microservice {
                        view.remove(&m.name);
                    }
                }
                _ => {}
            }
            if e.revision > 0 && kind != pb::WatchEventType::Snapshot {
                resume = e.revision;
                index = e.index_id.clone();
            }
        }
    }
}

/// The dashboard's event stream (Server-Sent Events) of the namespace, kept
/// open and resumed with `Last-Event-ID` against random replicas until
/// `stop`, as a browser does; its view is kept in `rec.dashboard`.
pub async fn dashboard_watcher(
    t: Target,
    rec: Arc<Record>,
    seed: u64,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut last_id: Option<String> = None;
    let token = std::fs::read_to_string(&t.read_token)
        .unwrap_or_default()
        .trim()
        .to_string();
    while !*stop.borrow() {
        let addr = t.dashboards[rng.random_range(0..t.dashboards.len())].clone();
        let Some(mut lines) = open_events(&addr, &token, last_id.as_deref()).await else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        *rec.dashboard_resumes.lock().unwrap() += 1;
        let mut frame = SseFrame::default();
        // A keep-alive comes every 15 s: 45 s of nothing is a dead stream.
        while let Ok(Ok(Some(line))) =
            tokio::time::timeout(Duration::from_secs(45), lines.next_line()).await
        {
            if *stop.borrow() {
                return;
            }
            if !line.is_empty() {
                frame.push(&line);
                continue;
            }
            let f = std::mem::take(&mut frame);
            if f.event == "end" {
                break;
            }
            if let Some(id) = f.id {
                last_id = Some(id);
            }
            apply_frame(
                &mut rec.dashboard.lock().unwrap(),
                &t.namespace,
                &f.event,
                &f.data,
            );
        }
    }
}

/// One event of the stream, as its lines came.
#[derive(Default)]
struct SseFrame {
    event: String,
    id: Option<String>,
    data: String,
}

impl SseFrame {
    fn push(&mut self, line: &str) {
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => self.event = value.to_string(),
            "id" => self.id = Some(value.to_string()),
            "data" => self.data.push_str(value),
            _ => {}
        }
    }
}

/// A row of the stream into `view` (name -> cluster -> image), this
/// namespace only.
fn apply_frame(
    view: &mut BTreeMap<String, BTreeMap<String, String>>,
    namespace: &str,
    event: &str,
    data: &str,
) {
    let Ok(row) = serde_json::from_str::<serde_json::Value>(data) else {
        return;
    };
    let ours = row["namespace"] == namespace;
    let name = row["name"].as_str().unwrap_or_default().to_string();
    match event {
        "reset" => view.clear(),
        "item" | "upsert" if ours => {
            let cells = row["cells"].as_array().into_iter().flatten();
            let clusters = cells
                .filter_map(|c| {
                    Some((
                        c["cluster"].as_str()?.to_string(),
                        c["image"].as_str().unwrap_or_default().to_string(),
                    ))
                })
                .collect();
            view.insert(name, clusters);
        }
        "delete" if ours => {
            view.remove(&name);
        }
        _ => {}
    }
}

/// `GET /api/events` over HTTP/1.0, so the body comes as it is, unchunked,
/// until the server closes: the stream's lines after the headers.
async fn open_events(
    addr: &str,
    token: &str,
    last_id: Option<&str>,
) -> Option<tokio::io::Lines<tokio::io::BufReader<tokio::net::TcpStream>>> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let open = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        let resume = last_id
            .map(|id| format!("Last-Event-ID: {id}\r\n"))
            .unwrap_or_default();
        let request = format!(
            "GET /api/events HTTP/1.0\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\
             Authorization: Bearer {token}\r\n{resume}\r\n"
        );
        s.write_all(request.as_bytes()).await.ok()?;
        let mut lines = tokio::io::BufReader::new(s).lines();
        let status = lines.next_line().await.ok()??;
        if status.split_whitespace().nth(1) != Some("200") {
            return None;
        }
        while !lines.next_line().await.ok()??.is_empty() {}
        Some(lines)
    };
    tokio::time::timeout(Duration::from_secs(10), open)
        .await
        .ok()
        .flatten()
}

#[test]
fn the_dashboard_streams_frames_make_the_view() {
    let mut view = BTreeMap::new();
    let row = |name: &str, ns: &str, image: &str| {
        json!({"namespace": ns, "name": name, "cells": [
            {"cluster": "member-1", "image": image},
            {"cluster": "member-2", "image": image},
        ]})
        .to_string()
    };
    let mut f = SseFrame::default();
    let data = format!("data: {}", row("a", "ns", "a:1"));
    for line in ["event: upsert", "id: idx/7", data.as_str()] {
        f.push(line);
    }
    assert_eq!(
        (f.event.as_str(), f.id.as_deref()),
        ("upsert", Some("idx/7"))
    );
    apply_frame(&mut view, "ns", &f.event, &f.data);
    apply_frame(&mut view, "ns", "item", &row("b", "ns", "b:1"));
    apply_frame(&mut view, "ns", "upsert", &row("c", "other", "c:1"));
    assert_eq!(
        view.keys().collect::<Vec<_>>(),
        ["a", "b"],
        "another namespace is not ours"
    );
    assert_eq!(view["a"]["member-2"], "a:1");
    apply_frame(
        &mut view,
        "ns",
        "delete",
        r#"{"namespace":"ns","name":"a"}"#,
    );
    assert_eq!(view.keys().collect::<Vec<_>>(), ["b"]);
    apply_frame(&mut view, "ns", "reset", "{}");
    assert!(view.is_empty(), "a snapshot starts over");
}

/// A loopback HTTP server for `ANALYZED`'s webhook check: every request is
/// answered 200, or 503 while the record says failing. Returns its port.
pub async fn verdict_server(rec: Arc<Record>) -> u16 {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the verdict server");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let rec = rec.clone();
            tokio::spawn(async move {
                // The head and a small JSON body: read until the client has
                // sent its request, bounded in time and size.
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                let read = async {
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        got.extend_from_slice(&buf[..n]);
                        if complete(&got) || got.len() > 1 << 20 {
                            break;
                        }
                    }
                };
                if tokio::time::timeout(Duration::from_secs(5), read)
                    .await
                    .is_err()
                {
                    return;
                }
                rec.asked.fetch_add(1, Ordering::Relaxed);
                let failing = rec.failing.load(Ordering::Relaxed);
                if failing {
                    rec.refused.fetch_add(1, Ordering::Relaxed);
                }
                let status = if failing {
                    "503 Service Unavailable"
                } else {
                    "200 OK"
                };
                let answer =
                    format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                let _ = s.write_all(answer.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    port
}

/// Whether `got` holds a whole HTTP/1.1 request: its head, and as many
/// body bytes as its content-length says.
fn complete(got: &[u8]) -> bool {
    let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    got.len() >= end + 4 + length
}

/// Turns the webhook's verdict between pass and fail every 10–30 s while
/// the workload runs, and leaves it passing for the quiet period.
pub async fn verdict_flipper(rec: Arc<Record>, seed: u64, until: Instant) {
    use std::sync::atomic::Ordering;
    let mut rng = StdRng::seed_from_u64(seed);
    loop {
        let pause = Duration::from_millis(rng.random_range(10_000..30_000));
        if Instant::now() + pause >= until {
            break;
        }
        tokio::time::sleep(pause).await;
        let failing = !rec.failing.load(Ordering::Relaxed);
        rec.failing.store(failing, Ordering::Relaxed);
        rec.op(format!(
            "analysis verdict of {}: {}",
            fleet_name(ANALYZED),
            if failing { "fail" } else { "pass" }
        ));
    }
    rec.failing.store(false, Ordering::Relaxed);
    rec.op(format!(
        "analysis verdict of {}: pass",
        fleet_name(ANALYZED)
    ));
}

#[test]
fn a_request_is_complete_with_its_whole_body() {
    assert!(!complete(b"POST / HTTP/1.1\r\ncontent-length: 4\r\n\r\nab"));
    assert!(complete(
        b"POST / HTTP/1.1\r\nContent-Length: 4\r\n\r\nabcd"
    ));
    assert!(complete(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"));
    assert!(!complete(b"GET / HTTP/1.1\r\nhost: x\r\n"));
}
