//! `dns-withdrawn`: a member that has been down (stopped or black-holed)
//! longer than the withdraw window plus 5 s is in no fleet answer, unless
//! that answer failed open (no candidate healthy, so every one is listed
//! and the records say so). Judged from etcd's history of the zone at the
//! revisions sampled while the member was down. Pure.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;

use crate::check::{DnsChange, Judged, Violation, ZoneRecord};

pub const DNS_WITHDRAWN: &str = "dns-withdrawn";

/// What the brief allows past the withdraw window.
pub const SLACK: Duration = Duration::from_secs(5);

/// A member the nemesis took down, from when to when.
#[derive(Debug, Clone)]
pub struct Down {
    pub member: String,
    pub from: Timestamp,
    pub to: Timestamp,
}

/// etcd's revision as read at a moment of the run.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub at: Timestamp,
    pub revision: i64,
}

/// What a down member is judged against.
pub struct Evidence<'a> {
    pub downs: &'a [Down],
    /// When a DNS writer's term may have begun: its Lease changing hands,
    /// or its term claimed in etcd (the same replica may win a new term).
    /// A new term starts its windows afresh.
    pub terms: &'a [Timestamp],
    /// When the writer could not write or read its Lease: the registry or
    /// the home apiserver down.
    pub blind: &'a [(Timestamp, Timestamp)],
    pub samples: &'a [Sample],
    pub initial: &'a [(String, ZoneRecord)],
    pub changes: &'a [DnsChange],
}

/// How long before a new term's first sign its writer may already have
/// stopped writing (paused, or its Lease running out).
const TERM_GRACE: Duration = Duration::from_secs(3);

/// Each down is judged at every sample from its start to its end except
/// where its writer could not be expected to have withdrawn it yet: the
/// first `window` + [`SLACK`] after it went down, after a new term began
/// (from [`TERM_GRACE`] before), or after the writer was blind. A judged
/// sample may list the member in no fleet answer that has not failed open.
/// Also returns, per down with a judged sample, how long after it went
/// down the member was first listed nowhere (None: never while down).
pub fn dns_withdrawn(e: &Evidence, window: Duration) -> (Judged, Vec<Option<f64>>) {
    let span = |d: Duration| jiff::SignedDuration::try_from(d).expect("a short span");
    let late = span(window + SLACK);
    let mut took = Vec::new();
    let mut checked = 0;
    let mut out = Vec::new();
    for d in e.downs {
        let mut excused: Vec<(Timestamp, Timestamp)> = vec![(d.from, d.from + late)];
        excused.extend(e.terms.iter().map(|t| (*t - span(TERM_GRACE), *t + late)));
        excused.extend(e.blind.iter().map(|(a, b)| (*a, *b + late)));
        let due: Vec<&Sample> = e
            .samples
            .iter()
            .filter(|s| s.at >= d.from && s.at < d.to)
            .filter(|s| !excused.iter().any(|(a, b)| *a <= s.at && s.at < *b))
            .collect();
        if due.is_empty() {
            continue;
        }
        checked += 1;
        // The figure: the first sample since it went down that lists it nowhere.
        let gone = e
            .samples
            .iter()
            .filter(|s| s.at >= d.from && s.at < d.to)
            .find(|s| {
                !zone_at(e.initial, e.changes, s.revision)
                    .iter()
                    .any(|(key, r)| lists(key, r, &d.member))
            });
        took.push(gone.map(|s| s.at.duration_since(d.from).as_secs_f64()));
        let mut seen = std::collections::BTreeSet::new();
        for s in due {
            for (key, r) in zone_at(e.initial, e.changes, s.revision) {
                if lists(&key, &r, &d.member) && seen.insert(key.clone()) {
                    out.push(Violation {
                        invariant: DNS_WITHDRAWN,
                        at: Some(s.at),
                        detail: format!(
                            "{}'s fleet name still listed {} at revision {} ({}), {:.1} s after it went down at {} (window {} s + {} s, no new term or blind writer in between)",
                            r.object,
                            d.member,
                            s.revision,
                            s.at,
                            s.at.duration_since(d.from).as_secs_f64(),
                            d.from,
                            window.as_secs(),
                            SLACK.as_secs(),
                        ),
                    });
                }
            }
        }
    }
    let judged = Judged {
        checked,
        violations: out,
        unverifiable: Vec::new(),
    };
    (judged, took)
}

/// A fleet answer, not failed open, that lists `member`.
fn lists(key: &str, r: &ZoneRecord, member: &str) -> bool {
    r.fleet && !r.fail_open && key.rsplit('/').next() == Some(member)
}

/// The zone's records at `revision`.
fn zone_at(
    initial: &[(String, ZoneRecord)],
    changes: &[DnsChange],
    revision: i64,
) -> BTreeMap<String, ZoneRecord> {
    let mut zone: BTreeMap<String, ZoneRecord> = initial.iter().cloned().collect();
    for c in changes.iter().take_while(|c| c.revision <= revision) {
        match &c.put {
            Some(r) => zone.insert(c.key.clone(), r.clone()),
            None => zone.remove(&c.key),
        };
    }
    zone
}

/// When a DNS writer's term may have begun: the Lease naming a different
/// holder than the write before it, and each claim of the term key in etcd,
/// timed by the first sample that holds it (half a second later, for the
/// read's own time).
pub fn term_starts(
    leases: &[crate::check::LeaseWrite],
    claims: &[crate::check::TermPut],
    samples: &[Sample],
) -> Vec<Timestamp> {
    let handovers = leases
        .windows(2)
        .filter(|w| w[0].holder != w[1].holder)
        .map(|w| w[1].at);
    let claimed = claims.iter().filter_map(|c| {
        samples
            .iter()
            .find(|s| s.revision >= c.revision)
            .map(|s| s.at + jiff::SignedDuration::from_millis(500))
    });
    handovers.chain(claimed).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn answer(cluster: &str, fail_open: bool) -> (String, ZoneRecord) {
        (
            format!("z/ns/web/{cluster}"),
            ZoneRecord {
                object: "ns/web".into(),
                fleet: true,
                fail_open,
            },
        )
    }

    fn withdrawal(cluster: &str, revision: i64) -> DnsChange {
        DnsChange {
            key: format!("z/ns/web/{cluster}"),
            revision,
            put: None,
        }
    }

    fn samples() -> Vec<Sample> {
        (0..30)
            .map(|s| Sample {
                at: t(s),
                revision: 100 + s,
            })
            .collect()
    }

    fn judge(
        initial: &[(String, ZoneRecord)],
        changes: &[DnsChange],
        terms: &[Timestamp],
    ) -> Judged {
        let downs = [Down {
            member: "m2".into(),
            from: t(2),
            to: t(20),
        }];
        dns_withdrawn(
            &Evidence {
                downs: &downs,
                terms,
                blind: &[],
                samples: &samples(),
                initial,
                changes,
            },
            Duration::from_secs(5),
        )
        .0
    }

    #[test]
    fn a_member_withdrawn_within_the_window_and_slack_passes() {
        let initial = [answer("m1", false), answer("m2", false)];
        // Withdrawn 9 s after it went down (revision 111 is read at 11 s).
        let j = judge(&initial, &[withdrawal("m2", 111)], &[]);
        assert_eq!(j.checked, 1);
        assert!(j.violations.is_empty(), "{:?}", j.violations);
    }

    #[test]
    fn a_member_left_in_the_answer_past_the_slack_is_caught() {
        let initial = [answer("m1", false), answer("m2", false)];
        let j = judge(&initial, &[withdrawal("m2", 114)], &[]);
        assert_eq!(j.checked, 1);
        assert_eq!(j.violations.len(), 1, "{:?}", j.violations);
        assert!(
            j.violations[0]
                .detail
                .contains("still listed m2 at revision 112")
        );
    }

    /// A new term (or a blind writer) starts the window again from its
    /// grace before it, and the rest of the stretch is still judged.
    #[test]
    fn a_new_term_or_a_blind_writer_starts_the_window_again() {
        let initial = [answer("m1", false), answer("m2", false)];
        // A term at 5 s: judged from 15 s; withdrawn at 14 s passes.
        let j = judge(&initial, &[withdrawal("m2", 114)], &[t(5)]);
        assert_eq!(
            (j.checked, j.violations.len()),
            (1, 0),
            "{:?}",
            j.violations
        );
        // Never withdrawn: caught at the first judged sample after it.
        let j = judge(&initial, &[], &[t(5)]);
        assert_eq!(j.violations.len(), 1, "{:?}", j.violations);
        assert!(j.violations[0].detail.contains("revision 115"));
        // A term after the deadline excuses from 3 s before it on: the
        // samples at 12 s to 15 s are still judged.
        let j = judge(&initial, &[withdrawal("m2", 114)], &[t(18)]);
        assert!(
            j.violations[0].detail.contains("revision 112"),
            "{:?}",
            j.violations
        );
        // The registry down from 3 s to 6 s: judged from 16 s.
        let downs = [Down {
            member: "m2".into(),
            from: t(2),
            to: t(20),
        }];
        let changes = [withdrawal("m2", 115)];
        let (j, took) = dns_withdrawn(
            &Evidence {
                downs: &downs,
                terms: &[],
                blind: &[(t(3), t(6))],
                samples: &samples(),
                initial: &initial,
                changes: &changes,
            },
            Duration::from_secs(5),
        );
        assert_eq!(
            (j.checked, j.violations.len()),
            (1, 0),
            "{:?}",
            j.violations
        );
        assert_eq!(took, [Some(13.0)]);
    }

    #[test]
    fn a_failed_open_answer_or_a_short_stretch_is_not_judged_against() {
        // Failed open: every candidate listed, and the records say so.
        let open = [answer("m1", true), answer("m2", true)];
        let j = judge(&open, &[], &[]);
        assert_eq!((j.checked, j.violations.len()), (1, 0));
        // Down shorter than the window and slack: nothing to judge.
        let short = [Down {
            member: "m2".into(),
            from: t(2),
            to: t(11),
        }];
        let initial = [answer("m2", false)];
        let j = dns_withdrawn(
            &Evidence {
                downs: &short,
                terms: &[],
                blind: &[],
                samples: &samples(),
                initial: &initial,
                changes: &[],
            },
            Duration::from_secs(5),
        )
        .0;
        assert_eq!(j.checked, 0);
    }

    #[test]
    fn terms_start_at_a_handover_or_a_claim_of_the_term_key() {
        use crate::check::{LeaseWrite, TermPut};
        let lease = |s: i64, holder: &str| LeaseWrite {
            at: t(s),
            writer: holder.into(),
            holder: holder.into(),
        };
        let leases = [lease(0, "r1"), lease(2, "r1"), lease(4, "r2")];
        let claims = [TermPut {
            revision: 107,
            epoch: 3,
        }];
        let starts = term_starts(&leases, &claims, &samples());
        let half = jiff::SignedDuration::from_millis(500);
        assert_eq!(starts, [t(4), t(7) + half]);
    }
}
