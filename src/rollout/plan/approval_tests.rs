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

fn approve(w: &mut World, wave: &str, revision: &str) {
    w.approvals.given.push(WaveApproval {
        wave: wave.into(),
        revision: revision.into(),
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
