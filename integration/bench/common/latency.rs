//! Change-to-applied latency. Changes raise `spec.replicas` by one each, so a
//! Deployment showing a value at least as high as a change's has that change
//! applied, even when the controller folded several changes into one write.
//! The clock runs from just before the patch is sent to the moment a watch
//! on the Deployments delivers the new value to this process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ResourceQuota;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde::Serialize;
use serde_json::json;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::percentile;

type Key = (String, String);
/// (cluster, name) -> every replicas value seen, with when.
type Seen = Arc<Mutex<HashMap<Key, Vec<(i64, Instant)>>>>;

/// A ResourceQuota of zero pods in `ns`: replicas changes then cost the
/// controllers and the apiserver, not pod churn.
pub async fn no_pods(client: &Client, ns: &str) {
    let quota: ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}},
    }))
    .expect("quota");
    Api::<ResourceQuota>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &quota)
        .await
        .expect("quota");
}

/// Every replicas value each Deployment was seen with, in order.
pub struct Observed {
    seen: Seen,
    tasks: Vec<JoinHandle<()>>,
}

impl Observed {
    /// Watches the Deployments in `ns` of each member.
    pub async fn start(members: &[(String, Client)], ns: &str) -> Self {
        let seen: Seen = Arc::default();
        let mut tasks = Vec::new();
        for (cluster, client) in members {
            let api = Api::<Deployment>::namespaced(client.clone(), ns);
            let (seen, cluster) = (seen.clone(), cluster.clone());
            tasks.push(tokio::spawn(async move {
                let mut events = watcher(api, watcher::Config::default())
                    .default_backoff()
                    .applied_objects()
                    .boxed();
                while let Some(event) = events.next().await {
                    let Ok(d) = event else { continue };
                    let name = d.metadata.name.clone().unwrap_or_default();
                    let replicas = d.spec.and_then(|s| s.replicas).unwrap_or(1) as i64;
                    seen.lock()
                        .unwrap()
                        .entry((cluster.clone(), name))
                        .or_default()
                        .push((replicas, Instant::now()));
                }
            }));
        }
        // The initial list arrives before the first change is sent.
        tokio::time::sleep(Duration::from_secs(1)).await;
        Observed { seen, tasks }
    }

    fn applied_at(&self, c: &Change) -> Option<Instant> {
        let seen = self.seen.lock().unwrap();
        seen.get(&(c.cluster.clone(), c.name.clone()))?
            .iter()
            .find(|(v, _)| *v >= c.value)
            .map(|(_, t)| *t)
    }
}

impl Drop for Observed {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// One object to change: Microservice or Foo, both with `spec.replicas`.
#[derive(Clone)]
pub struct Target {
    pub cluster: String,
    pub api: Api<DynamicObject>,
    pub name: String,
}

/// One change as sent.
#[derive(Debug, Clone)]
pub struct Change {
    pub cluster: String,
    pub name: String,
    pub value: i64,
    pub sent: Instant,
}

/// Sends `rate` changes per second for `window`, round robin over `targets`,
/// whose replicas are now `values` (raised as changes are sent). Returns the
/// changes the apiserver accepted, and how many it refused.
pub async fn drive(
    targets: &[Target],
    values: &mut [i64],
    rate: f64,
    window: Duration,
) -> (Vec<Change>, usize) {
    assert_eq!(targets.len(), values.len(), "one value per target");
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    let total = (rate * window.as_secs_f64()).round() as usize;
    let mut sends = Vec::with_capacity(total);
    for k in 0..total {
        ticker.tick().await;
        let i = k % targets.len();
        values[i] += 1;
        let (t, value) = (targets[i].clone(), values[i]);
        // Spawned, so that a slow answer does not lower the rate.
        sends.push(tokio::spawn(async move {
            let sent = Instant::now();
            let patch = Patch::Merge(json!({"spec": {"replicas": value}}));
            t.api
                .patch(&t.name, &PatchParams::default(), &patch)
                .await
                .ok()
                .map(|_| Change {
                    cluster: t.cluster,
                    name: t.name,
                    value,
                    sent,
                })
        }));
    }
    let (mut changes, mut refused) = (Vec::new(), 0);
    for s in sends {
        match s.await.expect("send task") {
            Some(c) => changes.push(c),
            None => refused += 1,
        }
    }
    (changes, refused)
}

#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub changes: usize,
    pub refused: usize,
    pub applied: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// The members' apiservers' CPU over the run, in cores (summed), when
    /// the scenario measures it: shows when the test bed is saturated.
    pub apiserver_cores: f64,
    /// The members' apiservers' CPU per change sent (ms), over a window of
    /// the same length for both controllers: the changes, then 15 s.
    pub apiserver_ms_per_change: f64,
}

/// Waits (up to `drain`) for every change to show, then sums up.
pub async fn settle(
    observed: &Observed,
    changes: &[Change],
    refused: usize,
    drain: Duration,
) -> Latency {
    let deadline = Instant::now() + drain;
    loop {
        let pending = changes
            .iter()
            .filter(|c| observed.applied_at(c).is_none())
            .count();
        if pending == 0 || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let ms: Vec<f64> = changes
        .iter()
        .filter_map(|c| {
            let at = observed.applied_at(c)?;
            Some(at.saturating_duration_since(c.sent).as_secs_f64() * 1000.0)
        })
        .collect();
    Latency {
        changes: changes.len(),
        refused,
        applied: ms.len(),
        p50_ms: percentile(&ms, 0.5),
        p99_ms: percentile(&ms, 0.99),
        max_ms: percentile(&ms, 1.0),
        apiserver_cores: f64::NAN,
        apiserver_ms_per_change: f64::NAN,
    }
}
