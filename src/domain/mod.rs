//! The pure core: desired state, diffing, ownership, conditions and status.
//! Nothing here talks to an API server; every function is a computation that
//! unit tests can drive in microseconds.

pub mod conditions;
pub mod contains;
pub mod desired;
pub mod digest;
pub mod duration;
pub mod egress;
pub mod image;
pub mod names;
pub mod ownership;
pub mod status;
pub mod update;
pub mod validate;

#[cfg(test)]
pub mod fixtures;

use kube::Resource;

use crate::crd::Microservice;

/// Errors of the pure core.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum DomainError {
    /// The spec passed the CRD schema but cannot be turned into valid children.
    #[error("invalid spec: {0}")]
    InvalidSpec(String),
    /// The object lacks metadata the API server always sets (name, namespace, uid).
    #[error("object has no metadata.{0}")]
    MissingMetadata(&'static str),
}

impl DomainError {
    /// A bounded label for metrics and Event reasons.
    pub fn category(&self) -> &'static str {
        match self {
            DomainError::InvalidSpec(_) => "InvalidSpec",
            DomainError::MissingMetadata(_) => "MissingMetadata",
        }
    }
}

/// Who owns the children: enough of the CR to write and check ownerReferences.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerIdentity {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

impl OwnerIdentity {
    pub fn of(ms: &Microservice) -> Result<Self, DomainError> {
        let meta = ms.meta();
        Ok(OwnerIdentity {
            api_version: Microservice::api_version(&()).into_owned(),
            kind: Microservice::kind(&()).into_owned(),
            name: meta
                .name
                .clone()
                .ok_or(DomainError::MissingMetadata("name"))?,
            namespace: meta
                .namespace
                .clone()
                .ok_or(DomainError::MissingMetadata("namespace"))?,
            uid: meta
                .uid
                .clone()
                .ok_or(DomainError::MissingMetadata("uid"))?,
        })
    }
}
