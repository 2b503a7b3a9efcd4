//! `flotilla.v1.FleetStatus`, answered from this replica's index.

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::deadline;
use super::errors::{self, Reason, Refusal};
use super::request;
use super::wait::{self, Floors};
use super::watch::{self as watch_stream, WatchLimits};
use super::{ApiError, convert, pb};
use crate::authz::access::{Access, Caller, Resource};
use crate::authz::gate::Gate;
use crate::serve::streams::{self, Streams};
use crate::status::hub::Hub;
use crate::status::index::{Filter, Key, MicroserviceView};
use crate::status::live::Live;
use crate::status::view::{self, Entry, RolloutResult};
use crate::telemetry::links;
use tracing::Instrument;

pub type EventStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

pub struct FleetStatusService {
    pub hub: Arc<Hub>,
    /// The longest a WaitForRollout may run.
    pub max_wait: Duration,
    /// Open watch and wait streams, against the server-wide cap.
    pub streams: Arc<Streams>,
    /// How long a stream's reader may leave its buffer full.
    pub stall: Duration,
    pub watch: WatchLimits,
    /// Turns true when the server shuts down: every stream ends UNAVAILABLE.
    pub shutdown: watch::Receiver<bool>,
    /// The tokens and TLS files in force: a watch ends when one changes.
    pub credentials: Vec<watch::Receiver<u64>>,
    /// Reads of members' live objects; `None`: no floors (a server fed an
    /// index directly, without members).
    pub live: Option<Live>,
    /// The registry's fleet-wide names, when fleet DNS is on.
    pub dns: Option<crate::dns::lookup::DnsLookup>,
    /// Who calls, and whether they may (#34).
    pub gate: Gate,
    /// The most a List page holds encoded; fewer items then, and a token.
    pub page_bytes: usize,
    /// What every List reply not yet sent may hold (`replies`).
    pub replies: super::replies::ReplyBudget,
}

impl FleetStatusService {
    /// Before the cluster registry is read, "in no cluster" and "no such
    /// cluster" would be guesses: every call is UNAVAILABLE until then.
    fn registry_read(&self) -> Result<(), Status> {
        if self.hub.read(|ix| ix.registry_was_read()) {
            Ok(())
        } else {
            Err(ApiError::refused(
                Reason::RegistryNotRead,
                "this replica has not read its cluster registry yet; retry",
            )
            .into())
        }
    }
}

impl FleetStatusService {
    /// Narrows `filter` to what `caller` may `verb`: a named namespace
    /// needs the right there; no namespace shows only those where it holds.
    async fn restrict(
        &self,
        caller: &Caller,
        filter: &mut Filter,
        verb: &'static str,
        method: &'static str,
    ) -> Result<(), Status> {
        match &filter.namespace {
            Some(ns) => {
                let access = Access::new(verb, Resource::Microservices).in_namespace(ns);
                Ok(self.gate.require(caller, &access, method).await?)
            }
            None => {
                // The scan runs outside the index lock.
                let present = self.hub.read(|ix| ix.snapshot()).namespaces();
                let visible = self
                    .gate
                    .visible(caller, verb, Resource::Microservices, present, method)
                    .await?;
                filter.visible = visible.map(Arc::new);
                Ok(())
            }
        }
    }
}

pub(super) fn grpc_timeout<T>(req: &Request<T>) -> Option<Duration> {
    req.metadata()
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(deadline::parse_grpc_timeout)
}

#[tonic::async_trait]
impl pb::fleet_status_server::FleetStatus for FleetStatusService {
    async fn list_clusters(
        &self,
        request: Request<pb::ListClustersRequest>,
    ) -> Result<Response<pb::ListClustersResponse>, Status> {
        const METHOD: &str = "ListClusters";
        let caller = self.gate.caller(&request, METHOD).await?;
        let access = Access::new("list", Resource::MemberClusters);
        self.gate.require(&caller, &access, METHOD).await?;
        self.registry_read()?;
        let snap = self.hub.read(|ix| ix.snapshot());
        let clusters = snap
            .clusters()
            .iter()
            .map(|(name, c)| convert::cluster(name, c, snap.microservices_in(name)))
            .collect();
        Ok(Response::new(pb::ListClustersResponse {
            clusters,
            replica_id: self.hub.replica_id.clone(),
        }))
    }

    async fn get_microservice(
        &self,
        request: Request<pb::GetMicroserviceRequest>,
    ) -> Result<Response<pb::Microservice>, Status> {
        const METHOD: &str = "GetMicroservice";
        let caller = self.gate.caller(&request, METHOD).await?;
        let r = request.into_inner();
        let key = request::key(&r.namespace, &r.name)?;
        let access = Access::new("get", Resource::Microservices)
            .in_namespace(&key.0)
            .named(&key.1);
        self.gate.require(&caller, &access, METHOD).await?;
        self.registry_read()?;
        let snap = self.hub.read(|ix| ix.snapshot());
        if let Some(v) = snap.view(&key, None) {
            let mut m = convert::microservice(&v);
            if let Some(dns) = &self.dns {
                let answer = dns.answer(&snap, Some(&v), &key.0, &key.1).await;
                m.dns = Some(convert::dns(answer));
            }
            return Ok(Response::new(m));
        }
        // Not found only where absence is known everywhere.
        let unlisted: Vec<&str> = snap
            .clusters()
            .iter()
            .filter(|(_, c)| !c.absence_is_known())
            .map(|(n, _)| n.as_str())
            .collect();
        if unlisted.is_empty() {
            Err(ApiError::refused(
                Reason::MicroserviceNotFound,
                format!(
                    "Microservice {}/{} is in no registered cluster",
                    key.0, key.1
                ),
            )
            .into())
        } else {
            Err(Refusal::new(Reason::ClustersNotListed, format!(
                "Microservice {}/{} is in no cluster this replica has listed, and it has not listed {}; retry",
                key.0,
                key.1,
                unlisted.join(", ")
            ))
            .meta("clusters", unlisted.join(","))
            .into())
        }
    }

    async fn list_microservices(
        &self,
        request: Request<pb::ListMicroservicesRequest>,
    ) -> Result<Response<pb::ListMicroservicesResponse>, Status> {
        const METHOD: &str = "ListMicroservices";
        let caller = self.gate.caller(&request, METHOD).await?;
        // The connection whose share of the List room the reply takes.
        let peer = request.remote_addr();
        let r = request.into_inner();
        let mut filter = request::filter(&r.namespace, &r.label_selector, &r.cluster)?;
        let after = request::after(&r.page_token)?;
        let size = request::page_size(r.page_size);
        self.registry_read()?;
        self.restrict(&caller, &mut filter, "list", METHOD).await?;
        let item = match request::basic_view(r.view)? {
            true => convert::basic_microservice,
            false => convert::microservice,
        };
        // Room for the page before it is built; once built, it keeps
        // what its bytes hold until they are sent.
        let reserved = self.replies.reserve(self.page_bytes, peer).await?;
        // Views are built outside the index lock, from a snapshot.
        let snap = self.hub.read(|ix| ix.snapshot());
        // One extra tells whether another page follows.
        let views = snap.list(&filter, after.as_ref(), size + 1);
        let (items, next_page_token) = request::page(
            views.map(|v: MicroserviceView| item(&v)),
            size,
            self.page_bytes,
            |m| (&m.namespace, &m.name),
        );
        Ok(reserved.ride(Response::new(pb::ListMicroservicesResponse {
            items,
            next_page_token,
            revision: snap.revision(),
        })))
    }

    type WatchMicroservicesStream = EventStream<pb::WatchEvent>;

    async fn watch_microservices(
        &self,
        request: Request<pb::WatchMicroservicesRequest>,
    ) -> Result<Response<Self::WatchMicroservicesStream>, Status> {
        const METHOD: &str = "WatchMicroservices";
        let standing = self.gate.standing(&request, METHOD).await?;
        let r = request.into_inner();
        let mut filter = request::filter(&r.namespace, &r.label_selector, &r.cluster)?;
        self.registry_read()?;
        let verb = if filter.namespace.is_some() {
            "watch"
        } else {
            "list"
        };
        self.restrict(&standing.caller, &mut filter, verb, METHOD)
            .await?;
        // A Kubernetes identity's token and rights are asked again while
        // the stream runs: a named namespace's right ends it, an unscoped
        // stream is narrowed or widened.
        let mut revoked = streams::Revocation::new(self.credentials.clone());
        let mut rights = None;
        if standing.may_change() {
            match &filter.namespace {
                Some(ns) => {
                    let access = Access::new(verb, Resource::Microservices).in_namespace(ns);
                    revoked = revoked.with_rights(standing, access, METHOD);
                }
                None => rights = Some(watch_stream::Rights { standing, verb }),
            }
        }
        let hub = self.hub.clone();
        // A resume would filter out what the caller lost meanwhile without
        // a DELETE: such a caller starts over with a snapshot.
        let may_resume = rights.is_none();
        let resume = (may_resume && r.resume_revision > 0 && r.index_id == hub.index_id)
            .then_some(r.resume_revision);
        let (out, inbox) = streams::channel(self.streams.open()?, self.stall);
        tokio::spawn(watch_stream::run(
            hub,
            watch_stream::Scope { filter, rights },
            resume,
            out,
            self.watch,
            self.shutdown.clone(),
            revoked,
        ));
        Ok(Response::new(Box::pin(inbox)))
    }

    type WaitForRolloutStream = EventStream<pb::RolloutProgress>;

    async fn wait_for_rollout(
        &self,
        request: Request<pb::WaitForRolloutRequest>,
    ) -> Result<Response<Self::WaitForRolloutStream>, Status> {
        const METHOD: &str = "WaitForRollout";
        let standing = self.gate.standing(&request, METHOD).await?;
        let header = grpc_timeout(&request);
        let r = request.into_inner();
        let key = request::key(&r.namespace, &r.name)?;
        let access = Access::new("get", Resource::Microservices)
            .in_namespace(&key.0)
            .named(&key.1);
        self.gate.require(&standing.caller, &access, METHOD).await?;
        // The wait ends once its caller loses the right (#34).
        let mut revoked = streams::Revocation::new(vec![]).with_rights(standing, access, METHOD);
        let target = request::target(r.target.as_ref())?;
        let wait =
            deadline::effective(request::timeout(r.timeout.as_ref())?, header, self.max_wait);
        let named: BTreeSet<String> = request::clusters(&r.clusters)?.into_iter().collect();
        let current = request::wants_current(r.target.as_ref());
        self.registry_read()?;
        let hub = self.hub.clone();
        hub.read(|ix| wait::unregistered(&named, &target, ix.clusters()))?;
        let live = self.live.clone();
        let mut floors = match &live {
            Some(_) => Floors::new(&target, current).following(named.is_empty()),
            None if current => {
                return Err(errors::status(
                    Reason::LiveReadsOff,
                    "this server cannot read its members' live generations",
                ));
            }
            None => Floors::none(),
        };
        let own = wait::own_targets(&target);
        let (mut out, inbox) = streams::channel(self.streams.open()?, self.stall);
        let mut shutdown = self.shutdown.clone();
        let mut changed = hub.subscribe();
        let mut clusters_changed = hub.subscribe_clusters();
        let until = tokio::time::Instant::now() + wait;
        // Outlives the call's server span: the stream runs on after the response starts.
        let span = tracing::info_span!(
            "flotilla.wait_for_rollout",
            k8s.namespace.name = %key.0,
            flotilla.microservice = %key.1,
            result = tracing::field::Empty,
        );
        let task_span = span.clone();
        tokio::spawn(
            async move {
                let mut last_sent: Option<pb::RolloutProgress> = None;
                let mut seen_at = hub.read(|ix| ix.changed_at(&key));
                let mut linked: BTreeSet<String> = BTreeSet::new();
                loop {
                    // The snapshot is dropped before the next await: a
                    // held snapshot makes the index copy on its next write.
                    let (entries, result, revision, required, to_read) = {
                        let snap = hub.read(|ix| ix.snapshot());
                        let v = snap.view(&key, None);
                        let required = view::required_clusters(
                            &named,
                            &own,
                            v.as_ref().map(|v| v.entries.as_slice()),
                            snap.clusters(),
                        );
                        let to_read = wait::to_read(&required, &named, snap.clusters());
                        let required =
                            wait::judged(required, &named, &floors, snap.clusters());
                        let (entries, result) =
                            wait::progress(v.as_ref(), &required, &target, &floors, &snap);
                        (entries, result, snap.revision(), required, to_read)
                    };
                    // Floors first: a verdict waits for what "current" is.
                    let due = floors.due(&to_read, tokio::time::Instant::now());
                    if let (Some(live), false) = (&live, due.is_empty()) {
                        tokio::select! {
                            _ = out.closed() => return,
                            _ = streams::shutting_down(&mut shutdown) => return shut_down(&span, &mut out),
                            status = revoked.changed() => return out.end(status),
                            _ = tokio::time::sleep_until(until) => {}
                            _ = floors.read_due(live, &key, due) => continue,
                        }
                    }
                    link_reconciles(&span, &key, &entries, &mut linked);
                    let mut msg = wait::progress_message(&entries, &result, revision);
                    msg.floors = floors.wanted();
                    if required.is_empty() {
                        msg.summary = format!(
                            "waiting for {}/{} to appear in a registered cluster",
                            key.0, key.1
                        );
                    }
                    let same = last_sent
                        .as_ref()
                        .is_some_and(|p| p.clusters == msg.clusters && p.result == msg.result);
                    if !same {
                        if out.send(msg.clone()).await.is_err() {
                            return;
                        }
                        last_sent = Some(msg.clone());
                    }
                    if result != RolloutResult::InProgress {
                        span.record(
                            "result",
                            pb::RolloutResult::try_from(msg.result)
                                .map(|r| r.as_str_name())
                                .unwrap_or("UNKNOWN"),
                        );
                        return;
                    }
                    // A floor that failed is read again, without an index change.
                    let retry = floors.next_retry(&to_read).unwrap_or(until);
                    tokio::select! {
                        _ = out.closed() => return,
                        _ = streams::shutting_down(&mut shutdown) => return shut_down(&span, &mut out),
                        status = revoked.changed() => return out.end(status),
                        c = own_change(&hub, &key, &mut changed, &mut seen_at) => if c.is_err() { return },
                        c = clusters_changed.changed() => if c.is_err() { return },
                        _ = tokio::time::sleep_until(retry.min(until)), if retry < until => {}
                        _ = tokio::time::sleep_until(until) => {
                            let mut end = msg;
                            end.result = pb::RolloutResult::DeadlineExceeded as i32;
                            end.summary = format!("deadline of {wait:?} exceeded: {}", end.summary);
                            span.record("result", "DEADLINE_EXCEEDED");
                            let _ = out.send(end).await;
                            return;
                        }
                    }
                }
            }
            .instrument(task_span),
        );
        Ok(Response::new(Box::pin(inbox)))
    }
}

/// Resolves when `key` itself changes: a wait recomputes on its own
/// Microservice's changes, not on every revision anywhere in the fleet.
/// (Cluster changes wake it through their own channel.)
async fn own_change(
    hub: &Hub,
    key: &Key,
    changed: &mut watch::Receiver<u64>,
    seen_at: &mut Option<u64>,
) -> Result<(), watch::error::RecvError> {
    loop {
        changed.changed().await?;
        let now = hub.read(|ix| ix.changed_at(key));
        if now != *seen_at {
            *seen_at = now;
            return Ok(());
        }
    }
}

/// The replica is shutting down: the wait ends UNAVAILABLE, so the
/// client asks another.
fn shut_down(span: &tracing::Span, out: &mut streams::Outbox<pb::RolloutProgress>) {
    span.record("result", "UNAVAILABLE");
    out.end(errors::status(
        Reason::ShuttingDown,
        "the replica is shutting down; ask another replica",
    ));
}

/// Links the wait to the reconcile that concluded each cluster, when this
/// replica ran it (it leads that cluster).
fn link_reconciles(
    span: &tracing::Span,
    key: &Key,
    entries: &[Entry],
    linked: &mut BTreeSet<String>,
) {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    for e in entries {
        let concluded = matches!(e.state, view::EntryState::Done | view::EntryState::Failed);
        if concluded
            && !linked.contains(&e.cluster)
            && let Some(ctx) = links::last(&e.cluster, &key.0, &key.1)
        {
            span.add_link(ctx);
            linked.insert(e.cluster.clone());
        }
    }
}
