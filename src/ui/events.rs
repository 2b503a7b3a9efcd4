//! The dashboard's live stream: the watch planner (`status::watch`)
//! driven from the hub and sent as Server-Sent Events. An event's id is
//! `<index id>/<revision>`; a browser that reconnects sends it back as
//! `Last-Event-ID` and gets what changed since, or, from another index
//! (a restarted or different replica), a fresh snapshot.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::Status;

use kube::ResourceExt;

use super::identity::Sight;
use super::json;
use crate::rollout::run::cache::RolloutCache;
use crate::serve::streams::{self, Ended, Outbox, Revocation};
use crate::status::hub::Hub;
use crate::status::index::Filter;
use crate::status::watch::{Cursor, Event};
use crate::telemetry::metrics::METRICS;

/// One SSE message, before encoding.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    pub event: &'static str,
    /// Set on resume points only; `reset` clears the browser's.
    pub id: Option<String>,
    pub data: String,
}

/// Not a resume point: a browser that drops mid-snapshot starts over.
pub const NO_RESUME: &str = "snapshot";

fn resume_id(index_id: &str, revision: u64) -> Option<String> {
    Some(format!("{index_id}/{revision}"))
}

/// The revision to resume from, if `last_event_id` names this index.
pub fn resume_from(last_event_id: &str, index_id: &str) -> Option<u64> {
    let (id, revision) = last_event_id.trim().rsplit_once('/')?;
    (id == index_id).then(|| revision.parse().ok()).flatten()
}

pub fn frame(event: Event, index_id: &str) -> Frame {
    let (name, id, data) = match event {
        Event::Reset => ("reset", Some(NO_RESUME.to_string()), json!({})),
        Event::Item(v) => ("item", None, json::row(&v)),
        Event::Synced(r) => ("synced", resume_id(index_id, r), json!({"revision": r})),
        Event::Upsert(r, v) => ("upsert", resume_id(index_id, r), json::row(&v)),
        Event::Delete(r, (namespace, name)) => (
            "delete",
            resume_id(index_id, r),
            json!({"namespace": namespace, "name": name}),
        ),
        Event::Bookmark(r) => ("bookmark", resume_id(index_id, r), json!({})),
    };
    Frame {
        event: name,
        id,
        data: data.to_string(),
    }
}

/// Every FleetMicroservice `sight` shows, by namespace and name.
pub fn rollouts(cache: &RolloutCache, sight: &Sight) -> Value {
    let mut all = cache.fleet.state();
    all.retain(|f| sight.shows_rollouts_of(&f.namespace().unwrap_or_default()));
    all.sort_by_key(|f| (f.namespace(), f.name_any()));
    Value::Array(
        all.iter()
            .map(|f| json::rollout(f, &cache.history(f)))
            .collect(),
    )
}

/// The fleet bar; empty for an identity that may not list clusters.
fn clusters(hub: &Hub, sight: &Sight) -> Value {
    if !sight.clusters {
        return Value::Array(Vec::new());
    }
    hub.read(|ix| {
        Value::Array(
            ix.clusters()
                .iter()
                .map(|(name, info)| json::cluster(name, info))
                .collect(),
        )
    })
}

#[derive(Debug, Clone, Copy)]
pub struct StreamLimits {
    /// The fleet bar is checked this often for changes no revision marks
    /// (last seen, leader, epoch, labels).
    pub clusters_every: Duration,
    pub bookmark_every: Duration,
    /// A browser that leaves its buffer full this long is cut; it resumes
    /// from its last event id when it reads again.
    pub stall: Duration,
    /// The longest life of a stream; the browser then resumes, on this or
    /// another replica.
    pub max_age: Duration,
}

impl Default for StreamLimits {
    fn default() -> Self {
        StreamLimits {
            clusters_every: Duration::from_secs(2),
            bookmark_every: Duration::from_secs(30),
            stall: Duration::from_secs(10),
            max_age: Duration::from_secs(30 * 60),
        }
    }
}

/// A whole-list frame (`clusters`, `rollouts`) when the list is not the
/// one this stream last sent.
fn changed_frame(event: &'static str, now: Value, sent: &mut Value) -> Option<Frame> {
    (now != *sent).then(|| {
        let data = now.to_string();
        *sent = now;
        Frame {
            event,
            id: None,
            data,
        }
    })
}

/// What woke a stream.
enum Wake {
    Index,
    Clusters,
    Rollouts,
    Bookmark,
}

/// Why a stream must end before its browser leaves.
struct Ends {
    shutdown: watch::Receiver<bool>,
    revoked: Revocation,
    at: Instant,
}

impl Ends {
    async fn reached(&mut self) -> &'static str {
        tokio::select! {
            _ = streams::shutting_down(&mut self.shutdown) => "shutdown",
            _ = self.revoked.changed() => "revoked",
            _ = tokio::time::sleep_until(self.at) => "age",
        }
    }
}

fn finish(out: &mut Outbox<Frame>, why: &'static str) {
    METRICS.ui_streams_ended_total.inc(&[why]);
    let message = match why {
        "shutdown" => "the replica is shutting down; reconnect",
        "revoked" => "the credentials this stream was opened with changed; sign in again if asked",
        _ => "the stream reached its maximum age; reconnect",
    };
    out.end(Status::unavailable(message));
}

/// Sends `frames` one at a time, each raced against the stream's ends:
/// false when the stream is over (the browser left, stalled, or an end
/// came).
async fn put(
    out: &mut Outbox<Frame>,
    frames: impl IntoIterator<Item = Frame>,
    ends: &mut Ends,
) -> bool {
    for f in frames {
        let sent = tokio::select! {
            sent = out.send(f) => sent,
            why = ends.reached() => {
                finish(out, why);
                return false;
            }
        };
        match sent {
            Ok(()) => {}
            Err(Ended::Stalled) => {
                METRICS.ui_streams_ended_total.inc(&["stalled"]);
                return false;
            }
            Err(Ended::Closed) => return false,
        }
    }
    true
}

/// `put` for planner events, framed for this index.
async fn put_events(
    out: &mut Outbox<Frame>,
    events: impl IntoIterator<Item = Event>,
    id: &str,
    ends: &mut Ends,
) -> bool {
    put(out, events.into_iter().map(|e| frame(e, id)), ends).await
}

/// Feeds one browser until it leaves, stalls, reaches its age, loses its
/// credentials, or the server shuts down. Nothing is built whole ahead of
/// the browser: the snapshot goes out one row at a time as it reads. What
/// it reads: the hub, the rollout cache, and what this browser may see.
pub async fn run(
    (hub, fleet_rollouts, sight): (Arc<Hub>, Option<Arc<RolloutCache>>, Sight),
    resume: Option<u64>,
    mut out: Outbox<Frame>,
    limits: StreamLimits,
    shutdown: watch::Receiver<bool>,
    revoked: Revocation,
) {
    let mut ends = Ends {
        shutdown,
        revoked,
        at: Instant::now() + limits.max_age,
    };
    let id = hub.index_id.clone();
    let mut changed = hub.subscribe();
    let mut rollouts_changed = fleet_rollouts.as_ref().map(|c| c.subscribe());
    let (mut sent_clusters, mut sent_rollouts) = (Value::Null, Value::Null);
    let mut cursor = Cursor::new(Filter {
        visible: sight.microservices.clone(),
        ..Filter::default()
    });
    let first = changed_frame("clusters", clusters(&hub, &sight), &mut sent_clusters);
    if !put(&mut out, first, &mut ends).await {
        return;
    }
    let (snap, changes) = hub.read(|ix| (ix.snapshot(), resume.and_then(|r| ix.changes_since(r))));
    // Sent lazily, so held across the sends: with maps of its own.
    let snap = snap.detached();
    let sent = match changes {
        Some(changes) => {
            let events = cursor.resume(&snap, &changes);
            put_events(&mut out, events, &id, &mut ends).await
        }
        None => put_events(&mut out, cursor.snapshot(&snap), &id, &mut ends).await,
    };
    drop(snap);
    let rollouts_now = fleet_rollouts
        .as_deref()
        .and_then(|c| changed_frame("rollouts", rollouts(c, &sight), &mut sent_rollouts));
    if !sent || !put(&mut out, rollouts_now, &mut ends).await {
        return;
    }
    let mut clusters_tick = tokio::time::interval(limits.clusters_every);
    let mut bookmark_tick = tokio::time::interval(limits.bookmark_every);
    clusters_tick.reset();
    bookmark_tick.reset();
    loop {
        let wake = tokio::select! {
            why = ends.reached() => {
                finish(&mut out, why);
                return;
            }
            _ = out.closed() => return,
            c = changed.changed() => match c {
                Ok(()) => Wake::Index,
                Err(_) => return,
            },
            _ = clusters_tick.tick() => Wake::Clusters,
            Some(()) = changed_rollouts(&mut rollouts_changed) => Wake::Rollouts,
            _ = bookmark_tick.tick() => Wake::Bookmark,
        };
        let sent = match wake {
            // Level-based: whatever changed since the cursor.
            Wake::Index => {
                let (snap, changes) =
                    hub.read(|ix| (ix.snapshot(), ix.changes_since(cursor.revision())));
                match changes {
                    Some(changes) => {
                        // Built, then sent with the snapshot dropped: a
                        // snapshot held across a slow reader makes the
                        // index copy its map on its next write.
                        let events = cursor.changes(&snap, &changes);
                        drop(snap);
                        put_events(&mut out, events, &id, &mut ends).await
                    }
                    // Fell behind the tombstones: start over, row by row.
                    None => {
                        let snap = snap.detached();
                        put_events(&mut out, cursor.snapshot(&snap), &id, &mut ends).await
                    }
                }
            }
            // Leader, epoch and last seen change without a revision; a
            // cluster's reachability reaches its cells at once as an UPSERT.
            Wake::Clusters => {
                let f = changed_frame("clusters", clusters(&hub, &sight), &mut sent_clusters);
                put(&mut out, f, &mut ends).await
            }
            Wake::Rollouts => {
                let f = fleet_rollouts.as_deref().and_then(|c| {
                    changed_frame("rollouts", rollouts(c, &sight), &mut sent_rollouts)
                });
                put(&mut out, f, &mut ends).await
            }
            Wake::Bookmark => put(&mut out, [frame(cursor.bookmark(), &id)], &mut ends).await,
        };
        if !sent {
            return;
        }
    }
}

/// Resolves when the rollout cache changed; never without one.
async fn changed_rollouts(rx: &mut Option<watch::Receiver<u64>>) -> Option<()> {
    match rx {
        Some(rx) => rx.changed().await.ok(),
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_browser_resumes_only_on_this_index() {
        assert_eq!(resume_from("r1-abc/42", "r1-abc"), Some(42));
        assert_eq!(resume_from("r2-def/42", "r1-abc"), None);
        assert_eq!(resume_from(NO_RESUME, "r1-abc"), None);
        assert_eq!(resume_from("r1-abc/x", "r1-abc"), None);
    }

    #[test]
    fn a_list_is_sent_again_only_when_it_changed() {
        let mut sent = Value::Null;
        let f = changed_frame("clusters", json!([{"name": "a"}]), &mut sent).unwrap();
        assert_eq!(
            (f.event, f.id, f.data.as_str()),
            ("clusters", None, r#"[{"name":"a"}]"#)
        );
        assert!(changed_frame("clusters", json!([{"name": "a"}]), &mut sent).is_none());
        assert!(changed_frame("clusters", json!([]), &mut sent).is_some());
    }

    #[test]
    fn only_resume_points_carry_an_id() {
        let reset = frame(Event::Reset, "i");
        assert_eq!(reset.id.as_deref(), Some(NO_RESUME));
        let synced = frame(Event::Synced(9), "i");
        assert_eq!(
            (synced.event, synced.id.as_deref()),
            ("synced", Some("i/9"))
        );
        let delete = frame(Event::Delete(10, ("ns".into(), "a".into())), "i");
        assert_eq!(delete.data, r#"{"name":"a","namespace":"ns"}"#);
    }
}
