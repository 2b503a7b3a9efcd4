//! Shares the index between the cluster feeds and the API: a short lock,
//! plus notifications when the revision or readiness changes.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

use super::index::Index;

pub struct Hub {
    index: Mutex<Index>,
    revision: watch::Sender<u64>,
    clusters: watch::Sender<u64>,
    ready: watch::Sender<bool>,
    /// Revisions are only meaningful within one index; watchers resume
    /// only when they come back with the same id.
    pub index_id: String,
    pub replica_id: String,
}

impl Hub {
    pub fn new(replica_id: &str) -> Arc<Self> {
        let started = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        Arc::new(Hub {
            index: Mutex::new(Index::default()),
            revision: watch::channel(0).0,
            clusters: watch::channel(0).0,
            ready: watch::channel(false).0,
            index_id: format!("{replica_id}-{started:x}"),
            replica_id: replica_id.to_string(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Index> {
        // A panic while holding the lock leaves a consistent index: every
        // mutation is a single map operation sequence without await points.
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn update<R>(&self, f: impl FnOnce(&mut Index) -> R) -> R {
        let (out, revision, clusters, ready) = {
            let mut ix = self.lock();
            let out = f(&mut ix);
            (out, ix.revision(), ix.cluster_changes(), ix.ready())
        };
        self.revision
            .send_if_modified(|r| std::mem::replace(r, revision) != revision);
        self.clusters
            .send_if_modified(|c| std::mem::replace(c, clusters) != clusters);
        self.ready
            .send_if_modified(|r| std::mem::replace(r, ready) != ready);
        out
    }

    pub fn read<R>(&self, f: impl FnOnce(&Index) -> R) -> R {
        f(&self.lock())
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.revision.subscribe()
    }

    /// Changes of the cluster set or of a cluster's reach, sync or feed:
    /// what can move a wait's verdict without a new revision.
    pub fn subscribe_clusters(&self) -> watch::Receiver<u64> {
        self.clusters.subscribe()
    }

    pub fn readiness(&self) -> watch::Receiver<bool> {
        self.ready.subscribe()
    }
}
