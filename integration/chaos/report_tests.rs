//! The report's rules: a line per invariant, and no pass by skipping.

use super::check::*;
use super::report::Report;

fn broken(invariant: &'static str) -> Violation {
    Violation {
        invariant,
        at: None,
        detail: "broken".into(),
    }
}

fn judged(checked: usize, violations: Vec<Violation>) -> Judged {
    Judged {
        checked,
        violations,
        unverifiable: Vec::new(),
    }
}

fn every_invariant_checked() -> Report {
    let mut r = Report::default();
    for name in INVARIANTS {
        r.add(name, judged(2, vec![]));
    }
    r
}

#[test]
fn every_invariant_gets_a_line_with_its_counts() {
    let mut r = every_invariant_checked();
    r.add(ONE_WRITER, judged(3, vec![broken(ONE_WRITER)]));
    let lines = r.lines();
    assert!(lines.contains(&"invariant member-fence: 5 checked, 1 violated".to_string()));
    assert!(lines.contains(&"invariant wait-truth: 2 checked, 0 violated".to_string()));
    for name in INVARIANTS {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&format!("invariant {name}: "))),
            "{name}: {lines:?}"
        );
    }
    assert!(lines.iter().any(|l| l.contains("approval-bound")));
    assert_eq!(r.failures(true), vec!["1 violations".to_string()]);
}

#[test]
fn a_clean_run_passes() {
    let r = every_invariant_checked();
    assert_eq!(r.failures(true), Vec::<String>::new());
}

#[test]
fn unreadable_evidence_fails_the_run_like_a_violation() {
    let mut r = every_invariant_checked();
    r.unverifiable("member-2 microservices: connection refused".into());
    let mut j = judged(1, vec![]);
    j.unverifiable.push("/z/x is not a record".into());
    r.add(NO_ORPHAN_RECORD, j);
    let f = r.failures(false);
    assert_eq!(f.len(), 1, "{f:?}");
    assert!(f[0].starts_with("2 unverifiable"), "{f:?}");
    assert!(r.lines().contains(&"unverifiable: 2".to_string()));
}

#[test]
fn an_invariant_that_judged_nothing_fails_a_long_run() {
    let mut r = Report::default();
    for name in INVARIANTS.iter().filter(|n| **n != BAKE_HELD) {
        r.add(name, judged(1, vec![]));
    }
    r.add(BAKE_HELD, judged(0, vec![]));
    assert_eq!(r.unchecked(), vec![BAKE_HELD]);
    assert!(r.failures(false).is_empty(), "a short run may lack a case");
    assert_eq!(r.failures(true).len(), 1);
}

#[test]
fn the_dns_writers_marks_may_go_unchecked() {
    let mut r = Report::default();
    for name in INVARIANTS.iter().filter(|n| **n != DNS_WRITER) {
        r.add(name, judged(1, vec![]));
    }
    assert!(r.failures(true).is_empty(), "{:?}", r.failures(true));
}
