//! Reading and conditionally writing one coordination.k8s.io Lease.

use std::future::Future;

use futures::stream::{BoxStream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;

use super::election::LeaseRecord;

/// The annotation through which an assigned owner asks the holder for the Lease.
pub const ANNOTATION_HANDOFF: &str = "platform.example.io/handoff-to";

/// A Lease as read: the election record plus what a conditional write needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Versioned {
    pub record: LeaseRecord,
    pub resource_version: String,
    pub acquire_time: Option<MicroTime>,
    /// The object as read, so that a replace keeps its labels, annotations
    /// and fields this operator does not know.
    pub object: Option<Lease>,
}

impl Versioned {
    /// The holder's renew time as written: an opaque token of its last
    /// write, which a handoff request leaves alone (`election::observe`).
    pub fn renew_mark(&self) -> Option<String> {
        let renewed = self.object.as_ref()?.spec.as_ref()?.renew_time.as_ref()?;
        Some(renewed.0.to_string())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Someone wrote the Lease since we read it: we lost this round.
    #[error("the lease changed since it was read")]
    Conflict,
    #[error("lease request failed: {0}")]
    Api(#[source] kube::Error),
    /// A fault injected by a test, standing in for a network partition.
    #[error("lease store unavailable: {0}")]
    Unavailable(String),
    /// The round took longer than its budget (client-go's RenewDeadline).
    #[error("lease round timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// The server returned a Lease without a resourceVersion.
    #[error("lease has no resourceVersion")]
    NoVersion,
}

impl LeaseError {
    pub fn category(&self) -> &'static str {
        match self {
            LeaseError::Conflict => "Conflict",
            LeaseError::Api(_) => "ApiError",
            LeaseError::Unavailable(_) => "Unavailable",
            LeaseError::Timeout(_) => "Timeout",
            LeaseError::NoVersion => "Malformed",
        }
    }
}

fn api_error(e: kube::Error) -> LeaseError {
    match &e {
        kube::Error::Api(s) if s.is_conflict() || s.is_already_exists() => LeaseError::Conflict,
        _ => LeaseError::Api(e),
    }
}

/// Where a Lease lives. The elector's rounds use only the reads and
/// conditional writes; `changes` only says when to run one.
pub trait LeaseStore: Send + Sync {
    /// Yields when the Lease may have changed (a watch), so that an owner
    /// waiting for a Lease held elsewhere runs its round the moment the
    /// holder lets go, not at its next retry. `None`: polling only.
    fn changes(&self) -> Option<BoxStream<'static, ()>> {
        None
    }
    fn get(&self) -> impl Future<Output = Result<Option<Versioned>, LeaseError>> + Send;
    fn create(
        &self,
        record: &LeaseRecord,
    ) -> impl Future<Output = Result<Versioned, LeaseError>> + Send;
    /// Replaces the Lease only if it still has `read.resource_version`.
    fn update(
        &self,
        read: &Versioned,
        record: &LeaseRecord,
        acquired: bool,
    ) -> impl Future<Output = Result<Versioned, LeaseError>> + Send;
    /// Like `update`, for a candidate that does not hold the Lease (a
    /// handoff request): the holder's times stay as the holder wrote them.
    fn annotate(
        &self,
        read: &Versioned,
        record: &LeaseRecord,
    ) -> impl Future<Output = Result<Versioned, LeaseError>> + Send {
        self.update(read, record, false)
    }
}

/// A Lease in a Kubernetes cluster.
#[derive(Clone)]
pub struct KubeLeaseStore {
    api: Api<Lease>,
    name: String,
}

impl KubeLeaseStore {
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        KubeLeaseStore {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
        }
    }

    /// The Lease's uid while `holder` holds it at `epoch` (its
    /// `leaseTransitions`); `None` once it does not. A Lease deleted and
    /// recreated is another uid, whose terms count again from 1, so a
    /// fence that outlives one Lease names its uid (#59).
    pub async fn held_uid(&self, holder: &str, epoch: i32) -> Result<Option<String>, kube::Error> {
        let Some(l) = self.api.get_opt(&self.name).await? else {
            return Ok(None);
        };
        let held = l.spec.as_ref().is_some_and(|s| {
            s.lease_transitions == Some(epoch) && s.holder_identity.as_deref() == Some(holder)
        });
        Ok(l.metadata.uid.filter(|_| held))
    }

    fn versioned(lease: Lease) -> Result<Versioned, LeaseError> {
        let spec = lease.spec.clone().unwrap_or_default();
        let resource_version = lease
            .metadata
            .resource_version
            .clone()
            .ok_or(LeaseError::NoVersion)?;
        let handoff_to = lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_HANDOFF))
            .filter(|h| !h.is_empty())
            .cloned();
        Ok(Versioned {
            record: LeaseRecord {
                holder: spec.holder_identity.unwrap_or_default(),
                lease_duration_seconds: spec.lease_duration_seconds.unwrap_or(0),
                transitions: spec.lease_transitions.unwrap_or(0),
                handoff_to,
            },
            resource_version,
            acquire_time: spec.acquire_time,
            object: Some(lease),
        })
    }

    /// `base` with the record written over it; everything else is kept.
    fn lease(
        &self,
        base: Option<&Lease>,
        record: &LeaseRecord,
        resource_version: Option<String>,
        acquire_time: Option<MicroTime>,
        renewed: bool,
    ) -> Lease {
        let mut lease = base.cloned().unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                ..ObjectMeta::default()
            },
            spec: None,
        });
        lease.metadata.resource_version = resource_version;
        let annotations = lease.metadata.annotations.get_or_insert_default();
        match &record.handoff_to {
            Some(h) => {
                annotations.insert(ANNOTATION_HANDOFF.to_string(), h.clone());
            }
            None => {
                annotations.remove(ANNOTATION_HANDOFF);
            }
        }
        if annotations.is_empty() {
            lease.metadata.annotations = None;
        }
        // Wall-clock times are for people and audits; expiry never reads them.
        let now = MicroTime(jiff::Timestamp::now());
        let spec = lease.spec.get_or_insert_default();
        spec.holder_identity = (!record.holder.is_empty()).then(|| record.holder.clone());
        spec.lease_duration_seconds = Some(record.lease_duration_seconds);
        spec.lease_transitions = Some(record.transitions);
        spec.acquire_time = acquire_time;
        if renewed {
            spec.renew_time = Some(now);
        }
        lease
    }

    /// A replace conditioned on the resourceVersion that was read.
    async fn replace(
        &self,
        read: &Versioned,
        record: &LeaseRecord,
        acquire_time: Option<MicroTime>,
        renewed: bool,
    ) -> Result<Versioned, LeaseError> {
        let lease = self.lease(
            read.object.as_ref(),
            record,
            Some(read.resource_version.clone()),
            acquire_time,
            renewed,
        );
        let updated = self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
            .map_err(api_error)?;
        Self::versioned(updated)
    }
}

/// Which events of one Lease's watch wake a candidate waiting for it: a
/// change of holder (a release, a takeover, a deletion) and the end of each
/// listing (a release between the round's read and the watch's start is in
/// it). The holder's renewals and handover requests do not, so a waiting
/// candidate reads no more often than it polls. Pure.
#[derive(Debug, Default)]
struct HolderChanges {
    /// The holder last seen; `None` before a listing or after a deletion.
    last: Option<Option<String>>,
}

impl HolderChanges {
    fn wakes(&mut self, event: &kube::runtime::watcher::Event<Lease>) -> bool {
        use kube::runtime::watcher::Event;
        let holder = |l: &Lease| l.spec.as_ref().and_then(|s| s.holder_identity.clone());
        match event {
            Event::InitApply(l) => {
                self.last = Some(holder(l));
                false
            }
            Event::InitDone => true,
            Event::Apply(l) => {
                let now = Some(holder(l));
                std::mem::replace(&mut self.last, now.clone()) != now
            }
            Event::Delete(_) => {
                self.last = None;
                true
            }
            Event::Init => false,
        }
    }
}

impl LeaseStore for KubeLeaseStore {
    fn changes(&self) -> Option<BoxStream<'static, ()>> {
        use kube::runtime::watcher;
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.name));
        let mut changes = HolderChanges::default();
        Some(
            crate::watching::retried(watcher(self.api.clone(), config))
                .filter_map(move |event| {
                    let wake = event.as_ref().is_ok_and(|e| changes.wakes(e));
                    std::future::ready(wake.then_some(()))
                })
                .boxed(),
        )
    }

    async fn get(&self) -> Result<Option<Versioned>, LeaseError> {
        self.api
            .get_opt(&self.name)
            .await
            .map_err(api_error)?
            .map(Self::versioned)
            .transpose()
    }

    async fn create(&self, record: &LeaseRecord) -> Result<Versioned, LeaseError> {
        let now = MicroTime(jiff::Timestamp::now());
        let lease = self.lease(None, record, None, Some(now), true);
        let created = self
            .api
            .create(&PostParams::default(), &lease)
            .await
            .map_err(api_error)?;
        Self::versioned(created)
    }

    async fn update(
        &self,
        read: &Versioned,
        record: &LeaseRecord,
        acquired: bool,
    ) -> Result<Versioned, LeaseError> {
        let acquire_time = if acquired {
            Some(MicroTime(jiff::Timestamp::now()))
        } else {
            read.acquire_time.clone()
        };
        self.replace(read, record, acquire_time, true).await
    }

    async fn annotate(
        &self,
        read: &Versioned,
        record: &LeaseRecord,
    ) -> Result<Versioned, LeaseError> {
        self.replace(read, record, read.acquire_time.clone(), false)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A client that is never called: building a Lease does no I/O.
    fn store() -> KubeLeaseStore {
        let svc = tower::service_fn(|_: http::Request<kube::client::Body>| async {
            Err::<http::Response<kube::client::Body>, _>(std::io::Error::other("no I/O here"))
        });
        KubeLeaseStore::new(kube::Client::new(svc, "default"), "ns", "flotilla-x")
    }

    fn held_by(holder: Option<&str>, handoff_to: Option<&str>, renewed: &str) -> Lease {
        let mut lease = Lease::default();
        lease.metadata.resource_version = Some(renewed.into());
        lease.metadata.annotations =
            handoff_to.map(|to| [(ANNOTATION_HANDOFF.to_string(), to.to_string())].into());
        lease.spec = Some(k8s_openapi::api::coordination::v1::LeaseSpec {
            holder_identity: holder.map(str::to_string),
            ..Default::default()
        });
        lease
    }

    #[test]
    fn a_waiting_candidate_wakes_on_a_new_holder_not_on_renewals() {
        use kube::runtime::watcher::Event;
        let mut changes = HolderChanges::default();
        let mut wakes = |e: Event<Lease>| changes.wakes(&e);
        // The listing ends with a wake: a release may lie before it.
        assert!(!wakes(Event::Init));
        assert!(!wakes(Event::InitApply(held_by(Some("a"), None, "1"))));
        assert!(wakes(Event::InitDone));
        // Renewals and a handover request change no holder.
        assert!(!wakes(Event::Apply(held_by(Some("a"), None, "2"))));
        assert!(!wakes(Event::Apply(held_by(Some("a"), Some("b"), "3"))));
        // A release, a takeover, a deletion, a creation: each wakes once.
        assert!(wakes(Event::Apply(held_by(None, None, "4"))));
        assert!(!wakes(Event::Apply(held_by(None, None, "5"))));
        assert!(wakes(Event::Apply(held_by(Some("b"), None, "6"))));
        assert!(wakes(Event::Delete(held_by(Some("b"), None, "7"))));
        assert!(wakes(Event::Apply(held_by(Some("b"), None, "8"))));
        // A relisting after a watch error wakes: it may have missed one.
        assert!(!wakes(Event::Init));
        assert!(!wakes(Event::InitApply(held_by(Some("b"), None, "9"))));
        assert!(wakes(Event::InitDone));
        assert!(!wakes(Event::Apply(held_by(Some("b"), None, "10"))));
    }

    fn record(holder: &str, handoff_to: Option<&str>) -> LeaseRecord {
        LeaseRecord {
            holder: holder.into(),
            lease_duration_seconds: 15,
            transitions: 3,
            handoff_to: handoff_to.map(str::to_string),
        }
    }

    #[tokio::test]
    async fn a_replace_keeps_what_others_put_on_the_lease() {
        let mut base = Lease::default();
        base.metadata.name = Some("flotilla-x".into());
        base.metadata.labels = Some(BTreeMap::from([("team".into(), "platform".into())]));
        base.metadata.annotations = Some(BTreeMap::from([("note".into(), "keep".into())]));
        let written = store().lease(
            Some(&base),
            &record("a", Some("b")),
            Some("7".into()),
            None,
            true,
        );
        assert_eq!(written.metadata.labels, base.metadata.labels);
        let annotations = written.metadata.annotations.clone().unwrap();
        assert_eq!(annotations["note"], "keep");
        assert_eq!(annotations[ANNOTATION_HANDOFF], "b");
        assert_eq!(written.metadata.resource_version.as_deref(), Some("7"));
        // Releasing clears the request and nothing else.
        let released = store().lease(
            Some(&written),
            &record("", None),
            Some("8".into()),
            None,
            true,
        );
        let annotations = released.metadata.annotations.unwrap();
        assert!(!annotations.contains_key(ANNOTATION_HANDOFF));
        assert_eq!(annotations["note"], "keep");
        assert_eq!(released.spec.unwrap().holder_identity, None);
    }

    #[tokio::test]
    async fn a_handoff_request_leaves_the_holders_renew_time_alone() {
        let base = Lease {
            spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                renew_time: Some(MicroTime("2026-01-01T00:00:00Z".parse().unwrap())),
                ..Default::default()
            }),
            ..Default::default()
        };
        let asked = store().lease(
            Some(&base),
            &record("a", Some("b")),
            Some("2".into()),
            None,
            false,
        );
        assert_eq!(
            asked.spec.unwrap().renew_time,
            base.spec.unwrap().renew_time
        );
    }
}
