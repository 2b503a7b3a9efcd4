//! Whether one cluster belongs in a Microservice's fleet-wide answer
//! (#31): Available at its generation and reachable, with a window each
//! way so that a blip shorter than it moves nothing. Pure.

use std::time::{Duration, Instant};

/// What the status index says of one Microservice in one cluster now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// `Available=True` at its current generation, in a reachable cluster.
    Healthy,
    /// Reachable, and not Available (or not at its generation, or gone).
    Unhealthy,
    /// The cluster does not answer: nobody knows.
    Unreachable,
}

/// What an unreachable cluster means for the answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OnUnreachable {
    /// Withdrawn after the window, like an unhealthy one.
    Withdraw,
    /// Left as it was: its control plane may be down while its workloads serve.
    Keep,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    pub withdraw_after: Duration,
    pub restore_after: Duration,
    pub unreachable: OnUnreachable,
}

/// One cluster's place in one answer, kept between passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Track {
    pub in_answer: bool,
    /// Since when what is seen has disagreed with `in_answer`.
    pub disagrees_since: Option<Instant>,
}

impl Track {
    /// As found: in the answer or not, nothing pending.
    pub fn found(in_answer: bool) -> Track {
        Track {
            in_answer,
            disagrees_since: None,
        }
    }
}

impl Rule {
    /// Whether `seen` argues for the answer; `None`: it says nothing.
    fn wants(&self, seen: Seen) -> Option<bool> {
        match (seen, self.unreachable) {
            (Seen::Healthy, _) => Some(true),
            (Seen::Unhealthy, _) | (Seen::Unreachable, OnUnreachable::Withdraw) => Some(false),
            (Seen::Unreachable, OnUnreachable::Keep) => None,
        }
    }

    /// The track after seeing `seen` at `now`, and how long until a change
    /// that is pending takes effect (to look again then).
    pub fn step(&self, track: Track, seen: Seen, now: Instant) -> (Track, Option<Duration>) {
        let Some(want) = self.wants(seen) else {
            // Nothing known: as it was, and the clock of a pending change stops.
            return (Track::found(track.in_answer), None);
        };
        if want == track.in_answer {
            return (Track::found(want), None);
        }
        let since = track.disagrees_since.unwrap_or(now);
        let window = if track.in_answer {
            self.withdraw_after
        } else {
            self.restore_after
        };
        let waited = now.saturating_duration_since(since);
        if waited >= window {
            (Track::found(want), None)
        } else {
            (
                Track {
                    in_answer: track.in_answer,
                    disagrees_since: Some(since),
                },
                Some(window - waited),
            )
        }
    }
}

/// The clusters an answer lists: those in it, or, when none is, every
/// candidate (fail-open: an empty answer would send every client nowhere,
/// and a fleet that looks all down is more likely a blind writer).
/// Returns them and whether the answer is degraded.
pub fn answer<'a>(candidates: &[(&'a str, bool)]) -> (Vec<&'a str>, bool) {
    let healthy: Vec<&str> = candidates
        .iter()
        .filter(|(_, in_answer)| *in_answer)
        .map(|(c, _)| *c)
        .collect();
    if healthy.is_empty() && !candidates.is_empty() {
        (candidates.iter().map(|(c, _)| *c).collect(), true)
    } else {
        (healthy, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULE: Rule = Rule {
        withdraw_after: Duration::from_secs(5),
        restore_after: Duration::from_secs(5),
        unreachable: OnUnreachable::Withdraw,
    };

    fn run(rule: &Rule, start: bool, seen: &[(u64, Seen)]) -> Vec<bool> {
        let t0 = Instant::now();
        let mut track = Track::found(start);
        seen.iter()
            .map(|(at, s)| {
                track = rule.step(track, *s, t0 + Duration::from_secs(*at)).0;
                track.in_answer
            })
            .collect()
    }

    #[test]
    fn a_cluster_leaves_after_the_window_and_returns_after_its_own() {
        use Seen::*;
        let seen = [
            (0, Unhealthy),
            (4, Unhealthy),
            (5, Unhealthy),
            (6, Healthy),
            (10, Healthy),
            (11, Healthy),
        ];
        assert_eq!(
            run(&RULE, true, &seen),
            vec![true, true, false, false, false, true]
        );
    }

    #[test]
    fn a_blip_shorter_than_the_window_moves_nothing() {
        use Seen::*;
        let seen = [
            (0, Unreachable),
            (3, Unreachable),
            (4, Healthy),
            (20, Healthy),
        ];
        assert_eq!(run(&RULE, true, &seen), vec![true; 4]);
        // And it starts the window again next time.
        let seen = [(0, Unhealthy), (4, Healthy), (5, Unhealthy), (9, Unhealthy)];
        assert_eq!(run(&RULE, true, &seen), vec![true; 4]);
    }

    #[test]
    fn pending_changes_say_when_to_look_again() {
        let t0 = Instant::now();
        let (track, next) = RULE.step(Track::found(true), Seen::Unhealthy, t0);
        assert_eq!(next, Some(Duration::from_secs(5)));
        let (_, next) = RULE.step(track, Seen::Unhealthy, t0 + Duration::from_secs(2));
        assert_eq!(next, Some(Duration::from_secs(3)));
        assert_eq!(RULE.step(Track::found(true), Seen::Healthy, t0).1, None);
    }

    #[test]
    fn keep_leaves_an_unreachable_cluster_as_it_was() {
        use Seen::*;
        let keep = Rule {
            unreachable: OnUnreachable::Keep,
            ..RULE
        };
        assert_eq!(
            run(&keep, true, &[(0, Unreachable), (60, Unreachable)]),
            vec![true, true]
        );
        // Withdrawn for being unavailable, it does not come back by going dark.
        assert_eq!(
            run(&keep, false, &[(0, Unreachable), (60, Unreachable)]),
            vec![false, false]
        );
        // Unreachable stops the clock of a pending withdrawal.
        let seen = [
            (0, Unhealthy),
            (3, Unreachable),
            (30, Unhealthy),
            (34, Unhealthy),
        ];
        assert_eq!(run(&keep, true, &seen), vec![true, true, true, true]);
    }

    #[test]
    fn a_new_cluster_enters_after_the_restore_window() {
        use Seen::*;
        assert_eq!(
            run(&RULE, false, &[(0, Healthy), (4, Healthy), (5, Healthy)]),
            vec![false, false, true]
        );
    }

    #[test]
    fn an_answer_is_never_empty() {
        assert_eq!(answer(&[("a", true), ("b", false)]), (vec!["a"], false));
        assert_eq!(
            answer(&[("a", false), ("b", false)]),
            (vec!["a", "b"], true)
        );
        assert_eq!(answer(&[]), (vec![], false));
    }
}
