//! Flotilla: a multi-cluster fleet operator.
#![forbid(unsafe_code)]

pub mod crd;
pub mod domain;
