//! Stopping one cluster's apiserver cuts off that cluster only. This binary
//! runs on its own (cargo runs test binaries one after another), so the
//! outage cannot disturb tests in other binaries.

mod support;

/// member-3 is stopped by two tests here; one at a time.
static MEMBER_3: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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
    use support::{Operator, TestNamespace, create_available, ensure_crd, settings};

    let _one_at_a_time = MEMBER_3.lock().await;
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
    let available = create_available(&api, "steady", "ghcr.io/acme/steady:1").await;

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

/// kubectl against member-3, failing the test if it fails.
fn k3(args: &[&str], stdin: Option<&str>) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new(support::kubectl())
        .arg("--kubeconfig")
        .arg(support::kubeconfig_path("member-3"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().expect("kubectl");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kubectl {args:?}: {text}");
    text
}

/// A replica whose status watch of a cluster fails while its Lease reads
/// still work (here: the right to read Microservices revoked, then the
/// apiserver restarted so that the watch must start again) shows that
/// cluster's entries Unknown, `StatusWatchFailing`, not its last state as
/// fresh; and recovers when the right comes back.
#[tokio::test]
async fn a_failing_status_watch_makes_the_entries_unknown_and_recovers() {
    use flotilla::api::client::{ClientOptions, connect};
    use flotilla::api::pb;
    use kube::api::PostParams;
    use support::ensure_crd;
    use support::microservice;
    use support::replicas::{Replicas, namespaces};

    let _one_at_a_time = MEMBER_3.lock().await;
    // member-3 only: the test beside this one stops member-2.
    let member_3 = client("member-3").await;
    ensure_crd(&member_3).await;
    let clients = std::collections::BTreeMap::from([("member-3", member_3)]);
    let (ns, _guards) = namespaces(&clients, "feed").await;
    // A ServiceAccount with what a replica needs, Microservices bound apart.
    let rbac = format!(
        r#"
apiVersion: v1
kind: ServiceAccount
metadata: {{name: feed, namespace: {ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: {ns}-base}}
rules:
- {{apiGroups: [coordination.k8s.io], resources: [leases], verbs: ["*"]}}
- {{apiGroups: [""], resources: [namespaces], verbs: [get, create]}}
- {{apiGroups: [""], resources: [services, events], verbs: ["*"]}}
- {{apiGroups: [events.k8s.io], resources: [events], verbs: ["*"]}}
- {{apiGroups: [apps], resources: [deployments], verbs: ["*"]}}
- {{apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [get, list, watch]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: {ns}-ms}}
rules:
- {{apiGroups: [platform.example.io], resources: [microservices, microservices/status], verbs: ["*"]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {ns}-base}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {ns}-base}}
subjects: [{{kind: ServiceAccount, name: feed, namespace: {ns}}}]
"#
    );
    let ms_binding = format!(
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {ns}-ms}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {ns}-ms}}
subjects: [{{kind: ServiceAccount, name: feed, namespace: {ns}}}]
"#
    );
    k3(&["apply", "-f", "-"], Some(&rbac));
    k3(&["apply", "-f", "-"], Some(&ms_binding));
    let token = k3(
        &["create", "token", "feed", "-n", &ns, "--duration", "1h"],
        None,
    );
    let mut replicas = Replicas::new(&ns, &["member-3"]);
    let admin: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(support::kubeconfig_path("member-3")).unwrap(),
    )
    .unwrap();
    let c = &admin["clusters"][0]["cluster"];
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "member-3", "cluster": {
            "server": c["server"], "certificate-authority-data": c["certificate-authority-data"],
        }}],
        "users": [{"name": "feed", "user": {"token": token.trim()}}],
        "contexts": [{"name": "member-3", "context": {"cluster": "member-3", "user": "feed"}}],
        "current-context": "member-3",
    });
    std::fs::write(
        replicas.dir.join("member-3.yaml"),
        serde_yaml::to_string(&kubeconfig).unwrap(),
    )
    .unwrap();
    replicas.start("r1");
    let url = replicas.grpc_url("r1");
    Api::<flotilla::crd::Microservice>::namespaced(clients["member-3"].clone(), &ns)
        .create(
            &PostParams::default(),
            &microservice("watched", "ghcr.io/acme/w:1", 8080, Some(1)),
        )
        .await
        .expect("create");
    let entry = |state: pb::EntryState, reason: Option<&'static str>| {
        let url = url.clone();
        let ns = ns.clone();
        move || {
            let url = url.clone();
            let ns = ns.clone();
            async move {
                let mut c = connect(&ClientOptions {
                    server: url,
                    ..Default::default()
                })
                .await
                .ok()?;
                let m = c
                    .get_microservice(pb::GetMicroserviceRequest {
                        namespace: ns,
                        name: "watched".into(),
                    })
                    .await
                    .ok()?
                    .into_inner();
                let e = m.clusters.first()?.clone();
                (e.state == state as i32 && reason.is_none_or(|r| e.reason == r)).then_some(e)
            }
        }
    };
    eventually(
        "the entry Done",
        Duration::from_secs(90),
        entry(pb::EntryState::Done, None),
    )
    .await;

    // No more Microservices for this replica; the watch must start again.
    k3(&["delete", "clusterrolebinding", &format!("{ns}-ms")], None);
    drop(StoppedMember::stop("member-3"));
    let back = std::time::Instant::now();
    let stale = eventually(
        "the entry Unknown (StatusWatchFailing)",
        Duration::from_secs(60),
        entry(pb::EntryState::Unknown, Some("StatusWatchFailing")),
    )
    .await;
    println!(
        "figure: entries Unknown {:?} after the apiserver came back without the right to watch",
        back.elapsed()
    );
    assert!(
        stale.message.contains("forbidden") || stale.message.contains("403"),
        "{}",
        stale.message
    );

    k3(&["apply", "-f", "-"], Some(&ms_binding));
    eventually(
        "the entry Done again",
        Duration::from_secs(60),
        entry(pb::EntryState::Done, None),
    )
    .await;
    for name in [format!("{ns}-base"), format!("{ns}-ms")] {
        k3(
            &[
                "delete",
                "clusterrolebinding,clusterrole",
                &name,
                "--ignore-not-found",
            ],
            None,
        );
    }
}
