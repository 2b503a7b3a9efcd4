//! The Microservice controller against a real member cluster: children with
//! platform defaults, truthful status, drift repair, ownership safety,
//! invalid input, steady state and the status race.

mod support;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::json;
use support::{
    Operator, TestNamespace, client, counting_client, counting_client_with, ensure_crd, eventually,
    from_json, microservice, settings, setup, wait_all_true, wait_condition,
};
use tokio::sync::{Notify, oneshot};

use flotilla::crd::{Microservice, Phase};
use flotilla::domain::conditions::find;
use flotilla::reconciler::Hooks;

const CLUSTER: &str = "member-1";
const WAIT: Duration = Duration::from_secs(90);

fn container_env(d: &Deployment) -> BTreeMap<String, String> {
    let pod = d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod spec");
    pod.containers[0]
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect()
}

fn image_of(d: &Deployment) -> String {
    let pod = d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod spec");
    pod.containers[0].image.clone().unwrap_or_default()
}

#[tokio::test]
async fn todo_api_is_reconciled_then_available_and_kubectl_wait_works() {
    let (client, ns) = setup("rec-basic").await;
    let op = Operator::start(&client, settings(CLUSTER, &ns.name), Hooks::default());
    let api = ns.api::<Microservice>();
    let created = api
        .create(
            &PostParams::default(),
            &microservice("todo-api", "ghcr.io/acme/todo-api:1.0.0", 8080, None),
        )
        .await
        .expect("create");
    assert_eq!(created.spec.replicas, 2, "replicas defaults to 2");

    let ms = wait_condition(
        &api,
        "todo-api",
        "Reconciled",
        "True",
        Some("ChildrenApplied"),
    )
    .await;
    let uid = ms.metadata.uid.clone().expect("uid");
    let d = ns
        .api::<Deployment>()
        .get("todo-api")
        .await
        .expect("deployment exists");
    let svc = ns
        .api::<Service>()
        .get("todo-api")
        .await
        .expect("service exists");
    for meta in [&d.metadata, &svc.metadata] {
        let owner = &meta.owner_references.as_ref().expect("owner refs")[0];
        assert_eq!(
            (owner.uid.as_str(), owner.controller),
            (uid.as_str(), Some(true))
        );
        let labels = meta.labels.as_ref().expect("labels");
        assert_eq!(labels["app"], "todo-api");
        assert_eq!(labels["app.kubernetes.io/managed-by"], "flotilla");
        assert!(
            meta.annotations
                .as_ref()
                .expect("annotations")
                .contains_key("platform.example.io/writer")
        );
    }
    let env = container_env(&d);
    assert_eq!(env["ASPNETCORE_URLS"], "http://+:8080");
    assert_eq!(env["OTEL_SERVICE_NAME"], "todo-api");
    assert_eq!(env["OTEL_SERVICE_VERSION"], "ghcr.io/acme/todo-api:1.0.0");
    assert_eq!(d.spec.as_ref().and_then(|s| s.replicas), Some(2));
    let svc_port = &svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .expect("ports")[0];
    assert_eq!(svc_port.port, 8080);
    assert!(
        svc.spec
            .as_ref()
            .and_then(|s| s.cluster_ip.clone())
            .is_some(),
        "server allocated a clusterIP"
    );

    let ms = wait_condition(
        &api,
        "todo-api",
        "Available",
        "True",
        Some("ReplicasAvailable"),
    )
    .await;
    let status = ms.status.expect("status");
    assert_eq!(status.phase, Some(Phase::Available));
    assert_eq!(status.ready.as_deref(), Some("2/2"));
    let managed = status.managed_resources.expect("managed resources");
    assert_eq!(managed.deployment.as_deref(), Some("todo-api"));

    let out = Command::new(support::kubectl())
        .arg("--kubeconfig")
        .arg(support::kubeconfig_path(CLUSTER))
        .args([
            "-n",
            &ns.name,
            "wait",
            "--for=condition=Available",
            "ms/todo-api",
            "--timeout=30s",
        ])
        .output()
        .expect("run kubectl");
    assert!(
        out.status.success(),
        "kubectl wait failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    op.stop().await;
}

#[tokio::test]
async fn image_change_advances_generation_only_with_the_new_deployment() {
    let (client, ns) = setup("rec-image").await;
    let op = Operator::start(&client, settings(CLUSTER, &ns.name), Hooks::default());
    let api = ns.api::<Microservice>();
    api.create(
        &PostParams::default(),
        &microservice("web", "ghcr.io/acme/web:1", 8080, Some(1)),
    )
    .await
    .expect("create");
    let before = wait_condition(&api, "web", "Available", "True", None).await;
    let accepted_at = find(
        &before.status.as_ref().expect("status").conditions,
        "Accepted",
    )
    .expect("Accepted")
    .last_transition_time
    .clone();

    // Let a second pass: lastTransitionTime has whole-second resolution.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"image": "ghcr.io/acme/web:2"}})),
    )
    .await
    .expect("patch image");

    let deployments = ns.api::<Deployment>();
    let after = eventually("observedGeneration 2", WAIT, || {
        let (api, deployments) = (api.clone(), deployments.clone());
        async move {
            let ms = api.get("web").await.ok()?;
            if ms.status.as_ref()?.observed_generation != Some(2) {
                return None;
            }
            // The moment status names generation 2, the Deployment must carry it.
            let d = deployments.get("web").await.ok()?;
            assert_eq!(
                image_of(&d),
                "ghcr.io/acme/web:2",
                "status advanced before the Deployment did"
            );
            Some(ms)
        }
    })
    .await;
    let status = after.status.expect("status");
    let accepted = find(&status.conditions, "Accepted").expect("Accepted");
    assert_eq!(
        accepted.last_transition_time, accepted_at,
        "unchanged condition kept its transition time"
    );
    assert_eq!(accepted.observed_generation, Some(2));
    wait_condition(&api, "web", "Available", "True", None).await;
    op.stop().await;
}

#[tokio::test]
async fn deleted_service_and_edited_deployment_are_repaired_on_the_watch() {
    let (client, ns) = setup("rec-drift").await;
    // A resync far away: only the watches can repair within the test's time.
    let mut s = settings(CLUSTER, &ns.name);
    s.resync = Duration::from_secs(3600);
    let op = Operator::start(&client, s, Hooks::default());
    let api = ns.api::<Microservice>();
    api.create(
        &PostParams::default(),
        &microservice("drift", "ghcr.io/acme/drift:1", 9000, Some(1)),
    )
    .await
    .expect("create");
    wait_condition(&api, "drift", "Reconciled", "True", None).await;

    let services = ns.api::<Service>();
    let old_uid = services.get("drift").await.expect("service").metadata.uid;
    services
        .delete("drift", &DeleteParams::default())
        .await
        .expect("delete service");
    eventually("service recreated", Duration::from_secs(10), || {
        let services = services.clone();
        let old_uid = old_uid.clone();
        async move {
            let s = services.get_opt("drift").await.ok()??;
            (s.metadata.uid != old_uid && s.metadata.deletion_timestamp.is_none()).then_some(())
        }
    })
    .await;

    let deployments = ns.api::<Deployment>();
    let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "drift", "image": "evil/miner:1"}]}}}});
    deployments
        .patch("drift", &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .expect("hand edit");
    eventually("image restored", Duration::from_secs(10), || {
        let deployments = deployments.clone();
        async move {
            let d = deployments.get("drift").await.ok()?;
            (image_of(&d) == "ghcr.io/acme/drift:1").then_some(())
        }
    })
    .await;
    op.stop().await;
}

/// Warnings about the Microservice `name` (not about other objects of that
/// name, such as a stranger's Service the apiserver warns about).
async fn warning_reasons(client: &Client, ns: &str, name: &str) -> Vec<String> {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| {
            let about = e.regarding.as_ref();
            e.type_.as_deref() == Some("Warning")
                && about.and_then(|r| r.name.as_deref()) == Some(name)
                && about.and_then(|r| r.kind.as_deref()) == Some("Microservice")
        })
        .filter_map(|e| e.reason)
        .collect()
}

#[tokio::test]
async fn foreign_service_blocks_both_children_until_it_is_gone() {
    let (client, ns) = setup("rec-owner").await;
    let services = ns.api::<Service>();
    let stranger: Service = from_json(json!({
        "metadata": {"name": "clash", "labels": {"owner": "someone-else"}},
        "spec": {"selector": {"app": "other"}, "ports": [{"port": 1234}]},
    }));
    let stranger = services
        .create(&PostParams::default(), &stranger)
        .await
        .expect("stranger");
    // The default resync (5 minutes): only a watch on the stranger can
    // notice it go within the test's time.
    let s = settings(CLUSTER, &ns.name);
    assert_eq!(s.resync, Duration::from_secs(300));
    let op = Operator::start(&client, s, Hooks::default());
    let api = ns.api::<Microservice>();
    api.create(
        &PostParams::default(),
        &microservice("clash", "ghcr.io/acme/clash:1", 8080, Some(1)),
    )
    .await
    .expect("create");

    let ms = wait_condition(
        &api,
        "clash",
        "Reconciled",
        "False",
        Some("OwnershipConflict"),
    )
    .await;
    let status = ms.status.expect("status");
    assert_eq!(status.phase, Some(Phase::Failed));
    assert_eq!(status.managed_resources, None);
    assert_eq!(
        find(&status.conditions, "Available").map(|c| c.status.as_str()),
        Some("False")
    );
    assert!(
        ns.api::<Deployment>()
            .get_opt("clash")
            .await
            .expect("get")
            .is_none(),
        "Deployment must not be created"
    );
    let untouched = services.get("clash").await.expect("stranger still there");
    assert_eq!(
        untouched.metadata.resource_version, stranger.metadata.resource_version,
        "stranger modified"
    );
    let reasons = eventually("Warning event", Duration::from_secs(10), || {
        let client = client.clone();
        let ns = ns.name.clone();
        async move {
            let r = warning_reasons(&client, &ns, "clash").await;
            r.contains(&"OwnershipConflict".to_string()).then_some(r)
        }
    })
    .await;
    assert!(
        reasons.iter().all(|r| r == "OwnershipConflict"),
        "{reasons:?}"
    );

    services
        .delete("clash", &DeleteParams::default())
        .await
        .expect("delete stranger");
    let deleted = std::time::Instant::now();
    wait_condition(&api, "clash", "Reconciled", "True", Some("ChildrenApplied")).await;
    let took = deleted.elapsed();
    println!("figure: conflict cleared {took:?} after the stranger's deletion");
    assert!(
        took < Duration::from_secs(10),
        "cleared after {took:?}: by a resync, not by a watch"
    );
    assert!(
        ns.api::<Deployment>()
            .get_opt("clash")
            .await
            .expect("get")
            .is_some()
    );
    op.stop().await;
}

#[tokio::test]
async fn invalid_input_is_rejected_by_the_server_or_fails_the_cr_and_touches_nothing() {
    let (client, ns) = setup("rec-invalid").await;
    let bystander = ns
        .api::<ConfigMap>()
        .create(
            &PostParams::default(),
            &from_json(json!({"metadata": {"name": "bystander"}, "data": {"k": "v"}})),
        )
        .await
        .expect("bystander");
    let op = Operator::start(&client, settings(CLUSTER, &ns.name), Hooks::default());
    let api = ns.api::<Microservice>();

    // What the schema and CEL can express, the API server refuses.
    for (name, image, port, replicas, why) in [
        ("spaces", "nginx latest", 80, None, "image with whitespace"),
        ("zero", "nginx:1", 0, None, "port 0"),
        ("huge", "nginx:1", 65536, None, "port 65536"),
        ("many", "nginx:1", 80, Some(1001), "replicas 1001"),
        (
            "my.api",
            "nginx:1",
            80,
            None,
            "a name that cannot name a Service",
        ),
    ] {
        match api
            .create(
                &PostParams::default(),
                &microservice(name, image, port, replicas),
            )
            .await
        {
            Err(kube::Error::Api(s)) => assert_eq!(s.code, 422, "{why}: {s:?}"),
            other => panic!("{why} must be rejected by the API server, got {other:?}"),
        }
    }

    // What passes the schema but is not a valid image becomes InvalidSpec.
    api.create(
        &PostParams::default(),
        &microservice("upper", "ghcr.io/Acme/API:1", 8080, None),
    )
    .await
    .expect("schema accepts it");
    let ms = wait_condition(&api, "upper", "Accepted", "False", Some("InvalidSpec")).await;
    let status = ms.status.expect("status");
    assert_eq!(status.phase, Some(Phase::Failed));
    let reconciled = find(&status.conditions, "Reconciled").expect("Reconciled");
    assert_eq!(reconciled.reason, "InvalidSpec");
    assert!(
        reconciled.message.contains("ghcr.io/Acme/API:1"),
        "message names the image: {}",
        reconciled.message
    );

    assert!(
        ns.api::<Deployment>()
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .is_empty()
    );
    assert!(
        ns.api::<Service>()
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .is_empty()
    );
    let after = ns
        .api::<ConfigMap>()
        .get("bystander")
        .await
        .expect("bystander");
    assert_eq!(
        after.metadata.resource_version,
        bystander.metadata.resource_version
    );

    // Fixing the spec recovers without a restart.
    api.patch(
        "upper",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"image": "ghcr.io/acme/api:1"}})),
    )
    .await
    .expect("fix");
    wait_condition(&api, "upper", "Reconciled", "True", Some("ChildrenApplied")).await;
    op.stop().await;
}

type Versions = BTreeMap<String, Option<String>>;

async fn resource_versions(ns: &TestNamespace) -> Versions {
    let mut v = Versions::new();
    let lp = ListParams::default();
    for m in ns
        .api::<Microservice>()
        .list(&lp)
        .await
        .expect("list")
        .items
    {
        v.insert(
            format!("ms/{}", m.metadata.name.unwrap_or_default()),
            m.metadata.resource_version,
        );
    }
    for d in ns.api::<Deployment>().list(&lp).await.expect("list").items {
        v.insert(
            format!("deploy/{}", d.metadata.name.unwrap_or_default()),
            d.metadata.resource_version,
        );
    }
    for s in ns.api::<Service>().list(&lp).await.expect("list").items {
        v.insert(
            format!("svc/{}", s.metadata.name.unwrap_or_default()),
            s.metadata.resource_version,
        );
    }
    v
}

#[tokio::test]
async fn fifty_in_sync_microservices_cause_no_writes_or_reads_on_resync() {
    let client = client(CLUSTER).await;
    ensure_crd(&client).await;
    let ns = TestNamespace::create(&client, CLUSTER, "rec-steady").await;
    // The controller gets a client of its own whose every request is counted.
    let (op_client, requests) = counting_client(CLUSTER).await;
    let mut s = settings(CLUSTER, &ns.name);
    s.resync = Duration::from_secs(2);
    let op = Operator::start(&op_client, s.clone(), Hooks::default());
    let api = ns.api::<Microservice>();
    for i in 0..50 {
        api.create(
            &PostParams::default(),
            &microservice(&format!("svc-{i:02}"), "ghcr.io/acme/s:1", 8080, Some(1)),
        )
        .await
        .expect("create");
    }
    wait_all_true(&api, 50, "Available", Duration::from_secs(180)).await;
    // Let the last child status updates land, and anything held be written.
    quiet(&requests, Duration::from_secs(8)).await;
    assert_request_budget(&requests.all(), &ns.name, 50);
    let settled = resource_versions(&ns).await;
    assert_eq!(settled.len(), 150);
    let before = requests.snapshot();
    assert!(
        before.get("POST").copied().unwrap_or(0) >= 100,
        "the counter saw the creates: {before:?}"
    );

    // Several resync periods pass: every object is reconciled again, from cache.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        requests.since(&before),
        BTreeMap::new(),
        "a resync sent API requests"
    );
    assert_eq!(
        resource_versions(&ns).await,
        settled,
        "a resync changed an in-sync object"
    );

    // A restarted controller gets its initial state from streaming lists
    // (watches) and reconciles everything from cache: not one request.
    op.stop().await;
    let before = requests.snapshot();
    let op = Operator::start(&op_client, s.clone(), Hooks::default());
    tokio::time::sleep(Duration::from_secs(6)).await;
    let restart = requests.since(&before);
    assert_eq!(
        restart,
        BTreeMap::new(),
        "a restart with streaming lists sent requests"
    );
    assert_eq!(
        resource_versions(&ns).await,
        settled,
        "a fresh controller changed an in-sync object"
    );
    op.stop().await;

    // Without streaming lists (members older than WatchList): the initial
    // LISTs of the 6 watches (Microservices, our Deployments, Services and
    // EndpointSlices, and every Deployment and Service name), and nothing else.
    s.streaming_lists = false;
    let before = requests.snapshot();
    let op = Operator::start(&op_client, s, Hooks::default());
    tokio::time::sleep(Duration::from_secs(6)).await;
    let restart = requests.since(&before);
    assert_eq!(
        restart.keys().collect::<Vec<_>>(),
        ["GET"],
        "a fresh controller wrote: {restart:?}"
    );
    assert!(
        (1..=6).contains(&restart["GET"]),
        "only the initial lists of 6 watches: {restart:?}"
    );
    assert_eq!(
        resource_versions(&ns).await,
        settled,
        "a fresh controller changed an in-sync object"
    );
    op.stop().await;
}

/// Waits until `requests` has seen nothing new for `still`.
/// A reconcile woken by the Deployment's events can run before the Service
/// watch shows the Service created a moment earlier. Here that watch lags
/// 2 s behind on purpose: the controller must trust its own create (one
/// POST per Service, no 409), and still create again a Service deleted
/// before its watch ever showed it.
#[tokio::test]
async fn a_lagging_service_watch_causes_no_second_create_and_hides_no_deletion() {
    let client = client(CLUSTER).await;
    ensure_crd(&client).await;
    let ns = TestNamespace::create(&client, CLUSTER, "rec-lag").await;
    let lag = support::lag::LagLayer {
        resource: "services",
        lag: Duration::from_secs(2),
    };
    let (op_client, requests) = counting_client_with(CLUSTER, Some(lag)).await;
    let _op = Operator::start(&op_client, settings(CLUSTER, &ns.name), Hooks::default());
    let api = ns.api::<Microservice>();
    for i in 0..5 {
        let ms = microservice(&format!("lag-{i}"), "ghcr.io/acme/s:1", 8080, Some(1));
        api.create(&PostParams::default(), &ms)
            .await
            .expect("create");
    }
    wait_all_true(&api, 5, "Available", Duration::from_secs(120)).await;
    quiet(&requests, Duration::from_secs(5)).await;
    assert_eq!(
        requests.count("POST", "/services"),
        5,
        "one create per Service: {:?}",
        requests.all()
    );

    // Deleted before the lagging watch shows it: created again all the same.
    let services = ns.api::<Service>();
    let first = microservice("lag-late", "ghcr.io/acme/s:1", 8080, Some(1));
    api.create(&PostParams::default(), &first)
        .await
        .expect("create");
    let uid = eventually("the Service of lag-late", WAIT, || {
        let services = services.clone();
        async move {
            services
                .get_opt("lag-late")
                .await
                .ok()
                .flatten()?
                .metadata
                .uid
        }
    })
    .await;
    services
        .delete("lag-late", &DeleteParams::default())
        .await
        .expect("delete the Service");
    eventually(
        "lag-late's Service created again",
        Duration::from_secs(60),
        || {
            let (services, uid) = (services.clone(), uid.clone());
            async move {
                let s = services.get_opt("lag-late").await.ok().flatten()?;
                (s.metadata.uid != Some(uid)).then_some(())
            }
        },
    )
    .await;
}

async fn quiet(requests: &support::RequestCounter, still: Duration) {
    let give_up = tokio::time::Instant::now() + Duration::from_secs(90);
    let mut seen = requests.all().len();
    let mut since = tokio::time::Instant::now();
    while since.elapsed() < still {
        assert!(
            tokio::time::Instant::now() < give_up,
            "the controller never went quiet"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = requests.all().len();
        if now != seen {
            (seen, since) = (now, tokio::time::Instant::now());
        }
    }
}

/// #37's floor: 2 creates and one status write per new object whose
/// children become Available inside the coalescing window (no GET for a
/// missing child, no 409, no count-only writes, no "applied" status that
/// the "available" one follows within the window), and at most one Event.
/// Counted at the client, and the writes checked against the apiserver's
/// audit log.
fn assert_request_budget(requests: &[String], namespace: &str, objects: usize) {
    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    for r in requests {
        let (verb, path) = r.split_once(' ').unwrap_or_default();
        let parts: Vec<&str> = path.split('/').collect();
        // .../namespaces/<ns>/<resource>[/<name>[/<subresource>]]
        let at = parts
            .iter()
            .position(|p| *p == "namespaces")
            .map_or(0, |i| i + 2);
        let resource = parts.get(at).copied().unwrap_or("?");
        let sub = parts
            .get(at + 2)
            .map(|s| format!("/{s}"))
            .unwrap_or_default();
        *by_kind
            .entry(format!("{verb} {resource}{sub}"))
            .or_default() += 1;
    }
    let events: usize = requests.iter().filter(|r| r.contains("/events")).count();
    let others = requests.len() - events;
    let per = |n: usize| n as f64 / objects as f64;
    eprintln!(
        "requests per converged Microservice: {:.2} without Events, {:.2} with; {by_kind:?}",
        per(others),
        per(requests.len())
    );
    assert!(
        per(others) <= 3.0,
        "{:.2} requests per object: {by_kind:?}",
        per(others)
    );
    assert!(
        per(requests.len()) <= 4.0,
        "{:.2} with Events: {by_kind:?}",
        per(requests.len())
    );
    // The apiserver saw the same writes from this client.
    let writes = requests.iter().filter(|r| !r.starts_with("GET ")).count();
    let audited = support::audited_requests(CLUSTER, namespace, support::COUNTED_AGENT)
        .into_iter()
        .filter(|(verb, _)| verb != "get" && verb != "list")
        .count();
    assert_eq!(audited, writes, "the audit log disagrees: {by_kind:?}");
}

/// The first report of a generation waits for the coalescing window only
/// while it says "under way": one whose pods never become ready is still
/// reported, once, within the window (#37's rule, `docs/decisions.md`).
#[tokio::test]
async fn a_new_microservice_that_never_becomes_available_is_reported_once_within_the_window() {
    let client = client(CLUSTER).await;
    ensure_crd(&client).await;
    let ns = TestNamespace::create(&client, CLUSTER, "rec-first").await;
    let (op_client, requests) = counting_client(CLUSTER).await;
    let op = Operator::start(&op_client, settings(CLUSTER, &ns.name), Hooks::default());
    let api = ns.api::<Microservice>();
    let created = tokio::time::Instant::now();
    api.create(
        &PostParams::default(),
        &microservice("stuck", "ghcr.io/acme/s:never-ready", 8080, Some(1)),
    )
    .await
    .expect("create");
    // The window is 5 s; the bound leaves room for a slow machine.
    let ms = eventually("the first status", Duration::from_secs(20), || async {
        api.get("stuck")
            .await
            .ok()
            .filter(|m| m.status.as_ref().and_then(|s| s.observed_generation) == Some(1))
    })
    .await;
    let reported_after = created.elapsed();
    let status = ms.status.expect("status");
    let state = |t: &str| find(&status.conditions, t).map(|c| (c.status.clone(), c.reason.clone()));
    assert_eq!(
        state("Reconciled"),
        Some(("True".into(), "ChildrenApplied".into()))
    );
    assert_eq!(state("Available").map(|s| s.0), Some("False".into()));
    assert_eq!(status.phase, Some(Phase::ResourcesApplied));
    // Nothing more to say: that one write stays the only one.
    quiet(&requests, Duration::from_secs(8)).await;
    let writes = requests.count("PUT", "/stuck/status");
    assert_eq!(
        writes,
        1,
        "one status write for a Microservice that stays under way (reported after {reported_after:?}): {:?}",
        requests.all()
    );
    op.stop().await;
}

#[tokio::test]
async fn result_for_an_old_generation_is_never_written_as_the_new_one() {
    let (client, ns) = setup("rec-race").await;
    let (reached_tx, reached_rx) = oneshot::channel::<()>();
    let reached_tx = Arc::new(std::sync::Mutex::new(Some(reached_tx)));
    let release = Arc::new(Notify::new());
    let paused_once = Arc::new(AtomicBool::new(false));
    let hook_release = release.clone();
    let hooks = Hooks {
        after_children_applied: Some(Arc::new(move |name: String| {
            let first = name == "racer" && !paused_once.swap(true, Ordering::SeqCst);
            let reached = reached_tx.clone();
            let release = hook_release.clone();
            async move {
                if first {
                    if let Some(tx) = reached.lock().expect("lock").take() {
                        let _ = tx.send(());
                    }
                    release.notified().await;
                }
            }
            .boxed()
        })),
        ..Default::default()
    };

    // Record every status the CR ever shows.
    let api = ns.api::<Microservice>();
    let seen = Arc::new(std::sync::Mutex::new(
        Vec::<(Option<i64>, Option<i64>)>::new(),
    ));
    let recorder = {
        let seen = seen.clone();
        let stream = watcher(
            api.clone(),
            watcher::Config::default().fields("metadata.name=racer"),
        )
        .applied_objects();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(Ok(ms)) = stream.next().await {
                let observed = ms.status.as_ref().and_then(|s| s.observed_generation);
                seen.lock()
                    .expect("lock")
                    .push((ms.metadata.generation, observed));
            }
        })
    };

    let op = Operator::start(&client, settings(CLUSTER, &ns.name), hooks);
    api.create(
        &PostParams::default(),
        &microservice("racer", "ghcr.io/acme/racer:1", 8080, Some(1)),
    )
    .await
    .expect("create");
    tokio::time::timeout(WAIT, reached_rx)
        .await
        .expect("reconcile reached the pause")
        .expect("hook");

    // Generation 1's children are applied; its status is not yet written.
    api.patch(
        "racer",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"image": "ghcr.io/acme/racer:2"}})),
    )
    .await
    .expect("patch");
    release.notify_one();

    let ms = wait_condition(&api, "racer", "Reconciled", "True", None).await;
    assert_eq!(ms.metadata.generation, Some(2));
    let d = ns
        .api::<Deployment>()
        .get("racer")
        .await
        .expect("deployment");
    assert_eq!(image_of(&d), "ghcr.io/acme/racer:2");
    tokio::time::sleep(Duration::from_millis(500)).await;
    recorder.abort();
    let seen = seen.lock().expect("lock").clone();
    assert!(
        seen.iter().all(|(_, observed)| *observed != Some(1)),
        "generation 1's result was written after generation 2 existed: {seen:?}"
    );
    assert!(
        seen.iter().any(|(_, observed)| *observed == Some(2)),
        "{seen:?}"
    );
    op.stop().await;
}

#[tokio::test]
async fn deleting_the_microservice_collects_both_children() {
    let (client, ns) = setup("rec-delete").await;
    let op = Operator::start(&client, settings(CLUSTER, &ns.name), Hooks::default());
    let api = ns.api::<Microservice>();
    api.create(
        &PostParams::default(),
        &microservice("gone", "ghcr.io/acme/gone:1", 8080, Some(1)),
    )
    .await
    .expect("create");
    wait_condition(&api, "gone", "Reconciled", "True", None).await;
    api.delete("gone", &DeleteParams::background())
        .await
        .expect("delete");
    let (deployments, services) = (ns.api::<Deployment>(), ns.api::<Service>());
    eventually("children collected", Duration::from_secs(60), || {
        let (deployments, services) = (deployments.clone(), services.clone());
        async move {
            let d = deployments.get_opt("gone").await.ok()?;
            let s = services.get_opt("gone").await.ok()?;
            (d.is_none() && s.is_none()).then_some(())
        }
    })
    .await;
    op.stop().await;
}

/// A→B→A inside a Deployment watch lag: the cache still holds the old A
/// template, complete, while the live Deployment rolls out B. The
/// controller remembers its update, so that stale copy is never "in sync",
/// and the Microservice never says Available at A's generation while the
/// live Deployment is not running A's template observed.
#[tokio::test]
async fn a_quick_change_and_back_never_takes_a_stale_deployment_for_complete() {
    let client = client(CLUSTER).await;
    ensure_crd(&client).await;
    let ns = TestNamespace::create(&client, CLUSTER, "rec-aba").await;
    let lag = support::lag::LagLayer {
        resource: "deployments",
        lag: Duration::from_secs(3),
    };
    let (op_client, _requests) = counting_client_with(CLUSTER, Some(lag)).await;
    let _op = Operator::start(&op_client, settings(CLUSTER, &ns.name), Hooks::default());
    let api = ns.api::<Microservice>();
    let deployments = ns.api::<Deployment>();
    support::create_available(&api, "aba", "ghcr.io/acme/aba:a").await;
    let set = |image: &'static str| {
        let api = api.clone();
        async move {
            api.patch(
                "aba",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"image": image}})),
            )
            .await
            .expect("patch")
        }
    };
    set("ghcr.io/acme/aba:b").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let back = set("ghcr.io/acme/aba:a").await;
    let last = back.metadata.generation.expect("generation");
    // Watched through a client without lag, until the claim has been seen
    // for 3 s (90 s at most).
    let mut until = tokio::time::Instant::now() + Duration::from_secs(90);
    let mut checks = 0;
    while tokio::time::Instant::now() < until {
        let ms = api.get("aba").await.expect("get");
        let claims = ms.status.as_ref().is_some_and(|st| {
            st.observed_generation == Some(last)
                && find(&st.conditions, "Available")
                    .is_some_and(|c| c.status == "True" && c.observed_generation == Some(last))
        });
        if claims {
            // Read after the claim: the Deployment only moves forward.
            let d = deployments.get("aba").await.expect("deployment");
            let image = d
                .spec
                .as_ref()
                .and_then(|s| s.template.spec.as_ref()?.containers.first()?.image.clone());
            let observed = d.status.as_ref().and_then(|s| s.observed_generation);
            assert_eq!(
                image.as_deref(),
                Some("ghcr.io/acme/aba:a"),
                "Available=True at generation {last} while the Deployment runs another template"
            );
            assert!(
                observed >= d.metadata.generation,
                "Available=True at generation {last} while the Deployment's generation {:?} is not observed ({observed:?})",
                d.metadata.generation
            );
            if checks == 0 {
                until = until.min(tokio::time::Instant::now() + Duration::from_secs(3));
            }
            checks += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        checks > 0,
        "Available=True at generation {last} was never seen"
    );
    println!(
        "figure: A→B→A with a 3 s Deployment lag: {checks} checks of Available=True, none stale"
    );
}

/// A storm of child events (the Deployment annotated every 100 ms, as a
/// large rollout or crash-looping pods change it) must not defer a new
/// generation: kube-runtime's debounce restarts on every trigger, and the
/// bound (`debounce_max`, 1 s) is what lets the reconcile through.
#[tokio::test]
async fn a_storm_of_child_events_does_not_defer_a_new_generation() {
    let (client, ns) = setup("rec-storm").await;
    let _op = Operator::start(&client, settings(CLUSTER, &ns.name), Hooks::default());
    let api = ns.api::<Microservice>();
    let deployments = ns.api::<Deployment>();
    support::create_available(&api, "storm", "ghcr.io/acme/storm:1").await;
    let storming = Arc::new(AtomicBool::new(true));
    let storm = tokio::spawn({
        let (deployments, storming) = (deployments.clone(), storming.clone());
        async move {
            let mut i = 0u32;
            while storming.load(Ordering::SeqCst) {
                i += 1;
                let _ = deployments
                    .patch(
                        "storm",
                        &PatchParams::default(),
                        &Patch::Merge(
                            json!({"metadata": {"annotations": {"storm": i.to_string()}}}),
                        ),
                    )
                    .await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            i
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let changed = std::time::Instant::now();
    let patched = api
        .patch(
            "storm",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"image": "ghcr.io/acme/storm:2"}})),
        )
        .await
        .expect("patch");
    let generation = patched.metadata.generation;
    // The storm goes on for 15 s more; the new generation must be taken
    // in while it lasts.
    let observed = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            let ms = api.get("storm").await.expect("get");
            if ms.status.and_then(|s| s.observed_generation) == generation {
                return changed.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    storming.store(false, Ordering::SeqCst);
    let patches = storm.await.expect("storm");
    let after = observed.expect("the new generation was deferred for as long as the storm lasted");
    println!(
        "figure: a new generation under a storm of child events ({patches} patches, 10/s) was observed after {after:?}"
    );
}

/// A child watch that fails after its first listing (here: EndpointSlices,
/// refused 403 as after an RBAC change) leaves a cache that looks fine and
/// never changes. Past 10 s the leader concludes `Available=Unknown`
/// (`CachesStale`) instead of what the frozen cache last showed, the
/// errors are counted, and recovery brings `True` back.
#[tokio::test]
async fn a_child_watch_that_fails_after_its_first_listing_makes_available_unknown() {
    let client = client(CLUSTER).await;
    ensure_crd(&client).await;
    let ns = TestNamespace::create(&client, CLUSTER, "rec-stale").await;
    let failing = Arc::new(AtomicBool::new(false));
    let op_client = support::failing_client(
        CLUSTER,
        support::lag::FailLayer {
            resource: "endpointslices",
            failing: failing.clone(),
            refuse: support::lag::Refuse::Reads,
        },
    )
    .await;
    let _op = Operator::start(&op_client, settings(CLUSTER, &ns.name), Hooks::default());
    let api = ns.api::<Microservice>();
    support::create_available(&api, "stale", "ghcr.io/acme/stale:1").await;
    failing.store(true, Ordering::SeqCst);
    let cut = std::time::Instant::now();
    wait_condition(&api, "stale", "Available", "Unknown", Some("CachesStale")).await;
    let after = cut.elapsed();
    let metrics = flotilla::telemetry::metrics::METRICS.encode();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("flotilla_watch_errors_total{")
                && l.contains("resource=\"endpointslices\"")
                && l.contains(&format!("cluster=\"{CLUSTER}\""))),
        "the errors are counted:\n{metrics}"
    );
    failing.store(false, Ordering::SeqCst);
    wait_condition(&api, "stale", "Available", "True", None).await;
    println!("figure: a failing EndpointSlice watch made Available Unknown after {after:?}");
}

/// Found by `make chaos`: a Microservice deleted and made again right after
/// its member's apiserver restarted found the Deployment and Service of its
/// earlier incarnation still there minutes later (the garbage collector
/// lagged), and stayed `OwnershipConflict`. Children controlled by an
/// earlier Microservice of the same name are garbage (a name holds one
/// object at a time): they are deleted, exactly those objects, and ours
/// are created. Here the earlier owner's apiVersion is one the cluster does
/// not serve, so the garbage collector cannot resolve it and leaves them,
/// as a lagging one does.
#[tokio::test]
async fn children_of_an_earlier_microservice_of_the_same_name_are_replaced() {
    let (client, ns) = setup("rec-leftover").await;
    let owner = json!([{
        "apiVersion": "platform.example.io/v9",
        "kind": "Microservice",
        "name": "web",
        "uid": "00000000-0000-4000-8000-00000000dead",
        "controller": true,
    }]);
    let old_deployment: Deployment = from_json(json!({
        "metadata": {"name": "web", "ownerReferences": owner},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "web-old"}},
            "template": {"metadata": {"labels": {"app": "web-old"}},
                "spec": {"containers": [{"name": "web", "image": "ghcr.io/acme/web:0"}]}},
        },
    }));
    let old_service: Service = from_json(json!({
        "metadata": {"name": "web", "ownerReferences": owner},
        "spec": {"selector": {"app": "web-old"}, "ports": [{"port": 8080}]},
    }));
    let old_d = ns
        .api::<Deployment>()
        .create(&PostParams::default(), &old_deployment)
        .await
        .expect("the earlier Deployment");
    let old_s = ns
        .api::<Service>()
        .create(&PostParams::default(), &old_service)
        .await
        .expect("the earlier Service");
    let op = Operator::start(&client, settings(CLUSTER, &ns.name), Hooks::default());
    let api = ns.api::<Microservice>();
    support::create_available(&api, "web", "ghcr.io/acme/web:1").await;
    let ms = api.get("web").await.expect("web");
    let uid = ms.metadata.uid.clone().expect("uid");
    let d = ns.api::<Deployment>().get("web").await.expect("Deployment");
    let s = ns.api::<Service>().get("web").await.expect("Service");
    for (kind, meta, old) in [
        ("Deployment", &d.metadata, &old_d.metadata),
        ("Service", &s.metadata, &old_s.metadata),
    ] {
        assert_ne!(meta.uid, old.uid, "the earlier {kind} was replaced");
        let controller = meta
            .owner_references
            .iter()
            .flatten()
            .find(|r| r.controller == Some(true))
            .expect("a controller");
        assert_eq!(
            controller.uid, uid,
            "{kind} is controlled by the live Microservice"
        );
    }
    op.stop().await;
}
