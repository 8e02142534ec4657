//! warmstore keeps local RocksDB copies of Kafka changelog topics warm.
//!
//! Each changelog partition is consumed into its own store ([`store`]), which keeps its applied
//! offset inside itself, so a restart resumes where the store really is. [`dirty`] decides which
//! stores cannot be trusted and must be rebuilt.

pub mod dirty;
pub mod inspect;
pub mod store;
#[doc(hidden)]
pub mod testkit;
pub mod units;
