//! What every store partition is doing, shared between the restore workers (which write it once per
//! batch) and the readers: HTTP endpoints, metrics, the demo's progress bar. Plain atomics, so the
//! restore loop never waits for a reader.

use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};

use super::group::GroupView;
use crate::store::dirty::WipeReason;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PartitionState {
    Opening,
    Wiping,
    Restoring,
    CaughtUp,
    Failed,
    /// Group mode: revoked, closed, and kept on disk for `keep_unassigned`.
    Unassigned,
}

impl PartitionState {
    pub const ALL: [PartitionState; 6] = [
        PartitionState::Opening,
        PartitionState::Wiping,
        PartitionState::Restoring,
        PartitionState::CaughtUp,
        PartitionState::Failed,
        PartitionState::Unassigned,
    ];

    pub fn label(self) -> &'static str {
        match self {
            PartitionState::Opening => "opening",
            PartitionState::Wiping => "wiping",
            PartitionState::Restoring => "restoring",
            PartitionState::CaughtUp => "caught_up",
            PartitionState::Failed => "failed",
            PartitionState::Unassigned => "unassigned",
        }
    }

    fn from_u8(v: u8) -> Self {
        Self::ALL
            .get(v as usize)
            .copied()
            .unwrap_or(PartitionState::Failed)
    }
}

/// Live figures of one store partition. Offsets are -1 while unknown.
#[derive(Debug)]
pub struct PartitionStatus {
    pub store: String,
    pub topic: String,
    pub partition: i32,
    pub db_dir: PathBuf,
    state: AtomicU8,
    pub applied: AtomicI64,
    pub position: AtomicI64,
    pub end_offset: AtomicI64,
    pub log_start: AtomicI64,
    /// Offset and end offset when the current catch-up began (progress ratio's baseline).
    pub catchup_from: AtomicI64,
    pub catchup_target: AtomicI64,
    pub records: AtomicU64,
    pub bytes: AtomicU64,
    pub null_keys: AtomicU64,
    pub commits: AtomicU64,
    pub unclean_shutdowns: AtomicU64,
    wipes: [AtomicU64; WipeReason::ALL.len()],
    /// Records applied per second, smoothed; stored as f64 bits.
    pub rate_bits: AtomicU64,
    /// Timestamp (ms) of the last record taken from the log; -1 before the first. While lagging,
    /// the oldest record not yet applied is at least this old, which estimates `restore_lag_seconds`.
    pub last_record_ts_ms: AtomicI64,
    /// Behind, but waiting for its turn (`catch_up_turns`): no progress is expected yet.
    pub waiting: AtomicBool,
    /// Fetched by the catching-up consumer (it holds a turn), not the tailing one.
    pub catching_up: AtomicBool,
    /// Commit latency, labelled like the other per-partition metrics.
    pub commit_seconds: prometheus::Histogram,
    pub estimated_keys: AtomicU64,
    pub disk_bytes: AtomicU64,
    error: Mutex<Option<String>>,
}

impl PartitionStatus {
    pub fn new(store: &str, topic: &str, partition: i32, db_dir: PathBuf) -> Self {
        PartitionStatus {
            store: store.into(),
            topic: topic.into(),
            partition,
            db_dir,
            state: AtomicU8::new(PartitionState::Opening as u8),
            applied: AtomicI64::new(-1),
            position: AtomicI64::new(-1),
            end_offset: AtomicI64::new(-1),
            log_start: AtomicI64::new(-1),
            catchup_from: AtomicI64::new(-1),
            catchup_target: AtomicI64::new(-1),
            records: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            null_keys: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            unclean_shutdowns: AtomicU64::new(0),
            wipes: Default::default(),
            rate_bits: AtomicU64::new(0f64.to_bits()),
            last_record_ts_ms: AtomicI64::new(-1),
            waiting: AtomicBool::new(false),
            catching_up: AtomicBool::new(false),
            commit_seconds: commit_histogram(store, topic, partition),
            estimated_keys: AtomicU64::new(0),
            disk_bytes: AtomicU64::new(0),
            error: Mutex::new(None),
        }
    }

    pub fn state(&self) -> PartitionState {
        PartitionState::from_u8(self.state.load(Relaxed))
    }

    /// Sets the state; entering `failed` records the error, leaving it clears it.
    pub fn set_state(&self, state: PartitionState, error: Option<String>) {
        self.state.store(state as u8, Relaxed);
        if let Ok(mut slot) = self.error.lock() {
            *slot = error;
        }
    }

    pub fn error(&self) -> Option<String> {
        self.error.lock().ok().and_then(|e| e.clone())
    }

    pub fn count_wipe(&self, reason: WipeReason) {
        let i = WipeReason::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        self.wipes[i].fetch_add(1, Relaxed);
    }

    pub fn wipes(&self, reason: WipeReason) -> u64 {
        let i = WipeReason::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        self.wipes[i].load(Relaxed)
    }

    pub fn rate(&self) -> f64 {
        f64::from_bits(self.rate_bits.load(Relaxed))
    }

    /// Records between the consumer position and the end offset; never negative.
    pub fn lag(&self) -> Option<i64> {
        let (position, end) = (self.position.load(Relaxed), self.end_offset.load(Relaxed));
        (position >= 0 && end >= 0).then(|| crate::restore::policy::lag(position, end))
    }

    pub fn snapshot(&self) -> PartitionSnapshot {
        let opt = |v: i64| (v >= 0).then_some(v);
        PartitionSnapshot {
            store: self.store.clone(),
            topic: self.topic.clone(),
            partition: self.partition,
            state: self.state(),
            applied_offset: opt(self.applied.load(Relaxed)),
            position: opt(self.position.load(Relaxed)),
            end_offset: opt(self.end_offset.load(Relaxed)),
            log_start_offset: opt(self.log_start.load(Relaxed)),
            lag: self.lag(),
            waiting: self.waiting.load(Relaxed),
            records: self.records.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            wipes: WipeReason::ALL.iter().map(|r| self.wipes(*r)).sum(),
            error: self.error(),
            path: self.db_dir.clone(),
        }
    }
}

fn commit_histogram(store: &str, topic: &str, partition: i32) -> prometheus::Histogram {
    let opts =
        prometheus::HistogramOpts::new("warmstore_commit_duration_seconds", "Store commit latency")
            .const_label("store", store)
            .const_label("topic", topic)
            .const_label("partition", partition.to_string())
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
            ]);
    prometheus::Histogram::with_opts(opts).expect("static histogram options are valid")
}

/// `/stores` row.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionSnapshot {
    pub store: String,
    pub topic: String,
    pub partition: i32,
    pub state: PartitionState,
    pub applied_offset: Option<i64>,
    pub position: Option<i64>,
    pub end_offset: Option<i64>,
    pub log_start_offset: Option<i64>,
    pub lag: Option<i64>,
    /// Waiting for its turn to catch up (`catch_up_turns`).
    pub waiting: bool,
    pub records: u64,
    pub bytes: u64,
    pub wipes: u64,
    pub error: Option<String>,
    pub path: PathBuf,
}

/// Every partition of every store, plus failures that have no partition yet (a topic that does not
/// exist cannot say how many partitions it has).
#[derive(Debug, Default)]
pub struct Board {
    partitions: RwLock<Vec<Arc<PartitionStatus>>>,
    /// Stores whose partitions are not on the board yet: until they are, the process cannot be
    /// ready, whatever the partitions already there say.
    unresolved: Mutex<BTreeSet<String>>,
    store_errors: Mutex<BTreeMap<String, String>>,
    /// Set while no Kafka broker is reachable (from librdkafka's statistics).
    kafka_outage: Mutex<Option<String>>,
    /// The last error librdkafka reported for the client as a whole (a refused TLS handshake or
    /// SASL login, say); cleared when a broker is reachable again. It explains failures that would
    /// otherwise only say "timed out".
    kafka_client_error: Mutex<Option<String>>,
    /// Cleared when the restore engine stops or dies; `/livez` reports it.
    pub restore_alive: AtomicBool,
    /// Group mode's view of the consumer group; `None` in `mode: all`.
    group: Mutex<Option<GroupView>>,
}

impl Board {
    /// The configured stores whose partitions are still to be learnt.
    pub fn unresolved_stores(&self) -> BTreeSet<String> {
        self.unresolved
            .lock()
            .map(|u| u.clone())
            .unwrap_or_default()
    }

    /// A configured store whose partitions are still to be learnt.
    pub fn expect_store(&self, store: &str) {
        if let Ok(mut unresolved) = self.unresolved.lock() {
            unresolved.insert(store.to_string());
        }
    }

    /// Every partition of `store` is on the board.
    pub fn store_resolved(&self, store: &str) {
        if let Ok(mut unresolved) = self.unresolved.lock() {
            unresolved.remove(store);
        }
    }

    pub fn add(&self, status: Arc<PartitionStatus>) {
        if let Ok(mut partitions) = self.partitions.write() {
            partitions.push(status);
        }
    }

    /// The partition of `store` on the board, if it is (group mode starts a partition again after
    /// it was revoked, and its counters go on).
    pub fn find(&self, store: &str, partition: i32) -> Option<Arc<PartitionStatus>> {
        let partitions = self.partitions.read().ok()?;
        partitions
            .iter()
            .find(|p| p.store == store && p.partition == partition)
            .cloned()
    }

    /// Takes a partition off the board, and so its series off `/metrics`: its store is deleted.
    pub fn remove(&self, store: &str, partition: i32) {
        if let Ok(mut partitions) = self.partitions.write() {
            partitions.retain(|p| !(p.store == store && p.partition == partition));
        }
    }

    pub fn join_group(&self, group: GroupView) {
        if let Ok(mut slot) = self.group.lock() {
            *slot = Some(group);
        }
    }

    /// Changes the group's view, in group mode.
    pub fn with_group(&self, change: impl FnOnce(&mut GroupView)) {
        if let Ok(mut slot) = self.group.lock() {
            if let Some(group) = slot.as_mut() {
                change(group);
            }
        }
    }

    pub fn group(&self) -> Option<GroupView> {
        self.group.lock().ok().and_then(|g| g.clone())
    }

    pub fn partitions(&self) -> Vec<Arc<PartitionStatus>> {
        self.partitions
            .read()
            .map(|p| p.clone())
            .unwrap_or_default()
    }

    /// Partitions registered so far, across all stores.
    pub fn partition_count(&self) -> usize {
        self.partitions.read().map(|p| p.len()).unwrap_or(1)
    }

    /// Average size (key plus value) of the records taken from `topic` so far in this process;
    /// `None` before the first. Partitions of one changelog carry records of one kind, so this sizes
    /// a partition's catch-up before its own first fetch.
    pub fn bytes_per_record(&self, topic: &str) -> Option<f64> {
        let partitions = self.partitions.read().ok()?;
        let (records, bytes) = partitions
            .iter()
            .filter(|p| p.topic == topic)
            .fold((0u64, 0u64), |(r, b), p| {
                (r + p.records.load(Relaxed), b + p.bytes.load(Relaxed))
            });
        (records > 0).then(|| bytes as f64 / records as f64)
    }

    pub fn set_store_error(&self, store: &str, error: Option<String>) {
        if let Ok(mut errors) = self.store_errors.lock() {
            match error {
                Some(e) => errors.insert(store.to_string(), e),
                None => errors.remove(store),
            };
        }
    }

    pub fn set_kafka_outage(&self, outage: Option<String>) {
        if let Ok(mut slot) = self.kafka_outage.lock() {
            *slot = outage;
        }
    }

    pub fn kafka_outage(&self) -> Option<String> {
        self.kafka_outage.lock().ok().and_then(|o| o.clone())
    }

    pub fn set_kafka_client_error(&self, error: Option<String>) {
        if let Ok(mut slot) = self.kafka_client_error.lock() {
            *slot = error;
        }
    }

    pub fn kafka_client_error(&self) -> Option<String> {
        self.kafka_client_error.lock().ok().and_then(|e| e.clone())
    }

    /// What is known to be wrong with Kafka as a whole, if anything, to go with a failure: "timed
    /// out" alone does not tell a wrong CA from a wrong password.
    pub fn kafka_cause(&self) -> Option<String> {
        self.kafka_outage().or_else(|| self.kafka_client_error())
    }

    pub fn store_errors(&self) -> BTreeMap<String, String> {
        self.store_errors
            .lock()
            .map(|e| e.clone())
            .unwrap_or_default()
    }
}

/// `"; <cause>"` to append to a Kafka failure, or nothing when no cause is known.
pub fn cause_suffix(cause: &Option<String>) -> String {
    cause
        .as_deref()
        .map(|c| format!("; {c}"))
        .unwrap_or_default()
}
