use super::schedule::*;
use std::time::Duration;

#[test]
fn the_same_seed_gives_the_same_plan_and_another_seed_another() {
    let a = plan(7, Duration::from_secs(300));
    assert_eq!(a, plan(7, Duration::from_secs(300)));
    assert_ne!(a, plan(8, Duration::from_secs(300)));
    assert!(a.len() > 20, "{} faults in 300 s", a.len());
}

#[test]
fn never_two_replicas_two_members_or_two_registry_faults_at_once() {
    for seed in 0..200 {
        let p = plan(seed, Duration::from_secs(300));
        for (i, a) in p.iter().enumerate() {
            for b in &p[i + 1..] {
                let overlap = b.at < a.at + a.down;
                let same = std::mem::discriminant(&class(&a.fault))
                    == std::mem::discriminant(&class(&b.fault))
                    && class(&a.fault) != Class::Labels;
                assert!(!(overlap && same), "seed {seed}: {a:?} overlaps {b:?}");
            }
            assert!(
                a.at + a.down <= Duration::from_secs(300),
                "seed {seed}: {a:?} outlasts the run"
            );
        }
    }
}

#[test]
fn a_long_run_reaches_every_kind() {
    let kinds: std::collections::BTreeSet<_> = plan(1, Duration::from_secs(1800))
        .iter()
        .map(|p| p.fault.kind())
        .collect();
    assert_eq!(kinds.len(), KINDS, "{kinds:?}");
}

#[test]
fn the_seed_of_the_day_rotates() {
    let week: std::collections::BTreeSet<_> = (0..7).map(seed_of_day).collect();
    assert_eq!(week.len(), 7);
    assert_eq!(seed_of_day(3), seed_of_day(10));
}

#[derive(Debug, PartialEq)]
enum Class {
    Replica,
    Member,
    Registry,
    Home,
    Watches,
    Labels,
}

fn class(f: &Fault) -> Class {
    match f {
        Fault::KillReplica { .. }
        | Fault::PauseReplica { .. }
        | Fault::RollingRestart
        | Fault::PauseLeader { .. } => Class::Replica,
        Fault::StopMember { .. } | Fault::BlackHoleMember { .. } | Fault::LateMember { .. } => {
            Class::Member
        }
        Fault::StopRegistry => Class::Registry,
        Fault::StopHome => Class::Home,
        Fault::WatchLag { .. } => Class::Watches,
        // Instant: nothing to overlap.
        Fault::MoveCanary { .. } | Fault::DeleteLease { .. } => Class::Labels,
    }
}

#[test]
fn a_five_minute_run_injects_every_kind() {
    for seed in 0..200 {
        let kinds: std::collections::BTreeSet<_> = plan(seed, Duration::from_secs(300))
            .iter()
            .map(|p| p.fault.kind())
            .collect();
        assert_eq!(kinds.len(), KINDS, "seed {seed}: {kinds:?}");
        for k in ["home-stop", "lease-delete", "watch-lag"] {
            assert!(kinds.contains(k), "seed {seed}: {kinds:?}");
        }
    }
}

#[test]
fn home_stop_is_held_out_of_short_runs_only() {
    for seed in 0..50 {
        let short = plan(seed, Duration::from_secs(120));
        assert!(
            !short.iter().any(|p| p.fault.kind() == "home-stop"),
            "seed {seed}"
        );
    }
    assert!(
        plan(1, Duration::from_secs(300))
            .iter()
            .any(|p| p.fault.kind() == "home-stop")
    );
}
