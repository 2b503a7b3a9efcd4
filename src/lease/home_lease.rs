//! A fleet-wide writer's life on a home Lease (the fleet rollouts, the
//! fleet DNS): contest the Lease, run one term of work while leading, and
//! on shutdown stop the work first, then release the Lease.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tracing::Instrument;

use super::election::Timings;
use super::elector::{Elector, Leadership, release};
use super::lease_store::{KubeLeaseStore, LeaseStore};

/// Where a fleet-wide writer's home Lease lives and who contests it: the
/// same for the rollout leader and the fleet DNS writer.
#[derive(Clone)]
pub struct HomeLease {
    /// The home cluster, with this replica's user agent.
    pub home: kube::Config,
    pub namespace: String,
    pub fleet_name: String,
    pub replica_id: String,
    pub timings: Timings,
}

impl HomeLease {
    /// The elector of the Lease `flotilla-<fleet>-<suffix>`, through `client`.
    pub fn elector(
        &self,
        client: kube::Client,
        suffix: &str,
    ) -> (Elector<KubeLeaseStore>, watch::Receiver<Leadership>) {
        Elector::new(
            self.replica_id.clone(),
            self.timings,
            self.store(client, suffix),
        )
    }

    /// The Lease `flotilla-<fleet>-<suffix>` itself, through `client`.
    pub fn store(&self, client: kube::Client, suffix: &str) -> KubeLeaseStore {
        let name = format!("flotilla-{}-{suffix}", self.fleet_name);
        KubeLeaseStore::new(client, &self.namespace, &name)
    }
}

/// Runs until `shutdown`. For each term this replica leads, `term(epoch)`
/// runs until it returns, the term is over (it is then dropped), or
/// shutdown; `ended(epoch)` follows each term. `what` names the Lease in logs.
pub async fn lead<S, F, Fut>(
    what: &'static str,
    elector: Elector<S>,
    mut leadership: watch::Receiver<Leadership>,
    renew_deadline: Duration,
    shutdown: impl Future<Output = ()>,
    mut term: F,
    mut ended: impl FnMut(i32),
) where
    S: LeaseStore + 'static,
    F: FnMut(i32) -> Fut,
    Fut: Future<Output = ()>,
{
    let (stop_elector_tx, mut stop_elector_rx) = watch::channel(false);
    // The elector's own lines name their Lease: a replica runs several.
    let elector_task = tokio::spawn(
        elector
            .run(async move {
                stop_elector_rx.wait_for(|s| *s).await.ok();
            })
            .instrument(tracing::info_span!("elector", lease = what)),
    );
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let state = leadership.borrow_and_update().clone();
        if let Leadership::Leading { epoch, .. } = state {
            tracing::info!(epoch, lease = what, "leading");
            let over = super::elector::term_over(leadership.clone(), epoch);
            let stopped = tokio::select! {
                _ = term(epoch) => false,
                _ = over => false,
                _ = &mut shutdown => true,
            };
            ended(epoch);
            tracing::info!(epoch, lease = what, "term over; writers stopped");
            if stopped {
                break;
            }
        }
        tokio::select! {
            changed = leadership.changed() => if changed.is_err() { break },
            _ = &mut shutdown => break,
        }
    }
    stop_elector_tx.send(true).ok();
    if let Ok((store, Some(held))) = elector_task.await {
        match tokio::time::timeout(renew_deadline, release(&store, &held)).await {
            Ok(Ok(())) => tracing::info!(lease = what, "lease released"),
            Ok(Err(e)) => tracing::warn!(lease = what, error = %e, "lease release failed"),
            Err(_) => tracing::warn!(lease = what, "lease release timed out"),
        }
    }
}
