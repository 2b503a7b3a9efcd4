//! Server streams with limits: a server-wide cap on open streams, a
//! bounded buffer per stream, and an end that overtakes what is queued, so
//! a stream can be closed with a status even when its reader is stuck.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::sync::{mpsc, oneshot, watch};
use tonic::Status;

use super::errors::{self, Reason};

use crate::authz::access::Access;
use crate::authz::gate::Standing;

/// Events queued per stream before its reader counts as stalled.
pub const BUFFER: usize = 256;

/// Counts the open streams against the cap.
#[derive(Debug)]
pub struct Streams {
    open: AtomicUsize,
    max: usize,
}

/// One open stream's place under the cap; freed on drop.
#[derive(Debug)]
pub struct Slot(Arc<Streams>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Streams {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Streams {
            open: AtomicUsize::new(0),
            max,
        })
    }

    pub fn open(self: &Arc<Self>) -> Result<Slot, Status> {
        let taken = self
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            });
        match taken {
            Ok(_) => Ok(Slot(self.clone())),
            Err(n) => Err(errors::status(
                Reason::StreamLimit,
                format!(
                    "{n} streams are open on this replica, its limit; retry later or on another replica"
                ),
            )),
        }
    }

    pub fn count(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }
}

/// Resolves once the server starts shutting down (the flag turns true).
pub async fn shutting_down(flag: &mut tokio::sync::watch::Receiver<bool>) {
    // The guard `wait_for` returns must not live across the caller's awaits.
    let _ = flag.wait_for(|s| *s).await.map(|_| ());
}

/// How often a Kubernetes identity's rights are asked again while its
/// stream runs: with the 5 s cache, a revoked right ends the stream within
/// about 8 s (#34).
pub const RECHECK: Duration = Duration::from_secs(3);

/// What ends a stream besides its client: the credentials it was admitted
/// under (read token, write token, TLS files), whose change ends it so the
/// client's reconnect is judged by what is in force then; and, for a
/// Kubernetes identity, its token and the right it needs, asked again every
/// `RECHECK`.
pub struct Revocation {
    creds: Vec<watch::Receiver<u64>>,
    rights: Option<Rights>,
}

struct Rights {
    standing: Standing,
    access: Access,
    method: &'static str,
    /// Kept here, so a stream's loop that starts `changed` anew after each
    /// event does not put the next check off.
    next: tokio::time::Instant,
    /// The check under way, kept here for the same reason: on a busy
    /// stream an event wins the loop's race before a review answers, and
    /// a check dropped with that race would never finish. A task of its
    /// own, so that it runs (and gives back its review turn) while the
    /// stream is busy sending, and its timeout counts only its own time.
    asking: Option<tokio::task::JoinHandle<Result<(), Status>>>,
}

impl Drop for Rights {
    fn drop(&mut self) {
        if let Some(check) = &self.asking {
            check.abort();
        }
    }
}

impl Revocation {
    pub fn new(mut rxs: Vec<watch::Receiver<u64>>) -> Self {
        for rx in &mut rxs {
            rx.borrow_and_update();
        }
        Revocation {
            creds: rxs,
            rights: None,
        }
    }

    /// Also ends the stream once `standing` loses `access` (only a
    /// Kubernetes identity's can; other callers are left as they are).
    pub fn with_rights(mut self, standing: Standing, access: Access, method: &'static str) -> Self {
        if standing.may_change() {
            self.rights = Some(Rights {
                standing,
                access,
                method,
                next: tokio::time::Instant::now() + RECHECK,
                asking: None,
            });
        }
        self
    }

    /// Resolves with the status to end the stream with.
    pub async fn changed(&mut self) -> Status {
        let Revocation { creds, rights } = self;
        let creds = async {
            if creds.is_empty() {
                return std::future::pending().await;
            }
            let each = creds.iter_mut().map(|rx| {
                Box::pin(async move {
                    if rx.changed().await.is_err() {
                        // Its owner is gone: nothing more will change.
                        std::future::pending::<()>().await;
                    }
                })
            });
            futures::future::select_all(each).await;
            errors::status(
                Reason::CredentialsChanged,
                "the credentials this stream was opened with changed; reconnect with the ones in force",
            )
        };
        let rights = async {
            let Some(r) = rights else {
                return std::future::pending().await;
            };
            loop {
                if r.asking.is_none() {
                    tokio::time::sleep_until(r.next).await;
                    r.next = tokio::time::Instant::now() + RECHECK;
                    let (standing, access, method) =
                        (r.standing.clone(), r.access.clone(), r.method);
                    r.asking = Some(tokio::spawn(async move {
                        standing
                            .recheck(&access, method)
                            .await
                            .map_err(Status::from)
                    }));
                }
                let asked = match r.asking.as_mut().expect("set above").await {
                    Ok(asked) => asked,
                    Err(e) => {
                        tracing::warn!(error = %e, "a stream's rights check failed");
                        Err(errors::status(
                            Reason::RightsUnchecked,
                            "this stream's rights could not be checked again; reconnect",
                        ))
                    }
                };
                r.asking = None;
                if let Err(status) = asked {
                    return status;
                }
            }
        };
        tokio::select! {
            s = creds => s,
            s = rights => s,
        }
    }
}

/// Resolves when a long-lived stream must end: `None` when its client
/// left; the status to end it with when the server shuts down, the
/// credentials it was admitted with change, or the stream reaches its
/// maximum age (the client resumes elsewhere).
pub async fn must_end<T>(
    out: &Outbox<T>,
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
    revoked: &mut Revocation,
    ends_at: tokio::time::Instant,
    max_age: Duration,
) -> Option<Status> {
    tokio::select! {
        _ = out.closed() => None,
        status = revoked.changed() => Some(status),
        _ = shutting_down(shutdown) => Some(errors::status(
            Reason::ShuttingDown,
            "the replica is shutting down; resume from the last revision on another replica",
        )),
        _ = tokio::time::sleep_until(ends_at) => Some(errors::status(
            Reason::StreamMaxAge,
            format!("the stream reached its maximum age of {max_age:?}; resume from the last revision"),
        )),
    }
}

/// Why a send did not go through.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The client went away.
    Closed,
    /// The client read nothing for the stall limit; the stream was ended.
    Stalled,
}

/// The sending half, for the task that produces the stream. It holds the
/// stream's slot: when the producer ends (the client left, it stalled, the
/// server stops), the slot is free, even if a stuck client's connection
/// keeps the other half alive.
pub struct Outbox<T> {
    tx: mpsc::Sender<Result<T, Status>>,
    end: Option<oneshot::Sender<Status>>,
    stall: Duration,
    _slot: Slot,
}

/// The half tonic reads.
pub struct Inbox<T> {
    rx: mpsc::Receiver<Result<T, Status>>,
    end: Option<oneshot::Receiver<Status>>,
}

pub fn channel<T>(slot: Slot, stall: Duration) -> (Outbox<T>, Inbox<T>) {
    let (tx, rx) = mpsc::channel(BUFFER);
    let (end_tx, end_rx) = oneshot::channel();
    (
        Outbox {
            tx,
            end: Some(end_tx),
            stall,
            _slot: slot,
        },
        Inbox {
            rx,
            end: Some(end_rx),
        },
    )
}

impl<T> Outbox<T> {
    /// Queues one item. A reader that leaves the buffer full for the stall
    /// limit is cut off with RESOURCE_EXHAUSTED; it may resume.
    pub async fn send(&mut self, item: T) -> Result<(), Ended> {
        match self.tx.send_timeout(Ok(item), self.stall).await {
            Ok(()) => Ok(()),
            Err(mpsc::error::SendTimeoutError::Closed(_)) => Err(Ended::Closed),
            Err(mpsc::error::SendTimeoutError::Timeout(_)) => {
                self.end(errors::status(
                    Reason::ReaderStalled,
                    format!(
                        "the client read nothing for {:?} with {BUFFER} events queued; resume from the last revision received",
                        self.stall
                    ),
                ));
                Err(Ended::Stalled)
            }
        }
    }

    /// Ends the stream with `status`, ahead of anything still queued.
    pub fn end(&mut self, status: Status) {
        if let Some(end) = self.end.take() {
            end.send(status).ok();
        }
    }

    pub async fn closed(&self) {
        self.tx.closed().await
    }
}

impl<T> Stream for Inbox<T> {
    type Item = Result<T, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(end) = self.end.as_mut() {
            match Pin::new(end).poll(cx) {
                Poll::Ready(Ok(status)) => {
                    self.end = None;
                    self.rx.close();
                    // Nothing queued after the end is delivered.
                    while self.rx.try_recv().is_ok() {}
                    return Poll::Ready(Some(Err(status)));
                }
                // The producer finished without an end: drain the queue.
                Poll::Ready(Err(_)) => self.end = None,
                Poll::Pending => {}
            }
        }
        self.rx.poll_recv(cx)
    }
}

#[cfg(test)]
mod tests {
    mod busy {
        use std::sync::Arc;
        use std::time::Duration;

        use tokio::time::Instant;
        use tonic::Code;

        use super::super::{RECHECK, Revocation};
        use crate::authz::access::{Access, Resource};
        use crate::authz::doors::{Door, Token};
        use crate::authz::gate::Gate;
        use crate::authz::review::Reviews;

        /// A home cluster that knows the token and denies every right,
        /// each SubjectAccessReview answered after 50 ms.
        fn home() -> kube::Client {
            let svc = tower::service_fn(|req: http::Request<kube::client::Body>| async move {
                let body = if req.uri().path().contains("tokenreviews") {
                    serde_json::json!({
                        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                        "spec": {},
                        "status": {"authenticated": true, "user": {"username": "system:serviceaccount:t:busy"}},
                    })
                } else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    serde_json::json!({
                        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                        "spec": {}, "status": {"allowed": false},
                    })
                };
                let body = kube::client::Body::from(serde_json::to_vec(&body).unwrap());
                Ok::<_, std::convert::Infallible>(http::Response::new(body))
            });
            kube::Client::new(svc, "default")
        }

        /// An event every 10 ms wins the stream loop's race over each check
        /// in flight; the check still finishes, and the revoked right ends
        /// the stream at the first recheck (before, each check was dropped
        /// with its race and the stream ran to its maximum age).
        #[tokio::test(start_paused = true)]
        async fn a_busy_stream_still_has_its_right_asked_again() {
            let gate = Gate::new(Some(Arc::new(Reviews::new(home()))), false);
            let mut req = tonic::Request::new(());
            req.extensions_mut()
                .insert(Door::Review(Token("a-token".into())));
            let standing = gate.standing(&req, "WatchMicroservices").await.unwrap();
            let access = Access::new("watch", Resource::Microservices).in_namespace("t");
            let mut revoked =
                Revocation::new(vec![]).with_rights(standing, access, "WatchMicroservices");
            let start = Instant::now();
            let status = loop {
                tokio::select! {
                    s = revoked.changed() => break s,
                    _ = tokio::time::sleep(Duration::from_millis(10)) => {}
                }
                assert!(
                    start.elapsed() < Duration::from_secs(60),
                    "the right was never asked again"
                );
            };
            assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
            assert!(start.elapsed() < RECHECK + Duration::from_secs(1));
        }
    }

    use futures::StreamExt;

    use super::*;

    #[tokio::test]
    async fn the_cap_counts_open_streams_and_frees_on_drop() {
        let streams = Streams::new(2);
        let a = streams.open().unwrap();
        let _b = streams.open().unwrap();
        let refused = streams.open().unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        drop(a);
        assert_eq!(streams.count(), 1);
        streams.open().unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_reader_is_ended_with_resource_exhausted_ahead_of_the_queue() {
        let streams = Streams::new(1);
        let (mut out, mut inbox) = channel::<u32>(streams.open().unwrap(), Duration::from_secs(5));
        for i in 0..BUFFER as u32 {
            out.send(i).await.unwrap();
        }
        assert_eq!(out.send(999).await, Err(Ended::Stalled));
        // The producer gives up: its slot is free even though nobody read.
        drop(out);
        assert_eq!(streams.count(), 0);
        let first = inbox.next().await.unwrap();
        assert_eq!(first.unwrap_err().code(), tonic::Code::ResourceExhausted);
        assert!(inbox.next().await.is_none());
    }

    #[tokio::test]
    async fn a_finished_producer_leaves_its_queue_to_be_read() {
        let streams = Streams::new(1);
        let (mut out, inbox) = channel::<u32>(streams.open().unwrap(), Duration::from_secs(5));
        out.send(1).await.unwrap();
        out.send(2).await.unwrap();
        drop(out);
        let got: Vec<u32> = inbox.map(|r| r.unwrap()).collect().await;
        assert_eq!(got, [1, 2]);
    }
}
