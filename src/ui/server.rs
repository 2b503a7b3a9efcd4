//! The dashboard's HTTP edge: the embedded page, its JSON reads, the event
//! stream, sign-in, and the security headers every response carries.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::connect_info::{ConnectInfo, Connected};
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{AppendHeaders, IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::IncomingStream;
use futures::StreamExt;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use super::auth::{self, Access, Caller};
use super::events::{self, Frame, StreamLimits};
use super::identity::{self, KubeAuth, Sight};
use super::limits::ClientStreams;
use super::warnings::Warnings;
use super::{UiError, assets, json, origin};
use crate::api::auth::BearerToken;
use crate::api::server::RolloutSource;
use crate::authz::AuthzError;
use crate::authz::access::{self as authz_access, Access as AuthzAccess, Resource, User};
use crate::authz::sign_ins::SignIns;
use crate::rollout::run::cache::RolloutCache;
use crate::rollout::run::edits::{self, EditError};
use crate::serve::conns::{self, Conn, ConnLimits};
use crate::serve::streams::{RECHECK, Revocation, Streams};
use crate::serve::tls::{Alpn, RELOAD_PERIOD, Rotating, TlsFiles};
use crate::status::hub::Hub;

#[derive(Debug, Clone)]
pub struct UiOptions {
    pub addr: SocketAddr,
    /// The page over TLS: the gRPC server's certificate and, when set, its
    /// client CA (the page then asks browsers for a client certificate,
    /// as gRPC asks its clients).
    pub tls: Option<TlsFiles>,
    /// Plaintext without a token, for local development only.
    pub insecure: bool,
    pub token: Option<String>,
    pub token_file: Option<PathBuf>,
    /// The rollout API's write token: a session signed in with it may
    /// pause, resume and undo rollouts.
    pub write_token: Option<String>,
    pub write_token_file: Option<PathBuf>,
    pub limits: StreamLimits,
    /// Open event streams at once; more are refused with 503.
    pub max_streams: usize,
    /// Open event streams per session, token or (open page) peer address;
    /// more are refused with 429.
    pub max_streams_per_client: usize,
    /// Host names an open (plaintext, no token) page answers to besides
    /// loopback ones.
    pub allowed_hosts: Vec<String>,
    pub conns: ConnLimits,
    /// Reads of fleet-wide DNS names, for the detail view.
    pub dns: Option<crate::dns::lookup::DnsLookup>,
    /// Kubernetes tokens sign in too (`--grpc-kube-auth`): each identity
    /// sees and changes what the home cluster's RBAC lets it.
    pub kube_auth: bool,
}

impl UiOptions {
    pub fn new(addr: SocketAddr) -> Self {
        UiOptions {
            addr,
            tls: None,
            insecure: false,
            token: None,
            token_file: None,
            write_token: None,
            write_token_file: None,
            limits: StreamLimits::default(),
            max_streams: 1000,
            max_streams_per_client: 8,
            allowed_hosts: Vec::new(),
            conns: ConnLimits {
                send_buffer: Some(SEND_BUFFER),
                ..ConnLimits::default()
            },
            dns: None,
            kube_auth: false,
        }
    }

    /// Plaintext without a token must be asked for, as for gRPC.
    pub fn validate(&self) -> Result<(), UiError> {
        if self.tls.is_none() && self.token.is_none() && !self.insecure {
            return Err(UiError::Config(
                "the dashboard needs TLS (--grpc-tls-cert) or a token (--grpc-token-file), or --ui-insecure for plaintext without either".into(),
            ));
        }
        Ok(())
    }

    /// Anyone who reaches the port reads the fleet: said at start-up.
    fn open_to_all(&self) -> Option<&'static str> {
        if self.kube_auth {
            return None;
        }
        match (&self.tls, &self.token) {
            (_, Some(_)) => None,
            (Some(t), None) if t.client_ca.is_some() => None,
            (Some(_), None) => Some("over TLS without a token or client certificates"),
            (None, None) => Some("in plaintext without a token (--ui-insecure)"),
        }
    }
}

/// The kernel's send buffer per dashboard connection (the kernel doubles
/// it): a 1.5 MB snapshot still crosses a 50 ms link in about a second.
pub const SEND_BUFFER: usize = 128 * 1024;

#[derive(Clone)]
struct Ctx {
    hub: Arc<Hub>,
    token: BearerToken,
    write: BearerToken,
    tls: Option<Rotating>,
    secure: bool,
    /// Plaintext with no token: answer only to loopback names.
    open_page: bool,
    allowed_hosts: Arc<Vec<String>>,
    warnings: Option<Arc<Warnings>>,
    fleet_rollouts: Option<RolloutSource>,
    dns: Option<crate::dns::lookup::DnsLookup>,
    limits: StreamLimits,
    streams: Arc<Streams>,
    per_client: Arc<ClientStreams>,
    sign_ins: Arc<Mutex<SignIns>>,
    shutdown: watch::Receiver<bool>,
    kube: Option<Arc<KubeAuth>>,
}

/// Who a request is.
enum Who {
    /// A static token's session or bearer token, or an open page.
    Static(Caller),
    /// A Kubernetes identity, with the token it came with (asked again
    /// while its stream runs).
    Kube(User, Arc<KubeAuth>, String),
}

impl Ctx {
    fn cookie_name(&self) -> &'static str {
        if self.secure {
            auth::TLS_COOKIE
        } else {
            auth::COOKIE
        }
    }

    fn caller(&self, headers: &HeaderMap) -> Option<Caller> {
        auth::caller(&self.token, &self.write, headers, self.cookie_name(), now())
    }

    fn kube_cookie_name(&self) -> &'static str {
        if self.secure {
            identity::TLS_COOKIE
        } else {
            identity::COOKIE
        }
    }

    /// The request's caller, or the response refusing it. With kube auth
    /// the page is never open: a static token, or an identity the home
    /// cluster vouches for.
    async fn who(&self, headers: &HeaderMap) -> Result<Who, Response> {
        let open_allowed = self.kube.is_none();
        if let Some(c) = self
            .caller(headers)
            .filter(|c| open_allowed || c.id.is_some())
        {
            return Ok(Who::Static(c));
        }
        let Some(kube) = &self.kube else {
            return Err(unauthorized());
        };
        let token = auth::cookies(headers, self.kube_cookie_name())
            .next()
            .or_else(|| auth::bearer(headers));
        let Some(token) = token else {
            return Err(unauthorized());
        };
        // Not charged to the client's address: the sign-in is (`login`).
        match kube.who(token, None).await {
            Ok(user) => Ok(Who::Kube(user, kube.clone(), token.to_string())),
            Err(e) => Err(refusal(e.into())),
        }
    }

    /// Everything a stream was admitted under, and `also`.
    fn revocation(&self, also: Option<watch::Receiver<u64>>) -> Revocation {
        let mut rxs = crate::serve::tls::changes(&[&self.token, &self.write], self.tls.as_ref());
        rxs.extend(also);
        Revocation::new(rxs)
    }

    fn rollout_cache(&self) -> Option<&RolloutCache> {
        self.fleet_rollouts.as_ref().map(|s| s.cache.as_ref())
    }
}

/// An authorization refusal, as the dashboard answers it.
fn refusal(status: tonic::Status) -> Response {
    let code = match status.code() {
        tonic::Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        tonic::Code::PermissionDenied => StatusCode::FORBIDDEN,
        tonic::Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    refuse(code, status.message())
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The peer, as the dashboard's listener accepted it.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

impl Connected<IncomingStream<'_, ConnListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, ConnListener>) -> Self {
        Peer(*stream.remote_addr())
    }
}

/// The host a request was sent to: Host for HTTP/1, :authority for h2.
fn host<'a>(headers: &'a HeaderMap, uri: &'a Uri) -> Option<&'a str> {
    headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| uri.authority().map(|a| a.as_str()))
}

/// What every response carries: scripts only from here, no framing, no
/// sniffing, no referrer.
fn secure_headers(mut res: Response, tls: bool) -> Response {
    let h = res.headers_mut();
    // Over TLS, browsers never try this host in plaintext again.
    if tls {
        h.insert(
            header::STRICT_TRANSPORT_SECURITY,
            HeaderValue::from_static("max-age=31536000"),
        );
    }
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
    refuse(StatusCode::UNAUTHORIZED, "sign in with the access token")
}

fn json_response(v: serde_json::Value) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

fn refuse(code: StatusCode, error: impl Into<String>) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        json!({"error": error.into()}).to_string(),
    )
        .into_response()
}

/// Writes (sign-in, sign-out, rollout edits) come from this page only,
/// as JSON.
fn refuse_write(ctx: &Ctx, headers: &HeaderMap, uri: &Uri) -> Option<Response> {
    if let Some(why) = origin::cross_origin(headers, ctx.secure, host(headers, uri)) {
        return Some(refuse(StatusCode::FORBIDDEN, why));
    }
    (!origin::is_json(headers))
        .then(|| refuse(StatusCode::UNSUPPORTED_MEDIA_TYPE, "send application/json"))
}

/// An open page answers only to the names it is reached by on this
/// machine, so a rebound DNS name reads nothing.
async fn host_check(State(ctx): State<Ctx>, req: Request, next: Next) -> Response {
    if ctx.open_page && !origin::allowed_host(host(req.headers(), req.uri()), &ctx.allowed_hosts) {
        return refuse(
            StatusCode::MISDIRECTED_REQUEST,
            "this dashboard answers only to localhost, 127.0.0.1 and --ui-allowed-hosts",
        );
    }
    next.run(req).await
}

async fn session(State(ctx): State<Ctx>, headers: HeaderMap) -> Response {
    match ctx.who(&headers).await {
        Err(refused) => refused,
        Ok(Who::Static(caller)) => json_response(json!({
            "write": caller.access == Access::Write,
            "writeConfigured": ctx.write.configured() && ctx.fleet_rollouts.is_some(),
            "signedIn": caller.id.is_some(),
        })),
        // The buttons this identity gets, by namespace.
        Ok(Who::Kube(user, kube, _)) => {
            let cache = ctx.rollout_cache();
            let may = match kube.sight(&user, &ctx.hub, cache).await {
                Ok(sight) => kube.verbs(&user, &sight, cache).await,
                Err(s) => Err(s),
            };
            match may {
                Ok(may) => json_response(json!({
                    "write": false,
                    "writeConfigured": false,
                    "signedIn": true,
                    "user": user.username,
                    "may": may,
                })),
                Err(s) => refusal(s),
            }
        }
    }
}

async fn login(
    State(ctx): State<Ctx>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    headers: HeaderMap,
    uri: Uri,
    body: Bytes,
) -> Response {
    if let Some(refused) = refuse_write(&ctx, &headers, &uri) {
        return refused;
    }
    let ip = peer.0.ip();
    let wait = ctx
        .sign_ins
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .wait(ip, std::time::Instant::now());
    if let Some(wait) = wait {
        let mut res = refuse(
            StatusCode::TOO_MANY_REQUESTS,
            "too many refused sign-ins; wait",
        );
        if let Ok(v) = HeaderValue::from_str(&wait.as_secs().max(1).to_string()) {
            res.headers_mut().insert(header::RETRY_AFTER, v);
        }
        return res;
    }
    #[derive(serde::Deserialize)]
    struct Login {
        token: String,
    }
    let Ok(Login { token }) = serde_json::from_slice::<Login>(&body) else {
        return (StatusCode::BAD_REQUEST, "expected {\"token\": \"...\"}\n").into_response();
    };
    let access = if ctx.write.accepts(&token) {
        Some(Access::Write)
    } else if ctx.token.accepts(&token) {
        Some(Access::Read)
    } else if !ctx.token.configured() && !ctx.write.configured() && ctx.kube.is_none() {
        return StatusCode::NO_CONTENT.into_response();
    } else {
        None
    };
    // Not a static token: a Kubernetes one, when the home cluster is asked.
    if let (None, Some(kube)) = (access, &ctx.kube)
        && identity::cookie_safe(&token)
    {
        match kube.who(&token, Some(ip)).await {
            Ok(user) => {
                ctx.sign_ins
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .succeeded(ip);
                tracing::info!(enduser.id = %user.username, peer = %peer.0, "dashboard sign-in");
                return (
                    StatusCode::NO_CONTENT,
                    [(header::SET_COOKIE, identity::set_cookie(&token, ctx.secure))],
                )
                    .into_response();
            }
            Err(AuthzError::Unauthenticated(_)) => {}
            Err(e) => return refusal(e.into()),
        }
    }
    let mut sign_ins = ctx.sign_ins.lock().unwrap_or_else(|e| e.into_inner());
    let id = auth::new_id();
    match access.and_then(|a| auth::issue(&ctx.token, &ctx.write, a, now(), &id)) {
        Some(value) => {
            sign_ins.succeeded(ip);
            tracing::info!(session = %id, peer = %peer.0, ?access, "dashboard sign-in");
            (
                StatusCode::NO_CONTENT,
                [(header::SET_COOKIE, auth::set_cookie(&value, ctx.secure))],
            )
                .into_response()
        }
        None => {
            sign_ins.failed(ip, std::time::Instant::now());
            tracing::info!(peer = %peer.0, "dashboard sign-in refused");
            unauthorized()
        }
    }
}

/// Ends the session in this browser. A copied cookie stays valid until it
/// expires or its token rotates: sessions are not stored anywhere.
async fn logout(State(ctx): State<Ctx>, headers: HeaderMap, uri: Uri) -> Response {
    if let Some(refused) = refuse_write(&ctx, &headers, &uri) {
        return refused;
    }
    (
        StatusCode::NO_CONTENT,
        AppendHeaders([
            (header::SET_COOKIE, auth::clear_cookie(ctx.secure)),
            (header::SET_COOKIE, identity::clear_cookie(ctx.secure)),
        ]),
    )
        .into_response()
}

async fn clusters(State(ctx): State<Ctx>, headers: HeaderMap) -> Response {
    match ctx.who(&headers).await {
        Err(refused) => return refused,
        Ok(Who::Static(_)) => {}
        Ok(Who::Kube(user, kube, _)) => {
            let access = AuthzAccess::new("list", Resource::MemberClusters);
            if let Err(s) = kube.require(&user, &access).await {
                return refusal(s);
            }
        }
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
    let who = match ctx.who(&headers).await {
        Ok(who) => who,
        Err(refused) => return refused,
    };
    // Names reach the members' apiservers: validated as gRPC does.
    if let Err(e) = crate::api::request::key(&ns, &name) {
        return refuse(StatusCode::BAD_REQUEST, e.to_string());
    }
    if let Who::Kube(user, kube, _) = &who {
        let access = AuthzAccess::new("get", Resource::Microservices)
            .in_namespace(&ns)
            .named(&name);
        if let Err(s) = kube.require(user, &access).await {
            return refusal(s);
        }
    }
    let key = (ns.clone(), name.clone());
    let snap = ctx.hub.read(|ix| ix.snapshot());
    let Some(view) = snap.view(&key, None) else {
        return refuse(
            StatusCode::NOT_FOUND,
            format!("{ns}/{name} is in no cluster"),
        );
    };
    let mut body = json::detail(&view);
    if let Some(dns) = &ctx.dns {
        let answer = dns.answer(&snap, Some(&view), &ns, &name).await;
        body["dns"] = json::dns(answer);
    }
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
    let sight = match ctx.who(&headers).await {
        Err(refused) => return refused,
        Ok(Who::Static(_)) => Sight::everything(),
        Ok(Who::Kube(user, kube, _)) => {
            match kube.sight(&user, &ctx.hub, ctx.rollout_cache()).await {
                Ok(sight) => sight,
                Err(s) => return refusal(s),
            }
        }
    };
    match &ctx.fleet_rollouts {
        Some(source) => json_response(events::rollouts(&source.cache, &sight)),
        None => json_response(json!([])),
    }
}

/// Pause, resume or undo: the same edits as the gRPC rollouts API, for a
/// session signed in with its write token, from this page.
async fn edit(
    State(ctx): State<Ctx>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    headers: HeaderMap,
    uri: Uri,
    Path((ns, name, action)): Path<(String, String, String)>,
    body: Bytes,
) -> Response {
    let needs_write = || {
        refuse(
            StatusCode::FORBIDDEN,
            "changing rollouts needs the rollout API's write token",
        )
    };
    let who = match ctx.who(&headers).await {
        Ok(Who::Static(c)) if c.access != Access::Write => return needs_write(),
        Ok(who) => who,
        // Static tokens only: whatever the session was, the write token
        // is what is missing (a rotated one's old sessions included).
        Err(_) if ctx.kube.is_none() => return needs_write(),
        Err(refused) => return refused,
    };
    if let Some(refused) = refuse_write(&ctx, &headers, &uri) {
        return refused;
    }
    // Names go into the home apiserver's URL unescaped: no `/`, `?`, `%`.
    if let Err(e) = crate::api::request::key(&ns, &name) {
        return refuse(StatusCode::BAD_REQUEST, e.to_string());
    }
    let Some(source) = &ctx.fleet_rollouts else {
        return refuse(StatusCode::NOT_FOUND, "no rollouts here");
    };
    let body = serde_json::from_slice::<serde_json::Value>(&body).unwrap_or_default();
    let to = body["toRevision"].as_i64().unwrap_or(0);
    let text = |field: &str| body[field].as_str().unwrap_or_default().to_string();
    let verb = match action.as_str() {
        "pause" => authz_access::PAUSE,
        "resume" => authz_access::RESUME,
        "undo" => authz_access::UNDO,
        "approve" => authz_access::APPROVE,
        other => return refuse(StatusCode::NOT_FOUND, format!("no action {other:?}")),
    };
    let by = match &who {
        // The dashboard's write sessions all hold the one write token. A
        // session id is half of a cookie: only its digest's prefix is
        // written.
        Who::Static(caller) => match caller.id.as_deref() {
            Some(id) => format!("dashboard:{}", BearerToken::fingerprint(id)),
            None => "dashboard:write-token".into(),
        },
        // The verb itself, in this namespace, on this object.
        Who::Kube(user, kube, _) => {
            let access = AuthzAccess::new(verb, Resource::FleetMicroservices)
                .in_namespace(&ns)
                .named(&name);
            if let Err(s) = kube.require(user, &access).await {
                return refusal(s);
            }
            user.username.clone()
        }
    };
    let done = match action.as_str() {
        "pause" => edits::set_paused(&source.home, &ns, &name, true, &by)
            .await
            .map(|_| ()),
        "resume" => edits::set_paused(&source.home, &ns, &name, false, &by)
            .await
            .map(|_| ()),
        "undo" => edits::undo(&source.home, &source.cache, &ns, &name, to, &by)
            .await
            .map(|_| ()),
        "approve" => {
            let (wave, revision) = (text("wave"), text("revision"));
            let key = (ns.as_str(), name.as_str());
            edits::approve(&source.home, &source.cache, key, &wave, &revision, &by)
                .await
                .map(|_| ())
        }
        other => return refuse(StatusCode::NOT_FOUND, format!("no action {other:?}")),
    };
    match done {
        Ok(()) => {
            tracing::info!(
                flotilla.fleet_microservice = %format!("{ns}/{name}"),
                action,
                enduser.id = %by,
                peer = %peer.0,
                "rollout changed from the dashboard"
            );
            StatusCode::NO_CONTENT.into_response()
        }
        Err(EditError::Undo(m) | EditError::Approve(m)) => refuse(StatusCode::BAD_REQUEST, m),
        Err(EditError::Kube(kube::Error::Api(s))) => refuse(
            StatusCode::from_u16(s.code).unwrap_or(StatusCode::BAD_GATEWAY),
            s.message,
        ),
        Err(e) => refuse(StatusCode::BAD_GATEWAY, e.to_string()),
    }
}

/// Every `RECHECK`, the identity's token and view, asked again; once
/// either is not what the stream was opened with (or cannot be asked),
/// `changed` moves and the stream ends.
async fn recheck_sight(
    (user, kube, token): (User, Arc<KubeAuth>, String),
    sight: Sight,
    ctx: Ctx,
    changed: watch::Sender<u64>,
) {
    loop {
        tokio::time::sleep(RECHECK).await;
        let now = match kube.who(&token, None).await {
            Ok(u) if u == user => kube.sight(&u, &ctx.hub, ctx.rollout_cache()).await.ok(),
            _ => None,
        };
        if now.as_ref() != Some(&sight) {
            changed.send_modify(|n| *n += 1);
            return;
        }
    }
}

fn sse(f: Frame) -> SseEvent {
    let e = SseEvent::default().event(f.event).data(f.data);
    match f.id {
        Some(id) => e.id(id),
        None => e,
    }
}

async fn stream(
    State(ctx): State<Ctx>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    headers: HeaderMap,
) -> Response {
    let who = match ctx.who(&headers).await {
        Ok(who) => who,
        Err(refused) => return refused,
    };
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|id| events::resume_from(id, &ctx.hub.index_id));
    let (client, sight, resume, kube) = match who {
        // A share per session (or token); on an open page, per address.
        Who::Static(caller) => (
            caller.id.unwrap_or_else(|| peer.0.ip().to_string()),
            Sight::everything(),
            resume,
            None,
        ),
        // Per identity. A view that may have narrowed since the browser's
        // last event is not resumed: what left it would never be deleted.
        Who::Kube(user, kube, token) => {
            match kube.sight(&user, &ctx.hub, ctx.rollout_cache()).await {
                Ok(sight) => (
                    format!("user:{}", user.username),
                    sight,
                    None,
                    Some((user, kube, token)),
                ),
                Err(s) => return refusal(s),
            }
        }
    };
    let Some(share) = ctx.per_client.open(&client) else {
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, "5")],
            "this client holds as many event streams as it may; close one\n",
        )
            .into_response();
    };
    let Ok(slot) = ctx.streams.open() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "2")],
            "too many open event streams on this replica; retry\n",
        )
            .into_response();
    };
    let (out, inbox) = crate::serve::streams::channel(slot, ctx.limits.stall);
    // An identity's token and view are asked again while the stream runs;
    // a change ends it, and the browser reconnects into its new view.
    let (recheck, changed) = match kube {
        Some((user, kube, token)) => {
            let (tx, rx) = watch::channel(0u64);
            let task = recheck_sight((user, kube, token), sight.clone(), ctx.clone(), tx);
            (Some(tokio::spawn(task)), Some(rx))
        }
        None => (None, None),
    };
    let feed = events::run(
        (
            ctx.hub.clone(),
            ctx.fleet_rollouts.as_ref().map(|s| s.cache.clone()),
            sight,
        ),
        resume,
        out,
        ctx.limits,
        ctx.shutdown.clone(),
        ctx.revocation(changed),
    );
    tokio::spawn(async move {
        feed.await;
        drop(share);
        if let Some(task) = recheck {
            task.abort();
        }
    });
    // An end (stall, age, revocation, shutdown) is the last event; the
    // browser then reconnects with its last event id.
    let frames = inbox.map(|item| {
        Ok::<_, Infallible>(match item {
            Ok(f) => sse(f),
            Err(status) => SseEvent::default()
                .event("end")
                .data(json!({"reason": status.message()}).to_string()),
        })
    });
    Sse::new(frames)
        .keep_alive(KeepAlive::default())
        .into_response()
}

fn router(ctx: Ctx) -> Router {
    let secure = ctx.secure;
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
        .route("/api/logout", post(logout))
        .route("/api/clusters", get(clusters))
        .route("/api/microservices/{ns}/{name}", get(detail))
        .route("/api/events", get(stream))
        .route("/api/rollouts", get(rollouts))
        .route("/api/rollouts/{ns}/{name}/{action}", post(edit))
        .layer(axum::middleware::from_fn_with_state(
            ctx.clone(),
            host_check,
        ))
        .with_state(ctx)
        .layer(axum::middleware::map_response(
            move |r: Response| async move { secure_headers(r, secure) },
        ))
}

/// Binds first, so a taken port is an error at startup, not later.
pub async fn bind(opts: &UiOptions) -> Result<TcpListener, UiError> {
    opts.validate()?;
    TcpListener::bind(opts.addr)
        .await
        .map_err(|e| UiError::Config(format!("--ui-addr {}: {e}", opts.addr)))
}

/// Connections through `conns` (capped, deadlined, TLS when configured),
/// as axum's listener.
pub struct ConnListener {
    conns: mpsc::Receiver<Conn>,
    addr: SocketAddr,
}

impl axum::serve::Listener for ConnListener {
    type Io = Conn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.conns.recv().await {
            Some(conn) => {
                let peer = conn.peer;
                (conn, peer)
            }
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.addr)
    }
}

/// How long open connections may take to finish once shutdown began and
/// every stream was told to end; a client that reads nothing would hold
/// graceful shutdown open forever.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

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
        .map(|files| Rotating::load(files, Alpn::H2OrHttp11))
        .transpose()
        .map_err(|e| UiError::Config(e.to_string()))?;
    if let Some(how) = opts.open_to_all() {
        tracing::warn!(addr = %opts.addr, "the dashboard is served {how}: anyone who reaches it reads the fleet");
    }
    let tokens = crate::serve::tls::token_files([
        (&opts.token_file, &token),
        (&opts.write_token_file, &write),
    ]);
    let watcher = tokio::spawn(crate::serve::tls::watch_files(
        tls.clone(),
        tokens,
        RELOAD_PERIOD,
    ));
    let addr = listener
        .local_addr()
        .map_err(|e| UiError::Serve(e.to_string()))?;
    let kube = match (opts.kube_auth, &fleet_rollouts) {
        (false, _) => None,
        (true, Some(source)) => Some(Arc::new(KubeAuth::new(source.home.clone()))),
        (true, None) => {
            return Err(UiError::Config(
                "--grpc-kube-auth needs the home cluster".into(),
            ));
        }
    };
    let ctx = Ctx {
        hub,
        open_page: tls.is_none() && opts.token.is_none() && !opts.kube_auth,
        token,
        write,
        secure: tls.is_some(),
        tls: tls.clone(),
        allowed_hosts: Arc::new(opts.allowed_hosts.clone()),
        warnings: warnings.map(Arc::new),
        fleet_rollouts,
        dns: opts.dns.clone(),
        limits: opts.limits,
        streams: Streams::new(opts.max_streams),
        per_client: ClientStreams::new(opts.max_streams_per_client),
        sign_ins: Arc::new(Mutex::new(SignIns::new(
            10,
            Duration::from_secs(60),
            10_000,
        ))),
        shutdown: shutdown.clone(),
        kube,
    };
    let app = router(ctx).into_make_service_with_connect_info::<Peer>();
    let mut stop = shutdown.clone();
    let stopped = async move {
        stop.wait_for(|s| *s).await.ok();
    };
    let listener = ConnListener {
        conns: conns::incoming(listener, tls, opts.conns, "ui"),
        addr,
    };
    let served = axum::serve(listener, app).with_graceful_shutdown(stopped);
    let mut stop_flag = shutdown.clone();
    let result = tokio::select! {
        r = served => r.map_err(|e| UiError::Serve(e.to_string())),
        _ = async {
            crate::serve::streams::shutting_down(&mut stop_flag).await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => {
            tracing::warn!("dashboard connections still open {SHUTDOWN_GRACE:?} after shutdown began; closing them");
            Ok(())
        }
    };
    watcher.abort();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> UiOptions {
        UiOptions::new("127.0.0.1:0".parse().unwrap())
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
    fn a_page_open_to_anyone_is_named_at_start_up() {
        let tls = |ca: bool| TlsFiles {
            cert: "c".into(),
            key: "k".into(),
            client_ca: ca.then(|| "ca".into()),
        };
        let with = |tls: Option<TlsFiles>, token: Option<&str>| UiOptions {
            tls,
            token: token.map(String::from),
            insecure: true,
            ..opts()
        };
        assert!(with(Some(tls(true)), None).open_to_all().is_none(), "mTLS");
        assert!(with(Some(tls(false)), Some("t")).open_to_all().is_none());
        assert!(with(Some(tls(false)), None).open_to_all().is_some());
        assert!(with(None, None).open_to_all().is_some());
    }

    #[test]
    fn every_response_forbids_inline_script_framing_and_sniffing() {
        let res = secure_headers(StatusCode::OK.into_response(), false);
        assert!(
            !res.headers()
                .contains_key(header::STRICT_TRANSPORT_SECURITY)
        );
        let tls = secure_headers(StatusCode::OK.into_response(), true);
        assert_eq!(
            tls.headers()[header::STRICT_TRANSPORT_SECURITY],
            "max-age=31536000"
        );
        let csp = res.headers()[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap();
        assert!(csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"));
        assert!(csp.contains("frame-ancestors 'none'"));
        assert_eq!(res.headers()[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
    }
}
