//! Serving FleetStatus: TLS (or explicit plaintext), the bearer token,
//! size limits, deadline caps, keepalive, health and optional reflection.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::net::TcpListener;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Server;
use tonic_health::ServingStatus;

use super::auth::{BearerToken, Doors};
use super::pb::fleet_rollouts_server::FleetRolloutsServer;
use super::pb::fleet_status_server::FleetStatusServer;
use super::rollouts::FleetRolloutsService;
use super::service::FleetStatusService;
use super::watch::WatchLimits;
use super::{ApiError, pb};
use crate::authz::gate::Gate;
use crate::authz::review::Reviews;
use crate::serve::streams::Streams;
use crate::serve::tls::{Alpn, Rotating, watch_files};
use crate::status::hub::Hub;
use crate::telemetry::grpc_layer::GrpcTelemetryLayer;

pub use crate::serve::tls::TlsFiles;

#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub addr: SocketAddr,
    pub tls: Option<TlsFiles>,
    /// Plaintext, for local development only; must be asked for.
    pub insecure: bool,
    pub token: Option<String>,
    /// Where the token came from: read again when it changes.
    pub token_file: Option<PathBuf>,
    /// How often the TLS files and the token file are checked for changes.
    pub reload_period: Duration,
    pub reflection: bool,
    pub max_request_bytes: usize,
    pub max_response_bytes: usize,
    /// The most one List page holds, encoded (at least one item).
    pub max_page_bytes: usize,
    /// The most every List reply not yet sent holds at once, encoded
    /// (`replies`); each call reserves `max_page_bytes` of it, and keeps
    /// what its built page holds.
    pub max_list_bytes_in_flight: usize,
    /// The most of that one connection's replies hold at once.
    pub max_list_bytes_per_connection: usize,
    /// The cap on WaitForRollout.
    pub max_wait: Duration,
    /// The cap on unary calls.
    pub unary_timeout: Duration,
    /// Open watch and wait streams this replica serves at once.
    pub max_streams: usize,
    /// A watch stream's longest life; the client resumes on another.
    pub max_stream_age: Duration,
    /// How long a stream's reader may leave its buffer full.
    pub stream_stall: Duration,
    pub bookmark_every: Duration,
    /// The token rollout mutations need; none: mutations are refused.
    pub write_token: Option<String>,
    /// Where the write token came from: read again when it changes.
    pub write_token_file: Option<PathBuf>,
    /// Caps and deadlines on connections, before any authentication.
    pub conns: crate::serve::conns::ConnLimits,
    /// Reads of members' live objects, for waits on "current".
    pub live: Option<crate::status::live::Live>,
    /// Reads of fleet-wide DNS names, for GetMicroservice's `dns` field.
    pub dns: Option<crate::dns::lookup::DnsLookup>,
    /// Bearer tokens other than the static ones are Kubernetes identities,
    /// and every call is checked against the home cluster's RBAC (#34).
    pub kube_auth: bool,
}

impl ServerOptions {
    pub fn new(addr: SocketAddr) -> Self {
        ServerOptions {
            addr,
            tls: None,
            insecure: false,
            token: None,
            token_file: None,
            reload_period: Duration::from_secs(2),
            reflection: false,
            max_request_bytes: 64 * 1024,
            max_response_bytes: 64 * 1024 * 1024,
            max_page_bytes: 256 * 1024,
            max_list_bytes_in_flight: 16 * 1024 * 1024,
            max_list_bytes_per_connection: 2 * 1024 * 1024,
            max_wait: Duration::from_secs(3600),
            unary_timeout: Duration::from_secs(30),
            max_streams: 1000,
            max_stream_age: Duration::from_secs(30 * 60),
            stream_stall: Duration::from_secs(10),
            bookmark_every: Duration::from_secs(20),
            write_token: None,
            write_token_file: None,
            conns: Default::default(),
            live: None,
            dns: None,
            kube_auth: false,
        }
    }

    pub fn validate(&self) -> Result<(), ApiError> {
        // Below one page budget, every List (or every List of a
        // connection) would take all of it, one at a time.
        for (flag, bytes) in [
            (
                "--grpc-max-list-bytes-in-flight",
                self.max_list_bytes_in_flight,
            ),
            (
                "--grpc-max-list-bytes-per-connection",
                self.max_list_bytes_per_connection,
            ),
        ] {
            if bytes < self.max_page_bytes {
                return Err(ApiError::Config(format!(
                    "{flag} ({bytes}) is less than --grpc-max-page-bytes ({}): every List would take it whole, one at a time",
                    self.max_page_bytes
                )));
            }
        }
        match (&self.tls, self.insecure) {
            (Some(_), true) => Err(ApiError::Config(
                "--grpc-insecure and --grpc-tls-cert exclude each other".into(),
            )),
            (None, false) => Err(ApiError::Config(
                "the gRPC server needs --grpc-tls-cert and --grpc-tls-key, or --grpc-insecure for plaintext".into(),
            )),
            _ => Ok(()),
        }
    }
}

/// How long open connections may take to finish once shutdown has begun
/// and every stream has been told to end.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// tonic reports an oversized request as OUT_OF_RANGE; gRPC's convention
/// (and every other implementation) says RESOURCE_EXHAUSTED.
fn oversized_is_resource_exhausted(
    mut res: http::Response<tonic::body::Body>,
) -> http::Response<tonic::body::Body> {
    let headers = res.headers_mut();
    let too_large = headers.get("grpc-status").is_some_and(|v| v == "11")
        && headers
            .get("grpc-message")
            .and_then(|m| m.to_str().ok())
            .is_some_and(|m| {
                m.contains("message%20length%20too%20large")
                    || m.contains("message length too large")
            });
    if too_large {
        headers.insert("grpc-status", http::HeaderValue::from_static("8"));
    }
    res
}

/// Binds first, so a taken port is an error at startup, not later.
pub async fn bind(opts: &ServerOptions) -> Result<TcpListener, ApiError> {
    opts.validate()?;
    TcpListener::bind(opts.addr)
        .await
        .map_err(|e| ApiError::Config(format!("--grpc-addr {}: {e}", opts.addr)))
}

/// What FleetRollouts (and the dashboard) reads and edits.
#[derive(Clone)]
pub struct RolloutSource {
    pub cache: Arc<crate::rollout::run::cache::RolloutCache>,
    /// The home cluster, for the spec edits users ask for.
    pub home: kube::Client,
}

/// The health service, NOT_SERVING until the hub is ready, and the task
/// that keeps it in step with the hub's readiness.
async fn health(
    hub: &Hub,
) -> (
    tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>,
    tokio::task::JoinHandle<()>,
) {
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_service_status("", ServingStatus::NotServing)
        .await;
    health
        .set_not_serving::<FleetStatusServer<FleetStatusService>>()
        .await;
    let mut ready = hub.readiness();
    let reporter = tokio::spawn(async move {
        loop {
            let status = if *ready.borrow_and_update() {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            for service in ["", "flotilla.v1.FleetStatus", "flotilla.v1.FleetRollouts"] {
                health.set_service_status(service, status).await;
            }
            if ready.changed().await.is_err() {
                return;
            }
        }
    });
    (health_service, reporter)
}

/// Server reflection of our services and health (`--grpc-reflection`).
fn reflection() -> Result<
    tonic_reflection::server::v1::ServerReflectionServer<
        impl tonic_reflection::server::v1::ServerReflection,
    >,
    ApiError,
> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| ApiError::Config(format!("reflection: {e}")))
}

pub async fn serve(
    hub: Arc<Hub>,
    rollouts: Option<RolloutSource>,
    opts: ServerOptions,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ApiError> {
    let (health_service, reporter) = health(&hub).await;

    // Streams end UNAVAILABLE as shutdown begins; tonic's graceful
    // shutdown would otherwise wait for them forever.
    let (stopping_tx, stopping) = tokio::sync::watch::channel(false);
    let mut stop_flag = stopping.clone();
    let shutdown = async move {
        shutdown.await;
        stopping_tx.send(true).ok();
    };
    let tls = opts
        .tls
        .clone()
        .map(|f| Rotating::load(f, Alpn::H2))
        .transpose()?;
    let token = BearerToken::new(opts.token.as_deref());
    let write = BearerToken::new(opts.write_token.as_deref());
    let credentials = crate::serve::tls::changes(&[&token, &write], tls.as_ref());
    let reviews = match (opts.kube_auth, &rollouts) {
        (false, _) => None,
        (true, Some(r)) => Some(Arc::new(Reviews::new(r.home.clone()))),
        (true, None) => {
            return Err(ApiError::Config(
                "--grpc-kube-auth needs the home cluster".into(),
            ));
        }
    };
    let gate = Gate::new(reviews, write.configured());
    let doors = Doors {
        read: token.clone(),
        write: write.clone(),
        kube: opts.kube_auth,
        client_certs: opts.tls.as_ref().is_some_and(|t| t.client_ca.is_some()),
    };
    let streams = Streams::new(opts.max_streams);
    let replies = super::replies::ReplyBudget::new(
        opts.max_list_bytes_in_flight,
        opts.max_list_bytes_per_connection,
    );
    let watch_limits = WatchLimits {
        bookmark_every: opts.bookmark_every,
        max_age: opts.max_stream_age,
    };
    let service = FleetStatusServer::new(FleetStatusService {
        hub,
        max_wait: opts.max_wait,
        streams: streams.clone(),
        stall: opts.stream_stall,
        watch: watch_limits,
        shutdown: stopping.clone(),
        credentials: credentials.clone(),
        live: opts.live.clone(),
        dns: opts.dns.clone(),
        gate: gate.clone(),
        page_bytes: opts.max_page_bytes,
        replies: replies.clone(),
    })
    .max_decoding_message_size(opts.max_request_bytes)
    .max_encoding_message_size(opts.max_response_bytes);
    let guarded = InterceptedService::new(service, doors.clone());
    let rollouts_guarded = rollouts.map(|r| {
        let service = FleetRolloutsServer::new(FleetRolloutsService {
            cache: r.cache,
            home: r.home,
            gate,
            streams: streams.clone(),
            stall: opts.stream_stall,
            max_wait: opts.max_wait,
            watch: watch_limits,
            shutdown: stopping.clone(),
            credentials,
            page_bytes: opts.max_page_bytes,
            replies,
        })
        .max_decoding_message_size(opts.max_request_bytes)
        .max_encoding_message_size(opts.max_response_bytes);
        InterceptedService::new(service, doors)
    });
    let tokens = crate::serve::tls::token_files([
        (&opts.token_file, &token),
        (&opts.write_token_file, &write),
    ]);
    let watcher = tokio::spawn(watch_files(tls.clone(), tokens, opts.reload_period));

    let reflection = opts.reflection.then(reflection).transpose()?;

    let router = Server::builder()
        .timeout(opts.unary_timeout)
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .max_concurrent_streams(Some(1024))
        .layer(GrpcTelemetryLayer)
        .layer(tower::util::MapResponseLayer::new(
            oversized_is_resource_exhausted,
        ))
        .layer(super::catch_panic::CatchPanicLayer)
        // A List reply's reservation lives as long as its unsent bytes.
        .layer(tower::util::MapResponseLayer::new(super::replies::hold))
        .add_service(health_service)
        .add_optional_service(reflection)
        .add_service(guarded)
        .add_optional_service(rollouts_guarded);
    // TLS is terminated here rather than by tonic, so that rotated files
    // apply to new connections without a restart; connections are capped
    // and deadlined before anyone authenticates (`conns`).
    let conns = crate::serve::conns::incoming(listener, tls, opts.conns, "grpc");
    let conns = tokio_stream::wrappers::ReceiverStream::new(conns).map(Ok::<_, std::io::Error>);
    let served = async {
        router
            .serve_with_incoming_shutdown(conns, shutdown)
            .await
            .map_err(|e| ApiError::Transport(e.to_string()))
    };
    // Graceful shutdown waits for every connection; a client that reads
    // nothing would hold it open forever. After the grace, stop waiting.
    let result = tokio::select! {
        r = served => r,
        _ = async {
            crate::serve::streams::shutting_down(&mut stop_flag).await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => {
            tracing::warn!("gRPC connections still open {SHUTDOWN_GRACE:?} after shutdown began; closing them");
            Ok(())
        }
    };
    reporter.abort();
    watcher.abort();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_room_or_a_share_smaller_than_a_page_is_refused() {
        type Set = fn(&mut ServerOptions, usize);
        let flags: [(&str, Set); 2] = [
            ("--grpc-max-list-bytes-in-flight", |o, b| {
                o.max_list_bytes_in_flight = b
            }),
            ("--grpc-max-list-bytes-per-connection", |o, b| {
                o.max_list_bytes_per_connection = b
            }),
        ];
        for (flag, set) in flags {
            let mut o = ServerOptions::new("127.0.0.1:0".parse().unwrap());
            o.insecure = true;
            let page = o.max_page_bytes;
            set(&mut o, page - 1);
            let err = o.validate().unwrap_err().to_string();
            assert!(
                err.contains(flag) && err.contains("--grpc-max-page-bytes"),
                "{err}"
            );
            set(&mut o, page);
            o.validate().unwrap();
        }
    }

    #[test]
    fn plaintext_must_be_asked_for_and_excludes_tls() {
        let mut o = ServerOptions::new("127.0.0.1:0".parse().unwrap());
        assert!(
            o.validate()
                .unwrap_err()
                .to_string()
                .contains("--grpc-insecure")
        );
        o.insecure = true;
        o.validate().unwrap();
        o.tls = Some(TlsFiles {
            cert: "c".into(),
            key: "k".into(),
            client_ca: None,
        });
        assert!(o.validate().unwrap_err().to_string().contains("exclude"));
    }
}
