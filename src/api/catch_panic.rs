//! The second line of defence behind request checking: a handler that
//! panics anyway is answered `INTERNAL` and counted, and the server (and
//! every other call on the connection) keeps serving.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::FutureExt;
use tower::{Layer, Service};

use crate::telemetry::grpc_layer::method_label;
use crate::telemetry::metrics::METRICS;

#[derive(Clone, Copy, Default)]
pub struct CatchPanicLayer;

impl<S> Layer<S> for CatchPanicLayer {
    type Service = CatchPanic<S>;
    fn layer(&self, inner: S) -> Self::Service {
        CatchPanic { inner }
    }
}

#[derive(Clone)]
pub struct CatchPanic<S> {
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> Service<http::Request<B>> for CatchPanic<S>
where
    S: Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let method = method_label(req.uri().path());
        // A panic while the handler is being set up, or while it runs.
        let fut = match std::panic::catch_unwind(AssertUnwindSafe(|| self.inner.call(req))) {
            Ok(fut) => fut,
            Err(_) => return Box::pin(async move { Ok(internal(method)) }),
        };
        Box::pin(async move {
            match AssertUnwindSafe(fut).catch_unwind().await {
                Ok(result) => result,
                Err(_) => Ok(internal(method)),
            }
        })
    }
}

fn internal(method: &'static str) -> http::Response<tonic::body::Body> {
    METRICS.grpc_panics_total.inc(&[method]);
    tracing::error!(rpc.method = method, "handler panicked; answered INTERNAL");
    super::errors::status(
        super::errors::Reason::HandlerPanicked,
        "the server failed to handle this request",
    )
    .into_http()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use tower::{ServiceExt, service_fn};

    #[tokio::test]
    async fn a_panicking_handler_is_answered_internal_and_counted() {
        let path = "/flotilla.v1.FleetStatus/GetMicroservice";
        let before = METRICS.encode();
        let svc = CatchPanicLayer.layer(service_fn(|r: http::Request<()>| async move {
            if r.uri().path().ends_with("GetMicroservice") {
                panic!("boom");
            }
            Ok::<_, Infallible>(tonic::Status::ok("").into_http())
        }));
        let req = http::Request::builder().uri(path).body(()).unwrap();
        let res = svc.clone().oneshot(req).await.unwrap();
        assert_eq!(res.headers()["grpc-status"], "13");
        let after = METRICS.encode();
        assert_ne!(before, after);
        assert!(after.contains(
            "flotilla_grpc_panics_total{method=\"flotilla.v1.FleetStatus/GetMicroservice\"}"
        ));
        // The service still answers the next call.
        let ok = http::Request::builder().uri("/x").body(()).unwrap();
        assert_eq!(svc.oneshot(ok).await.unwrap().headers()["grpc-status"], "0");
    }
}
