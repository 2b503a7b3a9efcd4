//! The nemesis at work: each planned fault applied at its time and taken
//! back after its length, every step logged with the time it happened.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use tokio::time::Instant;

use crate::check::{CanaryMove, Exit};
use crate::proxy::Proxy;
use crate::schedule::{Fault, LeaseKind, MEMBERS, Planned, REPLICAS, RESOURCES};
use crate::support::replicas::{Replicas, holder};
use crate::workload::{self, Record, Target};
use tokio::task::JoinHandle;

pub struct Bed {
    pub replicas: Mutex<Replicas>,
    pub urls: Arc<Mutex<BTreeMap<String, String>>>,
    pub proxies: BTreeMap<&'static str, Proxy>,
    /// Where the replicas read each member's labels.
    pub labels: PathBuf,
    pub canary: Mutex<Vec<CanaryMove>>,
    pub exits: Mutex<Vec<Exit>>,
    /// (time, what) for every fault step.
    pub log: Mutex<Vec<(Timestamp, String)>>,
    /// Processes the nemesis stopped and has not started again yet:
    /// members, or "registry".
    pub stopped: Mutex<Vec<String>>,
    /// One fault per resource at a time, even when stopping or starting a
    /// process takes longer than the plan allowed for.
    pub turns: [tokio::sync::Mutex<()>; RESOURCES],
    /// For the bursts of edits: where the workload writes and what it expects.
    pub target: Target,
    pub rec: Arc<Record>,
    /// The member Leases' name.
    pub member_lease: String,
    /// The replicas' watch-lag file (`FLOTILLA_WATCH_LAG_FILE`).
    pub watch_lag: PathBuf,
    /// When the registry's etcd was down: (stopped, started again).
    pub registry_down: Mutex<Vec<(tokio::time::Instant, tokio::time::Instant)>>,
    /// One burst of edits at a time: two at once (a late delivery beside a
    /// leader's pause) would race to set the burst Microservices' last
    /// image (the 30-minute soak's converged "violations").
    pub bursts: Arc<tokio::sync::Mutex<()>>,
    /// Members stopped, black-holed or held for late delivery: for
    /// `dns-withdrawn` and `failover-no-delete-unreachable`.
    pub downs: Mutex<Vec<crate::withdrawn::Down>>,
    /// When the DNS writer could not see: the registry or home down.
    pub blind: Mutex<Vec<(Timestamp, Timestamp)>>,
}

impl Bed {
    pub fn note(&self, what: String) {
        self.log.lock().unwrap().push((Timestamp::now(), what));
    }

    /// `member` was down from `from` until now (about to be healed).
    fn went_down(&self, member: &str, from: Timestamp) {
        self.downs.lock().unwrap().push(crate::withdrawn::Down {
            member: member.into(),
            from,
            to: Timestamp::now(),
        });
    }

    /// Moves `ring: canary` to `member`: off the old one first, so for a
    /// moment there is none (a wave with no canary waits) and never two.
    pub fn move_canary(&self, member: &str) {
        let old = self.canary.lock().unwrap().last().map(|m| m.member.clone());
        if let Some(old) = old.filter(|o| o != member) {
            std::fs::write(self.labels.join(format!("{old}.labels")), "ring: rest\n")
                .expect("labels");
        }
        std::fs::write(
            self.labels.join(format!("{member}.labels")),
            "ring: canary\n",
        )
        .expect("labels");
        self.canary.lock().unwrap().push(CanaryMove {
            at: Timestamp::now(),
            member: member.to_string(),
        });
    }

    fn refresh_urls(&self, r: &Replicas) {
        let mut urls = self.urls.lock().unwrap();
        for id in REPLICAS {
            urls.insert(id.to_string(), r.grpc_url(id));
        }
    }

    /// Replicas that exited without the nemesis asking: recorded, and
    /// started again so the run goes on.
    pub fn reap_unasked(&self) {
        let mut r = self.replicas.lock().unwrap();
        for id in REPLICAS {
            if let Some(status) = r.exit_within(id, Duration::ZERO) {
                self.exits.lock().unwrap().push(Exit {
                    replica: id.into(),
                    at: Timestamp::now(),
                    status: format!("{status}"),
                });
                r.start(id);
            }
        }
        self.refresh_urls(&r);
    }

    fn with_replicas<T>(&self, f: impl FnOnce(&mut Replicas) -> T) -> T {
        let mut r = self.replicas.lock().unwrap();
        let out = f(&mut r);
        self.refresh_urls(&r);
        out
    }
}

/// Runs the plan from `start`; returns when every fault is over.
pub async fn run(bed: Arc<Bed>, plan: Vec<Planned>, start: Instant) {
    let mut tasks = Vec::new();
    for p in plan {
        tokio::time::sleep_until(start + p.at).await;
        let bed = bed.clone();
        tasks.push(tokio::spawn(async move { apply(&bed, &p).await }));
    }
    for t in tasks {
        // A fault step that panicked (a fleet command failed) fails the run.
        t.await.expect("a nemesis step");
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("blocking step")
}

async fn apply(bed: &Arc<Bed>, p: &Planned) {
    let down = p.down;
    let _turn = match p.fault.resource() {
        Some(r) => Some(bed.turns[r].lock().await),
        None => None,
    };
    bed.note(format!(
        "fault: {:?} for {:.1}s",
        p.fault,
        down.as_secs_f64()
    ));
    println!(
        "fault {} {:?} at {:.1} s for {:.1} s",
        p.fault.kind(),
        p.fault,
        p.at.as_secs_f64(),
        down.as_secs_f64()
    );
    match p.fault.clone() {
        Fault::KillReplica { replica } => {
            bed.reap_unasked();
            bed.with_replicas(|r| r.kill_9(replica));
            tokio::time::sleep(down).await;
            bed.with_replicas(|r| r.start(replica));
        }
        Fault::PauseReplica { replica } => {
            bed.reap_unasked();
            bed.with_replicas(|r| r.signal(replica, "STOP"));
            tokio::time::sleep(down).await;
            bed.with_replicas(|r| r.signal(replica, "CONT"));
        }
        Fault::RollingRestart => {
            bed.reap_unasked();
            for id in REPLICAS {
                // As a Deployment's rolling update does, each replica is
                // replaced once it has started (a kill -9 may have just
                // started it again): a process signalled before its main
                // runs dies by the signal's default action.
                let port = bed.replicas.lock().unwrap().metrics_ports[id];
                blocking(move || started(port)).await;
                let b = bed.clone();
                let status = blocking(move || b.with_replicas(|r| r.restart_status(id))).await;
                if !status.success() {
                    bed.exits.lock().unwrap().push(Exit {
                        replica: id.into(),
                        at: Timestamp::now(),
                        status: format!("on SIGTERM: {status}"),
                    });
                }
                bed.note(format!("restarted {id}"));
                tokio::time::sleep(Duration::from_secs(3)).await;
            }
        }
        Fault::StopMember { member } => {
            bed.stopped.lock().unwrap().push(member.into());
            // Down once the stop returns: the apiserver may answer until then.
            blocking(move || crate::support::fleet_cmd(&["stop", member])).await;
            let from = Timestamp::now();
            tokio::time::sleep(down).await;
            bed.went_down(member, from);
            blocking(move || crate::support::fleet_cmd(&["start", member])).await;
            bed.stopped.lock().unwrap().retain(|m| m != member);
        }
        Fault::BlackHoleMember { member } => {
            bed.proxies[member].hole(true);
            let from = Timestamp::now();
            tokio::time::sleep(down).await;
            bed.went_down(member, from);
            bed.proxies[member].hole(false);
        }
        Fault::StopRegistry => {
            bed.stopped.lock().unwrap().push("registry".into());
            let blind = Timestamp::now();
            let stopped = tokio::time::Instant::now();
            blocking(|| crate::support::registry::registry_etcd("stop")).await;
            tokio::time::sleep(down).await;
            blocking(|| crate::support::registry::registry_etcd("start")).await;
            let started = tokio::time::Instant::now();
            bed.blind.lock().unwrap().push((blind, Timestamp::now()));
            bed.registry_down.lock().unwrap().push((stopped, started));
            bed.stopped.lock().unwrap().retain(|m| m != "registry");
        }
        Fault::StopHome => {
            bed.stopped.lock().unwrap().push("home".into());
            let blind = Timestamp::now();
            blocking(|| crate::support::fleet_cmd(&["stop", "home"])).await;
            tokio::time::sleep(down).await;
            blocking(|| crate::support::fleet_cmd(&["start", "home"])).await;
            bed.blind.lock().unwrap().push((blind, Timestamp::now()));
            bed.stopped.lock().unwrap().retain(|m| m != "home");
        }
        Fault::DeleteLease { lease } => delete_lease(bed, lease).await,
        Fault::WatchLag { scope, lag } => {
            std::fs::write(&bed.watch_lag, format!("{scope}={}\n", lag.as_millis()))
                .expect("the watch-lag file");
            tokio::time::sleep(down).await;
            std::fs::remove_file(&bed.watch_lag).ok();
        }
        Fault::LateMember { member, after } => late_member(bed, member, after, down, p).await,
        Fault::MoveCanary { member } => bed.move_canary(member),
        Fault::PauseLeader { member, after } => pause_leader(bed, member, after, down, p).await,
    }
    bed.note(format!("healed: {:?}", p.fault));
}

/// Deletes a Lease under whoever holds it; what it was (or why not) goes
/// to the log. A Lease that is not there (between terms) is no fault.
async fn delete_lease(bed: &Bed, which: LeaseKind) {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::DeleteParams;
    let home_ns = bed.target.namespace.as_str();
    let (client, namespace, name) = match which {
        LeaseKind::Member(m) => (
            bed.target.members[m].clone(),
            crate::support::replicas::LEASE_NAMESPACE,
            bed.member_lease.clone(),
        ),
        LeaseKind::Rollout => (
            bed.target.home.clone(),
            home_ns,
            format!("{}-rollouts", bed.member_lease),
        ),
        LeaseKind::Dns => (
            bed.target.home.clone(),
            home_ns,
            format!("{}-dns", bed.member_lease),
        ),
    };
    let api = kube::Api::<Lease>::namespaced(client, namespace);
    let deleted = tokio::time::timeout(
        Duration::from_secs(10),
        api.delete(&name, &DeleteParams::default()),
    )
    .await;
    let outcome = match deleted {
        Ok(Ok(_)) => "deleted".to_string(),
        Ok(Err(e)) => e.to_string(),
        Err(_) => "no answer within 10 s".to_string(),
    };
    bed.note(format!("{which:?} Lease {name}: {outcome}"));
}

/// Waits up to 15 s for a replica's metrics port to accept a connection.
fn started(port: u16) {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let until = std::time::Instant::now() + Duration::from_secs(15);
    while std::time::Instant::now() < until
        && std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err()
    {
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A burst of edits in `member`, and its leader stopped `after` it began,
/// for `down`: on waking it still holds reconciles it had not written,
/// and by then another replica leads. The burst then reaches the other
/// members too, so every copy ends at the same image.
async fn pause_leader(
    bed: &Arc<Bed>,
    member: &'static str,
    after: Duration,
    down: Duration,
    p: &Planned,
) {
    bed.reap_unasked();
    let client = bed.target.members[member].clone();
    let lease = bed.member_lease.clone();
    let leader = tokio::time::timeout(Duration::from_secs(5), holder(&client, &lease))
        .await
        .ok()
        .flatten()
        .and_then(|h| REPLICAS.into_iter().find(|id| *id == h));
    let Some(leader) = leader else {
        bed.note(format!("no leader of {member} known: no burst"));
        return;
    };
    let b = burst(bed, member, p).await;
    tokio::time::sleep(after).await;
    bed.with_replicas(|r| r.signal(leader, "STOP"));
    bed.note(format!("stopped {leader}, the leader of {member}"));
    tokio::time::sleep(down).await;
    bed.with_replicas(|r| r.signal(leader, "CONT"));
    finish_burst(bed, member, b).await;
}

/// Starts a burst of edits of the burst Microservices in `member`, so its
/// leader has writes on their way when a fault strikes `after` it.
async fn burst(bed: &Arc<Bed>, member: &'static str, p: &Planned) -> Burst {
    let turn = bed.bursts.clone().lock_owned().await;
    let image = format!("ghcr.io/acme/burst:{}", p.at.as_millis());
    {
        let mut plain = bed.rec.plain.lock().unwrap();
        for i in 0..workload::BURST {
            plain.insert(workload::burst_name(i), Some(image.clone()));
        }
    }
    bed.rec.op(format!("burst {image} in {member}"));
    let (t, img) = (bed.target.clone(), image.clone());
    let edits = tokio::spawn(async move { workload::burst_in(&t, member, &img).await });
    Burst { edits, image, turn }
}

/// A burst under way, holding the one turn until `finish_burst`.
struct Burst {
    edits: JoinHandle<()>,
    image: String,
    turn: tokio::sync::OwnedMutexGuard<()>,
}

/// Waits for the burst's edits, then gives the other members the same
/// image: every member ends with the workload's last one.
async fn finish_burst(bed: &Arc<Bed>, member: &str, b: Burst) {
    b.edits.await.expect("the burst's edits");
    for m in MEMBERS.into_iter().filter(|m| *m != member) {
        workload::burst_in(&bed.target, m, &b.image).await;
    }
    drop(b.turn);
}

/// A burst of edits in `member`, then, `after` it began, its path held
/// for `down` and what it held delivered late: the leader's writes for the
/// burst land after its term (the 2 s Lease) has ended.
async fn late_member(
    bed: &Arc<Bed>,
    member: &'static str,
    after: Duration,
    down: Duration,
    p: &Planned,
) {
    let b = burst(bed, member, p).await;
    tokio::time::sleep(after).await;
    bed.proxies[member].late(true);
    let from = Timestamp::now();
    tokio::time::sleep(down).await;
    bed.went_down(member, from);
    bed.proxies[member].late(false);
    finish_burst(bed, member, b).await;
}

/// Starts again whatever the nemesis left stopped (a failed step must not
/// leave the fleet broken for the tests that follow).
pub fn heal(bed: &Bed) {
    std::fs::remove_file(&bed.watch_lag).ok();
    for m in MEMBERS {
        bed.proxies[m].hole(false);
        bed.proxies[m].late(false);
    }
    for what in std::mem::take(&mut *bed.stopped.lock().unwrap()) {
        let args: &[&str] = if what == "registry" {
            &["registry", "start"]
        } else {
            &["start", &what]
        };
        let _ = std::process::Command::new(crate::support::fleet_script())
            .args(args)
            .output();
    }
}
