//! The gRPC status API over real sockets, served by `flotilla run` replicas
//! (separate processes) over the three members of the local fleet.

mod support;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::replicas::*;
use support::{certificates, eventually, from_json, microservice, output_within};
use tokio::time::Instant;

use flotilla::api::client::{Client as GrpcClient, ClientOptions, connect};
use flotilla::api::pb;
use flotilla::crd::Microservice;

/// The longest a `flotilla` command may run here: a process meant to exit
/// that keeps serving fails its test instead of hanging it.
const CLI_LIMIT: Duration = Duration::from_secs(60);

async fn grpc(url: &str) -> GrpcClient {
    connect(&ClientOptions {
        server: url.to_string(),
        ..Default::default()
    })
    .await
    .expect("connect")
}

fn image_target(image: &str) -> Option<pb::wait_for_rollout_request::Target> {
    Some(pb::wait_for_rollout_request::Target::Image(image.into()))
}

fn states(m: &pb::Microservice) -> Vec<(String, i32, i64, i64, String)> {
    m.clusters
        .iter()
        .map(|e| {
            (
                e.cluster.clone(),
                e.state,
                e.generation,
                e.observed_generation,
                e.image.clone(),
            )
        })
        .collect()
}

/// `flotilla ARGS` against a replica; returns the exit code and stdout.
fn cli(args: &[&str]) -> (i32, String) {
    let out = output_within(
        Command::new(env!("CARGO_BIN_EXE_flotilla")).args(args),
        CLI_LIMIT,
    );
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The message a rollout stream ends with.
async fn last_progress(mut stream: tonic::Streaming<pb::RolloutProgress>) -> pb::RolloutProgress {
    let mut last = None;
    while let Some(p) = stream.next().await {
        last = Some(p.expect("progress"));
    }
    last.expect("a final message")
}

async fn create_everywhere(fleet: &ThreeReplicaFleet, name: &str, image: &str) {
    for c in fleet.clients.values() {
        let api = Api::<Microservice>::namespaced(c.clone(), &fleet.namespace);
        api.create(
            &PostParams::default(),
            &microservice(name, image, 8080, Some(1)),
        )
        .await
        .expect("create");
    }
}

async fn patch_image_everywhere(fleet: &ThreeReplicaFleet, name: &str, image: &str) {
    for c in fleet.clients.values() {
        Api::<Microservice>::namespaced(c.clone(), &fleet.namespace)
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"image": image}})),
            )
            .await
            .expect("patch");
    }
}

async fn all_done(
    client: &mut GrpcClient,
    ns: &str,
    name: &str,
    clusters: u32,
) -> pb::Microservice {
    eventually(
        &format!("{ns}/{name} done in {clusters} clusters"),
        Duration::from_secs(90),
        || {
            let mut client = client.clone();
            async move {
                let m = client
                    .get_microservice(pb::GetMicroserviceRequest {
                        namespace: ns.into(),
                        name: name.into(),
                    })
                    .await
                    .ok()?
                    .into_inner();
                let a = m.aggregate.clone()?;
                (a.all_done && a.clusters == clusters).then_some(m)
            }
        },
    )
    .await
}

#[tokio::test]
async fn a_replica_that_leads_nothing_answers_like_a_leader() {
    let clients = member_clients().await;
    let (ns, _guards) = namespaces(&clients, "grpc-any").await;
    let mut replicas = Replicas::new(&ns, &MEMBERS);
    // The assertions name each Lease's holder and epoch: no hand-over
    // under a loaded machine's stalls.
    replicas.election = STEADY_ELECTION.map(String::from).to_vec();
    let ids = ["r1", "r2", "r3", "r4"];
    for id in ids {
        replicas.start(id);
    }
    // Settled on the assignment, not just balanced: a hand-over to the
    // replica taken for idle must not come after this.
    let held = assigned(&clients, &replicas.lease_name(), &ids).await;
    let idle = ids
        .iter()
        .find(|id| !held.values().any(|h| h == *id))
        .expect("four replicas, three members: one leads nothing")
        .to_string();
    let leader = held["member-1"].clone();
    for c in clients.values() {
        Api::<Microservice>::namespaced(c.clone(), &ns)
            .create(
                &PostParams::default(),
                &microservice("todo-api", "ghcr.io/acme/todo:1", 8080, Some(1)),
            )
            .await
            .expect("create");
    }
    let mut idle_client = grpc(&replicas.grpc_url(&idle)).await;
    let from_idle = all_done(&mut idle_client, &ns, "todo-api", 3).await;
    let agg = from_idle.aggregate.clone().unwrap();
    assert_eq!((agg.clusters, agg.done), (3, 3));
    assert_eq!(
        agg.summary,
        "Available in 3/3 clusters at their current generation"
    );
    let clusters: Vec<&str> = from_idle
        .clusters
        .iter()
        .map(|e| e.cluster.as_str())
        .collect();
    assert_eq!(clusters, MEMBERS);
    for e in &from_idle.clusters {
        assert_eq!(e.observed_generation, e.generation);
        let r = e.replicas.expect("replica counts");
        assert_eq!((r.desired, r.available), (1, 1), "{}", e.cluster);
        assert!(
            e.conditions
                .iter()
                .any(|c| c.r#type == "Available" && c.status == "True")
        );
    }
    let mut leader_client = grpc(&replicas.grpc_url(&leader)).await;
    let from_leader = all_done(&mut leader_client, &ns, "todo-api", 3).await;
    assert_eq!(states(&from_idle), states(&from_leader));

    // ListClusters: the idle replica knows every leader and leads nothing.
    let listed = idle_client
        .list_clusters(pb::ListClustersRequest {})
        .await
        .expect("list clusters")
        .into_inner();
    assert_eq!(listed.replica_id, idle);
    for c in &listed.clusters {
        assert_eq!(c.reachability, pb::Reachability::Reachable as i32, "{c:?}");
        assert!(c.synced, "{c:?}");
        assert!(!c.led_by_this_replica, "{c:?}");
        assert_eq!(c.lease_holder, held[&c.name], "{c:?}");
        let lease = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
            clients[c.name.as_str()].clone(),
            LEASE_NAMESPACE,
        )
        .get(&replicas.lease_name())
        .await
        .expect("lease");
        let transitions = lease.spec.and_then(|s| s.lease_transitions).unwrap_or(0);
        assert_eq!(c.epoch, transitions, "{c:?}");
        assert_eq!(c.microservices, 1, "{c:?}");
        assert!(c.source.starts_with("file "), "{c:?}");
    }

    // The CLI, in both formats.
    let url = replicas.grpc_url(&idle);
    let (code, out) = cli(&[
        "status",
        &format!("{ns}/todo-api"),
        "--server",
        &url,
        "-o",
        "json",
    ]);
    assert_eq!(code, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["aggregate"]["done"], 3);
    let (code, out) = cli(&["clusters", "--server", &url]);
    assert_eq!(code, 0);
    assert!(
        out.contains("member-2") && out.contains("Reachable"),
        "{out}"
    );
    let (code, out) = cli(&["status", "-n", &ns, "--server", &url]);
    assert_eq!(code, 0);
    assert!(
        out.contains(&format!("{ns}/todo-api: Available in 3/3")),
        "{out}"
    );

    // Paging and filters.
    let page = idle_client
        .list_microservices(pb::ListMicroservicesRequest {
            namespace: ns.clone(),
            cluster: "member-3".into(),
            page_size: 1,
            ..Default::default()
        })
        .await
        .expect("list")
        .into_inner();
    assert_eq!(page.items.len(), 1);
    assert_eq!(page.items[0].clusters.len(), 1);
    assert!(page.next_page_token.is_empty());

    // The BASIC view: the same rows, without conditions, messages or labels.
    let list = |view: pb::MicroserviceView| pb::ListMicroservicesRequest {
        namespace: ns.clone(),
        view: view as i32,
        ..Default::default()
    };
    let full = idle_client
        .list_microservices(list(pb::MicroserviceView::Full))
        .await
        .expect("full list")
        .into_inner();
    let basic = idle_client
        .list_microservices(list(pb::MicroserviceView::Basic))
        .await
        .expect("basic list")
        .into_inner();
    assert_eq!(basic.items.len(), full.items.len());
    assert!(!full.items.is_empty());
    for (b, f) in basic.items.iter().zip(&full.items) {
        assert_eq!((&b.name, &b.aggregate), (&f.name, &f.aggregate));
        assert_eq!(b.clusters.len(), f.clusters.len());
        for (be, fe) in b.clusters.iter().zip(&f.clusters) {
            let row = |e: &pb::ClusterEntry| {
                let e = e.clone();
                (
                    e.cluster,
                    e.state,
                    e.reason,
                    e.generation,
                    e.observed_generation,
                    e.image,
                    e.replicas,
                    e.microservice_phase,
                    e.reachability,
                )
            };
            assert_eq!(row(be), row(fe));
            assert!(!fe.conditions.is_empty(), "{fe:?}");
            assert!(be.conditions.is_empty() && be.labels.is_empty() && be.message.is_empty());
        }
    }
}

#[tokio::test]
async fn wait_for_rollout_ends_only_when_every_cluster_serves_the_new_generation() {
    let fleet = three_replica_fleet("grpc-wait").await;
    let ns = fleet.namespace.clone();
    create_everywhere(&fleet, "todo-api", "ghcr.io/acme/todo:1").await;
    let mut client = grpc(&fleet.replicas.grpc_url("r2")).await;
    all_done(&mut client, &ns, "todo-api", 3).await;

    // Asked before the change: every cluster is Available=True, but for the
    // old image, so the wait must not end.
    let mut stream = client
        .wait_for_rollout(pb::WaitForRolloutRequest {
            namespace: ns.clone(),
            name: "todo-api".into(),
            target: image_target("ghcr.io/acme/todo:2"),
            timeout: Some(prost_types::Duration {
                seconds: 120,
                nanos: 0,
            }),
            ..Default::default()
        })
        .await
        .expect("wait")
        .into_inner();
    let first = stream.next().await.expect("first progress").expect("ok");
    assert_eq!(first.result, pb::RolloutResult::InProgress as i32);
    assert!(
        first.clusters.iter().all(|e| e.reason == "ImageNotInSpec"),
        "{first:?}"
    );

    patch_image_everywhere(&fleet, "todo-api", "ghcr.io/acme/todo:2").await;
    let mut seen = vec![first];
    while let Some(p) = stream.next().await {
        seen.push(p.expect("progress"));
    }
    let last = seen.last().unwrap();
    assert_eq!(last.result, pb::RolloutResult::Succeeded as i32, "{last:?}");
    assert!(
        seen[..seen.len() - 1]
            .iter()
            .all(|p| p.result == pb::RolloutResult::InProgress as i32)
    );
    // Progress came per cluster, not only at the end.
    assert!(seen.len() >= 3, "only {} progress messages", seen.len());
    // When it said SUCCEEDED, every member had observed the new generation
    // and was Available for it.
    for (m, c) in &fleet.clients {
        let ms = Api::<Microservice>::namespaced(c.clone(), &ns)
            .get("todo-api")
            .await
            .unwrap();
        let status = ms.status.clone().unwrap();
        assert_eq!(status.observed_generation, ms.metadata.generation, "{m}");
        assert!(
            status
                .conditions
                .iter()
                .any(|c| c.type_ == "Available" && c.status == "True"),
            "{m}"
        );
        assert_eq!(ms.spec.image, "ghcr.io/acme/todo:2");
    }
    for e in &last.clusters {
        assert_eq!(e.state, pb::EntryState::Done as i32);
        assert_eq!(e.observed_generation, e.generation);
        assert_eq!(e.image, "ghcr.io/acme/todo:2");
    }

    // The CLI says done with exit code 0.
    let url = fleet.replicas.grpc_url("r3");
    let (code, out) = cli(&[
        "wait",
        &format!("{ns}/todo-api"),
        "--image",
        "ghcr.io/acme/todo:2",
        "--timeout",
        "30s",
        "--server",
        &url,
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("Succeeded"), "{out}");
}

#[tokio::test]
async fn a_permanent_failure_ends_the_wait_failed_and_a_deadline_ends_it_exceeded() {
    let fleet = three_replica_fleet("grpc-fail").await;
    let ns = fleet.namespace.clone();
    // member-2 already has a Deployment named "clash" that is not ours.
    let foreign: Deployment = from_json(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "clash"},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "foreign"}},
            "template": {"metadata": {"labels": {"app": "foreign"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}},
        },
    }));
    Api::<Deployment>::namespaced(fleet.clients["member-2"].clone(), &ns)
        .create(&PostParams::default(), &foreign)
        .await
        .expect("foreign deployment");
    create_everywhere(&fleet, "clash", "ghcr.io/acme/clash:1").await;
    let url = fleet.replicas.grpc_url("r1");
    let mut client = grpc(&url).await;
    let stream = client
        .wait_for_rollout(pb::WaitForRolloutRequest {
            namespace: ns.clone(),
            name: "clash".into(),
            target: image_target("ghcr.io/acme/clash:1"),
            timeout: Some(prost_types::Duration {
                seconds: 120,
                nanos: 0,
            }),
            ..Default::default()
        })
        .await
        .expect("wait")
        .into_inner();
    let last = last_progress(stream).await;
    assert_eq!(last.result, pb::RolloutResult::Failed as i32, "{last:?}");
    assert_eq!(last.failed_clusters, ["member-2"]);
    let m2 = last
        .clusters
        .iter()
        .find(|e| e.cluster == "member-2")
        .unwrap();
    assert_eq!(m2.reason, "OwnershipConflict");

    let key = format!("{ns}/clash");
    let (code, out) = cli(&[
        "wait",
        &key,
        "--image",
        "ghcr.io/acme/clash:1",
        "--timeout",
        "60s",
        "--server",
        &url,
    ]);
    assert_eq!(code, 1, "a permanent failure exits 1: {out}");
    assert!(out.contains("member-2"), "{out}");

    // Nobody will ever run :9, so only the deadline ends this.
    let started = Instant::now();
    let stream = client
        .wait_for_rollout(pb::WaitForRolloutRequest {
            namespace: ns.clone(),
            name: "clash".into(),
            target: image_target("ghcr.io/acme/clash:9"),
            clusters: vec!["member-1".into(), "member-3".into()],
            timeout: Some(prost_types::Duration {
                seconds: 2,
                nanos: 0,
            }),
        })
        .await
        .expect("wait")
        .into_inner();
    let last = last_progress(stream).await;
    assert_eq!(
        last.result,
        pb::RolloutResult::DeadlineExceeded as i32,
        "{last:?}"
    );
    assert!(started.elapsed() >= Duration::from_secs(2));
    let (code, out) = cli(&[
        "wait",
        &key,
        "--image",
        "ghcr.io/acme/clash:9",
        "--cluster",
        "member-1",
        "--timeout",
        "2s",
        "--server",
        &url,
    ]);
    assert_eq!(code, 2, "a timeout exits 2: {out}");

    // Bad requests: a clear code, and the server keeps serving.
    let bad_name = client
        .get_microservice(pb::GetMicroserviceRequest {
            namespace: ns.clone(),
            name: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(bad_name.code(), tonic::Code::InvalidArgument);
    assert!(bad_name.message().contains("name is required"));
    let missing = client
        .get_microservice(pb::GetMicroserviceRequest {
            namespace: ns.clone(),
            name: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);
    let bad_selector = client
        .list_microservices(pb::ListMicroservicesRequest {
            label_selector: "tier in web".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(bad_selector.code(), tonic::Code::InvalidArgument);
    let bad_token = client
        .list_microservices(pb::ListMicroservicesRequest {
            page_token: "zz".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(bad_token.code(), tonic::Code::InvalidArgument);
    let bad_view = client
        .list_microservices(pb::ListMicroservicesRequest {
            view: 9,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(bad_view.code(), tonic::Code::InvalidArgument);
    assert!(bad_view.message().contains("view 9"), "{bad_view:?}");
    let no_target = client
        .wait_for_rollout(pb::WaitForRolloutRequest {
            namespace: ns.clone(),
            name: "clash".into(),
            ..Default::default()
        })
        .await
        .expect_err("refused");
    assert_eq!(no_target.code(), tonic::Code::InvalidArgument);
    let unknown_cluster = client
        .wait_for_rollout(pb::WaitForRolloutRequest {
            namespace: ns.clone(),
            name: "clash".into(),
            target: image_target("x:1"),
            clusters: vec!["member-9".into()],
            ..Default::default()
        })
        .await
        .expect_err("refused");
    assert_eq!(unknown_cluster.code(), tonic::Code::InvalidArgument);
    assert!(
        unknown_cluster.message().contains("member-9"),
        "{unknown_cluster:?}"
    );
    let oversized = client
        .list_microservices(pb::ListMicroservicesRequest {
            label_selector: "a".repeat(200 * 1024),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        oversized.code(),
        tonic::Code::ResourceExhausted,
        "{oversized:?}"
    );
    client
        .get_microservice(pb::GetMicroserviceRequest {
            namespace: ns.clone(),
            name: "clash".into(),
        })
        .await
        .expect("still serving");
}

async fn next_event(stream: &mut tonic::Streaming<pb::WatchEvent>) -> pb::WatchEvent {
    tokio::time::timeout(Duration::from_secs(30), stream.next())
        .await
        .expect("an event within 30s")
        .expect("stream open")
        .expect("event")
}

#[tokio::test]
async fn watch_sends_a_snapshot_then_changes_and_resumes_without_loss() {
    let fleet = three_replica_fleet("grpc-watch").await;
    let ns = fleet.namespace.clone();
    create_everywhere(&fleet, "alpha", "ghcr.io/acme/a:1").await;
    let url = fleet.replicas.grpc_url("r1");
    let mut client = grpc(&url).await;
    all_done(&mut client, &ns, "alpha", 3).await;

    let request = |resume_revision: u64, index_id: String| pb::WatchMicroservicesRequest {
        namespace: ns.clone(),
        resume_revision,
        index_id,
        ..Default::default()
    };
    let mut stream = client
        .watch_microservices(request(0, String::new()))
        .await
        .expect("watch")
        .into_inner();
    let reset = next_event(&mut stream).await;
    assert_eq!(reset.r#type, pb::WatchEventType::Reset as i32);
    let snap = next_event(&mut stream).await;
    assert_eq!(snap.r#type, pb::WatchEventType::Snapshot as i32);
    assert_eq!(snap.revision, 0, "a snapshot item is no resume point");
    assert_eq!(snap.microservice.as_ref().unwrap().name, "alpha");
    let synced = next_event(&mut stream).await;
    assert_eq!(synced.r#type, pb::WatchEventType::Synced as i32);
    let index_id = synced.index_id.clone();

    // Each change reaches the watcher; record how long it took.
    let api1 = Api::<Microservice>::namespaced(fleet.clients["member-1"].clone(), &ns);
    let mut delays = Vec::new();
    let mut last_revision = synced.revision;
    for i in 2..=6 {
        let image = format!("ghcr.io/acme/a:{i}");
        let t0 = Instant::now();
        api1.patch(
            "alpha",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"image": image}})),
        )
        .await
        .expect("patch");
        loop {
            let e = next_event(&mut stream).await;
            assert_eq!(e.r#type, pb::WatchEventType::Upsert as i32);
            assert!(e.revision > last_revision, "revisions only grow");
            last_revision = e.revision;
            let m = e.microservice.unwrap();
            if m.clusters
                .iter()
                .any(|c| c.cluster == "member-1" && c.image == image)
            {
                delays.push(t0.elapsed());
                break;
            }
        }
    }
    delays.sort();
    eprintln!("change-to-watch-event delays: {delays:?}");
    assert!(
        delays[delays.len() / 2] < Duration::from_secs(1),
        "{delays:?}"
    );

    // Disconnect; meanwhile beta appears and alpha goes away everywhere.
    drop(stream);
    create_everywhere(&fleet, "beta", "ghcr.io/acme/b:1").await;
    for c in fleet.clients.values() {
        Api::<Microservice>::namespaced(c.clone(), &ns)
            .delete("alpha", &DeleteParams::default())
            .await
            .expect("delete");
    }
    eventually("the index saw the changes", Duration::from_secs(30), || {
        let mut client = client.clone();
        let ns = ns.clone();
        async move {
            let alpha = client
                .get_microservice(pb::GetMicroserviceRequest {
                    namespace: ns.clone(),
                    name: "alpha".into(),
                })
                .await;
            let beta = client
                .get_microservice(pb::GetMicroserviceRequest {
                    namespace: ns,
                    name: "beta".into(),
                })
                .await
                .ok()?
                .into_inner();
            (alpha.is_err() && beta.clusters.len() == 3).then_some(())
        }
    })
    .await;

    let mut resumed = client
        .watch_microservices(request(last_revision, index_id.clone()))
        .await
        .expect("resume")
        .into_inner();
    let mut deleted = BTreeSet::new();
    let mut upserted = BTreeSet::new();
    loop {
        let e = next_event(&mut resumed).await;
        assert!(
            e.r#type != pb::WatchEventType::Snapshot as i32
                && e.r#type != pb::WatchEventType::Reset as i32,
            "a resume sends no snapshot"
        );
        if e.r#type == pb::WatchEventType::Synced as i32 {
            break;
        }
        let name = e.microservice.unwrap().name;
        if e.r#type == pb::WatchEventType::Delete as i32 {
            deleted.insert(name);
        } else {
            upserted.insert(name);
        }
    }
    assert!(deleted.contains("alpha"), "{deleted:?}");
    assert!(upserted.contains("beta"), "{upserted:?}");

    // Another replica's revisions mean nothing here: a fresh snapshot.
    let mut elsewhere = client
        .watch_microservices(request(last_revision, "some-other-index".into()))
        .await
        .expect("watch")
        .into_inner();
    let e = next_event(&mut elsewhere).await;
    assert_eq!(e.r#type, pb::WatchEventType::Reset as i32);
    let e = next_event(&mut elsewhere).await;
    assert_eq!(e.r#type, pb::WatchEventType::Snapshot as i32);
    assert_eq!(e.microservice.unwrap().name, "beta");
}

#[tokio::test]
async fn health_turns_serving_after_sync_and_reflection_lists_the_service() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let clients = member_clients().await;
    let (ns, _guards) = namespaces(&clients, "grpc-health").await;
    let mut replicas = Replicas::new(&ns, &MEMBERS);
    // It stops no replica: a loaded machine's stall must not read as a
    // member gone silent.
    replicas.election = STEADY_ELECTION.map(String::from).to_vec();
    replicas.grpc_args.push("--grpc-reflection".into());
    replicas.start("r1");
    let url = replicas.grpc_url("r1");
    let channel = eventually("the gRPC port open", Duration::from_secs(30), || async {
        tonic::transport::Endpoint::from_shared(url.clone())
            .ok()?
            .connect()
            .await
            .ok()
    })
    .await;
    let mut health = HealthClient::new(channel.clone());
    let mut api = grpc(&url).await;
    // Whenever health says SERVING, every cluster has synced.
    eventually("SERVING", Duration::from_secs(60), || {
        let mut health = health.clone();
        let mut api = api.clone();
        async move {
            let s = health
                .check(tonic_health::pb::HealthCheckRequest {
                    service: "flotilla.v1.FleetStatus".into(),
                })
                .await
                .ok()?
                .into_inner()
                .status;
            if s != ServingStatus::Serving as i32 {
                return None;
            }
            let clusters = api
                .list_clusters(pb::ListClustersRequest {})
                .await
                .ok()?
                .into_inner()
                .clusters;
            assert_eq!(clusters.len(), 3);
            assert!(
                clusters.iter().all(|c| c.synced),
                "SERVING before sync: {clusters:?}"
            );
            Some(())
        }
    })
    .await;
    let overall = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(overall.status, ServingStatus::Serving as i32);

    let mut reflection = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = reflection
        .server_reflection_info(futures::stream::iter(vec![request]))
        .await
        .expect("reflection")
        .into_inner();
    let response = responses.next().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("unexpected reflection answer: {response:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"flotilla.v1.FleetStatus".to_string()),
        "{names:?}"
    );
    api.list_clusters(pb::ListClustersRequest {})
        .await
        .expect("api");
}

#[tokio::test]
async fn tls_client_certificates_and_the_token_guard_the_api() {
    let clients = member_clients().await;
    let (ns, _guards) = namespaces(&clients, "grpc-tls").await;
    let mut replicas = Replicas::new(&ns, &["member-1"]);
    let pki = replicas.dir.join("pki");
    std::fs::create_dir_all(&pki).unwrap();
    certificates(&pki);
    let p = |f: &str| pki.join(f).display().to_string();
    replicas.grpc_args = vec![
        "--grpc-tls-cert".into(),
        p("server.crt"),
        "--grpc-tls-key".into(),
        p("server.key"),
        "--grpc-client-ca".into(),
        p("ca.crt"),
        "--grpc-token-file".into(),
        p("token"),
    ];
    replicas.start("r1");
    let port = replicas.grpc_ports["r1"];
    let https = format!("https://127.0.0.1:{port}");
    let options = |cert: &str, token: Option<&str>| ClientOptions {
        server: https.clone(),
        ca: Some(pki.join("ca.crt")),
        cert: Some(pki.join(format!("{cert}.crt"))),
        key: Some(pki.join(format!("{cert}.key"))),
        tls_server_name: None,
        token: token.map(str::to_string),
    };
    // A good client: trusted certificate and the token. Until the replica
    // has read its registry every call is UNAVAILABLE, so wait for an answer.
    let mut good = eventually(
        "TLS server up and answering",
        Duration::from_secs(30),
        || async {
            let mut c = connect(&options("client", Some("let-me-in"))).await.ok()?;
            c.list_clusters(pb::ListClustersRequest {}).await.ok()?;
            Some(c)
        },
    )
    .await;
    good.list_clusters(pb::ListClustersRequest {})
        .await
        .expect("a good client succeeds");

    // Plaintext to the TLS port is refused.
    let plain = connect(&ClientOptions {
        server: format!("http://127.0.0.1:{port}"),
        ..Default::default()
    })
    .await;
    if let Ok(mut c) = plain {
        assert!(
            c.list_clusters(pb::ListClustersRequest {}).await.is_err(),
            "plaintext was served"
        );
    }
    // A client certificate from an unknown CA fails the handshake.
    match connect(&options("stranger", Some("let-me-in"))).await {
        Err(_) => {}
        Ok(mut c) => assert!(
            c.list_clusters(pb::ListClustersRequest {}).await.is_err(),
            "an unknown client CA was accepted"
        ),
    }
    // Trusted certificate, but no token or a wrong one.
    for token in [None, Some("wrong")] {
        let mut c = connect(&options("client", token))
            .await
            .expect("TLS handshake");
        let err = c
            .list_clusters(pb::ListClustersRequest {})
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated, "token {token:?}");
    }
    // The CLI with the same credentials.
    let (code, out) = cli(&[
        "clusters",
        "--server",
        &https,
        "--ca",
        &p("ca.crt"),
        "--cert",
        &p("client.crt"),
        "--key",
        &p("client.key"),
        "--token-file",
        &p("token"),
        "-o",
        "json",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("member-1"), "{out}");
    let (code, _) = cli(&[
        "clusters",
        "--server",
        &https,
        "--ca",
        &p("ca.crt"),
        "--cert",
        &p("client.crt"),
        "--key",
        &p("client.key"),
    ]);
    assert_eq!(code, 3, "no token: the question cannot be asked");
}

#[tokio::test]
async fn run_refuses_plaintext_unless_asked() {
    let out = output_within(
        Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .args(["run", "--fleet", "--grpc-addr", "127.0.0.1:0"])
            .args(["--replica-id", "plain"]),
        CLI_LIMIT,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--grpc-insecure"), "{err}");
}

#[tokio::test]
async fn a_page_token_cut_inside_a_character_is_invalid_and_the_server_keeps_serving() {
    let clients = member_clients().await;
    let (ns, _guards) = namespaces(&clients, "grpc-token").await;
    let mut replicas = Replicas::new(&ns, &["member-1"]);
    replicas.start("r1");
    // Until the registry is read every call is UNAVAILABLE, which would
    // hide whether a bad token broke anything.
    let mut api = serving(&replicas.grpc_url("r1")).await;
    for token in ["aé0", "éé", "0é", "zz"] {
        let err = api
            .list_microservices(pb::ListMicroservicesRequest {
                page_token: token.into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{token:?}: {err}");
    }
    // The same connection, and the server, still serve.
    api.list_microservices(pb::ListMicroservicesRequest::default())
        .await
        .expect("the server keeps serving");
    api.list_clusters(pb::ListClustersRequest {})
        .await
        .expect("the server keeps serving");
}

#[tokio::test]
async fn a_list_page_stops_at_its_byte_budget_and_the_pages_hold_every_item_once() {
    let clients = member_clients().await;
    let (ns, _guards) = namespaces(&clients, "grpc-pages").await;
    let member = clients["member-1"].clone();
    let api: Api<Microservice> = Api::namespaced(member, &ns);
    let names: Vec<String> = (0..30).map(|i| format!("svc-{i:02}")).collect();
    for name in &names {
        api.create(
            &PostParams::default(),
            &microservice(name, "ghcr.io/acme/app:1", 8080, Some(1)),
        )
        .await
        .expect("create");
    }
    const BUDGET: usize = 4096;
    let mut replicas = Replicas::new(&ns, &["member-1"]);
    replicas.extra_args = vec!["--grpc-max-page-bytes".into(), BUDGET.to_string()];
    replicas.start("r1");
    let mut client = serving(&replicas.grpc_url("r1")).await;
    let ask = |page_token: String| pb::ListMicroservicesRequest {
        namespace: ns.clone(),
        page_size: 1000,
        page_token,
        ..Default::default()
    };
    let first = eventually("all 30 indexed", Duration::from_secs(60), || {
        let mut client = client.clone();
        let (ns, names) = (ns.clone(), names.clone());
        async move {
            for name in names {
                let r = client.get_microservice(pb::GetMicroserviceRequest {
                    namespace: ns.clone(),
                    name,
                });
                r.await.ok()?;
            }
            Some(
                client
                    .list_microservices(ask(String::new()))
                    .await
                    .ok()?
                    .into_inner(),
            )
        }
    })
    .await;
    assert!(
        first.items.len() < names.len() && !first.next_page_token.is_empty(),
        "a page of {} FULL items and token {:?}: the budget did not cut it",
        first.items.len(),
        first.next_page_token
    );
    let mut seen = Vec::new();
    let mut page = first;
    let mut pages = 1;
    loop {
        use prost::Message;
        assert!(!page.items.is_empty(), "an empty page {pages}");
        let items_bytes = pb::ListMicroservicesResponse {
            items: page.items.clone(),
            ..Default::default()
        }
        .encoded_len();
        assert!(
            items_bytes <= BUDGET,
            "page {pages}: {items_bytes} bytes > {BUDGET}"
        );
        seen.extend(page.items.iter().map(|m| m.name.clone()));
        if page.next_page_token.is_empty() {
            break;
        }
        page = client
            .list_microservices(ask(page.next_page_token.clone()))
            .await
            .expect("next page")
            .into_inner();
        pages += 1;
        assert!(pages <= names.len(), "paging does not end");
    }
    assert_eq!(seen, names, "every item once, in order, over {pages} pages");
    println!(
        "figure: 30 FULL items asked 1000 to a page came in {pages} pages of at most {BUDGET} bytes"
    );
}

/// A List whose client reads nothing: its reply waits in the server past
/// the client's 1 KiB stream window. Returns the connection and the reply,
/// to keep (or drop) together.
async fn unread_list(
    url: &str,
    request: pb::ListMicroservicesRequest,
) -> (tonic::transport::Channel, http::Response<tonic::body::Body>) {
    use prost::Message;
    use tower::{Service, ServiceExt};
    let mut channel = tonic::transport::Endpoint::from_shared(url.to_string())
        .expect("url")
        .initial_stream_window_size(Some(1024))
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect");
    let message = request.encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend((message.len() as u32).to_be_bytes());
    framed.extend(message);
    let call = http::Request::builder()
        .method("POST")
        .uri(format!("{url}/flotilla.v1.FleetStatus/ListMicroservices"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(tonic::body::Body::new(http_body_util::Full::new(
            bytes::Bytes::from(framed),
        )))
        .expect("request");
    let ready = channel.ready().await.expect("ready");
    let reply = tokio::time::timeout(Duration::from_secs(10), ready.call(call))
        .await
        .expect("headers within 10 s")
        .expect("a reply");
    assert_eq!(reply.status(), http::StatusCode::OK);
    (channel, reply)
}

/// Twenty Microservices on member-1 in a namespace of their own, and r1
/// serving them with `args`, once all 20 are listed.
struct Listed {
    ns: String,
    // Fields drop in order: the replica stops before its namespaces go.
    _replicas: Replicas,
    _guards: Vec<support::TestNamespace>,
    url: String,
    client: GrpcClient,
}

impl Listed {
    async fn start(prefix: &str, args: &[&str]) -> Listed {
        let clients = member_clients().await;
        let (ns, guards) = namespaces(&clients, prefix).await;
        let api: Api<Microservice> = Api::namespaced(clients["member-1"].clone(), &ns);
        for i in 0..20 {
            let ms = microservice(&format!("svc-{i:02}"), "ghcr.io/acme/app:1", 8080, Some(1));
            api.create(&PostParams::default(), &ms)
                .await
                .expect("create");
        }
        let mut replicas = Replicas::new(&ns, &["member-1"]);
        replicas.extra_args = args.iter().map(|a| a.to_string()).collect();
        replicas.start("r1");
        let url = replicas.grpc_url("r1");
        let client = serving(&url).await;
        let listed = Listed {
            ns,
            _replicas: replicas,
            _guards: guards,
            url,
            client,
        };
        eventually("20 indexed", Duration::from_secs(60), || {
            let mut client = listed.client.clone();
            let ask = listed.ask();
            async move {
                let page = client.list_microservices(ask).await.ok()?.into_inner();
                (page.items.len() == 20).then_some(())
            }
        })
        .await;
        listed
    }

    /// All of them, in one page unless the byte budget cuts it.
    fn ask(&self) -> pb::ListMicroservicesRequest {
        pb::ListMicroservicesRequest {
            namespace: self.ns.clone(),
            page_size: 1000,
            ..Default::default()
        }
    }
}

/// A call's answer within 15 s: a List waits at most 5 s for room.
async fn answered<T>(
    call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, tonic::Status> {
    tokio::time::timeout(Duration::from_secs(15), call)
        .await
        .expect("an answer within 15 s")
        .map(tonic::Response::into_inner)
}

/// A List refused RESOURCE_EXHAUSTED, for want of room.
async fn no_room<T: std::fmt::Debug>(
    call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    why: &str,
) -> tonic::Status {
    let refused = answered(call).await.expect_err(why);
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    refused
}

/// What List replies hold is bounded across calls, not only per page
/// (#37): a reply keeps its room until its client has read it. With room
/// for one page budget, a client that asks and reads nothing holds part
/// of it, so another List, which reserves a whole budget before it builds
/// its page, is refused RESOURCE_EXHAUSTED after the 5 s wait, while a Get
/// answers; once that connection is gone the room is back.
#[tokio::test]
async fn a_list_reply_holds_its_room_until_read_and_an_unread_one_blocks_only_lists() {
    const ROOM: &str = "65536";
    let listed = Listed::start(
        "grpc-room",
        &[
            "--grpc-max-page-bytes",
            ROOM,
            "--grpc-max-list-bytes-in-flight",
            ROOM,
        ],
    )
    .await;
    let (url, ns, mut client) = (&listed.url, listed.ns.clone(), listed.client.clone());
    let ask = || listed.ask();
    let all = client
        .list_microservices(ask())
        .await
        .expect("list")
        .into_inner();
    {
        use prost::Message;
        let bytes = all.encoded_len();
        assert!(bytes > 1024, "a reply of {bytes} bytes fits the window");
    }
    let (connection, unread) = unread_list(url, ask()).await;
    let started = Instant::now();
    no_room(
        client.list_microservices(ask()),
        "no room while a reply is unread",
    )
    .await;
    println!(
        "figure: a List refused after {:?} while one reply was unread",
        started.elapsed()
    );
    let get = pb::GetMicroserviceRequest {
        namespace: ns.clone(),
        name: "svc-00".into(),
    };
    client
        .get_microservice(get)
        .await
        .expect("a Get needs no List room");
    drop(unread);
    drop(connection);
    let page = answered(client.list_microservices(ask()))
        .await
        .expect("room again once the unread reply is gone");
    assert_eq!(page.items.len(), 20);
}

/// One connection's unread replies hold at most its share of the List
/// room, and each only what its page needs (#37): with room for two page
/// budgets and a share of one, a client that asks and reads nothing gets
/// no further List on that connection (its share is held), while another
/// connection's List answers at once, even beside a second unread reply.
#[tokio::test]
async fn a_connection_that_reads_nothing_holds_only_its_share_of_the_list_room() {
    const PAGE: &str = "65536";
    let listed = Listed::start(
        "grpc-share",
        &[
            "--grpc-max-page-bytes",
            PAGE,
            "--grpc-max-list-bytes-in-flight",
            "131072",
            "--grpc-max-list-bytes-per-connection",
            PAGE,
        ],
    )
    .await;
    let (url, mut client) = (&listed.url, listed.client.clone());
    // BASIC pages: each unread one holds tonic's smallest buffer, 8 KiB.
    let ask = || pb::ListMicroservicesRequest {
        view: pb::MicroserviceView::Basic as i32,
        ..listed.ask()
    };
    {
        use prost::Message;
        let page = client
            .list_microservices(ask())
            .await
            .expect("list")
            .into_inner();
        let bytes = page.encoded_len();
        assert!(
            bytes > 1024 && bytes + 5 <= 8 * 1024,
            "a BASIC page of 20 is {bytes} bytes: past the 1 KiB window, inside 8 KiB"
        );
    }
    let (connection, unread) = unread_list(url, ask()).await;
    // The same connection asks again, and reads what it gets.
    let mut same = pb::fleet_status_client::FleetStatusClient::new(connection.clone());
    let started = Instant::now();
    let refused = no_room(
        same.list_microservices(ask()),
        "the connection's share is held by its unread reply",
    )
    .await;
    assert!(
        refused.message().contains("this connection's"),
        "{refused:?}"
    );
    println!(
        "figure: the same connection's List refused after {:?}",
        started.elapsed()
    );
    // A second connection that reads nothing: each unread reply holds only
    // its buffer (8 KiB), not the page budget it reserved (64 KiB), so with
    // the two of them the room (128 KiB) still has a page budget free.
    let (_other_connection, _other_unread) = unread_list(url, ask()).await;
    let started = Instant::now();
    let page = answered(client.list_microservices(ask()))
        .await
        .expect("another connection's List has room");
    assert_eq!(page.items.len(), 20);
    println!(
        "figure: another connection's List answered in {:?}",
        started.elapsed()
    );
    drop(unread);
    let page = answered(same.list_microservices(ask()))
        .await
        .expect("the share is back once the unread reply is gone");
    assert_eq!(page.items.len(), 20);
}

/// Replaces a file as cert-manager does: the new bytes appear at once.
fn replace_file(dir: &std::path::Path, from: &str, to: &str) {
    let tmp = dir.join(format!(".{to}.new"));
    std::fs::copy(dir.join(from), &tmp).expect("copy");
    std::fs::rename(&tmp, dir.join(to)).expect("rename");
}

#[tokio::test]
/// Rotation with no restart (#23), and the streams the old credentials
/// admitted end UNAVAILABLE (#30 M1): a client resumes from its last
/// revision with the credentials in force, and loses nothing.
async fn rotated_certificates_client_ca_and_token_apply_without_a_restart_and_end_what_they_admitted()
 {
    let clients = member_clients().await;
    let (ns, _guards) = namespaces(&clients, "grpc-rotate").await;
    let mut replicas = Replicas::new(&ns, &["member-1"]);
    let pki = replicas.dir.join("pki");
    std::fs::create_dir_all(&pki).unwrap();
    certificates(&pki);
    // The next generation: a new CA, a server and a client certificate from
    // it, and a new token.
    support::sh_in(
        &pki,
        r#"
      openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=ca2" -keyout ca2.key -out ca2.crt 2>/dev/null
      openssl req -newkey rsa:2048 -nodes -subj "/CN=flotilla" -keyout server2.key -out server2.csr 2>/dev/null
      openssl x509 -req -in server2.csr -CA ca2.crt -CAkey ca2.key -CAcreateserial -days 2 -extfile server.ext -out server2.crt 2>/dev/null
      openssl req -newkey rsa:2048 -nodes -subj "/CN=client2" -keyout client2.key -out client2.csr 2>/dev/null
      openssl x509 -req -in client2.csr -CA ca2.crt -CAkey ca2.key -CAcreateserial -days 2 -extfile client.ext -out client2.crt 2>/dev/null
      printf 'new-token\n' > token2
      cp server.crt live.crt; cp server.key live.key; cp ca.crt live-ca.crt; cp token live-token
    "#,
    );
    let p = |f: &str| pki.join(f).display().to_string();
    replicas.grpc_args = vec![
        "--grpc-tls-cert".into(),
        p("live.crt"),
        "--grpc-tls-key".into(),
        p("live.key"),
        "--grpc-client-ca".into(),
        p("live-ca.crt"),
        "--grpc-token-file".into(),
        p("live-token"),
    ];
    replicas.start("r1");
    let https = format!("https://127.0.0.1:{}", replicas.grpc_ports["r1"]);
    let options = |ca: &str, cert: &str, token: &str| ClientOptions {
        server: https.clone(),
        ca: Some(pki.join(ca)),
        cert: Some(pki.join(format!("{cert}.crt"))),
        key: Some(pki.join(format!("{cert}.key"))),
        tls_server_name: None,
        token: Some(token.to_string()),
    };
    let mut old = eventually("TLS server up", Duration::from_secs(30), || async {
        let mut c = connect(&options("ca.crt", "client", "let-me-in"))
            .await
            .ok()?;
        c.list_clusters(pb::ListClustersRequest {}).await.ok()?;
        Some(c)
    })
    .await;
    let mut stream = old
        .watch_microservices(pb::WatchMicroservicesRequest {
            namespace: ns.clone(),
            ..Default::default()
        })
        .await
        .expect("watch")
        .into_inner();
    assert_eq!(
        next_event(&mut stream).await.r#type,
        pb::WatchEventType::Reset as i32
    );
    let synced = next_event(&mut stream).await;
    assert_eq!(synced.r#type, pb::WatchEventType::Synced as i32);

    replace_file(&pki, "server2.crt", "live.crt");
    replace_file(&pki, "server2.key", "live.key");
    replace_file(&pki, "ca2.crt", "live-ca.crt");
    replace_file(&pki, "token2", "live-token");
    let rotated = Instant::now();
    let mut new = eventually(
        "the new certificate and token in force",
        Duration::from_secs(20),
        || async {
            let mut c = connect(&options("ca2.crt", "client2", "new-token"))
                .await
                .ok()?;
            c.list_clusters(pb::ListClustersRequest {}).await.ok()?;
            Some(c)
        },
    )
    .await;
    println!(
        "figure: rotation in force after {:.1} s",
        rotated.elapsed().as_secs_f64()
    );
    // New connections no longer get the old certificate.
    match connect(&options("ca.crt", "client", "let-me-in")).await {
        Err(_) => {}
        Ok(mut c) => assert!(
            c.list_clusters(pb::ListClustersRequest {}).await.is_err(),
            "a new connection was served the old certificate"
        ),
    }
    // The old token is refused, on a connection with the new certificates.
    let mut stale = connect(&options("ca2.crt", "client2", "let-me-in"))
        .await
        .expect("TLS handshake");
    let err = stale
        .list_clusters(pb::ListClustersRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    new.list_clusters(pb::ListClustersRequest {})
        .await
        .expect("the new token works");

    // The stream the old credentials opened has ended, UNAVAILABLE, saying why.
    let ended = loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.message()).await {
            Err(_) => panic!("the old stream still open 10 s after the rotation took effect"),
            Ok(Ok(Some(_))) => continue,
            Ok(Ok(None)) => panic!("the old stream ended without a status"),
            Ok(Err(status)) => break status,
        }
    };
    assert_eq!(ended.code(), tonic::Code::Unavailable, "{ended:?}");
    assert!(ended.message().contains("credentials"), "{ended:?}");
    // Resumed with the new credentials from the last revision: the change
    // made after the end arrives.
    let mut resumed = new
        .watch_microservices(pb::WatchMicroservicesRequest {
            namespace: ns.clone(),
            resume_revision: synced.revision,
            index_id: synced.index_id.clone(),
            ..Default::default()
        })
        .await
        .expect("resume")
        .into_inner();
    Api::<Microservice>::namespaced(clients["member-1"].clone(), &ns)
        .create(
            &PostParams::default(),
            &microservice("rotated", "ghcr.io/acme/a:1", 8080, Some(1)),
        )
        .await
        .expect("create");
    loop {
        let e = next_event(&mut resumed).await;
        // From revision 0 (an empty index) a resume is a snapshot.
        if synced.revision > 0 {
            assert_ne!(
                e.r#type,
                pb::WatchEventType::Reset as i32,
                "resumed, not restarted"
            );
        }
        if e.microservice.as_ref().is_some_and(|m| m.name == "rotated") {
            break;
        }
    }
}

#[test]
fn a_command_line_that_does_not_parse_exits_64_not_a_verdict_code() {
    let code = |args: &[&str]| {
        output_within(
            Command::new(env!("CARGO_BIN_EXE_flotilla")).args(args),
            CLI_LIMIT,
        )
        .status
        .code()
    };
    for bad in [
        &["wait"][..],
        &["wait", "ns/x", "--image", "i", "--timeout", "soon"],
        &["status", "--no-such-flag"],
        &["no-such-command"],
    ] {
        assert_eq!(code(bad), Some(64), "{bad:?}");
    }
    assert_eq!(code(&["--help"]), Some(0));
    assert_eq!(code(&["wait", "--help"]), Some(0));
}
