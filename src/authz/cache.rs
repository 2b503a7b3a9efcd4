//! A bounded map whose entries expire: what the home cluster said about a
//! token or a right, kept a few seconds so a busy caller costs one review,
//! not one per call. The clock is passed in, so it is pure.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

pub struct Expiring<K, V> {
    max: usize,
    entries: HashMap<K, (V, Instant)>,
}

impl<K: Hash + Eq + Clone, V: Clone> Expiring<K, V> {
    pub fn new(max: usize) -> Self {
        Expiring {
            max: max.max(1),
            entries: HashMap::new(),
        }
    }

    /// The value, while it has not expired.
    pub fn get(&self, key: &K, now: Instant) -> Option<V> {
        self.entries
            .get(key)
            .filter(|(_, until)| now < *until)
            .map(|(v, _)| v.clone())
    }

    /// Keeps `value` for `ttl`. When full, the expired entries go first,
    /// then the one that would expire soonest: the map never grows past
    /// its bound, whoever sends tokens.
    pub fn insert(&mut self, key: K, value: V, ttl: Duration, now: Instant) {
        if self.entries.len() >= self.max && !self.entries.contains_key(&key) {
            self.entries.retain(|_, (_, until)| now < *until);
            if self.entries.len() >= self.max
                && let Some(k) = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (_, until))| *until)
                    .map(|(k, _)| k.clone())
            {
                self.entries.remove(&k);
            }
        }
        self.entries.insert(key, (value, now + ttl));
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn an_entry_lives_for_its_own_ttl() {
        let t0 = Instant::now();
        let mut c = Expiring::new(4);
        c.insert("ok", true, 10 * S, t0);
        c.insert("bad", false, 2 * S, t0);
        assert_eq!(c.get(&"ok", t0 + 9 * S), Some(true));
        assert_eq!(c.get(&"bad", t0 + S), Some(false));
        assert_eq!(c.get(&"bad", t0 + 2 * S), None, "a failure is kept 2 s");
        assert_eq!(c.get(&"ok", t0 + 10 * S), None);
    }

    #[test]
    fn it_never_grows_past_its_bound() {
        let t0 = Instant::now();
        let mut c = Expiring::new(3);
        for i in 0..1000u32 {
            c.insert(i, i, Duration::from_secs(u64::from(i) + 1), t0);
            assert!(c.len() <= 3);
        }
        // The soonest to expire made room; the latest stay.
        assert_eq!(c.get(&999, t0), Some(999));
        assert_eq!(c.get(&0, t0), None);
    }

    #[test]
    fn expired_entries_make_room_first() {
        let t0 = Instant::now();
        let mut c = Expiring::new(2);
        c.insert("old", 1, S, t0);
        c.insert("long", 2, 100 * S, t0);
        c.insert("new", 3, 10 * S, t0 + 2 * S);
        assert_eq!(c.get(&"long", t0 + 2 * S), Some(2));
        assert_eq!(c.get(&"new", t0 + 2 * S), Some(3));
    }
}
