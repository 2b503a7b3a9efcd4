//! `flotilla.v1.FleetStatus`, answered from this replica's index.

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::deadline;
use super::request;
use super::streams::{self, Streams};
use super::watch::{self as watch_stream, WatchLimits};
use super::{ApiError, convert, pb};
use crate::status::hub::Hub;
use crate::status::index::{Key, MicroserviceView, Snapshot};
use crate::status::view::{self, Entry, RolloutResult, Target};
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
}

/// The rollout as it stands: the entries judged against the target.
fn progress(
    v: Option<&MicroserviceView>,
    required: &BTreeSet<String>,
    target: &Target,
    snap: &Snapshot,
) -> (Vec<Entry>, RolloutResult) {
    let entries: Vec<Entry> = required
        .iter()
        .map(
            |cluster| match v.and_then(|v| v.entries.iter().find(|e| e.cluster == *cluster)) {
                Some(e) => view::rollout_entry(target, e),
                None => view::absent_entry(cluster, snap.clusters().get(cluster)),
            },
        )
        .collect();
    let result = view::rollout_result(&entries);
    (entries, result)
}

fn progress_message(
    entries: &[Entry],
    result: &RolloutResult,
    revision: u64,
) -> pb::RolloutProgress {
    let aggregate = view::aggregate(entries);
    let (code, failed, summary) = match result {
        RolloutResult::InProgress => (
            pb::RolloutResult::InProgress,
            vec![],
            aggregate.summary.clone(),
        ),
        RolloutResult::Succeeded => (
            pb::RolloutResult::Succeeded,
            vec![],
            format!("rolled out: {}", aggregate.summary),
        ),
        RolloutResult::Failed(clusters) => (
            pb::RolloutResult::Failed,
            clusters.clone(),
            format!("failed in {}: {}", clusters.join(", "), aggregate.summary),
        ),
    };
    pb::RolloutProgress {
        result: code as i32,
        clusters: entries.iter().map(convert::entry).collect(),
        aggregate: Some(convert::aggregate(&aggregate)),
        failed_clusters: failed,
        revision,
        summary,
    }
}

fn grpc_timeout<T>(req: &Request<T>) -> Option<Duration> {
    req.metadata()
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(deadline::parse_grpc_timeout)
}

#[tonic::async_trait]
impl pb::fleet_status_server::FleetStatus for FleetStatusService {
    async fn list_clusters(
        &self,
        _request: Request<pb::ListClustersRequest>,
    ) -> Result<Response<pb::ListClustersResponse>, Status> {
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
        let r = request.into_inner();
        let key = request::key(&r.namespace, &r.name)?;
        let view = self.hub.read(|ix| ix.snapshot()).view(&key, None);
        match view {
            Some(v) => Ok(Response::new(convert::microservice(&v))),
            None => Err(ApiError::NotFound(format!(
                "Microservice {}/{} is in no registered cluster",
                key.0, key.1
            ))
            .into()),
        }
    }

    async fn list_microservices(
        &self,
        request: Request<pb::ListMicroservicesRequest>,
    ) -> Result<Response<pb::ListMicroservicesResponse>, Status> {
        let r = request.into_inner();
        let filter = request::filter(&r.namespace, &r.label_selector, &r.cluster)?;
        let after = request::after(&r.page_token)?;
        let size = request::page_size(r.page_size);
        let item = match request::basic_view(r.view)? {
            true => convert::basic_microservice,
            false => convert::microservice,
        };
        // Views are built outside the index lock, from a snapshot.
        let snap = self.hub.read(|ix| ix.snapshot());
        // One extra tells whether another page follows.
        let mut page: Vec<MicroserviceView> =
            snap.list(&filter, after.as_ref(), size + 1).collect();
        let more = page.len() > size;
        page.truncate(size);
        let revision = snap.revision();
        let next_page_token = match (more, page.last()) {
            (true, Some(last)) => request::page_token(&(last.namespace.clone(), last.name.clone())),
            _ => String::new(),
        };
        Ok(Response::new(pb::ListMicroservicesResponse {
            items: page.iter().map(item).collect(),
            next_page_token,
            revision,
        }))
    }

    type WatchMicroservicesStream = EventStream<pb::WatchEvent>;

    async fn watch_microservices(
        &self,
        request: Request<pb::WatchMicroservicesRequest>,
    ) -> Result<Response<Self::WatchMicroservicesStream>, Status> {
        let r = request.into_inner();
        let filter = request::filter(&r.namespace, &r.label_selector, &r.cluster)?;
        let hub = self.hub.clone();
        let resume =
            (r.resume_revision > 0 && r.index_id == hub.index_id).then_some(r.resume_revision);
        let (out, inbox) = streams::channel(self.streams.open()?, self.stall);
        tokio::spawn(watch_stream::run(
            hub,
            filter,
            resume,
            out,
            self.watch,
            self.shutdown.clone(),
        ));
        Ok(Response::new(Box::pin(inbox)))
    }

    type WaitForRolloutStream = EventStream<pb::RolloutProgress>;

    async fn wait_for_rollout(
        &self,
        request: Request<pb::WaitForRolloutRequest>,
    ) -> Result<Response<Self::WaitForRolloutStream>, Status> {
        let header = grpc_timeout(&request);
        let r = request.into_inner();
        let key = request::key(&r.namespace, &r.name)?;
        let target = request::target(r.target.as_ref())?;
        let wait =
            deadline::effective(request::timeout(r.timeout.as_ref())?, header, self.max_wait);
        let explicit = request::clusters(&r.clusters)?;
        let hub = self.hub.clone();
        if let Some(unknown) = hub.read(|ix| {
            explicit
                .iter()
                .find(|c| !ix.clusters().contains_key(*c))
                .cloned()
        }) {
            return Err(ApiError::NotFound(format!("cluster {unknown} is not registered")).into());
        }
        // Named clusters, or every cluster the Microservice is seen in while
        // the wait runs: one created after the call starts is waited for.
        let follow = explicit.is_empty();
        let mut required: BTreeSet<String> = explicit.into_iter().collect();
        // A cluster given its own generation target is waited for too.
        if follow && let Target::Generations { at_least, .. } = &target {
            required.extend(at_least.keys().cloned());
        }
        let (mut out, inbox) = streams::channel(self.streams.open()?, self.stall);
        let mut shutdown = self.shutdown.clone();
        let mut changed = hub.subscribe();
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
                let mut linked: BTreeSet<String> = BTreeSet::new();
                loop {
                    // The snapshot is dropped before the next await: a
                    // held snapshot makes the index copy on its next write.
                    let (entries, result, revision) = {
                        let snap = hub.read(|ix| ix.snapshot());
                        let v = snap.view(&key, None);
                        if follow {
                            if let Some(v) = &v {
                                required.extend(v.entries.iter().map(|e| e.cluster.clone()));
                            }
                            // A cluster no longer registered is no longer
                            // part of the fleet's rollout.
                            required.retain(|c| snap.clusters().contains_key(c));
                        }
                        let (entries, result) = progress(v.as_ref(), &required, &target, &snap);
                        (entries, result, snap.revision())
                    };
                    link_reconciles(&span, &key, &entries, &mut linked);
                    let mut msg = progress_message(&entries, &result, revision);
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
                    tokio::select! {
                        _ = out.closed() => return,
                        _ = streams::shutting_down(&mut shutdown) => {
                            span.record("result", "UNAVAILABLE");
                            out.end(Status::unavailable("the replica is shutting down; ask another replica"));
                            return;
                        }
                        c = changed.changed() => if c.is_err() { return },
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
