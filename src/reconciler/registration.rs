//! The registry side of a reconcile (on with `--registry-etcd-endpoints`):
//! our finalizer, the records, the `Registered` condition, and on deletion
//! seed 001's cleanup contract: the records go first, the finalizer
//! second, and while etcd cannot be reached the object stays with
//! `CleanupBlocked=True`, retried with backoff.

use k8s_openapi::api::core::v1::Service;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};

use super::children::post_params;
use super::context::Context;
use super::error::{ReconcileError, Result};
pub use super::registered::RETRY;
use crate::crd::Microservice;
use crate::domain::conditions::{CLEANUP_BLOCKED, REGISTERED, Status, Verdict, transition};
use crate::registry::records::{CLUSTER_TREE, Entry, Refusal, Writer, plan_register, plan_remove};
use crate::registry::{FINALIZER, Registration, Registry, RegistryError};
use crate::telemetry::metrics::METRICS;

/// What the deletion of a Microservice came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deletion {
    /// Not ours to hold: garbage collection removes the children.
    NotOurs,
    /// Records removed, then the finalizer.
    CleanedUp,
    /// Registration is off: the finalizer is released, and the sweep
    /// removes the records once it is on again.
    Released,
    /// etcd could not be reached; retried with backoff.
    Blocked,
}

pub fn has_finalizer(ms: &Microservice) -> bool {
    ms.finalizers().iter().any(|f| f == FINALIZER)
}

fn writer(ctx: &Context) -> Writer {
    Writer {
        cluster: ctx.settings.cluster.clone(),
        epoch: i64::from(ctx.settings.writer.epoch.unwrap_or(0)),
        lease: ctx.settings.writer.lease.clone().unwrap_or_default(),
    }
}

fn entry(ctx: &Context, ms: &Microservice) -> Entry {
    Entry {
        cluster: ctx.settings.cluster.clone(),
        namespace: ms.namespace().unwrap_or_default(),
        name: ms.name_any(),
    }
}

/// Notes whether etcd answered, for `/metrics`.
/// etcd is not behind the kube wire fence: the term is checked here, right
/// before each write or delete, so a deposed leader's stale backlog never
/// reaches the registry (records in sync keep an older term's epoch).
fn fenced(ctx: &Context) -> Result<(), RegistryError> {
    ctx.ensure_leading().map_err(|_| {
        METRICS
            .registry_writes_total
            .inc(&[ctx.settings.cluster.as_str(), "refused"]);
        RegistryError::NotLeading
    })
}

fn observed<T>(ctx: &Context, result: Result<T, RegistryError>) -> Result<T, RegistryError> {
    let up = !matches!(result, Err(RegistryError::Unavailable(_)));
    METRICS
        .registry_up
        .set(&[ctx.settings.cluster.as_str()], if up { 1.0 } else { 0.0 });
    result
}

/// Puts our finalizer on while registration is on, and takes it off when
/// it is off. Returns the object as written, if it wrote.
pub async fn ensure_finalizer(ctx: &Context, ms: &Microservice) -> Result<Option<Microservice>> {
    let want = ctx.settings.registry.is_some();
    if has_finalizer(ms) == want {
        return Ok(None);
    }
    // Our own write may be ahead of the cache: judge on it, and write on it.
    let latest = ctx.written.fresher_than(ms);
    let ms = latest.as_ref().unwrap_or(ms);
    if has_finalizer(ms) == want {
        return Ok(None);
    }
    set_finalizer(ctx, ms, want).await.map(Some)
}

fn api_of(ctx: &Context, ms: &Microservice) -> Api<Microservice> {
    Api::namespaced(ctx.client.clone(), &ms.namespace().unwrap_or_default())
}

/// Sets or clears the finalizer: a replace of the object as read, so it is
/// conditional on its resourceVersion (a stale copy gets 409 and nothing
/// lands), and the member role needs no `patch`.
async fn set_finalizer(ctx: &Context, ms: &Microservice, present: bool) -> Result<Microservice> {
    let mut next = ms.clone();
    let finalizers = next.metadata.finalizers.get_or_insert_with(Vec::new);
    finalizers.retain(|f| f != FINALIZER);
    if present {
        finalizers.push(FINALIZER.to_string());
    }
    ctx.ensure_leading()?;
    let api = api_of(ctx, ms);
    let params = post_params();
    let written = api
        .replace(&ms.name_any(), &params, &next)
        .await
        .map_err(|e| ReconcileError::api("update", "Microservice", e))?;
    // The status write that follows starts from this, not a stale cache.
    ctx.written.record(ms.resource_version(), written.clone());
    Ok(written)
}

/// The Service's address as the records give it: ClusterIP and first port.
fn address(service: &Service) -> (Option<&str>, u16) {
    let spec = service.spec.as_ref();
    let ip = spec.and_then(|s| s.cluster_ip.as_deref());
    let port = spec
        .and_then(|s| s.ports.as_ref())
        .and_then(|p| p.first())
        .map_or(0, |p| u16::try_from(p.port).unwrap_or(0));
    (ip, port)
}

async fn try_register(
    ctx: &Context,
    registry: &Registry,
    ms: &Microservice,
    service: &Service,
) -> Result<(), RegistryError> {
    let me = writer(ctx);
    let (host, port) = address(service);
    let mut desired = entry(ctx, ms).desired_by(registry.zone(), host, port, &me)?;
    for (_, record) in &mut desired {
        record.uid = uid_of(ms);
    }
    // The fleet-wide name is the fleet DNS writer's, health-aware (#31).
    if ctx.settings.fleet_dns {
        desired.truncate(1);
    }
    let key = ObjectRef::from_obj(ms);
    if ctx.registrations.fresh(&key, &desired) {
        return Ok(());
    }
    let keys: Vec<String> = desired.iter().map(|(k, _)| k.clone()).collect();
    let existing = observed(ctx, registry.read(&keys).await)?;
    let ops = plan_register(&desired, &existing, &me).inspect_err(|_| {
        // A newer term's record, or one not ours: counted, never written.
        METRICS
            .registry_writes_total
            .inc(&[ctx.settings.cluster.as_str(), "refused"]);
    })?;
    if !ops.is_empty() {
        fenced(ctx)?;
        let applied = observed(ctx, registry.register(&ops, &uid_of(ms)).await);
        let result = match &applied {
            Ok(()) => "applied",
            Err(RegistryError::Conflict) => "conflict",
            Err(_) => "error",
        };
        METRICS
            .registry_writes_total
            .inc(&[ctx.settings.cluster.as_str(), result]);
        applied?;
    }
    ctx.registrations.note(key, desired);
    Ok(())
}

/// Registers `ms`'s Service; the `Registered` verdict, true or saying why not.
pub async fn register(
    ctx: &Context,
    registration: &Registration,
    ms: &Microservice,
    service: &Service,
) -> Verdict {
    let result = match registration.get() {
        Ok(registry) => try_register(ctx, registry, ms, service)
            .await
            .map(|()| registry),
        Err(e) => Err(e),
    };
    match result {
        Ok(registry) => {
            let (ns, name, zone) = (
                ms.namespace().unwrap_or_default(),
                ms.name_any(),
                &registry.zone().name,
            );
            let cluster = &ctx.settings.cluster;
            let fleet_wide = if ctx.settings.fleet_dns {
                format!("; in {name}.{ns}.{zone} while Available here")
            } else {
                format!(" and {name}.{ns}.{zone}")
            };
            Verdict::new(
                REGISTERED,
                Status::True,
                "Registered",
                format!("resolvable as {name}.{ns}.{cluster}.{CLUSTER_TREE}.{zone}{fleet_wide}"),
            )
        }
        Err(e) => {
            tracing::info!(error = %e, "registration failed");
            ctx.registrations.set_failed(&ObjectRef::from_obj(ms), true);
            Verdict::new(REGISTERED, Status::False, e.category(), e.to_string())
        }
    }
}

async fn remove_records(
    ctx: &Context,
    registry: &Registry,
    ms: &Microservice,
) -> Result<(), RegistryError> {
    let me = writer(ctx);
    let keys = entry(ctx, ms).keys(registry.zone())?;
    let existing = observed(ctx, registry.read(&keys).await)?;
    let ops = plan_remove(&keys, &existing, &me)?;
    // Written even with no record left: a registration planned before the
    // deletion may still be on its way (#67).
    fenced(ctx)?;
    observed(ctx, registry.retire(&ops, &uid_of(ms)).await)
}

/// The object's uid, which its tombstone is keyed by; an object the
/// apiserver gave none (never, for a stored one) shares the empty key.
fn uid_of(ms: &Microservice) -> String {
    ms.metadata.uid.clone().unwrap_or_default()
}

/// Seed 001's contract for a Microservice being deleted: records first,
/// finalizer second; while etcd cannot be reached, `CleanupBlocked=True`
/// and a Warning, and the finalizer stays.
pub async fn on_deletion(ctx: &Context, ms: &Microservice) -> Result<Deletion> {
    if !has_finalizer(ms) {
        return Ok(Deletion::NotOurs);
    }
    let Some(registration) = &ctx.settings.registry else {
        set_finalizer(ctx, ms, false).await?;
        return Ok(Deletion::Released);
    };
    let removed = match registration.get() {
        Ok(registry) => remove_records(ctx, registry, ms).await,
        Err(e) => Err(e),
    };
    match removed {
        // A record at our name that is not ours is not ours to remove.
        Ok(())
        | Err(RegistryError::Refused(Refusal::Foreign { .. }))
        | Err(RegistryError::Invalid(_)) => {
            ctx.registrations.forget(&ObjectRef::from_obj(ms));
            set_finalizer(ctx, ms, false).await?;
            tracing::info!("registry records removed; finalizer released");
            Ok(Deletion::CleanedUp)
        }
        Err(RegistryError::Refused(Refusal::Deposed { .. })) | Err(RegistryError::NotLeading) => {
            Err(ReconcileError::NotLeader)
        }
        Err(e) => {
            let message = format!("the registry records cannot be removed yet: {e}");
            let verdict =
                Verdict::new(CLEANUP_BLOCKED, Status::True, e.category(), message.clone());
            if set_condition(ctx, ms, verdict).await? {
                ctx.announcer.warning(ms, "CleanupBlocked", message);
            }
            Ok(Deletion::Blocked)
        }
    }
}

/// Writes one condition on an object being deleted (no other conclusion
/// applies to it); whether it changed anything.
async fn set_condition(ctx: &Context, ms: &Microservice, verdict: Verdict) -> Result<bool> {
    let status = ms.status.clone().unwrap_or_default();
    let generation = ms.metadata.generation.unwrap_or(0);
    let conditions = transition(
        &status.conditions,
        &[verdict],
        generation,
        &super::status_writer::now(),
    );
    if conditions == status.conditions {
        return Ok(false);
    }
    let mut next = ms.clone();
    next.status = Some(crate::crd::MicroserviceStatus {
        conditions,
        ..status
    });
    ctx.ensure_leading()?;
    let api = api_of(ctx, ms);
    let params = post_params();
    let written = api
        .replace_status(&ms.name_any(), &params, &next)
        .await
        .map_err(|e| ReconcileError::api("update_status", "Microservice", e))?;
    ctx.written.record(ms.resource_version(), written);
    Ok(true)
}
