//! The write fence at the wire: the innermost layer of a member's client,
//! below kube's buffer and the member's request budget. A mutating request
//! passes only if this replica leads the cluster at the armed epoch at the
//! moment the request leaves the queue, and it is cut off at the term's
//! deadline. Reads pass through, so followers keep their caches.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http::Method;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tower::{BoxError, Layer, Service};

use super::elector::Leadership;
use crate::telemetry::metrics::METRICS;

/// Why a write was withheld at the wire.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FenceError {
    /// No term is armed, or the armed term is not the one that leads now.
    #[error("write fenced: this replica does not lead the cluster at epoch {armed:?}")]
    NotLeading { armed: Option<i32> },
    /// The write was admitted but had not finished when the term's deadline
    /// passed (or the clock was past it when the write was next polled): its
    /// outcome is unknown, it may have landed.
    #[error("write fenced: the leadership term ended before the write completed")]
    TermEnded,
}

impl FenceError {
    pub fn category(&self) -> &'static str {
        match self {
            FenceError::NotLeading { .. } => "NotLeading",
            FenceError::TermEnded => "TermEnded",
        }
    }
}

/// Whether a request changes state on the server.
pub fn is_mutating(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// The deadline a mutating request must finish by, if it may go at all:
/// the replica leads at exactly the armed epoch, and `now` is before `until`.
pub fn admit(
    leadership: &Leadership,
    armed: Option<i32>,
    now: Instant,
) -> Result<Instant, FenceError> {
    match (leadership, armed) {
        (Leadership::Leading { epoch, until, .. }, Some(a)) if *epoch == a && now < *until => {
            Ok(*until)
        }
        _ => Err(FenceError::NotLeading { armed }),
    }
}

/// One cluster's fence, shared by every client and task of that cluster.
#[derive(Clone)]
pub struct Fence {
    inner: Arc<Shared>,
}

struct Shared {
    cluster: String,
    leadership: watch::Receiver<Leadership>,
    armed: Mutex<Option<i32>>,
    in_flight: AtomicUsize,
    idle: Notify,
    /// The latest deadline of a write given up on its way (its future
    /// dropped after it was first polled): until then, the apiserver may
    /// still receive it.
    abandoned: Mutex<Option<Instant>>,
}

impl Fence {
    pub fn new(cluster: &str, leadership: watch::Receiver<Leadership>) -> Self {
        Fence {
            inner: Arc::new(Shared {
                cluster: cluster.to_string(),
                leadership,
                armed: Mutex::new(None),
                in_flight: AtomicUsize::new(0),
                idle: Notify::new(),
                abandoned: Mutex::new(None),
            }),
        }
    }

    /// Opens the fence for one term's writes; `None` closes it.
    pub fn arm(&self, epoch: Option<i32>) {
        *self.inner.armed.lock().unwrap_or_else(|e| e.into_inner()) = epoch;
    }

    fn armed(&self) -> Option<i32> {
        *self.inner.armed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Mutating requests admitted and not yet finished.
    pub fn in_flight(&self) -> usize {
        self.inner.in_flight.load(Ordering::SeqCst)
    }

    /// Resolves once no admitted write is on its way: each has finished,
    /// or, given up on its way (a term's work dropped), its deadline has
    /// passed, since the HTTP stack may send a request whose future is
    /// gone. Each one is bounded by its term's deadline, so this never
    /// waits past the latest one.
    pub async fn drained(&self) {
        loop {
            let idle = self.inner.idle.notified();
            if self.in_flight() == 0 {
                break;
            }
            idle.await;
        }
        let abandoned = *self
            .inner
            .abandoned
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(until) = abandoned {
            tokio::time::sleep_until(until).await;
        }
    }

    pub fn layer(&self) -> FenceLayer {
        FenceLayer {
            fence: self.clone(),
        }
    }
}

/// Decrements the in-flight count however the request ends, and records
/// the deadline of a write dropped on its way.
struct InFlight {
    shared: Arc<Shared>,
    until: Instant,
    /// Polled at least once (it may have been handed to the connection),
    /// and not yet finished.
    on_its_way: bool,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.on_its_way {
            let mut abandoned = self
                .shared
                .abandoned
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            *abandoned = Some(abandoned.map_or(self.until, |a| a.max(self.until)));
        }
        if self.shared.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.shared.idle.notify_waiters();
        }
    }
}

#[derive(Clone)]
pub struct FenceLayer {
    fence: Fence,
}

impl<S> Layer<S> for FenceLayer {
    type Service = Fenced<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Fenced {
            inner,
            fence: self.fence.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Fenced<S> {
    inner: S,
    fence: Fence,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, R> Service<http::Request<B>> for Fenced<S>
where
    S: Service<http::Request<B>, Response = R>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    R: Send + 'static,
{
    type Response = R;
    type Error = BoxError;
    type Future = BoxFuture<Result<R, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if !is_mutating(req.method()) {
            let fut = self.inner.call(req);
            return Box::pin(async move { fut.await.map_err(Into::into) });
        }
        let shared = &self.fence.inner;
        let admitted = admit(
            &shared.leadership.borrow(),
            self.fence.armed(),
            Instant::now(),
        );
        let until = match admitted {
            Ok(until) => until,
            Err(e) => {
                METRICS
                    .fenced_writes_total
                    .inc(&[&shared.cluster, e.category()]);
                tracing::debug!(k8s.cluster.name = %shared.cluster, method = %req.method(), uri = %req.uri(), "write fenced");
                return Box::pin(async move { Err(e.into()) });
            }
        };
        shared.in_flight.fetch_add(1, Ordering::SeqCst);
        // Held to the end of the write; it also names the cluster, so that
        // no string is copied per request.
        let mut guard = InFlight {
            shared: shared.clone(),
            until,
            on_its_way: false,
        };
        let fut = self.inner.call(req);
        Box::pin(async move {
            let mut fut = std::pin::pin!(fut);
            let mut cut = std::pin::pin!(tokio::time::sleep_until(until));
            // The clock is read before every poll of the write, not only
            // the timer: after a SIGCONT, tasks run before the timer driver
            // fires the timers that expired meanwhile, and a write admitted
            // before the stop must not be sent after its term on that poll.
            let outcome = std::future::poll_fn(|cx| {
                if Instant::now() >= until || cut.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(None);
                }
                guard.on_its_way = true;
                fut.as_mut().poll(cx).map(Some)
            })
            .await;
            // Finished, or cut off by this future itself: either way the
            // deadline has been applied here.
            guard.on_its_way = false;
            match outcome {
                Some(result) => result.map_err(Into::into),
                None => {
                    let ended = FenceError::TermEnded;
                    METRICS
                        .fenced_writes_total
                        .inc(&[&guard.shared.cluster, ended.category()]);
                    Err(ended.into())
                }
            }
        })
    }
}

/// Whether a client error is the fence refusing a write.
pub fn is_fenced(error: &kube::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if e.downcast_ref::<FenceError>().is_some() {
            return true;
        }
        source = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::time::Duration;
    use tower::{ServiceExt, service_fn};

    fn leading(epoch: i32, until: Instant) -> Leadership {
        Leadership::Leading {
            epoch,
            since: until - Duration::from_secs(1),
            until,
        }
    }

    #[test]
    fn only_the_armed_epoch_within_its_deadline_is_admitted() {
        let now = Instant::now();
        let later = now + Duration::from_secs(1);
        assert_eq!(admit(&leading(3, later), Some(3), now), Ok(later));
        // A newer term of the same replica does not admit an older term's write.
        assert!(admit(&leading(4, later), Some(3), now).is_err());
        assert!(admit(&leading(3, later), None, now).is_err());
        assert!(
            admit(&leading(3, now), Some(3), now).is_err(),
            "deadline is exclusive"
        );
        let following = Leadership::Following {
            holder: None,
            epoch: None,
            since: now,
        };
        assert!(admit(&following, Some(3), now).is_err());
    }

    #[test]
    fn reads_are_never_fenced() {
        for m in [Method::GET, Method::HEAD] {
            assert!(!is_mutating(&m));
        }
        for m in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
            assert!(is_mutating(&m));
        }
    }

    fn request(method: Method) -> http::Request<()> {
        http::Request::builder()
            .method(method)
            .uri("/x")
            .body(())
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn writes_are_refused_when_not_leading_and_cut_at_the_deadline() {
        let now = Instant::now();
        let (tx, rx) = watch::channel(leading(1, now + Duration::from_secs(2)));
        let fence = Fence::new("c", rx);
        // A slow server: every call takes 5 s.
        let svc = fence
            .layer()
            .layer(service_fn(|_r: http::Request<()>| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                Ok::<_, Infallible>("done")
            }));
        // Not armed: refused at once, even though the replica leads.
        let err = svc
            .clone()
            .oneshot(request(Method::POST))
            .await
            .unwrap_err();
        assert!(err.downcast_ref::<FenceError>().is_some());
        // Reads pass whatever the fence says.
        assert_eq!(
            svc.clone().oneshot(request(Method::GET)).await.unwrap(),
            "done"
        );
        fence.arm(Some(1));
        tx.send_replace(leading(1, Instant::now() + Duration::from_secs(2)));
        let start = Instant::now();
        let err = svc.clone().oneshot(request(Method::PUT)).await.unwrap_err();
        assert_eq!(
            err.downcast_ref::<FenceError>(),
            Some(&FenceError::TermEnded)
        );
        assert!(start.elapsed() <= Duration::from_secs(2));
        assert_eq!(fence.in_flight(), 0);
        // Past the deadline, nothing more is admitted.
        tx.send_replace(leading(1, Instant::now()));
        assert!(svc.oneshot(request(Method::DELETE)).await.is_err());
    }

    /// A replica stopped (SIGSTOP) between the admission and the first poll
    /// of its write: woken past the deadline, the write is not sent.
    #[tokio::test(start_paused = true)]
    async fn a_write_first_polled_after_the_deadline_is_not_sent() {
        let now = Instant::now();
        let (_tx, rx) = watch::channel(leading(1, now + Duration::from_secs(1)));
        let fence = Fence::new("c", rx);
        fence.arm(Some(1));
        let sent = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = sent.clone();
        let mut svc = fence
            .layer()
            .layer(service_fn(move |_r: http::Request<()>| {
                let sent = seen.clone();
                async move {
                    sent.store(true, Ordering::SeqCst);
                    Ok::<_, Infallible>(())
                }
            }));
        let write = svc.call(request(Method::POST));
        tokio::time::advance(Duration::from_secs(2)).await;
        let err = write.await.unwrap_err();
        assert_eq!(
            err.downcast_ref::<FenceError>(),
            Some(&FenceError::TermEnded)
        );
        assert!(!sent.load(Ordering::SeqCst), "sent after its term");
        assert_eq!(fence.in_flight(), 0);
    }

    /// A term's work dropped with a write on its way (its future gone, the
    /// request perhaps already with the connection): the drain waits out
    /// that write's deadline, not just for its future to go.
    #[tokio::test(start_paused = true)]
    async fn a_write_dropped_on_its_way_is_drained_at_its_deadline() {
        let now = Instant::now();
        let until = now + Duration::from_secs(2);
        let (_tx, rx) = watch::channel(leading(1, until));
        let fence = Fence::new("c", rx);
        fence.arm(Some(1));
        let svc = fence
            .layer()
            .layer(service_fn(|_r: http::Request<()>| async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                Ok::<_, Infallible>(())
            }));
        let call = tokio::spawn(svc.oneshot(request(Method::POST)));
        tokio::time::sleep(Duration::from_millis(10)).await;
        call.abort();
        let _ = call.await;
        assert_eq!(fence.in_flight(), 0);
        fence.drained().await;
        assert!(
            Instant::now() >= until,
            "drained before the dropped write's deadline"
        );
        // A write never sent leaves nothing to wait for.
        let fence = Fence::new(
            "c",
            watch::channel(leading(1, Instant::now() + Duration::from_secs(2))).1,
        );
        let start = Instant::now();
        fence.drained().await;
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn drained_waits_for_admitted_writes() {
        let now = Instant::now();
        let (_tx, rx) = watch::channel(leading(1, now + Duration::from_secs(10)));
        let fence = Fence::new("c", rx);
        fence.arm(Some(1));
        let svc = fence
            .layer()
            .layer(service_fn(|_r: http::Request<()>| async {
                tokio::time::sleep(Duration::from_secs(1)).await;
                Ok::<_, Infallible>(())
            }));
        let call = tokio::spawn(svc.oneshot(request(Method::POST)));
        tokio::task::yield_now().await;
        assert_eq!(fence.in_flight(), 1);
        let start = Instant::now();
        fence.drained().await;
        assert!(start.elapsed() >= Duration::from_secs(1));
        call.await.unwrap().unwrap();
    }
}
