//! Flotilla: a multi-cluster fleet operator.
#![forbid(unsafe_code)]

pub mod api;
pub mod authz;
pub mod cli;
pub mod crd;
pub mod crd_reference;
pub mod dns;
pub mod domain;
pub mod fleet;
pub mod join;
pub mod lease;
pub mod limits;
pub mod reconciler;
pub mod registry;
pub mod rollout;
pub mod serve;
pub mod status;
pub mod supervise;
pub mod telemetry;
pub mod ui;
pub mod watching;

#[cfg(test)]
#[path = "house_tests.rs"]
mod house;
