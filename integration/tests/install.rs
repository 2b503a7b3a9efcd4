//! The install a platform team follows, word for word: every `sh` block of
//! docs/install.md, then the uninstall blocks of docs/lifecycle.md, run by
//! bash against the local fleet with only the settings block replaced.
//! - The operator runs as Pods on the home cluster's real node, from the
//!   image `make image` builds, through an overlay of deploy/home.
//! - Members are registered only by `flotilla cluster add`, and each
//!   member's audit log shows the operator acting as its ServiceAccount,
//!   never as the admin that ran the command.
//! - A FleetMicroservice rolls out through the Pods.
//! - Uninstalling the documented way leaves every workload running.
//!
//! It takes the home cluster's flotilla-system for itself (the Pod tests'
//! install is removed first), so integration/run-tests runs it after every
//! other test.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Api;
use support::{
    audit_events_with, client, eventually, fleet_script, kubeconfig_path, kubectl, received,
};

use flotilla::crd::Microservice;

const MEMBERS: [&str; 3] = ["member-1", "member-2", "member-3"];
const SA: &str = "system:serviceaccount:flotilla-system:flotilla";
/// The test bed's real node, and the taint that keeps kwok's workloads off it.
const NODE: &str = "flotilla-node";
const NODE_TAINT: &str = "platform.example.io/operator-node";
/// Where the Pods reach the members (integration/fleet-node.sh).
const NODE_GATEWAY: &str = "10.88.0.1";
/// The image tag the test bed's image carries (integration/image).
const IMAGE: &str = "ghcr.io/example/flotilla:0.1.0";

/// The `sh` blocks of a markdown file, in order: the settings block (info
/// string `sh settings`), if any, and every other. Blocks in any other
/// language (`yaml`, `console`) are shown, not run.
fn sh_blocks(markdown: &str) -> (Option<String>, Vec<String>) {
    #[derive(PartialEq)]
    enum Kind {
        Settings,
        Run,
        Shown,
    }
    let (mut settings, mut blocks) = (None, Vec::new());
    let mut open: Option<(Kind, String)> = None;
    for line in markdown.lines() {
        let fence = line.trim_start().strip_prefix("```");
        match (open.take(), fence) {
            (None, Some(info)) => {
                let kind = match info.split_whitespace().collect::<Vec<_>>().as_slice() {
                    ["sh"] => Kind::Run,
                    ["sh", "settings"] => Kind::Settings,
                    _ => Kind::Shown,
                };
                open = Some((kind, String::new()));
            }
            (None, None) => {}
            (Some((kind, text)), Some(_)) => match kind {
                Kind::Settings => settings = Some(text),
                Kind::Run => blocks.push(text),
                Kind::Shown => {}
            },
            (Some((kind, mut text)), None) => {
                text.push_str(line);
                text.push('\n');
                open = Some((kind, text));
            }
        }
    }
    assert!(open.is_none(), "an unclosed code block");
    (settings, blocks)
}

fn apiserver_port(member: &str) -> u16 {
    let n: u16 = member
        .trim_start_matches("member-")
        .parse()
        .expect("member-N");
    17000 + 10 * n
}

/// The test bed's settings, in place of the doc's.
fn settings() -> String {
    let mut s = format!(
        "export HOME_KUBECONFIG={}\n",
        kubeconfig_path("home").display()
    );
    for m in MEMBERS {
        let var = m.to_uppercase().replace('-', "_");
        s += &format!("export {var}_KUBECONFIG={}\n", kubeconfig_path(m).display());
        s += &format!(
            "export {var}_SERVER=https://{NODE_GATEWAY}:{}\n",
            apiserver_port(m)
        );
    }
    s += &format!("export MEMBER_SERVER_ALLOW={NODE_GATEWAY}/32\nexport FLOTILLA_IMAGE={IMAGE}\n");
    s
}

/// Runs the blocks of `doc` in `dir` with bash, within `limit`; its output.
fn run_doc(doc: &str, dir: &Path, limit: Duration) -> String {
    let markdown =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(doc)).expect("doc");
    let (doc_settings, blocks) = sh_blocks(&markdown);
    assert!(!blocks.is_empty(), "{doc}: no sh blocks");
    if doc == "docs/install.md" {
        assert!(doc_settings.is_some(), "{doc}: no settings block");
    }
    // Background jobs (the port-forward) end with the script.
    let script = format!(
        "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\ntrap 'exit 143' TERM INT\nset -x\n{}{}",
        settings(),
        blocks.join("")
    );
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_flotilla"));
    let path = format!(
        "{}:{}:{}",
        bin.parent().expect("bin dir").display(),
        kubectl().parent().expect("kubectl dir").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = timed(limit)
        .args(["bash", "-c", &script])
        .current_dir(dir)
        .env("PATH", path)
        .env_remove("KUBECONFIG")
        .output()
        .expect("bash");
    let said = text(&out);
    assert!(
        out.status.success(),
        "{doc}, run as written, failed ({}):\n{said}",
        out.status
    );
    said
}

/// A command run by coreutils' timeout, which ends it past `limit`.
fn timed(limit: Duration) -> Command {
    let mut c = Command::new("timeout");
    c.args(["--kill-after=10", &limit.as_secs().to_string()]);
    c
}

/// Its stdout and stderr, as one text.
fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn run(program: &Path, args: &[&str], limit: Duration) -> String {
    let out = timed(limit)
        .arg(program)
        .args(args)
        .output()
        .expect("timeout(1)");
    assert!(
        out.status.success(),
        "{} {args:?}: {}",
        program.display(),
        text(&out)
    );
    text(&out)
}

fn k_home(args: &[&str]) -> String {
    let home = kubeconfig_path("home").display().to_string();
    let mut all = vec!["--kubeconfig", &home];
    all.extend_from_slice(args);
    run(&kubectl(), &all, Duration::from_secs(120))
}

/// The home cluster as a real one: Pods land on the real node only. kwok's
/// nodes are cordoned and the real node's taint lifted, and both are put
/// back when the test ends.
struct RealNodesOnly(Vec<String>);

impl RealNodesOnly {
    fn take() -> Self {
        let names = k_home(&["get", "nodes", "-o", "jsonpath={.items[*].metadata.name}"]);
        let fake: Vec<String> = names
            .split_whitespace()
            .filter(|n| *n != NODE)
            .map(String::from)
            .collect();
        for n in &fake {
            k_home(&["cordon", n]);
        }
        k_home(&["taint", "nodes", NODE, &format!("{NODE_TAINT}:NoSchedule-")]);
        RealNodesOnly(fake)
    }
}

impl Drop for RealNodesOnly {
    fn drop(&mut self) {
        let home = kubeconfig_path("home").display().to_string();
        let k = |args: &[&str]| {
            Command::new(kubectl())
                .arg("--kubeconfig")
                .arg(&home)
                .args(args)
                .output()
                .ok();
        };
        for n in &self.0 {
            k(&["uncordon", n]);
        }
        k(&[
            "taint",
            "nodes",
            NODE,
            &format!("{NODE_TAINT}=true:NoSchedule"),
            "--overwrite",
        ]);
        // What the test bed's `fleet up` applies to home, which the uninstall removed.
        let policy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/home/approval-policy.yaml");
        k(&["apply", "-f", &policy.display().to_string()]);
    }
}

/// A copy of `deploy/`, as a release unpacks it: the docs' commands run
/// from the directory that holds it.
fn release_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flotilla-install-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("work dir");
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    run(
        Path::new("cp"),
        &[
            "-r",
            &deploy.display().to_string(),
            &dir.display().to_string(),
        ],
        Duration::from_secs(30),
    );
    dir
}

/// Whether a read found nothing, a missing kind (no CRD) included; None
/// when it could not tell.
fn absent<K>(read: Result<Option<K>, kube::Error>) -> Option<bool> {
    match read {
        Ok(found) => Some(found.is_none()),
        Err(kube::Error::Api(e)) if e.code == 404 => Some(true),
        Err(_) => None,
    }
}

/// The sample's objects, gone: an earlier run's uninstall left them on
/// purpose. The FleetMicroservice's finalizer is the operator's, which is
/// not running, so it is cleared first.
async fn remove_sample() {
    use kube::api::{DeleteParams, Patch, PatchParams};
    let home = client("home").await;
    let fms = Api::<kube::api::DynamicObject>::namespaced_with(
        home,
        "default",
        &kube::api::ApiResource::erase::<flotilla::rollout::spec::FleetMicroservice>(&()),
    );
    if absent(fms.get_opt("whoami").await) == Some(false) {
        let clear = serde_json::json!({"metadata": {"finalizers": null}});
        fms.patch("whoami", &PatchParams::default(), &Patch::Merge(&clear))
            .await
            .expect("clear the finalizer");
        let _ = fms.delete("whoami", &DeleteParams::default()).await;
    }
    for m in MEMBERS {
        let member = client(m).await;
        let ms = Api::<Microservice>::namespaced(member.clone(), "default");
        let _ = ms.delete("whoami", &DeleteParams::default()).await;
        let deployments = Api::<Deployment>::namespaced(member, "default");
        eventually(
            &format!("{m}: the earlier whoami gone"),
            Duration::from_secs(60),
            || {
                let (ms, deployments) = (ms.clone(), deployments.clone());
                async move {
                    let gone = absent(ms.get_opt("whoami").await)?
                        && absent(deployments.get_opt("whoami").await)?;
                    gone.then_some(())
                }
            },
        )
        .await;
    }
}

/// Whether a kubeconfig carries only a token: no client certificate, key,
/// exec plugin or file reference.
fn token_only(kubeconfig: &str) -> bool {
    let v: serde_yaml::Value = serde_yaml::from_str(kubeconfig).expect("kubeconfig yaml");
    let users = v["users"].as_sequence().expect("users");
    users.len() == 1 && {
        let user = users[0]["user"].as_mapping().expect("user");
        user.len() == 1 && user.contains_key("token")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_install_runbook_word_for_word_registers_members_with_their_own_identity_and_uninstalling_keeps_workloads()
 {
    let image = support::image_tarball();
    assert!(
        image.is_file(),
        "no image at {}: run `make image` (run-tests builds it)",
        image.display()
    );
    let fleet = fleet_script();
    run(&fleet, &["node", "up"], Duration::from_secs(600));
    // A clean home: the Pod tests' install, and every registration with it, goes.
    run(&fleet, &["pods", "down"], Duration::from_secs(180));
    let home = client("home").await;
    for ns in ["flotilla-system", "flotilla-members"] {
        let api = Api::<Namespace>::all(home.clone());
        eventually(
            &format!("home: {ns} gone"),
            Duration::from_secs(120),
            || {
                let api = api.clone();
                async move { api.get_opt(ns).await.ok()?.is_none().then_some(()) }
            },
        )
        .await;
    }
    run(
        &fleet,
        &["node", "import", &image.display().to_string()],
        Duration::from_secs(300),
    );
    let _nodes = RealNodesOnly::take();
    remove_sample().await;
    let started = jiff::Timestamp::now();
    let dir = release_dir();

    let out = run_doc("docs/install.md", &dir, Duration::from_secs(900));
    println!("{out}");
    for m in MEMBERS {
        assert!(
            out.contains(&format!("home: Secret flotilla-members/{m} created")),
            "{m} not registered:\n{out}"
        );
    }

    // Each registration holds a token of the member's own ServiceAccount,
    // and nothing of the admin kubeconfig that ran `cluster add`.
    let secrets = Api::<Secret>::namespaced(home.clone(), "flotilla-members");
    for m in MEMBERS {
        let s = secrets.get(m).await.expect("member Secret");
        let kubeconfig = String::from_utf8(s.data.unwrap()["kubeconfig"].0.clone()).unwrap();
        assert!(
            token_only(&kubeconfig),
            "{m}: more than a token:\n{kubeconfig}"
        );
        assert!(
            kubeconfig.contains(&format!("https://{NODE_GATEWAY}:{}", apiserver_port(m))),
            "{m}: {kubeconfig}"
        );
        let admin = std::fs::read_to_string(kubeconfig_path(m)).unwrap();
        let admin: serde_yaml::Value = serde_yaml::from_str(&admin).unwrap();
        for secret_field in ["client-key-data", "client-certificate-data", "token"] {
            if let Some(v) = admin["users"][0]["user"][secret_field].as_str() {
                assert!(
                    !kubeconfig.contains(v),
                    "{m}: the admin's {secret_field} was stored"
                );
            }
        }
    }

    // Refused, with nothing written: the same cluster under another name,
    // a name that is no DNS label, a label Flotilla sets itself.
    let flotilla = PathBuf::from(env!("CARGO_BIN_EXE_flotilla"));
    let home_kc = kubeconfig_path("home").display().to_string();
    let member_kc = kubeconfig_path("member-1").display().to_string();
    for (args, why) in [
        (vec!["again"], "already registered as \"member-1\""),
        (vec!["Bad_Name"], "not a valid cluster name"),
        (
            vec![
                "again",
                "--label",
                "platform.example.io/member-cluster=false",
            ],
            "set by Flotilla",
        ),
    ] {
        let mut all = vec!["cluster", "add"];
        all.extend(args.iter().copied());
        all.extend([
            "--member-kubeconfig",
            &member_kc,
            "--home-kubeconfig",
            &home_kc,
        ]);
        let out = Command::new(&flotilla)
            .args(&all)
            .output()
            .expect("flotilla");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(why),
            "cluster {all:?}: {err}"
        );
    }
    assert!(
        secrets.get_opt("again").await.unwrap().is_none(),
        "a refused add wrote a Secret"
    );
    // A purge whose kubeconfig reaches another cluster than the name
    // registers deletes nothing, in home or in the member.
    let out = timed(Duration::from_secs(60))
        .arg(&flotilla)
        .args([
            "cluster",
            "remove",
            "member-2",
            "--purge",
            "--member-kubeconfig",
            &member_kc,
        ])
        .args(["--home-kubeconfig", &home_kc])
        .output()
        .expect("flotilla");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("nothing purged"),
        "{err}"
    );
    assert!(
        secrets.get_opt("member-2").await.unwrap().is_some(),
        "member-2 deregistered"
    );
    let token = Api::<Secret>::namespaced(client("member-1").await, "flotilla-system");
    assert!(
        token
            .get_opt("flotilla-member-token")
            .await
            .unwrap()
            .is_some(),
        "member-1's token purged"
    );
    // The same registration again changes nothing.
    let again = timed(Duration::from_secs(60))
        .arg(&flotilla)
        .args([
            "cluster",
            "add",
            "member-1",
            "--member-kubeconfig",
            &member_kc,
        ])
        .args([
            "--member-server",
            &format!("https://{NODE_GATEWAY}:{}", apiserver_port("member-1")),
        ])
        .args([
            "--home-kubeconfig",
            &home_kc,
            "--label",
            "env=prod",
            "--label",
            "ring=canary",
        ])
        .output()
        .expect("flotilla");
    let said = String::from_utf8_lossy(&again.stdout);
    assert!(
        again.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert!(
        said.contains("home: Secret flotilla-members/member-1 unchanged (the same member again")
            && said.contains("member: Secret flotilla-system/flotilla-member-token kept")
            && said.contains(
                "CustomResourceDefinition/microservices.platform.example.io present, left as it is"
            )
            && !said.contains(" created"),
        "cluster add again:\n{said}"
    );

    // The FleetMicroservice rolled out (the doc's `rollout wait` passed):
    // its Deployment is in every member, written by the Pods as the
    // member's ServiceAccount.
    for m in MEMBERS {
        let member = client(m).await;
        Api::<Deployment>::namespaced(member, "default")
            .get("whoami")
            .await
            .unwrap_or_else(|e| panic!("{m}: no whoami Deployment: {e}"));
        let events: Vec<_> = audit_events_with(m, "flotilla")
            .into_iter()
            .filter(|e| received(e) >= started)
            .filter(|e| {
                e["userAgent"]
                    .as_str()
                    .is_some_and(|a| a.starts_with("flotilla/") || a.starts_with("flotilla-fleet/"))
            })
            .collect();
        let lease_writes = events
            .iter()
            .filter(|e| {
                e["objectRef"]["resource"] == "leases"
                    && e["verb"] != "get"
                    && e["verb"] != "list"
                    && e["verb"] != "watch"
            })
            .count();
        let workload_writes = events
            .iter()
            .filter(|e| {
                matches!(
                    e["objectRef"]["resource"].as_str(),
                    Some("microservices" | "deployments")
                ) && e["verb"] == "create"
            })
            .count();
        assert!(
            lease_writes > 0 && workload_writes > 0,
            "{m}: the operator's Lease and workload writes were not audited ({lease_writes}, {workload_writes})"
        );
        let strangers: Vec<String> = events
            .iter()
            .map(|e| e["user"]["username"].as_str().unwrap_or("").to_string())
            .filter(|u| u != SA)
            .collect();
        assert!(
            strangers.is_empty(),
            "{m}: the operator acted as {strangers:?}, not only as {SA}"
        );
    }

    // Uninstalling as docs/lifecycle.md says keeps every workload.
    let out = run_doc("docs/lifecycle.md", &dir, Duration::from_secs(600));
    println!("{out}");
    // --purge revoked each member's token and deleted its access.
    for what in [
        "member: Secret flotilla-system/flotilla-member-token deleted",
        "member: ClusterRoleBinding/flotilla-member deleted",
        "member: ServiceAccount/flotilla-system/flotilla deleted",
    ] {
        assert_eq!(
            out.matches(what).count(),
            3,
            "{what:?} not once per member:\n{out}"
        );
    }
    for m in MEMBERS {
        let member = client(m).await;
        eventually(
            &format!("{m}: flotilla-system deleted"),
            Duration::from_secs(120),
            || {
                let api = Api::<Namespace>::all(member.clone());
                async move {
                    api.get_opt("flotilla-system")
                        .await
                        .ok()
                        .flatten()
                        .is_none()
                        .then_some(())
                }
            },
        )
        .await;
    }
    // Garbage collection deletes within moments of losing an owner; give it time to be wrong.
    tokio::time::sleep(Duration::from_secs(10)).await;
    for m in MEMBERS {
        let member = client(m).await;
        Api::<Deployment>::namespaced(member.clone(), "default")
            .get("whoami")
            .await
            .unwrap_or_else(|e| panic!("{m}: uninstalling deleted the whoami Deployment: {e}"));
        Api::<Microservice>::namespaced(member, "default")
            .get("whoami")
            .await
            .unwrap_or_else(|e| panic!("{m}: uninstalling deleted the whoami Microservice: {e}"));
    }
    let _ = std::fs::remove_dir_all(&dir);
    remove_sample().await;
}

#[test]
fn sh_blocks_are_read_in_order_and_others_are_skipped() {
    let md = "x\n```sh settings\nexport A=1\n```\n1. a step\n   ```sh\n   echo zero\n   ```\n```yaml\nk: v\n```\n```sh\necho one\n```\n```console\n$ no\n```\n```sh\necho two\n```\n";
    let (settings, blocks) = sh_blocks(md);
    assert_eq!(settings.as_deref(), Some("export A=1\n"));
    assert_eq!(
        blocks,
        vec![
            "   echo zero\n".to_string(),
            "echo one\n".to_string(),
            "echo two\n".to_string()
        ]
    );
}
