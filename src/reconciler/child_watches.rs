//! The health of the child watches whose caches a verdict reads: a cache
//! whose watch keeps failing cannot vouch for a verdict.

use std::sync::Arc;
use std::time::Duration;

use crate::watching::WatchHealth;

/// The health of the watches whose caches a verdict reads.
#[derive(Clone, Default)]
pub struct ChildWatches {
    pub deployments: Arc<WatchHealth>,
    pub services: Arc<WatchHealth>,
    pub endpoint_slices: Arc<WatchHealth>,
}

/// A watch failing this long makes its caches' verdicts unknown.
pub const STALE_AFTER: Duration = Duration::from_secs(10);

impl ChildWatches {
    /// The watches failing for `STALE_AFTER` or more, as of `now`.
    pub fn stale(&self, now: tokio::time::Instant) -> Vec<(&'static str, Duration)> {
        [
            ("Deployments", &self.deployments),
            ("Services", &self.services),
            ("EndpointSlices", &self.endpoint_slices),
        ]
        .into_iter()
        .filter_map(|(kind, h)| h.failing_for(now).map(|d| (kind, d)))
        .filter(|(_, d)| *d >= STALE_AFTER)
        .collect()
    }
}
