//! `FleetDnsDegraded` on a FleetMicroservice (#31): True while its
//! fleet-wide name lists every cluster only because none is healthy
//! (fail-open). Written by the DNS writer, conditioned on the object's
//! resourceVersion, so the rollout controller's own status writes (which
//! keep condition types they do not decide) never lose it, nor it theirs.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::domain::conditions::{Status, Verdict};

pub const FLEET_DNS_DEGRADED: &str = "FleetDnsDegraded";

/// The verdict to write, or `None` when the condition already says it.
/// Absent counts as False: a healthy name adds no condition, so a steady
/// fleet writes nothing.
pub fn change(
    previous: &[Condition],
    degraded: bool,
    name: &str,
    listed: usize,
) -> Option<Verdict> {
    let now_true = previous
        .iter()
        .any(|c| c.type_ == FLEET_DNS_DEGRADED && c.status == "True");
    if now_true == degraded {
        return None;
    }
    Some(if degraded {
        Verdict::new(
            FLEET_DNS_DEGRADED,
            Status::True,
            "NoHealthyCluster",
            format!("no cluster is healthy: {name} lists all {listed} (fail-open)"),
        )
    } else {
        Verdict::new(
            FLEET_DNS_DEGRADED,
            Status::False,
            "HealthyClustersListed",
            format!("{name} lists {listed} healthy cluster(s)"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(status: &str) -> Vec<Condition> {
        vec![Condition {
            type_: FLEET_DNS_DEGRADED.into(),
            status: status.into(),
            reason: "r".into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                jiff::Timestamp::UNIX_EPOCH,
            ),
        }]
    }

    #[test]
    fn written_only_when_it_changes_and_never_for_a_healthy_name_first() {
        assert_eq!(change(&[], false, "web.ns.z", 2), None);
        let v = change(&[], true, "web.ns.z", 3).unwrap();
        assert_eq!((v.status, v.reason), (Status::True, "NoHealthyCluster"));
        assert!(v.message.contains("all 3"), "{}", v.message);
        assert_eq!(change(&cond("True"), true, "web.ns.z", 3), None);
        let v = change(&cond("True"), false, "web.ns.z", 1).unwrap();
        assert_eq!(v.status, Status::False);
        assert_eq!(change(&cond("False"), false, "web.ns.z", 1), None);
    }
}
