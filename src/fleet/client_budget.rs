//! Each member cluster's client gets its own request budget, so a cluster
//! with thousands of objects cannot starve its apiserver or the others.

use std::time::Duration;

use tower::limit::RateLimitLayer;

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

    pub fn validate(&self) -> Result<(), String> {
        if !(self.qps.is_finite() && self.qps > 0.0) {
            return Err(format!("--cluster-qps must be above 0, got {}", self.qps));
        }
        if self.burst == 0 {
            return Err("--cluster-burst must be at least 1".into());
        }
        Ok(())
    }

    /// A window of `burst` requests that refills every `burst / qps`: the
    /// average rate is `qps` and no window exceeds `burst`.
    pub fn window(&self) -> (u64, Duration) {
        let burst = u64::from(self.burst);
        (
            burst,
            Duration::from_secs_f64(f64::from(self.burst) / self.qps),
        )
    }

    pub fn layer(&self) -> RateLimitLayer {
        let (n, per) = self.window();
        RateLimitLayer::new(n, per)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use tower::{Layer, Service, ServiceExt, service_fn};

    #[test]
    fn the_window_spreads_the_burst_over_the_rate() {
        let b = Budget {
            qps: 50.0,
            burst: 100,
        };
        assert_eq!(b.window(), (100, Duration::from_secs(2)));
    }

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

    #[tokio::test(start_paused = true)]
    async fn requests_beyond_the_burst_wait_for_the_next_window() {
        let budget = Budget {
            qps: 10.0,
            burst: 5,
        };
        let mut svc = budget
            .layer()
            .layer(service_fn(|n: u32| async move { Ok::<_, Infallible>(n) }));
        let start = tokio::time::Instant::now();
        for n in 0..20 {
            let got = svc.ready().await.unwrap().call(n).await.unwrap();
            assert_eq!(got, n);
        }
        // 20 requests in windows of 5 per 0.5 s: the fourth window opens at 1.5 s.
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(1500), "{took:?}");
        assert!(took < Duration::from_millis(2000), "{took:?}");
    }
}
