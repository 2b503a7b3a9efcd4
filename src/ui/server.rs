//! The dashboard's HTTP edge: the embedded page, its JSON reads, the event
//! stream, sign-in, and the security headers every response carries.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt;
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::server::TlsStream;

use super::events::{self, Frame, StreamLimits};
use super::warnings::Warnings;
use super::{UiError, assets, auth, json};
use crate::api::auth::BearerToken;
use crate::api::server::RolloutSource;
use crate::api::tls::{Rotating, TlsFiles};
use crate::rollout::edits::{self, EditError};
use crate::status::hub::Hub;

#[derive(Debug, Clone)]
pub struct UiOptions {
    pub addr: SocketAddr,
    /// The page over TLS (the gRPC server's certificate, no client CA).
    pub tls: Option<TlsFiles>,
    /// Plaintext without a token, for local development only.
    pub insecure: bool,
    pub token: Option<String>,
    pub token_file: Option<PathBuf>,
    /// The rollout API's write token: a session signed in with it may
    /// pause, resume and undo rollouts.
    pub write_token: Option<String>,
    pub limits: StreamLimits,
    /// Open event streams at once; more are refused with 503.
    pub max_streams: usize,
}

impl UiOptions {
    /// Plaintext without a token must be asked for, as for gRPC.
    pub fn validate(&self) -> Result<(), UiError> {
        if self.tls.is_none() && self.token.is_none() && !self.insecure {
            return Err(UiError::Config(
                "the dashboard needs TLS (--grpc-tls-cert) or a token (--grpc-token-file), or --ui-insecure for plaintext without either".into(),
            ));
        }
        Ok(())
    }
}

#[derive(Clone)]
struct Ctx {
    hub: Arc<Hub>,
    token: BearerToken,
    write: BearerToken,
    secure: bool,
    warnings: Option<Arc<Warnings>>,
    fleet_rollouts: Option<RolloutSource>,
    limits: StreamLimits,
    streams: Arc<tokio::sync::Semaphore>,
    shutdown: watch::Receiver<bool>,
}

/// What every response carries: scripts only from here, no framing, no
/// sniffing, no referrer.
fn secure_headers(mut res: Response) -> Response {
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    res
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::CONTENT_TYPE, "application/json")],
        json!({"error": "sign in with the access token"}).to_string(),
    )
        .into_response()
}

fn json_response(v: serde_json::Value) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

async fn session(State(ctx): State<Ctx>, headers: HeaderMap) -> Response {
    if !auth::admitted(&ctx.token, &ctx.write, &headers) {
        return unauthorized();
    }
    json_response(json!({
        "write": auth::may_write(&ctx.write, &headers),
        "writeConfigured": ctx.write.configured() && ctx.fleet_rollouts.is_some(),
    }))
}

async fn login(State(ctx): State<Ctx>, body: Bytes) -> Response {
    #[derive(serde::Deserialize)]
    struct Login {
        token: String,
    }
    let Ok(Login { token }) = serde_json::from_slice::<Login>(&body) else {
        return (StatusCode::BAD_REQUEST, "expected {\"token\": \"...\"}\n").into_response();
    };
    let value = if ctx.write.accepts(&token) {
        auth::write_session_value(&ctx.write)
    } else if ctx.token.accepts(&token) {
        auth::session_value(&ctx.token)
    } else if !ctx.token.configured() && !ctx.write.configured() {
        return StatusCode::NO_CONTENT.into_response();
    } else {
        None
    };
    match value {
        Some(value) => (
            StatusCode::NO_CONTENT,
            [(header::SET_COOKIE, auth::set_cookie(&value, ctx.secure))],
        )
            .into_response(),
        None => unauthorized(),
    }
}

async fn clusters(State(ctx): State<Ctx>, headers: HeaderMap) -> Response {
    if !auth::admitted(&ctx.token, &ctx.write, &headers) {
        return unauthorized();
    }
    let list = ctx.hub.read(|ix| {
        ix.clusters()
            .iter()
            .map(|(n, c)| json::cluster(n, c))
            .collect::<Vec<_>>()
    });
    json_response(serde_json::Value::Array(list))
}

async fn detail(
    State(ctx): State<Ctx>,
    headers: HeaderMap,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    if !auth::admitted(&ctx.token, &ctx.write, &headers) {
        return unauthorized();
    }
    let key = (ns.clone(), name.clone());
    let Some(view) = ctx.hub.read(|ix| ix.view(&key, None)) else {
        return (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "application/json")],
            json!({"error": format!("{ns}/{name} is in no cluster")}).to_string(),
        )
            .into_response();
    };
    let mut body = json::detail(&view);
    if let Some(w) = &ctx.warnings {
        let clusters: Vec<String> = view.entries.iter().map(|e| e.cluster.clone()).collect();
        let (warnings, errors) = w.for_object(&clusters, &ns, &name).await;
        body["warnings"] = json!(warnings);
        if !errors.is_empty() {
            body["warningsError"] = json!(format!("not read from {}", errors.join("; ")));
        }
    }
    json_response(body)
}

async fn rollouts(State(ctx): State<Ctx>, headers: HeaderMap) -> Response {
    if !auth::admitted(&ctx.token, &ctx.write, &headers) {
        return unauthorized();
    }
    match &ctx.fleet_rollouts {
        Some(source) => json_response(events::rollouts(&source.cache)),
        None => json_response(json!([])),
    }
}

/// Pause, resume or undo: the same edits as the gRPC rollouts API, for a
/// session signed in with its write token.
async fn edit(
    State(ctx): State<Ctx>,
    headers: HeaderMap,
    Path((ns, name, action)): Path<(String, String, String)>,
    body: Bytes,
) -> Response {
    let refuse = |code: StatusCode, error: String| {
        (
            code,
            [(header::CONTENT_TYPE, "application/json")],
            json!({"error": error}).to_string(),
        )
            .into_response()
    };
    if !auth::may_write(&ctx.write, &headers) {
        return refuse(
            StatusCode::FORBIDDEN,
            "changing rollouts needs the rollout API's write token".into(),
        );
    }
    let Some(source) = &ctx.fleet_rollouts else {
        return refuse(StatusCode::NOT_FOUND, "no rollouts here".into());
    };
    let to = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["toRevision"].as_i64())
        .unwrap_or(0);
    let done = match action.as_str() {
        "pause" => edits::set_paused(&source.home, &ns, &name, true)
            .await
            .map(|_| ()),
        "resume" => edits::set_paused(&source.home, &ns, &name, false)
            .await
            .map(|_| ()),
        "undo" => edits::undo(&source.home, &source.cache, &ns, &name, to)
            .await
            .map(|_| ()),
        other => return refuse(StatusCode::NOT_FOUND, format!("no action {other:?}")),
    };
    match done {
        Ok(()) => {
            tracing::info!(flotilla.fleet_microservice = %format!("{ns}/{name}"), action, "rollout changed from the dashboard");
            StatusCode::NO_CONTENT.into_response()
        }
        Err(EditError::Undo(m)) => refuse(StatusCode::BAD_REQUEST, m),
        Err(EditError::Kube(kube::Error::Api(s))) => refuse(
            StatusCode::from_u16(s.code).unwrap_or(StatusCode::BAD_GATEWAY),
            s.message,
        ),
        Err(e) => refuse(StatusCode::BAD_GATEWAY, e.to_string()),
    }
}

fn sse(f: Frame) -> SseEvent {
    let e = SseEvent::default().event(f.event).data(f.data);
    match f.id {
        Some(id) => e.id(id),
        None => e,
    }
}

async fn stream(State(ctx): State<Ctx>, headers: HeaderMap) -> Response {
    if !auth::admitted(&ctx.token, &ctx.write, &headers) {
        return unauthorized();
    }
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|id| events::resume_from(id, &ctx.hub.index_id));
    let Ok(slot) = ctx.streams.clone().try_acquire_owned() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "2")],
            "too many open event streams on this replica; retry\n",
        )
            .into_response();
    };
    let (tx, rx) = mpsc::channel(256);
    let feed = events::run(
        ctx.hub.clone(),
        ctx.fleet_rollouts.as_ref().map(|s| s.cache.clone()),
        resume,
        tx,
        ctx.limits,
        ctx.shutdown.clone(),
    );
    tokio::spawn(async move {
        feed.await;
        drop(slot);
    });
    let frames =
        tokio_stream::wrappers::ReceiverStream::new(rx).map(|f| Ok::<_, Infallible>(sse(f)));
    Sse::new(frames)
        .keep_alive(KeepAlive::default())
        .into_response()
}

fn router(ctx: Ctx) -> Router {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", assets::INDEX_HTML) }),
        )
        .route(
            "/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", assets::APP_JS) }),
        )
        .route(
            "/app.css",
            get(|| async { asset("text/css; charset=utf-8", assets::APP_CSS) }),
        )
        .route("/api/session", get(session))
        .route("/api/login", post(login))
        .route("/api/clusters", get(clusters))
        .route("/api/microservices/{ns}/{name}", get(detail))
        .route("/api/events", get(stream))
        .route("/api/rollouts", get(rollouts))
        .route("/api/rollouts/{ns}/{name}/{action}", post(edit))
        .with_state(ctx)
        .layer(axum::middleware::map_response(|r: Response| async move {
            secure_headers(r)
        }))
}

/// Binds first, so a taken port is an error at startup, not later.
pub async fn bind(opts: &UiOptions) -> Result<TcpListener, UiError> {
    opts.validate()?;
    TcpListener::bind(opts.addr)
        .await
        .map_err(|e| UiError::Config(format!("--ui-addr {}: {e}", opts.addr)))
}

/// TLS connections, as axum's listener.
struct TlsListener {
    conns: std::pin::Pin<
        Box<dyn futures::Stream<Item = std::io::Result<TlsStream<TcpStream>>> + Send>,
    >,
    addr: SocketAddr,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.conns.next().await {
                Some(Ok(tls)) => {
                    let peer = tls.get_ref().0.peer_addr().unwrap_or(self.addr);
                    return (tls, peer);
                }
                Some(Err(_)) => continue,
                None => std::future::pending::<()>().await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.addr)
    }
}

pub async fn serve(
    hub: Arc<Hub>,
    opts: UiOptions,
    listener: TcpListener,
    warnings: Option<Warnings>,
    fleet_rollouts: Option<RolloutSource>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), UiError> {
    let token = BearerToken::new(opts.token.as_deref());
    let write = BearerToken::new(opts.write_token.as_deref());
    let tls = opts
        .tls
        .clone()
        .map(|files| {
            Rotating::load(TlsFiles {
                client_ca: None,
                ..files
            })
        })
        .transpose()
        .map_err(|e| UiError::Config(e.to_string()))?;
    tokio::spawn(crate::api::tls::watch_files(
        tls.clone(),
        opts.token_file.clone(),
        token.clone(),
        std::time::Duration::from_secs(10),
    ));
    let ctx = Ctx {
        hub,
        token,
        write,
        secure: tls.is_some(),
        warnings: warnings.map(Arc::new),
        fleet_rollouts,
        limits: opts.limits,
        streams: Arc::new(tokio::sync::Semaphore::new(opts.max_streams)),
        shutdown: shutdown.clone(),
    };
    let app = router(ctx);
    let mut stop = shutdown.clone();
    let stopped = async move {
        stop.wait_for(|s| *s).await.ok();
    };
    let result = match tls {
        Some(tls) => {
            let addr = listener
                .local_addr()
                .map_err(|e| UiError::Serve(e.to_string()))?;
            let tcp = tokio_stream::wrappers::TcpListenerStream::new(listener);
            let conns = Box::pin(tls.accept(tcp));
            axum::serve(TlsListener { conns, addr }, app)
                .with_graceful_shutdown(stopped)
                .await
        }
        None => {
            axum::serve(listener, app)
                .with_graceful_shutdown(stopped)
                .await
        }
    };
    result.map_err(|e| UiError::Serve(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> UiOptions {
        UiOptions {
            addr: "127.0.0.1:0".parse().unwrap(),
            tls: None,
            insecure: false,
            token: None,
            token_file: None,
            write_token: None,
            limits: StreamLimits::default(),
            max_streams: 1,
        }
    }

    #[test]
    fn plaintext_without_a_token_must_be_asked_for() {
        let err = opts().validate().unwrap_err().to_string();
        assert!(err.contains("--ui-insecure"), "{err}");
        assert!(
            UiOptions {
                insecure: true,
                ..opts()
            }
            .validate()
            .is_ok()
        );
        assert!(
            UiOptions {
                token: Some("t".into()),
                ..opts()
            }
            .validate()
            .is_ok()
        );
    }

    #[test]
    fn every_response_forbids_inline_script_framing_and_sniffing() {
        let res = secure_headers(StatusCode::OK.into_response());
        let csp = res.headers()[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap();
        assert!(csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"));
        assert!(csp.contains("frame-ancestors 'none'"));
        assert_eq!(res.headers()[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
    }
}
