//! What the fleet controller's last writes to each member found, per
//! FleetMicroservice: the planner's `troubles`, and a backoff so that a
//! member that refuses is asked again at 1 s, 2 s, 4 s … up to a minute,
//! never every round. The clock is passed in.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use super::trouble::{Kind, Trouble};

const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Why a member write did not succeed, as the log needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failed {
    /// This replica's own fence stopped it: its term ended, and the member
    /// never answered.
    Fenced,
    /// The member answered this, or did not answer.
    Member(Kind),
}

/// What a write found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    Created,
    Replaced,
    /// It already holds exactly this revision: nothing was written.
    Unchanged,
    /// Someone else's Microservice is there; it is never written.
    NotOurs,
    /// Written, but the member stored a different spec than was sent: it
    /// prunes a field its CRD lacks, or an admission webhook changes it.
    Altered,
}

/// How one member write ended.
pub enum Outcome {
    /// Written, or already there.
    Ok,
    /// Written, but the member stored a different spec.
    Altered { revision: String, digest: u64 },
    /// An apply that failed.
    ApplyFailed {
        revision: String,
        digest: u64,
        kind: Kind,
    },
    /// A delete, or an apply that could not be made, failed: only backs
    /// off, and keeps what the last write found (an altered count must not
    /// start over).
    DeleteFailed,
}

/// What a finished write tells the log, given the (revision, digest) it
/// meant to write: nothing when this replica's own fence stopped it (its
/// term ended: the member never answered, and the next term reads and
/// writes again), else the member's answer.
pub fn outcome_of(
    result: &Result<Written, Failed>,
    meant: Option<(String, u64)>,
) -> Option<Outcome> {
    Some(match (result, meant) {
        (Err(Failed::Fenced), _) => return None,
        (Ok(Written::Altered), Some((revision, digest))) => Outcome::Altered { revision, digest },
        (Ok(_), _) => Outcome::Ok,
        (Err(Failed::Member(kind)), Some((revision, digest))) => Outcome::ApplyFailed {
            revision,
            digest,
            kind: kind.clone(),
        },
        (Err(_), None) => Outcome::DeleteFailed,
    })
}

struct Noted {
    trouble: Option<Trouble>,
    attempts: u32,
    next_try: Instant,
    /// How often the member altered which (revision, digest), kept across
    /// failed writes: a timeout or a conflict between two alterations must
    /// not start the count over, or the planner writes again and again.
    altered: Option<(String, u64, u32)>,
}

/// What a plan read from the log: the troubles, and how many outcomes of
/// the object had come in by then.
pub struct Reading {
    pub troubles: BTreeMap<String, Trouble>,
    outcomes: u64,
}

#[derive(Default)]
pub struct WriteLog {
    by_object: BTreeMap<String, BTreeMap<String, Noted>>,
    /// Outcomes recorded per object, so a plan can tell it is stale.
    outcomes: BTreeMap<String, u64>,
    /// (uid, cluster) with a write under way: not asked twice at once.
    in_flight: BTreeSet<(String, String)>,
}

impl WriteLog {
    /// The troubles of one FleetMicroservice, by cluster.
    pub fn troubles(&self, uid: &str) -> BTreeMap<String, Trouble> {
        self.by_object
            .get(uid)
            .into_iter()
            .flatten()
            .filter_map(|(c, n)| Some((c.clone(), n.trouble.clone()?)))
            .collect()
    }

    /// What a plan of `uid` reads.
    pub fn read(&self, uid: &str) -> Reading {
        Reading {
            troubles: self.troubles(uid),
            outcomes: self.outcomes.get(uid).copied().unwrap_or(0),
        }
    }

    /// Whether a plan made on `reading` may still start writes: not once
    /// an outcome came in after it was read, since the plan did not see it
    /// (a second "altered" turns a retry into `SpecRejected`).
    pub fn current(&self, uid: &str, reading: &Reading) -> bool {
        self.outcomes.get(uid).copied().unwrap_or(0) == reading.outcomes
    }

    /// Whether a write to `cluster` may go now.
    pub fn due(&self, uid: &str, cluster: &str, now: Instant) -> bool {
        !self
            .in_flight
            .contains(&(uid.to_string(), cluster.to_string()))
            && self
                .by_object
                .get(uid)
                .and_then(|m| m.get(cluster))
                .is_none_or(|n| n.next_try <= now)
    }

    /// A write to `cluster` starts.
    pub fn start(&mut self, uid: &str, cluster: &str) {
        self.in_flight
            .insert((uid.to_string(), cluster.to_string()));
    }

    /// A write that ended without an outcome (the fence stopped it): no
    /// longer under way, and nothing learned.
    pub fn abandon(&mut self, uid: &str, cluster: &str) {
        self.in_flight
            .remove(&(uid.to_string(), cluster.to_string()));
    }

    /// A new term: the writes of the last one were cut.
    pub fn new_term(&mut self) {
        self.in_flight.clear();
    }

    pub fn record(&mut self, uid: &str, cluster: &str, outcome: Outcome, now: Instant) {
        self.in_flight
            .remove(&(uid.to_string(), cluster.to_string()));
        *self.outcomes.entry(uid.to_string()).or_default() += 1;
        let object = self.by_object.entry(uid.to_string()).or_default();
        let before = object.remove(cluster);
        let attempts = before.as_ref().map_or(0, |n| n.attempts) + 1;
        let backoff = Duration::from_secs(1 << attempts.min(6).saturating_sub(1)).min(MAX_BACKOFF);
        let altered_before = before.as_ref().and_then(|n| n.altered.clone());
        let noted = match outcome {
            Outcome::Ok => return,
            Outcome::Altered { revision, digest } => {
                let times = match altered_before {
                    Some((r, d, times)) if r == revision && d == digest => times + 1,
                    _ => 1,
                };
                Noted {
                    trouble: Some(Trouble {
                        revision: revision.clone(),
                        digest,
                        kind: Kind::Altered { times },
                    }),
                    attempts,
                    next_try: now,
                    altered: Some((revision, digest, times)),
                }
            }
            Outcome::ApplyFailed {
                revision,
                digest,
                kind,
            } => Noted {
                trouble: Some(Trouble {
                    revision,
                    digest,
                    kind,
                }),
                attempts,
                next_try: now + backoff,
                altered: altered_before,
            },
            Outcome::DeleteFailed => Noted {
                trouble: before.and_then(|n| n.trouble),
                attempts,
                next_try: now + backoff,
                altered: altered_before,
            },
        };
        object.insert(cluster.to_string(), noted);
    }

    /// Forgets the objects that are gone.
    pub fn retain(&mut self, live: &BTreeSet<String>) {
        self.by_object.retain(|uid, _| live.contains(uid));
        self.outcomes.retain(|uid, _| live.contains(uid));
        self.in_flight.retain(|(uid, _)| live.contains(uid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_the_fence_stopped_teaches_nothing_about_the_member() {
        // How a fence error and a refusal become `Failed`: the error's own
        // test (`run::error`).
        let meant = || Some(("r1".to_string(), 7));
        assert!(outcome_of(&Err(Failed::Fenced), meant()).is_none());
        let refused = Failed::Member(Kind::Refused {
            code: 403,
            message: "no".into(),
        });
        assert!(matches!(
            outcome_of(&Err(refused), meant()),
            Some(Outcome::ApplyFailed {
                kind: Kind::Refused { code: 403, .. },
                ..
            })
        ));
        assert!(matches!(
            outcome_of(&Ok(Written::Altered), meant()),
            Some(Outcome::Altered { .. })
        ));
    }

    fn refused() -> Outcome {
        Outcome::ApplyFailed {
            revision: "r1".into(),
            digest: 7,
            kind: Kind::Refused {
                code: 503,
                message: "busy".into(),
            },
        }
    }

    /// The member stored another spec than revision `rev` gives it.
    fn altered(rev: &str) -> Outcome {
        Outcome::Altered {
            revision: rev.into(),
            digest: 7,
        }
    }

    #[test]
    fn failures_back_off_and_success_forgets() {
        let mut log = WriteLog::default();
        let t0 = Instant::now();
        log.record("u", "m1", refused(), t0);
        assert!(!log.due("u", "m1", t0));
        assert!(log.due("u", "m1", t0 + Duration::from_secs(1)));
        assert!(log.due("u", "m2", t0), "other clusters are not held");
        log.record("u", "m1", refused(), t0);
        assert!(!log.due("u", "m1", t0 + Duration::from_secs(1)), "2 s now");
        for _ in 0..10 {
            log.record("u", "m1", refused(), t0);
        }
        assert!(log.due("u", "m1", t0 + MAX_BACKOFF), "at most a minute");
        assert_eq!(log.troubles("u")["m1"].reason(), "WriteFailed");
        log.record("u", "m1", Outcome::Ok, t0);
        assert!(log.troubles("u").is_empty());
        assert!(log.due("u", "m1", t0));
        // One write at a time per object and cluster.
        log.start("u", "m1");
        assert!(!log.due("u", "m1", t0));
        log.new_term();
        assert!(log.due("u", "m1", t0), "a cut write is forgotten");
    }

    #[test]
    fn an_altered_spec_counts_per_revision_and_digest() {
        let mut log = WriteLog::default();
        let t0 = Instant::now();
        log.record("u", "m1", altered("r1"), t0);
        assert!(!log.troubles("u")["m1"].permanent());
        log.record("u", "m1", Outcome::DeleteFailed, t0);
        log.record("u", "m1", altered("r1"), t0);
        assert!(
            log.troubles("u")["m1"].permanent(),
            "a failure between two alterations does not start the count over"
        );
        log.record("u", "m1", altered("r2"), t0);
        assert!(
            !log.troubles("u")["m1"].permanent(),
            "a new revision starts over"
        );
        log.retain(&BTreeSet::new());
        assert!(log.troubles("u").is_empty());
    }

    /// A write that timed out or met a conflict between two alterations
    /// (the member's leader writes the object's status right after it is
    /// created) shows as the failure it was, and the alteration after it
    /// still makes two.
    #[test]
    fn a_failed_write_between_two_alterations_does_not_start_the_count_over() {
        let mut log = WriteLog::default();
        let t0 = Instant::now();
        log.record("u", "m1", altered("r1"), t0);
        log.record("u", "m1", refused(), t0);
        assert_eq!(log.troubles("u")["m1"].reason(), "WriteFailed");
        log.record("u", "m1", altered("r1"), t0);
        assert!(
            log.troubles("u")["m1"].permanent(),
            "altered twice, with a failed write between"
        );
        log.record("u", "m1", Outcome::Ok, t0);
        log.record("u", "m1", altered("r1"), t0);
        assert!(
            !log.troubles("u")["m1"].permanent(),
            "a write the member kept starts over"
        );
    }

    /// The flaky SpecRejected test's third write: a plan read "altered
    /// once", a retry ended "altered twice" while the round wrote its
    /// status, and the stale plan then wrote a third time.
    #[test]
    fn a_plan_read_before_an_outcome_starts_no_write() {
        let mut log = WriteLog::default();
        let t0 = Instant::now();
        log.record("u", "m1", altered("r1"), t0);
        let reading = log.read("u");
        assert!(log.current("u", &reading));
        log.start("u", "m1");
        log.record("u", "m1", altered("r1"), t0);
        assert!(log.due("u", "m1", t0), "the retry ended");
        assert!(!log.current("u", &reading), "but the plan did not see how");
        assert!(log.current("u", &log.read("u")), "a new plan may write");
        assert!(
            log.current("v", &log.read("v")),
            "other objects are not held"
        );
    }
}
