//! Traces to a real OTLP receiver (a tonic TraceService in this test),
//! Prometheus metrics and health endpoints, from `flotilla run` replicas.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Api;
use kube::api::PostParams;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use support::replicas::*;
use support::{eventually, http_get, kubeconfig_path, microservice, wait_all_true};

use flotilla::api::client::{ClientOptions, connect};
use flotilla::api::pb;
use flotilla::crd::Microservice;

/// A span as received, with its resource's attributes.
#[derive(Clone, Debug)]
struct Received {
    resource: BTreeMap<String, String>,
    span: Span,
}

#[derive(Clone, Default)]
struct Receiver(Arc<Mutex<Vec<Received>>>);

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => s.clone(),
                Some(Value::IntValue(i)) => i.to_string(),
                Some(Value::BoolValue(b)) => b.to_string(),
                Some(Value::DoubleValue(d)) => d.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), v)
        })
        .collect()
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut all = self.0.lock().unwrap();
        for rs in request.into_inner().resource_spans {
            let resource = attributes(&rs.resource.map(|r| r.attributes).unwrap_or_default());
            for ss in rs.scope_spans {
                for span in ss.spans {
                    all.push(Received {
                        resource: resource.clone(),
                        span,
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Receiver {
    async fn start() -> (Self, u16) {
        let receiver = Receiver::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let service = TraceServiceServer::new(receiver.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        (receiver, port)
    }

    fn spans(&self) -> Vec<Received> {
        self.0.lock().unwrap().clone()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn reconcile_and_grpc_spans_reach_a_real_otlp_receiver() {
    let (receiver, port) = Receiver::start().await;
    let clients = member_clients().await;
    let (ns, _guards) = namespaces(&clients, "otel").await;
    let mut replicas = Replicas::new(&ns, &["member-1"]);
    replicas.env = vec![
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
            format!("http://127.0.0.1:{port}"),
        ),
        ("OTEL_SERVICE_NAME".into(), "flotilla-under-test".into()),
        (
            "OTEL_RESOURCE_ATTRIBUTES".into(),
            "deployment.environment=test".into(),
        ),
        ("OTEL_BSP_SCHEDULE_DELAY".into(), "200".into()),
    ];
    replicas.start("r1");
    let member1 = clients["member-1"].clone();
    eventually("r1 leads member-1", Duration::from_secs(30), || async {
        holder(&member1, &replicas.lease_name())
            .await
            .filter(|h| h == "r1")
    })
    .await;
    let api = Api::<Microservice>::namespaced(member1.clone(), &ns);
    api.create(
        &PostParams::default(),
        &microservice("traced", "ghcr.io/acme/t:1", 8080, Some(1)),
    )
    .await
    .expect("create");
    wait_all_true(&api, 1, "Reconciled", Duration::from_secs(60)).await;

    let reconcile = eventually(
        "a reconcile span for traced",
        Duration::from_secs(30),
        || async {
            receiver.spans().into_iter().find(|r| {
                let a = attributes(&r.span.attributes);
                r.span.name == "reconcile"
                    && a.get("flotilla.microservice").map(String::as_str) == Some("traced")
            })
        },
    )
    .await;
    let a = attributes(&reconcile.span.attributes);
    assert_eq!(a["k8s.cluster.name"], "member-1");
    assert_eq!(a["k8s.namespace.name"], ns);
    assert_eq!(a["flotilla.generation"], "1");
    assert!(a.contains_key("outcome"), "{a:?}");
    assert_eq!(reconcile.resource["service.name"], "flotilla-under-test");
    assert_eq!(reconcile.resource["flotilla.replica.id"], "r1");
    assert_eq!(reconcile.resource["flotilla.fleet.name"], replicas.fleet);
    assert_eq!(reconcile.resource["deployment.environment"], "test");
    // The API writes are child spans of a reconcile of this object.
    eventually(
        "a write span under a reconcile of traced",
        Duration::from_secs(30),
        || async {
            let spans = receiver.spans();
            let reconciles: Vec<&Span> = spans
                .iter()
                .map(|r| &r.span)
                .filter(|s| {
                    s.name == "reconcile"
                        && attributes(&s.attributes)
                            .get("flotilla.microservice")
                            .map(String::as_str)
                            == Some("traced")
                })
                .collect();
            spans
                .iter()
                .any(|r| {
                    r.span.name == "k8s.write"
                        && reconciles.iter().any(|p| {
                            p.span_id == r.span.parent_span_id && p.trace_id == r.span.trace_id
                        })
                })
                .then_some(())
        },
    )
    .await;

    // A call that carries a traceparent is served in that trace.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent_id = "00f067aa0ba902b7";
    let mut client = eventually("gRPC up", Duration::from_secs(30), || async {
        connect(&ClientOptions {
            server: replicas.grpc_url("r1"),
            ..Default::default()
        })
        .await
        .ok()
    })
    .await;
    let mut request = tonic::Request::new(pb::GetMicroserviceRequest {
        namespace: ns.clone(),
        name: "traced".into(),
    });
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{trace_id}-{parent_id}-01").parse().unwrap(),
    );
    eventually("the index has traced", Duration::from_secs(30), || {
        let mut client = client.clone();
        let ns = ns.clone();
        async move {
            client
                .get_microservice(pb::GetMicroserviceRequest {
                    namespace: ns,
                    name: "traced".into(),
                })
                .await
                .ok()
        }
    })
    .await;
    client.get_microservice(request).await.expect("get");
    let server = eventually(
        "the server span in the caller's trace",
        Duration::from_secs(30),
        || async {
            receiver
                .spans()
                .into_iter()
                .find(|r| hex(&r.span.trace_id) == trace_id)
        },
    )
    .await;
    assert_eq!(server.span.name, "flotilla.v1.FleetStatus/GetMicroservice");
    assert_eq!(hex(&server.span.parent_span_id), parent_id);
    assert_eq!(server.span.kind, 2, "SPAN_KIND_SERVER");
    let a = attributes(&server.span.attributes);
    assert_eq!(a["rpc.system"], "grpc");
    assert_eq!(a["rpc.service"], "flotilla.v1.FleetStatus");
    assert_eq!(a["rpc.method"], "GetMicroservice");
    assert_eq!(a["rpc.grpc.status_code"], "0");
    // Who called (#34): no credential is configured here.
    assert_eq!(a["enduser.id"], "anonymous");

    // WaitForRollout links its span to the reconcile that concluded the
    // cluster, since this replica ran it.
    let wait_trace = "5bf92f3577b34da6a3ce929d0e0e4737";
    let mut request = tonic::Request::new(pb::WaitForRolloutRequest {
        namespace: ns.clone(),
        name: "traced".into(),
        target: Some(pb::wait_for_rollout_request::Target::Image(
            "ghcr.io/acme/t:1".into(),
        )),
        ..Default::default()
    });
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{wait_trace}-{parent_id}-01").parse().unwrap(),
    );
    let mut stream = client
        .wait_for_rollout(request)
        .await
        .expect("wait")
        .into_inner();
    let mut last = None;
    while let Some(p) = futures::StreamExt::next(&mut stream).await {
        last = Some(p.expect("progress"));
    }
    assert_eq!(last.unwrap().result, pb::RolloutResult::Succeeded as i32);
    eventually(
        "the wait span links to a reconcile of traced",
        Duration::from_secs(30),
        || async {
            let spans = receiver.spans();
            let wait = spans.iter().find(|r| {
                r.span.name == "flotilla.wait_for_rollout" && hex(&r.span.trace_id) == wait_trace
            })?;
            let reconciles: Vec<&Span> = spans
                .iter()
                .map(|r| &r.span)
                .filter(|s| {
                    s.name == "reconcile"
                        && attributes(&s.attributes)
                            .get("flotilla.microservice")
                            .map(String::as_str)
                            == Some("traced")
                })
                .collect();
            wait.span
                .links
                .iter()
                .any(|l| {
                    reconciles
                        .iter()
                        .any(|r| r.span_id == l.span_id && r.trace_id == l.trace_id)
                })
                .then_some(())
        },
    )
    .await;
}

/// Every sample line of an OpenMetrics (or Prometheus) text page: (name, labels, value).
fn samples(text: &str) -> Vec<(String, BTreeMap<String, String>, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (series, value) = l
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("bad line {l:?}"));
            let value: f64 = value
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {l:?}"));
            let (name, labels) = match series.split_once('{') {
                None => (series.to_string(), BTreeMap::new()),
                Some((name, rest)) => {
                    let inner = rest
                        .strip_suffix('}')
                        .unwrap_or_else(|| panic!("bad labels in {l:?}"));
                    let labels = inner
                        .split(',')
                        .map(|kv| {
                            let (k, v) = kv
                                .split_once('=')
                                .unwrap_or_else(|| panic!("bad label in {l:?}"));
                            (k.to_string(), v.trim_matches('"').to_string())
                        })
                        .collect();
                    (name.to_string(), labels)
                }
            };
            (name, labels, value)
        })
        .collect()
}

#[tokio::test]
async fn metrics_count_reconciles_match_the_leases_and_name_no_objects() {
    let clients = member_clients().await;
    let (ns, _guards) = namespaces(&clients, "metrics").await;
    let mut replicas = Replicas::new(&ns, &["member-1", "member-2"]);
    replicas.start("r1");
    replicas.start("r2");
    let two: BTreeMap<&str, kube::Client> = clients
        .iter()
        .filter(|(m, _)| ["member-1", "member-2"].contains(*m))
        .map(|(m, c)| (*m, c.clone()))
        .collect();
    let held = balanced(&two, &replicas.lease_name(), &["r1", "r2"]).await;
    let api = Api::<Microservice>::namespaced(clients["member-1"].clone(), &ns);
    let secret_name = "zz-metrics-probe";
    api.create(
        &PostParams::default(),
        &microservice(secret_name, "ghcr.io/acme/m:1", 8080, Some(1)),
    )
    .await
    .expect("create");
    wait_all_true(&api, 1, "Reconciled", Duration::from_secs(60)).await;

    let leader = held["member-1"].clone();
    let page = eventually(
        "reconciles counted on member-1's leader",
        Duration::from_secs(30),
        || async {
            let (code, body) =
                http_get(&format!("{}/metrics", replicas.metrics_url(&leader))).await?;
            assert_eq!(code, 200);
            let reconciled: f64 = samples(&body)
                .iter()
                .filter(|(n, l, _)| n == "flotilla_reconcile_total" && l["cluster"] == "member-1")
                .map(|(_, _, v)| v)
                .sum();
            (reconciled > 0.0).then_some(body)
        },
    )
    .await;
    let parsed = samples(&page);
    for (name, labels, _) in &parsed {
        for v in labels.values() {
            assert!(
                !v.contains(secret_name) && !v.contains(&ns),
                "{name} carries an object name: {labels:?}"
            );
        }
    }
    let has = |name: &str| parsed.iter().any(|(n, _, _)| n == name);
    for name in [
        "flotilla_reconcile_duration_seconds_count",
        "flotilla_api_requests_total",
        "flotilla_cluster_leader",
        "flotilla_lease_transitions_total",
        "flotilla_cluster_reachable",
    ] {
        assert!(has(name), "{name} missing:\n{page}");
    }
    let writes: f64 = parsed
        .iter()
        .filter(|(n, l, _)| {
            n == "flotilla_api_requests_total"
                && l["cluster"] == "member-1"
                && l["verb"] == "create"
        })
        .map(|(_, _, v)| v)
        .sum();
    assert!(
        writes >= 2.0,
        "the Deployment and Service creates are counted"
    );

    // The leadership gauges agree with the Leases, on both replicas.
    for id in ["r1", "r2"] {
        let (_, body) = http_get(&format!("{}/metrics", replicas.metrics_url(id)))
            .await
            .expect("scrape");
        let parsed = samples(&body);
        for member in ["member-1", "member-2"] {
            let gauge = parsed
                .iter()
                .find(|(n, l, _)| n == "flotilla_cluster_leader" && l["cluster"] == member)
                .map(|(_, _, v)| *v);
            let expected = if held[member] == id { 1.0 } else { 0.0 };
            assert_eq!(gauge, Some(expected), "{id} on {member}");
            let reachable = parsed
                .iter()
                .find(|(n, l, _)| n == "flotilla_cluster_reachable" && l["cluster"] == member)
                .map(|(_, _, v)| *v);
            assert_eq!(reachable, Some(1.0), "{id} on {member}");
        }
    }

    // gRPC calls are counted by method and code, unknown paths as "unknown".
    let client = connect(&ClientOptions {
        server: replicas.grpc_url("r1"),
        ..Default::default()
    })
    .await
    .expect("connect");
    // NOT_FOUND once the replica has listed both members (UNAVAILABLE before).
    eventually("a NotFound answer", Duration::from_secs(30), || {
        let (mut client, ns) = (client.clone(), ns.clone());
        async move {
            let e = client
                .get_microservice(pb::GetMicroserviceRequest {
                    namespace: ns,
                    name: "nope".into(),
                })
                .await
                .err()?;
            (e.code() == tonic::Code::NotFound).then_some(())
        }
    })
    .await;
    let (_, body) = http_get(&format!("{}/metrics", replicas.metrics_url("r1")))
        .await
        .expect("scrape");
    assert!(
        samples(&body)
            .iter()
            .any(|(n, l, v)| n == "flotilla_grpc_requests_total"
                && l["method"] == "flotilla.v1.FleetStatus/GetMicroservice"
                && l["code"] == "NotFound"
                && *v >= 1.0),
        "{body}"
    );
}

#[tokio::test]
async fn readyz_is_503_until_every_cluster_has_synced_or_is_given_up() {
    // An "apiserver" that accepts connections and never answers.
    let hanging = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hang_port = hanging.local_addr().unwrap().port();
    let clients = member_clients().await;
    let (ns, _guards) = namespaces(&clients, "readyz").await;
    let mut replicas = Replicas::new(&ns, &["member-1"]);
    let kubeconfig = std::fs::read_to_string(kubeconfig_path("member-1")).unwrap();
    let rewritten: String = kubeconfig
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("server:") {
                format!("    server: https://127.0.0.1:{hang_port}")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let silent = replicas.dir.join("silent.yaml");
    std::fs::write(&silent, rewritten).unwrap();
    replicas.start("r1");
    let url = replicas.metrics_url("r1");
    eventually("/healthz answers", Duration::from_secs(30), || async {
        http_get(&format!("{url}/healthz"))
            .await
            .filter(|(c, _)| *c == 200)
    })
    .await;
    // member-1 syncs quickly; the silent cluster never does, so not ready.
    let mut client = eventually("gRPC up", Duration::from_secs(30), || async {
        connect(&ClientOptions {
            server: replicas.grpc_url("r1"),
            ..Default::default()
        })
        .await
        .ok()
    })
    .await;
    eventually("member-1 synced", Duration::from_secs(30), || {
        let mut client = client.clone();
        async move {
            let clusters = client
                .list_clusters(pb::ListClustersRequest {})
                .await
                .ok()?
                .into_inner()
                .clusters;
            clusters
                .iter()
                .any(|c| c.name == "member-1" && c.synced)
                .then_some(())
        }
    })
    .await;
    // While the silent cluster is still being contacted, the replica is not ready.
    let mut checked = 0;
    loop {
        let clusters = client
            .list_clusters(pb::ListClustersRequest {})
            .await
            .unwrap()
            .into_inner()
            .clusters;
        let s = clusters
            .iter()
            .find(|c| c.name == "silent")
            .expect("silent registered");
        assert!(!s.synced);
        if s.reachability != pb::Reachability::Connecting as i32 {
            break;
        }
        let (code, body) = http_get(&format!("{url}/readyz")).await.expect("readyz");
        if code != 503 {
            // Given up on between the two calls, it may rightly be ready;
            // still connecting after the answer, it may not.
            let clusters = client
                .list_clusters(pb::ListClustersRequest {})
                .await
                .unwrap()
                .into_inner()
                .clusters;
            let still = clusters.iter().any(|c| {
                c.name == "silent" && c.reachability == pb::Reachability::Connecting as i32
            });
            assert!(
                !still,
                "ready ({code}) while a cluster has not synced: {body}"
            );
            break;
        }
        checked += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(checked >= 1, "the silent cluster was never seen connecting");
    // Given up on after the first-contact timeout: Unreachable, which no
    // longer holds readiness back.
    let clusters = client
        .list_clusters(pb::ListClustersRequest {})
        .await
        .unwrap()
        .into_inner()
        .clusters;
    let s = clusters.iter().find(|c| c.name == "silent").unwrap();
    assert_eq!(
        s.reachability,
        pb::Reachability::Unreachable as i32,
        "{s:?}"
    );
    assert!(s.reason.contains("no answer"), "{s:?}");
    eventually(
        "/readyz 200 with the silent cluster Unreachable",
        Duration::from_secs(30),
        || async {
            http_get(&format!("{url}/readyz"))
                .await
                .filter(|(c, _)| *c == 200)
        },
    )
    .await;

    // Removing it is prompt, although it never answered.
    std::fs::remove_file(&silent).unwrap();
    eventually("silent deregistered", Duration::from_secs(30), || {
        let mut client = client.clone();
        async move {
            let clusters = client
                .list_clusters(pb::ListClustersRequest {})
                .await
                .ok()?
                .into_inner()
                .clusters;
            (!clusters.iter().any(|c| c.name == "silent")).then_some(())
        }
    })
    .await;
    eventually("/readyz 200", Duration::from_secs(30), || async {
        http_get(&format!("{url}/readyz"))
            .await
            .filter(|(c, _)| *c == 200)
    })
    .await;
    drop(hanging);
}

#[tokio::test]
async fn sigterm_ends_open_streams_unavailable_exits_in_its_grace_and_flushes_the_last_spans() {
    let (receiver, port) = Receiver::start().await;
    let clients = member_clients().await;
    let (ns, _guards) = namespaces(&clients, "otel-term").await;
    let mut replicas = Replicas::new(&ns, &["member-1"]);
    // Spans leave only when flushed: the batch timer never fires first.
    replicas.env = vec![
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
            format!("http://127.0.0.1:{port}"),
        ),
        ("OTEL_BSP_SCHEDULE_DELAY".into(), "600000".into()),
    ];
    replicas.start("r1");
    let mut client = eventually("gRPC up", Duration::from_secs(30), || async {
        let mut c = connect(&ClientOptions {
            server: replicas.grpc_url("r1"),
            ..Default::default()
        })
        .await
        .ok()?;
        c.list_clusters(pb::ListClustersRequest {}).await.ok()?;
        Some(c)
    })
    .await;
    let mut streams = Vec::new();
    for _ in 0..3 {
        let mut s = client
            .watch_microservices(pb::WatchMicroservicesRequest {
                namespace: ns.clone(),
                ..Default::default()
            })
            .await
            .expect("watch")
            .into_inner();
        loop {
            let e = futures::StreamExt::next(&mut s).await.unwrap().unwrap();
            if e.r#type == pb::WatchEventType::Synced as i32 {
                break;
            }
        }
        streams.push(s);
    }
    // The last span before the signal, marked by its trace id.
    let last_trace = "6bf92f3577b34da6a3ce929d0e0e4738";
    let mut request = tonic::Request::new(pb::ListClustersRequest {});
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{last_trace}-00f067aa0ba902b7-01")
            .parse()
            .unwrap(),
    );
    client.list_clusters(request).await.expect("list");
    assert!(
        !receiver
            .spans()
            .iter()
            .any(|r| hex(&r.span.trace_id) == last_trace),
        "exported before the flush: the test would prove nothing"
    );

    let signalled = std::time::Instant::now();
    let mut child = replicas.sigterm("r1");
    for mut s in streams {
        let end = tokio::time::timeout(Duration::from_secs(10), futures::StreamExt::next(&mut s))
            .await
            .expect("the stream ends within the grace")
            .expect("a status, not a silent end")
            .expect_err("an error status");
        assert_eq!(end.code(), tonic::Code::Unavailable, "{end:?}");
    }
    let exited = eventually("the process exits", Duration::from_secs(15), || {
        let status = child.try_wait().expect("wait");
        async move { status }
    })
    .await;
    let took = signalled.elapsed();
    assert!(exited.success(), "{exited:?}");
    println!("figure: SIGTERM to exit with 3 open streams {took:?}");
    assert!(
        receiver
            .spans()
            .iter()
            .any(|r| hex(&r.span.trace_id) == last_trace),
        "the last span was not flushed at exit"
    );
}

#[tokio::test]
async fn a_fleet_write_and_the_member_reconcile_it_caused_are_linked() {
    let (receiver, port) = Receiver::start().await;
    let clients = member_clients().await;
    let home = support::client("home").await;
    support::ensure_fleet_crd(&home).await;
    let (ns, _guards) = namespaces(&clients, "otel-fleet").await;
    let mut replicas = Replicas::new(&ns, &["member-1"]);
    replicas.env = vec![
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
            format!("http://127.0.0.1:{port}"),
        ),
        ("OTEL_BSP_SCHEDULE_DELAY".into(), "200".into()),
    ];
    replicas.start("r1");
    let fms: flotilla::rollout::spec::FleetMicroservice = support::from_json(serde_json::json!({
        "apiVersion": "platform.example.io/v1alpha1",
        "kind": "FleetMicroservice",
        "metadata": {"name": "traced"},
        "spec": {"template": {"image": "ghcr.io/acme/traced:1", "port": 8080, "replicas": 1}},
    }));
    Api::<flotilla::rollout::spec::FleetMicroservice>::namespaced(home, &ns)
        .create(&PostParams::default(), &fms)
        .await
        .expect("create FleetMicroservice");
    let named = |r: &Received, name: &str| {
        r.span.name == name
            && attributes(&r.span.attributes)
                .get("k8s.cluster.name")
                .is_some_and(|c| c == "member-1")
    };
    let (write, reconcile, gate) = eventually(
        "a rollout write, the reconcile linked to it, and a linked gate",
        Duration::from_secs(90),
        || async {
            let spans = receiver.spans();
            let write = spans.iter().find(|r| named(r, "rollout write"))?.clone();
            let reconcile = spans
                .iter()
                .find(|r| {
                    named(r, "reconcile")
                        && r.span.links.iter().any(|l| {
                            l.trace_id == write.span.trace_id && l.span_id == write.span.span_id
                        })
                })?
                .clone();
            let gate = spans
                .iter()
                .find(|r| named(r, "rollout gate") && !r.span.links.is_empty())?
                .clone();
            Some((write, reconcile, gate))
        },
    )
    .await;
    assert_eq!(
        attributes(&reconcile.span.attributes)
            .get("flotilla.microservice")
            .map(String::as_str),
        Some("traced")
    );
    assert_ne!(
        reconcile.span.trace_id, write.span.trace_id,
        "linked, not a child"
    );
    // The gate links to a reconcile span this replica exported.
    let spans = receiver.spans();
    assert!(gate.span.links.iter().any(|l| {
        spans
            .iter()
            .any(|r| r.span.name == "reconcile" && r.span.span_id == l.span_id)
    }));
    assert!(spans.iter().any(|r| r.span.name == "rollout step"));
}
