//! One chaos run: the bed set up, the workload and the nemesis together,
//! the quiet period, then every invariant judged and reported.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use tokio::time::Instant;

use crate::check::{self, Expected, Observed, Seen, Violation};
use crate::nemesis::{self, Bed};
use crate::proxy::Proxy;
use crate::records;
use crate::registry_history;
use crate::schedule::{self, MEMBERS};
use crate::support::rollout::{RolloutFleet, done, rollout_fleet_prepared};
use crate::support::{fleet_dir, kubeconfig_via};
use crate::workload::{self, NEVER_READY, Record, Target};
use flotilla::crd::Microservice;
use flotilla::rollout::spec::FleetMicroservice;

/// How long the fleet may take to settle after the last fault.
const QUIET_LIMIT: Duration = Duration::from_secs(180);
/// How late a replica may act on a moved label (it rereads label files).
const LABEL_GRACE: Duration = Duration::from_secs(5);

pub async fn chaos(seed: u64, length: Duration) {
    let replay = format!(
        "CHAOS_SEED={seed} CHAOS_SECONDS={} make chaos",
        length.as_secs()
    );
    println!(
        "chaos: seed {seed}, {} s (replay: {replay})",
        length.as_secs()
    );
    let plan = schedule::plan(seed, length);

    let mut proxies = BTreeMap::new();
    for m in MEMBERS {
        let (_, upstream) = kubeconfig_via(m, 0);
        proxies.insert(m, Proxy::start(upstream).await);
    }
    let tokens = fleet_dir().join("chaos");
    std::fs::create_dir_all(&tokens).expect("chaos dir");
    let (read_token, write_token) = (tokens.join("read-token"), tokens.join("write-token"));
    std::fs::write(&read_token, "chaos-reader\n").expect("token");
    std::fs::write(&write_token, "chaos-writer\n").expect("token");
    let ports: BTreeMap<&str, u16> = proxies.iter().map(|(m, p)| (*m, p.port)).collect();
    let (rt, wt) = (read_token.clone(), write_token.clone());
    let labels = [
        ("member-1", "ring: canary\n"),
        ("member-2", "ring: rest\n"),
        ("member-3", "ring: rest\n"),
    ];
    let RolloutFleet {
        home,
        members,
        namespace,
        guards,
        replicas,
    } = rollout_fleet_prepared("chaos", &labels, move |r| {
        // The operator reaches each member through its black-hole proxy.
        for m in MEMBERS {
            let (yaml, _) = kubeconfig_via(m, ports[m]);
            std::fs::write(r.dir.join(format!("{m}.yaml")), yaml).expect("kubeconfig");
        }
        r.env.extend(crate::support::registry::env());
        for id in schedule::REPLICAS {
            r.ui_ports
                .insert(id.into(), crate::support::replicas::free_port());
        }
        r.grpc_args.extend([
            "--grpc-token-file".into(),
            rt.display().to_string(),
            "--grpc-write-token-file".into(),
            wt.display().to_string(),
        ]);
    })
    .await;
    let member_lease = replicas.lease_name();
    let home_lease = format!("{member_lease}-rollouts");
    let labels_dir = replicas.dir.clone();
    let dashboards = replicas
        .ui_ports
        .values()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let urls: Arc<Mutex<BTreeMap<String, String>>> = Default::default();
    let target = Target {
        namespace: namespace.clone(),
        home: home.clone(),
        members: members.clone(),
        urls: urls.clone(),
        read_token: read_token.display().to_string(),
        write_token: write_token.display().to_string(),
        dashboards,
    };
    let rec = Arc::new(Record::default());
    let bed = Arc::new(Bed {
        replicas: Mutex::new(replicas),
        urls,
        proxies,
        labels: labels_dir,
        canary: Default::default(),
        exits: Default::default(),
        log: Default::default(),
        stopped: Default::default(),
        turns: Default::default(),
        target: target.clone(),
        rec: rec.clone(),
        member_lease: member_lease.clone(),
        registry_down: Default::default(),
    });
    bed.move_canary("member-1");
    bed.reap_unasked();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let watcher = tokio::spawn(workload::watcher(
        target.clone(),
        rec.clone(),
        seed ^ 0xa,
        stop_rx.clone(),
    ));
    let dashboard = tokio::spawn(workload::dashboard_watcher(
        target.clone(),
        rec.clone(),
        seed ^ 0xd,
        stop_rx,
    ));
    workload::seed_objects(&target, &rec).await;
    let (settled, first) = settle(&target, &rec, QUIET_LIMIT).await;
    assert!(
        first.is_empty(),
        "the fleet did not settle before the chaos: {first:#?}"
    );
    println!(
        "chaos: settled before the faults in {:.1} s",
        settled.as_secs_f64()
    );

    // The registry's history is judged from here on (#67).
    let registry_prefix = registry_history::prefix()
        .await
        .expect("the registry's zone");
    let registry_from = registry_history::revision_retrying(30)
        .await
        .expect("etcd's revision before the chaos");
    let start = Instant::now();
    let until = start + length;
    let mut workers = Vec::new();
    for w in 0..workload::PLAIN_WORKERS {
        workers.push(tokio::spawn(workload::plain_worker(
            target.clone(),
            rec.clone(),
            seed ^ (w as u64 + 1) << 8,
            w,
            until,
        )));
    }
    for f in 0..workload::FLEET_OBJECTS {
        workers.push(tokio::spawn(workload::fleet_worker(
            target.clone(),
            rec.clone(),
            seed ^ (f as u64 + 1) << 16,
            f,
            until,
        )));
    }
    let faults = tokio::spawn(nemesis::run(bed.clone(), plan.clone(), start));
    let nemesis_result = faults.await;
    nemesis::heal(&bed);
    let last_fault = Instant::now();
    let mut harness_errors = Vec::new();
    if let Err(e) = nemesis_result {
        harness_errors.push(format!("the nemesis failed: {e}"));
    }
    for w in workers {
        match tokio::time::timeout(Duration::from_secs(300), w).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => harness_errors.push(format!("a workload task failed: {e}")),
            Err(_) => harness_errors.push("a workload task did not end within 300 s".into()),
        }
    }
    bed.reap_unasked();

    // The quiet period: until everything holds, or the limit.
    let (_, mut violations) = settle(&target, &rec, QUIET_LIMIT).await;
    let convergence = last_fault.elapsed();
    stop_tx.send_replace(true);
    watcher.abort();
    dashboard.abort();
    bed.reap_unasked();

    // From the apiservers' records.
    for m in MEMBERS {
        let (leases, writes) = records::member_terms(m, &namespace, &member_lease);
        violations.extend(check::writes_inside_terms(
            check::ONE_WRITER,
            &leases,
            &writes,
            records::TERM_LIMIT,
        ));
    }
    let (leases, writes) = records::fleet_terms(&namespace, &home_lease);
    violations.extend(check::writes_inside_terms(
        check::FLEET_WRITER,
        &leases,
        &writes,
        records::TERM_LIMIT,
    ));
    let (leases, writes) = records::dns_terms(&namespace, &format!("{member_lease}-dns"));
    violations.extend(check::writes_inside_terms(
        check::DNS_WRITER,
        &leases,
        &writes,
        records::TERM_LIMIT,
    ));
    let status = records::status_writes(&namespace);
    if status.is_empty() {
        // Without status bodies the false-success check has nothing to judge by.
        harness_errors.push(
            "no Microservice status bodies in the audit logs: the fleet predates \
             integration/audit-policy.yaml's status rule; `make fleet-down` and run again"
                .into(),
        );
    }
    let answers = rec.answers.lock().unwrap().clone();
    violations.extend(check::no_false_success(&answers, &status));
    let canary = bed.canary.lock().unwrap().clone();
    violations.extend(check::wave_order(
        &records::fleet_member_writes(&namespace),
        &status,
        &canary,
        crate::BAKE,
        LABEL_GRACE,
    ));
    violations.extend(check::no_exit(&bed.exits.lock().unwrap()));
    let (orphan_cases, overlapped) = orphan_records(
        &bed,
        &registry_prefix,
        registry_from,
        &mut violations,
        &mut harness_errors,
    )
    .await;

    // The report: a table per invariant, then the one-line summary.
    let kinds: BTreeSet<&str> = plan.iter().map(|p| p.fault.kind()).collect();
    println!("{:<45} {:>10}", "invariant", "violations");
    for inv in check::INVARIANTS {
        println!(
            "{inv:<45} {:>10}",
            violations.iter().filter(|v| v.invariant == inv).count()
        );
    }
    println!(
        "invariant {}: {orphan_cases} checked, {} violated ({overlapped} deletions overlapped a registry stop)",
        check::NO_ORPHAN_RECORD,
        violations
            .iter()
            .filter(|v| v.invariant == check::NO_ORPHAN_RECORD)
            .count()
    );
    let by_kind = kinds
        .iter()
        .map(|k| {
            format!(
                "{k} {}",
                plan.iter().filter(|p| p.fault.kind() == *k).count()
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    let waits = answers.len();
    let ok = answers.iter().filter(|a| a.code == 0).count();
    println!("faults by kind: {by_kind}");
    println!(
        "answers: {waits} waits ({ok} said done), watch resumed {} times, dashboard stream {} times; settled {:.1} s after the last fault",
        rec.watch_resumes.lock().unwrap(),
        rec.dashboard_resumes.lock().unwrap(),
        convergence.as_secs_f64()
    );
    let operations = rec.ops.lock().unwrap().len() + waits;
    println!(
        "chaos: {} faults ({} kinds), {operations} operations, {} violations, seed {seed}",
        plan.len(),
        kinds.len(),
        violations.len()
    );
    if !violations.is_empty() || !harness_errors.is_empty() {
        let file = excerpt(seed, &violations, &bed, &rec);
        panic!(
            "chaos found {} violations (history: {}); harness errors: {harness_errors:?}; first: {:#?}\nreplay: {replay}",
            violations.len(),
            file.display(),
            violations.iter().take(5).collect::<Vec<_>>()
        );
    }
    drop(guards);
}

/// #67: no record of a deleted Microservice written after its deletion was
/// seen, or left at the end, judged from etcd's own history. Returns the
/// deletions judged on real records, and how many overlapped a registry
/// stop. A read that fails is a harness error: the run cannot pass on it.
async fn orphan_records(
    bed: &Bed,
    prefix: &str,
    from: i64,
    violations: &mut Vec<Violation>,
    harness_errors: &mut Vec<String>,
) -> (usize, usize) {
    let down = bed.registry_down.lock().unwrap().clone();
    let mut gone = Vec::new();
    for g in bed.rec.gone.lock().unwrap().iter() {
        match g {
            Ok((g, began, ended)) => {
                let mut g = g.clone();
                g.during_registry_stop = down.iter().any(|(s, e)| s < ended && e > began);
                gone.push(g);
            }
            Err(e) => harness_errors.push(format!("unverifiable deletion: {e}")),
        }
    }
    let history = registry_history::puts_since(prefix, from).await;
    let now = registry_history::present(prefix).await;
    let (history, now) = match (history, now) {
        (Ok(h), Ok(n)) => (h, n),
        (h, n) => {
            let why = [h.err(), n.err()].into_iter().flatten().collect::<Vec<_>>();
            harness_errors.push(format!("unverifiable: the registry's history: {why:?}"));
            return (0, 0);
        }
    };
    let (checked, v) = check::no_orphan_record(&gone, &history, &now);
    violations.extend(v);
    let overlapped = gone.iter().filter(|g| g.during_registry_stop).count();
    (checked, overlapped)
}

/// Polls until the fleet matches the workload's record (convergence, no
/// orphans, no stale DNS) or `limit` passes: the time it took, and what
/// still failed.
async fn settle(t: &Target, rec: &Record, limit: Duration) -> (Duration, Vec<Violation>) {
    let start = Instant::now();
    loop {
        let expected = expected(rec);
        let (observed, orphans) = observe(t, rec).await;
        let stale = stale_names(t, &expected).await;
        let mut v = check::converged(&expected, &observed);
        v.extend(check::nothing_left(&orphans, &stale));
        if v.is_empty() || start.elapsed() > limit {
            return (start.elapsed(), v);
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
}

/// What the last operations demand: each plain Microservice's last image
/// (or its absence); for each FleetMicroservice, Complete at its last
/// good release, or RolledBack to an earlier good image when the last
/// release was never-ready or was not seen complete.
fn expected(rec: &Record) -> Expected {
    let mut fleet = BTreeMap::new();
    for (name, releases) in rec.releases.lock().unwrap().iter() {
        let Some((last, earlier)) = releases.split_last() else {
            continue;
        };
        let good = |r: &workload::Release| !r.image.ends_with(NEVER_READY);
        let mut allowed = Vec::new();
        if good(last) {
            allowed.push(("Complete".to_string(), last.image.clone()));
        }
        if !good(last) || last.code != Some(0) {
            for r in earlier.iter().filter(|r| good(r)) {
                allowed.push(("RolledBack".to_string(), r.image.clone()));
            }
        }
        fleet.insert(name.clone(), allowed);
    }
    Expected {
        microservices: rec.plain.lock().unwrap().clone(),
        fleet,
    }
}

async fn observe(t: &Target, rec: &Record) -> (Observed, Vec<String>) {
    let mut o = Observed {
        members: MEMBERS.iter().map(|m| m.to_string()).collect(),
        ..Default::default()
    };
    let mut orphans = Vec::new();
    for m in MEMBERS {
        let c = t.members[m].clone();
        let Ok(list) = Api::<Microservice>::namespaced(c.clone(), &t.namespace)
            .list(&ListParams::default())
            .await
        else {
            continue;
        };
        let live: BTreeSet<String> = list.iter().filter_map(|ms| ms.uid()).collect();
        for ms in &list {
            o.microservices.insert(
                (m.to_string(), ms.name_any()),
                Seen {
                    image: ms.spec.image.clone(),
                    done: done(ms),
                },
            );
        }
        orphans.extend(unowned::<Deployment>(&c, &t.namespace, &live, m, "deployments").await);
        orphans.extend(unowned::<Service>(&c, &t.namespace, &live, m, "services").await);
    }
    if let Ok(list) = Api::<FleetMicroservice>::namespaced(t.home.clone(), &t.namespace)
        .list(&ListParams::default())
        .await
    {
        for f in list {
            let st = f.status.as_ref();
            let phase = st.and_then(|s| s.phase).map_or("none", |p| p.as_str());
            let current = st.is_some_and(|s| s.observed_generation == f.metadata.generation);
            let shown = if current {
                phase.to_string()
            } else {
                format!("{phase} (generation not observed)")
            };
            o.phases.insert(f.name_any(), shown);
        }
    }
    o.watch = rec.watch.lock().unwrap().clone();
    o.dashboard = rec.dashboard.lock().unwrap().clone();
    (o, orphans)
}

/// Children of kind `K` in `ns` that no living Microservice controls.
async fn unowned<K>(
    c: &kube::Client,
    ns: &str,
    live: &BTreeSet<String>,
    member: &str,
    plural: &str,
) -> Vec<String>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let Ok(list) = Api::<K>::namespaced(c.clone(), ns)
        .list(&ListParams::default())
        .await
    else {
        return Vec::new();
    };
    list.iter()
        .filter(|o| {
            !o.meta().owner_references.as_ref().is_some_and(|r| {
                r.iter()
                    .any(|o| o.kind == "Microservice" && live.contains(&o.uid))
            })
        })
        .map(|o| format!("{member} {plural}/{}", o.name_any()))
        .collect()
}

/// Fleet-wide DNS names of deleted plain Microservices that still resolve.
async fn stale_names(t: &Target, expected: &Expected) -> Vec<String> {
    let zone = crate::support::registry::zone();
    let names: Vec<String> = expected
        .microservices
        .iter()
        .filter(|(_, image)| image.is_none())
        .map(|(name, _)| format!("{name}.{}.{zone}", t.namespace))
        .collect();
    tokio::task::spawn_blocking(move || {
        names
            .into_iter()
            .filter(|n| crate::support::registry::rcode(n, "A") != "NXDOMAIN")
            .collect()
    })
    .await
    .unwrap_or_default()
}

/// Writes the violations and the history around each (faults, operations
/// and answers within 15 s) to `.fleet/chaos/`; returns the file.
fn excerpt(seed: u64, violations: &[Violation], bed: &Bed, rec: &Record) -> std::path::PathBuf {
    let near = |at: &Timestamp| {
        violations.iter().any(|v| {
            v.at.is_none_or(|t| t.duration_since(*at).abs() <= jiff::SignedDuration::from_secs(15))
        })
    };
    let pick = |log: &[(Timestamp, String)]| -> Vec<String> {
        log.iter()
            .filter(|(t, _)| near(t))
            .map(|(t, w)| format!("{t} {w}"))
            .collect()
    };
    let faults = pick(&bed.log.lock().unwrap());
    let ops = pick(&rec.ops.lock().unwrap());
    let answers: Vec<_> = rec
        .answers
        .lock()
        .unwrap()
        .iter()
        .filter(|a| near(&a.answered))
        .cloned()
        .collect();
    let body = serde_json::json!({
        "seed": seed,
        "violations": violations.iter().map(|v| serde_json::json!({
            "invariant": v.invariant, "at": v.at.map(|t| t.to_string()), "detail": v.detail,
        })).collect::<Vec<_>>(),
        "faults": faults,
        "operations": ops,
        "answers": answers,
    });
    let dir = fleet_dir().join("chaos");
    std::fs::create_dir_all(&dir).expect("chaos dir");
    let file = dir.join(format!("seed-{seed}-{}.json", Timestamp::now().as_second()));
    std::fs::write(&file, serde_json::to_string_pretty(&body).expect("json"))
        .expect("write history");
    file
}
