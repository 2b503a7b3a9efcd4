//! The WatchMicroservices stream: drives the pure planner (`status::watch`)
//! from the hub's snapshots, outside the index lock, and encodes its events.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::{convert, pb};
use crate::authz::access::Resource;
use crate::authz::gate::Standing;
use crate::serve::streams::{self, Ended, Outbox};
use crate::status::hub::Hub;
use crate::status::index::Filter;
use crate::status::watch::{Cursor, Event};

#[derive(Debug, Clone, Copy)]
pub struct WatchLimits {
    /// An idle stream gets a BOOKMARK this often.
    pub bookmark_every: Duration,
    /// A stream is ended (UNAVAILABLE, to be resumed) after this long.
    pub max_age: Duration,
}

/// What a stream may send: its filter, and the rights (a user's) that
/// may narrow it while it runs.
pub struct Scope {
    pub filter: Filter,
    pub rights: Option<Rights>,
}

/// A Kubernetes identity's rights over an unscoped stream, asked again
/// every `streams::RECHECK`: they narrow or widen what it sends.
pub struct Rights {
    pub standing: Standing,
    pub verb: &'static str,
}

impl Rights {
    /// The filter the stream should now have, when it differs from
    /// `current`; a token no longer accepted ends the stream.
    async fn recheck(&self, current: &Filter, hub: &Hub) -> Result<Option<Filter>, tonic::Status> {
        const METHOD: &str = "WatchMicroservices";
        // Namespaces seen before stay asked about, so one emptied is not
        // taken for a revocation. The scan runs outside the index lock.
        let mut asked = hub.read(|ix| ix.snapshot()).namespaces();
        asked.extend(current.visible.iter().flat_map(|v| v.iter().cloned()));
        let visible = self
            .standing
            .visible_now(self.verb, Resource::Microservices, asked, METHOD)
            .await?;
        if visible.as_ref() == current.visible.as_deref() {
            return Ok(None);
        }
        Ok(Some(Filter {
            visible: visible.map(Arc::new),
            ..current.clone()
        }))
    }
}

fn encode(event: Event, index_id: &str) -> pb::WatchEvent {
    use pb::WatchEventType as T;
    let (type_, revision, microservice) = match event {
        Event::Reset => (T::Reset, 0, None),
        Event::Item(v) => (T::Snapshot, 0, Some(convert::microservice(&v))),
        Event::Synced(r) => (T::Synced, r, None),
        Event::Upsert(r, v) => (T::Upsert, r, Some(convert::microservice(&v))),
        Event::Delete(r, k) => (
            T::Delete,
            r,
            Some(pb::Microservice {
                namespace: k.0,
                name: k.1,
                ..Default::default()
            }),
        ),
        Event::Bookmark(r) => (T::Bookmark, r, None),
    };
    pb::WatchEvent {
        r#type: type_ as i32,
        revision,
        index_id: index_id.to_string(),
        microservice,
    }
}

async fn send_all(
    out: &mut Outbox<pb::WatchEvent>,
    events: impl IntoIterator<Item = Event>,
    index_id: &str,
) -> Result<usize, Ended> {
    let mut n = 0;
    for e in events {
        out.send(encode(e, index_id)).await?;
        n += 1;
    }
    Ok(n)
}

/// Runs one stream until its client leaves, it stalls, it reaches its
/// age, or the server shuts down.
pub async fn run(
    hub: Arc<Hub>,
    Scope { filter, rights }: Scope,
    resume: Option<u64>,
    mut out: Outbox<pb::WatchEvent>,
    limits: WatchLimits,
    mut shutdown: watch::Receiver<bool>,
    mut revoked: streams::Revocation,
) {
    let id = hub.index_id.clone();
    let mut changed = hub.subscribe();
    let mut current = filter.clone();
    let mut cursor = Cursor::new(filter);
    let every = streams::RECHECK;
    let mut recheck = tokio::time::interval_at(Instant::now() + every, every);
    let (snap, changes) = hub.read(|ix| (ix.snapshot(), resume.and_then(|r| ix.changes_since(r))));
    // Sent lazily, so held across the sends: with maps of its own.
    let snap = snap.detached();
    let first = match changes {
        Some(changes) => send_all(&mut out, cursor.resume(&snap, &changes), &id).await,
        None => send_all(&mut out, cursor.snapshot(&snap), &id).await,
    };
    drop(snap);
    if first.is_err() {
        return;
    }
    let ends_at = Instant::now() + limits.max_age;
    let mut quiet_until = Instant::now() + limits.bookmark_every;
    loop {
        tokio::select! {
            end = streams::must_end(&out, &mut shutdown, &mut revoked, ends_at, limits.max_age) => {
                if let Some(status) = end {
                    out.end(status);
                }
                return;
            }
            _ = tokio::time::sleep_until(quiet_until) => {
                if send_all(&mut out, [cursor.bookmark()], &id).await.is_err() {
                    return;
                }
                quiet_until = Instant::now() + limits.bookmark_every;
                continue;
            }
            _ = recheck.tick(), if rights.is_some() => {
                let Some(rights) = &rights else { continue };
                match rights.recheck(&current, &hub).await {
                    Err(status) => {
                        out.end(status);
                        return;
                    }
                    Ok(None) => {}
                    // Rights changed: start over, framed by RESET, so what
                    // may no longer be seen is gone from the client's view.
                    Ok(Some(narrowed)) => {
                        current = narrowed.clone();
                        cursor = Cursor::new(narrowed);
                        let snap = hub.read(|ix| ix.snapshot()).detached();
                        if send_all(&mut out, cursor.snapshot(&snap), &id).await.is_err() {
                            return;
                        }
                        quiet_until = Instant::now() + limits.bookmark_every;
                    }
                }
                continue;
            }
            c = changed.changed() => if c.is_err() { return },
        }
        // Level-based: whatever changed since the cursor, however many
        // revisions passed while this stream was busy.
        let (snap, changes) = hub.read(|ix| (ix.snapshot(), ix.changes_since(cursor.revision())));
        let sent = match changes {
            Some(changes) => {
                // Built, then sent with the snapshot dropped: a snapshot
                // held across a slow reader's await makes the index copy
                // its whole map on its next write.
                let events = cursor.changes(&snap, &changes);
                drop(snap);
                send_all(&mut out, events, &id).await
            }
            // Fell behind the tombstones: start over, framed by RESET. The
            // snapshot streams lazily (never buffered whole), so it is held,
            // with maps of its own.
            None => {
                let snap = snap.detached();
                send_all(&mut out, cursor.snapshot(&snap), &id).await
            }
        };
        match sent {
            Ok(0) => {}
            Ok(_) => quiet_until = Instant::now() + limits.bookmark_every,
            Err(_) => return,
        }
    }
}
