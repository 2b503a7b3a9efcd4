//! Fleet rollouts: a `FleetMicroservice` in the home cluster, placed on
//! member clusters by label and rolled out in waves.
//!
//! Everything here is pure but `run/`, the I/O shell: the controller that
//! plans each FleetMicroservice and writes, the home and member clients,
//! the caches, the edits the API makes, and the analysis checks' HTTP calls.

pub mod analysis;
pub mod approval;
pub mod barrier;
pub mod checked;
pub mod events;
pub mod failover;
pub mod fold;
pub mod gate;
pub mod leaving;
pub mod observe;
pub mod placement;
pub mod plan;
pub mod revision;
pub mod run;
pub mod spec;
pub mod trouble;
pub mod window;
pub mod write_log;
