//! `Manual` waves through the planner (#35): held until approved for the
//! update revision, and an approval opens no other revision's wave.

use super::*;
use crate::rollout::spec::{Approval, WaveApproval};

/// The canary (m1) starts on its own; `rest` (m2, m3) waits for approval.
fn gated() -> World {
    let mut w = World::three();
    w.spec.rollout.bake = None;
    w.spec.rollout.waves.push(Wave {
        name: "rest".into(),
        cluster_selector: LabelSelector::default(),
        max_parallel: None,
        approval: Approval::Manual,
    });
    w
}

/// Approves `wave` for the attempt `revision` has now (or the number it
/// will get when it is not stored yet).
fn approve(w: &mut World, wave: &str, revision: &str) {
    let next = w.revisions.iter().map(|r| r.number).max().unwrap_or(0) + 1;
    let number = w
        .revisions
        .iter()
        .find(|r| r.name == revision)
        .map_or(next, |r| r.number);
    w.approvals.given.push(WaveApproval {
        wave: wave.into(),
        revision: revision.into(),
        attempt: Some(number),
        by: "alice".into(),
        at: stamp(w.now),
    });
}

/// Plans until nothing more is written, every written member turning done.
fn run(w: &mut World) {
    for _ in 0..10 {
        let p = w.step();
        for c in w.written_clusters() {
            w.done(&c);
        }
        w.wait(1);
        if p.actions.is_empty() {
            w.step();
            return;
        }
    }
}

#[test]
fn a_manual_wave_holds_until_approved_for_the_update_revision() {
    let mut w = gated();
    let r1 = rev(&w, "app:1");
    run(&mut w);
    assert_eq!(w.written(&r1), ["m1"], "the canary only");
    assert_eq!(w.status.waves[1].state, WaveState::AwaitingApproval);
    assert_eq!(w.status.wave.as_deref(), Some("rest"));
    assert_eq!(w.status.phase, Some(RolloutPhase::Progressing));
    assert_eq!(
        w.condition(PROGRESSING),
        ("True".into(), "AwaitingApproval".into())
    );
    assert_eq!(w.state("m2"), ClusterState::Pending);
    // Time alone opens nothing.
    w.wait(3600);
    assert!(w.step().actions.is_empty());

    approve(&mut w, "rest", &r1);
    let p = w.step();
    let to: Vec<&str> = p
        .actions
        .iter()
        .map(|a| match a {
            Action::Apply { cluster, .. } => cluster.as_str(),
            Action::Delete { cluster } => cluster.as_str(),
        })
        .collect();
    assert_eq!(to, ["m2", "m3"]);
    let shown = w.status.waves[1]
        .approval
        .clone()
        .expect("the approval used");
    assert_eq!(
        (shown.by.as_str(), shown.revision.as_str()),
        ("alice", r1.as_str())
    );
    w.complete();
    assert_eq!(w.written(&r1), ["m1", "m2", "m3"]);
}

#[test]
fn an_approval_of_an_older_revision_opens_nothing_of_a_newer_one() {
    let mut w = gated();
    let r1 = rev(&w, "app:1");
    run(&mut w);
    approve(&mut w, "rest", &r1);
    w.complete();
    w.spec.template.image = "app:2".into();
    let r2 = rev(&w, "app:2");
    run(&mut w);
    assert_eq!(w.written(&r2), ["m1"]);
    assert_eq!(w.status.waves[1].state, WaveState::AwaitingApproval);
    assert_eq!(
        w.status.waves[1].approval, None,
        "r1's approval is not r2's"
    );
    // An approval of another wave does not open this one either.
    approve(&mut w, "canary", &r2);
    assert!(w.step().actions.is_empty());
    approve(&mut w, "rest", &r2);
    assert_eq!(w.step().actions.len(), 2);
}

#[test]
fn an_approval_given_early_waits_for_its_wave_and_the_canary_still_goes_first() {
    let mut w = gated();
    let r1 = rev(&w, "app:1");
    approve(&mut w, "rest", &r1);
    let p = w.step();
    assert_eq!(
        p.actions,
        vec![Action::Apply {
            cluster: "m1".into(),
            revision: r1.clone()
        }],
        "the approval does not skip the canary"
    );
    assert_eq!(w.status.waves[1].state, WaveState::Pending);
    w.complete();
    assert_eq!(w.written(&r1), ["m1", "m2", "m3"]);
}

#[test]
fn a_wave_under_way_goes_on_when_its_approval_is_gone() {
    let mut w = gated();
    w.spec.rollout.waves[1].max_parallel = Some(IntOrString::Int(1));
    let r1 = rev(&w, "app:1");
    run(&mut w);
    approve(&mut w, "rest", &r1);
    assert_eq!(w.step().actions.len(), 1, "one at a time");
    // The annotation is edited away: the wave began on an approval, and
    // the status keeps which one.
    w.approvals.given.clear();
    w.complete();
    assert_eq!(w.written(&r1), ["m1", "m2", "m3"]);
    assert_eq!(w.status.waves[1].approval.as_ref().unwrap().by, "alice");
}

#[test]
fn a_rollback_needs_no_approval() {
    let mut w = gated();
    let r1 = rev(&w, "app:1");
    run(&mut w);
    approve(&mut w, "rest", &r1);
    w.complete();
    // r2's canary fails; nobody approved anything for r2.
    w.spec.template.image = "app:bad".into();
    let bad = rev(&w, "app:bad");
    w.step();
    assert_eq!(w.written(&bad), ["m1"]);
    w.set("m1", EntryState::Failed, "ImagePullBackOff");
    w.step();
    w.step();
    assert_eq!(w.status.phase, Some(RolloutPhase::RolledBack));
    assert_eq!(
        w.written(&r1),
        ["m1", "m2", "m3", "m1"],
        "m1 went back at once"
    );
    assert_ne!(w.status.waves[1].state, WaveState::AwaitingApproval);
}

#[test]
fn an_unreadable_approvals_annotation_approves_nothing_and_says_so() {
    let mut w = gated();
    w.approvals.unreadable = Some("the annotation is not a list".into());
    run(&mut w);
    let (reason, message) = w.progressing();
    assert_eq!(reason, "AwaitingApproval");
    assert!(message.contains("not a list"), "{message}");
}

/// Time windows (#35): a deny window holds a wave's start until it
/// closes; a wave already under way goes on through it.
#[test]
fn a_deny_window_holds_a_waves_start_and_lets_a_started_one_finish() {
    use crate::rollout::spec::{Window, WindowKind};
    let mut w = World::three();
    w.spec.rollout.bake = None;
    // 00:00 to 00:10 every hour.
    w.spec.rollout.windows = vec![Window {
        kind: WindowKind::Deny,
        schedule: "0 * * * *".into(),
        duration: "10m".into(),
    }];
    let r1 = rev(&w, "app:1");
    let p = w.step();
    assert!(
        p.actions.is_empty(),
        "nothing starts inside the deny window"
    );
    assert_eq!(w.progressing().0, "DenyWindow");
    assert_eq!(
        p.requeue_after,
        Some(Duration::from_secs(600)),
        "looks again when it closes"
    );
    w.wait(600);
    assert_eq!(
        w.step().actions.len(),
        1,
        "the canary starts once it closed"
    );
    w.done("m1");
    // The next deny window opens while the canary is done: the rest waits.
    w.wait(3000);
    assert!(w.step().actions.is_empty());
    assert_eq!(w.written(&r1), ["m1"]);
    w.wait(600);
    assert_eq!(w.step().actions.len(), 2);
    // A wave under way when a deny window opens goes on.
    w.complete();
    w.spec.rollout.waves.push(Wave {
        name: "rest".into(),
        cluster_selector: LabelSelector::default(),
        max_parallel: Some(IntOrString::Int(1)),
        approval: Approval::Auto,
    });
    w.spec.template.image = "app:2".into();
    let r2 = rev(&w, "app:2");
    w.now = "2026-01-01T05:58:00Z".parse().unwrap();
    w.step();
    w.done("m1");
    w.now = "2026-01-01T05:59:00Z".parse().unwrap();
    assert_eq!(w.step().actions.len(), 1, "the rest starts, one at a time");
    w.now = "2026-01-01T06:00:30Z".parse().unwrap();
    w.done("m2");
    assert_eq!(
        w.step().actions.len(),
        1,
        "and goes on inside the deny window"
    );
    assert_eq!(w.written(&r2), ["m1", "m2", "m3"]);
}

#[test]
fn an_allow_window_opens_the_release_and_a_bad_schedule_is_an_invalid_spec() {
    use crate::rollout::spec::{Window, WindowKind};
    let mut w = World::three();
    w.spec.rollout.windows = vec![Window {
        kind: WindowKind::Allow,
        schedule: "30 1 * * *".into(),
        duration: "1h".into(),
    }];
    assert!(w.step().actions.is_empty());
    assert_eq!(w.progressing().0, "OutsideAllowWindow");
    w.now = "2026-01-01T01:30:00Z".parse().unwrap();
    assert_eq!(w.step().actions.len(), 1);
    let mut w = World::three();
    w.spec.rollout.windows = vec![Window {
        kind: WindowKind::Allow,
        schedule: "61 * * * *".into(),
        duration: "1h".into(),
    }];
    assert!(w.step().actions.is_empty());
    let (reason, message) = w.progressing();
    assert_eq!(reason, "InvalidSpec");
    assert!(message.contains("rollout.windows[0].schedule"), "{message}");
}

/// `gated`, with `rest` selecting `ring: prod` (m2 and m3).
fn gated_prod() -> World {
    let mut w = gated();
    w.spec.rollout.waves[1].cluster_selector = LabelSelector {
        match_labels: Some([("ring".to_string(), "prod".to_string())].into()),
        ..LabelSelector::default()
    };
    for c in ["m2", "m3"] {
        w.relabel(c, &[("ring", "prod")]);
    }
    w
}

/// Review of #58 (H1): the canary, already on the release, moves into the
/// Manual wave. Its presence there opens nothing: not the approval, not
/// a deny window.
#[test]
fn a_canary_relabelled_into_a_manual_wave_opens_nothing() {
    for deny in [false, true] {
        let mut w = gated_prod();
        let r1 = rev(&w, "app:1");
        run(&mut w);
        assert_eq!(w.written(&r1), ["m1"]);
        assert_eq!(w.status.waves[1].state, WaveState::AwaitingApproval);
        if deny {
            w.spec.rollout.windows = vec![crate::rollout::spec::Window {
                kind: crate::rollout::spec::WindowKind::Deny,
                schedule: "* * * * *".into(),
                duration: "1h".into(),
            }];
        }
        w.relabel("m1", &[("ring", "prod")]);
        for _ in 0..5 {
            let p = w.step();
            assert!(
                p.actions.iter().all(|a| !matches!(a, Action::Apply { .. })),
                "deny {deny}: {:?}",
                p.actions
            );
            w.wait(30);
        }
        assert_eq!(w.written(&r1), ["m1"], "deny {deny}");
        let prod = &w.status.waves[1];
        assert!(prod.clusters.contains(&"m1".to_string()), "{prod:?}");
        assert_eq!(prod.started, None, "deny {deny}: {prod:?}");
        if !deny {
            assert_eq!(prod.state, WaveState::AwaitingApproval);
            approve(&mut w, "rest", &r1);
            w.complete();
            assert_eq!(w.written(&r1), ["m1", "m2", "m3"]);
        }
    }
}

/// An approval of a failed attempt does not open the same content applied
/// again: it is renumbered, a new attempt (#59).
#[test]
fn an_approval_of_a_failed_attempt_opens_nothing_of_its_reapplication() {
    let mut w = gated();
    let r1 = rev(&w, "app:1");
    run(&mut w);
    approve(&mut w, "rest", &r1);
    w.complete();
    w.spec.template.image = "app:2".into();
    let r2 = rev(&w, "app:2");
    run(&mut w);
    approve(&mut w, "rest", &r2);
    w.step();
    w.set("m2", EntryState::Failed, "ImagePullBackOff");
    w.step();
    w.step();
    assert_eq!(w.status.phase, Some(RolloutPhase::RolledBack));
    // Back to app:1, then app:2 again: the same revision name, a new number.
    w.spec.template.image = "app:1".into();
    w.complete();
    w.spec.template.image = "app:2".into();
    let before = w.writes.len();
    run(&mut w);
    let again: Vec<&str> = w.writes[before..].iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(again, ["m1"], "the canary only");
    assert_eq!(w.status.waves[1].state, WaveState::AwaitingApproval);
    let number = w.status.update_revision_number.unwrap();
    assert_eq!(w.status.update_revision.as_deref(), Some(r2.as_str()));
    approve(&mut w, "rest", &r2);
    let shown = w.step();
    assert_eq!(shown.actions.len(), 2, "the new approval opens it");
    let a = w.status.waves[1].approval.clone().unwrap();
    assert_eq!(a.attempt, Some(number));
}

/// Review of #59: a wave is recorded as started only when its rules
/// opened it. The canary, relabelled into a `prod` held by a deny window,
/// then a pause and a resume: `prod` has still not started, and the window
/// still holds it.
#[test]
fn a_pause_and_resume_do_not_start_a_wave_a_relabelled_cluster_sits_in() {
    let mut w = gated_prod();
    w.spec.rollout.waves[1].approval = Approval::Auto;
    let r1 = rev(&w, "app:1");
    w.step();
    w.done("m1");
    w.spec.rollout.windows = vec![crate::rollout::spec::Window {
        kind: crate::rollout::spec::WindowKind::Deny,
        schedule: "* * * * *".into(),
        duration: "1h".into(),
    }];
    run(&mut w);
    assert_eq!(w.written(&r1), ["m1"]);
    w.relabel("m1", &[("ring", "prod")]);
    w.step();
    w.spec.paused = true;
    w.step();
    w.spec.paused = false;
    for _ in 0..3 {
        let p = w.step();
        assert!(
            p.actions.iter().all(|a| !matches!(a, Action::Apply { .. })),
            "{:?}",
            p.actions
        );
        w.wait(30);
    }
    assert_eq!(w.written(&r1), ["m1"]);
    assert_eq!(w.status.waves[1].started, None, "{:?}", w.status.waves[1]);
}

/// Review of #59: an approval given before its wave's turn, then taken
/// back out of the annotation, opens nothing: it is recorded in the status
/// only once the wave started.
#[test]
fn an_approval_taken_back_before_its_wave_starts_opens_nothing() {
    let mut w = gated();
    w.spec.rollout.bake = Some("60s".into());
    let r1 = rev(&w, "app:1");
    approve(&mut w, "rest", &r1);
    w.step();
    w.done("m1");
    w.step();
    assert_eq!(
        w.status.waves[1].approval, None,
        "not started: not recorded"
    );
    w.approvals.given.clear();
    w.wait(120);
    run(&mut w);
    assert_eq!(w.written(&r1), ["m1"]);
    assert_eq!(w.status.waves[1].state, WaveState::AwaitingApproval);
}
