//! The API as release tooling adopts it (#61): the Go and Python example
//! programs run the main flow (edit a FleetMicroservice, then wait for that
//! generation over gRPC, with TLS and a bearer token) against replicas of
//! the local fleet; errors decode in Python with their ErrorInfo reasons,
//! RetryInfo and BadRequest fields; and WaitForFleetRollout asked before
//! the controller has seen a generation waits for it.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use support::rollout::*;
use support::{certificates, kubeconfig_path, kubectl, output_within};

use flotilla::api::client::{ClientOptions, connect_rollouts};
use flotilla::api::pb::{self, FleetRolloutResult, wait_for_fleet_rollout_request::Target};
use flotilla::rollout::spec::RolloutPhase;

/// A tool of integration/toolchain/api-tools.sh (installed once, cached).
fn api_tool(tool: &str) -> PathBuf {
    let out = output_within(
        Command::new("integration/toolchain/api-tools.sh")
            .arg(tool)
            .current_dir(env!("CARGO_MANIFEST_DIR")),
        Duration::from_secs(1200),
    );
    assert!(
        out.status.success(),
        "api-tools.sh {tool}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// Three replicas serving TLS (a certificate for 127.0.0.1) with a read
/// token, each with room for two streams, and a FleetMicroservice `api`
/// placed on every member, Complete at its first generation.
async fn fleet_with_tls(prefix: &str) -> (RolloutFleet, PathBuf) {
    let pki = std::env::temp_dir().join(format!("{prefix}-{:08x}", rand::random::<u32>()));
    std::fs::create_dir_all(&pki).unwrap();
    certificates(&pki);
    let p = |f: &str| pki.join(f).display().to_string();
    let flags = vec![
        "--grpc-tls-cert".to_string(),
        p("server.crt"),
        "--grpc-tls-key".into(),
        p("server.key"),
        "--grpc-token-file".into(),
        p("token"),
        "--grpc-max-streams".into(),
        "2".into(),
    ];
    let fleet = rollout_fleet_prepared(prefix, &[], |r| r.grpc_args = flags).await;
    let mut fms = fleet_microservice("api", "ghcr.io/acme/api:1", json!({}));
    fms["spec"]["placement"] = json!({});
    fleet.create_complete(fms).await;
    (fleet, pki)
}

fn server(fleet: &RolloutFleet) -> String {
    format!("127.0.0.1:{}", fleet.replicas.grpc_ports["r1"])
}

/// The example's common flags: the replica, TLS, the token and the edit.
fn example_args(fleet: &RolloutFleet, pki: &Path, image: &str) -> Vec<String> {
    let s = |p: &Path| p.display().to_string();
    [
        ("server", server(fleet)),
        ("ca", s(&pki.join("ca.crt"))),
        ("token-file", s(&pki.join("token"))),
        ("kubectl", s(&kubectl())),
        ("kubeconfig", s(&kubeconfig_path("home"))),
        ("namespace", fleet.namespace.clone()),
        ("name", "api".into()),
        ("image", image.into()),
    ]
    .into_iter()
    .flat_map(|(k, v)| [format!("--{k}"), v])
    .collect()
}

/// After an example exited 0: the FleetMicroservice is Complete at the
/// generation the example's edit made, with its image, on every member.
async fn rolled_out(fleet: &RolloutFleet, stdout: &str, image: &str) {
    let applied: i64 = stdout
        .lines()
        .find_map(|l| l.split("generation ").nth(1))
        .and_then(|g| g.trim().parse().ok())
        .unwrap_or_else(|| panic!("no generation printed: {stdout}"));
    let f = fleet.api().get("api").await.unwrap();
    let st = f.status.unwrap();
    assert_eq!(st.observed_generation, Some(applied), "{stdout}");
    assert_eq!(st.phase, Some(RolloutPhase::Complete));
    assert_eq!(f.spec.template.image, image);
    for member in fleet.members.keys() {
        let ms = fleet.member_api(member).get("api").await.unwrap();
        assert_eq!(ms.spec.image, image, "{member}");
        assert!(done(&ms), "{member} not done");
    }
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("FLEET_ROLLOUT_RESULT_SUCCEEDED"),
        "{stdout}"
    );
}

#[tokio::test]
async fn the_go_and_python_examples_roll_out_over_tls_with_a_token() {
    let (fleet, pki) = fleet_with_tls("api-examples").await;

    // Go: built from examples/go against the committed stubs.
    let bin = pki.join("rollout-go");
    let built = output_within(
        Command::new("go")
            .args(["build", "-o"])
            .arg(&bin)
            .arg("./rollout")
            .env("GOFLAGS", "-mod=mod")
            .env("GOTOOLCHAIN", "local")
            .current_dir(repo("examples/go")),
        Duration::from_secs(900),
    );
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let go = output_within(
        Command::new(&bin)
            // Go's flag package takes --name as it takes -name.
            .args(example_args(&fleet, &pki, "ghcr.io/acme/api:2"))
            .args(["--timeout", "150s"]),
        Duration::from_secs(180),
    );
    let stdout = String::from_utf8_lossy(&go.stdout).to_string();
    assert!(
        go.status.success(),
        "go example: {stdout}\n{}",
        String::from_utf8_lossy(&go.stderr)
    );
    rolled_out(&fleet, &stdout, "ghcr.io/acme/api:2").await;

    // Python: grpcio from PyPI, the committed stubs on PYTHONPATH.
    let python = api_tool("python");
    let py = output_within(
        Command::new(&python)
            .arg(repo("examples/python/rollout.py"))
            .args(example_args(&fleet, &pki, "ghcr.io/acme/api:3"))
            .args(["--timeout", "150"])
            .env("PYTHONPATH", repo("clients/python")),
        Duration::from_secs(180),
    );
    let stdout = String::from_utf8_lossy(&py.stdout).to_string();
    assert!(
        py.status.success(),
        "python example: {stdout}\n{}",
        String::from_utf8_lossy(&py.stderr)
    );
    rolled_out(&fleet, &stdout, "ghcr.io/acme/api:3").await;

    // Errors, decoded by grpc_status.rpc_status.from_call.
    let out = output_within(
        Command::new(&python)
            .arg(repo("integration/api/error_details.py"))
            .arg(server(&fleet))
            .arg(pki.join("ca.crt"))
            .arg(pki.join("token"))
            .arg(&fleet.namespace)
            .env("PYTHONPATH", repo("clients/python")),
        Duration::from_secs(120),
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let calls: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let call = |name: &str| {
        calls
            .iter()
            .find(|c| c["call"] == name)
            .unwrap_or_else(|| panic!("no {name}: {text}"))
            .clone()
    };
    let c = call("unregistered-cluster");
    assert_eq!(
        (c["code"].as_str(), c["reason"].as_str()),
        (Some("INVALID_ARGUMENT"), Some("CLUSTER_NOT_REGISTERED")),
        "{c}"
    );
    assert_eq!(c["fields"], json!(["clusters"]), "{c}");
    assert_eq!(c["metadata"]["cluster"], "no-such-cluster", "{c}");
    assert_eq!(c["retry_seconds"], Value::Null, "{c}");
    assert_eq!(c["domain"], "flotilla.platform.example.io", "{c}");
    let c = call("bad-page-token");
    assert_eq!(c["reason"], "INVALID_REQUEST", "{c}");
    assert_eq!(c["fields"], json!(["page_token"]), "{c}");
    let c = call("unknown-fleet-microservice");
    assert_eq!(
        (c["code"].as_str(), c["reason"].as_str()),
        (Some("NOT_FOUND"), Some("FLEET_MICROSERVICE_NOT_FOUND")),
        "{c}"
    );
    let c = call("wrong-token");
    assert_eq!(
        (c["code"].as_str(), c["reason"].as_str()),
        (Some("UNAUTHENTICATED"), Some("UNAUTHENTICATED")),
        "{c}"
    );
    let c = call("stream-limit");
    assert_eq!(
        (c["code"].as_str(), c["reason"].as_str()),
        (Some("RESOURCE_EXHAUSTED"), Some("STREAM_LIMIT")),
        "{c}"
    );
    assert_eq!(c["retry_seconds"], json!(5.0), "{c}");
}

#[tokio::test]
async fn a_wait_asked_before_the_controller_saw_the_generation_waits_for_it() {
    let (fleet, pki) = fleet_with_tls("api-generation").await;
    let f = fleet.api().get("api").await.unwrap();
    let now = f.metadata.generation.unwrap();

    // Today's `flotilla rollout wait` judges the spec as it is now: asked
    // before the edit lands, it ends at once on the old generation.
    let options = ClientOptions {
        server: format!("https://{}", server(&fleet)),
        ca: Some(pki.join("ca.crt")),
        token: Some("let-me-in".into()),
        ..Default::default()
    };
    let key = format!("{}/api", fleet.namespace);
    let (code, _, stderr) = flotilla(
        &[
            "rollout",
            "wait",
            &key,
            "--timeout",
            "30s",
            "--server",
            &options.server,
            "--ca",
            &pki.join("ca.crt").display().to_string(),
            "--token-file",
            &pki.join("token").display().to_string(),
        ],
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(code, 0, "rollout wait ends on generation {now}: {stderr}");

    // WaitForFleetRollout for the next generation, asked before it exists.
    let mut client = connect_rollouts(&options).await.expect("connect");
    let mut stream = client
        .wait_for_fleet_rollout(pb::WaitForFleetRolloutRequest {
            namespace: fleet.namespace.clone(),
            name: "api".into(),
            target: Some(Target::Generation(now + 1)),
            timeout: Some(prost_types::Duration {
                seconds: 150,
                nanos: 0,
            }),
        })
        .await
        .expect("the wait starts")
        .into_inner();
    let first = stream.message().await.unwrap().expect("a first message");
    assert_eq!(first.result(), FleetRolloutResult::InProgress, "{first:?}");
    assert_eq!(first.target_generation, now + 1);
    assert!(
        first
            .summary
            .contains(&format!("observe generation {}", now + 1)),
        "{}",
        first.summary
    );
    let rollout = first.rollout.expect("the rollout");
    assert_eq!(rollout.rollout_phase(), pb::RolloutPhase::Complete);
    // It stays open while the old generation's Complete is all there is.
    let quiet = tokio::time::timeout(Duration::from_secs(3), stream.message()).await;
    assert!(
        quiet.is_err(),
        "the wait ended on the old generation: {quiet:?}"
    );

    fleet
        .api()
        .patch(
            "api",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"image": "ghcr.io/acme/api:2"}}})),
        )
        .await
        .unwrap();
    let mut last = None;
    let ended = tokio::time::timeout(Duration::from_secs(170), async {
        while let Some(p) = stream.message().await.expect("progress") {
            if p.result() != FleetRolloutResult::InProgress {
                return Some(p);
            }
            last = Some(p);
        }
        None
    })
    .await
    .expect("the wait ends within its timeout")
    .unwrap_or_else(|| panic!("the stream ended with no verdict after {last:?}"));
    assert_eq!(ended.result(), FleetRolloutResult::Succeeded, "{ended:?}");
    let r = ended.rollout.unwrap();
    assert!(r.observed_generation > now, "{r:?}");
    assert_eq!(r.image, "ghcr.io/acme/api:2");
    assert_eq!(r.clusters_placed, 3);
    assert_eq!((r.clusters_updated, r.clusters_available), (3, 3));
    let f = fleet.api().get("api").await.unwrap();
    assert_eq!(f.status.unwrap().phase, Some(RolloutPhase::Complete));
}
