//! `/metrics` (OpenMetrics text), `/healthz` (the process runs) and
//! `/readyz` (the registry was read and every cluster's caches synced).

use std::net::SocketAddr;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::TelemetryError;
use super::metrics::{self, METRICS};

pub async fn bind(addr: SocketAddr) -> Result<TcpListener, TelemetryError> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| TelemetryError::Http(format!("--metrics-addr {addr}: {e}")))
}

pub async fn serve(
    listener: TcpListener,
    ready: watch::Receiver<bool>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), TelemetryError> {
    let router = Router::new()
        .route(
            "/metrics",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
                    METRICS.encode(),
                )
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let ready = *ready.borrow();
                async move {
                    if ready {
                        (StatusCode::OK, "ready\n")
                    } else {
                        (
                            StatusCode::SERVICE_UNAVAILABLE,
                            "not ready: registry, caches or live replicas not read yet\n",
                        )
                    }
                }
            }),
        );
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| TelemetryError::Http(e.to_string()))
}
