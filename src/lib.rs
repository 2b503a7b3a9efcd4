//! Flotilla: a multi-cluster fleet operator.
#![forbid(unsafe_code)]

pub mod cli;
pub mod crd;
pub mod domain;
pub mod fleet;
pub mod reconciler;
