//! Replica heartbeats: each replica renews a Lease of its own in the home
//! cluster's operator namespace and watches the others'. A replica is live
//! while its heartbeat keeps changing, judged on this replica's clock.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::stream::{BoxStream, StreamExt};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;

pub const LABEL_FLEET: &str = "platform.example.io/fleet";
pub const LABEL_HEARTBEAT: &str = "platform.example.io/replica-heartbeat";

fn lease_name(fleet: &str, replica: &str) -> String {
    format!("flotilla-{fleet}-replica-{replica}")
}

/// Which replicas are live: those whose heartbeat changed within `ttl` of
/// our own observation. Pure, for tests.
pub fn live(
    seen: &BTreeMap<String, (String, Instant)>,
    me: &str,
    ttl: Duration,
    now: Instant,
) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = seen
        .iter()
        .filter(|(_, (_, since))| now.duration_since(*since) < ttl)
        .map(|(holder, _)| holder.clone())
        .collect();
    out.insert(me.to_string());
    out
}

/// When the next peer's heartbeat runs out, if it is not renewed before:
/// the earliest `since + ttl` still ahead of `now`. Pure, for tests.
pub fn next_expiry(
    seen: &BTreeMap<String, (String, Instant)>,
    me: &str,
    ttl: Duration,
    now: Instant,
) -> Option<Instant> {
    seen.iter()
        .filter(|(holder, _)| holder.as_str() != me)
        .map(|(_, (_, since))| *since + ttl)
        .filter(|at| *at > now)
        .min()
}

/// Publishes the live set once `rounds` allows it.
fn publish(live_tx: &watch::Sender<BTreeSet<String>>, set: BTreeSet<String>, rounds: u32) {
    live_tx.send_if_modified(|cur| {
        // Peers that started with us may not have announced themselves on
        // our first read; publish from the second one on, so that a fresh
        // replica does not briefly think it is alone and contest everything.
        if rounds < 2 || *cur == set {
            return false;
        }
        tracing::info!(replicas = ?set, "live replicas changed");
        *cur = set;
        true
    });
}

async fn beat(api: &Api<Lease>, fleet: &str, me: &str, ttl: Duration) -> Result<(), kube::Error> {
    let name = lease_name(fleet, me);
    let spec = LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(ttl.as_secs().max(1) as i32),
        renew_time: Some(MicroTime(jiff::Timestamp::now())),
        ..LeaseSpec::default()
    };
    match api.get_opt(&name).await? {
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name),
                    labels: Some(
                        [
                            (LABEL_FLEET.to_string(), fleet.to_string()),
                            (LABEL_HEARTBEAT.to_string(), "true".to_string()),
                        ]
                        .into(),
                    ),
                    ..ObjectMeta::default()
                },
                spec: Some(spec),
            };
            api.create(&PostParams::default(), &lease).await.map(|_| ())
        }
        Some(mut lease) => {
            lease.spec = Some(spec);
            api.replace(&name, &PostParams::default(), &lease)
                .await
                .map(|_| ())
        }
    }
}

/// Where and how often this replica announces itself.
pub struct Heartbeat {
    pub client: Client,
    pub namespace: String,
    pub fleet: String,
    pub me: String,
    /// A heartbeat unchanged this long means the replica is gone.
    pub ttl: Duration,
    pub period: Duration,
}

/// Renews this replica's heartbeat every `period` and publishes the live
/// replicas, until `shutdown`; then deletes the heartbeat so that the others
/// rebalance at once.
pub async fn run(
    hb: Heartbeat,
    live_tx: watch::Sender<BTreeSet<String>>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let Heartbeat {
        client,
        namespace,
        fleet,
        me,
        ttl,
        period,
    } = hb;
    let api: Api<Lease> = Api::namespaced(client, &namespace);
    let selector = format!("{LABEL_FLEET}={fleet},{LABEL_HEARTBEAT}=true");
    // holder -> (resourceVersion last seen, when we saw it change)
    let mut seen: BTreeMap<String, (String, Instant)> = BTreeMap::new();
    let mut shutdown = std::pin::pin!(shutdown);
    let mut departures = departures(api.clone(), &selector);
    let mut rounds = 0u32;
    'beats: loop {
        rounds += 1;
        let next_beat = Instant::now() + period;
        if let Err(e) = beat(&api, &fleet, &me, ttl).await {
            tracing::warn!(error = %e, "heartbeat failed");
        }
        match api.list(&ListParams::default().labels(&selector)).await {
            Ok(list) => {
                let now = Instant::now();
                // A deleted heartbeat is a replica that shut down cleanly: gone now.
                let present: BTreeSet<String> = list
                    .items
                    .iter()
                    .filter_map(|l| l.spec.as_ref().and_then(|s| s.holder_identity.clone()))
                    .collect();
                seen.retain(|holder, _| present.contains(holder));
                for lease in list.items {
                    let holder = lease
                        .spec
                        .and_then(|s| s.holder_identity)
                        .unwrap_or_default();
                    let rv = lease.metadata.resource_version.unwrap_or_default();
                    if holder.is_empty() {
                        continue;
                    }
                    match seen.get(&holder) {
                        Some((old, _)) if *old == rv => {}
                        _ => {
                            seen.insert(holder, (rv, now));
                        }
                    }
                }
                publish(&live_tx, live(&seen, &me, ttl, now), rounds);
            }
            Err(e) => tracing::warn!(error = %e, "listing heartbeats failed"),
        }
        // Until the next beat, also wake when a peer's heartbeat runs out:
        // a dead replica leaves the live set at its TTL, not up to a
        // period later, and its clusters are reassigned that much sooner.
        loop {
            let expiry = next_expiry(&seen, &me, ttl, Instant::now());
            let until = expiry.map_or(next_beat, |e| (e + Duration::from_millis(1)).min(next_beat));
            tokio::select! {
                _ = &mut shutdown => break 'beats,
                _ = tokio::time::sleep_until(until) => {}
                Some(gone) = departures.next() => {
                    // A replica shutting down leaves before it lets go of its
                    // clusters, so that their owners are named in time.
                    if gone != me {
                        seen.remove(&gone);
                    }
                }
            }
            if Instant::now() >= next_beat {
                break;
            }
            publish(&live_tx, live(&seen, &me, ttl, Instant::now()), rounds);
        }
    }
    // Bounded: an unreachable home must not hold the shutdown; the
    // heartbeat then runs out at its TTL instead.
    let (name, params) = (lease_name(&fleet, &me), DeleteParams::default());
    match tokio::time::timeout(period, api.delete(&name, &params)).await {
        Ok(Ok(_)) => tracing::info!("heartbeat deleted: left the live replicas"),
        Ok(Err(e)) => tracing::warn!(error = %e, "could not delete heartbeat"),
        Err(_) => tracing::warn!("deleting the heartbeat timed out"),
    }
}

/// The replicas whose heartbeat was deleted (a clean shutdown), as the
/// watch sees it: they leave the live set at once, not at the next listing.
fn departures(api: Api<Lease>, selector: &str) -> BoxStream<'static, String> {
    use kube::runtime::watcher;
    crate::watching::retried(watcher(api, watcher::Config::default().labels(selector)))
        .filter_map(|event| async move {
            match event {
                Ok(watcher::Event::Delete(lease)) => lease.spec.and_then(|s| s.holder_identity),
                _ => None,
            }
        })
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_expiry_is_the_earliest_peer_heartbeat_still_ahead() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(15);
        let mut seen = BTreeMap::new();
        seen.insert("a".to_string(), ("5".to_string(), t0));
        seen.insert(
            "b".to_string(),
            ("9".to_string(), t0 + Duration::from_secs(4)),
        );
        seen.insert("me".to_string(), ("1".to_string(), t0));
        assert_eq!(next_expiry(&seen, "me", ttl, t0), Some(t0 + ttl));
        // a has run out: b is next; our own heartbeat never counts.
        let later = t0 + Duration::from_secs(16);
        assert_eq!(
            next_expiry(&seen, "me", ttl, later),
            Some(t0 + Duration::from_secs(19))
        );
        assert_eq!(
            next_expiry(&seen, "me", ttl, t0 + Duration::from_secs(20)),
            None
        );
    }

    #[test]
    fn replicas_whose_heartbeat_stopped_changing_are_not_live() {
        let t0 = Instant::now();
        let mut seen = BTreeMap::new();
        seen.insert("a".to_string(), ("5".to_string(), t0));
        seen.insert(
            "b".to_string(),
            ("9".to_string(), t0 + Duration::from_secs(10)),
        );
        let now = t0 + Duration::from_secs(16);
        let l = live(&seen, "me", Duration::from_secs(15), now);
        assert_eq!(l, ["b", "me"].iter().map(|s| s.to_string()).collect());
    }
}
