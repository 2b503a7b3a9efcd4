//! Reading and writing the two children. Reads come from the watch caches
//! (no API call in steady state). A child missing from our cache is missing
//! if no object holds its name; only a name held by something our cache
//! does not show (a stranger, or our own object not yet seen) is looked up
//! live, so that a stranger's object is never mistaken for a missing one.
//! A child we created that the watches do not show yet is taken from our
//! note of the create (`created.rs`); one the watches show from before our
//! last update is taken from our note of the update.

use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, PostParams, Preconditions, PropagationPolicy};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::Instrument;

use super::context::{Child, Context, FIELD_MANAGER};
use super::error::{ReconcileError, Result};
use crate::domain::update::for_create;

/// What happened to one child in this reconcile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    Unchanged,
    Created,
    Updated,
}

pub async fn live<K>(ctx: &Context, child: &Child<'_, K>, ns: &str, name: &str) -> Result<Option<K>>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Debug
        + 'static,
{
    if let Some(obj) = child.cache.get(&ObjectRef::new(name).within(ns)) {
        // Our update, when the cache still shows the object before it.
        if let Some(ours) = child.created.newer_than(&obj) {
            return Ok(Some(ours));
        }
        let meta = obj.meta();
        child
            .created
            .seen(ns, name, meta.uid.as_deref(), meta.generation);
        return Ok(Some((*obj).clone()));
    }
    let holder = child
        .names
        .get(&ObjectRef::new(name).within(ns))
        .map(|m| m.metadata.uid.clone());
    if let Some(ours) = child.created.unseen(ns, name, tokio::time::Instant::now()) {
        // Our create, not yet shown by the caches: it is the live object,
        // unless the name now belongs to another object.
        if holder.as_ref().is_none_or(|uid| *uid == ours.meta().uid) {
            return Ok(Some(ours));
        }
    }
    if holder.is_none() {
        // Free: a create that loses a race to a new stranger gets 409,
        // and the retry takes this path with the name known.
        return Ok(None);
    }
    Api::<K>::namespaced(ctx.client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(|e| ReconcileError::api("get", child.kind, e))
}

/// Deletes a child an earlier Microservice of the same name left, exactly
/// that object (a uid precondition), unless it is already being deleted.
/// Gone already, or replaced meanwhile: nothing to do.
pub async fn delete_leftover<K>(
    ctx: &Context,
    child: &Child<'_, K>,
    ns: &str,
    meta: &ObjectMeta,
) -> Result<()>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Debug
        + 'static,
{
    if meta.deletion_timestamp.is_some() {
        return Ok(());
    }
    ctx.ensure_leading()?;
    let kind = child.kind;
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: meta.uid.clone(),
            resource_version: None,
        }),
        propagation_policy: Some(PropagationPolicy::Background),
        ..DeleteParams::default()
    };
    let name = meta.name.clone().unwrap_or_default();
    match Api::<K>::namespaced(ctx.client.clone(), ns)
        .delete(&name, &params)
        .instrument(tracing::info_span!("k8s.write", verb = "delete", kind))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(ReconcileError::api("delete", kind, e)),
    }
}

pub(super) fn post_params() -> PostParams {
    PostParams {
        dry_run: false,
        field_manager: Some(FIELD_MANAGER.into()),
    }
}

/// Creates `desired` when missing, replaces it (conditionally, on the live
/// resourceVersion) when out of sync, and leaves it alone otherwise.
pub async fn apply<K>(
    ctx: &Context,
    child: &Child<'_, K>,
    ns: &str,
    live: Option<K>,
    desired: &K,
    in_sync: fn(&K, &K) -> bool,
    update: fn(&K, &K, &std::collections::BTreeMap<String, String>) -> K,
) -> Result<(K, Write)>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Serialize
        + Debug
        + 'static,
{
    let kind = child.kind;
    let api = Api::<K>::namespaced(ctx.client.clone(), ns);
    let stamp = ctx.settings.writer.annotations();
    match live {
        None => {
            ctx.ensure_leading()?;
            let obj = for_create(desired, &stamp);
            let created = api
                .create(&post_params(), &obj)
                .instrument(tracing::info_span!("k8s.write", verb = "create", kind))
                .await
                .map_err(|e| ReconcileError::api("create", kind, e))?;
            child.created.record(&created, tokio::time::Instant::now());
            Ok((created, Write::Created))
        }
        Some(current) if in_sync(&current, desired) => Ok((current, Write::Unchanged)),
        Some(current) => {
            ctx.ensure_leading()?;
            let next = update(&current, desired, &stamp);
            let name = desired.meta().name.clone().unwrap_or_default();
            let updated = api
                .replace(&name, &post_params(), &next)
                .instrument(tracing::info_span!("k8s.write", verb = "update", kind))
                .await
                .map_err(|e| ReconcileError::api("update", kind, e))?;
            child.created.record(&updated, tokio::time::Instant::now());
            Ok((updated, Write::Updated))
        }
    }
}
