//! The manifests in `deploy/` against real apiservers: server-side dry-run,
//! then for real; RBAC that grants what the operator needs and nothing
//! broad; and a replica running on exactly those credentials.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kube::Api;
use kube::api::PostParams;
use support::replicas::{FAST_ELECTION, local_server_args};
use support::{
    TestNamespace, client, fleet_dir, kubeconfig_path, kubectl, microservice, output_within,
    wait_all_true,
};

use flotilla::crd::Microservice;

const SA: &str = "system:serviceaccount:flotilla-system:flotilla";

fn deploy_dir(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(sub)
}

/// kubectl against a cluster of the fleet: exit status and output.
fn k(cluster: &str, args: &[&str]) -> (bool, String) {
    k_with(&kubeconfig_path(cluster), args)
}

/// kubectl with a kubeconfig of the test's own (a ServiceAccount token).
fn k_with(kubeconfig: &Path, args: &[&str]) -> (bool, String) {
    let out = output_within(
        Command::new(kubectl())
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args),
        Duration::from_secs(120),
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn apply(cluster: &str, dir: &str) {
    // The CRDs first, as docs/install.md orders it: they are kept apart so
    // that deleting the operator's manifests deletes no workload.
    let crds = deploy_dir("crds").join(dir).display().to_string();
    let (ok, out) = k(
        cluster,
        &["apply", "--server-side", "--force-conflicts", "-k", &crds],
    );
    assert!(ok, "CRDs on {cluster}: {out}");
    // A server-side dry-run of namespaced objects needs their namespace.
    let ns = deploy_dir(dir).join("namespace.yaml").display().to_string();
    let (ok, out) = k(cluster, &["apply", "--server-side", "-f", &ns]);
    assert!(ok, "namespace on {cluster}: {out}");
    let path = deploy_dir(dir).display().to_string();
    for dry in [true, false] {
        let mut args = vec!["apply", "--server-side", "--force-conflicts", "-k", &path];
        if dry {
            args.push("--dry-run=server");
        }
        let (ok, out) = k(cluster, &args);
        assert!(ok, "kubectl {args:?} on {cluster}: {out}");
    }
}

/// `kubectl auth can-i` as the operator's ServiceAccount: a
/// SubjectAccessReview answered by the apiserver's RBAC authorizer.
fn can(cluster: &str, args: &[&str]) -> bool {
    let mut all = vec!["auth", "can-i"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--as", SA]);
    let (_, out) = k(cluster, &all);
    // The answer is the last line; a warning may come first (a
    // cluster-scoped resource asked about in the context's namespace).
    let answer = out
        .lines()
        .map(str::trim)
        .find(|l| *l == "yes" || l.starts_with("no"))
        .unwrap_or(out.trim());
    match answer {
        "yes" => true,
        s if s.starts_with("no") => false,
        other => panic!("kubectl auth can-i {args:?}: {other}"),
    }
}

#[test]
fn rbac_manifests_name_no_wildcards_and_no_cluster_wide_secrets() {
    for file in ["home/rbac.yaml", "home/user-roles.yaml", "member/rbac.yaml"] {
        let text = std::fs::read_to_string(deploy_dir(file)).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let v = serde_yaml::Value::deserialize(doc).unwrap();
            let kind = v["kind"].as_str().unwrap_or_default().to_string();
            for rule in v["rules"].as_sequence().into_iter().flatten() {
                for key in ["verbs", "resources", "apiGroups"] {
                    for item in rule[key].as_sequence().into_iter().flatten() {
                        assert_ne!(item.as_str(), Some("*"), "{file}: a wildcard in {key}");
                    }
                }
                let resources: Vec<&str> = rule["resources"]
                    .as_sequence()
                    .into_iter()
                    .flatten()
                    .filter_map(|r| r.as_str())
                    .collect();
                if kind == "ClusterRole" {
                    assert!(
                        !resources.contains(&"secrets"),
                        "{file}: cluster-wide Secrets"
                    );
                }
            }
        }
    }
}

/// #30 L6: the replicas' ports are not open to every pod. The policy
/// selects the operator's pods, admits ingress only from labelled
/// namespaces, and the metrics port only from the metrics one. (Its effect
/// needs a CNI that enforces NetworkPolicy; the test bed has none, so the
/// manifest itself is checked, and the apiserver accepts it in `apply`.)
#[test]
fn a_network_policy_opens_each_port_only_to_labelled_namespaces() {
    let text = std::fs::read_to_string(deploy_dir("home/networkpolicy.yaml")).unwrap();
    let kustomization = std::fs::read_to_string(deploy_dir("home/kustomization.yaml")).unwrap();
    assert!(kustomization.contains("networkpolicy.yaml"), "not shipped");
    let v: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    assert_eq!(v["kind"].as_str(), Some("NetworkPolicy"));
    assert_eq!(
        v["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"].as_str(),
        Some("flotilla")
    );
    let rules = v["spec"]["ingress"].as_sequence().expect("ingress rules");
    let mut opened: Vec<(String, String)> = Vec::new();
    for rule in rules {
        let from = rule["from"]
            .as_sequence()
            .expect("every rule names its sources");
        assert!(!from.is_empty(), "a rule open to everyone");
        let labels: Vec<String> = from
            .iter()
            .map(|f| {
                let m = f["namespaceSelector"]["matchLabels"]
                    .as_mapping()
                    .expect("a namespace label");
                assert!(!m.is_empty(), "an empty selector matches every namespace");
                serde_yaml::to_string(m).unwrap()
            })
            .collect();
        let ports = rule["ports"]
            .as_sequence()
            .expect("every rule names its ports");
        for p in ports {
            for l in &labels {
                opened.push((p["port"].as_str().unwrap().to_string(), l.clone()));
            }
        }
    }
    let metrics: Vec<&(String, String)> = opened.iter().filter(|(p, _)| p == "metrics").collect();
    assert!(
        !metrics.is_empty() && metrics.iter().all(|(_, l)| l.contains("flotilla-metrics")),
        "{opened:?}"
    );
    for port in ["grpc", "ui"] {
        assert!(
            opened
                .iter()
                .any(|(p, l)| p == port && l.contains("flotilla-client")),
            "{port}: {opened:?}"
        );
    }
}

use serde::Deserialize;

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.kill().ok();
        self.0.wait().ok();
    }
}

/// A kubeconfig for `cluster` that authenticates with a ServiceAccount token.
fn token_kubeconfig(cluster: &str, dir: &Path) -> PathBuf {
    let (ok, token) = k(
        cluster,
        &[
            "create",
            "token",
            "flotilla",
            "-n",
            "flotilla-system",
            "--duration",
            "1h",
        ],
    );
    assert!(ok, "token for {cluster}: {token}");
    let admin: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(kubeconfig_path(cluster)).unwrap()).unwrap();
    let c = &admin["clusters"][0]["cluster"];
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": cluster, "cluster": {
            "server": c["server"].as_str().unwrap(),
            "certificate-authority-data": c["certificate-authority-data"].as_str().unwrap(),
        }}],
        "users": [{"name": "flotilla", "user": {"token": token.trim()}}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": "flotilla"}}],
        "current-context": cluster,
    });
    let path = dir.join(format!("{cluster}.yaml"));
    std::fs::write(&path, serde_yaml::to_string(&kubeconfig).unwrap()).unwrap();
    path
}

#[tokio::test]
async fn manifests_apply_grant_least_privilege_and_run_the_operator() {
    apply("home", "home");
    apply("member-1", "member");
    let (ok, out) = k(
        "home",
        &[
            "-n",
            "flotilla-system",
            "get",
            "deployment",
            "flotilla",
            "-o",
            "jsonpath={.spec.replicas}",
        ],
    );
    assert!(ok && out.trim() == "3", "{out}");
    let (ok, out) = k(
        "home",
        &["-n", "flotilla-system", "get", "pdb,svc", "-o", "name"],
    );
    assert!(
        ok && out.contains("flotilla-grpc") && out.contains("poddisruptionbudget"),
        "{out}"
    );

    // Home: its own namespace's Secrets and Leases; FleetMicroservices,
    // their status and ControllerRevisions for the fleet controller.
    for (args, want) in [
        (
            &["watch", "fleetmicroservices.platform.example.io", "-A"][..],
            true,
        ),
        (
            &[
                "update",
                "fleetmicroservices.platform.example.io",
                "--subresource=status",
                "-n",
                "default",
            ][..],
            true,
        ),
        (
            &[
                "delete",
                "fleetmicroservices.platform.example.io",
                "-n",
                "default",
            ][..],
            false,
        ),
        (
            &["create", "controllerrevisions.apps", "-n", "default"][..],
            true,
        ),
        (&["delete", "deployments.apps", "-n", "default"][..], false),
        // #30 L7: member Secrets in a namespace of their own, list only;
        // nothing of its own namespace's Secrets (its TLS key, its tokens).
        (&["list", "secrets", "-n", "flotilla-members"][..], true),
        (&["watch", "secrets", "-n", "flotilla-members"][..], false),
        (&["get", "secrets", "-n", "flotilla-members"][..], false),
        (&["list", "secrets", "-n", "flotilla-system"][..], false),
        // #35: analysis webhook credentials, by name only.
        (&["get", "secrets", "-n", "flotilla-analysis"][..], true),
        (&["list", "secrets", "-n", "flotilla-analysis"][..], false),
        (&["watch", "secrets", "-n", "flotilla-analysis"][..], false),
        (
            &[
                "get",
                "secrets/flotilla-grpc-token",
                "-n",
                "flotilla-system",
            ][..],
            false,
        ),
        (
            &["get", "secrets/flotilla-grpc-tls", "-n", "flotilla-system"][..],
            false,
        ),
        (
            &[
                "create",
                "leases.coordination.k8s.io",
                "-n",
                "flotilla-system",
            ][..],
            true,
        ),
        (
            &[
                "delete",
                "leases.coordination.k8s.io",
                "-n",
                "flotilla-system",
            ][..],
            true,
        ),
        // #34: it asks the apiserver who a caller is and what they may do.
        (&["create", "tokenreviews.authentication.k8s.io"][..], true),
        (
            &["create", "subjectaccessreviews.authorization.k8s.io"][..],
            true,
        ),
        (&["list", "secrets", "-A"][..], false),
        (&["get", "secrets", "-n", "default"][..], false),
        (&["create", "secrets", "-n", "flotilla-system"][..], false),
        (
            &["create", "deployments.apps", "-n", "flotilla-system"][..],
            false,
        ),
        (&["*", "*"][..], false),
    ] {
        assert_eq!(can("home", args), want, "home: can-i {args:?}");
    }
    // Member: Microservices, their status and children; Leases only in flotilla-system.
    for (args, want) in [
        (
            &["watch", "microservices.platform.example.io", "-A"][..],
            true,
        ),
        (
            &[
                "update",
                "microservices.platform.example.io",
                "--subresource=status",
                "-n",
                "default",
            ][..],
            true,
        ),
        // The fleet controller writes the Microservices of FleetMicroservices
        // (never patch), and creates a namespace it needs; never deletes one.
        (
            &[
                "update",
                "microservices.platform.example.io",
                "-n",
                "default",
            ][..],
            true,
        ),
        (
            &[
                "patch",
                "microservices.platform.example.io",
                "-n",
                "default",
            ][..],
            false,
        ),
        (&["create", "namespaces"][..], true),
        (&["delete", "namespaces"][..], false),
        (&["create", "deployments.apps", "-n", "default"][..], true),
        (&["update", "services", "-n", "default"][..], true),
        // An earlier Microservice's leftover children; admission.yaml
        // admits only deletes of what a Microservice controls.
        (&["delete", "deployments.apps", "-n", "default"][..], true),
        (&["delete", "services", "-n", "default"][..], true),
        (&["list", "endpointslices.discovery.k8s.io", "-A"][..], true),
        (
            &["create", "endpointslices.discovery.k8s.io", "-n", "default"][..],
            false,
        ),
        (
            &["create", "events.events.k8s.io", "-n", "default"][..],
            true,
        ),
        // The dashboard's detail view lists an object's Warnings; it
        // never deletes Events.
        (&["list", "events", "-n", "default"][..], true),
        (&["delete", "events", "-n", "default"][..], false),
        (
            &[
                "update",
                "leases.coordination.k8s.io",
                "-n",
                "flotilla-system",
            ][..],
            true,
        ),
        (
            &["update", "leases.coordination.k8s.io", "-n", "kube-system"][..],
            false,
        ),
        (&["list", "secrets", "-A"][..], false),
        (&["get", "secrets", "-n", "flotilla-system"][..], false),
        (&["*", "*"][..], false),
    ] {
        assert_eq!(can("member-1", args), want, "member-1: can-i {args:?}");
    }

    // A replica on exactly those credentials reconciles member-1.
    let admin = client("member-1").await;
    let ns = TestNamespace::create(&admin, "member-1", "deploy-sa").await;
    let dir = fleet_dir()
        .join("test-kubeconfigs")
        .join(format!("deploy-{}", ns.name));
    let members = dir.join("members");
    std::fs::create_dir_all(&members).unwrap();
    let home = token_kubeconfig("home", &dir);
    token_kubeconfig("member-1", &members);
    let log_path = fleet_dir()
        .join("logs")
        .join(format!("test-deploy-{}.log", ns.name));
    let log = std::fs::File::create(&log_path).unwrap();
    let fleet_name = format!("sa{}", &ns.name[ns.name.len().saturating_sub(6)..]);
    let _operator = Running(
        Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .args(["run", "--kubeconfig-dir"])
            .arg(&members)
            .arg("--home-kubeconfig")
            .arg(&home)
            .args([
                "--home-namespace",
                "flotilla-system",
                "--member-secrets-namespace",
                "flotilla-members",
                "--fleet-name",
                &fleet_name,
            ])
            .args(["--replica-id", "sa-replica", "--namespace", &ns.name])
            .args(FAST_ELECTION)
            .args(local_server_args())
            .env("RUST_LOG", "info,kube=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start the operator"),
    );
    let api: Api<Microservice> = ns.api();
    api.create(
        &PostParams::default(),
        &microservice("least", "ghcr.io/acme/least:1", 8080, Some(1)),
    )
    .await
    .expect("create");
    wait_all_true(&api, 1, "Available", Duration::from_secs(90)).await;
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(
        !log.to_lowercase().contains("forbidden"),
        "the operator hit RBAC denials:\n{log}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// A test namespace in `cluster`, and a directory with a kubeconfig for
/// the operator's ServiceAccount there.
async fn as_operator(cluster: &str, prefix: &str) -> (TestNamespace, PathBuf, PathBuf) {
    let ns = TestNamespace::create(&client(cluster).await, cluster, prefix).await;
    let dir = fleet_dir()
        .join("test-kubeconfigs")
        .join(format!("{prefix}-{}", ns.name));
    std::fs::create_dir_all(&dir).unwrap();
    let sa = token_kubeconfig(cluster, &dir);
    (ns, dir, sa)
}

/// Writes `v` as `dir/name.json`; its path.
fn manifest(dir: &Path, name: &str, v: serde_json::Value) -> String {
    let p = dir.join(format!("{name}.json"));
    std::fs::write(&p, v.to_string()).unwrap();
    p.display().to_string()
}

/// A ControllerRevision manifest: with the fleet label and a controller
/// ownerReference to a FleetMicroservice, or as anyone else's.
fn revision(name: &str, ns: &str, fleets: bool, owned: bool) -> serde_json::Value {
    let mut metadata = serde_json::json!({"name": name, "namespace": ns});
    if fleets {
        metadata["labels"] = serde_json::json!({"platform.example.io/fleet-microservice": "web"});
    }
    if owned {
        metadata["ownerReferences"] = serde_json::json!([{
            "apiVersion": "platform.example.io/v1alpha1", "kind": "FleetMicroservice",
            "name": "web", "uid": "00000000-0000-0000-0000-000000000001", "controller": true,
        }]);
    }
    serde_json::json!({
        "apiVersion": "apps/v1", "kind": "ControllerRevision",
        "metadata": metadata, "revision": 1, "data": {"spec": {"template": {}}},
    })
}

/// #30 M5: RBAC grants ControllerRevisions cluster-wide, and they are also
/// StatefulSet and DaemonSet history; the shipped admission policy holds
/// the operator's ServiceAccount to its own. Server-side dry runs, so
/// nothing is written.
#[tokio::test]
async fn the_operator_writes_only_the_controller_revisions_of_its_fleet_microservices() {
    apply("home", "home");
    let (ns, dir, sa) = as_operator("home", "deploy-cr").await;
    let file = |name: &str, v: serde_json::Value| manifest(&dir, name, v);
    // Someone else's revision, as a StatefulSet's history would be.
    let theirs = file("theirs", revision("sts-history", &ns.name, false, false));
    let (ok, out) = k("home", &["create", "-f", &theirs]);
    assert!(ok, "{out}");
    let attempt = |args: Vec<String>| {
        let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
        all.push("--dry-run=server");
        k_with(&sa, &all)
    };
    let create = |path: &str| attempt(vec!["create".into(), "-f".into(), path.into()]);
    let injected = file(
        "injected",
        revision("injected", "kube-system", false, false),
    );
    // The policy takes a moment to be in force after it is created.
    let refused = support::eventually("the policy in force", Duration::from_secs(30), || {
        let (ok, out) = create(&injected);
        async move { (!ok && out.contains("flotilla may write only")).then_some(out) }
    })
    .await;
    assert!(
        refused.contains("Forbidden") || refused.contains("denied"),
        "{refused}"
    );
    // Labelled but not owned, and owned but not labelled: refused too.
    for (name, fleets, owned) in [("label-only", true, false), ("owner-only", false, true)] {
        let (ok, out) = create(&file(name, revision(name, &ns.name, fleets, owned)));
        assert!(
            !ok && out.contains("flotilla may write only"),
            "{name}: {out}"
        );
    }
    // Deleting someone else's history: refused.
    let (ok, out) = attempt(vec![
        "delete".into(),
        "controllerrevision".into(),
        "sts-history".into(),
        "-n".into(),
        ns.name.clone(),
    ]);
    assert!(!ok && out.contains("flotilla may write only"), "{out}");
    // Its own kind of revision: admitted.
    let (ok, out) = create(&file("ours", revision("ours", &ns.name, true, true)));
    assert!(ok, "the operator's own revision refused: {out}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A Deployment manifest in `ns`, with `pod` merged into its pod spec.
fn deployment(name: &str, ns: &str, pod: serde_json::Value) -> serde_json::Value {
    let mut spec = serde_json::json!({"containers": [{"name": "c", "image": "ghcr.io/acme/x:1"}]});
    for (k, v) in pod.as_object().into_iter().flatten() {
        spec[k] = v.clone();
    }
    serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    })
}

/// #30 L8: RBAC grants Deployments, Services and Namespaces cluster-wide on
/// members; the shipped admission policy holds the operator's
/// ServiceAccount to what its reconciler writes. Server-side dry runs as
/// that ServiceAccount on member-1.
#[tokio::test]
async fn a_leaked_member_credential_cannot_place_a_workload_that_owns_the_member() {
    apply("member-1", "member");
    let (ns, dir, sa) = as_operator("member-1", "deploy-guard").await;
    let create = |name: &str, v: serde_json::Value| {
        k_with(
            &sa,
            &["create", "-f", &manifest(&dir, name, v), "--dry-run=server"],
        )
    };
    let refused = |out: &str| {
        out.contains("flotilla writes nothing")
            || out.contains("flotilla creates no")
            || out.contains("flotilla's Deployments")
    };
    let in_kube_system = deployment("x", "kube-system", serde_json::json!({}));
    support::eventually("the policy in force", Duration::from_secs(30), || {
        let (ok, out) = create("kube-system", in_kube_system.clone());
        async move { (!ok && refused(&out)).then_some(()) }
    })
    .await;
    let cases = [
        (
            "powerful-sa",
            deployment(
                "x",
                &ns.name,
                serde_json::json!({"serviceAccountName": "admin"}),
            ),
        ),
        (
            "host-network",
            deployment("x", &ns.name, serde_json::json!({"hostNetwork": true})),
        ),
        (
            "host-path",
            deployment(
                "x",
                &ns.name,
                serde_json::json!({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}),
            ),
        ),
        (
            "privileged",
            deployment(
                "x",
                &ns.name,
                serde_json::json!({"containers": [{"name": "c", "image": "x:1", "securityContext": {"privileged": true}}]}),
            ),
        ),
        (
            "kube-namespace",
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-evil"}}),
        ),
    ];
    for (name, v) in cases {
        let (ok, out) = create(name, v);
        // The test bed's apiservers also refuse privileged pods themselves
        // (--allow-privileged=false); either refusal holds.
        let by_cluster = name == "privileged" && out.contains("disallowed by cluster policy");
        assert!(!ok && (refused(&out) || by_cluster), "{name}: {out}");
    }
    // A Deployment no Microservice controls: another's, or a stranger's.
    let (ok, out) = create("unowned", deployment("x", &ns.name, serde_json::json!({})));
    assert!(
        !ok && out.contains("a Microservice controls"),
        "a Deployment without its Microservice admitted: {out}"
    );
    // What the reconciler and the fleet controller write: admitted.
    let mut plain = deployment("x", &ns.name, serde_json::json!({}));
    plain["metadata"]["ownerReferences"] = serde_json::json!([{
        "apiVersion": "platform.example.io/v1alpha1", "kind": "Microservice",
        "name": "x", "uid": "00000000-0000-4000-8000-000000000001", "controller": true,
    }]);
    let (ok, out) = create("plain", plain);
    assert!(ok, "a plain Deployment refused: {out}");
    let (ok, out) = create(
        "namespace",
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": format!("{}-placed", ns.name)}}),
    );
    assert!(ok, "an ordinary namespace refused: {out}");
    std::fs::remove_dir_all(&dir).ok();
}

/// The operator may delete a Deployment or Service only when a Microservice
/// controls it: the leftovers of an earlier Microservice of the same name
/// (reconciler.rs: children_of_an_earlier_microservice_of_the_same_name_are_replaced),
/// which the shipped RBAC must let it remove. Anyone else's, or anything
/// in kube-system, is refused by the shipped admission policy. Server-side
/// dry runs as that ServiceAccount on member-1.
#[tokio::test]
async fn a_leaked_member_credential_deletes_only_what_a_microservice_controls() {
    apply("member-1", "member");
    let (ns, dir, sa) = as_operator("member-1", "deploy-deletes").await;
    let owner = serde_json::json!([{
        "apiVersion": "platform.example.io/v9", "kind": "Microservice",
        "name": "web", "uid": "00000000-0000-4000-8000-00000000dead", "controller": true,
    }]);
    // A version the member does not serve: the garbage collector cannot
    // resolve the owner and leaves these, as a lagging one does.
    let mut leftover = deployment("leftover", &ns.name, serde_json::json!({}));
    leftover["metadata"]["ownerReferences"] = owner.clone();
    let leftover_service = serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "leftover", "namespace": ns.name, "ownerReferences": owner.clone()},
        "spec": {"selector": {"app": "leftover"}, "ports": [{"port": 8080}]},
    });
    let stranger = deployment("stranger", &ns.name, serde_json::json!({}));
    let stranger_service = serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "stranger", "namespace": ns.name},
        "spec": {"selector": {"app": "stranger"}, "ports": [{"port": 8080}]},
    });
    for (name, v) in [
        ("leftover", leftover),
        ("leftover-svc", leftover_service),
        ("stranger", stranger),
        ("stranger-svc", stranger_service),
    ] {
        let (ok, out) = k("member-1", &["create", "-f", &manifest(&dir, name, v)]);
        assert!(ok, "{name}: {out}");
    }
    let delete = |kind: &str, ns: &str, name: &str| {
        k_with(&sa, &["delete", kind, name, "-n", ns, "--dry-run=server"])
    };
    let refused = |out: &str| out.contains("flotilla deletes");
    support::eventually(
        "the delete policy in force",
        Duration::from_secs(30),
        || {
            let (ok, out) = delete("deployment", &ns.name, "stranger");
            async move { (!ok && refused(&out)).then_some(()) }
        },
    )
    .await;
    let (ok, out) = delete("service", &ns.name, "stranger");
    assert!(!ok && refused(&out), "another's Service deleted: {out}");
    // A Microservice's leftover, but in kube-system.
    let system_name = format!("{}-leftover", ns.name);
    let mut in_system = deployment(&system_name, "kube-system", serde_json::json!({}));
    in_system["metadata"]["ownerReferences"] = owner.clone();
    let (ok, out) = k(
        "member-1",
        &["create", "-f", &manifest(&dir, "in-system", in_system)],
    );
    assert!(ok, "kube-system leftover: {out}");
    let (ok, out) = delete("deployment", "kube-system", &system_name);
    k(
        "member-1",
        &["delete", "deployment", &system_name, "-n", "kube-system"],
    );
    assert!(
        !ok && refused(&out),
        "a Deployment in kube-system deleted: {out}"
    );
    // Nor can it take another's over, or hand it to a Microservice.
    let (ok, out) = k_with(
        &sa,
        &[
            "label",
            "deployment",
            "stranger",
            "-n",
            &ns.name,
            "x=y",
            "--dry-run=server",
        ],
    );
    assert!(
        !ok && out.contains("a Microservice controls"),
        "another's Deployment updated: {out}"
    );
    let adopt = serde_json::json!({"metadata": {"ownerReferences": [{
        "apiVersion": "platform.example.io/v1alpha1", "kind": "Microservice",
        "name": "web", "uid": "00000000-0000-4000-8000-000000000002", "controller": true,
    }]}})
    .to_string();
    let (ok, out) = k_with(
        &sa,
        &[
            "patch",
            "service",
            "stranger",
            "-n",
            &ns.name,
            "--type=merge",
            "-p",
            &adopt,
            "--dry-run=server",
        ],
    );
    assert!(
        !ok && out.contains("a Microservice controls"),
        "another's Service adopted: {out}"
    );
    let (ok, out) = k_with(
        &sa,
        &[
            "label",
            "deployment",
            "leftover",
            "-n",
            &ns.name,
            "x=y",
            "--dry-run=server",
        ],
    );
    assert!(
        ok,
        "a Microservice's own Deployment could not be updated: {out}"
    );
    for kind in ["deployment", "service"] {
        let (ok, out) = delete(kind, &ns.name, "leftover");
        assert!(ok, "a Microservice's leftover {kind} refused: {out}");
    }
    std::fs::remove_dir_all(&dir).ok();
}
