//! The status API's reads of live Microservices in member clusters, with a
//! client of its own (its user agent, a small budget, never fenced: it
//! only reads).

use std::collections::BTreeMap;
use std::time::Duration;

use kube::Api;
use tokio::sync::watch;

use super::client_budget::Budget;
use super::cluster::{agent_named, unreachable_reason};
use super::member_clients::MemberClients;
use super::runtime::Credentials;
use crate::crd::Microservice;
use crate::status::live::LiveReads;

/// A member that does not answer within this is read again later.
const TIMEOUT: Duration = Duration::from_secs(3);

pub struct MemberReads {
    clients: MemberClients,
}

impl MemberReads {
    pub fn new(
        replica_id: &str,
        credentials: watch::Receiver<BTreeMap<String, Credentials>>,
    ) -> Result<Self, String> {
        let agent = agent_named("flotilla-api", replica_id)?;
        Ok(MemberReads {
            clients: MemberClients::new(credentials, agent, Budget::LIVE_READS, None),
        })
    }
}

#[tonic::async_trait]
impl LiveReads for MemberReads {
    async fn generation(&self, cluster: &str, ns: &str, name: &str) -> Result<Option<i64>, String> {
        // A GET without a resourceVersion is served from etcd by quorum:
        // never older than a write the caller has seen acknowledged.
        let read = async {
            let client = self.clients.get(cluster).await?;
            Api::<Microservice>::namespaced(client, ns)
                .get_opt(name)
                .await
                .map_err(|e| unreachable_reason(&e))
        };
        let got = tokio::time::timeout(TIMEOUT, read)
            .await
            .map_err(|_| format!("no answer within {TIMEOUT:?}"))??;
        Ok(got.map(|m| m.metadata.generation.unwrap_or(0)))
    }
}
