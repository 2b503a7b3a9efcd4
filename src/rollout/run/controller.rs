//! The fleet controller: on the replica that leads the home cluster's
//! rollout Lease, plan every FleetMicroservice and carry the plan out.
//!
//! Each round is level-triggered: it reads the FleetMicroservices and
//! ControllerRevisions from watch caches and the members from the status
//! index, plans, writes the status (so that the decisions survive a
//! failover) and only then writes to members.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client, Config, ResourceExt};
use tokio::sync::watch;
use tracing::Instrument;

use super::cache::RolloutCache;
use super::error::{Result, RolloutError};
use super::home::{self, Home};
use super::members::{Members, Written};
use crate::crd::MicroserviceSpec;
use crate::domain::conditions::{self, CLEANUP_BLOCKED, Status, Verdict};
use crate::domain::egress::Egress;
use crate::fleet::runtime::Credentials;
use crate::lease::fence::Fence;
use crate::lease::home_lease::HomeLease;
use crate::rollout::analysis;
use crate::rollout::checked::Checked;
use crate::rollout::events;
use crate::rollout::fold;
use crate::rollout::observe;
use crate::rollout::placement::member_spec;
use crate::rollout::plan::{self, Action, Inputs};
use crate::rollout::revision::{self, Revision, RevisionData, Step};
use crate::rollout::spec::{
    ClusterState, FINALIZER, FleetMicroservice, FleetMicroserviceStatus, RolloutPhase, WaveState,
};
use crate::rollout::write_log::{Outcome, WriteLog};
use crate::status::hub::Hub;
use crate::telemetry::metrics::METRICS;

pub struct Options {
    pub lease: HomeLease,
    pub hub: Arc<Hub>,
    pub credentials: watch::Receiver<BTreeMap<String, Credentials>>,
    /// The FleetMicroservices and revisions every replica caches.
    pub cache: Arc<RolloutCache>,
    /// How long one member call of a write may take.
    pub write_timeout: Duration,
    /// Where webhook checks' `headersFrom` Secrets are read; none: refused.
    pub analysis_secrets_namespace: Option<String>,
    /// Where analysis checks may call (`--egress-allow`).
    pub egress: Egress,
}

/// Plan again at least this often: cluster labels change without a
/// status-index revision.
const RESYNC: Duration = Duration::from_secs(5);
/// FleetMicroservices planned at once.
const ROUNDS_AT_ONCE: usize = 8;

fn client(config: &Config, fence: Option<&Fence>) -> Result<Client, String> {
    let builder = kube::client::ClientBuilder::try_from(config.clone())
        .map_err(|e| format!("home client: {e}"))?;
    Ok(builder
        .with_layer(&tower::util::option_layer(fence.map(Fence::layer)))
        .build())
}

/// Runs until `shutdown` resolves: contests the rollout Lease in the home
/// cluster, and while leading, runs the fleet controller. On shutdown the
/// controller stops first, then the Lease is released.
pub async fn run(
    opts: Options,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    let (elector, leadership) = opts
        .lease
        .elector(client(&opts.lease.home, None)?, "rollouts");
    let fence = Fence::new("home", leadership.clone());
    let drain = fence.clone();
    let elector = elector.with_drain(Box::new(move || {
        let f = drain.clone();
        Box::pin(async move { f.drained().await })
    }));
    let home = client(&opts.lease.home, Some(&fence))?;
    let analysis_secrets = opts
        .analysis_secrets_namespace
        .as_deref()
        .map(|ns| (ns.to_string(), Api::namespaced(home.clone(), ns)));
    let ctx = Arc::new(Ctx {
        home: Home::new(home, &opts.lease.replica_id),
        members: Members::new(
            fence.clone(),
            &opts.lease.replica_id,
            opts.credentials.clone(),
        )?,
        hub: opts.hub.clone(),
        written: std::sync::Mutex::new(BTreeMap::new()),
        held: std::sync::Mutex::new(BTreeMap::new()),
        numbered: std::sync::Mutex::new(BTreeMap::new()),
        ahead: std::sync::atomic::AtomicI64::new(0),
        writes: std::sync::Mutex::new(WriteLog::default()),
        write_done: tokio::sync::Notify::new(),
        analysis: std::sync::Mutex::new(analysis::Log::default()),
        http: super::analysis::client::Http::new(),
        analysis_secrets,
        cache: opts.cache.clone(),
        write_timeout: opts.write_timeout,
        checked: Default::default(),
        egress: opts.egress.clone(),
        read_through: Default::default(),
    });
    crate::lease::home_lease::lead(
        "fleet rollouts",
        elector,
        leadership,
        opts.lease.timings.renew_deadline,
        shutdown,
        |epoch| {
            // Writes of this term, and only this term, pass the fence.
            fence.arm(Some(epoch));
            work(ctx.clone())
        },
        |_| fence.arm(None),
    )
    .await;
    Ok(())
}

struct Ctx {
    home: Home,
    members: Members,
    hub: Arc<Hub>,
    cache: Arc<RolloutCache>,
    /// The last status this replica wrote per FleetMicroservice uid, with
    /// every resourceVersion its writes replaced: while the watch cache
    /// still shows one of those, the written copy is the fresher one.
    written: std::sync::Mutex<BTreeMap<String, (BTreeSet<String>, FleetMicroservice)>>,
    /// Per FleetMicroservice uid, a planned status whose changes are all
    /// observations (`fold`): the written status it departs from, itself,
    /// and since when it is held. Only this term's plans, and only while
    /// the written status is still that one.
    held: std::sync::Mutex<BTreeMap<String, Held>>,
    /// The most a stamp read this pass was ahead of this replica's clock.
    ahead: std::sync::atomic::AtomicI64,
    /// The highest revision number this replica gave, per uid.
    numbered: std::sync::Mutex<BTreeMap<String, i64>>,
    /// What the last member writes found, per FleetMicroservice uid.
    writes: std::sync::Mutex<WriteLog>,
    /// Told when a member write or an analysis run ends.
    write_done: tokio::sync::Notify,
    /// This term's analysis runs (#35).
    analysis: std::sync::Mutex<analysis::Log>,
    http: super::analysis::client::Http,
    /// The namespace of `headersFrom` Secrets, and its API.
    analysis_secrets: Option<(String, Api<Secret>)>,
    /// How long one member call of a write may take.
    write_timeout: Duration,
    /// Each FleetMicroservice's spec, checked once per generation (#58).
    checked: std::sync::Mutex<BTreeMap<String, (i64, CheckedSpec)>>,
    /// Where analysis checks may call.
    egress: Egress,
    /// The objects whose caches caught up with this term's quorum read.
    read_through: std::sync::Mutex<BTreeSet<String>>,
}

/// Stored ControllerRevisions, from the cache or a quorum read.
type Revisions = Vec<Arc<ControllerRevision>>;

/// A generation's spec, checked, or why it is invalid.
type CheckedSpec = Arc<Result<Checked, String>>;

impl Ctx {
    fn freshest(&self, cached: &FleetMicroservice) -> FleetMicroservice {
        let written = lock(&self.written);
        match (cached.uid(), cached.resource_version()) {
            (Some(uid), Some(rv)) => match written.get(&uid) {
                Some((replaced, copy)) if replaced.contains(&rv) => copy.clone(),
                _ => cached.clone(),
            },
            _ => cached.clone(),
        }
    }

    /// The held plan departing from `written`, and since when it is held.
    fn held(
        &self,
        uid: &str,
        written: &FleetMicroserviceStatus,
    ) -> Option<(FleetMicroserviceStatus, tokio::time::Instant)> {
        let mut held = lock(&self.held);
        match held.get(uid) {
            Some(h) if &h.written == written => Some((h.planned.clone(), h.since)),
            // Someone else wrote the status, or ours landed: start again from it.
            Some(_) => {
                held.remove(uid);
                None
            }
            None => None,
        }
    }

    fn numbered(&self, uid: &str, number: i64) {
        let mut all = lock(&self.numbered);
        let n = all.entry(uid.to_string()).or_default();
        *n = (*n).max(number);
    }

    /// The spec of this generation, checked: once per generation, not per round.
    fn checked(&self, fms: &FleetMicroservice) -> CheckedSpec {
        let (uid, generation) = (
            fms.uid().unwrap_or_default(),
            fms.metadata.generation.unwrap_or(0),
        );
        let mut all = lock(&self.checked);
        match all.get(&uid) {
            Some((g, c)) if *g == generation => c.clone(),
            _ => {
                let c = Arc::new(crate::rollout::checked::check(
                    &fms.name_any(),
                    &fms.spec,
                    &self.egress,
                ));
                all.insert(uid, (generation, c.clone()));
                c
            }
        }
    }

    /// The object and the revisions this round plans from: the caches,
    /// once they have caught up with a quorum read made this term; until
    /// then the quorum read itself (#59).
    async fn read_through(
        &self,
        cached: &FleetMicroservice,
    ) -> Result<(FleetMicroservice, Revisions)> {
        let uid = cached.uid().unwrap_or_default();
        let in_cache = self.cache.revisions.state();
        if lock(&self.read_through).contains(&uid) {
            return Ok((cached.clone(), in_cache));
        }
        let ns = cached.namespace().unwrap_or_default();
        let read = self.home.read(&ns, &cached.name_any()).await?;
        let read_revisions: Revisions = self
            .home
            .read_revisions(&ns)
            .await?
            .into_iter()
            .map(Arc::new)
            .collect();
        let owned = |fms: &FleetMicroservice, all: &Revisions| -> Vec<Revision> {
            home::revisions_of(fms, all.iter().map(|r| r.as_ref()))
                .into_iter()
                .map(|(r, _)| r)
                .collect()
        };
        let versions = (
            cached.metadata.resource_version.as_deref(),
            read.metadata.resource_version.as_deref(),
        );
        if crate::rollout::barrier::caught_up(
            versions,
            &owned(cached, &in_cache),
            &owned(&read, &read_revisions),
        ) {
            lock(&self.read_through).insert(uid);
            return Ok((cached.clone(), in_cache));
        }
        tracing::info!(
            k8s.namespace.name = %ns,
            flotilla.fleetmicroservice = %cached.name_any(),
            "the caches lag this term's read; planning from the read"
        );
        Ok((self.freshest(&read), read_revisions))
    }

    /// A write met a newer object than the one planned from: the next
    /// round reads it through (a quorum read) until the cache shows it,
    /// rather than planning again from the same stale copy (seen in chaos:
    /// a cache that missed an edit after a home restart, 409 every second).
    fn read_again(&self, uid: &str) {
        lock(&self.read_through).remove(uid);
        lock(&self.written).remove(uid);
    }

    fn write_log(&self) -> std::sync::MutexGuard<'_, WriteLog> {
        lock(&self.writes)
    }

    fn analysis(&self) -> std::sync::MutexGuard<'_, analysis::Log> {
        lock(&self.analysis)
    }

    /// A webhook check's headers: read from its `headersFrom` Secret at
    /// each run (a rotated credential is used at once), within `limit`.
    async fn check_headers(
        &self,
        secret: Option<&str>,
        namespace: &str,
        limit: Duration,
    ) -> std::result::Result<Vec<(http::HeaderName, http::HeaderValue)>, String> {
        let Some(secret) = secret else {
            return Ok(Vec::new());
        };
        let Some((secrets_ns, api)) = &self.analysis_secrets else {
            return Err(format!(
                "headersFrom Secret {secret}: this replica reads no analysis Secrets (--analysis-secrets-namespace)"
            ));
        };
        let read = tokio::time::timeout(limit, api.get_opt(secret)).await;
        let s = match read {
            Ok(Ok(Some(s))) => s,
            Ok(Ok(None)) => return Err(format!("Secret {secret} not found in {secrets_ns}")),
            Ok(Err(e)) => {
                let why = match &e {
                    kube::Error::Api(s) => format!("{} {}", s.code, s.reason),
                    _ => "no answer from the home apiserver".to_string(),
                };
                return Err(format!("Secret {secret} in {secrets_ns} unreadable: {why}"));
            }
            Err(_) => return Err(format!("Secret {secret}: no answer within {limit:?}")),
        };
        let data = s
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect();
        let annotations = s.metadata.annotations.unwrap_or_default();
        analysis::headers::from_secret(secret, &annotations, &data, namespace)
    }

    fn remember(&self, replaced: &FleetMicroservice, written: FleetMicroservice) {
        if let (Some(uid), Some(rv)) = (replaced.uid(), replaced.resource_version()) {
            let mut all = lock(&self.written);
            let entry = all
                .entry(uid)
                .or_insert_with(|| (BTreeSet::new(), written.clone()));
            // A chain of our own writes: every version before the last.
            if entry.1.resource_version() != Some(rv.clone()) {
                entry.0.clear();
            }
            entry.0.insert(rv);
            entry.1 = written;
        }
    }
}

/// Plans every FleetMicroservice whenever something may have changed:
/// the objects, the revisions, the status index, or a timer.
async fn work(ctx: Arc<Ctx>) {
    let mut changed = ctx.cache.changes();
    let mut index = ctx.hub.subscribe();
    if !ctx.cache.ready().await {
        return;
    }
    // Member writes of this term; dropped, and so cut, when the term ends.
    let writes = std::sync::Mutex::new(tokio::task::JoinSet::new());
    // Stamps older than this may be on another replica's clock.
    let term_started = jiff::Timestamp::now();
    ctx.write_log().new_term();
    // A successor runs every check again: runs are evidence of one term.
    ctx.analysis().new_term();
    // A plan held in an earlier term may rest on another leader's writes.
    lock(&ctx.held).clear();
    // Every object is read again before this term writes for it.
    lock(&ctx.read_through).clear();
    loop {
        let mut next = RESYNC;
        // Until the registry is read, the cluster set is unknown, not empty.
        let known = ctx.hub.read(|ix| ix.registry_was_read());
        let all = ctx.cache.fleet.state();
        // What this term remembers goes with its object (review L9).
        let alive: BTreeSet<String> = all.iter().filter_map(|f| f.uid()).collect();
        ctx.write_log().retain(&alive);
        ctx.analysis().retain(&alive);
        lock(&ctx.written).retain(|uid, _| alive.contains(uid));
        lock(&ctx.held).retain(|uid, _| alive.contains(uid));
        lock(&ctx.numbered).retain(|uid, _| alive.contains(uid));
        lock(&ctx.checked).retain(|uid, _| alive.contains(uid));
        lock(&ctx.read_through).retain(|uid| alive.contains(uid));
        // Several objects at once, so one whose home writes are slow holds
        // up only its own slot (review M3); each object still has one round
        // at a time.
        let (writes, ctx) = (&writes, &ctx);
        let rounds = futures::stream::iter(all.into_iter().filter(|_| known)).map(|fms| async move {
            let uid = fms.uid().unwrap_or_default();
            let fms = ctx.freshest(&fms);
            let key = format!("{}/{}", fms.namespace().unwrap_or_default(), fms.name_any());
            let span = tracing::info_span!(
                "rollout step",
                flotilla.fleet_microservice = %key,
                flotilla.revision = tracing::field::Empty
            );
            // One object's defect must not end the task every rollout,
            // and this replica, depend on: a panic is one failed round.
            let one = async {
                let (fms, revisions) = ctx.read_through(&fms).await?;
                round(ctx, &fms, &revisions, writes, term_started).await
            }
            .instrument(span);
            match futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(one)).await {
                Err(_) => {
                    tracing::error!(flotilla.fleet_microservice = %key, "rollout step panicked");
                    Duration::from_secs(5)
                }
                Ok(Ok(Some(after))) => after,
                Ok(Ok(None)) => RESYNC,
                Ok(Err(e)) => {
                    tracing::warn!(flotilla.fleet_microservice = %key, error = %e, category = e.category(), "rollout step failed");
                    if e.category() == "conflict" {
                        ctx.read_again(&uid);
                    }
                    Duration::from_secs(1)
                }
            }
        });
        next = rounds
            .buffer_unordered(ROUNDS_AT_ONCE)
            .fold(next, |a, b| async move { a.min(b) })
            .await;
        let ahead = ctx.ahead.swap(0, std::sync::atomic::Ordering::Relaxed);
        METRICS.rollout_clock_ahead.set(&[], ahead as f64);
        tokio::select! {
            _ = changed.changed() => {}
            _ = index.changed() => {}
            _ = ctx.write_done.notified() => {}
            _ = tokio::time::sleep(next) => {}
        }
        // Reap every write that ended, not one a pass: the set would keep them.
        while lock(writes).try_join_next().is_some() {}
        // Let a burst of changes settle into one round.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A planned status left unwritten because all it changes are observations.
struct Held {
    /// The written status it departs from.
    written: FleetMicroserviceStatus,
    planned: FleetMicroserviceStatus,
    /// When the first unwritten plan since `written` was made.
    since: tokio::time::Instant,
}

/// Who a round is about.
struct Obj {
    name: String,
    namespace: String,
    uid: String,
}

/// The stored revisions this object owns, with their ControllerRevisions.
type Owned<'a> = [(Revision, &'a ControllerRevision)];

/// One FleetMicroservice, one round. Returns when to plan again at the latest.
async fn round(
    ctx: &Arc<Ctx>,
    fms: &FleetMicroservice,
    stored: &Revisions,
    writes: &std::sync::Mutex<tokio::task::JoinSet<()>>,
    term_started: jiff::Timestamp,
) -> Result<Option<Duration>> {
    let o = Obj {
        name: fms.name_any(),
        namespace: fms.namespace().unwrap_or_default(),
        uid: fms.uid().unwrap_or_default(),
    };
    let snapshot = ctx.hub.read(|ix| ix.snapshot());
    let view = snapshot.view(&(o.namespace.clone(), o.name.clone()), None);
    let clusters = observe::clusters(snapshot.clusters(), view.as_ref(), &o.name);

    if fms.metadata.deletion_timestamp.is_some() {
        return cleanup(ctx, fms, &clusters).await;
    }
    if !fms.finalizers().iter().any(|f| f == FINALIZER) {
        ctx.home.set_finalizer(fms, true).await?;
        return Ok(Some(Duration::ZERO));
    }

    let owned = home::revisions_of(fms, stored.iter().map(|r| r.as_ref()));
    let existing: Vec<Revision> = owned.iter().map(|(r, _)| r.clone()).collect();
    let update = match update_revision(ctx, fms, &o, &owned, &existing).await? {
        Ok(update) => update,
        Err(again) => return Ok(Some(again)),
    };

    let written = fms.status.clone().unwrap_or_default();
    ctx.ahead.fetch_max(
        crate::rollout::gate::ahead(&written, jiff::Timestamp::now()),
        std::sync::atomic::Ordering::Relaxed,
    );
    // What this term planned last, when only observations were left unwritten.
    let held = ctx.held(&o.uid, &written);
    let previous = held.as_ref().map_or(&written, |(s, _)| s).clone();
    let now = jiff::Timestamp::now();
    let reading = ctx.write_log().read(&o.uid);
    let approvals = crate::rollout::approval::read(fms.metadata.annotations.as_ref());
    let runs = ctx.analysis().runs(&o.uid).to_vec();
    let checked = ctx.checked(fms);
    let plan = plan::plan_guarded(&Inputs {
        name: &o.name,
        uid: &o.uid,
        generation: fms.metadata.generation.unwrap_or(0),
        checked: checked.as_ref().as_ref().map_err(String::as_str),
        update: &update,
        revisions: &existing,
        previous: &previous,
        clusters: &clusters,
        troubles: &reading.troubles,
        now,
        term_started,
        approvals: &approvals,
        runs: &runs,
    });
    tracing::Span::current().record("flotilla.revision", update.number);

    if previous != plan.status {
        gate_spans(&previous, &plan.status, &o.namespace, &o.name);
    }
    let flush = write_status(ctx, fms, &o, &written, &plan.status, held).await?;
    // The revision remembers its failure, for a status that is lost.
    if plan.status.failed_revision_number == Some(update.number)
        && !update.failed()
        && let Some((_, cr)) = owned.iter().find(|(r, _)| r.name == update.name)
    {
        ctx.home.mark_failed(cr, update.number).await?;
    }
    let held_back = start_writes(ctx, &o, &plan, &reading, &existing, &clusters, writes);
    start_checks(ctx, &o, &plan, writes);
    prune(ctx, fms, &o, &update, &plan.status, &owned).await?;
    let again = if held_back {
        Some(Duration::from_secs(1))
    } else if plan.actions.is_empty() {
        plan.requeue_after
    } else {
        // Look again soon: the writes change what the index shows.
        Some(Duration::from_millis(500))
    };
    // Held observations are written by a round at the latest this soon.
    Ok(match (again, flush) {
        (Some(a), Some(f)) => Some(a.min(f)),
        (a, f) => a.or(f),
    })
}

/// The update revision, once it is stored and numbered: `Err` says when to
/// plan again after storing or renumbering one.
async fn update_revision(
    ctx: &Arc<Ctx>,
    fms: &FleetMicroservice,
    o: &Obj,
    owned: &Owned<'_>,
    existing: &[Revision],
) -> Result<std::result::Result<Revision, Duration>> {
    // Numbers continue past what the status last named, and past what this
    // term gave a revision, even if the cache has not shown it yet: two
    // quick edits get two numbers (review L2).
    let floor = fms
        .status
        .as_ref()
        .and_then(|s| s.update_revision_number)
        .unwrap_or(0)
        .max(lock(&ctx.numbered).get(&o.uid).copied().unwrap_or(0));
    let step = revision::update_revision(&o.name, existing, &RevisionData::of(&fms.spec), floor)
        .map_err(RolloutError::Revision)?;
    match step {
        Step::Current(r) => Ok(Ok(r)),
        Step::Create(mut r) => {
            // What a failure of this revision goes back to, kept with it.
            r.memory.good_before = fms
                .status
                .as_ref()
                .and_then(|s| s.last_good_revision.clone());
            ctx.home.create_revision(fms, &r).await?;
            ctx.numbered(&o.uid, r.number);
            Ok(Err(Duration::ZERO))
        }
        Step::Renumber(r) => {
            if let Some((_, cr)) = owned.iter().find(|(o, _)| o.name == r.name) {
                ctx.home.renumber(cr, r.number).await?;
                ctx.numbered(&o.uid, r.number);
            }
            Ok(Err(Duration::ZERO))
        }
    }
}

/// The decisions first, so that a successor reads them; observations wait
/// for the next decision, or their share of the write budget. Returns when
/// held observations must be written at the latest.
async fn write_status(
    ctx: &Arc<Ctx>,
    fms: &FleetMicroservice,
    o: &Obj,
    written: &FleetMicroserviceStatus,
    planned: &FleetMicroserviceStatus,
    held: Option<(FleetMicroserviceStatus, tokio::time::Instant)>,
) -> Result<Option<Duration>> {
    let held_since = held.map(|(_, since)| since);
    let news = fold::observed(written, planned);
    let every = fold::observations_every(lock(&ctx.held).len(), news);
    if fold::write_now(written, planned, held_since.map(|s| s.elapsed()), every) {
        let stored = ctx.home.write_status(fms, planned).await?;
        ctx.remember(fms, stored);
        lock(&ctx.held).remove(&o.uid);
        for note in events::changes(written, planned) {
            ctx.home.publish(fms, &note);
        }
        record_metrics(written, planned);
        return Ok(None);
    }
    if written == planned {
        lock(&ctx.held).remove(&o.uid);
        return Ok(None);
    }
    let since = held_since.unwrap_or_else(tokio::time::Instant::now);
    let held = Held {
        written: written.clone(),
        planned: planned.clone(),
        since,
    };
    lock(&ctx.held).insert(o.uid.clone(), held);
    Ok(Some(every.saturating_sub(since.elapsed())))
}

/// Starts the plan's member writes that are due; true when some were held
/// back. A member that refused is asked again after its backoff, not every
/// round; one with a write still in flight is not asked twice; and a plan
/// that missed an outcome (one came in while the status was written)
/// starts nothing: the outcome's wake-up plans again.
fn start_writes(
    ctx: &Arc<Ctx>,
    o: &Obj,
    plan: &plan::Plan,
    reading: &crate::rollout::write_log::Reading,
    existing: &[Revision],
    clusters: &[plan::Cluster],
    writes: &std::sync::Mutex<tokio::task::JoinSet<()>>,
) -> bool {
    let labels: BTreeMap<&str, _> = clusters
        .iter()
        .filter_map(|c| c.labels.as_ref().map(|l| (c.name.as_str(), l)))
        .collect();
    let started = tokio::time::Instant::now();
    let due: Vec<&Action> = {
        let mut log = ctx.write_log();
        let current = log.current(&o.uid, reading);
        let due: Vec<&Action> = plan
            .actions
            .iter()
            .filter(|a| current && log.due(&o.uid, action_cluster(a), started))
            .collect();
        for a in &due {
            log.start(&o.uid, action_cluster(a));
        }
        due
    };
    let held_back = due.len() < plan.actions.len();
    // Member writes run beside the rounds, so one slow member stalls no
    // other FleetMicroservice (review M3); each is bounded, and all of them
    // end with the term (the set is dropped with `work`).
    for action in due {
        let meant = match action {
            Action::Apply { cluster, revision } => existing
                .iter()
                .find(|r| &r.name == revision)
                .zip(labels.get(cluster.as_str()))
                .map(|(rev, l)| {
                    let spec = member_spec(&rev.data.template, &rev.data.overrides, l);
                    (revision.clone(), spec)
                }),
            Action::Delete { .. } => None,
        };
        let write = Write {
            uid: o.uid.clone(),
            namespace: o.namespace.clone(),
            name: o.name.clone(),
            action: action.clone(),
            meant,
        };
        lock(writes).spawn(write.run(ctx.clone()));
    }
    held_back
}

/// Analysis checks, beside the rounds like the member writes: one run per
/// wave and check at a time, each bounded by its timeout, all of them
/// ended with the term.
fn start_checks(
    ctx: &Arc<Ctx>,
    o: &Obj,
    plan: &plan::Plan,
    writes: &std::sync::Mutex<tokio::task::JoinSet<()>>,
) {
    for due in &plan.checks {
        if !ctx.analysis().start(&o.uid, due) {
            continue;
        }
        let check = Check {
            uid: o.uid.clone(),
            namespace: o.namespace.clone(),
            job: analysis::job(&o.namespace, &o.name, due),
            due: due.clone(),
        };
        lock(writes).spawn(check.run(ctx.clone()));
    }
}

/// History: keep what is in use, drop the oldest beyond the limit.
async fn prune(
    ctx: &Arc<Ctx>,
    fms: &FleetMicroservice,
    o: &Obj,
    update: &Revision,
    status: &FleetMicroserviceStatus,
    owned: &Owned<'_>,
) -> Result<()> {
    let mut keep: BTreeSet<String> = [update.name.clone()].into();
    keep.extend(status.last_good_revision.clone());
    for c in &status.clusters {
        keep.extend(c.revision.clone());
        keep.extend(c.target.clone());
    }
    let limit = fms.spec.revision_history_limit.max(1) as usize;
    let existing: Vec<Revision> = owned.iter().map(|(r, _)| r.clone()).collect();
    for old in revision::prune(&existing, limit, &keep) {
        if let Some((_, cr)) = owned.iter().find(|(r, _)| r.name == old) {
            ctx.home.delete_revision(&o.namespace, cr).await?;
        }
    }
    Ok(())
}

/// One member write, run beside the rounds; its outcome goes to the write log.
struct Write {
    uid: String,
    namespace: String,
    name: String,
    action: Action,
    /// For an apply: the revision and the spec it gives this cluster.
    meant: Option<(String, MicroserviceSpec)>,
}

impl Write {
    async fn run(self, ctx: Arc<Ctx>) {
        let Write {
            uid,
            namespace,
            name,
            action,
            meant,
        } = self;
        let (cluster, verb) = match &action {
            Action::Apply { cluster, .. } => (cluster.clone(), "apply"),
            Action::Delete { cluster } => (cluster.clone(), "delete"),
        };
        let span = tracing::info_span!("rollout write", k8s.cluster.name = %cluster, verb);
        let work = async {
            match (&action, &meant) {
                (Action::Apply { cluster, revision }, Some((_, spec))) => {
                    let w = ctx
                        .members
                        .apply(
                            cluster.as_str(),
                            &namespace,
                            &name,
                            &name,
                            revision.as_str(),
                            spec,
                        )
                        .await?;
                    if w == Written::NotOurs {
                        tracing::warn!(k8s.cluster.name = %cluster, "a Microservice that is not ours is in the way");
                    }
                    tracing::debug!(k8s.cluster.name = %cluster, revision = %revision, written = ?w, "member");
                    Ok(w)
                }
                (Action::Apply { cluster, revision }, None) => Err(RolloutError::Revision(
                    format!("revision {revision} for {cluster} is not stored"),
                )),
                (Action::Delete { cluster }, _) => ctx
                    .members
                    .delete(cluster.as_str(), &namespace, &name, &name)
                    .await
                    .map(|_| Written::Unchanged),
            }
        };
        let result = bounded(ctx.write_timeout, &cluster, work.instrument(span)).await;
        match &result {
            Err(e) if e.fenced() => {
                tracing::info!(k8s.cluster.name = %cluster, error = %e, "member write stopped by the fence: this rollout term ended");
            }
            Err(e) => {
                tracing::warn!(k8s.cluster.name = %cluster, error = %e, category = e.category(), "member write failed");
            }
            Ok(_) => {}
        }
        let meant =
            meant.map(|(revision, spec)| (revision, crate::rollout::placement::digest(&spec)));
        let ended = result.as_ref().map(|w| *w).map_err(RolloutError::failed);
        match crate::rollout::write_log::outcome_of(&ended, meant) {
            Some(outcome) => {
                if let Outcome::Altered { revision, .. } = &outcome {
                    tracing::info!(k8s.cluster.name = %cluster, revision = %revision, "the member stored a different spec than was written");
                }
                ctx.write_log()
                    .record(&uid, &cluster, outcome, tokio::time::Instant::now());
            }
            None => ctx.write_log().abandon(&uid, &cluster),
        }
        // Wakes the planner: the outcome may change a plan.
        ctx.write_done.notify_one();
    }
}

/// One analysis run; its outcome goes to the analysis log.
struct Check {
    uid: String,
    /// The FleetMicroservice's: a `headersFrom` Secret must be for it.
    namespace: String,
    due: analysis::Due,
    job: analysis::Job,
}

impl Check {
    async fn run(self, ctx: Arc<Ctx>) {
        let Check {
            uid,
            namespace,
            due,
            job,
        } = self;
        let started = jiff::Timestamp::now();
        let (passed, answer) = match &job {
            analysis::Job::Webhook {
                url,
                timeout,
                body,
                headers_from,
            } => match ctx
                .check_headers(headers_from.as_deref(), &namespace, *timeout)
                .await
            {
                Ok(headers) => {
                    super::analysis::webhook::run(&ctx.http, url, *timeout, &headers, body).await
                }
                Err(answer) => (false, answer),
            },
            analysis::Job::Prometheus {
                address,
                timeout,
                queries,
                condition,
            } => {
                super::analysis::prometheus::run(&ctx.http, address, *timeout, queries, condition)
                    .await
            }
        };
        tracing::info!(check = %due.check.name, wave = %due.evidence.wave, revision = %due.evidence.revision, passed, answer = %answer, "analysis run");
        let run = analysis::Run {
            check: due.check.name.clone(),
            definition: due.definition.clone(),
            evidence: due.evidence.clone(),
            started,
            passed,
            answer,
        };
        ctx.analysis().record(&uid, run);
        ctx.write_done.notify_one();
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A member call, cut after `limit` (`--member-write-timeout`): one hung
/// member holds up only itself.
async fn bounded<T>(
    limit: Duration,
    cluster: &str,
    call: impl Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
        Err(RolloutError::NoClient {
            cluster: cluster.to_string(),
            reason: format!("no answer within {limit:?}"),
        })
    })
}

fn action_cluster(a: &Action) -> &str {
    match a {
        Action::Apply { cluster, .. } | Action::Delete { cluster } => cluster,
    }
}

/// One span per cluster gate that changed, linked to the member reconcile
/// that concluded it when this replica ran that reconcile.
fn gate_spans(
    before: &FleetMicroserviceStatus,
    after: &FleetMicroserviceStatus,
    ns: &str,
    name: &str,
) {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    for c in &after.clusters {
        let was = before.clusters.iter().find(|b| b.name == c.name);
        if was.map(|b| (b.state, &b.target)) == Some((c.state, &c.target)) {
            continue;
        }
        let gate = tracing::info_span!(
            "rollout gate",
            k8s.cluster.name = %c.name,
            flotilla.state = ?c.state,
            flotilla.reason = %c.reason,
            flotilla.target = c.target.as_deref().unwrap_or_default(),
        );
        if let Some(reconcile) = crate::telemetry::links::last(&c.name, ns, name) {
            gate.add_link(reconcile);
        }
    }
}

fn record_metrics(before: &FleetMicroserviceStatus, after: &FleetMicroserviceStatus) {
    if before.phase != after.phase
        && let Some(p) = after.phase
    {
        METRICS.rollout_phase_total.inc(&[p.as_str()]);
        match p {
            RolloutPhase::RolledBack => METRICS.rollout_failures_total.inc(&["rollback"]),
            RolloutPhase::Failed => METRICS.rollout_failures_total.inc(&["failed"]),
            _ => {}
        }
    }
    for w in &after.waves {
        let was = before.waves.iter().find(|b| b.name == w.name);
        if w.state == WaveState::Done
            && was.map(|b| b.state) != Some(WaveState::Done)
            && let (Some(start), Some(end)) = (&w.started, &w.finished)
        {
            let secs = (end.0.as_millisecond() - start.0.as_millisecond()).max(0) as f64 / 1000.0;
            METRICS.rollout_wave_duration.observe(&[], secs);
        }
    }
    let held = |s: &FleetMicroserviceStatus| {
        s.clusters.iter().any(|c| c.state == ClusterState::Failed)
            && s.phase == Some(RolloutPhase::Paused)
    };
    if held(after) && !held(before) {
        METRICS.rollout_failures_total.inc(&["pause"]);
    }
}

/// Deleting: remove every member object, then the finalizer. A cluster
/// that does not answer holds the finalizer, and says so.
async fn cleanup(
    ctx: &Ctx,
    fms: &FleetMicroservice,
    clusters: &[plan::Cluster],
) -> Result<Option<Duration>> {
    if !fms.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(None);
    }
    let (name, namespace) = (fms.name_any(), fms.namespace().unwrap_or_default());
    let previous = fms.status.clone().unwrap_or_default();
    let mut todo = observe::cleanup(clusters, &previous);
    // Read live, not from the index: it may not have seen a create yet.
    // Each call is bounded, so one hung member holds up only itself.
    let (ns, n) = (&namespace, &name);
    let deletes = todo.delete.iter().map(|c| async move {
        (
            c.clone(),
            bounded(ctx.write_timeout, c, ctx.members.delete(c, ns, n, n)).await,
        )
    });
    let mut pending = false;
    for (c, r) in futures::future::join_all(deletes).await {
        match r {
            Ok(true) => {}
            Ok(false) => pending = true,
            Err(e) => {
                tracing::warn!(error = %e, category = e.category(), "member delete failed");
                todo.blocked.push(c);
            }
        }
    }
    let generation = fms.metadata.generation.unwrap_or(0);
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        jiff::Timestamp::from_second(jiff::Timestamp::now().as_second())
            .unwrap_or_else(|_| jiff::Timestamp::now()),
    );
    let verdict = if todo.blocked.is_empty() {
        Verdict::new(CLEANUP_BLOCKED, Status::False, "CleanupProceeding", "")
    } else {
        Verdict::new(
            CLEANUP_BLOCKED,
            Status::True,
            crate::rollout::spec::CLUSTER_UNREACHABLE,
            format!(
                "waiting for {} to answer, to delete this FleetMicroservice's Microservice there",
                todo.blocked.join(", ")
            ),
        )
    };
    let mut status = previous.clone();
    status.conditions = conditions::transition(&previous.conditions, &[verdict], generation, &now);
    if status != previous {
        let written = ctx.home.write_status(fms, &status).await?;
        ctx.remember(fms, written);
        if !todo.blocked.is_empty() {
            ctx.home.publish(
                fms,
                &events::Note {
                    warning: true,
                    reason: "CleanupBlocked",
                    message: format!("waiting for {} to answer", todo.blocked.join(", ")),
                },
            );
        }
        return Ok(Some(Duration::ZERO));
    }
    if todo.blocked.is_empty() && !pending {
        ctx.home.set_finalizer(fms, false).await?;
        return Ok(None);
    }
    Ok(Some(Duration::from_secs(1)))
}
