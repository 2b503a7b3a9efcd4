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

use crate::check::{self, Expected, Judged, Observed, Seen, Violation};
use crate::nemesis::{self, Bed};
use crate::proxy::Proxy;
use crate::records;
use crate::registry_history;
use crate::report::Report;
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
/// Runs this long or longer fail when an invariant judged no case.
const EVERY_CHECKED_FROM: Duration = Duration::from_secs(300);
/// How long a change of numberOfClusters, or a member's silence, may take
/// the fleet controller to act on.
const COUNT_GRACE: Duration = Duration::from_secs(5);

/// The replicas' `--dns-withdraw-after` (the default), for `dns-withdrawn`.
const DNS_WITHDRAW_AFTER: Duration = Duration::from_secs(5);

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
    if length < schedule::HELD_OUT_BELOW {
        println!(
            "chaos: held out of runs under {} s: home-stop (make test's Pod tests share the home apiserver)",
            schedule::HELD_OUT_BELOW.as_secs()
        );
    }

    let mut proxies = BTreeMap::new();
    for m in MEMBERS {
        let (_, upstream) = kubeconfig_via(m, 0);
        proxies.insert(m, Proxy::start(upstream).await);
    }
    let tokens = fleet_dir().join("chaos");
    std::fs::create_dir_all(&tokens).expect("chaos dir");
    let (read_token, write_token) = (tokens.join("read-token"), tokens.join("write-token"));
    let watch_lag = tokens.join("watch-lag");
    std::fs::remove_file(&watch_lag).ok();
    let lag_file = watch_lag.display().to_string();
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
        r.env
            .push(("FLOTILLA_WATCH_LAG_FILE".into(), lag_file.clone()));
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
    let rec = Arc::new(Record::default());
    let verdict = workload::verdict_server(rec.clone()).await;
    let target = Target {
        namespace: namespace.clone(),
        home: home.clone(),
        members: members.clone(),
        urls: urls.clone(),
        read_token: read_token.display().to_string(),
        write_token: write_token.display().to_string(),
        dashboards,
        verdict_url: format!("http://127.0.0.1:{verdict}/verdict"),
    };
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
        downs: Default::default(),
        blind: Default::default(),
        bursts: Default::default(),
        watch_lag,
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
        stop_rx.clone(),
    ));
    // Through the quiet period too: the last release's Manual wave must open.
    let approver = tokio::spawn(workload::approver(
        target.clone(),
        rec.clone(),
        seed ^ 0xa99,
        stop_rx,
    ));
    workload::seed_objects(&target, &rec).await;
    let (settled, first) = settle(&target, &rec, QUIET_LIMIT).await;
    assert!(
        first.holds(),
        "the fleet did not settle before the chaos: {:#?} {:#?} {:?}",
        first.converged.violations,
        first.left.violations,
        first.unverifiable
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
    // The windowed objects were created with their windows, long read.
    let windows_from = Timestamp::now();
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
    workers.push(tokio::spawn(workload::verdict_flipper(
        rec.clone(),
        seed ^ 0x7e4d,
        until,
    )));
    workers.push(tokio::spawn(workload::placed_worker(
        target.clone(),
        rec.clone(),
        seed ^ 0x91ace,
        until,
    )));
    let samples: Arc<Mutex<Vec<crate::withdrawn::Sample>>> = Default::default();
    let sampler = tokio::spawn(registry_history::sample_revisions(
        Duration::from_millis(250),
        samples.clone(),
    ));
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
    let (_, last) = settle(&target, &rec, QUIET_LIMIT).await;
    let convergence = last_fault.elapsed();
    let windows_to = Timestamp::now();
    sampler.abort();
    stop_tx.send_replace(true);
    watcher.abort();
    dashboard.abort();
    approver.abort();
    bed.reap_unasked();
    let mut report = Report::default();
    report.add(check::CONVERGED, last.converged);
    report.add(check::NOTHING_LEFT, last.left);
    for u in last.unverifiable {
        report.unverifiable(u);
    }

    // From the apiservers' records: every audit line must parse first.
    for cluster in MEMBERS.into_iter().chain(["home"]) {
        for u in records::unparsed(cluster) {
            report.unverifiable(u);
        }
    }
    // Writes a late delivery brought are judged at when they left.
    let late: Vec<crate::proxy::Delivery> =
        bed.proxies.values().flat_map(|p| p.deliveries()).collect();
    println!(
        "late-delivery: {} connections delivered late, lags up to {:.1?}; {} member writes landed late",
        late.len(),
        late.iter().map(|d| d.lag).max().unwrap_or_default(),
        records::late_writes(&late, &namespace, &member_lease)
    );
    for m in MEMBERS {
        let (leases, writes, unreadable) =
            records::member_terms(&late, m, &namespace, &member_lease);
        for u in unreadable {
            report.unverifiable(u);
        }
        report.add(
            check::ONE_WRITER,
            check::writes_inside_terms(check::ONE_WRITER, &leases, &writes, records::TERM_LIMIT),
        );
    }
    let (leases, writes) = records::fleet_terms(&late, &namespace, &home_lease);
    report.add(
        check::FLEET_WRITER,
        check::writes_inside_terms(check::FLEET_WRITER, &leases, &writes, records::TERM_LIMIT),
    );
    let (leases, writes) = records::dns_terms(&namespace, &format!("{member_lease}-dns"));
    report.add(
        check::DNS_WRITER,
        check::writes_inside_terms(check::DNS_WRITER, &leases, &writes, records::TERM_LIMIT),
    );
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
    report.add(
        check::NO_FALSE_SUCCESS,
        check::no_false_success(&answers, &status),
    );
    let canary = bed.canary.lock().unwrap().clone();
    let fleet_writes = records::fleet_member_writes(&namespace);
    let (fleet_status, unreadable) = records::fleet_status_writes(&namespace);
    for u in unreadable {
        report.unverifiable(u);
    }
    // The counted object has no waves: its writes are judged by placement.
    let waved: Vec<check::FleetWrite> = fleet_writes
        .iter()
        .filter(|w| w.name != workload::PLACED)
        .cloned()
        .collect();
    let (order, held) = check::wave_order(
        &waved,
        &status,
        &fleet_status,
        &canary,
        crate::BAKE,
        LABEL_GRACE,
    );
    report.add(check::WAVE_ORDER, order);
    report.add(check::BAKE_HELD, held);
    match approvals(&target).await {
        Ok(approvals) => report.add(
            check::APPROVAL_BOUND,
            check::approval_bound(
                &workload::fleet_name(workload::MANUAL),
                workload::MANUAL_WAVE,
                &fleet_writes,
                &status,
                &canary,
                &fleet_status,
                LABEL_GRACE,
                &approvals,
                &workload::APPROVERS,
                &rec.forbidden.lock().unwrap(),
            ),
        ),
        Err(e) => report.unverifiable(e),
    }
    let shut: Vec<check::Shut> = workload::WINDOWED
        .iter()
        .flat_map(|(f, kind)| workload::shut(*f, kind, windows_from, windows_to))
        .collect();
    report.add(
        check::WINDOW_HELD,
        check::window_held(&shut, &fleet_status, &fleet_writes),
    );
    let placed = records::placed_events(&late, &namespace, workload::PLACED);
    let unreachable = bed.downs.lock().unwrap().clone();
    report.add(
        crate::placement::FAILOVER_COUNT,
        crate::placement::failover_count(
            &placed,
            &rec.counts.lock().unwrap(),
            &unreachable,
            COUNT_GRACE,
        ),
    );
    report.add(
        crate::placement::NO_DELETE_UNREACHABLE,
        crate::placement::no_delete_unreachable(
            &placed,
            &unreachable,
            &fleet_status
                .iter()
                .filter(|s| s.name == workload::PLACED)
                .map(|s| crate::placement::Marks {
                    at: s.at,
                    unreachable: s.unreachable.clone(),
                })
                .collect::<Vec<_>>(),
        ),
    );
    report.add(
        check::NO_EXIT,
        check::no_exit(&bed.exits.lock().unwrap(), schedule::REPLICAS.len()),
    );
    let overlapped = orphan_records(&bed, &registry_prefix, registry_from, &mut report).await;
    let fleet = bed.replicas.lock().unwrap().fleet.clone();
    match fleet_dns_history(&fleet, &registry_prefix, registry_from).await {
        Ok((terms, puts, (initial, changes))) => {
            report.add(check::DNS_FENCE, check::dns_fence(&terms, &puts));
            report.add(
                check::DNS_NEVER_EMPTY,
                check::dns_never_empty(&initial, &changes),
            );
            let (dns_leases, _) = records::dns_terms(&namespace, &format!("{member_lease}-dns"));
            let samples = samples.lock().unwrap();
            let evidence = crate::withdrawn::Evidence {
                downs: &bed.downs.lock().unwrap(),
                terms: &crate::withdrawn::term_starts(&dns_leases, &terms, &samples),
                blind: &bed.blind.lock().unwrap(),
                samples: &samples,
                initial: &initial,
                changes: &changes,
            };
            let (judged, took) = crate::withdrawn::dns_withdrawn(&evidence, DNS_WITHDRAW_AFTER);
            report.add(crate::withdrawn::DNS_WITHDRAWN, judged);
            println!(
                "dns-withdrawn: down to listed nowhere, per judged member stretch: {took:.1?} s"
            );
        }
        Err(e) => report.unverifiable(format!("the fleet DNS history: {e}")),
    }

    // The report: one line per invariant, then the one-line summary.
    let kinds: BTreeSet<&str> = plan.iter().map(|p| p.fault.kind()).collect();
    for line in report.lines() {
        println!("{line}");
    }
    println!("registry: {overlapped} deletions overlapped a registry stop");
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
        "analysis: the webhook was asked {} times, {} answered 503",
        rec.asked.load(std::sync::atomic::Ordering::Relaxed),
        rec.refused.load(std::sync::atomic::Ordering::Relaxed)
    );
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
        report.violations.len()
    );
    // Long runs must give every invariant a case: a pass that judged
    // nothing proves nothing.
    let failures = report.failures(length >= EVERY_CHECKED_FROM);
    if !failures.is_empty() || !harness_errors.is_empty() {
        let file = excerpt(seed, &report.violations, &bed, &rec);
        panic!(
            "chaos failed: {failures:?} (history: {}); harness errors: {harness_errors:?}; first: {:#?}\nreplay: {replay}",
            file.display(),
            report.violations.iter().take(5).collect::<Vec<_>>()
        );
    }
    drop(guards);
}

/// #67: no record of a deleted Microservice written after its deletion was
/// seen, or left at the end, judged from etcd's own history. Returns how
/// many deletions overlapped a registry stop. A read that fails is
/// unverifiable: the run cannot pass on it.
async fn orphan_records(bed: &Bed, prefix: &str, from: i64, report: &mut Report) -> usize {
    let down = bed.registry_down.lock().unwrap().clone();
    let mut gone = Vec::new();
    for g in bed.rec.gone.lock().unwrap().iter() {
        match g {
            Ok((g, began, ended)) => {
                let mut g = g.clone();
                g.during_registry_stop = down.iter().any(|(s, e)| s < ended && e > began);
                gone.push(g);
            }
            Err(e) => report.unverifiable(format!("a deletion: {e}")),
        }
    }
    let history = registry_history::puts_since(prefix, from).await;
    let now = registry_history::present(prefix).await;
    let (history, now) = match (history, now) {
        (Ok(h), Ok(n)) => (h, n),
        (h, n) => {
            let why = [h.err(), n.err()].into_iter().flatten().collect::<Vec<_>>();
            report.unverifiable(format!("the registry's history: {why:?}"));
            return 0;
        }
    };
    report.add(
        check::NO_ORPHAN_RECORD,
        check::no_orphan_record(&gone, &history, &now),
    );
    gone.iter().filter(|g| g.during_registry_stop).count()
}

/// The fleet DNS writer's term claims and record puts since `from`.
async fn fleet_dns_history(
    fleet: &str,
    prefix: &str,
    from: i64,
) -> Result<(Vec<check::TermPut>, Vec<check::DnsPut>, DnsChanges), String> {
    let key = match crate::support::registry::registration().await {
        flotilla::registry::Registration::Ready(r) => r.term_key(fleet),
        other => return Err(format!("the registry config: {other:?}")),
    };
    let terms = registry_history::terms_since(&key, from).await?;
    let events = registry_history::events_since(prefix, from).await?;
    let changes = registry_history::fleet_dns_changes(prefix, fleet, from, &events).await?;
    Ok((
        terms,
        registry_history::fleet_dns_puts(&events, fleet),
        changes,
    ))
}

/// The zone's records present at the start, and every change since.
type DnsChanges = (Vec<(String, check::ZoneRecord)>, Vec<check::DnsChange>);

/// Every approval the Manual object carries at the end. The annotation
/// keeps the newest `KEPT`: a full one may have dropped some, and cannot
/// vouch for the writes they opened.
async fn approvals(t: &Target) -> Result<Vec<check::ApprovalSeen>, String> {
    use flotilla::rollout::approval;
    let api = Api::<FleetMicroservice>::namespaced(t.home.clone(), &t.namespace);
    let name = workload::fleet_name(workload::MANUAL);
    let f = read_retrying(&format!("home {name}"), || async { api.get(&name).await }).await?;
    let read = approval::read(f.metadata.annotations.as_ref());
    if let Some(e) = read.unreadable {
        return Err(format!("{name}'s approvals: {e}"));
    }
    if read.given.len() >= approval::KEPT {
        return Err(format!(
            "{name} holds {} approvals, the most kept: older ones may be gone",
            read.given.len()
        ));
    }
    Ok(read
        .given
        .into_iter()
        .map(|a| check::ApprovalSeen {
            wave: a.wave,
            revision: a.revision,
            by: a.by,
            at: a.at.0,
        })
        .collect())
}

/// What the last look at the fleet found: convergence, what was left
/// behind, and what could not be read.
struct Settled {
    converged: Judged,
    left: Judged,
    unverifiable: Vec<String>,
}

impl Settled {
    fn holds(&self) -> bool {
        self.converged.violations.is_empty()
            && self.left.violations.is_empty()
            && self.unverifiable.is_empty()
    }
}

/// Polls until the fleet matches the workload's record (convergence, no
/// orphans, no stale DNS, everything read) or `limit` passes: the time it
/// took, and the last look.
async fn settle(t: &Target, rec: &Record, limit: Duration) -> (Duration, Settled) {
    let start = Instant::now();
    loop {
        let expected = expected(rec);
        let (observed, orphans, inspected, unverifiable) = observe(t, rec).await;
        let stale = stale_names(t, &expected).await;
        let names = expected
            .microservices
            .values()
            .filter(|i| i.is_none())
            .count();
        let settled = Settled {
            converged: check::converged(&expected, &observed),
            left: check::nothing_left(&orphans, &stale, inspected + names),
            unverifiable,
        };
        if settled.holds() || start.elapsed() > limit {
            return (start.elapsed(), settled);
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
}

/// A read retried up to three times, a second apart: an error after that
/// is unverifiable, never an empty answer.
async fn read_retrying<T, F, Fut>(what: &str, read: F) -> Result<T, String>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let mut last = String::new();
    for attempt in 0..3 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        match tokio::time::timeout(Duration::from_secs(10), read()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => last = "no answer within 10 s".into(),
        }
    }
    Err(format!("{what}: {last}"))
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
    let placed = rec.counts.lock().unwrap().last().map_or(1, |c| c.n);
    Expected {
        microservices: rec.plain.lock().unwrap().clone(),
        fleet,
        counted: BTreeMap::from([(
            workload::PLACED.to_string(),
            (placed, workload::PLACED_IMAGE.to_string()),
        )]),
    }
}

/// The fleet as the members and home hold it; the children no living
/// Microservice owns; how many children were inspected; and every read
/// that failed (after retries), as unverifiable.
async fn observe(t: &Target, rec: &Record) -> (Observed, Vec<String>, usize, Vec<String>) {
    let mut o = Observed {
        members: MEMBERS.iter().map(|m| m.to_string()).collect(),
        ..Default::default()
    };
    let (mut orphans, mut inspected, mut unverifiable) = (Vec::new(), 0, Vec::new());
    for m in MEMBERS {
        let c = t.members[m].clone();
        let api = Api::<Microservice>::namespaced(c.clone(), &t.namespace);
        let list = match read_retrying(&format!("{m} microservices"), || async {
            api.list(&ListParams::default()).await
        })
        .await
        {
            Ok(list) => list,
            Err(e) => {
                unverifiable.push(e);
                continue;
            }
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
        for found in [
            unowned::<Deployment>(&c, &t.namespace, &live, m, "deployments").await,
            unowned::<Service>(&c, &t.namespace, &live, m, "services").await,
        ] {
            match found {
                Ok((n, o)) => {
                    inspected += n;
                    orphans.extend(o);
                }
                Err(e) => unverifiable.push(e),
            }
        }
    }
    let api = Api::<FleetMicroservice>::namespaced(t.home.clone(), &t.namespace);
    match read_retrying("home fleetmicroservices", || async {
        api.list(&ListParams::default()).await
    })
    .await
    {
        Ok(list) => {
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
        Err(e) => unverifiable.push(e),
    }
    o.watch = rec.watch.lock().unwrap().clone();
    o.dashboard = rec.dashboard.lock().unwrap().clone();
    (o, orphans, inspected, unverifiable)
}

/// Of the children of kind `K` in `ns`: how many there are, and those no
/// living Microservice controls. A list that fails is an error.
async fn unowned<K>(
    c: &kube::Client,
    ns: &str,
    live: &BTreeSet<String>,
    member: &str,
    plural: &str,
) -> Result<(usize, Vec<String>), String>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api = Api::<K>::namespaced(c.clone(), ns);
    let list = read_retrying(&format!("{member} {plural}"), || async {
        api.list(&ListParams::default()).await
    })
    .await?;
    let orphans = list
        .iter()
        .filter(|o| {
            !o.meta().owner_references.as_ref().is_some_and(|r| {
                r.iter()
                    .any(|o| o.kind == "Microservice" && live.contains(&o.uid))
            })
        })
        .map(|o| format!("{member} {plural}/{}", o.name_any()))
        .collect();
    Ok((list.items.len(), orphans))
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
