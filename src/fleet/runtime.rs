//! A replica of the fleet operator: heartbeats in the home cluster, the
//! kubeconfig directory as the cluster registry, the shard assignment, and
//! one task per member cluster.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::ListParams;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::cluster::{self, ReplicaSettings};
use super::labels::Labels;
use super::registry::{self, Entry};
use super::replicas;
use super::shard::assign;
use crate::status::hub::Hub;
use crate::status::view::{ClusterInfo, Reach};
use crate::telemetry::metrics::METRICS;

/// A valid member's credentials, for clients other than the cluster's own
/// (the fleet controller's, fenced by the home cluster's term).
#[derive(Clone)]
pub struct Credentials {
    pub kubeconfig: kube::config::Kubeconfig,
    pub trust: super::credentials::Trust,
    /// Changes whenever the kubeconfig does.
    pub fingerprint: u64,
}

pub struct FleetOptions {
    pub home: Client,
    pub home_namespace: String,
    /// Where labelled member Secrets are read: a namespace of their own, so
    /// the right to list them reaches no other Secret (the operator's own
    /// TLS key and tokens included).
    pub member_secrets_namespace: String,
    /// A directory of member kubeconfigs; labelled Secrets in
    /// `member_secrets_namespace` are always read too.
    pub kubeconfig_dir: Option<PathBuf>,
    /// Let kubeconfig files (never Secrets) run exec credential plugins.
    pub allow_exec_kubeconfigs: bool,
    pub replica: ReplicaSettings,
    /// How often the kubeconfig directory is read again.
    pub rescan: Duration,
    /// Where cluster states and every cluster's status go.
    pub hub: Arc<Hub>,
    /// Every valid member's credentials, as the registry reads them.
    pub credentials: watch::Sender<BTreeMap<String, Credentials>>,
}

/// Cluster tasks to stop, by name.
type Stops = Vec<(String, Running)>;

struct Running {
    fingerprint: u64,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// Labels that cannot be read keep the last good ones: a typo in a labels
/// file must not move a cluster out of every placement. A change applies
/// only once two scans in a row read it, so a file caught mid-write (empty,
/// or briefly missing during an editor's rename) changes nothing.
fn set_labels(
    name: &str,
    info: &mut ClusterInfo,
    labels: &Result<Labels, String>,
    pending: &mut BTreeMap<String, Labels>,
) {
    match labels {
        Ok(l) => {
            let first = info.labels.is_empty();
            if info.labels == *l {
                pending.remove(name);
            } else if first || pending.get(name) == Some(l) {
                tracing::info!(k8s.cluster.name = name, labels = ?l, "cluster labels");
                info.labels = l.clone();
                pending.remove(name);
            } else {
                pending.insert(name.to_string(), l.clone());
            }
            info.labels_error = None;
        }
        Err(e) => {
            if info.labels_error.as_ref() != Some(e) {
                tracing::warn!(k8s.cluster.name = name, error = %e, "cluster labels cannot be read; keeping the last good ones");
            }
            info.labels_error = Some(e.clone());
        }
    }
}

async fn stop_cluster(name: &str, running: Running) {
    running.stop.send(true).ok();
    if let Err(e) = running.task.await {
        tracing::error!(k8s.cluster.name = name, error = %e, "cluster task failed");
    }
}

/// How many clusters stop at once. A stop waits for the cluster's writers
/// and its Lease release, up to a renew deadline each; one after another,
/// removing ten members would hold the registry loop for minutes.
const PARALLEL_STOPS: usize = 32;

async fn stop_clusters(stops: Vec<(String, Running)>) {
    use futures::StreamExt;
    futures::stream::iter(stops)
        .for_each_concurrent(PARALLEL_STOPS, |(name, r)| async move {
            stop_cluster(&name, r).await
        })
        .await;
}

/// How long one list of the member Secrets may take: a home that holds it
/// must not hold the registry loop, which also follows the live replicas.
const SECRETS_READ_LIMIT: Duration = Duration::from_secs(10);

/// Runs until `shutdown` resolves; then removes this replica's heartbeat,
/// stops every cluster's writers and releases their Leases. Returns an
/// error if the heartbeat ends before that: a replica that no longer
/// announces itself must not keep leading.
pub async fn run(
    opts: FleetOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    let me = opts.replica.replica_id.clone();
    // Empty until the heartbeats have been read: nobody is assigned anything yet.
    let (live_tx, mut live_rx) = watch::channel(BTreeSet::new());
    opts.hub.update(|ix| ix.await_peers());
    cluster::ensure_namespace(&opts.home, &opts.home_namespace).await;
    let (stop_beat_tx, mut heartbeat) = heartbeat(&opts, live_tx);
    let (assignment_tx, assignment_rx) = watch::channel(BTreeMap::<String, String>::new());
    let mut clusters = Clusters::new(&opts, assignment_rx);
    let mut shutdown = std::pin::pin!(shutdown);
    let mut failure: Option<String> = None;
    // Ready (for /readyz and gRPC health) only once the live set is read.
    let mut joined = false;
    // Never resolve outside test builds (see `supervise::injected`).
    let mut heartbeat_fault = std::pin::pin!(crate::supervise::injected("heartbeat"));
    let mut registry_fault = std::pin::pin!(crate::supervise::injected("registry"));
    loop {
        // The read races the shutdown: a home that has gone silent holds
        // the Secrets list, and a SIGTERM must still release the Leases.
        // Only the read: stopping and starting tasks runs to its end.
        let read = tokio::select! {
            biased;
            _ = &mut shutdown => break,
            read = clusters.read(&opts) => read,
        };
        let valid = clusters.scan(&opts, read).await;
        // The assignment follows the live replicas and the valid clusters.
        let live = live_rx.borrow_and_update().clone();
        if !joined && live.contains(&me) {
            joined = true;
            opts.hub.update(|ix| ix.peers_known());
        }
        publish_assignment(&assignment_tx, &valid, &live);
        tokio::select! {
            _ = &mut shutdown => break,
            _ = live_rx.changed() => {}
            _ = tokio::time::sleep(opts.rescan) => {}
            ended = &mut heartbeat => {
                failure = Some(match ended {
                    Ok(()) => "the heartbeat stopped".to_string(),
                    Err(e) => format!("the heartbeat task failed: {e}"),
                });
                break;
            }
            e = &mut heartbeat_fault => {
                heartbeat.abort();
                failure = Some(format!("the heartbeat task failed: {e}"));
                break;
            }
            e = &mut registry_fault => {
                failure = Some(format!("the registry failed: {e}"));
                break;
            }
        }
    }

    tracing::info!("shutting down: leaving the live replicas, stopping writers, releasing leases");
    // Leave first: the others see the heartbeat deleted (a watch), name each
    // of this replica's clusters' successor and ask for its Lease while this
    // replica still leads, so that each release is taken the moment it
    // lands. The Leases, not the heartbeat, decide who may write.
    // Owner of nothing from now on: a cluster this replica waits for is
    // not asked for against its successor, and one it holds is renewed
    // until its release.
    assignment_tx.send_replace(BTreeMap::new());
    if failure.is_none() {
        stop_beat_tx.send(true).ok();
        leave(&opts, heartbeat).await;
    }
    stop_clusters(clusters.running.into_iter().collect()).await;
    failure.map_or(Ok(()), Err)
}

/// This replica's heartbeat Lease, renewed until told to stop; the live
/// replica set goes to `live`.
fn heartbeat(
    opts: &FleetOptions,
    live: watch::Sender<BTreeSet<String>>,
) -> (watch::Sender<bool>, JoinHandle<()>) {
    let (stop_tx, mut stop_rx) = watch::channel(false);
    let task = tokio::spawn(replicas::run(
        replicas::Heartbeat {
            client: opts.home.clone(),
            namespace: opts.home_namespace.clone(),
            fleet: opts.replica.fleet_name.clone(),
            me: opts.replica.replica_id.clone(),
            ttl: opts.replica.timings.lease_duration,
            period: opts.replica.timings.retry_period,
        },
        live,
        async move {
            stop_rx.wait_for(|s| *s).await.ok();
        },
    ));
    (stop_tx, task)
}

/// Waits for the heartbeat to delete itself. Bounded: a beat or listing
/// hung on a stalled home must not keep the member Leases from being
/// released (its TTL then ends it).
async fn leave(opts: &FleetOptions, mut heartbeat: JoinHandle<()>) {
    let limit = opts.replica.timings.retry_period * 2;
    match tokio::time::timeout(limit, &mut heartbeat).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(error = %e, "heartbeat task failed"),
        Err(_) => {
            heartbeat.abort();
            tracing::warn!("the heartbeat did not end within {limit:?}; left to its TTL");
        }
    }
}

/// The shard assignment of the valid clusters over the live replicas.
fn publish_assignment(
    tx: &watch::Sender<BTreeMap<String, String>>,
    valid: &BTreeSet<String>,
    live: &BTreeSet<String>,
) {
    let next: BTreeMap<String, String> = assign(valid, live)
        .into_iter()
        .map(|(c, r)| (c, r.to_string()))
        .collect();
    tx.send_if_modified(|cur| {
        let changed = *cur != next;
        if changed {
            tracing::info!(assignment = ?next, "shard assignment");
            *cur = next.clone();
        }
        changed
    });
}

/// The member clusters this replica runs a task for, and what the
/// registry's sources last said.
struct Clusters {
    running: BTreeMap<String, Running>,
    from_files: BTreeMap<String, registry::Found>,
    from_secrets: BTreeMap<String, registry::Found>,
    pending_labels: BTreeMap<String, Labels>,
    secrets_api: Api<Secret>,
    assignment: watch::Receiver<BTreeMap<String, String>>,
}

impl Clusters {
    fn new(opts: &FleetOptions, assignment: watch::Receiver<BTreeMap<String, String>>) -> Self {
        Clusters {
            running: BTreeMap::new(),
            from_files: BTreeMap::new(),
            from_secrets: BTreeMap::new(),
            pending_labels: BTreeMap::new(),
            secrets_api: Api::namespaced(opts.home.clone(), &opts.member_secrets_namespace),
            assignment,
        }
    }

    /// One pass of the registry over what `read` found: start new and
    /// changed clusters, stop removed ones, publish the credentials;
    /// returns the valid clusters.
    async fn scan(
        &mut self,
        opts: &FleetOptions,
        (found, whole): (BTreeMap<String, registry::Found>, bool),
    ) -> BTreeSet<String> {
        let hub = &opts.hub;
        hub.update(|ix| {
            for (name, f) in found.iter() {
                ix.update_cluster(name, &f.source, |c| {
                    set_labels(name, c, &f.labels, &mut self.pending_labels)
                });
            }
        });
        // Stops first, all together; then starts, so a changed cluster's old
        // task has let go before its new one begins.
        let (valid, stops, starts) = self.changes(hub, &found);
        stop_clusters(stops).await;
        for name in starts {
            self.start(opts, &name, &found[&name]);
        }
        publish_credentials(opts, &found);
        let forgotten = hub.update(|ix| {
            let gone: Vec<String> = ix
                .clusters()
                .keys()
                .filter(|c| !found.contains_key(*c))
                .cloned()
                .collect();
            ix.retain_clusters(&found.keys().cloned().collect());
            if whole {
                ix.registry_read();
            }
            gone
        });
        for cluster in forgotten {
            METRICS.forget_cluster(&cluster);
        }
        valid
    }

    /// Both sources, and whether both answered: until then the API answers
    /// UNAVAILABLE rather than from part of the fleet.
    async fn read(&mut self, opts: &FleetOptions) -> (BTreeMap<String, registry::Found>, bool) {
        let mut whole = true;
        let files = match &opts.kubeconfig_dir {
            None => BTreeMap::new(),
            Some(dir) => registry::scan(dir, opts.allow_exec_kubeconfigs).unwrap_or_else(|e| {
                // Keep what runs, as for Secrets: a passing EMFILE or EIO
                // must not stop every file member and drop its entries.
                tracing::warn!(dir = %dir.display(), error = %e, "cannot read the kubeconfig directory; keeping the clusters it defined");
                whole = false;
                self.from_files.clone()
            }),
        };
        self.from_files = files.clone();
        let listed = tokio::time::timeout(
            SECRETS_READ_LIMIT,
            self.secrets_api
                .list(&ListParams::default().labels(&format!("{}=true", registry::SECRET_LABEL))),
        )
        .await
        .unwrap_or_else(|_| {
            Err(kube::Error::Service(
                "the list did not answer in time".into(),
            ))
        });
        let secrets = match listed {
            Ok(list) => registry::from_secrets(&list.items),
            Err(e) => {
                // Keep what runs: a home-cluster hiccup must not drop members.
                tracing::warn!(error = %e, "cannot list member Secrets; keeping the clusters they defined");
                whole = false;
                self.from_secrets.clone()
            }
        };
        self.from_secrets = secrets.clone();
        (registry::merge(files, secrets), whole)
    }

    /// The valid clusters, the tasks to stop and the clusters to start.
    fn changes(
        &mut self,
        hub: &Hub,
        found: &BTreeMap<String, registry::Found>,
    ) -> (BTreeSet<String>, Stops, Vec<String>) {
        let mut valid = BTreeSet::new();
        let mut stops = Stops::new();
        let mut starts: Vec<String> = Vec::new();
        for (name, f) in found.iter() {
            match (&f.entry, &f.kubeconfig) {
                (Entry::Valid { fingerprint }, Some(_)) => {
                    valid.insert(name.clone());
                    if self
                        .running
                        .get(name)
                        .is_some_and(|r| r.fingerprint == *fingerprint)
                    {
                        continue;
                    }
                    if let Some(old) = self.running.remove(name) {
                        tracing::info!(k8s.cluster.name = %name, "kubeconfig changed; restarting the cluster");
                        stops.push((name.clone(), old));
                        // What the old cluster's feed listed says nothing
                        // of the new one until it has listed it.
                        hub.update(|ix| ix.update_cluster(name, "", |c| c.synced = false));
                    }
                    starts.push(name.clone());
                }
                (Entry::Invalid { reason }, _) => {
                    if let Some(old) = self.running.remove(name) {
                        stops.push((name.clone(), old));
                    }
                    hub.update(|ix| {
                        ix.update_cluster(name, &f.source, |c| {
                            if c.reach != Reach::Invalid || c.reason != *reason {
                                tracing::warn!(k8s.cluster.name = %name, reason = %reason, "cluster is Invalid");
                            }
                            c.reach = Reach::Invalid;
                            c.reason = reason.clone();
                            c.synced = false;
                        })
                    });
                }
                _ => {}
            }
        }
        let gone: Vec<String> = self
            .running
            .keys()
            .filter(|n| !found.contains_key(*n))
            .cloned()
            .collect();
        for name in gone {
            if let Some(old) = self.running.remove(&name) {
                tracing::info!(k8s.cluster.name = %name, "kubeconfig removed; releasing the cluster");
                stops.push((name, old));
            }
        }
        (valid, stops, starts)
    }

    /// Starts the task of one valid cluster.
    fn start(&mut self, opts: &FleetOptions, name: &str, f: &registry::Found) {
        let (Entry::Valid { fingerprint }, Some(kc)) = (&f.entry, &f.kubeconfig) else {
            return;
        };
        opts.hub
            .update(|ix| ix.update_cluster(name, &f.source, |c| c.source = f.source.clone()));
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(cluster::run(
            name.to_string(),
            kc.clone(),
            f.trust,
            opts.replica.clone(),
            self.assignment.clone(),
            opts.hub.clone(),
            stop_rx,
        ));
        self.running.insert(
            name.to_string(),
            Running {
                fingerprint: *fingerprint,
                stop,
                task,
            },
        );
    }
}

/// Every valid member's credentials, for the other clients (the rollout
/// controller's); sent only when a fingerprint changed.
fn publish_credentials(opts: &FleetOptions, found: &BTreeMap<String, registry::Found>) {
    let credentials: BTreeMap<String, Credentials> = found
        .iter()
        .filter_map(|(name, f)| match (&f.entry, &f.kubeconfig) {
            (Entry::Valid { fingerprint }, Some(kc)) => Some((
                name.clone(),
                Credentials {
                    kubeconfig: kc.clone(),
                    trust: f.trust,
                    fingerprint: *fingerprint,
                },
            )),
            _ => None,
        })
        .collect();
    opts.credentials.send_if_modified(|cur| {
        let fingerprints = |m: &BTreeMap<String, Credentials>| {
            m.iter()
                .map(|(n, c)| (n.clone(), c.fingerprint))
                .collect::<Vec<_>>()
        };
        let changed = fingerprints(cur) != fingerprints(&credentials);
        if changed {
            *cur = credentials;
        }
        changed
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Result<Labels, String> {
        Ok(pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect())
    }

    #[test]
    fn a_label_change_applies_once_two_scans_agree() {
        let mut info = ClusterInfo::new("file m1.yaml");
        let mut pending = BTreeMap::new();
        let prod = labels(&[("env", "prod"), ("n", "m1")]);
        let empty = labels(&[("n", "m1")]);
        set_labels("m1", &mut info, &prod, &mut pending);
        assert_eq!(
            Ok(info.labels.clone()),
            prod,
            "the first read applies at once"
        );
        // A file caught mid-write, then read whole again: nothing changed.
        set_labels("m1", &mut info, &empty, &mut pending);
        set_labels("m1", &mut info, &prod, &mut pending);
        assert_eq!(Ok(info.labels.clone()), prod);
        // A real change: applied on the second scan that reads it.
        set_labels("m1", &mut info, &empty, &mut pending);
        assert_eq!(Ok(info.labels.clone()), prod);
        set_labels("m1", &mut info, &empty, &mut pending);
        assert_eq!(Ok(info.labels.clone()), empty);
        // Unreadable: the last good labels stay, with the error.
        set_labels("m1", &mut info, &Err("bad".into()), &mut pending);
        assert_eq!(Ok(info.labels.clone()), empty);
        assert_eq!(info.labels_error.as_deref(), Some("bad"));
    }
}
