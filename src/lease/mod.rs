//! Leadership through a Lease: client-go's rules as a pure decision
//! (`election`), the loop that applies them (`elector`), the conditional
//! Lease reads and writes (`lease_store`), the write fence that admits a
//! member write only within a term (`fence`), and the home cluster's
//! Leases held by the rollout and DNS leaders (`home_lease`).

pub mod election;
pub mod elector;
pub mod fence;
pub mod home_lease;
pub mod lease_store;
