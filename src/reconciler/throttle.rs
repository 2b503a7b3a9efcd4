//! A bound on the debounce. kube-runtime's debounced scheduler moves a
//! pending reconcile to `now + debounce` on every new trigger, so a storm
//! of child events (a large Deployment rolling, pods crash-looping) could
//! defer a Microservice's reconcile, a rollback included, for as long as
//! the storm lasts.
//!
//! Each object's triggers open a window at the first one. A trigger passes
//! to the scheduler (and postpones the reconcile by `debounce`) only while
//! the reconcile would still run within `max` of the window's start;
//! later ones are dropped. A dropped trigger loses nothing: the reconcile
//! already due runs after it (the scheduler runs it no earlier than our
//! `due`), and reads the caches, which held the change before the trigger
//! was made. The window closes when that reconcile is due.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

#[derive(Debug, Clone, Copy)]
struct Window {
    first: Instant,
    /// When the reconcile the passed triggers scheduled is due.
    due: Instant,
}

#[derive(Debug)]
pub struct Throttle<K> {
    debounce: Duration,
    max: Duration,
    windows: Mutex<HashMap<K, Window>>,
}

impl<K: Eq + Hash + Clone> Throttle<K> {
    /// `max` below `debounce` is taken as `debounce`.
    pub fn new(debounce: Duration, max: Duration) -> Self {
        Throttle {
            debounce,
            max: max.max(debounce),
            windows: Mutex::new(HashMap::new()),
        }
    }

    /// Whether a trigger for `key` at `now` goes to the scheduler.
    pub fn admit(&self, key: &K, now: Instant) -> bool {
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let next = now + self.debounce;
        if let Some(w) = windows.get_mut(key).filter(|w| now < w.due) {
            if next <= w.first + self.max {
                w.due = next;
                return true;
            }
            return false;
        }
        // Closed windows go whenever the map has doubled, so it holds
        // about the objects triggered within one window.
        if windows.len() >= 64 && windows.len().is_power_of_two() {
            windows.retain(|_, w| now < w.due);
        }
        windows.insert(
            key.clone(),
            Window {
                first: now,
                due: next,
            },
        );
        true
    }

    /// Drops the windows closed by `now`; the prune calls it, so a quiet
    /// controller holds none.
    pub fn close(&self, now: Instant) {
        self.windows
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, w| now < w.due);
    }

    /// Windows held, open or not yet dropped: for the bounded-memory figure.
    pub fn tracked(&self) -> usize {
        self.windows.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_storm_postpones_the_reconcile_no_further_than_the_bound() {
        let t = Throttle::new(200 * MS, 1000 * MS);
        let t0 = Instant::now();
        // An event every 100 ms for 10 s: the scheduler would run the
        // reconcile 200 ms after the last one it was given.
        let mut last_passed = None;
        let mut runs = Vec::new();
        for i in 0..100u32 {
            let now = t0 + 100 * MS * i;
            if let Some(p) = last_passed
                && now >= p + 200 * MS
            {
                // The reconcile ran; a new window starts.
                runs.push(p + 200 * MS);
                last_passed = None;
            }
            if t.admit(&"a", now) {
                last_passed = Some(now);
            }
        }
        assert!(!runs.is_empty(), "the storm never let a reconcile run");
        let mut previous = t0;
        for run in &runs {
            assert!(
                run.duration_since(previous) <= 1100 * MS,
                "a reconcile waited {:?}",
                run.duration_since(previous)
            );
            previous = *run;
        }
    }

    #[test]
    fn quiet_objects_pass_every_trigger_and_windows_are_forgotten() {
        let t = Throttle::new(200 * MS, 1000 * MS);
        let t0 = Instant::now();
        assert!(t.admit(&0u32, t0));
        // Within the window and the bound: passes (and postpones).
        assert!(t.admit(&0u32, t0 + 100 * MS));
        // After its reconcile was due: a new window.
        assert!(t.admit(&0u32, t0 + 400 * MS));
        for k in 1..=200u32 {
            assert!(t.admit(&k, t0 + Duration::from_secs(10) + k * MS));
        }
        assert!(t.tracked() < 201, "closed windows were pruned");
        t.close(t0 + Duration::from_secs(20));
        assert_eq!(t.tracked(), 0, "a quiet throttle holds nothing");
        // A bound below the debounce is the debounce.
        let tight = Throttle::new(200 * MS, MS);
        assert!(tight.admit(&0u32, t0));
        assert!(!tight.admit(&0u32, t0 + 50 * MS));
    }
}
