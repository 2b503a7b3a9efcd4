//! The edits users ask for (pause, resume, undo, approve), shared by the gRPC
//! rollouts API and the dashboard: each one write to the home cluster.
//!
//! Any replica serves them, leader or not: they are a caller's request,
//! not the fleet controller's decision, so the rollout term does not fence
//! them (the undo is conditional on the resourceVersion read instead). They
//! carry the field manager `flotilla-api`, so the apiserver's records
//! (audit log, managedFields) tell them from the controller's own writes.

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as EventsV1;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::cache::RolloutCache;
use crate::rollout::approval;
use crate::rollout::revision::{Revision, undo_target};
use crate::rollout::spec::{FleetMicroservice, WaveApproval};

#[derive(Debug, thiserror::Error)]
pub enum EditError {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// No revision to go back to, or not the one asked for.
    #[error("{0}")]
    Undo(String),
    /// Not a Manual wave, no such revision, or an approvals annotation
    /// that cannot be read (it is never overwritten).
    #[error("{0}")]
    Approve(String),
}

impl EditError {
    /// A bounded label for metrics and logs.
    pub fn category(&self) -> &'static str {
        match self {
            EditError::Kube(kube::Error::Api(s)) if s.code == 404 => "NotFound",
            EditError::Kube(kube::Error::Api(s)) if s.code == 409 => "Conflict",
            EditError::Kube(_) => "Kube",
            EditError::Undo(_) => "Undo",
            EditError::Approve(_) => "Approve",
        }
    }
}

/// The field manager of every edit made on a user's behalf.
pub const FIELD_MANAGER: &str = "flotilla-api";

/// Who made the last edit through Flotilla, written with the edit itself
/// (#34): the status is the fleet controller's alone, behind its fence,
/// and an edit on its own could not say whose it was.
pub const LAST_EDIT_BY: &str = "platform.example.io/last-edit-by";

/// How long an edit waits for its Event; Events are a courtesy, the
/// annotation is the record.
const EVENT_TIMEOUT: Duration = Duration::from_secs(2);

/// An Event on `f` saying who asked for what (#34): `reason` is stable
/// CamelCase, `by` the caller's name. Created here rather than through
/// kube's `Recorder`, whose create names no field manager: the Event too
/// must read as the edge's write, not the fleet controller's.
async fn announce(home: &Client, f: &FleetMicroservice, reason: &str, what: &str, by: &str) {
    let note = format!("{what} by {by}");
    let event = edit_event(f.object_ref(&()), reason, &note, jiff::Timestamp::now());
    let ns = event.metadata.namespace.clone().unwrap_or_default();
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    let api = Api::<EventsV1>::namespaced(home.clone(), &ns);
    match tokio::time::timeout(EVENT_TIMEOUT, api.create(&params, &event)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::debug!(error = %e, reason, "could not publish the edit's event"),
        Err(_) => tracing::debug!(reason, "the edit's event took too long; dropped"),
    }
}

/// The Event an edit leaves about the object `about`, as of `now`. Pure.
fn edit_event(about: ObjectReference, reason: &str, note: &str, now: jiff::Timestamp) -> EventsV1 {
    let ev = kube::runtime::events::Event {
        type_: kube::runtime::events::EventType::Normal,
        reason: reason.into(),
        note: Some(note.into()),
        action: "Edit".into(),
        secondary: None,
    };
    let edge = kube::runtime::events::Reporter {
        controller: FIELD_MANAGER.into(),
        instance: Some(FIELD_MANAGER.into()),
    };
    crate::telemetry::events::object(&ev, &about, &edge, now)
}

pub async fn set_paused(
    home: &Client,
    ns: &str,
    name: &str,
    paused: bool,
    by: &str,
) -> Result<FleetMicroservice, EditError> {
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let f = Api::<FleetMicroservice>::namespaced(home.clone(), ns)
        .patch(
            name,
            &params,
            &Patch::Merge(serde_json::json!({
                "metadata": {"annotations": {LAST_EDIT_BY: by}},
                "spec": {"paused": paused},
            })),
        )
        .await?;
    let (reason, what) = match paused {
        true => ("PauseRequested", "paused"),
        false => ("ResumeRequested", "resumed"),
    };
    announce(home, &f, reason, what, by).await;
    Ok(f)
}

/// Puts the template and overrides of a stored revision back: the last
/// good one, or number `to` when it is not 0. Conditional on the
/// resourceVersion read.
pub async fn undo(
    home: &Client,
    cache: &RolloutCache,
    ns: &str,
    name: &str,
    to: i64,
    by: &str,
) -> Result<(FleetMicroservice, Revision), EditError> {
    if to < 0 {
        return Err(EditError::Undo("to_revision must not be negative".into()));
    }
    let api = Api::<FleetMicroservice>::namespaced(home.clone(), ns);
    let mut f = api.get(name).await?;
    let stored = cache.history(&f);
    let st = f.status.clone().unwrap_or_default();
    let target = undo_target(
        &stored,
        st.update_revision.as_deref(),
        st.last_good_revision.as_deref(),
        to,
    )
    .map_err(EditError::Undo)?
    .clone();
    f.spec.template = target.data.template.clone();
    f.spec.overrides = target.data.overrides.clone();
    f.metadata
        .annotations
        .get_or_insert_default()
        .insert(LAST_EDIT_BY.into(), by.into());
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let f = api.replace(name, &params, &f).await?;
    let what = format!("undone to revision {} ({})", target.number, target.name);
    announce(home, &f, "UndoRequested", &what, by).await;
    Ok((f, target))
}

/// How often an approval is tried again when the object changed under it:
/// the fleet controller writes the status of a running rollout often.
const APPROVE_TRIES: usize = 5;

/// Approves `wave` for `revision` (a name or number; empty: the update
/// revision the status shows): adds it to the approvals annotation,
/// conditional on the resourceVersion read. Returns the object and the
/// approval in force, which is the earlier one when it was given before.
pub async fn approve(
    home: &Client,
    cache: &RolloutCache,
    (ns, name): (&str, &str),
    wave: &str,
    revision: &str,
    by: &str,
) -> Result<(FleetMicroservice, WaveApproval), EditError> {
    let api = Api::<FleetMicroservice>::namespaced(home.clone(), ns);
    let mut tries = 0;
    loop {
        tries += 1;
        let f = api.get(name).await?;
        approval::check_wave(&f.spec.rollout.waves, wave).map_err(EditError::Approve)?;
        let update = f.status.as_ref().and_then(|s| s.update_revision.as_deref());
        let (revision, mut number) = approval::revision_named(revision, update, &cache.history(&f))
            .map_err(EditError::Approve)?;
        // The status names the attempt being released; the cache of
        // revisions may not show its renumbering yet.
        let status = f.status.as_ref();
        if status.and_then(|s| s.update_revision.as_deref()) == Some(revision.as_str())
            && let Some(n) = status.and_then(|s| s.update_revision_number)
        {
            number = number.max(n);
        }
        let given = approval::read(f.metadata.annotations.as_ref());
        if let Some(e) = given.unreadable {
            return Err(EditError::Approve(format!("{e}; fix or remove it first")));
        }
        let new = WaveApproval {
            wave: wave.into(),
            revision: revision.clone(),
            attempt: Some(number),
            by: by.into(),
            at: Time(jiff::Timestamp::now()),
        };
        let all = match approval::add(&given.given, new.clone()) {
            Ok(all) => all,
            Err(before) => return Ok((f, before)),
        };
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        let patch = serde_json::json!({
            "metadata": {
                "resourceVersion": f.metadata.resource_version,
                "annotations": {
                    approval::ANNOTATION: serde_json::to_string(&all).expect("approvals serialize"),
                    LAST_EDIT_BY: by,
                },
            },
        });
        match api.patch(name, &params, &Patch::Merge(patch)).await {
            Ok(f) => {
                let what =
                    format!("wave {wave} of revision {revision} (attempt {number}) approved");
                announce(home, &f, "WaveApproved", &what, by).await;
                return Ok((f, new));
            }
            Err(kube::Error::Api(s)) if s.code == 409 && tries < APPROVE_TRIES => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_edits_event_names_the_edge_and_its_object() {
        let f = ObjectReference {
            api_version: Some("platform.example.io/v1alpha1".into()),
            kind: Some("FleetMicroservice".into()),
            namespace: Some("team-a".into()),
            name: Some("api".into()),
            uid: Some("u-1".into()),
            ..ObjectReference::default()
        };
        let at: jiff::Timestamp = "2026-12-03T18:00:00Z".parse().unwrap();
        let e = edit_event(f, "PauseRequested", "paused by alice", at);
        assert_eq!(e.reporting_controller.as_deref(), Some(FIELD_MANAGER));
        assert_eq!(e.metadata.namespace.as_deref(), Some("team-a"));
        assert!(e.metadata.name.unwrap().starts_with("api."));
        let about = e.regarding.unwrap();
        assert_eq!(about.uid.as_deref(), Some("u-1"));
        assert_eq!(about.kind.as_deref(), Some("FleetMicroservice"));
        assert_eq!(e.note.as_deref(), Some("paused by alice"));
    }
}
