//! Reading and writing the two children. Reads come from the watch caches
//! (no API call in steady state). A child missing from our cache is missing
//! if no object holds its name; only a name held by something our cache
//! does not show (a stranger, or our own object not yet seen) is looked up
//! live, so that a stranger's object is never mistaken for a missing one.

use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use kube::api::PostParams;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::Instrument;

use super::context::{Context, FIELD_MANAGER};
use super::error::{ReconcileError, Result};
use super::names::{self, Names};
use crate::domain::update::for_create;

/// What happened to one child in this reconcile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    Unchanged,
    Created,
    Updated,
}

pub async fn live<K>(
    ctx: &Context,
    cache: &Store<K>,
    names: &Names<K>,
    ns: &str,
    name: &str,
    kind: &'static str,
) -> Result<Option<K>>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Debug,
{
    if let Some(obj) = cache.get(&ObjectRef::new(name).within(ns)) {
        return Ok(Some((*obj).clone()));
    }
    if !names::taken(names, ns, name) {
        // Free: a create that loses a race to a new stranger gets 409,
        // and the retry takes this path with the name known.
        return Ok(None);
    }
    Api::<K>::namespaced(ctx.client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(|e| ReconcileError::api("get", kind, e))
}

fn post_params() -> PostParams {
    PostParams {
        dry_run: false,
        field_manager: Some(FIELD_MANAGER.into()),
    }
}

/// Creates `desired` when missing, replaces it (conditionally, on the live
/// resourceVersion) when out of sync, and leaves it alone otherwise.
pub async fn apply<K>(
    ctx: &Context,
    ns: &str,
    live: Option<K>,
    desired: &K,
    kind: &'static str,
    in_sync: fn(&K, &K) -> bool,
    update: fn(&K, &K, &std::collections::BTreeMap<String, String>) -> K,
) -> Result<(K, Write)>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Serialize
        + Debug,
{
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
            Ok((updated, Write::Updated))
        }
    }
}
