//! Health-aware fleet DNS (#31) on the local fleet: three replicas, the
//! registry's real etcd and CoreDNS, and real DNS questions (dig). The
//! fleet-wide name `NAME.NS.ZONE` lists a cluster only while its
//! Microservice is Available there and the cluster answers.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use kube::api::PostParams;
use kube::{Api, Client};

use flotilla::crd::Microservice;
use flotilla::registry::Registration;
use support::registry::{dig, resolves, zone};
use support::replicas::{MEMBERS, REPLICA_IDS, Replicas, holder_in, member_clients, namespaces};
use support::{
    StoppedMember, client, ensure_crd, eventually, http_get, microservice, wait_condition,
};

const WAIT: Duration = Duration::from_secs(90);

/// The tests of this binary stop members; one at a time.
static MEMBERS_UP: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn service_ip(client: &Client, ns: &str, name: &str) -> String {
    let s = Api::<Service>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .expect("the Service");
    s.spec.and_then(|s| s.cluster_ip).expect("a ClusterIP")
}

/// Three replicas over the three members, the registry on, with the
/// windows given; `web` Available in every member. Returns the replicas,
/// the namespace, and each member's ClusterIP for `web`.
/// The replicas, the namespace, each member's ClusterIP for `web`, and
/// the namespaces' guards.
type Fleet = (
    Replicas,
    String,
    BTreeMap<&'static str, String>,
    Vec<support::TestNamespace>,
);

async fn fleet(prefix: &str, windows: &[&str]) -> Fleet {
    fleet_of(prefix, windows, &REPLICA_IDS).await
}

/// The same with the replicas named, started in that order.
async fn fleet_of(prefix: &str, windows: &[&str], ids: &[&str]) -> Fleet {
    fleet_with(prefix, windows, ids, |_, _| {}).await
}

/// The same, `prepare` changing the replicas' setup before each start.
/// The first replica takes the DNS Lease before the others start.
async fn fleet_with(
    prefix: &str,
    windows: &[&str],
    ids: &[&str],
    mut prepare: impl FnMut(&mut Replicas, &str),
) -> Fleet {
    let members = member_clients().await;
    for c in members.values() {
        ensure_crd(c).await;
    }
    let (ns, guards) = namespaces(&members, prefix).await;
    let mut replicas = Replicas::new(&ns, &MEMBERS);
    replicas.env.extend(support::registry::env());
    replicas.extra_args.extend(
        ["--registry-sweep-period", "1h"]
            .iter()
            .chain(windows)
            .map(|s| s.to_string()),
    );
    for (i, id) in ids.iter().enumerate() {
        prepare(&mut replicas, id);
        replicas.start(id);
        if i == 0 {
            let (r, ns) = (&replicas, &ns);
            eventually("the first replica writing DNS", WAIT, || async move {
                (dns_writer(r, ns).await.as_deref() == Some(*id)).then_some(())
            })
            .await;
        }
    }
    let mut ips = BTreeMap::new();
    for c in members.values() {
        let api = Api::<Microservice>::namespaced(c.clone(), &ns);
        api.create(
            &PostParams::default(),
            &microservice("web", "ghcr.io/acme/web:1", 8080, Some(1)),
        )
        .await
        .expect("create web");
    }
    for (name, c) in &members {
        let api = Api::<Microservice>::namespaced(c.clone(), &ns);
        wait_condition(&api, "web", "Available", "True", None).await;
        wait_condition(&api, "web", "Registered", "True", None).await;
        ips.insert(*name, service_ip(c, &ns, "web").await);
    }
    (replicas, ns, ips, guards)
}

/// Waits until each restarted member works again end to end (a new
/// Microservice becomes Available there): its controller-manager and kwok
/// reconnect with backoff after an apiserver restart, and the next test
/// binary must find the fleet whole.
async fn working_again(ns: &str, members: &[&str]) {
    let name = format!("after-{:08x}", rand::random::<u32>());
    for m in members {
        let api = Api::<Microservice>::namespaced(client(m).await, ns);
        api.create(
            &PostParams::default(),
            &microservice(&name, "ghcr.io/acme/web:1", 8080, Some(1)),
        )
        .await
        .expect("create a Microservice after the restart");
    }
    for m in members {
        let api = Api::<Microservice>::namespaced(client(m).await, ns);
        wait_condition(&api, &name, "Available", "True", None).await;
    }
}

/// Windows of 3 s, and a 10 s progress deadline so that a release that
/// never becomes ready fails soon.
const FAILING_FAST: &[&str] = &[
    "--dns-withdraw-after",
    "3s",
    "--dns-restore-after",
    "3s",
    "--progress-deadline",
    "10s",
];

/// A patch that gives `web` this image tag.
fn image(tag: &str) -> kube::api::Patch<serde_json::Value> {
    kube::api::Patch::Merge(
        serde_json::json!({"spec": {"image": format!("ghcr.io/acme/web:{tag}")}}),
    )
}

fn answer(ips: &BTreeMap<&str, String>, members: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = members.iter().map(|m| ips[m].clone()).collect();
    v.sort();
    v
}

/// The replica holding the fleet's DNS Lease.
async fn dns_writer(replicas: &Replicas, ns: &str) -> Option<String> {
    let home = client("home").await;
    holder_in(&home, ns, &format!("{}-dns", replicas.lease_name())).await
}

/// A series' value on the replica that leads the fleet's DNS Lease.
async fn on_dns_leader(replicas: &Replicas, ns: &str, series: &str) -> f64 {
    let id = dns_writer(replicas, ns).await.expect("a DNS writer");
    metric(replicas, &id, series).await
}

/// A series' value on replica `id` (0 when absent).
async fn metric(replicas: &Replicas, id: &str, series: &str) -> f64 {
    let (_, body) = http_get(&format!("{}/metrics", replicas.metrics_url(id)))
        .await
        .expect("metrics");
    body.lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// A member goes down: its address leaves the fleet-wide name once the
/// withdraw window passes, while the others and its own name's records
/// stay; it comes back once healthy for the restore window. A blip
/// shorter than the window moves nothing. With every member down, the
/// answer keeps every address (fail-open) and says so in metrics.
#[tokio::test]
async fn the_fleet_wide_name_follows_where_the_service_is_available() {
    let _one = MEMBERS_UP.lock().await;
    let (replicas, ns, ips, _guards) = fleet(
        "dns",
        &["--dns-withdraw-after", "4s", "--dns-restore-after", "4s"],
    )
    .await;
    let zone = zone();
    let fleet_wide = format!("web.{ns}.{zone}");
    let all = answer(&ips, &MEMBERS);
    resolves(&fleet_wide, "A", &all).await;

    // member-2 down: withdrawn; member-1's own name unaffected.
    let stopped = Instant::now();
    let down = StoppedMember::stop("member-2");
    let rest = answer(&ips, &["member-1", "member-3"]);
    eventually("member-2 withdrawn", WAIT, || {
        let got = dig(&fleet_wide, "A");
        let rest = rest.clone();
        async move { (got == rest).then_some(()) }
    })
    .await;
    println!(
        "figure: member-2 stopped to its address gone from {fleet_wide}: {:?} (withdraw window 4 s, TTL 10 s)",
        stopped.elapsed()
    );
    resolves(
        &format!("web.{ns}.member-2.cluster.{zone}"),
        "A",
        std::slice::from_ref(&ips["member-2"]),
    )
    .await;
    drop(down);
    let back = Instant::now();
    resolves(&fleet_wide, "A", &all).await;
    println!(
        "figure: member-2 back (apiserver ready) to its address listed again: {:?} (restore window 4 s)",
        back.elapsed()
    );
    working_again(&ns, &["member-2"]).await;
    drop(replicas);
}

/// A blip shorter than the withdraw window (a member stopped for about a
/// second, three times) never takes its address out of the answer.
#[tokio::test]
async fn a_blip_shorter_than_the_window_moves_nothing() {
    let _one = MEMBERS_UP.lock().await;
    // The window covers the whole series, about 20 s: a member whose
    // status feed has not relisted between two blips was never seen
    // healthy in between, so to the DNS writer the series is one outage
    // (a 20 s window failed the test twice in CI, at the last blip).
    let (replicas, ns, ips, _guards) = fleet(
        "dns-blip",
        &["--dns-withdraw-after", "45s", "--dns-restore-after", "2s"],
    )
    .await;
    let fleet_wide = format!("web.{ns}.{}", zone());
    let all = answer(&ips, &MEMBERS);
    resolves(&fleet_wide, "A", &all).await;
    let mut answers = 0;
    for _ in 0..3 {
        // kill -9: a blip of a known second. `stop`'s SIGTERM can keep
        // the apiserver half-down for 10 s, and three of those left the
        // member's controllers backing off past the test's wait.
        let down = StoppedMember::crash("member-2");
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(down);
        // Watch through the recovery: every answer lists member-2.
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            let got = dig(&fleet_wide, "A");
            if !got.is_empty() {
                assert_eq!(got, all, "a blip moved the answer");
                answers += 1;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    assert!(answers > 20, "only {answers} answers seen");
    let withdrawn =
        on_dns_leader(&replicas, &ns, "flotilla_dns_records{state=\"withdrawn\"}").await;
    assert_eq!(withdrawn, 0.0);
    working_again(&ns, &["member-2"]).await;
    drop(replicas);
}

/// With the service failed in every member (a release that never becomes
/// ready, past a 10 s progress deadline), nothing is healthy: the answer
/// keeps every address rather than sending clients nowhere, and the DNS
/// writer counts them as listed fail-open. (Failed rather than stopped
/// members: the test bed's controller-managers take minutes to recover
/// from every apiserver restarting at once.)
#[tokio::test]
async fn with_the_service_failed_everywhere_the_answer_fails_open() {
    let _one = MEMBERS_UP.lock().await;
    let (replicas, ns, ips, _guards) = fleet("dns-all", FAILING_FAST).await;
    let fleet_wide = format!("web.{ns}.{}", zone());
    let all = answer(&ips, &MEMBERS);
    resolves(&fleet_wide, "A", &all).await;
    for m in MEMBERS {
        Api::<Microservice>::namespaced(client(m).await, &ns)
            .patch(
                "web",
                &kube::api::PatchParams::default(),
                &image("never-ready"),
            )
            .await
            .expect("a release that never becomes ready");
    }
    eventually("every address listed fail-open", WAIT, || {
        let (replicas, ns) = (&replicas, &ns);
        async move {
            let failopen =
                on_dns_leader(replicas, ns, "flotilla_dns_records{state=\"failopen\"}").await;
            (failopen == 3.0).then_some(())
        }
    })
    .await;
    // Well past the window, still every address.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(dig(&fleet_wide, "A"), all);
    drop(replicas);
}

/// The etcd half of the DNS writer's fence, against the registry's real
/// etcd: once a newer term claims the fleet's term key, a write the older
/// term planned (and that passed its own leadership check) changes
/// nothing, and the older term cannot claim the key back.
#[tokio::test]
async fn a_deposed_dns_writers_write_changes_nothing_once_its_successor_claimed_the_term() {
    use flotilla::registry::records::{Op, Record, Refusal, Writer};
    use flotilla::registry::{Registration, RegistryError};
    let Registration::Ready(registry) = support::registry::registration().await else {
        panic!("the test bed's registry config is valid");
    };
    let fleet = format!("t{:08x}", rand::random::<u32>());
    let ns = format!("dns-fence-{:08x}", rand::random::<u32>());
    let term = registry.term_key(&fleet);
    let key = format!("{}/{ns}/web/member-1", registry.zone().prefix);
    let put = |epoch: i64, host: &str| Op::Put {
        key: key.clone(),
        record: Record {
            host: host.into(),
            port: 80,
            ttl: 10,
            object: format!("{ns}/web"),
            writer: Writer::fleet(&fleet, epoch),
            fail_open: false,
            uid: String::new(),
        },
        mod_revision: 0,
    };
    use flotilla::registry::store::Claim;
    let claim = |holder: &str, lease: &str, epoch: i64| Claim {
        holder: holder.into(),
        lease: lease.into(),
        lease_epoch: epoch,
    };
    let (old, old_term) = registry
        .claim_term(&term, &claim("r1", "lease-a", 3))
        .await
        .expect("claim 3");
    // The old term planned this write; the successor claims the term first.
    let (new, new_term) = registry
        .claim_term(&term, &claim("r2", "lease-a", 4))
        .await
        .expect("claim 4");
    assert!(new > old);
    assert!(new_term > old_term, "etcd numbers the terms");
    let late = [
        put(old_term, "10.96.0.3"),
        Op::Check {
            key: term.clone(),
            mod_revision: old,
        },
    ];
    assert!(matches!(
        registry.apply(&late).await,
        Err(RegistryError::Conflict)
    ));
    assert!(
        registry
            .read(std::slice::from_ref(&key))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(matches!(
        registry.claim_term(&term, &claim("r1", "lease-a", 3)).await,
        Err(RegistryError::Refused(Refusal::Deposed { epoch: 4, .. }))
    ));
    // Claiming its own term again is a no-op.
    assert_eq!(
        registry
            .claim_term(&term, &claim("r2", "lease-a", 4))
            .await
            .unwrap(),
        (new, new_term)
    );
    // The successor's write lands.
    registry
        .apply(&[
            put(new_term, "10.96.0.4"),
            Op::Check {
                key: term.clone(),
                mod_revision: new,
            },
        ])
        .await
        .expect("the successor writes");
    let found = registry.read(std::slice::from_ref(&key)).await.unwrap();
    assert_eq!(found[0].record.as_ref().unwrap().host, "10.96.0.4");
    let delete = [
        Op::Delete {
            key: key.clone(),
            mod_revision: found[0].mod_revision,
        },
        Op::Delete {
            key: term.clone(),
            mod_revision: new,
        },
    ];
    registry.apply(&delete).await.expect("cleaned up");
}

/// A release that never becomes ready on member-1 (the replicas' progress
/// deadline is 10 s): once the Microservice there fails, member-1 leaves
/// the fleet-wide answer; the fix brings it back.
#[tokio::test]
async fn a_failed_release_leaves_the_answer_and_its_fix_brings_it_back() {
    let _one = MEMBERS_UP.lock().await;
    let (replicas, ns, ips, _guards) = fleet("dns-bad", FAILING_FAST).await;
    let fleet_wide = format!("web.{ns}.{}", zone());
    resolves(&fleet_wide, "A", &answer(&ips, &MEMBERS)).await;
    let api = Api::<Microservice>::namespaced(client("member-1").await, &ns);
    let params = kube::api::PatchParams::default();
    api.patch("web", &params, &image("never-ready"))
        .await
        .expect("a release that never becomes ready");
    let rest = answer(&ips, &["member-2", "member-3"]);
    eventually("member-1 withdrawn", WAIT, || {
        let got = dig(&fleet_wide, "A");
        let rest = rest.clone();
        async move { (got == rest).then_some(()) }
    })
    .await;
    api.patch("web", &params, &image("2"))
        .await
        .expect("the fix");
    resolves(&fleet_wide, "A", &answer(&ips, &MEMBERS)).await;
    drop(replicas);
}

/// `flotilla dns NS/NAME -o json` against replica `id`.
async fn dns_json(replicas: &Replicas, id: &str, ns: &str, name: &str) -> serde_json::Value {
    let (code, out, err) = support::rollout::flotilla(
        &[
            "dns",
            &format!("{ns}/{name}"),
            "-o",
            "json",
            "--server",
            &replicas.grpc_url(id),
        ],
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(code, 0, "flotilla dns: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// A FleetMicroservice's `FleetDnsDegraded` status ("" when absent).
async fn degraded_condition(home: &Client, ns: &str, name: &str) -> String {
    let f = Api::<flotilla::rollout::spec::FleetMicroservice>::namespaced(home.clone(), ns)
        .get(name)
        .await
        .expect("the FleetMicroservice");
    f.status
        .and_then(|s| {
            s.conditions
                .into_iter()
                .find(|c| c.type_ == "FleetDnsDegraded")
        })
        .map(|c| c.status)
        .unwrap_or_default()
}

/// `spec.dns.strategy: Failover` with member-1 primary: only member-1
/// answers; with member-1 down, member-2 and member-3 do; with member-1
/// back, only member-1 again. `flotilla dns` on a replica that is not the
/// DNS writer says why each cluster is in or out. A release that fails
/// everywhere lists every cluster (fail-open), and the FleetMicroservice
/// says `FleetDnsDegraded=True` until the fix.
#[tokio::test]
async fn a_failover_name_answers_from_its_primary_and_the_others_only_without_it() {
    let _one = MEMBERS_UP.lock().await;
    let home = client("home").await;
    support::ensure_fleet_crd(&home).await;
    // The last replica (not the DNS writer: the first one is) serves the page.
    let ui_port = support::replicas::free_port();
    let viewer = REPLICA_IDS[REPLICA_IDS.len() - 1];
    let (replicas, ns, _, _guards) =
        fleet_with("dns-failover", FAILING_FAST, &REPLICA_IDS, |r, id| {
            if id == viewer {
                r.extra_args.extend(
                    [
                        "--ui-addr",
                        &format!("127.0.0.1:{ui_port}"),
                        "--ui-insecure",
                    ]
                    .map(String::from),
                );
            }
        })
        .await;
    let fms: flotilla::rollout::spec::FleetMicroservice = support::from_json(serde_json::json!({
        "apiVersion": "platform.example.io/v1alpha1",
        "kind": "FleetMicroservice",
        "metadata": {"name": "api"},
        "spec": {
            "template": {"image": "ghcr.io/acme/api:1", "port": 8080, "replicas": 1},
            "rollout": {"onFailure": "Pause"},
            "dns": {
                "strategy": "Failover",
                "primary": {"clusterSelector": {"matchLabels": {
                    "platform.example.io/cluster-name": "member-1"
                }}}
            }
        }
    }));
    let fleet_api =
        Api::<flotilla::rollout::spec::FleetMicroservice>::namespaced(home.clone(), &ns);
    fleet_api
        .create(&PostParams::default(), &fms)
        .await
        .expect("create the FleetMicroservice");
    let mut ips = BTreeMap::new();
    for m in MEMBERS {
        let c = client(m).await;
        let api = Api::<Microservice>::namespaced(c.clone(), &ns);
        eventually(&format!("api in {m}"), WAIT, || {
            let api = api.clone();
            async move { api.get_opt("api").await.ok()?.map(|_| ()) }
        })
        .await;
        wait_condition(&api, "api", "Available", "True", None).await;
        wait_condition(&api, "api", "Registered", "True", None).await;
        ips.insert(m, service_ip(&c, &ns, "api").await);
    }
    let zone = zone();
    let name = format!("api.{ns}.{zone}");
    resolves(&name, "A", &answer(&ips, &["member-1"])).await;

    // Asked of a replica that does not write DNS.
    let writer = dns_writer(&replicas, &ns).await.expect("a DNS writer");
    let other = REPLICA_IDS.iter().find(|r| **r != writer).unwrap();
    let j = dns_json(&replicas, other, &ns, "api").await;
    assert_eq!(j["strategy"], "Failover", "{j}");
    assert_eq!(j["degraded"], false, "{j}");
    let row = |j: &serde_json::Value, c: &str| {
        j["clusters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["cluster"] == c)
            .cloned()
            .unwrap_or_else(|| panic!("{c} in {j}"))
    };
    assert_eq!(row(&j, "member-1")["listed"], true, "{j}");
    assert_eq!(row(&j, "member-1")["primary"], true, "{j}");
    let standby = row(&j, "member-2");
    assert_eq!(standby["listed"], false, "{j}");
    assert!(
        standby["reason"].as_str().unwrap().starts_with("standby"),
        "{j}"
    );

    // The dashboard's detail view shows the same, from the page itself.
    let browser = support::browser::Browser::start("dns-failover", None).await;
    browser
        .open(&format!("http://127.0.0.1:{ui_port}/?detail={ns}/api"))
        .await;
    let shown = browser
        .until(
            "the DNS table in the detail view",
            WAIT,
            "const s = document.getElementById('detail-dns-summary'); const r = document.querySelector('#detail-dns tr[data-cluster=\"member-2\"]'); return s && r ? s.textContent + ' | ' + r.innerText : null;",
        )
        .await;
    let shown = shown.as_str().unwrap_or_default().to_string();
    assert!(shown.contains("lists member-1 (Failover)"), "{shown}");
    assert!(shown.contains("standby"), "{shown}");
    drop(browser);

    // The primary down: the others answer; back: the primary alone.
    let down = StoppedMember::stop("member-1");
    let others = answer(&ips, &["member-2", "member-3"]);
    eventually("member-2 and member-3 answer", WAIT, || {
        let got = dig(&name, "A");
        let others = others.clone();
        async move { (got == others).then_some(()) }
    })
    .await;
    drop(down);
    resolves(&name, "A", &answer(&ips, &["member-1"])).await;
    working_again(&ns, &["member-1"]).await;
    assert_eq!(degraded_condition(&home, &ns, "api").await, "");

    // A release that fails everywhere: every address, and the condition.
    let image = |tag: &str| {
        kube::api::Patch::Merge(
            serde_json::json!({"spec": {"template": {"image": format!("ghcr.io/acme/api:{tag}")}}}),
        )
    };
    let params = kube::api::PatchParams::default();
    fleet_api
        .patch("api", &params, &image("never-ready"))
        .await
        .expect("a release that never becomes ready");
    let all = answer(&ips, &MEMBERS);
    eventually("every address listed, and FleetDnsDegraded", WAIT, || {
        let (home, ns, all, name) = (&home, &ns, &all, &name);
        async move {
            (dig(name, "A") == *all && degraded_condition(home, ns, "api").await == "True")
                .then_some(())
        }
    })
    .await;
    let j = dns_json(&replicas, other, &ns, "api").await;
    assert_eq!(j["degraded"], true, "{j}");
    assert!(
        row(&j, "member-2")["reason"]
            .as_str()
            .unwrap()
            .contains("fail-open"),
        "{j}"
    );
    fleet_api
        .patch("api", &params, &image("2"))
        .await
        .expect("the fix");
    eventually("the primary alone, and not degraded", WAIT, || {
        let (home, ns, name) = (&home, &ns, &name);
        let want = answer(&ips, &["member-1"]);
        async move {
            (dig(name, "A") == want && degraded_condition(home, ns, "api").await == "False")
                .then_some(())
        }
    })
    .await;
    // Both marks are the DNS writer's, under its own Lease, and say so: the
    // apiserver's records tell them from the rollout controller's writes.
    let marked = support::audit_events("home")
        .into_iter()
        .filter(|e| {
            e["objectRef"]["resource"] == "fleetmicroservices"
                && e["objectRef"]["namespace"] == ns.as_str()
        })
        .filter(|e| {
            e["requestURI"]
                .as_str()
                .is_some_and(|u| u.contains("fieldManager=flotilla-dns"))
        })
        .count();
    assert!(
        marked >= 2,
        "FleetDnsDegraded True then False, marked fieldManager=flotilla-dns: {marked}"
    );
    drop(replicas);
}

/// kill -9 of the DNS writer: another replica takes the DNS Lease and
/// keeps the names. A new Microservice, Available in every member after
/// the kill, is listed fleet-wide in all three, and a release that leaves
/// member-3 unavailable withdraws it: both are the successor's writes.
#[tokio::test]
async fn a_killed_dns_writers_successor_keeps_the_names() {
    let _one = MEMBERS_UP.lock().await;
    let (mut replicas, ns, _, _guards) = fleet("dns-kill", FAILING_FAST).await;
    let writer = dns_writer(&replicas, &ns).await.expect("a DNS writer");
    replicas.kill_9(&writer);
    let (r, n, w) = (&replicas, &ns, &writer);
    let successor = eventually("a successor holds the DNS Lease", WAIT, || async move {
        dns_writer(r, n).await.filter(|h| h != w)
    })
    .await;
    let members = support::replicas::member_clients().await;
    for c in members.values() {
        Api::<Microservice>::namespaced(c.clone(), &ns)
            .create(
                &PostParams::default(),
                &microservice("fresh", "ghcr.io/acme/web:1", 8080, Some(1)),
            )
            .await
            .expect("create fresh");
    }
    let mut ips = BTreeMap::new();
    for (m, c) in &members {
        let api = Api::<Microservice>::namespaced(c.clone(), &ns);
        wait_condition(&api, "fresh", "Available", "True", None).await;
        wait_condition(&api, "fresh", "Registered", "True", None).await;
        ips.insert(*m, service_ip(c, &ns, "fresh").await);
    }
    let name = format!("fresh.{ns}.{}", zone());
    resolves(&name, "A", &answer(&ips, &MEMBERS)).await;
    Api::<Microservice>::namespaced(members["member-3"].clone(), &ns)
        .patch(
            "fresh",
            &kube::api::PatchParams::default(),
            &image("never-ready"),
        )
        .await
        .expect("a release that never becomes ready");
    let rest = answer(&ips, &["member-1", "member-2"]);
    eventually("member-3 withdrawn by the successor", WAIT, || {
        let got = dig(&name, "A");
        let rest = rest.clone();
        async move { (got == rest).then_some(()) }
    })
    .await;
    assert_eq!(dns_writer(&replicas, &ns).await, Some(successor));
    drop(replicas);
}

/// The etcd fence on live replicas. The DNS writer rA reaches etcd
/// through a proxy that holds its next write: member-3 goes down, rA's
/// withdrawal of it is held, and rA is stopped (SIGSTOP) after its term
/// check passed. rB (which keeps unreachable clusters, so it leaves
/// member-3's record untouched) takes the Lease and claims the term by
/// listing a new Microservice. rA's held write then reaches etcd: only the
/// term key's revision stands between it and member-3's record, and it
/// changes nothing.
#[tokio::test]
async fn a_stopped_dns_writers_held_write_is_refused_once_its_successor_claimed_the_term() {
    use support::gate::Gate;
    let _one = MEMBERS_UP.lock().await;
    let etcd = support::registry::env()["FLOTILLA_REGISTRY_ETCD_ENDPOINTS"].clone();
    let gate = Gate::start(etcd.trim_start_matches("http://").to_string()).await;
    let endpoint = |r: &mut Replicas, e: String| {
        r.env
            .retain(|(k, _)| k != "FLOTILLA_REGISTRY_ETCD_ENDPOINTS");
        r.env.push(("FLOTILLA_REGISTRY_ETCD_ENDPOINTS".into(), e));
    };
    let (replicas, ns, ips, _guards) = fleet_with(
        "dns-stop",
        &["--dns-withdraw-after", "2s", "--dns-restore-after", "2s"],
        &["ra", "rb"],
        |r, id| {
            if id == "ra" {
                endpoint(r, format!("http://127.0.0.1:{}", gate.port));
            } else {
                endpoint(r, etcd.clone());
                r.env
                    .push(("FLOTILLA_DNS_UNREACHABLE".into(), "keep".into()));
            }
        },
    )
    .await;
    let zone = zone();
    let fleet_wide = format!("web.{ns}.{zone}");
    let all = answer(&ips, &MEMBERS);
    resolves(&fleet_wide, "A", &all).await;

    gate.hold_next_write();
    let down = StoppedMember::stop("member-3");
    eventually(
        "ra's withdrawal of member-3 held at the proxy",
        WAIT,
        || {
            let holding = gate.holding();
            async move { holding.then_some(()) }
        },
    )
    .await;
    replicas.signal("ra", "STOP");
    let stopped = Continued(&replicas, "ra".into());
    eventually("rb holds the DNS Lease", WAIT, || {
        let (replicas, ns) = (&replicas, &ns);
        async move { (dns_writer(replicas, ns).await.as_deref() == Some("rb")).then_some(()) }
    })
    .await;
    // rb claims the term with its first write: a new name in member-1.
    let api1 = Api::<Microservice>::namespaced(client("member-1").await, &ns);
    api1.create(
        &PostParams::default(),
        &microservice("api", "ghcr.io/acme/api:1", 8080, Some(1)),
    )
    .await
    .expect("create api");
    wait_condition(&api1, "api", "Available", "True", None).await;
    let api_ip = service_ip(&client("member-1").await, &ns, "api").await;
    resolves(&format!("api.{ns}.{zone}"), "A", &[api_ip]).await;

    let Registration::Ready(registry) = support::registry::registration().await else {
        panic!("the test bed's registry config is valid");
    };
    let key = format!("{}/{ns}/web/member-3", registry.zone().prefix);
    let before = registry.read(std::slice::from_ref(&key)).await.unwrap();
    assert_eq!(
        before.len(),
        1,
        "rb kept member-3 (it keeps unreachable clusters)"
    );
    // ra's write, planned and checked inside its term, reaches etcd now.
    let held = gate.waiting();
    gate.release();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = registry.read(std::slice::from_ref(&key)).await.unwrap();
    assert_eq!(
        after, before,
        "ra's held write ({held} bytes) changed member-3's place"
    );
    assert_eq!(dig(&fleet_wide, "A"), all);
    drop(stopped);
    println!(
        "figure: ra's held write ({held} bytes) refused by the term key; ra's etcd conflicts: {}",
        metric(
            &replicas,
            "ra",
            "flotilla_dns_writes_total{result=\"conflict\"}"
        )
        .await,
    );
    drop(down);
    working_again(&ns, &["member-3"]).await;
    drop(replicas);
}

/// Continues a stopped replica when dropped, whatever the test's outcome.
struct Continued<'a>(&'a Replicas, String);

impl Drop for Continued<'_> {
    fn drop(&mut self) {
        self.0.signal(&self.1, "CONT");
    }
}

/// Workload failover and the fleet-wide name (#32): a FleetMicroservice on
/// two of the three members answers from those two; when one is stopped
/// and replaced, the name answers from the other and the replacement, and
/// the stopped member, once back and cleaned up, stays out.
#[tokio::test]
async fn a_failover_moves_the_fleet_wide_name_with_the_placement() {
    use flotilla::rollout::spec::{FleetMicroservice, Role, RolloutPhase};
    let _one = MEMBERS_UP.lock().await;
    let home = client("home").await;
    support::ensure_fleet_crd(&home).await;
    let windows = ["--dns-withdraw-after", "3s", "--dns-restore-after", "3s"];
    let (_replicas, ns, _, _guards) = fleet("dns-placed", &windows).await;
    let fms: FleetMicroservice = support::from_json(serde_json::json!({
        "apiVersion": "platform.example.io/v1alpha1",
        "kind": "FleetMicroservice",
        "metadata": {"name": "api"},
        "spec": {
            "template": {"image": "ghcr.io/acme/api:1", "port": 8080, "replicas": 1},
            "placement": {"numberOfClusters": 2, "failover": {"unreachableAfter": "10s"}},
        }
    }));
    let fleet_api = Api::<FleetMicroservice>::namespaced(home.clone(), &ns);
    fleet_api
        .create(&PostParams::default(), &fms)
        .await
        .expect("create the FleetMicroservice");
    let chosen = |f: &FleetMicroservice| -> Vec<String> {
        let p = f.status.as_ref().and_then(|s| s.placement.clone());
        let mut v: Vec<String> = p
            .into_iter()
            .flat_map(|p| p.clusters)
            .filter(|c| c.role == Role::Chosen)
            .map(|c| c.name)
            .collect();
        v.sort();
        v
    };
    let on = eventually("api Complete on two", WAIT, || {
        let fleet_api = fleet_api.clone();
        async move {
            let f = fleet_api.get("api").await.ok()?;
            let st = f.status.as_ref()?;
            (st.phase == Some(RolloutPhase::Complete) && chosen(&f).len() == 2).then(|| chosen(&f))
        }
    })
    .await;
    let ip_of = |m: &'static str| {
        let ns = ns.clone();
        async move {
            let c = client(m).await;
            let api = Api::<Microservice>::namespaced(c.clone(), &ns);
            wait_condition(&api, "api", "Available", "True", None).await;
            wait_condition(&api, "api", "Registered", "True", None).await;
            service_ip(&c, &ns, "api").await
        }
    };
    let member = |n: &str| *MEMBERS.iter().find(|m| **m == n).unwrap();
    let (victim, kept) = (member(&on[0]), member(&on[1]));
    let spare = *MEMBERS
        .iter()
        .find(|m| ![victim, kept].contains(m))
        .unwrap();
    let mut ips = BTreeMap::new();
    ips.insert(victim, ip_of(victim).await);
    ips.insert(kept, ip_of(kept).await);
    let name = format!("api.{ns}.{}", zone());
    resolves(&name, "A", &answer(&ips, &[victim, kept])).await;

    let down = StoppedMember::stop(victim);
    ips.insert(spare, ip_of(spare).await);
    let now = answer(&ips, &[kept, spare]);
    eventually("the name follows the placement", WAIT, || {
        let got = dig(&name, "A");
        let now = now.clone();
        async move { (got == now).then_some(()) }
    })
    .await;
    drop(down);
    let gone = Api::<Microservice>::namespaced(client(victim).await, &ns);
    eventually(&format!("{victim}'s api removed"), WAIT, || {
        let gone = gone.clone();
        async move { gone.get_opt("api").await.ok()?.is_none().then_some(()) }
    })
    .await;
    working_again(&ns, &[victim]).await;
    assert_eq!(dig(&name, "A"), now, "the replaced member stays out");
}

/// #59: the DNS writer's fence survives its Lease. After two handovers
/// (the Lease's leaseTransitions grow), the Lease is deleted and every
/// replica restarted, etcd kept: the recreated Lease counts from 1 again,
/// below the term etcd holds. The new writer still writes: member-2's
/// apiserver stops, and its address leaves the fleet-wide name within the
/// withdraw window (3 s) plus 5 s, after it is seen unreachable.
#[tokio::test]
async fn the_dns_writer_writes_on_after_its_lease_is_deleted_and_every_replica_restarts() {
    let _one = MEMBERS_UP.lock().await;
    let (mut replicas, ns, ips, _guards) = fleet("dns-relic", FAILING_FAST).await;
    let fleet_wide = format!("web.{ns}.{}", zone());
    resolves(&fleet_wide, "A", &answer(&ips, &MEMBERS)).await;
    for handover in 0..2 {
        let writer = dns_writer(&replicas, &ns).await.expect("a DNS writer");
        replicas.kill_9(&writer);
        let (r, n, w) = (&replicas, &ns, &writer);
        eventually(&format!("handover {handover}"), WAIT, || async move {
            dns_writer(r, n).await.filter(|h| h != w)
        })
        .await;
        replicas.start(&writer);
    }
    for id in REPLICA_IDS {
        replicas.kill_9(id);
    }
    let home = client("home").await;
    let lease = format!("{}-dns", replicas.lease_name());
    Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(home.clone(), &ns)
        .delete(&lease, &Default::default())
        .await
        .expect("delete the DNS Lease");
    for id in REPLICA_IDS {
        replicas.start(id);
    }
    let (r, n) = (&replicas, &ns);
    eventually("a writer on the recreated Lease", WAIT, || async move {
        dns_writer(r, n).await
    })
    .await;
    // The new term is claimed (the writer lists what it reads).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let stopped = Instant::now();
    let down = StoppedMember::stop("member-2");
    let rest = answer(&ips, &["member-1", "member-3"]);
    eventually(
        "member-2 withdrawn after the Lease was recreated",
        WAIT,
        || {
            let got = dig(&fleet_wide, "A");
            let rest = rest.clone();
            async move { (got == rest).then_some(()) }
        },
    )
    .await;
    let took = stopped.elapsed();
    println!("figure: member-2 stopped to withdrawn, on a recreated DNS Lease: {took:?}");
    // Unreachable is seen within the client's timeouts; then the 3 s
    // window, then at most 5 s.
    assert!(took < Duration::from_secs(25), "{took:?}");
    drop(down);
    resolves(&fleet_wide, "A", &answer(&ips, &MEMBERS)).await;
    working_again(&ns, &["member-2"]).await;
    drop(replicas);
}

/// #59: a member's registry records survive its Lease. After two
/// handovers of member-1's Lease, its leader rewrites `web`'s records at a
/// later term (a new port); then the Lease is deleted and every replica
/// restarted, etcd kept, and the recreated Lease counts from 1 again. The
/// new leader still keeps member-1's records: `web` deleted there, its
/// own name goes.
#[tokio::test]
async fn a_members_records_follow_it_after_its_lease_is_deleted_and_every_replica_restarts() {
    use support::replicas::{LEASE_NAMESPACE, holder};
    let _one = MEMBERS_UP.lock().await;
    let (mut replicas, ns, ips, _guards) = fleet("reg-relic", FAILING_FAST).await;
    let members = member_clients().await;
    let m1 = members["member-1"].clone();
    let lease = replicas.lease_name();
    let own = format!("web.{ns}.member-1.cluster.{}", zone());
    resolves(&own, "A", std::slice::from_ref(&ips["member-1"])).await;
    for handover in 0..2 {
        let leader = holder(&m1, &lease).await.expect("member-1's leader");
        replicas.kill_9(&leader);
        let (c, l, was) = (&m1, &lease, &leader);
        eventually(
            &format!("member-1 handover {handover}"),
            WAIT,
            || async move { holder(c, l).await.filter(|h| h != was) },
        )
        .await;
        replicas.start(&leader);
    }
    // A later term writes the records again: the Service's port moves.
    let web = Api::<Microservice>::namespaced(m1.clone(), &ns);
    web.patch(
        "web",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({"spec": {"port": 8081}})),
    )
    .await
    .expect("a new port");
    eventually("member-1's record at the new port", WAIT, || async {
        let got = dig(&own, "SRV");
        got.iter().any(|l| l.contains(" 8081 ")).then_some(())
    })
    .await;
    for id in REPLICA_IDS {
        replicas.kill_9(id);
    }
    Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(m1.clone(), LEASE_NAMESPACE)
        .delete(&lease, &Default::default())
        .await
        .expect("delete member-1's Lease");
    for id in REPLICA_IDS {
        replicas.start(id);
    }
    let (c, l) = (&m1, &lease);
    eventually(
        "a leader on member-1's recreated Lease",
        WAIT,
        || async move { holder(c, l).await },
    )
    .await;
    web.delete("web", &Default::default())
        .await
        .expect("delete web in member-1");
    eventually("member-1's own name gone", WAIT, || async {
        dig(&own, "A").is_empty().then_some(())
    })
    .await;
    drop(replicas);
}

/// #62 (found by chaos): a new DNS writer that has not listed a member
/// does not know that member's Microservices, which is not the same as
/// their being gone. `solo` lives only in member-3 and is listed; member-3
/// stops, and the writer's successor starts while it is down, so its
/// caches never list it. The successor writes (a new name resolves), and
/// `solo`'s answer stays: withdrawn only where its absence is known.
#[tokio::test]
async fn a_new_dns_writer_keeps_the_names_of_a_member_it_has_not_listed() {
    let _one = MEMBERS_UP.lock().await;
    let (mut replicas, ns, _, _guards) =
        fleet_of("dns-blind", FAILING_FAST, &REPLICA_IDS[..1]).await;
    let members = member_clients().await;
    let create = |m: &'static str, name: &'static str| {
        let (c, ns) = (members[m].clone(), ns.clone());
        async move {
            let api = Api::<Microservice>::namespaced(c.clone(), &ns);
            api.create(
                &PostParams::default(),
                &microservice(name, "ghcr.io/acme/web:1", 8080, Some(1)),
            )
            .await
            .expect("create");
            wait_condition(&api, name, "Available", "True", None).await;
            wait_condition(&api, name, "Registered", "True", None).await;
            service_ip(&c, &ns, name).await
        }
    };
    let solo = format!("solo.{ns}.{}", zone());
    let solo_ip = vec![create("member-3", "solo").await];
    resolves(&solo, "A", &solo_ip).await;

    let down = StoppedMember::stop("member-3");
    let first = REPLICA_IDS[0];
    replicas.start(REPLICA_IDS[1]);
    replicas.kill_9(first);
    let (r, n) = (&replicas, &ns);
    eventually("the successor holds the DNS Lease", WAIT, || async move {
        dns_writer(r, n).await.filter(|h| h != first)
    })
    .await;
    // The successor's passes run: a new name in member-1 is listed.
    let fresh_ip = vec![create("member-1", "fresh").await];
    resolves(&format!("fresh.{ns}.{}", zone()), "A", &fresh_ip).await;
    resolves(&solo, "A", &solo_ip).await;

    drop(down);
    working_again(&ns, &["member-3"]).await;
    resolves(&solo, "A", &solo_ip).await;
    drop(replicas);
}
