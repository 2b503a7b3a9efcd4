//! The rollout's I/O shell: everything that talks to an apiserver or a
//! webhook. The decisions are the pure modules beside it (`plan`,
//! `checked`, `analysis`, `write_log`, ...).

pub mod analysis;
pub mod cache;
pub mod controller;
pub mod edits;
pub mod error;
pub mod home;
pub mod members;
