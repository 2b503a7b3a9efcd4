//! A read barrier for rollout answers. A replica answers from its watch
//! cache, and a cache can lag the home apiserver: a replica that was
//! stopped while an edit was made wakes with the old object, `Complete` at
//! the old generation, and `flotilla rollout wait` would exit 0 while
//! members still ran the old image (found by `make chaos`). So a fresh
//! answer first reads the live generations from the home apiserver (a
//! quorum read of metadata only) and waits until the cache holds at least
//! those; if it does not within a bound, the call fails UNAVAILABLE and the
//! client asks again, perhaps another replica. The same idea as the
//! apiserver's consistent reads from its watch cache (KEP-2340).

use std::collections::BTreeMap;
use std::time::Duration;

use kube::api::ListParams;
use kube::{Api, Client};
use tonic::Status;

use super::errors::{self, Reason};

use crate::rollout::run::cache::RolloutCache;
use crate::rollout::spec::FleetMicroservice;

/// (namespace, name) -> (uid, generation) as the apiserver has it.
pub type Floor = BTreeMap<(String, String), (String, i64)>;

/// Whether the cache's view has reached the floor: every object in it at
/// the same uid and at least its generation. An object the cache holds at
/// another uid (deleted and made again) has not been reached either.
pub fn caught_up(floor: &Floor, seen: impl Fn(&(String, String)) -> Option<(String, i64)>) -> bool {
    floor
        .iter()
        .all(|(key, (uid, generation))| matches!(seen(key), Some((u, g)) if u == *uid && g >= *generation))
}

/// How long a call waits for its replica's cache to catch up.
pub const LIMIT: Duration = Duration::from_secs(10);

/// Waits until `cache` holds every FleetMicroservice of `ns` (or just
/// `name`) at least as new as the home apiserver has it now.
pub async fn barrier(
    home: &Client,
    cache: &RolloutCache,
    ns: Option<&str>,
    name: Option<&str>,
    limit: Duration,
) -> Result<(), Status> {
    let until = tokio::time::Instant::now() + limit;
    let floor = tokio::time::timeout_at(until, live(home, ns, name))
        .await
        .map_err(|_| unreachable_home("no answer"))?
        .map_err(|e| unreachable_home(&e.to_string()))?;
    let mut changes = cache.changes();
    loop {
        let seen = |(ns, name): &(String, String)| {
            let f = cache.get(ns, name)?;
            Some((f.metadata.uid.clone()?, f.metadata.generation.unwrap_or(0)))
        };
        if caught_up(&floor, seen) {
            return Ok(());
        }
        if tokio::time::timeout_at(until, changes.changed())
            .await
            .is_err()
        {
            return Err(errors::status(
                Reason::HomeViewStale,
                format!(
                    "this replica's view of the home cluster is more than {limit:?} behind it; ask again"
                ),
            ));
        }
    }
}

async fn live(home: &Client, ns: Option<&str>, name: Option<&str>) -> Result<Floor, kube::Error> {
    let api: Api<FleetMicroservice> = match ns {
        Some(ns) => Api::namespaced(home.clone(), ns),
        None => Api::all(home.clone()),
    };
    let metas = match name {
        Some(name) => api.get_metadata_opt(name).await?.into_iter().collect(),
        None => api.list_metadata(&ListParams::default()).await?.items,
    };
    Ok(metas
        .into_iter()
        .filter_map(|m| {
            let meta = m.metadata;
            Some((
                (meta.namespace?, meta.name?),
                (meta.uid?, meta.generation.unwrap_or(0)),
            ))
        })
        .collect())
}

fn unreachable_home(why: &str) -> Status {
    errors::status(
        Reason::HomeUnreachable,
        format!(
            "the home cluster did not answer ({why}), so this replica cannot tell whether its view is current; ask again"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn floor(items: &[(&str, &str, i64)]) -> Floor {
        items
            .iter()
            .map(|(name, uid, g)| (("ns".to_string(), name.to_string()), (uid.to_string(), *g)))
            .collect()
    }

    #[test]
    fn the_cache_must_hold_every_object_at_its_uid_and_generation_or_newer() {
        let f = floor(&[("a", "u1", 3), ("b", "u2", 1)]);
        fn cache(
            a: Option<(&'static str, i64)>,
        ) -> impl Fn(&(String, String)) -> Option<(String, i64)> {
            move |k| match k.1.as_str() {
                "a" => a.map(|(u, g)| (u.to_string(), g)),
                _ => Some(("u2".to_string(), 1)),
            }
        }
        assert!(caught_up(&f, cache(Some(("u1", 3)))));
        assert!(caught_up(&f, cache(Some(("u1", 4)))), "newer is fine");
        assert!(
            !caught_up(&f, cache(Some(("u1", 2)))),
            "the edit not seen yet"
        );
        assert!(!caught_up(&f, cache(None)), "not seen at all");
        assert!(
            !caught_up(&f, cache(Some(("u0", 9)))),
            "an older incarnation"
        );
        assert!(caught_up(&Floor::new(), cache(None)), "nothing to wait for");
    }
}
