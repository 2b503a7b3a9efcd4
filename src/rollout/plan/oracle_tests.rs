//! The oracle's own world (#58): every input the planner reads, at random.
//! Each plan that `World::plan` makes is also made by the planner as it was
//! before the stages (`oracle.rs`), and the two must be equal: actions,
//! status and checks. Random specs (Manual waves, windows, analysis,
//! counted placement, onFailure, budgets, bakes, requireCanary), member
//! states, write troubles, objects in the way, unreadable labels,
//! unregistered clusters, approvals, analysis runs, leader changes and the
//! clock.

use super::*;
use crate::rollout::analysis::Run;
use crate::rollout::spec::{
    AnalysisCheck, Approval, WaveApproval, WebhookCheck, Window, WindowKind,
};
use crate::rollout::trouble::{Kind, Trouble};
use proptest::prelude::*;

const NAMES: [&str; 5] = ["m1", "m2", "m3", "m4", "m5"];

/// The spec's shape, drawn once per case.
#[derive(Clone, Debug)]
struct Shape {
    manual_late: bool,
    deny_window: bool,
    allow_window: bool,
    analysis: bool,
    counted: Option<i32>,
    pause_on_failure: bool,
    max_failed: i32,
    bake: u8,
    require_canary: Option<bool>,
    max_parallel: Option<IntOrString>,
    no_waves: bool,
    /// Seconds past the hour the case starts at, against the windows.
    start: u16,
}

fn shape() -> impl Strategy<Value = Shape> {
    (
        any::<bool>(),
        prop_oneof![4 => Just(false), 1 => Just(true)],
        prop_oneof![4 => Just(false), 1 => Just(true)],
        any::<bool>(),
        prop_oneof![3 => Just(None), 1 => (1i32..4).prop_map(Some)],
        any::<bool>(),
        0i32..3,
        0u8..3,
        prop_oneof![Just(None), any::<bool>().prop_map(Some)],
        prop_oneof![
            Just(None),
            (1i32..3).prop_map(|n| Some(IntOrString::Int(n))),
            Just(Some(IntOrString::String("50%".into()))),
        ],
        prop_oneof![5 => Just(false), 1 => Just(true)],
        0u16..3600,
    )
        .prop_map(
            |(
                manual_late,
                deny_window,
                allow_window,
                analysis,
                counted,
                pause_on_failure,
                max_failed,
                bake,
                require_canary,
                max_parallel,
                no_waves,
                start,
            )| Shape {
                manual_late,
                deny_window,
                allow_window,
                analysis,
                counted,
                pause_on_failure,
                max_failed,
                bake,
                require_canary,
                max_parallel,
                no_waves,
                start,
            },
        )
}

#[derive(Clone, Debug)]
enum Event {
    Plan,
    CrashAfterStatus,
    Done(usize),
    Fail(usize),
    Wait(u64),
    Edit(u8),
    Relabel(usize, u8),
    Unregister(usize),
    Reregister(usize),
    Unreachable(usize),
    Reachable(usize),
    Pause(bool),
    Approve(u8),
    /// Every check the last plan asked for ends, passing or not.
    Runs(bool),
    /// The last write to a cluster went wrong, permanently or not.
    Trouble(usize, bool),
    /// Someone else's Microservice appears in a cluster.
    Foreign(usize),
    /// A cluster's labels become unreadable.
    LabelsLost(usize),
    /// Another replica's term begins now.
    NewTerm,
    /// A bad edit: the spec no longer checks.
    BreakSpec(bool),
    /// The approvals annotation is emptied.
    Unapprove,
    /// A few rounds in which every reachable member turns done.
    Settle,
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        8 => Just(Event::Plan),
        1 => Just(Event::CrashAfterStatus),
        5 => (0usize..5).prop_map(Event::Done),
        1 => (0usize..5).prop_map(Event::Fail),
        4 => (1u64..120).prop_map(Event::Wait),
        1 => (120u64..1800).prop_map(Event::Wait),
        1 => (1u8..4).prop_map(Event::Edit),
        1 => ((0usize..5), (0u8..4)).prop_map(|(i, r)| Event::Relabel(i, r)),
        1 => (0usize..5).prop_map(Event::Unregister),
        1 => (0usize..5).prop_map(Event::Reregister),
        1 => (0usize..5).prop_map(Event::Unreachable),
        2 => (0usize..5).prop_map(Event::Reachable),
        1 => any::<bool>().prop_map(Event::Pause),
        2 => (0u8..3).prop_map(Event::Approve),
        3 => any::<bool>().prop_map(Event::Runs),
        1 => ((0usize..5), any::<bool>()).prop_map(|(i, p)| Event::Trouble(i, p)),
        1 => (0usize..5).prop_map(Event::Foreign),
        1 => (0usize..5).prop_map(Event::LabelsLost),
        1 => Just(Event::NewTerm),
        1 => any::<bool>().prop_map(Event::BreakSpec),
        1 => Just(Event::Unapprove),
        2 => Just(Event::Settle),
    ]
}

fn ring(r: u8) -> &'static str {
    ["canary", "early", "late", "other"][r as usize]
}

fn world(s: &Shape) -> World {
    let mut w = World::new(&[
        ("m1", &[("ring", "canary")]),
        ("m2", &[("ring", "early")]),
        ("m3", &[("ring", "early")]),
        ("m4", &[("ring", "late")]),
        ("m5", &[("ring", "late")]),
    ]);
    let r = &mut w.spec.rollout;
    r.waves.push(Wave {
        name: "early".into(),
        cluster_selector: sel("ring", "early"),
        max_parallel: s.max_parallel.clone(),
        approval: Default::default(),
    });
    r.waves.push(Wave {
        name: "late".into(),
        cluster_selector: sel("ring", "late"),
        max_parallel: None,
        approval: if s.manual_late {
            Approval::Manual
        } else {
            Approval::Auto
        },
    });
    if s.no_waves {
        r.waves.clear();
    }
    r.max_failed_clusters = s.max_failed;
    r.bake = Some(["0s", "30s", "5m"][s.bake as usize].into());
    r.progress_deadline = Some("5m".into());
    r.require_canary = s.require_canary;
    if s.pause_on_failure {
        r.on_failure = OnFailure::Pause;
    }
    if s.deny_window {
        r.windows.push(Window {
            kind: WindowKind::Deny,
            schedule: "0 * * * *".into(),
            duration: "20m".into(),
        });
    }
    if s.allow_window {
        r.windows.push(Window {
            kind: WindowKind::Allow,
            schedule: "30 * * * *".into(),
            duration: "20m".into(),
        });
    }
    if s.analysis {
        r.analysis.push(AnalysisCheck {
            name: "errors".into(),
            webhook: Some(WebhookCheck {
                url: "http://127.0.0.1:9/check".into(),
                timeout: None,
                headers_from: None,
            }),
            prometheus: None,
            interval: Some("20s".into()),
            failure_limit: Some(2),
        });
    }
    w.spec.placement.number_of_clusters = s.counted;
    w.wait(s.start as u64);
    w.term_started = w.now;
    w
}

/// A run of each check the last plan asked for, ended now.
fn runs(w: &mut World, last: Option<&Plan>, passed: bool) {
    for due in last.map(|p| p.checks.as_slice()).unwrap_or_default() {
        w.runs.push(Run {
            check: due.check.name.clone(),
            evidence: due.evidence.clone(),
            started: w.now,
            passed,
            answer: if passed { "HTTP 200" } else { "HTTP 500" }.into(),
        });
    }
}

/// The last write to cluster `i` went wrong: a write of the update
/// revision, of the spec it gives that cluster, as the edge records it.
fn trouble(w: &mut World, i: usize, permanent: bool) {
    let update = w.update();
    let Some(c) = w.clusters.iter().find(|c| c.name == NAMES[i]) else {
        return;
    };
    let Some(labels) = c.labels.as_ref() else {
        return;
    };
    let spec = member_spec(&update.data.template, &update.data.overrides, labels);
    let kind = match permanent {
        true => Kind::Refused {
            code: 422,
            message: "denied".into(),
        },
        false => Kind::Failed {
            message: "no answer".into(),
        },
    };
    w.troubles.insert(
        c.name.clone(),
        Trouble {
            revision: update.name.clone(),
            digest: digest(&spec),
            kind,
        },
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]
    #[test]
    fn the_new_planner_plans_as_the_oracle(
        s in shape(),
        events in proptest::collection::vec(event(), 1..120),
    ) {
        let mut w = world(&s);
        let mut away: Vec<Cluster> = Vec::new();
        let mut last: Option<Plan> = None;
        for e in events {
            match e {
                Event::Plan => last = Some(w.step()),
                Event::CrashAfterStatus => {
                    let p = w.plan();
                    w.status = p.status.clone();
                    last = Some(p);
                }
                Event::Done(i) | Event::Fail(i) => {
                    let failed = matches!(e, Event::Fail(_));
                    if let Some(c) = w.clusters.iter_mut().find(|c| c.name == NAMES[i] && c.reachable)
                        && let Some(m) = c.member.as_mut()
                    {
                        m.state = if failed { EntryState::Failed } else { EntryState::Done };
                        m.reason = if failed { "InvalidSpec" } else { "Available" }.into();
                    }
                }
                Event::Wait(secs) => w.wait(secs),
                Event::Edit(n) => w.spec.template.image = format!("app:{n}"),
                Event::Relabel(i, r) => {
                    if let Some(c) = w.clusters.iter_mut().find(|c| c.name == NAMES[i]) {
                        c.labels = Some(BTreeMap::from([("ring".into(), ring(r).into())]));
                    }
                }
                Event::Unregister(i) => {
                    if let Some(at) = w.clusters.iter().position(|c| c.name == NAMES[i]) {
                        away.push(w.clusters.remove(at));
                    }
                }
                Event::Reregister(i) => {
                    if let Some(at) = away.iter().position(|c| c.name == NAMES[i]) {
                        w.clusters.push(away.remove(at));
                        w.clusters.sort_by(|a, b| a.name.cmp(&b.name));
                    }
                }
                Event::Unreachable(i) | Event::Reachable(i) => {
                    let up = matches!(e, Event::Reachable(_));
                    if let Some(c) = w.clusters.iter_mut().find(|c| c.name == NAMES[i]) {
                        c.reachable = up;
                        if let Some(m) = c.member.as_mut() {
                            match (up, m.state) {
                                (false, _) => m.state = EntryState::Unknown,
                                (true, EntryState::Unknown) => m.state = EntryState::Progressing,
                                _ => {}
                            }
                        }
                    }
                }
                Event::Pause(p) => w.spec.paused = p,
                Event::Approve(k) => {
                    let revision = w.update().name;
                    w.approvals.given.push(WaveApproval {
                        wave: ["canary", "early", "late"][k as usize].into(),
                        revision,
                        by: "release-manager".into(),
                        at: stamp(w.now),
                    });
                }
                Event::Runs(passed) => runs(&mut w, last.as_ref(), passed),
                Event::Trouble(i, permanent) => trouble(&mut w, i, permanent),
                Event::Foreign(i) => {
                    if let Some(c) = w.clusters.iter_mut().find(|c| c.name == NAMES[i] && c.member.is_none()) {
                        c.member = Some(foreign());
                    }
                }
                Event::LabelsLost(i) => {
                    if let Some(c) = w.clusters.iter_mut().find(|c| c.name == NAMES[i]) {
                        c.labels = None;
                    }
                }
                Event::NewTerm => {
                    w.term_started = w.now;
                    w.runs.clear();
                }
                Event::Unapprove => w.approvals.given.clear(),
                Event::Settle => {
                    for _ in 0..6 {
                        last = Some(w.step());
                        for c in w.clusters.iter_mut().filter(|c| c.reachable) {
                            if let Some(m) = c.member.as_mut().filter(|m| m.ours) {
                                m.state = EntryState::Done;
                                m.reason = "Available".into();
                            }
                        }
                        w.wait(31);
                    }
                }
                Event::BreakSpec(broken) => {
                    w.spec.rollout.progress_deadline = Some(if broken { "forever" } else { "5m" }.into());
                }
            }
        }
    }
}
