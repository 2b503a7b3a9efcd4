//! The status's size bound (#59): whatever the members and checks say, a
//! FleetMicroservice's status stays far below the apiserver's object
//! limit (etcd's 1.5 MiB, spec included). Each message is clipped; past
//! the whole bound, the per-cluster messages go first (each cluster keeps
//! its state and reason, which the planner reads).

use crate::rollout::spec::FleetMicroserviceStatus;

/// The most characters one message keeps.
pub const MESSAGE_CHARS: usize = 512;
/// The most bytes the serialized status may take before cluster messages go.
pub const STATUS_BYTES: usize = 512 * 1024;

fn clip(s: &mut String) {
    if let Some((at, _)) = s.char_indices().nth(MESSAGE_CHARS) {
        s.truncate(at);
        s.push('…');
    }
}

fn size(st: &FleetMicroserviceStatus) -> usize {
    serde_json::to_vec(st).map_or(usize::MAX, |v| v.len())
}

/// `st`, bounded.
pub fn status(mut st: FleetMicroserviceStatus) -> FleetMicroserviceStatus {
    for c in &mut st.clusters {
        clip(&mut c.message);
    }
    for c in &mut st.conditions {
        clip(&mut c.message);
    }
    for w in &mut st.waves {
        for a in &mut w.analysis {
            clip(&mut a.answer);
        }
    }
    if size(&st) > STATUS_BYTES {
        for c in &mut st.clusters {
            c.message.clear();
        }
    }
    st
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::spec::{ClusterState, ClusterStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn cluster(i: usize, message: String) -> ClusterStatus {
        ClusterStatus {
            name: format!("member-{i}"),
            revision: Some("api-0123456789abcdef".into()),
            target: Some("api-0123456789abcdef".into()),
            state: ClusterState::Failed,
            reason: "ImagePullBackOff".into(),
            message,
            since: Time("2026-12-07T00:00:00Z".parse().unwrap()),
            targeted: None,
        }
    }

    #[test]
    fn messages_are_clipped_and_a_huge_status_keeps_every_cluster_and_reason() {
        let long = "é".repeat(10_000);
        let one = status(FleetMicroserviceStatus {
            clusters: vec![cluster(0, long.clone())],
            ..Default::default()
        });
        assert_eq!(one.clusters[0].message.chars().count(), MESSAGE_CHARS + 1);
        let huge = status(FleetMicroserviceStatus {
            clusters: (0..3000).map(|i| cluster(i, long.clone())).collect(),
            ..Default::default()
        });
        assert!(size(&huge) <= STATUS_BYTES, "{}", size(&huge));
        assert_eq!(huge.clusters.len(), 3000);
        assert!(huge.clusters.iter().all(|c| c.reason == "ImagePullBackOff"));
        let short = cluster(1, "pulling".into());
        let kept = status(FleetMicroserviceStatus {
            clusters: vec![short.clone()],
            ..Default::default()
        });
        assert_eq!(kept.clusters[0], short);
    }
}
