//! Analysis checks through the planner (#35): a wave passes on its checks'
//! evidence after the bake, a failure fails it, and a run of evidence that
//! moved is not counted.

use super::*;
use crate::rollout::analysis::Run;
use crate::rollout::spec::{AnalysisCheck, CheckState, WebhookCheck};

/// The canary (m1, bake 30s) then the rest, with one webhook check.
fn analysed() -> World {
    let mut w = World::three();
    w.spec.rollout.analysis = vec![AnalysisCheck {
        name: "errors".into(),
        webhook: Some(WebhookCheck {
            url: "http://127.0.0.1:9/errors".into(),
            timeout: None,
            headers_from: None,
        }),
        interval: Some("10s".into()),
        failure_limit: None,
        ..Default::default()
    }];
    w
}

impl World {
    /// Every check the plan asked for runs now and answers `passed`.
    fn answer(&mut self, p: &Plan, passed: bool) -> usize {
        for due in &p.checks {
            self.runs.push(Run {
                check: due.check.name.clone(),
                definition: due.definition.clone(),
                evidence: due.evidence.clone(),
                started: self.now,
                passed,
                answer: if passed {
                    "HTTP 200"
                } else {
                    "HTTP 500: errors 7%"
                }
                .into(),
            });
        }
        p.checks.len()
    }

    fn checks_of(&self, wave: &str) -> Vec<CheckStatus> {
        let w = self.status.waves.iter().find(|w| w.name == wave).unwrap();
        w.analysis.clone()
    }
}

#[test]
fn the_next_wave_waits_for_a_pass_that_started_after_the_bake() {
    let mut w = analysed();
    let r1 = rev(&w, "app:1");
    w.step();
    assert!(
        w.step().checks.is_empty(),
        "nothing to judge before m1 is done"
    );
    w.done("m1");
    let p = w.step();
    assert_eq!(w.answer(&p, true), 1, "a run as soon as the wave is done");
    let p = w.step();
    assert!(p.checks.is_empty(), "not again before the interval");
    assert_eq!(w.checks_of("canary")[0].state, CheckState::Passed);
    w.wait(31);
    let p = w.step();
    assert!(p.actions.is_empty(), "a pass during the bake is not enough");
    assert_eq!(w.answer(&p, true), 1, "once more at the bake's end");
    let p = w.step();
    let to: Vec<&str> = p.actions.iter().map(action_cluster_name).collect();
    assert_eq!(to, ["m2", "m3"]);
    assert_eq!(w.written(&r1), ["m1", "m2", "m3"]);
}

#[test]
fn a_failing_check_rolls_the_canary_back_before_the_next_wave_is_written() {
    let mut w = analysed();
    let r1 = rev(&w, "app:1");
    run_to_complete(&mut w);
    w.spec.template.image = "app:2".into();
    let r2 = rev(&w, "app:2");
    w.step();
    w.done("m1");
    let p = w.step();
    assert_eq!(w.answer(&p, false), 1);
    w.step();
    assert_eq!(w.status.phase, Some(RolloutPhase::RolledBack));
    assert_eq!(w.written(&r2), ["m1"], "the rest never saw it");
    assert_eq!(w.written(&r1), ["m1", "m2", "m3", "m1"], "m1 went back");
    let rolled = w.status.conditions.iter().find(|c| c.type_ == ROLLED_BACK);
    let message = &rolled.unwrap().message;
    assert!(
        message.contains("analysis errors of wave canary"),
        "{message}"
    );
    let failed = &w.checks_of("canary")[0];
    assert_eq!(failed.state, CheckState::Failed);
    assert!(failed.answer.contains("errors 7%"));
    // It stays said while the rollback runs.
    w.wait(5);
    w.step();
    assert_eq!(w.checks_of("canary")[0].state, CheckState::Failed);
}

#[test]
fn a_pass_on_a_member_generation_that_moved_since_is_not_counted() {
    let mut w = analysed();
    w.spec.rollout.bake = None;
    w.step();
    w.done("m1");
    let p = w.step();
    // The run starts on generation 1 of m1; m1's object is edited (and
    // repaired) before it ends, and the index never showed it not done.
    let stale = p.checks.clone();
    w.clusters[0].member.as_mut().unwrap().generation += 1;
    let p = Plan { checks: stale, ..p };
    w.answer(&p, true);
    let p = w.step();
    assert!(
        p.actions.is_empty(),
        "a pass on moved evidence opened the rest"
    );
    assert_eq!(p.checks.len(), 1, "run again on the evidence as it is");
    w.answer(&p, true);
    assert_eq!(w.step().actions.len(), 2);
}

fn action_cluster_name(a: &Action) -> &str {
    match a {
        Action::Apply { cluster, .. } | Action::Delete { cluster } => cluster,
    }
}

/// Drives a release to Complete, answering every check with a pass.
fn run_to_complete(w: &mut World) {
    for _ in 0..30 {
        let p = w.step();
        if w.status.phase == Some(RolloutPhase::Complete) {
            return;
        }
        w.answer(&p, true);
        for c in w.written_clusters() {
            w.done(&c);
        }
        w.wait(11);
    }
    panic!("no Complete: {:?}", w.status);
}
