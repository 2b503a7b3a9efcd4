//! Fleet rollouts on the local fleet: replicas with labelled members, a
//! FleetMicroservice in home, and what the members' audit logs say the
//! fleet controller wrote.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use super::replicas::*;
use super::{TestNamespace, client, ensure_fleet_crd, eventually, fleet_dir, from_json};
use flotilla::crd::Microservice;
use flotilla::rollout::spec::{FleetMicroservice, REVISION_ANNOTATION, RolloutPhase};

pub struct RolloutFleet {
    pub home: Client,
    pub members: BTreeMap<&'static str, Client>,
    pub namespace: String,
    pub guards: Vec<TestNamespace>,
    pub replicas: Replicas,
}

/// Three replicas over the three members, each member labelled by its
/// side file (`labels`: member -> YAML), with the FleetMicroservice CRD in home.
pub async fn rollout_fleet(prefix: &str, labels: &[(&str, &str)]) -> RolloutFleet {
    rollout_fleet_with(prefix, labels, &[]).await
}

/// The same, with further gRPC flags (tokens) for every replica.
pub async fn rollout_fleet_with(
    prefix: &str,
    labels: &[(&str, &str)],
    grpc_args: &[String],
) -> RolloutFleet {
    rollout_fleet_env(prefix, labels, grpc_args, &[]).await
}

/// The same, with further environment (test hooks) for every replica.
pub async fn rollout_fleet_env(
    prefix: &str,
    labels: &[(&str, &str)],
    grpc_args: &[String],
    env: &[(&str, &str)],
) -> RolloutFleet {
    rollout_fleet_prepared(prefix, labels, |replicas| {
        replicas.grpc_args.extend(grpc_args.iter().cloned());
        replicas
            .env
            .extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    })
    .await
}

/// The same, with the replicas' setup changed before they start (e.g. a
/// member reached through a proxy).
pub async fn rollout_fleet_prepared(
    prefix: &str,
    labels: &[(&str, &str)],
    prepare: impl FnOnce(&mut Replicas),
) -> RolloutFleet {
    let members = member_clients().await;
    let home = client("home").await;
    ensure_fleet_crd(&home).await;
    let (namespace, guards) = namespaces(&members, prefix).await;
    let mut replicas = Replicas::new(&namespace, &MEMBERS);
    prepare(&mut replicas);
    for (member, yaml) in labels {
        std::fs::write(replicas.dir.join(format!("{member}.labels")), yaml).expect("labels file");
    }
    for id in REPLICA_IDS {
        replicas.start(id);
    }
    balanced(&members, &replicas.lease_name(), &REPLICA_IDS).await;
    let fleet = RolloutFleet {
        home,
        members,
        namespace,
        guards,
        replicas,
    };
    fleet.rollout_leader().await;
    fleet
}

impl RolloutFleet {
    pub fn api(&self) -> Api<FleetMicroservice> {
        Api::namespaced(self.home.clone(), &self.namespace)
    }

    pub fn member_api(&self, member: &str) -> Api<Microservice> {
        Api::namespaced(self.members[member].clone(), &self.namespace)
    }

    /// The replica holding the home cluster's rollout Lease.
    pub async fn rollout_leader(&self) -> String {
        let lease = format!("{}-rollouts", self.replicas.lease_name());
        let api: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(self.home.clone(), &self.namespace);
        eventually("a rollout leader", Duration::from_secs(30), || {
            let api = api.clone();
            let lease = lease.clone();
            async move {
                api.get_opt(&lease)
                    .await
                    .ok()??
                    .spec?
                    .holder_identity
                    .filter(|h| !h.is_empty())
            }
        })
        .await
    }

    pub async fn create(&self, fms: serde_json::Value) -> FleetMicroservice {
        let obj: FleetMicroservice = from_json(fms);
        self.api()
            .create(&PostParams::default(), &obj)
            .await
            .expect("create FleetMicroservice")
    }

    /// Creates the FleetMicroservice and waits for its first `Complete`.
    pub async fn create_complete(&self, fms: serde_json::Value) -> FleetMicroservice {
        let name = fms["metadata"]["name"]
            .as_str()
            .expect("a name")
            .to_string();
        self.create(fms).await;
        self.wait_phase(&name, RolloutPhase::Complete, Duration::from_secs(120))
            .await
    }

    pub async fn set_image(&self, name: &str, image: &str) {
        self.api()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"template": {"image": image}}})),
            )
            .await
            .expect("patch image");
    }

    /// A new image with a new per-cluster progress deadline, in one edit.
    pub async fn set_image_and_deadline(&self, name: &str, image: &str, deadline: &str) {
        self.api()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {
                    "template": {"image": image},
                    "rollout": {"progressDeadline": deadline},
                }})),
            )
            .await
            .expect("patch image and deadline");
    }

    /// Waits for `phase` at the object's current generation.
    pub async fn wait_phase(
        &self,
        name: &str,
        phase: RolloutPhase,
        limit: Duration,
    ) -> FleetMicroservice {
        let api = self.api();
        eventually(&format!("{name} {phase:?}"), limit, || {
            let api = api.clone();
            async move {
                let f = api.get(name).await.ok()?;
                let st = f.status.as_ref()?;
                (st.observed_generation == f.metadata.generation && st.phase == Some(phase))
                    .then_some(f)
            }
        })
        .await
    }

    /// The member's Microservice, once it is done at `revision`: observed at
    /// its generation and Available.
    pub async fn done_at(
        &self,
        member: &str,
        name: &str,
        revision: &str,
        limit: Duration,
    ) -> Microservice {
        let api = self.member_api(member);
        eventually(
            &format!("{member}/{name} done at {revision}"),
            limit,
            || {
                let api = api.clone();
                async move {
                    let ms = api.get(name).await.ok()?;
                    (ms.metadata.annotations.as_ref()?.get(REVISION_ANNOTATION)? == revision
                        && done(&ms))
                    .then_some(ms)
                }
            },
        )
        .await
    }
}

pub fn done(ms: &Microservice) -> bool {
    let Some(st) = &ms.status else { return false };
    st.observed_generation == ms.metadata.generation
        && flotilla::domain::conditions::find(&st.conditions, "Available")
            .is_some_and(|c| c.status == "True" && c.observed_generation == ms.metadata.generation)
}

/// A FleetMicroservice manifest: canary wave `ring=canary`, then the rest.
pub fn fleet_microservice(
    name: &str,
    image: &str,
    rollout: serde_json::Value,
) -> serde_json::Value {
    json!({
        "apiVersion": "platform.example.io/v1alpha1",
        "kind": "FleetMicroservice",
        "metadata": {"name": name},
        "spec": {
            "template": {"image": image, "port": 8080, "replicas": 1},
            "rollout": rollout,
        }
    })
}

/// One Microservice write of the fleet controller, from a member's audit log.
#[derive(Debug, Clone)]
pub struct FleetWrite {
    pub received: jiff::Timestamp,
    pub user_agent: String,
    pub verb: String,
    pub name: String,
    /// The revision annotation of the written object (none for deletes).
    pub revision: Option<String>,
    /// The image it wrote (none for deletes).
    pub image: Option<String>,
    /// The address it came from.
    pub source: String,
}

/// The fleet controller's successful Microservice writes in `namespace` of
/// `cluster`, in the order the apiserver received them.
pub fn fleet_writes(cluster: &str, namespace: &str) -> Vec<FleetWrite> {
    let path = fleet_dir()
        .join("logs")
        .join(format!("{cluster}-audit.log"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("audit log {}: {e}", path.display()));
    // The logs grow large; parse only the lines that can match.
    let mut out: Vec<FleetWrite> = text
        .lines()
        .filter(|l| l.contains("flotilla-fleet/") && l.contains(namespace))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["objectRef"]["namespace"] == namespace)
        .filter(|e| e["objectRef"]["resource"] == "microservices")
        .filter(|e| e["objectRef"]["subresource"].is_null())
        .filter(|e| {
            matches!(
                e["verb"].as_str(),
                Some("create" | "update" | "patch" | "delete")
            )
        })
        .filter(|e| {
            e["userAgent"]
                .as_str()
                .is_some_and(|u| u.starts_with("flotilla-fleet/"))
        })
        .filter(|e| {
            e["responseStatus"]["code"]
                .as_u64()
                .is_some_and(|c| c < 300)
        })
        .filter_map(|e| {
            Some(FleetWrite {
                received: e["requestReceivedTimestamp"].as_str()?.parse().ok()?,
                user_agent: e["userAgent"].as_str()?.to_string(),
                verb: e["verb"].as_str()?.to_string(),
                name: e["objectRef"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                revision: e["requestObject"]["metadata"]["annotations"][REVISION_ANNOTATION]
                    .as_str()
                    .map(str::to_string),
                image: e["requestObject"]["spec"]["image"]
                    .as_str()
                    .map(str::to_string),
                source: super::source_ip(&e),
            })
        })
        .collect();
    out.sort_by_key(|w| w.received);
    out
}

/// `flotilla ARGS` to its end within `limit`: exit code, stdout, stderr.
pub async fn flotilla(args: &[&str], limit: Duration) -> (i32, String, String) {
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start flotilla");
    finish(child, limit).await
}

/// `flotilla rollout wait KEY --timeout 90s --server SERVER`, within 120 s.
pub async fn rollout_wait(key: &str, server: &str) -> (i32, String, String) {
    flotilla(
        &[
            "rollout",
            "wait",
            key,
            "--timeout",
            "90s",
            "--server",
            server,
        ],
        Duration::from_secs(120),
    )
    .await
}

pub async fn finish(child: std::process::Child, limit: Duration) -> (i32, String, String) {
    let pid = child.id();
    let out = tokio::time::timeout(
        limit,
        tokio::task::spawn_blocking(move || child.wait_with_output().expect("wait output")),
    )
    .await
    .unwrap_or_else(|_| panic!("pid {pid} still running after {limit:?}"))
    .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The fleet controller's writes of `revision` to `member`.
pub fn writes_of(member: &str, namespace: &str, revision: &str) -> usize {
    fleet_writes(member, namespace)
        .iter()
        .filter(|w| w.revision.as_deref() == Some(revision))
        .count()
}

/// The fleet controller's writes so far, summed over the running replicas:
/// (home writes by kind, member writes).
pub async fn controller_writes(replicas: &Replicas) -> (BTreeMap<String, f64>, f64) {
    let mut home = BTreeMap::new();
    let mut members = 0.0;
    for id in REPLICA_IDS {
        if !replicas.metrics_ports.contains_key(id) {
            continue;
        }
        let Some((_, body)) =
            super::http_get(&format!("{}/metrics", replicas.metrics_url(id))).await
        else {
            continue;
        };
        for line in body.lines() {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let value: f64 = value.parse().unwrap_or(0.0);
            if let Some(rest) = series.strip_prefix("flotilla_rollout_home_writes_total{kind=\"") {
                *home
                    .entry(rest.trim_end_matches("\"}").to_string())
                    .or_insert(0.0) += value;
            } else if series.starts_with("flotilla_rollout_member_writes_total{") {
                members += value;
            }
        }
    }
    (home, members)
}

/// The single-writer property of the fleet controller, from the
/// apiservers' own records: every write it made (home: FleetMicroservices,
/// their status, ControllerRevisions and Events in `namespace`; members:
/// Microservices) was received while its writer held the home Lease
/// `lease`, within `renew_deadline` (plus `slack`) of its last renewal.
/// Returns how many writes were checked.
pub fn assert_fleet_writes_inside_home_terms(
    namespace: &str,
    lease: &str,
    renew_deadline: Duration,
    slack: Duration,
) -> usize {
    let leases = super::lease_writes("home", namespace, lease);
    let writes = fleet_controller_writes(namespace);
    let limit = jiff::SignedDuration::try_from(renew_deadline + slack).expect("duration");
    for (cluster, writer, at, what) in &writes {
        let last = leases.iter().rev().find(|l| l.received <= *at);
        let renewed = leases
            .iter()
            .rev()
            .find(|r| r.received <= *at && r.writer == *writer && r.holder == *writer);
        let ok = last.is_some_and(|l| l.holder == *writer)
            && renewed.is_some_and(|r| at.duration_since(r.received) <= limit);
        assert!(
            ok,
            "split brain: {writer} wrote {what} in {cluster} at {at} outside its home term; \
             last home Lease write before it: {last:?}"
        );
    }
    writes.len()
}

/// Every write the fleet controller made for `namespace`, wherever it
/// landed: (cluster, writer, received, what). Home: FleetMicroservices,
/// their status, ControllerRevisions and Events; members: Microservices.
pub fn fleet_controller_writes(namespace: &str) -> Vec<(String, String, jiff::Timestamp, String)> {
    let mut writes: Vec<(String, String, jiff::Timestamp, String)> = Vec::new();
    for member in MEMBERS {
        for w in fleet_writes(member, namespace) {
            let writer = w
                .user_agent
                .trim_start_matches("flotilla-fleet/")
                .to_string();
            writes.push((
                member.to_string(),
                writer,
                w.received,
                format!("{} {}", w.verb, w.name),
            ));
        }
    }
    for e in super::audit_events_with("home", namespace) {
        let resource = e["objectRef"]["resource"].as_str().unwrap_or_default();
        if e["objectRef"]["namespace"] != namespace
            || !matches!(
                resource,
                "fleetmicroservices" | "controllerrevisions" | "events"
            )
            || !matches!(
                e["verb"].as_str(),
                Some("create" | "update" | "patch" | "delete")
            )
        {
            continue;
        }
        let Some(writer) = e["userAgent"]
            .as_str()
            .and_then(|u| u.strip_prefix("flotilla/"))
        else {
            continue;
        };
        // A user's pause, resume or undo (served by any replica, no term
        // fences it) and the DNS writer's marks (fenced by the DNS Lease)
        // are not the rollout controller's writes.
        if [
            flotilla::rollout::run::edits::FIELD_MANAGER,
            flotilla::dns::writer::FIELD_MANAGER,
        ]
        .iter()
        .any(|m| written_by(&e, m))
        {
            continue;
        }
        let writer = writer
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string();
        let what = format!(
            "{} {} {}",
            e["verb"].as_str().unwrap_or_default(),
            resource,
            e["objectRef"]["name"].as_str().unwrap_or_default()
        );
        writes.push(("home".into(), writer, super::received(&e), what));
    }
    writes
}

/// Whether a home audit event's request named `field_manager`.
pub fn written_by(e: &serde_json::Value, field_manager: &str) -> bool {
    e["requestURI"]
        .as_str()
        .is_some_and(|u| u.contains(&format!("fieldManager={field_manager}")))
}
