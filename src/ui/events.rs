//! The dashboard's live stream: the watch planner (`status::watch`)
//! driven from the hub and sent as Server-Sent Events. An event's id is
//! `<index id>/<revision>`; a browser that reconnects sends it back as
//! `Last-Event-ID` and gets what changed since, or, from another index
//! (a restarted or different replica), a fresh snapshot.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

use kube::ResourceExt;

use super::json;
use crate::rollout::cache::RolloutCache;
use crate::status::hub::Hub;
use crate::status::index::Filter;
use crate::status::watch::{Cursor, Event};

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

/// Every FleetMicroservice, by namespace and name.
pub fn rollouts(cache: &RolloutCache) -> Value {
    let mut all = cache.fleet.state();
    all.sort_by_key(|f| (f.namespace(), f.name_any()));
    Value::Array(
        all.iter()
            .map(|f| json::rollout(f, &cache.history(f)))
            .collect(),
    )
}

fn clusters(hub: &Hub) -> Value {
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
}

impl Default for StreamLimits {
    fn default() -> Self {
        StreamLimits {
            clusters_every: Duration::from_secs(2),
            bookmark_every: Duration::from_secs(30),
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

/// Feeds one browser until it leaves or the server shuts down.
pub async fn run(
    hub: Arc<Hub>,
    fleet_rollouts: Option<Arc<RolloutCache>>,
    resume: Option<u64>,
    tx: mpsc::Sender<Frame>,
    limits: StreamLimits,
    mut shutdown: watch::Receiver<bool>,
) {
    let id = hub.index_id.clone();
    let mut changed = hub.subscribe();
    let mut rollouts_changed = fleet_rollouts.as_ref().map(|c| c.subscribe());
    let (mut sent_clusters, mut sent_rollouts) = (Value::Null, Value::Null);
    let mut cursor = Cursor::new(Filter::default());
    let (snap, changes) = hub.read(|ix| (ix.snapshot(), resume.and_then(|r| ix.changes_since(r))));
    let mut first: Vec<Frame> = changed_frame("clusters", clusters(&hub), &mut sent_clusters)
        .into_iter()
        .collect();
    let events = match changes {
        Some(changes) => cursor.resume(&snap, &changes),
        None => cursor.snapshot(&snap).collect(),
    };
    drop(snap);
    first.extend(events.into_iter().map(|e| frame(e, &id)));
    first.extend(
        fleet_rollouts
            .as_deref()
            .and_then(|c| changed_frame("rollouts", rollouts(c), &mut sent_rollouts)),
    );
    for f in first {
        if tx.send(f).await.is_err() {
            return;
        }
    }
    let mut clusters_tick = tokio::time::interval(limits.clusters_every);
    let mut bookmark_tick = tokio::time::interval(limits.bookmark_every);
    clusters_tick.reset();
    bookmark_tick.reset();
    loop {
        let wake = tokio::select! {
            // The guard `wait_for` returns is not Send: drop it here.
            _ = async { shutdown.wait_for(|s| *s).await.is_ok() } => return,
            _ = tx.closed() => return,
            c = changed.changed() => match c {
                Ok(()) => Wake::Index,
                Err(_) => return,
            },
            _ = clusters_tick.tick() => Wake::Clusters,
            Some(()) = changed_rollouts(&mut rollouts_changed) => Wake::Rollouts,
            _ = bookmark_tick.tick() => Wake::Bookmark,
        };
        let frames: Vec<Frame> = match wake {
            // Level-based: whatever changed since the cursor.
            Wake::Index => {
                let (snap, changes) =
                    hub.read(|ix| (ix.snapshot(), ix.changes_since(cursor.revision())));
                let events = match changes {
                    Some(changes) => cursor.changes(&snap, &changes),
                    None => cursor.snapshot(&snap).collect(),
                };
                events.into_iter().map(|e| frame(e, &id)).collect()
            }
            // Leader, epoch and last seen change without a revision; a
            // cluster's reachability reaches its cells at once as an UPSERT.
            Wake::Clusters => changed_frame("clusters", clusters(&hub), &mut sent_clusters)
                .into_iter()
                .collect(),
            Wake::Rollouts => fleet_rollouts
                .as_deref()
                .and_then(|c| changed_frame("rollouts", rollouts(c), &mut sent_rollouts))
                .into_iter()
                .collect(),
            Wake::Bookmark => vec![frame(cursor.bookmark(), &id)],
        };
        for f in frames {
            if tx.send(f).await.is_err() {
                return;
            }
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
