//! Concluding a reconcile: write status only when it changed, and never stamp
//! a result on a generation it was not computed for. Writes are conditional
//! on a resourceVersion, so the common case needs no read.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::reflector::ObjectRef;
use tracing::Instrument;

use super::context::{Context, FIELD_MANAGER};
use super::error::{ReconcileError, Result};
use crate::crd::{Microservice, MicroserviceStatus};
use crate::domain::conditions::{Verdict, transition};
use crate::domain::status::{Outcome, coalescable, first_report_may_wait, next_status};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Concluded {
    /// The status already said this; nothing was written.
    Unchanged,
    Written,
    /// The CR changed (new generation or uid) or is being deleted since this
    /// reconcile read it: its result is about an object that no longer is.
    Dropped,
    /// Only counts or wording changed, or the first report of a generation
    /// says only "under way": held for `coalesce::WINDOW`.
    Held,
}

pub(super) fn now() -> Time {
    // Whole seconds, as the API server stores them, so equal states compare equal.
    let ts = jiff::Timestamp::now();
    Time(jiff::Timestamp::from_second(ts.as_second()).unwrap_or(ts))
}

pub async fn conclude(
    ctx: &Context,
    cached: &Microservice,
    outcome: &Outcome,
) -> Result<Concluded> {
    conclude_with(ctx, cached, outcome, &[]).await
}

/// `conclude`, with verdicts on facts other than the outcome's (the
/// registry's `Registered`), each its own condition.
pub async fn conclude_with(
    ctx: &Context,
    cached: &Microservice,
    outcome: &Outcome,
    also: &[Verdict],
) -> Result<Concluded> {
    // What we last wrote is fresher than a cache that has not seen it yet.
    let ours = ctx.written.fresher_than(cached);
    let ms = ours.as_ref().unwrap_or(cached);
    let generation = ms.metadata.generation.unwrap_or(0);
    let now = now();
    let cached = with(
        next_status(
            ms.status.as_ref(),
            outcome,
            ms.spec.replicas,
            generation,
            &now,
        ),
        also,
        generation,
        &now,
    );
    let key = ObjectRef::from_obj(ms);
    if ms.status.as_ref() == Some(&cached) {
        ctx.held.clear(&key);
        return Ok(Concluded::Unchanged);
    }
    let may_wait = ms.status.as_ref().is_some_and(|s| coalescable(s, &cached))
        || first_report_may_wait(ms.status.as_ref(), &cached);
    if may_wait && !ctx.held.due(&key, tokio::time::Instant::now()) {
        return Ok(Concluded::Held);
    }
    ctx.held.clear(&key);
    let (Some(ns), Some(name)) = (
        ms.metadata.namespace.as_deref(),
        ms.metadata.name.as_deref(),
    ) else {
        return Ok(Concluded::Dropped);
    };
    let api = Api::<Microservice>::namespaced(ctx.client.clone(), ns);

    // First against the cached copy: its resourceVersion makes the replace
    // conditional, so if anything changed since (a new spec, a deletion, a
    // status from elsewhere) it fails with 409 and nothing stale lands.
    let mut attempt = ms.clone();
    attempt.status = Some(cached);
    ctx.ensure_leading()?;
    match write(&api, name, &attempt).await {
        Ok(result) => {
            ctx.written
                .record(attempt.metadata.resource_version.clone(), result);
            return Ok(Concluded::Written);
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(ReconcileError::api("update_status", "Microservice", e)),
    }

    // The cache lagged: re-read, and write only if the result is still
    // about the object as it now is.
    let Some(mut fresh) = api
        .get_opt(name)
        .await
        .map_err(|e| ReconcileError::api("get", "Microservice", e))?
    else {
        return Ok(Concluded::Dropped);
    };
    if fresh.metadata.uid != ms.metadata.uid
        || fresh.metadata.generation != ms.metadata.generation
        || fresh.metadata.deletion_timestamp.is_some()
    {
        return Ok(Concluded::Dropped);
    }
    let next = with(
        next_status(
            fresh.status.as_ref(),
            outcome,
            fresh.spec.replicas,
            generation,
            &now,
        ),
        also,
        generation,
        &now,
    );
    if fresh.status.as_ref() == Some(&next) {
        return Ok(Concluded::Unchanged);
    }
    fresh.status = Some(next);
    ctx.ensure_leading()?;
    let result = write(&api, name, &fresh)
        .await
        .map_err(|e| ReconcileError::api("update_status", "Microservice", e))?;
    ctx.written
        .record(fresh.metadata.resource_version.clone(), result);
    Ok(Concluded::Written)
}

fn with(
    mut status: MicroserviceStatus,
    also: &[Verdict],
    generation: i64,
    now: &Time,
) -> MicroserviceStatus {
    if !also.is_empty() {
        status.conditions = transition(&status.conditions, also, generation, now);
    }
    status
}

/// Replaces the status, conditional on `ms`'s resourceVersion; returns the
/// object as written.
async fn write(
    api: &Api<Microservice>,
    name: &str,
    ms: &Microservice,
) -> kube::Result<Microservice> {
    let pp = PostParams {
        dry_run: false,
        field_manager: Some(FIELD_MANAGER.into()),
    };
    api.replace_status(name, &pp, ms)
        .instrument(tracing::info_span!(
            "k8s.write",
            verb = "update_status",
            kind = "Microservice"
        ))
        .await
}
