//! Reads one fleet-wide name from etcd for `flotilla dns` and the gRPC
//! view (#31): any replica can answer, not only the DNS writer, because
//! the answer is what etcd holds (and so what CoreDNS serves), and the
//! fail-open mark travels in the records.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::view::{self, DnsView, Row};
use crate::registry::Registry;
use crate::registry::records::{Entry, Existing};
use crate::rollout::run::cache::RolloutCache;
use crate::status::index::{MicroserviceView, Snapshot};

/// The longest one lookup waits on etcd.
const READ_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Clone)]
pub struct DnsLookup {
    pub registry: Registry,
    pub fleet: Option<Arc<RolloutCache>>,
}

impl std::fmt::Debug for DnsLookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DnsLookup")
    }
}

impl DnsLookup {
    /// The answer of `NAME.NAMESPACE.ZONE`, or why it cannot be read;
    /// `v` is the object's view, as the caller already built it.
    pub async fn answer(
        &self,
        snap: &Snapshot,
        v: Option<&MicroserviceView>,
        ns: &str,
        name: &str,
    ) -> Result<DnsView, String> {
        let zone = self.registry.zone();
        let fqdn = format!("{name}.{ns}.{}", zone.name);
        // Own records: one key per registered cluster whose name makes one.
        let mut own_keys = BTreeMap::new();
        for cluster in snap.clusters().keys() {
            let entry = Entry {
                cluster: cluster.clone(),
                namespace: ns.to_string(),
                name: name.to_string(),
            };
            if let Ok([own, _]) = entry.keys(zone) {
                own_keys.insert(own, cluster.clone());
            }
        }
        let wide_prefix = format!("{}/{ns}/{name}/", zone.prefix);
        let keys: Vec<String> = own_keys.keys().cloned().collect();
        let read = async {
            let own = self.registry.read(&keys).await?;
            let wide = self.registry.read_under(&wide_prefix).await?;
            Ok::<_, crate::registry::store::RegistryError>((own, wide))
        };
        let (own, wide): (Vec<Existing>, Vec<Existing>) =
            match tokio::time::timeout(READ_TIMEOUT, read).await {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => return Err(format!("the registry could not be read: {e}")),
                Err(_) => return Err("the registry did not answer in 3s".into()),
            };
        let own: BTreeMap<&str, &Existing> = own
            .iter()
            .filter_map(|e| own_keys.get(&e.key).map(|c| (c.as_str(), e)))
            .collect();
        let wide: BTreeMap<&str, &Existing> = wide
            .iter()
            .filter_map(|e| e.key.strip_prefix(&wide_prefix).map(|c| (c, e)))
            .filter(|(c, _)| !c.contains('/'))
            .collect();

        let fms = self.fleet.as_ref().and_then(|f| f.get(ns, name));
        let primaries = fms.as_ref().and_then(|f| f.spec.dns_primaries());
        let mut clusters: Vec<&str> = own.keys().chain(wide.keys()).copied().collect();
        clusters.sort_unstable();
        clusters.dedup();
        let rows: Vec<Row> = clusters
            .iter()
            .map(|c| Row {
                cluster: c,
                own: own.get(c).and_then(|e| e.record.as_ref()),
                listed: wide.get(c).and_then(|e| e.record.as_ref()),
                seen: view::seen(snap, v, c),
                primary: view::is_primary(snap, primaries, c),
            })
            .collect();
        Ok(view::explain(&fqdn, primaries.is_some(), &rows))
    }
}
