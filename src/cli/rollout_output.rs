//! What `flotilla rollout` prints, and how `rollout wait` judges a
//! rollout. Pure.

use serde_json::{Value, json};

use super::output::{named, table};
use super::remote::exit;
use crate::api::pb;

fn revision(r: &Option<pb::RevisionRef>) -> String {
    match r {
        Some(r) if r.number > 0 => format!("{} ({})", r.number, r.name),
        Some(r) => r.name.clone(),
        None => "-".into(),
    }
}

fn time(t: &Option<prost_types::Timestamp>) -> String {
    t.as_ref()
        .and_then(|t| jiff::Timestamp::new(t.seconds, 0).ok())
        .map_or("-".into(), |t| t.strftime("%H:%M:%S").to_string())
}

fn or_dash(s: &str) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s.to_string()
    }
}

#[allow(deprecated)]
pub fn phase(r: &pb::Rollout) -> String {
    let p = pb::RolloutPhase::try_from(r.rollout_phase).ok();
    named(p.map(|p| p.as_str_name()), "ROLLOUT_PHASE_", &r.phase)
}

#[allow(deprecated)]
fn wave_state(w: &pb::Wave) -> String {
    let s = pb::WaveState::try_from(w.wave_state).ok();
    named(s.map(|s| s.as_str_name()), "WAVE_STATE_", &w.state)
}

#[allow(deprecated)]
fn check_state(c: &pb::AnalysisCheck) -> String {
    let s = pb::AnalysisCheckState::try_from(c.check_state).ok();
    named(
        s.map(|s| s.as_str_name()),
        "ANALYSIS_CHECK_STATE_",
        &c.state,
    )
}

#[allow(deprecated)]
fn cluster_state(c: &pb::ClusterRollout) -> String {
    let s = pb::ClusterRolloutState::try_from(c.cluster_state).ok();
    named(
        s.map(|s| s.as_str_name()),
        "CLUSTER_ROLLOUT_STATE_",
        &c.state,
    )
}

/// "updated" and "available" as "2/3", from the counts, or the deprecated
/// text from a server that sets no counts.
#[allow(deprecated)]
fn counts(r: &pb::Rollout) -> (String, String) {
    if r.clusters_placed == 0 && r.rollout_phase == 0 {
        return (r.updated.clone(), r.available.clone());
    }
    let of = |n: u32| format!("{n}/{}", r.clusters_placed);
    (of(r.clusters_updated), of(r.clusters_available))
}

/// The verdict on the spec as it is now: `None` while it is still rolling
/// out (or not yet planned for the current generation).
pub fn verdict(r: &pb::Rollout) -> Option<u8> {
    if r.observed_generation != r.generation {
        return None;
    }
    match phase(r).as_str() {
        "Complete" => Some(exit::DONE),
        "RolledBack" | "Failed" | "Degraded" => Some(exit::FAILED),
        _ => None,
    }
}

pub fn status_text(r: &pb::Rollout) -> String {
    let (updated, available) = counts(r);
    let mut out = format!(
        "{}/{}  phase {}{}  revision {}  updated {}  available {}\n",
        r.namespace,
        r.name,
        or_dash(&phase(r)),
        if r.wave.is_empty() {
            String::new()
        } else {
            format!(" (wave {})", r.wave)
        },
        revision(&r.update_revision),
        or_dash(&updated),
        or_dash(&available),
    );
    out.push_str(&format!(
        "image {}  last good {}{}{}\n",
        r.image,
        revision(&r.last_good_revision),
        if r.paused { "  PAUSED" } else { "" },
        if r.observed_generation == r.generation {
            ""
        } else {
            "  (not yet planned for this generation)"
        },
    ));
    for c in &r.conditions {
        out.push_str(&format!(
            "  {}={} {}: {}\n",
            c.r#type, c.status, c.reason, c.message
        ));
    }
    let waves: Vec<Vec<String>> = r
        .waves
        .iter()
        .map(|w| {
            vec![
                w.name.clone(),
                wave_state(w),
                w.clusters.join(","),
                time(&w.started),
                time(&w.finished),
                approval(w),
            ]
        })
        .collect();
    out.push('\n');
    out.push_str(&table(
        &[
            "WAVE", "STATE", "CLUSTERS", "STARTED", "FINISHED", "APPROVAL",
        ],
        &waves,
    ));
    let clusters: Vec<Vec<String>> = r
        .clusters
        .iter()
        .map(|c| {
            vec![
                c.cluster.clone(),
                cluster_state(c),
                or_dash(&c.revision),
                or_dash(&c.target),
                or_dash(&c.reason),
                time(&c.since),
            ]
        })
        .collect();
    out.push('\n');
    out.push_str(&table(
        &["CLUSTER", "STATE", "REVISION", "TARGET", "REASON", "SINCE"],
        &clusters,
    ));
    let checks: Vec<Vec<String>> = r
        .waves
        .iter()
        .flat_map(|w| {
            w.analysis.iter().map(|c| {
                let failures = c.failures.to_string();
                vec![
                    w.name.clone(),
                    c.name.clone(),
                    check_state(c),
                    failures,
                    or_dash(&c.answer),
                ]
            })
        })
        .collect();
    if !checks.is_empty() {
        out.push('\n');
        out.push_str(&table(
            &["WAVE", "CHECK", "STATE", "FAILURES", "LAST ANSWER"],
            &checks,
        ));
    }
    if r.placement.is_some() {
        out.push('\n');
        out.push_str(&placement_text(r));
    }
    out
}

/// A wave's gate as the table shows it: `-` for a wave that starts on its
/// own, `manual` until approved, then who approved.
fn approval(w: &pb::Wave) -> String {
    match (&w.approval, w.manual) {
        (Some(a), _) => format!("by {} at {}", a.by, time(&a.at)),
        (None, true) => "manual".into(),
        (None, false) => "-".into(),
    }
}

/// `flotilla placement`: each cluster's place and why, then the moves.
pub fn placement_text(r: &pb::Rollout) -> String {
    let Some(p) = &r.placement else {
        return format!(
            "{}/{}: no numberOfClusters; every selected cluster runs it\n",
            r.namespace, r.name
        );
    };
    let mut out = format!(
        "{}/{}: {} of the selected clusters{}\n",
        r.namespace,
        r.name,
        p.number_of_clusters,
        match &p.last_failover {
            Some(_) => format!("; last move {}", time(&p.last_failover)),
            None => String::new(),
        }
    );
    let rows: Vec<Vec<String>> = p
        .clusters
        .iter()
        .map(|c| {
            let timer = match (&c.unreachable_since, &c.unavailable_since) {
                (Some(_), _) => format!("unreachable since {}", time(&c.unreachable_since)),
                (None, Some(_)) => format!("unavailable since {}", time(&c.unavailable_since)),
                (None, None) if !c.replaced_by.is_empty() => {
                    format!("replaced by {}", c.replaced_by)
                }
                (None, None) => "-".into(),
            };
            vec![
                c.cluster.clone(),
                c.role.clone(),
                c.reason.clone(),
                time(&c.since),
                timer,
                or_dash(&c.message),
            ]
        })
        .collect();
    out.push_str(&table(
        &["CLUSTER", "ROLE", "REASON", "SINCE", "HEALTH", "WHY"],
        &rows,
    ));
    if !p.history.is_empty() {
        let moves: Vec<Vec<String>> = p
            .history
            .iter()
            .map(|h| {
                vec![
                    time(&h.time),
                    h.reason.clone(),
                    h.from.clone(),
                    h.to.clone(),
                    h.message.clone(),
                ]
            })
            .collect();
        out.push('\n');
        out.push_str(&table(&["MOVED", "WHY", "FROM", "TO", "DETAIL"], &moves));
    }
    out
}

pub fn history_text(r: &pb::Rollout) -> String {
    let current = r.update_revision.as_ref().map(|u| u.name.clone());
    let good = r.last_good_revision.as_ref().map(|u| u.name.clone());
    let rows: Vec<Vec<String>> = r
        .history
        .iter()
        .map(|h| {
            let mut marks = Vec::new();
            if Some(&h.name) == current.as_ref() {
                marks.push("update");
            }
            if Some(&h.name) == good.as_ref() {
                marks.push("last good");
            }
            vec![
                h.number.to_string(),
                h.name.clone(),
                h.image.clone(),
                h.replicas.to_string(),
                h.overrides.to_string(),
                marks.join(", "),
            ]
        })
        .collect();
    table(
        &["REVISION", "NAME", "IMAGE", "REPLICAS", "OVERRIDES", ""],
        &rows,
    )
}

/// One line per change while `rollout wait` runs.
pub fn progress_line(r: &pb::Rollout) -> String {
    let clusters: Vec<String> = r
        .clusters
        .iter()
        .map(|c| format!("{}={}", c.cluster, cluster_state(c)))
        .collect();
    let (updated, available) = counts(r);
    format!(
        "{} {}: {} wave {} updated {} available {} [{}]",
        r.namespace,
        r.name,
        or_dash(&phase(r)),
        or_dash(&r.wave),
        or_dash(&updated),
        or_dash(&available),
        clusters.join(" ")
    )
}

pub fn json(r: &pb::Rollout) -> Value {
    let (updated, available) = counts(r);
    json!({
        "namespace": r.namespace,
        "name": r.name,
        "generation": r.generation,
        "observedGeneration": r.observed_generation,
        "phase": phase(r),
        "wave": r.wave,
        "image": r.image,
        "paused": r.paused,
        "updateRevision": r.update_revision.as_ref().map(|x| json!({"name": x.name, "number": x.number})),
        "lastGoodRevision": r.last_good_revision.as_ref().map(|x| json!({"name": x.name, "number": x.number})),
        "updated": updated,
        "available": available,
        "waves": r.waves.iter().map(|w| json!({
            "name": w.name, "state": wave_state(w), "clusters": w.clusters, "manual": w.manual,
            "analysis": w.analysis.iter().map(|c| json!({"name": c.name, "state": check_state(c), "failures": c.failures, "answer": c.answer})).collect::<Vec<_>>(),
            "approval": w.approval.as_ref().map(|a| json!({"revision": a.revision, "by": a.by, "at": time(&a.at)})),
        })).collect::<Vec<_>>(),
        "clusters": r.clusters.iter().map(|c| json!({
            "cluster": c.cluster, "state": cluster_state(c), "revision": c.revision,
            "target": c.target, "reason": c.reason, "message": c.message,
        })).collect::<Vec<_>>(),
        "conditions": r.conditions.iter().map(|c| json!({
            "type": c.r#type, "status": c.status, "reason": c.reason, "message": c.message,
            "observedGeneration": c.observed_generation,
        })).collect::<Vec<_>>(),
        "history": r.history.iter().map(|h| json!({"number": h.number, "name": h.name, "image": h.image})).collect::<Vec<_>>(),
        "placement": r.placement.as_ref().map(|p| json!({
            "numberOfClusters": p.number_of_clusters,
            "clusters": p.clusters.iter().map(|c| json!({
                "cluster": c.cluster, "role": c.role, "reason": c.reason, "message": c.message,
                "replacedBy": c.replaced_by,
                "unreachable": c.unreachable_since.is_some(), "unavailable": c.unavailable_since.is_some(),
            })).collect::<Vec<_>>(),
            "history": p.history.iter().map(|h| json!({
                "reason": h.reason, "from": h.from, "to": h.to, "message": h.message,
                "time": h.time.as_ref().map(|t| t.seconds),
            })).collect::<Vec<_>>(),
        })),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rollout(phase: &str, generation: i64, observed: i64) -> pb::Rollout {
        let screaming: String = phase
            .chars()
            .enumerate()
            .flat_map(|(i, c)| {
                let gap = (i > 0 && c.is_ascii_uppercase()).then_some('_');
                gap.into_iter().chain([c.to_ascii_uppercase()])
            })
            .collect();
        let value = pb::RolloutPhase::from_str_name(&format!("ROLLOUT_PHASE_{screaming}"))
            .expect("a phase");
        pb::Rollout {
            namespace: "shop".into(),
            name: "api".into(),
            rollout_phase: value as i32,
            generation,
            observed_generation: observed,
            ..Default::default()
        }
    }

    #[test]
    fn enums_read_as_the_status_spells_them_and_an_older_servers_text_still_counts() {
        assert_eq!(phase(&rollout("RolledBack", 1, 1)), "RolledBack");
        assert_eq!(
            super::super::output::camel("WAVE_STATE_AWAITING_APPROVAL", "WAVE_STATE_"),
            "AwaitingApproval"
        );
        // One release older: no enum, no counts, only the text.
        #[allow(deprecated)]
        let old = pb::Rollout {
            phase: "Complete".into(),
            updated: "2/3".into(),
            available: "1/3".into(),
            generation: 4,
            observed_generation: 4,
            ..Default::default()
        };
        assert_eq!(verdict(&old), Some(exit::DONE));
        assert_eq!(counts(&old), ("2/3".to_string(), "1/3".to_string()));
        let mut new = rollout("Progressing", 4, 4);
        new.clusters_placed = 3;
        new.clusters_updated = 2;
        assert_eq!(counts(&new), ("2/3".to_string(), "0/3".to_string()));
    }

    #[test]
    fn only_a_verdict_on_the_current_generation_counts() {
        assert_eq!(verdict(&rollout("Complete", 3, 3)), Some(exit::DONE));
        assert_eq!(verdict(&rollout("RolledBack", 3, 3)), Some(exit::FAILED));
        assert_eq!(verdict(&rollout("Failed", 3, 3)), Some(exit::FAILED));
        assert_eq!(
            verdict(&rollout("Complete", 4, 3)),
            None,
            "a stale Complete"
        );
        assert_eq!(verdict(&rollout("Progressing", 3, 3)), None);
        assert_eq!(verdict(&rollout("Paused", 3, 3)), None);
    }

    #[test]
    fn placement_says_why_each_cluster_is_where_it_is() {
        let mut r = rollout("Complete", 2, 2);
        assert!(placement_text(&r).contains("every selected cluster runs it"));
        r.placement = Some(pb::Placement {
            number_of_clusters: 2,
            clusters: vec![
                pb::PlacedCluster {
                    cluster: "member-3".into(),
                    role: "Chosen".into(),
                    reason: "Replacement".into(),
                    message: "replaces member-1 (unreachable for 60s)".into(),
                    ..Default::default()
                },
                pb::PlacedCluster {
                    cluster: "member-1".into(),
                    role: "Replaced".into(),
                    reason: "Unreachable".into(),
                    replaced_by: "member-3".into(),
                    ..Default::default()
                },
            ],
            history: vec![pb::PlacementChange {
                reason: "Unreachable".into(),
                from: "member-1".into(),
                to: "member-3".into(),
                ..Default::default()
            }],
            last_failover: None,
        });
        let text = placement_text(&r);
        assert!(text.contains("2 of the selected clusters"), "{text}");
        assert!(text.contains("replaces member-1"), "{text}");
        assert!(text.contains("replaced by member-3"), "{text}");
        assert!(text.contains("MOVED"), "{text}");
        assert!(
            status_text(&r).contains("ROLE"),
            "rollout status shows it too"
        );
        let j = json(&r);
        assert_eq!(j["placement"]["clusters"][1]["replacedBy"], "member-3");
    }

    #[test]
    fn status_names_waves_and_clusters() {
        let mut r = rollout("Progressing", 2, 2);
        r.wave = "canary".into();
        r.waves.push(pb::Wave {
            name: "canary".into(),
            clusters: vec!["member-1".into()],
            wave_state: pb::WaveState::Progressing as i32,
            ..Default::default()
        });
        r.clusters.push(pb::ClusterRollout {
            cluster: "member-1".into(),
            cluster_state: pb::ClusterRolloutState::Updating as i32,
            reason: "GenerationNotObserved".into(),
            ..Default::default()
        });
        let text = status_text(&r);
        assert!(
            !text.contains("ROLE"),
            "no placement section without a count"
        );
        assert!(text.contains("phase Progressing (wave canary)"), "{text}");
        assert!(text.contains("member-1"), "{text}");
        assert!(text.contains("GenerationNotObserved"), "{text}");
    }
}
