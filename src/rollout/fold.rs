//! Which status changes must be written before the round acts, and which
//! may wait: decisions are written at once, so that a successor reads
//! them; observations are folded into the next decision, or written after
//! at most `observations_every` (#29: one status write per decision, not
//! one per cluster step). Pure.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::spec::{CLUSTER_UNREACHABLE, ClusterState, ClusterStatus, FleetMicroserviceStatus};
use crate::domain::conditions::AVAILABLE;

/// How stale the written observations may be while nothing is decided,
/// with few rollouts in flight.
pub const OBSERVATIONS_EVERY: Duration = Duration::from_secs(5);
/// Observation-only status writes a second, over every FleetMicroservice
/// the leader holds observations for, when what they hold changes a
/// verdict (`Observed::Verdict`): with many rollouts in flight each waits
/// longer, so a hundred at once cost home 5 such writes a second, not 20.
const VERDICT_WRITES_PER_SECOND: f64 = 5.0;
/// The same when they hold only progress (`Observed::Progress`): steps and
/// counts of a mass rollout wait longer than a change of availability, so
/// a rollout whose waves are shorter than its wait is written once per
/// decision (#29: at most 5 home writes per rollout).
const PROGRESS_WRITES_PER_SECOND: f64 = 1.0;
/// The longest observations wait, however many rollouts hold some.
pub const OBSERVATIONS_AT_MOST: Duration = Duration::from_secs(30);

/// What held observations would change for a reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// Steps towards the targets, the counts, and the `Available`
    /// condition as they follow: a rollout moving on.
    Progress,
    /// A cluster that stops answering or answers again, or a `Done`
    /// cluster that is no longer done (its availability lost at its
    /// target): something no step of a rollout explains.
    Verdict,
}

/// What the observations `planned` holds beyond `written` change. Only
/// meaningful when nothing is decided (`urgent` is false), so the clusters
/// are the same ones in the same order. `Available` is not looked at: it
/// is the count of done clusters, so it dips while a wave's clusters
/// update (progress), and a loss no step explains shows as a cluster here.
pub fn observed(written: &FleetMicroserviceStatus, planned: &FleetMicroserviceStatus) -> Observed {
    let unreachable =
        |c: &ClusterStatus| c.state == ClusterState::Unknown || c.reason == CLUSTER_UNREACHABLE;
    let lost = |w: &ClusterStatus, p: &ClusterStatus| {
        w.state == ClusterState::Done && p.state != ClusterState::Done
    };
    let turned = written
        .clusters
        .iter()
        .zip(&planned.clusters)
        .any(|(w, p)| unreachable(w) != unreachable(p) || lost(w, p));
    match turned {
        true => Observed::Verdict,
        false => Observed::Progress,
    }
}

/// How long observations may wait when `holding` FleetMicroservices hold
/// some: `OBSERVATIONS_EVERY`, or their share of the write budget for what
/// they change, at most `OBSERVATIONS_AT_MOST`.
pub fn observations_every(holding: usize, observed: Observed) -> Duration {
    let per_second = match observed {
        Observed::Verdict => VERDICT_WRITES_PER_SECOND,
        Observed::Progress => PROGRESS_WRITES_PER_SECOND,
    };
    // Past the bound's worth of rollouts the share no longer matters.
    let holding = holding.min(1_000_000) as f64;
    let share = Duration::from_secs_f64(holding / per_second);
    share.clamp(OBSERVATIONS_EVERY, OBSERVATIONS_AT_MOST)
}

/// Whether `planned` decides something `written` does not say: a phase, a
/// generation, a revision, a wave, a cluster's target, a failure, a cluster
/// leaving or reached. Those are written before any member write.
pub fn urgent(written: &FleetMicroserviceStatus, planned: &FleetMicroserviceStatus) -> bool {
    !same_decisions(written, planned)
}

/// Whether to write now: a decision, or observations held for `every`.
pub fn write_now(
    written: &FleetMicroserviceStatus,
    planned: &FleetMicroserviceStatus,
    held_for: Option<Duration>,
    every: Duration,
) -> bool {
    written != planned && (urgent(written, planned) || held_for.is_some_and(|d| d >= every))
}

/// The two statuses agree once their observations are left out. Compared
/// field by field, without copies (this runs every round of every object);
/// the patterns name every field, so a new one must be sorted here.
fn same_decisions(a: &FleetMicroserviceStatus, b: &FleetMicroserviceStatus) -> bool {
    let FleetMicroserviceStatus {
        observed_generation,
        // Counts and the revision every cluster runs follow from the clusters.
        current_revision: _,
        updated: _,
        available: _,
        update_revision,
        update_revision_number,
        last_good_revision,
        failed_revision_number,
        failed_clusters,
        reached_clusters,
        phase,
        wave,
        waves,
        clusters,
        // Every change of the placement is a decision, timers included: a
        // successor continues them.
        placement,
        conditions,
    } = a;
    *observed_generation == b.observed_generation
        && *update_revision == b.update_revision
        && *update_revision_number == b.update_revision_number
        && *last_good_revision == b.last_good_revision
        && *failed_revision_number == b.failed_revision_number
        && *failed_clusters == b.failed_clusters
        && *reached_clusters == b.reached_clusters
        && *phase == b.phase
        && *wave == b.wave
        && *waves == b.waves
        && *placement == b.placement
        && clusters.len() == b.clusters.len()
        && clusters
            .iter()
            .zip(&b.clusters)
            .all(|(x, y)| cluster_decisions(x) == cluster_decisions(y))
        && decided_conditions(conditions).eq(decided_conditions(&b.conditions))
}

/// A step towards the target is an observation; the target, when it was
/// chosen, a failure and a departure are decisions.
fn cluster_decisions(c: &ClusterStatus) -> impl PartialEq + '_ {
    let ClusterStatus {
        name,
        target,
        targeted,
        state,
        revision: _,
        reason: _,
        message: _,
        since: _,
    } = c;
    let decided = matches!(state, ClusterState::Failed | ClusterState::Removing).then_some(*state);
    (name, target, targeted, decided)
}

/// Availability is observed; the other conditions change with the
/// decisions, and their messages carry counts.
fn decided_conditions(all: &[Condition]) -> impl Iterator<Item = impl PartialEq + '_> {
    all.iter().filter(|c| c.type_ != AVAILABLE).map(|c| {
        let Condition {
            type_,
            status,
            reason,
            observed_generation,
            message: _,
            last_transition_time: _,
        } = c;
        (type_, status, reason, observed_generation)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::spec::{RolloutPhase, WaveState, WaveStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn at(s: &str) -> Time {
        Time(s.parse().unwrap())
    }

    fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            observed_generation: Some(2),
            last_transition_time: at("2026-01-01T00:00:00Z"),
        }
    }

    fn cluster(name: &str, target: &str, state: ClusterState) -> ClusterStatus {
        ClusterStatus {
            name: name.into(),
            revision: Some("api-1".into()),
            target: Some(target.into()),
            state,
            reason: "Writing".into(),
            message: String::new(),
            since: at("2026-01-01T00:00:00Z"),
            targeted: Some(at("2026-01-01T00:00:00Z")),
        }
    }

    /// The canary wave open, m1 being given api-2, m2 pending.
    fn opened() -> FleetMicroserviceStatus {
        FleetMicroserviceStatus {
            observed_generation: Some(2),
            update_revision: Some("api-2".into()),
            phase: Some(RolloutPhase::Progressing),
            wave: Some("canary".into()),
            updated: Some("0/2".into()),
            available: Some("2/2".into()),
            reached_clusters: vec!["m1".into(), "m2".into()],
            waves: vec![WaveStatus {
                name: "canary".into(),
                clusters: vec!["m1".into()],
                state: WaveState::Progressing,
                started: Some(at("2026-01-01T00:00:00Z")),
                finished: None,
                approval: None,
                analysis: vec![],
            }],
            clusters: vec![
                cluster("m1", "api-2", ClusterState::Updating),
                cluster("m2", "api-1", ClusterState::Pending),
            ],
            conditions: vec![
                condition(
                    "Progressing",
                    "True",
                    "RolloutInProgress",
                    "wave canary: 0/2",
                ),
                condition(
                    "Available",
                    "True",
                    "AllClustersAvailable",
                    "available in 2/2",
                ),
            ],
            ..Default::default()
        }
    }

    #[test]
    fn a_cluster_step_and_its_counts_wait() {
        let written = opened();
        let mut planned = written.clone();
        planned.clusters[0].state = ClusterState::Done;
        planned.clusters[0].revision = Some("api-2".into());
        planned.clusters[0].reason = "Available".into();
        planned.clusters[0].since = at("2026-01-01T00:00:03Z");
        planned.updated = Some("1/2".into());
        planned.current_revision = None;
        planned.conditions[0].message = "wave canary: 1/2".into();
        planned.conditions[1] = condition("Available", "False", "ClustersNotAvailable", "1/2");
        let every = observations_every(1, observed(&written, &planned));
        assert!(!urgent(&written, &planned));
        assert!(!write_now(&written, &planned, None, every));
        assert!(!write_now(
            &written,
            &planned,
            Some(Duration::from_secs(4)),
            every
        ));
        assert!(write_now(
            &written,
            &planned,
            Some(OBSERVATIONS_EVERY),
            every
        ));
        // With a hundred rollouts holding observations, 5 s is not enough.
        let busy = observations_every(100, Observed::Verdict);
        assert!(!write_now(
            &written,
            &planned,
            Some(OBSERVATIONS_EVERY),
            busy
        ));
        assert!(write_now(&written, &planned, Some(busy), busy));
    }

    #[test]
    fn observations_wait_for_their_share_of_the_write_budget() {
        use Observed::{Progress, Verdict};
        // Few in flight: 5 s, as a single rollout always had.
        for holding in [0, 1, 5, 10, 25] {
            assert_eq!(observations_every(holding, Verdict), OBSERVATIONS_EVERY);
        }
        for holding in [0, 1, 5] {
            assert_eq!(observations_every(holding, Progress), OBSERVATIONS_EVERY);
        }
        // Many: a verdict waits its share of 5 writes a second, progress
        // its share of 1.
        assert_eq!(observations_every(40, Verdict), Duration::from_secs(8));
        assert_eq!(observations_every(100, Verdict), Duration::from_secs(20));
        assert_eq!(observations_every(20, Progress), Duration::from_secs(20));
        assert_eq!(observations_every(40, Progress), OBSERVATIONS_AT_MOST);
        // Never past the bound, however many.
        for observed in [Progress, Verdict] {
            assert_eq!(observations_every(150, observed), OBSERVATIONS_AT_MOST);
            assert_eq!(
                observations_every(usize::MAX, observed),
                OBSERVATIONS_AT_MOST
            );
        }
    }

    #[test]
    fn steps_counts_and_a_waves_dip_are_progress() {
        let written = opened();
        // The canary cluster, targeted, observed at its new generation and
        // not yet available: the count of done clusters dips.
        let mut dip = written.clone();
        dip.clusters[0].reason = "ReplicasUnavailable".into();
        dip.available = Some("1/2".into());
        dip.conditions[1] = condition("Available", "False", "ClustersNotAvailable", "1/2");
        // Then done, and every count follows.
        let mut step = written.clone();
        step.clusters[0].state = ClusterState::Done;
        step.clusters[0].revision = Some("api-2".into());
        step.clusters[0].reason = "Available".into();
        step.updated = Some("1/2".into());
        step.conditions[0].message = "wave canary: 1/2".into();
        for (what, planned) in [("the dip", &dip), ("the step", &step)] {
            assert!(!urgent(&written, planned), "{what} is an observation");
            assert_eq!(observed(&written, planned), Observed::Progress, "{what}");
        }
    }

    #[test]
    fn a_lost_cluster_or_its_return_is_a_verdict() {
        let mut done = opened();
        done.clusters[0].state = ClusterState::Done;
        type Turn = fn(&mut FleetMicroserviceStatus);
        let turns: [(&str, Turn); 4] = [
            ("a targeted cluster unreachable", |s| {
                s.clusters[0].state = ClusterState::Unknown;
                s.clusters[0].reason = CLUSTER_UNREACHABLE.into();
            }),
            ("a pending cluster unreachable", |s| {
                s.clusters[1].reason = CLUSTER_UNREACHABLE.into()
            }),
            ("a done cluster no longer done", |s| {
                s.clusters[0].state = ClusterState::Updating;
                s.clusters[0].reason = "ReplicasUnavailable".into();
            }),
            ("back from unreachable", |s| {
                s.clusters[1].reason = "WaitingForWave".into()
            }),
        ];
        for (what, turn) in turns {
            let mut before = done.clone();
            if what == "back from unreachable" {
                before.clusters[1].reason = CLUSTER_UNREACHABLE.into();
            }
            let mut planned = before.clone();
            turn(&mut planned);
            assert!(!urgent(&before, &planned), "{what} is an observation");
            assert_eq!(observed(&before, &planned), Observed::Verdict, "{what}");
        }
    }

    type Change = Box<dyn Fn(&mut FleetMicroserviceStatus)>;

    #[test]
    fn every_decision_is_written_at_once() {
        let written = opened();
        let changes: Vec<(&str, Change)> = vec![
            (
                "phase",
                Box::new(|s| s.phase = Some(RolloutPhase::Complete)),
            ),
            ("generation", Box::new(|s| s.observed_generation = Some(3))),
            (
                "update revision",
                Box::new(|s| s.update_revision = Some("api-3".into())),
            ),
            (
                "last good",
                Box::new(|s| s.last_good_revision = Some("api-2".into())),
            ),
            (
                "failed clusters",
                Box::new(|s| s.failed_clusters = vec!["m1".into()]),
            ),
            (
                "reached",
                Box::new(|s| s.reached_clusters.push("m3".into())),
            ),
            ("current wave", Box::new(|s| s.wave = Some("rest".into()))),
            (
                "wave state",
                Box::new(|s| s.waves[0].state = WaveState::Done),
            ),
            (
                "a target",
                Box::new(|s| s.clusters[1].target = Some("api-2".into())),
            ),
            (
                "a failure",
                Box::new(|s| s.clusters[0].state = ClusterState::Failed),
            ),
            (
                "a departure",
                Box::new(|s| s.clusters[1].state = ClusterState::Removing),
            ),
            (
                "a new cluster",
                Box::new(|s| {
                    s.clusters
                        .push(cluster("m3", "api-1", ClusterState::Pending))
                }),
            ),
            (
                "the progressing reason",
                Box::new(|s| s.conditions[0].reason = "WaitingForCanary".into()),
            ),
            (
                "the progressing status",
                Box::new(|s| s.conditions[0].status = "False".into()),
            ),
            (
                "a rollback",
                Box::new(|s| {
                    s.conditions
                        .push(condition("RolledBack", "True", "CanaryFailed", ""))
                }),
            ),
            (
                "when a target was chosen",
                Box::new(|s| s.clusters[0].targeted = Some(at("2026-01-01T00:00:09Z"))),
            ),
            (
                "the revision number",
                Box::new(|s| s.update_revision_number = Some(3)),
            ),
            (
                "the failed revision",
                Box::new(|s| s.failed_revision_number = Some(2)),
            ),
        ];
        for (what, change) in changes {
            let mut planned = written.clone();
            change(&mut planned);
            assert!(urgent(&written, &planned), "{what} must be written at once");
            assert!(
                write_now(&written, &planned, None, OBSERVATIONS_EVERY),
                "{what}"
            );
        }
    }

    #[test]
    fn nothing_changed_is_never_written() {
        let s = opened();
        assert!(!write_now(
            &s,
            &s,
            Some(Duration::from_secs(3600)),
            OBSERVATIONS_EVERY
        ));
    }
}
