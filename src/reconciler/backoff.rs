//! Per-object exponential backoff: a few milliseconds after the first
//! failure, doubling up to a cap, and forgotten on success.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

#[derive(Debug)]
pub struct Backoff<K> {
    base: Duration,
    max: Duration,
    failures: HashMap<K, u32>,
}

impl<K: Eq + Hash> Backoff<K> {
    pub fn new(base: Duration, max: Duration) -> Self {
        Backoff {
            base,
            max,
            failures: HashMap::new(),
        }
    }

    /// Records a failure of `key` and returns how long to wait before retrying.
    pub fn failed(&mut self, key: K) -> Duration {
        let n = self.failures.entry(key).or_insert(0);
        let delay = self.base.saturating_mul(1u32 << (*n).min(31));
        *n = n.saturating_add(1);
        delay.min(self.max)
    }

    /// Forgets `key`'s failures: the next failure starts from the base again.
    pub fn succeeded(&mut self, key: &K) {
        self.failures.remove(key);
    }

    /// Keeps only the keys `keep` names (the rest are gone).
    pub fn retain(&mut self, keep: impl Fn(&K) -> bool) {
        self.failures.retain(|k, _| keep(k));
    }

    pub fn tracked(&self) -> usize {
        self.failures.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_per_object_up_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(5), Duration::from_secs(300));
        assert_eq!(b.failed("a"), Duration::from_millis(5));
        assert_eq!(b.failed("a"), Duration::from_millis(10));
        assert_eq!(b.failed("a"), Duration::from_millis(20));
        assert_eq!(
            b.failed("b"),
            Duration::from_millis(5),
            "objects back off independently"
        );
        for _ in 0..40 {
            b.failed("a");
        }
        assert_eq!(b.failed("a"), Duration::from_secs(300));
        b.succeeded(&"a");
        assert_eq!(b.failed("a"), Duration::from_millis(5));
        b.succeeded(&"a");
        b.succeeded(&"b");
        assert_eq!(b.tracked(), 0);
    }
}
