//! The fleet service registry (#15) against the test bed's own etcd and
//! CoreDNS (`integration/fleet registry up`), asked real DNS questions.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use tokio::time::Instant;

use flotilla::api::client::{ClientOptions, connect};
use flotilla::api::pb;
use flotilla::crd::Microservice;
use flotilla::domain::conditions::find;
use flotilla::reconciler::Hooks;
use flotilla::registry::records::{Entry, Existing, Writer, plan_register, plan_remove};
use flotilla::registry::{FINALIZER, Registration, Registry, RegistryConfig, RegistryError};
use support::registry::{StoppedEtcd, dig, rcode, registration, resolves, zone};
use support::{
    Operator, TestNamespace, client, ensure_crd, eventually, microservice, settings, wait_condition,
};

const WAIT: Duration = Duration::from_secs(90);

/// The tests of this binary run at once; the one that stops the registry's
/// etcd holds this exclusively, those that need it up hold it shared.
static ETCD_UP: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

fn cluster_ip(s: &Service) -> String {
    s.spec
        .as_ref()
        .and_then(|s| s.cluster_ip.clone())
        .expect("a ClusterIP")
}

async fn service_ip(client: &Client, ns: &str, name: &str) -> String {
    let api = Api::<Service>::namespaced(client.clone(), ns);
    let service = eventually("the Service", WAIT, || {
        let api = api.clone();
        async move { api.get_opt(name).await.ok().flatten() }
    })
    .await;
    cluster_ip(&service)
}

/// An in-process controller with registration on. Its sweep waits an hour
/// unless a test asks otherwise: a sweep would hide what the deletion path
/// itself does.
async fn operator(
    client: &Client,
    cluster: &str,
    ns: &str,
    registration: Registration,
) -> Operator {
    swept_operator(client, cluster, ns, registration, Duration::from_secs(3600))
}

fn swept_operator(
    client: &Client,
    cluster: &str,
    ns: &str,
    registration: Registration,
    sweep: Duration,
) -> Operator {
    let mut s = settings(cluster, ns);
    s.registry = Some(registration);
    s.registry_sweep = sweep;
    Operator::start(client, s, Hooks::default())
}

/// Waits for `CleanupBlocked=True` about the object's current generation
/// (a deletion bumps it). The status's own `observedGeneration` stays with
/// the last spec concluded: the deletion is no spec to apply.
async fn cleanup_blocked(api: &Api<Microservice>, name: &str) -> Microservice {
    eventually(&format!("{name}: CleanupBlocked=True"), WAIT, || {
        let api = api.clone();
        async move {
            let ms = api.get(name).await.ok()?;
            let c = find(&ms.status.as_ref()?.conditions, "CleanupBlocked")?;
            (c.status == "True" && c.observed_generation == ms.metadata.generation)
                .then_some(ms.clone())
        }
    })
    .await
}

async fn warning_reasons(client: &Client, ns: &str, name: &str) -> Vec<String> {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter_map(|e| e.reason)
        .collect()
}

/// `name` once `Registered` is False at its generation, and that condition.
async fn not_registered(
    api: &Api<Microservice>,
    name: &str,
) -> (
    Microservice,
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition,
) {
    let got = wait_condition(api, name, "Registered", "False", None).await;
    let c = find(&got.status.as_ref().unwrap().conditions, "Registered")
        .unwrap()
        .clone();
    (got, c)
}

/// Deletes `name` and waits until it is gone (the operator releases it).
async fn delete_and_wait(api: &Api<Microservice>, name: &str) {
    api.delete(name, &DeleteParams::default()).await.ok();
    eventually(&format!("{name} gone"), WAIT, || {
        let api = api.clone();
        async move { api.get_opt(name).await.ok()?.is_none().then_some(()) }
    })
    .await;
}

/// Tests 1-3 of #15: names resolve per cluster and fleet-wide, with the
/// port over SRV; a deletion while etcd is stopped keeps the object, its
/// finalizer and `CleanupBlocked=True/ExternalUnavailable`, with a Warning;
/// once etcd is back, the record leaves DNS before the object leaves the
/// apiserver, and the other cluster's record stays.
#[tokio::test]
async fn names_resolve_and_a_blocked_deletion_cleans_up_in_order_once_etcd_returns() {
    let etcd_up = ETCD_UP.read().await;
    let (c1, c2) = (client("member-1").await, client("member-2").await);
    ensure_crd(&c1).await;
    ensure_crd(&c2).await;
    let ns_name = format!("reg-{:08x}", rand::random::<u32>());
    let ns1 = TestNamespace::create_named(&c1, "member-1", &ns_name).await;
    let ns2 = TestNamespace::create_named(&c2, "member-2", &ns_name).await;
    let op1 = operator(&c1, "member-1", &ns_name, registration().await).await;
    let _op2 = operator(&c2, "member-2", &ns_name, registration().await).await;
    let (api1, api2) = (ns1.api::<Microservice>(), ns2.api::<Microservice>());
    let ms = microservice("todo-api", "ghcr.io/acme/todo:1", 8080, Some(1));
    api1.create(&PostParams::default(), &ms)
        .await
        .expect("create in member-1");
    api2.create(&PostParams::default(), &ms)
        .await
        .expect("create in member-2");
    for api in [&api1, &api2] {
        wait_condition(api, "todo-api", "Registered", "True", None).await;
    }
    let got = api1.get("todo-api").await.unwrap();
    assert!(
        got.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER)
    );
    let (ip1, ip2) = (
        service_ip(&c1, &ns_name, "todo-api").await,
        service_ip(&c2, &ns_name, "todo-api").await,
    );
    let zone = zone();
    let own = |cluster: &str| format!("todo-api.{ns_name}.{cluster}.cluster.{zone}");
    let shared = format!("todo-api.{ns_name}.{zone}");
    resolves(&own("member-1"), "A", std::slice::from_ref(&ip1)).await;
    resolves(&own("member-2"), "A", std::slice::from_ref(&ip2)).await;
    // The fleet-wide name lists both clusters.
    let mut both = vec![ip1.clone(), ip2.clone()];
    both.sort();
    resolves(&shared, "A", &both).await;
    // #30 M4: a cluster's own names live under `cluster.ZONE`, apart from
    // the fleet-wide tree. Before, member-1's record sat at
    // <zone>/member-1/NS/todo-api, so NS.member-1.ZONE (the fleet-wide name
    // of a Microservice NS in a namespace called member-1, another
    // tenant's) answered it too.
    let hijack = format!("{ns_name}.member-1.{zone}");
    let answered = dig(&hijack, "A");
    assert!(
        answered.is_empty(),
        "{hijack} answered {answered:?}: one tenant's record under another's fleet-wide name"
    );
    let srv = dig(&own("member-1"), "SRV");
    assert_eq!(srv.len(), 1, "{srv:?}");
    assert_eq!(
        srv[0].split_whitespace().nth(2),
        Some("8080"),
        "SRV gives the port: {srv:?}"
    );

    // Delete in member-1 with the registry's etcd stopped.
    drop(etcd_up);
    let _exclusive = ETCD_UP.write().await;
    let mut stopped = StoppedEtcd::stop();
    api1.delete("todo-api", &DeleteParams::default())
        .await
        .expect("delete");
    let blocked = cleanup_blocked(&api1, "todo-api").await;
    assert!(blocked.metadata.deletion_timestamp.is_some());
    assert!(
        blocked
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER)
    );
    let condition = find(
        &blocked.status.as_ref().unwrap().conditions,
        "CleanupBlocked",
    )
    .unwrap()
    .clone();
    assert_eq!(condition.reason, "ExternalUnavailable");
    assert!(
        !condition.message.contains("://"),
        "no endpoint or credential: {}",
        condition.message
    );
    eventually("a CleanupBlocked Warning", WAIT, || {
        let c1 = c1.clone();
        let ns = ns_name.clone();
        async move {
            warning_reasons(&c1, &ns, "todo-api")
                .await
                .iter()
                .any(|r| r == "CleanupBlocked")
                .then_some(())
        }
    })
    .await;
    // Still blocked a few retries later: nothing gives up on its own.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(api1.get_opt("todo-api").await.unwrap().is_some());

    // etcd returns: the record leaves etcd and DNS before the object leaves
    // the API. Each poll notes whether the record is still seen (in etcd,
    // or answered by CoreDNS) and whether the object is gone; a record seen
    // after the object was gone fails. CoreDNS answers SERVFAIL while it
    // reconnects, which says nothing either way.
    stopped.start();
    let Registration::Ready(registry) = registration().await else {
        panic!("the test bed's registry config is valid");
    };
    let keys = Entry {
        cluster: "member-1".into(),
        namespace: ns_name.clone(),
        name: "todo-api".into(),
    }
    .keys(registry.zone())
    .unwrap();
    let start = Instant::now();
    let (mut last_seen, mut object_gone, mut nxdomain) = (None, None, false);
    // What saw the record last (#67: a failure must say whether etcd held
    // it, and whose write it was, or only CoreDNS answered).
    let mut seen_by = String::new();
    while object_gone.is_none() || !nxdomain {
        // CoreDNS may take a while to reconnect (gRPC's backoff).
        assert!(start.elapsed() < 2 * WAIT, "cleanup did not complete");
        let found = registry.read(&keys).await.unwrap_or_default();
        let dns = rcode(&own("member-1"), "A");
        if !found.is_empty() || dns == "NOERROR" {
            last_seen = Some(start.elapsed());
            seen_by = format!(
                "etcd: {:?}; CoreDNS: {dns}",
                found
                    .iter()
                    .map(|e| (&e.key, e.mod_revision, e.record.as_ref().map(|r| &r.writer)))
                    .collect::<Vec<_>>()
            );
        }
        nxdomain |= dns == "NXDOMAIN";
        if object_gone.is_none() && api1.get_opt("todo-api").await.unwrap().is_none() {
            object_gone = Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let object_gone = object_gone.unwrap();
    eprintln!(
        "cleanup after etcd returned: record last seen at {last_seen:?}, object gone at {object_gone:?}"
    );
    assert!(
        last_seen.is_none_or(|t| t < object_gone),
        "the record outlived the object: seen at {last_seen:?} ({seen_by}), object gone at {object_gone:?}"
    );
    drop(stopped);
    // member-2's record is untouched.
    resolves(&own("member-2"), "A", std::slice::from_ref(&ip2)).await;
    resolves(&shared, "A", &[ip2]).await;

    op1.stop().await;
    delete_and_wait(&api2, "todo-api").await;
}

/// Test 7 of #15: a registry that cannot be reached, or is misconfigured,
/// stops no reconcile; `Registered=False` says why.
#[tokio::test]
async fn an_unreachable_or_misconfigured_registry_stops_no_reconcile() {
    let c = client("member-3").await;
    ensure_crd(&c).await;
    let ns = TestNamespace::create(&c, "member-3", "reg-bad").await;
    let api = ns.api::<Microservice>();

    // Nothing listens on this loopback port.
    let unreachable = Registration::connect(&RegistryConfig {
        endpoints: vec!["http://127.0.0.1:9".into()],
        ..support::registry::config()
    })
    .await;
    assert!(
        matches!(unreachable, Registration::Ready(_)),
        "connecting is lazy"
    );
    let op = operator(&c, "member-3", &ns.name, unreachable).await;
    let ms = microservice("api", "ghcr.io/acme/api:1", 8080, Some(1));
    api.create(&PostParams::default(), &ms).await.unwrap();
    wait_condition(&api, "api", "Available", "True", None).await;
    let (got, registered) = not_registered(&api, "api").await;
    assert_eq!(registered.reason, "ExternalUnavailable");
    assert_eq!(registered.observed_generation, got.metadata.generation);
    // The registry's health is in /metrics (this process's registry).
    let metrics = flotilla::telemetry::metrics::METRICS.encode();
    assert!(
        metrics.contains("flotilla_registry_up{cluster=\"member-3\"} 0"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("registry"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    op.stop().await;

    // A bad zone: the finalizer stays on, and the reason is Invalid.
    let broken = Registration::connect(&RegistryConfig {
        zone: "not a zone".into(),
        ..support::registry::config()
    })
    .await;
    assert!(matches!(broken, Registration::Broken(_)));
    let op = operator(&c, "member-3", &ns.name, broken).await;
    let ms = microservice("web", "ghcr.io/acme/web:1", 8080, Some(1));
    api.create(&PostParams::default(), &ms).await.unwrap();
    wait_condition(&api, "web", "Available", "True", None).await;
    let (_, registered) = not_registered(&api, "web").await;
    assert_eq!(registered.reason, "Invalid");
    assert!(
        registered.message.contains("not a zone"),
        "{}",
        registered.message
    );
    op.stop().await;

    // Registration off: the finalizers are released, so nothing is stranded.
    let _op = Operator::start(&c, settings("member-3", &ns.name), Hooks::default());
    for name in ["api", "web"] {
        delete_and_wait(&api, name).await;
    }
}

fn entry(cluster: &str, ns: &str, name: &str) -> Entry {
    Entry {
        cluster: cluster.into(),
        namespace: ns.into(),
        name: name.into(),
    }
}

async fn put(
    registry: &Registry,
    entry: &Entry,
    ip: &str,
    epoch: i64,
) -> Result<(), RegistryError> {
    let me = Writer {
        cluster: entry.cluster.clone(),
        epoch,
        lease: String::new(),
    };
    let desired = entry.desired_by(registry.zone(), Some(ip), 80, &me)?;
    let keys: Vec<String> = desired.iter().map(|(k, _)| k.clone()).collect();
    let existing = registry.read(&keys).await?;
    let ops = plan_register(&desired, &existing, &me)?;
    registry.apply(&ops).await
}

/// Test 5 of #15, at the registry's edge: a term that is not the newest is
/// refused, and a write planned on a stale read changes nothing.
#[tokio::test]
async fn a_deposed_writer_and_a_stale_read_change_nothing_in_etcd() {
    let _up = ETCD_UP.read().await;
    let Registration::Ready(registry) = registration().await else {
        panic!("the test bed's registry config is valid");
    };
    let ns = format!("dep-{:08x}", rand::random::<u32>());
    let e = entry("member-1", &ns, "api");
    put(&registry, &e, "10.96.0.10", 7)
        .await
        .expect("term 7 writes");
    let refused = put(&registry, &e, "10.96.0.66", 6).await;
    assert!(
        matches!(refused, Err(RegistryError::Refused(_))),
        "term 6 is deposed: {refused:?}"
    );
    // A read, then someone else's write, then ours planned on the old read.
    let seven = Writer {
        cluster: "member-1".into(),
        epoch: 7,
        lease: String::new(),
    };
    let desired = e
        .desired_by(registry.zone(), Some("10.96.0.11"), 80, &seven)
        .unwrap();
    let keys: Vec<String> = desired.iter().map(|(k, _)| k.clone()).collect();
    let stale: Vec<Existing> = registry.read(&keys).await.unwrap();
    put(&registry, &e, "10.96.0.12", 8)
        .await
        .expect("term 8 writes");
    let me = Writer {
        cluster: "member-1".into(),
        epoch: 9,
        lease: String::new(),
    };
    let ops = plan_register(&desired, &stale, &me).unwrap();
    assert!(matches!(
        registry.apply(&ops).await,
        Err(RegistryError::Conflict)
    ));
    let now = registry.read(&keys).await.unwrap();
    assert!(
        now.iter()
            .all(|x| x.record.as_ref().unwrap().host == "10.96.0.12")
    );
    let name = format!("api.{ns}.member-1.cluster.{}", zone());
    resolves(&name, "A", &["10.96.0.12".to_string()]).await;
    // Clean up.
    let ops = plan_remove(
        &keys,
        &now,
        &Writer {
            cluster: "member-1".into(),
            epoch: 8,
            lease: String::new(),
        },
    )
    .unwrap();
    registry.apply(&ops).await.unwrap();
}

/// #67, seed 001's order under a late write: a registration planned before
/// its object's deletion (a deposed leader's, or one held in transit while
/// etcd restarted) and delivered after it is refused by etcd itself, so no
/// record outlives its object; also for an object deleted before it was
/// ever registered.
#[tokio::test]
async fn a_registration_delivered_after_its_objects_deletion_is_refused_by_etcd() {
    let _up = ETCD_UP.read().await;
    let Registration::Ready(registry) = registration().await else {
        panic!("the test bed's registry config is valid");
    };
    let ns = format!("tomb-{:08x}", rand::random::<u32>());
    let writer = |epoch| Writer {
        cluster: "member-1".into(),
        epoch,
        lease: String::new(),
    };
    for (name, registered_first) in [("api", true), ("web", false)] {
        let e = entry("member-1", &ns, name);
        let uid = format!("uid-{:08x}", rand::random::<u32>());
        let desired = e
            .desired_by(registry.zone(), Some("10.96.0.10"), 80, &writer(7))
            .unwrap();
        let keys: Vec<String> = desired.iter().map(|(k, _)| k.clone()).collect();
        // The late writer read (nothing there yet) and planned its create.
        let read = registry.read(&keys).await.unwrap();
        let late = plan_register(&desired, &read, &writer(7)).unwrap();
        assert!(!late.is_empty());
        // Meanwhile the object was registered by its leader, then deleted.
        let cluster_name = format!("{name}.{ns}.member-1.cluster.{}", zone());
        if registered_first {
            let now = e
                .desired_by(registry.zone(), Some("10.96.0.11"), 80, &writer(8))
                .unwrap();
            let ops = plan_register(&now, &read, &writer(8)).unwrap();
            registry.register(&ops, &uid).await.expect("registered");
            resolves(&cluster_name, "A", &["10.96.0.11".to_string()]).await;
        }
        let found = registry.read(&keys).await.unwrap();
        let remove = plan_remove(&keys, &found, &writer(8)).unwrap();
        registry.retire(&remove, &uid).await.expect("retired");
        assert!(registry.read(&keys).await.unwrap().is_empty());
        // The late create arrives: etcd refuses it.
        let landed = registry.register(&late, &uid).await;
        assert!(
            matches!(landed, Err(RegistryError::Conflict)),
            "{name}: a registration after the deletion: {landed:?}"
        );
        assert!(
            registry.read(&keys).await.unwrap().is_empty(),
            "{name}: a record outlived its object"
        );
        assert_eq!(rcode(&cluster_name, "A"), "NXDOMAIN", "{name}");
        // A new object of the same name (another uid) registers as ever.
        let again = registry.read(&keys).await.unwrap();
        let ops = plan_register(&desired, &again, &writer(9)).unwrap();
        let other = format!("uid-{:08x}", rand::random::<u32>());
        registry.register(&ops, &other).await.expect("a new object");
        let found = registry.read(&keys).await.unwrap();
        let remove = plan_remove(&keys, &found, &writer(9)).unwrap();
        registry.retire(&remove, &other).await.unwrap();
    }
}

/// Test 6 of #15, the sweep of a cluster that left the fleet: its records
/// go within two sweep periods, and a member's stay.
#[tokio::test]
async fn the_sweep_removes_a_departed_clusters_records_and_keeps_members() {
    let _up = ETCD_UP.read().await;
    let Registration::Ready(registry) = registration().await else {
        panic!("the test bed's registry config is valid");
    };
    let ns = format!("swp-{:08x}", rand::random::<u32>());
    let gone = entry("member-9", &ns, "api");
    let kept = entry("member-1", &ns, "api");
    put(&registry, &gone, "10.96.0.20", 1).await.unwrap();
    put(&registry, &kept, "10.96.0.21", 1).await.unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let members = || {
        Some(
            ["member-1", "member-2", "member-3"]
                .map(String::from)
                .into_iter()
                .collect(),
        )
    };
    let sweep = tokio::spawn(flotilla::registry::sweep::sweep_departed(
        registry.as_ref().clone(),
        members,
        Duration::from_millis(500),
        async move {
            stop_rx.await.ok();
        },
    ));
    let z = zone();
    eventually("member-9's records swept", Duration::from_secs(20), || {
        let name = format!("api.{ns}.member-9.cluster.{z}");
        async move { (rcode(&name, "A") == "NXDOMAIN").then_some(()) }
    })
    .await;
    resolves(&format!("api.{ns}.{z}"), "A", &["10.96.0.21".to_string()]).await;
    stop_tx.send(()).ok();
    sweep.await.unwrap();

    // A cluster leader's own sweep: a record of a Microservice that does
    // not exist (as after an etcd restore) goes; one that exists stays.
    let c3 = client("member-3").await;
    ensure_crd(&c3).await;
    let ns3 = TestNamespace::create(&c3, "member-3", "reg-sweep").await;
    let ghost = entry("member-3", &ns3.name, "ghost");
    put(&registry, &ghost, "10.96.0.30", 0).await.unwrap();
    let api3 = ns3.api::<Microservice>();
    let real = microservice("real", "ghcr.io/acme/real:1", 8080, Some(1));
    api3.create(&PostParams::default(), &real).await.unwrap();
    let op = swept_operator(
        &c3,
        "member-3",
        &ns3.name,
        registration().await,
        Duration::from_secs(1),
    );
    wait_condition(&api3, "real", "Registered", "True", None).await;
    eventually("the ghost's records swept", Duration::from_secs(20), || {
        let name = format!("ghost.{}.member-3.cluster.{z}", ns3.name);
        async move { (rcode(&name, "A") == "NXDOMAIN").then_some(()) }
    })
    .await;
    assert_eq!(
        dig(&format!("real.{}.member-3.cluster.{z}", ns3.name), "A").len(),
        1
    );
    delete_and_wait(&api3, "real").await;
    op.stop().await;
    let keys = kept.keys(registry.zone()).unwrap();
    let now = registry.read(&keys).await.unwrap();
    let ops = plan_remove(
        &keys,
        &now,
        &Writer {
            cluster: "member-1".into(),
            epoch: 1,
            lease: String::new(),
        },
    )
    .unwrap();
    registry.apply(&ops).await.unwrap();
}

/// Test 4 of #15: the leader of member-1 is killed (-9) while a deletion
/// waits on a stopped registry; the successor completes the cleanup once
/// etcd is back.
#[tokio::test]
async fn a_successor_completes_a_cleanup_its_killed_predecessor_was_blocked_on() {
    use support::replicas::{Replicas, holder, member_clients, namespaces};
    let clients = member_clients().await;
    let (ns, _guards) = namespaces(&clients, "reg-kill").await;
    let c1 = clients["member-1"].clone();
    let etcd_up = ETCD_UP.read().await;
    let mut replicas = Replicas::new(&ns, &["member-1"]);
    for (k, v) in support::registry::env() {
        replicas.env.push((k, v));
    }
    // These replicas' fleet has member-1 only: their sweep of departed
    // clusters would take member-2's and member-3's records, which other
    // tests of this binary hold, for departed. It waits out the test.
    replicas
        .extra_args
        .extend(["--registry-sweep-period".into(), "1h".into()]);
    for id in ["r1", "r2"] {
        replicas.start(id);
    }
    let lease = replicas.lease_name();
    let leader = eventually("a leader of member-1", WAIT, || {
        let (c1, lease) = (c1.clone(), lease.clone());
        async move { holder(&c1, &lease).await }
    })
    .await;
    let api = Api::<Microservice>::namespaced(c1.clone(), &ns);
    let ms = microservice("todo-api", "ghcr.io/acme/todo:1", 8080, Some(1));
    api.create(&PostParams::default(), &ms).await.unwrap();
    wait_condition(&api, "todo-api", "Registered", "True", None).await;
    let name = format!("todo-api.{ns}.member-1.cluster.{}", zone());
    assert_eq!(dig(&name, "A").len(), 1);

    // Over gRPC, from the replica that survives: a watch that sees the
    // object deleting, cleanup pending, until it is gone.
    let other = if leader == "r1" { "r2" } else { "r1" };
    let grpc = connect(&ClientOptions {
        server: replicas.grpc_url(other),
        ..Default::default()
    })
    .await
    .expect("gRPC");
    let watched = tokio::spawn(watch_until_deleted(grpc.clone(), ns.clone()));

    drop(etcd_up);
    let _exclusive = ETCD_UP.write().await;
    let stopped = StoppedEtcd::stop();
    api.delete("todo-api", &DeleteParams::default())
        .await
        .unwrap();
    cleanup_blocked(&api, "todo-api").await;
    let get = pb::GetMicroserviceRequest {
        namespace: ns.clone(),
        name: "todo-api".into(),
    };
    eventually("gRPC shows the pending cleanup", WAIT, || {
        let (mut grpc, get) = (grpc.clone(), get.clone());
        async move {
            let m = grpc.get_microservice(get).await.ok()?.into_inner();
            m.clusters
                .iter()
                .any(|e| {
                    e.cluster == "member-1"
                        && e.deleting
                        && e.registered == "True"
                        && e.cleanup_blocked == "ExternalUnavailable"
                })
                .then_some(())
        }
    })
    .await;
    replicas.kill_9(&leader);
    let successor = eventually("a successor", WAIT, || {
        let (c1, lease, leader) = (c1.clone(), lease.clone(), leader.clone());
        async move { holder(&c1, &lease).await.filter(|h| *h != leader) }
    })
    .await;
    drop(stopped);
    eventually("the object gone", WAIT, || {
        let api = api.clone();
        async move { api.get_opt("todo-api").await.ok()?.is_none().then_some(()) }
    })
    .await;
    assert_eq!(
        rcode(&name, "A"),
        "NXDOMAIN",
        "{successor} removed the record"
    );
    // member-1's entry of each UPSERT after the deletion, then the DELETE.
    let seen = tokio::time::timeout(WAIT, watched)
        .await
        .expect("the watch sent the DELETE")
        .unwrap();
    let first = seen
        .iter()
        .position(|e| e.as_ref().is_some_and(|(deleting, _)| *deleting))
        .unwrap_or_else(|| panic!("the watch never sent it deleting: {seen:?}"));
    assert!(
        seen[first..seen.len() - 1]
            .iter()
            .all(|e| e.as_ref().is_some_and(|(deleting, _)| *deleting)),
        "once deleting, every UPSERT says so until the DELETE: {seen:?}"
    );
    assert!(
        seen[first..].iter().any(|e| e
            .as_ref()
            .is_some_and(|(_, blocked)| blocked == "ExternalUnavailable")),
        "the watch sent the blocked cleanup: {seen:?}"
    );
    assert_eq!(seen.last(), Some(&None), "it ends with the DELETE");
}

/// Watches `ns` until `todo-api`'s DELETE: for each UPSERT of it, member-1's
/// (deleting, cleanup_blocked); `None` for the DELETE.
async fn watch_until_deleted(
    mut grpc: flotilla::api::client::Client,
    ns: String,
) -> Vec<Option<(bool, String)>> {
    use tokio_stream::StreamExt;
    let request = pb::WatchMicroservicesRequest {
        namespace: ns,
        ..Default::default()
    };
    let mut stream = grpc
        .watch_microservices(request)
        .await
        .expect("watch")
        .into_inner();
    let mut seen = Vec::new();
    while let Some(event) = stream.next().await {
        let event = event.expect("the stream stays open");
        let Some(m) = event.microservice.as_ref().filter(|m| m.name == "todo-api") else {
            continue;
        };
        match pb::WatchEventType::try_from(event.r#type) {
            Ok(pb::WatchEventType::Delete) => {
                seen.push(None);
                return seen;
            }
            Ok(pb::WatchEventType::Upsert) => {
                if let Some(e) = m.clusters.iter().find(|e| e.cluster == "member-1") {
                    seen.push(Some((e.deleting, e.cleanup_blocked.clone())));
                }
            }
            _ => {}
        }
    }
    panic!("the stream ended before the DELETE: {seen:?}");
}

/// The value of `series` on a replica's /metrics, 0 if absent.
async fn metric(replicas: &support::replicas::Replicas, id: &str, series: &str) -> f64 {
    let url = format!("{}/metrics", replicas.metrics_url(id));
    let Some((_, body)) = support::http_get(&url).await else {
        return 0.0;
    };
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Points the replicas started next at another registry endpoint.
fn set_endpoint(replicas: &mut support::replicas::Replicas, endpoint: String) {
    const KEY: &str = "FLOTILLA_REGISTRY_ETCD_ENDPOINTS";
    replicas.env.retain(|(k, _)| k != KEY);
    replicas.env.push((KEY.into(), endpoint));
}

/// Test 5 of #15 on live replicas, with the fencing test's SIGSTOP: the
/// leader of member-1 sends a registry write that a gate holds on its way
/// to etcd, and is stopped; its successor registers the same change at a
/// newer term; the held write then reaches etcd and is refused by its
/// mod-revision comparison. The record keeps the successor's term.
#[tokio::test]
async fn a_stopped_leaders_registry_write_is_refused_once_its_successor_has_written() {
    use support::gate::Gate;
    use support::replicas::{Replicas, holder, namespaces};
    let _up = ETCD_UP.read().await;
    let c1 = client("member-1").await;
    ensure_crd(&c1).await;
    let clients = std::collections::BTreeMap::from([("member-1", c1.clone())]);
    let (ns, _guards) = namespaces(&clients, "reg-stop").await;
    let env = support::registry::env();
    let etcd = env["FLOTILLA_REGISTRY_ETCD_ENDPOINTS"].clone();
    let gate = Gate::start(etcd.trim_start_matches("http://").to_string()).await;

    // sa is member-1's assigned leader with sb beside it, so sb joining
    // does not take member-1 from it.
    let live: std::collections::BTreeSet<String> = ["sa", "sb"].map(String::from).into();
    let only: std::collections::BTreeSet<String> = ["member-1".to_string()].into();
    assert_eq!(
        flotilla::fleet::shard::assign(&only, &live)["member-1"],
        "sa"
    );
    let mut replicas = Replicas::new(&ns, &["member-1"]);
    replicas.env.extend(env.clone());
    // Member leaders write both names, so the gate's next etcd write is
    // the leader's (a fleet DNS writer's would race it; #31 tests it apart).
    replicas
        .extra_args
        .extend(["--registry-sweep-period", "1h", "--fleet-dns", "false"].map(String::from));
    // The first replica reaches etcd through the gate, the second directly.
    set_endpoint(&mut replicas, format!("http://127.0.0.1:{}", gate.port));
    replicas.start("sa");
    let lease = replicas.lease_name();
    eventually("sa leading member-1", WAIT, || {
        let (c1, lease) = (c1.clone(), lease.clone());
        async move { holder(&c1, &lease).await.filter(|h| h == "sa") }
    })
    .await;
    set_endpoint(&mut replicas, etcd);
    replicas.start("sb");

    let api = Api::<Microservice>::namespaced(c1.clone(), &ns);
    let ms = microservice("todo-api", "ghcr.io/acme/todo:1", 8080, Some(1));
    api.create(&PostParams::default(), &ms).await.unwrap();
    wait_condition(&api, "todo-api", "Registered", "True", None).await;
    let Registration::Ready(registry) = registration().await else {
        panic!("the test bed's registry config is valid");
    };
    let keys = entry("member-1", &ns, "todo-api")
        .keys(registry.zone())
        .unwrap();
    let records = || async {
        let found = registry.read(&keys).await.expect("read etcd");
        assert_eq!(found.len(), 2, "{found:?}");
        found
            .into_iter()
            .map(|e| e.record.expect("a record of ours"))
            .collect::<Vec<_>>()
    };
    let first = records().await;
    let old_term = first[0].writer.epoch;
    assert_eq!(first[0].port, 8080);

    // A port change: sa updates the Service, reads etcd, and sends its
    // conditional write, which the gate holds on its way.
    gate.hold_next_write();
    let port = serde_json::json!({"spec": {"port": 9090}});
    api.patch(
        "todo-api",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&port),
    )
    .await
    .unwrap();
    eventually("sa's registry write held at the gate", WAIT, || {
        let holding = gate.holding();
        async move { holding.then_some(()) }
    })
    .await;
    replicas.signal("sa", "STOP");
    let new_term = eventually("sb registering port 9090", WAIT, || async {
        let now = records().await;
        now.iter()
            .all(|r| r.port == 9090 && r.writer.epoch > old_term)
            .then(|| now[0].writer.epoch)
    })
    .await;
    assert_eq!(holder(&c1, &lease).await.as_deref(), Some("sb"), "sb leads");
    let before: Vec<i64> = registry
        .read(&keys)
        .await
        .unwrap()
        .iter()
        .map(|e| e.mod_revision)
        .collect();
    // sa's write, planned on a read from before sb's, reaches etcd now,
    // while sa is still stopped: the mod-revision comparison refuses it.
    let held = gate.waiting();
    gate.release();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = registry.read(&keys).await.unwrap();
    assert_eq!(
        after.iter().map(|e| e.mod_revision).collect::<Vec<_>>(),
        before,
        "sa's write ({held} bytes held, then sent) changed nothing: {after:?}"
    );
    replicas.signal("sa", "CONT");
    // sa wakes deposed; whatever it does next, the record never goes back
    // to its old term (the shard assignment may hand it member-1 again,
    // at a newer term still).
    tokio::time::sleep(Duration::from_secs(5)).await;
    for r in records().await {
        assert_eq!(r.port, 9090, "{r:?}");
        assert!(r.writer.epoch >= new_term, "an older term's record: {r:?}");
    }
    let conflicts = "flotilla_registry_writes_total{cluster=\"member-1\",result=\"conflict\"}";
    println!(
        "figure: the deposed leader's held write ({held} bytes) refused by etcd; its conflict count {}",
        metric(&replicas, "sa", conflicts).await
    );
    let name = format!("todo-api.{ns}.member-1.cluster.{}", zone());
    let srv = dig(&name, "SRV");
    assert!(
        srv.first()
            .and_then(|s| s.split_whitespace().nth(2))
            .is_some_and(|p| p == "9090"),
        "{srv:?}"
    );
    // Whoever leads now cleans up.
    delete_and_wait(&api, "todo-api").await;
}

/// Test 7 of #15 on a live replica: with its registry unreachable, the
/// replica reconciles, is ready, and shows the registry down in /metrics.
#[tokio::test]
async fn a_replica_with_an_unreachable_registry_is_ready_and_says_so_in_metrics() {
    use support::replicas::{Replicas, namespaces};
    let c3 = client("member-3").await;
    ensure_crd(&c3).await;
    let clients = std::collections::BTreeMap::from([("member-3", c3.clone())]);
    let (ns, _guards) = namespaces(&clients, "reg-ready").await;
    let mut replicas = Replicas::new(&ns, &["member-3"]);
    replicas.env.extend(support::registry::env());
    // Nothing listens on this loopback port.
    set_endpoint(&mut replicas, "http://127.0.0.1:9".into());
    replicas
        .extra_args
        .extend(["--registry-sweep-period".into(), "1h".into()]);
    replicas.start("ru");
    let api = Api::<Microservice>::namespaced(c3.clone(), &ns);
    let ms = microservice("api", "ghcr.io/acme/api:1", 8080, Some(1));
    api.create(&PostParams::default(), &ms).await.unwrap();
    wait_condition(&api, "api", "Available", "True", None).await;
    let (_, registered) = not_registered(&api, "api").await;
    assert_eq!(registered.reason, "ExternalUnavailable");
    let readyz = format!("{}/readyz", replicas.metrics_url("ru"));
    let (code, body) = support::http_get(&readyz).await.expect("/readyz answers");
    assert_eq!(code, 200, "ready without the registry: {body}");
    let up = "flotilla_registry_up{cluster=\"member-3\"}";
    assert_eq!(metric(&replicas, "ru", up).await, 0.0);
    let (_, body) = support::http_get(&format!("{}/metrics", replicas.metrics_url("ru")))
        .await
        .expect("/metrics");
    assert!(body.contains(&format!("{up} 0")), "the series is present");
    // Still ready a few retries later.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let (code, _) = support::http_get(&readyz).await.expect("/readyz answers");
    assert_eq!(code, 200);
    drop(replicas);
    // Registration off releases the finalizer.
    let _op = Operator::start(&c3, settings("member-3", &ns), Hooks::default());
    delete_and_wait(&api, "api").await;
}

/// #30 L2: etcd is outside the kube wire fence, so the registration code
/// checks the term itself. A leader deposed between a reconcile's start
/// and its registry delete (a stale backlog) removes nothing: the records
/// stay for the new leader, and once this replica leads again the
/// deletion completes. With the check removed, the record is gone.
#[tokio::test]
async fn a_leader_deposed_mid_reconcile_deletes_no_record() {
    use flotilla::lease::elector::Leadership;
    use futures::FutureExt;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let _up = ETCD_UP.read().await;
    let c = client("member-3").await;
    ensure_crd(&c).await;
    let ns = TestNamespace::create(&c, "member-3", "reg-fence").await;
    let Registration::Ready(registry) = registration().await else {
        panic!("the test bed's registry config is valid");
    };
    let leading = || Leadership::Leading {
        epoch: 4,
        since: tokio::time::Instant::now(),
        until: tokio::time::Instant::now() + Duration::from_secs(3600),
    };
    let (tx, rx) = tokio::sync::watch::channel(leading());
    let tx = Arc::new(tx);
    let depose = Arc::new(AtomicBool::new(false));
    let mut s = settings("member-3", &ns.name);
    s.registry = Some(registration().await);
    s.registry_sweep = Duration::from_secs(3600);
    s.leadership = Some(rx);
    s.writer.epoch = Some(4);
    let hooks = Hooks {
        before_reconcile: Some(Arc::new({
            let (tx, depose) = (tx.clone(), depose.clone());
            move |_| {
                if depose.load(Ordering::SeqCst) {
                    tx.send_replace(Leadership::Following {
                        holder: Some("the-successor".into()),
                        epoch: Some(5),
                        since: tokio::time::Instant::now(),
                    });
                }
                async {}.boxed()
            }
        })),
        ..Default::default()
    };
    let op = Operator::start(&c, s, hooks);
    let api = ns.api::<Microservice>();
    api.create(
        &PostParams::default(),
        &microservice("api", "ghcr.io/acme/api:1", 8080, Some(1)),
    )
    .await
    .unwrap();
    wait_condition(&api, "api", "Registered", "True", None).await;
    let keys = entry("member-3", &ns.name, "api")
        .keys(registry.zone())
        .unwrap();
    let held = |existing: &[Existing]| existing.iter().filter(|e| e.record.is_some()).count();
    assert_eq!(held(&registry.read(&keys).await.unwrap()), 2);

    // The next reconcile starts as leader and is deposed at once.
    depose.store(true, Ordering::SeqCst);
    api.delete("api", &DeleteParams::default()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        held(&registry.read(&keys).await.unwrap()),
        2,
        "a deposed leader deleted registry records"
    );
    assert!(
        api.get_opt("api").await.unwrap().is_some(),
        "the finalizer stays"
    );

    // Leading again: the deletion completes, records first.
    depose.store(false, Ordering::SeqCst);
    tx.send_replace(leading());
    eventually("the deletion completed by the leader", WAIT, || {
        let api = api.clone();
        async move { api.get_opt("api").await.ok()?.is_none().then_some(()) }
    })
    .await;
    assert_eq!(held(&registry.read(&keys).await.unwrap()), 0);
    op.stop().await;
}

/// An etcd of this test's own, over TLS with client certificates required.
struct TlsEtcd {
    child: std::process::Child,
    endpoint: String,
    dir: std::path::PathBuf,
}

impl Drop for TlsEtcd {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

impl TlsEtcd {
    fn start(pki: &std::path::Path) -> TlsEtcd {
        let bin = std::fs::read_to_string(support::fleet_dir().join("bindir"))
            .expect("the fleet's bindir");
        let (client, peer) = (
            support::replicas::free_port(),
            support::replicas::free_port(),
        );
        let dir = pki.join("etcd-data");
        let p = |f: &str| pki.join(f).display().to_string();
        let log = std::fs::File::create(pki.join("etcd.log")).unwrap();
        let child = std::process::Command::new(format!("{}/etcd", bin.trim()))
            .args(["--name", "tls", "--data-dir", &dir.display().to_string()])
            .args([
                "--listen-client-urls",
                &format!("https://127.0.0.1:{client}"),
            ])
            .args([
                "--advertise-client-urls",
                &format!("https://127.0.0.1:{client}"),
            ])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args([
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
            ])
            .args(["--initial-cluster", &format!("tls=http://127.0.0.1:{peer}")])
            .args([
                "--cert-file",
                &p("server.crt"),
                "--key-file",
                &p("server.key"),
            ])
            .args(["--client-cert-auth", "--trusted-ca-file", &p("ca.crt")])
            .args(["--unsafe-no-fsync", "--log-level", "warn"])
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd");
        TlsEtcd {
            child,
            endpoint: format!("https://127.0.0.1:{client}"),
            dir,
        }
    }
}

/// #30 L1: the registry's client certificate rotates without a restart.
/// A replica starts with a certificate etcd does not trust (another CA's)
/// and cannot read; the files are replaced in place with a trusted one,
/// and within the reload period it reads and writes. Its client identity
/// is never dropped for want of a CA (a unit test covers the refusals).
#[tokio::test]
async fn a_rotated_etcd_client_certificate_applies_without_a_restart() {
    let pki = support::fleet_dir().join(format!("etcd-tls-{:08x}", rand::random::<u32>()));
    std::fs::create_dir_all(&pki).unwrap();
    support::certificates(&pki);
    std::fs::copy(pki.join("stranger.crt"), pki.join("live.crt")).unwrap();
    std::fs::copy(pki.join("stranger.key"), pki.join("live.key")).unwrap();
    let etcd = TlsEtcd::start(&pki);
    let Registration::Ready(registry) = Registration::connect(&RegistryConfig {
        endpoints: vec![etcd.endpoint.clone()],
        ca: Some(pki.join("ca.crt")),
        cert: Some(pki.join("live.crt")),
        key: Some(pki.join("live.key")),
        insecure: false,
        ..support::registry::config()
    })
    .await
    else {
        panic!("a complete TLS configuration is valid");
    };
    let e = entry("member-1", "rotated", "api");
    let keys = e.keys(registry.zone()).unwrap();
    // etcd is up (its port answers), and refuses the stranger.
    let port = etcd.endpoint.rsplit_once(':').unwrap().1.to_string();
    eventually("etcd listening", WAIT, || {
        let port = port.clone();
        async move {
            tokio::net::TcpStream::connect(format!("127.0.0.1:{port}"))
                .await
                .ok()
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        registry.read(&keys).await.is_err(),
        "etcd served another CA's certificate"
    );
    // Rotated in place, as cert-manager does.
    for f in ["crt", "key"] {
        let tmp = pki.join(format!(".live.{f}.new"));
        std::fs::copy(pki.join(format!("client.{f}")), &tmp).unwrap();
        std::fs::rename(&tmp, pki.join(format!("live.{f}"))).unwrap();
    }
    let t0 = Instant::now();
    eventually("the rotated certificate in force", WAIT, || async {
        registry.read(&keys).await.ok()
    })
    .await;
    println!(
        "figure: registry client certificate rotated in {:?}",
        t0.elapsed()
    );
    put(&registry, &e, "10.96.0.40", 1)
        .await
        .expect("a write with the new certificate");
    drop(etcd);
    std::fs::remove_dir_all(&pki).ok();
}
