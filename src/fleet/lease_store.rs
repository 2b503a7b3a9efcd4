//! Reading and conditionally writing one coordination.k8s.io Lease.

use std::future::Future;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;

use super::election::LeaseRecord;

/// A Lease as read: the election record plus what a conditional write needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Versioned {
    pub record: LeaseRecord,
    pub resource_version: String,
    pub acquire_time: Option<MicroTime>,
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
}

impl LeaseError {
    pub fn category(&self) -> &'static str {
        match self {
            LeaseError::Conflict => "Conflict",
            LeaseError::Api(_) => "ApiError",
            LeaseError::Unavailable(_) => "Unavailable",
        }
    }
}

fn api_error(e: kube::Error) -> LeaseError {
    match &e {
        kube::Error::Api(s) if s.is_conflict() || s.is_already_exists() => LeaseError::Conflict,
        _ => LeaseError::Api(e),
    }
}

/// Where a Lease lives. The elector only ever uses these three calls.
pub trait LeaseStore: Send + Sync {
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

    fn versioned(lease: Lease) -> Versioned {
        let spec = lease.spec.unwrap_or_default();
        Versioned {
            record: LeaseRecord {
                holder: spec.holder_identity.unwrap_or_default(),
                lease_duration_seconds: spec.lease_duration_seconds.unwrap_or(0),
                transitions: spec.lease_transitions.unwrap_or(0),
                renew_marker: spec.renew_time.as_ref().map(|t| t.0.to_string()),
            },
            resource_version: lease.metadata.resource_version.unwrap_or_default(),
            acquire_time: spec.acquire_time,
        }
    }

    fn lease(
        &self,
        record: &LeaseRecord,
        resource_version: Option<String>,
        acquire_time: Option<MicroTime>,
    ) -> Lease {
        // Wall-clock times are for people and audits; expiry never reads them.
        let now = MicroTime(jiff::Timestamp::now());
        Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                resource_version,
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: (!record.holder.is_empty()).then(|| record.holder.clone()),
                lease_duration_seconds: Some(record.lease_duration_seconds),
                lease_transitions: Some(record.transitions),
                acquire_time,
                renew_time: Some(now),
                ..LeaseSpec::default()
            }),
        }
    }
}

impl LeaseStore for KubeLeaseStore {
    async fn get(&self) -> Result<Option<Versioned>, LeaseError> {
        Ok(self
            .api
            .get_opt(&self.name)
            .await
            .map_err(api_error)?
            .map(Self::versioned))
    }

    async fn create(&self, record: &LeaseRecord) -> Result<Versioned, LeaseError> {
        let now = MicroTime(jiff::Timestamp::now());
        let lease = self.lease(record, None, Some(now));
        let created = self
            .api
            .create(&PostParams::default(), &lease)
            .await
            .map_err(api_error)?;
        Ok(Self::versioned(created))
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
        let lease = self.lease(record, Some(read.resource_version.clone()), acquire_time);
        let updated = self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
            .map_err(api_error)?;
        Ok(Self::versioned(updated))
    }
}
