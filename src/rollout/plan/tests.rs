//! The planner, step by step against a simulated fleet.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::*;
use crate::crd::MicroserviceSpec;
use crate::rollout::placement::{digest, member_spec};
use crate::rollout::revision::{RevisionData, name_for};
use crate::rollout::spec::{
    CheckStatus, ClusterState, ClusterStatus, FleetMicroserviceSpec, OnFailure, WaveState,
};
use crate::rollout::spec::{Override, Rollout, Wave};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

fn sel(k: &str, v: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([(k.to_string(), v.to_string())])),
        ..Default::default()
    }
}

fn spec(image: &str) -> FleetMicroserviceSpec {
    FleetMicroserviceSpec {
        template: MicroserviceSpec {
            image: image.into(),
            port: 8080,
            replicas: 2,
            env: vec![],
        },
        placement: Default::default(),
        overrides: vec![],
        rollout: Rollout {
            waves: vec![Wave {
                name: "canary".into(),
                cluster_selector: sel("ring", "canary"),
                max_parallel: None,
                approval: Default::default(),
            }],
            bake: Some("30s".into()),
            progress_deadline: Some("60s".into()),
            require_canary: None,
            max_failed_clusters: 0,
            on_failure: OnFailure::Rollback,
            analysis: vec![],
            windows: vec![],
        },
        dns: None,
        paused: false,
        revision_history_limit: 10,
    }
}

/// A Microservice someone else made, done.
fn foreign() -> Member {
    Member {
        ours: false,
        revision: None,
        digest: 0,
        generation: 1,
        state: EntryState::Done,
        reason: String::new(),
        message: String::new(),
    }
}

/// The tests' egress: loopback, where their analysis URLs point.
fn loopback() -> crate::domain::egress::Egress {
    crate::domain::egress::Egress::parse(&["127.0.0.1".to_string()]).unwrap()
}

/// A fleet that does what it is told: the test decides when members turn done.
struct World {
    spec: FleetMicroserviceSpec,
    revisions: Vec<Revision>,
    clusters: Vec<Cluster>,
    status: FleetMicroserviceStatus,
    now: Timestamp,
    troubles: BTreeMap<String, crate::rollout::trouble::Trouble>,
    /// When the planning leader's term began.
    term_started: Timestamp,
    /// Every write, in order: (cluster, revision).
    writes: Vec<(String, String)>,
    deletes: Vec<String>,
    approvals: crate::rollout::approval::Approvals,
    /// Analysis runs that ended (#35).
    runs: Vec<crate::rollout::analysis::Run>,
}

impl World {
    fn new(names: &[(&str, &[(&str, &str)])]) -> Self {
        let clusters = names
            .iter()
            .map(|(n, labels)| Cluster {
                name: n.to_string(),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                reachable: true,
                synced: true,
                member: None,
            })
            .collect();
        World {
            spec: spec("app:1"),
            revisions: vec![],
            clusters,
            status: Default::default(),
            now: "2026-01-01T00:00:00Z".parse().unwrap(),
            troubles: BTreeMap::new(),
            term_started: "2026-01-01T00:00:00Z".parse().unwrap(),
            writes: vec![],
            deletes: vec![],
            approvals: Default::default(),
            runs: vec![],
        }
    }

    /// Replaces a cluster's labels, as an edit of its labels file would.
    fn relabel(&mut self, name: &str, labels: &[(&str, &str)]) {
        let c = self.clusters.iter_mut().find(|c| c.name == name).unwrap();
        c.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
    }

    fn three() -> Self {
        World::new(&[("m1", &[("ring", "canary")]), ("m2", &[]), ("m3", &[])])
    }

    /// The update revision for the current spec (what the edge ensures).
    fn update(&mut self) -> Revision {
        let data = RevisionData::of(&self.spec);
        let step =
            crate::rollout::revision::update_revision("api", &self.revisions, &data, 0).unwrap();
        let mut r = step.revision().clone();
        // As the edge does: a new revision keeps the last good one.
        if matches!(step, crate::rollout::revision::Step::Create(_)) {
            r.memory.good_before = self.status.last_good_revision.clone();
        }
        self.revisions.retain(|x| x.name != r.name);
        self.revisions.push(r.clone());
        r
    }

    fn plan(&mut self) -> Plan {
        let update = self.update();
        let checked = crate::rollout::checked::check("api", &self.spec, &loopback());
        let inputs = Inputs {
            name: "api",
            uid: "uid-api",
            generation: 1,
            checked: checked.as_ref().map_err(String::as_str),
            update: &update,
            revisions: &self.revisions,
            previous: &self.status,
            clusters: &self.clusters,
            troubles: &self.troubles,
            now: self.now,
            term_started: self.term_started,
            approvals: &self.approvals,
            runs: &self.runs,
        };
        plan(&inputs)
    }

    /// Plan, persist the status, then carry out the actions.
    fn step(&mut self) -> Plan {
        let p = self.plan();
        self.status = p.status.clone();
        // As the edge does: a failed revision is marked with its number.
        if let Some(n) = p.status.failed_revision_number
            && let Some(r) = self.revisions.iter_mut().find(|r| r.number == n)
        {
            r.memory.failed_number = Some(n);
        }
        for a in &p.actions {
            match a {
                Action::Apply { cluster, revision } => {
                    let rev = self
                        .revisions
                        .iter()
                        .find(|r| &r.name == revision)
                        .unwrap()
                        .clone();
                    let c = self
                        .clusters
                        .iter_mut()
                        .find(|c| &c.name == cluster)
                        .unwrap();
                    assert!(c.reachable, "wrote to unreachable {cluster}");
                    let labels = c.labels.clone().unwrap();
                    let spec = member_spec(&rev.data.template, &rev.data.overrides, &labels);
                    if let Some(m) = &c.member {
                        assert!(m.ours, "overwrote a foreign object in {cluster}");
                        assert!(
                            !(m.revision.as_deref() == Some(revision) && m.digest == digest(&spec)),
                            "{cluster} written twice with {revision}"
                        );
                    }
                    let generation = c.member.as_ref().map_or(1, |m| m.generation + 1);
                    c.member = Some(Member {
                        ours: true,
                        revision: Some(revision.clone()),
                        digest: digest(&spec),
                        generation,
                        state: EntryState::Progressing,
                        reason: "GenerationNotObserved".into(),
                        message: String::new(),
                    });
                    self.writes.push((cluster.clone(), revision.clone()));
                }
                Action::Delete { cluster } => {
                    let c = self
                        .clusters
                        .iter_mut()
                        .find(|c| &c.name == cluster)
                        .unwrap();
                    assert!(c.member.as_ref().is_some_and(|m| m.ours));
                    assert!(c.reachable, "deleted in unreachable {cluster}");
                    c.member = None;
                    self.deletes.push(cluster.clone());
                }
            }
        }
        p
    }

    /// The Progressing condition's reason and message.
    fn progressing(&self) -> (&str, &str) {
        let c = self
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == PROGRESSING);
        let c = c.expect("a Progressing condition");
        (&c.reason, &c.message)
    }

    fn written_clusters(&self) -> Vec<String> {
        self.clusters
            .iter()
            .filter(|c| c.member.is_some())
            .map(|c| c.name.clone())
            .collect()
    }

    fn set(&mut self, cluster: &str, state: EntryState, reason: &str) {
        let c = self
            .clusters
            .iter_mut()
            .find(|c| c.name == cluster)
            .unwrap();
        let m = c.member.as_mut().expect("member");
        m.state = state;
        m.reason = reason.into();
    }

    fn done(&mut self, cluster: &str) {
        self.set(cluster, EntryState::Done, "MinimumReplicasAvailable");
    }

    fn wait(&mut self, secs: u64) {
        self.now += Duration::from_secs(secs);
    }

    fn written(&self, revision: &str) -> Vec<&str> {
        self.writes
            .iter()
            .filter(|(_, r)| r == revision)
            .map(|(c, _)| c.as_str())
            .collect()
    }

    fn state(&self, cluster: &str) -> ClusterState {
        self.status
            .clusters
            .iter()
            .find(|c| c.name == cluster)
            .unwrap()
            .state
    }

    fn condition(&self, type_: &str) -> (String, String) {
        let c = self
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .unwrap();
        (c.status.clone(), c.reason.clone())
    }

    /// Drive the current revision to Complete: every written member turns done.
    fn complete(&mut self) {
        self.settle(RolloutPhase::Complete)
    }

    /// Drive the current revision until its phase is `phase`, every
    /// written member turning done.
    fn settle(&mut self, phase: RolloutPhase) {
        for _ in 0..20 {
            let p = self.step();
            if p.status.phase == Some(phase) {
                return;
            }
            let written: Vec<String> = self
                .clusters
                .iter()
                .filter(|c| c.member.is_some())
                .map(|c| c.name.clone())
                .collect();
            for c in written {
                self.done(&c);
            }
            self.wait(31);
        }
        panic!("no {phase:?}: {:?}", self.status);
    }
}

fn rev(world: &World, image: &str) -> String {
    let mut s = world.spec.clone();
    s.template.image = image.into();
    name_for("api", &RevisionData::of(&s))
}

#[test]
fn the_canary_goes_first_and_the_rest_wait_for_its_bake() {
    let mut w = World::three();
    let r1 = rev(&w, "app:1");
    let p = w.step();
    assert_eq!(
        p.actions,
        vec![Action::Apply {
            cluster: "m1".into(),
            revision: r1.clone()
        }]
    );
    assert_eq!(w.status.phase, Some(RolloutPhase::Progressing));
    assert_eq!(w.status.wave.as_deref(), Some("canary"));
    assert_eq!(w.state("m2"), ClusterState::Pending);
    // Written but not done: nothing more, and the deadline is the next wake-up.
    let p = w.step();
    assert!(p.actions.is_empty());
    // A second more than the deadline: stamps keep whole seconds.
    assert_eq!(p.requeue_after, Some(Duration::from_secs(61)));
    w.wait(5);
    w.done("m1");
    let p = w.step();
    assert!(p.actions.is_empty(), "baking: {:?}", p.actions);
    assert_eq!(p.requeue_after, Some(Duration::from_secs(31)));
    assert_eq!(w.status.waves[0].state, WaveState::Baking);
    w.wait(30);
    assert!(
        w.step().actions.is_empty(),
        "30 s after a whole-second stamp may be 29.x s of a 30 s bake"
    );
    w.wait(1);
    let p = w.step();
    assert_eq!(
        p.actions,
        vec![
            Action::Apply {
                cluster: "m2".into(),
                revision: r1.clone()
            },
            Action::Apply {
                cluster: "m3".into(),
                revision: r1.clone()
            },
        ]
    );
    assert_eq!(w.status.waves[0].state, WaveState::Done);
    assert_eq!(w.status.wave.as_deref(), Some("remaining"));
    w.done("m2");
    w.done("m3");
    w.step();
    w.wait(31);
    let p = w.step();
    assert!(p.actions.is_empty());
    assert_eq!(w.status.phase, Some(RolloutPhase::Complete));
    assert_eq!(w.status.last_good_revision.as_deref(), Some(r1.as_str()));
    assert_eq!(w.status.current_revision.as_deref(), Some(r1.as_str()));
    assert_eq!(
        w.condition(AVAILABLE),
        ("True".into(), "AllClustersAvailable".into())
    );
    assert_eq!(
        w.condition(PROGRESSING),
        ("False".into(), "RolloutComplete".into())
    );
    assert_eq!(w.writes.len(), 3, "one write per cluster: {:?}", w.writes);
}

#[test]
fn a_failed_canary_is_rolled_back_and_the_rest_never_see_the_release() {
    let mut w = World::three();
    w.complete();
    let good = rev(&w, "app:1");
    w.spec.template.image = "app:bad".into();
    let bad = rev(&w, "app:bad");
    let p = w.step();
    assert_eq!(
        p.actions,
        vec![Action::Apply {
            cluster: "m1".into(),
            revision: bad.clone()
        }]
    );
    w.set("m1", EntryState::Failed, "ProgressDeadlineExceeded");
    let p = w.step();
    assert_eq!(
        p.actions,
        vec![Action::Apply {
            cluster: "m1".into(),
            revision: good.clone()
        }]
    );
    assert_eq!(w.status.phase, Some(RolloutPhase::RolledBack));
    assert_eq!(
        w.condition(ROLLED_BACK),
        ("True".into(), "RolledBack".into())
    );
    assert_eq!(w.status.failed_revision_number, Some(2));
    assert_eq!(w.written(&bad), vec!["m1"]);
    // Back on the good revision and done: it stays rolled back, and keeps
    // saying which cluster failed.
    w.done("m1");
    let message = |w: &World| {
        w.status
            .conditions
            .iter()
            .find(|c| c.type_ == ROLLED_BACK)
            .unwrap()
            .message
            .clone()
    };
    let first = message(&w);
    assert!(first.contains("failed in m1"), "{first}");
    for _ in 0..3 {
        w.wait(60);
        assert!(w.step().actions.is_empty());
        assert_eq!(message(&w), first);
        assert_eq!(w.status.failed_clusters, vec!["m1"]);
    }
    assert_eq!(w.status.phase, Some(RolloutPhase::RolledBack));
    assert_eq!(w.state("m1"), ClusterState::Done);
    assert_eq!(w.written(&bad), vec!["m1"], "m2 and m3 never see it");
    // Its row says which revision failed there, not only where it is now.
    let m1 = w.status.clusters.iter().find(|c| c.name == "m1").unwrap();
    assert_eq!(m1.reason, "RolledBack", "{m1:?}");
    assert!(
        m1.message.contains(&bad) && m1.message.contains(&good),
        "{}",
        m1.message
    );
    let m2 = w.status.clusters.iter().find(|c| c.name == "m2").unwrap();
    assert_ne!(m2.reason, "RolledBack", "m2 never had it: {m2:?}");
}

#[test]
fn not_done_within_the_deadline_fails_and_an_unreachable_cluster_counts_as_not_done() {
    let mut w = World::three();
    w.complete();
    let good = rev(&w, "app:1");
    w.spec.template.image = "app:2".into();
    w.step();
    w.clusters[0].reachable = false;
    w.set("m1", EntryState::Unknown, "ClusterUnreachable");
    w.wait(60);
    let p = w.step();
    assert!(p.actions.is_empty());
    assert_eq!(p.requeue_after, Some(Duration::from_secs(1)));
    assert_eq!(w.state("m1"), ClusterState::Unknown);
    w.wait(1);
    let p = w.step();
    assert_eq!(w.status.phase, Some(RolloutPhase::RolledBack));
    assert!(
        p.actions.is_empty(),
        "nothing is written to an unreachable cluster"
    );
    let m1 = w.status.clusters.iter().find(|c| c.name == "m1").unwrap();
    assert_eq!(
        (m1.state, m1.reason.as_str()),
        (ClusterState::Failed, "ClusterUnreachable")
    );
    assert_eq!(m1.target.as_deref(), Some(good.as_str()));
    // It returns: it gets the final decision, the good revision.
    w.clusters[0].reachable = true;
    w.set("m1", EntryState::Progressing, "GenerationNotObserved");
    let p = w.step();
    assert_eq!(
        p.actions,
        vec![Action::Apply {
            cluster: "m1".into(),
            revision: good
        }]
    );
}

#[test]
fn pause_on_failure_holds_and_continues_when_the_failure_clears() {
    let mut w = World::three();
    w.complete();
    w.spec.rollout.on_failure = OnFailure::Pause;
    w.spec.template.image = "app:2".into();
    let r2 = rev(&w, "app:2");
    w.step();
    w.set("m1", EntryState::Failed, "ProgressDeadlineExceeded");
    let p = w.step();
    assert!(p.actions.is_empty());
    assert_eq!(w.status.phase, Some(RolloutPhase::Paused));
    assert_eq!(
        w.condition(PROGRESSING),
        ("Unknown".into(), "ClusterFailed".into())
    );
    assert_eq!(w.status.failed_revision_number, None);
    w.done("m1");
    w.step();
    w.wait(31);
    let p = w.step();
    assert_eq!(p.actions.len(), 2, "{:?}", p.actions);
    assert!(w.written(&r2).contains(&"m2"));
}

#[test]
fn held_on_failure_a_returning_cluster_still_gets_what_it_was_given() {
    let mut w = World::three();
    w.complete();
    w.spec.rollout.on_failure = OnFailure::Pause;
    w.spec.template.image = "app:2".into();
    let r2 = rev(&w, "app:2");
    w.step();
    w.done("m1");
    w.step();
    w.wait(31);
    // Wave 2 opens and targets both; the leader dies before writing. Then
    // m2 goes down and cannot be written; m3 gets it and is done.
    let p = w.plan();
    w.status = p.status;
    w.clusters[1].reachable = false;
    w.step();
    w.done("m3");
    w.wait(61);
    w.step();
    assert_eq!(w.status.phase, Some(RolloutPhase::Paused));
    assert_eq!(w.state("m2"), ClusterState::Failed);
    // m2 returns: it is given the update it was targeted with, then done.
    w.clusters[1].reachable = true;
    let p = w.step();
    assert_eq!(
        p.actions,
        vec![Action::Apply {
            cluster: "m2".into(),
            revision: r2
        }]
    );
    w.done("m2");
    w.step();
    w.wait(31);
    w.step();
    assert_eq!(w.status.phase, Some(RolloutPhase::Complete));
}

#[test]
fn a_first_release_that_fails_has_nothing_to_go_back_to() {
    let mut w = World::three();
    w.step();
    w.set("m1", EntryState::Failed, "InvalidSpec");
    let p = w.step();
    assert!(p.actions.is_empty());
    assert_eq!(w.status.phase, Some(RolloutPhase::Failed));
    assert_eq!(
        w.condition(PROGRESSING),
        ("False".into(), "RolloutFailed".into())
    );
}

#[test]
fn a_template_edit_mid_rollout_starts_again_from_the_first_wave() {
    let mut w = World::three();
    w.complete();
    w.spec.template.image = "app:2".into();
    let r2 = rev(&w, "app:2");
    w.step();
    w.done("m1");
    w.step();
    w.wait(31);
    w.step(); // wave 2 gets r2
    assert_eq!(w.written(&r2), vec!["m1", "m2", "m3"]);
    w.spec.template.image = "app:3".into();
    let r3 = rev(&w, "app:3");
    let p = w.step();
    assert_eq!(
        p.actions,
        vec![Action::Apply {
            cluster: "m1".into(),
            revision: r3.clone()
        }]
    );
    assert_eq!(w.status.wave.as_deref(), Some("canary"));
    assert_eq!(w.state("m2"), ClusterState::Pending);
}

#[test]
fn paused_writes_nothing_and_resumes_where_it_stopped() {
    let mut w = World::three();
    w.spec.paused = true;
    let p = w.step();
    assert!(p.actions.is_empty());
    assert_eq!(w.status.phase, Some(RolloutPhase::Paused));
    w.spec.paused = false;
    let p = w.step();
    assert_eq!(p.actions.len(), 1);
}

#[test]
fn max_parallel_bounds_the_clusters_updating_at_once() {
    let mut w = World::new(&[("a", &[]), ("b", &[]), ("c", &[])]);
    w.spec.rollout.waves = vec![Wave {
        name: "all".into(),
        cluster_selector: LabelSelector::default(),
        max_parallel: Some(IntOrString::Int(1)),
        approval: Default::default(),
    }];
    w.spec.rollout.bake = None;
    for expected in ["a", "b", "c"] {
        let p = w.step();
        assert_eq!(p.actions.len(), 1, "{:?}", p.actions);
        assert!(matches!(&p.actions[0], Action::Apply { cluster, .. } if cluster == expected));
        assert!(w.step().actions.is_empty(), "one at a time");
        w.done(expected);
    }
    w.step();
    assert_eq!(w.status.phase, Some(RolloutPhase::Complete));
}

#[test]
fn placement_overrides_conflicts_and_unknown_labels() {
    let mut w = World::new(&[
        ("m1", &[("env", "prod"), ("region", "eu")]),
        ("m2", &[("env", "prod")]),
        ("m3", &[("env", "dev")]),
    ]);
    w.spec.placement.cluster_selector = sel("env", "prod");
    w.spec.rollout.waves.clear();
    w.spec.overrides = vec![Override {
        cluster_selector: sel("region", "eu"),
        replicas: Some(5),
        env: vec![],
    }];
    let p = w.step();
    assert_eq!(p.actions.len(), 2);
    assert!(w.clusters[2].member.is_none(), "m3 is not placed");
    let m1 = w.clusters[0].member.clone().unwrap();
    let mut five = w.spec.template.clone();
    five.replicas = 5;
    assert_eq!(m1.digest, digest(&five));
    // Drift: someone edits m2's object; the same revision is written back.
    w.clusters[1].member.as_mut().unwrap().digest = 42;
    let p = w.step();
    assert!(matches!(&p.actions[..], [Action::Apply { cluster, .. }] if cluster == "m2"));
    // m1 leaves the placement: deleted. m3's labels become unreadable: untouched.
    w.clusters[0].labels = Some(BTreeMap::from([("env".to_string(), "dev".to_string())]));
    w.clusters[2].labels = None;
    let p = w.step();
    assert_eq!(
        p.actions,
        vec![Action::Delete {
            cluster: "m1".into()
        }]
    );
    // A foreign object is never written, and fails the cluster.
    let mut w = World::three();
    w.spec.rollout.max_failed_clusters = 1;
    w.clusters[1].member = Some(foreign());
    w.settle(RolloutPhase::Degraded);
    let m2 = w.status.clusters.iter().find(|c| c.name == "m2").unwrap();
    assert_eq!(
        (m2.state, m2.reason.as_str()),
        (ClusterState::Failed, "OwnershipConflict")
    );
    assert!(!w.writes.iter().any(|(c, _)| c == "m2"));
    assert_eq!(w.condition(AVAILABLE).0, "False");
    // Within the budget, but not the whole truth: never Complete.
    assert_eq!(
        w.condition(PROGRESSING),
        ("False".into(), "RolloutDegraded".into())
    );
    assert_eq!(w.status.last_good_revision, None);
}

#[test]
fn bad_specs_are_refused_with_the_reason() {
    let mut w = World::three();
    w.spec.rollout.bake = Some("soon".into());
    let p = w.step();
    assert!(p.actions.is_empty());
    assert_eq!(w.status.phase, Some(RolloutPhase::Failed));
    let c = w
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == PROGRESSING)
        .unwrap();
    assert_eq!(c.reason, "InvalidSpec");
    assert!(c.message.contains("rollout.bake"), "{}", c.message);
    let mut w = World::three();
    w.spec.rollout.waves.push(Wave {
        name: "remaining".into(),
        cluster_selector: LabelSelector::default(),
        max_parallel: None,
        approval: Default::default(),
    });
    assert!(w.step().actions.is_empty());
    let mut w = World::three();
    w.spec.template.image = "Not An Image".into();
    assert!(w.step().actions.is_empty());
}

#[test]
fn an_undo_to_the_failed_content_is_a_fresh_attempt() {
    let mut w = World::three();
    w.complete();
    w.spec.template.image = "app:2".into();
    w.step();
    w.set("m1", EntryState::Failed, "ProgressDeadlineExceeded");
    w.step();
    assert_eq!(w.status.phase, Some(RolloutPhase::RolledBack));
    // Back to app:1 (renumbered 3): complete at once, nothing failed.
    w.spec.template.image = "app:1".into();
    w.done("m1");
    w.step();
    assert_eq!(w.status.phase, Some(RolloutPhase::Complete));
    // app:2 again is revision 4: tried again from the canary.
    w.spec.template.image = "app:2".into();
    let p = w.step();
    assert_eq!(w.status.update_revision_number, Some(4));
    assert_eq!(p.actions.len(), 1);
    assert_eq!(w.status.phase, Some(RolloutPhase::Progressing));
}

#[test]
fn equal_inputs_give_an_equal_plan() {
    let mut w = World::three();
    w.complete();
    w.spec.template.image = "app:2".into();
    w.step();
    let a = w.plan();
    let b = w.plan();
    assert_eq!(a, b);
    // The status it writes is stable: planning on it again changes nothing.
    w.step();
    let before = w.status.clone();
    w.step();
    assert_eq!(before, w.status);
}

mod orders {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Event {
        Plan,
        /// A leader writes the status, then dies before acting.
        CrashAfterStatus,
        Done(usize),
        Wait(u64),
        Edit(u8),
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            4 => Just(Event::Plan),
            1 => Just(Event::CrashAfterStatus),
            3 => (0usize..3).prop_map(Event::Done),
            2 => (1u64..40).prop_map(Event::Wait),
            1 => (1u8..4).prop_map(Event::Edit),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        /// Whatever the order of events: no cluster is written twice with
        /// the same revision (asserted in `step`), the rest never get a
        /// revision before the canary was done with it for the bake time,
        /// and the rollout completes once the members turn done.
        #[test]
        fn waves_hold_in_any_order(events in proptest::collection::vec(event(), 1..60)) {
            let mut w = World::three();
            // Deadlines are another test's subject: none passes here.
            w.spec.rollout.progress_deadline = Some("2h".into());
            // When the canary turned done, and at which revision.
            let mut canary_done: Option<(String, Timestamp)> = None;
            for e in events {
                match e {
                    Event::Plan => {
                        // An edit back to the revision that completed last
                        // goes everywhere at once: it ran before.
                        let good = w.status.last_good_revision.clone();
                        let p = w.step();
                        for a in &p.actions {
                            if let Action::Apply { cluster, revision } = a {
                                if good.as_ref() == Some(revision) {
                                    continue;
                                }
                                if cluster == "m1" {
                                    canary_done = None;
                                } else {
                                    let (rev, at) = canary_done.clone().expect("the canary was done first");
                                    prop_assert_eq!(&rev, revision);
                                    prop_assert!(w.now.as_second() - at.as_second() >= 30, "baked");
                                }
                            }
                        }
                    }
                    Event::CrashAfterStatus => {
                        let p = w.plan();
                        w.status = p.status;
                    }
                    Event::Done(i) => {
                        let name = ["m1", "m2", "m3"][i];
                        if let Some(m) = w.clusters[i].member.clone()
                            && m.state != EntryState::Done
                        {
                            w.done(name);
                            if i == 0 {
                                canary_done = Some((m.revision.clone().unwrap(), w.now));
                            }
                        }
                    }
                    Event::Wait(s) => w.wait(s),
                    Event::Edit(n) => w.spec.template.image = format!("app:{n}"),
                }
            }
            for _ in 0..12 {
                for i in 0..3 {
                    if w.clusters[i].member.is_some() {
                        w.set(["m1", "m2", "m3"][i], EntryState::Done, "Available");
                    }
                }
                w.step();
                w.wait(31);
            }
            prop_assert_eq!(w.status.phase, Some(RolloutPhase::Complete));
            prop_assert_eq!(&w.status.last_good_revision, &w.status.update_revision);
        }
    }
}

mod review {
    //! Cases a review found by reading: each failed before its fix.
    use super::*;

    #[test]
    fn a_canary_whose_labels_vanish_holds_its_wave() {
        let mut w = World::three();
        w.complete();
        w.spec.template.image = "app:2".into();
        let r2 = rev(&w, "app:2");
        w.step();
        w.clusters[0].labels = None;
        for _ in 0..3 {
            w.wait(31);
            let p = w.step();
            assert!(p.actions.is_empty(), "the rest wait: {:?}", p.actions);
        }
        assert_eq!(w.written(&r2), vec!["m1"]);
        // Past the deadline since its labels went: failed, not held forever.
        assert_eq!(w.status.waves[0].state, WaveState::Failed);
        assert_eq!(w.status.phase, Some(RolloutPhase::RolledBack));
    }

    #[test]
    fn a_revision_that_ran_nowhere_is_not_good() {
        let mut w = World::three();
        w.spec.placement.cluster_selector = sel("env", "none");
        w.step();
        assert_eq!(w.status.phase, Some(RolloutPhase::Degraded));
        assert_eq!(
            w.condition(PROGRESSING),
            ("False".into(), "NoClusterPlaced".into())
        );
        assert_eq!(w.status.last_good_revision, None);
    }

    /// Review H4: the canary tolerates no failure, whatever the budget; it
    /// used to count as finished and open the next wave.
    #[test]
    fn a_failed_canary_within_the_budget_still_stops_the_release() {
        let mut w = World::three();
        w.complete();
        w.spec.rollout.max_failed_clusters = 1;
        w.spec.template.image = "app:2".into();
        let r2 = rev(&w, "app:2");
        w.step();
        // The canary never turns done: one failure, within the budget.
        w.wait(62);
        w.step();
        assert_eq!(w.state("m1"), ClusterState::Failed);
        assert_eq!(w.status.phase, Some(RolloutPhase::RolledBack));
        for _ in 0..3 {
            w.wait(31);
            w.step();
        }
        assert_eq!(w.written(&r2), vec!["m1"], "m2 and m3 never see it");
    }

    /// Review H4: a wave whose every cluster failed is failed, not finished,
    /// and a release that runs nowhere is never Complete.
    #[test]
    fn every_cluster_failed_within_the_budget_is_not_complete() {
        let mut w = World::new(&[("m1", &[])]);
        w.spec.rollout.waves.clear();
        w.spec.rollout.max_failed_clusters = 1;
        w.step();
        w.set("m1", EntryState::Failed, "InvalidSpec");
        w.step();
        assert_ne!(w.status.phase, Some(RolloutPhase::Complete));
        assert_eq!(w.status.phase, Some(RolloutPhase::Failed));
        assert_eq!(w.status.waves[0].state, WaveState::Failed);
    }

    /// Review H4: a cluster of a finished wave that regresses while the last
    /// wave bakes keeps the rollout from Complete.
    #[test]
    fn a_regression_in_a_finished_wave_is_not_complete() {
        let mut w = World::three();
        w.spec.rollout.max_failed_clusters = 3;
        w.step();
        w.done("m1");
        w.step();
        w.wait(31);
        w.step();
        w.done("m2");
        w.done("m3");
        w.step();
        w.set("m1", EntryState::Progressing, "ReplicasUnavailable");
        w.wait(31);
        w.step();
        assert_eq!(w.status.waves[0].state, WaveState::Done);
        assert_eq!(w.status.phase, Some(RolloutPhase::Progressing));
        assert_eq!(w.status.last_good_revision, None);
    }

    /// Review H3: an empty canary proves nothing; the rest wait for one.
    #[test]
    fn an_empty_canary_holds_the_rest_unless_the_spec_opts_out() {
        let mut w = World::new(&[("m2", &[]), ("m3", &[])]);
        for _ in 0..3 {
            assert!(w.step().actions.is_empty());
            w.wait(31);
        }
        assert_eq!(w.status.waves[0].state, WaveState::Skipped);
        assert_eq!(
            w.condition(PROGRESSING),
            ("True".into(), "WaitingForCanary".into())
        );
        w.spec.rollout.require_canary = Some(false);
        assert_eq!(w.step().actions.len(), 2, "opted out: the rest go");
        w.settle(RolloutPhase::Complete);
        assert_eq!(w.status.waves[0].state, WaveState::Skipped);
    }

    /// Review H3: the canary leaves the registry while it bakes; its wave
    /// does not pass, the rest get nothing, and after the deadline it fails.
    #[test]
    fn a_canary_gone_from_the_registry_holds_then_fails_its_wave() {
        let mut w = World::three();
        w.complete();
        w.spec.template.image = "app:2".into();
        let r2 = rev(&w, "app:2");
        w.step();
        w.done("m1");
        w.step();
        let canary = w.clusters.remove(0);
        for _ in 0..2 {
            w.wait(31);
            assert!(w.step().actions.is_empty(), "the rest wait");
        }
        assert_eq!(w.written(&r2), vec!["m1"]);
        let m1 = w.status.clusters.iter().find(|c| c.name == "m1").unwrap();
        assert_eq!(
            (m1.state, m1.reason.as_str()),
            (ClusterState::Unknown, NOT_REGISTERED)
        );
        assert_eq!(w.status.waves[0].clusters, vec!["m1"]);
        // It comes back in time: its evidence counts again.
        w.clusters.insert(0, canary);
        w.step();
        w.wait(31);
        w.step();
        assert_eq!(w.written(&r2).len(), 3, "{:?}", w.writes);
        // Gone for longer than the deadline, in a fresh release: failed.
        let mut w = World::three();
        w.complete();
        w.spec.template.image = "app:3".into();
        w.step();
        w.clusters.remove(0);
        w.step();
        w.wait(62);
        w.step();
        assert_eq!(w.status.phase, Some(RolloutPhase::RolledBack));
        assert_eq!(w.status.failed_clusters, vec!["m1"]);
    }

    /// Review H3: the canary relabelled out of its wave mid-bake stays in
    /// it: its wave neither empties (and passes) nor loses the bake.
    #[test]
    fn a_canary_relabelled_mid_bake_stays_in_its_wave() {
        let mut w = World::three();
        w.complete();
        w.spec.template.image = "app:2".into();
        let r2 = rev(&w, "app:2");
        w.step();
        w.done("m1");
        w.step();
        w.wait(10);
        w.clusters[0].labels = Some(BTreeMap::from([("ring".into(), "main".into())]));
        let p = w.step();
        assert!(p.actions.is_empty(), "the rest wait: {:?}", p.actions);
        assert_eq!(w.status.waves[0].clusters, vec!["m1"]);
        assert_eq!(w.status.waves[0].state, WaveState::Baking);
        w.wait(21);
        w.step();
        assert_eq!(w.written(&r2), vec!["m1", "m2", "m3"], "after the bake");
    }

    /// Review M6: a placement edit that removes the service everywhere goes
    /// wave by wave, the canary first, and the status says who waits.
    #[test]
    fn leaving_the_placement_goes_wave_by_wave() {
        let mut w = World::three();
        w.complete();
        w.spec.placement.cluster_selector = sel("env", "none");
        let p = w.plan();
        assert_eq!(
            p.actions,
            vec![Action::Delete {
                cluster: "m1".into()
            }]
        );
        // The status is written; the index still shows m1: the same again.
        w.status = p.status;
        let p = w.step();
        assert_eq!(p.actions.len(), 1, "{:?}", p.actions);
        let m2 = w.status.clusters.iter().find(|c| c.name == "m2").unwrap();
        assert_eq!(
            (m2.state, m2.reason.as_str()),
            (ClusterState::Removing, "WaitingToLeave")
        );
        // m1 is gone: the rest leave.
        let p = w.step();
        assert_eq!(p.actions.len(), 2, "{:?}", p.actions);
        assert_eq!(w.deletes, vec!["m1", "m2", "m3"]);
    }

    /// Review M4: a cluster already down when its wave opens takes no slot,
    /// so it neither blocks the others nor fails a release it never got.
    #[test]
    fn a_cluster_down_before_its_turn_takes_no_slot() {
        let mut w = World::new(&[("a", &[]), ("b", &[]), ("c", &[])]);
        w.spec.rollout.waves = vec![Wave {
            name: "all".into(),
            cluster_selector: LabelSelector::default(),
            max_parallel: Some(IntOrString::Int(1)),
            approval: Default::default(),
        }];
        w.clusters[0].reachable = false;
        let p = w.step();
        assert!(matches!(&p.actions[..], [Action::Apply { cluster, .. }] if cluster == "b"));
        let a = w.status.clusters.iter().find(|c| c.name == "a").unwrap();
        assert_eq!(
            (a.state, a.reason.as_str()),
            (ClusterState::Pending, "ClusterUnreachable")
        );
        w.done("b");
        w.step();
        w.done("c");
        for _ in 0..3 {
            w.wait(61);
            w.step();
        }
        assert!(w.status.failed_clusters.is_empty());
        assert_eq!(
            w.status.phase,
            Some(RolloutPhase::Progressing),
            "it waits for a"
        );
        w.clusters[0].reachable = true;
        let p = w.step();
        assert!(matches!(&p.actions[..], [Action::Apply { cluster, .. }] if cluster == "a"));
    }

    /// Review M2: a member that refuses the write shows why in its state,
    /// and a permanent refusal fails the cluster at once, not at the deadline.
    #[test]
    fn a_refused_write_shows_and_a_permanent_one_fails_at_once() {
        use crate::rollout::trouble::{Kind, Trouble};
        let mut w = World::three();
        let r1 = rev(&w, "app:1");
        let p = w.plan();
        assert_eq!(p.actions.len(), 1);
        let spec = member_spec(
            &w.spec.template,
            &[],
            w.clusters[0].labels.as_ref().unwrap(),
        );
        let refused = |code| Trouble {
            revision: r1.clone(),
            digest: digest(&spec),
            kind: Kind::Refused {
                code,
                message: "denied by policy".into(),
            },
        };
        w.status = p.status;
        w.troubles.insert("m1".into(), refused(503));
        let p = w.plan();
        assert_eq!(p.actions.len(), 1, "a transient one is tried again");
        let m1 = p.status.clusters.iter().find(|c| c.name == "m1").unwrap();
        assert_eq!(
            (m1.state, m1.reason.as_str()),
            (ClusterState::Updating, "WriteFailed")
        );
        assert!(m1.message.contains("HTTP 503"), "{}", m1.message);
        w.troubles.insert("m1".into(), refused(403));
        let p = w.step();
        assert!(p.actions.is_empty(), "not written again: {:?}", p.actions);
        let m1 = w.status.clusters.iter().find(|c| c.name == "m1").unwrap();
        assert_eq!(
            (m1.state, m1.reason.as_str()),
            (ClusterState::Failed, "WriteFailed")
        );
        assert!(m1.message.contains("denied by policy"), "{}", m1.message);
        assert_eq!(
            w.status.phase,
            Some(RolloutPhase::Failed),
            "a canary failure"
        );
    }

    /// Review M1: a member that cannot hold the written spec is tried once
    /// more, then SpecRejected, never rewritten every round.
    #[test]
    fn a_member_that_alters_the_spec_is_spec_rejected_not_rewritten() {
        use crate::rollout::trouble::{Kind, Trouble};
        let mut w = World::three();
        w.complete();
        w.spec.template.image = "app:2".into();
        let r2 = rev(&w, "app:2");
        w.step();
        // What m1 stored differs from what was written.
        w.clusters[0].member.as_mut().unwrap().digest = 42;
        let spec = member_spec(
            &w.spec.template,
            &[],
            w.clusters[0].labels.as_ref().unwrap(),
        );
        let altered = |times| Trouble {
            revision: r2.clone(),
            digest: digest(&spec),
            kind: Kind::Altered { times },
        };
        w.troubles.insert("m1".into(), altered(1));
        let p = w.plan();
        assert_eq!(p.actions.len(), 1, "one retry");
        w.troubles.insert("m1".into(), altered(2));
        let p = w.plan();
        let m1 = p.status.clusters.iter().find(|c| c.name == "m1").unwrap();
        assert_eq!(
            (m1.state, m1.reason.as_str()),
            (ClusterState::Failed, "SpecRejected")
        );
        assert!(m1.message.contains("different spec"), "{}", m1.message);
        for _ in 0..3 {
            let p = w.plan();
            let again = Action::Apply {
                cluster: "m1".into(),
                revision: r2.clone(),
            };
            assert!(!p.actions.contains(&again), "{:?}", p.actions);
            w.status = p.status;
        }
        assert_eq!(w.status.phase, Some(RolloutPhase::RolledBack));
        assert_eq!(w.status.failed_clusters, vec!["m1"]);
    }

    /// Review H5: a cluster taken out of the registry stays on the record
    /// of clusters the object reached, so its deletion waits for it; a
    /// cluster never reached holds nothing up.
    #[test]
    fn the_record_of_reached_clusters_survives_an_unregistration() {
        let mut w = World::new(&[("m1", &[("ring", "canary")]), ("m2", &[]), ("m3", &[])]);
        w.spec.placement.cluster_selector = LabelSelector {
            match_expressions: Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                    key: "ring".into(),
                    operator: "Exists".into(),
                    values: None,
                },
            ]),
            ..Default::default()
        };
        w.spec.rollout.require_canary = Some(false);
        w.complete();
        assert_eq!(w.status.reached_clusters, vec!["m1"]);
        let m1 = w.clusters.remove(0);
        for _ in 0..3 {
            w.wait(5);
            w.step();
        }
        assert_eq!(w.status.reached_clusters, vec!["m1"], "kept while away");
        // m2 is down and m3 Invalid: never reached, so they hold nothing up.
        w.clusters[0].reachable = false;
        w.clusters[1].synced = false;
        w.clusters[1].reachable = false;
        let todo = crate::rollout::observe::cleanup(&w.clusters, &w.status);
        assert_eq!(todo.blocked, vec!["m1 (not registered)"]);
        assert!(todo.delete.is_empty());
        // Back, and read live.
        w.clusters.insert(0, m1);
        let todo = crate::rollout::observe::cleanup(&w.clusters, &w.status);
        assert_eq!(todo.delete, vec!["m1"]);
    }

    /// Review M7: a cluster whose labels stay unreadable fails at the
    /// progress deadline instead of holding the rollout forever.
    #[test]
    fn unreadable_labels_count_against_the_deadline() {
        let mut w = World::three();
        w.complete();
        w.spec.template.image = "app:2".into();
        w.step();
        w.clusters[0].labels = None;
        w.wait(30);
        w.step();
        // The deadline counts from when the labels became unreadable.
        w.wait(31);
        w.step();
        assert_eq!(w.status.phase, Some(RolloutPhase::Progressing));
        w.wait(31);
        w.step();
        let m1 = w.status.clusters.iter().find(|c| c.name == "m1").unwrap();
        assert_eq!(
            (m1.state, m1.reason.as_str()),
            (ClusterState::Failed, LABELS_UNKNOWN)
        );
        assert_eq!(w.status.phase, Some(RolloutPhase::RolledBack));
        assert_eq!(w.status.failed_clusters, vec!["m1"]);
    }

    /// Review M5: a successor whose clock runs two minutes ahead of the
    /// replica that stamped the canary done does not end its 30 s bake at
    /// once; it bakes 30 s on its own clock.
    #[test]
    fn a_successor_with_a_clock_ahead_still_bakes() {
        let mut w = World::three();
        w.complete();
        w.spec.template.image = "app:2".into();
        w.step();
        w.done("m1");
        w.step();
        assert_eq!(w.status.waves[0].state, WaveState::Baking);
        // Failover to a replica whose clock reads two minutes later.
        w.wait(120);
        w.term_started = w.now;
        let p = w.step();
        assert!(
            p.actions.is_empty(),
            "the bake is not over: {:?}",
            p.actions
        );
        assert_eq!(w.status.waves[0].state, WaveState::Baking);
        w.wait(31);
        assert_eq!(w.step().actions.len(), 2, "then the rest go");
        // Deadlines alike: a skewed successor does not fail a cluster early.
        let mut w = World::three();
        w.complete();
        w.spec.template.image = "app:3".into();
        w.step();
        w.wait(120);
        w.term_started = w.now;
        w.step();
        assert_eq!(w.status.phase, Some(RolloutPhase::Progressing));
        w.wait(31);
        w.step();
        assert_eq!(
            w.status.phase,
            Some(RolloutPhase::RolledBack),
            "after 30 s of its own"
        );
    }

    /// Review test gap 4: maxParallel holds while the index lags the writes.
    #[test]
    fn max_parallel_holds_while_the_index_lags() {
        let mut w = World::new(&[("a", &[]), ("b", &[]), ("c", &[])]);
        w.spec.rollout.waves = vec![Wave {
            name: "all".into(),
            cluster_selector: LabelSelector::default(),
            max_parallel: Some(IntOrString::Int(1)),
            approval: Default::default(),
        }];
        let p = w.plan();
        assert_eq!(p.actions.len(), 1);
        // The status is written, the write not yet seen by the index.
        w.status = p.status;
        let p = w.plan();
        assert_eq!(p.actions.len(), 1, "the same one again: {:?}", p.actions);
    }

    /// Review H1: a typo behind a requirement that fails is InvalidSpec,
    /// and nothing is deleted or written.
    #[test]
    fn a_selector_typo_deletes_nothing() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement as Req;
        let typo = LabelSelector {
            match_expressions: Some(vec![
                Req {
                    key: "ring".into(),
                    operator: "Exists".into(),
                    values: None,
                },
                Req {
                    key: "tier".into(),
                    operator: "in".into(),
                    values: Some(vec!["web".into()]),
                },
            ]),
            ..Default::default()
        };
        for place in ["placement", "wave", "override"] {
            let mut w = World::three();
            w.complete();
            match place {
                "placement" => w.spec.placement.cluster_selector = typo.clone(),
                "wave" => w.spec.rollout.waves[0].cluster_selector = typo.clone(),
                _ => w.spec.overrides.push(Override {
                    cluster_selector: typo.clone(),
                    replicas: Some(9),
                    env: vec![],
                }),
            }
            let p = w.step();
            assert!(p.actions.is_empty(), "{place}: {:?}", p.actions);
            assert!(w.deletes.is_empty(), "{place}");
            assert_eq!(w.condition(PROGRESSING).1, "InvalidSpec", "{place}");
        }
    }

    /// Review L8: an override that makes an invalid member spec (a reserved
    /// env name) is InvalidSpec at plan time: nothing written, rather than a
    /// canary that fails at the member.
    #[test]
    fn an_override_that_makes_an_invalid_spec_writes_nothing() {
        let mut w = World::three();
        w.complete();
        let before = w.writes.len();
        w.spec.template.image = "app:2".into();
        w.spec.overrides.push(Override {
            cluster_selector: sel("ring", "canary"),
            replicas: None,
            env: vec![crate::crd::EnvEntry {
                name: "OTEL_SERVICE_NAME".into(),
                value: "mine".into(),
            }],
        });
        rev(&w, "app:2");
        let p = w.step();
        assert!(p.actions.is_empty(), "{:?}", p.actions);
        assert_eq!(w.writes.len(), before);
        let c = w
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == PROGRESSING)
            .unwrap();
        assert_eq!(c.reason, "InvalidSpec");
        assert!(c.message.contains("overrides[0]"), "{}", c.message);
    }

    /// #31: `Failover` without primaries, primaries without `Failover`, and
    /// a bad primary selector are InvalidSpec: nothing is written.
    #[test]
    fn a_dns_strategy_that_cannot_be_followed_is_invalid() {
        use crate::rollout::spec::{Dns, DnsPrimary, DnsStrategy};
        let bad_selector = LabelSelector {
            match_expressions: Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                    key: "ring".into(),
                    operator: "in".into(),
                    values: Some(vec!["a".into()]),
                },
            ]),
            ..Default::default()
        };
        let cases = [
            (DnsStrategy::Failover, None, "needs dns.primary"),
            (
                DnsStrategy::RoundRobin,
                Some(sel("ring", "canary")),
                "only to dns.strategy Failover",
            ),
            (
                DnsStrategy::Failover,
                Some(bad_selector),
                "dns.primary.clusterSelector",
            ),
        ];
        for (strategy, primary, says) in cases {
            let mut w = World::three();
            w.complete();
            let before = w.writes.len();
            w.spec.template.image = "app:2".into();
            w.spec.dns = Some(Dns {
                strategy,
                primary: primary.map(|cluster_selector| DnsPrimary { cluster_selector }),
            });
            rev(&w, "app:2");
            let p = w.step();
            assert!(p.actions.is_empty(), "{says}: {:?}", p.actions);
            assert_eq!(w.writes.len(), before, "{says}");
            let c = w.status.conditions.iter().find(|c| c.type_ == PROGRESSING);
            let c = c.unwrap();
            assert_eq!(c.reason, "InvalidSpec", "{says}");
            assert!(c.message.contains(says), "{says}: {}", c.message);
        }
        // A valid Failover plans as usual.
        let mut w = World::three();
        w.spec.dns = Some(Dns {
            strategy: DnsStrategy::Failover,
            primary: Some(DnsPrimary {
                cluster_selector: sel("ring", "canary"),
            }),
        });
        w.complete();
        assert_ne!(w.condition(PROGRESSING).1, "InvalidSpec");
    }

    /// Review H2: a duration too long for any clock is InvalidSpec, and a
    /// planner that panics fails its object, not the process.
    #[test]
    fn an_oversized_bake_and_a_panicking_planner_fail_only_the_object() {
        for bake in ["20000000000000000000s", "10000000000000000s", "169h"] {
            let mut w = World::three();
            w.spec.rollout.bake = Some(bake.into());
            assert!(w.step().actions.is_empty());
            let c = w
                .status
                .conditions
                .iter()
                .find(|c| c.type_ == PROGRESSING)
                .unwrap();
            assert_eq!(c.reason, "InvalidSpec", "{bake}");
            assert!(c.message.contains("rollout.bake"), "{}", c.message);
        }
        let mut w = World::three();
        let update = w.update();
        let checked = crate::rollout::checked::check("api", &w.spec, &loopback()).unwrap();
        let inputs = Inputs {
            name: "api",
            uid: "uid-api",
            generation: 1,
            checked: Ok(&checked),
            update: &update,
            revisions: &w.revisions,
            previous: &w.status,
            clusters: &w.clusters,
            troubles: &w.troubles,
            now: w.now,
            term_started: w.term_started,
            approvals: &w.approvals,
            runs: &w.runs,
        };
        let p = guarded(&inputs, || panic!("a defect"));
        assert!(p.actions.is_empty());
        assert_eq!(p.status.phase, Some(RolloutPhase::Failed));
        let c = p
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == PROGRESSING)
            .unwrap();
        assert_eq!(c.reason, "InvalidSpec");
        assert!(c.message.contains("a defect"), "{}", c.message);
    }

    #[test]
    fn an_undo_to_the_last_good_is_complete_only_once_done_everywhere() {
        let mut w = World::three();
        w.complete();
        w.spec.template.image = "app:2".into();
        w.step();
        w.set("m1", EntryState::Failed, "ProgressDeadlineExceeded");
        w.step();
        // The rollback already wrote app:1 back to m1; it is not done yet.
        w.spec.template.image = "app:1".into();
        w.step();
        assert_eq!(w.status.phase, Some(RolloutPhase::Progressing));
        w.done("m1");
        w.step();
        assert_eq!(w.status.phase, Some(RolloutPhase::Complete));
    }

    #[test]
    fn a_pause_stops_the_deadline_clock() {
        let mut w = World::three();
        w.complete();
        w.spec.template.image = "app:2".into();
        w.step();
        w.spec.paused = true;
        w.step();
        w.wait(600);
        w.step();
        w.spec.paused = false;
        let p = w.step();
        assert_eq!(w.status.phase, Some(RolloutPhase::Progressing));
        assert_eq!(p.requeue_after, Some(Duration::from_secs(61)));
        w.wait(62);
        w.step();
        assert_eq!(
            w.status.phase,
            Some(RolloutPhase::RolledBack),
            "the clock runs again"
        );
    }
}

mod chaos {
    //! The review's world (test gap 3): five clusters, three waves, a
    //! maxParallel of one, and events that relabel, unregister, cut off,
    //! fail and pause, in any order.
    use super::*;
    use proptest::prelude::*;

    const NAMES: [&str; 5] = ["m1", "m2", "m3", "m4", "m5"];

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
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            6 => Just(Event::Plan),
            1 => Just(Event::CrashAfterStatus),
            4 => (0usize..5).prop_map(Event::Done),
            1 => (0usize..5).prop_map(Event::Fail),
            3 => (1u64..40).prop_map(Event::Wait),
            1 => (1u8..4).prop_map(Event::Edit),
            1 => ((0usize..5), (0u8..3)).prop_map(|(i, r)| Event::Relabel(i, r)),
            1 => (0usize..5).prop_map(Event::Unregister),
            1 => (0usize..5).prop_map(Event::Reregister),
            1 => (0usize..5).prop_map(Event::Unreachable),
            1 => (0usize..5).prop_map(Event::Reachable),
            1 => any::<bool>().prop_map(Event::Pause),
        ]
    }

    fn ring(r: u8) -> &'static str {
        ["canary", "early", "late"][r as usize]
    }

    fn world() -> World {
        let mut w = World::new(&[
            ("m1", &[("ring", "canary")]),
            ("m2", &[("ring", "early")]),
            ("m3", &[("ring", "early")]),
            ("m4", &[("ring", "late")]),
            ("m5", &[("ring", "late")]),
        ]);
        w.spec.rollout.waves.push(Wave {
            name: "early".into(),
            cluster_selector: sel("ring", "early"),
            max_parallel: Some(IntOrString::Int(1)),
            approval: Default::default(),
        });
        w.spec.rollout.max_failed_clusters = 1;
        w
    }

    /// Checks one plan against the invariants; `before` is the status it was
    /// planned from.
    fn check(before: &FleetMicroserviceStatus, p: &Plan) -> Result<(), TestCaseError> {
        let st = &p.status;
        let update = st.update_revision.clone().unwrap_or_default();
        // A valid spec with an unchanged placement deletes nothing.
        prop_assert!(
            !p.actions.iter().any(|a| matches!(a, Action::Delete { .. })),
            "a delete: {:?}",
            p.actions
        );
        // Outside the canary, an unproven update goes out only once the
        // canary wave passed on evidence (Done, never Skipped or Failed).
        let proven = before.last_good_revision.as_deref() == Some(update.as_str());
        let canary = st.waves.first().filter(|w| w.name == "canary");
        for a in &p.actions {
            if let Action::Apply { cluster, revision } = a
                && *revision == update
                && !proven
                && let Some(c) = canary
                && !c.clusters.contains(cluster)
            {
                // Passed now with a cluster in it, or passed before (then
                // checked the same way) and its cluster has gone since.
                let passed_before = before.update_revision.as_deref() == Some(update.as_str())
                    && before
                        .waves
                        .first()
                        .is_some_and(|w| w.name == "canary" && w.state == WaveState::Done);
                let evidence = st.clusters.iter().any(|k| {
                    c.clusters.contains(&k.name)
                        && k.state == ClusterState::Done
                        && k.revision.as_deref() == Some(update.as_str())
                });
                prop_assert!(
                    c.state == WaveState::Done && (evidence || passed_before),
                    "{} got {} early: {:?}",
                    cluster,
                    revision,
                    st
                );
            }
        }
        // Complete is the whole truth.
        if st.phase == Some(RolloutPhase::Complete) {
            let rows: Vec<&ClusterStatus> = st
                .clusters
                .iter()
                .filter(|c| c.state != ClusterState::Removing)
                .collect();
            prop_assert!(rows.iter().any(|c| c.state == ClusterState::Done), "{st:?}");
            prop_assert!(
                rows.iter().all(|c| c.state == ClusterState::Done
                    && c.revision.as_deref() == Some(update.as_str())),
                "Complete but: {st:?}"
            );
        }
        // maxParallel 1 in `early`: a cluster is started there only while
        // no other one there is written and not yet done. One that got the
        // update in another wave (relabelled into a passed canary, then into
        // `early`) was not started by this wave and takes no decision here.
        if let Some(early) = st.waves.iter().find(|w| w.name == "early")
            && early.state == WaveState::Progressing
            && st.phase == Some(RolloutPhase::Progressing)
        {
            let given_before = |name: &str| {
                before
                    .clusters
                    .iter()
                    .any(|c| c.name == name && c.target.as_deref() == Some(update.as_str()))
            };
            let started: Vec<&str> = p
                .actions
                .iter()
                .filter_map(|a| match a {
                    Action::Apply { cluster, revision }
                        if *revision == update
                            && early.clusters.contains(cluster)
                            && !given_before(cluster) =>
                    {
                        Some(cluster.as_str())
                    }
                    _ => None,
                })
                .collect();
            let writing = st
                .clusters
                .iter()
                .filter(|c| early.clusters.contains(&c.name) && !started.contains(&c.name.as_str()))
                .filter(|c| c.target.as_deref() == Some(update.as_str()))
                .filter(|c| matches!(c.state, ClusterState::Updating))
                .count();
            prop_assert!(
                started.is_empty() || writing + started.len() <= 1,
                "{started:?} started in early beside {writing} updating: {st:?}"
            );
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]
        #[test]
        fn no_wave_without_evidence_no_delete_and_complete_is_true(
            events in proptest::collection::vec(event(), 1..80)
        ) {
            let mut w = world();
            let mut away: Vec<Cluster> = Vec::new();
            for e in events {
                match e {
                    Event::Plan => {
                        let before = w.status.clone();
                        let p = w.step();
                        check(&before, &p)?;
                    }
                    Event::CrashAfterStatus => {
                        let before = w.status.clone();
                        let p = w.plan();
                        check(&before, &p)?;
                        w.status = p.status;
                    }
                    Event::Done(i) | Event::Fail(i) => {
                        let failed = matches!(e, Event::Fail(_));
                        // The index sees no change in a cluster it cannot reach.
                        if let Some(c) = w.clusters.iter_mut().find(|c| c.name == NAMES[i] && c.reachable)
                            && let Some(m) = c.member.as_mut()
                        {
                            m.state = if failed { EntryState::Failed } else { EntryState::Done };
                            m.reason = if failed { "InvalidSpec" } else { "Available" }.into();
                        }
                    }
                    Event::Wait(s) => w.wait(s),
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
                        // As the index shows it: reachability folded into
                        // the member's state.
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
                }
            }
            // Then everything turns done but what was failed, and every
            // round is checked again on the way.
            let broken: Vec<String> = w
                .clusters
                .iter()
                .filter(|c| c.member.as_ref().is_some_and(|m| m.state == EntryState::Failed))
                .map(|c| c.name.clone())
                .collect();
            w.spec.paused = false;
            for _ in 0..12 {
                for c in w.clusters.iter_mut() {
                    if let Some(m) = c.member.as_mut()
                        && !broken.contains(&c.name)
                        && c.reachable
                    {
                        m.state = EntryState::Done;
                        m.reason = "Available".into();
                    }
                }
                let before = w.status.clone();
                let p = w.step();
                check(&before, &p)?;
                w.wait(31);
            }
        }
    }
}

/// Review L1: in a rollback, a cluster whose object names a revision that
/// is no longer stored (pruned while it was away, or a hand-edited
/// annotation) is given the good revision, not its unknown one: that one
/// cannot be written, and round after round failed on it.
#[test]
fn a_rollback_gives_a_cluster_on_an_unknown_revision_the_good_one() {
    let mut w = World::three();
    w.complete();
    let good = rev(&w, "app:1");
    let m2 = w.clusters.iter_mut().find(|c| c.name == "m2").unwrap();
    m2.member.as_mut().unwrap().revision = Some("app-gone".into());
    w.spec.template.image = "app:bad".into();
    rev(&w, "app:bad");
    w.step();
    w.set("m1", EntryState::Failed, "ProgressDeadlineExceeded");
    let mut gave_good = false;
    for _ in 0..5 {
        let p = w.step();
        gave_good |= p.actions.contains(&Action::Apply {
            cluster: "m2".into(),
            revision: good.clone(),
        });
        if let Some(member) = w
            .clusters
            .iter_mut()
            .find(|c| c.name == "m1")
            .and_then(|m| m.member.as_mut())
        {
            member.state = EntryState::Done;
        }
    }
    assert_eq!(w.status.phase, Some(RolloutPhase::RolledBack));
    let target = w
        .status
        .clusters
        .iter()
        .find(|c| c.name == "m2")
        .and_then(|c| c.target.clone());
    assert_eq!(target.as_deref(), Some(good.as_str()));
    assert!(gave_good, "m2 was never given the good revision");
}

/// Review L10: a foreign object in the first placed cluster kept
/// `currentRevision` at its old value (or none) for good; it is the
/// revision our clusters agree on.
#[test]
fn current_revision_ignores_a_foreign_object() {
    let mut w = World::three();
    w.spec.rollout.waves = vec![];
    w.spec.rollout.max_failed_clusters = 1;
    w.clusters[0].member = Some(foreign());
    w.settle(RolloutPhase::Degraded);
    let first = w.update().name;
    assert_eq!(w.status.current_revision.as_deref(), Some(first.as_str()));
    w.spec.template.image = "app:2".into();
    w.settle(RolloutPhase::Degraded);
    let second = w.update().name;
    assert_ne!(first, second);
    assert_eq!(w.status.current_revision.as_deref(), Some(second.as_str()));
}

fn row<'a>(w: &'a World, cluster: &str) -> &'a crate::rollout::spec::ClusterStatus {
    w.status
        .clusters
        .iter()
        .find(|c| c.name == cluster)
        .unwrap()
}

/// Review L5: once a revision completed, a cluster that joins the
/// placement and never becomes done was `Progressing` for ever; the
/// progress deadline holds there too. It is failed (no rollback: the
/// revision is good elsewhere), the phase is `Degraded`, and it is
/// `Complete` again once the cluster is done.
#[test]
fn a_cluster_joining_a_completed_revision_has_a_deadline_too() {
    let mut w = World::three();
    w.spec.rollout.waves = vec![];
    w.spec.rollout.max_failed_clusters = 1;
    w.settle(RolloutPhase::Complete);
    let good = w.update().name;
    w.clusters.push(Cluster {
        name: "m4".into(),
        labels: Some(BTreeMap::new()),
        reachable: true,
        synced: true,
        member: None,
    });
    w.step();
    assert_eq!(w.written(&good).iter().filter(|c| **c == "m4").count(), 1);
    assert_eq!(w.status.phase, Some(RolloutPhase::Progressing));
    w.wait(61);
    w.step();
    let m4 = row(&w, "m4");
    assert_eq!(
        (m4.state, m4.reason.as_str()),
        (ClusterState::Failed, "ProgressDeadlineExceeded"),
        "{m4:?}"
    );
    assert_eq!(w.status.phase, Some(RolloutPhase::Degraded));
    assert_eq!(w.status.last_good_revision.as_deref(), Some(good.as_str()));
    assert_eq!(w.status.failed_revision_number, None, "nothing rolls back");
    assert!(w.deletes.is_empty());
    w.done("m4");
    w.step();
    assert_eq!(w.status.phase, Some(RolloutPhase::Complete));
}

/// Review L5, the other half: the deadline of a cluster that was done
/// counts from when it stopped being done, not from its target's choice
/// long ago. A feed that is lost for a moment is not a failure, in a
/// completed rollout or in a canary's bake; one that stays lost is.
#[test]
fn a_done_cluster_that_blips_has_a_fresh_deadline() {
    let mut w = World::three();
    w.spec.rollout.waves = vec![];
    w.settle(RolloutPhase::Complete);
    w.wait(3600);
    w.set("m2", EntryState::Unknown, "FeedLost");
    w.step();
    assert_eq!(w.state("m2"), ClusterState::Unknown);
    assert_eq!(w.status.phase, Some(RolloutPhase::Progressing));
    assert_eq!(row(&w, "m2").targeted, Some(Time(w.now)), "restarted");
    w.wait(30);
    w.step();
    w.done("m2");
    w.step();
    assert_eq!(w.status.phase, Some(RolloutPhase::Complete));
    // Lost for longer than the deadline: failed, degraded, not rolled back.
    w.wait(3600);
    w.set("m2", EntryState::Unknown, "FeedLost");
    w.step();
    w.wait(61);
    w.step();
    assert_eq!(
        (w.state("m2"), row(&w, "m2").reason.as_str()),
        (ClusterState::Failed, "ClusterUnreachable")
    );
    assert_eq!(w.status.phase, Some(RolloutPhase::Degraded));

    // In a canary's bake (longer than the deadline), a blip restarts the
    // bake and does not fail the canary.
    let mut w = World::three();
    w.spec.rollout.bake = Some("1h".into());
    w.step();
    w.done("m1");
    w.step();
    w.wait(1800);
    w.set("m1", EntryState::Unknown, "FeedLost");
    w.step();
    w.wait(5);
    w.done("m1");
    w.step();
    assert_eq!(w.state("m1"), ClusterState::Done);
    assert_eq!(w.status.phase, Some(RolloutPhase::Progressing));
    assert_eq!(w.status.failed_revision_number, None, "{:?}", w.status);
}

/// Review L11: a done cluster whose member changes its reason (still
/// done) keeps its bake; only leaving done restarts it.
#[test]
fn a_reason_change_of_a_done_canary_keeps_its_bake() {
    let mut w = World::three();
    w.step();
    w.done("m1");
    w.step();
    let since = row(&w, "m1").since.clone();
    w.wait(20);
    w.set("m1", EntryState::Done, "NewReplicaSetAvailable");
    w.step();
    assert_eq!(row(&w, "m1").since, since, "the bake goes on");
    w.wait(11);
    w.step();
    assert!(
        w.status.waves[0].state == crate::rollout::spec::WaveState::Done,
        "the canary baked 31 s across the reason change: {:?}",
        w.status.waves
    );
}

/// Review L13: the status is lost (a restore without status, a wipe).
/// The revisions remember: a failed release is not tried again from the
/// canary, and a release that fails after the loss still goes back to the
/// last good revision instead of being `Failed` with nowhere to go.
#[test]
fn a_lost_status_forgets_neither_the_failure_nor_the_last_good() {
    let mut w = World::three();
    w.complete();
    let good = w.update().name;
    w.spec = spec("app:2");
    w.step();
    w.set("m1", EntryState::Failed, "ProgressDeadlineExceeded");
    w.step();
    assert_eq!(w.status.phase, Some(RolloutPhase::RolledBack));
    let failed = w.update();
    assert!(failed.failed(), "{failed:?}");

    w.status = Default::default();
    let writes = w.writes.len();
    w.step();
    assert_eq!(
        w.status.phase,
        Some(RolloutPhase::RolledBack),
        "{:?}",
        w.status
    );
    assert!(
        w.writes[writes..].iter().all(|(_, r)| *r == good),
        "nothing but the good revision is written: {:?}",
        &w.writes[writes..]
    );

    // A new release; the status is lost before it fails.
    let mut w = World::three();
    w.complete();
    let good = w.update().name;
    w.spec = spec("app:3");
    w.step();
    w.status = Default::default();
    w.set("m1", EntryState::Failed, "ProgressDeadlineExceeded");
    w.step();
    assert_eq!(
        w.status.phase,
        Some(RolloutPhase::RolledBack),
        "{:?}",
        w.status
    );
    assert_eq!(w.status.last_good_revision.as_deref(), Some(good.as_str()));
}

#[path = "failover_tests.rs"]
mod failover;

/// Found by `make chaos` (seed 3): a release superseded half-way left a
/// cluster on it; the next release failed on its canary and rolled back,
/// and that cluster stayed on the superseded revision, which no one asked
/// for any more and which never completed, while the phase said
/// `RolledBack`. A rollback brings every cluster back to the good revision.
#[test]
fn a_rollback_also_brings_back_a_cluster_left_on_a_superseded_release() {
    let mut w = World::three();
    w.complete();
    let good = rev(&w, "app:1");
    // app:2 reaches the canary and then the rest, m2 done, m3 not yet.
    w.spec.template.image = "app:2".into();
    let superseded = rev(&w, "app:2");
    w.step();
    w.done("m1");
    for _ in 0..5 {
        w.wait(10);
        w.step();
    }
    assert_eq!(w.written(&superseded), vec!["m1", "m2", "m3"]);
    w.done("m2");
    // app:3 supersedes it and fails on the canary.
    w.spec.template.image = "app:3".into();
    let bad = rev(&w, "app:3");
    w.step();
    assert_eq!(w.written(&bad), vec!["m1"]);
    w.set("m1", EntryState::Failed, "ProgressDeadlineExceeded");
    for _ in 0..5 {
        w.step();
        w.wait(10);
    }
    assert_eq!(w.status.phase, Some(RolloutPhase::RolledBack));
    for m in ["m1", "m2", "m3"] {
        let at = w
            .clusters
            .iter()
            .find(|c| c.name == m)
            .and_then(|c| c.member.as_ref())
            .and_then(|m| m.revision.clone());
        assert_eq!(at.as_deref(), Some(good.as_str()), "{m} after the rollback");
    }
}

#[path = "approval_tests.rs"]
mod approval;

#[path = "analysis_tests.rs"]
mod analysis_gates;
