//! The WatchRollouts stream: a snapshot or a resume from the rollout
//! cache's log, then its changes, bookmarks when idle; for an unscoped
//! Kubernetes identity, only the namespaces it may watch, asked again
//! every `streams::RECHECK` (#34), as `WatchMicroservices` does.

use std::collections::BTreeSet;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;
use tonic::Status;

use super::pb::{self, WatchEventType};
use super::rollout_convert::{deleted, listed, rollout};
use super::watch::WatchLimits;
use crate::authz::access::Resource;
use crate::authz::gate::Standing;
use crate::rollout::run::cache::{Key, RolloutCache};
use crate::serve::streams::{self, Outbox};

const METHOD: &str = "WatchRollouts";

/// What one stream may send: its namespace (or all), and of those the
/// namespaces its caller may watch (`None`: every one).
#[derive(Clone, Default)]
pub struct View {
    pub namespace: Option<String>,
    pub visible: Option<Arc<BTreeSet<String>>>,
}

impl View {
    pub fn shows(&self, ns: &str) -> bool {
        self.namespace.as_deref().is_none_or(|want| want == ns)
            && self.visible.as_ref().is_none_or(|v| v.contains(ns))
    }
}

fn event(
    type_: WatchEventType,
    revision: u64,
    id: &str,
    r: Option<pb::Rollout>,
) -> pb::RolloutEvent {
    pb::RolloutEvent {
        r#type: type_ as i32,
        revision,
        index_id: id.to_string(),
        rollout: r,
    }
}

/// A snapshot: RESET, every rollout in view, SYNCED.
fn snapshot(cache: &RolloutCache, view: &View, revision: u64) -> Vec<pb::RolloutEvent> {
    let id = cache.index_id.as_str();
    std::iter::once(event(WatchEventType::Reset, 0, id, None))
        .chain(
            listed(cache, |ns| view.shows(ns), None)
                .map(|r| event(WatchEventType::Snapshot, 0, id, Some(r))),
        )
        .chain(std::iter::once(event(
            WatchEventType::Synced,
            revision,
            id,
            None,
        )))
        .collect()
}

/// What changed in view: the latest state of each key, or its deletion.
fn changes(cache: &RolloutCache, view: &View, changed: &[(u64, Key)]) -> Vec<pb::RolloutEvent> {
    let id = cache.index_id.as_str();
    changed
        .iter()
        .filter(|(_, (n, _))| view.shows(n))
        .map(|(rev, (n, name))| match cache.get(n, name) {
            Some(f) => event(
                WatchEventType::Upsert,
                *rev,
                id,
                // With its revisions' numbers, as Get, List and the
                // snapshot give them (review L6).
                Some(rollout(&f, &cache.history(&f), false)),
            ),
            None => event(WatchEventType::Delete, *rev, id, Some(deleted(n, name))),
        })
        .collect()
}

async fn send(
    out: &mut Outbox<pb::RolloutEvent>,
    events: Vec<pb::RolloutEvent>,
) -> Result<usize, ()> {
    let n = events.len();
    for e in events {
        out.send(e).await.map_err(|_| ())?;
    }
    Ok(n)
}

/// The namespaces `standing` may watch now, when they differ from
/// `current`; a token no longer accepted ends the stream. Namespaces asked
/// about before stay asked about, so one emptied is not taken for a
/// revocation.
async fn recheck(
    standing: &Standing,
    cache: &RolloutCache,
    current: &View,
) -> Result<Option<View>, Status> {
    let mut asked = cache.namespaces();
    asked.extend(current.visible.iter().flat_map(|v| v.iter().cloned()));
    let fleet = Resource::FleetMicroservices;
    let visible = standing.visible_now("watch", fleet, asked, METHOD).await?;
    if visible.as_ref() == current.visible.as_deref() {
        return Ok(None);
    }
    Ok(Some(View {
        visible: visible.map(Arc::new),
        ..current.clone()
    }))
}

/// Runs one stream until its client leaves, it stalls, it reaches its
/// age, it loses its right, or the server shuts down. `rights`: the
/// caller of an unscoped stream whose view may change while it runs.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    cache: Arc<RolloutCache>,
    mut view: View,
    rights: Option<Standing>,
    resume: Option<u64>,
    mut out: Outbox<pb::RolloutEvent>,
    limits: WatchLimits,
    mut shutdown: watch::Receiver<bool>,
    mut revoked: streams::Revocation,
) {
    let mut changed = cache.subscribe();
    let mut at = cache.revision();
    let first = match resume.and_then(|r| cache.changes_since(r)) {
        Some(c) => {
            at = at.max(c.last().map_or(0, |(r, _)| *r));
            let mut events = changes(&cache, &view, &c);
            events.push(event(WatchEventType::Synced, at, &cache.index_id, None));
            events
        }
        None => snapshot(&cache, &view, at),
    };
    if send(&mut out, first).await.is_err() {
        return;
    }
    let ends_at = Instant::now() + limits.max_age;
    let mut quiet_until = Instant::now() + limits.bookmark_every;
    let every = streams::RECHECK;
    let mut rechecks = tokio::time::interval_at(Instant::now() + every, every);
    loop {
        tokio::select! {
            end = streams::must_end(&out, &mut shutdown, &mut revoked, ends_at, limits.max_age) => {
                if let Some(status) = end {
                    out.end(status);
                }
                return;
            }
            _ = tokio::time::sleep_until(quiet_until) => {
                let mark = event(WatchEventType::Bookmark, at, &cache.index_id, None);
                if send(&mut out, vec![mark]).await.is_err() {
                    return;
                }
                quiet_until = Instant::now() + limits.bookmark_every;
                continue;
            }
            _ = rechecks.tick(), if rights.is_some() => {
                let Some(standing) = &rights else { continue };
                match recheck(standing, &cache, &view).await {
                    Err(status) => {
                        out.end(status);
                        return;
                    }
                    Ok(None) => {}
                    // Rights changed: start over, framed by RESET, so what
                    // may no longer be seen is gone from the client's view.
                    Ok(Some(next)) => {
                        view = next;
                        at = cache.revision();
                        if send(&mut out, snapshot(&cache, &view, at)).await.is_err() {
                            return;
                        }
                        quiet_until = Instant::now() + limits.bookmark_every;
                    }
                }
                continue;
            }
            c = changed.changed() => if c.is_err() { return },
        }
        let now = cache.revision();
        let events = match cache.changes_since(at) {
            Some(c) => {
                at = now.max(c.last().map_or(0, |(r, _)| *r));
                changes(&cache, &view, &c)
            }
            // A relist happened: start over, framed by RESET.
            None => {
                at = now;
                snapshot(&cache, &view, now)
            }
        };
        match send(&mut out, events).await {
            Ok(0) => {}
            Ok(_) => quiet_until = Instant::now() + limits.bookmark_every,
            Err(()) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_shows_its_namespace_and_only_what_its_caller_may_watch() {
        let everything = View::default();
        assert!(everything.shows("a") && everything.shows("b"));
        let team = View {
            namespace: None,
            visible: Some(Arc::new(BTreeSet::from(["a".to_string()]))),
        };
        assert!(team.shows("a"));
        assert!(!team.shows("b"));
        let named = View {
            namespace: Some("b".into()),
            ..team.clone()
        };
        assert!(!named.shows("a") && !named.shows("b"));
        let nothing = View {
            namespace: None,
            visible: Some(Arc::new(BTreeSet::new())),
        };
        assert!(!nothing.shows("a"));
    }
}
