//! Health-aware fleet DNS (#31): one replica, holding the home Lease
//! `flotilla-<fleet>-dns`, keeps each fleet-wide name `NAME.NAMESPACE.ZONE`
//! listing the clusters where the Microservice is Available and reachable.
//! Member leaders keep writing their clusters' own names. `health.rs` is
//! the rule and `plan.rs` the writes (both pure); `writer.rs` runs them.

pub mod health;
pub mod plan;
pub mod writer;
