//! A new rollout term acts on what it has read, not on a cache (#59).
//! Before a leader's first member write for an object in a term, it reads
//! the FleetMicroservice and its ControllerRevisions from the apiserver
//! (a quorum read: no resourceVersion), and plans from that read until its
//! caches have caught up with it. Otherwise a successor whose caches lag
//! could plan from a status its predecessor already replaced, and apply a
//! revision again that was rolled back. Pure: whether the caches caught up.

use super::revision::Revision;

/// Whether a cached resourceVersion is at least the one read. Kubernetes
/// resourceVersions of one object come from one etcd and grow; one that
/// does not parse is caught up only when equal.
pub fn at_least(cached: Option<&str>, read: Option<&str>) -> bool {
    match (cached, read) {
        (Some(c), Some(r)) => match (c.parse::<u64>(), r.parse::<u64>()) {
            (Ok(c), Ok(r)) => c >= r,
            _ => c == r,
        },
        _ => false,
    }
}

/// What the planner reads of a revision: its name, number and memory.
fn key(r: &Revision) -> (&str, i64, Option<&str>, Option<i64>) {
    (
        &r.name,
        r.number,
        r.memory.good_before.as_deref(),
        r.memory.failed_number,
    )
}

/// The caches caught up with the read: the object's cached version is at
/// least the one read, and the cached revisions say what the read ones say.
pub fn caught_up(
    (cached_rv, read_rv): (Option<&str>, Option<&str>),
    cached: &[Revision],
    read: &[Revision],
) -> bool {
    let mut c: Vec<_> = cached.iter().map(key).collect();
    let mut r: Vec<_> = read.iter().map(key).collect();
    c.sort();
    r.sort();
    at_least(cached_rv, read_rv) && c == r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::revision::{Memory, RevisionData};

    fn rev(name: &str, number: i64, failed: Option<i64>) -> Revision {
        Revision {
            name: name.into(),
            number,
            data: RevisionData {
                template: crate::crd::MicroserviceSpec {
                    image: "app:1".into(),
                    port: 8080,
                    replicas: 1,
                    env: vec![],
                },
                overrides: vec![],
            },
            memory: Memory {
                good_before: None,
                failed_number: failed,
            },
        }
    }

    #[test]
    fn a_cache_behind_the_read_has_not_caught_up() {
        assert!(at_least(Some("120"), Some("118")));
        assert!(at_least(Some("118"), Some("118")));
        assert!(!at_least(Some("117"), Some("118")));
        assert!(!at_least(None, Some("1")));
        assert!(at_least(Some("x"), Some("x")));
        assert!(!at_least(Some("x"), Some("y")));
        let read = [rev("api-1", 1, None), rev("api-2", 2, Some(2))];
        // The revision's failure is not in the cache yet.
        let stale = [rev("api-2", 2, None), rev("api-1", 1, None)];
        assert!(!caught_up((Some("9"), Some("9")), &stale, &read));
        let fresh = [rev("api-2", 2, Some(2)), rev("api-1", 1, None)];
        assert!(caught_up((Some("9"), Some("9")), &fresh, &read));
        assert!(!caught_up((Some("8"), Some("9")), &fresh, &read));
    }
}
