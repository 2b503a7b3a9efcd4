//! The Microservice controller for one cluster: watches Microservices and
//! their children, writes children through one door, and concludes a truthful
//! status. Everything it decides comes from `crate::domain`.

mod announce;
mod backoff;
mod child_watches;
mod children;
mod coalesce;
mod context;
mod controller;
mod created;
mod endpoints;
mod error;
pub mod names;
mod reconcile;
mod registered;
mod registration;
mod status_writer;
mod throttle;
mod triggers;
mod written;

pub use backoff::Backoff;
pub use context::{Hooks, Reconciled, Settings, WriterIdentity};
pub use controller::run;
pub use error::{ReconcileError, Result};
