//! Condition transitions. `lastTransitionTime` moves only when a condition's
//! status or reason changes (or it appears); message and observedGeneration
//! follow every conclusion.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::crd::Phase;

pub const ACCEPTED: &str = "Accepted";
pub const RECONCILED: &str = "Reconciled";
pub const AVAILABLE: &str = "Available";
pub const PROGRESSING: &str = "Progressing";
/// A deletion waits on something outside the cluster (the registry).
pub const CLEANUP_BLOCKED: &str = "CleanupBlocked";
/// Whether the service registry holds the Microservice's records.
pub const REGISTERED: &str = "Registered";

/// The order conditions are written in, so that equal states serialize equally.
const ORDER: [&str; 4] = [ACCEPTED, RECONCILED, AVAILABLE, PROGRESSING];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    True,
    False,
    Unknown,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }
}

/// A conclusion about one condition type, before timestamps are settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub type_: &'static str,
    pub status: Status,
    pub reason: &'static str,
    pub message: String,
}

impl Verdict {
    pub fn new(
        type_: &'static str,
        status: Status,
        reason: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Verdict {
            type_,
            status,
            reason,
            message: message.into(),
        }
    }
}

/// The conditions after applying `verdicts` for `generation` at `now`.
/// Condition types not named in the verdicts are kept unchanged.
pub fn transition(
    previous: &[Condition],
    verdicts: &[Verdict],
    generation: i64,
    now: &Time,
) -> Vec<Condition> {
    let mut next: Vec<Condition> = verdicts
        .iter()
        .map(|v| {
            let prior = previous.iter().find(|c| c.type_ == v.type_);
            let unchanged =
                prior.is_some_and(|c| c.status == v.status.as_str() && c.reason == v.reason);
            Condition {
                type_: v.type_.to_string(),
                status: v.status.as_str().to_string(),
                reason: v.reason.to_string(),
                message: v.message.clone(),
                observed_generation: Some(generation),
                last_transition_time: match prior {
                    Some(c) if unchanged => c.last_transition_time.clone(),
                    _ => now.clone(),
                },
            }
        })
        .collect();
    next.extend(
        previous
            .iter()
            .filter(|c| !verdicts.iter().any(|v| v.type_ == c.type_))
            .cloned(),
    );
    next.sort_by_key(|c| {
        ORDER
            .iter()
            .position(|t| *t == c.type_)
            .unwrap_or(ORDER.len())
    });
    next
}

pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

/// Reasons that no retry can fix; only a spec change (or a resync) looks again.
pub fn is_permanent_reason(reason: &str) -> bool {
    matches!(reason, "InvalidSpec" | "OwnershipConflict" | "Invalid")
}

/// The compatibility phase, derived from the conditions alone.
pub fn phase(conditions: &[Condition]) -> Phase {
    let reconciled = find(conditions, RECONCILED);
    if reconciled.is_some_and(|c| c.status == "False" && is_permanent_reason(&c.reason)) {
        Phase::Failed
    } else if is_true(conditions, AVAILABLE) {
        Phase::Available
    } else if reconciled.is_some_and(|c| c.status == "True") {
        Phase::ResourcesApplied
    } else {
        Phase::Accepted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Time {
        Time(s.parse().unwrap())
    }

    #[test]
    fn new_condition_gets_now() {
        let out = transition(
            &[],
            &[Verdict::new(ACCEPTED, Status::True, "SpecValid", "ok")],
            3,
            &t("2026-01-01T00:00:00Z"),
        );
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].last_transition_time, t("2026-01-01T00:00:00Z"));
        assert_eq!(out[0].observed_generation, Some(3));
    }

    #[test]
    fn same_status_and_reason_keeps_transition_time_but_updates_message_and_generation() {
        let before = transition(
            &[],
            &[Verdict::new(
                AVAILABLE,
                Status::False,
                "ReplicasUnavailable",
                "0/2",
            )],
            1,
            &t("2026-01-01T00:00:00Z"),
        );
        let after = transition(
            &before,
            &[Verdict::new(
                AVAILABLE,
                Status::False,
                "ReplicasUnavailable",
                "1/2",
            )],
            2,
            &t("2026-01-01T00:05:00Z"),
        );
        assert_eq!(after[0].last_transition_time, t("2026-01-01T00:00:00Z"));
        assert_eq!(after[0].message, "1/2");
        assert_eq!(after[0].observed_generation, Some(2));
    }

    #[test]
    fn status_or_reason_change_moves_transition_time() {
        let before = transition(
            &[],
            &[Verdict::new(
                AVAILABLE,
                Status::False,
                "ReplicasUnavailable",
                "",
            )],
            1,
            &t("2026-01-01T00:00:00Z"),
        );
        let status_changed = transition(
            &before,
            &[Verdict::new(
                AVAILABLE,
                Status::True,
                "ReplicasUnavailable",
                "",
            )],
            1,
            &t("2026-01-01T00:01:00Z"),
        );
        assert_eq!(
            status_changed[0].last_transition_time,
            t("2026-01-01T00:01:00Z")
        );
        let reason_changed = transition(
            &before,
            &[Verdict::new(
                AVAILABLE,
                Status::False,
                "NoReadyEndpoints",
                "",
            )],
            1,
            &t("2026-01-01T00:02:00Z"),
        );
        assert_eq!(
            reason_changed[0].last_transition_time,
            t("2026-01-01T00:02:00Z")
        );
    }

    #[test]
    fn order_is_stable_and_other_types_are_kept() {
        let now = t("2026-01-01T00:00:00Z");
        let prev = vec![Condition {
            type_: CLEANUP_BLOCKED.into(),
            status: "False".into(),
            reason: "NotDeleting".into(),
            message: String::new(),
            observed_generation: Some(1),
            last_transition_time: now.clone(),
        }];
        let out = transition(
            &prev,
            &[
                Verdict::new(PROGRESSING, Status::False, "RolloutComplete", ""),
                Verdict::new(ACCEPTED, Status::True, "SpecValid", ""),
            ],
            1,
            &now,
        );
        let types: Vec<_> = out.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, [ACCEPTED, PROGRESSING, CLEANUP_BLOCKED]);
    }

    #[test]
    fn phase_follows_conditions() {
        let now = t("2026-01-01T00:00:00Z");
        let make = |v: &[Verdict]| transition(&[], v, 1, &now);
        assert_eq!(phase(&[]), Phase::Accepted);
        assert_eq!(
            phase(&make(&[Verdict::new(
                RECONCILED,
                Status::True,
                "ChildrenApplied",
                ""
            )])),
            Phase::ResourcesApplied
        );
        assert_eq!(
            phase(&make(&[
                Verdict::new(RECONCILED, Status::True, "ChildrenApplied", ""),
                Verdict::new(AVAILABLE, Status::True, "ReplicasAvailable", ""),
            ])),
            Phase::Available
        );
        assert_eq!(
            phase(&make(&[Verdict::new(
                RECONCILED,
                Status::False,
                "OwnershipConflict",
                ""
            )])),
            Phase::Failed
        );
        assert_eq!(
            phase(&make(&[Verdict::new(
                RECONCILED,
                Status::False,
                "ApiError",
                ""
            )])),
            Phase::Accepted
        );
    }
}
