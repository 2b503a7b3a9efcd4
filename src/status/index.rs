//! The fleet-wide status index: every cluster's Microservices and their
//! Deployments' counts, with a revision per change so watchers can resume.
//! A plain data structure; the edges feed it and read it under a lock.

use std::collections::{BTreeMap, BTreeSet};

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

#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub namespace: Option<String>,
    pub selector: Selector,
    pub cluster: Option<String>,
}

/// A change for a watcher: the key's view now, or `None` if it is gone
/// (or no longer matches).
pub type Change = (u64, Key, Option<MicroserviceView>);

#[derive(Debug, Default)]
pub struct Index {
    revision: u64,
    clusters: BTreeMap<String, ClusterInfo>,
    objects: BTreeMap<Key, BTreeMap<String, Facts>>,
    replicas: BTreeMap<Key, BTreeMap<String, Replicas>>,
    changed_at: BTreeMap<Key, u64>,
    tombstones: BTreeMap<Key, u64>,
    /// Resuming from before this revision needs a snapshot.
    compacted: u64,
    /// The registry has been read at least once.
    registry_read: bool,
}

impl Index {
    pub fn revision(&self) -> u64 {
        self.revision
    }

    fn touch(&mut self, key: &Key) {
        self.revision += 1;
        if self.objects.contains_key(key) {
            self.tombstones.remove(key);
            self.changed_at.insert(key.clone(), self.revision);
        } else {
            self.changed_at.remove(key);
            self.tombstones.insert(key.clone(), self.revision);
            if self.tombstones.len() > TOMBSTONES
                && let Some((oldest, rev)) = self
                    .tombstones
                    .iter()
                    .min_by_key(|(_, r)| **r)
                    .map(|(k, r)| (k.clone(), *r))
            {
                self.tombstones.remove(&oldest);
                self.compacted = self.compacted.max(rev);
            }
        }
    }

    // ---- the cluster registry and each cluster's state

    pub fn registry_read(&mut self) {
        self.registry_read = true;
    }

    /// Ready to serve: the registry was read and every cluster settled.
    pub fn ready(&self) -> bool {
        self.registry_read && self.clusters.values().all(ClusterInfo::settled)
    }

    pub fn clusters(&self) -> &BTreeMap<String, ClusterInfo> {
        &self.clusters
    }

    fn keys_in(&self, cluster: &str) -> Vec<Key> {
        self.objects
            .iter()
            .filter(|(_, by)| by.contains_key(cluster))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Changes a cluster's info; its entries change revision when what
    /// they report (reachability) changes.
    pub fn update_cluster(&mut self, name: &str, source: &str, f: impl FnOnce(&mut ClusterInfo)) {
        let info = self
            .clusters
            .entry(name.to_string())
            .or_insert_with(|| ClusterInfo::new(source));
        let before = info.reach;
        f(info);
        if info.reach != before {
            for key in self.keys_in(name) {
                self.touch(&key);
            }
        }
    }

    /// Forgets clusters no longer registered, and everything they held.
    pub fn retain_clusters(&mut self, registered: &BTreeSet<String>) {
        let gone: Vec<String> = self
            .clusters
            .keys()
            .filter(|c| !registered.contains(*c))
            .cloned()
            .collect();
        for cluster in gone {
            self.clusters.remove(&cluster);
            self.replace_microservices(&cluster, Vec::new());
            self.replace_replicas(&cluster, Vec::new());
        }
    }

    // ---- Microservices and Deployments, per cluster

    pub fn upsert_microservice(&mut self, cluster: &str, key: Key, facts: Facts) {
        let by = self.objects.entry(key.clone()).or_default();
        if by.get(cluster) != Some(&facts) {
            by.insert(cluster.to_string(), facts);
            self.touch(&key);
        }
    }

    pub fn delete_microservice(&mut self, cluster: &str, key: &Key) {
        let Some(by) = self.objects.get_mut(key) else {
            return;
        };
        if by.remove(cluster).is_some() {
            if by.is_empty() {
                self.objects.remove(key);
            }
            self.touch(key);
        }
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

    pub fn upsert_replicas(&mut self, cluster: &str, key: Key, counts: Replicas) {
        let by = self.replicas.entry(key.clone()).or_default();
        if by.get(cluster) != Some(&counts) {
            by.insert(cluster.to_string(), counts);
            if self
                .objects
                .get(&key)
                .is_some_and(|o| o.contains_key(cluster))
            {
                self.touch(&key);
            }
        }
    }

    pub fn delete_replicas(&mut self, cluster: &str, key: &Key) {
        if let Some(by) = self.replicas.get_mut(key)
            && by.remove(cluster).is_some()
        {
            if by.is_empty() {
                self.replicas.remove(key);
            }
            if self
                .objects
                .get(key)
                .is_some_and(|o| o.contains_key(cluster))
            {
                self.touch(key);
            }
        }
    }

    pub fn replace_replicas(&mut self, cluster: &str, items: Vec<(Key, Replicas)>) {
        let keep: BTreeSet<Key> = items.iter().map(|(k, _)| k.clone()).collect();
        let stale: Vec<Key> = self
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
        self.objects
            .values()
            .filter(|by| by.contains_key(cluster))
            .count()
    }

    // ---- queries

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

    fn matches(&self, key: &Key, filter: &Filter) -> Option<MicroserviceView> {
        if filter.namespace.as_ref().is_some_and(|ns| *ns != key.0) {
            return None;
        }
        let v = self.view(key, filter.cluster.as_deref())?;
        v.entries
            .iter()
            .any(|e| filter.selector.matches(&e.facts.labels))
            .then_some(v)
    }

    /// Matching views in (namespace, name) order, starting after `after`.
    pub fn list(
        &self,
        filter: &Filter,
        after: Option<&Key>,
        limit: usize,
    ) -> Vec<MicroserviceView> {
        let range = match after {
            Some(k) => self.objects.range((
                std::ops::Bound::Excluded(k.clone()),
                std::ops::Bound::Unbounded,
            )),
            None => self.objects.range::<Key, _>(..),
        };
        range
            .filter_map(|(k, _)| self.matches(k, filter))
            .take(limit)
            .collect()
    }

    /// Every change after `revision`, oldest first, as views under `filter`
    /// (other namespaces are left out; a key that stopped matching is `None`).
    /// `None` when that revision is too old to resume from.
    pub fn changes_since(&self, revision: u64, filter: &Filter) -> Option<Vec<Change>> {
        if revision < self.compacted || revision > self.revision {
            return None;
        }
        let mut changed: Vec<(u64, &Key)> = self
            .changed_at
            .iter()
            .chain(self.tombstones.iter())
            .filter(|(k, r)| {
                **r > revision && filter.namespace.as_ref().is_none_or(|ns| *ns == k.0)
            })
            .map(|(k, r)| (*r, k))
            .collect();
        changed.sort();
        Some(
            changed
                .into_iter()
                .map(|(r, k)| (r, k.clone(), self.matches(k, filter)))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::view::Reach;

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
        let changes = ix.changes_since(seen, &all).unwrap();
        let summary: Vec<(String, bool)> = changes
            .iter()
            .map(|(_, k, v)| (k.1.clone(), v.is_some()))
            .collect();
        // b was deleted first, then a changed.
        assert_eq!(summary, [("b".into(), false), ("a".into(), true)]);
        assert!(changes.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(ix.changes_since(ix.revision(), &all).unwrap().is_empty());
        assert!(ix.changes_since(ix.revision() + 1, &all).is_none());
    }

    #[test]
    fn an_unreachable_cluster_turns_its_entries_unknown_as_a_change() {
        let mut ix = Index::default();
        reachable(&mut ix, "m1");
        ix.upsert_microservice("m1", key("a"), facts(1, "pay"));
        let seen = ix.revision();
        ix.update_cluster("m1", "file x", |c| c.reach = Reach::Unreachable);
        let changes = ix.changes_since(seen, &Filter::default()).unwrap();
        let v = changes[0].2.as_ref().unwrap();
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
}
