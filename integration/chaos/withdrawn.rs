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
    /// When the DNS Lease changed hands: a new writer starts its own windows.
    pub handovers: &'a [Timestamp],
    /// When the writer could not write or read its Lease: the registry or
    /// the home apiserver down.
    pub blind: &'a [(Timestamp, Timestamp)],
    pub samples: &'a [Sample],
    pub initial: &'a [(String, ZoneRecord)],
    pub changes: &'a [DnsChange],
}

/// Each down longer than `window` + [`SLACK`] in which the writer kept its
/// term and could see is judged at every sample from its deadline to its
/// end: no fleet answer that has not failed open may list the member.
/// Also returns, per judged down, how long after it went down the member
/// was first listed nowhere (None: never while it was down).
pub fn dns_withdrawn(e: &Evidence, window: Duration) -> (Judged, Vec<Option<f64>>) {
    let late = jiff::SignedDuration::try_from(window + SLACK).expect("a short window");
    let mut took = Vec::new();
    let mut checked = 0;
    let mut out = Vec::new();
    for d in e.downs {
        let deadline = d.from + late;
        if deadline >= d.to
            || e.handovers.iter().any(|h| *h >= d.from && *h <= deadline)
            || e.blind.iter().any(|(a, b)| *a <= deadline && *b >= d.from)
        {
            continue;
        }
        let due: Vec<&Sample> = e
            .samples
            .iter()
            .filter(|s| s.at >= deadline && s.at < d.to)
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
                            "{}'s fleet name still listed {} at revision {} ({}), {:.1} s after it went down at {} (window {} s + {} s)",
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

/// When the DNS Lease named a different holder than the write before it.
pub fn handovers(leases: &[crate::check::LeaseWrite]) -> Vec<Timestamp> {
    leases
        .windows(2)
        .filter(|w| w[0].holder != w[1].holder)
        .map(|w| w[1].at)
        .collect()
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
        handovers: &[Timestamp],
    ) -> Judged {
        let downs = [Down {
            member: "m2".into(),
            from: t(2),
            to: t(20),
        }];
        dns_withdrawn(
            &Evidence {
                downs: &downs,
                handovers,
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

    #[test]
    fn a_failed_open_answer_a_new_writer_or_a_short_stretch_is_not_judged_against() {
        // Failed open: every candidate listed, and the records say so.
        let open = [answer("m1", true), answer("m2", true)];
        let j = judge(&open, &[], &[]);
        assert_eq!((j.checked, j.violations.len()), (1, 0));
        // A handover inside the stretch: the new writer's window starts then.
        let initial = [answer("m2", false)];
        let j = judge(&initial, &[], &[t(5)]);
        assert_eq!((j.checked, j.violations.len()), (0, 0));
        // Down shorter than the window and slack: nothing to judge.
        let short = [Down {
            member: "m2".into(),
            from: t(2),
            to: t(11),
        }];
        let j = dns_withdrawn(
            &Evidence {
                downs: &short,
                handovers: &[],
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
}
