//! How every watch in the operator starts.

use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::utils::{Backoff, ResetTimerBackoff};
use kube::runtime::watcher;

use crate::domain::desired::{LABEL_MANAGED_BY, MANAGED_BY};

/// The base watch configuration. With streaming lists, a watch (and each
/// restart of one, e.g. after a replica restarts) receives its initial state
/// as watch events, so no LIST request is sent. That needs the WatchList
/// feature (Kubernetes 1.32 and later, on by default); members older than
/// that need `--streaming-lists=false`.
pub fn config(streaming_lists: bool) -> watcher::Config {
    let config = watcher::Config::default();
    if streaming_lists {
        config.streaming_lists()
    } else {
        config
    }
}

/// The same, for the children we made: they carry our managed-by label, so
/// watching only those keeps the caches small.
pub fn managed(streaming_lists: bool) -> watcher::Config {
    config(streaming_lists).labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}"))
}

/// A trigger stream without its errors. Each watch retries on its own
/// backoff; passed on, its errors would also pause every trigger of the
/// controller by the controller's backoff, once per watch: after an
/// apiserver restart each watch's 410 cost all of them 5 s more.
pub fn without_errors<K, S>(
    stream: S,
    cluster: String,
    kind: &'static str,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send
where
    S: Stream<Item = Result<K, watcher::Error>> + Send,
    K: Send,
{
    stream.filter(move |item| {
        if let Err(e) = item {
            tracing::debug!(k8s.cluster.name = %cluster, kind, error = %e, "watch error; retrying");
        }
        futures::future::ready(item.is_ok())
    })
}

/// How a watch retries. kube's default grows to 30 s and resets only after
/// two quiet minutes, so after a 5-second apiserver outage the errors of the
/// outage had grown it, and the 410 that a restarted apiserver answers first
/// waited out 10, 15, then 38 s before the relist: the controller saw no
/// change for a minute. Retries here stay under 5 s, and reset after 10 s.
pub fn backoff() -> impl Backoff {
    ResetTimerBackoff::new(Doubling::default(), Duration::from_secs(10))
}

const FIRST_RETRY: Duration = Duration::from_millis(200);
const LONGEST_RETRY: Duration = Duration::from_secs(5);

/// 200 ms, doubling, capped at 5 s.
#[derive(Debug)]
struct Doubling(Duration);

impl Default for Doubling {
    fn default() -> Self {
        Doubling(FIRST_RETRY)
    }
}

impl Iterator for Doubling {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let now = self.0;
        self.0 = (self.0 * 2).min(LONGEST_RETRY);
        Some(now)
    }
}

impl Backoff for Doubling {
    fn reset(&mut self) {
        self.0 = FIRST_RETRY;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_double_from_200_ms_up_to_5_s_and_reset() {
        let mut d = Doubling::default();
        let first: Vec<u128> = d.by_ref().take(7).map(|x| x.as_millis()).collect();
        assert_eq!(first, [200, 400, 800, 1600, 3200, 5000, 5000]);
        d.reset();
        assert_eq!(d.next(), Some(FIRST_RETRY));
    }
}
