//! Counts every request a member cluster's client sends, by verb and the
//! HTTP status of the answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower::{Layer, Service};

use super::metrics::METRICS;

/// The Kubernetes verb of a request, from its method and query.
pub fn verb(method: &http::Method, query: Option<&str>) -> &'static str {
    let watch = query.is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    match *method {
        http::Method::GET if watch => "watch",
        http::Method::GET => "get",
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE => "delete",
        _ => "other",
    }
}

#[derive(Clone)]
pub struct ApiMetricsLayer {
    cluster: Arc<str>,
}

impl ApiMetricsLayer {
    pub fn new(cluster: &str) -> Self {
        ApiMetricsLayer {
            cluster: Arc::from(cluster),
        }
    }
}

impl<S> Layer<S> for ApiMetricsLayer {
    type Service = ApiMetrics<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ApiMetrics {
            inner,
            cluster: self.cluster.clone(),
        }
    }
}

pub struct ApiMetrics<S> {
    inner: S,
    cluster: Arc<str>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, RB> Service<http::Request<B>> for ApiMetrics<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let verb = verb(req.method(), req.uri().query());
        let cluster = self.cluster.clone();
        let future = self.inner.call(req);
        Box::pin(async move {
            let result = future.await;
            let code = match &result {
                Ok(res) => res.status().as_str().to_string(),
                Err(_) => "error".to_string(),
            };
            METRICS.api_requests_total.inc(&[&cluster, verb, &code]);
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_follow_kubernetes_naming() {
        assert_eq!(
            verb(&http::Method::GET, Some("watch=true&resourceVersion=1")),
            "watch"
        );
        assert_eq!(verb(&http::Method::GET, Some("labelSelector=a")), "get");
        assert_eq!(verb(&http::Method::PUT, None), "update");
        assert_eq!(verb(&http::Method::POST, None), "create");
        assert_eq!(verb(&http::Method::PATCH, None), "patch");
    }
}
