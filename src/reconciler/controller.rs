//! Wiring one cluster's watches into a kube-runtime Controller.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::controller::{self, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use kube::{Api, Client};

use super::Backoff;
use super::context::{Context, Hooks, Settings};
use super::reconcile::{error_policy, reconcile};
use crate::crd::Microservice;

const BACKOFF_BASE: Duration = Duration::from_millis(5);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

fn scoped<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Runs the controller until `shutdown` resolves, then lets in-flight
/// reconciles finish.
pub async fn run(
    client: Client,
    settings: Settings,
    hooks: Hooks,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let ns = settings.namespace.clone();
    // Children carry our managed-by label; watching only those keeps the
    // caches small. EndpointSlices inherit the Service's labels.
    let base = crate::watching::config(settings.streaming_lists);
    let managed = crate::watching::managed(settings.streaming_lists);

    let (deployments, dep_writer) = reflector::store();
    let dep_stream = watcher(
        scoped::<Deployment>(&client, ns.as_deref()),
        managed.clone(),
    )
    .default_backoff()
    .reflect(dep_writer)
    .touched_objects();
    let (services, svc_writer) = reflector::store();
    let svc_stream = watcher(scoped::<Service>(&client, ns.as_deref()), managed.clone())
        .default_backoff()
        .reflect(svc_writer)
        .touched_objects();
    let (slices, slice_writer) = reflector::store();
    let slice_stream = watcher(scoped::<EndpointSlice>(&client, ns.as_deref()), managed)
        .default_backoff()
        .reflect(slice_writer)
        .touched_objects();

    let (ms_reader, ms_writer) = reflector::store();
    // Only spec changes (generation) trigger: our own status writes do not loop.
    let ms_stream = watcher(scoped::<Microservice>(&client, ns.as_deref()), base)
        .default_backoff()
        .reflect(ms_writer)
        .applied_objects()
        .predicate_filter(predicates::generation, Default::default());

    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "flotilla".into(),
            instance: Some(settings.writer.holder.clone()),
        },
    );
    let concurrency = settings.concurrency;
    let cluster = settings.cluster.clone();
    let ctx = Arc::new(Context {
        client,
        settings,
        deployments,
        services,
        slices,
        recorder,
        backoff: Mutex::new(Backoff::new(BACKOFF_BASE, BACKOFF_MAX)),
        hooks,
    });

    Controller::for_stream(ms_stream, ms_reader)
        .owns_stream(dep_stream)
        .owns_stream(svc_stream)
        .watches_stream(slice_stream, |slice: EndpointSlice| {
            let ns = slice.metadata.namespace.clone();
            let service = slice
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("kubernetes.io/service-name").cloned());
            match (ns, service) {
                (Some(ns), Some(name)) => Some(ObjectRef::<Microservice>::new(&name).within(&ns)),
                _ => None,
            }
        })
        .with_config(controller::Config::default().concurrency(concurrency))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| {
            if let Err(e) = result {
                tracing::debug!(k8s.cluster.name = %cluster, error = %e, "controller event");
            }
            futures::future::ready(())
        })
        .await;
}
