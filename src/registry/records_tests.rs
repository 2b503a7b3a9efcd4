use super::*;

fn zone() -> Zone {
    Zone::new("fleet.example.", DEFAULT_PATH).unwrap()
}

fn entry(cluster: &str) -> Entry {
    Entry {
        cluster: cluster.into(),
        namespace: "default".into(),
        name: "todo-api".into(),
    }
}

fn me(cluster: &str, epoch: i64) -> Writer {
    Writer {
        cluster: cluster.into(),
        epoch,
        lease: String::new(),
    }
}

fn existing(desired: &[(String, Record)], rev: i64) -> Vec<Existing> {
    desired
        .iter()
        .map(|(k, r)| Existing {
            key: k.clone(),
            record: Some(r.clone()),
            mod_revision: rev,
        })
        .collect()
}

#[test]
fn keys_follow_coredns_paths_for_both_names() {
    let z = zone();
    assert_eq!(z.prefix, "/skydns/example/fleet");
    assert_eq!(
        entry("member-1").keys(&z).unwrap(),
        [
            "/skydns/example/fleet/cluster/member-1/default/todo-api".to_string(),
            "/skydns/example/fleet/default/todo-api/member-1".to_string(),
        ]
    );
}

#[test]
fn bad_names_and_a_missing_address_are_refused_with_the_reason() {
    let z = zone();
    let mut e = entry("Member_1");
    assert!(matches!(
        e.keys(&z),
        Err(RecordError::NotALabel {
            what: "cluster name",
            ..
        })
    ));
    e.cluster = "member-1".into();
    assert_eq!(
        e.desired(&z, Some("None"), 80, 1),
        Err(RecordError::NoAddress)
    );
    assert_eq!(e.desired(&z, None, 80, 1), Err(RecordError::NoAddress));
    // The namespace that would overlap the cluster-scoped tree.
    let reserved = Entry {
        namespace: CLUSTER_TREE.into(),
        ..entry("member-1")
    };
    assert!(matches!(
        reserved.keys(&z),
        Err(RecordError::ReservedNamespace(_))
    ));
    assert!(Zone::new("", DEFAULT_PATH).is_err());
    assert!(Zone::new("bad..zone", DEFAULT_PATH).is_err());
}

#[test]
fn a_record_decodes_as_coredns_sees_it() {
    let d = entry("member-1")
        .desired(&zone(), Some("10.96.0.7"), 8080, 3)
        .unwrap();
    let json: serde_json::Value = serde_json::to_value(&d[0].1).unwrap();
    assert_eq!(json["host"], "10.96.0.7");
    assert_eq!(json["port"], 8080);
    assert_eq!(json["ttl"], TTL_SECONDS);
    assert_eq!(json["flotillaWriter"]["epoch"], 3);
    let back = Existing::parse(d[0].0.clone(), json.to_string().as_bytes(), 5);
    assert_eq!(back.record.as_ref(), Some(&d[0].1));
    assert_eq!(
        Existing::parse("k".into(), b"{\"host\":\"x\"}", 1).record,
        None
    );
}

#[test]
fn registering_writes_missing_records_and_nothing_when_in_sync() {
    let d = entry("member-1")
        .desired(&zone(), Some("10.96.0.7"), 8080, 3)
        .unwrap();
    let ops = plan_register(&d, &[], &me("member-1", 3)).unwrap();
    assert_eq!(ops.len(), 2);
    assert!(ops.iter().all(|o| matches!(
        o,
        Op::Put {
            mod_revision: 0,
            ..
        }
    )));
    // In sync: no write, even after a new term (the epoch alone is no change).
    let ops = plan_register(&d, &existing(&d, 9), &me("member-1", 4)).unwrap();
    assert!(ops.is_empty());
}

#[test]
fn a_changed_address_is_replaced_on_the_revision_read() {
    let old = entry("member-1")
        .desired(&zone(), Some("10.96.0.7"), 8080, 3)
        .unwrap();
    let new = entry("member-1")
        .desired(&zone(), Some("10.96.0.8"), 8080, 3)
        .unwrap();
    let ops = plan_register(&new, &existing(&old, 9), &me("member-1", 3)).unwrap();
    assert_eq!(ops.len(), 2);
    assert!(ops.iter().all(|o| matches!(
        o,
        Op::Put {
            mod_revision: 9,
            ..
        }
    )));
}

#[test]
fn a_deposed_leader_never_overwrites_a_newer_terms_record() {
    let newer = entry("member-1")
        .desired(&zone(), Some("10.96.0.8"), 8080, 5)
        .unwrap();
    let mine = entry("member-1")
        .desired(&zone(), Some("10.96.0.7"), 8080, 4)
        .unwrap();
    let refused = plan_register(&mine, &existing(&newer, 9), &me("member-1", 4));
    assert!(matches!(
        refused,
        Err(Refusal::Deposed {
            epoch: 5,
            ours: 4,
            ..
        })
    ));
    let keys: Vec<String> = newer.iter().map(|(k, _)| k.clone()).collect();
    assert!(matches!(
        plan_remove(&keys, &existing(&newer, 9), &me("member-1", 4)),
        Err(Refusal::Deposed { .. })
    ));
}

#[test]
fn another_clusters_or_a_foreign_record_is_never_written() {
    let theirs = entry("member-2")
        .desired(&zone(), Some("10.96.0.9"), 8080, 1)
        .unwrap();
    let mut at_our_keys = existing(&theirs, 2);
    let mine = entry("member-1")
        .desired(&zone(), Some("10.96.0.7"), 8080, 1)
        .unwrap();
    for (e, (k, _)) in at_our_keys.iter_mut().zip(&mine) {
        e.key = k.clone();
    }
    assert!(matches!(
        plan_register(&mine, &at_our_keys, &me("member-1", 1)),
        Err(Refusal::Foreign { .. })
    ));
    at_our_keys[0].record = None;
    assert!(matches!(
        plan_register(&mine, &at_our_keys, &me("member-1", 1)),
        Err(Refusal::Foreign { .. })
    ));
}

#[test]
fn removal_deletes_only_what_exists_on_the_revision_read() {
    let d = entry("member-1")
        .desired(&zone(), Some("10.96.0.7"), 8080, 3)
        .unwrap();
    let keys: Vec<String> = d.iter().map(|(k, _)| k.clone()).collect();
    let mut found = existing(&d, 7);
    found.pop();
    let ops = plan_remove(&keys, &found, &me("member-1", 3)).unwrap();
    assert_eq!(
        ops,
        vec![Op::Delete {
            key: keys[0].clone(),
            mod_revision: 7
        }]
    );
    assert!(
        plan_remove(&keys, &[], &me("member-1", 3))
            .unwrap()
            .is_empty()
    );
}

#[test]
fn a_foreign_or_unreadable_record_at_one_key_leaves_it_and_still_removes_ours() {
    let d = entry("member-1")
        .desired(&zone(), Some("10.96.0.7"), 8080, 3)
        .unwrap();
    let keys: Vec<String> = d.iter().map(|(k, _)| k.clone()).collect();
    let mut found = existing(&d, 7);
    // The fleet-wide key holds what nobody of ours wrote, or nothing readable.
    for foreign in [
        Some(
            entry("member-2")
                .desired(&zone(), Some("10.96.0.9"), 80, 1)
                .unwrap()[1]
                .1
                .clone(),
        ),
        None,
    ] {
        found[1].record = foreign;
        let ops = plan_remove(&keys, &found, &me("member-1", 3)).unwrap();
        assert_eq!(
            ops,
            vec![Op::Delete {
                key: keys[0].clone(),
                mod_revision: 7
            }]
        );
    }
}

#[test]
fn every_registration_checks_the_tombstone_and_nothing_adds_a_write() {
    let d = entry("member-1")
        .desired(&zone(), Some("10.96.0.7"), 8080, 3)
        .unwrap();
    let ops = plan_register(&d, &[], &me("member-1", 3)).unwrap();
    let fenced = guarded(&ops, "/skydns/_flotilla/tombstones/z/uid-1");
    assert_eq!(fenced.len(), ops.len() + 1);
    assert_eq!(
        fenced.last(),
        Some(&Op::Check {
            key: "/skydns/_flotilla/tombstones/z/uid-1".into(),
            mod_revision: 0
        })
    );
    assert!(guarded(&[], "t").is_empty(), "no write, no transaction");
}

#[test]
fn the_sweep_removes_only_our_dead_objects_records() {
    let z = zone();
    let mut all = Vec::new();
    for (cluster, name, epoch) in [
        ("member-1", "alive", 3),
        ("member-1", "gone", 3),
        ("member-1", "gone-newer-term", 4),
        ("member-2", "gone", 1),
    ] {
        let e = Entry {
            cluster: cluster.into(),
            namespace: "default".into(),
            name: name.into(),
        };
        all.extend(existing(
            &e.desired(&z, Some("10.0.0.1"), 80, epoch).unwrap(),
            1,
        ));
    }
    // A record of a live Microservice where the layout before #30 put it.
    let old = all[0].clone();
    all.push(Existing {
        key: "/skydns/example/fleet/member-1/default/alive".into(),
        ..old
    });
    let ops = plan_sweep(&all, &me("member-1", 3), &z, |_, name| name == "alive");
    let keys: Vec<&str> = ops.iter().map(Op::key).collect();
    assert_eq!(
        keys,
        [
            "/skydns/example/fleet/cluster/member-1/default/gone",
            "/skydns/example/fleet/default/gone/member-1",
            "/skydns/example/fleet/member-1/default/alive",
        ]
    );
    let departed = plan_departed(&all, |c| c == "member-1");
    assert_eq!(departed.len(), 2, "member-2's two records");
    assert!(departed.iter().all(|o| o.key().contains("member-2")));
}

/// What CoreDNS answers for the name whose path is `dir`: the record at
/// it and every one below it.
fn answers(key: &str, dir: &str) -> bool {
    key == dir || key.starts_with(&format!("{dir}/"))
}

proptest::proptest! {
    /// #30 M4: no key of one Microservice is answered under another's
    /// fleet-wide name or cluster-scoped name, whatever the clusters,
    /// namespaces and names (drawn from a few labels, so collisions of a
    /// cluster with a namespace or name are common).
    #[test]
    fn no_entry_is_answered_under_another_entrys_name(
        a in (0..5usize, 0..5usize, 0..5usize),
        b in (0..5usize, 0..5usize, 0..5usize),
    ) {
        const LABELS: [&str; 5] = ["prod", "web", "api", "cluster", "member-1"];
        let entry = |(c, n, m): (usize, usize, usize)| Entry {
            cluster: LABELS[c].into(),
            namespace: LABELS[n].into(),
            name: LABELS[m].into(),
        };
        let (ea, eb) = (entry(a), entry(b));
        proptest::prop_assume!(ea != eb);
        let z = zone();
        let (Ok(ka), Ok(kb)) = (ea.keys(&z), eb.keys(&z)) else {
            // A reserved namespace has no records to collide with.
            return Ok(());
        };
        let fleet_wide = format!("{}/{}/{}", z.prefix, eb.namespace, eb.name);
        let same_service = ea.namespace == eb.namespace && ea.name == eb.name;
        for key in &ka {
            proptest::prop_assert!(!answers(key, &kb[0]), "{key} answered as {}", kb[0]);
            // Only the same service in another cluster joins its fleet-wide name.
            if !same_service {
                proptest::prop_assert!(!answers(key, &fleet_wide), "{key} answered under {fleet_wide}");
            }
            proptest::prop_assert!(!kb.contains(key), "{key} shared");
        }
    }
}

/// #59: a member Lease deleted and recreated counts its terms from 1
/// again. A record of a higher term of another Lease does not depose the
/// new leader (it would never write again); one of the same Lease does.
#[test]
fn a_newer_term_deposes_only_on_the_same_lease() {
    let on = |lease: &str, epoch| Writer {
        lease: lease.into(),
        ..me("m1", epoch)
    };
    let desired = entry("m1")
        .desired_by(&zone(), Some("10.96.0.7"), 8080, &on("lease-a", 9))
        .unwrap();
    let found = existing(&desired, 4);
    let key = &found[0].key;
    let record = found[0].record.as_ref().unwrap();
    assert!(newer_term(key, record, &on("lease-a", 2)).is_err());
    assert!(newer_term(key, record, &on("lease-b", 1)).is_ok());
    assert!(newer_term(key, record, &on("lease-a", 9)).is_ok());
    let again = entry("m1")
        .desired_by(&zone(), Some("10.96.0.8"), 8080, &on("lease-b", 1))
        .unwrap();
    assert_eq!(
        plan_register(&again, &found, &on("lease-b", 1))
            .unwrap()
            .len(),
        2,
        "both records rewritten"
    );
    let alive = |_: &str, _: &str| false;
    assert_eq!(
        plan_sweep(&found, &on("lease-b", 1), &zone(), alive).len(),
        2
    );
    assert!(plan_sweep(&found, &on("lease-a", 2), &zone(), alive).is_empty());
}
