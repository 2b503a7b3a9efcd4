//! Each invariant on a hand-made history that keeps it and one that breaks it.

use super::check::*;
use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;

fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap()
}

fn ms(s: i64, millis: i64) -> Timestamp {
    Timestamp::from_millisecond((1_800_000_000 + s) * 1000 + millis).unwrap()
}

fn lease(at: Timestamp, writer: &str, holder: &str) -> LeaseWrite {
    LeaseWrite {
        at,
        writer: writer.into(),
        holder: holder.into(),
    }
}

fn write(at: Timestamp, writer: &str) -> Write {
    Write {
        cluster: "member-1".into(),
        writer: writer.into(),
        at,
        what: "update deployments web".into(),
    }
}

const LIMIT: Duration = Duration::from_millis(1700);

#[test]
fn writes_inside_their_terms_pass() {
    let leases = [
        lease(t(0), "r1", "r1"),
        lease(t(1), "r1", "r1"),
        lease(t(5), "r2", "r2"),
    ];
    let writes = [write(ms(1, 500), "r1"), write(ms(5, 100), "r2")];
    let j = writes_inside_terms(ONE_WRITER, &leases, &writes, LIMIT);
    assert!(j.violations.is_empty());
    assert_eq!(j.checked, 2, "every write is a case");
}

#[test]
fn a_deposed_writer_and_a_writer_past_its_renewal_are_caught() {
    let leases = [lease(t(0), "r1", "r1"), lease(t(5), "r2", "r2")];
    // r1 writes after r2 took the Lease: split brain.
    let late =
        writes_inside_terms(ONE_WRITER, &leases, &[write(ms(5, 200), "r1")], LIMIT).violations;
    assert_eq!(late.len(), 1, "{late:?}");
    assert!(late[0].detail.contains("r1 wrote"), "{late:?}");
    // r1 still named holder, but 3 s after its last renewal: past the deadline.
    let stale = writes_inside_terms(ONE_WRITER, &leases, &[write(t(3), "r1")], LIMIT).violations;
    assert_eq!(stale.len(), 1, "{stale:?}");
    // Before any Lease write at all.
    let early = [lease(t(2), "r1", "r1")];
    assert_eq!(
        writes_inside_terms(ONE_WRITER, &early, &[write(t(1), "r1")], LIMIT)
            .violations
            .len(),
        1
    );
}

fn status(cluster: &str, at: Timestamp, image: &str, available: bool) -> StatusWrite {
    StatusWrite {
        cluster: cluster.into(),
        name: "web".into(),
        at,
        generation: 2,
        image: image.into(),
        available,
    }
}

fn answer(answered: Timestamp, image: &str, code: i32) -> Answer {
    Answer {
        command: "wait".into(),
        name: "web".into(),
        image: image.into(),
        clusters: vec!["member-1".into(), "member-2".into()],
        server: "http://127.0.0.1:1".into(),
        started: t(0),
        answered,
        code,
    }
}

#[test]
fn a_success_matched_by_every_cluster_passes() {
    let s = [
        status("member-1", t(1), "a:2", false),
        status("member-1", t(2), "a:2", true),
        status("member-2", t(3), "a:2", true),
    ];
    let j = no_false_success(&[answer(t(4), "a:2", 0)], &s);
    assert!(j.violations.is_empty());
    assert_eq!(j.checked, 2, "one case per cluster the answer names");
    // A failure or a timeout claims nothing.
    assert_eq!(no_false_success(&[answer(t(1), "a:2", 1)], &s).checked, 0);
}

#[test]
fn a_success_before_a_cluster_was_available_is_caught() {
    let s = [
        status("member-1", t(2), "a:2", true),
        status("member-2", t(1), "a:1", true),
        status("member-2", t(5), "a:2", true),
    ];
    // At 4, member-2 still ran a:1.
    let v = no_false_success(&[answer(t(4), "a:2", 0)], &s).violations;
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].detail.contains("member-2"), "{v:?}");
    // A cluster that went unavailable again before the answer.
    let s = [
        status("member-1", t(1), "a:2", true),
        status("member-2", t(1), "a:2", true),
        status("member-2", t(3), "a:2", false),
    ];
    assert_eq!(
        no_false_success(&[answer(t(4), "a:2", 0)], &s)
            .violations
            .len(),
        1
    );
    // A cluster never heard from.
    let s = [status("member-1", t(1), "a:2", true)];
    assert_eq!(
        no_false_success(&[answer(t(4), "a:2", 0)], &s)
            .violations
            .len(),
        1
    );
}

fn fw(cluster: &str, at: Timestamp, image: &str) -> FleetWrite {
    FleetWrite {
        cluster: cluster.into(),
        name: "web".into(),
        at,
        image: image.into(),
        revision: format!("web-{image}"),
    }
}

fn canary(at: Timestamp, member: &str) -> CanaryMove {
    CanaryMove {
        at,
        member: member.into(),
    }
}

const BAKE: Duration = Duration::from_secs(3);
const GRACE: Duration = Duration::from_secs(5);

#[test]
fn a_release_through_its_canary_and_bake_passes() {
    let writes = [
        fw("member-1", t(10), "a:2"),
        fw("member-2", t(15), "a:2"),
        fw("member-3", t(15), "a:2"),
        // A rollback to an image that ran before: written anywhere at once.
        fw("member-2", t(30), "a:1"),
    ];
    let s = [
        status("member-2", t(1), "a:1", true),
        status("member-1", t(11), "a:2", true),
    ];
    let c = [canary(t(0), "member-1")];
    let (order, held) = wave_order(&writes, &s, &[], &c, BAKE, GRACE);
    assert!(order.violations.is_empty() && held.violations.is_empty());
    assert_eq!(order.checked, 2, "both writes outside the canary");
    assert_eq!(held.checked, 2);
}

#[test]
fn a_wave_opened_without_evidence_or_before_the_bake_is_caught() {
    let c = [canary(t(0), "member-1")];
    // The canary never became Available (a never-ready image), yet the rest got it.
    let writes = [fw("member-1", t(10), "a:9"), fw("member-2", t(20), "a:9")];
    let v = wave_order(
        &writes,
        &[status("member-1", t(11), "a:9", false)],
        &[],
        &c,
        BAKE,
        GRACE,
    )
    .0
    .violations;
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].detail.contains("member-2"), "{v:?}");
    // Available, but the next wave opened 1 s later with a 3 s bake.
    let writes = [fw("member-1", t(10), "a:2"), fw("member-2", t(12), "a:2")];
    let s = [status("member-1", t(11), "a:2", true)];
    assert_eq!(
        wave_order(&writes, &s, &[], &c, BAKE, GRACE)
            .0
            .violations
            .len(),
        1
    );
    // Every cluster at once, no canary at all.
    let writes = [
        fw("member-1", t(10), "a:3"),
        fw("member-2", t(10), "a:3"),
        fw("member-3", t(10), "a:3"),
    ];
    assert_eq!(
        wave_order(&writes, &[], &[], &c, BAKE, GRACE)
            .0
            .violations
            .len(),
        2
    );
}

#[test]
fn the_canary_may_move_within_the_grace() {
    // member-2 became the canary at 8; written at 10 as the new canary.
    let c = [canary(t(0), "member-1"), canary(t(8), "member-2")];
    let writes = [fw("member-2", t(10), "a:2")];
    assert!(
        wave_order(&writes, &[], &[], &c, BAKE, GRACE)
            .0
            .violations
            .is_empty()
    );
    // member-1 stopped being the canary at 8; still read as one at 10.
    let writes = [fw("member-1", t(10), "a:3")];
    assert!(
        wave_order(&writes, &[], &[], &c, BAKE, GRACE)
            .0
            .violations
            .is_empty()
    );
    // ...but not at 20.
    let writes = [fw("member-1", t(20), "a:4")];
    assert_eq!(
        wave_order(&writes, &[], &[], &c, BAKE, GRACE)
            .0
            .violations
            .len(),
        1
    );
}

fn seen(image: &str, done: bool) -> Seen {
    Seen {
        image: image.into(),
        done,
    }
}

fn observed() -> Observed {
    let members = vec!["member-1".to_string(), "member-2".to_string()];
    let mut o = Observed {
        members: members.clone(),
        ..Default::default()
    };
    for m in &members {
        o.microservices
            .insert((m.clone(), "svc".into()), seen("s:3", true));
        o.microservices
            .insert((m.clone(), "fleet".into()), seen("f:2", true));
    }
    o.phases.insert("fleet".into(), "Complete".into());
    o.microservices
        .insert(("member-1".into(), "placed".into()), seen("p:1", true));
    o.phases.insert("placed".into(), "Complete".into());
    o.watch.insert(
        "placed".into(),
        BTreeMap::from([("member-1".into(), "p:1".into())]),
    );
    for name in ["svc", "fleet"] {
        let image = if name == "svc" { "s:3" } else { "f:2" };
        o.watch.insert(
            name.into(),
            members
                .iter()
                .map(|m| (m.clone(), image.to_string()))
                .collect(),
        );
    }
    o.dashboard = o.watch.clone();
    o
}

fn expected() -> Expected {
    Expected {
        microservices: BTreeMap::from([("svc".into(), Some("s:3".into())), ("gone".into(), None)]),
        fleet: BTreeMap::from([("fleet".into(), vec![("Complete".into(), "f:2".into())])]),
        counted: BTreeMap::from([("placed".into(), (1, "p:1".into()))]),
    }
}

#[test]
fn a_converged_fleet_passes() {
    assert_eq!(converged(&expected(), &observed()).violations, vec![]);
}

#[test]
fn each_way_of_not_converging_is_caught() {
    // A lost edit.
    let mut o = observed();
    o.microservices
        .insert(("member-2".into(), "svc".into()), seen("s:2", true));
    for view in [&mut o.watch, &mut o.dashboard] {
        view.get_mut("svc")
            .unwrap()
            .insert("member-2".into(), "s:2".into());
    }
    assert_eq!(converged(&expected(), &o).violations.len(), 1);
    // Not Available.
    let mut o = observed();
    o.microservices
        .insert(("member-1".into(), "svc".into()), seen("s:3", false));
    assert_eq!(converged(&expected(), &o).violations.len(), 1);
    // A deletion that did not happen.
    let mut o = observed();
    o.microservices
        .insert(("member-1".into(), "gone".into()), seen("g:1", true));
    assert_eq!(
        converged(&expected(), &o).violations.len(),
        3,
        "the watch and the dashboard stream lack it too"
    );
    // A FleetMicroservice in the wrong phase.
    let mut o = observed();
    o.phases.insert("fleet".into(), "Progressing".into());
    assert_eq!(converged(&expected(), &o).violations.len(), 1);
    // A counted object left on one member too many, or on none.
    for (on, n) in [(vec!["member-1", "member-2"], 1), (vec![], 0)] {
        let mut o = observed();
        o.microservices.retain(|(_, name), _| name != "placed");
        for m in on {
            o.microservices
                .insert((m.into(), "placed".into()), seen("p:1", true));
        }
        let (mut o2, mut e) = (o.clone(), expected());
        let v = converged(&e, &o).violations;
        assert!(v.iter().any(|v| v.detail.contains("placed")), "{v:?}");
        // The same members are right when the count asks for them.
        e.counted.insert("placed".into(), (2 * n, "p:1".into()));
        o2.watch = o2.truth();
        o2.dashboard = o2.watch.clone();
        if n == 1 {
            assert_eq!(converged(&e, &o2).violations, vec![]);
        }
    }
    // A watch client that missed a change.
    let mut o = observed();
    o.watch
        .get_mut("svc")
        .unwrap()
        .insert("member-1".into(), "s:1".into());
    let v = converged(&expected(), &o).violations;
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].detail.contains("watch"), "{v:?}");
    // A dashboard stream that missed a deletion.
    let mut o = observed();
    o.dashboard.insert(
        "gone".into(),
        BTreeMap::from([("member-1".into(), "g:1".into())]),
    );
    let v = converged(&expected(), &o).violations;
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].detail.contains("dashboard stream"), "{v:?}");
}

#[test]
fn orphans_stale_names_and_exits_are_violations() {
    assert!(nothing_left(&[], &[], 4).violations.is_empty());
    assert_eq!(
        nothing_left(
            &["member-1 deployments/web".into()],
            &["web.ns.zone".into()],
            4
        )
        .violations
        .len(),
        2
    );
    let exit = Exit {
        replica: "r2".into(),
        at: t(1),
        status: "exit status: 101".into(),
    };
    assert_eq!(no_exit(&[exit], 3).violations.len(), 1);
    assert!(no_exit(&[], 3).violations.is_empty());
}

#[test]
fn a_write_answered_504_may_have_been_stored() {
    use crate::records::may_be_stored;
    assert!(may_be_stored(200) && may_be_stored(201));
    assert!(
        may_be_stored(504),
        "the write may complete after the timeout"
    );
    for refused in [409, 422, 500, 503] {
        assert!(!may_be_stored(refused), "{refused}");
    }
}

#[test]
fn a_record_written_after_its_objects_deletion_or_left_behind_is_an_orphan() {
    use crate::check::{Gone, RecordPut, no_orphan_record};
    let gone = vec![
        Gone {
            uid: "u1".into(),
            object: "ns/a".into(),
            revision: 100,
            during_registry_stop: true,
        },
        Gone {
            uid: "u2".into(),
            object: "ns/b".into(),
            revision: 200,
            during_registry_stop: false,
        },
    ];
    let put = |key: &str, uid: &str, revision: i64| RecordPut {
        key: key.into(),
        uid: uid.into(),
        parsed: true,
        revision,
    };
    // Registered before the deletion, nothing after: both checked, clean.
    let history = vec![put("/z/a", "u1", 90), put("/z/b", "u2", 150)];
    let j = no_orphan_record(&gone, &history, &[]);
    assert_eq!((j.checked, j.violations), (2, vec![]));
    // A late write of a, and b still there at the end.
    let late = vec![put("/z/a", "u1", 90), put("/z/a", "u1", 101)];
    let Judged {
        checked,
        violations: v,
        ..
    } = no_orphan_record(&gone, &late, &[put("/z/b", "u2", 150)]);
    assert_eq!(checked, 1);
    assert_eq!(v.len(), 2, "{v:#?}");
    assert!(v[0].detail.contains("after its deletion"));
    assert!(v[1].detail.contains("still in etcd"));
    // A new object of the same name (another uid) is not an orphan.
    let reborn = vec![put("/z/a", "u1", 90), put("/z/a", "u3", 300)];
    assert_eq!(
        no_orphan_record(&gone, &reborn, &[put("/z/a", "u3", 300)]).violations,
        vec![]
    );
    // A value that is not a record cannot be judged: unverifiable, a failure.
    let mut odd = put("/z/x", "", 5);
    odd.parsed = false;
    let j = no_orphan_record(&gone, &[odd], &[]);
    assert_eq!(j.unverifiable.len(), 1, "{j:?}");
    assert!(j.unverifiable[0].contains("/z/x"), "{j:?}");
}

#[test]
fn every_write_is_judged_not_only_the_first() {
    let c = [canary(t(0), "member-1")];
    let s = [status("member-1", t(11), "a:2", true)];
    // member-2's first write waited for the bake; its second did not need
    // to, but a write the day the canary was never Available is caught.
    let writes = [fw("member-1", t(10), "a:2"), fw("member-2", t(15), "a:2")];
    let (order, _) = wave_order(&writes, &s, &[], &c, BAKE, GRACE);
    assert_eq!((order.checked, order.violations.len()), (1, 0));
    let writes = [
        fw("member-1", t(10), "a:2"),
        fw("member-2", t(12), "a:2"),
        fw("member-2", t(15), "a:2"),
    ];
    let (order, _) = wave_order(&writes, &s, &[], &c, BAKE, GRACE);
    assert_eq!(order.checked, 2, "both writes to member-2 judged");
    assert_eq!(order.violations.len(), 1, "{:?}", order.violations);
}

#[test]
fn a_canary_that_stopped_being_available_during_the_bake_is_caught() {
    let c = [canary(t(0), "member-1")];
    let writes = [fw("member-1", t(10), "a:2"), fw("member-2", t(16), "a:2")];
    // Available at 11, down at 14, back at 15: Available 3 s before the
    // write, but not through the bake.
    let flapped = [
        status("member-1", t(11), "a:2", true),
        status("member-1", t(14), "a:2", false),
        status("member-1", t(15), "a:2", true),
    ];
    let (order, held) = wave_order(&writes, &flapped, &[], &c, BAKE, GRACE);
    assert!(order.violations.is_empty(), "{:?}", order.violations);
    assert_eq!(held.checked, 1);
    assert_eq!(held.violations.len(), 1, "{:?}", held.violations);
    assert_eq!(held.violations[0].invariant, BAKE_HELD);
    // A flip inside the read lag before the write is not held against it.
    let late = [
        status("member-1", t(11), "a:2", true),
        status("member-1", ms(15, 500), "a:2", false),
    ];
    let (_, held) = wave_order(&writes, &late, &[], &c, BAKE, GRACE);
    assert!(held.violations.is_empty(), "{:?}", held.violations);
}

/// Seed 487269228: a:2 went out in waves and completed, a:3 reached every
/// cluster, then failed (a member stopped past its deadline) and was rolled
/// back to a:2 everywhere at once. Nothing ran a:2 through the bake before
/// the rollback, and nothing had to: its status names a:2 the good one.
#[test]
fn a_rollback_to_the_good_revision_is_not_a_wave() {
    let c = [canary(t(0), "member-1")];
    let writes = [
        fw("member-1", t(10), "a:2"),
        fw("member-2", t(15), "a:2"),
        fw("member-1", t(50), "a:3"),
        fw("member-2", t(55), "a:3"),
        fw("member-2", t(90), "a:2"),
        fw("member-3", t(90), "a:2"),
    ];
    let s = [
        status("member-1", t(11), "a:2", true),
        status("member-2", t(16), "a:2", true),
        status("member-1", t(51), "a:3", true),
        status("member-2", t(56), "a:3", true),
    ];
    let mut rolled_back = fstatus(t(89), "a:3", Some(50), Some(55));
    rolled_back.last_good = Some("web-a:2".into());
    let (order, held) = wave_order(&writes, &s, &[rolled_back.clone()], &c, BAKE, GRACE);
    assert!(held.violations.is_empty(), "{:?}", held.violations);
    assert!(order.violations.is_empty(), "{:?}", order.violations);
    assert_eq!(order.checked, 2, "only the waves of a:2 and a:3 judged");
    // The same writes with no completion on record are judged as a wave.
    rolled_back.last_good = None;
    let (_, held) = wave_order(&writes, &s, &[rolled_back], &c, BAKE, GRACE);
    assert_eq!(held.violations.len(), 2, "{:?}", held.violations);
}

fn approved(at: Timestamp, revision: &str, by: &str) -> ApprovalSeen {
    ApprovalSeen {
        wave: "rest".into(),
        revision: revision.into(),
        by: by.into(),
        at,
    }
}

fn judge_approvals(
    writes: &[FleetWrite],
    approvals: &[ApprovalSeen],
    forbidden: &[Forbidden],
) -> Judged {
    let c = [canary(t(0), "member-1")];
    approval_bound(
        "web",
        "rest",
        writes,
        &[status("member-1", t(11), "a:2", true)],
        &c,
        &[],
        GRACE,
        approvals,
        &["write-token"],
        forbidden,
    )
}

#[test]
fn a_manual_wave_written_after_its_approval_passes() {
    let writes = [
        fw("member-1", t(10), "a:2"),
        fw("member-2", t(20), "a:2"),
        fw("member-3", t(21), "a:2"),
    ];
    let refused = Forbidden {
        at: t(12),
        code: 7,
        answer: "PERMISSION_DENIED".into(),
    };
    let j = judge_approvals(
        &writes,
        &[approved(t(19), "web-a:2", "write-token")],
        &[refused],
    );
    assert_eq!(j.violations, vec![]);
    assert_eq!(j.checked, 4, "two writes, one approval, one refusal");
}

#[test]
fn a_manual_wave_opened_early_for_another_revision_or_by_the_wrong_identity_is_caught() {
    let writes = [fw("member-1", t(10), "a:2"), fw("member-2", t(20), "a:2")];
    // Approved only after the write.
    let late = judge_approvals(&writes, &[approved(t(21), "web-a:2", "write-token")], &[]);
    assert_eq!(late.violations.len(), 1, "{:?}", late.violations);
    assert_eq!(late.violations[0].invariant, APPROVAL_BOUND);
    // Approved in time, but for the revision before.
    let other = judge_approvals(&writes, &[approved(t(15), "web-a:1", "write-token")], &[]);
    assert_eq!(other.violations.len(), 1, "{:?}", other.violations);
    // Approved by an identity without the right: the write and the approval.
    let wrong = judge_approvals(&writes, &[approved(t(15), "web-a:2", "read-token")], &[]);
    assert_eq!(wrong.violations.len(), 2, "{:?}", wrong.violations);
    // An attempt without the right that was let through.
    let through = Forbidden {
        at: t(12),
        code: 0,
        answer: "approved".into(),
    };
    let j = judge_approvals(&[], &[], &[through]);
    assert_eq!(j.violations.len(), 1, "{:?}", j.violations);
}

#[test]
fn a_dns_record_put_under_a_term_that_was_no_longer_held_is_caught() {
    let terms = [
        TermPut {
            revision: 10,
            epoch: 11,
        },
        TermPut {
            revision: 20,
            epoch: 21,
        },
    ];
    let put = |revision: i64, epoch: i64| DnsPut {
        key: "/skydns/example/fleet/ns/web/member-1".into(),
        revision,
        epoch,
    };
    let j = dns_fence(&terms, &[put(15, 11), put(25, 21)]);
    assert_eq!(
        (j.checked, j.violations.len()),
        (2, 0),
        "{:?}",
        j.violations
    );
    // A deposed term's put after the next claim, and one before any claim.
    let j = dns_fence(&terms, &[put(22, 11), put(5, 11)]);
    assert_eq!(j.violations.len(), 2, "{:?}", j.violations);
    assert!(
        j.violations[0].detail.contains("term 21"),
        "{:?}",
        j.violations
    );
    // In the claim's own revision: not yet held.
    assert_eq!(dns_fence(&terms, &[put(20, 21)]).violations.len(), 1);
}

fn shut(from: i64, to: i64) -> Shut {
    Shut {
        name: "web".into(),
        from: t(from),
        to: t(to),
    }
}

/// A status of `web` at `at`, updating to `image`'s revision, with the
/// canary wave (member-1) and the rest (member-2, member-3) started or not.
fn fstatus(at: Timestamp, image: &str, canary: Option<i64>, rest: Option<i64>) -> FleetStatus {
    let wave = |name: &str, clusters: &[&str], started: Option<i64>| WaveSeen {
        name: name.into(),
        clusters: clusters.iter().map(|c| c.to_string()).collect(),
        started: started.map(t),
    };
    FleetStatus {
        name: "web".into(),
        at,
        update: format!("web-{image}"),
        last_good: None,
        unreachable: Vec::new(),
        waves: vec![
            wave("canary", &["member-1"], canary),
            wave("rest", &["member-2", "member-3"], rest),
        ],
    }
}

#[test]
fn waves_started_before_a_window_shut_finish_inside_it() {
    let shut = [shut(60, 120)];
    // The canary started at 50 and was written at 51; the rest started at
    // 58 and its writes landed at 61 and 70, inside the shut stretch.
    let status = [
        fstatus(t(50), "b:2", Some(50), None),
        fstatus(t(58), "b:2", Some(50), Some(58)),
    ];
    let writes = [
        fw("member-1", t(51), "b:2"),
        fw("member-2", t(61), "b:2"),
        fw("member-3", t(70), "b:2"),
        // A rollback's target inside the stretch is not a start.
        fw("member-1", t(80), "b:1"),
    ];
    let j = window_held(&shut, &status, &writes);
    assert_eq!(j.checked, 6);
    assert!(j.violations.is_empty(), "{:?}", j.violations);
}

/// An undo to a revision that completed (seed 7's 300 s run): its waves
/// start and its writes land inside a shut stretch, which windows allow.
/// The same revision before it had completed is held.
#[test]
fn an_undo_to_a_completed_revision_is_not_held_by_a_window() {
    let shut = [shut(60, 120)];
    let good = |mut s: FleetStatus| {
        s.last_good = Some("web-b:1".into());
        s
    };
    let status = [
        // b:1 started before the stretch and was not yet good...
        fstatus(t(10), "b:1", Some(10), Some(20)),
        // ...then completed; b:2 was released, then undone inside it.
        good(fstatus(t(30), "b:1", Some(10), Some(20))),
        good(fstatus(t(40), "b:2", Some(40), None)),
        good(fstatus(t(70), "b:1", Some(70), Some(75))),
    ];
    let writes = [fw("member-1", t(71), "b:1"), fw("member-2", t(76), "b:1")];
    let j = window_held(&shut, &status, &writes);
    assert!(j.violations.is_empty(), "{:?}", j.violations);
    // Without the completion on record, the same starts are caught.
    let unproven: Vec<FleetStatus> = status
        .iter()
        .cloned()
        .map(|mut s| {
            s.last_good = None;
            s
        })
        .collect();
    let j = window_held(&shut, &unproven, &writes);
    assert_eq!(j.violations.len(), 2, "{:?}", j.violations);
    // b:1 completed, then b:2 did too: an undo back to b:1 inside the
    // stretch is a new rollout of it, held by the window.
    let good2 = |mut s: FleetStatus| {
        s.last_good = Some("web-b:2".into());
        s
    };
    let replaced = [
        good(fstatus(t(30), "b:1", Some(10), Some(20))),
        good2(fstatus(t(50), "b:2", Some(40), Some(45))),
        good2(fstatus(t(70), "b:1", Some(70), Some(75))),
    ];
    let j = window_held(&shut, &replaced, &writes);
    assert_eq!(j.violations.len(), 2, "{:?}", j.violations);
}

#[test]
fn a_wave_started_or_written_inside_a_shut_stretch_is_caught() {
    let shut = [shut(60, 120)];
    // The rest's start stamp is inside; and a write with no start recorded.
    let status = [
        fstatus(t(50), "b:2", Some(50), None),
        fstatus(t(65), "b:2", Some(50), Some(65)),
    ];
    let writes = [fw("member-2", t(62), "b:2"), fw("member-3", t(66), "b:2")];
    let j = window_held(&shut, &status, &writes);
    assert_eq!(j.violations.len(), 2, "{:?}", j.violations);
    assert!(j.violations[0].detail.contains("wave rest of web"));
    assert!(j.violations[1].detail.contains("member-2 got web"));
    // Just as the stretch shuts, a write decided before it is not held
    // against the writer (READ_LAG).
    let early = [fw("member-2", ms(60, 500), "b:2")];
    let j = window_held(&shut, &status[..1], &early);
    assert!(j.violations.is_empty(), "{:?}", j.violations);
}

#[test]
fn the_shut_minutes_of_an_allow_and_a_deny_window_alternate() {
    use crate::workload::shut;
    // From 30 s into an even minute to 30 s into the odd minute two later.
    let (from, to) = (t(30), t(150));
    let minute = |m: i64| m * 60;
    let base = 1_800_000_000 / 60;
    assert_eq!(base % 2, 0, "t(0) starts an even minute");
    let allow: Vec<(i64, i64)> = shut(0, "Allow", from, to)
        .iter()
        .map(|s| {
            (
                s.from.as_second() - t(0).as_second(),
                s.to.as_second() - t(0).as_second(),
            )
        })
        .collect();
    assert_eq!(allow, [(30, minute(1)), (minute(2), minute(2) + 30)]);
    let deny: Vec<(i64, i64)> = shut(1, "Deny", from, to)
        .iter()
        .map(|s| {
            (
                s.from.as_second() - t(0).as_second(),
                s.to.as_second() - t(0).as_second(),
            )
        })
        .collect();
    assert_eq!(deny, [(minute(1), minute(2))]);
}

fn dns(key: &str, revision: i64, put: Option<(&str, bool)>) -> DnsChange {
    DnsChange {
        key: key.into(),
        revision,
        put: put.map(|(object, fleet)| ZoneRecord {
            object: object.into(),
            fleet,
            fail_open: false,
        }),
    }
}

fn zone(key: &str, object: &str, fleet: bool) -> (String, ZoneRecord) {
    (
        key.into(),
        ZoneRecord {
            object: object.into(),
            fleet,
            fail_open: false,
        },
    )
}

#[test]
fn a_fleet_name_that_swaps_its_answers_in_one_transaction_is_never_empty() {
    let initial = [
        zone("z/ns/web/member-1", "ns/web", true),
        zone("m/member-1/ns/web", "ns/web", false),
        zone("m/member-2/ns/web", "ns/web", false),
    ];
    let changes = [
        // Withdrawn and replaced in one transaction.
        dns("z/ns/web/member-1", 10, None),
        dns("z/ns/web/member-2", 10, Some(("ns/web", true))),
        // A key no record held: nothing to judge.
        dns("z/ns/other/member-1", 11, None),
        // The object deleted: a member's transaction takes its answer
        // with its record, leaving another member's not yet answered.
        dns("m/member-2/ns/web", 12, None),
        dns("z/ns/web/member-2", 12, None),
        dns("m/member-1/ns/web", 13, None),
        // Created again: its first answer comes after its first candidate.
        dns("m/member-1/ns/web", 15, Some(("ns/web", false))),
        dns("z/ns/web/member-1", 16, Some(("ns/web", true))),
    ];
    let j = dns_never_empty(&initial, &changes);
    assert_eq!(j.checked, 2, "the writer's own transactions at 10 and 16");
    assert!(j.violations.is_empty(), "{:?}", j.violations);
}

#[test]
fn a_fleet_name_left_without_an_answer_while_a_member_lists_it_is_caught() {
    let initial = [
        zone("z/ns/web/member-1", "ns/web", true),
        zone("m/member-1/ns/web", "ns/web", false),
    ];
    let changes = [
        dns("z/ns/web/member-1", 10, None),
        dns("z/ns/web/member-2", 11, Some(("ns/web", true))),
    ];
    let j = dns_never_empty(&initial, &changes);
    assert_eq!(j.checked, 2);
    assert_eq!(j.violations.len(), 1, "{:?}", j.violations);
    assert!(j.violations[0].detail.contains("revision 10"));
}
