//! What this leader knows it registered in etcd, per Microservice, and
//! which registrations failed: the memory a reconcile in sync reads
//! instead of etcd.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use kube::runtime::reflector::ObjectRef;
use tokio::time::Instant;

use crate::crd::Microservice;
use crate::registry::records::Record;

/// Records known to be in etcd, per Microservice, so a reconcile in sync
/// costs no etcd read. A note is trusted for `TRUST`, so a record lost to
/// an etcd restore comes back within that.
/// The records a Microservice had in etcd, and when that was last known.
type Known = (Vec<(String, Record)>, Instant);

#[derive(Debug, Default)]
pub struct Registrations {
    known: Mutex<HashMap<ObjectRef<Microservice>, Known>>,
    /// Registrations that failed: retried every `RETRY`, not only at resync.
    failed: Mutex<std::collections::HashSet<ObjectRef<Microservice>>>,
}

const TRUST: Duration = Duration::from_secs(300);
/// How soon a failed registration is tried again.
pub const RETRY: Duration = Duration::from_secs(10);

impl Registrations {
    pub(super) fn fresh(
        &self,
        key: &ObjectRef<Microservice>,
        desired: &[(String, Record)],
    ) -> bool {
        let map = self.known.lock().unwrap_or_else(|e| e.into_inner());
        map.get(key)
            .is_some_and(|(known, at)| known.as_slice() == desired && at.elapsed() < TRUST)
    }

    pub(super) fn note(&self, key: ObjectRef<Microservice>, desired: Vec<(String, Record)>) {
        self.set_failed(&key, false);
        let mut map = self.known.lock().unwrap_or_else(|e| e.into_inner());
        map.insert(key, (desired, Instant::now()));
    }

    pub(super) fn set_failed(&self, key: &ObjectRef<Microservice>, failed: bool) {
        let mut set = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        if failed {
            set.insert(key.clone());
        } else {
            set.remove(key);
        }
    }

    /// Whether `key`'s last registration failed.
    pub fn failed(&self, key: &ObjectRef<Microservice>) -> bool {
        self.failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(key)
    }

    pub fn forget(&self, key: &ObjectRef<Microservice>) {
        self.known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
        self.set_failed(key, false);
    }
}
