//! Wiring one cluster's watches into a kube-runtime Controller.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{self, Controller};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

use super::Backoff;
use super::announce::Announcer;
use super::child_watches::ChildWatches;
use super::coalesce::Held;
use super::context::{Context, Hooks, Settings};
use super::endpoints::ReadyEndpoints;
use super::names;
use super::reconcile::{error_policy, reconcile};
use super::throttle::Throttle;
use super::triggers::{Triggers, owner_of};
use super::written::Written;
use crate::crd::Microservice;
use crate::watching::{tracked, without_errors};

/// Which child triggers reach the scheduler.
#[derive(Clone)]
struct Gate {
    microservices: Store<Microservice>,
    throttle: Arc<Throttle<ObjectRef<Microservice>>>,
}

/// A child's change wakes `owner`, noting why, when `owner` is a
/// Microservice the store holds (one that is gone, or a stranger's name no
/// Microservice has, is nothing to note or wake: notes for it would never
/// be taken) and the throttle lets it through.
fn waking(
    triggers: &Triggers,
    gate: &Gate,
    owner: Option<ObjectRef<Microservice>>,
    kind: &'static str,
) -> Option<ObjectRef<Microservice>> {
    let owner = owner?;
    gate.microservices.get(&owner)?;
    triggers.note(owner.clone(), kind);
    gate.throttle
        .admit(&owner, tokio::time::Instant::now())
        .then_some(owner)
}

const BACKOFF_BASE: Duration = Duration::from_millis(5);
const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// A deletion blocked on the registry retries from 1 s to 10 s apart, so
/// cleanup follows within seconds of etcd's return.
const CLEANUP_BACKOFF_BASE: Duration = Duration::from_secs(1);
const CLEANUP_BACKOFF_MAX: Duration = Duration::from_secs(10);

/// Triggers on a new spec, and on the deletion (which a finalizer turns
/// into an update whose generation the API server may leave alone).
fn generation_or_deleting(ms: &Microservice) -> Option<u64> {
    let generation = u64::try_from(ms.metadata.generation?).ok()?;
    Some(generation * 2 + u64::from(ms.metadata.deletion_timestamp.is_some()))
}

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
    let cluster = settings.cluster.clone();
    // Children carry our managed-by label; watching only those keeps the
    // caches small. EndpointSlices inherit the Service's labels.
    let base = crate::watching::config(settings.streaming_lists);
    let managed = crate::watching::managed(settings.streaming_lists);
    // Each trigger notes what it wakes, so a reconcile knows why it ran.
    let triggers = Arc::new(Triggers::default());
    let watches = ChildWatches::default();
    let scope = (&client, ns.as_deref(), cluster.as_str());
    let deployments = children::<Deployment>(
        scope,
        &managed,
        &watches.deployments,
        ("deployments", "Deployment"),
    );
    let services = children::<Service>(scope, &managed, &watches.services, ("services", "Service"));
    // Slices are not stored: only each Service's ready-endpoint count.
    let endpoints = Arc::new(ReadyEndpoints::default());
    let slices = slices(scope, &managed, &watches, endpoints.clone());
    let written = Arc::new(Written::default());
    let held = Arc::new(Held::default());
    let announcer = Announcer::start(crate::telemetry::events::Sender::new(
        client.clone(),
        Reporter {
            controller: "flotilla".into(),
            instance: Some(settings.writer.holder.clone()),
        },
    ));
    let forget = Forget {
        triggers: triggers.clone(),
        written: written.clone(),
        held: held.clone(),
        announcer: announcer.clone(),
    };
    let (ms_reader, ms_stream) = microservices(scope, &base, forget);
    // Every Deployment and Service name in the scope, ours or not.
    let (deployment_names, dep_names) = names::watch(
        scoped::<PartialObjectMeta<Deployment>>(&client, ns.as_deref()),
        base.clone(),
    );
    let dep_names = without_errors(dep_names, cluster.clone(), "Deployment names");
    let (service_names, svc_names) = names::watch(
        scoped::<PartialObjectMeta<Service>>(&client, ns.as_deref()),
        base.clone(),
    );
    let svc_names = without_errors(svc_names, cluster.clone(), "Service names");
    let (concurrency, debounce, debounce_max) = (
        settings.concurrency,
        settings.debounce,
        settings.debounce_max,
    );
    let ctx = Arc::new(Context {
        client,
        settings,
        deployments: deployments.0,
        services: services.0,
        endpoints,
        announcer,
        backoff: Mutex::new(Backoff::new(BACKOFF_BASE, BACKOFF_MAX)),
        hooks,
        triggers: triggers.clone(),
        written,
        held,
        deployment_names,
        service_names,
        deployments_created: Default::default(),
        services_created: Default::default(),
        registrations: Default::default(),
        cleanup_backoff: Mutex::new(Backoff::new(CLEANUP_BACKOFF_BASE, CLEANUP_BACKOFF_MAX)),
        watches: watches.clone(),
    });
    // Children wake the Microservice that controls them, noting why as
    // they do: the note is taken only where the trigger is made.
    let gate = Gate {
        microservices: ms_reader.clone(),
        throttle: Arc::new(Throttle::new(debounce, debounce_max)),
    };
    let sweep = sweeping(ctx.clone(), ms_reader.clone());
    let prune = pruning(ctx.clone(), ms_reader.clone(), gate.throttle.clone());
    let wake = |kind: &'static str| {
        let (notes, g) = (triggers.clone(), gate.clone());
        move |owner: Option<ObjectRef<Microservice>>| waking(&notes, &g, owner, kind)
    };
    let (by_deployment, by_service) = (wake("Deployment"), wake("Service"));
    let (dep_stranger, svc_stranger, by_slice) =
        (wake("Stranger"), wake("Stranger"), wake("EndpointSlice"));
    let controller = Controller::for_stream(ms_stream, ms_reader)
        .watches_stream(deployments.1, move |d: Deployment| {
            by_deployment(owner_of(&d.metadata))
        })
        .watches_stream(services.1, move |s: Service| {
            by_service(owner_of(&s.metadata))
        })
        // A stranger's change may free a name a Microservice is blocked on.
        .watches_stream(dep_names, {
            let (created, names) = (
                ctx.deployments_created.clone(),
                ctx.deployment_names.clone(),
            );
            move |m| {
                created.on_name_change(&names, &m);
                dep_stranger(names::blocked_by(&m))
            }
        })
        .watches_stream(svc_names, {
            let (created, names) = (ctx.services_created.clone(), ctx.service_names.clone());
            move |m| {
                created.on_name_change(&names, &m);
                svc_stranger(names::blocked_by(&m))
            }
        })
        .watches_stream(slices, move |slice: EndpointSlice| {
            by_slice(slice_owner(&slice))
        })
        // A child watch going stale, or coming back, moves every verdict.
        .reconcile_all_on(staleness_changes(watches))
        // The trigger streams' errors pause all triggers by their own
        // backoff; kube's default grows to 30 s and kept a member that came
        // back from a 5 s outage unwatched for a minute.
        .trigger_backoff(crate::watching::backoff())
        .with_config(
            controller::Config::default()
                .concurrency(concurrency)
                .debounce(debounce),
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| {
            if let Err(e) = result {
                tracing::debug!(k8s.cluster.name = %cluster, error = %e, "controller event");
            }
            futures::future::ready(())
        });
    // The sweeps live as long as the controller (this leadership term).
    tokio::select! {
        _ = controller => {}
        _ = sweep => {}
        _ = prune => {}
    }
}

/// Where a controller watches: the client, its namespace, the cluster's name.
type Scope<'a> = (&'a Client, Option<&'a str>, &'a str);

/// One kind of child we manage: its watch cache, and the objects it touches.
fn children<K>(
    (client, ns, cluster): Scope,
    managed: &watcher::Config,
    health: &Arc<crate::watching::WatchHealth>,
    (resource, kind): (&'static str, &'static str),
) -> (
    Store<K>,
    impl futures::Stream<Item = Result<K, watcher::Error>> + Send + use<K>,
)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let stream = tracked(
        crate::watching::retried(watcher(scoped::<K>(client, ns), managed.clone())),
        health.clone(),
        cluster.to_string(),
        resource,
    )
    .modify(crate::watching::strip)
    .reflect(writer)
    .touched_objects();
    (store, without_errors(stream, cluster.to_string(), kind))
}

/// EndpointSlices: not stored, only counted into each Service's ready
/// endpoints.
fn slices(
    (client, ns, cluster): Scope,
    managed: &watcher::Config,
    watches: &ChildWatches,
    tally: Arc<ReadyEndpoints>,
) -> impl futures::Stream<Item = Result<EndpointSlice, watcher::Error>> + Send + use<> {
    let stream = tracked(
        crate::watching::retried(watcher(
            scoped::<EndpointSlice>(client, ns),
            managed.clone(),
        )),
        watches.endpoint_slices.clone(),
        cluster.to_string(),
        "endpointslices",
    )
    .inspect(move |e| {
        if let Ok(e) = e {
            tally.apply(e);
        }
    })
    .touched_objects();
    without_errors(stream, cluster.to_string(), "EndpointSlice")
}

/// The Microservice an EndpointSlice counts for: its Service's name.
fn slice_owner(slice: &EndpointSlice) -> Option<ObjectRef<Microservice>> {
    let ns = slice.metadata.namespace.as_deref()?;
    let service = slice
        .metadata
        .labels
        .as_ref()?
        .get("kubernetes.io/service-name")?;
    Some(ObjectRef::<Microservice>::new(service).within(ns))
}

/// What the controller remembers of a Microservice, dropped when it is deleted.
struct Forget {
    triggers: Arc<Triggers>,
    written: Arc<Written>,
    held: Arc<Held>,
    announcer: Arc<Announcer>,
}

/// The Microservices: their cache, and the stream that triggers. Only spec
/// changes (generation) trigger: our own status writes do not loop.
fn microservices(
    (client, ns, cluster): Scope,
    base: &watcher::Config,
    forget: Forget,
) -> (
    Store<Microservice>,
    impl futures::Stream<Item = Result<Microservice, watcher::Error>> + Send + use<>,
) {
    let (reader, writer) = reflector::store();
    let notes = forget.triggers.clone();
    let stream =
        crate::watching::retried(watcher(scoped::<Microservice>(client, ns), base.clone()))
            .modify(crate::watching::strip)
            .reflect(writer)
            // A deleted Microservice is not reconciled again: drop what the
            // controller remembers of it here.
            .inspect(move |e| {
                if let Ok(watcher::Event::Delete(gone)) = e {
                    let gone = ObjectRef::from_obj(gone);
                    forget.triggers.forget(&gone);
                    forget.written.forget(&gone);
                    forget.held.clear(&gone);
                    forget.announcer.forget(&gone);
                }
            })
            .applied_objects()
            .predicate_filter(generation_or_deleting, Default::default())
            .inspect(move |m| {
                if let Ok(m) = m {
                    notes.note(ObjectRef::from_obj(m), "Microservice");
                }
            });
    (
        reader,
        without_errors(stream, cluster.to_string(), "Microservice"),
    )
}

/// Emits whenever the set of stale child watches changes (checked every
/// second), so every Microservice is concluded again.
fn staleness_changes(watches: ChildWatches) -> impl futures::Stream<Item = ()> + Send {
    futures::stream::unfold(
        (watches, Vec::<&'static str>::new()),
        |(watches, mut was)| async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let now: Vec<&'static str> = watches
                    .stale(tokio::time::Instant::now())
                    .into_iter()
                    .map(|(kind, _)| kind)
                    .collect();
                if now != was {
                    was = now;
                    return Some(((), (watches, was)));
                }
            }
        },
    )
}

/// How often the per-object notes are pruned against the store.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// Every `PRUNE_EVERY`, drops what the controller remembers of objects the
/// store no longer holds: a Microservice deleted while a watch was down
/// brings no Delete event, so `forget` never ran for it. Never returns.
async fn pruning(
    ctx: Arc<Context>,
    microservices: Store<Microservice>,
    throttle: Arc<Throttle<ObjectRef<Microservice>>>,
) {
    loop {
        tokio::time::sleep(PRUNE_EVERY).await;
        if !matches!(
            microservices.wait_until_ready().now_or_never(),
            Some(Ok(()))
        ) {
            continue;
        }
        prune(&ctx, |k| microservices.get(k).is_some());
        throttle.close(tokio::time::Instant::now());
        publish_notes(&ctx, &throttle);
    }
}

/// How much the controller remembers, per map: the figure that shows its
/// memory is bounded by the store, not by how many objects ever lived.
fn publish_notes(ctx: &Context, throttle: &Throttle<ObjectRef<Microservice>>) {
    let backoff = |b: &std::sync::Mutex<Backoff<ObjectRef<Microservice>>>| {
        b.lock().unwrap_or_else(|e| e.into_inner()).tracked()
    };
    let counts = [
        ("triggers", ctx.triggers.tracked()),
        ("written", ctx.written.tracked()),
        ("held", ctx.held.tracked()),
        ("announced", ctx.announcer.tracked()),
        ("backoff", backoff(&ctx.backoff)),
        ("cleanup_backoff", backoff(&ctx.cleanup_backoff)),
        ("deployments_created", ctx.deployments_created.tracked()),
        ("services_created", ctx.services_created.tracked()),
        ("throttle", throttle.tracked()),
    ];
    for (map, n) in counts {
        crate::telemetry::metrics::METRICS
            .reconciler_notes
            .set(&[&ctx.settings.cluster, map], n as f64);
    }
}

fn prune(ctx: &Context, alive: impl Fn(&ObjectRef<Microservice>) -> bool) {
    ctx.triggers.retain(&alive);
    ctx.written.retain(&alive);
    ctx.held.retain(&alive);
    ctx.announcer.retain(&alive);
    for backoff in [&ctx.backoff, &ctx.cleanup_backoff] {
        backoff
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(&alive);
    }
}

/// Every `registry_sweep`, removes this cluster's registry records whose
/// Microservice is gone. Never returns while registration is on.
async fn sweeping(ctx: Arc<Context>, microservices: Store<Microservice>) {
    let Some(crate::registry::Registration::Ready(registry)) = ctx.settings.registry.clone() else {
        return futures::future::pending().await;
    };
    let me = crate::registry::records::Writer {
        cluster: ctx.settings.cluster.clone(),
        epoch: i64::from(ctx.settings.writer.epoch.unwrap_or(0)),
        lease: ctx.settings.writer.lease.clone().unwrap_or_default(),
    };
    let scope = ctx.settings.namespace.clone();
    loop {
        tokio::time::sleep(ctx.settings.registry_sweep).await;
        let synced = matches!(
            microservices.wait_until_ready().now_or_never(),
            Some(Ok(()))
        );
        if !synced || ctx.ensure_leading().is_err() {
            continue;
        }
        // Outside our namespace we know nothing: those records stay.
        let alive = |ns: &str, name: &str| {
            scope.as_deref().is_some_and(|s| s != ns)
                || microservices
                    .get(&ObjectRef::new(name).within(ns))
                    .is_some()
        };
        if let Err(e) = crate::registry::sweep::sweep_cluster(&registry, &me, alive).await {
            tracing::debug!(k8s.cluster.name = %me.cluster, error = %e, "registry sweep will retry");
        }
    }
}
