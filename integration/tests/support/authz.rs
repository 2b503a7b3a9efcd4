//! Kubernetes identities for the authorization tests: ServiceAccounts in
//! the home cluster, tokens the home apiserver issues for them (and one it
//! signed but that has expired), and Roles that grant them rights.
#![allow(dead_code)]

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use super::{fleet_dir, from_json};

/// Creates ServiceAccount `ns/name` in home; returns its uid.
pub async fn service_account(home: &Client, ns: &str, name: &str) -> String {
    let sa: ServiceAccount = from_json(json!({"metadata": {"name": name}}));
    Api::<ServiceAccount>::namespaced(home.clone(), ns)
        .create(&PostParams::default(), &sa)
        .await
        .expect("create ServiceAccount")
        .metadata
        .uid
        .expect("uid")
}

/// A token the home apiserver issues for `ns/name` (TokenRequest).
pub async fn token(home: &Client, ns: &str, name: &str) -> String {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::<ServiceAccount>::namespaced(home.clone(), ns)
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .expect("TokenRequest")
        .status
        .and_then(|s| s.token)
        .expect("token")
}

/// Role `name` in `ns` with `rules`, bound to ServiceAccount `sa_ns/sa`.
pub async fn grant(
    home: &Client,
    ns: &str,
    name: &str,
    rules: serde_json::Value,
    (sa_ns, sa): (&str, &str),
) {
    let role: Role = from_json(json!({"metadata": {"name": name}, "rules": rules}));
    Api::<Role>::namespaced(home.clone(), ns)
        .create(&PostParams::default(), &role)
        .await
        .expect("create Role");
    let binding: RoleBinding = from_json(json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": sa_ns}],
    }));
    Api::<RoleBinding>::namespaced(home.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await
        .expect("create RoleBinding");
}

/// Binds the shipped ClusterRole `role` to `sa_ns/sa` in `ns`.
pub async fn bind_cluster_role(home: &Client, ns: &str, role: &str, (sa_ns, sa): (&str, &str)) {
    let binding: RoleBinding = from_json(json!({
        "metadata": {"name": format!("{role}-{sa}")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": sa_ns}],
    }));
    Api::<RoleBinding>::namespaced(home.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await
        .expect("create RoleBinding");
}

/// `deploy/home/user-roles.yaml`, applied to home as a user would.
pub fn apply_user_roles() {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/home/user-roles.yaml");
    // Tests running at once may each create them first: the loser of
    // that race is told AlreadyExists, and the next apply updates.
    let mut last = None;
    for _ in 0..3 {
        let out = super::output_within(
            std::process::Command::new(super::kubectl())
                .arg("--kubeconfig")
                .arg(super::kubeconfig_path("home"))
                .args(["apply", "-f"])
                .arg(&file),
            std::time::Duration::from_secs(60),
        );
        if out.status.success() {
            return;
        }
        last = Some(out);
    }
    panic!("kubectl apply: {last:?}");
}

/// Waits until the home cluster's RBAC says `sa_ns/sa` may `verb`
/// `resource` in `ns` (`allowed`) or may not: its authorizer's cache
/// follows a RoleBinding change a moment later.
pub async fn until_rbac_says(
    home: &Client,
    (sa_ns, sa): (&str, &str),
    verb: &str,
    resource: &str,
    ns: &str,
    allowed: bool,
) {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(format!("system:serviceaccount:{sa_ns}:{sa}")),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{sa_ns}"),
            ]),
            resource_attributes: Some(ResourceAttributes {
                group: Some("platform.example.io".into()),
                resource: Some(resource.into()),
                verb: Some(verb.into()),
                namespace: Some(ns.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    until_answer(home, review, "RBAC to follow the change", |r| {
        r.status.is_some_and(|s| s.allowed == allowed)
    })
    .await;
}

/// Asks the home apiserver `review` (a TokenReview or an access review)
/// until its answer `holds`, for up to 20 s.
async fn until_answer<K>(home: &Client, review: K, what: &str, holds: impl Fn(K) -> bool)
where
    K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned,
    K::DynamicType: Default,
{
    let api = Api::<K>::all(home.clone());
    let holds = &holds;
    super::eventually(what, std::time::Duration::from_secs(20), || {
        let api = api.clone();
        let review = review.clone();
        async move {
            let got = api.create(&PostParams::default(), &review).await.ok()?;
            holds(got).then_some(())
        }
    })
    .await;
}

/// Waits until the home cluster refuses `token` (its ServiceAccount was
/// deleted: the authenticator's cache follows a moment later).
pub async fn until_refused(home: &Client, token: &str) {
    use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: token.to_string(),
            audiences: None,
        },
        ..Default::default()
    };
    until_answer(home, review, "the token refused", |r| {
        r.status.is_some_and(|s| s.authenticated != Some(true))
    })
    .await;
}

/// Takes the right back: the RoleBinding goes.
pub async fn revoke(home: &Client, ns: &str, name: &str) {
    Api::<RoleBinding>::namespaced(home.clone(), ns)
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete RoleBinding");
}

/// The rules a team's reader and releaser holds, by verbs on Microservices
/// and on FleetMicroservices.
pub fn rules(microservices: &[&str], fleet: &[&str]) -> serde_json::Value {
    let rule = |resource: &str, verbs: &[&str]| json!({"apiGroups": ["platform.example.io"], "resources": [resource], "verbs": verbs});
    [
        ("microservices", microservices),
        ("fleetmicroservices", fleet),
    ]
    .into_iter()
    .filter(|(_, verbs)| !verbs.is_empty())
    .map(|(r, verbs)| rule(r, verbs))
    .collect()
}

fn base64url(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

/// A ServiceAccount token for `ns/sa` signed with the home cluster's own
/// key, well formed, that expired an hour ago: only its age is wrong.
pub fn expired_token(ns: &str, sa: &str, uid: &str) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let header = json!({"alg": "RS256", "typ": "JWT"});
    let claims = json!({
        "iss": "https://home.fleet.invalid",
        "aud": ["https://home.fleet.invalid"],
        "sub": format!("system:serviceaccount:{ns}:{sa}"),
        "iat": now - 7200,
        "nbf": now - 7200,
        "exp": now - 3600,
        "kubernetes.io": {"namespace": ns, "serviceaccount": {"name": sa, "uid": uid}},
    });
    let input = format!(
        "{}.{}",
        base64url(header.to_string().as_bytes()),
        base64url(claims.to_string().as_bytes())
    );
    let dir = tempdir();
    std::fs::write(dir.join("input"), &input).expect("write");
    let out = std::process::Command::new("openssl")
        .args(["dgst", "-sha256", "-sign"])
        .arg(fleet_dir().join("pki/sa.key"))
        .arg(dir.join("input"))
        .output()
        .expect("openssl");
    assert!(out.status.success(), "openssl: {out:?}");
    std::fs::remove_dir_all(&dir).ok();
    format!("{input}.{}", base64url(&out.stdout))
}

fn tempdir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("flotilla-jwt-{:08x}", rand::random::<u32>()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// A client of `cluster` that authenticates with `token` alone (no client
/// certificate), as a team's CI identity would.
pub async fn client_as(cluster: &str, token: &str) -> Client {
    use kube::config::{AuthInfo, KubeConfigOptions, Kubeconfig};
    let kubeconfig = Kubeconfig::read_from(super::kubeconfig_path(cluster)).expect("kubeconfig");
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("kubeconfig");
    config.auth_info = AuthInfo {
        token: Some(token.to_string().into()),
        ..AuthInfo::default()
    };
    Client::try_from(config).expect("client")
}
