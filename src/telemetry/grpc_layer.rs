//! A server span and metrics for every gRPC call. The span is named after
//! the method (`flotilla.v1.FleetStatus/GetMicroservice`), carries the OTel
//! RPC attributes, and continues the caller's trace from `traceparent`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use opentelemetry::propagation::Extractor;
use tokio::time::Instant;
use tower::{Layer, Service};
use tracing::{Instrument, field};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::metrics::METRICS;

/// The methods this server has; anything else is counted as "unknown",
/// so a caller cannot mint metric labels.
const KNOWN: &[&str] = &[
    "flotilla.v1.FleetStatus/ListClusters",
    "flotilla.v1.FleetStatus/GetMicroservice",
    "flotilla.v1.FleetStatus/ListMicroservices",
    "flotilla.v1.FleetStatus/WatchMicroservices",
    "flotilla.v1.FleetStatus/WaitForRollout",
    "flotilla.v1.FleetRollouts/GetRollout",
    "flotilla.v1.FleetRollouts/ListRollouts",
    "flotilla.v1.FleetRollouts/WatchRollouts",
    "flotilla.v1.FleetRollouts/PauseRollout",
    "flotilla.v1.FleetRollouts/ResumeRollout",
    "flotilla.v1.FleetRollouts/UndoRollout",
    "flotilla.v1.FleetRollouts/ApproveWave",
    "flotilla.v1.FleetRollouts/WaitForFleetRollout",
    "grpc.health.v1.Health/Check",
    "grpc.health.v1.Health/Watch",
    "grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
];

pub fn method_label(path: &str) -> &'static str {
    let p = path.trim_start_matches('/');
    KNOWN
        .iter()
        .find(|k| **k == p)
        .copied()
        .unwrap_or("unknown")
}

/// The gRPC status of a response whose status travels in its headers
/// (every error tonic returns before the body); otherwise OK so far.
pub fn status_code(headers: &http::HeaderMap) -> tonic::Code {
    headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.parse::<i32>().ok())
        .map(tonic::Code::from)
        .unwrap_or(tonic::Code::Ok)
}

struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

#[derive(Clone, Copy, Default)]
pub struct GrpcTelemetryLayer;

impl<S> Layer<S> for GrpcTelemetryLayer {
    type Service = GrpcTelemetry<S>;
    fn layer(&self, inner: S) -> Self::Service {
        GrpcTelemetry { inner }
    }
}

#[derive(Clone)]
pub struct GrpcTelemetry<S> {
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, RB> Service<http::Request<B>> for GrpcTelemetry<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let method = method_label(req.uri().path());
        let (service, rpc) = method.split_once('/').unwrap_or((method, ""));
        let span = tracing::info_span!(
            "grpc.server",
            otel.name = method,
            otel.kind = "server",
            rpc.system = "grpc",
            rpc.service = service,
            rpc.method = rpc,
            rpc.grpc.status_code = field::Empty,
            otel.status_code = field::Empty,
            // Who called (#34): a username or a static door's name, never a token.
            enduser.id = field::Empty,
        );
        let parent =
            opentelemetry::global::get_text_map_propagator(|p| p.extract(&Headers(req.headers())));
        // A parent that cannot be attached only costs the link to the caller's trace.
        let _ = span.set_parent(parent);
        let started = Instant::now();
        let future = span.in_scope(|| self.inner.call(req));
        Box::pin(
            async move {
                let result = future.await;
                let code = match &result {
                    Ok(res) => status_code(res.headers()),
                    Err(_) => tonic::Code::Unknown,
                };
                let span = tracing::Span::current();
                span.record("rpc.grpc.status_code", code as i32);
                if code != tonic::Code::Ok {
                    span.record("otel.status_code", "ERROR");
                }
                let code_label = format!("{code:?}");
                METRICS.grpc_requests_total.inc(&[method, &code_label]);
                METRICS
                    .grpc_duration
                    .observe(&[method], started.elapsed().as_secs_f64());
                result
            }
            .instrument(span),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_the_protos_define_is_a_known_label() {
        use prost::Message;
        let set = prost_types::FileDescriptorSet::decode(crate::api::pb::FILE_DESCRIPTOR_SET)
            .expect("the descriptor set");
        let mut defined = 0;
        for file in &set.file {
            for service in &file.service {
                for method in &service.method {
                    let path = format!("{}.{}/{}", file.package(), service.name(), method.name());
                    assert_eq!(method_label(&path), path, "{path} is not in KNOWN");
                    defined += 1;
                }
            }
        }
        assert!(defined >= 13, "{defined}");
    }

    #[test]
    fn only_known_methods_become_labels() {
        assert_eq!(
            method_label("/flotilla.v1.FleetStatus/GetMicroservice"),
            "flotilla.v1.FleetStatus/GetMicroservice"
        );
        assert_eq!(method_label("/evil/made-up-label-1234"), "unknown");
    }

    #[test]
    fn the_status_comes_from_trailers_only_headers() {
        let mut h = http::HeaderMap::new();
        assert_eq!(status_code(&h), tonic::Code::Ok);
        h.insert("grpc-status", "5".parse().unwrap());
        assert_eq!(status_code(&h), tonic::Code::NotFound);
    }
}
