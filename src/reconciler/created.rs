//! Children this controller created that its watches may not show yet.
//! A reconcile woken by the Deployment's first events can run before the
//! Service watch delivers the Service created a moment earlier; without
//! this note it would find the name free, create again and meet a 409.
//!
//! A note lasts until either watch shows the object it names (by uid: an
//! event for an older object of that name does not count) or `TTL` passes,
//! so a child deleted right after its create is still created again.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use kube::Resource;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use tokio::time::Instant;

use super::names::Names;

/// The longest a watch is trusted to lag behind our own create.
pub const TTL: Duration = Duration::from_secs(10);

type Notes<K> = HashMap<ObjectRef<K>, (K, Instant)>;

pub struct Created<K: Resource<DynamicType = ()>>(Mutex<Notes<K>>);

impl<K: Resource<DynamicType = ()>> Default for Created<K> {
    fn default() -> Self {
        Created(Mutex::new(HashMap::new()))
    }
}

impl<K> Created<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    fn notes(&self) -> std::sync::MutexGuard<'_, Notes<K>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes the object a create returned.
    pub fn record(&self, obj: &K, now: Instant) {
        let mut notes = self.notes();
        // Expired notes go here, so the map never outgrows one TTL of creates.
        notes.retain(|_, (_, at)| now.duration_since(*at) < TTL);
        notes.insert(ObjectRef::from_obj(obj), (obj.clone(), now));
    }

    /// Our created object, while no watch has shown it and the note is fresh.
    pub fn unseen(&self, ns: &str, name: &str, now: Instant) -> Option<K> {
        let key = ObjectRef::new(name).within(ns);
        let mut notes = self.notes();
        match notes.get(&key) {
            Some((obj, at)) if now.duration_since(*at) < TTL => Some(obj.clone()),
            Some(_) => {
                notes.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Whether a note is still waiting for a watch to show its object.
    pub fn awaiting(&self, ns: &str, name: &str) -> bool {
        self.notes().contains_key(&ObjectRef::new(name).within(ns))
    }

    /// A watch showed `name` with `uid`: if that is our object, the
    /// caches know it now and the note has served.
    pub fn seen(&self, ns: &str, name: &str, uid: Option<&str>) {
        let key = ObjectRef::new(name).within(ns);
        let mut notes = self.notes();
        if notes
            .get(&key)
            .is_some_and(|(obj, _)| obj.meta().uid.as_deref() == uid)
        {
            notes.remove(&key);
        }
    }

    /// The names watch changed `obj` and `names` is its store, already
    /// updated. If the store no longer holds that object, it was deleted,
    /// perhaps before our own watch ever showed it: a note about it would
    /// hide the deletion.
    pub fn on_name_change(&self, names: &Names<K>, obj: &PartialObjectMeta<K>) {
        let (Some(ns), Some(name)) = (&obj.metadata.namespace, &obj.metadata.name) else {
            return;
        };
        let uid = obj.metadata.uid.as_deref();
        let held = names.get(&ObjectRef::new(name).within(ns));
        if held.is_none_or(|h| h.metadata.uid.as_deref() != uid) {
            self.seen(ns, name, uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Service;

    fn svc(uid: &str) -> Service {
        let mut s = Service::default();
        s.metadata.name = Some("api".into());
        s.metadata.namespace = Some("ns".into());
        s.metadata.uid = Some(uid.into());
        s
    }

    #[test]
    fn a_created_child_counts_as_present_until_a_watch_shows_it() {
        let created = Created::default();
        let t0 = Instant::now();
        created.record(&svc("u1"), t0);
        let uid = |s: Option<Service>| s.and_then(|s| s.metadata.uid);
        assert_eq!(uid(created.unseen("ns", "api", t0)), Some("u1".into()));
        assert!(created.awaiting("ns", "api"));
        // An event about an older object of the same name is not ours.
        created.seen("ns", "api", Some("u0"));
        assert_eq!(uid(created.unseen("ns", "api", t0)), Some("u1".into()));
        created.seen("ns", "api", Some("u1"));
        assert_eq!(uid(created.unseen("ns", "api", t0)), None);
        assert!(!created.awaiting("ns", "api"));
    }

    #[test]
    fn a_note_expires_so_a_child_deleted_unseen_is_created_again() {
        let created = Created::default();
        let t0 = Instant::now();
        created.record(&svc("u1"), t0);
        assert!(created.unseen("ns", "api", t0 + TTL).is_none());
        assert!(!created.awaiting("ns", "api"), "the expired note is gone");
        assert!(created.unseen("ns", "other", t0).is_none());
    }

    #[test]
    fn recording_drops_expired_notes() {
        let created = Created::default();
        let t0 = Instant::now();
        created.record(&svc("u1"), t0);
        let mut other = svc("u2");
        other.metadata.name = Some("web".into());
        created.record(&other, t0 + TTL);
        assert!(!created.awaiting("ns", "api"));
        assert!(created.awaiting("ns", "web"));
    }
}
