//! The reconciler tells the truth at its edges, against a real member
//! cluster: each kind of drift is repaired by its own watch, an API refusal
//! is Failed and not retried hot, a transient error leaves Available alone,
//! a terminating child is not in sync, and Available follows the endpoints
//! right after a status write. API refusals are staged with
//! ValidatingAdmissionPolicies, as a platform's admission rules would.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::policy::Policy;
use support::{
    Operator, TestNamespace, counting_client, eventually, microservice, settings, setup,
    wait_condition,
};

use flotilla::crd::Microservice;
use flotilla::domain::conditions::find;
use flotilla::reconciler::{Hooks, Reconciled};

const CLUSTER: &str = "member-1";

/// Every finished reconcile, as the hook reports it.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<(Instant, Reconciled)>>>);

impl Log {
    fn hooks(&self) -> Hooks {
        let log = self.clone();
        Hooks {
            on_reconciled: Some(Arc::new(move |r| {
                log.0.lock().unwrap().push((Instant::now(), r));
            })),
            ..Default::default()
        }
    }

    /// The triggers of reconciles of `name` that wrote children after `since`.
    fn repairs(&self, name: &str, since: Instant) -> Vec<Vec<&'static str>> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, r)| *t >= since && r.name == name && r.outcome == "Applied")
            .map(|(_, r)| r.triggers.clone())
            .collect()
    }
}

/// A controller with the resync an hour away: only watches act in time.
async fn drift_setup(prefix: &str, name: &str) -> (TestNamespace, Operator, Log) {
    let (client, ns) = setup(prefix).await;
    let mut s = settings(CLUSTER, &ns.name);
    s.resync = Duration::from_secs(3600);
    let log = Log::default();
    let op = Operator::start(&client, s, log.hooks());
    let api = ns.api::<Microservice>();
    api.create(
        &PostParams::default(),
        &microservice(name, "ghcr.io/acme/drift:1", 9000, Some(1)),
    )
    .await
    .expect("create");
    wait_condition(&api, name, "Available", "True", None).await;
    (ns, op, log)
}

/// Waits for `repaired`, then checks that a reconcile woken by `watch`
/// did the repair.
async fn repaired_by<F, Fut>(log: &Log, name: &str, since: Instant, watch: &str, repaired: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<()>>,
{
    eventually("the drift repaired", Duration::from_secs(20), repaired).await;
    let repairs = eventually("the repair logged", Duration::from_secs(5), || {
        let r = log.repairs(name, since);
        async move { (!r.is_empty()).then_some(r) }
    })
    .await;
    assert!(
        repairs.iter().any(|t| t.contains(&watch)),
        "the {watch} watch did not wake the repair: {repairs:?}"
    );
}

fn merge(v: serde_json::Value) -> Patch<serde_json::Value> {
    Patch::Merge(v)
}

#[tokio::test]
async fn a_service_selector_key_added_by_hand_is_removed_by_the_service_watch() {
    let (ns, op, log) = drift_setup("drift-sel", "sel").await;
    let services = ns.api::<Service>();
    let since = Instant::now();
    services
        .patch(
            "sel",
            &PatchParams::default(),
            &merge(json!({"spec": {"selector": {"canary": "true"}}})),
        )
        .await
        .expect("hand edit");
    repaired_by(&log, "sel", since, "Service", || {
        let services = services.clone();
        async move {
            let s = services.get("sel").await.ok()?;
            let selector = s.spec?.selector?;
            (!selector.contains_key("canary")).then_some(())
        }
    })
    .await;
    op.stop().await;
}

#[tokio::test]
async fn an_edited_service_port_is_restored_by_the_service_watch() {
    let (ns, op, log) = drift_setup("drift-port", "port").await;
    let services = ns.api::<Service>();
    let since = Instant::now();
    let patch = json!({"spec": {"ports": [{"name": "http", "port": 9999, "targetPort": 9000, "protocol": "TCP"}]}});
    services
        .patch("port", &PatchParams::default(), &merge(patch))
        .await
        .expect("hand edit");
    repaired_by(&log, "port", since, "Service", || {
        let services = services.clone();
        async move {
            let s = services.get("port").await.ok()?;
            let ports = s.spec?.ports?;
            (ports.len() == 1 && ports[0].port == 9000).then_some(())
        }
    })
    .await;
    op.stop().await;
}

#[tokio::test]
async fn a_deleted_deployment_is_recreated_by_the_deployment_watch() {
    let (ns, op, log) = drift_setup("drift-del", "gone").await;
    let deployments = ns.api::<Deployment>();
    let old = deployments
        .get("gone")
        .await
        .expect("deployment")
        .metadata
        .uid;
    let since = Instant::now();
    deployments
        .delete("gone", &DeleteParams::background())
        .await
        .expect("delete");
    repaired_by(&log, "gone", since, "Deployment", || {
        let deployments = deployments.clone();
        let old = old.clone();
        async move {
            let d = deployments.get_opt("gone").await.ok()??;
            (d.metadata.uid != old && d.metadata.deletion_timestamp.is_none()).then_some(())
        }
    })
    .await;
    op.stop().await;
}

#[tokio::test]
async fn an_edited_deployment_env_var_is_restored_by_the_deployment_watch() {
    let (ns, op, log) = drift_setup("drift-env", "env").await;
    let deployments = ns.api::<Deployment>();
    let since = Instant::now();
    let patch = json!({"spec": {"template": {"spec": {"containers": [
        {"name": "env", "env": [{"name": "OTEL_SERVICE_NAME", "value": "hijacked"}]}
    ]}}}});
    deployments
        .patch("env", &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .expect("hand edit");
    repaired_by(&log, "env", since, "Deployment", || {
        let deployments = deployments.clone();
        async move {
            let d = deployments.get("env").await.ok()?;
            let env = d.spec?.template.spec?.containers[0].env.clone()?;
            env.iter()
                .any(|e| e.name == "OTEL_SERVICE_NAME" && e.value.as_deref() == Some("env"))
                .then_some(())
        }
    })
    .await;
    op.stop().await;
}

async fn warnings(client: &kube::Client, ns: &str, name: &str) -> Vec<(String, String)> {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| {
            e.type_.as_deref() == Some("Warning")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

#[tokio::test]
async fn a_child_the_api_server_rejects_as_invalid_fails_with_a_warning_and_is_not_retried() {
    let (client, ns) = setup("rec-422").await;
    let _policy = Policy::apply(
        &client,
        CLUSTER,
        &ns.name,
        "CREATE",
        "deployments",
        "!object.spec.template.spec.containers.exists(c, c.image.endsWith(':rejected'))",
        "Invalid",
    )
    .await;
    let (counted, counter) = counting_client(CLUSTER).await;
    let op = Operator::start(&counted, settings(CLUSTER, &ns.name), Hooks::default());
    let api = ns.api::<Microservice>();
    // Policies take effect once the apiserver has loaded them: retry the
    // create under a new name until one is refused.
    let mut name = String::new();
    for attempt in 0..30 {
        let candidate = format!("bad{attempt}");
        api.create(
            &PostParams::default(),
            &microservice(&candidate, "ghcr.io/acme/api:rejected", 8080, Some(1)),
        )
        .await
        .expect("create");
        let refused = tokio::time::timeout(
            Duration::from_secs(5),
            wait_condition(&api, &candidate, "Reconciled", "False", Some("Invalid")),
        )
        .await;
        if refused.is_ok() {
            name = candidate;
            break;
        }
    }
    assert!(!name.is_empty(), "the admission policy never took effect");
    let ms = api.get(&name).await.unwrap();
    let status = ms.status.expect("status");
    let reconciled = find(&status.conditions, "Reconciled").unwrap();
    assert!(
        reconciled.message.contains("rejected") && reconciled.message.contains("Deployment"),
        "the message names what was refused and why: {}",
        reconciled.message
    );
    assert_eq!(status.phase, Some(flotilla::crd::Phase::Failed));
    let w = eventually("a Warning event", Duration::from_secs(10), || {
        let client = client.clone();
        let (ns, name) = (ns.name.clone(), name.clone());
        async move {
            let w = warnings(&client, &ns, &name).await;
            (!w.is_empty()).then_some(w)
        }
    })
    .await;
    assert!(w.iter().any(|(reason, _)| reason == "Invalid"), "{w:?}");

    // No hot retry: the create is not sent again for 30 s.
    let suffix = "/deployments";
    let before = counter.count("POST", suffix);
    tokio::time::sleep(Duration::from_secs(30)).await;
    let after = counter.count("POST", suffix);
    println!(
        "figure: Deployment creates during 30 s after the 422: {}",
        after - before
    );
    assert_eq!(after, before, "the refused create was retried");
    op.stop().await;
}

#[tokio::test]
async fn a_transient_error_leaves_available_and_its_transition_time_alone() {
    let (client, ns) = setup("rec-transient").await;
    let op = Operator::start(&client, settings(CLUSTER, &ns.name), Hooks::default());
    let api = ns.api::<Microservice>();
    let available = support::create_available(&api, "steady", "ghcr.io/acme/steady:1").await;
    op.stop().await;

    // While no controller runs: a hand edit to repair, then updates of the
    // Deployment refused (403, a transient error to us). The workload runs on.
    let deployments = ns.api::<Deployment>();
    let patch = json!({"spec": {"template": {"spec": {"containers": [
        {"name": "steady", "env": [{"name": "OTEL_SERVICE_NAME", "value": "hijacked"}]}
    ]}}}});
    deployments
        .patch(
            "steady",
            &PatchParams::default(),
            &Patch::Strategic(patch.clone()),
        )
        .await
        .expect("hand edit");
    let _policy = Policy::apply(
        &client,
        CLUSTER,
        &ns.name,
        "UPDATE",
        "deployments",
        "false",
        "Forbidden",
    )
    .await;
    eventually("the policy in force", Duration::from_secs(30), || {
        let deployments = deployments.clone();
        let patch = patch.clone();
        async move {
            let dry = PatchParams {
                dry_run: true,
                ..Default::default()
            };
            match deployments
                .patch("steady", &dry, &Patch::Strategic(patch))
                .await
            {
                Err(kube::Error::Api(e)) if e.code == 403 => Some(()),
                _ => None,
            }
        }
    })
    .await;

    let op = Operator::start(&client, settings(CLUSTER, &ns.name), Hooks::default());
    let failing = eventually("Reconciled=False ApiError", Duration::from_secs(60), || {
        let api = api.clone();
        async move {
            let ms = api.get("steady").await.ok()?;
            let c = find(&ms.status.as_ref()?.conditions, "Reconciled")?.clone();
            (c.status == "False" && c.reason == "ApiError").then_some(ms)
        }
    })
    .await;
    let now = find(&failing.status.unwrap().conditions, "Available")
        .unwrap()
        .clone();
    assert_eq!(
        (now.status.as_str(), &now.last_transition_time),
        ("True", &available.last_transition_time),
        "a failed write moved Available: {now:?}"
    );
    op.stop().await;
}

#[tokio::test]
async fn a_terminating_child_is_not_in_sync_and_is_created_again_once_gone() {
    let (client, ns) = setup("rec-terminating").await;
    let op = Operator::start(&client, settings(CLUSTER, &ns.name), Hooks::default());
    let api = ns.api::<Microservice>();
    api.create(
        &PostParams::default(),
        &microservice("held", "ghcr.io/acme/held:1", 8080, Some(1)),
    )
    .await
    .expect("create");
    wait_condition(&api, "held", "Available", "True", None).await;
    // A finalizer of someone else's keeps the deleted Service terminating.
    let services = ns.api::<Service>();
    services
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/hold"]}})),
        )
        .await
        .expect("finalizer");
    let old = services.get("held").await.unwrap().metadata.uid;
    services
        .delete("held", &DeleteParams::default())
        .await
        .expect("delete");
    wait_condition(
        &api,
        "held",
        "Reconciled",
        "False",
        Some("ChildTerminating"),
    )
    .await;
    let ms = api.get("held").await.unwrap();
    assert!(
        !flotilla::domain::conditions::is_true(&ms.status.unwrap().conditions, "Available"),
        "a Service on its way out does not serve"
    );
    services
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("release");
    wait_condition(&api, "held", "Reconciled", "True", Some("ChildrenApplied")).await;
    let new = services.get("held").await.unwrap().metadata.uid;
    assert_ne!(new, old, "a new Service was created");
    let _ = client;
    op.stop().await;
}

#[tokio::test]
async fn available_turns_false_when_endpoints_go_right_after_a_status_write() {
    let (client, ns) = setup("rec-endpoints").await;
    let op = Operator::start(&client, settings(CLUSTER, &ns.name), Hooks::default());
    let api = ns.api::<Microservice>();
    api.create(
        &PostParams::default(),
        &microservice("flaky", "ghcr.io/acme/flaky:1", 8080, Some(1)),
    )
    .await
    .expect("create");
    // The moment Available=True is written, the pod stops being ready.
    wait_condition(&api, "flaky", "Available", "True", None).await;
    let pods = ns.api::<Pod>();
    let started = Instant::now();
    for name in pod_names(&pods, "flaky").await {
        set_pod_ready(&pods, &name, false).await;
    }
    wait_condition(&api, "flaky", "Available", "False", None).await;
    let took = started.elapsed();
    println!("figure: Available False {took:?} after the endpoints went");
    assert!(
        took < Duration::from_secs(10),
        "{took:?}: by a resync, not a watch"
    );
    let _ = client;
    op.stop().await;
}

/// The names of `app`'s pods, sorted.
async fn pod_names(pods: &Api<Pod>, app: &str) -> Vec<String> {
    let mut names: Vec<String> = pods
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .expect("pods")
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    names.sort();
    names
}

/// Sets a pod's Ready (and ContainersReady) condition by hand.
async fn set_pod_ready(pods: &Api<Pod>, name: &str, ready: bool) {
    let status = if ready { "True" } else { "False" };
    let patch = json!({"status": {"conditions": [
        {"type": "Ready", "status": status, "reason": "Test"},
        {"type": "ContainersReady", "status": status, "reason": "Test"},
    ]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .expect("pod readiness");
}

/// Sets the Ready condition of the first pod of `app` (by name).
async fn set_first_pod_ready(pods: &Api<Pod>, app: &str, ready: bool) {
    let names = pod_names(pods, app).await;
    set_pod_ready(pods, names.first().expect("a pod"), ready).await;
}

/// Review #3: our own status writes inside one Microservice watch lag
/// (Available=True; an API error that keeps it; the retry that clears the
/// error), then a reconcile whose result equals the lagging cache's old
/// status. Remembering only the last write took the cache for the truth,
/// found nothing to write, and left `Available=True` on the live object
/// while a pod was not ready. Two replicas, one flipped: every partial view
/// of the flip (Deployment or EndpointSlice first) concludes the same.
#[tokio::test]
async fn writes_inside_a_watch_lag_never_leave_a_stale_available_true() {
    let (_client, ns) = setup("rec-chain").await;
    let lag = support::lag::LagLayer {
        resource: "microservices",
        lag: Duration::from_secs(15),
    };
    let refuse = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let op_client = support::failing_client_with(
        CLUSTER,
        support::lag::FailLayer {
            resource: "services",
            failing: refuse.clone(),
            refuse: support::lag::Refuse::NextWrite,
        },
        Some(lag),
    )
    .await;
    // Reconciles wait at their start while the gate is held (30 s at most).
    let (gate, held) = tokio::sync::watch::channel(false);
    let hooks = Hooks {
        before_reconcile: Some(Arc::new(move |_| {
            let mut held = held.clone();
            async move {
                let _ = tokio::time::timeout(Duration::from_secs(30), held.wait_for(|held| !held))
                    .await;
            }
            .boxed()
        })),
        ..Default::default()
    };
    let op = Operator::start(&op_client, settings(CLUSTER, &ns.name), hooks);
    let api = ns.api::<Microservice>();
    let pods = ns.api::<Pod>();
    let services = ns.api::<Service>();
    api.create(
        &PostParams::default(),
        &microservice("chain", "ghcr.io/acme/chain:1", 8080, Some(2)),
    )
    .await
    .expect("create");
    wait_condition(&api, "chain", "Available", "True", None).await;
    // The controller's cache holds Available=False (a pod not ready): wait
    // out the lag after the live object shows it.
    set_first_pod_ready(&pods, "chain", false).await;
    wait_condition(&api, "chain", "Available", "False", None).await;
    tokio::time::sleep(lag.lag + Duration::from_secs(3)).await;

    // Inside the lag. Write 1: Available=True.
    let started = Instant::now();
    set_first_pod_ready(&pods, "chain", true).await;
    wait_condition(&api, "chain", "Available", "True", None).await;
    // The pod is not ready again, and a hand edit of the Service comes with
    // it; one reconcile takes both in. Write 2: the repair is refused once,
    // so Reconciled=False/ApiError, Available kept. The retry repairs it
    // and concludes the status the lagging cache still shows: write 3 is
    // due, Available=False.
    gate.send_replace(true);
    refuse.store(true, std::sync::atomic::Ordering::SeqCst);
    set_first_pod_ready(&pods, "chain", false).await;
    let drift = json!({"spec": {"ports": [{"name": "http", "port": 9999, "targetPort": 8080, "protocol": "TCP"}]}});
    services
        .patch("chain", &PatchParams::default(), &merge(drift))
        .await
        .expect("hand edit");
    let deployments = ns.api::<Deployment>();
    eventually(
        "the Deployment sees the pod",
        Duration::from_secs(10),
        || {
            let deployments = deployments.clone();
            async move {
                let d = deployments.get("chain").await.ok()?;
                (d.status?.available_replicas.unwrap_or(0) < 2).then_some(())
            }
        },
    )
    .await;
    // The controller's child caches take the changes in.
    tokio::time::sleep(Duration::from_secs(1)).await;
    gate.send_replace(false);
    let staged = started.elapsed();
    eventually("the Service repaired", Duration::from_secs(30), || {
        let services = services.clone();
        async move {
            let s = services.get("chain").await.ok()?;
            s.spec?.ports?.iter().all(|p| p.port != 9999).then_some(())
        }
    })
    .await;
    assert!(
        !refuse.load(std::sync::atomic::Ordering::SeqCst),
        "the repair was never refused: no API error was staged"
    );
    assert!(
        staged + Duration::from_secs(5) < lag.lag,
        "staged {staged:?} after the first write, too near the end of the lag"
    );
    // It must be written now, not when the cache catches up or at a resync.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let ms = api.get("chain").await.expect("get");
        let available = ms
            .status
            .as_ref()
            .and_then(|s| find(&s.conditions, "Available").map(|c| c.status.clone()));
        if available.as_deref() == Some("False") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Available={available:?} 5 s after a pod was not ready: {:?}",
            ms.status
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    op.stop().await;
}
