//! What `flotilla rollout` prints, and how `rollout wait` judges a
//! rollout. Pure.

use serde_json::{Value, json};

use super::output::table;
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

/// The verdict on the spec as it is now: `None` while it is still rolling
/// out (or not yet planned for the current generation).
pub fn verdict(r: &pb::Rollout) -> Option<u8> {
    if r.observed_generation != r.generation {
        return None;
    }
    match r.phase.as_str() {
        "Complete" => Some(exit::DONE),
        "RolledBack" | "Failed" | "Degraded" => Some(exit::FAILED),
        _ => None,
    }
}

pub fn status_text(r: &pb::Rollout) -> String {
    let mut out = format!(
        "{}/{}  phase {}{}  revision {}  updated {}  available {}\n",
        r.namespace,
        r.name,
        or_dash(&r.phase),
        if r.wave.is_empty() {
            String::new()
        } else {
            format!(" (wave {})", r.wave)
        },
        revision(&r.update_revision),
        or_dash(&r.updated),
        or_dash(&r.available),
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
                w.state.clone(),
                w.clusters.join(","),
                time(&w.started),
                time(&w.finished),
            ]
        })
        .collect();
    out.push('\n');
    out.push_str(&table(
        &["WAVE", "STATE", "CLUSTERS", "STARTED", "FINISHED"],
        &waves,
    ));
    let clusters: Vec<Vec<String>> = r
        .clusters
        .iter()
        .map(|c| {
            vec![
                c.cluster.clone(),
                c.state.clone(),
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
        .map(|c| format!("{}={}", c.cluster, c.state))
        .collect();
    format!(
        "{} {}: {} wave {} updated {} available {} [{}]",
        r.namespace,
        r.name,
        or_dash(&r.phase),
        or_dash(&r.wave),
        or_dash(&r.updated),
        or_dash(&r.available),
        clusters.join(" ")
    )
}

pub fn json(r: &pb::Rollout) -> Value {
    json!({
        "namespace": r.namespace,
        "name": r.name,
        "generation": r.generation,
        "observedGeneration": r.observed_generation,
        "phase": r.phase,
        "wave": r.wave,
        "image": r.image,
        "paused": r.paused,
        "updateRevision": r.update_revision.as_ref().map(|x| json!({"name": x.name, "number": x.number})),
        "lastGoodRevision": r.last_good_revision.as_ref().map(|x| json!({"name": x.name, "number": x.number})),
        "updated": r.updated,
        "available": r.available,
        "waves": r.waves.iter().map(|w| json!({"name": w.name, "state": w.state, "clusters": w.clusters})).collect::<Vec<_>>(),
        "clusters": r.clusters.iter().map(|c| json!({
            "cluster": c.cluster, "state": c.state, "revision": c.revision,
            "target": c.target, "reason": c.reason, "message": c.message,
        })).collect::<Vec<_>>(),
        "conditions": r.conditions.iter().map(|c| json!({
            "type": c.r#type, "status": c.status, "reason": c.reason, "message": c.message,
            "observedGeneration": c.observed_generation,
        })).collect::<Vec<_>>(),
        "history": r.history.iter().map(|h| json!({"number": h.number, "name": h.name, "image": h.image})).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rollout(phase: &str, generation: i64, observed: i64) -> pb::Rollout {
        pb::Rollout {
            namespace: "shop".into(),
            name: "api".into(),
            phase: phase.into(),
            generation,
            observed_generation: observed,
            ..Default::default()
        }
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
    fn status_names_waves_and_clusters() {
        let mut r = rollout("Progressing", 2, 2);
        r.wave = "canary".into();
        r.waves.push(pb::Wave {
            name: "canary".into(),
            clusters: vec!["member-1".into()],
            state: "Progressing".into(),
            ..Default::default()
        });
        r.clusters.push(pb::ClusterRollout {
            cluster: "member-1".into(),
            state: "Updating".into(),
            reason: "GenerationNotObserved".into(),
            ..Default::default()
        });
        let text = status_text(&r);
        assert!(text.contains("phase Progressing (wave canary)"), "{text}");
        assert!(text.contains("member-1"), "{text}");
        assert!(text.contains("GenerationNotObserved"), "{text}");
    }
}
