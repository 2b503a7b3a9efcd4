//! A placement with a count, and failover (#32): `rank` and `choose` are
//! pure; `types` is what the CRD carries. The rollout planner applies it.

pub mod choose;
pub mod rank;
pub mod types;
