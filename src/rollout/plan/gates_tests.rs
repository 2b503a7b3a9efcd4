//! One table per gate rule: each reads and fails alone.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};

use super::*;
use crate::rollout::spec::{WaveApproval, Window, WindowKind};

fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap()
}

fn done() -> Gate {
    Gate::Done(Time(t(0)))
}

#[test]
fn the_canary_and_bake_rule_judges_evidence_only() {
    let since = Time(t(0));
    let d = || Evidence::Done(since.clone());
    let bake = Duration::from_secs(30);
    // (members, canary, finished before, now, want)
    let table: Vec<(Vec<Evidence>, bool, bool, i64, Gate)> = vec![
        (vec![], false, false, 0, Gate::Skipped),
        (vec![Evidence::Pending], false, false, 0, Gate::Progressing),
        (vec![Evidence::Failed], false, false, 0, Gate::Failed),
        (vec![d(), Evidence::Failed], true, false, 60, Gate::Failed),
        (
            vec![d(), Evidence::Failed],
            false,
            false,
            60,
            Gate::Done(Time(t(60))),
        ),
        (
            vec![d()],
            false,
            false,
            10,
            Gate::Baking(Duration::from_secs(21)),
        ),
        (vec![d()], false, false, 31, Gate::Done(Time(t(31)))),
        (vec![Evidence::Pending], false, true, 0, done()),
    ];
    for (members, canary, finished, now, want) in table {
        let before = finished.then(|| Time(t(0)));
        let got = gate::gate(&members, canary, before.as_ref(), bake, t(now));
        assert_eq!(got, want, "{members:?} canary {canary} at {now}");
    }
}

#[test]
fn the_analysis_rule_fails_holds_or_passes_a_done_wave() {
    let table = [
        (Judgement::Passed, done(), None),
        (
            Judgement::Failed {
                check: "errors".into(),
                answer: "HTTP 500".into(),
            },
            Gate::Failed,
            None,
        ),
        (
            Judgement::Waiting(Duration::from_secs(7)),
            Gate::Baking(Duration::from_secs(7)),
            Some(Duration::from_secs(7)),
        ),
    ];
    for (judgement, want, requeue) in table {
        let mut soon = Soon::default();
        assert_eq!(
            analysed(done(), judgement.clone(), &mut soon),
            want,
            "{judgement:?}"
        );
        assert_eq!(soon.0, requeue, "{judgement:?}");
    }
}

#[test]
fn the_failure_budget_counts_clusters_and_any_failed_wave() {
    let table = [
        (0, 0, vec![done()], false),
        (1, 0, vec![done()], true),
        (1, 1, vec![done()], false),
        (2, 1, vec![done()], true),
        (0, 5, vec![done(), Gate::Failed], true),
    ];
    for (failed, max, gates, want) in table {
        assert_eq!(
            over_budget(failed, max, &gates),
            want,
            "{failed} of {max}: {gates:?}"
        );
    }
}

#[test]
fn past_the_budget_no_wave_newly_passes() {
    let baking = Gate::Baking(Duration::from_secs(3));
    // (gate, counting, finished before, want, requeue)
    let table = [
        (
            baking.clone(),
            true,
            false,
            baking.clone(),
            Some(Duration::from_secs(3)),
        ),
        (baking.clone(), false, false, Gate::Progressing, None),
        (done(), true, false, done(), None),
        (done(), false, false, Gate::Progressing, None),
        (done(), false, true, done(), None),
        (Gate::Skipped, false, false, Gate::Skipped, None),
        (Gate::Failed, false, false, Gate::Failed, None),
    ];
    for (g, counting, finished, want, requeue) in table {
        let mut soon = Soon::default();
        assert_eq!(
            budget(g.clone(), counting, finished, &mut soon),
            want,
            "{g:?} {counting}"
        );
        assert_eq!(soon.0, requeue, "{g:?} {counting}");
    }
}

#[test]
fn require_canary_holds_the_rest_while_the_canary_selects_no_cluster() {
    let table = [
        (true, true, Some(Gate::Skipped), true),
        (false, true, Some(Gate::Skipped), false),
        (true, false, Some(Gate::Skipped), false),
        (true, true, Some(done()), false),
        (true, true, Some(Gate::Progressing), false),
        (true, true, None, false),
    ];
    for (require, placed, first, want) in table {
        assert_eq!(
            canary_missing(require, placed, first.as_ref()),
            want,
            "{require} {placed} {first:?}"
        );
    }
}

fn wave(approval: Approval) -> checked::Wave {
    checked::Wave {
        name: "prod".into(),
        selector: LabelSelector::default(),
        approval,
        parallel: Parallel::All,
    }
}

fn approved(wave: &str, revision: &str, attempt: i64) -> Approvals {
    Approvals {
        given: vec![given(wave, revision, attempt)],
        unreadable: None,
    }
}

fn given(wave: &str, revision: &str, attempt: i64) -> WaveApproval {
    WaveApproval {
        wave: wave.into(),
        revision: revision.into(),
        attempt: Some(attempt),
        by: "release-manager".into(),
        at: Time(t(0)),
    }
}

#[test]
fn a_manual_wave_opens_only_approved_for_this_attempt() {
    let none = Approvals::default();
    let manual = wave(Approval::Manual);
    let automatic = wave(Approval::Auto);
    let kept = given("prod", "api-2", 2);
    let stale = given("prod", "api-2", 1);
    // (wave, the approval its last status recorded, approvals, want)
    type Row<'a> = (
        Option<&'a checked::Wave>,
        Option<&'a WaveApproval>,
        Approvals,
        Result<(), Hold>,
    );
    let table: Vec<Row> = vec![
        (None, None, none.clone(), Ok(())),
        (Some(&automatic), None, none.clone(), Ok(())),
        (Some(&manual), None, none.clone(), Err(Hold::Approval)),
        (Some(&manual), None, approved("prod", "api-2", 2), Ok(())),
        (
            Some(&manual),
            None,
            approved("prod", "api-1", 2),
            Err(Hold::Approval),
        ),
        (
            Some(&manual),
            None,
            approved("canary", "api-2", 2),
            Err(Hold::Approval),
        ),
        // The same content, approved for an earlier attempt (#59).
        (
            Some(&manual),
            None,
            approved("prod", "api-2", 1),
            Err(Hold::Approval),
        ),
        (Some(&manual), Some(&kept), none.clone(), Ok(())),
        (
            Some(&manual),
            Some(&stale),
            none.clone(),
            Err(Hold::Approval),
        ),
    ];
    let attempt = Attempt {
        revision: "api-2",
        number: 2,
    };
    for (w, recorded, approvals, want) in table {
        assert_eq!(
            approval(w, recorded, &approvals, attempt),
            want,
            "{w:?} {recorded:?} {approvals:?}"
        );
    }
}

#[test]
fn a_wave_starts_only_inside_its_windows_and_one_under_way_goes_on() {
    let deny_always = window::check(&[Window {
        kind: WindowKind::Deny,
        schedule: "* * * * *".into(),
        duration: "1h".into(),
    }])
    .unwrap();
    let table = [
        (vec![], false, true),
        (deny_always.clone(), false, false),
        (deny_always.clone(), true, true),
    ];
    for (windows, under_way, open) in table {
        let got = window(&windows, under_way, t(0));
        assert_eq!(got.is_ok(), open, "{windows:?} {under_way}: {got:?}");
        if let Err(shut) = got {
            assert_eq!(shut.reason, "DenyWindow");
        }
    }
}

#[test]
fn max_parallel_leaves_slots_for_what_is_not_in_flight() {
    let table = [
        (Parallel::All, 5, 0, 5),
        (Parallel::All, 5, 2, 3),
        (Parallel::Count(1), 5, 0, 1),
        (Parallel::Count(1), 5, 1, 0),
        (Parallel::Count(2), 5, 3, 0),
        (Parallel::Percent(50), 5, 1, 2),
        (Parallel::Percent(1), 0, 0, 1),
    ];
    for (p, size, in_flight, want) in table {
        assert_eq!(
            slots(p, size, in_flight),
            want,
            "{p:?} of {size}, {in_flight} in flight"
        );
    }
}
