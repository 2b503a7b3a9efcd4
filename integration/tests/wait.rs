//! `flotilla wait`, the command release tooling runs, against `flotilla run`
//! replicas over the local fleet: it outlives a rolling restart of every
//! replica, fails a rollout stuck past its progress deadline, waits for a
//! Microservice that does not exist yet, and judges each cluster against
//! its own generation.

mod support;

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use support::replicas::*;
use support::{eventually, microservice};

use flotilla::api::client::{ClientOptions, connect};
use flotilla::api::pb;
use flotilla::crd::Microservice;

/// `flotilla wait ARGS`, started now; read it with `finish`.
fn wait(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .arg("wait")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start flotilla wait")
}

/// Its exit code, stdout and stderr, within `limit`.
async fn finish(child: Child, limit: Duration) -> (i32, String, String) {
    let pid = child.id();
    let out: Output = tokio::time::timeout(
        limit,
        tokio::task::spawn_blocking(move || child.wait_with_output().expect("wait output")),
    )
    .await
    .unwrap_or_else(|_| panic!("flotilla wait (pid {pid}) still running after {limit:?}"))
    .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `flotilla wait ARGS`, run to its end within `limit`.
async fn wait_done(args: &[&str], limit: Duration) -> (i32, String, String) {
    finish(wait(args), limit).await
}

async fn serving(url: &str) {
    eventually(
        &format!("{url} answers"),
        Duration::from_secs(30),
        || async {
            let mut c = connect(&ClientOptions {
                server: url.to_string(),
                ..Default::default()
            })
            .await
            .ok()?;
            c.list_clusters(pb::ListClustersRequest {}).await.ok()
        },
    )
    .await;
}

async fn create(client: &kube::Client, ns: &str, name: &str, image: &str) {
    Api::<Microservice>::namespaced(client.clone(), ns)
        .create(
            &PostParams::default(),
            &microservice(name, image, 8080, Some(1)),
        )
        .await
        .expect("create");
}

async fn set_image(client: &kube::Client, ns: &str, name: &str, image: &str) {
    Api::<Microservice>::namespaced(client.clone(), ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"image": image}})),
        )
        .await
        .expect("patch");
}

#[tokio::test]
async fn wait_keeps_waiting_through_a_rolling_restart_of_every_replica() {
    let mut fleet = three_replica_fleet("wait-restart").await;
    let ns = fleet.namespace.clone();
    for c in fleet.clients.values() {
        create(c, &ns, "api", "ghcr.io/acme/api:1").await;
    }
    let servers: Vec<String> = REPLICA_IDS
        .iter()
        .map(|id| fleet.replicas.grpc_url(id))
        .collect();
    let servers = servers.join(",");
    let waiter = wait(&[
        &format!("{ns}/api"),
        "--image",
        "ghcr.io/acme/api:2",
        "--timeout",
        "150s",
        "--server",
        &servers,
    ]);
    // Let it connect and report the rollout in progress first.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for id in REPLICA_IDS {
        fleet.replicas.restart(id);
        serving(&fleet.replicas.grpc_url(id)).await;
    }
    for c in fleet.clients.values() {
        set_image(c, &ns, "api", "ghcr.io/acme/api:2").await;
    }
    let (code, stdout, stderr) = finish(waiter, Duration::from_secs(160)).await;
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    let gaps: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("reconnected"))
        .collect();
    assert!(
        !gaps.is_empty(),
        "the wait never lost its replica; the test proved nothing:\n{stderr}"
    );
    println!("figure: reconnects during the rolling restart: {gaps:?}");
}

#[tokio::test]
async fn a_rollout_stuck_past_its_progress_deadline_fails_the_wait() {
    let clients = member_clients().await;
    let (ns, _guards) = namespaces(&clients, "wait-stuck").await;
    let mut replicas = Replicas::new(&ns, &["member-1"]);
    replicas.extra_args = vec!["--progress-deadline".into(), "5s".into()];
    replicas.start("r1");
    let url = replicas.grpc_url("r1");
    serving(&url).await;
    let member1 = clients["member-1"].clone();
    create(&member1, &ns, "stuck", "ghcr.io/acme/api:1").await;
    let (code, stdout, stderr) = wait_done(
        &[
            &format!("{ns}/stuck"),
            "--image",
            "ghcr.io/acme/api:1",
            "--timeout",
            "60s",
            "--server",
            &url,
        ],
        Duration::from_secs(70),
    )
    .await;
    assert_eq!(code, 0, "the healthy rollout: {stdout}{stderr}");

    set_image(&member1, &ns, "stuck", "ghcr.io/acme/api:never-ready").await;
    let started = std::time::Instant::now();
    let (code, stdout, stderr) = wait_done(
        &[
            &format!("{ns}/stuck"),
            "--image",
            "ghcr.io/acme/api:never-ready",
            "--timeout",
            "120s",
            "--server",
            &url,
            "-o",
            "json",
        ],
        Duration::from_secs(130),
    )
    .await;
    assert_eq!(code, 1, "stdout:\n{stdout}\nstderr:\n{stderr}");
    let last: serde_json::Value =
        serde_json::from_str(stdout.lines().last().expect("progress")).expect("json");
    assert_eq!(last["result"], "Failed", "{last}");
    assert_eq!(last["failedClusters"], json!(["member-1"]), "{last}");
    assert!(
        last.to_string().contains("ProgressDeadlineExceeded"),
        "the reason is named: {last}"
    );
    println!(
        "figure: a stuck rollout failed the wait after {:?} (deadline 5 s)",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_wait_started_before_the_microservice_exists_waits_for_it() {
    let clients = member_clients().await;
    let (ns, _guards) = namespaces(&clients, "wait-late").await;
    let mut replicas = Replicas::new(&ns, &["member-1"]);
    replicas.start("r1");
    let url = replicas.grpc_url("r1");
    serving(&url).await;
    let waiter = wait(&[
        &format!("{ns}/late"),
        "--image",
        "ghcr.io/acme/late:1",
        "--timeout",
        "90s",
        "--server",
        &url,
    ]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    create(&clients["member-1"], &ns, "late", "ghcr.io/acme/late:1").await;
    let (code, stdout, stderr) = finish(waiter, Duration::from_secs(100)).await;
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains("waiting for"),
        "it said what it waited for: {stdout}"
    );

    // Nothing ever appears: a timeout (2), not an error (3).
    let (code, stdout, _) = wait_done(
        &[
            &format!("{ns}/never"),
            "--image",
            "x:1",
            "--timeout",
            "3s",
            "--server",
            &url,
        ],
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(code, 2, "{stdout}");
}

#[tokio::test]
async fn generation_targets_are_per_cluster_and_explicit_ones_win() {
    let clients = member_clients().await;
    let (ns, _guards) = namespaces(&clients, "wait-gen").await;
    let mut replicas = Replicas::new(&ns, &["member-1", "member-2"]);
    replicas.start("r1");
    let url = replicas.grpc_url("r1");
    serving(&url).await;
    let (m1, m2) = (clients["member-1"].clone(), clients["member-2"].clone());
    create(&m1, &ns, "gen", "ghcr.io/acme/g:1").await;
    create(&m2, &ns, "gen", "ghcr.io/acme/g:1").await;
    // member-1 moves on to generation 3; member-2 stays at 1.
    set_image(&m1, &ns, "gen", "ghcr.io/acme/g:2").await;
    set_image(&m1, &ns, "gen", "ghcr.io/acme/g:3").await;
    let mut client = connect(&ClientOptions {
        server: url.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    eventually(
        "the index has both generations",
        Duration::from_secs(30),
        || {
            let mut client = client.clone();
            let ns = ns.clone();
            async move {
                let m = client
                    .get_microservice(pb::GetMicroserviceRequest {
                        namespace: ns,
                        name: "gen".into(),
                    })
                    .await
                    .ok()?
                    .into_inner();
                let gens: Vec<i64> = m.clusters.iter().map(|c| c.generation).collect();
                (gens == [3, 1]).then_some(())
            }
        },
    )
    .await;
    let _ = &mut client;

    // Each cluster's own generation: done once both are observed.
    let (code, stdout, stderr) = wait_done(
        &[
            &format!("{ns}/gen"),
            "--generation",
            "--timeout",
            "60s",
            "--server",
            &url,
        ],
        Duration::from_secs(70),
    )
    .await;
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");

    // One number for all would wait for member-2 to reach 3: it times out.
    let (code, ..) = wait_done(
        &[
            &format!("{ns}/gen"),
            "--generation",
            "3",
            "--timeout",
            "3s",
            "--server",
            &url,
        ],
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(code, 2);

    // An explicit member-2=2 overrides: done once member-2 moves on.
    let waiter = wait(&[
        &format!("{ns}/gen"),
        "--generation",
        "--generation",
        "member-2=2",
        "--timeout",
        "60s",
        "--server",
        &url,
    ]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    set_image(&m2, &ns, "gen", "ghcr.io/acme/g:2").await;
    let (code, stdout, stderr) = finish(waiter, Duration::from_secs(70)).await;
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");

    // Bad values are usage errors, named.
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["wait", "ns/x", "--generation", "member-2=zero"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a generation"));
}

#[tokio::test]
async fn a_wait_no_replica_ever_answers_exits_3_not_a_verdict() {
    let nobody = format!("http://127.0.0.1:{}", free_port());
    let (code, _, stderr) = wait_done(
        &[
            "ns/x",
            "--image",
            "x:1",
            "--timeout",
            "2s",
            "--server",
            &nobody,
        ],
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(code, 3, "{stderr}");
    assert!(stderr.contains("no replica"), "{stderr}");
}
