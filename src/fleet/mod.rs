//! The fleet: per-cluster leader election (and, as it lands, the cluster
//! registry and sharding).

pub mod election;
pub mod elector;
pub mod lease_store;
pub mod shard;
