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
