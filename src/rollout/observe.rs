//! What the planner sees, read from the status index: every registered
//! cluster's labels and reachability, and this FleetMicroservice's member
//! object in each. Pure.

use std::collections::{BTreeMap, BTreeSet};

use super::plan::{Cluster, Member};
use super::spec::{FLEET_LABEL, FleetMicroserviceStatus};
use crate::status::index::MicroserviceView;
use crate::status::view::ClusterInfo;

/// Labels that cannot be read are unknown, not empty: an empty set would
/// move the cluster out of every placement and delete its objects.
pub fn clusters(
    registered: &BTreeMap<String, ClusterInfo>,
    view: Option<&MicroserviceView>,
    owner: &str,
) -> Vec<Cluster> {
    let entries: BTreeMap<&str, _> = view
        .map(|v| v.entries.iter().map(|e| (e.cluster.as_str(), e)).collect())
        .unwrap_or_default();
    registered
        .iter()
        .map(|(name, info)| {
            let entry = entries.get(name.as_str()).copied();
            let member = entry.map(|e| {
                let ours = e.facts.labels.get(FLEET_LABEL).map(String::as_str) == Some(owner);
                Member {
                    ours,
                    revision: e.facts.fleet_revision.clone().filter(|_| ours),
                    digest: e.facts.spec_digest,
                    generation: e.facts.generation,
                    state: e.state,
                    reason: e.reason.clone(),
                    message: e.message.clone(),
                }
            });
            Cluster {
                name: name.clone(),
                labels: info
                    .labels_error
                    .is_none()
                    .then(|| info.labels.clone())
                    .filter(|l| !l.is_empty()),
                // The wait's rule too: where absence is not known, the
                // cluster counts as unreachable.
                reachable: info.absence_is_known(),
                synced: info.synced,
                member,
            }
        })
        .collect()
}

/// Deleting a FleetMicroservice: where its member objects are to be
/// deleted now, and which clusters hold the deletion up.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Cleanup {
    /// Registered and answering: read live, and deleted if ours is there.
    pub delete: Vec<String>,
    /// May hold an object of ours, but not answering or not registered.
    pub blocked: Vec<String>,
}

/// Which clusters to clean, from the durable record in the status (every
/// cluster the object reached, and any written in the last round) and from
/// the index (any seen holding ours), never from the index alone: it can
/// lag a create. A cluster the object never reached holds nothing up, even
/// one that is unreachable or Invalid (review H5).
pub fn cleanup(clusters: &[Cluster], status: &FleetMicroserviceStatus) -> Cleanup {
    let mut may_hold: BTreeSet<&str> = status.reached_clusters.iter().map(String::as_str).collect();
    may_hold.extend(
        status
            .clusters
            .iter()
            .filter(|c| c.revision.is_some() || c.target.is_some())
            .map(|c| c.name.as_str()),
    );
    may_hold.extend(
        clusters
            .iter()
            .filter(|c| c.member.as_ref().is_some_and(|m| m.ours))
            .map(|c| c.name.as_str()),
    );
    let mut out = Cleanup::default();
    for name in may_hold {
        match clusters.iter().find(|c| c.name == name) {
            Some(c) if c.reachable => out.delete.push(name.to_string()),
            Some(_) => out.blocked.push(name.to_string()),
            None => out.blocked.push(format!("{name} (not registered)")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::view::{EntryState, Facts, Reach};

    fn info(reach: Reach, labels: &[(&str, &str)]) -> ClusterInfo {
        ClusterInfo {
            reach,
            synced: true,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..ClusterInfo::new("file x")
        }
    }

    fn view(entries: &[(&str, Option<&str>)]) -> MicroserviceView {
        MicroserviceView {
            namespace: "ns".into(),
            name: "api".into(),
            entries: entries
                .iter()
                .map(|(cluster, owner)| {
                    let facts = Facts {
                        labels: owner
                            .map(|o| BTreeMap::from([(FLEET_LABEL.to_string(), o.to_string())]))
                            .unwrap_or_default(),
                        fleet_revision: Some("api-1".into()),
                        ..Default::default()
                    };
                    crate::status::view::entry(
                        cluster,
                        &facts,
                        None,
                        Some(&info(Reach::Reachable, &[])),
                    )
                })
                .collect(),
            aggregate: Default::default(),
            revision: 1,
        }
    }

    #[test]
    fn members_are_ours_only_by_label_and_unreadable_labels_are_unknown() {
        let mut registered = BTreeMap::new();
        registered.insert(
            "m1".to_string(),
            info(Reach::Reachable, &[("ring", "canary")]),
        );
        let mut broken = info(Reach::Reachable, &[("ring", "main")]);
        broken.labels_error = Some("labels file m2.labels: not a YAML map".into());
        registered.insert("m2".to_string(), broken);
        registered.insert("m3".to_string(), info(Reach::Unreachable, &[("a", "b")]));
        let v = view(&[("m1", Some("api")), ("m2", None), ("m3", Some("other"))]);
        let c = clusters(&registered, Some(&v), "api");
        let m1 = c[0].member.as_ref().unwrap();
        assert!(m1.ours);
        assert_eq!(m1.revision.as_deref(), Some("api-1"));
        assert_eq!(m1.state, EntryState::Progressing);
        assert!(c[1].labels.is_none(), "unreadable labels are unknown");
        assert!(!c[1].member.as_ref().unwrap().ours);
        assert!(!c[2].reachable);
        assert!(
            !c[2].member.as_ref().unwrap().ours,
            "another fleet object's"
        );
        assert_eq!(c[2].member.as_ref().unwrap().revision, None);
    }

    #[test]
    fn cleanup_waits_for_clusters_that_may_hold_an_object() {
        let member = |ours| Member {
            ours,
            revision: None,
            digest: 0,
            generation: 1,
            state: EntryState::Done,
            reason: String::new(),
            message: String::new(),
        };
        let c = |name: &str, reachable, synced, m: Option<Member>| Cluster {
            name: name.into(),
            labels: None,
            reachable,
            synced,
            member: m,
        };
        let status = FleetMicroserviceStatus {
            reached_clusters: vec!["up".into(), "down".into(), "gone".into(), "lagging".into()],
            ..Default::default()
        };
        let out = cleanup(
            &[
                c("up", true, true, Some(member(true))),
                c("foreign", true, true, Some(member(false))),
                c("down", false, true, Some(member(true))),
                // Reached, but the index shows nothing yet: read live.
                c("lagging", true, true, None),
                // Never reached: it holds nothing up, down or Invalid.
                c("never-listed", false, false, None),
                c("down-empty", false, true, None),
            ],
            &status,
        );
        assert_eq!(out.delete, vec!["lagging", "up"]);
        assert_eq!(out.blocked, vec!["down", "gone (not registered)"]);
    }
}
