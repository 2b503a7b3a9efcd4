//! Kubernetes-native authorization (#34): every bearer token is a
//! Kubernetes identity checked by the real home apiserver (TokenReview),
//! and every call is checked against its RBAC (SubjectAccessReview).
//!
//! The first tests run the product's own server (`api::server::serve`)
//! over a real socket, fed an index directly, so that two teams'
//! namespaces sit side by side in it (a test fleet's replicas reconcile one
//! namespace); the last runs three real replicas end to end.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::Client;
use serde_json::json;
use tokio::time::{Instant, timeout};

use flotilla::api::client::{ClientOptions, connect, connect_rollouts};
use flotilla::api::pb;
use flotilla::api::server::{RolloutSource, ServerOptions, serve};
use flotilla::rollout::run::cache::RolloutCache;
use flotilla::status::hub::Hub;
use flotilla::status::view::{Facts, Reach};
use support::authz::{
    bind_cluster_role, expired_token, grant, revoke, rules, service_account, token,
    until_rbac_says, until_refused,
};
use support::{TestNamespace, client};

/// Two teams' namespaces in home, each also holding Microservices in the
/// index; `ci` in team-a may read team-a's Microservices only.
struct Teams {
    home: Client,
    a: String,
    b: String,
    sa_uid: String,
    _guards: Vec<TestNamespace>,
}

impl Teams {
    async fn new() -> Self {
        let home = client("home").await;
        let id = format!("{:08x}", rand::random::<u32>());
        let (a, b) = (format!("team-a-{id}"), format!("team-b-{id}"));
        let guards = vec![
            TestNamespace::create_named(&home, "home", &a).await,
            TestNamespace::create_named(&home, "home", &b).await,
        ];
        let sa_uid = service_account(&home, &a, "ci").await;
        grant(
            &home,
            &a,
            "reader",
            rules(&["get", "list", "watch"], &[]),
            (&a, "ci"),
        )
        .await;
        until_rbac_says(&home, (&a, "ci"), "list", "microservices", &a, true).await;
        Teams {
            home,
            a,
            b,
            sa_uid,
            _guards: guards,
        }
    }

    fn hub(&self) -> Arc<Hub> {
        let hub = Hub::new("authz-test");
        hub.update(|ix| {
            ix.registry_read();
            ix.update_cluster("member-1", "file", |i| {
                i.reach = Reach::Reachable;
                i.synced = true;
            });
            for (ns, name) in [(&self.a, "web"), (&self.a, "api"), (&self.b, "web")] {
                ix.upsert_microservice("member-1", (ns.clone(), name.into()), facts());
            }
        });
        hub
    }
}

fn facts() -> Facts {
    Facts {
        generation: 1,
        observed_generation: 1,
        image: "a:1".into(),
        labels: BTreeMap::new(),
        ..Default::default()
    }
}

struct Server {
    url: String,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// The product's server with `--grpc-kube-auth`, its home client `home`.
async fn kube_auth_server(hub: Arc<Hub>, home: Client) -> Server {
    kube_auth_server_over(hub, home, Some("flotilla-none")).await
}

/// The same, its rollout cache over `rollouts_in` (`None`: every namespace).
async fn kube_auth_server_over(hub: Arc<Hub>, home: Client, rollouts_in: Option<&str>) -> Server {
    let mut opts = ServerOptions::new("127.0.0.1:0".parse().unwrap());
    opts.insecure = true;
    opts.kube_auth = true;
    let listener = flotilla::api::server::bind(&opts).await.expect("bind");
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (stop_cache, cache_stopped) = tokio::sync::watch::channel(false);
    let (cache, watches) = RolloutCache::start(home.clone(), rollouts_in, "authz", async move {
        let mut rx = cache_stopped;
        rx.wait_for(|s| *s).await.ok();
    });
    tokio::spawn(watches);
    tokio::spawn(async move {
        serve(
            hub,
            Some(RolloutSource { cache, home }),
            opts,
            listener,
            async {
                stopped.await.ok();
                stop_cache.send(true).ok();
            },
        )
        .await
        .expect("serve");
    });
    Server { url, _stop: stop }
}

async fn status_client(url: &str, token: Option<&str>) -> flotilla::api::client::Client {
    connect(&ClientOptions {
        server: url.to_string(),
        token: token.map(str::to_string),
        ..Default::default()
    })
    .await
    .expect("connect")
}

fn get(ns: &str, name: &str) -> pb::GetMicroserviceRequest {
    pb::GetMicroserviceRequest {
        namespace: ns.into(),
        name: name.into(),
    }
}

fn list(ns: &str) -> pb::ListMicroservicesRequest {
    pb::ListMicroservicesRequest {
        namespace: ns.into(),
        ..Default::default()
    }
}

fn watch(ns: &str) -> pb::WatchMicroservicesRequest {
    pb::WatchMicroservicesRequest {
        namespace: ns.into(),
        ..Default::default()
    }
}

/// The namespaces of a watch's next snapshot (RESET .. SYNCED), or the
/// status the stream ended with.
async fn next_snapshot(
    stream: &mut tonic::Streaming<pb::WatchEvent>,
    limit: Duration,
) -> Result<Vec<String>, tonic::Status> {
    let until = Instant::now() + limit;
    let mut items = None::<Vec<String>>;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let e = timeout(left, stream.next())
            .await
            .expect("a snapshot in time")
            .expect("the stream is open")?;
        match pb::WatchEventType::try_from(e.r#type).unwrap() {
            pb::WatchEventType::Reset => items = Some(vec![]),
            pb::WatchEventType::Snapshot => {
                if let (Some(v), Some(m)) = (items.as_mut(), e.microservice) {
                    v.push(m.namespace);
                }
            }
            pb::WatchEventType::Synced if items.is_some() => return Ok(items.unwrap()),
            _ => {}
        }
    }
}

/// Opens a watch of `ns` ("" for every namespace it may see) and checks
/// that its first snapshot holds team-a's two objects only.
async fn watching(
    c: &mut flotilla::api::client::Client,
    ns: &str,
    a: &str,
) -> tonic::Streaming<pb::WatchEvent> {
    let mut stream = c
        .watch_microservices(watch(ns))
        .await
        .expect("watch")
        .into_inner();
    let first = next_snapshot(&mut stream, Duration::from_secs(10)).await;
    assert_eq!(first.unwrap(), [a, a]);
    stream
}

/// The status a stream ends with, within `limit`; progress is skipped.
async fn ended<T: std::fmt::Debug>(
    stream: &mut tonic::Streaming<T>,
    limit: Duration,
) -> tonic::Status {
    loop {
        match timeout(limit, stream.next()).await {
            Ok(Some(Ok(_))) => continue,
            Ok(Some(Err(status))) => return status,
            other => panic!("the stream should end with a status: {other:?}"),
        }
    }
}

fn denied_total(method: &str) -> f64 {
    let text = flotilla::telemetry::metrics::METRICS.encode();
    let series = format!("flotilla_authz_denied_total{{method=\"{method}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn a_team_token_reads_its_namespace_and_nothing_of_another() {
    let teams = Teams::new().await;
    let hub = teams.hub();
    let server = kube_auth_server(hub.clone(), teams.home.clone()).await;
    let ci = token(&teams.home, &teams.a, "ci").await;
    let mut c = status_client(&server.url, Some(&ci)).await;
    let (a, b) = (teams.a.as_str(), teams.b.as_str());

    let got = c.get_microservice(get(a, "web")).await.expect("its own");
    assert_eq!(got.into_inner().namespace, a);
    let denied_before = denied_total("GetMicroservice");
    let err = c.get_microservice(get(b, "web")).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
    assert!(
        err.message().contains(&format!(
            "system:serviceaccount:{a}:ci may not get microservices"
        )),
        "{err}"
    );
    assert!(
        denied_total("GetMicroservice") > denied_before,
        "the denial is counted"
    );

    // An unscoped list shows only team-a; naming team-b is refused.
    let items = c
        .list_microservices(list(""))
        .await
        .expect("list")
        .into_inner()
        .items;
    let seen: Vec<(&str, &str)> = items
        .iter()
        .map(|m| (m.namespace.as_str(), m.name.as_str()))
        .collect();
    assert_eq!(seen, [(a, "api"), (a, "web")]);
    let err = c.list_microservices(list(b)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
    let wait = pb::WaitForRolloutRequest {
        namespace: b.into(),
        name: "web".into(),
        ..Default::default()
    };
    let err = c.wait_for_rollout(wait).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
    let err = c
        .list_clusters(pb::ListClustersRequest {})
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        tonic::Code::PermissionDenied,
        "no memberclusters right: {err}"
    );

    // An unscoped watch never sends team-b's objects, old or new.
    let mut stream = c
        .watch_microservices(watch(""))
        .await
        .expect("watch")
        .into_inner();
    let first = next_snapshot(&mut stream, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(first, [a, a]);
    hub.update(|ix| {
        ix.upsert_microservice("member-1", (b.into(), "new".into()), facts());
        ix.upsert_microservice("member-1", (a.into(), "new".into()), facts());
    });
    let e = timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("an event")
        .expect("open")
        .expect("ok");
    let m = e.microservice.expect("an object");
    assert_eq!((m.namespace.as_str(), m.name.as_str()), (a, "new"));
    let watch_b = c.watch_microservices(watch(b)).await.unwrap_err();
    assert_eq!(watch_b.code(), tonic::Code::PermissionDenied);
}

#[tokio::test]
async fn a_call_without_a_good_kubernetes_identity_is_unauthenticated() {
    let teams = Teams::new().await;
    let server = kube_auth_server(teams.hub(), teams.home.clone()).await;
    let a = teams.a.clone();
    let expired = expired_token(&a, "ci", &teams.sa_uid);
    // A ServiceAccount deleted after its token was issued.
    service_account(&teams.home, &a, "gone").await;
    let gone = token(&teams.home, &a, "gone").await;
    kube::Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(teams.home.clone(), &a)
        .delete("gone", &Default::default())
        .await
        .expect("delete");
    until_refused(&teams.home, &gone).await;
    let cases = [
        ("no token", None, ""),
        ("not a token", Some("not-a-jwt"), ""),
        (
            "forged: signed by nobody the home cluster trusts",
            Some("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"),
            "",
        ),
        ("expired", Some(expired.as_str()), "expired"),
        ("its ServiceAccount deleted", Some(gone.as_str()), ""),
    ];
    for (what, token, says) in cases {
        let mut c = status_client(&server.url, token).await;
        let err = c.get_microservice(get(&a, "web")).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated, "{what}: {err}");
        assert!(err.message().contains(says), "{what}: {err}");
    }
}

#[tokio::test]
async fn a_revoked_right_leaves_a_running_watch_within_ten_seconds() {
    let teams = Teams::new().await;
    let server = kube_auth_server(teams.hub(), teams.home.clone()).await;
    let ci = token(&teams.home, &teams.a, "ci").await;
    let mut c = status_client(&server.url, Some(&ci)).await;
    let a = teams.a.as_str();
    let mut unscoped = watching(&mut c, "", a).await;
    let mut scoped = watching(&mut c, a, a).await;
    // A wait that will not end by itself (nothing runs a:2).
    let wait = pb::WaitForRolloutRequest {
        namespace: a.into(),
        name: "web".into(),
        target: Some(pb::wait_for_rollout_request::Target::Image("a:2".into())),
        ..Default::default()
    };
    let mut waiting = c.wait_for_rollout(wait).await.expect("wait").into_inner();
    timeout(Duration::from_secs(10), waiting.next())
        .await
        .expect("first progress")
        .expect("open")
        .expect("progress");

    revoke(&teams.home, a, "reader").await;
    let revoked = Instant::now();
    // Measured from when the home cluster's own RBAC says no.
    until_rbac_says(&teams.home, (a, "ci"), "list", "microservices", a, false).await;
    // The unscoped stream starts over without team-a; the one that named
    // team-a ends, and so does the wait.
    let after = next_snapshot(&mut unscoped, Duration::from_secs(12))
        .await
        .unwrap();
    assert!(after.is_empty(), "{after:?}");
    let end = next_snapshot(&mut scoped, Duration::from_secs(12))
        .await
        .unwrap_err();
    assert_eq!(end.code(), tonic::Code::PermissionDenied, "{end}");
    let end = ended(&mut waiting, Duration::from_secs(12)).await;
    assert_eq!(end.code(), tonic::Code::PermissionDenied, "{end}");
    assert!(
        revoked.elapsed() <= Duration::from_secs(12),
        "{:?}",
        revoked.elapsed()
    );
}

/// The rollouts of the next snapshot on `events` (RESET to SYNCED), as
/// namespace/name.
async fn next_rollout_snapshot(
    events: &mut tonic::Streaming<pb::RolloutEvent>,
    within: Duration,
) -> Vec<String> {
    use pb::WatchEventType as T;
    let deadline = Instant::now() + within;
    let mut seen: Option<Vec<String>> = None;
    loop {
        let e = tokio::time::timeout_at(deadline, events.next())
            .await
            .expect("a snapshot in time")
            .expect("the stream open")
            .expect("an event");
        match (T::try_from(e.r#type), &mut seen) {
            (Ok(T::Reset), _) => seen = Some(Vec::new()),
            (Ok(T::Snapshot), Some(s)) => {
                let r = e.rollout.expect("a snapshot's rollout");
                s.push(format!("{}/{}", r.namespace, r.name));
            }
            (Ok(T::Synced), Some(s)) => return std::mem::take(s),
            _ => {}
        }
    }
}

/// #34: an unscoped WatchRollouts shows a team the namespaces it may
/// watch, and nothing of another's; when its right goes, the stream
/// starts over with RESET without them (it used to need the right in
/// every namespace, and refused the team outright).
#[tokio::test]
async fn an_unscoped_rollout_watch_shows_a_team_its_own_and_narrows_when_revoked() {
    let teams = Teams::new().await;
    let (a, b) = (teams.a.as_str(), teams.b.as_str());
    support::ensure_fleet_crd(&teams.home).await;
    for ns in [a, b] {
        let f: flotilla::rollout::spec::FleetMicroservice = serde_json::from_value(
            support::rollout::fleet_microservice("api", "ghcr.io/acme/api:1", json!({})),
        )
        .expect("a FleetMicroservice");
        kube::Api::namespaced(teams.home.clone(), ns)
            .create(&Default::default(), &f)
            .await
            .expect("create");
    }
    grant(
        &teams.home,
        a,
        "rollouts",
        rules(&[], &["watch"]),
        (a, "ci"),
    )
    .await;
    until_rbac_says(
        &teams.home,
        (a, "ci"),
        "watch",
        "fleetmicroservices",
        a,
        true,
    )
    .await;
    let server = kube_auth_server_over(teams.hub(), teams.home.clone(), None).await;
    let ci = token(&teams.home, a, "ci").await;
    let r = connect_rollouts(&ClientOptions {
        server: server.url.clone(),
        token: Some(ci),
        ..Default::default()
    })
    .await
    .expect("connect");
    // The server's rollout cache lists the home cluster first.
    let mut events = support::eventually("the watch", Duration::from_secs(30), || {
        let mut r = r.clone();
        async move {
            let unscoped = pb::WatchRolloutsRequest::default();
            r.watch_rollouts(unscoped).await.ok()
        }
    })
    .await
    .into_inner();
    let first = next_rollout_snapshot(&mut events, Duration::from_secs(20)).await;
    assert_eq!(first, vec![format!("{a}/api")], "team-b's is {b}/api");

    revoke(&teams.home, a, "rollouts").await;
    until_rbac_says(
        &teams.home,
        (a, "ci"),
        "watch",
        "fleetmicroservices",
        a,
        false,
    )
    .await;
    let after = next_rollout_snapshot(&mut events, Duration::from_secs(12)).await;
    assert!(after.is_empty(), "{after:?}");
}

#[tokio::test]
async fn a_deleted_service_account_ends_its_running_streams() {
    let teams = Teams::new().await;
    let server = kube_auth_server(teams.hub(), teams.home.clone()).await;
    let a = teams.a.as_str();
    // Its RoleBinding stays: only the token stops being anyone's.
    service_account(&teams.home, a, "short").await;
    grant(
        &teams.home,
        a,
        "short",
        rules(&["get", "list", "watch"], &[]),
        (a, "short"),
    )
    .await;
    until_rbac_says(&teams.home, (a, "short"), "list", "microservices", a, true).await;
    let short = token(&teams.home, a, "short").await;
    let mut c = status_client(&server.url, Some(&short)).await;
    let mut unscoped = watching(&mut c, "", a).await;
    kube::Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(teams.home.clone(), a)
        .delete("short", &Default::default())
        .await
        .expect("delete");
    until_refused(&teams.home, &short).await;
    // The token's 10 s in the cache, then a recheck.
    let end = ended(&mut unscoped, Duration::from_secs(20)).await;
    assert_eq!(end.code(), tonic::Code::Unauthenticated, "{end}");
}

#[tokio::test]
async fn an_unreachable_home_cluster_fails_closed() {
    let teams = Teams::new().await;
    let (yaml, upstream) = support::kubeconfig_via("home", 0);
    let gate = support::gate::Gate::start(upstream).await;
    let (yaml, _) = {
        let mut kc: serde_yaml::Value = serde_yaml::from_str(&yaml).unwrap();
        kc["clusters"][0]["cluster"]["server"] = format!("https://127.0.0.1:{}", gate.port).into();
        (serde_yaml::to_string(&kc).unwrap(), ())
    };
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&yaml).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config");
    let home_via_gate = Client::try_from(config).expect("client");
    let server = kube_auth_server(teams.hub(), home_via_gate).await;
    let a = teams.a.clone();
    let ci = token(&teams.home, &a, "ci").await;
    service_account(&teams.home, &a, "later").await;
    let later = token(&teams.home, &a, "later").await;
    let mut c = status_client(&server.url, Some(&ci)).await;
    c.get_microservice(get(&a, "web"))
        .await
        .expect("through the gate");

    gate.silence();
    // A known token (cached 10 s) once its right's 5 s have passed: the
    // SubjectAccessReview cannot be made, and that is not "allowed" (the
    // message names the review that failed, so this is not the token's).
    tokio::time::sleep(Duration::from_millis(5500)).await;
    let err = c.get_microservice(get(&a, "web")).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err}");
    assert!(err.message().contains("SubjectAccessReview"), "{err}");
    // A token never seen: its TokenReview cannot be made.
    let mut fresh = status_client(&server.url, Some(&later)).await;
    let err = fresh.get_microservice(get(&a, "web")).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err}");
    assert!(err.message().contains("could not check"), "{err}");
    assert!(err.message().contains("TokenReview"), "{err}");
    gate.release();
}

#[tokio::test]
async fn rollout_verbs_are_granted_one_by_one_through_a_replica() {
    use support::rollout::{fleet_microservice, rollout_fleet_with};
    let fleet = rollout_fleet_with(
        "authz-e2e",
        &[("member-1", "ring: canary\n")],
        &["--grpc-kube-auth".to_string()],
    )
    .await;
    let ns = fleet.namespace.clone();
    // The roles the product ships, as a user installs them.
    support::authz::apply_user_roles();
    service_account(&fleet.home, &ns, "releaser").await;
    bind_cluster_role(&fleet.home, &ns, "flotilla-releaser", (&ns, "releaser")).await;
    service_account(&fleet.home, &ns, "stranger").await;
    let releaser = token(&fleet.home, &ns, "releaser").await;
    let stranger = token(&fleet.home, &ns, "stranger").await;
    fleet
        .create(fleet_microservice(
            "api",
            "ghcr.io/acme/api:1",
            json!({
                "waves": [{"name": "canary", "clusterSelector": {"matchLabels": {"ring": "canary"}}}],
                "bake": "0s",
                "progressDeadline": "5m",
            }),
        ))
        .await;
    fleet
        .wait_phase(
            "api",
            flotilla::rollout::spec::RolloutPhase::Complete,
            Duration::from_secs(120),
        )
        .await;
    let server = fleet.replicas.grpc_url("r1");
    let rollouts = |t: &str| {
        let t = t.to_string();
        let server = server.clone();
        async move {
            connect_rollouts(&ClientOptions {
                server,
                token: Some(t),
                ..Default::default()
            })
            .await
            .expect("connect")
        }
    };
    let key = pb::RolloutRef {
        namespace: ns.clone(),
        name: "api".into(),
    };
    let mut r = rollouts(&releaser).await;
    let got = support::eventually("the rollout listed", Duration::from_secs(30), || {
        let mut r = r.clone();
        let key = key.clone();
        async move { r.get_rollout(key).await.ok() }
    })
    .await;
    assert_eq!(got.into_inner().name, "api");

    // A releaser pauses and resumes without edit rights; undo is an admin's.
    r.pause_rollout(key.clone()).await.expect("pause");
    let f = fleet.api().get("api").await.expect("get");
    assert!(f.spec.paused);
    assert_eq!(
        f.metadata.annotations.unwrap_or_default()["platform.example.io/last-edit-by"],
        format!("system:serviceaccount:{ns}:releaser")
    );
    let events =
        kube::Api::<k8s_openapi::api::events::v1::Event>::namespaced(fleet.home.clone(), &ns);
    let who = format!("paused by system:serviceaccount:{ns}:releaser");
    let event = support::eventually("the pause's Event", Duration::from_secs(10), || {
        let events = events.clone();
        let who = who.clone();
        async move {
            let list = events.list(&Default::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.reason.as_deref() == Some("PauseRequested")
                    && e.note.as_deref() == Some(who.as_str())
            })
        }
    })
    .await;
    // The edge's Event, as its edit, reads as the edge's write in the
    // apiserver's own records, never as the fleet controller's (whose
    // writes must fall inside its rollout term).
    assert_eq!(event.reporting_controller.as_deref(), Some("flotilla-api"));
    let name = event.metadata.name.clone().unwrap();
    let created = support::eventually("the Event's audit record", Duration::from_secs(10), || {
        let (ns, name) = (ns.clone(), name.clone());
        async move {
            support::audit_events_with("home", &ns)
                .into_iter()
                .find(|e| {
                    e["objectRef"]["resource"] == "events"
                        && e["objectRef"]["name"] == name.as_str()
                        && e["verb"] == "create"
                })
        }
    })
    .await;
    assert!(
        support::rollout::written_by(&created, "flotilla-api"),
        "{}",
        created["requestURI"]
    );
    let resumed = r.resume_rollout(key.clone()).await.expect("resume");
    assert!(!resumed.into_inner().paused);
    let undo = pb::UndoRolloutRequest {
        namespace: ns.clone(),
        name: "api".into(),
        to_revision: 0,
    };
    let err = r.undo_rollout(undo).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
    assert!(err.message().contains("may not undo"), "{err}");

    // The member Microservice the rollout made is readable by the
    // releaser, and by nobody without a right.
    let mut status = status_client(&server, Some(&releaser)).await;
    support::eventually(
        "the Microservice in the index",
        Duration::from_secs(60),
        || {
            let mut s = status.clone();
            let ns = ns.clone();
            async move { s.get_microservice(get(&ns, "api")).await.ok() }
        },
    )
    .await;
    let mut nobody = status_client(&server, Some(&stranger)).await;
    let err = nobody.get_microservice(get(&ns, "api")).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
    let mut nobody = rollouts(&stranger).await;
    let err = nobody.pause_rollout(key.clone()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
    // The releaser lists its namespace, and the clusters only with a
    // ClusterRoleBinding (memberclusters is cluster-wide).
    let listed = status.list_microservices(list(&ns)).await.expect("list");
    assert_eq!(listed.into_inner().items.len(), 1);
    let err = status
        .list_clusters(pb::ListClustersRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");

    // An admin binding adds undo: the call now reaches the edit, which
    // finds no earlier revision.
    bind_cluster_role(&fleet.home, &ns, "flotilla-admin", (&ns, "releaser")).await;
    let undo = pb::UndoRolloutRequest {
        namespace: ns.clone(),
        name: "api".into(),
        to_revision: 0,
    };
    let done = support::eventually("undo allowed", Duration::from_secs(15), || {
        let mut r = r.clone();
        let undo = undo.clone();
        async move {
            match r.undo_rollout(undo).await {
                Err(e) if e.code() == tonic::Code::PermissionDenied => None,
                other => Some(other),
            }
        }
    })
    .await;
    let err = done.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
    assert!(err.message().contains("no earlier revision"), "{err}");
}

/// One client sending made-up tokens: after 20 refusals in 10 s its next
/// unknown token is `RESOURCE_EXHAUSTED`, asked of nobody, while a
/// token the replica already knows keeps working from that address.
#[tokio::test]
async fn a_client_sending_made_up_tokens_is_throttled_and_a_known_token_still_passes() {
    let teams = Teams::new().await;
    let server = kube_auth_server(teams.hub(), teams.home.clone()).await;
    let a = teams.a.clone();
    let ci = token(&teams.home, &a, "ci").await;
    let mut known = status_client(&server.url, Some(&ci)).await;
    known.get_microservice(get(&a, "web")).await.expect("known");
    for i in 0..20 {
        let made_up = format!("made-up-token-{i}");
        let mut c = status_client(&server.url, Some(&made_up)).await;
        let err = c.get_microservice(get(&a, "web")).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated, "{i}: {err}");
    }
    let mut c = status_client(&server.url, Some("made-up-token-21")).await;
    let err = c.get_microservice(get(&a, "web")).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err}");
    assert!(err.message().contains("too many refused tokens"), "{err}");
    known
        .get_microservice(get(&a, "web"))
        .await
        .expect("a known token from the same address");
}

/// Every method in the service descriptor, called by a caller without the
/// right (team-a's reader naming team-b, or a cluster-wide resource):
/// `PERMISSION_DENIED`, each one. A method added without a check fails
/// here, with no change to this test. The same request naming team-a, by
/// a caller bound to `flotilla-admin` there, is not denied: the request
/// reached the check, and the check is about rights.
#[tokio::test]
async fn every_method_in_the_descriptor_denies_a_caller_without_the_right() {
    use support::raw_grpc::{encode, methods};
    let teams = Teams::new().await;
    let (a, b) = (teams.a.as_str(), teams.b.as_str());
    support::authz::apply_user_roles();
    service_account(&teams.home, a, "admin").await;
    bind_cluster_role(&teams.home, a, "flotilla-admin", (a, "admin")).await;
    until_rbac_says(
        &teams.home,
        (a, "admin"),
        "undo",
        "fleetmicroservices",
        a,
        true,
    )
    .await;
    let server = kube_auth_server(teams.hub(), teams.home.clone()).await;
    let reader = token(&teams.home, a, "ci").await;
    let admin = token(&teams.home, a, "admin").await;

    let all = methods(pb::FILE_DESCRIPTOR_SET);
    let names: std::collections::BTreeSet<&str> = all.iter().map(|m| m.name.as_str()).collect();
    for known in [
        "ListClusters",
        "GetMicroservice",
        "ListMicroservices",
        "WatchMicroservices",
        "WaitForRollout",
        "GetRollout",
        "ListRollouts",
        "WatchRollouts",
        "PauseRollout",
        "ResumeRollout",
        "UndoRollout",
        "ApproveWave",
    ] {
        assert!(
            names.contains(known),
            "{known} not in the descriptor: {names:?}"
        );
    }
    for m in &all {
        let request = |ns: &str| {
            let fields: Vec<(i32, &str)> = m
                .string_fields
                .iter()
                .filter_map(|(n, f)| match f.as_str() {
                    "namespace" => Some((*n, ns)),
                    "name" => Some((*n, "web")),
                    _ => None,
                })
                .collect();
            encode(&fields)
        };
        let denied = answered(&server.url, m, request(b), &reader).await;
        assert_eq!(
            denied.as_ref().err().map(|s| s.code()),
            Some(tonic::Code::PermissionDenied),
            "{} for team-a's reader naming team-b: {denied:?}",
            m.path
        );
        if m.string_fields.iter().any(|(_, f)| f == "namespace") {
            let allowed = answered(&server.url, m, request(a), &admin).await;
            let code = allowed.as_ref().err().map(|s| s.code());
            assert!(
                !matches!(
                    code,
                    Some(tonic::Code::PermissionDenied | tonic::Code::Unauthenticated)
                ),
                "{} for team-a's admin naming team-a: {allowed:?}",
                m.path
            );
        }
        println!("checked {} ({})", m.path, m.string_fields.len());
    }
}

/// The call's outcome once the server is ready: `UNAVAILABLE` (its
/// rollout cache not listed yet) is asked again, for up to 20 s.
async fn answered(
    url: &str,
    m: &support::raw_grpc::Method,
    body: bytes::Bytes,
    token: &str,
) -> Result<(), tonic::Status> {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let outcome = support::raw_grpc::call(url, m, body.clone(), token).await;
        match &outcome {
            Err(s) if s.code() == tonic::Code::Unavailable && Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            _ => return outcome,
        }
    }
}
