//! One reconcile of one Microservice: idempotent, from the current state,
//! never asking why it was triggered.

use std::sync::Arc;

use futures::FutureExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use tracing::{Instrument, field};

use super::children::{self, Write};
use super::coalesce;
use super::context::{Context, Reconciled};
use super::error::{ReconcileError, Result};
use super::registration::{self, Deletion};
use super::status_writer::{Concluded, conclude, conclude_with};
use crate::crd::Microservice;
use crate::domain::contains::{deployment_in_sync, service_in_sync};
use crate::domain::desired::desired;
use crate::domain::ownership::{Ownership, ownership};
use crate::domain::status::{Outcome, RolloutFacts};
use crate::domain::update::{deployment_update, service_update};
use crate::domain::{DomainError, OwnerIdentity};
use crate::telemetry::links;
use crate::telemetry::metrics::METRICS;

const CACHES_WARMING: &str = "CachesWarming";
const CHILD_TERMINATING: &str = "ChildTerminating";
/// A status change that may wait was held; the requeue writes it.
const HELD: &str = "Held";
/// A deletion waits for the registry; retried with its own backoff.
const CLEANUP_BLOCKED: &str = "CleanupBlocked";

/// Requeue soon when a result was dropped because the CR moved on, or the
/// caches are still warming.
const DROPPED_REQUEUE: std::time::Duration = std::time::Duration::from_millis(50);

pub async fn reconcile(ms: Arc<Microservice>, ctx: Arc<Context>) -> Result<Action> {
    let span = tracing::info_span!(
        "reconcile",
        k8s.cluster.name = %ctx.settings.cluster,
        k8s.namespace.name = ms.metadata.namespace.as_deref().unwrap_or_default(),
        flotilla.microservice = ms.metadata.name.as_deref().unwrap_or_default(),
        flotilla.generation = ms.metadata.generation.unwrap_or_default(),
        flotilla.triggers = field::Empty,
        outcome = field::Empty,
    );
    // Written by the fleet controller: link to the write that caused this.
    if let Some(from) = ms
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(links::TRACEPARENT_ANNOTATION))
        .and_then(|tp| links::from_traceparent(tp))
    {
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        span.add_link(from);
    }
    async move {
        let started = tokio::time::Instant::now();
        let triggers = ctx.triggers.take(&ObjectRef::from_obj(ms.as_ref()));
        tracing::Span::current().record("flotilla.triggers", triggers.join(",").as_str());
        let result = reconcile_inner(&ms, &ctx).await;
        let outcome = match &result {
            Ok(label) => *label,
            Err(e) => e.category(),
        };
        tracing::Span::current().record("outcome", outcome);
        if let Some(hook) = &ctx.hooks.on_reconciled {
            hook(Reconciled {
                name: ms.metadata.name.clone().unwrap_or_default(),
                triggers,
                outcome,
            });
        }
        let cluster = ctx.settings.cluster.as_str();
        {
            use opentelemetry::trace::TraceContextExt;
            use tracing_opentelemetry::OpenTelemetrySpanExt;
            let span = tracing::Span::current().context().span().span_context().clone();
            links::record(
                cluster,
                ms.metadata.namespace.as_deref().unwrap_or_default(),
                ms.metadata.name.as_deref().unwrap_or_default(),
                span,
            );
        }
        METRICS.reconcile_total.inc(&[cluster, outcome]);
        METRICS
            .reconcile_duration
            .observe(&[cluster], started.elapsed().as_secs_f64());
        match result {
            Ok(label) => {
                let key = ObjectRef::from_obj(ms.as_ref());
                if let Ok(mut b) = ctx.backoff.lock() {
                    b.succeeded(&key);
                }
                if label == "CleanedUp"
                    && let Ok(mut b) = ctx.cleanup_backoff.lock()
                {
                    b.succeeded(&key);
                }
                if label == CLEANUP_BLOCKED {
                    let delay = match ctx.cleanup_backoff.lock() {
                        Ok(mut b) => b.failed(key),
                        Err(_) => std::time::Duration::from_secs(10),
                    };
                    return Ok(Action::requeue(delay));
                }
                tracing::debug!(outcome = label, "reconciled");
                Ok(if label == "Dropped" || label == CACHES_WARMING {
                    Action::requeue(DROPPED_REQUEUE)
                } else if label == HELD {
                    Action::requeue(coalesce::WINDOW)
                } else if label == CHILD_TERMINATING {
                    // The deletion event wakes us first; this is the
                    // backstop, and a child held for long costs little.
                    Action::requeue(std::time::Duration::from_secs(5))
                } else if ctx.registrations.failed(&ObjectRef::from_obj(ms.as_ref())) {
                    // A registration that failed is tried again soon, not
                    // only at the next resync.
                    Action::requeue(registration::RETRY)
                } else if ctx.awaiting_watch(
                    ms.metadata.namespace.as_deref().unwrap_or_default(),
                    ms.metadata.name.as_deref().unwrap_or_default(),
                ) {
                    // Concluded on a child only our create showed: look
                    // again once that note expires, in case the watch
                    // never shows the child (deleted during a relist).
                    Action::requeue(super::created::TTL)
                } else {
                    Action::requeue(ctx.settings.resync)
                })
            }
            Err(e) => {
                if matches!(e, ReconcileError::Api { .. }) {
                    // Say so in status, if the API lets us: an error is never success.
                    if let Err(status_err) = conclude(&ctx, &ms, &Outcome::ApiError(e.to_string())).await {
                        tracing::debug!(error = %status_err, "could not record the API error in status");
                    }
                }
                Err(e)
            }
        }
    }
    .instrument(span)
    .await
}

/// Returns a short, bounded label of what happened.
async fn reconcile_inner(ms: &Microservice, ctx: &Context) -> Result<&'static str> {
    if let Some(hook) = &ctx.hooks.before_reconcile {
        hook(ms.metadata.name.clone().unwrap_or_default()).await;
    }
    if !caches_ready(ctx) {
        return Ok(CACHES_WARMING);
    }
    if ms.metadata.deletion_timestamp.is_some() {
        // Garbage collection removes the children through their
        // ownerReferences; the registry's records are ours to remove.
        let ms = ctx.written.fresher_than(ms).unwrap_or_else(|| ms.clone());
        return Ok(match registration::on_deletion(ctx, &ms).await? {
            Deletion::NotOurs => "Deleting",
            Deletion::CleanedUp => "CleanedUp",
            Deletion::Released => "FinalizerReleased",
            Deletion::Blocked => CLEANUP_BLOCKED,
        });
    }
    let owner = OwnerIdentity::of(ms)?;
    let children = match desired(ms, &ctx.settings.defaults) {
        Ok(c) => c,
        Err(DomainError::InvalidSpec(msg)) => {
            return permanent(ctx, ms, Outcome::InvalidSpec(msg), "InvalidSpec").await;
        }
        Err(e) => return Err(e.into()),
    };
    let (ns, name) = (owner.namespace.as_str(), owner.name.as_str());

    // Check both children before writing either.
    let (deployments, services) = (ctx.deployment_child(), ctx.service_child());
    let live_deployment = children::live(ctx, &deployments, ns, name).await?;
    let live_service = children::live(ctx, &services, ns, name).await?;
    if let Some(done) = in_the_way(ctx, ms, &owner, &live_deployment, &live_service).await? {
        return Ok(done);
    }

    // The registry's finalizer goes on before anything is registered.
    registration::ensure_finalizer(ctx, ms).await?;

    let applied = apply_both(ctx, ns, live_deployment, live_service, &children).await;
    let (deployment, service, dep_write, svc_write) = match applied {
        Ok(done) => done,
        Err(ReconcileError::Rejected { message, kind, .. }) => {
            let msg = format!("the API server rejected the {kind}: {message}");
            return permanent(ctx, ms, Outcome::Rejected(msg), "Invalid").await;
        }
        Err(e) => return Err(e),
    };
    if let Some((reason, note)) = announcement(name, dep_write, svc_write) {
        ctx.announcer.normal_once(ms, reason, note);
    }
    if let Some(hook) = &ctx.hooks.after_children_applied {
        hook(name.to_string()).await;
    }

    let registered = match &ctx.settings.registry {
        Some(registry) => vec![registration::register(ctx, registry, ms, &service).await],
        None => Vec::new(),
    };
    let outcome = applied_outcome(ctx, ns, name, &deployment);
    Ok(match conclude_with(ctx, ms, &outcome, &registered).await? {
        Concluded::Dropped => "Dropped",
        Concluded::Held => HELD,
        _ if dep_write != Write::Unchanged || svc_write != Write::Unchanged => "Applied",
        _ => "InSync",
    })
}

/// Until every child cache has its initial list, "missing" and "no ready
/// endpoints" would be guesses that a restarted controller must not
/// publish. Waiting here would hold a concurrency slot the caches need to
/// fill, so come back shortly instead.
fn caches_ready(ctx: &Context) -> bool {
    let ready = |r: Option<Result<(), _>>| matches!(r, Some(Ok(())));
    ready(ctx.deployments.wait_until_ready().now_or_never())
        && ready(ctx.services.wait_until_ready().now_or_never())
        && ready(ctx.deployment_names.wait_until_ready().now_or_never())
        && ready(ctx.service_names.wait_until_ready().now_or_never())
        && ctx.endpoints.synced()
}

/// What stands in the way of writing the children: an earlier
/// Microservice's leftovers, a stranger's objects, or a child being
/// deleted. `Some` is the reconcile's result, concluded.
async fn in_the_way(
    ctx: &Context,
    ms: &Microservice,
    owner: &OwnerIdentity,
    live_deployment: &Option<Deployment>,
    live_service: &Option<Service>,
) -> Result<Option<&'static str>> {
    let (ns, name) = (owner.namespace.as_str(), owner.name.as_str());
    let (deployments, services) = (ctx.deployment_child(), ctx.service_child());
    // Children an earlier Microservice of this name left: garbage the
    // garbage collector has not reached (found by `make chaos`, after a
    // member's apiserver restart). Delete exactly those objects; their
    // deletion events wake us to create ours.
    let mut leftovers = Vec::new();
    if let Some(d) = live_deployment
        && let Ownership::Leftover { .. } = ownership(&d.metadata, owner)
    {
        children::delete_leftover(ctx, &deployments, ns, &d.metadata).await?;
        leftovers.push("Deployment");
    }
    if let Some(s) = live_service
        && let Ownership::Leftover { .. } = ownership(&s.metadata, owner)
    {
        children::delete_leftover(ctx, &services, ns, &s.metadata).await?;
        leftovers.push("Service");
    }
    if !leftovers.is_empty() {
        let msg = format!(
            "{} {name} of an earlier Microservice of this name is being deleted",
            leftovers.join(" and ")
        );
        return child_terminating(ctx, ms, msg).await.map(Some);
    }
    let mut strangers = Vec::new();
    if let Some(d) = live_deployment
        && let Ownership::Foreign { controller } = ownership(&d.metadata, owner)
    {
        strangers.push(describe("Deployment", name, controller));
    }
    if let Some(s) = live_service
        && let Ownership::Foreign { controller } = ownership(&s.metadata, owner)
    {
        strangers.push(describe("Service", name, controller));
    }
    if !strangers.is_empty() {
        // The name watches wake us when a stranger changes or goes.
        let msg = format!("{}; they are left untouched", strangers.join("; "));
        let conflict = Outcome::OwnershipConflict(msg);
        return permanent(ctx, ms, conflict, "OwnershipConflict")
            .await
            .map(Some);
    }

    // A child being deleted is not in sync, and cannot be written until it
    // is gone; its deletion event wakes us to create it again.
    let terminating: Vec<&str> = [
        ("Deployment", live_deployment.as_ref().map(|d| &d.metadata)),
        ("Service", live_service.as_ref().map(|s| &s.metadata)),
    ]
    .into_iter()
    .filter(|(_, m)| m.is_some_and(|m| m.deletion_timestamp.is_some()))
    .map(|(kind, _)| kind)
    .collect();
    if !terminating.is_empty() {
        let msg = format!("{} {name} is being deleted", terminating.join(" and "));
        return child_terminating(ctx, ms, msg).await.map(Some);
    }
    Ok(None)
}

/// The outcome of children in place: their facts, unless a child watch has
/// been failing (frozen caches would keep concluding what they last saw).
fn applied_outcome(ctx: &Context, ns: &str, name: &str, deployment: &Deployment) -> Outcome {
    let stale = ctx.watches.stale(tokio::time::Instant::now());
    if stale.is_empty() {
        return Outcome::Applied {
            deployment: name.to_string(),
            service: name.to_string(),
            rollout: RolloutFacts::of(deployment),
            ready_endpoints: ctx.endpoints.ready(ns, name),
        };
    }
    let failing: Vec<String> = stale
        .iter()
        .map(|(kind, d)| format!("{kind} for {}s", d.as_secs()))
        .collect();
    Outcome::CachesStale(format!(
        "the watches of {} have been failing; availability is unknown until they recover",
        failing.join(", ")
    ))
}

async fn apply_both(
    ctx: &Context,
    ns: &str,
    live_deployment: Option<Deployment>,
    live_service: Option<Service>,
    children: &crate::domain::desired::Children,
) -> Result<(Deployment, Service, Write, Write)> {
    let (deployment, dep_write) = children::apply(
        ctx,
        &ctx.deployment_child(),
        ns,
        live_deployment,
        &children.deployment,
        deployment_in_sync,
        deployment_update,
    )
    .await?;
    let (service, svc_write) = children::apply(
        ctx,
        &ctx.service_child(),
        ns,
        live_service,
        &children.service,
        service_in_sync,
        service_update,
    )
    .await?;
    Ok((deployment, service, dep_write, svc_write))
}

fn describe(kind: &str, name: &str, controller: Option<String>) -> String {
    match controller {
        Some(c) => format!("{kind} {name} exists and is controlled by {c}"),
        None => format!("{kind} {name} exists and is not owned by this Microservice"),
    }
}

/// A permanent error: record it in status and as a Warning Event, then wait
/// for the next spec change or resync instead of retrying hot.
/// A child is going away: say so, and wait for its deletion event.
async fn child_terminating(ctx: &Context, ms: &Microservice, msg: String) -> Result<&'static str> {
    let outcome = Outcome::ChildTerminating(msg);
    Ok(match conclude(ctx, ms, &outcome).await? {
        Concluded::Dropped => "Dropped",
        _ => CHILD_TERMINATING,
    })
}

async fn permanent(
    ctx: &Context,
    ms: &Microservice,
    outcome: Outcome,
    reason: &'static str,
) -> Result<&'static str> {
    let message = match &outcome {
        Outcome::InvalidSpec(m) | Outcome::OwnershipConflict(m) | Outcome::Rejected(m) => m.clone(),
        _ => String::new(),
    };
    tracing::warn!(reason, message = %message, "permanent error");
    let concluded = conclude(ctx, ms, &outcome).await?;
    if concluded == Concluded::Written {
        ctx.announcer.warning(ms, reason, message);
    }
    Ok(match concluded {
        Concluded::Dropped => "Dropped",
        Concluded::Held => HELD,
        _ => reason,
    })
}

/// The Normal Event for what this reconcile wrote, if it wrote anything.
fn announcement(name: &str, deployment: Write, service: Write) -> Option<(&'static str, String)> {
    let kinds = |w: Write| {
        [("Deployment", deployment), ("Service", service)]
            .into_iter()
            .filter(|(_, x)| *x == w)
            .map(|(k, _)| k)
            .collect::<Vec<_>>()
            .join(" and ")
    };
    let (created, updated) = (kinds(Write::Created), kinds(Write::Updated));
    match (created.is_empty(), updated.is_empty()) {
        (true, true) => None,
        (false, true) => Some(("Created", format!("{created} {name} created"))),
        (true, false) => Some(("Updated", format!("{updated} {name} updated"))),
        (false, false) => Some((
            "Applied",
            format!("{created} {name} created; {updated} {name} updated"),
        )),
    }
}

/// Transient errors back off per object, exponentially, from a few ms.
pub fn error_policy(ms: Arc<Microservice>, error: &ReconcileError, ctx: Arc<Context>) -> Action {
    let delay = match ctx.backoff.lock() {
        Ok(mut b) => b.failed(ObjectRef::from_obj(ms.as_ref())),
        Err(_) => ctx.settings.resync,
    };
    tracing::warn!(
        k8s.cluster.name = %ctx.settings.cluster,
        flotilla.microservice = ms.metadata.name.as_deref().unwrap_or_default(),
        error = %error,
        category = error.category(),
        retry_in_ms = delay.as_millis() as u64,
        "reconcile failed"
    );
    Action::requeue(delay)
}
