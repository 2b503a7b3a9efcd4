//! `flotilla wait`, the command release tooling runs, against `flotilla run`
//! replicas over the local fleet: it outlives a rolling restart of every
//! replica, fails a rollout stuck past its progress deadline, waits for a
//! Microservice that does not exist yet, and judges each cluster against
//! its own generation.

mod support;

use std::collections::BTreeMap;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use futures::StreamExt;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use support::replicas::*;
use support::{eventually, microservice, output_within};

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
    let out = output_within(
        Command::new(env!("CARGO_BIN_EXE_flotilla")).args([
            "wait",
            "ns/x",
            "--generation",
            "member-2=zero",
        ]),
        Duration::from_secs(60),
    );
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

/// `flotilla wait NS/web ARGS --timeout 90s --server URL`, to its end.
async fn wait_web(ns: &str, args: &[&str], url: &str) -> (i32, String, String) {
    let key = format!("{ns}/web");
    let mut all = vec![key.as_str()];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--timeout", "90s", "--server", url]);
    wait_done(&all, Duration::from_secs(100)).await
}

/// Forwards `127.0.0.1:port` to `upstream` from now on: until this is
/// called nothing listens there, as for a member whose apiserver is down.
async fn forward(port: u16, upstream: String) -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("bind the forwarder");
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let upstream = upstream.clone();
            tokio::spawn(async move {
                if let Ok(mut server) = tokio::net::TcpStream::connect(&upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    })
}

/// The first progress a replica sends for `ns/web` and `target`.
async fn first_progress(
    url: &str,
    ns: &str,
    target: pb::wait_for_rollout_request::Target,
) -> pb::RolloutProgress {
    let mut c = connect(&ClientOptions {
        server: url.to_string(),
        ..Default::default()
    })
    .await
    .expect("connect");
    let mut stream = c
        .wait_for_rollout(pb::WaitForRolloutRequest {
            namespace: ns.to_string(),
            name: "web".into(),
            target: Some(target),
            clusters: vec![],
            timeout: Some(prost_types::Duration {
                seconds: 5,
                nanos: 0,
            }),
        })
        .await
        .expect("wait_for_rollout")
        .into_inner();
    tokio::time::timeout(Duration::from_secs(15), stream.next())
        .await
        .expect("a first progress within 15 s")
        .expect("a first progress")
        .expect("progress")
}

/// Every member holds `ns/web` at its current generation, Available, and
/// its Deployment runs `image`: what an exit 0 promised.
async fn assert_rolled_out(clients: &BTreeMap<&'static str, kube::Client>, ns: &str, image: &str) {
    for (m, c) in clients {
        let ms = Api::<Microservice>::namespaced(c.clone(), ns)
            .get("web")
            .await
            .expect("get");
        let generation = ms.metadata.generation;
        let st = ms.status.expect("status");
        assert_eq!(st.observed_generation, generation, "{m}: observed");
        let available =
            flotilla::domain::conditions::find(&st.conditions, "Available").expect("Available");
        assert_eq!(
            (available.status.as_str(), available.observed_generation),
            ("True", generation),
            "{m}: Available at the current generation"
        );
        let d = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(c.clone(), ns)
            .get("web")
            .await
            .expect("deployment");
        let running = d
            .spec
            .and_then(|s| s.template.spec?.containers.first()?.image.clone());
        assert_eq!(
            running.as_deref(),
            Some(image),
            "{m}: the Deployment's image"
        );
    }
}

#[tokio::test]
async fn a_replica_that_never_listed_a_member_does_not_call_the_rollout_done() {
    let clients = member_clients().await;
    let (ns, _guards) = namespaces(&clients, "wait-unlisted").await;
    let mut replicas = Replicas::new(&ns, &MEMBERS);
    // Replica b reaches member-2 through a port where nothing listens yet:
    // for b, member-2 is down from its start.
    let port = free_port();
    let dir_b = replicas.own_dir("b", &["member-1", "member-3"]);
    let (kc, upstream) = support::kubeconfig_via("member-2", port);
    std::fs::write(dir_b.join("member-2.yaml"), kc).expect("member-2 via the port");
    replicas.start("a");
    let url_a = replicas.grpc_url("a");
    serving(&url_a).await;
    for c in clients.values() {
        create(c, &ns, "web", "web:1").await;
    }
    let (code, stdout, stderr) = wait_web(&ns, &["--image", "web:1"], &url_a).await;
    assert_eq!(code, 0, "web:1 everywhere first: {stdout}{stderr}");
    replicas.start("b");
    let url_b = replicas.grpc_url("b");
    serving(&url_b).await;
    // member-1 and member-3 move on to web:2; member-2 stays on web:1.
    for m in ["member-1", "member-3"] {
        set_image(&clients[m], &ns, "web", "web:2").await;
    }
    for url in [&url_a, &url_b] {
        let only = [
            "--image",
            "web:2",
            "--cluster",
            "member-1",
            "--cluster",
            "member-3",
        ];
        let (code, stdout, stderr) = wait_web(&ns, &only, url).await;
        assert_eq!(
            code, 0,
            "{url} sees member-1 and member-3 done: {stdout}{stderr}"
        );
    }

    // The question release tooling asks, of either replica: not done.
    let image = pb::wait_for_rollout_request::Target::Image("web:2".into());
    let trials = 20;
    let mut disagreements = 0;
    for _ in 0..trials {
        let a = first_progress(&url_a, &ns, image.clone()).await;
        let b = first_progress(&url_b, &ns, image.clone()).await;
        assert_eq!(
            b.result,
            pb::RolloutResult::InProgress as i32,
            "the replica that never listed member-2 must not call it done: {b:?}"
        );
        let m2 = b.clusters.iter().find(|c| c.cluster == "member-2");
        assert_eq!(
            m2.map(|c| c.reason.as_str()),
            Some("NotListed"),
            "member-2 is unknown to b, and says why: {b:?}"
        );
        if a.result != b.result {
            disagreements += 1;
        }
    }
    assert_eq!(disagreements, 0, "both replicas give the same verdict");
    println!(
        "figure: verdict disagreements between replicas over {trials} trials: {disagreements}"
    );
    // The CLI, too: a timeout (2), never 0.
    let (code, stdout, stderr) = wait_done(
        &[
            &format!("{ns}/web"),
            "--image",
            "web:2",
            "--timeout",
            "4s",
            "--server",
            &url_b,
        ],
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(code, 2, "{stdout}{stderr}");

    // member-2 comes back for b, and moves on: both say done, and it is.
    let _forwarder = forward(port, upstream).await;
    set_image(&clients["member-2"], &ns, "web", "web:2").await;
    for url in [&url_a, &url_b] {
        let (code, stdout, stderr) = wait_web(&ns, &["--image", "web:2"], url).await;
        assert_eq!(code, 0, "{url}: {stdout}{stderr}");
        assert_rolled_out(&clients, &ns, "web:2").await;
    }
}

/// A member that stops answering stays "listed and answering" in the
/// replica's index for the seconds its feed takes to notice. A wait that
/// names no cluster, asked in those seconds about a Microservice created
/// there meanwhile, must not leave the member out: its live read fails,
/// and the member is Unknown until it answers.
#[tokio::test]
async fn a_member_gone_silent_is_not_left_out_before_the_replica_notices() {
    let clients = member_clients().await;
    let (ns, _guards) = namespaces(&clients, "wait-silent").await;
    let gate = support::gate::Gate::start(support::kubeconfig_via("member-3", 0).1).await;
    let mut replicas = Replicas::new(&ns, &MEMBERS);
    // One replica, with the shipped election timings (a 15 s Lease, not the
    // tests' 2 s): it notices a silent member as a deployed one does, after
    // the seconds this test is about.
    replicas.election.clear();
    let dir = replicas.own_dir("r1", &["member-1", "member-2"]);
    std::fs::write(
        dir.join("member-3.yaml"),
        support::kubeconfig_via("member-3", gate.port).0,
    )
    .expect("member-3 via the gate");
    replicas.start("r1");
    let url = replicas.grpc_url("r1");
    serving(&url).await;
    // web:1 in member-1 and member-2; member-3 listed, and without it.
    for m in ["member-1", "member-2"] {
        create(&clients[m], &ns, "web", "web:1").await;
    }
    let (code, stdout, stderr) = wait_web(&ns, &["--image", "web:1"], &url).await;
    assert_eq!(code, 0, "web:1 where it is: {stdout}{stderr}");

    // member-3 goes silent, and gets web:2 from its own admin; the others
    // move to web:2. The wait starts at once, inside the seconds before
    // the replica's feed of member-3 notices the silence.
    gate.silence();
    create(&clients["member-3"], &ns, "web", "web:2").await;
    for m in ["member-1", "member-2"] {
        set_image(&clients[m], &ns, "web", "web:2").await;
    }
    let (code, stdout, stderr) = wait_done(
        &[
            &format!("{ns}/web"),
            "--image",
            "web:2",
            "--timeout",
            "20s",
            "--server",
            &url,
        ],
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(
        code, 2,
        "member-3 holds web:2 unseen: a timeout, never done: {stdout}{stderr}"
    );
    assert!(stdout.contains("member-3"), "{stdout}{stderr}");

    // It answers again: done, and truly.
    gate.release();
    let (code, stdout, stderr) = wait_web(&ns, &["--image", "web:2"], &url).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert_rolled_out(&clients, &ns, "web:2").await;
}

#[tokio::test]
async fn apply_then_wait_with_no_pause_never_ends_on_the_previous_generation() {
    let clients = member_clients().await;
    let (ns, _guards) = namespaces(&clients, "wait-apply").await;
    let only: BTreeMap<&'static str, kube::Client> =
        BTreeMap::from([("member-1", clients["member-1"].clone())]);
    let mut replicas = Replicas::new(&ns, &["member-1"]);
    // The replica's index sees each change of member-1 two seconds late.
    replicas
        .env
        .push(("FLOTILLA_FEED_DELAY".into(), "member-1=2000".into()));
    replicas.start("r1");
    let url = replicas.grpc_url("r1");
    serving(&url).await;
    let m1 = clients["member-1"].clone();
    create(&m1, &ns, "web", "web:1").await;
    let (code, stdout, stderr) = wait_web(&ns, &["--image", "web:1"], &url).await;
    assert_eq!(code, 0, "{stdout}{stderr}");

    // Apply, then wait for "the current generation", with no pause.
    set_image(&m1, &ns, "web", "web:2").await;
    let (code, stdout, stderr) = wait_web(&ns, &["--generation"], &url).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert_rolled_out(&only, &ns, "web:2").await;

    // A rollback to an image an older generation carried: that generation's
    // "done" must not answer for the new one.
    set_image(&m1, &ns, "web", "web:3").await;
    set_image(&m1, &ns, "web", "web:1").await;
    let (code, stdout, stderr) = wait_web(&ns, &["--image", "web:1"], &url).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert_rolled_out(&only, &ns, "web:1").await;

    // What reading "current" from the member costs: the time to the first
    // answer, with the read (current) and without (a given number).
    let mut with_read = Vec::new();
    let mut without = Vec::new();
    for _ in 0..20 {
        let t = std::time::Instant::now();
        first_progress(
            &url,
            &ns,
            pb::wait_for_rollout_request::Target::Generations(pb::GenerationTargets {
                at_least: Default::default(),
                otherwise: 1,
                current: true,
            }),
        )
        .await;
        with_read.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = std::time::Instant::now();
        first_progress(
            &url,
            &ns,
            pb::wait_for_rollout_request::Target::Generation(1),
        )
        .await;
        without.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let p = |v: &[f64], q| support::percentile(v, q);
    println!(
        "figure: first answer of a wait, with the live read p50 {:.1} ms p99 {:.1} ms; without p50 {:.1} ms p99 {:.1} ms",
        p(&with_read, 0.5),
        p(&with_read, 0.99),
        p(&without, 0.5),
        p(&without, 0.99)
    );
}

#[tokio::test]
async fn an_unregistered_cluster_is_a_usage_error_that_names_the_known_ones() {
    let clients = member_clients().await;
    let (ns, _guards) = namespaces(&clients, "wait-typo").await;
    let mut replicas = Replicas::new(&ns, &["member-1", "member-2"]);
    replicas.start("r1");
    let url = replicas.grpc_url("r1");
    serving(&url).await;
    for args in [
        vec!["--generation", "--generation", "memebr-2=5"],
        vec!["--image", "x:1", "--cluster", "memebr-2"],
    ] {
        let mut all = vec![format!("{ns}/web")];
        all.extend(args.iter().map(|s| s.to_string()));
        all.extend([
            "--timeout".into(),
            "20s".into(),
            "--server".into(),
            url.clone(),
        ]);
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let (code, stdout, stderr) = wait_done(&all, Duration::from_secs(30)).await;
        assert_eq!(code, 64, "{args:?}: {stdout}{stderr}");
        assert!(
            stderr.contains("memebr-2") && stderr.contains("member-1, member-2"),
            "names the typo and the registered clusters: {stderr}"
        );
    }
}

#[tokio::test]
async fn a_replica_restarted_mid_rollout_answers_done_only_when_every_member_is() {
    let clients = member_clients().await;
    let (ns, _guards) = namespaces(&clients, "wait-midway").await;
    let mut replicas = Replicas::new(&ns, &MEMBERS);
    // Each replica lists member-2 (and sees its changes) 5 s late: a slow
    // member, as a restarted replica meets it.
    replicas
        .env
        .push(("FLOTILLA_FEED_DELAY".into(), "member-2=5000".into()));
    replicas.start("a");
    let url = replicas.grpc_url("a");
    serving(&url).await;
    for c in clients.values() {
        create(c, &ns, "web", "web:1").await;
    }
    let (code, stdout, stderr) = wait_web(&ns, &["--image", "web:1"], &url).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    // member-1 and member-3 roll out web:2; member-2 is slow to get it.
    for m in ["member-1", "member-3"] {
        set_image(&clients[m], &ns, "web", "web:2").await;
    }
    let waiter = wait(&[
        &format!("{ns}/web"),
        "--image",
        "web:2",
        "--timeout",
        "120s",
        "--server",
        &url,
    ]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The answering replica restarts; the wait reconnects to it while it
    // has listed member-1 and member-3 but not yet member-2.
    replicas.restart("a");
    tokio::time::sleep(Duration::from_secs(8)).await;
    set_image(&clients["member-2"], &ns, "web", "web:2").await;
    let (code, stdout, stderr) = finish(waiter, Duration::from_secs(130)).await;
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    // At the moment it said done, every member was.
    assert_rolled_out(&clients, &ns, "web:2").await;
    assert!(
        stderr.contains("reconnected"),
        "the wait never lost its replica; the test proved nothing:\n{stdout}{stderr}"
    );
}

/// A gRPC client of `url`, and the request for `web` in `ns`.
async fn asking_for_web(
    url: &str,
    ns: &str,
) -> (flotilla::api::client::Client, pb::GetMicroserviceRequest) {
    let grpc = connect(&ClientOptions {
        server: url.to_string(),
        ..Default::default()
    })
    .await
    .expect("gRPC");
    let get = pb::GetMicroserviceRequest {
        namespace: ns.to_string(),
        name: "web".into(),
    };
    (grpc, get)
}

/// One replica serving `web:1` on member-1 of `ns`, whose status watch of
/// member-1 stays connected and delivers no change (a stuck watch cache)
/// while the returned file exists.
async fn web_rolled_out_behind_a_stallable_feed(
    m1: &kube::Client,
    ns: &str,
) -> (Replicas, String, std::path::PathBuf) {
    let mut replicas = Replicas::new(ns, &["member-1"]);
    let switch = std::env::temp_dir().join(format!("flotilla-stall-{ns}"));
    let _ = std::fs::remove_file(&switch);
    replicas.env.push((
        "FLOTILLA_FEED_STALL".into(),
        format!("member-1={}", switch.display()),
    ));
    replicas.start("r1");
    let url = replicas.grpc_url("r1");
    serving(&url).await;
    create(m1, ns, "web", "web:1").await;
    let (code, stdout, stderr) = wait_web(ns, &["--image", "web:1"], &url).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    (replicas, url, switch)
}

/// A stalled watch that missed the deletion of the namespace's last
/// Microservice: the probe's list is then empty (`"items": null` from the
/// apiserver), which it once failed to read, so the deleted object was
/// shown Done for as long as the stall lasted.
#[tokio::test]
async fn a_stalled_watch_that_missed_the_last_deletion_stops_showing_the_object() {
    let clients = member_clients().await;
    let (ns, _guards) = namespaces(&clients, "wait-stall-gone").await;
    let m1 = clients["member-1"].clone();
    let (_replicas, url, switch) = web_rolled_out_behind_a_stallable_feed(&m1, &ns).await;

    std::fs::write(&switch, b"").expect("stall the watch");
    Api::<Microservice>::namespaced(m1.clone(), &ns)
        .delete("web", &Default::default())
        .await
        .expect("delete");
    eventually("web gone from member-1", Duration::from_secs(120), || {
        let api = Api::<Microservice>::namespaced(m1.clone(), &ns);
        async move { api.get_opt("web").await.ok()?.is_none().then_some(()) }
    })
    .await;
    let gone = std::time::Instant::now();
    let (grpc, get) = asking_for_web(&url, &ns).await;
    // Shown Unknown, or not at all: never Done for an object that is gone.
    eventually(
        "member-1 no longer shows web",
        Duration::from_secs(20),
        || {
            let (mut grpc, get) = (grpc.clone(), get.clone());
            async move {
                match grpc.get_microservice(get).await {
                    Err(s) if s.code() == tonic::Code::NotFound => Some(()),
                    Err(_) => None,
                    Ok(m) => {
                        let shown = m
                            .into_inner()
                            .clusters
                            .into_iter()
                            .find(|e| e.cluster == "member-1");
                        shown
                            .is_none_or(|e| e.state == pb::EntryState::Unknown as i32)
                            .then_some(())
                    }
                }
            }
        },
    )
    .await;
    println!(
        "figure: a deletion hidden by a stalled watch stopped showing {:.1} s after it",
        gone.elapsed().as_secs_f64()
    );
    std::fs::remove_file(&switch).expect("unstall the watch");
}

#[tokio::test]
async fn a_status_watch_that_stalls_without_an_error_turns_its_entries_unknown() {
    let clients = member_clients().await;
    let (ns, _guards) = namespaces(&clients, "wait-stall").await;
    let m1 = clients["member-1"].clone();
    let (replicas, url, switch) = web_rolled_out_behind_a_stallable_feed(&m1, &ns).await;

    std::fs::write(&switch, b"").expect("stall the watch");
    set_image(&m1, &ns, "web", "web:2").await;
    let changed = std::time::Instant::now();
    let (grpc, get) = asking_for_web(&url, &ns).await;
    // The entry still shows web:1 Done: the watch said nothing. Within 20 s
    // it is Unknown, with the reason.
    let entry = eventually("member-1 Unknown", Duration::from_secs(20), || {
        let (mut grpc, get) = (grpc.clone(), get.clone());
        async move {
            let m = grpc.get_microservice(get).await.ok()?.into_inner();
            m.clusters.into_iter().find(|e| {
                e.cluster == "member-1"
                    && e.state == pb::EntryState::Unknown as i32
                    && e.reason == "StatusWatchFailing"
            })
        }
    })
    .await;
    println!(
        "figure: a silent stall shown Unknown {:.1} s after the change it hid",
        changed.elapsed().as_secs_f64()
    );
    assert!(entry.message.contains("stalled"), "{entry:?}");
    let (_, metrics) = support::http_get(&format!("{}/metrics", replicas.metrics_url("r1")))
        .await
        .expect("metrics");
    assert!(
        metrics.lines().any(|l| l.starts_with(
            r#"flotilla_watch_errors_total{cluster="member-1",resource="status-feed"}"#
        ) && !l.ends_with(" 0")),
        "the stall is counted:\n{metrics}"
    );

    // The stall restarts the watch; once it delivers again, the entry is
    // back, at the new generation.
    std::fs::remove_file(&switch).expect("unstall the watch");
    let (code, stdout, stderr) = wait_web(&ns, &["--image", "web:2"], &url).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert_rolled_out(&BTreeMap::from([("member-1", m1)]), &ns, "web:2").await;
}
