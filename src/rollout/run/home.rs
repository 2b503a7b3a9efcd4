//! The fleet controller's writes to the home cluster: the finalizer, the
//! revisions (ControllerRevisions), the status and Events. Every one goes
//! through the home term's fence, and every one is conditional.

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::{Api, Client, Resource, ResourceExt};

use super::error::{Result, RolloutError};
use crate::rollout::events::Note;
use crate::rollout::revision::{Memory, Revision, RevisionData};
use crate::rollout::spec::{
    FAILED_ANNOTATION, FINALIZER, FLEET_LABEL, FleetMicroservice, FleetMicroserviceStatus,
    GOOD_BEFORE_ANNOTATION,
};
use crate::telemetry::metrics::METRICS;

pub struct Home {
    client: Client,
    /// Events go out from a task of their own: a round never waits on one.
    events: tokio::sync::mpsc::Sender<(Event, ObjectReference)>,
}

/// Events waiting to be sent; past this, new ones are dropped (Events are
/// a courtesy; the status is the record).
const EVENT_QUEUE: usize = 1024;

fn counted(kind: &str) {
    METRICS.rollout_home_writes_total.inc(&[kind]);
}

impl Home {
    pub fn new(client: Client, replica_id: &str) -> Self {
        let recorder = crate::telemetry::events::Sender::new(
            client.clone(),
            Reporter {
                controller: "flotilla-fleet".into(),
                instance: Some(replica_id.to_string()),
            },
        );
        let (events, mut pending) =
            tokio::sync::mpsc::channel::<(Event, ObjectReference)>(EVENT_QUEUE);
        // Lives as long as the controller; the fence refuses what it would
        // send outside a term of this replica.
        tokio::spawn(async move {
            while let Some((event, about)) = pending.recv().await {
                match recorder.publish(&event, &about).await {
                    Ok(()) => counted("event"),
                    Err(e) => tracing::debug!(error = %e, "could not publish event"),
                }
            }
        });
        Home { client, events }
    }

    fn api(&self, namespace: &str) -> Api<FleetMicroservice> {
        Api::namespaced(self.client.clone(), namespace)
    }

    fn revisions_api(&self, namespace: &str) -> Api<ControllerRevision> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// The object as the apiserver has it now (a quorum read, #59).
    pub async fn read(&self, namespace: &str, name: &str) -> Result<FleetMicroservice> {
        self.api(namespace)
            .get(name)
            .await
            .map_err(|e| RolloutError::home("get", "FleetMicroservice", e))
    }

    /// The fleet's ControllerRevisions in `namespace` as the apiserver has
    /// them now (a quorum read: no resourceVersion).
    pub async fn read_revisions(&self, namespace: &str) -> Result<Vec<ControllerRevision>> {
        let params = kube::api::ListParams::default().labels(FLEET_LABEL);
        Ok(self
            .revisions_api(namespace)
            .list(&params)
            .await
            .map_err(|e| RolloutError::home("list", "ControllerRevision", e))?
            .items)
    }

    /// Sets or clears the finalizer, conditioned on the resourceVersion read.
    pub async fn set_finalizer(&self, fms: &FleetMicroservice, present: bool) -> Result<()> {
        let mut finalizers: Vec<String> = fms.finalizers().to_vec();
        finalizers.retain(|f| f != FINALIZER);
        if present {
            finalizers.push(FINALIZER.to_string());
        }
        let patch = serde_json::json!({
            "metadata": {
                "resourceVersion": fms.resource_version(),
                "finalizers": finalizers,
            }
        });
        let ns = fms.namespace().unwrap_or_default();
        self.api(&ns)
            .patch(
                &fms.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|e| RolloutError::home("patch", "FleetMicroservice", e))?;
        counted("finalizer");
        Ok(())
    }

    /// Writes the whole status, conditioned on the resourceVersion read;
    /// returns the object as written.
    pub async fn write_status(
        &self,
        fms: &FleetMicroservice,
        status: &FleetMicroserviceStatus,
    ) -> Result<FleetMicroservice> {
        let mut next = fms.clone();
        next.status = Some(status.clone());
        let ns = fms.namespace().unwrap_or_default();
        let written = self
            .api(&ns)
            .replace_status(&fms.name_any(), &PostParams::default(), &next)
            .await
            .map_err(|e| RolloutError::home("replace status", "FleetMicroservice", e))?;
        counted("status");
        Ok(written)
    }

    /// Queues an Event about `fms`; it is sent beside the rounds.
    pub fn publish(&self, fms: &FleetMicroservice, note: &Note) {
        let event = Event {
            type_: if note.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: note.reason.to_string(),
            note: Some(note.message.clone()),
            action: "Rollout".into(),
            secondary: None,
        };
        if self.events.try_send((event, fms.object_ref(&()))).is_err() {
            tracing::debug!(reason = note.reason, "event queue full; event dropped");
        }
    }

    /// Stores a new revision, owned by the FleetMicroservice.
    pub async fn create_revision(&self, fms: &FleetMicroservice, r: &Revision) -> Result<()> {
        let owner = fms
            .controller_owner_ref(&())
            .ok_or_else(|| RolloutError::Revision("the FleetMicroservice has no uid".into()))?;
        let cr = revision_object(fms, r, owner)?;
        let api = self.revisions_api(&fms.namespace().unwrap_or_default());
        match api.create(&PostParams::default(), &cr).await {
            Ok(_) => counted("revision"),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                // Ours, created in a round the cache has not shown yet; or
                // someone else's with our name, which must not loop.
                let existing = api
                    .get(&r.name)
                    .await
                    .map_err(|e| RolloutError::home("get", "ControllerRevision", e))?;
                if revisions_of(fms, [&existing]).is_empty() {
                    return Err(RolloutError::Revision(format!(
                        "a ControllerRevision named {} exists and is not this FleetMicroservice's",
                        r.name
                    )));
                }
            }
            Err(e) => return Err(RolloutError::home("create", "ControllerRevision", e)),
        }
        Ok(())
    }

    /// Gives an existing revision a new number, conditioned on its resourceVersion.
    pub async fn renumber(&self, stored: &ControllerRevision, number: i64) -> Result<()> {
        let mut next = stored.clone();
        next.revision = number;
        self.revisions_api(&stored.namespace().unwrap_or_default())
            .replace(&stored.name_any(), &PostParams::default(), &next)
            .await
            .map_err(|e| RolloutError::home("replace", "ControllerRevision", e))?;
        counted("revision");
        Ok(())
    }

    /// Marks a revision failed at its number (review L13): one write, on
    /// the failure path only, conditional on the resourceVersion read.
    pub async fn mark_failed(&self, stored: &ControllerRevision, number: i64) -> Result<()> {
        let mut next = stored.clone();
        next.annotations_mut()
            .insert(FAILED_ANNOTATION.into(), number.to_string());
        match self
            .revisions_api(&stored.namespace().unwrap_or_default())
            .replace(&stored.name_any(), &PostParams::default(), &next)
            .await
        {
            Ok(_) => counted("revision"),
            // Changed since it was read (this mark, not yet in the cache):
            // the next round reads it again.
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(RolloutError::home("replace", "ControllerRevision", e)),
        }
        Ok(())
    }

    /// Deletes an old revision, on the uid and resourceVersion this round
    /// planned with (review L3): one an undo just brought back is kept.
    pub async fn delete_revision(&self, namespace: &str, cr: &ControllerRevision) -> Result<()> {
        let params = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: cr.metadata.uid.clone(),
                resource_version: cr.metadata.resource_version.clone(),
            }),
            ..DeleteParams::default()
        };
        let name = cr.metadata.name.clone().unwrap_or_default();
        match self.revisions_api(namespace).delete(&name, &params).await {
            Ok(_) => {
                counted("revision");
                Ok(())
            }
            // Gone, or changed since it was read: either way not ours to delete now.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
            Err(e) => Err(RolloutError::home("delete", "ControllerRevision", e)),
        }
    }
}

fn revision_object(
    fms: &FleetMicroservice,
    r: &Revision,
    owner: OwnerReference,
) -> Result<ControllerRevision> {
    let data = serde_json::to_value(&r.data).map_err(|e| RolloutError::Revision(e.to_string()))?;
    Ok(ControllerRevision {
        metadata: ObjectMeta {
            name: Some(r.name.clone()),
            namespace: fms.namespace(),
            labels: Some([(FLEET_LABEL.to_string(), fms.name_any())].into()),
            annotations: r
                .memory
                .good_before
                .clone()
                .map(|g| [(GOOD_BEFORE_ANNOTATION.to_string(), g)].into()),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        data: Some(RawExtension(data)),
        revision: r.number,
    })
}

/// The revisions of `fms` among stored ControllerRevisions: owned by its
/// uid, with data that parses. Anything else is left alone.
pub fn revisions_of<'a>(
    fms: &FleetMicroservice,
    stored: impl IntoIterator<Item = &'a ControllerRevision>,
) -> Vec<(Revision, &'a ControllerRevision)> {
    let uid = fms.uid();
    stored
        .into_iter()
        .filter(|cr| {
            cr.namespace() == fms.namespace()
                && cr
                    .owner_references()
                    .iter()
                    .any(|o| o.controller == Some(true) && Some(&o.uid) == uid.as_ref())
        })
        .filter_map(|cr| {
            let data: RevisionData = serde_json::from_value(cr.data.clone()?.0)
                .inspect_err(|e| {
                    tracing::warn!(revision = %cr.name_any(), error = %e, "revision data does not parse; ignored")
                })
                .ok()?;
            Some((
                Revision {
                    name: cr.name_any(),
                    number: cr.revision,
                    data,
                    memory: Memory {
                        good_before: cr.annotations().get(GOOD_BEFORE_ANNOTATION).cloned(),
                        failed_number: cr
                            .annotations()
                            .get(FAILED_ANNOTATION)
                            .and_then(|n| n.parse().ok()),
                    },
                },
                cr,
            ))
        })
        .collect()
}
