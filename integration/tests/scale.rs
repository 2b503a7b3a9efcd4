//! Ten members and three replicas: the fleet grows to ten members for this
//! test and shrinks back to its size afterwards. It checks a balanced
//! assignment, a Microservice converged in every member, and the kill -9
//! handover of the biggest share, with one writer at a time in the audit
//! log of every member. The fifty-member run is `make bench-scale`.
//!
//! One test in a binary of its own: nothing else runs while the fleet is
//! ten members wide.

mod support;

use support::replicas::*;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use support::{
    assert_one_writer_at_a_time, client, ensure_crd, eventually, fleet_cmd, fleet_dir,
    microservice, wait_all_true, wait_deployment_image,
};
use tokio::time::Instant;

use flotilla::crd::Microservice;

const MEMBERS_HERE: usize = 10;

/// Grows the fleet to `n` members; shrinks it back to its size when
/// dropped, whatever the outcome, so the tests that follow find it as it was.
struct WiderFleet {
    before: usize,
}

impl WiderFleet {
    fn grow(n: usize) -> Self {
        let before: usize = std::fs::read_to_string(fleet_dir().join("members"))
            .expect("the fleet is up")
            .trim()
            .parse()
            .expect("member count");
        if before < n {
            fleet_cmd(&["up", "--clusters", &n.to_string()]);
        }
        WiderFleet { before }
    }
}

impl Drop for WiderFleet {
    fn drop(&mut self) {
        fleet_cmd(&["up", "--clusters", &self.before.to_string()]);
    }
}

/// Member kubeconfigs in the fleet's directory.
fn member_kubeconfigs() -> BTreeSet<String> {
    std::fs::read_dir(fleet_dir().join("kubeconfigs"))
        .expect("kubeconfig dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|f| f.starts_with("member-") && f.ends_with(".yaml"))
        .collect()
}

fn expected_kubeconfigs(n: usize) -> BTreeSet<String> {
    (1..=n).map(|i| format!("member-{i}.yaml")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_members_balance_converge_and_survive_a_kill_9() {
    let wider = WiderFleet::grow(MEMBERS_HERE);
    assert_eq!(
        member_kubeconfigs(),
        expected_kubeconfigs(MEMBERS_HERE.max(wider.before)),
        "`up --clusters N` leaves exactly N member kubeconfigs"
    );
    let names: Vec<&'static str> = (1..=MEMBERS_HERE)
        .map(|i| &*Box::leak(format!("member-{i}").into_boxed_str()))
        .collect();
    let mut clients: BTreeMap<&'static str, Client> = BTreeMap::new();
    for m in &names {
        let c = client(m).await;
        ensure_crd(&c).await;
        clients.insert(m, c);
    }
    {
        let (ns, _guards) = namespaces(&clients, "scale").await;
        // Replicas inherit this process's limits: a soft open-files limit
        // of 1024 below a higher hard one, as container runtimes start
        // processes, which a replica raises for its two connections per member.
        let (_, hard) = flotilla::limits::open_files();
        let soft = hard.map_or(1024, |h| h.min(1024));
        rustix::process::setrlimit(
            rustix::process::Resource::Nofile,
            rustix::process::Rlimit {
                current: Some(soft),
                maximum: hard,
            },
        )
        .expect("lower the soft limit");
        let mut replicas = Replicas::new(&ns, &names);
        for id in REPLICA_IDS {
            replicas.start(id);
        }
        let want = hard.map_or("unlimited".to_string(), |h| h.to_string());
        for pid in replicas.pids() {
            eventually(
                "the replica raised its open-files limit",
                Duration::from_secs(20),
                || {
                    let want = want.clone();
                    async move {
                        let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
                        let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
                        let f: Vec<&str> = line.split_whitespace().collect();
                        (f.get(3) == Some(&want.as_str())).then_some(())
                    }
                },
            )
            .await;
        }
        let lease = replicas.lease_name();

        // Balanced: 4/3/3.
        let held = balanced(&clients, &lease, &REPLICA_IDS).await;
        let mut shares: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for (m, r) in &held {
            shares.entry(r.as_str()).or_default().push(m.clone());
        }
        let sizes: Vec<usize> = shares.values().map(Vec::len).collect();
        eprintln!("assignment over {MEMBERS_HERE} members: {sizes:?}");
        assert_eq!(shares.len(), 3, "every replica leads: {held:?}");
        assert!(
            sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1,
            "{held:?}"
        );

        // Converged in every member.
        let started = Instant::now();
        for c in clients.values() {
            Api::<Microservice>::namespaced(c.clone(), &ns)
                .create(
                    &PostParams::default(),
                    &microservice("web", "ghcr.io/acme/web:1", 8080, Some(1)),
                )
                .await
                .expect("create");
        }
        futures::future::join_all(clients.values().map(|c| {
            let api = Api::<Microservice>::namespaced(c.clone(), &ns);
            async move { wait_all_true(&api, 1, "Available", Duration::from_secs(120)).await }
        }))
        .await;
        eprintln!(
            "Available in all {MEMBERS_HERE} members after {:?}",
            started.elapsed()
        );

        // kill -9 of the replica with the biggest share.
        let (victim, victims_members) = shares
            .iter()
            .max_by_key(|(_, ms)| ms.len())
            .map(|(r, ms)| (r.to_string(), ms.clone()))
            .expect("a share");
        let started = Instant::now();
        replicas.kill_9(&victim);
        // Changes made while those members have no leader.
        for m in &victims_members {
            Api::<Microservice>::namespaced(clients[m.as_str()].clone(), &ns)
                .patch(
                    "web",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"image": "ghcr.io/acme/web:2"}})),
                )
                .await
                .expect("patch");
        }
        let after = eventually(
            "every member of the killed replica led again",
            Duration::from_secs(60),
            || async {
                let h = holders(&clients, &lease).await;
                let moved = victims_members
                    .iter()
                    .all(|m| h[m].as_ref().is_some_and(|r| *r != victim));
                moved.then_some(h)
            },
        )
        .await;
        let takeover = started.elapsed();
        eprintln!(
            "kill -9 of {victim}, leading {}: all led again after {takeover:?}",
            victims_members.len()
        );
        // LeaseDuration + RetryPeriod is the bound; the rest is room for a
        // loaded two-core machine polling ten Leases.
        assert!(
            takeover < LEASE_DURATION + RETRY_PERIOD + Duration::from_secs(5),
            "{takeover:?}"
        );
        // Members the victim did not lead kept their leaders.
        for (m, r) in &held {
            if *r != victim {
                assert_eq!(after[m].as_ref(), Some(r), "{m} changed leader");
            }
        }
        // The survivors share the victim's members evenly: 5/5.
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for r in after.values().flatten() {
            *counts.entry(r.as_str()).or_default() += 1;
        }
        let spread: Vec<usize> = counts.values().copied().collect();
        assert_eq!(counts.len(), 2, "{after:?}");
        assert!(spread.iter().max().unwrap() - spread.iter().min().unwrap() <= 1);

        // The pending changes applied by the new leaders.
        for m in &victims_members {
            let deployments = Api::<Deployment>::namespaced(clients[m.as_str()].clone(), &ns);
            wait_deployment_image(
                &deployments,
                "web",
                "ghcr.io/acme/web:2",
                Duration::from_secs(60),
            )
            .await;
        }

        // One writer at a time in every member's audit log.
        let by = |id: &str| format!("flotilla/{id}");
        for m in &names {
            let writers = assert_one_writer_at_a_time(m, &ns);
            if victims_members.iter().any(|v| v == m) {
                let new = after[*m].clone().expect("a leader");
                assert_eq!(writers, vec![by(&victim), by(&new)], "{m}'s writers");
            } else {
                assert_eq!(writers, vec![by(&held[*m])], "{m}'s writers");
            }
        }
    }
    let before = wider.before;
    drop(wider);
    assert_eq!(
        member_kubeconfigs(),
        expected_kubeconfigs(before),
        "shrinking the fleet removes the kubeconfigs of the members it stopped"
    );
}
