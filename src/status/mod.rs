//! The fleet-wide status every replica serves: a pure index of all member
//! clusters' Microservices (`index`, `view`, `selector`), the hub that shares
//! it between tasks, and the read-only watches that feed it (`feed`, with `stall` proving a
//! silent one behind); `live` is what a wait reads from the members themselves.

pub mod feed;
pub mod hub;
pub mod index;
pub mod live;
pub mod selector;
pub mod stall;
pub mod view;
pub mod watch;
