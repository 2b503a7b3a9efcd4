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
async fn fleet(
    prefix: &str,
    windows: &[&str],
) -> (
    Replicas,
    String,
    BTreeMap<&'static str, String>,
    Vec<support::TestNamespace>,
) {
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
    for id in REPLICA_IDS {
        replicas.start(id);
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

fn answer(ips: &BTreeMap<&str, String>, members: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = members.iter().map(|m| ips[m].clone()).collect();
    v.sort();
    v
}

/// A series' value on the replica that leads the fleet's DNS Lease.
async fn on_dns_leader(replicas: &Replicas, ns: &str, series: &str) -> f64 {
    let home = client("home").await;
    let lease = format!("{}-dns", replicas.lease_name());
    let id = holder_in(&home, ns, &lease).await.expect("a DNS writer");
    let (_, body) = http_get(&format!("{}/metrics", replicas.metrics_url(&id)))
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
    drop(replicas);
}

/// A blip shorter than the withdraw window (a member stopped for about a
/// second, three times) never takes its address out of the answer.
#[tokio::test]
async fn a_blip_shorter_than_the_window_moves_nothing() {
    let _one = MEMBERS_UP.lock().await;
    let (replicas, ns, ips, _guards) = fleet(
        "dns-blip",
        &["--dns-withdraw-after", "20s", "--dns-restore-after", "2s"],
    )
    .await;
    let fleet_wide = format!("web.{ns}.{}", zone());
    let all = answer(&ips, &MEMBERS);
    resolves(&fleet_wide, "A", &all).await;
    let mut answers = 0;
    for _ in 0..3 {
        let down = StoppedMember::stop("member-2");
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
    drop(replicas);
}

/// With every member down, nothing is healthy: the answer keeps every
/// address rather than sending clients nowhere, and the DNS writer counts
/// them as listed fail-open.
#[tokio::test]
async fn with_every_member_down_the_answer_fails_open() {
    let _one = MEMBERS_UP.lock().await;
    let (replicas, ns, ips, _guards) = fleet(
        "dns-all",
        &["--dns-withdraw-after", "3s", "--dns-restore-after", "3s"],
    )
    .await;
    let fleet_wide = format!("web.{ns}.{}", zone());
    let all = answer(&ips, &MEMBERS);
    resolves(&fleet_wide, "A", &all).await;
    let downs: Vec<StoppedMember> = MEMBERS.iter().map(|m| StoppedMember::stop(m)).collect();
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
    drop(downs);
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
        },
        mod_revision: 0,
    };
    let old = registry.claim_term(&term, 3, "r1").await.expect("claim 3");
    // The old term planned this write; the successor claims the term first.
    let new = registry.claim_term(&term, 4, "r2").await.expect("claim 4");
    assert!(new > old);
    let late = [
        put(3, "10.96.0.3"),
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
        registry.claim_term(&term, 3, "r1").await,
        Err(RegistryError::Refused(Refusal::Deposed { epoch: 4, .. }))
    ));
    // The successor's write lands.
    registry
        .apply(&[
            put(4, "10.96.0.4"),
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
