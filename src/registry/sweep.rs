//! Sweeps: records no Microservice stands behind any more (deleted while
//! the registry was off, or restored from an old etcd backup), and records
//! of clusters that left the fleet. Every delete is conditional on the
//! revision read, so a sweep never removes a record rewritten meanwhile.

use std::collections::BTreeSet;
use std::time::Duration;

use super::Registry;
use super::records::{Writer, plan_departed, plan_sweep};
use crate::telemetry::metrics::METRICS;

/// One sweep of `me.cluster`'s records, `alive(namespace, name)` telling
/// which Microservices exist. Returns how many records it removed.
pub async fn sweep_cluster(
    registry: &Registry,
    me: &Writer,
    alive: impl Fn(&str, &str) -> bool,
) -> super::store::Result<usize> {
    let existing = registry.read_zone().await?;
    let ops = plan_sweep(&existing, me, registry.zone(), alive);
    registry.apply(&ops).await?;
    if !ops.is_empty() {
        tracing::info!(k8s.cluster.name = %me.cluster, removed = ops.len(), "registry sweep removed records of deleted Microservices");
    }
    Ok(ops.len())
}

/// Removes records of clusters absent from the fleet in two sweeps in a
/// row, so a replica that has not yet read a new member's credentials
/// never removes that member's records. `members` is `None` until the
/// fleet's member list has been read. Runs until `stop`.
pub async fn sweep_departed(
    registry: Registry,
    members: impl Fn() -> Option<BTreeSet<String>>,
    period: Duration,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    let mut absent_before: BTreeSet<String> = BTreeSet::new();
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(period) => {}
        }
        let existing = match registry.read_zone().await {
            Ok(e) => e,
            Err(e) => {
                tracing::debug!(error = %e, "registry sweep: etcd not reachable");
                continue;
            }
        };
        let Some(now) = members() else {
            continue;
        };
        let absent: BTreeSet<String> = existing
            .iter()
            .filter_map(|e| e.record.as_ref().map(|r| r.writer.cluster.clone()))
            .filter(|c| !now.contains(c))
            .collect();
        let ops = plan_departed(&existing, |c| {
            !(absent.contains(c) && absent_before.contains(c))
        });
        absent_before = absent;
        if ops.is_empty() {
            continue;
        }
        match registry.apply(&ops).await {
            Ok(()) => {
                METRICS.registry_writes_total.inc(&["fleet", "applied"]);
                tracing::info!(
                    removed = ops.len(),
                    "registry sweep removed records of clusters that left the fleet"
                );
            }
            Err(e) => tracing::info!(error = %e, "registry sweep of departed clusters will retry"),
        }
    }
}
