//! The dashboard (#16) in a real headless Chromium, over WebDriver, served
//! by real replicas of a real fleet.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use flotilla::crd::Microservice;
use support::browser::{Browser, wall_ms};
use support::replicas::{
    MEMBERS, REPLICA_IDS, Replicas, STEADY_ELECTION, free_port, holders, member_clients,
    namespaces, three_replica_fleet,
};
use support::{StoppedMember, eventually, microservice, percentile, wait_condition};

const WAIT: Duration = Duration::from_secs(90);

/// The test that stops member-2 holds this exclusively.
static MEMBERS_UP: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

fn ui_args(port: u16) -> Vec<String> {
    vec![
        "--ui-addr".into(),
        format!("127.0.0.1:{port}"),
        "--ui-insecure".into(),
    ]
}

/// A replica id that the shard assignment gives no member beside REPLICA_IDS.
fn viewer_id() -> String {
    let clusters: BTreeSet<String> = MEMBERS.iter().map(|m| m.to_string()).collect();
    (1..)
        .map(|i| format!("v{i}"))
        .find(|id| {
            let mut live: BTreeSet<String> = REPLICA_IDS.iter().map(|r| r.to_string()).collect();
            live.insert(id.clone());
            let a = flotilla::fleet::shard::assign(&clusters, &live);
            !a.values().any(|r| *r == id.as_str())
        })
        .expect("an id that leads nothing")
}

async fn set_image(api: &Api<Microservice>, name: &str, image: &str) {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"image": image}})),
    )
    .await
    .expect("patch image");
}

/// Records, in the page, every state the cell passes through and when
/// (browser clock) its image first reads `image`.
const OBSERVE: &str = r#"
const [key, cluster, image] = arguments;
const seen = { states: [], at: null };
window.__observed = seen;
const read = () => {
  const c = document.querySelector(`td[data-key="${key}"][data-cluster="${cluster}"]`);
  if (!c) return;
  const s = c.dataset.state;
  if (seen.states[seen.states.length - 1] !== s) seen.states.push(s);
  const img = c.querySelector(".image");
  if (seen.at === null && img && img.textContent === image) seen.at = Date.now();
};
if (window.__observer) window.__observer.disconnect();
window.__observer = new MutationObserver(read);
window.__observer.observe(document.getElementById("matrix-body"), { childList: true, subtree: true, attributes: true });
read();
"#;

/// Tests 1, 2 and 9 of #16, the live stream's figures, and a restart of
/// the serving replica.
#[tokio::test]
async fn a_replica_that_leads_nothing_shows_the_fleet_and_follows_it_live() {
    let _up = MEMBERS_UP.read().await;
    let mut fleet = three_replica_fleet("ui").await;
    let ns = fleet.namespace.clone();
    let viewer = viewer_id();
    let port = free_port();
    fleet.replicas.extra_args = ui_args(port);
    fleet.replicas.start(&viewer);

    // todo-api at generation 2 in every member.
    for m in MEMBERS {
        let api = Api::<Microservice>::namespaced(fleet.clients[m].clone(), &ns);
        let ms = microservice("todo-api", "ghcr.io/acme/todo:1", 8080, Some(1));
        api.create(&PostParams::default(), &ms).await.unwrap();
        set_image(&api, "todo-api", "ghcr.io/acme/todo:2").await;
    }
    for m in MEMBERS {
        let api = Api::<Microservice>::namespaced(fleet.clients[m].clone(), &ns);
        wait_condition(&api, "todo-api", "Available", "True", None).await;
    }

    let browser = Browser::start("overview", None).await;
    let url = format!("http://127.0.0.1:{port}/");
    browser.open(&url).await;
    let key = format!("{ns}/todo-api");
    for m in MEMBERS {
        let text = eventually(&format!("todo-api Done 2/2 in {m}"), WAIT, || async {
            browser
                .cell(&key, m)
                .await
                .filter(|t| t.contains("Done") && t.contains("gen 2/2"))
        })
        .await;
        assert!(text.contains("ghcr.io/acme/todo:2"), "{text}");
    }
    // The fleet bar: three clusters, each led by a replica other than this one.
    let bar = browser
        .js(
            "return [...document.querySelectorAll('#clusters li')].map(li => [li.dataset.cluster, li.dataset.reach, li.innerText]);",
            vec![],
        )
        .await;
    let bar = bar.as_array().unwrap();
    assert_eq!(bar.len(), 3, "{bar:?}");
    let held = holders(&fleet.clients, &fleet.replicas.lease_name()).await;
    for entry in bar {
        let (cluster, reach, text) = (
            entry[0].as_str().unwrap(),
            entry[1].as_str().unwrap(),
            entry[2].as_str().unwrap(),
        );
        assert_eq!(reach, "Reachable", "{text}");
        let leader = held[cluster].clone().expect("a leader");
        assert_ne!(leader, viewer);
        assert!(text.contains(&format!("leader {leader}")), "{text}");
    }
    browser.screenshot("overview").await;

    // Live: image changes in member-1, each seen without a reload.
    browser.js("window.__marker = 'no reload';", vec![]).await;
    let api1 = Api::<Microservice>::namespaced(fleet.clients["member-1"].clone(), &ns);
    let mut latencies = Vec::new();
    let mut update_bytes = Vec::new();
    for i in 3..23 {
        let image = format!("ghcr.io/acme/todo:{i}");
        browser
            .js(OBSERVE, vec![json!(key), json!("member-1"), json!(image)])
            .await;
        let patched = wall_ms();
        set_image(&api1, "todo-api", &image).await;
        let seen = browser
            .until(
                "the new image in member-1's cell, then Done",
                WAIT,
                "const s = window.__observed; return s.at !== null && s.states[s.states.length - 1] === 'Done' ? s : null;",
            )
            .await;
        latencies.push(seen["at"].as_f64().unwrap() - patched);
        let states: Vec<&str> = seen["states"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        assert!(
            states.contains(&"Progressing"),
            "the cell went through Progressing: {states:?}"
        );
        update_bytes.push(
            browser
                .js("return window.flotilla.lastUpdateBytes;", vec![])
                .await
                .as_f64()
                .unwrap(),
        );
        if i == 3 {
            browser.screenshot("live-change").await;
        }
    }
    assert_eq!(
        browser.js("return window.__marker;", vec![]).await,
        "no reload"
    );
    update_bytes.sort_by(f64::total_cmp);
    let weight = flotilla::ui::assets::page_weight();
    println!(
        "figure: patch to cell over {} changes: p50 {:.0} ms, p99 {:.0} ms; bytes per update p50 {:.0}, max {:.0}; page weight {weight} bytes",
        latencies.len(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        percentile(&update_bytes, 0.5),
        update_bytes.last().unwrap(),
    );

    // The serving replica restarts: the page says so, starts over from the
    // new index (a RESET), and goes on.
    browser
        .js(
            "window.__live = []; new MutationObserver(() => window.__live.push(document.getElementById('live').dataset.state)).observe(document.getElementById('live'), { attributes: true });",
            vec![],
        )
        .await;
    let resets = browser.js("return window.flotilla.resets;", vec![]).await;
    fleet.replicas.restart(&viewer);
    browser
        .until(
            "the page back to live after the restart",
            WAIT,
            &format!("return document.getElementById('live').dataset.state === 'live' && window.flotilla.resets > {resets};"),
        )
        .await;
    let states = browser.js("return window.__live;", vec![]).await;
    assert!(
        states
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s == "reconnecting"),
        "the page showed it was reconnecting: {states}"
    );
    browser
        .js(
            OBSERVE,
            vec![json!(key), json!("member-1"), json!("ghcr.io/acme/todo:99")],
        )
        .await;
    set_image(&api1, "todo-api", "ghcr.io/acme/todo:99").await;
    browser
        .until(
            "a change after the restart",
            WAIT,
            "return window.__observed.at !== null;",
        )
        .await;
    assert_eq!(
        browser.js("return window.__marker;", vec![]).await,
        "no reload"
    );
}

/// Test 3 of #16: a member's apiserver stops; its column turns Unknown
/// with a recent last-seen time, and recovers when it returns.
#[tokio::test]
async fn a_stopped_member_shows_unknown_with_its_last_seen_time_and_recovers() {
    let _exclusive = MEMBERS_UP.write().await;
    let clients = member_clients().await;
    let (ns, _guards) = namespaces(&clients, "ui-down").await;
    let mut replicas = Replicas::new(&ns, &MEMBERS);
    let port = free_port();
    replicas.extra_args = ui_args(port);
    replicas.start("solo");
    for m in MEMBERS {
        let api = Api::<Microservice>::namespaced(clients[m].clone(), &ns);
        let ms = microservice("web", "ghcr.io/acme/web:1", 8080, Some(1));
        api.create(&PostParams::default(), &ms).await.unwrap();
    }
    let browser = Browser::start("member-down", None).await;
    let url = format!("http://127.0.0.1:{port}/");
    browser.open(&url).await;
    let key = format!("{ns}/web");
    for m in MEMBERS {
        eventually(&format!("web Done in {m}"), WAIT, || async {
            browser.cell(&key, m).await.filter(|t| t.contains("Done"))
        })
        .await;
    }

    let stopped = StoppedMember::stop("member-2");
    let stopped_at = wall_ms();
    let cell = eventually("member-2's cell Unknown", WAIT, || async {
        browser
            .cell(&key, "member-2")
            .await
            .filter(|t| t.contains("Unknown"))
    })
    .await;
    assert!(cell.contains("last seen"), "{cell}");
    let last_seen = browser
        .js(
            "const li = document.querySelector('#clusters li[data-cluster=\"member-2\"]'); return [li.dataset.reach, Date.parse(li.dataset.lastSeen)];",
            vec![],
        )
        .await;
    assert_eq!(last_seen[0], "Unreachable");
    let seen = last_seen[1].as_f64().expect("a last-seen time");
    assert!(
        (stopped_at - seen).abs() < 20_000.0,
        "last seen {:.1} s from the stop",
        (stopped_at - seen) / 1000.0
    );
    // The other columns stay Done.
    for m in ["member-1", "member-3"] {
        let t = browser.cell(&key, m).await.unwrap();
        assert!(t.contains("Done"), "{m}: {t}");
    }
    browser.screenshot("member-down").await;
    drop(stopped);
    eventually("member-2's cell Done again", WAIT, || async {
        browser
            .cell(&key, "member-2")
            .await
            .filter(|t| t.contains("Done"))
    })
    .await;
}

/// A single replica leading member-3, with the dashboard on `port`.
async fn member3_replica(
    prefix: &str,
    extra: &[&str],
) -> (
    String,
    Vec<support::TestNamespace>,
    Replicas,
    u16,
    kube::Client,
) {
    let c3 = support::client("member-3").await;
    support::ensure_crd(&c3).await;
    let clients = std::collections::BTreeMap::from([("member-3", c3.clone())]);
    let (ns, guards) = namespaces(&clients, prefix).await;
    let mut replicas = Replicas::new(&ns, &["member-3"]);
    let port = free_port();
    replicas.extra_args = extra.iter().map(|s| s.to_string()).collect();
    replicas
        .extra_args
        .extend(["--ui-addr".to_string(), format!("127.0.0.1:{port}")]);
    (ns, guards, replicas, port, c3)
}

/// Tests 4, 5 and 6 of #16: the detail view while a change is in progress
/// and during an ownership conflict; filters in the URL; hostile values
/// shown as text.
#[tokio::test]
async fn details_filters_and_hostile_values_on_a_slow_member() {
    let _up = MEMBERS_UP.read().await;
    // A request budget so small that a change stays unobserved for seconds.
    let (ns, _guards, mut replicas, port, c3) = member3_replica(
        "ui-detail",
        &[
            "--ui-insecure",
            "--cluster-qps",
            "0.5",
            "--cluster-burst",
            "1",
        ],
    )
    .await;
    // Its Lease renewals share that budget: on a loaded CI machine the
    // tests' 2 s Lease lapsed every few seconds (member-3's elector said
    // so) and each lapse cut the reconciles, so web-a never became
    // Available. A steadier Lease keeps the test about the slow member.
    replicas.election = STEADY_ELECTION.iter().map(|a| a.to_string()).collect();
    replicas.start("slow");
    let api = Api::<Microservice>::namespaced(c3.clone(), &ns);
    let mut web = microservice("web-a", "ghcr.io/acme/web:1", 8080, Some(1));
    web.metadata.labels = Some([("team".to_string(), "web".to_string())].into());
    let mut other = microservice("api-b", "ghcr.io/acme/api:1", 8080, Some(1));
    other.metadata.labels = Some([("team".to_string(), "api".to_string())].into());
    // Hostile: an image that is markup and script (no whitespace, so the
    // schema takes it; the reconciler rejects it and quotes it back).
    let payload = "<img/src=x/onerror=document.title=1><script>document.title=2</script>";
    let mut hostile = microservice("hostile", payload, 8080, Some(1));
    hostile.metadata.labels = Some([("team".to_string(), "x-script-alert-1".to_string())].into());
    for ms in [&web, &other, &hostile] {
        api.create(&PostParams::default(), ms).await.unwrap();
    }
    // Someone else's Deployment under the name of a Microservice.
    let taken: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "taken"},
        "spec": {
            "selector": {"matchLabels": {"app": "taken"}},
            "template": {"metadata": {"labels": {"app": "taken"}},
                          "spec": {"containers": [{"name": "c", "image": "other:1"}]}}
        }
    }))
    .unwrap();
    Api::<Deployment>::namespaced(c3.clone(), &ns)
        .create(&PostParams::default(), &taken)
        .await
        .unwrap();
    api.create(
        &PostParams::default(),
        &microservice("taken", "ghcr.io/acme/taken:1", 8080, Some(1)),
    )
    .await
    .unwrap();
    wait_condition(&api, "web-a", "Available", "True", None).await;
    let browser = Browser::start("detail", None).await;
    let base = format!("http://127.0.0.1:{port}/");
    // The detail view of web-a while generation 2 is not yet observed.
    browser.open(&format!("{base}?detail={ns}/web-a")).await;
    browser
        .until(
            "web-a's detail at generation 1",
            WAIT,
            "const h = document.querySelector('#detail-clusters h3'); return h && h.textContent.includes('generation 1, observed 1');",
        )
        .await;
    set_image(&api, "web-a", "ghcr.io/acme/web:2").await;
    let lagging = browser
        .until(
            "the detail showing observedGeneration behind generation",
            WAIT,
            "const h = document.querySelector('#detail-clusters h3'); return h && h.textContent.includes('generation 2, observed 1') ? document.getElementById('detail').innerText : null;",
        )
        .await;
    assert!(
        lagging.as_str().unwrap().contains("Progressing"),
        "{lagging}"
    );
    browser.screenshot("detail-lagging").await;
    browser
        .until(
            "the detail caught up",
            WAIT,
            "const h = document.querySelector('#detail-clusters h3'); return h && h.textContent.includes('generation 2, observed 2');",
        )
        .await;
    // The conflict's Warning Event in the detail of `taken`.
    browser
        .client
        .goto(&format!("{base}?detail={ns}/taken"))
        .await
        .unwrap();
    let warnings = browser
        .until(
            "the OwnershipConflict Warning",
            WAIT,
            "const w = document.querySelector('#detail-warnings li[data-reason=\"OwnershipConflict\"]'); if (w) return w.innerText; loadDetail(); return null;",
        )
        .await;
    assert!(
        warnings.as_str().unwrap().contains("member-3"),
        "{warnings}"
    );
    browser.screenshot("detail-conflict").await;

    // Filters: a label selector, then a name search; the URL keeps them.
    browser
        .client
        .goto(&format!("{base}?ns={ns}"))
        .await
        .unwrap();
    let visible = "return [...document.querySelectorAll('#matrix-body tr:not([hidden])')].map(r => r.dataset.key.split('/')[1]).sort();";
    browser
        .until(
            "four rows",
            WAIT,
            "return document.querySelectorAll('#matrix-body tr:not([hidden])').length === 4;",
        )
        .await;
    let selector = browser
        .client
        .find(fantoccini::Locator::Id("f-selector"))
        .await
        .unwrap();
    selector.send_keys("team=web").await.unwrap();
    shows(&browser, visible, json!(["web-a"])).await;
    let url = browser.client.current_url().await.unwrap();
    assert!(url.as_str().contains("selector=team%3Dweb"), "{url}");
    browser.client.refresh().await.unwrap();
    browser
        .until(
            "the filtered view after a reload",
            WAIT,
            "return document.getElementById('f-selector').value === 'team=web' && document.querySelectorAll('#matrix-body tr').length === 4;",
        )
        .await;
    shows(&browser, visible, json!(["web-a"])).await;
    browser
        .client
        .goto(&format!("{base}?ns={ns}&q=api&state=Done"))
        .await
        .unwrap();
    browser
        .until(
            "the name search",
            WAIT,
            "return document.querySelectorAll('#matrix-body tr').length === 4;",
        )
        .await;
    shows(&browser, visible, json!(["api-b"])).await;
    browser.screenshot("filters").await;

    // Hostile values are text: no element from them, no script run.
    browser
        .client
        .goto(&format!("{base}?ns={ns}&detail={ns}/hostile"))
        .await
        .unwrap();
    let cell = eventually("the hostile row", WAIT, || async {
        browser
            .cell(&format!("{ns}/hostile"), "member-3")
            .await
            .filter(|t| t.contains("<img"))
    })
    .await;
    assert!(cell.contains(payload), "shown as text: {cell}");
    browser
        .until(
            "the hostile detail",
            WAIT,
            "return document.getElementById('detail-title').textContent.endsWith('hostile') && document.querySelectorAll('#detail-clusters h3').length > 0;",
        )
        .await;
    let injected = browser
        .js(
            "return { imgs: document.querySelectorAll('img').length, scripts: document.scripts.length, title: document.title };",
            vec![],
        )
        .await;
    assert_eq!(
        injected,
        json!({"imgs": 0, "scripts": 1, "title": "Flotilla fleet"}),
        "nothing from a cluster became markup"
    );
    browser.screenshot("hostile").await;

    // Settled, the member's budget goes to the status feed's stall probe
    // alone, and it may take a tenth: two lists every 40 s here. It once
    // listed every 5 s, 0.4 of the 0.5 requests a second, and web-a was not
    // Available within 90 s on a loaded machine.
    let from = jiff::Timestamp::now();
    tokio::time::sleep(Duration::from_secs(20)).await;
    // By the time received, so a rotation of the log cannot upset it.
    let during = support::audit_log("member-3")
        .iter()
        .filter(|e| {
            e["verb"] == "list"
                && e["userAgent"] == "flotilla/slow"
                && e["objectRef"]["namespace"] == ns.as_str()
                && support::received(e) >= from
        })
        .count();
    assert!(
        during <= 4,
        "{during} lists in 20 s on a budget of 0.5 requests a second"
    );
}

/// The raw response of a GET: status line and headers, lower-cased names.
async fn head(url: &str, cookie: Option<&str>) -> (u16, Vec<(String, String)>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let mut s = tokio::net::TcpStream::connect(host).await.unwrap();
    let cookie = cookie
        .map(|c| format!("Cookie: {c}\r\n"))
        .unwrap_or_default();
    s.write_all(
        format!("GET /{path} HTTP/1.1\r\nHost: {host}\r\n{cookie}Connection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, _) = text.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let code = lines
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (code, headers)
}

/// Test 7 of #16, and the security headers: with a token, the page offers
/// only the prompt; a wrong token is refused; the right one shows the
/// fleet, and the session cookie is out of the page's reach.
#[tokio::test]
async fn with_a_token_the_page_asks_once_and_refuses_a_wrong_one() {
    let _up = MEMBERS_UP.read().await;
    let (ns, _guards, mut replicas, port, c3) = member3_replica("ui-auth", &[]).await;
    // Beside the kubeconfig directory, not in it.
    let token_file = replicas.dir.with_extension("token");
    std::fs::write(&token_file, "the-right-token\n").unwrap();
    replicas.extra_args.extend([
        "--grpc-token-file".to_string(),
        token_file.display().to_string(),
    ]);
    replicas.start("guarded");
    let api = Api::<Microservice>::namespaced(c3.clone(), &ns);
    api.create(
        &PostParams::default(),
        &microservice("web", "ghcr.io/acme/web:1", 8080, Some(1)),
    )
    .await
    .unwrap();
    let base = format!("http://127.0.0.1:{port}/");
    eventually("the dashboard answering", WAIT, || async {
        support::http_get(&base).await.filter(|(c, _)| *c == 200)
    })
    .await;

    // Every response's headers; the data refused without a session.
    let (code, headers) = head(&base, None).await;
    assert_eq!(code, 200);
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let csp = header("content-security-policy");
    assert!(
        csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(header("x-content-type-options"), "nosniff");
    let (code, _) = head(&format!("{base}api/clusters"), None).await;
    assert_eq!(code, 401);
    let (code, _) = head(&format!("{base}api/events"), Some("flotilla_ui=forged")).await;
    assert_eq!(code, 401);

    let browser = Browser::start("auth", None).await;
    browser.client.goto(&base).await.unwrap();
    browser
        .until(
            "only the token prompt",
            WAIT,
            "return !document.getElementById('login').hidden && document.getElementById('fleet').hidden;",
        )
        .await;
    assert_eq!(
        browser
            .js(
                "return document.querySelectorAll('#matrix-body tr, #clusters li').length;",
                vec![]
            )
            .await,
        json!(0)
    );
    browser.screenshot("auth-prompt").await;
    browser.sign_in("a-wrong-token").await;
    let error = browser
        .until(
            "the wrong token refused",
            WAIT,
            "const e = document.getElementById('login-error').textContent; return e || null;",
        )
        .await;
    assert!(error.as_str().unwrap().contains("refused"), "{error}");
    assert_eq!(
        browser
            .js("return document.getElementById('fleet').hidden;", vec![])
            .await,
        json!(true)
    );
    browser.sign_in("the-right-token").await;
    let key = format!("{ns}/web");
    eventually("the fleet after signing in", WAIT, || async {
        browser.cell(&key, "member-3").await
    })
    .await;
    // HttpOnly: the page's script cannot read the session.
    let cookies = browser.js("return document.cookie;", vec![]).await;
    assert!(
        !cookies.as_str().unwrap().contains("flotilla_ui"),
        "{cookies}"
    );
    // Asked once: a reload goes straight to the fleet.
    browser.client.refresh().await.unwrap();
    eventually("the fleet after a reload", WAIT, || async {
        browser.cell(&key, "member-3").await
    })
    .await;
    assert_eq!(
        browser
            .js("return document.getElementById('login').hidden;", vec![])
            .await,
        json!(true)
    );
    browser.screenshot("auth-signed-in").await;
}

/// Waits until the visible rows (by `script`) are `want`.
async fn shows(browser: &Browser, script: &str, want: serde_json::Value) {
    let w = want.clone();
    eventually(&format!("the matrix showing {want}"), WAIT, || {
        let w = w.clone();
        async move {
            let got = browser.client.execute(script, vec![]).await.ok()?;
            (got == w).then_some(())
        }
    })
    .await;
}

fn curl(args: &[&str]) -> String {
    let out = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .args(args)
        .output()
        .expect("curl");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Safe by default (#16, #30 H2): with the gRPC certificate and client CA
/// configured, the page is served over TLS only and asks for a client
/// certificate as gRPC does: no certificate, or one from another CA, reads
/// nothing (curl and Chromium). With the CA dropped (a rolling restart),
/// the token alone signs a browser in, and the session cookie is
/// `__Host-` prefixed and Secure.
#[tokio::test]
async fn with_tls_the_page_is_https_only_asks_for_client_certificates_and_its_cookie_secure() {
    let _up = MEMBERS_UP.read().await;
    let (_ns, _guards, mut replicas, port, _c3) = member3_replica("ui-tls", &[]).await;
    let pki = replicas.dir.with_extension("pki");
    std::fs::create_dir_all(&pki).unwrap();
    // The test CA, a server certificate for 127.0.0.1, client certificates
    // from it (client) and another CA (stranger), and `token`.
    support::certificates(&pki);
    let p = |f: &str| pki.join(f).display().to_string();
    let tls_args = |client_ca: bool| {
        let mut a = vec![
            "--grpc-tls-cert".to_string(),
            p("server.crt"),
            "--grpc-tls-key".into(),
            p("server.key"),
            "--grpc-token-file".into(),
            p("token"),
        ];
        if client_ca {
            a.extend(["--grpc-client-ca".to_string(), p("ca.crt")]);
        }
        a
    };
    replicas.grpc_args = tls_args(true);
    replicas.start("tls");
    let https = format!("https://127.0.0.1:{port}/");
    let ca = p("ca.crt");
    let (cert, key) = (p("client.crt"), p("client.key"));
    let as_client = |extra: &[&str]| {
        let mut a = vec![
            "--cacert",
            ca.as_str(),
            "--cert",
            cert.as_str(),
            "--key",
            key.as_str(),
        ];
        a.extend_from_slice(extra);
        curl(&a)
    };
    let code = eventually("the page over mutual TLS", WAIT, || {
        let code = as_client(&["-o", "/dev/null", "-w", "%{http_code}", &https]);
        async move { (code == "200").then_some(code) }
    })
    .await;
    assert_eq!(code, "200");
    // No client certificate, or one the CA did not sign: no data at all.
    let clusters = format!("{https}api/clusters");
    let bare = curl(&["-w", "%{http_code}", "--cacert", &ca, &clusters]);
    assert_eq!(bare, "000", "answered without a client certificate: {bare}");
    let stranger = curl(&[
        "-w",
        "%{http_code}",
        "--cacert",
        &ca,
        "--cert",
        &p("stranger.crt"),
        "--key",
        &p("stranger.key"),
        &clusters,
    ]);
    assert_eq!(
        stranger, "000",
        "answered a stranger's certificate: {stranger}"
    );
    // Plaintext to the same port gets no page.
    let plain = curl(&[
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &format!("http://127.0.0.1:{port}/"),
    ]);
    assert_ne!(plain, "200", "plaintext answered");
    // With a certificate, the token still signs in: a Secure, HttpOnly,
    // SameSite=Strict, host-only cookie that expires.
    let headers = as_client(&[
        "-D",
        "-",
        "-o",
        "/dev/null",
        "-H",
        "content-type: application/json",
        "--data",
        r#"{"token":"let-me-in"}"#,
        &format!("{https}api/login"),
    ]);
    let cookie = headers
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .unwrap_or_else(|| panic!("no cookie: {headers}"));
    for part in [
        "__Host-flotilla_ui=",
        "HttpOnly",
        "SameSite=Strict",
        "Secure",
        "Path=/",
        "Max-Age=",
    ] {
        assert!(cookie.contains(part), "{cookie}");
    }
    let wrong = as_client(&[
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-H",
        "content-type: application/json",
        "--data",
        r#"{"token":"nope"}"#,
        &format!("{https}api/login"),
    ]);
    assert_eq!(wrong, "401");
    // Chromium holds no client certificate: the handshake fails and the
    // page never loads.
    let browser = Browser::start_with("mtls", None, &["--ignore-certificate-errors"]).await;
    browser.client.goto(&https).await.ok();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        browser
            .js("return document.getElementById('fleet') === null && document.getElementById('login') === null;", vec![])
            .await,
        json!(true),
        "the page loaded without a client certificate"
    );
    browser.screenshot("mtls-refused").await;
    drop(browser);

    // The CA dropped, a rolling restart: the token alone, in the browser
    // (which does not know the test CA): the prompt, then the fleet.
    replicas.grpc_args = tls_args(false);
    replicas.restart("tls");
    eventually("the page over TLS after the restart", WAIT, || {
        let code = curl(&[
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--cacert",
            &ca,
            &https,
        ]);
        async move { (code == "200").then_some(()) }
    })
    .await;
    let browser = Browser::start_with("tls", None, &["--ignore-certificate-errors"]).await;
    browser.client.goto(&https).await.unwrap();
    browser
        .until(
            "the token prompt over HTTPS",
            WAIT,
            "return !document.getElementById('login').hidden;",
        )
        .await;
    browser.sign_in("let-me-in").await;
    browser
        .until(
            "the fleet over HTTPS",
            WAIT,
            "return document.querySelectorAll('#clusters li').length === 1 && location.protocol === 'https:';",
        )
        .await;
    browser.screenshot("tls").await;
    // Signing out asks for the token again.
    browser
        .client
        .find(fantoccini::Locator::Id("logout"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    browser
        .until(
            "the prompt after signing out",
            WAIT,
            "return !document.getElementById('login').hidden && document.getElementById('fleet').hidden;",
        )
        .await;
}

/// Usable (#16): the grid by keyboard alone, a phone-width screen, and
/// the OS's dark scheme.
#[tokio::test]
async fn the_grid_works_by_keyboard_on_a_phone_and_in_the_dark() {
    use fantoccini::key::Key;
    let _up = MEMBERS_UP.read().await;
    let (ns, _guards, mut replicas, port, c3) =
        member3_replica("ui-a11y", &["--ui-insecure"]).await;
    replicas.start("a11y");
    let api = Api::<Microservice>::namespaced(c3.clone(), &ns);
    for name in ["alpha", "beta"] {
        api.create(
            &PostParams::default(),
            &microservice(name, "ghcr.io/acme/app:1", 8080, Some(1)),
        )
        .await
        .unwrap();
    }
    let base = format!("http://127.0.0.1:{port}/?ns={ns}");
    let browser = Browser::start("a11y", None).await;
    browser.open(&base).await;
    for name in ["alpha", "beta"] {
        eventually(&format!("{name} Done"), WAIT, || async {
            browser
                .cell(&format!("{ns}/{name}"), "member-3")
                .await
                .filter(|t| t.contains("Done"))
        })
        .await;
    }
    let roles = browser
        .js(
            "return [document.getElementById('matrix').getAttribute('role'), document.querySelectorAll('[role=gridcell]').length, document.querySelectorAll('[role=row]').length];",
            vec![],
        )
        .await;
    assert_eq!(roles, json!(["grid", 2, 2]));
    // Into the grid by Tab, across and down by arrows, Enter for the detail.
    browser
        .js(
            "document.querySelector('#matrix [tabindex=\"0\"]').focus();",
            vec![],
        )
        .await;
    let key = |k: Key| char::from(k).to_string();
    let active = || async { browser.client.active_element().await.unwrap() };
    active().await.send_keys(&key(Key::Right)).await.unwrap();
    active().await.send_keys(&key(Key::Down)).await.unwrap();
    let focused = browser
        .js(
            "const a = document.activeElement; return [a.dataset.key, a.dataset.cluster];",
            vec![],
        )
        .await;
    assert_eq!(focused, json!([format!("{ns}/beta"), "member-3"]));
    active().await.send_keys(&key(Key::Enter)).await.unwrap();
    browser
        .until(
            "the detail of beta by keyboard",
            WAIT,
            "return document.getElementById('detail-title').textContent.endsWith('/beta');",
        )
        .await;

    // A phone: nothing wider than the screen but the grid's own scroller.
    browser.client.set_window_size(390, 844).await.unwrap();
    browser.client.goto(&base).await.unwrap();
    browser
        .until(
            "the matrix on a phone",
            WAIT,
            "return document.querySelectorAll('#matrix-body tr').length === 2;",
        )
        .await;
    let overflow = browser
        .js(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth;",
            vec![],
        )
        .await;
    assert_eq!(overflow, json!(0), "the page scrolls sideways on a phone");
    browser.screenshot("phone").await;
    drop(browser);

    // The OS's dark scheme.
    let dark = Browser::start_with("dark", None, &["--force-dark-mode"]).await;
    dark.client.goto(&base).await.unwrap();
    let background = dark
        .until(
            "the dark scheme",
            WAIT,
            "return document.querySelectorAll('#matrix-body tr').length === 2 ? getComputedStyle(document.body).backgroundColor : null;",
        )
        .await;
    assert_eq!(background, json!("rgb(13, 17, 23)"));
    dark.screenshot("dark").await;
}

/// Records each change of a wave's state that the rollouts view shows for
/// `key` from now on, in order, as "wave:state".
const WAVES: &str = r#"
const [key] = arguments;
window.__waves = [];
const last = {};
const read = (record) => {
  const r = document.querySelector(`article[data-rollout="${key}"]`);
  if (!r) return;
  for (const w of r.querySelectorAll("li[data-wave]")) {
    if (last[w.dataset.wave] !== w.dataset.state && record) window.__waves.push(w.dataset.wave + ":" + w.dataset.state);
    last[w.dataset.wave] = w.dataset.state;
  }
};
new MutationObserver(() => read(true)).observe(document.getElementById("rollouts"), { childList: true, subtree: true, attributes: true });
read(false);
"#;

/// Test 8 of #16: a FleetMicroservice's waves advance on screen in order,
/// and an automatic rollback is shown.
#[tokio::test]
async fn the_rollouts_view_shows_waves_in_order_and_a_rollback() {
    use flotilla::rollout::spec::RolloutPhase;
    use support::rollout::{fleet_microservice, rollout_fleet_with};
    let _up = MEMBERS_UP.read().await;
    let write_token = support::fleet_dir().join(format!("ui-write-{:08x}", rand::random::<u32>()));
    std::fs::write(&write_token, "write-me\n").unwrap();
    let mut fleet = rollout_fleet_with(
        "ui-roll",
        &[("member-1", "ring: canary\n")],
        &[
            "--grpc-write-token-file".to_string(),
            write_token.display().to_string(),
        ],
    )
    .await;
    let viewer = viewer_id();
    let port = free_port();
    fleet.replicas.extra_args = ui_args(port);
    fleet.replicas.start(&viewer);
    let canary_first = json!({
        "waves": [{"name": "canary", "clusterSelector": {"matchLabels": {"ring": "canary"}}}],
        "bake": "4s",
        "progressDeadline": "5m",
    });
    fleet
        .create(fleet_microservice(
            "api",
            "ghcr.io/acme/api:1",
            canary_first,
        ))
        .await;
    fleet
        .wait_phase("api", RolloutPhase::Complete, Duration::from_secs(120))
        .await;

    let browser = Browser::start("rollouts", None).await;
    let url = format!("http://127.0.0.1:{port}/");
    browser.open(&url).await;
    let key = format!("{}/api", fleet.namespace);
    browser
        .until(
            "api Complete on screen",
            WAIT,
            &format!(
                "const r = document.querySelector('article[data-rollout=\"{key}\"]'); return r && r.dataset.phase === 'Complete';"
            ),
        )
        .await;
    let waves: Vec<String> = browser
        .js(
            &format!(
                "return [...document.querySelectorAll('article[data-rollout=\"{key}\"] li[data-wave]')].map(w => w.dataset.wave);"
            ),
            vec![],
        )
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap().to_string())
        .collect();
    assert_eq!(waves.len(), 2, "the canary, then the rest: {waves:?}");
    assert_eq!(waves[0], "canary");

    // A counted placement shows each cluster's role and why (#32).
    let mut counted = fleet_microservice("two", "ghcr.io/acme/two:1", json!({}));
    counted["spec"]["placement"] = json!({"numberOfClusters": 2});
    fleet.create(counted).await;
    fleet
        .wait_phase("two", RolloutPhase::Complete, Duration::from_secs(120))
        .await;
    let two = format!("{}/two", fleet.namespace);
    browser
        .until(
            "two's placement on screen",
            WAIT,
            &format!(
                "const p = [...document.querySelectorAll('article[data-rollout=\"{two}\"] li[data-placed]')]; return p.length === 2 && p.every(l => l.dataset.role === 'Chosen' && /Ranked/.test(l.textContent));"
            ),
        )
        .await;

    // A good release: each wave updating, then done, the canary first.
    browser.js(WAVES, vec![json!(key)]).await;
    fleet.set_image("api", "ghcr.io/acme/api:2").await;
    fleet
        .wait_phase("api", RolloutPhase::Complete, Duration::from_secs(120))
        .await;
    let seen = browser
        .until(
            "the last wave done on screen",
            WAIT,
            &format!(
                "return window.__waves.includes('{}:Done') && window.__waves.includes('canary:Baking') ? window.__waves : null;",
                waves[1]
            ),
        )
        .await;
    let seen: Vec<String> = seen
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect();
    let at = |s: &str| {
        seen.iter()
            .position(|x| x == s)
            .unwrap_or_else(|| panic!("{s} never shown: {seen:?}"))
    };
    let rest = &waves[1];
    assert!(at("canary:Progressing") < at("canary:Baking"), "{seen:?}");
    assert!(
        at("canary:Baking") < at(&format!("{rest}:Progressing")),
        "the rest started only after the canary baked: {seen:?}"
    );
    assert!(at(&format!("{rest}:Progressing")) < at(&format!("{rest}:Done")));
    browser.screenshot("rollout-waves").await;

    // A release that never becomes ready: rolled back on the canary, shown.
    fleet
        .set_image_and_deadline("api", "ghcr.io/acme/api:never-ready", "15s")
        .await;
    fleet
        .wait_phase("api", RolloutPhase::RolledBack, Duration::from_secs(90))
        .await;
    let shown = browser
        .until(
            "the rollback on screen",
            WAIT,
            &format!(
                "const r = document.querySelector('article[data-rollout=\"{key}\"]'); return r && r.dataset.phase === 'RolledBack' && r.querySelector('.rollback') ? r.innerText : null;"
            ),
        )
        .await;
    let text = shown.as_str().unwrap();
    assert!(text.contains("Rolled back"), "{text}");
    assert!(text.contains("History (3 revisions)"), "{text}");
    browser.screenshot("rollout-rollback").await;

    // Read-only until the write token is presented: no edit buttons, and
    // an edit without it is refused.
    assert_eq!(
        browser
            .js("return [document.querySelectorAll('[data-action]').length, document.getElementById('unlock').hidden];", vec![])
            .await,
        json!([0, false])
    );
    let refused = std::process::Command::new("curl")
        .args([
            "-s",
            "--max-time",
            "10",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-X",
            "POST",
        ])
        .arg(format!("{url}api/rollouts/{key}/pause"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&refused.stdout), "403");
    browser
        .client
        .find(fantoccini::Locator::Id("unlock"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    browser.sign_in("write-me").await;
    let click = |action: &'static str| {
        let browser = &browser;
        let key = key.clone();
        async move {
            eventually(&format!("the {action} button"), WAIT, || {
                let key = key.clone();
                async move {
                    let css = format!("article[data-rollout=\"{key}\"] [data-action=\"{action}\"]");
                    let b = browser
                        .client
                        .find(fantoccini::Locator::Css(&css))
                        .await
                        .ok()?;
                    b.click().await.ok()
                }
            })
            .await
        }
    };
    let paused = |want: bool| {
        let api = fleet.api();
        async move {
            eventually(&format!("spec.paused {want}"), WAIT, || {
                let api = api.clone();
                async move { (api.get("api").await.ok()?.spec.paused == want).then_some(()) }
            })
            .await
        }
    };
    click("pause").await;
    paused(true).await;
    browser
        .until(
            "the pause on screen",
            WAIT,
            &format!("const r = document.querySelector('article[data-rollout=\"{key}\"] .phase'); return r && /^Paused|\\(paused\\)/.test(r.textContent);"),
        )
        .await;
    browser.screenshot("rollout-paused").await;
    click("resume").await;
    paused(false).await;

    // A Manual wave (#35): shown as awaiting approval, with a button for a
    // writer that approves the revision on screen.
    let gated = json!({"spec": {
        "template": {"image": "ghcr.io/acme/api:3"},
        "rollout": {
            "waves": [
                {"name": "canary", "clusterSelector": {"matchLabels": {"ring": "canary"}}},
                {"name": "rest", "clusterSelector": {}, "approval": "Manual"},
            ],
            "bake": "1s",
            "progressDeadline": "5m",
        },
    }});
    fleet
        .api()
        .patch(
            "api",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(gated),
        )
        .await
        .unwrap();
    browser
        .until(
            "the rest awaiting approval on screen",
            WAIT,
            &format!("const w = document.querySelector('article[data-rollout=\"{key}\"] li[data-wave=\"rest\"]'); return w && w.dataset.state === 'AwaitingApproval' && /awaiting approval/.test(w.textContent);"),
        )
        .await;
    browser.screenshot("rollout-awaiting-approval").await;
    click("approve").await;
    let f = fleet
        .wait_phase("api", RolloutPhase::Complete, Duration::from_secs(90))
        .await;
    let st = f.status.unwrap();
    let approval = st
        .waves
        .iter()
        .find(|w| w.name == "rest")
        .and_then(|w| w.approval.clone());
    let approval = approval.expect("the approval in status");
    assert_eq!(Some(&approval.revision), st.update_revision.as_ref());
    assert!(approval.by.starts_with("dashboard:"), "{approval:?}");
    browser
        .until(
            "who approved on screen",
            WAIT,
            &format!("const w = document.querySelector('article[data-rollout=\"{key}\"] li[data-wave=\"rest\"] .approval'); return w && /approved by dashboard:/.test(w.textContent);"),
        )
        .await;
}

/// The status line of a GET whose body may never end (an event stream);
/// the connection stays open as long as the returned stream lives.
async fn open_stream(url: &str) -> (u16, tokio::net::TcpStream) {
    use tokio::io::AsyncWriteExt;
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let mut s = tokio::net::TcpStream::connect(host).await.unwrap();
    s.write_all(format!("GET /{path} HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let code = support::status_line(&mut s).await;
    (code, s)
}

/// Bad input: more event streams than the cap are refused (503, Retry-After)
/// rather than each holding a task; a slot frees when its stream closes.
#[tokio::test]
async fn event_streams_over_the_cap_are_refused_until_one_closes() {
    use flotilla::ui::server::{UiOptions, bind, serve};
    let hub = flotilla::status::hub::Hub::new("cap-test");
    let mut opts = UiOptions::new(format!("127.0.0.1:{}", free_port()).parse().unwrap());
    opts.insecure = true;
    opts.max_streams = 2;
    let url = format!("http://{}/api/events", opts.addr);
    let listener = bind(&opts).await.unwrap();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let server = tokio::spawn(serve(hub, opts, listener, None, None, stop_rx));
    let (a, first) = open_stream(&url).await;
    let (b, _second) = open_stream(&url).await;
    assert_eq!((a, b), (200, 200));
    let (c, _) = open_stream(&url).await;
    assert_eq!(c, 503, "a third stream over a cap of 2");
    drop(first);
    eventually("a slot freed by the closed stream", WAIT, || async {
        let (code, s) = open_stream(&url).await;
        (code == 200).then_some(s)
    })
    .await;
    // Shutdown ends open streams, so the server stops.
    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the server stops with streams open")
        .unwrap()
        .unwrap();
}

/// #30 H1 on a real replica: ten event streams that never read (each from
/// its own loopback address, 4 KiB receive window) while 500 Microservices
/// change. The streams are cut within the stall limit, the replica's RSS
/// stays under 128 MiB, and SIGTERM exits within its grace with them still
/// connected.
#[tokio::test]
async fn stalled_event_streams_on_a_real_replica_are_cut_and_do_not_hold_its_memory_or_shutdown() {
    use futures::StreamExt;
    const N: usize = 500;
    // Long image names make rows of about 1 KB, as busy fleets have.
    let image = |tag: usize| format!("ghcr.io/acme/{}:{tag}", "s".repeat(200));
    let _up = MEMBERS_UP.read().await;
    let (ns, _guards, mut replicas, port, c3) =
        member3_replica("ui-stall", &["--ui-insecure"]).await;
    replicas.start("stall");
    let api = Api::<Microservice>::namespaced(c3.clone(), &ns);
    futures::stream::iter(0..N)
        .for_each_concurrent(16, |i| {
            let api = api.clone();
            async move {
                let ms = microservice(&format!("svc-{i:03}"), &image(1), 8080, Some(1));
                api.create(&PostParams::default(), &ms)
                    .await
                    .expect("create");
            }
        })
        .await;
    let base = format!("http://127.0.0.1:{port}/");
    eventually("the dashboard answering", WAIT, || async {
        support::http_get(&base).await.filter(|(c, _)| *c == 200)
    })
    .await;
    let mut held = Vec::new();
    let addr = format!("127.0.0.1:{port}");
    for i in 0..10u8 {
        let (code, s) = support::stalled_event_stream(&addr, [127, 0, 2, i + 1].into()).await;
        assert_eq!(code, 200);
        held.push(s);
    }
    // Changes while they stall: every Microservice's image, twice.
    let t0 = std::time::Instant::now();
    for round in 2..4 {
        futures::stream::iter(0..N)
            .for_each_concurrent(16, |i| {
                let api = api.clone();
                async move { set_image(&api, &format!("svc-{i:03}"), &image(round)).await }
            })
            .await;
    }
    let pid = replicas.pids()[0];
    let stalled = "flotilla_ui_streams_ended_total{reason=\"stalled\"}";
    let metrics = replicas.metrics_url("stall");
    let cut = eventually("ten streams cut as stalled", WAIT, || {
        let metrics = metrics.clone();
        async move {
            let (_, body) = support::http_get(&format!("{metrics}/metrics")).await?;
            let n: f64 = body
                .lines()
                .find_map(|l| l.strip_prefix(stalled)?.trim().parse().ok())?;
            (n >= 10.0).then_some(n)
        }
    })
    .await;
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix("VmRSS:")?
                .split_whitespace()
                .next()?
                .parse::<f64>()
                .ok()
        })
        .unwrap()
        / 1024.0;
    println!(
        "figure: {cut} stalled streams cut {:?} after the changes began; replica RSS {rss:.1} MiB",
        t0.elapsed()
    );
    assert!(
        rss < 128.0,
        "replica RSS {rss:.1} MiB with ten stalled streams"
    );
    // SIGTERM with the ten still connected: the replica exits, cleanly,
    // within its grace (the dashboard drops what is left after 5 s).
    let t1 = std::time::Instant::now();
    let mut child = replicas.sigterm("stall");
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t1.elapsed() < Duration::from_secs(30),
            "still running 30 s after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "{status:?}");
    println!(
        "figure: exited {:?} after SIGTERM with ten stalled streams",
        t1.elapsed()
    );
    drop(held);
}

/// #34 in the browser: the dashboard with `--grpc-kube-auth`, in process
/// over the real home apiserver, an index holding two teams' Microservices
/// and a rollout cache of every namespace. Signed in with team-a's
/// ServiceAccount token (`flotilla-releaser` in team-a), the page shows
/// team-a's rows and FleetMicroservice only, a Pause button and no Undo;
/// the pause lands with the identity's name, and the same edit of
/// team-b's, sent from the page by hand, is refused. No token of a static
/// door is configured: the page is not open.
#[tokio::test]
async fn a_kubernetes_identity_sees_its_own_namespace_and_only_the_buttons_it_may_use() {
    use flotilla::rollout::spec::FleetMicroservice;
    use flotilla::status::view::{Facts, Reach};
    use support::authz::{bind_cluster_role, service_account, token, until_rbac_says};
    let home = support::client("home").await;
    support::ensure_fleet_crd(&home).await;
    let id = format!("{:08x}", rand::random::<u32>());
    let (a, b) = (format!("ui-team-a-{id}"), format!("ui-team-b-{id}"));
    let _guards = [
        support::TestNamespace::create_named(&home, "home", &a).await,
        support::TestNamespace::create_named(&home, "home", &b).await,
    ];
    support::authz::apply_user_roles();
    service_account(&home, &a, "releaser").await;
    bind_cluster_role(&home, &a, "flotilla-releaser", (&a, "releaser")).await;
    until_rbac_says(
        &home,
        (&a, "releaser"),
        "pause",
        "fleetmicroservices",
        &a,
        true,
    )
    .await;
    for ns in [&a, &b] {
        let f: FleetMicroservice = support::from_json(support::rollout::fleet_microservice(
            "api",
            "ghcr.io/acme/api:1",
            json!({}),
        ));
        Api::<FleetMicroservice>::namespaced(home.clone(), ns)
            .create(&PostParams::default(), &f)
            .await
            .expect("create FleetMicroservice");
    }
    let hub = flotilla::status::hub::Hub::new("ui-kube-auth");
    hub.update(|ix| {
        ix.registry_read();
        ix.update_cluster("member-1", "file", |i| {
            i.reach = Reach::Reachable;
            i.synced = true;
        });
        for (ns, name) in [(&a, "web"), (&a, "api"), (&b, "web")] {
            let facts = Facts {
                generation: 1,
                observed_generation: 1,
                image: "a:1".into(),
                ..Default::default()
            };
            ix.upsert_microservice("member-1", (ns.clone(), name.into()), facts);
        }
    });
    let mut opts = flotilla::ui::server::UiOptions::new("127.0.0.1:0".parse().unwrap());
    opts.insecure = true;
    opts.kube_auth = true;
    let listener = flotilla::ui::server::bind(&opts).await.expect("bind");
    let base = format!("http://{}/", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (cache, watches) =
        flotilla::rollout::run::cache::RolloutCache::start(home.clone(), None, "ui-kube-auth", {
            let mut s = stopped.clone();
            async move {
                s.wait_for(|s| *s).await.ok();
            }
        });
    tokio::spawn(watches);
    let source = flotilla::api::server::RolloutSource {
        cache,
        home: home.clone(),
    };
    let server = tokio::spawn(flotilla::ui::server::serve(
        hub,
        opts,
        listener,
        None,
        Some(source),
        stopped,
    ));

    // No credential, no fleet: the page is not open.
    let (code, _) = head(&format!("{base}api/clusters"), None).await;
    assert_eq!(code, 401);
    let releaser = token(&home, &a, "releaser").await;
    let browser = Browser::start("kube-auth", None).await;
    browser.open(&base).await;
    browser
        .until(
            "the token prompt",
            WAIT,
            "return !document.getElementById('login').hidden || null;",
        )
        .await;
    browser.sign_in(&releaser).await;
    let rows = "return [...document.querySelectorAll('#matrix-body tr')].map((r) => r.dataset.key).sort();";
    shows(
        &browser,
        rows,
        json!([format!("{a}/api"), format!("{a}/web")]),
    )
    .await;
    let rollouts = "return [...document.querySelectorAll('#rollouts [data-rollout]')].map((r) => r.dataset.rollout);";
    shows(&browser, rollouts, json!([format!("{a}/api")])).await;
    let buttons = "return [...document.querySelectorAll('#rollouts [data-action]')].map((b) => b.dataset.action);";
    shows(&browser, buttons, json!(["pause"])).await;
    let who = browser
        .js("return document.getElementById('who').textContent;", vec![])
        .await;
    let name = format!("system:serviceaccount:{a}:releaser");
    assert!(who.as_str().unwrap().contains(&name), "{who}");
    let cookies = browser.js("return document.cookie;", vec![]).await;
    assert_eq!(
        cookies,
        json!(""),
        "the token's cookie is out of the page's reach"
    );
    browser.screenshot("kube-auth-team-a").await;

    // The button works, and says who pressed it.
    // Clicked by script: the list is drawn anew on every rollouts frame.
    let clicked = browser
        .js(
            "const b = document.querySelector('#rollouts [data-action=\"pause\"]'); if (b) b.click(); return !!b;",
            vec![],
        )
        .await;
    assert_eq!(clicked, json!(true));
    let api_a = Api::<FleetMicroservice>::namespaced(home.clone(), &a);
    let paused = eventually("team-a's rollout paused", WAIT, || async {
        api_a.get("api").await.ok().filter(|f| f.spec.paused)
    })
    .await;
    assert_eq!(
        paused.metadata.annotations.unwrap_or_default()["platform.example.io/last-edit-by"],
        name
    );
    shows(&browser, buttons, json!(["resume"])).await;

    // Team-b's, asked from the page by hand: refused, and left alone.
    let status = browser
        .js(
            "return fetch('/api/rollouts/' + arguments[0] + '/api/pause', {method: 'POST', headers: {'content-type': 'application/json'}, body: '{}'}).then((r) => r.status);",
            vec![json!(b)],
        )
        .await;
    assert_eq!(status, json!(403));
    let status = browser
        .js(
            "return fetch('/api/microservices/' + arguments[0] + '/web').then((r) => r.status);",
            vec![json!(b)],
        )
        .await;
    assert_eq!(status, json!(403));
    let f = Api::<FleetMicroservice>::namespaced(home.clone(), &b)
        .get("api")
        .await
        .expect("team-b's");
    assert!(!f.spec.paused, "team-b's rollout untouched");

    // The RoleBinding deleted: the open page loses team-a within 30 s
    // (the stream asks again every 3 s, rights are cached 5 s), with no
    // reload.
    support::authz::revoke(&home, &a, "flotilla-releaser-releaser").await;
    let t0 = std::time::Instant::now();
    shows(&browser, rows, json!([])).await;
    shows(&browser, rollouts, json!([])).await;
    let gone = t0.elapsed();
    println!("figure: RoleBinding deleted to the page emptied: {gone:?}");
    assert!(gone < Duration::from_secs(30), "{gone:?}");
    stop.send(true).ok();
    tokio::time::timeout(Duration::from_secs(15), server)
        .await
        .expect("the dashboard stops")
        .expect("join")
        .expect("serve");
}
