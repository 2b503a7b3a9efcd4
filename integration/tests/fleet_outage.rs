//! One member's apiserver stops while three replicas run the fleet: the
//! other members keep reconciling at their usual pace, the stopped one is
//! reported Unreachable, and after a restart it converges with no manual
//! step. Its own binary, so that no other test runs while member-2 is down.

mod support;

use std::time::Duration;

use kube::Api;
use kube::api::PostParams;
use support::replicas::*;
use support::{
    StoppedMember, assert_one_writer_at_a_time, client, eventually, microservice, wait_all_true,
};
use tokio::time::Instant;

use flotilla::api::client::{ClientOptions, connect};
use flotilla::api::pb;
use flotilla::crd::Microservice;

/// Seconds from create to Reconciled=True, for `n` Microservices in turn.
async fn latencies(api: &Api<Microservice>, prefix: &str, n: usize) -> Vec<f64> {
    let mut out = Vec::new();
    for i in 0..n {
        let name = format!("{prefix}-{i}");
        let t = Instant::now();
        api.create(
            &PostParams::default(),
            &microservice(&name, "ghcr.io/acme/o:1", 8080, Some(1)),
        )
        .await
        .expect("create");
        eventually("reconciled", Duration::from_secs(60), || async {
            let ms = api.get(&name).await.ok()?;
            let st = ms.status?;
            (st.observed_generation == ms.metadata.generation
                && flotilla::domain::conditions::is_true(&st.conditions, "Reconciled"))
            .then_some(())
        })
        .await;
        out.push(t.elapsed().as_secs_f64());
    }
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

#[tokio::test]
async fn a_stopped_member_is_unreachable_others_keep_pace_and_it_recovers() {
    let ThreeReplicaFleet {
        clients,
        namespace: ns,
        guards: _guards,
        replicas,
        ..
    } = three_replica_fleet("fleet-outage").await;
    let api1 = Api::<Microservice>::namespaced(clients["member-1"].clone(), &ns);
    let api3 = Api::<Microservice>::namespaced(clients["member-3"].clone(), &ns);
    let mut baseline = latencies(&api1, "base1", 5).await;
    baseline.extend(latencies(&api3, "base3", 5).await);

    // A Microservice in every member, done everywhere, as the API reports it.
    for c in clients.values() {
        Api::<Microservice>::namespaced(c.clone(), &ns)
            .create(
                &PostParams::default(),
                &microservice("probe", "ghcr.io/acme/p:1", 8080, Some(1)),
            )
            .await
            .expect("create probe");
    }
    let mut grpc = connect(&ClientOptions {
        server: replicas.grpc_url("r1"),
        ..Default::default()
    })
    .await
    .expect("gRPC");
    let get = pb::GetMicroserviceRequest {
        namespace: ns.clone(),
        name: "probe".into(),
    };
    eventually("probe done in 3 clusters", Duration::from_secs(60), || {
        let (mut grpc, get) = (grpc.clone(), get.clone());
        async move {
            let m = grpc.get_microservice(get).await.ok()?.into_inner();
            m.aggregate?.all_done.then_some(())
        }
    })
    .await;

    // Started again when dropped, whatever happens below.
    let restart = StoppedMember::stop("member-2");
    let stopped_at = std::time::SystemTime::now();

    // The API turns member-2's entry Unknown, with when it was last seen;
    // the others stay Done.
    let m = eventually("member-2's entry Unknown", Duration::from_secs(20), || {
        let (mut grpc, get) = (grpc.clone(), get.clone());
        async move {
            let m = grpc.get_microservice(get).await.ok()?.into_inner();
            m.clusters
                .iter()
                .any(|e| e.cluster == "member-2" && e.state == pb::EntryState::Unknown as i32)
                .then_some(m)
        }
    })
    .await;
    for e in &m.clusters {
        if e.cluster == "member-2" {
            assert_eq!(e.reachability, pb::Reachability::Unreachable as i32);
            let seen = e.last_seen.expect("last seen");
            let seen = std::time::UNIX_EPOCH + Duration::from_secs(seen.seconds as u64);
            assert!(
                seen <= stopped_at + Duration::from_secs(1),
                "last seen after the stop"
            );
            assert!(
                seen + Duration::from_secs(30) >= stopped_at,
                "last seen long before the stop"
            );
        } else {
            assert_eq!(e.state, pb::EntryState::Done as i32, "{e:?}");
        }
    }
    let aggregate = m.aggregate.unwrap();
    assert_eq!((aggregate.done, aggregate.unknown), (2, 1));
    let listed = grpc
        .list_clusters(pb::ListClustersRequest {})
        .await
        .expect("clusters")
        .into_inner();
    let m2 = listed
        .clusters
        .iter()
        .find(|c| c.name == "member-2")
        .unwrap();
    assert_eq!(m2.reachability, pb::Reachability::Unreachable as i32);
    assert!(!m2.reason.is_empty());

    // Every replica reports member-2 Unreachable.
    eventually(
        "member-2 reported Unreachable",
        Duration::from_secs(20),
        || async {
            ["r1", "r2", "r3"]
                .iter()
                .all(|r| {
                    replicas
                        .log(r)
                        .lines()
                        .any(|l| l.contains("member-2") && l.contains("Unreachable"))
                })
                .then_some(())
        },
    )
    .await;
    let mut during = latencies(&api1, "down1", 5).await;
    during.extend(latencies(&api3, "down3", 5).await);
    let (b, d) = (median(baseline), median(during));
    eprintln!(
        "reconcile latency on member-1 and member-3: baseline median {b:.3}s, during the outage {d:.3}s"
    );
    // Isolation: the outage must not slow the others (1.5x, with room for a noisy machine).
    assert!(
        d <= 1.5 * b + 0.5,
        "baseline {b:.3}s, during outage {d:.3}s"
    );

    // After the restart, member-2 is led and reconciled again with no manual step.
    drop(restart);
    let api2 = Api::<Microservice>::namespaced(client("member-2").await, &ns);
    api2.create(
        &PostParams::default(),
        &microservice("after", "ghcr.io/acme/o:1", 8080, Some(1)),
    )
    .await
    .expect("create in member-2");
    wait_all_true(&api2, 2, "Reconciled", Duration::from_secs(60)).await;
    let lease = replicas.lease_name();
    let m2 = client("member-2").await;
    eventually("member-2 led again", Duration::from_secs(30), || async {
        holder(&m2, &lease).await
    })
    .await;
    for m in ["member-1", "member-2", "member-3"] {
        let writers = assert_one_writer_at_a_time(m, &ns);
        assert!(
            !writers.is_empty(),
            "{m}: the operator's writes are audited"
        );
    }
}
