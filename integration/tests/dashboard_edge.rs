//! The dashboard's doors (#30), each over a real socket against the
//! product's own server (`ui::server::serve`) fed from an index in this
//! process: streams that never read, shutdown with them open, the
//! per-client share, silent connections, cross-origin and non-JSON writes,
//! sign-in guessing, token rotation, and rebound host names.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use flotilla::status::hub::Hub;
use flotilla::status::view::{Facts, Reach, Replicas};
use flotilla::ui::server::{UiOptions, bind, serve};
use support::eventually;
use support::replicas::free_port;

const WAIT: Duration = Duration::from_secs(30);

/// A served dashboard; stopped (and awaited) by `stop`.
struct Served {
    addr: String,
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<(), flotilla::ui::UiError>>,
}

impl Served {
    async fn start(hub: Arc<Hub>, opts: UiOptions) -> Self {
        let addr = opts.addr.to_string();
        let listener = bind(&opts).await.expect("bind");
        let (stop, rx) = watch::channel(false);
        let task = tokio::spawn(serve(hub, opts, listener, None, None, rx));
        Served { addr, stop, task }
    }

    /// Stops the server; it must be gone within `limit`.
    async fn stop_within(self, limit: Duration) -> Duration {
        let t0 = Instant::now();
        self.stop.send(true).unwrap();
        tokio::time::timeout(limit, self.task)
            .await
            .expect("the server stops within its limit")
            .unwrap()
            .unwrap();
        t0.elapsed()
    }
}

fn options() -> UiOptions {
    let mut o = UiOptions::new(format!("127.0.0.1:{}", free_port()).parse().unwrap());
    o.insecure = true;
    o
}

/// An index with `n` Microservices in each of three clusters.
fn hub_with(n: usize) -> Arc<Hub> {
    let hub = Hub::new("edge-test");
    hub.update(|ix| {
        ix.registry_read();
        for c in ["member-1", "member-2", "member-3"] {
            ix.update_cluster(c, "file", |i| {
                i.reach = Reach::Reachable;
                i.synced = true;
            });
            for i in 0..n {
                let key = ("shop".to_string(), format!("svc-{i:05}"));
                ix.upsert_microservice(c, key.clone(), facts(1));
                ix.upsert_replicas(c, key, Replicas::default());
            }
        }
    });
    hub
}

fn facts(generation: i64) -> Facts {
    Facts {
        generation,
        observed_generation: generation,
        image: format!("ghcr.io/acme/shop:{generation}-{}", "x".repeat(200)),
        labels: BTreeMap::from([("team".into(), "shop".into())]),
        phase: "Running".into(),
        ..Default::default()
    }
}

/// One raw HTTP/1.1 exchange: status, headers (lower-case names), body.
async fn call(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Vec<(String, String)>, String) {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut raw))
        .await
        .expect("an answer")
        .ok();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let code = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (code, headers, body.to_string())
}

/// The session cookie (`name=value`) a sign-in sets.
async fn sign_in(addr: &str, token: &str) -> String {
    let (code, headers, body) = call(
        addr,
        "POST",
        "/api/login",
        &[("content-type", "application/json")],
        &format!(r#"{{"token":"{token}"}}"#),
    )
    .await;
    assert_eq!(code, 204, "{body}");
    let set = headers
        .iter()
        .find(|(k, _)| k == "set-cookie")
        .map(|(_, v)| v.clone())
        .expect("a cookie");
    set.split(';').next().unwrap().to_string()
}

/// An event stream whose client reads nothing (from 127.0.0.1, one client).
async fn stalled_stream(addr: &str) -> (u16, TcpStream) {
    support::stalled_event_stream(addr, [127, 0, 0, 1].into()).await
}

/// H1: streams that never read are cut at the stall limit (their slots
/// free), one client holds at most its share, and shutdown ends with them
/// still connected.
#[tokio::test]
async fn streams_that_never_read_are_cut_and_shutdown_does_not_wait_for_them() {
    let hub = hub_with(2_000);
    let mut opts = options();
    opts.limits.stall = Duration::from_secs(1);
    opts.max_streams_per_client = 8;
    let served = Served::start(hub.clone(), opts).await;
    // The index keeps changing, so every stream has more to send.
    let churn = {
        let hub = hub.clone();
        tokio::spawn(async move {
            for g in 2.. {
                hub.update(|ix| {
                    for i in 0..50 {
                        let key = (
                            "shop".to_string(),
                            format!("svc-{:05}", (g * 50 + i) % 2_000),
                        );
                        ix.upsert_microservice("member-1", key, facts(g));
                    }
                });
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let mut held = Vec::new();
    for _ in 0..8 {
        let (code, s) = stalled_stream(&served.addr).await;
        assert_eq!(code, 200);
        held.push(s);
    }
    // The ninth from the same client (an open page: its address) is over its share.
    let (code, _ninth) = stalled_stream(&served.addr).await;
    assert_eq!(code, 429, "a ninth stream for one client");
    // Stalled streams end within the stall limit (plus filling the buffers):
    // the client's share is free again while all eight are still connected.
    let t0 = Instant::now();
    let (_, again) = eventually(
        "a stream admitted once the stalled ones were cut",
        WAIT,
        || async {
            let (code, s) = stalled_stream(&served.addr).await;
            (code == 200).then_some((code, s))
        },
    )
    .await;
    let cut_after = t0.elapsed();
    println!("stalled streams cut {cut_after:?} after the ninth was refused (stall 1 s)");
    assert!(cut_after < Duration::from_secs(15), "{cut_after:?}");
    held.push(again);
    // Shutdown with stalled clients still connected.
    let took = served.stop_within(Duration::from_secs(10)).await;
    println!(
        "stopped in {took:?} with {} stalled streams connected",
        held.len()
    );
    churn.abort();
}

/// M3: a client that connects and sends nothing is cut at the first-byte
/// deadline, and at most `max_connections` are held at once.
#[tokio::test]
async fn silent_connections_are_cut_and_capped() {
    let mut opts = options();
    opts.conns.first_byte = Duration::from_secs(1);
    opts.conns.max_connections = 4;
    let served = Served::start(hub_with(1), opts).await;
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(TcpStream::connect(&served.addr).await.unwrap());
    }
    // A fifth waits behind the cap: no answer while the four are held.
    let addr = served.addr.clone();
    let fifth = tokio::spawn(async move { call(&addr, "GET", "/api/clusters", &[], "").await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !fifth.is_finished(),
        "a fifth connection served over a cap of 4"
    );
    // The silent four are closed by the server within the deadline.
    let t0 = Instant::now();
    for s in &mut silent {
        let mut buf = [0u8; 16];
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .expect("closed by the server");
        assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    }
    println!("silent connections held {:?} before the cut", t0.elapsed());
    let (code, _, _) = tokio::time::timeout(WAIT, fifth).await.unwrap().unwrap();
    assert_eq!(code, 200, "the fifth served once the silent ones were cut");
    served.stop_within(Duration::from_secs(10)).await;
}

/// M2, L3, L4: writes only from this origin and as JSON; names checked;
/// sign-in guessing is slowed; sign-out clears the cookie.
#[tokio::test]
async fn cross_origin_and_non_json_writes_are_refused() {
    let mut opts = options();
    opts.insecure = false;
    opts.token = Some("reader".into());
    opts.write_token = Some("writer".into());
    let served = Served::start(hub_with(1), opts).await;
    let addr = served.addr.clone();
    let cookie = sign_in(&addr, "writer").await;
    let pause = "/api/rollouts/shop/svc/pause";
    let post = |path: &'static str, extra: Vec<(&'static str, String)>, body: &'static str| {
        let (addr, cookie) = (addr.clone(), cookie.clone());
        async move {
            let mut h: Vec<(&str, String)> = vec![("cookie", cookie)];
            h.extend(extra);
            let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
            call(&addr, "POST", path, &h, body).await.0
        }
    };
    let json = ("content-type", "application/json".to_string());
    type Case = (&'static str, &'static str, Vec<(&'static str, String)>, u16);
    let cases: Vec<Case> = vec![
        // Passes every check; this server has no rollouts, so 404.
        (
            "same origin by Sec-Fetch-Site",
            pause,
            vec![json.clone(), ("sec-fetch-site", "same-origin".into())],
            404,
        ),
        (
            "same origin by Origin",
            pause,
            vec![json.clone(), ("origin", format!("http://{addr}"))],
            404,
        ),
        // Another port on this host, a sibling site, a form.
        (
            "another port",
            pause,
            vec![json.clone(), ("origin", "http://127.0.0.1:9".into())],
            403,
        ),
        (
            "same site, another origin",
            pause,
            vec![json.clone(), ("sec-fetch-site", "same-site".into())],
            403,
        ),
        (
            "a form's text/plain",
            pause,
            vec![("content-type", "text/plain".into())],
            415,
        ),
        ("no content type", pause, vec![], 415),
        // A name that would reach a subresource.
        (
            "an escaped slash",
            "/api/rollouts/shop/svc%2Fstatus/pause",
            vec![json.clone()],
            400,
        ),
    ];
    for (what, path, headers, want) in cases {
        assert_eq!(post(path, headers, "{}").await, want, "{what}");
    }
    // The read session may not write.
    let read = sign_in(&addr, "reader").await;
    let (code, _, _) = call(
        &addr,
        "POST",
        pause,
        &[("cookie", &read), ("content-type", "application/json")],
        "{}",
    )
    .await;
    assert_eq!(code, 403);
    // Sign-in: a form from elsewhere is refused before the token is looked at.
    let (code, _, _) = call(
        &addr,
        "POST",
        "/api/login",
        &[("content-type", "text/plain")],
        r#"{"token":"writer"}"#,
    )
    .await;
    assert_eq!(code, 415);
    // Ten wrong tokens, then even the right one waits.
    for _ in 0..10 {
        let (code, _, _) = call(
            &addr,
            "POST",
            "/api/login",
            &[("content-type", "application/json")],
            r#"{"token":"guess"}"#,
        )
        .await;
        assert_eq!(code, 401);
    }
    let (code, headers, _) = call(
        &addr,
        "POST",
        "/api/login",
        &[("content-type", "application/json")],
        r#"{"token":"writer"}"#,
    )
    .await;
    assert_eq!(code, 429);
    assert!(
        headers.iter().any(|(k, _)| k == "retry-after"),
        "{headers:?}"
    );
    // Sign-out clears the cookie.
    let (code, headers, _) = call(
        &addr,
        "POST",
        "/api/logout",
        &[("content-type", "application/json")],
        "{}",
    )
    .await;
    assert_eq!(code, 204);
    let set = headers
        .iter()
        .find(|(k, _)| k == "set-cookie")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    assert!(set.contains("Max-Age=0"), "{set}");
    served.stop_within(Duration::from_secs(10)).await;
}

/// M1: the write token rotates (its sessions end within 2 s) and an open
/// stream ends when the read token rotates.
#[tokio::test]
async fn rotated_tokens_end_their_sessions_and_streams() {
    let dir = support::fleet_dir().join(format!("edge-rot-{:08x}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir).unwrap();
    let (read_file, write_file) = (dir.join("read"), dir.join("write"));
    std::fs::write(&read_file, "reader-1\n").unwrap();
    std::fs::write(&write_file, "writer-1\n").unwrap();
    let mut opts = options();
    opts.insecure = false;
    opts.token = Some("reader-1".into());
    opts.token_file = Some(read_file.clone());
    opts.write_token = Some("writer-1".into());
    opts.write_token_file = Some(write_file.clone());
    let served = Served::start(hub_with(3), opts).await;
    let addr = served.addr.clone();
    let write = sign_in(&addr, "writer-1").await;
    let edit = |cookie: String| {
        let addr = addr.clone();
        async move {
            call(
                &addr,
                "POST",
                "/api/rollouts/shop/svc/pause",
                &[("cookie", &cookie), ("content-type", "application/json")],
                "{}",
            )
            .await
            .0
        }
    };
    assert_eq!(
        edit(write.clone()).await,
        404,
        "admitted before the rotation"
    );
    std::fs::write(&write_file, "writer-2\n").unwrap();
    let t0 = Instant::now();
    eventually(
        "the old write session refused",
        Duration::from_secs(10),
        || async { (edit(write.clone()).await == 403).then_some(()) },
    )
    .await;
    let write_took = t0.elapsed();
    assert_eq!(
        edit(sign_in(&addr, "writer-2").await).await,
        404,
        "the new token signs in"
    );

    // A stream opened with the read session ends when the read token rotates.
    let read = sign_in(&addr, "reader-1").await;
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(
        format!("GET /api/events HTTP/1.1\r\nHost: {addr}\r\nCookie: {read}\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("event: synced") {
        let n = tokio::time::timeout(WAIT, s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "the stream ended before its snapshot");
        got.extend_from_slice(&buf[..n]);
    }
    std::fs::write(&read_file, "reader-2\n").unwrap();
    let t1 = Instant::now();
    // The stream's last event says why; the response then ends (the
    // connection may stay open for the next request).
    let mut rest = Vec::new();
    while !String::from_utf8_lossy(&rest).contains("\r\n0\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("the stream ends after the rotation")
            .unwrap();
        if n == 0 {
            break;
        }
        rest.extend_from_slice(&buf[..n]);
    }
    let stream_took = t1.elapsed();
    let rest = String::from_utf8_lossy(&rest);
    assert!(rest.contains("event: end"), "{rest}");
    println!(
        "write session refused {write_took:?} after the rotation; stream ended after {stream_took:?}"
    );
    served.stop_within(Duration::from_secs(10)).await;
    std::fs::remove_dir_all(&dir).ok();
}

/// L9: an open development page answers only to loopback names, so a
/// rebound DNS name reads nothing.
#[tokio::test]
async fn an_open_page_refuses_rebound_host_names() {
    let served = Served::start(hub_with(1), options()).await;
    let (code, _, _) = call(&served.addr, "GET", "/api/clusters", &[], "").await;
    assert_eq!(code, 200);
    let port = served.addr.rsplit_once(':').unwrap().1.to_string();
    for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}")] {
        let (code, _, _) = call(&served.addr, "GET", "/api/clusters", &[("host", &host)], "").await;
        assert_eq!(code, 200, "{host}");
    }
    let evil = format!("evil.example:{port}");
    let (code, _, body) = call(&served.addr, "GET", "/api/clusters", &[("host", &evil)], "").await;
    assert_eq!(code, 421, "{body}");
    let (code, _, _) = call(&served.addr, "GET", "/api/events", &[("host", &evil)], "").await;
    assert_eq!(code, 421);
    served.stop_within(Duration::from_secs(10)).await;
}
