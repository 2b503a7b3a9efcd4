//! What a watch stream sends, decided from snapshots: a pure planner that
//! the gRPC edge drives and encodes.
//!
//! The protocol a client can rely on:
//! - A snapshot is `Reset`, its items (revision 0: they are not resume
//!   points), then `Synced` with the snapshot's revision. A client that
//!   drops mid-snapshot has no resume point from it and starts over.
//! - Changes carry their revision; `Bookmark` moves the resume point on
//!   an idle stream.
//! - A filtered stream sends `Delete` only for keys it sent, including
//!   when one stops matching its filter.

use std::collections::BTreeSet;

use super::index::{Filter, Key, MicroserviceView, Snapshot};

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Forget every item and the resume point.
    Reset,
    /// One item of a snapshot.
    Item(MicroserviceView),
    /// The snapshot or catch-up is complete, as of this revision.
    Synced(u64),
    Upsert(u64, MicroserviceView),
    Delete(u64, Key),
    /// Nothing to send; this revision is a valid resume point.
    Bookmark(u64),
}

/// What one stream has told its client.
#[derive(Debug)]
pub struct Cursor {
    filter: Filter,
    /// The revision the client is at once it has read everything planned.
    revision: u64,
    /// The keys the client holds.
    sent: BTreeSet<Key>,
}

impl Cursor {
    pub fn new(filter: Filter) -> Self {
        Cursor {
            filter,
            revision: 0,
            sent: BTreeSet::new(),
        }
    }

    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// A full snapshot: the client forgets what it had.
    pub fn snapshot<'a>(&'a mut self, snap: &'a Snapshot) -> impl Iterator<Item = Event> + 'a {
        self.sent.clear();
        self.revision = snap.revision();
        let items = snap.list(&self.filter, None, usize::MAX).map(|v| {
            self.sent.insert((v.namespace.clone(), v.name.clone()));
            Event::Item(v)
        });
        std::iter::once(Event::Reset)
            .chain(items)
            .chain(std::iter::once(Event::Synced(snap.revision())))
    }

    /// A client resuming from a revision it had: what changed since, then
    /// `Synced`. The stream cannot know which keys the client held, so a
    /// changed key that does not match now is deleted either way.
    pub fn resume(&mut self, snap: &Snapshot, changes: &[(u64, Key)]) -> Vec<Event> {
        self.sent = snap.matching_keys(&self.filter).cloned().collect();
        let mut events: Vec<Event> = changes
            .iter()
            .filter(|(_, k)| self.filter.namespace_matches(k))
            .map(|(rev, k)| match snap.matching(k, &self.filter) {
                Some(v) => Event::Upsert(*rev, v),
                None => Event::Delete(*rev, k.clone()),
            })
            .collect();
        self.revision = snap.revision();
        events.push(Event::Synced(snap.revision()));
        events
    }

    /// The changes after the cursor, as this stream's client should see them.
    pub fn changes(&mut self, snap: &Snapshot, changes: &[(u64, Key)]) -> Vec<Event> {
        let events = changes
            .iter()
            .filter_map(|(rev, k)| match snap.matching(k, &self.filter) {
                Some(v) => {
                    self.sent.insert(k.clone());
                    Some(Event::Upsert(*rev, v))
                }
                None => self.sent.remove(k).then(|| Event::Delete(*rev, k.clone())),
            })
            .collect();
        self.revision = snap.revision();
        events
    }

    /// A heartbeat for an idle stream.
    pub fn bookmark(&self) -> Event {
        Event::Bookmark(self.revision)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::status::index::Index;
    use crate::status::selector::Selector;
    use crate::status::view::{Facts, Reach};

    fn key(name: &str) -> Key {
        ("ns".into(), name.into())
    }

    fn facts(team: &str) -> Facts {
        Facts {
            generation: 1,
            observed_generation: 1,
            image: "a:1".into(),
            labels: BTreeMap::from([("team".into(), team.into())]),
            ..Default::default()
        }
    }

    fn fleet(n: usize) -> Index {
        let mut ix = Index::default();
        for c in ["m1", "m2"] {
            ix.update_cluster(c, "file", |i| {
                i.reach = Reach::Reachable;
                i.synced = true;
            });
        }
        for i in 0..n {
            ix.upsert_microservice("m1", key(&format!("s{i:03}")), facts("pay"));
        }
        ix
    }

    fn names(events: &[Event]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                Event::Reset => "reset".into(),
                Event::Item(v) => format!("item {}", v.name),
                Event::Synced(_) => "synced".into(),
                Event::Upsert(_, v) => format!("upsert {}", v.name),
                Event::Delete(_, k) => format!("delete {}", k.1),
                Event::Bookmark(_) => "bookmark".into(),
            })
            .collect()
    }

    #[test]
    fn a_snapshot_is_framed_and_its_items_are_not_resume_points() {
        let ix = fleet(2);
        let snap = ix.snapshot();
        let mut c = Cursor::new(Filter::default());
        let events: Vec<Event> = c.snapshot(&snap).collect();
        assert_eq!(
            names(&events),
            ["reset", "item s000", "item s001", "synced"]
        );
        assert_eq!(events[3], Event::Synced(ix.revision()));
        assert_eq!(c.revision(), ix.revision());
        assert_eq!(c.bookmark(), Event::Bookmark(ix.revision()));
    }

    #[test]
    fn a_cluster_filtered_stream_hears_nothing_of_other_clusters() {
        let mut ix = fleet(1);
        let mut c = Cursor::new(Filter {
            cluster: Some("m1".into()),
            ..Default::default()
        });
        let _ = c.snapshot(&ix.snapshot()).count();
        let from = c.revision();
        ix.upsert_microservice("m2", key("only-m2"), facts("pay"));
        ix.delete_microservice("m2", &key("only-m2"));
        let changes = ix.changes_since(from).unwrap();
        assert!(c.changes(&ix.snapshot(), &changes).is_empty());
    }

    #[test]
    fn leaving_the_label_filter_is_a_delete_and_only_then() {
        let mut ix = fleet(1);
        let mut c = Cursor::new(Filter {
            selector: Selector::parse("team=pay").unwrap(),
            ..Default::default()
        });
        let _ = c.snapshot(&ix.snapshot()).count();
        let from = c.revision();
        ix.upsert_microservice("m1", key("web"), facts("web"));
        ix.upsert_microservice("m1", key("s000"), facts("web"));
        ix.delete_microservice("m1", &key("web"));
        let changes = ix.changes_since(from).unwrap();
        assert_eq!(names(&c.changes(&ix.snapshot(), &changes)), ["delete s000"]);
        // Back into the filter: an upsert, and its later deletion is sent.
        let from = c.revision();
        ix.upsert_microservice("m1", key("s000"), facts("pay"));
        let changes = ix.changes_since(from).unwrap();
        assert_eq!(names(&c.changes(&ix.snapshot(), &changes)), ["upsert s000"]);
        let from = c.revision();
        ix.delete_microservice("m1", &key("s000"));
        let changes = ix.changes_since(from).unwrap();
        assert_eq!(names(&c.changes(&ix.snapshot(), &changes)), ["delete s000"]);
        // Come and gone between two looks: the client never hears of it.
        let from = c.revision();
        ix.upsert_microservice("m1", key("brief"), facts("pay"));
        ix.delete_microservice("m1", &key("brief"));
        let changes = ix.changes_since(from).unwrap();
        assert!(c.changes(&ix.snapshot(), &changes).is_empty());
    }

    #[test]
    fn a_resume_sends_what_changed_then_synced() {
        let mut ix = fleet(3);
        let from = ix.revision();
        ix.delete_microservice("m1", &key("s001"));
        ix.upsert_microservice("m1", key("s002"), facts("web"));
        let mut c = Cursor::new(Filter::default());
        let changes = ix.changes_since(from).unwrap();
        let events = c.resume(&ix.snapshot(), &changes);
        assert_eq!(names(&events), ["delete s001", "upsert s002", "synced"]);
        // The stream now knows what the client holds.
        let from = c.revision();
        ix.delete_microservice("m1", &key("s000"));
        let changes = ix.changes_since(from).unwrap();
        assert_eq!(names(&c.changes(&ix.snapshot(), &changes)), ["delete s000"]);
    }
}
