//! Health-aware fleet DNS (#31): one replica, holding the home Lease
//! `flotilla-<fleet>-dns`, keeps each fleet-wide name `NAME.NAMESPACE.ZONE`
//! listing the clusters where the Microservice is Available and reachable,
//! by each FleetMicroservice's strategy. Member leaders keep writing their
//! clusters' own names. `health.rs` is the rule, `plan.rs` the writes and
//! `view.rs` the explanation (all pure); `writer.rs` runs them,
//! `condition.rs` keeps `FleetDnsDegraded` and `lookup.rs` reads a name
//! for `flotilla dns`.

pub mod condition;
pub mod health;
pub mod lookup;
pub mod plan;
pub mod view;
pub mod writer;
