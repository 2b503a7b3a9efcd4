//! Stopping one cluster's apiserver cuts off that cluster only. This binary
//! runs on its own (cargo runs test binaries one after another), so the
//! outage cannot disturb tests in other binaries.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use support::{StoppedMember, client, eventually};

#[tokio::test]
async fn stopped_member_fails_while_others_answer_then_recovers() {
    let member_1 = client("member-1").await;
    let member_2 = client("member-2").await;

    // Started again when dropped, whatever happens below.
    let restart = StoppedMember::stop("member-2");

    let err = Api::<Namespace>::all(member_2.clone())
        .get("default")
        .await
        .expect_err("a stopped apiserver cannot answer");
    assert!(
        !matches!(err, kube::Error::Api(_)),
        "expected a connection error, got an API answer: {err:?}"
    );
    Api::<Namespace>::all(member_1.clone())
        .get("default")
        .await
        .expect("member-1 keeps answering while member-2 is down");

    drop(restart);
    eventually("member-2 answers again", Duration::from_secs(30), || {
        let c = member_2.clone();
        async move { Api::<Namespace>::all(c).get("default").await.ok() }
    })
    .await;
}

/// A 5-second apiserver blip is no news: the controller's watches recover
/// and Available stands, with its transition time, across it. Uses
/// member-3, so that it runs beside the test above.
#[tokio::test]
async fn available_and_its_transition_time_stand_across_an_apiserver_blip() {
    use std::sync::{Arc, Mutex};

    use flotilla::crd::Microservice;
    use flotilla::domain::conditions::find;
    use flotilla::reconciler::Hooks;
    use kube::api::PostParams;
    use support::{Operator, TestNamespace, ensure_crd, microservice, settings, wait_condition};

    let member_3 = client("member-3").await;
    ensure_crd(&member_3).await;
    let ns = TestNamespace::create(&member_3, "member-3", "blip").await;
    let reconciled = Arc::new(Mutex::new(Vec::new()));
    let log = reconciled.clone();
    let hooks = Hooks {
        on_reconciled: Some(Arc::new(move |r| {
            log.lock()
                .unwrap()
                .push((std::time::Instant::now(), r.outcome));
        })),
        ..Default::default()
    };
    let op = Operator::start(&member_3, settings("member-3", &ns.name), hooks);
    let api = ns.api::<Microservice>();
    api.create(
        &PostParams::default(),
        &microservice("steady", "ghcr.io/acme/steady:1", 8080, Some(1)),
    )
    .await
    .expect("create");
    let before = wait_condition(&api, "steady", "Available", "True", None).await;
    let available = find(&before.status.unwrap().conditions, "Available")
        .unwrap()
        .clone();

    let restart = StoppedMember::stop("member-3");
    tokio::time::sleep(Duration::from_secs(5)).await;
    drop(restart);
    let back = std::time::Instant::now();
    eventually("member-3 answers again", Duration::from_secs(30), || {
        let c = member_3.clone();
        async move { Api::<Namespace>::all(c).get("default").await.ok() }
    })
    .await;
    // Make the controller look again: a label on the Deployment wakes it
    // through the Deployment watch, which has had to reconnect. (Not an
    // annotation: a Deployment's generation counts those.)
    Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(member_3.clone(), &ns.name)
        .patch(
            "steady",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                serde_json::json!({"metadata": {"labels": {"poke": "after-blip"}}}),
            ),
        )
        .await
        .expect("poke");
    let seen = reconciled.clone();
    let waited = tokio::time::timeout(
        Duration::from_secs(45),
        eventually(
            "a reconcile after the blip",
            Duration::from_secs(120),
            || {
                let done = reconciled
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|(t, outcome)| *t > back && matches!(*outcome, "InSync" | "Applied"));
                async move { done.then_some(()) }
            },
        ),
    )
    .await;
    let outcomes: Vec<(u128, &str)> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(t, o)| (t.saturating_duration_since(back).as_millis(), *o))
        .collect();
    assert!(waited.is_ok(), "no reconcile after the blip: {outcomes:?}");
    let first = seen
        .lock()
        .unwrap()
        .iter()
        .find(|(t, _)| *t > back)
        .map(|(t, _)| t.duration_since(back));
    println!("figure: first reconcile {first:?} after the apiserver answered again");
    let after = api.get("steady").await.expect("get");
    let now = find(&after.status.unwrap().conditions, "Available")
        .unwrap()
        .clone();
    let deployment =
        Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(member_3.clone(), &ns.name)
            .get("steady")
            .await
            .expect("deployment");
    assert_eq!(
        now, available,
        "the blip moved Available; the Deployment: generation {:?}, {:?}",
        deployment.metadata.generation, deployment.status
    );
    op.stop().await;
}
