//! Proof that the local fleet behaves like real clusters: the behaviours the
//! operator relies on (availability, garbage collection, endpoints, optimistic
//! concurrency on Leases) happen for real.

mod support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;
use support::{StoppedMember, TestNamespace, client, eventually, from_json};

fn deployment(name: &str, replicas: i32) -> Deployment {
    from_json(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{
                    "name": "app",
                    "image": "registry.example.com/app:1",
                    "ports": [{"containerPort": 8080}],
                }]},
            },
        },
    }))
}

#[tokio::test]
async fn deployment_in_member_2_becomes_available() {
    let client = client("member-2").await;
    let ns = TestNamespace::create(&client, "member-2", "bed-deploy").await;
    let api = ns.api::<Deployment>();
    api.create(&PostParams::default(), &deployment("web", 2))
        .await
        .expect("create deployment");

    let available = eventually("2 available replicas", Duration::from_secs(90), || {
        let api = api.clone();
        async move {
            let d = api.get("web").await.ok()?;
            let n = d.status?.available_replicas?;
            (n == 2).then_some(n)
        }
    })
    .await;
    assert_eq!(available, 2);
}

/// A member whose apiserver was down runs workloads again as soon as it is
/// back: its controller-manager and kwok do not sit out a reconnect backoff
/// grown during the outage (member-3: no other test here uses it).
#[tokio::test]
async fn a_member_back_from_an_outage_runs_workloads_at_once() {
    let down = StoppedMember::stop("member-3");
    // Long enough for client-go's reconnect backoff to pass 10 s.
    tokio::time::sleep(Duration::from_secs(30)).await;
    drop(down);
    let client = client("member-3").await;
    let ns = TestNamespace::create(&client, "member-3", "bed-restart").await;
    let api = ns.api::<Deployment>();
    api.create(&PostParams::default(), &deployment("web", 1))
        .await
        .expect("create deployment");
    eventually(
        "the Deployment Available after the restart",
        Duration::from_secs(15),
        || {
            let api = api.clone();
            async move {
                let d = api.get("web").await.ok()?;
                (d.status?.available_replicas? == 1).then_some(())
            }
        },
    )
    .await;
}

#[tokio::test]
async fn deleting_an_owner_garbage_collects_what_it_owns() {
    let client = client("member-1").await;
    let ns = TestNamespace::create(&client, "member-1", "bed-gc").await;
    let api = ns.api::<ConfigMap>();
    let owner = api
        .create(
            &PostParams::default(),
            &from_json(json!({"metadata": {"name": "owner"}})),
        )
        .await
        .expect("create owner");
    let uid = owner.metadata.uid.expect("server sets uid");
    api.create(
        &PostParams::default(),
        &from_json(json!({"metadata": {"name": "owned", "ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid,
            "controller": true, "blockOwnerDeletion": true,
        }]}})),
    )
    .await
    .expect("create owned");

    api.delete("owner", &DeleteParams::background())
        .await
        .expect("delete owner");
    eventually("owned ConfigMap collected", Duration::from_secs(60), || {
        let api = api.clone();
        async move { api.get_opt("owned").await.ok()?.is_none().then_some(()) }
    })
    .await;
}

#[tokio::test]
async fn service_gets_endpointslice_with_ready_endpoints() {
    let client = client("member-1").await;
    let ns = TestNamespace::create(&client, "member-1", "bed-eps").await;
    ns.api::<Deployment>()
        .create(&PostParams::default(), &deployment("api", 2))
        .await
        .expect("create deployment");
    let svc: Service = from_json(json!({
        "metadata": {"name": "api"},
        "spec": {"selector": {"app": "api"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }));
    ns.api::<Service>()
        .create(&PostParams::default(), &svc)
        .await
        .expect("create service");

    let slices = ns.api::<EndpointSlice>();
    let ready = eventually("2 ready endpoints", Duration::from_secs(90), || {
        let slices = slices.clone();
        async move {
            let lp = ListParams::default().labels("kubernetes.io/service-name=api");
            let list = slices.list(&lp).await.ok()?;
            let ready = list
                .items
                .iter()
                .flat_map(|s| s.endpoints.iter().flatten())
                .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
                .count();
            (ready == 2).then_some(ready)
        }
    })
    .await;
    assert_eq!(ready, 2);
}

#[tokio::test]
async fn lease_update_with_stale_resource_version_conflicts() {
    let client = client("home").await;
    let ns = TestNamespace::create(&client, "home", "bed-lease").await;
    let api = ns.api::<Lease>();
    let created = api
        .create(
            &PostParams::default(),
            &from_json(json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}})),
        )
        .await
        .expect("create lease");

    let mut first = created.clone();
    first.spec.as_mut().expect("spec").holder_identity = Some("b".into());
    let after_first = api
        .replace("l", &PostParams::default(), &first)
        .await
        .expect("update with current resourceVersion succeeds");

    // `created` still carries the resourceVersion from before the first update.
    let mut stale = created;
    stale.spec.as_mut().expect("spec").holder_identity = Some("c".into());
    match api.replace("l", &PostParams::default(), &stale).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 409, "{status:?}"),
        other => panic!("stale update must conflict, got {other:?}"),
    }

    let mut current = after_first;
    current.spec.as_mut().expect("spec").holder_identity = Some("c".into());
    let done = api
        .replace("l", &PostParams::default(), &current)
        .await
        .expect("update with current resourceVersion succeeds");
    assert_eq!(
        done.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("c")
    );
}
