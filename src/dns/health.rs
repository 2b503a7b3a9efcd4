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
    /// It has been in this answer before (as found, or since): only then
    /// does coming back wait out the restore window. A cluster new to the
    /// name has no flapping to damp, and a new service's name should list
    /// each cluster as soon as it is Available there.
    pub returning: bool,
}

impl Track {
    /// As found: in the answer or not, nothing pending. `returning`: its
    /// coming back waits out the restore window, as it would have under the
    /// last term (#59: a cluster withdrawn then is not restored at once
    /// because a new term began).
    pub fn found(in_answer: bool, returning: bool) -> Track {
        Track {
            in_answer,
            disagrees_since: None,
            returning: in_answer || returning,
        }
    }

    fn settled(self, in_answer: bool) -> Track {
        Track {
            in_answer,
            disagrees_since: None,
            returning: self.returning || in_answer,
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
            return (track.settled(track.in_answer), None);
        };
        if want == track.in_answer {
            return (track.settled(want), None);
        }
        let since = track.disagrees_since.unwrap_or(now);
        let window = match (track.in_answer, track.returning) {
            (true, _) => self.withdraw_after,
            (false, true) => self.restore_after,
            (false, false) => Duration::ZERO,
        };
        let waited = now.saturating_duration_since(since);
        if waited >= window {
            (track.settled(want), None)
        } else {
            (
                Track {
                    disagrees_since: Some(since),
                    ..track
                },
                Some(window - waited),
            )
        }
    }
}

/// What is known of one cluster for one name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Judged {
    /// The rule's verdict ([`Rule::step`]).
    pub in_answer: bool,
    /// Preferred by the name's strategy.
    pub primary: bool,
    /// Its cluster answers now (not known unreachable).
    pub reachable: bool,
}

/// One cluster that could be in an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate<'a> {
    pub cluster: &'a str,
    /// The rule's verdict ([`Rule::step`]).
    pub in_answer: bool,
    /// Preferred: every cluster under `RoundRobin`, the selected ones under
    /// `Failover`.
    pub primary: bool,
    /// Its cluster answers now.
    pub reachable: bool,
}

/// The clusters an answer lists: the primaries in it; else the others in
/// it; else, when none is and the name is `serving` (lists something now),
/// fail-open (an empty answer would send every client nowhere, and a fleet
/// that looks all down is more likely a blind writer): every candidate
/// whose cluster answers, or every one when none does (#59: never one
/// known unreachable beside one that answers). A name that serves nothing
/// yet stays empty: there is nothing to keep, and listing clusters not yet
/// Available would be a lie. Returns them and whether the answer is
/// degraded.
pub fn answer<'a>(candidates: &[Candidate<'a>], serving: bool) -> (Vec<&'a str>, bool) {
    let pick = |primary: bool| -> Vec<&'a str> {
        candidates
            .iter()
            .filter(|c| c.in_answer && c.primary == primary)
            .map(|c| c.cluster)
            .collect()
    };
    let primaries = pick(true);
    if !primaries.is_empty() {
        return (primaries, false);
    }
    let others = pick(false);
    if !others.is_empty() || candidates.is_empty() || !serving {
        return (others, false);
    }
    let answering: Vec<&'a str> = candidates
        .iter()
        .filter(|c| c.reachable)
        .map(|c| c.cluster)
        .collect();
    match answering.is_empty() {
        false => (answering, true),
        true => (candidates.iter().map(|c| c.cluster).collect(), true),
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
        let mut track = Track::found(start, start);
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
        let (track, next) = RULE.step(Track::found(true, true), Seen::Unhealthy, t0);
        assert_eq!(next, Some(Duration::from_secs(5)));
        let (_, next) = RULE.step(track, Seen::Unhealthy, t0 + Duration::from_secs(2));
        assert_eq!(next, Some(Duration::from_secs(3)));
        assert_eq!(
            RULE.step(Track::found(true, true), Seen::Healthy, t0).1,
            None
        );
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
    fn a_new_cluster_enters_at_once_and_a_returning_one_after_the_window() {
        use Seen::*;
        assert_eq!(run(&RULE, false, &[(0, Healthy)]), vec![true]);
        // Unhealthy first (registered before Available): still new.
        assert_eq!(
            run(&RULE, false, &[(0, Unhealthy), (3, Healthy)]),
            vec![false, true]
        );
        // Once in, a withdrawal makes it a returning one.
        let seen = [
            (0, Healthy),
            (1, Unhealthy),
            (6, Unhealthy),
            (7, Healthy),
            (11, Healthy),
            (12, Healthy),
        ];
        assert_eq!(
            run(&RULE, false, &seen),
            vec![true, true, false, false, false, true]
        );
    }

    fn cands<'a>(c: &[(&'a str, bool, bool)]) -> Vec<Candidate<'a>> {
        c.iter()
            .map(|&(cluster, in_answer, primary)| Candidate {
                cluster,
                in_answer,
                primary,
                reachable: true,
            })
            .collect()
    }

    /// #59: fail-open lists the candidates whose clusters answer; all of
    /// them only when none does.
    #[test]
    fn fail_open_never_lists_an_unreachable_cluster_beside_one_that_answers() {
        let mut c = cands(&[("a", false, true), ("b", false, true), ("c", false, true)]);
        c[1].reachable = false;
        assert_eq!(answer(&c, true), (vec!["a", "c"], true));
        for x in &mut c {
            x.reachable = false;
        }
        assert_eq!(answer(&c, true), (vec!["a", "b", "c"], true));
    }

    /// #59: a cluster withdrawn under the last term waits out its restore
    /// window under the next one too; one new to a name does not.
    #[test]
    fn a_new_term_keeps_the_restore_window_of_a_withdrawn_cluster() {
        let t0 = Instant::now();
        let withdrawn = Track::found(false, true);
        let (t, next) = RULE.step(withdrawn, Seen::Healthy, t0);
        assert!(!t.in_answer);
        assert_eq!(next, Some(RULE.restore_after));
        let new = Track::found(false, false);
        assert!(RULE.step(new, Seen::Healthy, t0).0.in_answer);
    }

    #[test]
    fn an_answer_is_never_empty() {
        let rr = |c: &[(&'static str, bool)]| {
            answer(
                &cands(&c.iter().map(|&(n, i)| (n, i, true)).collect::<Vec<_>>()),
                true,
            )
        };
        assert_eq!(rr(&[("a", true), ("b", false)]), (vec!["a"], false));
        assert_eq!(rr(&[("a", false), ("b", false)]), (vec!["a", "b"], true));
        assert_eq!(answer(&[], true), (vec![], false));
        // A new name, nobody healthy yet: nothing to keep, nothing listed.
        let new = cands(&[("a", false, true), ("b", false, true)]);
        assert_eq!(answer(&new, false), (vec![], false));
    }

    #[test]
    fn failover_lists_healthy_primaries_and_the_others_only_without_one() {
        // member-1 primary and healthy: only it.
        let all_up = [("m1", true, true), ("m2", true, false), ("m3", true, false)];
        assert_eq!(answer(&cands(&all_up), true), (vec!["m1"], false));
        // The primary withdrawn: the healthy others.
        let down = [
            ("m1", false, true),
            ("m2", true, false),
            ("m3", true, false),
        ];
        assert_eq!(answer(&cands(&down), true), (vec!["m2", "m3"], false));
        // Two primaries, one healthy: that one alone.
        let half = [("m1", false, true), ("m2", true, true), ("m3", true, false)];
        assert_eq!(answer(&cands(&half), true), (vec!["m2"], false));
        // Nobody healthy: every candidate, primaries or not (fail-open).
        let none = [("m1", false, true), ("m2", false, false)];
        assert_eq!(answer(&cands(&none), true), (vec!["m1", "m2"], true));
        // No primary registered at all: the healthy others, not degraded.
        let no_primary = [("m2", true, false), ("m3", false, false)];
        assert_eq!(answer(&cands(&no_primary), true), (vec!["m2"], false));
    }
}
