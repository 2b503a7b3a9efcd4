//! Revisions of a FleetMicroservice, as Kubernetes keeps them for
//! DaemonSets: each distinct (template, overrides) is one ControllerRevision,
//! named by a hash of its data and numbered in the order it became current.
//! Pure: the edge lists, creates, bumps and deletes what this decides.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::placement::digest_bytes;
use super::spec::{FleetMicroserviceSpec, Override};
use crate::crd::MicroserviceSpec;

/// What a revision holds: everything that decides what a member gets.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq)]
pub struct RevisionData {
    pub template: MicroserviceSpec,
    #[serde(default)]
    pub overrides: Vec<Override>,
}

impl RevisionData {
    pub fn of(spec: &FleetMicroserviceSpec) -> Self {
        RevisionData {
            template: spec.template.clone(),
            overrides: spec.overrides.clone(),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Revision {
    pub name: String,
    pub number: i64,
    pub data: RevisionData,
    pub memory: Memory,
}

/// What a revision's ControllerRevision remembers of the rollouts, so
/// that a status that is lost (a restore without status, a wipe) does not
/// take the fleet's memory with it (review L13), as a Deployment keeps
/// its history in its ReplicaSets.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Memory {
    /// The last good revision when this one was created: what a failure
    /// of this one goes back to. Written with the create, so it costs no write.
    pub good_before: Option<String>,
    /// The number this revision had when it failed. A revision re-applied
    /// later gets a new number, and is a fresh attempt.
    pub failed_number: Option<i64>,
}

impl Revision {
    /// Failed as it is numbered now.
    pub fn failed(&self) -> bool {
        self.memory.failed_number == Some(self.number)
    }
}

/// `<fleet-microservice>-<hash>`, short enough for any object name.
pub fn name_for(owner: &str, data: &RevisionData) -> String {
    let bytes = serde_json::to_vec(data).unwrap_or_default();
    let hash = format!("{:016x}", digest_bytes(&bytes));
    let keep = owner.len().min(253 - hash.len() - 1);
    format!("{}-{hash}", &owner[..keep])
}

/// How the spec's revision comes to exist and be the newest.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// It exists and is the newest.
    Current(Revision),
    /// Create it with the next number.
    Create(Revision),
    /// It exists with an older number (the spec went back to it): renumber
    /// it as the newest, as DaemonSets do on a rollback.
    Renumber(Revision),
}

impl Step {
    pub fn revision(&self) -> &Revision {
        match self {
            Step::Current(r) | Step::Create(r) | Step::Renumber(r) => r,
        }
    }
}

/// The update revision for `data`, given the existing revisions.
/// `floor` is the highest number known to have been used (the status's),
/// so a new revision never reuses one the cache has not shown yet.
pub fn update_revision(
    owner: &str,
    existing: &[Revision],
    data: &RevisionData,
    floor: i64,
) -> Result<Step, String> {
    let name = name_for(owner, data);
    let stored = existing.iter().map(|r| r.number).max().unwrap_or(0);
    let newest = stored.max(floor);
    match existing.iter().find(|r| r.name == name) {
        Some(r) if r.data != *data => Err(format!(
            "revision {name} exists with different data (a hash collision); rename the FleetMicroservice"
        )),
        Some(r) if r.number == stored => Ok(Step::Current(r.clone())),
        Some(r) => Ok(Step::Renumber(Revision {
            number: newest + 1,
            ..r.clone()
        })),
        None => Ok(Step::Create(Revision {
            name,
            number: newest + 1,
            data: data.clone(),
            memory: Memory::default(),
        })),
    }
}

/// The revision an undo goes back to: number `to`, or with 0 the last good
/// revision, or (when that is the update revision) the newest before it
/// that did not fail (review L7: going back to a known failure is never
/// the default; name its number to try it again).
pub fn undo_target<'a>(
    stored: &'a [Revision],
    update: Option<&str>,
    last_good: Option<&str>,
    to: i64,
) -> Result<&'a Revision, String> {
    let numbers = || {
        let mut n: Vec<String> = stored.iter().map(|r| r.number.to_string()).collect();
        n.sort();
        n.join(", ")
    };
    if to > 0 {
        return stored
            .iter()
            .find(|r| r.number == to)
            .ok_or_else(|| format!("revision {to} is not stored (stored: {})", numbers()));
    }
    if let Some(good) = last_good.filter(|g| Some(*g) != update)
        && let Some(r) = stored.iter().find(|r| r.name == good)
    {
        return Ok(r);
    }
    let current = stored
        .iter()
        .find(|r| Some(r.name.as_str()) == update)
        .map_or(i64::MAX, |r| r.number);
    let earlier = || stored.iter().filter(|r| r.number < current);
    earlier()
        .filter(|r| !r.failed())
        .max_by_key(|r| r.number)
        .ok_or_else(|| match earlier().count() {
            0 => "there is no earlier revision to go back to".to_string(),
            _ => format!(
                "every earlier revision failed; name one to try it again (stored: {})",
                numbers()
            ),
        })
}

/// Revisions to delete: the oldest beyond `limit`, never one in `keep`
/// (the update revision, the last good one, and any a member runs).
pub fn prune(existing: &[Revision], limit: usize, keep: &BTreeSet<String>) -> Vec<String> {
    let mut old: Vec<&Revision> = existing.iter().collect();
    old.sort_by_key(|r| std::cmp::Reverse(r.number));
    old.into_iter()
        .skip(limit)
        .filter(|r| !keep.contains(&r.name))
        .map(|r| r.name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(image: &str) -> RevisionData {
        RevisionData {
            template: MicroserviceSpec {
                image: image.into(),
                port: 80,
                replicas: 2,
                env: vec![],
            },
            overrides: vec![],
        }
    }

    #[test]
    fn names_are_stable_and_differ_by_data() {
        assert_eq!(name_for("api", &data("a:1")), name_for("api", &data("a:1")));
        assert_ne!(name_for("api", &data("a:1")), name_for("api", &data("a:2")));
        assert!(name_for(&"x".repeat(300), &data("a:1")).len() <= 253);
    }

    #[test]
    fn new_data_is_the_next_number_and_old_data_is_renumbered() {
        let step = update_revision("api", &[], &data("a:1"), 0).unwrap();
        let first = match step {
            Step::Create(r) => r,
            other => panic!("{other:?}"),
        };
        assert_eq!(first.number, 1);
        let second = Revision {
            name: name_for("api", &data("a:2")),
            number: 2,
            data: data("a:2"),
            memory: Memory::default(),
        };
        let existing = vec![first.clone(), second.clone()];
        assert_eq!(
            update_revision("api", &existing, &data("a:2"), 0).unwrap(),
            Step::Current(second)
        );
        // Going back to a:1 makes it revision 3, as a DaemonSet rollback does.
        match update_revision("api", &existing, &data("a:1"), 0).unwrap() {
            Step::Renumber(r) => assert_eq!((r.name, r.number), (first.name, 3)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn numbers_continue_past_the_floor_the_cache_has_not_caught_up_with() {
        match update_revision("api", &[], &data("a:3"), 2).unwrap() {
            Step::Create(r) => assert_eq!(r.number, 3),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_collision_is_an_error_not_an_overwrite() {
        let mut r = Revision {
            name: name_for("api", &data("a:1")),
            number: 1,
            data: data("a:1"),
            memory: Memory::default(),
        };
        r.data = data("a:9");
        assert!(update_revision("api", &[r], &data("a:1"), 0).is_err());
    }

    /// Revisions r1..=rN, numbered 1..=N.
    fn numbered(n: i64) -> Vec<Revision> {
        (1..=n)
            .map(|n| Revision {
                name: format!("r{n}"),
                number: n,
                data: data(&format!("a:{n}")),
                memory: Memory::default(),
            })
            .collect()
    }

    #[test]
    fn undo_goes_to_a_number_the_last_good_or_the_one_before() {
        let revs = numbered(3);
        assert_eq!(
            undo_target(&revs, Some("r3"), Some("r1"), 2).unwrap().name,
            "r2"
        );
        assert!(
            undo_target(&revs, Some("r3"), Some("r1"), 9)
                .unwrap_err()
                .contains("1, 2, 3")
        );
        assert_eq!(
            undo_target(&revs, Some("r3"), Some("r1"), 0).unwrap().name,
            "r1"
        );
        assert_eq!(
            undo_target(&revs, Some("r3"), Some("r3"), 0).unwrap().name,
            "r2"
        );
        assert!(undo_target(&revs[..1], Some("r1"), Some("r1"), 0).is_err());
    }

    /// Review L7: with r3 good and r2 failed, an undo without a number
    /// goes to r1, not to r2; r2 is still there by its number.
    #[test]
    fn undo_skips_a_revision_that_failed() {
        let mut revs = numbered(3);
        revs[1].memory.failed_number = Some(2);
        assert_eq!(
            undo_target(&revs, Some("r3"), Some("r3"), 0).unwrap().name,
            "r1"
        );
        assert_eq!(
            undo_target(&revs, Some("r3"), Some("r3"), 2).unwrap().name,
            "r2"
        );
        // Failed under an older number, it was re-applied since: not failed.
        revs[1].number = 4;
        assert!(!revs[1].failed());
        revs[0].memory.failed_number = Some(1);
        let err = undo_target(&revs[..1], Some("r9"), None, 0).unwrap_err();
        assert!(err.contains("every earlier revision failed"), "{err}");
    }

    #[test]
    fn pruning_keeps_the_newest_and_what_is_in_use() {
        let revs = numbered(5);
        let keep = BTreeSet::from(["r1".to_string()]);
        assert_eq!(prune(&revs, 2, &keep), vec!["r3", "r2"]);
        assert!(prune(&revs, 10, &keep).is_empty());
    }
}
