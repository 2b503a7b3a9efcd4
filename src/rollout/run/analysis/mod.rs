//! The analysis checks' calls: one HTTP client, webhooks and Prometheus.
//! What a run sends and what it proves are `rollout::analysis`.

pub mod client;
pub mod prometheus;
pub mod webhook;
