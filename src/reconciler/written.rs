//! The status this controller last wrote, per Microservice. A reconcile
//! queued during a status write may run on the cached copy from before the
//! write; comparing against that copy would find "nothing to write" where
//! the object now says something else. While the cache still holds the
//! version a write replaced, the write's result is the fresher copy.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::runtime::reflector::ObjectRef;

use crate::crd::Microservice;

#[derive(Debug, Default)]
pub struct Written(Mutex<HashMap<ObjectRef<Microservice>, (String, Microservice)>>);

/// Whether our write (`after`, over version `replaced`) is fresher than
/// `cached`: the cache still holds the version the write replaced.
pub fn fresher(cached: &Microservice, (replaced, after): &(String, Microservice)) -> bool {
    cached.metadata.resource_version.as_deref() == Some(replaced.as_str())
        && cached.metadata.uid == after.metadata.uid
}

impl Written {
    /// Our later write, when it is fresher than the cache; `None` when the
    /// cache is the truth (the common case costs no copy).
    pub fn fresher_than(&self, cached: &Microservice) -> Option<Microservice> {
        let key = ObjectRef::from_obj(cached);
        let mut map = self.0.lock().ok()?;
        match map.get(&key).filter(|e| fresher(cached, e)) {
            Some((_, after)) => Some(after.clone()),
            None => {
                // The cache caught up, or moved on: the note has served.
                map.remove(&key);
                None
            }
        }
    }

    /// The Microservice is gone: nothing to remember for it.
    pub fn forget(&self, gone: &ObjectRef<Microservice>) {
        if let Ok(mut map) = self.0.lock() {
            map.remove(gone);
        }
    }

    /// Notes that `result` was written over `replaced`.
    pub fn record(&self, replaced: Option<String>, result: Microservice) {
        if let (Some(replaced), Ok(mut map)) = (replaced, self.0.lock()) {
            map.insert(ObjectRef::from_obj(&result), (replaced, result));
        }
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
    fn another_object_of_the_same_name_is_not_ours() {
        let mut after = at("8");
        after.metadata.uid = Some("other".into());
        assert!(!fresher(&at("7"), &("7".to_string(), after)));
    }
}
