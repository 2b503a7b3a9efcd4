//! Five electors contend for one Lease on a real apiserver while a chaos
//! task partitions whoever leads. Across 100 changes of leader, no two
//! electors may ever lead at once, and no epoch may be won twice.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use flotilla::lease::election::{LeaseRecord, Timings};
use flotilla::lease::elector::{Elector, Leadership};
use flotilla::lease::lease_store::{KubeLeaseStore, LeaseError, LeaseStore, Versioned};
use support::{TestNamespace, client};

const CANDIDATES: usize = 5;
const DEFAULT_ROUNDS: usize = 100;

/// A real Lease store behind a fault: random latency on every call, and no
/// answer at all while partitioned.
struct Flaky {
    inner: KubeLeaseStore,
    partitioned_until: Arc<Mutex<Option<Instant>>>,
}

impl Flaky {
    async fn gate(&self) -> Result<(), LeaseError> {
        let delay = rand::rng().random_range(0..40);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let until = *self.partitioned_until.lock().expect("lock");
        match until {
            Some(t) if Instant::now() < t => Err(LeaseError::Unavailable("partitioned".into())),
            _ => Ok(()),
        }
    }
}

impl LeaseStore for Flaky {
    async fn get(&self) -> Result<Option<Versioned>, LeaseError> {
        self.gate().await?;
        self.inner.get().await
    }
    async fn create(&self, record: &LeaseRecord) -> Result<Versioned, LeaseError> {
        self.gate().await?;
        self.inner.create(record).await
    }
    async fn update(
        &self,
        read: &Versioned,
        record: &LeaseRecord,
        acquired: bool,
    ) -> Result<Versioned, LeaseError> {
        self.gate().await?;
        self.inner.update(read, record, acquired).await
    }
}

#[derive(Debug, Clone)]
struct Interval {
    candidate: usize,
    epoch: i32,
    start: Instant,
    end: Instant,
}

/// Leadership intervals from one candidate's full transition history.
fn intervals(candidate: usize, history: &[Leadership], stopped: Instant) -> Vec<Interval> {
    let mut out = Vec::new();
    let mut open: Option<(i32, Instant, Instant)> = None;
    for event in history {
        match event {
            Leadership::Leading {
                epoch,
                since,
                until,
            } => {
                if let Some((e, s, u)) = open.take() {
                    out.push(Interval {
                        candidate,
                        epoch: e,
                        start: s,
                        end: u.min(*since),
                    });
                }
                open = Some((*epoch, *since, *until));
            }
            Leadership::Following { since, .. } => {
                if let Some((e, s, _)) = open.take() {
                    out.push(Interval {
                        candidate,
                        epoch: e,
                        start: s,
                        end: *since,
                    });
                }
            }
        }
    }
    if let Some((e, s, u)) = open {
        out.push(Interval {
            candidate,
            epoch: e,
            start: s,
            end: u.min(stopped),
        });
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_electors_never_lead_at_once_across_100_leader_changes() {
    let client = client("home").await;
    let ns = TestNamespace::create(&client, "home", "election").await;
    let timings = Timings {
        lease_duration: Duration::from_secs(1),
        renew_deadline: Duration::from_millis(700),
        retry_period: Duration::from_millis(150),
    }
    .validate()
    .expect("valid timings");

    let rounds: usize = std::env::var("FLOTILLA_ELECTION_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_ROUNDS);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut partitions = Vec::new();
    let mut states = Vec::new();
    let mut histories = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..CANDIDATES {
        let partitioned_until = Arc::new(Mutex::new(None));
        let store = Flaky {
            inner: KubeLeaseStore::new(client.clone(), &ns.name, "race"),
            partitioned_until: partitioned_until.clone(),
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let (elector, state) = Elector::new(format!("candidate-{i}"), timings, store);
        let elector = elector.with_history(tx);
        let mut stop = stop_rx.clone();
        tasks.push(tokio::spawn(async move {
            elector
                .run(async move {
                    stop.wait_for(|s| *s).await.ok();
                })
                .await
        }));
        partitions.push(partitioned_until);
        states.push(state);
        histories.push(rx);
    }

    // Chaos: let each leader hold for a random while, sometimes several lease
    // durations (a healthy leader must keep its Lease), then partition it for
    // longer than the lease.
    let started = Instant::now();
    let deadline = started + Duration::from_secs(480);
    let mut acquisitions = 0usize;
    let mut current: Option<(i32, Instant, Duration)> = None;
    while acquisitions < rounds && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(rand::rng().random_range(50..200))).await;
        let now = Instant::now();
        for (i, state) in states.iter().enumerate() {
            let leading = match &*state.borrow() {
                Leadership::Leading { epoch, .. } if state.borrow().is_leading_at(now) => {
                    Some(*epoch)
                }
                _ => None,
            };
            let Some(epoch) = leading else { continue };
            if current.is_none_or(|(e, _, _)| e != epoch) {
                acquisitions += 1;
                let hold = if rand::rng().random_bool(0.3) {
                    Duration::from_millis(rand::rng().random_range(1500..3500))
                } else {
                    Duration::from_millis(rand::rng().random_range(0..400))
                };
                current = Some((epoch, now, hold));
            }
            if let Some((_, since, hold)) = current
                && now.duration_since(since) >= hold
            {
                let cut = Duration::from_millis(rand::rng().random_range(800..2000));
                *partitions[i].lock().expect("lock") = Some(now + cut);
            }
        }
    }
    stop_tx.send(true).expect("stop electors");
    for t in tasks {
        t.await.expect("elector task");
    }
    let stopped = Instant::now();

    let mut all = Vec::new();
    for (i, rx) in histories.iter_mut().enumerate() {
        let mut events = Vec::new();
        while let Ok(e) = rx.try_recv() {
            events.push(e);
        }
        all.extend(intervals(i, &events, stopped));
    }
    assert!(
        acquisitions >= rounds,
        "only {acquisitions} leader changes in {:?}",
        started.elapsed()
    );

    // No epoch is won by two candidates.
    let mut winners: BTreeMap<i32, usize> = BTreeMap::new();
    for iv in &all {
        if let Some(prev) = winners.insert(iv.epoch, iv.candidate) {
            assert_eq!(
                prev, iv.candidate,
                "epoch {} was won by two candidates",
                iv.epoch
            );
        }
    }
    // Leadership intervals of different candidates never overlap: each one
    // starts after every earlier one of another candidate has ended.
    all.sort_by_key(|iv| iv.start);
    let mut max_end: Option<(Instant, usize)> = None;
    for iv in &all {
        if let Some((end, who)) = max_end
            && who != iv.candidate
        {
            assert!(
                iv.start >= end,
                "overlap: candidate {who} until {:?}, candidate {} from {:?}",
                end - started,
                iv.candidate,
                iv.start - started
            );
        }
        if max_end.is_none_or(|(end, _)| iv.end > end) {
            max_end = Some((iv.end, iv.candidate));
        }
    }
    let lease = k8s_openapi::api::coordination::v1::Lease::clone(
        &ns.api::<k8s_openapi::api::coordination::v1::Lease>()
            .get("race")
            .await
            .expect("lease"),
    );
    let transitions = lease.spec.and_then(|s| s.lease_transitions).unwrap_or(0);
    assert!(
        transitions as usize >= rounds - 1,
        "leaseTransitions {transitions}"
    );
    eprintln!(
        "{} leadership intervals, {acquisitions} leader changes, leaseTransitions {transitions}, in {:?}",
        all.len(),
        started.elapsed()
    );
}

/// A replica the assignment names as a free Lease's owner takes it as soon
/// as the assignment changes, not at its next retry: after a kill -9 the
/// survivors learn of the death from the heartbeats, and each retry period
/// spent waiting would add to the failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_assignee_takes_a_free_lease_as_soon_as_the_assignment_names_it() {
    use flotilla::lease::election::Ownership;
    use futures::StreamExt;

    let client = client("home").await;
    let ns = TestNamespace::create(&client, "home", "elect-wake").await;
    let retry = Duration::from_secs(10);
    let timings = Timings {
        lease_duration: Duration::from_secs(30),
        renew_deadline: Duration::from_secs(20),
        retry_period: retry,
    };
    let (owner_tx, owner_rx) = watch::channel(Some("another-replica".to_string()));
    let view = owner_rx.clone();
    let store = KubeLeaseStore::new(client.clone(), &ns.name, "wake");
    let (elector, mut leadership) = Elector::new("me".to_string(), timings, store);
    let elector = elector
        .with_ownership(Box::new(move || Ownership::Assigned {
            owner: view.borrow().clone(),
            // Longer than the test: only the assignment can make it contest.
            grace: Duration::from_secs(600),
        }))
        .with_wake(
            tokio_stream::wrappers::WatchStream::from_changes(owner_rx)
                .map(|_| ())
                .boxed(),
        );
    let (stop_tx, mut stop_rx) = watch::channel(false);
    let task = tokio::spawn(elector.run(async move {
        stop_rx.wait_for(|s| *s).await.ok();
    }));
    // Its first round finds no Lease, and leaves it alone: not its cluster.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !matches!(*leadership.borrow(), Leadership::Leading { .. }),
        "contested a cluster assigned elsewhere"
    );
    let named = Instant::now();
    owner_tx.send(Some("me".into())).expect("send");
    tokio::time::timeout(
        retry / 2,
        leadership.wait_for(|l| matches!(l, Leadership::Leading { .. })),
    )
    .await
    .expect("led well within a retry period of being named owner")
    .expect("elector alive");
    eprintln!("named owner to leading: {:?}", named.elapsed());
    stop_tx.send(true).ok();
    task.await.expect("elector task");
}
