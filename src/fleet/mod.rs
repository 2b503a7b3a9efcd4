//! The fleet: the cluster registry, replica heartbeats, balanced sharding
//! and one leader per member cluster through its Lease.

pub mod client_budget;
pub mod cluster;
pub mod credentials;
pub mod labels;
pub mod live_reads;
pub mod member_clients;
pub mod registry;
pub mod replicas;
pub mod runtime;
pub mod shard;
