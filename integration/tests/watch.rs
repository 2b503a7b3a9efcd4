//! WatchMicroservices' protocol over a real socket: the server is the
//! product's own (`api::server::serve`), fed an index directly, so each
//! edge (a snapshot cut in half, a filter, a stalled reader, a cap, an age,
//! an idle stream) can be set up exactly. The end-to-end path from member
//! clusters to the index is covered by grpc.rs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::time::{Instant, timeout};

use flotilla::api::client::{Client, ClientOptions, connect};
use flotilla::api::pb;
use flotilla::api::server::{ServerOptions, serve};
use flotilla::status::hub::Hub;
use flotilla::status::view::{Facts, Reach};

type Key = (String, String);

fn facts(team: &str, image: &str) -> Facts {
    Facts {
        generation: 1,
        observed_generation: 1,
        image: image.into(),
        labels: BTreeMap::from([("team".into(), team.into())]),
        ..Default::default()
    }
}

fn key(name: &str) -> Key {
    ("shop".into(), name.into())
}

fn hub_with(n: usize) -> Arc<Hub> {
    let hub = Hub::new("watch-test");
    hub.update(|ix| {
        ix.registry_read();
        for c in ["member-1", "member-2"] {
            ix.update_cluster(c, "file", |i| {
                i.reach = Reach::Reachable;
                i.synced = true;
            });
        }
        for i in 0..n {
            ix.upsert_microservice("member-1", key(&format!("s{i:04}")), facts("pay", "a:1"));
        }
    });
    hub
}

struct Server {
    url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    async fn start(hub: Arc<Hub>, tune: impl FnOnce(&mut ServerOptions)) -> Self {
        let mut opts = ServerOptions::new("127.0.0.1:0".parse().unwrap());
        opts.insecure = true;
        tune(&mut opts);
        let listener = flotilla::api::server::bind(&opts).await.expect("bind");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            serve(hub, None, opts, listener, async {
                stopped.await.ok();
            })
            .await
            .expect("serve");
        });
        Server {
            url,
            stop: Some(stop),
            task,
        }
    }

    async fn client(&self) -> Client {
        connect(&ClientOptions {
            server: self.url.clone(),
            ..Default::default()
        })
        .await
        .expect("connect")
    }
}

fn request(
    cluster: &str,
    selector: &str,
    resume: u64,
    index_id: &str,
) -> pb::WatchMicroservicesRequest {
    pb::WatchMicroservicesRequest {
        namespace: String::new(),
        label_selector: selector.into(),
        cluster: cluster.into(),
        resume_revision: resume,
        index_id: index_id.into(),
    }
}

async fn next(
    stream: &mut tonic::Streaming<pb::WatchEvent>,
) -> Result<pb::WatchEvent, tonic::Status> {
    timeout(Duration::from_secs(40), stream.next())
        .await
        .expect("an event within 40 s")
        .expect("the stream is open")
}

/// Opens a watch; the call itself must succeed.
async fn open(
    client: &mut Client,
    r: pb::WatchMicroservicesRequest,
) -> tonic::Streaming<pb::WatchEvent> {
    client
        .watch_microservices(r)
        .await
        .expect("watch")
        .into_inner()
}

fn kind(e: &pb::WatchEvent) -> pb::WatchEventType {
    pb::WatchEventType::try_from(e.r#type).unwrap()
}

fn name(e: &pb::WatchEvent) -> String {
    e.microservice
        .as_ref()
        .map(|m| m.name.clone())
        .unwrap_or_default()
}

/// A client that follows the documented protocol: its resume point is the
/// last non-zero revision, and RESET forgets everything.
#[derive(Default)]
struct Mirror {
    items: BTreeSet<String>,
    resume: u64,
    index_id: String,
}

impl Mirror {
    /// Applies one event; true at SYNCED.
    fn apply(&mut self, e: &pb::WatchEvent) -> bool {
        use pb::WatchEventType as T;
        self.index_id = e.index_id.clone();
        match kind(e) {
            T::Reset => {
                self.items.clear();
                self.resume = 0;
            }
            T::Snapshot | T::Upsert => {
                self.items.insert(name(e));
            }
            T::Delete => {
                self.items.remove(&name(e));
            }
            _ => {}
        }
        if e.revision > 0 {
            self.resume = e.revision;
        }
        kind(e) == T::Synced
    }
}

#[tokio::test]
async fn a_client_dropped_halfway_through_a_snapshot_resumes_to_exactly_the_servers_set() {
    let hub = hub_with(300);
    let server = Server::start(hub.clone(), |_| {}).await;
    let mut client = server.client().await;
    let mut mirror = Mirror::default();
    let mut stream = open(&mut client, request("", "", 0, "")).await;
    for _ in 0..151 {
        let e = next(&mut stream).await.expect("event");
        assert!(!mirror.apply(&e), "synced before the snapshot ended");
    }
    drop(stream);
    assert_eq!(mirror.items.len(), 150);

    // Meanwhile some go and some come.
    hub.update(|ix| {
        for i in (0..300).step_by(7) {
            ix.delete_microservice("member-1", &key(&format!("s{i:04}")));
        }
        for i in 300..310 {
            ix.upsert_microservice("member-1", key(&format!("s{i:04}")), facts("pay", "a:1"));
        }
    });

    let mut resumed = open(
        &mut client,
        request("", "", mirror.resume, &mirror.index_id),
    )
    .await;
    while !mirror.apply(&next(&mut resumed).await.expect("event")) {}
    let server_set: BTreeSet<String> = hub.read(|ix| {
        ix.list(&Default::default(), None, usize::MAX)
            .into_iter()
            .map(|v| v.name)
            .collect()
    });
    assert_eq!(server_set.len(), 300 - 43 + 10);
    assert_eq!(mirror.items, server_set);
}

#[tokio::test]
async fn a_filtered_watch_deletes_only_what_it_sent_and_what_leaves_its_filter() {
    let hub = hub_with(3);
    let server = Server::start(hub.clone(), |_| {}).await;
    let mut client = server.client().await;
    let mut by_cluster = open(&mut client, request("member-1", "", 0, "")).await;
    let mut by_label = open(&mut client, request("", "team=pay", 0, "")).await;
    for stream in [&mut by_cluster, &mut by_label] {
        let mut m = Mirror::default();
        while !m.apply(&next(stream).await.expect("event")) {}
        assert_eq!(m.items.len(), 3);
    }

    // Changes in member-2 only, then s0000 leaves the label filter, then a
    // marker both streams see.
    hub.update(|ix| {
        ix.upsert_microservice("member-2", key("elsewhere"), facts("web", "a:1"));
        ix.delete_microservice("member-2", &key("elsewhere"));
    });
    hub.update(|ix| ix.upsert_microservice("member-1", key("s0000"), facts("web", "a:1")));
    hub.update(|ix| ix.upsert_microservice("member-1", key("s0002"), facts("pay", "a:2")));

    let mut seen = Vec::new();
    loop {
        let e = next(&mut by_cluster).await.expect("event");
        seen.push((kind(&e), name(&e)));
        if name(&e) == "s0002" {
            break;
        }
    }
    assert!(
        !seen.iter().any(|(k, _)| *k == pb::WatchEventType::Delete),
        "a member-1 watch heard of member-2: {seen:?}"
    );
    let mut seen = Vec::new();
    loop {
        let e = next(&mut by_label).await.expect("event");
        seen.push((kind(&e), name(&e)));
        if name(&e) == "s0002" {
            break;
        }
    }
    assert_eq!(
        seen,
        [
            (pb::WatchEventType::Delete, "s0000".to_string()),
            (pb::WatchEventType::Upsert, "s0002".to_string()),
        ]
    );
}

#[tokio::test]
async fn a_reader_that_reads_nothing_is_cut_off_while_others_keep_being_served() {
    let hub = hub_with(300);
    let server = Server::start(hub.clone(), |o| o.stream_stall = Duration::from_secs(2)).await;
    let mut client = server.client().await;
    // Its own connection, so that its full window does not stall the others.
    let mut stuck_client = server.client().await;
    let mut stuck = open(&mut stuck_client, request("", "", 0, "")).await;
    let mut healthy = open(&mut client, request("", "", 0, "")).await;
    let mut mirror = Mirror::default();
    while !mirror.apply(&next(&mut healthy).await.expect("event")) {}

    // Churn: every key changes, round after round, with big labels so the
    // stuck reader's windows fill.
    let reader = tokio::spawn(async move {
        let mut last = String::new();
        while let Some(Ok(e)) = healthy.next().await {
            if let Some(m) = &e.microservice {
                last = m
                    .clusters
                    .first()
                    .map(|c| c.image.clone())
                    .unwrap_or_default();
            }
            if last == "a:final" {
                return last;
            }
        }
        last
    });
    let mut latencies = Vec::new();
    let started = Instant::now();
    let padding = "x".repeat(2000);
    for round in 0..60 {
        hub.update(|ix| {
            for i in 0..300 {
                let mut f = facts("pay", &format!("a:{round}"));
                f.labels.insert("pad".into(), padding.clone());
                ix.upsert_microservice("member-1", key(&format!("s{i:04}")), f);
            }
        });
        let t0 = Instant::now();
        client
            .get_microservice(pb::GetMicroserviceRequest {
                namespace: "shop".into(),
                name: "s0001".into(),
            })
            .await
            .expect("a unary call answers during the churn");
        latencies.push(t0.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    hub.update(|ix| {
        for i in 0..300 {
            ix.upsert_microservice(
                "member-1",
                key(&format!("s{i:04}")),
                facts("pay", "a:final"),
            );
        }
    });
    let last = timeout(Duration::from_secs(30), reader)
        .await
        .expect("the reading watcher keeps up")
        .unwrap();
    assert_eq!(last, "a:final");
    latencies.sort();
    println!(
        "figure: GetMicroservice during the churn p50 {:?} max {:?} over {:?}",
        latencies[latencies.len() / 2],
        latencies.last().unwrap(),
        started.elapsed()
    );

    // The stuck reader now drains what its windows held, then the verdict.
    let end = timeout(Duration::from_secs(60), async {
        loop {
            match stuck.next().await {
                Some(Ok(_)) => continue,
                Some(Err(status)) => return Some(status),
                None => return None,
            }
        }
    })
    .await
    .expect("the stuck stream ends");
    let status = end.expect("the stuck stream ends with a status, not silently");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
}

#[tokio::test]
async fn the_stream_cap_refuses_and_the_maximum_age_ends_a_stream_unavailable() {
    let hub = hub_with(1);
    let server = Server::start(hub.clone(), |o| {
        o.max_streams = 2;
        o.max_stream_age = Duration::from_secs(2);
    })
    .await;
    let mut client = server.client().await;
    let mut a = open(&mut client, request("", "", 0, "")).await;
    let _b = client
        .watch_microservices(request("", "", 0, ""))
        .await
        .expect("second")
        .into_inner();
    let refused = client
        .watch_microservices(request("", "", 0, ""))
        .await
        .expect_err("over the cap");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);

    let mut mirror = Mirror::default();
    while !mirror.apply(&next(&mut a).await.expect("event")) {}
    let end = next(&mut a).await.expect_err("the age ends the stream");
    assert_eq!(end.code(), tonic::Code::Unavailable, "{end:?}");
    // Its slot is free again; a resume sends only SYNCED.
    let mut again = open(
        &mut client,
        request("", "", mirror.resume, &mirror.index_id),
    )
    .await;
    assert_eq!(
        kind(&next(&mut again).await.unwrap()),
        pb::WatchEventType::Synced
    );
}

#[tokio::test]
async fn an_idle_stream_carries_a_bookmark_within_35_seconds() {
    let hub = hub_with(1);
    let server = Server::start(hub.clone(), |_| {}).await;
    let mut client = server.client().await;
    let mut stream = open(&mut client, request("", "", 0, "")).await;
    let mut mirror = Mirror::default();
    while !mirror.apply(&next(&mut stream).await.expect("event")) {}
    let synced_at = Instant::now();
    // Nothing changes: the next event is a bookmark at the current revision.
    let e = next(&mut stream).await.expect("event");
    assert_eq!(kind(&e), pb::WatchEventType::Bookmark);
    assert!(synced_at.elapsed() <= Duration::from_secs(35));
    assert_eq!(e.revision, hub.read(|ix| ix.revision()));
    println!("figure: first bookmark after {:?}", synced_at.elapsed());
}

#[tokio::test]
async fn shutdown_ends_open_streams_unavailable_and_the_server_returns() {
    let hub = hub_with(1);
    let mut server = Server::start(hub.clone(), |_| {}).await;
    let mut client = server.client().await;
    let mut streams = Vec::new();
    for _ in 0..3 {
        let mut s = open(&mut client, request("", "", 0, "")).await;
        let mut m = Mirror::default();
        while !m.apply(&next(&mut s).await.expect("event")) {}
        streams.push(s);
    }
    server.stop.take().unwrap().send(()).unwrap();
    for mut s in streams {
        let end = next(&mut s).await.expect_err("ended");
        assert_eq!(end.code(), tonic::Code::Unavailable, "{end:?}");
    }
    timeout(Duration::from_secs(10), &mut server.task)
        .await
        .expect("the server returns once its streams ended")
        .unwrap();
}

#[tokio::test]
async fn a_resume_from_before_the_tombstone_horizon_gets_a_reset_and_the_exact_set() {
    let hub = hub_with(5);
    let server = Server::start(hub.clone(), |_| {}).await;
    let mut client = server.client().await;
    let mut mirror = Mirror::default();
    let mut stream = open(&mut client, request("", "", 0, "")).await;
    while !mirror.apply(&next(&mut stream).await.expect("event")) {}
    drop(stream);
    // While the client is away, more deletions than the index remembers.
    hub.update(|ix| {
        ix.delete_microservice("member-1", &key("s0000"));
        for i in 0..10_050 {
            let k = key(&format!("brief-{i:05}"));
            ix.upsert_microservice("member-1", k.clone(), facts("pay", "a:1"));
            ix.delete_microservice("member-1", &k);
        }
    });
    let mut resumed = open(
        &mut client,
        request("", "", mirror.resume, &mirror.index_id),
    )
    .await;
    let first = next(&mut resumed).await.expect("event");
    assert_eq!(
        kind(&first),
        pb::WatchEventType::Reset,
        "too old to resume: a snapshot, framed"
    );
    mirror.apply(&first);
    while !mirror.apply(&next(&mut resumed).await.expect("event")) {}
    let expected: BTreeSet<String> = (1..5).map(|i| format!("s{i:04}")).collect();
    assert_eq!(mirror.items, expected, "s0000's deletion was not lost");
}

#[tokio::test]
async fn every_call_is_unavailable_until_the_registry_is_read_then_answered() {
    // Clusters and objects are there, but the registry has not been read:
    // "in no cluster" or "no such cluster" would be guesses.
    let hub = Hub::new("watch-test");
    hub.update(|ix| {
        ix.update_cluster("member-1", "file", |i| {
            i.reach = Reach::Reachable;
            i.synced = true;
        });
        let mut done = facts("pay", "a:1");
        done.conditions = vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: "Available".into(),
            status: "True".into(),
            reason: "MinimumReplicasAvailable".into(),
            message: String::new(),
            observed_generation: Some(1),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                jiff::Timestamp::UNIX_EPOCH,
            ),
        }];
        ix.upsert_microservice("member-1", key("s0000"), done);
    });
    let server = Server::start(hub.clone(), |_| {}).await;
    let mut c = server.client().await;
    let get = pb::GetMicroserviceRequest {
        namespace: "shop".into(),
        name: "s0000".into(),
    };
    let wait = pb::WaitForRolloutRequest {
        namespace: "shop".into(),
        name: "s0000".into(),
        target: Some(pb::wait_for_rollout_request::Target::Image("a:1".into())),
        clusters: vec![],
        timeout: None,
    };
    let codes = [
        c.list_clusters(pb::ListClustersRequest {}).await.err(),
        c.get_microservice(get.clone()).await.err(),
        c.list_microservices(pb::ListMicroservicesRequest::default())
            .await
            .err(),
        c.watch_microservices(request("", "", 0, "")).await.err(),
        c.wait_for_rollout(wait.clone()).await.err(),
    ]
    .map(|e| e.map(|s| s.code()));
    assert_eq!(codes, [Some(tonic::Code::Unavailable); 5], "{codes:?}");

    hub.update(|ix| ix.registry_read());
    c.list_clusters(pb::ListClustersRequest {})
        .await
        .expect("clusters");
    c.get_microservice(get).await.expect("get");
    let first = first_progress(&mut c, wait.clone()).await;
    assert_eq!(
        first.result,
        pb::RolloutResult::Succeeded as i32,
        "{first:?}"
    );

    // A registered cluster this replica has not listed: the object may be
    // there, so Get is not NOT_FOUND, and a follow-mode wait is not done.
    hub.update(|ix| ix.update_cluster("member-2", "file", |i| i.reach = Reach::Connecting));
    let missing = c
        .get_microservice(pb::GetMicroserviceRequest {
            namespace: "shop".into(),
            name: "nowhere".into(),
        })
        .await
        .expect_err("not found yet");
    assert_eq!(missing.code(), tonic::Code::Unavailable, "{missing:?}");
    assert!(missing.message().contains("member-2"), "{missing:?}");
    let first = first_progress(&mut c, wait).await;
    assert_eq!(
        first.result,
        pb::RolloutResult::InProgress as i32,
        "{first:?}"
    );
    let m2 = first.clusters.iter().find(|e| e.cluster == "member-2");
    assert_eq!(
        m2.map(|e| e.reason.as_str()),
        Some("NotListed"),
        "{first:?}"
    );
}

/// The first progress a wait sends.
async fn first_progress(c: &mut Client, wait: pb::WaitForRolloutRequest) -> pb::RolloutProgress {
    let mut s = c.wait_for_rollout(wait).await.expect("wait").into_inner();
    timeout(Duration::from_secs(10), s.next())
        .await
        .expect("an answer")
        .expect("open")
        .expect("progress")
}
