//! The I/O of `cluster add` and `remove`: every decision is `plan`'s; this
//! reads both clusters, checks before it writes anything, then applies
//! server-side (so a second run changes nothing) and prints each step.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use kube::api::{Api, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::Scope;
use kube::{Client, Config};

use super::JoinError;
use super::manifests::{self, Manifest};
use super::plan::{self, CLUSTER_ID_ANNOTATION, SYSTEM_NAMESPACE, TOKEN_SECRET};
use crate::fleet::registry::{SECRET_KEY, SECRET_LABEL};

/// The field manager of every write, so an audit log and managedFields
/// name the command.
const MANAGER: &str = "flotilla-cluster-add";
/// How long the member's token controller gets to fill in the token.
const TOKEN_WAIT: Duration = Duration::from_secs(60);

/// A kubeconfig file and, optionally, the context to use from it.
#[derive(Debug, Clone)]
pub struct KubeconfigRef {
    pub path: PathBuf,
    pub context: Option<String>,
}

/// `flotilla cluster add`.
#[derive(Debug, Clone)]
pub struct Add {
    pub name: String,
    pub member: KubeconfigRef,
    /// The URL the operator dials, when not the member kubeconfig's.
    pub member_server: Option<String>,
    pub labels: Vec<String>,
    pub home: KubeconfigRef,
    pub members_namespace: String,
    pub timeout: Duration,
}

/// `flotilla cluster remove`.
#[derive(Debug, Clone)]
pub struct Remove {
    pub name: String,
    pub home: KubeconfigRef,
    pub members_namespace: String,
    /// With `--purge`: the member, whose token and RBAC are deleted too.
    pub purge: Option<KubeconfigRef>,
    pub timeout: Duration,
}

fn api_err(
    cluster: &'static str,
    action: impl Into<String>,
) -> impl FnOnce(kube::Error) -> JoinError {
    let action = action.into();
    move |source| JoinError::Api {
        cluster,
        action,
        source,
    }
}

/// The raw kubeconfig and the client built from it.
async fn open(r: &KubeconfigRef) -> Result<(Kubeconfig, Client), JoinError> {
    let shown = r.path.display();
    let kc = Kubeconfig::read_from(&r.path)
        .map_err(|e| JoinError::Kubeconfig(format!("{shown}: {e}")))?;
    let options = KubeConfigOptions {
        context: r.context.clone(),
        ..Default::default()
    };
    let mut config = Config::from_custom_kubeconfig(kc.clone(), &options)
        .await
        .map_err(|e| JoinError::Kubeconfig(format!("{shown}: {e}")))?;
    config.connect_timeout = Some(Duration::from_secs(10));
    config.read_timeout = Some(Duration::from_secs(30));
    config.write_timeout = Some(Duration::from_secs(30));
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(MANAGER),
    ));
    let client =
        Client::try_from(config).map_err(|e| JoinError::Kubeconfig(format!("{shown}: {e}")))?;
    Ok((kc, client))
}

/// The server and CA (PEM, when the kubeconfig has one) of the context used.
fn server_and_ca(
    kc: &Kubeconfig,
    r: &KubeconfigRef,
) -> Result<(String, Option<Vec<u8>>), JoinError> {
    let shown = r.path.display();
    let context_name = r
        .context
        .clone()
        .or_else(|| kc.current_context.clone())
        .ok_or_else(|| {
            JoinError::Kubeconfig(format!("{shown}: no --context and no current-context"))
        })?;
    let context = kc
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.as_ref())
        .ok_or_else(|| JoinError::Kubeconfig(format!("{shown}: no context {context_name:?}")))?;
    let cluster = kc
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .and_then(|c| c.cluster.as_ref())
        .ok_or_else(|| {
            JoinError::Kubeconfig(format!("{shown}: no cluster {:?}", context.cluster))
        })?;
    let server = cluster
        .server
        .clone()
        .ok_or_else(|| JoinError::Kubeconfig(format!("{shown}: the cluster has no server")))?;
    let ca = match (
        &cluster.certificate_authority_data,
        &cluster.certificate_authority,
    ) {
        (Some(data), _) => Some(
            base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .map_err(|_| {
                    JoinError::Kubeconfig(format!(
                        "{shown}: certificate-authority-data is not base64"
                    ))
                })?,
        ),
        (None, Some(file)) => {
            let path = resolve(&r.path, file);
            Some(std::fs::read(&path).map_err(|e| {
                JoinError::Kubeconfig(format!(
                    "{shown}: certificate-authority {}: {}",
                    path.display(),
                    e.kind()
                ))
            })?)
        }
        (None, None) => None,
    };
    Ok((server, ca))
}

/// A kubeconfig's relative paths are relative to the kubeconfig.
fn resolve(kubeconfig: &Path, file: &str) -> PathBuf {
    let p = Path::new(file);
    if p.is_absolute() {
        return p.to_path_buf();
    }
    kubeconfig.parent().unwrap_or(Path::new(".")).join(p)
}

/// The cluster's ID: its kube-system namespace's UID.
async fn cluster_id(member: &Client) -> Result<String, JoinError> {
    let ns = Api::<Namespace>::all(member.clone())
        .get("kube-system")
        .await
        .map_err(api_err(
            "member",
            "read namespace kube-system (the cluster ID)",
        ))?;
    ns.metadata.uid.ok_or_else(|| {
        JoinError::Kubeconfig("the member's kube-system namespace has no uid".into())
    })
}

/// The registrations there are, by Secret name. The namespace must exist:
/// a list of a missing one is empty, not an error.
async fn registrations(
    home: &Client,
    namespace: &str,
) -> Result<BTreeMap<String, plan::Existing>, JoinError> {
    let there = Api::<Namespace>::all(home.clone())
        .get_opt(namespace)
        .await
        .map_err(api_err("home", format!("read namespace {namespace}")))?;
    if there.is_none() {
        return Err(JoinError::NoMembersNamespace(namespace.to_string()));
    }
    let secrets = Api::<Secret>::namespaced(home.clone(), namespace)
        .list(&Default::default())
        .await
        .map_err(api_err("home", format!("list Secrets in {namespace}")))?;
    Ok(secrets
        .items
        .into_iter()
        .filter_map(|s| {
            let labelled = s
                .metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.get(SECRET_LABEL).is_some_and(|v| v == "true"));
            let cluster_id = s
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(CLUSTER_ID_ANNOTATION).cloned());
            let server = s
                .data
                .as_ref()
                .and_then(|d| d.get(SECRET_KEY))
                .and_then(|k| plan::kubeconfig_server(&k.0));
            Some((
                s.metadata.name?,
                plan::Existing {
                    labelled,
                    cluster_id,
                    server,
                },
            ))
        })
        .collect())
}

/// What an apply did, from the resourceVersions before and after.
fn outcome(before: Option<&str>, after: Option<&str>) -> &'static str {
    match before {
        None => "created",
        Some(b) if Some(b) == after => "unchanged",
        Some(_) => "configured",
    }
}

/// The member's API for a manifest's kind, found by discovery.
async fn dynamic_api(member: &Client, m: &Manifest) -> Result<Api<DynamicObject>, JoinError> {
    let (group, version) = m
        .api_version
        .split_once('/')
        .unwrap_or(("", m.api_version.as_str()));
    let gvk = GroupVersionKind::gvk(group, version, &m.kind);
    let (resource, caps) = kube::discovery::pinned_kind(member, &gvk)
        .await
        .map_err(api_err("member", format!("discover {}", m.kind)))?;
    Ok(match (&caps.scope, &m.namespace) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(member.clone(), ns, &resource),
        _ => Api::all_with(member.clone(), &resource),
    })
}

/// Server-side apply of one manifest to the member.
async fn apply_manifest(member: &Client, m: &Manifest) -> Result<&'static str, JoinError> {
    let api = dynamic_api(member, m).await?;
    let before = api
        .get_opt(&m.name)
        .await
        .map_err(api_err("member", format!("read {}", m.describe())))?
        .and_then(|o| o.metadata.resource_version);
    // A CRD is upgraded on purpose, first (docs/lifecycle.md): an older CLI
    // adding a member must not take an existing one back.
    if m.kind == "CustomResourceDefinition" && before.is_some() {
        return Ok(
            "present, left as it is (CRD upgrades: kubectl apply --server-side -k deploy/crds/member)",
        );
    }
    let after = api
        .patch(
            &m.name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&m.object),
        )
        .await
        .map_err(api_err("member", format!("apply {}", m.describe())))?;
    Ok(outcome(
        before.as_deref(),
        after.metadata.resource_version.as_deref(),
    ))
}

/// The token Secret bound to the operator's ServiceAccount, once the
/// member's token controller has filled it in for the ServiceAccount that
/// exists now (a Secret of an earlier one holds a dead token, and the
/// controller deletes it): (token, ca.crt).
async fn issue_token(member: &Client) -> Result<(String, Option<Vec<u8>>), JoinError> {
    const TOKEN_TYPE: &str = "kubernetes.io/service-account-token";
    let api = Api::<Secret>::namespaced(member.clone(), SYSTEM_NAMESPACE);
    let account = Api::<ServiceAccount>::namespaced(member.clone(), SYSTEM_NAMESPACE)
        .get(plan::SERVICE_ACCOUNT)
        .await
        .map_err(api_err("member", "read the ServiceAccount"))?;
    let account_uid = account.metadata.uid.unwrap_or_default();
    let desired = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "type": TOKEN_TYPE,
        "metadata": {
            "name": TOKEN_SECRET,
            "namespace": SYSTEM_NAMESPACE,
            "labels": {"app.kubernetes.io/part-of": "flotilla"},
            "annotations": {"kubernetes.io/service-account.name": plan::SERVICE_ACCOUNT},
        },
    });
    let apply = || async {
        api.patch(
            TOKEN_SECRET,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&desired),
        )
        .await
        .map_err(api_err("member", "apply the token Secret"))
    };
    let read = || async {
        let s = api
            .get_opt(TOKEN_SECRET)
            .await
            .map_err(api_err("member", "read the token Secret"))?;
        match s {
            Some(s) if s.type_.as_deref() != Some(TOKEN_TYPE) => Err(JoinError::NotAToken),
            s => Ok(s),
        }
    };
    let created = read().await?.is_none();
    apply().await?;
    let deadline = tokio::time::Instant::now() + TOKEN_WAIT;
    loop {
        match read().await? {
            // The controller deleted one of an earlier ServiceAccount.
            None => {
                apply().await?;
            }
            Some(s) => {
                let bound = s
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("kubernetes.io/service-account.uid"))
                    .is_some_and(|uid| *uid == account_uid);
                let data = s.data.unwrap_or_default();
                let token = data
                    .get("token")
                    .and_then(|t| String::from_utf8(t.0.clone()).ok())
                    .filter(|t| !t.trim().is_empty());
                if let (true, Some(token)) = (bound, token) {
                    println!(
                        "member: Secret {SYSTEM_NAMESPACE}/{TOKEN_SECRET} {} (a token for ServiceAccount {SYSTEM_NAMESPACE}/{})",
                        if created { "created" } else { "kept" },
                        plan::SERVICE_ACCOUNT
                    );
                    return Ok((token, data.get("ca.crt").map(|c| c.0.clone())));
                }
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(JoinError::TokenNotIssued);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `work`, ended at `limit`: what is done stays done.
async fn within(
    limit: Duration,
    work: impl Future<Output = Result<(), JoinError>>,
) -> Result<(), JoinError> {
    tokio::time::timeout(limit, work)
        .await
        .map_err(|_| JoinError::Timeout(limit))?
}

/// Registers the member; prints each step.
pub async fn add(a: &Add) -> Result<(), JoinError> {
    within(a.timeout, add_inner(a)).await
}

async fn add_inner(a: &Add) -> Result<(), JoinError> {
    plan::check_name(&a.name)?;
    let labels = plan::parse_labels(&a.labels)?;
    let (member_kc, member) = open(&a.member).await?;
    let (kubeconfig_server, kubeconfig_ca) = server_and_ca(&member_kc, &a.member)?;
    let server = a.member_server.clone().unwrap_or(kubeconfig_server);
    plan::check_server(&server)?;
    let (_, home) = open(&a.home).await?;
    // Everything is checked before anything is written.
    let id = cluster_id(&member).await?;
    let registering = plan::check_registration(
        &a.name,
        &id,
        &server,
        &registrations(&home, &a.members_namespace).await?,
    )?;
    println!("member: cluster id {id} (the UID of its kube-system namespace)");
    for m in manifests::member()? {
        let what = apply_manifest(&member, &m).await?;
        println!("member: {} {what}", m.describe());
    }
    let (token, secret_ca) = issue_token(&member).await?;
    let ca = kubeconfig_ca.or(secret_ca).ok_or(JoinError::NoCa)?;
    let kubeconfig = plan::member_kubeconfig(&a.name, &server, &ca, &token)?;
    let secrets = Api::<Secret>::namespaced(home.clone(), &a.members_namespace);
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(a.name.clone()),
            namespace: Some(a.members_namespace.clone()),
            labels: Some(plan::secret_labels(&labels)),
            annotations: Some([(CLUSTER_ID_ANNOTATION.to_string(), id)].into()),
            ..Default::default()
        },
        data: Some([(SECRET_KEY.to_string(), ByteString(kubeconfig.into_bytes()))].into()),
        type_: Some("Opaque".into()),
        ..Default::default()
    };
    let before = secrets
        .get_metadata_opt(&a.name)
        .await
        .map_err(api_err("home", "read the member Secret"))?
        .and_then(|o| o.metadata.resource_version);
    let mut object =
        serde_json::to_value(&secret).map_err(|e| JoinError::Kubeconfig(e.to_string()))?;
    object["apiVersion"] = "v1".into();
    object["kind"] = "Secret".into();
    let after = secrets
        .patch(
            &a.name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&object),
        )
        .await
        .map_err(api_err("home", "apply the member Secret"))?;
    let shown: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!(
        "home: Secret {}/{} {} ({}; server {server}; labels {})",
        a.members_namespace,
        a.name,
        outcome(
            before.as_deref(),
            after.metadata.resource_version.as_deref()
        ),
        match registering {
            plan::Registering::New => "a new member",
            plan::Registering::Again => "the same member again",
        },
        if shown.is_empty() {
            "none".to_string()
        } else {
            shown.join(",")
        }
    );
    Ok(())
}

/// Deregisters the member, and with `purge` deletes its token and RBAC.
pub async fn remove(r: &Remove) -> Result<(), JoinError> {
    within(r.timeout, remove_inner(r)).await
}

async fn remove_inner(r: &Remove) -> Result<(), JoinError> {
    plan::check_name(&r.name)?;
    let (_, home) = open(&r.home).await?;
    let secrets = Api::<Secret>::namespaced(home.clone(), &r.members_namespace);
    // No namespace, no registrations: the home cluster was uninstalled first.
    let there = match registrations(&home, &r.members_namespace).await {
        Err(JoinError::NoMembersNamespace(_)) => BTreeMap::new(),
        other => other?,
    };
    let registered = there.get(&r.name);
    if registered.is_some_and(|e| !e.labelled) {
        return Err(JoinError::NotWrittenByAdd {
            name: r.name.clone(),
        });
    }
    // Everything is checked before anything is deleted.
    let member = match &r.purge {
        None => None,
        Some(m) => {
            let (kc, client) = open(m).await?;
            let (server, _) = server_and_ca(&kc, m)?;
            let found = cluster_id(&client).await?;
            plan::check_purge(&r.name, &found, &server, &there)?;
            Some(client)
        }
    };
    if registered.is_some() {
        secrets
            .delete(&r.name, &DeleteParams::default())
            .await
            .map_err(api_err("home", "delete the member Secret"))?;
        println!(
            "home: Secret {}/{} deleted: the operator lets go of the member",
            r.members_namespace, r.name
        );
    } else {
        println!(
            "home: Secret {}/{} not there: not registered",
            r.members_namespace, r.name
        );
    }
    let Some(member) = member else {
        println!("member: left as it is (its token and RBAC stay; --purge deletes them)");
        return Ok(());
    };
    let token = Api::<Secret>::namespaced(member.clone(), SYSTEM_NAMESPACE);
    let gone = delete_opt(
        token.delete(TOKEN_SECRET, &DeleteParams::default()).await,
        "the token Secret",
    )?;
    println!("member: Secret {SYSTEM_NAMESPACE}/{TOKEN_SECRET} {gone}");
    // Bindings before roles before the ServiceAccount: access ends first.
    let mut access: Vec<Manifest> = manifests::member()?
        .into_iter()
        .filter(Manifest::is_access)
        .collect();
    access.reverse();
    for m in access {
        let api = dynamic_api(&member, &m).await?;
        let gone = delete_opt(
            api.delete(&m.name, &DeleteParams::default())
                .await
                .map(|_| ()),
            &m.describe(),
        )?;
        println!("member: {} {gone}", m.describe());
    }
    println!("member: the CRD, the namespace and every workload stay (docs/lifecycle.md)");
    Ok(())
}

/// A delete that found nothing is done too.
fn delete_opt<T>(result: Result<T, kube::Error>, what: &str) -> Result<&'static str, JoinError> {
    match result {
        Ok(_) => Ok("deleted"),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok("not there"),
        Err(e) => Err(api_err("member", format!("delete {what}"))(e)),
    }
}
