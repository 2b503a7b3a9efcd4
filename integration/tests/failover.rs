//! Workload failover on the local fleet (#32): a FleetMicroservice with
//! `numberOfClusters: 2` over the three real members runs on exactly two;
//! a member that stops, or whose service stops being Available, is
//! replaced by the third, and the replaced cluster's Microservice is
//! removed only once it answers and its replacement is Available. Each
//! answer is read from the apiservers: the members' objects, their audit
//! logs and the home cluster's Events.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};
use support::replicas::MEMBERS;
use support::rollout::*;
use support::{StoppedMember, eventually, from_json};

use flotilla::rollout::spec::{FleetMicroservice, PlacementStatus, Role, RolloutPhase};

/// Tests that stop a member or hold its traffic run one at a time.
static MEMBERS_UP: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn counted(name: &str, n: usize, failover: Value) -> Value {
    let mut m = fleet_microservice(name, "ghcr.io/acme/api:1", json!({}));
    m["spec"]["placement"] = json!({"numberOfClusters": n, "failover": failover});
    m
}

fn placement(f: &FleetMicroservice) -> PlacementStatus {
    f.status
        .as_ref()
        .and_then(|s| s.placement.clone())
        .unwrap_or_default()
}

fn chosen(p: &PlacementStatus) -> Vec<String> {
    p.clusters
        .iter()
        .filter(|c| c.role == Role::Chosen)
        .map(|c| c.name.clone())
        .collect()
}

/// The members holding `name` among those that answer.
async fn holders(fleet: &RolloutFleet, name: &str, skip: Option<&str>) -> Vec<String> {
    let mut out = Vec::new();
    for m in MEMBERS.iter().filter(|m| Some(**m) != skip) {
        if fleet
            .member_api(m)
            .get_opt(name)
            .await
            .expect("read member")
            .is_some()
        {
            out.push(m.to_string());
        }
    }
    out
}

fn member(name: &str) -> &'static str {
    MEMBERS.iter().find(|m| **m == name).expect("a member")
}

/// Created and Complete on exactly two members, which the placement names.
async fn placed(fleet: &RolloutFleet, failover: Value) -> (FleetMicroservice, Vec<String>) {
    placed_on(fleet, 2, failover).await
}

/// Created and Complete on exactly `n` members, which the placement names.
async fn placed_on(
    fleet: &RolloutFleet,
    n: usize,
    failover: Value,
) -> (FleetMicroservice, Vec<String>) {
    fleet.create(counted("api", n, failover)).await;
    let f = fleet
        .wait_phase("api", RolloutPhase::Complete, Duration::from_secs(120))
        .await;
    let mut on = chosen(&placement(&f));
    on.sort();
    assert_eq!(on.len(), n, "{:?}", f.status);
    assert_eq!(
        holders(fleet, "api", None).await,
        on,
        "exactly the chosen run it"
    );
    (f, on)
}

/// The running revision, the first chosen member (the victim) and the
/// member left out (the spare).
fn roles(f: &FleetMicroservice, on: &[String]) -> (String, &'static str, &'static str) {
    let good = f
        .status
        .clone()
        .unwrap()
        .last_good_revision
        .expect("a good revision");
    let victim = member(&on[0]);
    let spare = *MEMBERS
        .iter()
        .find(|m| !on.contains(&m.to_string()))
        .unwrap();
    (good, victim, spare)
}

/// When the member's Microservice turned Available, by its condition.
async fn available_since(fleet: &RolloutFleet, m: &str) -> jiff::Timestamp {
    let ms = fleet.member_api(m).get("api").await.expect("replacement");
    let st = ms.status.expect("status");
    let c = flotilla::domain::conditions::find(&st.conditions, "Available").expect("Available");
    assert_eq!(c.status, "True");
    c.last_transition_time.0
}

/// Watches, from the moment it is made, for `spare`'s Microservice to turn
/// done and `victim`'s to go; returns when both happened, in order seen.
struct Order {
    task: tokio::task::JoinHandle<(Instant, Instant)>,
}

impl Order {
    fn watch(fleet: &RolloutFleet, victim: &str, spare: &str) -> Self {
        let (v, s) = (fleet.member_api(victim), fleet.member_api(spare));
        let task = tokio::spawn(async move {
            let (mut gone, mut available) = (None, None);
            loop {
                let now = Instant::now();
                if available.is_none()
                    && s.get_opt("api")
                        .await
                        .ok()
                        .flatten()
                        .is_some_and(|m| done(&m))
                {
                    available = Some(now);
                }
                if gone.is_none() && v.get_opt("api").await.is_ok_and(|m| m.is_none()) {
                    gone = Some(now);
                }
                if let (Some(a), Some(g)) = (available, gone) {
                    return (a, g);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        Order { task }
    }

    /// The replaced cluster's Microservice went no earlier than its
    /// replacement was seen available.
    async fn check(self) {
        let (available, gone) = tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("both seen")
            .expect("watch");
        assert!(
            gone >= available,
            "removed {:?} before its replacement was available",
            available - gone
        );
    }
}

/// Waits for `victim`'s Microservice to go, then checks how it went.
async fn removed(
    fleet: &RolloutFleet,
    victim: &str,
    replaced_at: jiff::Timestamp,
    available: jiff::Timestamp,
) {
    let api = fleet.member_api(victim);
    eventually(
        &format!("{victim}'s Microservice removed"),
        Duration::from_secs(90),
        || {
            let api = api.clone();
            async move { api.get_opt("api").await.ok()?.is_none().then_some(()) }
        },
    )
    .await;
    removed_after(victim, &fleet.namespace, replaced_at, available);
}

/// The one delete of `api` in `m`, from its audit log, after the
/// replacement turned Available; and nothing written there since it was
/// replaced but that delete.
fn removed_after(m: &str, ns: &str, replaced_at: jiff::Timestamp, available: jiff::Timestamp) {
    let writes: Vec<FleetWrite> = fleet_writes(m, ns)
        .into_iter()
        .filter(|w| w.name == "api" && w.received > replaced_at)
        .collect();
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(writes[0].verb, "delete", "{writes:?}");
    // The condition's stamp keeps whole seconds.
    assert!(
        writes[0].received >= available,
        "removed at {} before its replacement was available at {available}",
        writes[0].received
    );
}

async fn events(fleet: &RolloutFleet, reason: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(fleet.home.clone(), &fleet.namespace);
    let list = api.list(&ListParams::default()).await.expect("events");
    list.items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

#[tokio::test]
async fn a_stopped_member_is_replaced_and_removed_only_after_its_replacement_is_available() {
    let _one = MEMBERS_UP.lock().await;
    let fleet = rollout_fleet("fo-stop", &[]).await;
    let (f, on) = placed(&fleet, json!({"unreachableAfter": "10s"})).await;
    let (good, victim, spare) = roles(&f, &on);

    let at = Instant::now();
    let replaced_at = jiff::Timestamp::now();
    let stopped = StoppedMember::crash(victim);
    // The replacement runs the running revision, Available. How soon is
    // a figure (unreachableAfter + a few seconds here), not a bound: a
    // loaded machine stretches it.
    fleet
        .done_at(spare, "api", &good, Duration::from_secs(90))
        .await;
    println!(
        "figure: member stop to replacement Available: {:?}",
        at.elapsed()
    );
    let f = fleet.api().get("api").await.unwrap();
    let p = placement(&f);
    assert_eq!(p.history.len(), 1, "{p:?}");
    assert_eq!(
        (
            p.history[0].from.as_str(),
            p.history[0].to.as_str(),
            p.history[0].reason.as_str()
        ),
        (victim, spare, "Unreachable")
    );
    let gone = p
        .clusters
        .iter()
        .find(|c| c.name == victim)
        .expect("remembered");
    assert_eq!(gone.role, Role::Replaced);
    assert_eq!(events(&fleet, "FailedOver").await.len(), 1);
    let available = available_since(&fleet, spare).await;
    // The CLI says it, over a replica's gRPC API.
    let url = fleet.replicas.grpc_url("r1");
    let (code, out, err) = flotilla(
        &[
            "placement",
            &format!("{}/api", fleet.namespace),
            "-o",
            "json",
            "--server",
            &url,
        ],
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let j: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(j["placement"]["history"][0]["from"], victim, "{j}");
    assert_eq!(j["placement"]["history"][0]["to"], spare, "{j}");
    let (code, out, err) = flotilla(
        &[
            "placement",
            &format!("{}/api", fleet.namespace),
            "--server",
            &url,
        ],
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("Replaced") && out.contains(&format!("replaced by {spare}")),
        "{out}"
    );

    // Back: its Microservice goes, now that the replacement is available.
    drop(stopped);
    removed(&fleet, victim, replaced_at, available).await;
    let f = fleet
        .wait_phase("api", RolloutPhase::Complete, Duration::from_secs(60))
        .await;
    let mut now_on = chosen(&placement(&f));
    now_on.sort();
    assert_eq!(
        holders(&fleet, "api", None).await,
        now_on,
        "settled to exactly two"
    );
    assert!(!now_on.contains(&victim.to_string()), "failback Never");
}

/// A member whose service stops being Available (its pods cannot be
/// recreated: an admission policy refuses them) is replaced after
/// `unavailableAfter`, outside any rollout; it still answers, so its
/// Microservice is removed as soon as the replacement is Available.
#[tokio::test]
async fn a_member_whose_service_fails_is_replaced_after_unavailable_after() {
    let _one = MEMBERS_UP.lock().await;
    let fleet = rollout_fleet("fo-unavail", &[]).await;
    let ns = fleet.namespace.clone();
    let (f, on) = placed(
        &fleet,
        json!({"unreachableAfter": "10m", "unavailableAfter": "15s"}),
    )
    .await;
    let (good, victim, spare) = roles(&f, &on);

    let client = fleet.members[victim].clone();
    let _refused =
        support::policy::Policy::apply_to_all(&client, victim, &ns, "CREATE", "pods", "Forbidden")
            .await;
    // In force once a pod made by hand is refused.
    let probe: Pod = from_json(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
        "spec": {"containers": [{"name": "c", "image": "ghcr.io/acme/probe:1"}]},
    }));
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    eventually("pods refused", Duration::from_secs(30), || {
        let pods = pods.clone();
        let probe = probe.clone();
        async move {
            match pods.create(&PostParams::default(), &probe).await {
                Err(kube::Error::Api(s)) if s.code == 403 => Some(()),
                Ok(_) => {
                    pods.delete("probe", &DeleteParams::default().grace_period(0))
                        .await
                        .ok();
                    None
                }
                Err(_) => None,
            }
        }
    })
    .await;
    let replaced_at = jiff::Timestamp::now();
    let order = Order::watch(&fleet, victim, spare);
    pods.delete_collection(
        &DeleteParams::default().grace_period(0),
        &ListParams::default(),
    )
    .await
    .expect("delete pods");
    let at = Instant::now();
    eventually("no pod comes back", Duration::from_secs(30), || {
        let pods = pods.clone();
        async move {
            pods.list(&ListParams::default())
                .await
                .ok()?
                .items
                .is_empty()
                .then_some(())
        }
    })
    .await;
    fleet
        .done_at(spare, "api", &good, Duration::from_secs(90))
        .await;
    println!(
        "figure: service failure to replacement Available: {:?}",
        at.elapsed()
    );
    let p = placement(&fleet.api().get("api").await.unwrap());
    assert_eq!(p.history.len(), 1, "{p:?}");
    assert_eq!(
        (p.history[0].from.as_str(), p.history[0].reason.as_str()),
        (victim, "Unavailable")
    );
    let available = available_since(&fleet, spare).await;
    removed(&fleet, victim, replaced_at, available).await;
    order.check().await;
    assert_eq!(holders(&fleet, "api", None).await.len(), 2);
}

/// Waits until the placement says `victim` is unreachable, or not.
async fn seen_unreachable(api: &Api<FleetMicroservice>, victim: &str, is: bool, blip: usize) {
    eventually(
        &format!("blip {blip}: {victim} seen unreachable: {is}"),
        Duration::from_secs(30),
        || {
            let api = api.clone();
            async move {
                let p = placement(&api.get("api").await.ok()?);
                let me = p.clusters.iter().find(|c| c.name == victim)?;
                (me.unreachable_since.is_some() == is).then_some(())
            }
        },
    )
    .await;
}

/// Ten blips shorter than `unreachableAfter` (each member reached through a
/// proxy that holds every byte; each blip lasts until the placement has
/// seen the cluster unreachable): no failover.
#[tokio::test]
async fn blips_shorter_than_unreachable_after_move_nothing() {
    let _one = MEMBERS_UP.lock().await;
    let mut gates = std::collections::BTreeMap::new();
    for m in MEMBERS {
        let upstream = support::kubeconfig_via(m, 0).1;
        gates.insert(m, support::gate::Gate::start(upstream).await);
    }
    let kubeconfigs: Vec<(&str, String)> = gates
        .iter()
        .map(|(m, g)| (*m, support::kubeconfig_via(m, g.port).0))
        .collect();
    let fleet = rollout_fleet_prepared("fo-blips", &[], |replicas| {
        for (m, kc) in &kubeconfigs {
            std::fs::write(replicas.dir.join(format!("{m}.yaml")), kc).expect("kubeconfig");
        }
    })
    .await;
    let (_, on) = placed(&fleet, json!({"unreachableAfter": "30s"})).await;
    let victim = member(&on[0]);
    let api = fleet.api();
    let mut longest = Duration::ZERO;
    for blip in 0..10 {
        gates[victim].hold();
        let held = Instant::now();
        seen_unreachable(&api, victim, true, blip).await;
        gates[victim].release();
        longest = longest.max(held.elapsed());
        seen_unreachable(&api, victim, false, blip).await;
    }
    println!("figure: 10 blips, the longest held {longest:?}");
    assert!(
        longest < Duration::from_secs(30),
        "each blip shorter than unreachableAfter"
    );
    let f = fleet.api().get("api").await.unwrap();
    let p = placement(&f);
    assert!(p.history.is_empty(), "{p:?}");
    let mut now_on = chosen(&p);
    now_on.sort();
    assert_eq!(now_on, on);
    assert!(events(&fleet, "FailedOver").await.is_empty());
}

/// kill -9 of the rollout leader while a failover's timer runs: the
/// successor carries the timer on from the status and completes the
/// failover; the replacement is written once, no other member is written
/// at all (never more than N + 1 running, N = 1 here), and the replaced
/// member's Microservice is removed once, when it is back.
#[tokio::test]
async fn a_killed_rollout_leaders_successor_completes_the_failover() {
    let _one = MEMBERS_UP.lock().await;
    let mut fleet = rollout_fleet("fo-kill", &[]).await;
    let ns = fleet.namespace.clone();
    // Long enough that the test sees the timer running before it ends.
    let (f, on) = placed_on(&fleet, 1, json!({"unreachableAfter": "20s"})).await;
    let good = f
        .status
        .unwrap()
        .last_good_revision
        .expect("a good revision");
    let victim = member(&on[0]);
    let before = jiff::Timestamp::now();

    let stopped = StoppedMember::crash(victim);
    let api = fleet.api();
    seen_unreachable(&api, victim, true, 0).await;
    let leader = fleet.rollout_leader().await;
    fleet.replicas.kill_9(&leader);
    let killed = Instant::now();
    let spare = eventually("the failover decided", Duration::from_secs(60), || {
        let api = api.clone();
        async move {
            let p = placement(&api.get("api").await.ok()?);
            p.history.first().map(|h| h.to.clone())
        }
    })
    .await;
    let spare = member(&spare);
    fleet
        .done_at(spare, "api", &good, Duration::from_secs(60))
        .await;
    println!(
        "figure: leader killed to replacement Available: {:?}",
        killed.elapsed()
    );
    let successor = fleet.rollout_leader().await;
    assert_ne!(successor, leader, "decided by the successor");
    let third = *MEMBERS
        .iter()
        .find(|m| ![victim, spare].contains(m))
        .unwrap();

    drop(stopped);
    let available = available_since(&fleet, spare).await;
    removed(&fleet, victim, before, available).await;
    let writes = |m: &str| -> Vec<String> {
        fleet_writes(m, &ns)
            .into_iter()
            .filter(|w| w.name == "api" && w.received > before)
            .map(|w| w.verb)
            .collect()
    };
    assert_eq!(
        writes(spare),
        vec!["create"],
        "the replacement written once"
    );
    assert!(
        writes(third).is_empty(),
        "nothing else written: {:?}",
        writes(third)
    );
    assert_eq!(holders(&fleet, "api", None).await, vec![spare.to_string()]);
}
