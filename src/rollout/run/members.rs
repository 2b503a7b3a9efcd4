//! The fleet controller's writes to member clusters: each FleetMicroservice's
//! Microservice, created, replaced or deleted. The clients are fenced by the
//! home cluster's term, not the member's: the member's own leader stays the
//! only writer of status and children.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;

use super::error::{Result, RolloutError};
use crate::crd::{Microservice, MicroserviceSpec};
use crate::fleet::client_budget::Budget;
use crate::fleet::cluster::fleet_user_agent;
use crate::fleet::member_clients::MemberClients;
use crate::fleet::runtime::Credentials;
use crate::lease::fence::Fence;
use crate::rollout::spec::{FLEET_LABEL, REVISION_ANNOTATION};
pub use crate::rollout::write_log::Written;
use crate::telemetry::metrics::METRICS;

pub struct Members {
    /// Fenced by the home cluster's term, with the fleet controller's agent.
    clients: MemberClients,
}

impl Members {
    pub fn new(
        fence: Fence,
        replica_id: &str,
        credentials: watch::Receiver<BTreeMap<String, Credentials>>,
    ) -> std::result::Result<Self, String> {
        let agent = fleet_user_agent(replica_id)?;
        Ok(Members {
            clients: MemberClients::new(credentials, agent, Budget::FLEET_WRITES, Some(fence)),
        })
    }

    async fn client(&self, cluster: &str) -> Result<Client> {
        self.clients
            .get(cluster)
            .await
            .map_err(|reason| RolloutError::NoClient {
                cluster: cluster.into(),
                reason,
            })
    }

    /// Makes `cluster`'s Microservice hold `spec` from `revision`: creates
    /// it (and its namespace) if missing, replaces it conditionally if it
    /// is ours and differs, and never touches one that is not ours.
    pub async fn apply(
        &self,
        cluster: &str,
        namespace: &str,
        name: &str,
        owner: &str,
        revision: &str,
        spec: &MicroserviceSpec,
    ) -> Result<Written> {
        let client = self.client(cluster).await?;
        let api: Api<Microservice> = Api::namespaced(client.clone(), namespace);
        let err = |verb| move |e| RolloutError::member(cluster, verb, e);
        let found = api.get_opt(name).await.map_err(err("get"))?;
        let count = |verb: &str| METRICS.rollout_member_writes_total.inc(&[cluster, verb]);
        match found {
            Some(ms) => {
                if ms.labels().get(FLEET_LABEL).map(String::as_str) != Some(owner) {
                    return Ok(Written::NotOurs);
                }
                let at = ms
                    .annotations()
                    .get(REVISION_ANNOTATION)
                    .map(String::as_str);
                if at == Some(revision) && ms.spec == *spec {
                    return Ok(Written::Unchanged);
                }
                let mut next = ms.clone();
                next.spec = spec.clone();
                next.annotations_mut()
                    .insert(REVISION_ANNOTATION.into(), revision.into());
                stamp_trace(&mut next);
                let stored = api
                    .replace(name, &PostParams::default(), &next)
                    .await
                    .map_err(err("replace"))?;
                count("replace");
                Ok(if stored.spec == *spec {
                    Written::Replaced
                } else {
                    Written::Altered
                })
            }
            None => {
                let mut ms = Microservice::new(name, spec.clone());
                ms.metadata.namespace = Some(namespace.into());
                ms.labels_mut().insert(FLEET_LABEL.into(), owner.into());
                ms.annotations_mut()
                    .insert(REVISION_ANNOTATION.into(), revision.into());
                stamp_trace(&mut ms);
                let created = match api.create(&PostParams::default(), &ms).await {
                    // The namespace is missing: create it, then try once more.
                    Err(kube::Error::Api(s)) if s.code == 404 => {
                        ensure_namespace(&client, namespace)
                            .await
                            .map_err(err("create namespace for"))?;
                        api.create(&PostParams::default(), &ms).await
                    }
                    other => other,
                };
                let stored = created.map_err(err("create"))?;
                count("create");
                Ok(if stored.spec == *spec {
                    Written::Created
                } else {
                    Written::Altered
                })
            }
        }
    }

    /// Deletes `cluster`'s Microservice if it is ours, on the uid and
    /// resourceVersion just read. True when, as read live, nothing of ours
    /// is there (any more); false when a delete was sent.
    pub async fn delete(
        &self,
        cluster: &str,
        namespace: &str,
        name: &str,
        owner: &str,
    ) -> Result<bool> {
        let client = self.client(cluster).await?;
        let api: Api<Microservice> = Api::namespaced(client, namespace);
        let err = |verb| move |e| RolloutError::member(cluster, verb, e);
        let Some(ms) = api.get_opt(name).await.map_err(err("get"))? else {
            return Ok(true);
        };
        if ms.labels().get(FLEET_LABEL).map(String::as_str) != Some(owner) {
            return Ok(true);
        }
        if ms.metadata.deletion_timestamp.is_some() {
            // Going already (a finalizer holds it): no DELETE every round.
            return Ok(false);
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: ms.uid(),
                resource_version: ms.resource_version(),
            }),
            ..DeleteParams::default()
        };
        match api.delete(name, &params).await {
            Ok(_) => {
                METRICS
                    .rollout_member_writes_total
                    .inc(&[cluster, "delete"]);
                Ok(false)
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(true),
            Err(e) => Err(err("delete")(e)),
        }
    }
}

/// The write's span, for the member's reconcile to link to.
fn stamp_trace(ms: &mut Microservice) {
    match crate::telemetry::links::traceparent(&tracing::Span::current()) {
        Some(tp) => {
            ms.annotations_mut()
                .insert(crate::telemetry::links::TRACEPARENT_ANNOTATION.into(), tp);
        }
        None => {
            ms.annotations_mut()
                .remove(crate::telemetry::links::TRACEPARENT_ANNOTATION);
        }
    }
}

/// The fleet creates a missing namespace (and never deletes one): a
/// placement must not depend on someone preparing every member by hand.
async fn ensure_namespace(client: &Client, namespace: &str) -> Result<(), kube::Error> {
    let api: Api<Namespace> = Api::all(client.clone());
    let mut ns = Namespace::default();
    ns.metadata.name = Some(namespace.into());
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}
