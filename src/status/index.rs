//! The fleet-wide status index: every cluster's Microservices and their
//! Deployments' counts, with a revision per change so watchers can resume.
//! A plain data structure; the edges feed it under a lock and read it from
//! a [`Snapshot`], taken in O(1) under the lock and read outside it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::selector::Selector;
use super::view::{self, Aggregate, ClusterInfo, Entry, Facts, Replicas};

/// (namespace, name)
pub type Key = (String, String);

/// Deleted keys remembered for resuming watchers; older ones force a snapshot.
const TOMBSTONES: usize = 10_000;

#[derive(Debug, Clone, PartialEq)]
pub struct MicroserviceView {
    pub namespace: String,
    pub name: String,
    pub entries: Vec<Entry>,
    pub aggregate: Aggregate,
    pub revision: u64,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Filter {
    pub namespace: Option<String>,
    pub selector: Selector,
    pub cluster: Option<String>,
    /// The namespaces the caller may see; `None`: every one (#34).
    pub visible: Option<Arc<BTreeSet<String>>>,
}

impl Filter {
    pub fn namespace_matches(&self, key: &Key) -> bool {
        self.namespace.as_ref().is_none_or(|ns| *ns == key.0)
            && self.visible.as_ref().is_none_or(|v| v.contains(&key.0))
    }
}

type PerCluster<T> = Arc<BTreeMap<String, T>>;

/// The index's state at one revision. Clones share the maps; a writer
/// copies only what it changes (`Arc::make_mut`), so readers never hold
/// the lock while they build views, filter or encode.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    revision: u64,
    clusters: Arc<BTreeMap<String, ClusterInfo>>,
    objects: Arc<BTreeMap<Key, PerCluster<Facts>>>,
    replicas: Arc<BTreeMap<Key, PerCluster<Replicas>>>,
}

#[derive(Debug, Default)]
pub struct Index {
    state: Snapshot,
    /// Each key's latest change, by revision, and the reverse.
    log: BTreeMap<u64, Key>,
    changed_at: BTreeMap<Key, u64>,
    /// The part of `log` whose keys are gone, oldest first.
    tombstones: BTreeMap<u64, Key>,
    /// Resuming from before this revision needs a snapshot.
    compacted: u64,
    /// The registry has been read at least once.
    registry_read: bool,
    /// A fleet replica that has not yet read the live replicas: it owns
    /// nothing yet, so it could not take over a departing peer's clusters.
    peers_unknown: bool,
    /// Moves when the cluster set, or what a wait reads of a cluster
    /// (reach, synced, a failing feed), changes: such a change can move a
    /// verdict without touching any entry.
    cluster_changes: u64,
}

impl Index {
    pub fn revision(&self) -> u64 {
        self.state.revision
    }

    /// The current state, to read outside the lock.
    pub fn snapshot(&self) -> Snapshot {
        self.state.clone()
    }

    fn touch(&mut self, key: &Key) {
        self.state.revision += 1;
        let rev = self.state.revision;
        if let Some(old) = self.changed_at.insert(key.clone(), rev) {
            self.log.remove(&old);
            self.tombstones.remove(&old);
        }
        self.log.insert(rev, key.clone());
        if self.state.objects.contains_key(key) {
            return;
        }
        self.tombstones.insert(rev, key.clone());
        if self.tombstones.len() > TOMBSTONES
            && let Some((oldest, k)) = self.tombstones.pop_first()
        {
            self.log.remove(&oldest);
            self.changed_at.remove(&k);
            self.compacted = self.compacted.max(oldest);
        }
    }

    // ---- the cluster registry and each cluster's state

    pub fn registry_read(&mut self) {
        if !self.registry_read {
            self.cluster_changes += 1;
        }
        self.registry_read = true;
    }

    /// The revision of `key`'s latest change, if it is remembered.
    pub fn changed_at(&self, key: &Key) -> Option<u64> {
        self.changed_at.get(key).copied()
    }

    pub fn cluster_changes(&self) -> u64 {
        self.cluster_changes
    }

    /// The registry has been read at least once: the cluster set is known.
    pub fn registry_was_read(&self) -> bool {
        self.registry_read
    }

    /// Ready to serve: the registry was read, every cluster settled, and
    /// (a fleet replica) the live replicas are known.
    pub fn ready(&self) -> bool {
        self.registry_read
            && !self.peers_unknown
            && self.state.clusters.values().all(ClusterInfo::settled)
    }

    /// A fleet replica: not ready until `peers_known`.
    pub fn await_peers(&mut self) {
        self.peers_unknown = true;
    }

    /// The live replicas were read: this replica takes its share of the
    /// assignment, so a rolling update may now stop the next old one.
    pub fn peers_known(&mut self) {
        self.peers_unknown = false;
    }

    pub fn clusters(&self) -> &BTreeMap<String, ClusterInfo> {
        &self.state.clusters
    }

    fn keys_in(&self, cluster: &str) -> Vec<Key> {
        self.state
            .objects
            .iter()
            .filter(|(_, by)| by.contains_key(cluster))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Changes a cluster's info; its entries change revision when what
    /// they report (reachability, a failing feed, a listing) changes.
    pub fn update_cluster(&mut self, name: &str, source: &str, f: impl FnOnce(&mut ClusterInfo)) {
        let clusters = Arc::make_mut(&mut self.state.clusters);
        let new = !clusters.contains_key(name);
        let info = clusters
            .entry(name.to_string())
            .or_insert_with(|| ClusterInfo::new(source));
        // The error's wording may change on every retry; only its coming and
        // going changes what the entries say.
        let before = (info.reach, info.feed_error.is_some(), info.synced);
        f(info);
        let after = (info.reach, info.feed_error.is_some(), info.synced);
        if new || after != before {
            self.cluster_changes += 1;
        }
        if after != before {
            for key in self.keys_in(name) {
                self.touch(&key);
            }
        }
    }

    /// Forgets clusters no longer registered, and everything they held.
    pub fn retain_clusters(&mut self, registered: &BTreeSet<String>) {
        let gone: Vec<String> = self
            .state
            .clusters
            .keys()
            .filter(|c| !registered.contains(*c))
            .cloned()
            .collect();
        for cluster in gone {
            self.cluster_changes += 1;
            Arc::make_mut(&mut self.state.clusters).remove(&cluster);
            self.replace_microservices(&cluster, Vec::new());
            self.replace_replicas(&cluster, Vec::new());
        }
    }

    // ---- Microservices and Deployments, per cluster

    pub fn upsert_microservice(&mut self, cluster: &str, key: Key, facts: Facts) {
        let same = self
            .state
            .objects
            .get(&key)
            .and_then(|by| by.get(cluster))
            .is_some_and(|f| *f == facts);
        if same {
            return;
        }
        let objects = Arc::make_mut(&mut self.state.objects);
        Arc::make_mut(objects.entry(key.clone()).or_default()).insert(cluster.to_string(), facts);
        self.touch(&key);
    }

    pub fn delete_microservice(&mut self, cluster: &str, key: &Key) {
        if !self
            .state
            .objects
            .get(key)
            .is_some_and(|by| by.contains_key(cluster))
        {
            return;
        }
        let objects = Arc::make_mut(&mut self.state.objects);
        if let Some(by) = objects.get_mut(key) {
            let by = Arc::make_mut(by);
            by.remove(cluster);
            if by.is_empty() {
                objects.remove(key);
            }
        }
        self.touch(key);
    }

    /// After a (re)list: the cluster holds exactly `items`.
    pub fn replace_microservices(&mut self, cluster: &str, items: Vec<(Key, Facts)>) {
        let keep: BTreeSet<Key> = items.iter().map(|(k, _)| k.clone()).collect();
        for key in self.keys_in(cluster) {
            if !keep.contains(&key) {
                self.delete_microservice(cluster, &key);
            }
        }
        for (key, facts) in items {
            self.upsert_microservice(cluster, key, facts);
        }
    }

    fn has_microservice(&self, cluster: &str, key: &Key) -> bool {
        self.state
            .objects
            .get(key)
            .is_some_and(|o| o.contains_key(cluster))
    }

    pub fn upsert_replicas(&mut self, cluster: &str, key: Key, counts: Replicas) {
        let same = self
            .state
            .replicas
            .get(&key)
            .and_then(|by| by.get(cluster))
            .is_some_and(|c| *c == counts);
        if same {
            return;
        }
        let replicas = Arc::make_mut(&mut self.state.replicas);
        Arc::make_mut(replicas.entry(key.clone()).or_default()).insert(cluster.to_string(), counts);
        if self.has_microservice(cluster, &key) {
            self.touch(&key);
        }
    }

    pub fn delete_replicas(&mut self, cluster: &str, key: &Key) {
        if !self
            .state
            .replicas
            .get(key)
            .is_some_and(|by| by.contains_key(cluster))
        {
            return;
        }
        let replicas = Arc::make_mut(&mut self.state.replicas);
        if let Some(by) = replicas.get_mut(key) {
            let by = Arc::make_mut(by);
            by.remove(cluster);
            if by.is_empty() {
                replicas.remove(key);
            }
        }
        if self.has_microservice(cluster, key) {
            self.touch(key);
        }
    }

    pub fn replace_replicas(&mut self, cluster: &str, items: Vec<(Key, Replicas)>) {
        let keep: BTreeSet<Key> = items.iter().map(|(k, _)| k.clone()).collect();
        let stale: Vec<Key> = self
            .state
            .replicas
            .iter()
            .filter(|(k, by)| by.contains_key(cluster) && !keep.contains(*k))
            .map(|(k, _)| k.clone())
            .collect();
        for key in stale {
            self.delete_replicas(cluster, &key);
        }
        for (key, counts) in items {
            self.upsert_replicas(cluster, key, counts);
        }
    }

    pub fn microservices_in(&self, cluster: &str) -> usize {
        self.state.microservices_in(cluster)
    }

    // ---- queries

    pub fn view(&self, key: &Key, cluster: Option<&str>) -> Option<MicroserviceView> {
        self.state.view(key, cluster)
    }

    pub fn list(
        &self,
        filter: &Filter,
        after: Option<&Key>,
        limit: usize,
    ) -> Vec<MicroserviceView> {
        self.state.list(filter, after, limit).collect()
    }

    /// The keys changed after `revision`, oldest first, each with its latest
    /// revision (a key changed twice appears once). `None` when that
    /// revision is too old to resume from, or from the future.
    pub fn changes_since(&self, revision: u64) -> Option<Vec<(u64, Key)>> {
        if revision < self.compacted || revision > self.state.revision {
            return None;
        }
        Some(
            self.log
                .range(revision + 1..)
                .map(|(r, k)| (*r, k.clone()))
                .collect(),
        )
    }
}

impl Snapshot {
    /// This snapshot with maps of its own. A reader that holds a snapshot
    /// across an await (a stream sending it lazily to a slow client) pays
    /// the copy itself, outside the hub's lock: holding shared maps made
    /// every index write meanwhile copy the whole map under the lock.
    pub fn detached(self) -> Snapshot {
        fn own<T: Clone>(shared: Arc<T>) -> Arc<T> {
            Arc::new(Arc::unwrap_or_clone(shared))
        }
        Snapshot {
            revision: self.revision,
            clusters: own(self.clusters),
            objects: own(self.objects),
            replicas: own(self.replicas),
        }
    }

    pub fn revision(&self) -> u64 {
        self.revision
    }

    pub fn clusters(&self) -> &BTreeMap<String, ClusterInfo> {
        &self.clusters
    }

    pub fn microservices_in(&self, cluster: &str) -> usize {
        self.objects
            .values()
            .filter(|by| by.contains_key(cluster))
            .count()
    }

    /// The fleet view of one Microservice, limited to one cluster if asked.
    /// `None` when no (selected) cluster has it.
    pub fn view(&self, key: &Key, cluster: Option<&str>) -> Option<MicroserviceView> {
        let by = self.objects.get(key)?;
        let entries: Vec<Entry> = by
            .iter()
            .filter(|(c, _)| cluster.is_none_or(|only| only == c.as_str()))
            .map(|(c, facts)| {
                let counts = self.replicas.get(key).and_then(|r| r.get(c)).copied();
                view::entry(c, facts, counts, self.clusters.get(c))
            })
            .collect();
        if entries.is_empty() {
            return None;
        }
        Some(MicroserviceView {
            namespace: key.0.clone(),
            name: key.1.clone(),
            aggregate: view::aggregate(&entries),
            entries,
            revision: self.revision,
        })
    }

    /// Whether the key matches `filter`, without building its view.
    pub fn matches(&self, key: &Key, filter: &Filter) -> bool {
        filter.namespace_matches(key)
            && self.objects.get(key).is_some_and(|by| {
                by.iter().any(|(c, f)| {
                    filter.cluster.as_ref().is_none_or(|only| only == c)
                        && filter.selector.matches(&f.labels)
                })
            })
    }

    /// The key's view under `filter`, or `None` when it does not match.
    pub fn matching(&self, key: &Key, filter: &Filter) -> Option<MicroserviceView> {
        // Checked before building the view: most keys fail here.
        if !self.matches(key, filter) {
            return None;
        }
        self.view(key, filter.cluster.as_deref())
    }

    /// The keys matching `filter`, in order, without their views.
    pub fn matching_keys<'a>(&'a self, filter: &'a Filter) -> impl Iterator<Item = &'a Key> + 'a {
        self.objects.keys().filter(move |k| self.matches(k, filter))
    }

    /// Matching views in (namespace, name) order, starting after `after`.
    pub fn list<'a>(
        &'a self,
        filter: &'a Filter,
        after: Option<&Key>,
        limit: usize,
    ) -> impl Iterator<Item = MicroserviceView> + 'a {
        let range = match after {
            Some(k) => self.objects.range((
                std::ops::Bound::Excluded(k.clone()),
                std::ops::Bound::Unbounded,
            )),
            None => self.objects.range::<Key, _>(..),
        };
        range
            .filter_map(move |(k, _)| self.matching(k, filter))
            .take(limit)
    }

    /// Every namespace that holds a Microservice somewhere, each once.
    pub fn namespaces(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for (ns, _) in self.objects.keys() {
            // Keys are ordered, so a namespace's keys come together.
            if out.last() != Some(ns) {
                out.insert(ns.clone());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::view::Reach;

    #[test]
    fn a_filter_shows_only_the_namespaces_it_may() {
        let mut ix = Index::default();
        for ns in ["team-a", "team-b", "team-c"] {
            ix.upsert_microservice("m1", (ns.into(), "web".into()), facts(1, "x"));
        }
        assert_eq!(
            ix.snapshot().namespaces().into_iter().collect::<Vec<_>>(),
            ["team-a", "team-b", "team-c"]
        );
        let only_a = Filter {
            visible: Some(Arc::new(BTreeSet::from(["team-a".to_string()]))),
            ..Default::default()
        };
        let seen: Vec<String> = ix
            .list(&only_a, None, 10)
            .into_iter()
            .map(|v| v.namespace)
            .collect();
        assert_eq!(seen, ["team-a"]);
        let none = Filter {
            visible: Some(Arc::new(BTreeSet::new())),
            ..Default::default()
        };
        assert!(ix.list(&none, None, 10).is_empty());
    }

    fn key(name: &str) -> Key {
        ("ns".into(), name.into())
    }

    fn facts(generation: i64, team: &str) -> Facts {
        Facts {
            generation,
            observed_generation: generation,
            image: "a:1".into(),
            labels: BTreeMap::from([("team".into(), team.into())]),
            ..Default::default()
        }
    }

    fn reachable(index: &mut Index, cluster: &str) {
        index.update_cluster(cluster, "file x", |c| {
            c.reach = Reach::Reachable;
            c.synced = true;
        });
    }

    #[test]
    fn a_detached_snapshot_shares_no_map_with_the_index() {
        let mut ix = Index::default();
        ix.upsert_microservice("m1", key("a"), facts(1, "pay"));
        let held = ix.snapshot().detached();
        // The index's maps are its own again: its next write copies none.
        assert_eq!(Arc::strong_count(&ix.state.objects), 1);
        assert_eq!(Arc::strong_count(&ix.state.replicas), 1);
        ix.upsert_microservice("m1", key("b"), facts(1, "pay"));
        assert!(held.view(&key("a"), None).is_some());
        assert!(
            held.view(&key("b"), None).is_none(),
            "a snapshot stays at its revision"
        );
    }

    #[test]
    fn one_view_per_microservice_with_an_entry_per_cluster() {
        let mut ix = Index::default();
        reachable(&mut ix, "m1");
        reachable(&mut ix, "m2");
        ix.upsert_microservice("m1", key("a"), facts(1, "pay"));
        ix.upsert_microservice("m2", key("a"), facts(1, "pay"));
        ix.upsert_replicas(
            "m2",
            key("a"),
            Replicas {
                desired: 2,
                updated: 2,
                ready: 2,
                available: 2,
            },
        );
        let v = ix.view(&key("a"), None).unwrap();
        let clusters: Vec<&str> = v.entries.iter().map(|e| e.cluster.as_str()).collect();
        assert_eq!(clusters, ["m1", "m2"]);
        assert_eq!(v.entries[1].replicas.unwrap().available, 2);
        assert_eq!(ix.view(&key("a"), Some("m2")).unwrap().entries.len(), 1);
        assert!(ix.view(&key("a"), Some("m3")).is_none());
        assert!(ix.view(&key("b"), None).is_none());
    }

    #[test]
    fn unchanged_facts_do_not_move_the_revision() {
        let mut ix = Index::default();
        ix.upsert_microservice("m1", key("a"), facts(1, "pay"));
        let r = ix.revision();
        ix.upsert_microservice("m1", key("a"), facts(1, "pay"));
        ix.replace_microservices("m1", vec![(key("a"), facts(1, "pay"))]);
        assert_eq!(ix.revision(), r);
        // Counts for a Deployment whose Microservice is unknown change nothing visible.
        ix.upsert_replicas("m1", key("zzz"), Replicas::default());
        assert_eq!(ix.revision(), r);
    }

    #[test]
    fn a_relist_removes_what_is_gone_and_watchers_resume_from_a_revision() {
        let mut ix = Index::default();
        reachable(&mut ix, "m1");
        ix.upsert_microservice("m1", key("a"), facts(1, "pay"));
        ix.upsert_microservice("m1", key("b"), facts(1, "pay"));
        let seen = ix.revision();
        ix.replace_microservices("m1", vec![(key("a"), facts(2, "pay"))]);
        let all = Filter::default();
        let snap = ix.snapshot();
        let changes = ix.changes_since(seen).unwrap();
        let summary: Vec<(String, bool)> = changes
            .iter()
            .map(|(_, k)| (k.1.clone(), snap.matching(k, &all).is_some()))
            .collect();
        // b was deleted first, then a changed.
        assert_eq!(summary, [("b".into(), false), ("a".into(), true)]);
        assert!(changes.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(ix.changes_since(ix.revision()).unwrap().is_empty());
        assert!(ix.changes_since(ix.revision() + 1).is_none());
    }

    #[test]
    fn an_unreachable_cluster_turns_its_entries_unknown_as_a_change() {
        let mut ix = Index::default();
        reachable(&mut ix, "m1");
        ix.upsert_microservice("m1", key("a"), facts(1, "pay"));
        let seen = ix.revision();
        ix.update_cluster("m1", "file x", |c| c.reach = Reach::Unreachable);
        let changes = ix.changes_since(seen).unwrap();
        let v = ix.view(&changes[0].1, None).unwrap();
        assert_eq!(v.entries[0].state, view::EntryState::Unknown);
        // Holder changes alone are not entry changes.
        let seen = ix.revision();
        ix.update_cluster("m1", "file x", |c| c.holder = Some("r2".into()));
        assert_eq!(ix.revision(), seen);
    }

    #[test]
    fn lists_filter_by_namespace_selector_and_cluster_and_page_in_order() {
        let mut ix = Index::default();
        for (i, team) in ["pay", "web", "pay", "pay"].iter().enumerate() {
            ix.upsert_microservice("m1", key(&format!("s{i}")), facts(1, team));
        }
        ix.upsert_microservice("m2", ("other".into(), "x".into()), facts(1, "pay"));
        let pay = Filter {
            selector: Selector::parse("team=pay").unwrap(),
            ..Default::default()
        };
        let names = |v: Vec<MicroserviceView>| v.into_iter().map(|v| v.name).collect::<Vec<_>>();
        assert_eq!(names(ix.list(&pay, None, 10)), ["s0", "s2", "s3", "x"]);
        let page1 = ix.list(&pay, None, 2);
        assert_eq!(names(page1.clone()), ["s0", "s2"]);
        let last = (page1[1].namespace.clone(), page1[1].name.clone());
        assert_eq!(names(ix.list(&pay, Some(&last), 2)), ["s3", "x"]);
        let in_ns = Filter {
            namespace: Some("other".into()),
            ..Default::default()
        };
        assert_eq!(names(ix.list(&in_ns, None, 10)), ["x"]);
        let in_m2 = Filter {
            cluster: Some("m2".into()),
            ..Default::default()
        };
        assert_eq!(names(ix.list(&in_m2, None, 10)), ["x"]);
    }

    #[test]
    fn removing_a_cluster_forgets_its_entries() {
        let mut ix = Index::default();
        reachable(&mut ix, "m1");
        reachable(&mut ix, "m2");
        ix.upsert_microservice("m1", key("a"), facts(1, "pay"));
        ix.upsert_microservice("m2", key("a"), facts(1, "pay"));
        ix.retain_clusters(&BTreeSet::from(["m2".to_string()]));
        assert_eq!(ix.view(&key("a"), None).unwrap().entries.len(), 1);
        assert_eq!(ix.microservices_in("m1"), 0);
        assert!(!ix.clusters().contains_key("m1"));
    }

    #[test]
    fn ready_after_the_registry_is_read_and_every_cluster_settles() {
        let mut ix = Index::default();
        assert!(!ix.ready());
        ix.registry_read();
        assert!(ix.ready());
        ix.update_cluster("m1", "file x", |_| {});
        assert!(!ix.ready());
        reachable(&mut ix, "m1");
        assert!(ix.ready());
    }

    /// A fleet replica is ready only once it knows the live replicas: a
    /// rolling update that moved on before (Ready 0.5 s after start, the
    /// live set read 2 s after) left a member unled for 1.5 s.
    #[test]
    fn a_fleet_replica_is_ready_once_it_knows_its_peers() {
        let mut ix = Index::default();
        ix.await_peers();
        ix.registry_read();
        assert!(!ix.ready());
        ix.peers_known();
        assert!(ix.ready());
    }
}
