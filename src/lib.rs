//! warmstore keeps local RocksDB copies of Kafka changelog topics warm.
//!
//! Each changelog partition is consumed ([`changelog`], [`restore`]) into its own store ([`store`]),
//! which keeps its applied offset inside itself, so a restart resumes where the store really is.
//! [`dirty`] decides which stores cannot be trusted and must be rebuilt; [`status`] is what every
//! partition is doing, served by [`http`] and [`metrics`].

pub mod changelog;
pub mod config;
pub mod demo;
pub mod descriptors;
pub mod dirty;
pub mod http;
pub mod inspect;
pub mod logging;
pub mod memory;
pub mod metrics;
pub mod restore;
pub mod service;
pub mod status;
pub mod store;
#[doc(hidden)]
pub mod testkit;
pub mod units;
