//! warmstore keeps local RocksDB copies of Kafka changelog topics warm.
//!
//! Each changelog partition is consumed ([`kafka`]) by the restore engine ([`restore`]: one task
//! per partition, its phases, the turns catch-ups take) into its own store ([`store`]), which keeps
//! its applied offset inside itself, so a restart resumes where the store really is.
//! [`store::dirty`] decides which stores cannot be trusted and must be rebuilt; [`observe`] shows
//! what every partition is doing, over HTTP, in metrics and in the logs. [`service`] puts the
//! engine and the HTTP server together for `warmstore run`.
//!
//! To follow one record from the consumer into a commit, start at `restore/worker/records.rs`:
//! `take_batch` polls the partition's queue and puts each record into the store's uncommitted
//! buffer, and `fetch` commits it with its offset when `restore::policy::commit_due` says so.
//! `restore/worker.rs` around it runs the partition's life: open, the phases, close.

pub mod config;
pub mod kafka;
pub mod memory;
pub mod observe;
pub mod restore;
pub mod service;
pub mod store;
#[doc(hidden)]
pub mod testkit;
pub mod units;
