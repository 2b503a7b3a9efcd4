//! Fleet rollouts against the local fleet: a FleetMicroservice in home,
//! three `flotilla run` replicas, and three labelled members. What reached
//! each member, and when, is read from the members' audit logs.

mod support;

use std::time::Duration;

use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::rollout::*;
use support::{StoppedMember, eventually, microservice};

use flotilla::api::client::{ClientOptions, connect};
use flotilla::api::pb;
use flotilla::rollout::spec::{ClusterState, FLEET_LABEL, RolloutPhase};

/// One test stops member-3; the others must not run meanwhile.
static MEMBERS_UP: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

const CANARY: &str = "ring: canary\n";

fn canary_first(bake: &str, deadline: &str) -> serde_json::Value {
    json!({
        "waves": [{"name": "canary", "clusterSelector": {"matchLabels": {"ring": "canary"}}}],
        "bake": bake,
        "progressDeadline": deadline,
    })
}

fn revision_of(f: &flotilla::rollout::spec::FleetMicroservice) -> String {
    f.status
        .as_ref()
        .and_then(|s| s.update_revision.clone())
        .expect("an update revision")
}

#[tokio::test]
async fn placement_and_overrides_reach_exactly_the_selected_members_and_labels_are_live() {
    let _up = MEMBERS_UP.read().await;
    let fleet = rollout_fleet(
        "fms-place",
        &[
            ("member-1", "env: prod\nregion: eu\n"),
            ("member-2", "env: prod\n"),
            ("member-3", "env: dev\n"),
        ],
    )
    .await;
    let mut fms = fleet_microservice("api", "ghcr.io/acme/api:1", json!({}));
    fms["spec"]["placement"] = json!({"clusterSelector": {"matchLabels": {"env": "prod"}}});
    fms["spec"]["overrides"] = json!([{
        "clusterSelector": {"matchLabels": {"region": "eu"}},
        "replicas": 2,
        "env": [{"name": "REGION", "value": "eu"}],
    }]);
    fleet.create(fms).await;
    let f = fleet
        .wait_phase("api", RolloutPhase::Complete, Duration::from_secs(90))
        .await;
    let rev = revision_of(&f);

    let eu = fleet
        .member_api("member-1")
        .get("api")
        .await
        .expect("member-1");
    assert_eq!(eu.spec.replicas, 2, "the override applies to member-1");
    assert_eq!(eu.spec.env.len(), 1);
    assert_eq!(
        (eu.spec.env[0].name.as_str(), eu.spec.env[0].value.as_str()),
        ("REGION", "eu")
    );
    assert_eq!(
        eu.labels().get(FLEET_LABEL).map(String::as_str),
        Some("api")
    );
    let other = fleet
        .member_api("member-2")
        .get("api")
        .await
        .expect("member-2");
    assert_eq!(other.spec.replicas, 1);
    assert!(other.spec.env.is_empty());
    assert_eq!(
        other
            .annotations()
            .get(flotilla::rollout::spec::REVISION_ANNOTATION),
        Some(&rev)
    );
    assert!(
        fleet
            .member_api("member-3")
            .get_opt("api")
            .await
            .unwrap()
            .is_none(),
        "member-3 is not placed"
    );
    assert!(fleet_writes("member-3", &fleet.namespace).is_empty());

    // ListClusters shows the labels, the cluster's own name among them.
    let mut grpc = connect(&ClientOptions {
        server: fleet.replicas.grpc_url("r1"),
        ..Default::default()
    })
    .await
    .expect("connect");
    let clusters = grpc
        .list_clusters(pb::ListClustersRequest {})
        .await
        .expect("ListClusters")
        .into_inner()
        .clusters;
    let m1 = clusters
        .iter()
        .find(|c| c.name == "member-1")
        .expect("member-1");
    assert_eq!(m1.labels.get("region").map(String::as_str), Some("eu"));
    assert_eq!(
        m1.labels
            .get("platform.example.io/cluster-name")
            .map(String::as_str),
        Some("member-1")
    );

    // A label change is seen live: member-3 joins the placement.
    std::fs::write(fleet.replicas.dir.join("member-3.labels"), "env: prod\n").unwrap();
    fleet
        .done_at("member-3", "api", &rev, Duration::from_secs(60))
        .await;
    let f = fleet
        .wait_phase("api", RolloutPhase::Complete, Duration::from_secs(30))
        .await;
    assert_eq!(f.status.unwrap().available.as_deref(), Some("3/3"));
    // And leaves it: its Microservice is deleted, the others stay.
    std::fs::write(fleet.replicas.dir.join("member-3.labels"), "env: dev\n").unwrap();
    eventually(
        "member-3's Microservice deleted",
        Duration::from_secs(30),
        || async {
            fleet
                .member_api("member-3")
                .get_opt("api")
                .await
                .ok()?
                .is_none()
                .then_some(())
        },
    )
    .await;
    assert!(
        fleet
            .member_api("member-1")
            .get_opt("api")
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test]
async fn a_release_reaches_the_rest_only_after_the_canary_was_done_for_the_bake() {
    let _up = MEMBERS_UP.read().await;
    let fleet = rollout_fleet("fms-waves", &[("member-1", CANARY)]).await;
    fleet
        .create(fleet_microservice(
            "api",
            "ghcr.io/acme/api:1",
            canary_first("3s", "5m"),
        ))
        .await;
    fleet
        .wait_phase("api", RolloutPhase::Complete, Duration::from_secs(120))
        .await;
    let changed = std::time::Instant::now();
    fleet.set_image("api", "ghcr.io/acme/api:2").await;
    let f = fleet
        .wait_phase("api", RolloutPhase::Progressing, Duration::from_secs(30))
        .await;
    let rev2 = revision_of(&f);
    fleet
        .done_at("member-1", "api", &rev2, Duration::from_secs(60))
        .await;
    // Seen done no later than this (the poll runs every 200 ms).
    let canary_done = jiff::Timestamp::now();
    fleet
        .wait_phase("api", RolloutPhase::Complete, Duration::from_secs(90))
        .await;
    println!(
        "figure: template change to Complete over 3 members (canary, bake 3s): {:?}",
        changed.elapsed()
    );
    let first = |member: &str| {
        let writes: Vec<FleetWrite> = fleet_writes(member, &fleet.namespace)
            .into_iter()
            .filter(|w| w.revision.as_deref() == Some(rev2.as_str()))
            .collect();
        assert_eq!(
            writes.len(),
            1,
            "{member} is written once with {rev2}: {writes:#?}"
        );
        writes[0].received
    };
    let canary_written = first("member-1");
    for member in ["member-2", "member-3"] {
        let at = first(member);
        assert!(at > canary_written);
        let after = at.duration_since(canary_done);
        assert!(
            after.as_secs_f64() >= 3.0 - 0.3,
            "{member} got {rev2} {after:?} after the canary was seen done; the bake is 3s"
        );
    }
}

#[tokio::test]
async fn a_release_that_never_becomes_ready_is_rolled_back_on_the_canary_only() {
    let _up = MEMBERS_UP.read().await;
    let fleet = rollout_fleet("fms-rollback", &[("member-1", CANARY)]).await;
    fleet
        .create(fleet_microservice(
            "api",
            "ghcr.io/acme/api:1",
            canary_first("1s", "20s"),
        ))
        .await;
    let good = revision_of(
        &fleet
            .wait_phase("api", RolloutPhase::Complete, Duration::from_secs(120))
            .await,
    );
    fleet.set_image("api", "ghcr.io/acme/api:never-ready").await;
    let bad = revision_of(
        &fleet
            .wait_phase("api", RolloutPhase::Progressing, Duration::from_secs(30))
            .await,
    );
    let f = fleet
        .wait_phase("api", RolloutPhase::RolledBack, Duration::from_secs(60))
        .await;
    let detected = std::time::Instant::now();
    let st = f.status.clone().unwrap();
    let canary = st.clusters.iter().find(|c| c.name == "member-1").unwrap();
    assert_eq!(canary.target.as_deref(), Some(good.as_str()));
    let rolled_back = st
        .conditions
        .iter()
        .find(|c| c.type_ == "RolledBack")
        .unwrap();
    assert_eq!(rolled_back.status, "True");
    assert_eq!(rolled_back.observed_generation, f.metadata.generation);
    fleet
        .done_at("member-1", "api", &good, Duration::from_secs(60))
        .await;
    println!(
        "figure: failure detected to every cluster back on the last good revision and Available: {:?}",
        detected.elapsed()
    );
    for member in ["member-2", "member-3"] {
        let bad_writes: Vec<_> = fleet_writes(member, &fleet.namespace)
            .into_iter()
            .filter(|w| w.revision.as_deref() == Some(bad.as_str()))
            .collect();
        assert!(bad_writes.is_empty(), "{member} saw {bad}: {bad_writes:#?}");
    }
    let canary_writes: Vec<Option<String>> = fleet_writes("member-1", &fleet.namespace)
        .into_iter()
        .map(|w| w.revision)
        .collect();
    assert_eq!(
        canary_writes,
        vec![Some(good.clone()), Some(bad.clone()), Some(good.clone())],
        "created, given the bad revision once, and put back"
    );
    // A Warning Event says so.
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(fleet.home.clone(), &fleet.namespace);
    eventually(
        "a RolledBack Warning Event",
        Duration::from_secs(20),
        || async {
            events
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some("RolledBack")
                        && e.type_.as_deref() == Some("Warning")
                })
        },
    )
    .await;
    // It stays rolled back.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let f = fleet.api().get("api").await.unwrap();
    assert_eq!(f.status.unwrap().phase, Some(RolloutPhase::RolledBack));
}

#[tokio::test]
async fn a_kill_9_of_the_rollout_leader_mid_wave_loses_and_repeats_nothing() {
    let _up = MEMBERS_UP.read().await;
    let mut fleet = rollout_fleet("fms-failover", &[("member-1", CANARY)]).await;
    // Three waves; the second names its cluster by the label every cluster has.
    let mut rollout = canary_first("3s", "5m");
    rollout["waves"].as_array_mut().unwrap().push(json!({
        "name": "second",
        "clusterSelector": {"matchLabels": {"platform.example.io/cluster-name": "member-2"}},
    }));
    fleet
        .create(fleet_microservice("api", "ghcr.io/acme/api:1", rollout))
        .await;
    fleet
        .wait_phase("api", RolloutPhase::Complete, Duration::from_secs(120))
        .await;
    fleet.set_image("api", "ghcr.io/acme/api:2").await;
    let rev2 = revision_of(
        &fleet
            .wait_phase("api", RolloutPhase::Progressing, Duration::from_secs(30))
            .await,
    );
    let got = |m: &str| {
        fleet_writes(m, &fleet.namespace)
            .iter()
            .any(|w| w.revision.as_deref() == Some(rev2.as_str()))
    };
    // Wave 2 has begun, and the last wave waits behind its 3 s bake.
    eventually("wave 2 begins", Duration::from_secs(60), || async {
        got("member-2").then_some(())
    })
    .await;
    let leader = fleet.rollout_leader().await;
    fleet.replicas.kill_9(&leader);
    let killed = jiff::Timestamp::now();
    assert!(!got("member-3"), "the kill came after wave 2");
    let f = fleet
        .wait_phase("api", RolloutPhase::Complete, Duration::from_secs(120))
        .await;
    let successor = fleet.rollout_leader().await;
    assert_ne!(successor, leader);
    for member in ["member-1", "member-2", "member-3"] {
        let writes: Vec<FleetWrite> = fleet_writes(member, &fleet.namespace)
            .into_iter()
            .filter(|w| w.revision.as_deref() == Some(rev2.as_str()))
            .collect();
        assert_eq!(
            writes.len(),
            1,
            "{member}: written once with {rev2}: {writes:#?}"
        );
    }
    let last = fleet_writes("member-3", &fleet.namespace)
        .into_iter()
        .find(|w| w.revision.as_deref() == Some(rev2.as_str()))
        .unwrap();
    assert!(
        last.user_agent.ends_with(&successor),
        "the successor finished: {last:?}"
    );
    let st = f.status.unwrap();
    assert_eq!(st.waves.len(), 3);
    assert!(
        st.waves.iter().all(|w| w.finished.is_some()),
        "no wave skipped: {:?}",
        st.waves
    );
    println!(
        "figure: resume after kill -9 of the rollout leader: the successor wrote member-3 {:?} after the kill (lease duration 2 s)",
        last.received.duration_since(killed)
    );
}

#[tokio::test]
async fn a_hand_made_microservice_is_never_overwritten_and_deletion_waits_for_a_down_member() {
    let _all = MEMBERS_UP.write().await;
    let fleet = rollout_fleet("fms-cleanup", &[]).await;
    fleet
        .member_api("member-2")
        .create(
            &PostParams::default(),
            &microservice("api", "ghcr.io/team/handmade:7", 8080, Some(1)),
        )
        .await
        .expect("hand-made Microservice");
    let mut fms = fleet_microservice("api", "ghcr.io/acme/api:1", json!({"maxFailedClusters": 1}));
    fms["spec"]["placement"] = json!({});
    fleet.create(fms).await;
    let f = fleet
        .wait_phase("api", RolloutPhase::Complete, Duration::from_secs(120))
        .await;
    let st = f.status.unwrap();
    let m2 = st.clusters.iter().find(|c| c.name == "member-2").unwrap();
    assert_eq!(
        (m2.state, m2.reason.as_str()),
        (ClusterState::Failed, "OwnershipConflict")
    );
    let handmade = fleet.member_api("member-2").get("api").await.unwrap();
    assert_eq!(handmade.spec.image, "ghcr.io/team/handmade:7");
    assert!(fleet_writes("member-2", &fleet.namespace).is_empty());

    let down = StoppedMember::stop("member-3");
    fleet
        .api()
        .delete("api", &DeleteParams::default())
        .await
        .expect("delete");
    let api = fleet.api();
    let blocked = eventually("CleanupBlocked", Duration::from_secs(60), || {
        let api = api.clone();
        async move {
            let f = api.get("api").await.ok()?;
            let c = f
                .status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "CleanupBlocked" && c.status == "True")?;
            Some(c)
        }
    })
    .await;
    assert_eq!(blocked.reason, "ClusterUnreachable");
    assert!(blocked.message.contains("member-3"), "{}", blocked.message);
    eventually(
        "member-1's copy deleted",
        Duration::from_secs(30),
        || async {
            fleet
                .member_api("member-1")
                .get_opt("api")
                .await
                .ok()?
                .is_none()
                .then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        fleet.api().get_opt("api").await.unwrap().is_some(),
        "the finalizer holds"
    );

    drop(down);
    eventually(
        "the FleetMicroservice is gone",
        Duration::from_secs(90),
        || async {
            fleet
                .api()
                .get_opt("api")
                .await
                .ok()?
                .is_none()
                .then_some(())
        },
    )
    .await;
    assert!(
        fleet
            .member_api("member-3")
            .get_opt("api")
            .await
            .unwrap()
            .is_none()
    );
    let handmade = fleet.member_api("member-2").get("api").await.unwrap();
    assert_eq!(
        handmade.spec.image, "ghcr.io/team/handmade:7",
        "never touched"
    );
}
