//! The run's verdict: one line per invariant (how many cases it judged,
//! how many it found broken), the evidence that could not be read, and
//! whether the run passes. Pure, so the rule "no pass by skipping" is
//! unit-tested.

use std::collections::BTreeMap;

use crate::check::{DNS_WRITER, INVARIANTS, Judged, Violation};

#[derive(Debug, Default)]
pub struct Report {
    /// Invariant -> (checked, violated).
    rows: BTreeMap<&'static str, (usize, usize)>,
    pub violations: Vec<Violation>,
    /// What could not be read, with where: each fails the run.
    pub unverifiable: Vec<String>,
}

impl Report {
    /// Adds what `name` judged (an invariant judged in parts, one per
    /// member, adds up).
    pub fn add(&mut self, name: &'static str, judged: Judged) {
        let row = self.rows.entry(name).or_default();
        row.0 += judged.checked;
        row.1 += judged.violations.len();
        self.violations.extend(judged.violations);
        self.unverifiable.extend(
            judged
                .unverifiable
                .into_iter()
                .map(|u| format!("{name}: {u}")),
        );
    }

    pub fn unverifiable(&mut self, what: String) {
        self.unverifiable.push(what);
    }

    /// `invariant NAME: C checked, V violated`, in the fixed order; then
    /// how much could not be verified.
    pub fn lines(&self) -> Vec<String> {
        let mut out: Vec<String> = INVARIANTS
            .iter()
            .map(|name| {
                let (c, v) = self.rows.get(name).copied().unwrap_or_default();
                format!("invariant {name}: {c} checked, {v} violated")
            })
            .collect();
        out.push(format!("unverifiable: {}", self.unverifiable.len()));
        out
    }

    /// Invariants that judged nothing: a pass there proves nothing. The
    /// DNS writer's status marks are written only while an answer is
    /// degraded, which a run need not bring about.
    pub fn unchecked(&self) -> Vec<&'static str> {
        INVARIANTS
            .iter()
            .copied()
            .filter(|n| *n != DNS_WRITER)
            .filter(|n| self.rows.get(n).is_none_or(|(c, _)| *c == 0))
            .collect()
    }

    /// Why the run fails, if it does: violations and unreadable evidence
    /// always; invariants that judged nothing when `every_checked` is asked
    /// (runs long enough that each must have had a case).
    pub fn failures(&self, every_checked: bool) -> Vec<String> {
        let mut out = Vec::new();
        if !self.violations.is_empty() {
            out.push(format!("{} violations", self.violations.len()));
        }
        if !self.unverifiable.is_empty() {
            out.push(format!(
                "{} unverifiable: {:?}",
                self.unverifiable.len(),
                self.unverifiable.iter().take(5).collect::<Vec<_>>()
            ));
        }
        let unchecked = self.unchecked();
        if every_checked && !unchecked.is_empty() {
            out.push(format!("never checked: {unchecked:?}"));
        }
        out
    }
}
