//! The registry's etcd: consistent reads of our keys, and writes that are
//! transactions comparing every key's mod revision with the one read, so a
//! write planned on a stale read (a deposed leader's, a racing sweep's)
//! changes nothing.

use std::path::PathBuf;
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity, TlsOptions, Txn,
    TxnOp, TxnOpResponse,
};

use super::records::{Existing, Op, RecordError, Refusal, Zone};

/// How the registry is reached (`--registry-*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryConfig {
    pub endpoints: Vec<String>,
    /// The DNS zone served, e.g. `fleet.example`.
    pub zone: String,
    /// CoreDNS's etcd `path`.
    pub path: String,
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// etcd did not answer; the message names no credentials.
    #[error("the service registry cannot be reached: {0}")]
    Unavailable(String),
    #[error(transparent)]
    Invalid(#[from] RecordError),
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// A key changed between our read and our write: read again.
    #[error("the registry changed while we wrote it; reading it again")]
    Conflict,
    #[error("registry configuration: {0}")]
    Config(String),
    /// This replica no longer leads the cluster: it writes nothing.
    #[error("this replica no longer leads the cluster; the new leader keeps its records")]
    NotLeading,
}

impl RegistryError {
    /// A bounded label for metrics, condition reasons and Event reasons.
    pub fn category(&self) -> &'static str {
        match self {
            RegistryError::Unavailable(_) => "ExternalUnavailable",
            RegistryError::Invalid(_) => "Invalid",
            RegistryError::Refused(Refusal::Deposed { .. }) => "Deposed",
            RegistryError::Refused(Refusal::Foreign { .. }) => "RecordConflict",
            RegistryError::Conflict => "Conflict",
            RegistryError::Config(_) => "Invalid",
            RegistryError::NotLeading => "NotLeader",
        }
    }
}

pub type Result<T, E = RegistryError> = std::result::Result<T, E>;

/// etcd's errors carry the gRPC status; keep its code and message, short.
fn unavailable(e: etcd_client::Error) -> RegistryError {
    let text = match &e {
        etcd_client::Error::GRpcStatus(s) => format!("{:?}: {}", s.code(), s.message()),
        other => other.to_string(),
    };
    RegistryError::Unavailable(text.chars().take(200).collect())
}

#[derive(Clone)]
pub struct Registry {
    client: Client,
    zone: Zone,
}

fn read_file(what: &str, path: &PathBuf) -> Result<Vec<u8>> {
    std::fs::read(path)
        .map_err(|e| RegistryError::Config(format!("{what} {}: {e}", path.display())))
}

impl Registry {
    /// Connects lazily: an etcd that is down now is reported by the first
    /// call, not here, so startup never waits on the registry.
    pub async fn connect(config: &RegistryConfig) -> Result<Registry> {
        let zone = Zone::new(&config.zone, &config.path)?;
        if config.endpoints.is_empty() {
            return Err(RegistryError::Config("no etcd endpoints".into()));
        }
        if config
            .endpoints
            .iter()
            .any(|e| e.split("://").nth(1).unwrap_or(e).contains('@'))
        {
            return Err(RegistryError::Config(
                "credentials in an endpoint URL are refused; use TLS client certificates".into(),
            ));
        }
        let mut options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(5));
        if let Some(ca) = &config.ca {
            let mut tls =
                TlsOptions::new().ca_certificate(Certificate::from_pem(read_file("CA", ca)?));
            match (&config.cert, &config.key) {
                (Some(cert), Some(key)) => {
                    tls = tls.identity(Identity::from_pem(
                        read_file("certificate", cert)?,
                        read_file("key", key)?,
                    ));
                }
                (None, None) => {}
                _ => {
                    return Err(RegistryError::Config(
                        "a client certificate needs both --registry-cert and --registry-key".into(),
                    ));
                }
            }
            options = options.with_tls(tls);
        }
        let client = Client::connect(&config.endpoints, Some(options))
            .await
            .map_err(|e| match e {
                etcd_client::Error::InvalidArgs(m) => RegistryError::Config(m),
                etcd_client::Error::InvalidUri(e) => RegistryError::Config(e.to_string()),
                other => unavailable(other),
            })?;
        Ok(Registry { client, zone })
    }

    pub fn zone(&self) -> &Zone {
        &self.zone
    }

    /// The current values of `keys`, read in one transaction.
    pub async fn read(&self, keys: &[String]) -> Result<Vec<Existing>> {
        let gets: Vec<TxnOp> = keys.iter().map(|k| TxnOp::get(k.as_str(), None)).collect();
        let response = self
            .client
            .clone()
            .txn(Txn::new().and_then(gets))
            .await
            .map_err(unavailable)?;
        let mut out = Vec::new();
        for op in response.op_responses() {
            if let TxnOpResponse::Get(get) = op {
                for kv in get.kvs() {
                    let key = String::from_utf8_lossy(kv.key()).into_owned();
                    out.push(Existing::parse(key, kv.value(), kv.mod_revision()));
                }
            }
        }
        Ok(out)
    }

    /// Every record of the zone (the sweeps).
    pub async fn read_zone(&self) -> Result<Vec<Existing>> {
        let response = self
            .client
            .clone()
            .get(
                self.zone.key_prefix(),
                Some(GetOptions::new().with_prefix()),
            )
            .await
            .map_err(unavailable)?;
        Ok(response
            .kvs()
            .iter()
            .map(|kv| {
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                Existing::parse(key, kv.value(), kv.mod_revision())
            })
            .collect())
    }

    /// Applies `ops` at once, each conditional on its key's mod revision
    /// (0: absent). `Conflict` when any key moved since it was read.
    pub async fn apply(&self, ops: &[Op]) -> Result<()> {
        if ops.is_empty() {
            return Ok(());
        }
        let mut compares = Vec::new();
        let mut writes = Vec::new();
        for op in ops {
            match op {
                Op::Put {
                    key,
                    record,
                    mod_revision,
                } => {
                    compares.push(Compare::mod_revision(
                        key.as_str(),
                        CompareOp::Equal,
                        *mod_revision,
                    ));
                    let value = serde_json::to_vec(record)
                        .map_err(|e| RegistryError::Config(e.to_string()))?;
                    writes.push(TxnOp::put(key.as_str(), value, None));
                }
                Op::Delete { key, mod_revision } => {
                    compares.push(Compare::mod_revision(
                        key.as_str(),
                        CompareOp::Equal,
                        *mod_revision,
                    ));
                    writes.push(TxnOp::delete(key.as_str(), None));
                }
            }
        }
        let response = self
            .client
            .clone()
            .txn(Txn::new().when(compares).and_then(writes))
            .await
            .map_err(unavailable)?;
        if response.succeeded() {
            Ok(())
        } else {
            Err(RegistryError::Conflict)
        }
    }
}
