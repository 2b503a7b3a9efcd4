//! Whether a status watch has stalled without an error: a stuck watch cache
//! or a silent proxy keeps the connection open and delivers nothing, and
//! kube's watcher shows no error for it. The feed compares what its watch
//! delivered with a consistent list taken now and then; a key that differed
//! at the last probe and has not moved since is proof that the watch is
//! not delivering. Pure: the feed does the listing.

use std::collections::{BTreeMap, BTreeSet};

use super::index::Key;

/// `resourceVersion` by key: what a watch delivered, or what a list read.
/// Versions are compared for equality only, never ordered.
pub type Versions = BTreeMap<Key, String>;

#[derive(Debug, PartialEq, Eq)]
pub enum Probe {
    /// The watch shows what the apiserver has.
    Fresh,
    /// Behind on these many keys; normal for a moment, judged next probe.
    Behind(usize),
    /// Still behind on this key, and it has not moved since the last probe.
    Stalled(Key),
}

/// The keys that differed at the last probe, with the version the watch
/// had delivered for each then (`None`: it had not delivered the key).
#[derive(Debug, Default)]
pub struct Stall {
    suspects: BTreeMap<Key, Option<String>>,
}

impl Stall {
    /// Judges `seen` (what the watch delivered) against `listed` (a
    /// consistent read finished just now).
    pub fn judge(&mut self, seen: &Versions, listed: &Versions) -> Probe {
        let keys: BTreeSet<&Key> = seen.keys().chain(listed.keys()).collect();
        let behind: BTreeMap<Key, Option<String>> = keys
            .into_iter()
            .filter(|k| seen.get(*k) != listed.get(*k))
            .map(|k| ((*k).clone(), seen.get(k).cloned()))
            .collect();
        let stuck = behind
            .iter()
            .find(|(k, now)| self.suspects.get(*k) == Some(now))
            .map(|(k, _)| k.clone());
        self.suspects = behind;
        match stuck {
            Some(key) => Probe::Stalled(key),
            None if self.suspects.is_empty() => Probe::Fresh,
            None => Probe::Behind(self.suspects.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(name: &str) -> Key {
        ("ns".into(), name.into())
    }

    fn v(items: &[(&str, &str)]) -> Versions {
        items.iter().map(|(n, rv)| (k(n), rv.to_string())).collect()
    }

    #[test]
    fn a_watch_in_step_is_fresh() {
        let mut s = Stall::default();
        let both = v(&[("a", "1"), ("b", "2")]);
        assert_eq!(s.judge(&both, &both), Probe::Fresh);
        assert_eq!(s.judge(&both, &both), Probe::Fresh);
    }

    #[test]
    fn a_watch_a_moment_behind_is_judged_next_time_not_now() {
        let mut s = Stall::default();
        assert_eq!(
            s.judge(&v(&[("a", "1")]), &v(&[("a", "2"), ("b", "3")])),
            Probe::Behind(2)
        );
        // It caught up on both: fresh.
        let now = v(&[("a", "2"), ("b", "3")]);
        assert_eq!(s.judge(&now, &now), Probe::Fresh);
    }

    #[test]
    fn a_watch_that_moves_while_the_object_keeps_changing_is_not_stalled() {
        let mut s = Stall::default();
        // A busy object: each probe finds the watch one version behind, but
        // it delivered something in between.
        for (seen, listed) in [("1", "2"), ("2", "3"), ("3", "4"), ("4", "5")] {
            let p = s.judge(&v(&[("a", seen)]), &v(&[("a", listed)]));
            assert_eq!(p, Probe::Behind(1));
        }
    }

    #[test]
    fn a_watch_that_delivers_nothing_is_stalled_at_the_second_probe() {
        let mut s = Stall::default();
        let seen = v(&[("a", "1")]);
        assert_eq!(s.judge(&seen, &v(&[("a", "2")])), Probe::Behind(1));
        // The object changed again: the watch still shows version 1.
        assert_eq!(s.judge(&seen, &v(&[("a", "3")])), Probe::Stalled(k("a")));
    }

    #[test]
    fn an_undelivered_create_or_delete_is_a_stall_too() {
        let mut s = Stall::default();
        let seen = v(&[("gone", "1")]);
        let listed = v(&[("new", "5")]);
        assert_eq!(s.judge(&seen, &listed), Probe::Behind(2));
        assert!(matches!(s.judge(&seen, &listed), Probe::Stalled(_)));
    }

    #[test]
    fn a_key_behind_once_and_fresh_later_is_forgotten() {
        let mut s = Stall::default();
        let old = v(&[("a", "1")]);
        assert_eq!(s.judge(&old, &v(&[("a", "2")])), Probe::Behind(1));
        let now = v(&[("a", "2")]);
        assert_eq!(s.judge(&now, &now), Probe::Fresh);
        // Behind again at the same version it had the first time: a new
        // suspicion, not proof.
        assert_eq!(s.judge(&old, &v(&[("a", "2")])), Probe::Behind(1));
    }
}
