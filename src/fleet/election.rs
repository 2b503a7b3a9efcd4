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

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimingsError {
    #[error("lease duration ({0:?}) must be a whole number of seconds, at least 1s")]
    LeaseDurationNotWholeSeconds(Duration),
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
    /// `renewTime` exactly as written, used only to notice that the holder
    /// renewed (the record changed); never compared with our clock.
    pub renew_marker: Option<String>,
}

/// What this candidate last saw, and when (on its own clock) it first saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub record: LeaseRecord,
    pub since: Instant,
}

/// Folds a fresh read into the observation: the clock restarts only when the
/// record changed.
pub fn observe(previous: Option<&Observed>, record: LeaseRecord, now: Instant) -> Observed {
    match previous {
        Some(p) if p.record == record => p.clone(),
        _ => Observed { record, since: now },
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Someone else holds an unexpired Lease: keep watching.
    Follow {
        holder: String,
        expires_in: Duration,
    },
    /// Write this record, conditioned on the resourceVersion that was read.
    /// `acquired` is true when leadership changes hands (a new epoch).
    Write { record: LeaseRecord, acquired: bool },
}

/// What to do with the Lease as observed, for candidate `me` at `now`.
pub fn decide(me: &str, timings: &Timings, observed: &Observed, now: Instant) -> Decision {
    let current = &observed.record;
    let held_by_other = !current.holder.is_empty() && current.holder != me;
    if held_by_other {
        let duration = Duration::from_secs(current.lease_duration_seconds.max(0) as u64);
        let expires_at = observed.since + duration;
        if expires_at > now {
            return Decision::Follow {
                holder: current.holder.clone(),
                expires_in: expires_at - now,
            };
        }
    }
    let acquired = current.holder != me;
    Decision::Write {
        record: LeaseRecord {
            holder: me.to_string(),
            lease_duration_seconds: timings.lease_duration.as_secs() as i32,
            // client-go counts every change of holder, a release included.
            transitions: if acquired {
                current.transitions + 1
            } else {
                current.transitions
            },
            renew_marker: None,
        },
        acquired,
    }
}

/// The record for a Lease nobody has created yet.
pub fn initial_record(me: &str, timings: &Timings) -> LeaseRecord {
    LeaseRecord {
        holder: me.to_string(),
        lease_duration_seconds: timings.lease_duration.as_secs() as i32,
        transitions: 0,
        renew_marker: None,
    }
}

/// The record that hands the Lease back on shutdown: an empty holder lets a
/// standby acquire at once, without waiting out the lease duration.
pub fn released(current: &LeaseRecord) -> LeaseRecord {
    LeaseRecord {
        holder: String::new(),
        lease_duration_seconds: 1,
        transitions: current.transitions,
        renew_marker: None,
    }
}

/// Whether a leader whose last successful renewal was sent at `renewed_at`
/// may still act as leader at `now`.
pub fn still_leading(timings: &Timings, renewed_at: Instant, now: Instant) -> bool {
    now < renewed_at + timings.renew_deadline
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
            renew_marker: Some("2026-01-01T00:00:00.000000Z".into()),
        }
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
        ];
        for t in bad {
            assert!(t.validate().is_err(), "{t:?}");
        }
    }

    #[test]
    fn another_holders_lease_is_respected_until_unchanged_for_its_duration() {
        let t = Timings::default();
        let seen = observe(None, held("other", 3), secs(100));
        assert!(matches!(
            decide("me", &t, &seen, secs(100)),
            Decision::Follow { .. }
        ));
        assert!(matches!(
            decide("me", &t, &seen, secs(114)),
            Decision::Follow { .. }
        ));
        match decide("me", &t, &seen, secs(115)) {
            Decision::Write { record, acquired } => {
                assert!(acquired);
                assert_eq!(record.holder, "me");
                assert_eq!(record.transitions, 4, "a takeover starts a new epoch");
            }
            other => panic!("expected takeover, got {other:?}"),
        }
    }

    #[test]
    fn a_renewal_by_the_holder_restarts_the_local_clock() {
        let t = Timings::default();
        let first = observe(None, held("other", 3), secs(0));
        // Same record seen again later: the clock keeps running from 0.
        let again = observe(Some(&first), held("other", 3), secs(10));
        assert_eq!(again.since, secs(0));
        // The holder renewed (its renewTime changed): the clock restarts.
        let mut renewed = held("other", 3);
        renewed.renew_marker = Some("2026-01-01T00:00:10.000000Z".into());
        let after = observe(Some(&again), renewed, secs(14));
        assert_eq!(after.since, secs(14));
        assert!(matches!(
            decide("me", &t, &after, secs(20)),
            Decision::Follow { .. }
        ));
    }

    #[test]
    fn expiry_never_reads_timestamps_written_by_other_hosts() {
        // Whatever wall-clock time the holder wrote is not part of the record we
        // judge by; only our own observation time counts.
        let t = Timings::default();
        let seen = observe(None, held("other", 0), secs(1_000_000));
        assert!(matches!(
            decide("me", &t, &seen, secs(1_000_001)),
            Decision::Follow { .. }
        ));
    }

    #[test]
    fn the_holder_renews_without_a_new_epoch() {
        let t = Timings::default();
        let seen = observe(None, held("me", 7), secs(0));
        match decide("me", &t, &seen, secs(1)) {
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
        let seen = observe(None, released(&held("other", 2)), secs(50));
        match decide("me", &t, &seen, secs(50)) {
            Decision::Write { record, acquired } => {
                assert!(acquired);
                assert_eq!(record.transitions, 3);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn first_lease_starts_at_epoch_zero() {
        let r = initial_record("me", &Timings::default());
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
        let follower_view = observe(None, held("leader", 1), secs(100));
        // The earliest takeover is at 115, after the leader stopped at 110.
        assert!(matches!(
            decide("f", &t, &follower_view, secs(114)),
            Decision::Follow { .. }
        ));
    }
}
