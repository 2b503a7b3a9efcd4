use super::*;
use crate::dns::health::Judged;

fn zone() -> Zone {
    Zone::new("fleet.example", "/skydns").unwrap()
}

const P: &str = "/skydns/example/fleet";

fn record(host: &str, writer: Writer) -> Record {
    Record {
        host: host.into(),
        port: 80,
        ttl: 30,
        object: "ns/web".into(),
        writer,
        fail_open: false,
        uid: String::new(),
    }
}

fn member(c: &str) -> Writer {
    Writer {
        cluster: c.into(),
        epoch: 1,
        lease: String::new(),
    }
}

fn me(epoch: i64) -> Writer {
    Writer::fleet("prod", epoch)
}

fn own(c: &str, host: &str, rev: i64) -> Existing {
    Existing {
        key: format!("{P}/cluster/{c}/ns/web"),
        record: Some(record(host, member(c))),
        mod_revision: rev,
    }
}

fn wide(c: &str, host: &str, writer: Writer, rev: i64) -> Existing {
    Existing {
        key: format!("{P}/ns/web/{c}"),
        record: Some(Record {
            ttl: 10,
            ..record(host, writer)
        }),
        mod_revision: rev,
    }
}

fn clusters() -> BTreeSet<String> {
    ["m1", "m2", "m3"].map(String::from).into()
}

fn web() -> BTreeSet<Object> {
    [("ns".to_string(), "web".to_string())].into()
}

fn run(
    existing: &[Existing],
    out: &[&str],
    objects: &BTreeSet<Object>,
) -> Result<Vec<Step>, Refusal> {
    let z = zoned(&zone(), existing, &clusters());
    plan(&zone(), &z, &me(4), 10, &clusters(), objects, |_, c| {
        Judged {
            in_answer: !out.contains(&c),
            primary: true,
            reachable: true,
        }
    })
}

fn puts(ops: &[Op]) -> Vec<&str> {
    ops.iter()
        .filter_map(|o| match o {
            Op::Put { key, .. } => Some(key.as_str()),
            _ => None,
        })
        .collect()
}

fn deletes(ops: &[Op]) -> Vec<&str> {
    ops.iter()
        .filter_map(|o| match o {
            Op::Delete { key, .. } => Some(key.as_str()),
            _ => None,
        })
        .collect()
}

#[test]
fn healthy_clusters_are_listed_each_write_checked_against_its_source() {
    let existing = [own("m1", "10.0.0.1", 5), own("m2", "10.0.0.2", 6)];
    let steps = run(&existing, &[], &web()).unwrap();
    assert_eq!(steps.len(), 1);
    let s = &steps[0];
    assert_eq!(s.answer.listed, vec!["m1", "m2"]);
    assert!(!s.answer.degraded);
    assert_eq!(
        s.ops,
        vec![
            Op::Put {
                key: format!("{P}/ns/web/m1"),
                record: Record {
                    ttl: 10,
                    ..record("10.0.0.1", me(4))
                },
                mod_revision: 0,
            },
            Op::Check {
                key: format!("{P}/cluster/m1/ns/web"),
                mod_revision: 5,
            },
            Op::Put {
                key: format!("{P}/ns/web/m2"),
                record: Record {
                    ttl: 10,
                    ..record("10.0.0.2", me(4))
                },
                mod_revision: 0,
            },
            Op::Check {
                key: format!("{P}/cluster/m2/ns/web"),
                mod_revision: 6,
            },
        ]
    );
}

#[test]
fn an_unhealthy_cluster_is_withdrawn_and_in_sync_writes_nothing() {
    let existing = [
        own("m1", "10.0.0.1", 5),
        own("m2", "10.0.0.2", 6),
        // Written by an earlier term: the same answer needs no write.
        wide("m1", "10.0.0.1", me(3), 7),
        wide("m2", "10.0.0.2", me(4), 8),
    ];
    let steps = run(&existing, &["m2"], &web()).unwrap();
    assert_eq!(steps[0].answer.listed, vec!["m1"]);
    assert_eq!(
        steps[0].ops,
        vec![Op::Delete {
            key: format!("{P}/ns/web/m2"),
            mod_revision: 8,
        }]
    );
    assert!(run(&existing, &[], &web()).unwrap()[0].ops.is_empty());
}

#[test]
fn with_no_cluster_healthy_every_candidate_is_listed() {
    let existing = [
        own("m1", "10.0.0.1", 5),
        own("m2", "10.0.0.2", 6),
        wide("m1", "10.0.0.1", me(4), 7),
    ];
    let steps = run(&existing, &["m1", "m2"], &web()).unwrap();
    assert!(steps[0].answer.degraded);
    assert_eq!(steps[0].answer.listed, vec!["m1", "m2"]);
    // Both are written marked fail-open, so every replica can tell.
    assert_eq!(
        puts(&steps[0].ops),
        vec![format!("{P}/ns/web/m1"), format!("{P}/ns/web/m2")]
    );
    for op in &steps[0].ops {
        if let Op::Put { record, .. } = op {
            assert!(record.fail_open);
        }
    }
    // Healthy again: the mark goes, and nothing is written once it has.
    let marked = |c: &str, host: &str, rev: i64| {
        let mut e = wide(c, host, me(4), rev);
        e.record.as_mut().unwrap().fail_open = true;
        e
    };
    let degraded = [
        own("m1", "10.0.0.1", 5),
        own("m2", "10.0.0.2", 6),
        marked("m1", "10.0.0.1", 7),
        marked("m2", "10.0.0.2", 8),
    ];
    assert!(
        run(&degraded, &["m1", "m2"], &web()).unwrap()[0]
            .ops
            .is_empty()
    );
    let steps = run(&degraded, &["m2"], &web()).unwrap();
    assert_eq!(puts(&steps[0].ops), vec![format!("{P}/ns/web/m1")]);
    assert_eq!(deletes(&steps[0].ops), vec![format!("{P}/ns/web/m2")]);
}

#[test]
fn a_new_name_with_nobody_healthy_lists_nothing_and_is_not_degraded() {
    let existing = [own("m1", "10.0.0.1", 5), own("m2", "10.0.0.2", 6)];
    let steps = run(&existing, &["m1", "m2"], &web()).unwrap();
    assert!(steps[0].ops.is_empty(), "{:?}", steps[0].ops);
    assert!(!steps[0].answer.degraded);
    assert!(steps[0].answer.listed.is_empty());
}

#[test]
fn failover_lists_only_the_healthy_primary() {
    let existing = [
        own("m1", "10.0.0.1", 5),
        own("m2", "10.0.0.2", 6),
        own("m3", "10.0.0.3", 7),
        wide("m2", "10.0.0.2", me(4), 8),
    ];
    let z = zoned(&zone(), &existing, &clusters());
    let failover = |out: &[&str]| {
        plan(&zone(), &z, &me(4), 10, &clusters(), &web(), |_, c| {
            Judged {
                in_answer: !out.contains(&c),
                primary: c == "m1",
                reachable: true,
            }
        })
        .unwrap()
    };
    let steps = failover(&[]);
    assert_eq!(steps[0].answer.listed, vec!["m1"]);
    assert_eq!(puts(&steps[0].ops), vec![format!("{P}/ns/web/m1")]);
    assert_eq!(deletes(&steps[0].ops), vec![format!("{P}/ns/web/m2")]);
    // The primary out: the others, not degraded.
    let steps = failover(&["m1"]);
    assert_eq!(steps[0].answer.listed, vec!["m2", "m3"]);
    assert!(!steps[0].answer.degraded);
}

#[test]
fn a_member_written_entry_is_adopted_or_withdrawn() {
    // Before a fleet DNS writer ran, each member leader wrote its own place.
    let existing = [
        own("m1", "10.0.0.1", 5),
        own("m2", "10.0.0.2", 6),
        wide("m1", "10.0.0.1", member("m1"), 7),
        wide("m2", "10.0.0.2", member("m2"), 8),
    ];
    let steps = run(&existing, &["m2"], &web()).unwrap();
    assert_eq!(puts(&steps[0].ops), vec![format!("{P}/ns/web/m1")]);
    assert_eq!(deletes(&steps[0].ops), vec![format!("{P}/ns/web/m2")]);
}

#[test]
fn what_is_not_ours_is_left_alone() {
    let existing = [
        own("m1", "10.0.0.1", 5),
        // Another fleet sharing the zone, and a value that is not a record.
        wide("m2", "10.0.0.2", Writer::fleet("staging", 9), 8),
        Existing {
            key: format!("{P}/ns/web/m3"),
            record: None,
            mod_revision: 9,
        },
        // A cluster outside this fleet is no candidate, nor is a record at
        // a cluster's key written by another cluster.
        own("m9", "10.0.0.9", 10),
        Existing {
            key: format!("{P}/cluster/m3/ns/web"),
            record: Some(record("10.0.0.3", member("m1"))),
            mod_revision: 11,
        },
    ];
    let steps = run(&existing, &[], &web()).unwrap();
    assert_eq!(steps[0].answer.candidates, vec!["m1"]);
    assert_eq!(puts(&steps[0].ops), vec![format!("{P}/ns/web/m1")]);
    assert!(deletes(&steps[0].ops).is_empty());
}

#[test]
fn a_newer_term_of_this_writer_deposes_it() {
    let existing = [own("m1", "10.0.0.1", 5), wide("m1", "10.0.0.8", me(5), 7)];
    assert!(matches!(
        run(&existing, &[], &web()),
        Err(Refusal::Deposed {
            epoch: 5,
            ours: 4,
            ..
        })
    ));
}

#[test]
fn an_object_the_index_no_longer_knows_loses_our_records_only() {
    let existing = [
        own("m1", "10.0.0.1", 5),
        wide("m1", "10.0.0.1", me(4), 7),
        wide("m2", "10.0.0.2", member("m2"), 8),
    ];
    let steps = run(&existing, &[], &BTreeSet::new()).unwrap();
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].answer.listed, Vec::<String>::new());
    // Ours goes; the member's own is its leader's to sweep.
    assert_eq!(deletes(&steps[0].ops), vec![format!("{P}/ns/web/m1")]);
}

/// #62: an object the index does not know, while a cluster its name lists
/// or that has a record of it has not been listed (a new writer's caches
/// still filling, a cluster not answering): nothing is withdrawn. Once
/// every such cluster is known not to have it, our records go.
#[test]
fn an_unknown_object_is_withdrawn_only_where_its_absence_is_known() {
    // m1 is listed (with no record of its own left), m2 has a record of
    // its own and is not listed, m9 is listed and no longer of the fleet.
    let existing = [
        own("m2", "10.0.0.2", 6),
        wide("m1", "10.0.0.1", me(4), 7),
        wide("m9", "10.0.0.9", me(4), 8),
    ];
    let z = zoned(&zone(), &existing, &clusters());
    let blind_to = |unseen: &'static str| {
        plan(
            &zone(),
            &z,
            &me(4),
            10,
            &clusters(),
            &BTreeSet::new(),
            move |_, c| Judged {
                in_answer: true,
                primary: true,
                reachable: c != unseen,
            },
        )
        .unwrap()
    };
    assert!(blind_to("m1").is_empty(), "a listed cluster not seen");
    assert!(
        blind_to("m2").is_empty(),
        "a cluster with a record not seen"
    );
    // m3 has nothing of it, and m9 is not of the fleet: neither matters.
    for unseen in ["m3", "m9"] {
        let steps = blind_to(unseen);
        assert_eq!(
            deletes(&steps[0].ops),
            vec![format!("{P}/ns/web/m1"), format!("{P}/ns/web/m9")],
            "{unseen}"
        );
    }
}

/// #59: every candidate's registration gone at once, the name still
/// known: the answer stays as it is, degraded, and nothing is deleted.
#[test]
fn an_empty_candidate_set_keeps_the_last_answer_degraded() {
    let existing = [
        wide("m1", "10.0.0.1", me(4), 7),
        wide("m2", "10.0.0.2", me(4), 8),
    ];
    let steps = run(&existing, &[], &web()).unwrap();
    assert_eq!(steps.len(), 1);
    assert!(steps[0].ops.is_empty(), "{:?}", steps[0].ops);
    assert_eq!(steps[0].answer.listed, ["m1", "m2"]);
    assert!(steps[0].answer.degraded);
    // The object gone from the index: our records go, as before.
    let gone = run(&existing, &[], &BTreeSet::new()).unwrap();
    assert_eq!(deletes(&gone[0].ops).len(), 2);
}
