//! `flotilla.v1.FleetRollouts`: reads from the replica's rollout caches;
//! Pause, Resume and Undo edit the FleetMicroservice's spec in the home
//! cluster, conditionally, and only with the write token.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use kube::Client;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::errors::{self, Reason, Refusal};
use super::fleet_wait;
use super::fresh;
use super::pb;
use super::pb::fleet_rollouts_server::FleetRollouts;
use super::request;
use super::rollout_convert::{listed, rollout};
use super::rollout_watch;
use super::watch::WatchLimits;
use crate::authz::access::{self, Access, Caller, Resource};
use crate::authz::gate::Gate;
use crate::rollout::run::cache::RolloutCache;
use crate::rollout::run::edits::{self, EditError};
use crate::serve::streams::{self, Streams};

pub struct FleetRolloutsService {
    pub cache: Arc<RolloutCache>,
    /// The home cluster, for the spec edits users ask for.
    pub home: Client,
    /// Who calls, and whether they may (#34).
    pub gate: Gate,
    pub streams: Arc<Streams>,
    pub stall: Duration,
    /// The longest WaitForFleetRollout (--grpc-max-wait).
    pub max_wait: Duration,
    pub watch: WatchLimits,
    pub shutdown: watch::Receiver<bool>,
    /// The tokens and TLS files in force: a watch ends when one changes.
    pub credentials: Vec<watch::Receiver<u64>>,
    /// What one ListRollouts page may hold, encoded (`request::take_page`).
    pub page_bytes: usize,
    /// What every List reply not yet sent may hold (`replies`).
    pub replies: super::replies::ReplyBudget,
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::RolloutEvent, Status>> + Send>>;
type WaitStream =
    Pin<Box<dyn Stream<Item = Result<pb::WaitForFleetRolloutResponse, Status>> + Send>>;

fn kube_status(e: kube::Error) -> Status {
    match &e {
        kube::Error::Api(s) if s.code == 404 => {
            errors::status(Reason::FleetMicroserviceNotFound, s.message.clone())
        }
        kube::Error::Api(s) if s.code == 409 => errors::status(
            Reason::Conflict,
            format!(
                "the FleetMicroservice changed meanwhile; retry ({})",
                s.message
            ),
        ),
        kube::Error::Api(s) if s.code == 422 || s.code == 400 => {
            errors::status(Reason::SpecRejected, s.message.clone())
        }
        kube::Error::Api(s) if s.code == 403 => {
            errors::status(Reason::PermissionDenied, s.message.clone())
        }
        _ => errors::status(
            Reason::HomeUnreachable,
            format!("the home cluster did not answer: {e}"),
        ),
    }
}

impl FleetRolloutsService {
    /// Before the caches' first listing, "none" would be a lie.
    fn ready(&self) -> Result<(), Status> {
        use futures::FutureExt;
        let listed = |r: Option<Result<(), _>>| matches!(r, Some(Ok(())));
        if listed(self.cache.fleet.wait_until_ready().now_or_never())
            && listed(self.cache.revisions.wait_until_ready().now_or_never())
        {
            Ok(())
        } else {
            Err(errors::status(
                Reason::HomeNotListed,
                "this replica has not listed the home cluster's FleetMicroservices yet; retry",
            ))
        }
    }

    /// The FleetMicroservice, no older than the home cluster has it now.
    async fn current(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Arc<crate::rollout::spec::FleetMicroservice>, Status> {
        self.ready()?;
        let (ns, n) = (Some(namespace), Some(name));
        fresh::barrier(&self.home, &self.cache, ns, n, fresh::LIMIT).await?;
        self.cache.get(namespace, name).ok_or_else(|| {
            errors::status(
                Reason::FleetMicroserviceNotFound,
                format!("no FleetMicroservice {namespace}/{name}"),
            )
        })
    }

    /// The caller, once they hold `verb` on the named FleetMicroservice.
    async fn permitted<T>(
        &self,
        r: &Request<T>,
        verb: &'static str,
        (ns, name): (&str, &str),
        method: &'static str,
    ) -> Result<Caller, Status> {
        let caller = self.gate.caller(r, method).await?;
        let access = Access::new(verb, Resource::FleetMicroservices)
            .in_namespace(ns)
            .named(name);
        self.gate.require(&caller, &access, method).await?;
        Ok(caller)
    }

    async fn set_paused(
        &self,
        r: Request<pb::RolloutRef>,
        paused: bool,
    ) -> Result<Response<pb::Rollout>, Status> {
        let (method, verb) = match paused {
            true => ("PauseRollout", access::PAUSE),
            false => ("ResumeRollout", access::RESUME),
        };
        let (ns, name) = request::key(&r.get_ref().namespace, &r.get_ref().name)?;
        let caller = self.permitted(&r, verb, (&ns, &name), method).await?;
        let f = edits::set_paused(&self.home, &ns, &name, paused, caller.name())
            .await
            .map_err(edit_status)?;
        tracing::info!(flotilla.fleet_microservice = %format!("{ns}/{name}"), paused, enduser.id = caller.name(), "rollout paused or resumed over gRPC");
        Ok(Response::new(rollout(&f, &self.cache.history(&f), true)))
    }
}

fn edit_status(e: EditError) -> Status {
    match e {
        EditError::Kube(e) => kube_status(e),
        EditError::Undo(m) => errors::status(Reason::UndoRefused, m),
        EditError::Approve(m) => errors::status(Reason::ApprovalRefused, m),
    }
}

#[tonic::async_trait]
impl FleetRollouts for FleetRolloutsService {
    async fn get_rollout(
        &self,
        r: Request<pb::RolloutRef>,
    ) -> Result<Response<pb::Rollout>, Status> {
        let (ns, name) = request::key(&r.get_ref().namespace, &r.get_ref().name)?;
        self.permitted(&r, "get", (&ns, &name), "GetRollout")
            .await?;
        let f = self.current(&ns, &name).await?;
        Ok(Response::new(rollout(&f, &self.cache.history(&f), true)))
    }

    async fn list_rollouts(
        &self,
        r: Request<pb::ListRolloutsRequest>,
    ) -> Result<Response<pb::ListRolloutsResponse>, Status> {
        const METHOD: &str = "ListRollouts";
        let caller = self.gate.caller(&r, METHOD).await?;
        let ns = namespace_filter(&r.get_ref().namespace)?;
        let after = request::after(&r.get_ref().page_token)?;
        let size = request::page_size(r.get_ref().page_size);
        // The connection whose share of the List room the reply takes.
        let peer = r.remote_addr();
        self.ready()?;
        if let Some(n) = &ns {
            let access = Access::new("list", Resource::FleetMicroservices).in_namespace(n);
            self.gate.require(&caller, &access, METHOD).await?;
        }
        fresh::barrier(&self.home, &self.cache, ns.as_deref(), None, fresh::LIMIT).await?;
        // After the barrier: a namespace just created is asked about too.
        let visible = match &ns {
            Some(_) => None,
            None => {
                let present = self.cache.namespaces();
                let list = Resource::FleetMicroservices;
                let gate = &self.gate;
                gate.visible(&caller, "list", list, present, METHOD).await?
            }
        };
        // Room for the page before it is built; once built, it keeps
        // what its bytes hold until they are sent.
        let reserved = self.replies.reserve(self.page_bytes, peer).await?;
        let revision = self.cache.revision();
        let view = rollout_watch::View {
            namespace: ns,
            visible: visible.map(Arc::new),
        };
        let (rollouts, next_page_token) = request::page(
            listed(&self.cache, |n| view.shows(n), after.as_ref()),
            size,
            self.page_bytes,
            |r| (&r.namespace, &r.name),
        );
        Ok(reserved.ride(Response::new(pb::ListRolloutsResponse {
            rollouts,
            revision,
            index_id: self.cache.index_id.clone(),
            next_page_token,
        })))
    }

    type WatchRolloutsStream = EventStream;

    async fn watch_rollouts(
        &self,
        r: Request<pb::WatchRolloutsRequest>,
    ) -> Result<Response<Self::WatchRolloutsStream>, Status> {
        const METHOD: &str = "WatchRollouts";
        let standing = self.gate.standing(&r, METHOD).await?;
        let req = r.into_inner();
        let ns = namespace_filter(&req.namespace)?;
        let mut revoked = streams::Revocation::new(self.credentials.clone());
        // Unscoped, a Kubernetes identity's view is asked again while the
        // stream runs (it narrows and widens); named, its right is, and
        // losing it ends the stream. Either way its token is.
        let mut rights = None;
        if let Some(n) = &ns {
            let access = Access::new("watch", Resource::FleetMicroservices).in_namespace(n);
            self.gate.require(&standing.caller, &access, METHOD).await?;
            revoked = revoked.with_rights(standing.clone(), access, METHOD);
        } else if standing.may_change() {
            rights = Some(standing.clone());
        }
        self.ready()?;
        let slot = self.streams.open()?;
        // A view that may have narrowed since the client's last event
        // cannot be resumed: what left it would never be deleted.
        let resume =
            (req.resume_from > 0 && req.index_id == self.cache.index_id && rights.is_none())
                .then_some(req.resume_from);
        // A snapshot is an answer: no older than the home cluster was when
        // asked. A resume continues this replica's own log, which only moves on.
        if resume.is_none() {
            fresh::barrier(&self.home, &self.cache, ns.as_deref(), None, fresh::LIMIT).await?;
        }
        // After the barrier, as List: a namespace just created is asked about.
        let visible = match &ns {
            Some(_) => None,
            None => {
                let present = self.cache.namespaces();
                let fleet = Resource::FleetMicroservices;
                let caller = &standing.caller;
                self.gate
                    .visible(caller, "watch", fleet, present, METHOD)
                    .await?
            }
        };
        let view = rollout_watch::View {
            namespace: ns,
            visible: visible.map(Arc::new),
        };
        let (out, inbox) = streams::channel(slot, self.stall);
        tokio::spawn(rollout_watch::run(
            self.cache.clone(),
            view,
            rights,
            resume,
            out,
            self.watch,
            self.shutdown.clone(),
            revoked,
        ));
        Ok(Response::new(Box::pin(inbox)))
    }

    type WaitForFleetRolloutStream = WaitStream;

    async fn wait_for_fleet_rollout(
        &self,
        r: Request<pb::WaitForFleetRolloutRequest>,
    ) -> Result<Response<Self::WaitForFleetRolloutStream>, Status> {
        const METHOD: &str = "WaitForFleetRollout";
        let standing = self.gate.standing(&r, METHOD).await?;
        let header = super::service::grpc_timeout(&r);
        let req = r.into_inner();
        let (ns, name) = request::key(&req.namespace, &req.name)?;
        let access = Access::new("get", Resource::FleetMicroservices)
            .in_namespace(&ns)
            .named(&name);
        self.gate.require(&standing.caller, &access, METHOD).await?;
        // The wait ends once its caller loses the right, or its credentials change.
        let revoked = streams::Revocation::new(self.credentials.clone())
            .with_rights(standing, access, METHOD);
        let wait = super::deadline::effective(
            request::timeout(req.timeout.as_ref())?,
            header,
            self.max_wait,
        );
        // No older than the home cluster when asked: `current` is the
        // generation the caller's own edit made, or a later one.
        let f = self.current(&ns, &name).await?;
        let goal = fleet_wait::goal(req.target.as_ref(), &f, &self.cache.history(&f))?;
        let (out, inbox) = streams::channel(self.streams.open()?, self.stall);
        let wait = fleet_wait::Wait {
            cache: self.cache.clone(),
            key: (ns, name),
            goal,
            until: tokio::time::Instant::now() + wait,
            wait,
        };
        tokio::spawn(wait.run(out, self.shutdown.clone(), revoked));
        Ok(Response::new(Box::pin(inbox)))
    }

    async fn pause_rollout(
        &self,
        r: Request<pb::RolloutRef>,
    ) -> Result<Response<pb::Rollout>, Status> {
        self.set_paused(r, true).await
    }

    async fn resume_rollout(
        &self,
        r: Request<pb::RolloutRef>,
    ) -> Result<Response<pb::Rollout>, Status> {
        self.set_paused(r, false).await
    }

    async fn undo_rollout(
        &self,
        r: Request<pb::UndoRolloutRequest>,
    ) -> Result<Response<pb::Rollout>, Status> {
        let req = r.get_ref();
        let (ns, name) = request::key(&req.namespace, &req.name)?;
        let caller = self
            .permitted(&r, access::UNDO, (&ns, &name), "UndoRollout")
            .await?;
        self.ready()?;
        let req = r.get_ref();
        let edit = edits::undo(
            &self.home,
            &self.cache,
            &ns,
            &name,
            req.to_revision,
            caller.name(),
        );
        let (f, target) = edit.await.map_err(edit_status)?;
        tracing::info!(flotilla.fleet_microservice = %format!("{ns}/{name}"), to = %target.name, number = target.number, enduser.id = caller.name(), "rollout undone over gRPC");
        Ok(Response::new(rollout(&f, &self.cache.history(&f), true)))
    }

    async fn approve_wave(
        &self,
        r: Request<pb::ApproveWaveRequest>,
    ) -> Result<Response<pb::Rollout>, Status> {
        let req = r.get_ref();
        let (ns, name) = request::key(&req.namespace, &req.name)?;
        let caller = self
            .permitted(&r, access::APPROVE, (&ns, &name), "ApproveWave")
            .await?;
        let req = r.get_ref();
        if req.wave.is_empty() {
            return Err(Refusal::invalid("wave", "wave is required").into());
        }
        self.ready()?;
        let edit = edits::approve(
            &self.home,
            &self.cache,
            (&ns, &name),
            &req.wave,
            &req.revision,
            caller.name(),
        );
        let (f, given) = edit.await.map_err(edit_status)?;
        tracing::info!(flotilla.fleet_microservice = %format!("{ns}/{name}"), wave = %given.wave, revision = %given.revision, by = %given.by, enduser.id = caller.name(), "wave approved over gRPC");
        Ok(Response::new(rollout(&f, &self.cache.history(&f), true)))
    }
}

fn namespace_filter(ns: &str) -> Result<Option<String>, Status> {
    if ns.is_empty() {
        return Ok(None);
    }
    request::key(ns, "x")?;
    Ok(Some(ns.to_string()))
}
