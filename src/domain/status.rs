//! The status a reconcile concludes: conditions, phase and compatibility
//! fields, from what happened (the outcome) and what the children report.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::conditions::{self, ACCEPTED, AVAILABLE, PROGRESSING, RECONCILED, Status, Verdict};
use crate::crd::{ManagedResources, MicroserviceStatus};

/// What the Deployment reports about its rollout.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RolloutFacts {
    /// Whether the Deployment controller has seen the Deployment's latest spec.
    pub observed_current: bool,
    pub replicas: i32,
    pub updated: i32,
    pub ready: i32,
    pub available: i32,
    pub deadline_exceeded: bool,
}

impl RolloutFacts {
    pub fn of(d: &Deployment) -> Self {
        let generation = d.metadata.generation.unwrap_or(0);
        let Some(s) = d.status.as_ref() else {
            return RolloutFacts::default();
        };
        let observed_current = s.observed_generation.unwrap_or(0) >= generation;
        RolloutFacts {
            observed_current,
            replicas: s.replicas.unwrap_or(0),
            updated: s.updated_replicas.unwrap_or(0),
            ready: s.ready_replicas.unwrap_or(0),
            available: s.available_replicas.unwrap_or(0),
            // A deadline from an older spec says nothing about this one.
            deadline_exceeded: observed_current
                && s.conditions.iter().flatten().any(|c| {
                    c.type_ == "Progressing"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
                }),
        }
    }
}

/// Ready endpoints across a Service's EndpointSlices.
pub fn ready_endpoints<'a>(slices: impl IntoIterator<Item = &'a EndpointSlice>) -> usize {
    slices
        .into_iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false))
        .count()
}

/// What a reconcile found or did.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Both children match the spec; the rollout is as the facts say.
    Applied {
        deployment: String,
        service: String,
        rollout: RolloutFacts,
        ready_endpoints: usize,
    },
    InvalidSpec(String),
    OwnershipConflict(String),
    /// The API server refused a child as invalid (422), e.g. an immutable
    /// field: no retry can fix it, only a spec or child change.
    Rejected(String),
    /// A child is being deleted; it is created again once it is gone.
    ChildTerminating(String),
    /// A transient failure; backoff retries it.
    ApiError(String),
    /// The children were applied, but the watches whose caches show their
    /// state have been failing: what they show may be frozen.
    CachesStale(String),
}

fn applied_verdicts(desired: i32, r: &RolloutFacts, endpoints: usize) -> [Verdict; 2] {
    let done = r.observed_current
        && r.updated >= desired
        && r.replicas == r.updated
        && r.available >= desired;
    let progressing = if r.deadline_exceeded {
        Verdict::new(
            PROGRESSING,
            Status::False,
            "ProgressDeadlineExceeded",
            "the rollout made no progress within its deadline",
        )
    } else if done {
        Verdict::new(
            PROGRESSING,
            Status::False,
            "RolloutComplete",
            format!("{desired} replicas run the current spec"),
        )
    } else {
        Verdict::new(
            PROGRESSING,
            Status::True,
            "RolloutInProgress",
            "the Deployment is rolling out the current spec",
        )
    };
    let available = if !done {
        Verdict::new(
            AVAILABLE,
            Status::False,
            "RolloutInProgress",
            "not every replica of the current spec is available yet",
        )
    } else if desired == 0 {
        Verdict::new(
            AVAILABLE,
            Status::True,
            "ScaledToZero",
            "scaled to zero replicas",
        )
    } else if endpoints == 0 {
        Verdict::new(
            AVAILABLE,
            Status::False,
            "NoReadyEndpoints",
            "the Service has no ready endpoints",
        )
    } else {
        Verdict::new(
            AVAILABLE,
            Status::True,
            "ReplicasAvailable",
            format!("{desired} replicas of the current spec are available and serve the Service"),
        )
    };
    [available, progressing]
}

/// The next status for `generation`. `previous` supplies transition times.
pub fn next_status(
    previous: Option<&MicroserviceStatus>,
    outcome: &Outcome,
    desired_replicas: i32,
    generation: i64,
    now: &Time,
) -> MicroserviceStatus {
    let prev_conditions = previous
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let accepted_ok = Verdict::new(ACCEPTED, Status::True, "SpecValid", "the spec is valid");
    let (verdicts, managed, ready): (Vec<Verdict>, Option<ManagedResources>, Option<String>) =
        match outcome {
            Outcome::Applied {
                deployment,
                service,
                rollout,
                ready_endpoints,
            } => {
                let mut v = vec![
                    accepted_ok,
                    Verdict::new(
                        RECONCILED,
                        Status::True,
                        "ChildrenApplied",
                        "the Deployment and Service match the spec",
                    ),
                ];
                v.extend(applied_verdicts(
                    desired_replicas,
                    rollout,
                    *ready_endpoints,
                ));
                let managed = ManagedResources {
                    deployment: Some(deployment.clone()),
                    service: Some(service.clone()),
                };
                (
                    v,
                    Some(managed),
                    Some(format!("{}/{desired_replicas}", rollout.available)),
                )
            }
            Outcome::InvalidSpec(msg)
            | Outcome::OwnershipConflict(msg)
            | Outcome::Rejected(msg) => {
                let reason = match outcome {
                    Outcome::InvalidSpec(_) => "InvalidSpec",
                    Outcome::OwnershipConflict(_) => "OwnershipConflict",
                    _ => "Invalid",
                };
                let accepted = if reason == "InvalidSpec" {
                    Verdict::new(ACCEPTED, Status::False, "InvalidSpec", msg.clone())
                } else {
                    accepted_ok
                };
                let v = vec![
                    accepted,
                    Verdict::new(RECONCILED, Status::False, reason, msg.clone()),
                    Verdict::new(
                        AVAILABLE,
                        Status::False,
                        reason,
                        "not available at this generation: the spec could not be applied",
                    ),
                    Verdict::new(
                        PROGRESSING,
                        Status::False,
                        reason,
                        "no rollout while the error stands",
                    ),
                ];
                (v, None, None)
            }
            Outcome::ChildTerminating(msg) => {
                let v = vec![
                    accepted_ok,
                    Verdict::new(RECONCILED, Status::False, "ChildTerminating", msg.clone()),
                    Verdict::new(
                        AVAILABLE,
                        Status::False,
                        "ChildTerminating",
                        "a child is being deleted and will be created again",
                    ),
                    Verdict::new(
                        PROGRESSING,
                        Status::True,
                        "ChildTerminating",
                        "waiting for the deleted child to go",
                    ),
                ];
                (v, None, None)
            }
            Outcome::CachesStale(msg) => {
                let v = vec![
                    accepted_ok,
                    Verdict::new(RECONCILED, Status::False, CACHES_STALE, msg.clone()),
                    Verdict::new(AVAILABLE, Status::Unknown, CACHES_STALE, msg.clone()),
                    Verdict::new(PROGRESSING, Status::Unknown, CACHES_STALE, msg.clone()),
                ];
                (
                    v,
                    previous.and_then(|p| p.managed_resources.clone()),
                    previous.and_then(|p| p.ready.clone()),
                )
            }
            Outcome::ApiError(msg) => {
                // A failed read says nothing about the workload: what was
                // known at this generation stands, transition time and all.
                let mut v = vec![
                    accepted_ok,
                    Verdict::new(RECONCILED, Status::False, "ApiError", msg.clone()),
                ];
                for type_ in [AVAILABLE, PROGRESSING] {
                    let known = conditions::find(prev_conditions, type_)
                        .is_some_and(|c| c.observed_generation == Some(generation));
                    if !known {
                        v.push(Verdict::new(
                            type_,
                            Status::Unknown,
                            "ApiError",
                            "unknown until the children can be applied",
                        ));
                    }
                }
                (
                    v,
                    previous.and_then(|p| p.managed_resources.clone()),
                    previous.and_then(|p| p.ready.clone()),
                )
            }
        };
    let conditions = conditions::transition(prev_conditions, &verdicts, generation, now);
    MicroserviceStatus {
        phase: Some(conditions::phase(&conditions)),
        observed_generation: Some(generation),
        conditions,
        managed_resources: managed,
        ready,
    }
}

/// The reason of conditions concluded from caches whose watches fail.
pub const CACHES_STALE: &str = "CachesStale";

/// `Progressing`'s reason for a rollout past its deadline: the status API
/// reads it as a failure of the generation.
const DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";

/// Whether `next` differs from `current` only in what may wait: what
/// changes no verdict (the status API's entry state, `flotilla wait`,
/// `kubectl wait --for=condition=Available`). That is the replica counts,
/// the reason or message of `Available` or `Progressing` while its status
/// stays, and `Progressing` turning False for `RolloutComplete` while
/// `Available` stays False (the pods are up, the endpoints not yet). Such a
/// change is held for a few seconds; anything else (`Available` flipping,
/// a deadline exceeded, a new generation, `Reconciled` or `Accepted`
/// changing, the phase) is written at once.
pub fn coalescable(current: &MicroserviceStatus, next: &MicroserviceStatus) -> bool {
    if current.phase != next.phase
        || current.observed_generation != next.observed_generation
        || current.managed_resources != next.managed_resources
        || current.conditions.len() != next.conditions.len()
    {
        return false;
    }
    let unavailable = |s: &MicroserviceStatus| {
        conditions::find(&s.conditions, AVAILABLE).is_some_and(|c| c.status == "False")
    };
    let still_unavailable = unavailable(current) && unavailable(next);
    current.conditions.iter().all(|c| {
        conditions::find(&next.conditions, &c.type_).is_some_and(|n| {
            let same_status =
                n.status == c.status && n.observed_generation == c.observed_generation;
            // A new reason moves the transition time (conditions.rs).
            let unchanged = same_status
                && n.reason == c.reason
                && n.message == c.message
                && n.last_transition_time == c.last_transition_time;
            // A deadline exceeded, or its end, is a verdict (FAILED for the
            // status API), whatever the status: never held.
            let verdict_moves = n.reason != c.reason
                && (n.reason == DEADLINE_EXCEEDED || c.reason == DEADLINE_EXCEEDED);
            if verdict_moves {
                return false;
            }
            let words_may_wait = c.type_ == AVAILABLE || c.type_ == PROGRESSING;
            let settled_unseen = c.type_ == PROGRESSING
                && n.reason == "RolloutComplete"
                && n.observed_generation == c.observed_generation
                && still_unavailable;
            unchanged || (same_status && words_may_wait) || settled_unseen
        })
    })
}

/// Whether `next` is the first report of its generation and says only that
/// the rollout is under way, nothing wrong: the status API, the fleet DNS
/// and the rollout planner all key on `observedGeneration`, and read "not
/// yet observed" exactly as they read "observed, rolling out" (Progressing,
/// not Available). So it may wait, and children that become Available
/// within the window cost one status write, not two. An error, a rejected
/// or invalid spec, a deadline, `Available=True` or anything else not
/// named here is written at once.
pub fn first_report_may_wait(
    current: Option<&MicroserviceStatus>,
    next: &MicroserviceStatus,
) -> bool {
    let first = current.is_none_or(|c| c.observed_generation < next.observed_generation);
    let is = |type_: &str, status: &str, reasons: &[&str]| {
        conditions::find(&next.conditions, type_)
            .is_some_and(|c| c.status == status && reasons.contains(&c.reason.as_str()))
    };
    first
        && next.conditions.len() == 4
        && is(ACCEPTED, "True", &["SpecValid"])
        && is(RECONCILED, "True", &["ChildrenApplied"])
        && is(
            AVAILABLE,
            "False",
            &["RolloutInProgress", "NoReadyEndpoints"],
        )
        && (is(PROGRESSING, "True", &["RolloutInProgress"])
            || is(PROGRESSING, "False", &["RolloutComplete"]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::Phase;
    use crate::domain::conditions::{find, is_true};

    fn now() -> Time {
        Time("2026-01-01T00:00:00Z".parse().unwrap())
    }

    fn applied(r: RolloutFacts, endpoints: usize) -> Outcome {
        Outcome::Applied {
            deployment: "api".into(),
            service: "api".into(),
            rollout: r,
            ready_endpoints: endpoints,
        }
    }

    fn complete(n: i32) -> RolloutFacts {
        RolloutFacts {
            observed_current: true,
            replicas: n,
            updated: n,
            ready: n,
            available: n,
            deadline_exceeded: false,
        }
    }

    fn deployment(generation: i64, observed: i64, progressing: Option<&str>) -> Deployment {
        use k8s_openapi::api::apps::v1::{DeploymentCondition, DeploymentStatus};
        Deployment {
            metadata: kube::api::ObjectMeta {
                generation: Some(generation),
                ..Default::default()
            },
            status: Some(DeploymentStatus {
                observed_generation: Some(observed),
                replicas: Some(2),
                updated_replicas: Some(1),
                ready_replicas: Some(1),
                available_replicas: Some(1),
                conditions: progressing.map(|reason| {
                    vec![DeploymentCondition {
                        type_: "Progressing".into(),
                        status: if reason == "ProgressDeadlineExceeded" {
                            "False".into()
                        } else {
                            "True".into()
                        },
                        reason: Some(reason.into()),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn rollout_facts_count_only_what_the_deployment_controller_has_observed() {
        let current = RolloutFacts::of(&deployment(3, 3, Some("ReplicaSetUpdated")));
        assert_eq!(
            current,
            RolloutFacts {
                observed_current: true,
                replicas: 2,
                updated: 1,
                ready: 1,
                available: 1,
                deadline_exceeded: false,
            }
        );
        // The controller has not seen generation 3 yet.
        assert!(!RolloutFacts::of(&deployment(3, 2, None)).observed_current);
        // A deadline counts at the observed generation only: an older
        // spec's deadline is about to be replaced.
        assert!(
            RolloutFacts::of(&deployment(3, 3, Some("ProgressDeadlineExceeded"))).deadline_exceeded
        );
        assert!(
            !RolloutFacts::of(&deployment(3, 2, Some("ProgressDeadlineExceeded")))
                .deadline_exceeded
        );
        // No status yet: nothing observed, nothing counted.
        let mut fresh = deployment(1, 0, None);
        fresh.status = None;
        assert_eq!(RolloutFacts::of(&fresh), RolloutFacts::default());
    }

    #[test]
    fn applied_is_not_available_until_the_rollout_completes() {
        let s = next_status(None, &applied(RolloutFacts::default(), 0), 2, 1, &now());
        assert!(is_true(&s.conditions, RECONCILED));
        assert!(!is_true(&s.conditions, AVAILABLE));
        assert!(is_true(&s.conditions, PROGRESSING));
        assert_eq!(s.phase, Some(Phase::ResourcesApplied));
        assert_eq!(s.ready.as_deref(), Some("0/2"));
    }

    #[test]
    fn complete_rollout_with_endpoints_is_available() {
        let s = next_status(None, &applied(complete(2), 2), 2, 4, &now());
        assert!(is_true(&s.conditions, AVAILABLE));
        assert_eq!(
            find(&s.conditions, PROGRESSING).unwrap().reason,
            "RolloutComplete"
        );
        assert_eq!(s.phase, Some(Phase::Available));
        assert_eq!(s.observed_generation, Some(4));
        assert!(
            s.conditions
                .iter()
                .all(|c| c.observed_generation == Some(4))
        );
        assert_eq!(s.ready.as_deref(), Some("2/2"));
    }

    #[test]
    fn no_ready_endpoints_means_not_available() {
        let s = next_status(None, &applied(complete(2), 0), 2, 1, &now());
        assert_eq!(
            find(&s.conditions, AVAILABLE).unwrap().reason,
            "NoReadyEndpoints"
        );
    }

    #[test]
    fn stale_deployment_status_is_not_trusted() {
        let mut r = complete(2);
        r.observed_current = false;
        let s = next_status(None, &applied(r, 2), 2, 2, &now());
        assert!(!is_true(&s.conditions, AVAILABLE));
    }

    #[test]
    fn old_pods_still_present_means_rollout_in_progress() {
        let mut r = complete(2);
        r.replicas = 3;
        let s = next_status(None, &applied(r, 2), 2, 2, &now());
        assert_eq!(
            find(&s.conditions, AVAILABLE).unwrap().reason,
            "RolloutInProgress"
        );
    }

    #[test]
    fn scaled_to_zero_is_available() {
        let s = next_status(None, &applied(complete(0), 0), 0, 1, &now());
        assert_eq!(
            find(&s.conditions, AVAILABLE).unwrap().reason,
            "ScaledToZero"
        );
    }

    #[test]
    fn permanent_errors_fail_and_clear_managed_resources() {
        let ok = next_status(None, &applied(complete(2), 2), 2, 1, &now());
        for outcome in [
            Outcome::InvalidSpec("bad".into()),
            Outcome::OwnershipConflict("stranger".into()),
        ] {
            let s = next_status(Some(&ok), &outcome, 2, 2, &now());
            assert_eq!(s.phase, Some(Phase::Failed));
            assert_eq!(s.managed_resources, None);
            assert!(
                !is_true(&s.conditions, AVAILABLE),
                "an error is never reported as available"
            );
        }
    }

    #[test]
    fn api_error_is_unknown_not_success() {
        let ok = next_status(None, &applied(complete(2), 2), 2, 1, &now());
        let s = next_status(
            Some(&ok),
            &Outcome::ApiError("forbidden".into()),
            2,
            2,
            &now(),
        );
        assert_eq!(find(&s.conditions, AVAILABLE).unwrap().status, "Unknown");
        assert_eq!(find(&s.conditions, RECONCILED).unwrap().status, "False");
        assert_eq!(s.phase, Some(Phase::Accepted));
        assert_eq!(s.managed_resources, ok.managed_resources);
    }

    #[test]
    fn a_transient_error_keeps_what_was_known_at_this_generation() {
        let ok = next_status(None, &applied(complete(2), 2), 2, 3, &now());
        let later = Time("2026-01-01T00:05:00Z".parse().unwrap());
        let s = next_status(
            Some(&ok),
            &Outcome::ApiError("connection refused".into()),
            2,
            3,
            &later,
        );
        let (before, after) = (
            find(&ok.conditions, AVAILABLE).unwrap(),
            find(&s.conditions, AVAILABLE).unwrap(),
        );
        assert_eq!(after, before, "Available and its transition time stand");
        assert_eq!(
            find(&s.conditions, PROGRESSING),
            find(&ok.conditions, PROGRESSING)
        );
        let reconciled = find(&s.conditions, RECONCILED).unwrap();
        assert_eq!(
            (reconciled.status.as_str(), reconciled.reason.as_str()),
            ("False", "ApiError")
        );
        assert_eq!(reconciled.message, "connection refused");
        // Back to normal: Available never moved.
        let back = next_status(Some(&s), &applied(complete(2), 2), 2, 3, &later);
        assert_eq!(find(&back.conditions, AVAILABLE).unwrap(), before);
    }

    #[test]
    fn a_rejected_child_is_a_permanent_failure_and_a_terminating_one_is_not_in_sync() {
        let ok = next_status(None, &applied(complete(2), 2), 2, 1, &now());
        let s = next_status(
            Some(&ok),
            &Outcome::Rejected("spec.selector: field is immutable".into()),
            2,
            1,
            &now(),
        );
        let r = find(&s.conditions, RECONCILED).unwrap();
        assert_eq!((r.status.as_str(), r.reason.as_str()), ("False", "Invalid"));
        assert!(r.message.contains("spec.selector"));
        assert_eq!(s.phase, Some(Phase::Failed));
        let t = next_status(
            Some(&ok),
            &Outcome::ChildTerminating("Deployment api is being deleted".into()),
            2,
            1,
            &now(),
        );
        assert!(!is_true(&t.conditions, AVAILABLE));
        assert_ne!(t.phase, Some(Phase::Failed));
    }

    #[test]
    fn same_conclusion_gives_equal_status() {
        let a = next_status(None, &applied(complete(2), 2), 2, 1, &now());
        let later = Time("2026-01-01T01:00:00Z".parse().unwrap());
        let b = next_status(Some(&a), &applied(complete(2), 2), 2, 1, &later);
        assert_eq!(a, b, "nothing changed, so nothing to write");
    }

    #[test]
    fn stale_caches_make_availability_unknown_at_once() {
        let ok = next_status(None, &applied(complete(2), 2), 2, 1, &now());
        let stale = next_status(
            Some(&ok),
            &Outcome::CachesStale("EndpointSlices for 12s".into()),
            2,
            1,
            &now(),
        );
        let a = find(&stale.conditions, AVAILABLE).unwrap();
        assert_eq!(
            (a.status.as_str(), a.reason.as_str()),
            ("Unknown", "CachesStale")
        );
        assert!(
            !coalescable(&ok, &stale),
            "a flip of Available is never held"
        );
        assert_eq!(stale.ready, ok.ready, "the last counts stand");
    }

    #[test]
    fn deadline_exceeded_is_reported() {
        let mut r = complete(2);
        r.available = 0;
        r.deadline_exceeded = true;
        let s = next_status(None, &applied(r, 0), 2, 1, &now());
        assert_eq!(
            find(&s.conditions, PROGRESSING).unwrap().reason,
            "ProgressDeadlineExceeded"
        );
    }

    #[test]
    fn counts_and_the_wording_of_a_standing_state_may_wait_a_flip_may_not() {
        let later = Time("2026-01-01T00:00:07Z".parse().unwrap());
        let mut half = complete(2);
        half.available = 1;
        half.ready = 1;
        let starting = next_status(None, &applied(RolloutFacts::default(), 0), 2, 1, &now());
        // Only the counts move: the same conditions, word for word.
        let halfway = next_status(Some(&starting), &applied(half.clone(), 1), 2, 1, &later);
        assert_ne!(starting.ready, halfway.ready);
        assert_eq!(starting.conditions, halfway.conditions);
        assert!(coalescable(&starting, &halfway));
        // Rolled out but no endpoint yet: Available stays False, for
        // another reason.
        let no_endpoints = next_status(Some(&halfway), &applied(complete(2), 0), 2, 1, &later);
        assert_eq!(
            find(&no_endpoints.conditions, AVAILABLE).unwrap().reason,
            "NoReadyEndpoints"
        );
        assert!(
            coalescable(&halfway, &no_endpoints),
            "pods up, endpoints not yet: no verdict moved"
        );
        let mut stuck = complete(2);
        stuck.available = 0;
        stuck.deadline_exceeded = true;
        let exceeded = next_status(Some(&halfway), &applied(stuck, 0), 2, 1, &later);
        assert!(!coalescable(&halfway, &exceeded), "a deadline is a verdict");
        // Its end is one too: the pods came up, the endpoints lag.
        let recovered = next_status(Some(&exceeded), &applied(complete(2), 0), 2, 1, &later);
        assert_eq!(
            find(&recovered.conditions, PROGRESSING).unwrap().reason,
            "RolloutComplete"
        );
        assert!(
            !coalescable(&exceeded, &recovered),
            "the end of a deadline is a verdict"
        );
        // The reason of a standing False may wait.
        let mut reworded = no_endpoints.clone();
        for c in reworded
            .conditions
            .iter_mut()
            .filter(|c| c.type_ == AVAILABLE)
        {
            c.reason = "RolloutInProgress".into();
        }
        assert!(coalescable(&reworded, &no_endpoints));
        // Available turning True, a new generation, an error: at once.
        let available = next_status(Some(&no_endpoints), &applied(complete(2), 2), 2, 1, &later);
        assert!(!coalescable(&no_endpoints, &available));
        let next_generation = next_status(Some(&available), &applied(complete(2), 2), 2, 2, &later);
        assert!(!coalescable(&available, &next_generation));
        let failed = next_status(
            Some(&available),
            &Outcome::ApiError("boom".into()),
            2,
            1,
            &later,
        );
        assert!(!coalescable(&available, &failed));
        assert!(coalescable(&available, &available));
    }

    #[test]
    fn the_first_report_of_a_generation_may_wait_while_it_says_only_under_way() {
        let later = Time("2026-01-01T00:00:03Z".parse().unwrap());
        let starting = next_status(None, &applied(RolloutFacts::default(), 0), 2, 1, &now());
        assert!(first_report_may_wait(None, &starting), "new, rolling out");
        // Pods up, endpoints not yet: still only under way.
        let no_endpoints = next_status(None, &applied(complete(2), 0), 2, 1, &now());
        assert!(first_report_may_wait(None, &no_endpoints));
        // Available at once: the verdict is written at once.
        let available = next_status(None, &applied(complete(2), 2), 2, 1, &now());
        assert!(!first_report_may_wait(None, &available));
        // A new generation of a Microservice that was Available.
        let next_generation = next_status(
            Some(&available),
            &applied(RolloutFacts::default(), 0),
            2,
            2,
            &later,
        );
        assert!(first_report_may_wait(Some(&available), &next_generation));
        // Once a generation has been reported, only `coalescable` may hold.
        assert!(!first_report_may_wait(Some(&starting), &no_endpoints));
        // Anything wrong is written at once.
        let stuck = RolloutFacts {
            observed_current: true,
            deadline_exceeded: true,
            ..Default::default()
        };
        let exceeded = next_status(None, &applied(stuck, 0), 2, 1, &now());
        assert!(!first_report_may_wait(None, &exceeded), "a deadline");
        for outcome in [
            Outcome::InvalidSpec("bad".into()),
            Outcome::OwnershipConflict("theirs".into()),
            Outcome::Rejected("422".into()),
            Outcome::ApiError("boom".into()),
            Outcome::ChildTerminating("going".into()),
            Outcome::CachesStale("12s".into()),
        ] {
            let s = next_status(None, &outcome, 2, 1, &now());
            assert!(!first_report_may_wait(None, &s), "{outcome:?}");
        }
        // A status with a condition of another concern (the registry's) is
        // not judged here.
        let mut registered = starting.clone();
        registered.conditions.push(registered.conditions[0].clone());
        registered.conditions[4].type_ = conditions::REGISTERED.into();
        assert!(!first_report_may_wait(None, &registered));
    }
}
