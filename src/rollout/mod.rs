//! Fleet rollouts: a `FleetMicroservice` in the home cluster, placed on
//! member clusters by label and rolled out in waves. `spec`, `checked`, `approval`, `analysis` (but its webhook), `placement`,
//! `failover` (but its types), `revision`, `gate`, `leaving`, `trouble`, `window`, `plan`, `fold` and `events` are pure; the controller does the I/O.

pub mod analysis;
pub mod approval;
pub mod cache;
pub mod checked;
pub mod controller;
pub mod edits;
pub mod error;
pub mod events;
pub mod failover;
pub mod fold;
pub mod gate;
pub mod home;
pub mod leaving;
pub mod members;
pub mod observe;
pub mod placement;
pub mod plan;
pub mod revision;
pub mod spec;
pub mod trouble;
pub mod window;
pub mod write_log;
