//! One member cluster, as one replica sees it: connect, elect, and run the
//! controller only while this replica leads the cluster.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::PostParams;
use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;

use super::client_budget::Budget;
use super::credentials::{self, Trust};
use crate::domain::desired::PlatformDefaults;
use crate::lease::election::{Ownership, Timings};
use crate::lease::elector::{Elector, Leadership, release};
use crate::lease::fence::Fence;
use crate::lease::lease_store::KubeLeaseStore;
use crate::reconciler::{self, Hooks, Settings, WriterIdentity};
use crate::status::hub::Hub;
use crate::status::view::Reach;
use crate::telemetry::kube_layer::ApiMetricsLayer;
use crate::telemetry::metrics::METRICS;

/// What this replica knows about a cluster, for logs and the status API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterState {
    /// The kubeconfig cannot be used; the reason never quotes its contents.
    Invalid {
        reason: String,
    },
    Unreachable {
        reason: String,
        last_seen: Option<Instant>,
    },
    /// Answering again; who leads is up to the elector.
    Reachable,
    Following {
        holder: Option<String>,
        epoch: Option<i32>,
    },
    Leading {
        epoch: i32,
    },
}

/// How long the first contact with a cluster may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// What every cluster task of one replica shares.
#[derive(Clone, Debug)]
pub struct ReplicaSettings {
    pub replica_id: String,
    pub fleet_name: String,
    pub lease_namespace: String,
    pub timings: Timings,
    /// How long a Lease must have been free before a replica that does not
    /// own the cluster by assignment contests it.
    pub takeover_grace: Duration,
    pub resync: Duration,
    pub defaults: PlatformDefaults,
    /// Reconcile one namespace only in every member; `None` reconciles all.
    pub namespace: Option<String>,
    /// Every member cluster's client gets a budget of this size.
    pub budget: Budget,
    /// Start watches with streaming lists rather than LIST requests.
    pub streaming_lists: bool,
    pub debounce: Duration,
    pub debounce_max: Duration,
    /// The fleet service registry, when registration is on.
    pub registry: Option<crate::registry::Registration>,
    pub registry_sweep: Duration,
    /// A fleet DNS writer keeps the fleet-wide names (`--fleet-dns`).
    pub fleet_dns: bool,
}

fn set_state(hub: &Hub, cluster: &str, me: &str, state: ClusterState) {
    hub.update(|ix| {
        ix.update_cluster(cluster, "", |info| {
            let before = info.clone();
            match &state {
                ClusterState::Invalid { reason } => {
                    info.reach = Reach::Invalid;
                    info.reason = reason.clone();
                    info.synced = false;
                }
                ClusterState::Unreachable { reason, last_seen } => {
                    info.reach = Reach::Unreachable;
                    info.reason = reason.clone();
                    info.last_seen = last_seen.map(|t| SystemTime::now() - t.elapsed());
                }
                ClusterState::Reachable => {
                    info.reach = Reach::Reachable;
                    info.reason.clear();
                    info.last_seen = None;
                }
                ClusterState::Following { holder, epoch } => {
                    info.reach = Reach::Reachable;
                    info.reason.clear();
                    info.last_seen = None;
                    info.holder = holder.clone();
                    info.epoch = *epoch;
                    info.led_here = false;
                }
                ClusterState::Leading { epoch } => {
                    info.last_seen = None;
                    info.reach = Reach::Reachable;
                    info.reason.clear();
                    info.holder = Some(me.to_string());
                    info.epoch = Some(*epoch);
                    info.led_here = true;
                }
            }
            if *info != before {
                tracing::info!(k8s.cluster.name = cluster, state = ?state, "cluster state");
            }
            if info.led_here != before.led_here {
                METRICS.lease_transitions_total.inc(&[cluster]);
                if info.led_here {
                    tracing::info!(k8s.cluster.name = cluster, epoch = ?info.epoch, "leadership acquired");
                } else {
                    tracing::info!(k8s.cluster.name = cluster, "leadership lost");
                }
            }
            METRICS
                .cluster_leader
                .set(&[cluster], if info.led_here { 1.0 } else { 0.0 });
            METRICS.cluster_reachable.set(
                &[cluster],
                if info.reach == Reach::Reachable { 1.0 } else { 0.0 },
            );
        })
    });
}

/// A client with this replica's user agent, so audit logs name the writer.
/// Its requests are held to the cluster's own budget; with a fence, every
/// write is checked against leadership as it leaves that budget's queue.
pub async fn client_for(
    cluster: &str,
    kubeconfig: Kubeconfig,
    trust: Trust,
    agent: &http::HeaderValue,
    budget: Budget,
    fence: Option<&Fence>,
) -> Result<Client, String> {
    // Refused before kube-rs sees it: it would run commands and read files.
    credentials::check(&kubeconfig, trust).map_err(|e| e.to_string())?;
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| format!("kubeconfig is not usable: {}", credentials::describe(&e)))?;
    config
        .headers
        .push((http::header::USER_AGENT, agent.clone()));
    let builder = ClientBuilder::try_from(config)
        .map_err(|e| format!("client: {}", credentials::describe(&e)))?;
    Ok(builder
        .with_layer(&tower::util::option_layer(fence.map(Fence::layer)))
        .with_layer(&budget.layer())
        .with_layer(&ApiMetricsLayer::new(cluster))
        .build())
}

/// `flotilla/<replica-id>`, the user agent every request of this replica carries.
pub fn user_agent(replica_id: &str) -> Result<http::HeaderValue, String> {
    agent_named("flotilla", replica_id)
}

/// `flotilla-fleet/<replica-id>`: the fleet controller's writes to members,
/// told apart from the member leader's in audit logs.
pub fn fleet_user_agent(replica_id: &str) -> Result<http::HeaderValue, String> {
    agent_named("flotilla-fleet", replica_id)
}

/// `flotilla-ui/<replica-id>`: the dashboard's reads of member Events.
pub fn ui_user_agent(replica_id: &str) -> Result<http::HeaderValue, String> {
    agent_named("flotilla-ui", replica_id)
}

pub(crate) fn agent_named(product: &str, replica_id: &str) -> Result<http::HeaderValue, String> {
    http::HeaderValue::from_str(&format!("{product}/{replica_id}"))
        .map_err(|_| format!("replica id {replica_id:?} is not a valid header value"))
}

/// Why a cluster did not answer, in words that never quote credentials or
/// a credential plugin's output: the server's status code and reason for an
/// API error, and only the first clause of anything else.
pub(crate) fn unreachable_reason(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => {
            format!("the apiserver answered {} {}", status.code, status.reason)
        }
        other => credentials::describe(other),
    }
}

/// Yields each time the assignment names a different owner for `cluster`.
fn owner_changes(
    assignment: watch::Receiver<BTreeMap<String, String>>,
    cluster: String,
) -> futures::stream::BoxStream<'static, ()> {
    use futures::StreamExt;
    let mut last = assignment.borrow().get(&cluster).cloned();
    tokio_stream::wrappers::WatchStream::from_changes(assignment)
        .filter_map(move |a| {
            let owner = a.get(&cluster).cloned();
            let changed = owner != last;
            last = owner;
            std::future::ready(changed.then_some(()))
        })
        .boxed()
}

pub async fn ensure_namespace(client: &Client, namespace: &str) {
    let ns: Namespace = Namespace {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(namespace.to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    // Already there, or not ours to create: the Lease calls will say which.
    if let Err(e) = Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
    {
        tracing::debug!(error = %e, namespace, "lease namespace not created");
    }
}

/// Runs one cluster until `shutdown` turns true: waits until reachable,
/// elects, and runs the controller during each leadership term. On shutdown
/// the controller stops first, then the Lease is released.
pub async fn run(
    name: String,
    kubeconfig: Kubeconfig,
    trust: Trust,
    settings: ReplicaSettings,
    assignment: watch::Receiver<BTreeMap<String, String>>,
    hub: Arc<Hub>,
    mut shutdown: watch::Receiver<bool>,
) {
    let id = settings.replica_id.clone();
    let (c, elector) = match connect(&name, kubeconfig, trust, &settings).await {
        Ok(c) => c,
        Err(reason) => return set_state(&hub, &name, &id, ClusterState::Invalid { reason }),
    };
    if !reachable(&c.client, &hub, &name, &id, &mut shutdown).await {
        return;
    }
    let created = ensure_namespace(&c.lease_client, &settings.lease_namespace);
    if tokio::time::timeout(settings.timings.renew_deadline, created)
        .await
        .is_err()
    {
        tracing::warn!(k8s.cluster.name = %name, "creating the lease namespace timed out");
    }
    // The read-only status feed runs whether or not this replica leads.
    let feed = tokio::spawn(crate::status::feed::run(
        c.client.clone(),
        name.clone(),
        settings.namespace.clone(),
        settings.streaming_lists,
        settings.budget.qps,
        hub.clone(),
    ));
    let (cluster, grace) = (name.clone(), settings.takeover_grace);
    let drain_fence = c.fence.clone();
    let owner_changes = owner_changes(assignment.clone(), name.clone());
    let elector = elector
        .with_wake(owner_changes)
        .with_ownership(Box::new(move || Ownership::Assigned {
            owner: assignment.borrow().get(&cluster).cloned(),
            grace,
        }))
        .with_drain(Box::new(move || {
            let f = drain_fence.clone();
            Box::pin(async move { f.drained().await })
        }));
    let reachability = watch_reachability(
        elector.last_contact(),
        hub.clone(),
        name.clone(),
        &settings,
        shutdown.clone(),
    );
    let (stop_elector_tx, mut stop_elector_rx) = watch::channel(false);
    // The elector's own lines name their member: a replica runs several.
    let elector_task = tokio::spawn(
        elector
            .run(async move {
                stop_elector_rx.wait_for(|s| *s).await.ok();
            })
            .instrument(tracing::info_span!("elector", cluster = %name)),
    );
    let mut leadership = c.leadership.clone();
    loop {
        let state = leadership.borrow_and_update().clone();
        match state {
            Leadership::Leading { epoch, .. } if !*shutdown.borrow() => {
                set_state(&hub, &name, &id, ClusterState::Leading { epoch });
                lead(&c, &name, &settings, epoch, &shutdown).await;
            }
            Leadership::Following { holder, epoch, .. } => {
                set_state(&hub, &name, &id, ClusterState::Following { holder, epoch });
            }
            Leadership::Leading { .. } => {}
        }
        if *shutdown.borrow() {
            break;
        }
        tokio::select! {
            changed = leadership.changed() => if changed.is_err() { break },
            _ = shutdown.wait_for(|s| *s) => break,
        }
    }
    // Writers are stopped (the controller returned); now hand the Lease back.
    reachability.abort();
    feed.abort();
    stop_elector_tx.send(true).ok();
    if let Ok((store, Some(held))) = elector_task.await {
        let released =
            tokio::time::timeout(settings.timings.renew_deadline, release(&store, &held));
        match released.await {
            Ok(Ok(())) => tracing::info!(k8s.cluster.name = %name, "lease released"),
            Ok(Err(e)) => {
                tracing::warn!(k8s.cluster.name = %name, error = %e, "lease release failed")
            }
            Err(_) => tracing::warn!(k8s.cluster.name = %name, "lease release timed out"),
        }
    }
}

/// One member's clients and its write fence (`connect` also makes its elector).
struct Connected {
    /// The Lease's own client: renewals must never queue behind a
    /// reconcile backlog that has used up the cluster's request budget.
    lease_client: Client,
    /// The member's own client, fenced by the leadership that Lease decides.
    client: Client,
    /// The Lease itself, for its uid as a term begins.
    lease: KubeLeaseStore,
    leadership: watch::Receiver<Leadership>,
    fence: Fence,
}

async fn connect(
    name: &str,
    kubeconfig: Kubeconfig,
    trust: Trust,
    settings: &ReplicaSettings,
) -> Result<(Connected, Elector<KubeLeaseStore>), String> {
    let id = settings.replica_id.clone();
    let agent = user_agent(&id)?;
    let lease_client = client_for(
        name,
        kubeconfig.clone(),
        trust,
        &agent,
        Budget::ELECTION,
        None,
    )
    .await?;
    let store = KubeLeaseStore::new(
        lease_client.clone(),
        &settings.lease_namespace,
        &format!("flotilla-{}", settings.fleet_name),
    );
    let (elector, leadership) = Elector::new(id, settings.timings, store.clone());
    let fence = Fence::new(name, leadership.clone());
    let client = client_for(
        name,
        kubeconfig,
        trust,
        &agent,
        settings.budget,
        Some(&fence),
    )
    .await?;
    let connected = Connected {
        lease_client,
        client,
        lease: store,
        leadership,
        fence,
    };
    Ok((connected, elector))
}

/// Waits until the member answers, with backoff; false on shutdown.
async fn reachable(
    client: &Client,
    hub: &Hub,
    name: &str,
    id: &str,
    shutdown: &mut watch::Receiver<bool>,
) -> bool {
    let mut delay = Duration::from_millis(200);
    loop {
        // A server that accepts connections and never answers must neither
        // hold this task past shutdown nor stay "connecting" for ever.
        let probe = tokio::time::timeout(PROBE_TIMEOUT, client.apiserver_version());
        let answer = tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return false,
            answer = probe => answer,
        };
        let reason = match answer {
            Ok(Ok(_)) => {
                set_state(hub, name, id, ClusterState::Reachable);
                return true;
            }
            Ok(Err(e)) => unreachable_reason(&e),
            Err(_) => format!("no answer within {PROBE_TIMEOUT:?}"),
        };
        let unreachable = ClusterState::Unreachable {
            reason,
            last_seen: None,
        };
        set_state(hub, name, id, unreachable);
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return false,
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(30));
    }
}

/// Reachability: a cluster whose Lease could not be read for a lease
/// duration is Unreachable, with the last time it answered.
fn watch_reachability(
    contact: watch::Receiver<Option<Instant>>,
    hub: Arc<Hub>,
    name: String,
    settings: &ReplicaSettings,
    mut stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let (me, timings) = (settings.replica_id.clone(), settings.timings);
    // The cluster answered its probe just before this starts.
    let answered = Instant::now();
    tokio::spawn(async move {
        let mut was_unreachable = false;
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => break,
                _ = tokio::time::sleep(timings.retry_period) => {}
            }
            let last = *contact.borrow();
            let silent = silent(last, answered, Instant::now(), timings.lease_duration);
            if silent && !was_unreachable {
                let state = ClusterState::Unreachable {
                    reason: "the cluster's Lease could not be read for a lease duration".into(),
                    last_seen: last,
                };
                set_state(&hub, &name, &me, state);
            } else if !silent && was_unreachable {
                set_state(&hub, &name, &me, ClusterState::Reachable);
                tracing::info!(k8s.cluster.name = %name, "cluster reachable again");
            }
            was_unreachable = silent;
        }
    })
}

/// Silent for longer than a lease duration since the last Lease read, or,
/// before the first, since the probe answered: a first read still in
/// flight on a loaded apiserver is not yet a silence.
fn silent(last_read: Option<Instant>, answered: Instant, now: Instant, lease: Duration) -> bool {
    now.saturating_duration_since(last_read.unwrap_or(answered)) > lease
}

/// One leadership term: the controller runs with writes of this term, and
/// only this term, passing the fence.
async fn lead(
    c: &Connected,
    name: &str,
    settings: &ReplicaSettings,
    epoch: i32,
    shutdown: &watch::Receiver<bool>,
) {
    let lease = lease_uid(c, settings, epoch).await;
    let s = controller_settings(name, settings, (epoch, lease), &c.leadership);
    c.fence.arm(Some(epoch));
    // On shutdown, while still leading, in-flight reconciles may finish for
    // up to a renew deadline. A lost term aborts the controller at once:
    // the fence already refuses its writes.
    let mut stop = shutdown.clone();
    let end = async move {
        stop.wait_for(|s| *s).await.ok();
    };
    let (over, mut stopping) = (
        crate::lease::elector::term_over(c.leadership.clone(), epoch),
        shutdown.clone(),
    );
    let cutoff = settings.timings.renew_deadline;
    let aborted = async move {
        tokio::pin!(over);
        tokio::select! {
            _ = &mut over => return "term over",
            _ = stopping.wait_for(|s| *s) => {}
        }
        tokio::select! {
            _ = &mut over => "term over",
            _ = tokio::time::sleep(cutoff) => "did not stop in time",
        }
    };
    tokio::select! {
        _ = reconciler::run(c.client.clone(), s, Hooks::default(), end) => {}
        why = aborted => tracing::info!(k8s.cluster.name = %name, epoch, why, "controller aborted"),
    }
    c.fence.arm(None);
    tracing::info!(k8s.cluster.name = %name, epoch, "leadership term over; writers stopped");
}

/// The uid of the member Lease, read as this term begins while this
/// replica holds it at `epoch`, and read again until it is (its records
/// name it, #59); `None` once the term is over.
async fn lease_uid(c: &Connected, settings: &ReplicaSettings, epoch: i32) -> Option<String> {
    loop {
        let read = c.lease.held_uid(&settings.replica_id, epoch);
        if let Ok(Ok(uid)) = tokio::time::timeout(settings.timings.renew_deadline, read).await {
            return uid;
        }
        let leading =
            matches!(*c.leadership.borrow(), Leadership::Leading { epoch: e, .. } if e == epoch);
        if !leading {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The member controller's settings for one term.
fn controller_settings(
    name: &str,
    settings: &ReplicaSettings,
    (epoch, lease): (i32, Option<String>),
    leadership: &watch::Receiver<Leadership>,
) -> Settings {
    let mut s = Settings::new(
        name.to_string(),
        WriterIdentity {
            holder: settings.replica_id.clone(),
            epoch: Some(epoch),
            lease,
        },
    );
    s.resync = settings.resync;
    s.namespace = settings.namespace.clone();
    s.streaming_lists = settings.streaming_lists;
    s.debounce = settings.debounce;
    s.debounce_max = settings.debounce_max;
    s.registry = settings.registry.clone();
    s.registry_sweep = settings.registry_sweep;
    s.fleet_dns = settings.fleet_dns;
    s.defaults = settings.defaults.clone();
    s.leadership = Some(leadership.clone());
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_lease_read_still_in_flight_is_not_a_silence_until_a_lease_duration() {
        let (start, lease) = (Instant::now(), Duration::from_secs(2));
        let at = |ms| start + Duration::from_millis(ms);
        assert!(!silent(None, start, at(300), lease));
        assert!(!silent(None, start, at(2000), lease));
        assert!(silent(None, start, at(2001), lease));
        assert!(!silent(Some(at(1500)), start, at(3000), lease));
        assert!(silent(Some(at(1500)), start, at(3501), lease));
    }
}
