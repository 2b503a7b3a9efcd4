//! The status this controller last wrote, per Microservice. A reconcile
//! queued during a status write may run on the cached copy from before the
//! write; comparing against that copy would find "nothing to write" where
//! the object now says something else. While the cache still holds a
//! version our writes replaced, our last write is the fresher copy.
//!
//! Writes chain: a write based on our own last write (the cache still
//! lagging) replaces that write's version, so the note keeps every version
//! it superseded. With only the last pair, a cache two writes behind would
//! be taken for the truth.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::runtime::reflector::ObjectRef;

use crate::crd::Microservice;

/// The longest chain kept: a cache this many of our writes behind is
/// treated as having moved on (the next reconcile re-reads it anyway).
const CHAIN: usize = 16;

/// Our last write, and the versions our writes replaced since the cache
/// last showed one of them.
#[derive(Debug, Clone)]
pub struct Note {
    superseded: Vec<String>,
    after: Microservice,
}

#[derive(Debug, Default)]
pub struct Written(Mutex<HashMap<ObjectRef<Microservice>, Note>>);

/// Whether our write is fresher than `cached`: the cache holds a version
/// one of our writes replaced, of the same object.
pub fn fresher(cached: &Microservice, note: &Note) -> bool {
    cached
        .metadata
        .resource_version
        .as_ref()
        .is_some_and(|rv| note.superseded.contains(rv))
        && cached.metadata.uid == note.after.metadata.uid
}

impl Written {
    fn notes(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectRef<Microservice>, Note>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Our later write, when it is fresher than the cache; `None` when the
    /// cache is the truth (the common case costs no copy).
    pub fn fresher_than(&self, cached: &Microservice) -> Option<Microservice> {
        let key = ObjectRef::from_obj(cached);
        let mut map = self.notes();
        match map.get(&key).filter(|n| fresher(cached, n)) {
            Some(n) => Some(n.after.clone()),
            None => {
                // The cache caught up, or moved on: the note has served.
                map.remove(&key);
                None
            }
        }
    }

    /// The Microservice is gone: nothing to remember for it.
    pub fn forget(&self, gone: &ObjectRef<Microservice>) {
        self.notes().remove(gone);
    }

    /// Keeps the notes of the objects `keep` names only.
    pub fn retain(&self, keep: impl Fn(&ObjectRef<Microservice>) -> bool) {
        self.notes().retain(|k, _| keep(k));
    }

    /// Notes that `result` was written over `replaced`. When `replaced` is
    /// our own last write, the chain grows: the cache may still show any
    /// version before it.
    pub fn record(&self, replaced: Option<String>, mut result: Microservice) {
        let Some(replaced) = replaced else { return };
        crate::watching::strip(&mut result);
        let key = ObjectRef::from_obj(&result);
        let mut map = self.notes();
        let mut superseded = match map.remove(&key) {
            Some(n)
                if n.after.metadata.resource_version.as_ref() == Some(&replaced)
                    && n.after.metadata.uid == result.metadata.uid =>
            {
                n.superseded
            }
            _ => Vec::new(),
        };
        superseded.push(replaced);
        if superseded.len() > CHAIN {
            superseded.remove(0);
        }
        map.insert(
            key,
            Note {
                superseded,
                after: result,
            },
        );
    }

    /// How many Microservices have a note: for tests of bounded memory.
    pub fn tracked(&self) -> usize {
        self.notes().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::fixtures::ms;

    fn at(rv: &str) -> Microservice {
        let mut m = ms("api").build();
        m.metadata.resource_version = Some(rv.into());
        m
    }

    #[test]
    fn our_write_wins_until_the_cache_moves_past_what_it_replaced() {
        let written = Written::default();
        let mut after = at("8");
        after.status = Some(Default::default());
        written.record(Some("7".into()), after.clone());
        let rv =
            |m: Option<Microservice>| m.map(|m| (m.metadata.resource_version, m.status.is_some()));
        // The cache still holds version 7: conclude against our write.
        assert_eq!(
            rv(written.fresher_than(&at("7"))),
            Some((Some("8".into()), true))
        );
        // The cache reached 9 (or anything else): it is the truth again.
        assert_eq!(rv(written.fresher_than(&at("9"))), None);
        assert_eq!(rv(written.fresher_than(&at("7"))), None, "the note is gone");
    }

    #[test]
    fn a_note_keeps_the_written_object_without_its_managed_fields() {
        let written = Written::default();
        let mut after = at("8");
        after.metadata.managed_fields = Some(vec![Default::default()]);
        after.status = Some(Default::default());
        written.record(Some("7".into()), after.clone());
        let kept = written.fresher_than(&at("7")).expect("the note");
        after.metadata.managed_fields = None;
        let json = |m: &Microservice| serde_json::to_value(m).expect("json");
        assert_eq!(json(&kept), json(&after));
    }

    #[test]
    fn two_of_our_writes_behind_the_cache_is_still_stale() {
        let written = Written::default();
        written.record(Some("7".into()), at("8"));
        // The second write was based on the first (the cache still at 7).
        written.record(Some("8".into()), at("9"));
        let rv = |m: Option<Microservice>| m.and_then(|m| m.metadata.resource_version);
        assert_eq!(rv(written.fresher_than(&at("7"))), Some("9".into()));
        assert_eq!(rv(written.fresher_than(&at("8"))), Some("9".into()));
        // The cache shows our last write: the note has served.
        assert_eq!(rv(written.fresher_than(&at("9"))), None);
        assert_eq!(rv(written.fresher_than(&at("7"))), None, "the note is gone");
        assert_eq!(written.tracked(), 0);
    }

    #[test]
    fn a_write_over_another_version_starts_a_new_chain() {
        let written = Written::default();
        written.record(Some("7".into()), at("8"));
        // Someone else wrote 10; we wrote over it.
        written.record(Some("10".into()), at("11"));
        assert!(written.fresher_than(&at("10")).is_some());
        assert!(written.fresher_than(&at("7")).is_none());
    }

    #[test]
    fn the_chain_is_bounded() {
        let written = Written::default();
        for v in 1..=40u32 {
            written.record(Some(v.to_string()), at(&(v + 1).to_string()));
        }
        assert!(written.fresher_than(&at("40")).is_some());
        assert!(written.fresher_than(&at("1")).is_none());
        assert_eq!(written.tracked(), 0);
    }

    #[test]
    fn another_object_of_the_same_name_is_not_ours() {
        let mut after = at("8");
        after.metadata.uid = Some("other".into());
        let note = Note {
            superseded: vec!["7".into()],
            after,
        };
        assert!(!fresher(&at("7"), &note));
    }
}
