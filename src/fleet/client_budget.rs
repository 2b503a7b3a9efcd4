//! Each member cluster's client gets its own request budget, so a cluster
//! with thousands of objects cannot starve its apiserver or the others.
//! The budget is a token bucket with client-go's semantics (refilled at
//! `qps`, holding at most `burst`), and Events draw from a small bucket of
//! their own, so announcing a write never delays the next one.

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tower::{BoxError, Layer, Service};

/// Requests per second on average, and how many may go at once after a quiet spell.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Budget {
    pub qps: f64,
    pub burst: u32,
}

impl Default for Budget {
    /// Generous enough for a full resync of 500 Microservices in seconds,
    /// low enough to keep one runaway controller off an apiserver.
    fn default() -> Self {
        Budget {
            qps: 100.0,
            burst: 200,
        }
    }
}

impl Budget {
    /// For the Lease alone: a read and a write per retry period, with room.
    pub const ELECTION: Budget = Budget {
        qps: 20.0,
        burst: 20,
    };

    /// The fleet controller's writes to one member: a GET and a write per
    /// FleetMicroservice and wave, with room for many released at once.
    pub const FLEET_WRITES: Budget = Budget {
        qps: 20.0,
        burst: 40,
    };

    /// Events, beside any member budget: client-go's default client budget
    /// (5 a second), where sample-controller sends its Events, with room
    /// for a wave of creates.
    pub const EVENTS: Budget = Budget {
        qps: 5.0,
        burst: 50,
    };

    /// The status API's live reads when a wait starts: one GET per
    /// cluster per wait, so a burst of waits queues instead of flooding.
    pub const LIVE_READS: Budget = Budget {
        qps: 20.0,
        burst: 100,
    };

    pub fn validate(&self) -> Result<(), String> {
        if !(self.qps.is_finite() && self.qps > 0.0) {
            return Err(format!("--cluster-qps must be above 0, got {}", self.qps));
        }
        if self.burst == 0 {
            return Err("--cluster-burst must be at least 1".into());
        }
        Ok(())
    }

    /// One token every `1 / qps`, at most `burst` saved up.
    pub fn quota(&self) -> Quota {
        let period = Duration::from_secs_f64(1.0 / self.qps.max(f64::MIN_POSITIVE));
        let burst = NonZeroU32::new(self.burst).unwrap_or(NonZeroU32::MIN);
        Quota::with_period(period.max(Duration::from_nanos(1)))
            .expect("a period of at least 1 ns")
            .allow_burst(burst)
    }

    pub fn layer(&self) -> BudgetLayer {
        BudgetLayer {
            requests: Arc::new(RateLimiter::direct(self.quota())),
            events: Arc::new(RateLimiter::direct(Budget::EVENTS.quota())),
        }
    }
}

/// Whether a request writes an Event (core or events.k8s.io).
pub fn is_event(path: &str) -> bool {
    path.starts_with("/apis/events.k8s.io/")
        || (path.starts_with("/api/v1/") && path.contains("/events"))
}

#[derive(Clone)]
pub struct BudgetLayer {
    requests: Arc<DefaultDirectRateLimiter>,
    events: Arc<DefaultDirectRateLimiter>,
}

impl<S> Layer<S> for BudgetLayer {
    type Service = BudgetService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BudgetService {
            inner: Arc::new(tokio::sync::Mutex::new(inner)),
            requests: self.requests.clone(),
            events: self.events.clone(),
        }
    }
}

/// Waits for a token from the request's bucket, then passes the request on.
/// The bucket depends on the request, so readiness is taken per call: the
/// service below is shared, and locked only to ready it and start the call.
pub struct BudgetService<S> {
    inner: Arc<tokio::sync::Mutex<S>>,
    requests: Arc<DefaultDirectRateLimiter>,
    events: Arc<DefaultDirectRateLimiter>,
}

impl<S> Clone for BudgetService<S> {
    fn clone(&self) -> Self {
        BudgetService {
            inner: self.inner.clone(),
            requests: self.requests.clone(),
            events: self.events.clone(),
        }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> Service<http::Request<B>> for BudgetService<S>
where
    S: Service<http::Request<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    S::Response: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<Result<S::Response, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let bucket = if is_event(req.uri().path()) {
            self.events.clone()
        } else {
            self.requests.clone()
        };
        let inner = self.inner.clone();
        Box::pin(async move {
            bucket.until_ready().await;
            let call = {
                let mut svc = inner.lock().await;
                std::future::poll_fn(|cx| svc.poll_ready(cx))
                    .await
                    .map_err(Into::into)?;
                svc.call(req)
            };
            call.await.map_err(Into::into)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::time::Instant;
    use tower::{ServiceExt, service_fn};

    #[test]
    fn bad_budgets_are_named() {
        for bad in [
            Budget { qps: 0.0, burst: 1 },
            Budget {
                qps: f64::NAN,
                burst: 1,
            },
            Budget { qps: 5.0, burst: 0 },
        ] {
            let err = bad.validate().unwrap_err();
            assert!(err.contains("--cluster-"), "{err}");
        }
        Budget::default().validate().unwrap();
    }

    #[test]
    fn the_bucket_holds_the_burst_and_refills_at_the_rate() {
        use governor::clock::FakeRelativeClock;
        let clock = FakeRelativeClock::default();
        let b = Budget {
            qps: 5.0,
            burst: 10,
        };
        let bucket = RateLimiter::direct_with_clock(b.quota(), clock.clone());
        // A full bucket: the burst at once, then nothing.
        for _ in 0..10 {
            assert!(bucket.check().is_ok());
        }
        assert!(bucket.check().is_err());
        // One token per 1/qps, as client-go's token bucket refills.
        clock.advance(Duration::from_millis(200));
        assert!(bucket.check().is_ok());
        assert!(bucket.check().is_err());
        // Idle for long: no more than the burst is saved up.
        clock.advance(Duration::from_secs(60));
        for _ in 0..10 {
            assert!(bucket.check().is_ok());
        }
        assert!(bucket.check().is_err());
    }

    #[test]
    fn events_are_told_from_other_requests() {
        assert!(is_event("/apis/events.k8s.io/v1/namespaces/a/events"));
        assert!(is_event("/api/v1/namespaces/a/events"));
        assert!(!is_event("/apis/apps/v1/namespaces/a/deployments/events"));
        assert!(!is_event(
            "/apis/platform.example.io/v1alpha1/namespaces/a/microservices"
        ));
    }

    fn request(path: &str) -> http::Request<()> {
        http::Request::builder().uri(path).body(()).unwrap()
    }

    fn echo(
        budget: Budget,
    ) -> BudgetService<
        impl Service<http::Request<()>, Response = String, Error = Infallible, Future = impl Send>
        + Send
        + 'static,
    > {
        budget
            .layer()
            .layer(service_fn(|r: http::Request<()>| async move {
                Ok::<_, Infallible>(r.uri().path().to_string())
            }))
    }

    #[tokio::test]
    async fn requests_beyond_the_burst_wait_for_tokens() {
        let svc = echo(Budget {
            qps: 20.0,
            burst: 5,
        });
        let start = Instant::now();
        for _ in 0..15 {
            svc.clone().oneshot(request("/api/v1/pods")).await.unwrap();
        }
        // 10 beyond the burst, at 20 a second: at least 0.5 s (less a
        // token's worth of rounding).
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(450), "{took:?}");
    }

    #[tokio::test]
    async fn events_do_not_wait_for_the_request_bucket() {
        // The next request token is 10 s away.
        let svc = echo(Budget { qps: 0.1, burst: 2 });
        for _ in 0..2 {
            svc.clone().oneshot(request("/api/v1/pods")).await.unwrap();
        }
        let event = svc
            .clone()
            .oneshot(request("/apis/events.k8s.io/v1/namespaces/a/events"));
        let sent = tokio::time::timeout(Duration::from_secs(5), event).await;
        assert!(sent.is_ok(), "the Event waited for the request bucket");
        let request = svc.clone().oneshot(request("/api/v1/pods"));
        let waited = tokio::time::timeout(Duration::from_secs(2), request).await;
        assert!(waited.is_err(), "a request went beyond the budget");
    }
}
