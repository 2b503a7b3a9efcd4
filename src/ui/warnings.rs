//! The Warning Events a member cluster holds for one Microservice, for
//! the detail view. Read with a client of the dashboard's own (its own
//! user agent and a small budget, never fenced: it only reads).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::fleet::client_budget::Budget;
use crate::fleet::cluster::ui_user_agent;
use crate::fleet::member_clients::MemberClients;
use crate::fleet::runtime::Credentials;

/// At most this many, newest first.
const SHOWN: usize = 20;
/// At most this many read from one member (one page, no continuation).
const LISTED: u32 = 100;
const TIMEOUT: Duration = Duration::from_secs(3);

pub struct Warnings {
    clients: MemberClients,
}

impl Warnings {
    pub fn new(
        replica_id: &str,
        credentials: watch::Receiver<BTreeMap<String, Credentials>>,
    ) -> Result<Self, String> {
        let agent = ui_user_agent(replica_id)?;
        Ok(Warnings {
            clients: MemberClients::new(credentials, agent, Budget::EVENTS, None),
        })
    }

    /// The Warning Events for `ns/name` in each of `clusters`, newest first;
    /// and, per cluster that could not be read, why.
    pub async fn for_object(
        &self,
        clusters: &[String],
        ns: &str,
        name: &str,
    ) -> (Vec<Value>, Vec<String>) {
        let selector =
            format!("involvedObject.kind=Microservice,involvedObject.name={name},type=Warning");
        let mut found: Vec<(String, Value)> = Vec::new();
        let mut errors = Vec::new();
        for cluster in clusters {
            let listed = async {
                let client = self.clients.get(cluster).await?;
                // Bounded: a hostile or broken member must not hand the
                // replica hundreds of MB for one detail view.
                let lp = ListParams::default().fields(&selector).limit(LISTED);
                let list =
                    tokio::time::timeout(TIMEOUT, Api::<Event>::namespaced(client, ns).list(&lp))
                        .await
                        .map_err(|_| "timed out".to_string())?
                        .map_err(|e| match e {
                            kube::Error::Api(s) => format!("{} {}", s.code, s.reason),
                            _ => "unreachable".to_string(),
                        })?;
                Ok::<_, String>(list.items)
            };
            match listed.await {
                Ok(items) => found.extend(items.iter().map(|e| warning(cluster, e))),
                Err(e) => errors.push(format!("{cluster}: {e}")),
            }
        }
        found.sort_by(|a, b| b.0.cmp(&a.0));
        (
            found.into_iter().take(SHOWN).map(|(_, v)| v).collect(),
            errors,
        )
    }
}

/// (sort key, JSON) for one Event: its latest time first.
fn warning(cluster: &str, e: &Event) -> (String, Value) {
    let time = e
        .series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref().map(|t| t.0.to_string()))
        .or_else(|| e.last_timestamp.as_ref().map(|t| t.0.to_string()))
        .or_else(|| e.event_time.as_ref().map(|t| t.0.to_string()))
        .or_else(|| {
            e.metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.to_string())
        })
        .unwrap_or_default();
    let v = json!({
        "cluster": cluster,
        "time": time,
        "reason": e.reason,
        "note": e.message,
        "count": e.series.as_ref().and_then(|s| s.count).or(e.count),
    });
    (time, v)
}
