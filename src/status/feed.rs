//! Read-only watches of one member cluster's Microservices and managed
//! Deployments, folded into the hub. Every replica runs one per cluster,
//! whether it leads the cluster or not, so any replica answers for all.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use futures::{StreamExt, stream};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::ListParams;
use kube::runtime::watcher::{Event, watcher};
use kube::{Api, Client, ResourceExt};

use super::hub::Hub;
use super::index::Key;
use super::stall::{Probe, Stall, Versions};
use super::view::{Facts, Replicas};
use crate::crd::Microservice;
use crate::domain::conditions;

pub fn facts(ms: &Microservice) -> Facts {
    let status = ms.status.clone().unwrap_or_default();
    Facts {
        generation: ms.metadata.generation.unwrap_or(0),
        observed_generation: status.observed_generation.unwrap_or(0),
        image: ms.spec.image.clone(),
        labels: ms.labels().clone(),
        fleet_revision: ms
            .annotations()
            .get(crate::domain::names::REVISION_ANNOTATION)
            .cloned(),
        spec_digest: crate::domain::digest::digest(&ms.spec),
        deleting: ms.metadata.deletion_timestamp.is_some(),
        phase: status
            .phase
            .map(|p| p.as_str().to_string())
            .unwrap_or_else(|| conditions::phase(&status.conditions).as_str().to_string()),
        conditions: status.conditions,
    }
}

pub fn replicas(d: &Deployment) -> Replicas {
    let s = d.status.clone().unwrap_or_default();
    Replicas {
        desired: d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
        updated: s.updated_replicas.unwrap_or(0),
        ready: s.ready_replicas.unwrap_or(0),
        available: s.available_replicas.unwrap_or(0),
    }
}

fn key<K: ResourceExt>(o: &K) -> Key {
    (o.namespace().unwrap_or_default(), o.name_any())
}

enum Item {
    Ms(Box<Event<Microservice>>),
    Dep(Box<Event<Deployment>>),
}

/// A status watch that keeps failing for this long makes the cluster's
/// entries Unknown: past it, what this replica shows may be stale.
const STALE_AFTER: Duration = Duration::from_secs(5);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How often a synced feed compares what its watches delivered with a
/// consistent list, at the most: a silent stall is proven at the second
/// probe, so within two periods of the first change it missed. A watch is
/// listed only once it has delivered nothing for a period.
const PROBE_EVERY: Duration = Duration::from_secs(5);
/// The share of a member's request budget the probe may take. Its two
/// lists draw from the same budget as the leader's writes, and on a small
/// budget a probe every 5 s took most of it (0.4 of 0.5 requests a second).
const PROBE_SHARE: f64 = 0.1;

/// Objects the probe may list a second, whatever the budget. Its quorum
/// lists cost the member's apiserver in proportion to the objects listed,
/// on every replica, so a large member is probed less often: at 500
/// Microservices (1,000 objects with their Deployments) every 10 s (#37).
const PROBE_OBJECTS_PER_SECOND: f64 = 100.0;
/// A probe list's page size.
const PROBE_PAGE: u32 = 500;

/// The probe's period on a member whose budget is `qps` requests a second,
/// with `objects` Microservices and managed Deployments: every
/// `PROBE_EVERY`, or less often when that would take more than
/// `PROBE_SHARE` of the budget or list more than `PROBE_OBJECTS_PER_SECOND`.
pub fn probe_period(qps: f64, objects: usize) -> Duration {
    // Two lists, each of at least one page.
    let pages = 2.0 * (objects as f64 / f64::from(PROBE_PAGE)).ceil().max(1.0);
    let by_budget = pages / (PROBE_SHARE * qps);
    let by_objects = objects as f64 / PROBE_OBJECTS_PER_SECOND;
    let period = by_budget.max(by_objects);
    if period.is_finite() && period > PROBE_EVERY.as_secs_f64() {
        Duration::from_secs_f64(period.min(3600.0))
    } else {
        PROBE_EVERY
    }
}
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why both watches stopped.
enum Ended {
    /// An error, marked once it has lasted `STALE_AFTER`.
    Failed(String),
    /// A proven stall, marked at once: the entries are already stale.
    Stalled(String),
}

/// Runs until dropped. Relists replace the cluster's entries, so nothing
/// deleted while a watch was down lingers. Every error, and every proven
/// stall, restarts both watches with a relist, so a recovery is always seen
/// as a completed listing, even on a cluster where nothing changes.
pub async fn run(
    client: Client,
    cluster: String,
    namespace: Option<String>,
    streaming_lists: bool,
    probe_qps: f64,
    hub: Arc<Hub>,
) {
    let mut health = Health::default();
    loop {
        let ended = watch_until_error(
            client.clone(),
            &cluster,
            namespace.as_deref(),
            streaming_lists,
            probe_qps,
            &hub,
            &mut health,
        )
        .await;
        crate::telemetry::metrics::METRICS
            .watch_errors_total
            .inc(&[&cluster, "status-feed"]);
        let since = *health.failing_since.get_or_insert_with(Instant::now);
        let (error, now) = match ended {
            Ended::Failed(e) => (e, since.elapsed() >= STALE_AFTER),
            Ended::Stalled(e) => (e, true),
        };
        if now {
            if !health.marked {
                tracing::warn!(k8s.cluster.name = %cluster, error = %error, "status watch is failing; entries are shown as Unknown");
            }
            health.marked = true;
            hub.update(|ix| ix.update_cluster(&cluster, "", |c| c.feed_error = Some(error)));
        } else {
            tracing::debug!(k8s.cluster.name = %cluster, error = %error, "status watch error");
        }
        tokio::time::sleep(health.backoff).await;
        health.backoff = (health.backoff * 2).min(MAX_BACKOFF);
    }
}

#[derive(Debug)]
struct Health {
    failing_since: Option<Instant>,
    marked: bool,
    backoff: Duration,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            failing_since: None,
            marked: false,
            backoff: Duration::from_millis(500),
        }
    }
}

/// The `resourceVersion`s one watch has delivered, with a listing under way.
#[derive(Default)]
struct Delivered {
    now: Versions,
    listing: Option<Versions>,
    /// When it last delivered a change.
    last: Option<Instant>,
}

impl Delivered {
    fn saw<K: ResourceExt>(&mut self, event: &Event<K>) {
        let rv = |o: &K| o.resource_version().unwrap_or_default();
        if matches!(event, Event::Apply(_) | Event::Delete(_)) {
            self.last = Some(Instant::now());
        }
        match event {
            Event::Init => self.listing = Some(Versions::new()),
            Event::InitApply(o) => {
                if let Some(l) = self.listing.as_mut() {
                    l.insert(key(o), rv(o));
                }
            }
            Event::InitDone => self.now = self.listing.take().unwrap_or_default(),
            Event::Apply(o) => {
                self.now.insert(key(o), rv(o));
            }
            Event::Delete(o) => {
                self.now.remove(&key(o));
            }
        }
    }

    /// Whether this watch needs the probe's list at `now`: only once it
    /// has delivered nothing for a whole `period`. One that delivers is
    /// not stalled, and a watch delivers in order, so it has also
    /// delivered every change before its last. On a busy member this saves
    /// the quorum lists, which cost the apiserver by the objects listed
    /// (#37).
    fn quiet_at(&self, now: Instant, period: Duration) -> bool {
        self.quiet_from(period).is_none_or(|t| t <= now)
    }

    /// When it will have been quiet for `period`, if nothing comes; `None`
    /// if it never delivered.
    fn quiet_from(&self, period: Duration) -> Option<Instant> {
        self.last.map(|t| t + period)
    }
}

/// What the apiserver has now: a list without a resourceVersion, served
/// from etcd by quorum, metadata only, paged. Each page is decoded into
/// names and versions alone: kube's `list_metadata` builds every entry's
/// `managedFields` as JSON trees, which at 500 objects was most of the
/// allocations of a converged replica (docs/performance.md, #37).
async fn listed<K: kube::Resource + Clone>(
    api: &Api<K>,
    labels: Option<&str>,
) -> kube::Result<Versions> {
    let request = kube::core::Request::new(api.resource_url());
    let client: Client = api.clone().into_client();
    let mut params = ListParams::default().limit(PROBE_PAGE);
    if let Some(l) = labels {
        params = params.labels(l);
    }
    let mut out = Versions::new();
    loop {
        let mut req = request
            .list_metadata(&params)
            .map_err(kube::Error::BuildRequest)?;
        req.extensions_mut().insert("list_metadata");
        let page: VersionPage = client.request(req).await?;
        for o in page.items.unwrap_or_default() {
            let m = o.metadata;
            out.insert(
                (m.namespace.unwrap_or_default(), m.name),
                m.resource_version,
            );
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(next) => params = params.continue_token(&next),
            None => return Ok(out),
        }
    }
}

/// One page of a metadata list as the probe reads it. Fields it does not
/// name are skipped by the parser without being built.
#[derive(serde::Deserialize)]
struct VersionPage {
    #[serde(default)]
    metadata: PageMeta,
    /// An empty metadata list comes as `"items": null`; as an error it
    /// left the probe blind to a stalled watch that missed the last
    /// object's deletion.
    #[serde(default)]
    items: Option<Vec<Versioned>>,
}

#[derive(serde::Deserialize, Default)]
struct PageMeta {
    #[serde(rename = "continue", default)]
    continue_: Option<String>,
}

#[derive(serde::Deserialize)]
struct Versioned {
    metadata: VersionedMeta,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct VersionedMeta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    resource_version: String,
}

/// What the probe's two listings read, within its timeout.
type ProbeAnswer =
    Result<kube::Result<(Option<Versions>, Option<Versions>)>, tokio::time::error::Elapsed>;

/// The probe's two listings in flight.
type ProbeRead = std::pin::Pin<Box<dyn std::future::Future<Output = ProbeAnswer> + Send>>;

/// Both watches, folded into the hub until either fails or stalls.
async fn watch_until_error(
    client: Client,
    cluster: &str,
    namespace: Option<&str>,
    streaming_lists: bool,
    probe_qps: f64,
    hub: &Hub,
    health: &mut Health,
) -> Ended {
    let (ms_api, dep_api): (Api<Microservice>, Api<Deployment>) = match namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client, ns),
        ),
        None => (Api::all(client.clone()), Api::all(client)),
    };
    let base = crate::watching::config(streaming_lists);
    let managed = crate::watching::managed(streaming_lists);
    let labels = managed.label_selector.clone();
    // Lagged only by the chaos nemesis's test hook.
    let ms = crate::supervise::watch_lagged(cluster, watcher(ms_api.clone(), base))
        .map(|e| e.map(|m| Item::Ms(Box::new(m))));
    let deps = crate::supervise::watch_lagged(cluster, watcher(dep_api.clone(), managed))
        .map(|e| e.map(|d| Item::Dep(Box::new(d))));
    let mut events = std::pin::pin!(stream::select(ms, deps));
    let mut fed = Fed::default();
    let mut announced = false;
    // Recovery counts once the watches have stayed up this long after their
    // listing: one that lists and then fails at once keeps backing off, and
    // stays marked, rather than relisting every half second.
    let mut stable_at: Option<Instant> = None;
    let mut stalls = (Stall::default(), Stall::default());
    // The period follows the objects the watches have delivered.
    let mut probe_every = probe_period(probe_qps, 0);
    let mut next_probe = Instant::now() + probe_every;
    let mut probing: Option<ProbeRead> = None;
    let delay = crate::supervise::feed_delay(cluster);
    loop {
        let event = tokio::select! {
            e = events.next() => e,
            _ = tokio::time::sleep_until(stable_at.unwrap_or_else(Instant::now)), if stable_at.is_some() => {
                stable_at = None;
                if health.marked {
                    tracing::info!(k8s.cluster.name = %cluster, "status watch recovered");
                    hub.update(|ix| ix.update_cluster(cluster, "", |c| c.feed_error = None));
                }
                *health = Health::default();
                continue;
            }
            // The probe's reads run beside the watches, never in place of
            // them: a read waiting on a small request budget must not hold
            // back the events it is checking.
            _ = tokio::time::sleep_until(next_probe), if announced && probing.is_none() => {
                let (ms_seen, dep_seen) = (&fed.ms_seen, &fed.dep_seen);
                probe_every = probe_period(probe_qps, ms_seen.now.len() + dep_seen.now.len());
                let now = Instant::now();
                let (ms_quiet, dep_quiet) = (ms_seen.quiet_at(now, probe_every), dep_seen.quiet_at(now, probe_every));
                if !ms_quiet && !dep_quiet {
                    // Both are delivering: look again once either has been
                    // quiet for a whole period, so a stall that follows a
                    // delivery is still proven within two periods.
                    next_probe = ms_seen.quiet_from(probe_every).min(dep_seen.quiet_from(probe_every)).unwrap_or(now);
                    continue;
                }
                next_probe = now + probe_every;
                // Judged only between listings: a relist in progress is
                // progress, however long it takes.
                if fed.ms_seen.listing.is_none() && fed.dep_seen.listing.is_none() {
                    let (ms_api, dep_api, labels) = (ms_api.clone(), dep_api.clone(), labels.clone());
                    probing = Some(Box::pin(tokio::time::timeout(PROBE_TIMEOUT, async move {
                        let ms = if ms_quiet { Some(listed(&ms_api, None).await?) } else { None };
                        let dep = if dep_quiet { Some(listed(&dep_api, labels.as_deref()).await?) } else { None };
                        Ok::<_, kube::Error>((ms, dep))
                    })));
                }
                continue;
            }
            read = async { probing.as_mut().expect("guarded").await }, if probing.is_some() => {
                probing = None;
                match stalled(read, &fed, &mut stalls, probe_every) {
                    Some(ended) => return ended,
                    None => continue,
                }
            }
        };
        let Some(event) = event else { break };
        let item = match event {
            Ok(item) => item,
            Err(e) => return Ended::Failed(e.to_string()),
        };
        fed.apply(item, cluster, hub, delay).await;
        if fed.ms_synced && fed.dep_synced && !announced {
            announced = true;
            stable_at = Some(Instant::now() + STALE_AFTER);
            hub.update(|ix| ix.update_cluster(cluster, "", |c| c.synced = true));
        }
    }
    Ended::Failed("the watch ended".to_string())
}

/// What the watches delivered so far: each listing under way, whether
/// each has listed, and what each delivered (for the stall probe).
#[derive(Default)]
struct Fed {
    ms_init: Vec<(Key, Facts)>,
    dep_init: Vec<(Key, Replicas)>,
    ms_synced: bool,
    dep_synced: bool,
    ms_seen: Delivered,
    dep_seen: Delivered,
}

impl Fed {
    /// One event of either watch, folded into the hub.
    async fn apply(&mut self, item: Item, cluster: &str, hub: &Hub, delay: Option<Duration>) {
        match item {
            // A watch that delivers nothing, as a stuck watch cache does
            // (test builds only).
            Item::Ms(event)
                if matches!(*event, Event::Apply(_) | Event::Delete(_))
                    && crate::supervise::feed_stalled(cluster) => {}
            Item::Ms(event) => {
                self.ms_seen.saw(&event);
                match *event {
                    Event::Init => self.ms_init.clear(),
                    Event::InitApply(o) => self.ms_init.push((key(&o), facts(&o))),
                    Event::InitDone => {
                        // A slow feed lists slowly too (test builds only).
                        if let Some(d) = delay {
                            tokio::time::sleep(d).await;
                        }
                        let items = std::mem::take(&mut self.ms_init);
                        hub.update(|ix| ix.replace_microservices(cluster, items));
                        self.ms_synced = true;
                    }
                    Event::Apply(o) => {
                        if let Some(d) = delay {
                            tokio::time::sleep(d).await;
                        }
                        hub.update(|ix| ix.upsert_microservice(cluster, key(&o), facts(&o)))
                    }
                    Event::Delete(o) => hub.update(|ix| ix.delete_microservice(cluster, &key(&o))),
                }
            }
            Item::Dep(event) => {
                self.dep_seen.saw(&event);
                match *event {
                    Event::Init => self.dep_init.clear(),
                    Event::InitApply(o) => self.dep_init.push((key(&o), replicas(&o))),
                    Event::InitDone => {
                        let items = std::mem::take(&mut self.dep_init);
                        hub.update(|ix| ix.replace_replicas(cluster, items));
                        self.dep_synced = true;
                    }
                    Event::Apply(o) => {
                        hub.update(|ix| ix.upsert_replicas(cluster, key(&o), replicas(&o)))
                    }
                    Event::Delete(o) => hub.update(|ix| ix.delete_replicas(cluster, &key(&o))),
                }
            }
        }
    }
}

/// The probe's verdict on what it read: the watch that stalled, if one did.
fn stalled(
    read: ProbeAnswer,
    fed: &Fed,
    (ms_stall, dep_stall): &mut (Stall, Stall),
    probe_every: Duration,
) -> Option<Ended> {
    if fed.ms_seen.listing.is_some() || fed.dep_seen.listing.is_some() {
        return None;
    }
    // An apiserver that does not answer is its reachability, which the
    // Lease covers; only an answer is evidence.
    let Ok(Ok((ms_now, dep_now))) = read else {
        return None;
    };
    // A watch that was not listed keeps its suspects for the next turn it
    // is: still unmoved then is still a stall.
    let verdicts = [
        ms_now.map(|now| ("Microservice", ms_stall.judge(&fed.ms_seen.now, &now))),
        dep_now.map(|now| ("Deployment", dep_stall.judge(&fed.dep_seen.now, &now))),
    ];
    verdicts.into_iter().flatten().find_map(|(kind, verdict)| match verdict {
        Probe::Stalled((ns, name)) => Some(Ended::Stalled(format!(
            "the watch stalled: {kind} {ns}/{name} changed on the apiserver and the watch has not shown it for {}s",
            probe_every.as_secs()
        ))),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As the apiserver sends an empty metadata list (seen in a replica's
    /// log as a parse error every probe).
    #[test]
    fn an_empty_probe_page_is_read_as_no_objects() {
        let page: VersionPage = serde_json::from_str(
            r#"{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"27253"},"items":null}"#,
        )
        .expect("an empty list is a list");
        assert!(page.items.unwrap_or_default().is_empty());
        assert_eq!(page.metadata.continue_, None);
    }

    #[test]
    fn a_probe_page_keeps_names_versions_and_the_continue_token_only() {
        let page: VersionPage = serde_json::from_value(serde_json::json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": "900", "continue": "next-page"},
            "items": [{
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": {
                    "name": "web", "namespace": "shop", "resourceVersion": "812",
                    "uid": "u-1", "labels": {"a": "b"},
                    "managedFields": [{"manager": "flotilla", "operation": "Apply",
                        "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:replicas": {}}}}],
                },
            }, {
                "metadata": {"name": "node-wide", "resourceVersion": "7"},
            }],
        }))
        .unwrap();
        assert_eq!(page.metadata.continue_.as_deref(), Some("next-page"));
        let got: Vec<(Option<String>, String, String)> = page
            .items
            .unwrap_or_default()
            .into_iter()
            .map(|i| {
                (
                    i.metadata.namespace,
                    i.metadata.name,
                    i.metadata.resource_version,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (Some("shop".into()), "web".into(), "812".into()),
                (None, "node-wide".into(), "7".into()),
            ]
        );
        let last: VersionPage =
            serde_json::from_value(serde_json::json!({"metadata": {}, "items": []})).unwrap();
        assert_eq!(last.metadata.continue_, None);
    }

    #[test]
    fn the_stall_probe_takes_at_most_a_tenth_of_a_small_budget() {
        // The default budget (100 a second), and any above 4: every 5 s.
        assert_eq!(probe_period(100.0, 0), PROBE_EVERY);
        assert_eq!(probe_period(4.0, 0), PROBE_EVERY);
        // Half a request a second: two lists every 40 s, a tenth of it.
        assert_eq!(probe_period(0.5, 0), Duration::from_secs(40));
        // Nothing absurd from a budget that cannot be set anyway.
        assert_eq!(probe_period(0.0, 0), PROBE_EVERY);
        assert_eq!(probe_period(1e-9, 0), Duration::from_secs(3600));
        // Lists of more than one page are more requests: three pages
        // each, six requests, every 60 s at one request a second.
        assert_eq!(probe_period(1.0, 1200), Duration::from_secs(60));
    }

    #[test]
    fn only_a_watch_quiet_for_a_whole_period_is_listed() {
        let dep = |name: &str, rv: &str| {
            let mut d = Deployment::default();
            d.metadata.name = Some(name.into());
            d.metadata.namespace = Some("shop".into());
            d.metadata.resource_version = Some(rv.into());
            d
        };
        let period = Duration::from_secs(5);
        let mut seen = Delivered::default();
        // A listing is not a delivery: right after it, the watch is listed.
        seen.saw(&Event::<Deployment>::Init);
        seen.saw(&Event::InitApply(dep("web", "1")));
        seen.saw(&Event::<Deployment>::InitDone);
        assert!(seen.quiet_at(Instant::now(), period));
        assert_eq!(seen.quiet_from(period), None);
        // A change delivered: not listed for a whole period after it.
        seen.saw(&Event::Apply(dep("web", "2")));
        let at = seen.last.expect("a delivery");
        assert!(!seen.quiet_at(at + Duration::from_millis(4999), period));
        assert!(seen.quiet_at(at + period, period));
        assert_eq!(seen.quiet_from(period), Some(at + period));
        seen.saw(&Event::Delete(dep("web", "3")));
        assert!(seen.last.expect("a delivery") >= at);
        assert!(seen.now.is_empty());
    }

    #[test]
    fn a_large_member_is_probed_less_often() {
        // Up to 500 objects: every 5 s, as on a small member.
        assert_eq!(probe_period(100.0, 100), PROBE_EVERY);
        assert_eq!(probe_period(100.0, 500), PROBE_EVERY);
        // 500 Microservices and their Deployments: every 10 s, so a
        // silent stall is proven within 20 s.
        assert_eq!(probe_period(100.0, 1000), Duration::from_secs(10));
        assert_eq!(probe_period(100.0, 10_000), Duration::from_secs(100));
    }
}
