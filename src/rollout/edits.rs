//! The edits users ask for (pause, resume, undo), shared by the gRPC
//! rollouts API and the dashboard: each one write to the home cluster.
//!
//! Any replica serves them, leader or not: they are a caller's request,
//! not the fleet controller's decision, so the rollout term does not fence
//! them (the undo is conditional on the resourceVersion read instead). They
//! carry the field manager `flotilla-api`, so the apiserver's records
//! (audit log, managedFields) tell them from the controller's own writes.

use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};

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

pub async fn set_paused(
    home: &Client,
    ns: &str,
    name: &str,
    paused: bool,
) -> Result<FleetMicroservice, EditError> {
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let f = Api::<FleetMicroservice>::namespaced(home.clone(), ns)
        .patch(
            name,
            &params,
            &Patch::Merge(serde_json::json!({"spec": {"paused": paused}})),
        )
        .await?;
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
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let f = api.replace(name, &params, &f).await?;
    Ok((f, target))
}
