//! Changes that may wait (replica counts, the wording of a standing
//! condition) are held per Microservice for a short window, so a rollout's
//! stream of count updates costs one status write, not one per update.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use kube::runtime::reflector::ObjectRef;
use tokio::time::Instant;

use crate::crd::Microservice;

/// How long a change that may wait is held. It bounds how stale counts and
/// reasons can be; a status flip is never held.
pub const WINDOW: Duration = Duration::from_secs(5);

#[derive(Debug, Default)]
pub struct Held(Mutex<HashMap<ObjectRef<Microservice>, Instant>>);

impl Held {
    /// Whether a change that may wait has waited long enough; the first
    /// call for an object starts its window.
    pub fn due(&self, key: &ObjectRef<Microservice>, now: Instant) -> bool {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let since = *map.entry(key.clone()).or_insert(now);
        if now.duration_since(since) >= WINDOW {
            map.remove(key);
            true
        } else {
            false
        }
    }

    /// Keeps only the objects `keep` names (the rest are gone).
    pub fn retain(&self, keep: impl Fn(&ObjectRef<Microservice>) -> bool) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| keep(k));
    }

    pub fn tracked(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Nothing is held for `key` any more: written, or no longer different.
    pub fn clear(&self, key: &ObjectRef<Microservice>) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_change_is_due_once_its_window_has_passed_and_a_write_restarts_it() {
        let held = Held::default();
        let k = ObjectRef::<Microservice>::new("a").within("ns");
        let t0 = Instant::now();
        assert!(!held.due(&k, t0));
        assert!(!held.due(&k, t0 + WINDOW / 2), "later calls keep the start");
        assert!(held.due(&k, t0 + WINDOW));
        // Written then: the next change starts a window of its own.
        assert!(!held.due(&k, t0 + WINDOW + Duration::from_millis(1)));
        held.clear(&k);
        assert!(!held.due(&k, t0 + WINDOW * 3));
    }
}
