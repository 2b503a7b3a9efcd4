//! Leader election decisions with client-go's semantics, as pure functions of
//! what was observed and a local monotonic clock.
//!
//! Safety rests on two rules that never compare clocks of different hosts:
//! - a candidate may take a Lease held by someone else only after it has
//!   seen the record unchanged for the record's full lease duration, timed
//!   on its own clock from the moment it first saw that version;
//! - a leader stops acting as one once `renew_deadline` has passed since its
//!   last successful renewal, timed on its own clock from before it sent it.
//!
//! Because `renew_deadline < lease_duration`, a deposed leader has stopped
//! before anyone else may take over, as long as clocks run at similar rates.

use std::time::Duration;

/// Elapsed time on this process's monotonic clock, from any fixed origin.
pub type Instant = Duration;

/// Lease timings, validated against client-go's constraints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// client-go's jitter factor: RenewDeadline must exceed 1.2 × RetryPeriod.
const JITTER_FACTOR: f64 = 1.2;

/// The longest lease we accept: far beyond any sensible failover time, and
/// far inside `leaseDurationSeconds`' i32.
pub const MAX_LEASE_DURATION: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimingsError {
    #[error("lease duration ({0:?}) must be a whole number of seconds, at least 1s")]
    LeaseDurationNotWholeSeconds(Duration),
    #[error("lease duration ({0:?}) must be at most {MAX_LEASE_DURATION:?}")]
    LeaseDurationTooLong(Duration),
    #[error("lease duration ({lease:?}) must be greater than renew deadline ({renew:?})")]
    LeaseNotAboveRenew { lease: Duration, renew: Duration },
    #[error("renew deadline ({renew:?}) must be greater than 1.2 × retry period ({retry:?})")]
    RenewNotAboveRetry { renew: Duration, retry: Duration },
    #[error("retry period must be positive")]
    ZeroRetry,
}

impl Timings {
    pub fn validate(&self) -> Result<Self, TimingsError> {
        // The Lease stores whole seconds; a fraction would silently shorten it for others.
        if self.lease_duration.subsec_nanos() != 0 || self.lease_duration.is_zero() {
            return Err(TimingsError::LeaseDurationNotWholeSeconds(
                self.lease_duration,
            ));
        }
        if self.lease_duration > MAX_LEASE_DURATION {
            return Err(TimingsError::LeaseDurationTooLong(self.lease_duration));
        }
        if self.retry_period.is_zero() {
            return Err(TimingsError::ZeroRetry);
        }
        if self.lease_duration <= self.renew_deadline {
            return Err(TimingsError::LeaseNotAboveRenew {
                lease: self.lease_duration,
                renew: self.renew_deadline,
            });
        }
        if self.renew_deadline.as_secs_f64() <= JITTER_FACTOR * self.retry_period.as_secs_f64() {
            return Err(TimingsError::RenewNotAboveRetry {
                renew: self.renew_deadline,
                retry: self.retry_period,
            });
        }
        Ok(*self)
    }

    /// `leaseDurationSeconds`; validation keeps it in range.
    pub fn lease_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }
}

/// The parts of a Lease that election reads and writes. Wall-clock times are
/// written for humans and audits, and never used to judge expiry.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseRecord {
    /// Empty when released.
    pub holder: String,
    pub lease_duration_seconds: i32,
    /// `leaseTransitions`: the leadership epoch.
    pub transitions: i32,
    /// The replica that owns the cluster by assignment and asks the holder
    /// to hand it over (an annotation on the Lease).
    pub handoff_to: Option<String>,
}

/// What this candidate last saw, and when (on its own clock) it first saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub record: LeaseRecord,
    /// The Lease's resourceVersion: any write at all changes it.
    pub version: String,
    /// The holder's renew time as written, compared as an opaque token
    /// (never read as a clock): only the holder changes it.
    pub mark: Option<String>,
    pub since: Instant,
}

/// Folds a fresh read into the observation: the clock restarts only when the
/// holder wrote the Lease since: a new resourceVersion that also changes the
/// holder, its epoch or its renew `mark`. Another candidate's handoff
/// request leaves those as they were, so it proves nothing about the holder:
/// two candidates asking in turn must not keep a dead holder alive (chaos
/// soak, seed 3707273445: member-3 unled for 10 s). Without a mark, any
/// write restarts it.
pub fn observe(
    previous: Option<&Observed>,
    record: LeaseRecord,
    version: &str,
    mark: Option<&str>,
    now: Instant,
) -> Observed {
    let same_holder = |p: &Observed| {
        mark.is_some()
            && p.mark.as_deref() == mark
            && p.record.holder == record.holder
            && p.record.transitions == record.transitions
    };
    match previous {
        Some(p) if p.version == version || same_holder(p) => Observed {
            record,
            version: version.to_string(),
            ..p.clone()
        },
        _ => Observed {
            record,
            version: version.to_string(),
            mark: mark.map(str::to_string),
            since: now,
        },
    }
}

/// What the shard assignment says about this cluster, as the candidate sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// No sharding: every candidate contests.
    Unsharded,
    /// The replica the assignment names, if any; a Lease free for longer
    /// than `grace` may be taken by anyone, so no cluster stays unled.
    Assigned {
        owner: Option<String>,
        grace: Duration,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Leave the Lease as it is.
    Follow,
    /// Write this record, conditioned on the resourceVersion that was read.
    /// `acquired` is true when leadership changes hands (a new epoch).
    Write { record: LeaseRecord, acquired: bool },
    /// The owner by assignment asks the live holder to hand over.
    RequestHandoff { record: LeaseRecord },
    /// The holder's owner asked for the cluster: stop writing, wait for
    /// admitted writes, then write this released record.
    Yield { record: LeaseRecord },
}

/// What to do with the Lease as observed, for candidate `me` at `now`.
/// `floor` is the highest epoch this candidate has ever seen for the Lease,
/// so that an epoch never repeats even if the Lease is deleted.
pub fn decide(
    me: &str,
    timings: &Timings,
    observed: &Observed,
    ownership: &Ownership,
    floor: Option<i32>,
    now: Instant,
) -> Decision {
    let current = &observed.record;
    // Unsharded candidates never ask for a handoff: nobody owns anything.
    let (owner, sharded): (Option<&str>, bool) = match ownership {
        Ownership::Unsharded => (Some(me), false),
        Ownership::Assigned { owner, .. } => (owner.as_deref(), true),
    };
    let mine = owner == Some(me);
    if current.holder == me {
        // A holder keeps its cluster until the owner is actually there to take it.
        return match owner {
            Some(o) if o != me && current.handoff_to.as_deref() == Some(o) => Decision::Yield {
                record: released(current),
            },
            _ => Decision::Write {
                record: LeaseRecord {
                    holder: me.to_string(),
                    lease_duration_seconds: timings.lease_seconds(),
                    transitions: current.transitions,
                    handoff_to: current.handoff_to.clone().filter(|h| h != me),
                },
                acquired: false,
            },
        };
    }
    let free_for = if current.holder.is_empty() {
        now.saturating_sub(observed.since)
    } else {
        let duration = Duration::from_secs(current.lease_duration_seconds.max(0) as u64);
        let expires_at = observed.since + duration;
        if expires_at > now {
            if sharded && mine && current.handoff_to.as_deref() != Some(me) {
                return Decision::RequestHandoff {
                    record: LeaseRecord {
                        handoff_to: Some(me.to_string()),
                        ..current.clone()
                    },
                };
            }
            return Decision::Follow;
        }
        now - expires_at
    };
    if !may_take(me, ownership, free_for) {
        return Decision::Follow;
    }
    // client-go counts every change of holder, a release included.
    let transitions = current.transitions.max(floor.unwrap_or(i32::MIN)) + 1;
    Decision::Write {
        record: LeaseRecord {
            holder: me.to_string(),
            lease_duration_seconds: timings.lease_seconds(),
            transitions,
            handoff_to: None,
        },
        acquired: true,
    }
}

/// The record for a Lease that does not exist: epoch 0, or past any epoch
/// this candidate saw before the Lease was deleted.
pub fn initial_record(me: &str, timings: &Timings, floor: Option<i32>) -> LeaseRecord {
    LeaseRecord {
        holder: me.to_string(),
        lease_duration_seconds: timings.lease_seconds(),
        transitions: floor.map_or(0, |f| f.saturating_add(1)),
        handoff_to: None,
    }
}

/// When a Lease held by someone else expires, as this candidate observes
/// it, if this candidate would take it then: its owner by assignment, or
/// anyone when unsharded. A round at that instant, rather than at the next
/// retry, takes up to a retry period off a failover.
pub fn takeover_at(me: &str, observed: &Observed, ownership: &Ownership) -> Option<Instant> {
    let r = &observed.record;
    let owner = match ownership {
        Ownership::Unsharded => true,
        Ownership::Assigned { owner, .. } => owner.as_deref() == Some(me),
    };
    (owner && !r.holder.is_empty() && r.holder != me)
        .then(|| observed.since + Duration::from_secs(r.lease_duration_seconds.max(0) as u64))
}

/// Whether a candidate may take a Lease that has been free (expired,
/// released or absent) for `free_for`: its owner at once, anyone else after
/// the grace period, so that no cluster stays unled while its owner is away.
pub fn may_take(me: &str, ownership: &Ownership, free_for: Duration) -> bool {
    match ownership {
        Ownership::Unsharded => true,
        Ownership::Assigned { owner, grace } => owner.as_deref() == Some(me) || free_for > *grace,
    }
}

/// The record that hands the Lease back: an empty holder lets the next
/// candidate acquire at once, without waiting out the lease duration.
pub fn released(current: &LeaseRecord) -> LeaseRecord {
    LeaseRecord {
        holder: String::new(),
        lease_duration_seconds: 1,
        transitions: current.transitions,
        handoff_to: None,
    }
}

/// Whether a leader whose last successful renewal was sent at `renewed_at`
/// may still act as leader at `now`.
pub fn still_leading(timings: &Timings, renewed_at: Instant, now: Instant) -> bool {
    now < renewed_at + timings.renew_deadline
}

/// How long one Lease round (a read and a conditional write) may take, as
/// client-go bounds each attempt: the renew deadline, and while leading no
/// longer than the time left before stepping down (but at least a retry
/// period, so that a late renewal still gets a chance).
pub fn round_budget(timings: &Timings, renewed_at: Option<Instant>, now: Instant) -> Duration {
    match renewed_at {
        None => timings.renew_deadline,
        Some(r) => (r + timings.renew_deadline)
            .saturating_sub(now)
            .max(timings.retry_period)
            .min(timings.renew_deadline),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn held(holder: &str, transitions: i32) -> LeaseRecord {
        LeaseRecord {
            holder: holder.into(),
            lease_duration_seconds: 15,
            transitions,
            handoff_to: None,
        }
    }

    const U: Ownership = Ownership::Unsharded;

    fn assigned(owner: Option<&str>) -> Ownership {
        Ownership::Assigned {
            owner: owner.map(str::to_string),
            grace: secs(5),
        }
    }

    fn seen(record: LeaseRecord, version: &str, at: u64) -> Observed {
        observe(None, record, version, None, secs(at))
    }

    #[test]
    fn only_the_owner_of_a_lease_held_elsewhere_is_woken_at_its_expiry() {
        let other = seen(held("other", 3), "7", 100);
        // Seen at 100 s, 15 s long: the owner tries at 115 s.
        assert_eq!(
            takeover_at("me", &other, &assigned(Some("me"))),
            Some(secs(115))
        );
        assert_eq!(takeover_at("me", &other, &U), Some(secs(115)));
        // Not the owner: it may take the Lease only after the grace, at its
        // ordinary retries.
        assert_eq!(takeover_at("me", &other, &assigned(Some("x"))), None);
        assert_eq!(takeover_at("me", &other, &assigned(None)), None);
        // Free, or its own: nothing to wait for.
        assert_eq!(
            takeover_at("me", &seen(held("", 3), "8", 100), &assigned(Some("me"))),
            None
        );
        assert_eq!(
            takeover_at("me", &seen(held("me", 3), "9", 100), &assigned(Some("me"))),
            None
        );
    }

    #[test]
    fn default_timings_are_client_go_defaults_and_valid() {
        let t = Timings::default();
        assert_eq!(
            (t.lease_duration, t.renew_deadline, t.retry_period),
            (secs(15), secs(10), secs(2))
        );
        assert!(t.validate().is_ok());
    }

    #[test]
    fn invalid_timings_are_refused_with_a_reason() {
        let bad = [
            Timings {
                lease_duration: secs(10),
                renew_deadline: secs(10),
                retry_period: secs(2),
            },
            Timings {
                lease_duration: secs(15),
                renew_deadline: secs(2),
                retry_period: secs(2),
            },
            Timings {
                lease_duration: Duration::from_millis(1500),
                renew_deadline: secs(1),
                retry_period: Duration::from_millis(100),
            },
            Timings {
                lease_duration: secs(15),
                renew_deadline: secs(10),
                retry_period: Duration::ZERO,
            },
            // Would wrap leaseDurationSeconds' i32 without the range check.
            Timings {
                lease_duration: secs(u64::from(u32::MAX) + 10),
                renew_deadline: secs(10),
                retry_period: secs(2),
            },
        ];
        for t in bad {
            assert!(t.validate().is_err(), "{t:?}");
        }
    }

    #[test]
    fn another_holders_lease_is_respected_until_unchanged_for_its_duration() {
        let t = Timings::default();
        let seen = seen(held("other", 3), "10", 100);
        assert_eq!(
            decide("me", &t, &seen, &U, None, secs(100)),
            Decision::Follow
        );
        assert_eq!(
            decide("me", &t, &seen, &U, None, secs(114)),
            Decision::Follow
        );
        match decide("me", &t, &seen, &U, None, secs(115)) {
            Decision::Write { record, acquired } => {
                assert!(acquired);
                assert_eq!(record.holder, "me");
                assert_eq!(record.transitions, 4, "a takeover starts a new epoch");
            }
            other => panic!("expected takeover, got {other:?}"),
        }
    }

    #[test]
    fn without_a_renew_mark_any_write_restarts_the_local_clock() {
        let t = Timings::default();
        let first = seen(held("other", 3), "10", 0);
        // Same version seen again later: the clock keeps running from 0.
        let again = observe(Some(&first), held("other", 3), "10", None, secs(10));
        assert_eq!(again.since, secs(0));
        // The holder renewed: an identical record, but a new resourceVersion.
        let after = observe(Some(&again), held("other", 3), "11", None, secs(14));
        assert_eq!(after.since, secs(14));
        assert_eq!(
            decide("me", &t, &after, &U, None, secs(20)),
            Decision::Follow
        );
    }

    /// Seed 3707273445's soak: the holder stopped, and two candidates that
    /// both believed themselves its owner asked for a handoff in turn, each
    /// write a new resourceVersion. The holder's renew mark stayed, so it
    /// expires on time; its own renewal restarts the clock.
    #[test]
    fn handoff_requests_do_not_keep_a_silent_holder_alive() {
        let t = Timings::default();
        let asked = |by: &str| LeaseRecord {
            handoff_to: Some(by.into()),
            ..held("other", 3)
        };
        let mut o = observe(None, held("other", 3), "10", Some("t1"), secs(0));
        for (k, by) in ["r1", "r3", "r1", "r3", "r1"].into_iter().enumerate() {
            let at = 2 * k as u64 + 2;
            o = observe(
                Some(&o),
                asked(by),
                &(11 + k).to_string(),
                Some("t1"),
                secs(at),
            );
        }
        assert_eq!(o.since, secs(0), "requests are not the holder's writes");
        assert_eq!(o.version, "15", "writes go on from the newest version");
        assert!(
            matches!(
                decide("me", &t, &o, &U, None, secs(16)),
                Decision::Write { acquired: true, .. }
            ),
            "{:?}",
            decide("me", &t, &o, &U, None, secs(16))
        );
        // The holder renewed: its mark moved, and the clock restarts.
        let renewed = observe(Some(&o), asked("r1"), "16", Some("t2"), secs(14));
        assert_eq!(renewed.since, secs(14));
        assert_eq!(
            decide("me", &t, &renewed, &U, None, secs(16)),
            Decision::Follow
        );
    }

    #[test]
    fn expiry_never_reads_timestamps_written_by_other_hosts() {
        // Whatever wall-clock time the holder wrote is not part of the record we
        // judge by; only our own observation time counts.
        let t = Timings::default();
        let seen = seen(held("other", 0), "1", 1_000_000);
        assert_eq!(
            decide("me", &t, &seen, &U, None, secs(1_000_001)),
            Decision::Follow
        );
    }

    #[test]
    fn the_holder_renews_without_a_new_epoch() {
        let t = Timings::default();
        let seen = seen(held("me", 7), "1", 0);
        match decide("me", &t, &seen, &U, None, secs(1)) {
            Decision::Write { record, acquired } => {
                assert!(!acquired);
                assert_eq!(record.transitions, 7);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_released_lease_is_taken_at_once() {
        let t = Timings::default();
        let seen = seen(released(&held("other", 2)), "1", 50);
        match decide("me", &t, &seen, &U, None, secs(50)) {
            Decision::Write { record, acquired } => {
                assert!(acquired);
                assert_eq!(record.transitions, 3);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_epoch_never_goes_back_even_when_the_lease_is_recreated() {
        let t = Timings::default();
        assert_eq!(initial_record("me", &t, None).transitions, 0);
        // This candidate saw epoch 9 before the Lease was deleted.
        assert_eq!(initial_record("me", &t, Some(9)).transitions, 10);
        // Someone else recreated it at 0 meanwhile: the takeover still moves past 9.
        let seen = seen(released(&held("other", 0)), "1", 0);
        match decide("me", &t, &seen, &U, Some(9), secs(0)) {
            Decision::Write { record, .. } => assert_eq!(record.transitions, 10),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn first_lease_starts_at_epoch_zero() {
        let r = initial_record("me", &Timings::default(), None);
        assert_eq!(
            (r.holder.as_str(), r.transitions, r.lease_duration_seconds),
            ("me", 0, 15)
        );
    }

    #[test]
    fn a_leader_stops_before_anyone_may_take_over() {
        let t = Timings::default();
        // The leader's last renewal was sent at 100; a follower saw it at 100 or later.
        assert!(still_leading(&t, secs(100), secs(109)));
        assert!(!still_leading(&t, secs(100), secs(110)));
        let follower_view = seen(held("leader", 1), "5", 100);
        // The earliest takeover is at 115, after the leader stopped at 110.
        assert_eq!(
            decide("f", &t, &follower_view, &U, None, secs(114)),
            Decision::Follow
        );
    }

    #[test]
    fn a_holder_that_is_not_the_owner_keeps_the_lease_until_the_owner_asks() {
        let t = Timings::default();
        // "me" took the cluster over after the grace period; "owner" is assigned.
        let mut record = held("me", 4);
        let s = seen(record.clone(), "1", 0);
        assert!(matches!(
            decide("me", &t, &s, &assigned(Some("owner")), None, secs(1)),
            Decision::Write {
                acquired: false,
                ..
            }
        ));
        // Nobody assigned (no live replicas yet): still kept.
        assert!(matches!(
            decide("me", &t, &s, &assigned(None), None, secs(1)),
            Decision::Write {
                acquired: false,
                ..
            }
        ));
        // A request from someone who is not the owner is ignored.
        record.handoff_to = Some("stranger".into());
        let s = seen(record.clone(), "2", 0);
        assert!(matches!(
            decide("me", &t, &s, &assigned(Some("owner")), None, secs(1)),
            Decision::Write {
                acquired: false,
                ..
            }
        ));
        // The owner asked: release, keeping the epoch.
        record.handoff_to = Some("owner".into());
        let s = seen(record, "3", 0);
        match decide("me", &t, &s, &assigned(Some("owner")), None, secs(1)) {
            Decision::Yield { record } => {
                assert_eq!((record.holder.as_str(), record.transitions), ("", 4));
                assert_eq!(record.handoff_to, None);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_owner_asks_a_live_holder_once_and_takes_a_released_lease_at_once() {
        let t = Timings::default();
        let s = seen(held("other", 2), "1", 0);
        match decide("owner", &t, &s, &assigned(Some("owner")), None, secs(1)) {
            Decision::RequestHandoff { record } => {
                assert_eq!(record.holder, "other");
                assert_eq!(record.handoff_to.as_deref(), Some("owner"));
            }
            other => panic!("{other:?}"),
        }
        let mut asked = held("other", 2);
        asked.handoff_to = Some("owner".into());
        let s = seen(asked, "2", 0);
        assert_eq!(
            decide("owner", &t, &s, &assigned(Some("owner")), None, secs(1)),
            Decision::Follow
        );
        // A holder that never answers: the owner takes over after the lease duration.
        assert!(matches!(
            decide("owner", &t, &s, &assigned(Some("owner")), None, secs(15)),
            Decision::Write { acquired: true, .. }
        ));
        let s = seen(released(&held("other", 2)), "3", 20);
        assert!(matches!(
            decide("owner", &t, &s, &assigned(Some("owner")), None, secs(20)),
            Decision::Write { acquired: true, .. }
        ));
    }

    #[test]
    fn a_non_owner_takes_a_free_lease_only_after_the_grace_period() {
        let t = Timings::default();
        let s = seen(released(&held("gone", 1)), "1", 0);
        let a = assigned(Some("owner"));
        assert_eq!(decide("me", &t, &s, &a, None, secs(5)), Decision::Follow);
        assert!(matches!(
            decide("me", &t, &s, &a, None, secs(6)),
            Decision::Write { acquired: true, .. }
        ));
        assert!(!may_take("me", &a, secs(5)));
        assert!(may_take("me", &a, secs(6)));
        assert!(may_take("owner", &a, secs(0)));
    }

    #[test]
    fn a_lease_round_never_outlives_the_renew_deadline() {
        let t = Timings::default();
        assert_eq!(round_budget(&t, None, secs(0)), secs(10));
        assert_eq!(round_budget(&t, Some(secs(0)), secs(3)), secs(7));
        // Close to the deadline, still one retry period to try a renewal.
        assert_eq!(round_budget(&t, Some(secs(0)), secs(9)), secs(2));
    }
}
