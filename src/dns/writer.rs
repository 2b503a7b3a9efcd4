//! The fleet DNS writer (#31): on the replica that leads the home Lease
//! `flotilla-<fleet>-dns`, keep every fleet-wide name listing the clusters
//! the health rule lets in. A pass runs on a change of the status index,
//! the FleetMicroservices or the zone (watched in etcd), and when a window
//! ends; it reads the zone and the index, steps each cluster's track,
//! plans, and writes one etcd transaction per name that changed. Every
//! transaction checks this term's key in etcd (claimed when the term
//! starts), and goes only while the term holds at the wire (`admit`, bounded by its renew deadline): a deposed writer's
//! late write changes nothing once its successor has claimed the key.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube::api::PostParams;
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tracing::Instrument;

use super::health::{Judged, Rule, Track};
use super::plan::{self, Object};
use super::view::{is_primary, seen};
use crate::domain::conditions::{self, Verdict};
use crate::lease::elector::Leadership;
use crate::lease::fence::admit;
use crate::lease::home_lease::HomeLease;
use crate::registry::Registry;
use crate::registry::records::{Op, Refusal, Writer};
use crate::registry::store::{Claim, RegistryError};
use crate::rollout::run::cache::RolloutCache;
use crate::rollout::spec::FleetMicroservice;
use crate::status::hub::Hub;
use crate::status::index::Filter;
use crate::telemetry::metrics::METRICS;

pub struct Options {
    pub lease: HomeLease,
    pub hub: Arc<Hub>,
    pub registry: Registry,
    pub rule: Rule,
    /// The TTL of fleet-wide answers.
    pub ttl: u32,
    /// The FleetMicroservices: their DNS strategies, and where
    /// `FleetDnsDegraded` is written.
    pub fleet: Arc<RolloutCache>,
}

/// Look again at least this often. Changes in etcd (a member leader's own
/// record, the address a fleet-wide one copies) come from the zone watch;
/// this only bounds what a lost watch event could delay.
const RESYNC: Duration = Duration::from_secs(30);
/// After a zone watch fails, wait this long before watching again (and
/// pass on the timer meanwhile).
const REWATCH: Duration = Duration::from_secs(2);
/// Let a burst of index changes settle into one pass.
const SETTLE: Duration = Duration::from_millis(100);

/// The field manager of the DNS writer's FleetMicroservice status writes:
/// they are fenced by the DNS Lease, not the rollout one, and the
/// apiserver's records must say which.
pub const FIELD_MANAGER: &str = "flotilla-dns";

/// Runs until `shutdown`: contests the DNS Lease in the home cluster and,
/// while leading, keeps the fleet-wide names. On shutdown the writer
/// stops first, then the Lease is released.
pub async fn run(
    opts: Options,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    let home =
        Client::try_from(opts.lease.home.clone()).map_err(|e| format!("home client: {e}"))?;
    let (elector, leadership) = opts.lease.elector(home.clone(), "dns");
    let terms = leadership.clone();
    crate::lease::home_lease::lead(
        "fleet DNS",
        elector,
        leadership,
        opts.lease.timings.renew_deadline,
        shutdown,
        |epoch| term(&opts, epoch, terms.clone(), home.clone()),
        |_| {},
    )
    .await;
    Ok(())
}

/// One term: passes until the term is over (the caller drops this) or a
/// newer term is found in etcd.
async fn term(opts: &Options, epoch: i32, leadership: watch::Receiver<Leadership>, home: Client) {
    // The Lease this term was won on: a recreated one is another Lease,
    // whose terms count again from 1 (#59).
    let Some(lease) = lease_uid(opts, &home, epoch).await else {
        return;
    };
    let mut pass = Pass {
        opts,
        home,
        marked: HashMap::new(),
        // Numbered by etcd once claimed ([`Pass::claim`]).
        me: Writer::fleet(&opts.lease.fleet_name, 0),
        claim: Claim {
            holder: opts.lease.replica_id.clone(),
            lease,
            lease_epoch: i64::from(epoch),
        },
        epoch,
        leadership,
        term_key: opts.registry.term_key(&opts.lease.fleet_name),
        claimed: None,
        tracks: HashMap::new(),
    };
    let mut index = opts.hub.subscribe();
    let mut clusters = opts.hub.subscribe_clusters();
    let mut fleet = opts.fleet.changes();
    let (zone_tx, mut zone) = watch::channel(0u64);
    // Ends with the term: the handle aborts it when dropped.
    let _watching = Aborted(tokio::spawn(watch_zone(opts.registry.clone(), zone_tx)));
    loop {
        let next = match pass.run().await {
            Ok(wake) => wake.map_or(RESYNC, |w| w.min(RESYNC)),
            Err(RegistryError::Refused(Refusal::Deposed { epoch: newer, .. })) => {
                tracing::warn!(
                    epoch,
                    newer,
                    "a newer fleet DNS term holds the registry; writing nothing more this term"
                );
                std::future::pending::<()>().await;
                return;
            }
            Err(e) => {
                tracing::info!(error = %e, category = e.category(), "fleet DNS pass failed; retrying");
                Duration::from_secs(1)
            }
        };
        tokio::select! {
            _ = index.changed() => {}
            _ = clusters.changed() => {}
            _ = fleet.changed() => {}
            _ = zone.changed() => {}
            _ = tokio::time::sleep(next) => {}
        }
        tokio::time::sleep(SETTLE).await;
    }
}

/// The uid of the DNS Lease, read while this replica holds it at `epoch`
/// (else the term is over: `None`), retried until read.
async fn lease_uid(opts: &Options, home: &Client, epoch: i32) -> Option<String> {
    loop {
        match held_lease(opts, home, epoch).await {
            Ok(uid) => return uid,
            Err(e) => {
                tracing::info!(error = %e, "could not read the DNS Lease; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// The DNS Lease's uid if this replica holds it at `epoch`.
async fn held_lease(
    opts: &Options,
    home: &Client,
    epoch: i32,
) -> Result<Option<String>, kube::Error> {
    let uid = opts
        .lease
        .store(home.clone(), "dns")
        .held_uid(&opts.lease.replica_id, epoch)
        .await?;
    if uid.is_none() {
        tracing::info!(epoch, "the DNS Lease is not this term's any more");
    }
    Ok(uid)
}

/// Bumps `changed` for every change under the zone, watching again after
/// a failure. While it is down, a pass runs every `REWATCH` instead.
async fn watch_zone(registry: Registry, changed: watch::Sender<u64>) {
    loop {
        match registry.watch_zone().await {
            Ok(mut stream) => loop {
                match stream.message().await {
                    Ok(Some(_)) => changed.send_modify(|n| *n += 1),
                    Ok(None) => break,
                    Err(e) => {
                        tracing::info!(error = %e, "fleet DNS zone watch failed; watching again");
                        break;
                    }
                }
            },
            Err(e) => tracing::info!(error = %e, "fleet DNS zone watch not started; retrying"),
        }
        // The change that may have been missed meanwhile: look now.
        changed.send_modify(|n| *n += 1);
        tokio::time::sleep(REWATCH).await;
    }
}

/// A task that ends when its handle is dropped.
struct Aborted(tokio::task::JoinHandle<()>);

impl Drop for Aborted {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Pass<'a> {
    opts: &'a Options,
    home: Client,
    /// Per FleetMicroservice, the resourceVersion its `FleetDnsDegraded`
    /// was last written against: not again until the cache moves past it.
    marked: HashMap<Object, String>,
    me: Writer,
    epoch: i32,
    leadership: watch::Receiver<Leadership>,
    term_key: String,
    /// Who this term is, as its claim of the term key says.
    claim: Claim,
    /// The term key's mod revision once this term claimed it.
    claimed: Option<i64>,
    /// Per fleet-wide name and cluster, its place as the rule keeps it.
    tracks: HashMap<(Object, String), Track>,
}

impl Pass<'_> {
    /// One pass; returns when a pending change is due, if one is.
    async fn run(&mut self) -> Result<Option<Duration>, RegistryError> {
        let opts = self.opts;
        let (known, snap) = opts.hub.read(|ix| (ix.registry_was_read(), ix.snapshot()));
        // Until the member list is read, every cluster would look absent.
        if !known {
            return Ok(None);
        }
        self.claim().await?;
        let clusters: BTreeSet<String> = snap.clusters().keys().cloned().collect();
        let objects: BTreeSet<Object> = snap
            .list(&Filter::default(), None, usize::MAX)
            .map(|v| (v.namespace, v.name))
            .collect();
        let existing = opts.registry.read_zone().await?;
        let zone = opts.registry.zone();
        let z = plan::zoned(zone, &existing, &clusters);

        // Step each candidate's track; a new one starts as etcd has it.
        let now = std::time::Instant::now();
        let mut wake: Option<Duration> = None;
        let mut alive = HashSet::new();
        for (object, sources) in &z.sources {
            let view = snap.view(object, None);
            // A name that lists some: a cluster not in it was withdrawn (or
            // is new to it), and comes back only after its window.
            let serving = z.fleet_wide.get(object).is_some_and(|m| !m.is_empty());
            for cluster in sources.keys() {
                let key = (object.clone(), cluster.clone());
                let listed = z
                    .fleet_wide
                    .get(object)
                    .and_then(|m| m.get(cluster))
                    .and_then(|e| e.record.as_ref())
                    .is_some_and(|r| {
                        r.writer.cluster == self.me.cluster || r.writer.cluster == *cluster
                    });
                let track = self
                    .tracks
                    .get(&key)
                    .copied()
                    .unwrap_or(Track::found(listed, serving));
                let (track, due) = opts
                    .rule
                    .step(track, seen(&snap, view.as_ref(), cluster), now);
                wake = match (wake, due) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                self.tracks.insert(key.clone(), track);
                alive.insert(key);
            }
        }
        self.tracks.retain(|k, _| alive.contains(k));

        // `Failover` FleetMicroservices, by object: their primaries' selector.
        let primaries: HashMap<&Object, LabelSelector> = z
            .sources
            .keys()
            .filter_map(|o| {
                let fms = opts.fleet.get(&o.0, &o.1)?;
                Some((o, fms.spec.dns_primaries()?.clone()))
            })
            .collect();
        let tracks = &self.tracks;
        let steps = plan::plan(zone, &z, &self.me, opts.ttl, &clusters, &objects, |o, c| {
            Judged {
                in_answer: tracks
                    .get(&(o.clone(), c.to_string()))
                    .is_some_and(|t| t.in_answer),
                primary: is_primary(&snap, primaries.get(o), c),
                reachable: snap.clusters().get(c).is_some_and(|i| i.absence_is_known()),
            }
        })?;
        count(&steps);
        let mut verdicts = Vec::new();
        for step in steps {
            verdicts.extend(self.degraded_change(&step.answer));
            if !step.ops.is_empty() {
                self.write(step).await?;
            }
        }
        // Forget what was marked on FleetMicroservices that are gone.
        self.marked
            .retain(|(ns, name), _| opts.fleet.get(ns, name).is_some());
        // After the names: the condition reports what etcd now holds.
        for (fms, verdict) in verdicts {
            self.mark(&fms, verdict).await;
        }
        Ok(wake)
    }

    /// The `FleetDnsDegraded` to write for `answer`'s FleetMicroservice,
    /// if one manages the name and its condition says otherwise.
    fn degraded_change(&self, answer: &plan::Answer) -> Option<(Arc<FleetMicroservice>, Verdict)> {
        let (ns, name) = &answer.object;
        let fms = self.opts.fleet.get(ns, name)?;
        let conds = fms.status.as_ref().map_or(&[][..], |s| &s.conditions[..]);
        let fqdn = format!("{name}.{ns}.{}", self.opts.registry.zone().name);
        let v = super::condition::change(conds, answer.degraded, &fqdn, answer.listed.len())?;
        Some((fms, v))
    }

    /// Writes one FleetMicroservice's `FleetDnsDegraded`, fenced by this
    /// term and conditioned on the resourceVersion read; a refusal is
    /// retried on a later pass.
    async fn mark(&mut self, fms: &FleetMicroservice, verdict: Verdict) {
        let key = (fms.namespace().unwrap_or_default(), fms.name_any());
        let rv = fms.resource_version().unwrap_or_default();
        if self.marked.get(&key) == Some(&rv) {
            return;
        }
        let mut next = fms.clone();
        let status = next.status.get_or_insert_with(Default::default);
        let now = Time(jiff::Timestamp::now());
        status.conditions = conditions::transition(
            &status.conditions,
            &[verdict],
            fms.metadata.generation.unwrap_or(0),
            &now,
        );
        let Ok(until) = admit(
            &self.leadership.borrow(),
            Some(self.epoch),
            tokio::time::Instant::now(),
        ) else {
            return;
        };
        let api: Api<FleetMicroservice> = Api::namespaced(self.home.clone(), &key.0);
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        let write = api.replace_status(&key.1, &params, &next);
        match tokio::time::timeout_at(until, write).await {
            Ok(Ok(_)) => {
                tracing::info!(
                    k8s.namespace.name = %key.0,
                    flotilla.fleetmicroservice = %key.1,
                    "FleetDnsDegraded written"
                );
                self.marked.insert(key, rv);
            }
            Ok(Err(e)) => {
                tracing::info!(error = %e, "could not write FleetDnsDegraded; next pass")
            }
            Err(_) => tracing::info!("FleetDnsDegraded write outlived the term's deadline"),
        }
    }

    /// Claims the term key, once per term (again after a conflict), while
    /// leading: its number, etcd's, is the epoch this term's records carry.
    async fn claim(&mut self) -> Result<i64, RegistryError> {
        if let Some(r) = self.claimed {
            return Ok(r);
        }
        admit(
            &self.leadership.borrow(),
            Some(self.epoch),
            tokio::time::Instant::now(),
        )
        .map_err(|_| RegistryError::NotLeading)?;
        // The Lease this term was won on is still the one, and still ours:
        // a holder of a deleted Lease (which admit cannot see) never claims
        // over the holder of its successor (#59).
        let live = held_lease(self.opts, &self.home, self.epoch)
            .await
            .map_err(|e| RegistryError::Unavailable(format!("the DNS Lease: {e}")))?;
        if live.as_deref() != Some(self.claim.lease.as_str()) {
            return Err(RegistryError::NotLeading);
        }
        let (r, number) = self
            .opts
            .registry
            .claim_term(&self.term_key, &self.claim)
            .await?;
        if self.me.epoch != number {
            tracing::info!(
                term = number,
                lease_epoch = self.epoch,
                "fleet DNS term claimed"
            );
        }
        self.me.epoch = number;
        self.claimed = Some(r);
        Ok(r)
    }

    /// One name's writes, in one transaction that checks this term's key.
    async fn write(&mut self, step: plan::Step) -> Result<(), RegistryError> {
        let opts = self.opts;
        let claimed = self.claim().await?;
        let mut ops = step.ops;
        ops.push(Op::Check {
            key: self.term_key.clone(),
            mod_revision: claimed,
        });
        let until = admit(
            &self.leadership.borrow(),
            Some(self.epoch),
            tokio::time::Instant::now(),
        )
        .map_err(|_| {
            METRICS.dns_writes_total.inc(&["refused"]);
            RegistryError::NotLeading
        })?;
        let (ns, name) = &step.answer.object;
        // A span per change, so a trace shows when each answer moved.
        let span = tracing::info_span!(
            "dns change",
            k8s.namespace.name = %ns,
            k8s.microservice.name = %name,
            flotilla.dns.listed = ?step.answer.listed,
            flotilla.dns.degraded = step.answer.degraded,
        );
        let apply = opts.registry.apply(&ops).instrument(span);
        let applied = match tokio::time::timeout_at(until, apply).await {
            Ok(r) => r,
            Err(_) => Err(RegistryError::NotLeading),
        };
        let result = match &applied {
            Ok(()) => "applied",
            Err(RegistryError::Conflict) => {
                // A key, or the term, moved: claim again (refused if a
                // newer term holds it) and read again next pass.
                self.claimed = None;
                "conflict"
            }
            Err(_) => "error",
        };
        METRICS.dns_writes_total.inc(&[result]);
        if applied.is_ok() {
            tracing::info!(
                k8s.namespace.name = %ns,
                k8s.microservice.name = %name,
                listed = ?step.answer.listed,
                degraded = step.answer.degraded,
                "fleet-wide name changed"
            );
        }
        applied
    }
}

/// `flotilla_dns_records{state}` after a pass.
fn count(steps: &[plan::Step]) {
    let (mut listed, mut withdrawn, mut failopen) = (0, 0, 0);
    for s in steps {
        let n = s.answer.listed.len();
        if s.answer.degraded {
            failopen += n;
        } else {
            listed += n;
            withdrawn += s.answer.candidates.len() - n;
        }
    }
    for (state, n) in [
        ("listed", listed),
        ("withdrawn", withdrawn),
        ("failopen", failopen),
    ] {
        METRICS.dns_records.set(&[state], n as f64);
    }
}
