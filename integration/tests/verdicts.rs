//! Verdicts that cannot be bypassed (#59), on the local fleet with
//! deploy/home's approval policy applied to home (`integration/fleet up`):
//! a Manual wave opens only by the approve verb, and a cluster that comes
//! into it already holding the release opens nothing. What reached each
//! member is read from the members' audit logs.

mod support;

use std::time::Duration;

use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use support::authz::{client_as, grant, service_account, token, until_rbac_says};
use support::eventually;
use support::replicas::{REPLICA_IDS, STEADY_ELECTION};
use support::rollout::*;

use flotilla::api::client::ClientOptions;
use flotilla::api::pb;
use flotilla::rollout::spec::{FleetMicroservice, RolloutPhase, WaveState};

const ANNOTATION: &str = "platform.example.io/approvals";

/// The canary wave (ring=canary, member-1), then `prod` (ring=prod,
/// member-2 and member-3), which waits for approval.
fn gated() -> serde_json::Value {
    json!({
        "waves": [
            {"name": "canary", "clusterSelector": {"matchLabels": {"ring": "canary"}}},
            {"name": "prod", "clusterSelector": {"matchLabels": {"ring": "prod"}}, "approval": "Manual"},
        ],
        "bake": "1s",
        "progressDeadline": "5m",
    })
}

const LABELS: [(&str, &str); 3] = [
    ("member-1", "ring: canary\n"),
    ("member-2", "ring: prod\n"),
    ("member-3", "ring: prod\n"),
];

/// The object once `prod` awaits approval at its current generation.
async fn awaiting(fleet: &RolloutFleet) -> FleetMicroservice {
    let api = fleet.api();
    eventually("wave prod awaits approval", Duration::from_secs(90), || {
        let api = api.clone();
        async move {
            let f = api.get("api").await.ok()?;
            let st = f.status.as_ref()?;
            let prod = st.waves.iter().find(|w| w.name == "prod")?;
            (st.observed_generation == f.metadata.generation
                && prod.state == WaveState::AwaitingApproval)
                .then_some(f)
        }
    })
    .await
}

fn prod_state(f: &FleetMicroservice) -> WaveState {
    let st = f.status.as_ref().expect("status");
    st.waves.iter().find(|w| w.name == "prod").unwrap().state
}

/// Holds for `secs` seconds: prod still awaits approval, and neither
/// prod cluster got `revision`.
async fn still_held(fleet: &RolloutFleet, revision: &str, secs: u64, why: &str) {
    for _ in 0..secs {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let f = fleet.api().get("api").await.expect("get");
        assert_eq!(prod_state(&f), WaveState::AwaitingApproval, "{why}");
        for m in ["member-2", "member-3"] {
            assert_eq!(
                writes_of(m, &fleet.namespace, revision),
                0,
                "{why}: {m} got {revision}"
            );
        }
    }
}

fn approval_json(wave: &str, revision: &str, attempt: i64, by: &str) -> String {
    json!([{
        "wave": wave, "revision": revision, "attempt": attempt, "by": by,
        "at": "2026-12-07T00:00:00Z",
    }])
    .to_string()
}

/// An identity that may get, patch and update FleetMicroservices (and
/// their status), but not approve, cannot open a Manual wave by writing
/// the approval itself, under any name; the approve verb over gRPC still
/// opens it (the replica runs with the test bed's admin kubeconfig). One
/// that holds `approve` may annotate, in its own name only.
#[tokio::test]
async fn only_the_approve_verb_opens_a_manual_wave() {
    let dir = std::env::temp_dir().join(format!("verdicts-{:08x}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir).unwrap();
    let write_file = dir.join("write");
    std::fs::write(&write_file, "writer-token\n").unwrap();
    let flags = vec![
        "--grpc-write-token-file".to_string(),
        write_file.display().to_string(),
    ];
    let fleet = rollout_fleet_with("verdict-approve", &LABELS, &flags).await;
    let ns = fleet.namespace.clone();
    fleet
        .create(fleet_microservice("api", "ghcr.io/acme/api:1", gated()))
        .await;
    let f = awaiting(&fleet).await;
    let st = f.status.clone().unwrap();
    let (rev, number) = (
        st.update_revision.clone().unwrap(),
        st.update_revision_number.unwrap(),
    );

    // A CI identity: it ships images (patch), and may write the status.
    service_account(&fleet.home, &ns, "ci").await;
    let ci_rules = json!([
        {"apiGroups": ["platform.example.io"], "resources": ["fleetmicroservices"],
         "verbs": ["get", "list", "patch", "update"]},
        {"apiGroups": ["platform.example.io"], "resources": ["fleetmicroservices/status"],
         "verbs": ["get", "patch", "update"]},
    ]);
    grant(&fleet.home, &ns, "ci", ci_rules, (&ns, "ci")).await;
    until_rbac_says(
        &fleet.home,
        (&ns, "ci"),
        "patch",
        "fleetmicroservices",
        &ns,
        true,
    )
    .await;
    let ci = client_as("home", &token(&fleet.home, &ns, "ci").await).await;
    let as_ci = Api::<FleetMicroservice>::namespaced(ci.clone(), &ns);
    let ci_name = format!("system:serviceaccount:{ns}:ci");

    // Its patches of the spec go through: the right it was given.
    as_ci
        .patch(
            "api",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}})),
        )
        .await
        .expect("ci may patch the object");
    // The approval, in a name it claims and in its own: refused.
    for by in ["release-manager", ci_name.as_str()] {
        let patch = json!({"metadata": {"annotations": {ANNOTATION: approval_json("prod", &rev, number, by)}}});
        let e = as_ci
            .patch("api", &PatchParams::default(), &Patch::Merge(patch))
            .await
            .expect_err("an approval by an identity without approve");
        let kube::Error::Api(s) = e else {
            panic!("{e}")
        };
        assert_eq!(s.code, 403, "{s:?}");
        assert!(s.message.contains("approve verb"), "{}", s.message);
    }
    // An update of the whole object, the annotation in it: refused too.
    let mut whole = as_ci.get("api").await.unwrap();
    whole.metadata.managed_fields = None;
    whole.metadata.annotations.get_or_insert_default().insert(
        ANNOTATION.into(),
        approval_json("prod", &rev, number, &ci_name),
    );
    let e = as_ci
        .replace("api", &Default::default(), &whole)
        .await
        .expect_err("an update carrying an approval");
    assert!(e.to_string().contains("approve verb"), "{e}");
    // The status records the approval a wave used: Flotilla's alone.
    let forged = json!({"status": {"waves": [
        {"name": "canary", "clusters": ["member-1"], "state": "Done"},
        {"name": "prod", "clusters": ["member-2", "member-3"], "state": "AwaitingApproval",
         "approval": {"wave": "prod", "revision": rev, "attempt": number,
                      "by": "release-manager", "at": "2026-12-07T00:00:00Z"}},
    ]}});
    let e = as_ci
        .patch_status("api", &PatchParams::default(), &Patch::Merge(forged))
        .await
        .expect_err("a status written by ci");
    assert!(e.to_string().contains("attest"), "{e}");
    still_held(&fleet, &rev, 10, "ci wrote approvals").await;

    // Given approve, it may annotate, in its own name only.
    let approver = json!([{"apiGroups": ["platform.example.io"],
        "resources": ["fleetmicroservices"], "verbs": ["approve"]}]);
    grant(&fleet.home, &ns, "ci-approve", approver, (&ns, "ci")).await;
    until_rbac_says(
        &fleet.home,
        (&ns, "ci"),
        "approve",
        "fleetmicroservices",
        &ns,
        true,
    )
    .await;
    let claimed = json!({"metadata": {"annotations": {ANNOTATION: approval_json("prod", &rev, number, "release-manager")}}});
    let e = as_ci
        .patch("api", &PatchParams::default(), &Patch::Merge(claimed))
        .await
        .expect_err("an approval in a name it claims");
    assert!(e.to_string().contains("must name its writer"), "{e}");
    still_held(&fleet, &rev, 3, "a claimed name").await;

    // The approve verb over gRPC (the write token) opens it; `by` is the caller.
    let mut grpc = flotilla::api::client::connect_rollouts(&ClientOptions {
        server: fleet.replicas.grpc_url("r1"),
        token: Some("writer-token".into()),
        ..Default::default()
    })
    .await
    .expect("connect");
    let r = grpc
        .approve_wave(pb::ApproveWaveRequest {
            namespace: ns.clone(),
            name: "api".into(),
            wave: "prod".into(),
            revision: String::new(),
        })
        .await
        .expect("ApproveWave")
        .into_inner();
    let prod = r.waves.iter().find(|w| w.name == "prod").unwrap();
    let shown = prod.approval.as_ref().expect("the approval");
    assert_eq!((shown.by.as_str(), shown.attempt), ("write-token", number));
    let f = fleet
        .wait_phase("api", RolloutPhase::Complete, Duration::from_secs(90))
        .await;
    let used = f.status.unwrap().waves[1].approval.clone().unwrap();
    assert_eq!(
        (used.by.as_str(), used.attempt),
        ("write-token", Some(number))
    );
    for m in ["member-2", "member-3"] {
        assert_eq!(writes_of(m, &ns, &rev), 1, "{m} written once");
    }
    // Holding approve, ci still cannot rewrite write-token's approval (for
    // another wave, under the same name): others' approvals stay as written.
    let f = as_ci.get("api").await.unwrap();
    let kept = f.metadata.annotations.unwrap()[ANNOTATION].clone();
    let moved = kept.replacen("\"wave\":\"prod\"", "\"wave\":\"canary\"", 1);
    assert_ne!(moved, kept);
    let e = as_ci
        .patch(
            "api",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {ANNOTATION: moved}}})),
        )
        .await
        .expect_err("write-token's approval rewritten by ci");
    assert!(e.to_string().contains("must name its writer"), "{e}");
    // Its own, added beside the others kept as written: admitted.
    let mine: serde_json::Value =
        serde_json::from_str(&approval_json("canary", &rev, number, &ci_name)).unwrap();
    let raw = format!("{},{}]", kept.trim_end_matches(']'), mine[0]);
    as_ci
        .patch(
            "api",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {ANNOTATION: raw}}})),
        )
        .await
        .expect("ci adds its own approval, the others kept");
    std::fs::remove_dir_all(&dir).ok();
}

/// Review H1 of #59: the canary passes and prod awaits approval; then
/// member-1's labels file says `ring: prod`. It is in prod now, holding
/// the release: that opens nothing.
#[tokio::test]
async fn a_canary_relabelled_into_a_manual_wave_opens_nothing() {
    let fleet = rollout_fleet("verdict-relabel", &LABELS).await;
    let ns = fleet.namespace.clone();
    fleet
        .create(fleet_microservice("api", "ghcr.io/acme/api:1", gated()))
        .await;
    let f = awaiting(&fleet).await;
    let rev = f.status.unwrap().update_revision.unwrap();
    assert_eq!(writes_of("member-1", &ns, &rev), 1, "the canary went");
    std::fs::write(fleet.replicas.dir.join("member-1.labels"), "ring: prod\n").unwrap();
    eventually("member-1 in prod", Duration::from_secs(30), || async {
        let f = fleet.api().get("api").await.ok()?;
        let st = f.status?;
        let prod = st.waves.iter().find(|w| w.name == "prod")?;
        prod.clusters.iter().any(|c| c == "member-1").then_some(())
    })
    .await;
    still_held(&fleet, &rev, 15, "member-1 moved into prod").await;
    let f = fleet.api().get("api").await.unwrap();
    let prod = f
        .status
        .unwrap()
        .waves
        .into_iter()
        .find(|w| w.name == "prod")
        .unwrap();
    assert_eq!(prod.started, None, "{prod:?}");
}

/// #59: a webhook outside `--egress-allow` (the test bed allows 127.0.0.1;
/// this listener is on 127.0.0.2) is an InvalidSpec that says why, and is
/// never called: its listener counts no connection.
#[tokio::test]
async fn a_webhook_outside_the_egress_allow_list_is_invalid_and_never_called() {
    let listener = tokio::net::TcpListener::bind("127.0.0.2:0")
        .await
        .expect("bind 127.0.0.2");
    let port = listener.local_addr().unwrap().port();
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = count.clone();
    let accept = tokio::spawn(async move {
        while let Ok((_conn, _)) = listener.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    let fleet = rollout_fleet("verdict-egress", &LABELS[..1]).await;
    let mut rollout = gated();
    rollout["analysis"] = json!([{
        "name": "errors",
        "webhook": {"url": format!("http://127.0.0.2:{port}/check")},
        "interval": "1s",
    }]);
    fleet
        .create(fleet_microservice("api", "ghcr.io/acme/api:1", rollout))
        .await;
    let api = fleet.api();
    let message = eventually("Progressing InvalidSpec", Duration::from_secs(60), || {
        let api = api.clone();
        async move {
            let f = api.get("api").await.ok()?;
            let st = f.status?;
            let c = st.conditions.iter().find(|c| c.type_ == "Progressing")?;
            (c.reason == "InvalidSpec").then(|| c.message.clone())
        }
    })
    .await;
    assert!(
        message.contains("rollout.analysis[errors].webhook.url")
            && message.contains("not an allowed destination"),
        "{message}"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        count.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the webhook was called"
    );
    for m in ["member-1", "member-2", "member-3"] {
        assert!(
            fleet_writes(m, &fleet.namespace).is_empty(),
            "{m} written on an invalid spec"
        );
    }
    accept.abort();
}

/// #59 item 4: a term begins with a read, not a memory. Leader A rolls a
/// failed release back on the canary and is killed at once; the other
/// replicas' caches of FleetMicroservices and ControllerRevisions lag the
/// apiserver by 9 s (test hook), so the successor's caches still show the
/// release in flight, not yet failed. It plans from a quorum read until
/// its caches catch up: the canary's audit log shows the failed revision
/// written once, by A, and never again.
#[tokio::test]
async fn a_successor_with_lagging_caches_does_not_apply_a_rolled_back_revision_again() {
    let mut fleet = rollout_fleet_prepared("verdict-lag", &LABELS[..1], |r| {
        r.election = STEADY_ELECTION.iter().map(|a| a.to_string()).collect();
    })
    .await;
    let ns = fleet.namespace.clone();
    let rollout = json!({
        "waves": [{"name": "canary", "clusterSelector": {"matchLabels": {"ring": "canary"}}}],
        "bake": "1s",
        "progressDeadline": "5m",
    });
    fleet
        .create(fleet_microservice("api", "ghcr.io/acme/api:1", rollout))
        .await;
    let good = fleet
        .wait_phase("api", RolloutPhase::Complete, Duration::from_secs(120))
        .await
        .status
        .unwrap()
        .update_revision
        .unwrap();
    let leader = fleet.rollout_leader().await;
    fleet
        .replicas
        .env
        .push(("FLOTILLA_ROLLOUT_CACHE_DELAY".into(), "9000".into()));
    for id in REPLICA_IDS.iter().filter(|id| **id != leader) {
        fleet.replicas.kill_9(id);
        fleet.replicas.start(id);
    }
    // Their caches are listed (9 s late) before the release begins.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(fleet.rollout_leader().await, leader, "A still leads");
    fleet
        .set_image_and_deadline("api", "ghcr.io/acme/api:never-ready", "10s")
        .await;
    let f = fleet
        .wait_phase("api", RolloutPhase::RolledBack, Duration::from_secs(90))
        .await;
    fleet.replicas.kill_9(&leader);
    let bad = f.status.unwrap().update_revision.unwrap();
    assert_ne!(bad, good);
    let (home, lease) = (
        fleet.home.clone(),
        format!("{}-rollouts", fleet.replicas.lease_name()),
    );
    let successor = eventually("a successor leads", Duration::from_secs(30), || {
        let (home, lease, ns, leader) = (home.clone(), lease.clone(), ns.clone(), leader.clone());
        async move {
            support::replicas::holder_in(&home, &ns, &lease)
                .await
                .filter(|h| *h != leader)
        }
    })
    .await;
    // Its caches lag 9 s: past that and a few rounds more.
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(
        writes_of("member-1", &ns, &bad),
        1,
        "{successor} applied the rolled-back {bad} again"
    );
    let f = fleet.api().get("api").await.unwrap();
    let st = f.status.unwrap();
    assert_eq!(st.phase, Some(RolloutPhase::RolledBack), "{st:?}");
    let canary = st.clusters.iter().find(|c| c.name == "member-1").unwrap();
    assert_eq!(canary.target.as_deref(), Some(good.as_str()));
}
