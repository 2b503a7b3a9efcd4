//! The fleet registry's records, as CoreDNS's etcd plugin reads them
//! (SkyDNS messages: JSON under `/skydns/<zone labels reversed>/...`), and
//! what to write so that etcd holds the records one Microservice should
//! have. Pure: the etcd calls are in `store.rs`.
//!
//! One Microservice `NAME` in `NAMESPACE` of cluster `CLUSTER` has two:
//! - `NAME.NAMESPACE.CLUSTER.cluster.ZONE`, at
//!   `<zone>/cluster/CLUSTER/NAMESPACE/NAME`;
//! - one member of the fleet-wide `NAME.NAMESPACE.ZONE`, at
//!   `<zone>/NAMESPACE/NAME/CLUSTER`: CoreDNS answers a name with every
//!   record below it, so that name lists every cluster that runs it.
//!
//! The two trees cannot overlap: cluster-scoped keys all sit under the
//! label `cluster`, which no fleet-wide name may use as its namespace. So
//! no Microservice's key can fall under another one's fleet-wide name (a
//! cluster named like a namespace once let one tenant answer for another).

use serde::{Deserialize, Serialize};

/// The finalizer that keeps a Microservice until its records are gone.
pub const FINALIZER: &str = "platform.example.io/registry";
/// CoreDNS's default etcd path.
pub const DEFAULT_PATH: &str = "/skydns";
/// The answers' TTL: short, since a Service can move between clusters.
pub const TTL_SECONDS: u32 = 30;
/// The label that holds every cluster-scoped name; a namespace of this
/// name gets no records.
pub const CLUSTER_TREE: &str = "cluster";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error(
        "{what} {value:?} is not a DNS label (1-63 of a-z, 0-9 and '-', not starting or ending with '-')"
    )]
    NotALabel { what: &'static str, value: String },
    #[error("zone {0:?} is not a DNS name")]
    BadZone(String),
    #[error("the Service has no ClusterIP yet")]
    NoAddress,
    #[error(
        "namespace {0:?} is reserved in the registry: NAME.{0}.ZONE would overlap the cluster-scoped names under {0}.ZONE, so this Microservice gets no records; use another namespace"
    )]
    ReservedNamespace(String),
}

fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn label<'a>(what: &'static str, value: &'a str) -> Result<&'a str, RecordError> {
    if is_label(value) {
        Ok(value)
    } else {
        Err(RecordError::NotALabel {
            what,
            value: value.to_string(),
        })
    }
}

/// The zone the registry serves, as an etcd key prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Zone {
    pub name: String,
    /// `/skydns/example/fleet` for `fleet.example`.
    pub prefix: String,
}

impl Zone {
    pub fn new(name: &str, path: &str) -> Result<Zone, RecordError> {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        let labels: Vec<&str> = name.split('.').collect();
        if name.is_empty() || !labels.iter().all(|l| is_label(l)) {
            return Err(RecordError::BadZone(name));
        }
        let path = path.trim_end_matches('/');
        let reversed: Vec<&str> = labels.into_iter().rev().collect();
        Ok(Zone {
            prefix: format!("{path}/{}", reversed.join("/")),
            name,
        })
    }

    /// Every key of this zone starts with this (a trailing '/' keeps
    /// `fleet.example` from matching `fleet.example2`).
    pub fn key_prefix(&self) -> String {
        format!("{}/", self.prefix)
    }
}

/// Who wrote a record: CoreDNS ignores the field; the sweep and the epoch
/// check read it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Writer {
    /// A member cluster's name, or `@FLEET` for a fleet's DNS writer.
    pub cluster: String,
    /// The leader's term (its Lease's transitions) when written; for the
    /// fleet DNS writer, the term etcd numbered.
    pub epoch: i64,
    /// The uid of the member Lease that term was won on (#59): a Lease
    /// deleted and recreated counts its terms from 1 again, so a term is
    /// newer only than the terms of its own Lease. Empty for the fleet DNS
    /// writer and in records written before #59.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub lease: String,
}

/// The prefix of a fleet DNS writer's name: no cluster name has it.
pub const FLEET_WRITER: char = '@';

impl Writer {
    /// The DNS writer of fleet `fleet`, at `epoch`.
    pub fn fleet(fleet: &str, epoch: i64) -> Writer {
        Writer {
            cluster: format!("{FLEET_WRITER}{fleet}"),
            epoch,
            lease: String::new(),
        }
    }

    /// Whether this writer's term is newer than `me`'s: the same writer, on
    /// the same Lease, at a later term. Records written before #59 carry no
    /// Lease, and fence only each other: a leader reads its Lease's uid
    /// before its first write.
    pub fn newer_than(&self, me: &Writer) -> bool {
        self.cluster == me.cluster && self.lease == me.lease && self.epoch > me.epoch
    }

    /// A fleet's DNS writer rather than a member's leader.
    pub fn is_fleet(&self) -> bool {
        self.cluster.starts_with(FLEET_WRITER)
    }
}

/// One SkyDNS message, as CoreDNS's etcd plugin decodes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub host: String,
    pub port: u16,
    pub ttl: u32,
    /// Which Microservice it stands for: namespace/name.
    #[serde(rename = "flotillaObject")]
    pub object: String,
    #[serde(rename = "flotillaWriter")]
    pub writer: Writer,
    /// Listed only because no cluster is healthy (the fleet DNS writer's
    /// fail-open, #31): every replica can tell a degraded answer from etcd.
    #[serde(
        rename = "flotillaFailOpen",
        default,
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub fail_open: bool,
    /// The Microservice's uid (#67): which object, not just which name, a
    /// record stands for, so a record left by a deleted object can be told
    /// from a new object's of the same name. Empty in records written
    /// before it existed.
    #[serde(
        rename = "flotillaUid",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub uid: String,
}

impl Record {
    /// Same answer for DNS clients, whoever wrote it.
    fn same_answer(&self, other: &Record) -> bool {
        self.host == other.host
            && self.port == other.port
            && self.ttl == other.ttl
            && self.object == other.object
            && self.writer.cluster == other.writer.cluster
            && self.uid == other.uid
    }
}

/// One Microservice's place in the registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub cluster: String,
    pub namespace: String,
    pub name: String,
}

impl Entry {
    /// Its two keys: the cluster's own name, then the fleet-wide one.
    pub fn keys(&self, zone: &Zone) -> Result<[String; 2], RecordError> {
        let cluster = label("cluster name", &self.cluster)?;
        let ns = label("namespace", &self.namespace)?;
        let name = label("name", &self.name)?;
        if ns == CLUSTER_TREE {
            return Err(RecordError::ReservedNamespace(ns.to_string()));
        }
        let p = &zone.prefix;
        Ok([
            format!("{p}/{CLUSTER_TREE}/{cluster}/{ns}/{name}"),
            format!("{p}/{ns}/{name}/{cluster}"),
        ])
    }

    /// [`Entry::desired_by`] its own cluster's writer at `epoch`.
    #[cfg(test)]
    pub fn desired(
        &self,
        zone: &Zone,
        host: Option<&str>,
        port: u16,
        epoch: i64,
    ) -> Result<Vec<(String, Record)>, RecordError> {
        let writer = Writer {
            cluster: self.cluster.clone(),
            epoch,
            lease: String::new(),
        };
        self.desired_by(zone, host, port, &writer)
    }

    /// The records it should have, for a Service at `host:port`, as
    /// `writer` writes them: its own name's, then its place in the
    /// fleet-wide one.
    pub fn desired_by(
        &self,
        zone: &Zone,
        host: Option<&str>,
        port: u16,
        writer: &Writer,
    ) -> Result<Vec<(String, Record)>, RecordError> {
        let host = host
            .filter(|h| !h.is_empty() && *h != "None")
            .ok_or(RecordError::NoAddress)?;
        let record = Record {
            host: host.to_string(),
            port,
            ttl: TTL_SECONDS,
            object: format!("{}/{}", self.namespace, self.name),
            writer: writer.clone(),
            fail_open: false,
            uid: String::new(),
        };
        Ok(self
            .keys(zone)?
            .into_iter()
            .map(|k| (k, record.clone()))
            .collect())
    }
}

/// A key as read from etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Existing {
    pub key: String,
    /// `None` when the value is not one of our records.
    pub record: Option<Record>,
    pub mod_revision: i64,
}

impl Existing {
    pub fn parse(key: String, value: &[u8], mod_revision: i64) -> Existing {
        Existing {
            key,
            record: serde_json::from_slice(value).ok(),
            mod_revision,
        }
    }
}

/// One conditional write: it applies only if the key is still as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Create (`mod_revision` 0: the key must not exist) or replace.
    Put {
        key: String,
        record: Record,
        mod_revision: i64,
    },
    Delete {
        key: String,
        mod_revision: i64,
    },
    /// No write: the others apply only if this key is still as read (the
    /// record a fleet-wide one is copied from, the writer's term).
    Check {
        key: String,
        mod_revision: i64,
    },
}

impl Op {
    pub fn key(&self) -> &str {
        match self {
            Op::Put { key, .. } | Op::Delete { key, .. } | Op::Check { key, .. } => key,
        }
    }
}

/// Why a plan refuses to write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "{key} was written by cluster {cluster}'s leader at term {epoch}, newer than ours ({ours})"
    )]
    Deposed {
        key: String,
        cluster: String,
        epoch: i64,
        ours: i64,
    },
    #[error("{key} holds a record this cluster did not write; it is left untouched")]
    Foreign { key: String },
}

/// A newer term of our own writer wrote it: we are not its leader any more.
pub fn newer_term(key: &str, found: &Record, me: &Writer) -> Result<(), Refusal> {
    if found.writer.newer_than(me) {
        return Err(Refusal::Deposed {
            key: key.to_string(),
            cluster: found.writer.cluster.clone(),
            epoch: found.writer.epoch,
            ours: me.epoch,
        });
    }
    Ok(())
}

fn find<'a>(existing: &'a [Existing], key: &str) -> Option<&'a Existing> {
    existing.iter().find(|e| e.key == key)
}

/// The writes that make `existing` hold `desired`: nothing when every
/// record already gives the same answer.
pub fn plan_register(
    desired: &[(String, Record)],
    existing: &[Existing],
    me: &Writer,
) -> Result<Vec<Op>, Refusal> {
    let mut ops = Vec::new();
    for (key, want) in desired {
        let Some(found) = find(existing, key) else {
            ops.push(Op::Put {
                key: key.clone(),
                record: want.clone(),
                mod_revision: 0,
            });
            continue;
        };
        let Some(record) = &found.record else {
            return Err(Refusal::Foreign { key: key.clone() });
        };
        if record.writer.cluster != me.cluster {
            return Err(Refusal::Foreign { key: key.clone() });
        }
        newer_term(key, record, me)?;
        if !record.same_answer(want) {
            ops.push(Op::Put {
                key: key.clone(),
                record: want.clone(),
                mod_revision: found.mod_revision,
            });
        }
    }
    Ok(ops)
}

/// `ops` that write a Microservice's records, refused by etcd once its
/// tombstone (`tombstone`, a key only its deletion writes) exists (#67).
pub fn guarded(ops: &[Op], tombstone: &str) -> Vec<Op> {
    let mut out = ops.to_vec();
    if !out.is_empty() {
        out.push(Op::Check {
            key: tombstone.to_string(),
            mod_revision: 0,
        });
    }
    out
}

/// The deletes that remove `keys` (those of one Microservice) from
/// `existing`; a key already gone needs nothing, and a record another
/// cluster wrote (or one that does not parse) is never removed.
pub fn plan_remove(
    keys: &[String],
    existing: &[Existing],
    me: &Writer,
) -> Result<Vec<Op>, Refusal> {
    let mut ops = Vec::new();
    for key in keys {
        let Some(found) = find(existing, key) else {
            continue;
        };
        match &found.record {
            Some(r) if r.writer.cluster == me.cluster => {
                newer_term(key, r, me)?;
                ops.push(Op::Delete {
                    key: key.clone(),
                    mod_revision: found.mod_revision,
                });
            }
            // Our cluster's place in the fleet-wide answer, kept by the
            // fleet's DNS writer: withdrawn with the Microservice, so no
            // client is sent to a Service that is gone (the key names this
            // cluster and this Microservice).
            Some(r) if r.writer.is_fleet() => {
                ops.push(Op::Delete {
                    key: key.clone(),
                    mod_revision: found.mod_revision,
                });
            }
            // Another's, or unreadable: left untouched, while our own
            // record under the other key still goes (#67: aborting the
            // whole plan let the finalizer go with our record in place).
            _ => continue,
        }
    }
    Ok(ops)
}

/// The sweep: this cluster's records (written at our term or before) whose
/// Microservice no longer exists, judged by `alive(namespace, name)`, or
/// that sit where its keys no longer are (an older layout). Another
/// cluster's records, and newer terms', are never touched.
pub fn plan_sweep(
    existing: &[Existing],
    me: &Writer,
    zone: &Zone,
    alive: impl Fn(&str, &str) -> bool,
) -> Vec<Op> {
    existing
        .iter()
        .filter_map(|e| {
            let r = e.record.as_ref()?;
            if r.writer.cluster != me.cluster || r.writer.newer_than(me) {
                return None;
            }
            let (ns, name) = r.object.split_once('/')?;
            let entry = Entry {
                cluster: me.cluster.clone(),
                namespace: ns.to_string(),
                name: name.to_string(),
            };
            let placed = entry.keys(zone).is_ok_and(|k| k.contains(&e.key));
            (!alive(ns, name) || !placed).then(|| Op::Delete {
                key: e.key.clone(),
                mod_revision: e.mod_revision,
            })
        })
        .collect()
}

/// The fleet's sweep: records of clusters no longer in the fleet, whose
/// leaders are gone and will not clean up after themselves.
pub fn plan_departed(existing: &[Existing], member: impl Fn(&str) -> bool) -> Vec<Op> {
    existing
        .iter()
        .filter_map(|e| {
            let r = e.record.as_ref()?;
            // A fleet DNS writer's records are its own to keep.
            (!r.writer.is_fleet() && !member(&r.writer.cluster)).then(|| Op::Delete {
                key: e.key.clone(),
                mod_revision: e.mod_revision,
            })
        })
        .collect()
}

#[cfg(test)]
#[path = "records_tests.rs"]
mod tests;
