//! The edits users ask for (pause, resume, undo), shared by the gRPC
//! rollouts API and the dashboard: each one write to the home cluster.
//!
//! Any replica serves them, leader or not: they are a caller's request,
//! not the fleet controller's decision, so the rollout term does not fence
//! them (the undo is conditional on the resourceVersion read instead). They
//! carry the field manager `flotilla-api`, so the apiserver's records
//! (audit log, managedFields) tell them from the controller's own writes.

use std::time::Duration;

use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client, Resource};

use super::cache::RolloutCache;
use super::revision::{Revision, undo_target};
use super::spec::FleetMicroservice;

#[derive(Debug, thiserror::Error)]
pub enum EditError {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// No revision to go back to, or not the one asked for.
    #[error("{0}")]
    Undo(String),
}

impl EditError {
    /// A bounded label for metrics and logs.
    pub fn category(&self) -> &'static str {
        match self {
            EditError::Kube(kube::Error::Api(s)) if s.code == 404 => "NotFound",
            EditError::Kube(kube::Error::Api(s)) if s.code == 409 => "Conflict",
            EditError::Kube(_) => "Kube",
            EditError::Undo(_) => "Undo",
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
/// CamelCase, `by` the caller's name.
async fn announce(home: &Client, f: &FleetMicroservice, reason: &str, what: &str, by: &str) {
    let recorder = Recorder::new(
        home.clone(),
        Reporter {
            controller: FIELD_MANAGER.into(),
            instance: None,
        },
    );
    let event = Event {
        type_: EventType::Normal,
        reason: reason.into(),
        note: Some(format!("{what} by {by}")),
        action: "Edit".into(),
        secondary: None,
    };
    let about = f.object_ref(&());
    let sent = tokio::time::timeout(EVENT_TIMEOUT, recorder.publish(&event, &about));
    match sent.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(error = %e, reason, "could not publish the edit's event"),
        Err(_) => tracing::debug!(reason, "the edit's event took too long; dropped"),
    }
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
