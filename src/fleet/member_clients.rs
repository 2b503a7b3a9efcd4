//! Clients for member clusters, built from the credentials the fleet
//! runtime validated, and built again when those change.

use std::collections::BTreeMap;
use std::sync::Mutex;

use kube::Client;
use tokio::sync::watch;

use super::client_budget::Budget;
use super::cluster::client_for;
use super::runtime::Credentials;
use crate::lease::fence::Fence;

pub struct MemberClients {
    credentials: watch::Receiver<BTreeMap<String, Credentials>>,
    /// Every request's user agent, so audit logs name the caller.
    agent: http::HeaderValue,
    budget: Budget,
    /// Writes pass only inside this term; `None` for a reader.
    fence: Option<Fence>,
    clients: Mutex<BTreeMap<String, (u64, Client)>>,
}

impl MemberClients {
    pub fn new(
        credentials: watch::Receiver<BTreeMap<String, Credentials>>,
        agent: http::HeaderValue,
        budget: Budget,
        fence: Option<Fence>,
    ) -> Self {
        MemberClients {
            credentials,
            agent,
            budget,
            fence,
            clients: Mutex::new(BTreeMap::new()),
        }
    }

    /// `cluster`'s client; the error says why there is none.
    pub async fn get(&self, cluster: &str) -> Result<Client, String> {
        let creds = self.credentials.borrow().get(cluster).cloned();
        let creds = creds.ok_or_else(|| "not registered".to_string())?;
        if let Some((fp, c)) = self
            .clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(cluster)
            && *fp == creds.fingerprint
        {
            return Ok(c.clone());
        }
        let client = client_for(
            cluster,
            creds.kubeconfig,
            creds.trust,
            &self.agent,
            self.budget,
            self.fence.as_ref(),
        )
        .await?;
        self.clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(cluster.to_string(), (creds.fingerprint, client.clone()));
        Ok(client)
    }
}
