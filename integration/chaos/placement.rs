//! `failover-count` and `failover-no-delete-unreachable`, pure: from the
//! members' audit logs, how many clusters ran a `numberOfClusters` object
//! at each create and delete, and when each delete left its writer
//! against when its member was unreachable.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

use crate::check::{Judged, Violation};
use crate::withdrawn::Down;

pub const FAILOVER_COUNT: &str = "failover-count";
pub const NO_DELETE_UNREACHABLE: &str = "failover-no-delete-unreachable";

/// A create or delete of the counted object's Microservice in a member.
#[derive(Debug, Clone)]
pub struct Placed {
    pub cluster: String,
    /// When the member received it.
    pub received: Timestamp,
    /// When it left its writer (earlier when it came late).
    pub sent: Timestamp,
    pub create: bool,
}

/// The spec asked for `n` clusters from `at` on.
#[derive(Debug, Clone, Copy)]
pub struct Count {
    pub at: Timestamp,
    pub n: usize,
}

/// `failover-count`: after every create and delete, at most N + 1
/// answering members hold the object, N being the largest count the spec
/// asked for within `grace` before (a change of N takes the controller a
/// moment to read). A member the nemesis made unreachable, until `grace`
/// after it healed, does not count: the product's bound is on clusters
/// that answer, since one that does not is replaced without waiting
/// (docs/decisions.md, "Workload failover").
pub fn failover_count(
    events: &[Placed],
    counts: &[Count],
    unreachable: &[Down],
    grace: Duration,
) -> Judged {
    let grace = SignedDuration::try_from(grace).expect("a short grace");
    let dark = |cluster: &str, t: Timestamp| {
        unreachable.iter().any(|u| {
            u.member == cluster && u.from <= t && u.to.checked_add(grace).is_ok_and(|to| t <= to)
        })
    };
    let mut events: Vec<&Placed> = events.iter().collect();
    events.sort_by_key(|e| e.received);
    let mut holders = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for e in &events {
        if e.create {
            holders.insert(e.cluster.as_str());
        } else {
            holders.remove(e.cluster.as_str());
        }
        let from = e.received.checked_sub(grace).unwrap_or(e.received);
        let asked = counts
            .iter()
            .filter(|c| c.at <= e.received)
            .filter(|c| {
                c.at >= from
                    || counts
                        .iter()
                        .filter(|d| d.at <= from)
                        .max_by_key(|d| d.at)
                        .is_some_and(|d| d.at == c.at)
            })
            .map(|c| c.n)
            .max()
            .unwrap_or(0);
        let answering: Vec<&&str> = holders.iter().filter(|h| !dark(h, e.received)).collect();
        if answering.len() > asked + 1 {
            out.push(Violation {
                invariant: FAILOVER_COUNT,
                at: Some(e.received),
                detail: format!(
                    "{} answering members held it after the {} in {} at {}: {answering:?} (of {holders:?}), with numberOfClusters {asked}",
                    answering.len(),
                    if e.create { "create" } else { "delete" },
                    e.cluster,
                    e.received
                ),
            });
        }
    }
    Judged::of(events.len(), out)
}

/// What one status write of the counted object said: which of its
/// placement's clusters the fleet controller held unreachable.
#[derive(Debug, Clone)]
pub struct Marks {
    pub at: Timestamp,
    pub unreachable: Vec<String>,
}

/// `failover-no-delete-unreachable`: no delete left its writer while its
/// member was unreachable (a nemesis stretch) and the fleet controller
/// knew it (its last status write before the delete, made in that
/// stretch, marks the member unreachable): it must leave the copy until
/// the member answers. Only a late delivery can show such a delete; every
/// delete is judged.
pub fn no_delete_unreachable(events: &[Placed], unreachable: &[Down], marks: &[Marks]) -> Judged {
    let mut out = Vec::new();
    let deletes: Vec<&Placed> = events.iter().filter(|e| !e.create).collect();
    for d in &deletes {
        let known = marks
            .iter()
            .filter(|m| m.at <= d.sent)
            .max_by_key(|m| m.at)
            .filter(|m| m.unreachable.contains(&d.cluster));
        let gone = unreachable.iter().find(|u| {
            u.member == d.cluster
                && u.from <= d.sent
                && d.sent <= u.to
                && known.is_some_and(|m| m.at >= u.from)
        });
        if let Some(u) = gone {
            out.push(Violation {
                invariant: NO_DELETE_UNREACHABLE,
                at: Some(d.received),
                detail: format!(
                    "a delete in {} left its writer at {} (received {}), while {} was unreachable from {} to {}, as its status said at {}",
                    d.cluster,
                    d.sent,
                    d.received,
                    u.member,
                    u.from,
                    u.to,
                    known.map_or("never".into(), |m| m.at.to_string())
                ),
            });
        }
    }
    Judged::of(deletes.len(), out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn ev(cluster: &str, s: i64, create: bool) -> Placed {
        Placed {
            cluster: cluster.into(),
            received: t(s),
            sent: t(s),
            create,
        }
    }

    const GRACE: Duration = Duration::from_secs(5);

    #[test]
    fn a_failover_runs_at_most_one_more() {
        let counts = [Count { at: t(0), n: 1 }];
        // On member-1; it fails over to member-2, and member-1's copy goes
        // once it answers.
        let events = [
            ev("member-1", 1, true),
            ev("member-2", 30, true),
            ev("member-1", 50, false),
        ];
        let j = failover_count(&events, &counts, &[], GRACE);
        assert_eq!(j.checked, 3);
        assert!(j.violations.is_empty(), "{:?}", j.violations);
        // A second move before the first copy went: three run.
        let more = [
            ev("member-1", 1, true),
            ev("member-2", 30, true),
            ev("member-3", 40, true),
        ];
        let j = failover_count(&more, &counts, &[], GRACE);
        assert_eq!(j.violations.len(), 1, "{:?}", j.violations);
        assert!(j.violations[0].detail.contains("member-3"));
        // Unless one of the three does not answer: it is replaced at once.
        let down = [Down {
            member: "member-2".into(),
            from: t(35),
            to: t(60),
        }];
        assert!(
            failover_count(&more, &counts, &down, GRACE)
                .violations
                .is_empty()
        );
    }

    #[test]
    fn a_lowered_count_is_judged_once_read() {
        let counts = [Count { at: t(0), n: 2 }, Count { at: t(20), n: 1 }];
        let events = [
            ev("member-1", 1, true),
            ev("member-2", 1, true),
            // Created just after the count fell: the old count still holds.
            ev("member-3", 22, true),
        ];
        assert!(
            failover_count(&events, &counts, &[], GRACE)
                .violations
                .is_empty()
        );
        let late = [
            ev("member-1", 1, true),
            ev("member-2", 1, true),
            ev("member-3", 40, true),
        ];
        assert_eq!(
            failover_count(&late, &counts, &[], GRACE).violations.len(),
            1
        );
    }

    #[test]
    fn a_delete_sent_to_a_member_known_unreachable_is_caught() {
        let down = [Down {
            member: "member-1".into(),
            from: t(10),
            to: t(40),
        }];
        let marks = [
            Marks {
                at: t(5),
                unreachable: vec![],
            },
            Marks {
                at: t(17),
                unreachable: vec!["member-1".into()],
            },
        ];
        // Sent at 20, after the status said member-1 was unreachable,
        // delivered late at 36.
        let mut late = ev("member-1", 36, false);
        late.sent = t(20);
        let j = no_delete_unreachable(&[ev("member-1", 5, true), late], &down, &marks);
        assert_eq!(j.checked, 1);
        assert_eq!(j.violations.len(), 1, "{:?}", j.violations);
        // Sent before the controller knew, after the stretch, or to
        // another member: no violation.
        let mut early = ev("member-1", 18, false);
        early.sent = t(12);
        let fine = [early, ev("member-1", 45, false), ev("member-2", 30, false)];
        let j = no_delete_unreachable(&fine, &down, &marks);
        assert_eq!(j.checked, 3);
        assert!(j.violations.is_empty(), "{:?}", j.violations);
        // A mark left over from an earlier stretch is not knowledge of this one.
        let stale = [Marks {
            at: t(8),
            unreachable: vec!["member-1".into()],
        }];
        let mut mid = ev("member-1", 36, false);
        mid.sent = t(20);
        assert!(
            no_delete_unreachable(&[mid], &down, &stale)
                .violations
                .is_empty()
        );
    }
}
