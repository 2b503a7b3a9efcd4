//! Children this controller created or updated that its watches may not
//! show yet. A reconcile woken by the Deployment's first events can run
//! before the Service watch delivers the Service created a moment earlier;
//! without this note it would find the name free, create again and meet a
//! 409. Likewise after an update: a cache still holding the object from
//! before it (same uid, a lower generation) is stale, never "in sync".
//! Without this, a quick A→B→A change found the cached A template in sync
//! and took the old A rollout's "complete" for the new generation's.
//!
//! A note lasts until either watch shows the object it names (by uid: an
//! event for an older object of that name does not count) at the noted
//! generation or later, or, for an object no watch shows, until `TTL`
//! passes, so a child deleted right after its create is still created again.

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

    /// Notes the object a create or an update returned.
    pub fn record(&self, obj: &K, now: Instant) {
        let mut notes = self.notes();
        // Expired notes go here, so the map never outgrows one TTL of creates.
        notes.retain(|_, (_, at)| now.duration_since(*at) < TTL);
        let mut kept = obj.clone();
        crate::watching::strip(&mut kept);
        notes.insert(ObjectRef::from_obj(obj), (kept, now));
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

    /// Our write, when `cached` is the same object at a lower generation:
    /// the cache has not caught up with it. Objects without a generation
    /// (a Service) cannot be told behind, and are taken as they are.
    pub fn newer_than(&self, cached: &K) -> Option<K> {
        let cached_generation = cached.meta().generation?;
        let key = ObjectRef::from_obj(cached);
        let notes = self.notes();
        let (ours, _) = notes.get(&key)?;
        let same = ours.meta().uid.is_some() && ours.meta().uid == cached.meta().uid;
        (same
            && ours
                .meta()
                .generation
                .is_some_and(|g| g > cached_generation))
        .then(|| ours.clone())
    }

    /// A watch showed `name` with `uid` at `generation`: if that is our
    /// object, at our write's generation or later, the caches know it now
    /// and the note has served.
    pub fn seen(&self, ns: &str, name: &str, uid: Option<&str>, generation: Option<i64>) {
        let key = ObjectRef::new(name).within(ns);
        let mut notes = self.notes();
        if notes.get(&key).is_some_and(|(obj, _)| {
            obj.meta().uid.as_deref() == uid
                && generation.unwrap_or(i64::MAX) >= obj.meta().generation.unwrap_or(0)
        }) {
            notes.remove(&key);
        }
    }

    /// How many notes are kept: for tests of bounded memory.
    pub fn tracked(&self) -> usize {
        self.notes().len()
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
            self.seen(ns, name, uid, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::Deployment;
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
        created.seen("ns", "api", Some("u0"), None);
        assert_eq!(uid(created.unseen("ns", "api", t0)), Some("u1".into()));
        created.seen("ns", "api", Some("u1"), None);
        assert_eq!(uid(created.unseen("ns", "api", t0)), None);
        assert!(!created.awaiting("ns", "api"));
    }

    fn deployment(uid: &str, generation: i64) -> Deployment {
        let mut d = Deployment::default();
        d.metadata.name = Some("api".into());
        d.metadata.namespace = Some("ns".into());
        d.metadata.uid = Some(uid.into());
        d.metadata.generation = Some(generation);
        d
    }

    #[test]
    fn a_cache_behind_our_update_is_stale_until_it_shows_our_generation() {
        let ours = Created::default();
        let t0 = Instant::now();
        ours.record(&deployment("u1", 8), t0);
        let generation = |d: Option<Deployment>| d.and_then(|d| d.metadata.generation);
        // The cache still holds generation 7 of the same object.
        assert_eq!(generation(ours.newer_than(&deployment("u1", 7))), Some(8));
        ours.seen("ns", "api", Some("u1"), Some(7));
        assert_eq!(generation(ours.newer_than(&deployment("u1", 7))), Some(8));
        // Another object of that name says nothing about ours.
        assert_eq!(ours.newer_than(&deployment("u2", 1)), None);
        // The cache reached our generation (or passed it): it is the truth.
        assert_eq!(ours.newer_than(&deployment("u1", 8)), None);
        ours.seen("ns", "api", Some("u1"), Some(9));
        assert_eq!(ours.tracked(), 0);
        // A Service has no generation: never behind.
        let svcs = Created::default();
        svcs.record(&svc("s1"), t0);
        assert!(svcs.newer_than(&svc("s1")).is_none());
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
    fn a_note_keeps_the_created_child_without_its_managed_fields() {
        let created = Created::default();
        let t0 = Instant::now();
        let mut child = svc("u1");
        child.metadata.managed_fields = Some(vec![Default::default()]);
        created.record(&child, t0);
        child.metadata.managed_fields = None;
        assert_eq!(created.unseen("ns", "api", t0), Some(child));
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
