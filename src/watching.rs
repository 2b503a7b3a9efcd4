//! How every watch in the operator starts.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::utils::{Backoff, ResetTimerBackoff, StreamBackoff};
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

/// Drops an object's managedFields before it is kept: no decision reads
/// them, and decoded as free-form JSON trees they were most of a cached
/// Deployment (12 of 38 MiB live at 500 objects, #37). A replace built
/// from a stripped object sends none, and the apiserver then keeps the
/// stored ones (it falls back to the live object's when an update carries
/// none), so nothing is lost on write.
pub fn strip<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
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

/// Whether one watch is keeping its cache current: since when it has
/// been failing, if it is. A watch that fails after its first listing
/// leaves a cache that looks fine and says nothing new.
///
/// A watch that restarts successfully from its last resourceVersion emits
/// nothing until something changes, so recovery is also read from the
/// errors stopping: a failing watch retries at least every `LONGEST_RETRY`,
/// and one quiet for `RECOVERED_AFTER` has got through.
#[derive(Debug, Default)]
pub struct WatchHealth(std::sync::Mutex<Option<Failure>>);

#[derive(Debug, Clone, Copy)]
struct Failure {
    since: tokio::time::Instant,
    last: tokio::time::Instant,
}

/// No error for this long after one: the watch's retry got through.
pub const RECOVERED_AFTER: Duration = Duration::from_secs(8);

impl WatchHealth {
    /// Notes one event of the watch: a refusal starts (or continues) a
    /// failure; an event, a listing done included, ends it. A connection
    /// error does neither: the apiserver is not answering at all, which is
    /// the cluster's reachability (the leader's Lease), and a restart of
    /// the apiserver is no news for the workload.
    pub fn saw<K>(&self, event: &Result<watcher::Event<K>, watcher::Error>) {
        match event {
            Ok(_) => self.note(false, tokio::time::Instant::now()),
            Err(e) if refused(e) => self.note(true, tokio::time::Instant::now()),
            Err(_) => {}
        }
    }

    fn note(&self, error: bool, now: tokio::time::Instant) {
        let mut failure = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *failure = match (error, *failure) {
            (false, _) => None,
            (true, Some(f)) if now.saturating_duration_since(f.last) < RECOVERED_AFTER => {
                Some(Failure { last: now, ..f })
            }
            (true, _) => Some(Failure {
                since: now,
                last: now,
            }),
        };
    }

    /// How long the watch has been failing, as of `now`.
    pub fn failing_for(&self, now: tokio::time::Instant) -> Option<Duration> {
        let failure = *self.0.lock().unwrap_or_else(|e| e.into_inner());
        failure
            .filter(|f| now.saturating_duration_since(f.last) < RECOVERED_AFTER)
            .map(|f| now.saturating_duration_since(f.since))
    }
}

/// The apiserver answered the watch with an error (a 403 after an RBAC
/// change, a broken watch cache). 410 Gone is the ordinary end of a
/// resourceVersion, answered by a relist.
fn refused(e: &watcher::Error) -> bool {
    use kube::Error::Api;
    use watcher::Error::*;
    match e {
        InitialListFailed(Api(s)) | WatchStartFailed(Api(s)) | WatchFailed(Api(s)) => s.code != 410,
        WatchError(s) => s.code != 410,
        NoResourceVersion => true,
        _ => false,
    }
}

/// Counts and tracks the raw events of one watch (before `reflect`, so a
/// relist that lists nothing still ends a failure).
pub fn tracked<K, S>(
    stream: S,
    health: std::sync::Arc<WatchHealth>,
    cluster: String,
    resource: &'static str,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
    K: Send,
{
    stream.inspect(move |event| {
        if event.is_err() {
            crate::telemetry::metrics::METRICS
                .watch_errors_total
                .inc(&[&cluster, resource]);
        }
        health.saw(event);
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

/// A watch that retries on `backoff()`, reset only by an event that shows
/// the watch got somewhere: a listing's end, or a change. kube resets its
/// backoff on every event, and a watch that lists announces `Init` before
/// each attempt, failed ones too, so a home without the FleetMicroservice
/// CRD, or an apiserver refusing every list, was asked again at the first
/// step of the backoff (about once a second with kube's, five times with
/// ours) for as long as it lasted.
pub fn retried<K, S>(
    stream: S,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
    K: Send,
{
    let progress = Arc::new(AtomicBool::new(false));
    let seen = progress.clone();
    let stream = stream.inspect(move |event| {
        // Not `Init`, and not a listing's objects: a list that fails on a
        // later page yields the first page's objects on every attempt.
        if matches!(
            event,
            Ok(watcher::Event::InitDone | watcher::Event::Apply(_) | watcher::Event::Delete(_))
        ) {
            seen.store(true, Ordering::Relaxed);
        }
    });
    StreamBackoff::new(
        stream,
        OnProgress {
            inner: backoff(),
            progress,
        },
    )
}

/// A backoff that `StreamBackoff`'s reset after each event leaves alone
/// unless that event was progress.
struct OnProgress<B> {
    inner: B,
    progress: Arc<AtomicBool>,
}

impl<B: Iterator<Item = Duration>> Iterator for OnProgress<B> {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        self.inner.next()
    }
}

impl<B: Backoff> Backoff for OnProgress<B> {
    fn reset(&mut self) {
        if self.progress.swap(false, Ordering::Relaxed) {
            self.inner.reset();
        }
    }
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

    type ConfigMapEvent = Result<watcher::Event<ConfigMap>, watcher::Error>;
    use k8s_openapi::api::core::v1::ConfigMap;

    /// When each of `script`'s attempts (its `Init`s) was made, played
    /// through `retried` on a paused clock.
    async fn attempts(script: Vec<ConfigMapEvent>) -> Vec<Duration> {
        let start = tokio::time::Instant::now();
        let at = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = at.clone();
        let stream = futures::stream::unfold(script.into_iter(), move |mut items| {
            let seen = seen.clone();
            async move {
                let item = items.next()?;
                if matches!(item, Ok(watcher::Event::Init)) {
                    seen.lock().unwrap().push(start.elapsed());
                }
                Some((item, items))
            }
        });
        let _: Vec<_> = retried(stream).collect().await;
        at.lock().unwrap().clone()
    }

    fn gaps(at: &[Duration]) -> Vec<u128> {
        at.windows(2).map(|w| (w[1] - w[0]).as_millis()).collect()
    }

    /// A list that fails says `Init` first each time (kube's ListWatch).
    fn failed_list() -> [ConfigMapEvent; 2] {
        [
            Ok(watcher::Event::Init),
            Err(watcher::Error::NoResourceVersion),
        ]
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_that_never_lists_waits_longer_each_time_up_to_five_seconds() {
        let at = attempts((0..8).flat_map(|_| failed_list()).collect()).await;
        assert_eq!(gaps(&at), [200, 400, 800, 1600, 3200, 5000, 5000]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_list_that_fails_after_its_first_page_still_waits_longer_each_time() {
        let page_then_failure = || {
            [
                Ok(watcher::Event::Init),
                Ok(watcher::Event::InitApply(ConfigMap::default())),
                Err(watcher::Error::NoResourceVersion),
            ]
        };
        let at = attempts((0..5).flat_map(|_| page_then_failure()).collect()).await;
        assert_eq!(gaps(&at), [200, 400, 800, 1600]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_listing_that_got_through_starts_the_backoff_again() {
        let mut script: Vec<ConfigMapEvent> = (0..3).flat_map(|_| failed_list()).collect();
        script.extend([
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitDone),
            Err(watcher::Error::NoResourceVersion),
        ]);
        script.extend(failed_list());
        let at = attempts(script).await;
        // 200, 400, 800 while failing; after the listing, 200 again.
        assert_eq!(gaps(&at), [200, 400, 800, 200]);
    }

    #[test]
    fn a_stripped_object_keeps_everything_but_its_managed_fields() {
        use k8s_openapi::api::apps::v1::Deployment;
        let full: Deployment = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "api", "namespace": "ns", "uid": "u1",
                "resourceVersion": "7", "generation": 3,
                "labels": {"app": "api"},
                "annotations": {"deployment.kubernetes.io/revision": "2"},
                "ownerReferences": [{"apiVersion": "platform.example.io/v1alpha1",
                    "kind": "Microservice", "name": "api", "uid": "o1", "controller": true}],
                "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:replicas": {}}}}]
            },
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "api"}},
                     "template": {"spec": {"containers": [{"name": "api", "image": "i:1"}]}}},
            "status": {"observedGeneration": 3, "availableReplicas": 2}
        }))
        .expect("deployment");
        let mut kept = full.clone();
        strip(&mut kept);
        assert_eq!(kept.metadata.managed_fields, None);
        let mut expected = full;
        expected.metadata.managed_fields = None;
        assert_eq!(
            kept, expected,
            "identity, labels, annotations, owners, spec and status stay"
        );
    }

    #[test]
    fn a_failure_lasts_from_its_first_error_until_an_event_or_quiet() {
        let h = WatchHealth::default();
        let t0 = tokio::time::Instant::now();
        let s = Duration::from_secs;
        assert_eq!(h.failing_for(t0), None);
        // Errors at each retry: failing since the first.
        for at in [0, 5, 10] {
            h.note(true, t0 + s(at));
        }
        assert_eq!(h.failing_for(t0 + s(12)), Some(s(12)));
        // Any event ends it.
        h.note(false, t0 + s(13));
        assert_eq!(h.failing_for(t0 + s(13)), None);
        // A retry that got through silently: the errors stop.
        h.note(true, t0 + s(20));
        assert_eq!(h.failing_for(t0 + s(27)), Some(s(7)));
        assert_eq!(h.failing_for(t0 + s(20) + RECOVERED_AFTER), None);
        // A later error starts a new failure.
        h.note(true, t0 + s(40));
        assert_eq!(h.failing_for(t0 + s(41)), Some(s(1)));
        let err: Result<watcher::Event<()>, watcher::Error> =
            Err(watcher::Error::NoResourceVersion);
        h.saw(&err);
        h.saw::<()>(&Ok(watcher::Event::InitDone));
        assert_eq!(h.failing_for(tokio::time::Instant::now()), None);
    }

    #[test]
    fn only_refusals_count_not_an_apiserver_that_is_away_or_a_gone_version() {
        let status = |code| {
            Box::new(kube::core::Status {
                code,
                ..Default::default()
            })
        };
        assert!(refused(&watcher::Error::WatchError(status(403))));
        assert!(!refused(&watcher::Error::WatchError(status(410))));
        let h = WatchHealth::default();
        h.saw::<()>(&Err(watcher::Error::WatchError(status(410))));
        assert_eq!(h.failing_for(tokio::time::Instant::now()), None);
    }

    #[test]
    fn retries_double_from_200_ms_up_to_5_s_and_reset() {
        let mut d = Doubling::default();
        let first: Vec<u128> = d.by_ref().take(7).map(|x| x.as_millis()).collect();
        assert_eq!(first, [200, 400, 800, 1600, 3200, 5000, 5000]);
        d.reset();
        assert_eq!(d.next(), Some(FIRST_RETRY));
    }
}
