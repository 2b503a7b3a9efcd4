//! Rollout safety on the local fleet (#29): a bad edit deletes nothing, a
//! planner defect fails one object and not the process, an empty canary
//! proves nothing, and a release that runs nowhere is never Complete. What
//! reached each member is read from the members' audit logs.

mod support;

use std::time::Duration;

use kube::api::{Patch, PatchParams};
use serde_json::json;
use support::eventually;
use support::replicas::REPLICA_IDS;
use support::rollout::*;

use flotilla::rollout::spec::{FleetMicroservice, RolloutPhase, WaveState};

/// The Progressing condition's (reason, message) once it is at the
/// object's current generation and has this reason.
async fn progressing(
    fleet: &RolloutFleet,
    name: &str,
    reason: &str,
    limit: Duration,
) -> (FleetMicroservice, String) {
    let api = fleet.api();
    eventually(&format!("{name} Progressing {reason}"), limit, || {
        let api = api.clone();
        async move {
            let f = api.get(name).await.ok()?;
            let st = f.status.as_ref()?;
            let c = st.conditions.iter().find(|c| c.type_ == "Progressing")?;
            (st.observed_generation == f.metadata.generation
                && c.observed_generation == f.metadata.generation
                && c.reason == reason)
                .then(|| (f.clone(), c.message.clone()))
        }
    })
    .await
}

async fn patch_spec(fleet: &RolloutFleet, name: &str, spec: serde_json::Value) {
    fleet
        .api()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": spec })),
        )
        .await
        .expect("patch FleetMicroservice");
}

fn deletes(member: &str, ns: &str) -> usize {
    fleet_writes(member, ns)
        .iter()
        .filter(|w| w.verb == "delete")
        .count()
}

#[tokio::test]
async fn a_bad_edit_deletes_nothing_and_a_planner_panic_fails_only_its_object() {
    let mut fleet =
        rollout_fleet_env("fms-safety", &[], &[], &[("FLOTILLA_PLAN_PANIC", "doomed")]).await;
    let ns = fleet.namespace.clone();
    fleet
        .create(fleet_microservice("api", "ghcr.io/acme/api:1", json!({})))
        .await;
    fleet
        .wait_phase("api", RolloutPhase::Complete, Duration::from_secs(120))
        .await;

    // A typo in an operator: the apiserver refuses it, naming the field.
    let typo = json!({"matchExpressions": [
        {"key": "ring", "operator": "Exists"},
        {"key": "tier", "operator": "in", "values": ["web"]},
    ]});
    let err = fleet
        .api()
        .patch(
            "api",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"placement": {"clusterSelector": typo}}})),
        )
        .await
        .expect_err("an unknown operator is refused");
    let text = err.to_string();
    assert!(text.contains("operator"), "{text}");

    // `In` without values behind a requirement that fails everywhere: the
    // schema lets it through, the planner does not. It used to mean "not
    // placed", and the service was deleted from every member at once.
    let arity = json!({"matchExpressions": [
        {"key": "ring", "operator": "Exists"},
        {"key": "tier", "operator": "In"},
    ]});
    patch_spec(
        &fleet,
        "api",
        json!({"placement": {"clusterSelector": arity}}),
    )
    .await;
    let (_, message) = progressing(&fleet, "api", "InvalidSpec", Duration::from_secs(30)).await;
    assert!(message.contains("In needs values"), "{message}");

    // A bake no clock can hold passes the CRD's pattern: InvalidSpec too.
    patch_spec(
        &fleet,
        "api",
        json!({
            "placement": {"clusterSelector": {"matchExpressions": null}},
            "rollout": {"bake": "999999999h"},
        }),
    )
    .await;
    let (_, message) = progressing(&fleet, "api", "InvalidSpec", Duration::from_secs(30)).await;
    assert!(message.contains("rollout.bake"), "{message}");

    // A planner that panics on one object fails that object alone.
    fleet
        .create(fleet_microservice(
            "doomed",
            "ghcr.io/acme/doomed:1",
            json!({}),
        ))
        .await;
    let (_, message) = progressing(&fleet, "doomed", "InvalidSpec", Duration::from_secs(30)).await;
    assert!(message.contains("injected planner fault"), "{message}");
    fleet
        .create(fleet_microservice(
            "after",
            "ghcr.io/acme/after:1",
            json!({}),
        ))
        .await;
    fleet
        .wait_phase("after", RolloutPhase::Complete, Duration::from_secs(120))
        .await;
    for id in REPLICA_IDS {
        assert!(
            fleet
                .replicas
                .exit_within(id, Duration::from_millis(100))
                .is_none(),
            "replica {id} exited:\n{}",
            fleet.replicas.log(id)
        );
    }

    // Nothing was deleted, and every member still runs the service.
    for member in ["member-1", "member-2", "member-3"] {
        assert_eq!(deletes(member, &ns), 0, "{member}");
        assert!(
            fleet
                .member_api(member)
                .get_opt("api")
                .await
                .unwrap()
                .is_some(),
            "{member} still has api"
        );
        assert!(
            fleet
                .member_api(member)
                .get_opt("doomed")
                .await
                .unwrap()
                .is_none(),
            "nothing written for the object whose planner failed"
        );
    }
}

#[tokio::test]
async fn an_empty_canary_holds_the_release_and_a_release_that_runs_nowhere_is_never_complete() {
    let fleet = rollout_fleet("fms-evidence", &[("member-3", "tier: edge\n")]).await;
    let ns = fleet.namespace.clone();

    // No member has ring=canary: the canary is skipped, and the rest wait.
    fleet
        .create(fleet_microservice(
            "held",
            "ghcr.io/acme/held:1",
            json!({"waves": [{"name": "canary", "clusterSelector": {"matchLabels": {"ring": "canary"}}}]}),
        ))
        .await;
    let (f, message) =
        progressing(&fleet, "held", "WaitingForCanary", Duration::from_secs(30)).await;
    assert!(message.contains("canary"), "{message}");
    let st = f.status.unwrap();
    assert_eq!(st.waves[0].state, WaveState::Skipped);
    tokio::time::sleep(Duration::from_secs(3)).await;
    for member in ["member-1", "member-2", "member-3"] {
        let held: Vec<_> = fleet_writes(member, &ns)
            .into_iter()
            .filter(|w| w.name == "held")
            .collect();
        assert!(held.is_empty(), "{member} was written: {held:?}");
    }

    // One placed member whose release never turns ready, one failure
    // tolerated: it failed everywhere it ran, so it is not Complete, and
    // `rollout wait` exits 1.
    let mut fms = fleet_microservice(
        "nowhere",
        "ghcr.io/acme/nowhere:never-ready",
        json!({"progressDeadline": "15s", "maxFailedClusters": 1}),
    );
    fms["spec"]["placement"] = json!({"clusterSelector": {"matchLabels": {"tier": "edge"}}});
    fleet.create(fms).await;
    let key = format!("{ns}/nowhere");
    let server = fleet.replicas.grpc_url("r1");
    let (code, stdout, stderr) = flotilla(
        &[
            "rollout",
            "wait",
            &key,
            "--timeout",
            "90s",
            "--server",
            &server,
        ],
        Duration::from_secs(120),
    )
    .await;
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    let f = fleet.api().get("nowhere").await.unwrap();
    let st = f.status.unwrap();
    assert_eq!(st.phase, Some(RolloutPhase::Failed), "{st:?}");
    assert_eq!(st.failed_clusters, vec!["member-3"]);
}
