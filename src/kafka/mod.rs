//! The Kafka side: consumers with manual assignment. They never subscribe and never commit to
//! Kafka; the stores hold the truth. librdkafka's statistics feed end and log-start offsets to each
//! partition's `Watermarks`, so end offsets are refreshed without a request per partition. The
//! worker reads them there and publishes what it decided on to the status board, which only workers
//! write and HTTP reads.
//!
//! Two consumers, one per kind of fetching. The tailing consumer holds every caught-up partition
//! and long-polls (`fetch.wait.max.ms`), which keeps an idle standby cheap for the brokers. The
//! catching-up consumer holds only the partitions catching up on their turn, which always have data
//! to fetch, so it waits at most `CATCHING_UP_FETCH_WAIT_MS`. With one consumer for both, a partition
//! given a turn waited for the outstanding long-poll over idle partitions before its first fetch:
//! up to `fetch.wait.max.ms` per turn (100 ms then), which made a restore of many small partitions
//! up to twice as slow with 4 turns, and 4.5 times with 1 (docs/restore.md).

pub mod batch;
pub mod consumers;
pub mod group;
pub mod statistics;
