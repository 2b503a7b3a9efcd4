//! The registry's etcd: consistent reads of our keys, and writes that are
//! transactions comparing every key's mod revision with the one read, so a
//! write planned on a stale read (a deposed leader's, a racing sweep's)
//! changes nothing.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity, PutOptions,
    TlsOptions, Txn, TxnOp, TxnOpResponse,
};

use super::records::{self, Existing, Op, RecordError, Refusal, Zone};

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
    /// Plaintext etcd, asked for (`--registry-insecure`): records steer
    /// traffic, so writing them unauthenticated is never a default.
    pub insecure: bool,
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

/// Who holds a fleet DNS writer's term, as stored at its term key.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Term {
    /// The term's number: past the last claim's and etcd's revision then.
    epoch: i64,
    holder: String,
    /// The Lease this term was won on: its uid and `leaseTransitions`.
    /// Empty in a term written before #59 (whose `epoch` was the Lease's).
    #[serde(default)]
    lease: String,
    #[serde(default)]
    lease_epoch: i64,
}

/// Who claims a term: this replica, at this term of this Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub holder: String,
    /// The Lease's uid: a recreated Lease is another one.
    pub lease: String,
    pub lease_epoch: i64,
}

enum Claimed<'a> {
    /// A later term of the same Lease holds it.
    Deposed(&'a Term),
    /// This very term holds it already, at this number.
    Ours(i64),
    /// Write this.
    Next(Term),
}

/// What a claim finds and does: refused by a later term of the same
/// Lease, its own already, or the next number. A term of another Lease
/// (deleted and recreated) never blocks: its holder lost that Lease.
fn term_after<'a>(found: Option<&'a Term>, claim: &Claim, revision: i64) -> Claimed<'a> {
    match found {
        Some(t) if t.lease == claim.lease && t.lease_epoch > claim.lease_epoch => {
            Claimed::Deposed(t)
        }
        Some(t)
            if t.lease == claim.lease
                && t.lease_epoch == claim.lease_epoch
                && t.holder == claim.holder =>
        {
            Claimed::Ours(t.epoch)
        }
        _ => Claimed::Next(Term {
            epoch: found.map_or(0, |t| t.epoch).max(revision) + 1,
            holder: claim.holder.clone(),
            lease: claim.lease.clone(),
            lease_epoch: claim.lease_epoch,
        }),
    }
}

/// TLS is complete or plaintext is asked for: a client certificate without
/// the CA that checks the server used to be dropped without a word.
fn check_transport(config: &RegistryConfig) -> Result<()> {
    let plaintext = config.endpoints.iter().any(|e| !e.starts_with("https://"));
    match (&config.ca, config.insecure) {
        (None, _) if config.cert.is_some() || config.key.is_some() => Err(RegistryError::Config(
            "--registry-cert and --registry-key need --registry-ca, the CA that signs etcd's certificate".into(),
        )),
        (None, false) => Err(RegistryError::Config(
            "the registry's etcd needs TLS (--registry-ca and https:// endpoints), or --registry-insecure for plaintext".into(),
        )),
        (Some(_), true) => Err(RegistryError::Config(
            "--registry-insecure and --registry-ca exclude each other".into(),
        )),
        (Some(_), false) if plaintext => Err(RegistryError::Config(
            "with --registry-ca every endpoint must be https://".into(),
        )),
        _ => Ok(()),
    }
}

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
    inner: Arc<Inner>,
    zone: Zone,
}

struct Inner {
    /// Replaced when the TLS files change; each call clones the current one.
    client: RwLock<Client>,
    config: RegistryConfig,
    /// The TLS files' bytes the client was built from.
    material: Mutex<Vec<u8>>,
}

fn read_file(what: &str, path: &PathBuf) -> Result<Vec<u8>> {
    std::fs::read(path)
        .map_err(|e| RegistryError::Config(format!("{what} {}: {e}", path.display())))
}

/// The connection options for `config`, and the bytes of the TLS files
/// they were read from (empty in plaintext).
fn options(config: &RegistryConfig) -> Result<(ConnectOptions, Vec<u8>)> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(5));
    let mut material = Vec::new();
    if let Some(ca) = &config.ca {
        let ca = read_file("CA", ca)?;
        material.extend_from_slice(&ca);
        let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(ca));
        match (&config.cert, &config.key) {
            (Some(cert), Some(key)) => {
                let (cert, key) = (read_file("certificate", cert)?, read_file("key", key)?);
                material.extend_from_slice(&cert);
                material.extend_from_slice(&key);
                tls = tls.identity(Identity::from_pem(cert, key));
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
    Ok((options, material))
}

async fn client(config: &RegistryConfig, options: ConnectOptions) -> Result<Client> {
    Client::connect(&config.endpoints, Some(options))
        .await
        .map_err(|e| match e {
            etcd_client::Error::InvalidArgs(m) => RegistryError::Config(m),
            etcd_client::Error::InvalidUri(e) => RegistryError::Config(e.to_string()),
            other => unavailable(other),
        })
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
        check_transport(config)?;
        let (opts, material) = options(config)?;
        let client = client(config, opts).await?;
        Ok(Registry {
            inner: Arc::new(Inner {
                client: RwLock::new(client),
                config: config.clone(),
                material: Mutex::new(material),
            }),
            zone,
        })
    }

    fn client(&self) -> Client {
        self.inner
            .client
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Reads the TLS files again; when their bytes changed and they load,
    /// later calls use a client built from them (cert-manager rotates the
    /// client certificate in place). Files that do not load keep the old
    /// client, counted in `flotilla_tls_reload_errors_total`.
    pub async fn reload(&self) -> bool {
        let config = &self.inner.config;
        if config.ca.is_none() {
            return false;
        }
        let built = match options(config) {
            Ok((opts, material)) => {
                if *self
                    .inner
                    .material
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    == material
                {
                    return false;
                }
                client(config, opts).await.map(|c| (c, material))
            }
            Err(e) => Err(e),
        };
        match built {
            Ok((client, material)) => {
                *self.inner.client.write().unwrap_or_else(|e| e.into_inner()) = client;
                *self
                    .inner
                    .material
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = material;
                tracing::info!("registry TLS files changed; new calls use them");
                true
            }
            Err(e) => {
                crate::telemetry::metrics::METRICS
                    .tls_reload_errors_total
                    .inc(&[]);
                tracing::warn!(error = %e, "registry TLS files changed but do not load; keeping the previous ones");
                false
            }
        }
    }

    /// Reloads every `period` for as long as any clone of this registry lives.
    pub fn watch_files(&self, period: Duration) {
        if self.inner.config.ca.is_none() {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        let zone = self.zone.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                let Some(inner) = weak.upgrade() else { return };
                Registry {
                    inner,
                    zone: zone.clone(),
                }
                .reload()
                .await;
            }
        });
    }

    pub fn zone(&self) -> &Zone {
        &self.zone
    }

    /// The current values of `keys`, read in one transaction.
    pub async fn read(&self, keys: &[String]) -> Result<Vec<Existing>> {
        let gets: Vec<TxnOp> = keys.iter().map(|k| TxnOp::get(k.as_str(), None)).collect();
        let response = self
            .client()
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
        self.read_under(&self.zone.key_prefix()).await
    }

    /// A watch of every key of the zone: the DNS writer reads the zone
    /// again when something in it changed, not on a timer (#31).
    pub async fn watch_zone(&self) -> Result<etcd_client::WatchStream> {
        self.client()
            .watch(
                self.zone.key_prefix(),
                Some(etcd_client::WatchOptions::new().with_prefix()),
            )
            .await
            .map_err(unavailable)
    }

    /// Every record whose key starts with `prefix`.
    pub async fn read_under(&self, prefix: &str) -> Result<Vec<Existing>> {
        let response = self
            .client()
            .get(prefix, Some(GetOptions::new().with_prefix()))
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

    /// The key that fences fleet `fleet`'s DNS writer: under the registry's
    /// path, outside the zone's tree, so CoreDNS never serves it.
    pub fn term_key(&self, fleet: &str) -> String {
        format!(
            "{}/_flotilla/dns-writers/{}/{fleet}",
            self.inner.config.path.trim_end_matches('/'),
            self.zone.name
        )
    }

    /// Takes the term at `key` for `claim`, unless a newer term of the same
    /// Lease holds it. The term number is past the stored one and etcd's
    /// revision, so it grows even when the Lease is deleted and recreated
    /// (its `leaseTransitions` start again, #59) or the key is lost. Returns the key's mod revision,
    /// which every write of this term checks (once a successor claims the
    /// key nothing of ours lands, #31), and the term number.
    pub async fn claim_term(&self, key: &str, claim: &Claim) -> Result<(i64, i64)> {
        let got = self.client().get(key, None).await.map_err(unavailable)?;
        let (found, read) = got.kvs().first().map_or((None, 0), |kv| {
            (
                serde_json::from_slice::<Term>(kv.value()).ok(),
                kv.mod_revision(),
            )
        });
        // etcd's revision only grows: past it, a number is newer than any
        // claimed before, even with the key lost or unreadable.
        let now = got.header().map_or(0, |h| h.revision());
        let next = match term_after(found.as_ref(), claim, now) {
            Claimed::Deposed(t) => {
                return Err(RegistryError::Refused(Refusal::Deposed {
                    key: key.to_string(),
                    cluster: t.holder.clone(),
                    epoch: t.lease_epoch,
                    ours: claim.lease_epoch,
                }));
            }
            Claimed::Ours(epoch) => return Ok((read, epoch)),
            Claimed::Next(t) => t,
        };
        let epoch = next.epoch;
        let value = serde_json::to_vec(&next).map_err(|e| RegistryError::Config(e.to_string()))?;
        let response = self
            .client()
            .txn(
                Txn::new()
                    .when([Compare::mod_revision(key, CompareOp::Equal, read)])
                    .and_then([TxnOp::put(key, value, None)]),
            )
            .await
            .map_err(unavailable)?;
        if !response.succeeded() {
            return Err(RegistryError::Conflict);
        }
        let revision = response
            .header()
            .map(|h| h.revision())
            .ok_or_else(|| RegistryError::Unavailable("etcd sent no revision".into()))?;
        Ok((revision, epoch))
    }

    /// The key that marks Microservice `uid` deleted (#67): under the
    /// registry's path, outside the zone's tree, so CoreDNS never serves it.
    pub fn tombstone_key(&self, uid: &str) -> String {
        format!(
            "{}/_flotilla/tombstones/{}/{uid}",
            self.inner.config.path.trim_end_matches('/'),
            self.zone.name
        )
    }

    /// Applies `ops` at once, each conditional on its key's mod revision
    /// (0: absent). `Conflict` when any key moved since it was read.
    pub async fn apply(&self, ops: &[Op]) -> Result<()> {
        if ops.is_empty() {
            return Ok(());
        }
        let (compares, writes) = txn_of(ops)?;
        self.commit(compares, writes).await
    }

    /// Writes Microservice `uid`'s records: `ops`, refused by etcd itself
    /// once the object's tombstone exists, so a write planned before its
    /// deletion (a deposed leader's, one held in transit) never brings a
    /// record back after it (#67).
    pub async fn register(&self, ops: &[Op], uid: &str) -> Result<()> {
        self.apply(&records::guarded(ops, &self.tombstone_key(uid)))
            .await
    }

    /// Removes Microservice `uid`'s records (`ops`, maybe none) and writes
    /// its tombstone in the same transaction: once this returns, no
    /// registration of `uid` lands (`register`). The tombstone lives
    /// `TOMBSTONE_TTL` under an etcd lease, so deletions leave no litter.
    pub async fn retire(&self, ops: &[Op], uid: &str) -> Result<()> {
        let (compares, mut writes) = txn_of(ops)?;
        let lease = self
            .client()
            .lease_grant(TOMBSTONE_TTL.as_secs() as i64, None)
            .await
            .map_err(unavailable)?
            .id();
        writes.push(TxnOp::put(
            self.tombstone_key(uid),
            "deleted",
            Some(PutOptions::new().with_lease(lease)),
        ));
        self.commit(compares, writes).await
    }

    async fn commit(&self, compares: Vec<Compare>, writes: Vec<TxnOp>) -> Result<()> {
        let response = self
            .client()
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

/// How long a deleted Microservice's tombstone refuses its records: far
/// longer than any write can be held in transit or a deposed leader stall.
pub const TOMBSTONE_TTL: Duration = Duration::from_secs(24 * 3600);

/// `ops` as one transaction's compares (each key at its mod revision, 0:
/// absent) and writes.
fn txn_of(ops: &[Op]) -> Result<(Vec<Compare>, Vec<TxnOp>)> {
    let mut compares = Vec::new();
    let mut writes = Vec::new();
    for op in ops {
        let (key, mod_revision) = match op {
            Op::Put {
                key, mod_revision, ..
            }
            | Op::Delete { key, mod_revision }
            | Op::Check { key, mod_revision } => (key, *mod_revision),
        };
        compares.push(Compare::mod_revision(
            key.as_str(),
            CompareOp::Equal,
            mod_revision,
        ));
        match op {
            Op::Put { key, record, .. } => {
                let value =
                    serde_json::to_vec(record).map_err(|e| RegistryError::Config(e.to_string()))?;
                writes.push(TxnOp::put(key.as_str(), value, None));
            }
            Op::Delete { key, .. } => writes.push(TxnOp::delete(key.as_str(), None)),
            Op::Check { .. } => {}
        }
    }
    Ok((compares, writes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> RegistryConfig {
        RegistryConfig {
            endpoints: vec!["https://127.0.0.1:2379".into()],
            zone: "fleet.example".into(),
            path: "/skydns".into(),
            ca: Some("ca.pem".into()),
            cert: None,
            key: None,
            insecure: false,
        }
    }

    fn refused(c: RegistryConfig) -> String {
        match check_transport(&c) {
            Err(e) => e.to_string(),
            Ok(()) => panic!("accepted: {c:?}"),
        }
    }

    #[test]
    fn tls_is_complete_or_plaintext_is_asked_for() {
        check_transport(&config()).unwrap();
        let identity_without_ca = RegistryConfig {
            ca: None,
            cert: Some("c.pem".into()),
            key: Some("k.pem".into()),
            ..config()
        };
        assert!(refused(identity_without_ca).contains("--registry-ca"));
        let plain = RegistryConfig {
            ca: None,
            endpoints: vec!["http://127.0.0.1:2379".into()],
            ..config()
        };
        assert!(refused(plain.clone()).contains("--registry-insecure"));
        check_transport(&RegistryConfig {
            insecure: true,
            ..plain
        })
        .unwrap();
        let mixed = RegistryConfig {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            ..config()
        };
        assert!(refused(mixed).contains("https://"));
        assert!(
            refused(RegistryConfig {
                insecure: true,
                ..config()
            })
            .contains("exclude")
        );
    }
}
