//! Command-line helpers: duration parsing, and the status commands'
//! output (`output`, pure) and calls (`remote`).

pub mod args;
pub mod cluster;
#[cfg(test)]
mod doc_examples;
pub mod output;
pub mod remote;
pub mod rollout;
pub mod rollout_output;
pub mod wait;

pub use crate::domain::duration::parse_duration;
