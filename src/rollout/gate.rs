//! The wave gate: whether a wave's evidence lets the next wave start. Pure.
//!
//! A wave passes only on evidence: at least one of its clusters done at the
//! update revision, every other one done or (outside the canary) failed
//! within the budget, and all of the done ones done for the bake time. An
//! empty wave proves nothing: it is skipped, never "baked". A member that
//! is missing (labels unreadable, unregistered, relabelled away after the
//! wave started) is not done.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// One cluster of a wave, as the gate needs it.
#[derive(Clone, Debug, PartialEq)]
pub enum Evidence {
    /// Done at the update revision since this stamp.
    Done(Time),
    /// Failed at the update revision (deadline missed, member failed, conflict).
    Failed,
    /// Anything else: not yet given, writing, progressing, or missing.
    Pending,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Gate {
    /// The wave selects no cluster: it proves nothing and holds nothing.
    Skipped,
    /// Some cluster is not done yet.
    Progressing,
    /// Every cluster is done (or tolerated failed); the bake has this long left.
    Baking(Duration),
    /// Passed, at this stamp.
    Done(Time),
    /// No cluster of it is done and every one failed, or it is the canary and
    /// one failed: the release failed here, whatever the budget says.
    Failed,
}

impl Gate {
    /// Whether the waves after this one may start.
    pub fn passed(&self) -> bool {
        matches!(self, Gate::Skipped | Gate::Done(_))
    }
}

/// The gate of one wave. `finished` is the stamp an earlier round wrote for
/// the same update revision: a wave that passed stays passed.
pub fn gate(
    members: &[Evidence],
    canary: bool,
    finished: Option<&Time>,
    bake: Duration,
    now: Timestamp,
) -> Gate {
    if let Some(t) = finished {
        return Gate::Done(t.clone());
    }
    if members.is_empty() {
        return Gate::Skipped;
    }
    let failed = members.iter().filter(|e| **e == Evidence::Failed).count();
    let done: Vec<&Time> = members
        .iter()
        .filter_map(|e| match e {
            Evidence::Done(since) => Some(since),
            _ => None,
        })
        .collect();
    if (canary && failed > 0) || failed == members.len() {
        return Gate::Failed;
    }
    if done.len() + failed < members.len() {
        return Gate::Progressing;
    }
    let left = done
        .iter()
        .filter_map(|since| left(now, since, bake))
        .max()
        .filter(|_| !bake.is_zero());
    match left {
        Some(rest) => Gate::Baking(rest),
        None => Gate::Done(stamp(now)),
    }
}

/// What is left of `span` counted from `since`, or `None` once it is over.
/// Stamps keep whole seconds (as the apiserver's Time does), so the real
/// start may be up to a second after `since`: count from a second later,
/// so that a bake is never cut short and a deadline never fires early.
/// Saturating: no span or stamp can overflow it.
pub fn left(now: Timestamp, since: &Time, span: Duration) -> Option<Duration> {
    let span = i64::try_from(span.as_millis()).unwrap_or(i64::MAX);
    let end = since
        .0
        .as_millisecond()
        .saturating_add(1000)
        .saturating_add(span);
    let ms = end.saturating_sub(now.as_millisecond());
    (ms > 0).then(|| Duration::from_millis(ms as u64))
}

/// How much of a span an inherited stamp may vouch for: a term that takes
/// over counts at least this much of every bake and deadline on its own
/// clock (or the whole span, when shorter).
pub const INHERITED_ALLOWANCE: Duration = Duration::from_secs(30);

/// A stamp as this term may trust it for `span` (review M5). Stamps this
/// term wrote are on its own clock. One written before it began may come
/// from another replica's clock, ahead or behind: it is moved no earlier
/// than where the span would end `min(span, allowance)` after the term
/// began, so a successor whose clock runs ahead cannot cut a bake short or
/// fire a deadline early by more than the allowance.
pub fn trusted(since: &Time, span: Duration, term_started: Timestamp) -> Time {
    if since.0 >= term_started {
        return since.clone();
    }
    let owed = span.saturating_sub(span.min(INHERITED_ALLOWANCE));
    let floor = jiff::SignedDuration::try_from(owed)
        .ok()
        .and_then(|d| term_started.checked_sub(d).ok())
        .unwrap_or(Timestamp::MIN);
    Time(since.0.max(floor))
}

/// How far the newest stamp in `s` is ahead of `now`, in whole seconds (0
/// when none is): the clock of the replica that wrote it runs ahead of this
/// one's by at least that much. Exported, so skew is seen before it shows
/// as a long bake (review M5).
pub fn ahead(s: &super::spec::FleetMicroserviceStatus, now: Timestamp) -> i64 {
    let clusters = s
        .clusters
        .iter()
        .flat_map(|c| std::iter::once(&c.since).chain(c.targeted.as_ref()));
    let waves = s
        .waves
        .iter()
        .flat_map(|w| w.started.iter().chain(w.finished.iter()));
    let conditions = s.conditions.iter().map(|c| &c.last_transition_time);
    clusters
        .chain(waves)
        .chain(conditions)
        .map(|t| t.0.as_second() - now.as_second())
        .max()
        .unwrap_or(0)
        .max(0)
}

/// `now` in whole seconds, as a status stamp.
pub fn stamp(now: Timestamp) -> Time {
    Time(Timestamp::from_second(now.as_second()).unwrap_or(now))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }
    fn done(s: &str) -> Evidence {
        Evidence::Done(Time(at(s)))
    }
    const T0: &str = "2026-01-01T00:00:00Z";
    const BAKE: Duration = Duration::from_secs(30);

    #[test]
    fn an_empty_wave_is_skipped_not_baked() {
        let g = gate(&[], true, None, BAKE, at(T0));
        assert_eq!(g, Gate::Skipped);
        assert!(g.passed());
    }

    #[test]
    fn every_member_done_for_the_bake_passes() {
        let members = [done(T0), done("2026-01-01T00:00:10Z")];
        let g = gate(&members, true, None, BAKE, at("2026-01-01T00:00:20Z"));
        assert_eq!(
            g,
            Gate::Baking(Duration::from_secs(21)),
            "the latest counts"
        );
        assert!(!g.passed());
        let g = gate(&members, true, None, BAKE, at("2026-01-01T00:00:41Z"));
        assert!(matches!(g, Gate::Done(_)), "{g:?}");
        let g = gate(&members, true, None, Duration::ZERO, at(T0));
        assert!(matches!(g, Gate::Done(_)), "no bake: done at once");
    }

    #[test]
    fn a_member_not_done_holds_the_wave() {
        let g = gate(&[done(T0), Evidence::Pending], false, None, BAKE, at(T0));
        assert_eq!(g, Gate::Progressing);
    }

    /// Review H4: failures are failures, never "finished".
    #[test]
    fn failures_never_open_a_gate_on_their_own() {
        let later = at("2026-01-01T01:00:00Z");
        // Every member failed: failed, whatever the budget.
        assert_eq!(
            gate(&[Evidence::Failed], false, None, BAKE, later),
            Gate::Failed
        );
        // The canary tolerates no failure, even beside a done cluster.
        let mixed = [done(T0), Evidence::Failed];
        assert_eq!(gate(&mixed, true, None, BAKE, later), Gate::Failed);
        // A later wave tolerates it (the budget is checked elsewhere), but
        // only beside evidence: a done cluster.
        assert!(matches!(
            gate(&mixed, false, None, BAKE, later),
            Gate::Done(_)
        ));
    }

    #[test]
    fn a_passed_wave_stays_passed_for_its_revision() {
        let t = Time(at(T0));
        let g = gate(&[Evidence::Pending], true, Some(&t), BAKE, at(T0));
        assert_eq!(g, Gate::Done(t));
    }

    /// Review M5: a successor whose clock runs two minutes ahead inherits a
    /// stamp that looks two minutes old; it still bakes 30 s on its own clock.
    #[test]
    fn an_inherited_stamp_vouches_for_at_most_the_allowance() {
        let term = at("2026-01-01T00:05:00Z");
        let stamp = Time(at("2026-01-01T00:03:00Z"));
        let bake = Duration::from_secs(30);
        let t = trusted(&stamp, bake, term);
        assert_eq!(t.0, term, "the whole 30 s bake counts from the term");
        assert!(left(term, &t, bake).is_some());
        // A long bake: the stamp vouches for all but the allowance.
        let hour = Duration::from_secs(3600);
        let t = trusted(&stamp, hour, term);
        assert_eq!(t, stamp, "an old enough stamp is kept");
        let t = trusted(&Time(at("2026-01-01T00:04:59Z")), bake, term);
        assert_eq!(t.0, term);
        // A stamp of this term is its own.
        let own = Time(at("2026-01-01T00:05:10Z"));
        assert_eq!(trusted(&own, bake, term), own);
    }

    #[test]
    fn ahead_is_the_newest_stamp_past_now() {
        use crate::rollout::spec::{FleetMicroserviceStatus, WaveState, WaveStatus};
        let mut s = FleetMicroserviceStatus::default();
        assert_eq!(ahead(&s, at(T0)), 0, "no stamp");
        s.waves.push(WaveStatus {
            name: "canary".into(),
            clusters: vec![],
            state: WaveState::Done,
            started: Some(Time(at("2025-12-31T23:59:00Z"))),
            finished: Some(Time(at("2026-01-01T00:01:30Z"))),
            approval: None,
            analysis: vec![],
        });
        assert_eq!(ahead(&s, at(T0)), 90);
        assert_eq!(
            ahead(&s, at("2026-01-01T00:05:00Z")),
            0,
            "behind is not skew"
        );
    }

    /// Review H2: a span or stamp at the edge of the range saturates.
    #[test]
    fn left_saturates() {
        let since = Time(at(T0));
        let huge = Duration::from_secs(10_000_000_000_000_000);
        assert!(left(at(T0), &since, huge).is_some());
        assert!(left(at(T0), &since, Duration::MAX).is_some());
        assert_eq!(left(at("2026-01-01T00:00:31Z"), &since, BAKE), None);
    }
}
