//! The Microservice controller for one cluster: watches Microservices and
//! their children, writes children through one door, and concludes a truthful
//! status. Everything it decides comes from `crate::domain`.

mod backoff;
mod children;
mod context;
mod controller;
mod error;
mod reconcile;
mod status_writer;
mod strangers;
mod triggers;
mod written;

pub use backoff::Backoff;
pub use context::{Hooks, Reconciled, Settings, WriterIdentity};
pub use controller::run;
pub use error::{ReconcileError, Result};
