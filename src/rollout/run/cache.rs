//! Every replica's read-only watch caches of the home cluster's
//! FleetMicroservices and their ControllerRevisions, with a revision per
//! change so rollout watchers can resume. The fleet controller, on the
//! replica that leads, plans from the same caches.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::ControllerRevision;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;

use crate::rollout::spec::{FLEET_LABEL, FleetMicroservice};

/// (namespace, name)
pub type Key = (String, String);

/// Keys changed by revision, for resuming watchers.
#[derive(Debug, Default)]
struct Log {
    revision: u64,
    by_revision: BTreeMap<u64, Key>,
    at: BTreeMap<Key, u64>,
    /// Resuming from before this needs a snapshot (a relist loses deletes).
    compacted: u64,
}

impl Log {
    fn touch(&mut self, key: Key) {
        self.revision += 1;
        if let Some(old) = self.at.insert(key.clone(), self.revision) {
            self.by_revision.remove(&old);
        }
        self.by_revision.insert(self.revision, key);
    }

    fn since(&self, revision: u64) -> Option<Vec<(u64, Key)>> {
        if revision < self.compacted || revision > self.revision {
            return None;
        }
        Some(
            self.by_revision
                .range(revision + 1..)
                .map(|(r, k)| (*r, k.clone()))
                .collect(),
        )
    }

    fn compact(&mut self) {
        self.revision += 1;
        self.compacted = self.revision;
        self.by_revision.clear();
        self.at.clear();
    }
}

pub struct RolloutCache {
    pub fleet: Store<FleetMicroservice>,
    pub revisions: Store<ControllerRevision>,
    log: Mutex<Log>,
    /// The log's revision, for watchers.
    revision: watch::Sender<u64>,
    /// Bumped on every event of either cache, for the controller.
    changed: watch::Sender<u64>,
    pub index_id: String,
}

/// How long one watch of the home cluster runs before it is made again.
/// A watch can go silent without ending (seen after a home apiserver
/// restart: an edit never arrived at any replica for minutes); kube's
/// watcher reconnects once nothing came for this long plus 5 s, instead of
/// the server's default 290 s.
const WATCH_TIMEOUT_SECS: u32 = 60;

fn watch_config() -> watcher::Config {
    watcher::Config::default().timeout(WATCH_TIMEOUT_SECS)
}

/// The home cluster's name in the chaos nemesis's watch-lag file.
const HOME_SCOPE: &str = "home";

impl RolloutCache {
    /// Starts both watches; the task ends at `shutdown` (Ok), or with an
    /// error if a watch stream ends.
    pub fn start<S: std::future::Future<Output = ()> + Send + 'static>(
        client: Client,
        namespace: Option<&str>,
        replica_id: &str,
        shutdown: S,
    ) -> (
        Arc<Self>,
        impl std::future::Future<Output = Result<(), String>> + use<S>,
    ) {
        let (fleet, fleet_writer) = reflector::store();
        let (revisions, revisions_writer) = reflector::store();
        let started = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let cache = Arc::new(RolloutCache {
            fleet,
            revisions,
            log: Mutex::new(Log::default()),
            revision: watch::channel(0).0,
            changed: watch::channel(0).0,
            index_id: format!("{replica_id}-rollouts-{started:x}"),
        });
        let (fms_api, cr_api): (Api<FleetMicroservice>, Api<ControllerRevision>) = match namespace {
            Some(ns) => (
                Api::namespaced(client.clone(), ns),
                Api::namespaced(client, ns),
            ),
            None => (Api::all(client.clone()), Api::all(client)),
        };
        // The test hook's lag wraps the stream only when asked for.
        let fleet_watch = watcher(fms_api, watch_config());
        let fleet_watch = match crate::supervise::rollout_cache_delay() {
            Some(d) => crate::supervise::delayed(fleet_watch, move || d),
            None => fleet_watch.boxed(),
        };
        let fleet_watch = crate::supervise::watch_lagged(HOME_SCOPE, fleet_watch);
        let fleet_events =
            crate::watching::retried(reflector::reflector(fleet_writer, fleet_watch));
        let revision_watch = watcher(cr_api, watch_config().labels(FLEET_LABEL));
        let revision_watch = match crate::supervise::rollout_cache_delay() {
            Some(d) => crate::supervise::delayed(revision_watch, move || d),
            None => revision_watch.boxed(),
        };
        let revision_watch = crate::supervise::watch_lagged(HOME_SCOPE, revision_watch);
        let revision_events =
            crate::watching::retried(reflector::reflector(revisions_writer, revision_watch));
        let me = cache.clone();
        let run = async move {
            let mut fleet_events = std::pin::pin!(fleet_events);
            let mut revision_events = std::pin::pin!(revision_events);
            let mut shutdown = std::pin::pin!(shutdown);
            loop {
                tokio::select! {
                    _ = &mut shutdown => return Ok(()),
                    e = fleet_events.next() => match e {
                        None => return Err("the FleetMicroservice watch ended".to_string()),
                        Some(Ok(event)) => me.fleet_event(event),
                        // A missing CRD or RBAC shows here: say so, not at debug.
                        Some(Err(e)) => tracing::warn!(error = %e, "FleetMicroservice watch error"),
                    },
                    e = revision_events.next() => match e {
                        None => return Err("the ControllerRevision watch ended".to_string()),
                        Some(Ok(_)) => me.bump(),
                        Some(Err(e)) => tracing::warn!(error = %e, "ControllerRevision watch error"),
                    },
                }
            }
        };
        (cache, run)
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    fn fleet_event(&self, event: watcher::Event<FleetMicroservice>) {
        let key = |o: &FleetMicroservice| (o.namespace().unwrap_or_default(), o.name_any());
        let revision = {
            let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
            match &event {
                watcher::Event::Apply(o) | watcher::Event::Delete(o) => log.touch(key(o)),
                // A relist may have missed deletes: resumers start over.
                watcher::Event::InitDone => log.compact(),
                watcher::Event::Init | watcher::Event::InitApply(_) => {}
            }
            log.revision
        };
        self.revision
            .send_if_modified(|r| std::mem::replace(r, revision) != revision);
        self.bump();
    }

    pub fn revision(&self) -> u64 {
        *self.revision.borrow()
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.revision.subscribe()
    }

    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Keys changed after `revision`, each at its latest change; `None` if
    /// the log no longer reaches back that far.
    pub fn changes_since(&self, revision: u64) -> Option<Vec<(u64, Key)>> {
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .since(revision)
    }

    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<FleetMicroservice>> {
        self.fleet.get(&ObjectRef::new(name).within(namespace))
    }

    /// The namespaces that hold a FleetMicroservice, each once.
    pub fn namespaces(&self) -> std::collections::BTreeSet<String> {
        self.fleet
            .state()
            .iter()
            .filter_map(|f| f.metadata.namespace.clone())
            .collect()
    }

    /// `f`'s stored revisions, as the cache holds them.
    pub fn history(&self, f: &FleetMicroservice) -> Vec<crate::rollout::revision::Revision> {
        let stored = self.revisions.state();
        crate::rollout::run::home::revisions_of(f, stored.iter().map(|r| r.as_ref()))
            .into_iter()
            .map(|(r, _)| r)
            .collect()
    }

    pub async fn ready(&self) -> bool {
        self.fleet.wait_until_ready().await.is_ok()
            && self.revisions.wait_until_ready().await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_keeps_each_key_once_and_a_relist_forces_a_snapshot() {
        let mut log = Log::default();
        let k = |n: &str| ("ns".to_string(), n.to_string());
        log.touch(k("a"));
        log.touch(k("b"));
        log.touch(k("a"));
        assert_eq!(log.since(0), Some(vec![(2, k("b")), (3, k("a"))]));
        assert_eq!(log.since(2), Some(vec![(3, k("a"))]));
        assert_eq!(log.since(3), Some(vec![]));
        assert_eq!(log.since(9), None, "a revision this log never had");
        log.compact();
        assert_eq!(log.since(3), None, "from before the relist");
        assert_eq!(log.since(4), Some(vec![]));
    }
}
