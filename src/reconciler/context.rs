//! What every reconcile of one cluster shares.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource};

use super::Backoff;
use super::created::Created;
use super::names::Names;
use crate::crd::Microservice;
use crate::domain::desired::PlatformDefaults;

pub const ANNOTATION_WRITER: &str = "platform.example.io/writer";
pub const ANNOTATION_EPOCH: &str = "platform.example.io/epoch";
pub const FIELD_MANAGER: &str = "flotilla";

/// Who writes: stamped on every child written, so audits can prove that
/// there was one writer at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterIdentity {
    pub holder: String,
    /// The leadership epoch (the Lease's `leaseTransitions`), once elected.
    pub epoch: Option<i32>,
    /// The uid of the Lease that epoch counts on, when it could be read:
    /// registry records compare terms of the same Lease only (#59).
    pub lease: Option<String>,
}

impl WriterIdentity {
    pub fn annotations(&self) -> BTreeMap<String, String> {
        let mut a = BTreeMap::from([(ANNOTATION_WRITER.to_string(), self.holder.clone())]);
        if let Some(epoch) = self.epoch {
            a.insert(ANNOTATION_EPOCH.to_string(), epoch.to_string());
        }
        a
    }
}

/// The default debounce: long enough to take in a rollout's burst of child
/// events (a Deployment's status and its EndpointSlice move within
/// milliseconds of each other), short against a human's wait.
pub const DEBOUNCE: Duration = Duration::from_millis(200);

/// The bound on the debounce: a storm of child events (a large rollout,
/// crash-looping pods) defers a reconcile at most this long.
pub const DEBOUNCE_MAX: Duration = Duration::from_secs(1);

/// How one cluster's controller behaves.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The cluster's name, for logs, spans and metrics.
    pub cluster: String,
    /// Watch one namespace only; `None` watches all.
    pub namespace: Option<String>,
    pub defaults: PlatformDefaults,
    /// The safety-net resync; watches repair drift before it comes round.
    pub resync: Duration,
    pub writer: WriterIdentity,
    /// Reconciles in flight at once for this cluster.
    pub concurrency: u16,
    /// When set, every write first checks that this replica still leads the
    /// cluster (within its renew deadline); otherwise the write is refused.
    pub leadership: Option<tokio::sync::watch::Receiver<crate::lease::elector::Leadership>>,
    /// Start watches with streaming lists rather than LIST requests.
    pub streaming_lists: bool,
    /// A reconcile waits until its object's triggers have been quiet this
    /// long, so the burst of child events after a write is one reconcile.
    pub debounce: Duration,
    /// The longest a storm of child events may defer a reconcile.
    pub debounce_max: Duration,
    /// The fleet service registry, when registration is on.
    pub registry: Option<crate::registry::Registration>,
    /// How often the leader sweeps its cluster's stale registry records.
    pub registry_sweep: Duration,
    /// A fleet DNS writer keeps the fleet-wide names (fleet mode): this
    /// leader writes its cluster's own name only.
    pub fleet_dns: bool,
}

impl Settings {
    pub fn new(cluster: impl Into<String>, writer: WriterIdentity) -> Self {
        Settings {
            cluster: cluster.into(),
            namespace: None,
            defaults: PlatformDefaults::default(),
            resync: Duration::from_secs(300),
            writer,
            concurrency: 16,
            streaming_lists: true,
            debounce: DEBOUNCE,
            debounce_max: DEBOUNCE_MAX,
            leadership: None,
            registry: None,
            registry_sweep: Duration::from_secs(60),
            fleet_dns: false,
        }
    }
}

type Hook = Arc<dyn Fn(String) -> BoxFuture<'static, ()> + Send + Sync>;

/// One finished reconcile, as the test seam sees it.
#[derive(Debug, Clone)]
pub struct Reconciled {
    pub name: String,
    /// What woke it: child kinds, "Microservice", "Stranger", or "Requeue".
    pub triggers: Vec<&'static str>,
    /// The bounded outcome label (Applied, InSync, an error category...).
    pub outcome: &'static str,
}

/// Test seams: points where a test can pause a reconcile to stage a race.
/// Production code leaves them empty.
#[derive(Clone, Default)]
pub struct Hooks {
    /// Runs as each reconcile starts, with the Microservice's name: tests
    /// hold reconciles while they stage several changes for one of them.
    pub before_reconcile: Option<Hook>,
    /// Runs after both children are written and before status is concluded,
    /// with the Microservice's name.
    pub after_children_applied: Option<Hook>,
    /// Told of every finished reconcile: tests prove which watch woke it.
    pub on_reconciled: Option<Arc<dyn Fn(Reconciled) + Send + Sync>>,
}

impl Context {
    /// An early check before a write is built: refuse unless this replica
    /// leads at this term's epoch. The wire fence checks again, later.
    pub fn ensure_leading(&self) -> Result<(), super::ReconcileError> {
        let Some(rx) = &self.settings.leadership else {
            return Ok(());
        };
        crate::lease::fence::admit(
            &rx.borrow(),
            self.settings.writer.epoch,
            tokio::time::Instant::now(),
        )
        .map(|_| ())
        .map_err(|_| super::ReconcileError::NotLeader)
    }
}

pub(crate) struct Context {
    pub client: Client,
    pub settings: Settings,
    pub deployments: Store<Deployment>,
    pub services: Store<Service>,
    pub endpoints: Arc<super::endpoints::ReadyEndpoints>,
    pub announcer: Arc<super::announce::Announcer>,
    pub backoff: Mutex<Backoff<ObjectRef<Microservice>>>,
    pub hooks: Hooks,
    pub triggers: Arc<super::triggers::Triggers>,
    pub written: Arc<super::written::Written>,
    /// Every Deployment and Service name in the scope, metadata only.
    pub held: Arc<super::coalesce::Held>,
    pub deployment_names: super::names::Names<Deployment>,
    pub service_names: super::names::Names<Service>,
    /// Children created here that the watches may not show yet.
    pub deployments_created: Arc<Created<Deployment>>,
    pub services_created: Arc<Created<Service>>,
    /// Registry records known to be in etcd.
    pub registrations: super::registered::Registrations,
    /// Retries of a deletion blocked on the registry.
    pub cleanup_backoff: Mutex<Backoff<ObjectRef<Microservice>>>,
    /// Whether the child watches keep their caches current.
    pub watches: super::child_watches::ChildWatches,
}

impl Context {
    pub fn deployment_child(&self) -> Child<'_, Deployment> {
        Child {
            kind: "Deployment",
            cache: &self.deployments,
            names: &self.deployment_names,
            created: &self.deployments_created,
        }
    }

    pub fn service_child(&self) -> Child<'_, Service> {
        Child {
            kind: "Service",
            cache: &self.services,
            names: &self.service_names,
            created: &self.services_created,
        }
    }

    /// Whether a child created here is still unseen by the watches.
    pub fn awaiting_watch(&self, ns: &str, name: &str) -> bool {
        self.deployments_created.awaiting(ns, name) || self.services_created.awaiting(ns, name)
    }
}

/// Where one kind of child is known from: our watch cache, the names
/// watch, and our notes of recent creates.
pub struct Child<'a, K: Resource<DynamicType = ()> + 'static> {
    pub kind: &'static str,
    pub cache: &'a Store<K>,
    pub names: &'a Names<K>,
    pub created: &'a Created<K>,
}
