//! One thread per store partition: open the store under the dirty rules, assign the partition at
//! the store's own offset, apply records in commits, keep tailing. RocksDB work stays on this thread,
//! never on the async runtime, and partitions progress independently.

use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::policy::{self, ConsumeError, Pending};
use super::slots::{Slot, Slots};
use crate::changelog::{ChangelogConsumer, EngineContext};
use crate::config::RestoreConfig;
use crate::dirty::{LogBounds, WipeReason};
use crate::status::{cause_suffix, PartitionState, PartitionStatus};
use crate::store::{OpenOutcome, Store, StoreError, StoreOptions, StorePaths, TopicPartition};

const POLL_TIMEOUT: Duration = Duration::from_millis(100);
const WATERMARK_TIMEOUT: Duration = Duration::from_secs(10);
/// Bookkeeping (commit decision, status update) happens at least this often in records.
const MAX_BATCH_RECORDS: usize = 10_000;
const PROPERTIES_EVERY: Duration = Duration::from_secs(5);
/// Longest a catching-up partition keeps commits unflushed (the configured bound applies if tighter).
const RESTORING_FLUSH_BOUND: Duration = Duration::from_secs(5);

/// One consumer and this partition's queue in it (`changelog` explains the two consumers).
pub struct Lane {
    pub consumer: Arc<ChangelogConsumer>,
    pub queue: PartitionQueue<EngineContext>,
}

pub struct Worker {
    pub tailing: Lane,
    pub loading: Lane,
    pub status: Arc<PartitionStatus>,
    pub board: Arc<crate::status::Board>,
    pub tp: TopicPartition,
    pub paths: StorePaths,
    pub options: StoreOptions,
    pub restore: RestoreConfig,
    pub stop: Arc<AtomicBool>,
    pub slots: Arc<Slots>,
}

/// How a restore attempt ended badly. Kafka trouble leaves the store healthy (it is closed cleanly
/// before retrying); store trouble drops it unclosed and reopens it through the dirty rules.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error(transparent)]
    Kafka(Box<KafkaFailure>),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<KafkaFailure> for Failure {
    fn from(failure: KafkaFailure) -> Self {
        Failure::Kafka(Box::new(failure))
    }
}

/// What went wrong on the Kafka side of one partition. `cause` is what is known to be wrong with
/// Kafka as a whole (no broker reachable, a refused login): "timed out" alone does not tell a
/// wrong CA from a wrong password.
#[derive(Debug, thiserror::Error)]
enum KafkaFailure {
    #[error("cannot read the offsets of {tp}: {source}{}", cause_suffix(cause))]
    Offsets {
        tp: TopicPartition,
        source: KafkaError,
        cause: Option<String>,
    },
    #[error("cannot assign {tp}: {source}")]
    Assign {
        tp: TopicPartition,
        source: KafkaError,
    },
    /// An error on the partition's queue that may stand for records librdkafka skipped.
    #[error("cannot consume {tp} after offset {}: {source}; the store keeps every record before it and the partition is retried from there", after.map_or("none".to_string(), |o| o.to_string()))]
    Consume {
        tp: TopicPartition,
        after: Option<i64>,
        source: KafkaError,
    },
}

/// Keeps the partition assigned in one lane while alive; unassigns on drop, on every exit path.
struct Assignment<'a> {
    lane: &'a Lane,
    list: TopicPartitionList,
}

impl<'a> Assignment<'a> {
    fn new(lane: &'a Lane, tp: &TopicPartition, offset: i64) -> Result<Self, Failure> {
        let assign = |source| KafkaFailure::Assign {
            tp: tp.clone(),
            source,
        };
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(&tp.topic, tp.partition, Offset::Offset(offset))
            .map_err(assign)?;
        lane.consumer.incremental_assign(&list).map_err(assign)?;
        Ok(Assignment { lane, list })
    }
}

impl Drop for Assignment<'_> {
    fn drop(&mut self) {
        let _ = self.lane.consumer.incremental_unassign(&self.list);
    }
}

/// What the message loop saw in one batch.
#[derive(Default)]
struct Batch {
    records: u64,
    bytes: u64,
    null_keys: u64,
    out_of_range: Option<String>,
    /// The partition cannot be consumed: topic or partition gone, or a batch librdkafka could not
    /// decode (which it would skip).
    kafka_failure: Option<KafkaFailure>,
    /// Timestamp of the last record taken, published once per batch (lag in seconds).
    last_timestamp_ms: Option<i64>,
}

impl Worker {
    /// Runs until the stop flag is set; failures are logged, shown as `failed` and retried with
    /// exponential backoff.
    pub fn run(self) {
        let mut attempt = 0;
        while !self.stop.load(Relaxed) {
            let started = Instant::now();
            match self.attempt() {
                Ok(()) => break,
                Err(failure) => {
                    if started.elapsed() > Duration::from_secs(60) {
                        attempt = 0;
                    }
                    let delay = policy::backoff(attempt);
                    attempt += 1;
                    tracing::warn!(
                        store = %self.status.store,
                        topic = %self.tp.topic,
                        partition = self.tp.partition,
                        error = %failure,
                        retry_in_s = delay.as_secs(),
                        "store partition failed; retrying"
                    );
                    self.status
                        .set_state(PartitionState::Failed, Some(failure.to_string()));
                    self.sleep(delay);
                }
            }
        }
    }

    fn sleep(&self, duration: Duration) {
        let until = Instant::now() + duration;
        while !self.stop.load(Relaxed) && Instant::now() < until {
            std::thread::sleep(POLL_TIMEOUT);
        }
    }

    fn bounds(&self) -> Result<LogBounds, Failure> {
        let (low, high) = self
            .tailing
            .consumer
            .fetch_watermarks(&self.tp.topic, self.tp.partition, WATERMARK_TIMEOUT)
            .map_err(|source| KafkaFailure::Offsets {
                tp: self.tp.clone(),
                source,
                cause: self.board.kafka_cause(),
            })?;
        self.status.log_start.store(low, Relaxed);
        self.status.end_offset.store(high, Relaxed);
        Ok(LogBounds {
            log_start: low,
            high_watermark: high,
        })
    }

    fn attempt(&self) -> Result<(), Failure> {
        self.status
            .set_state(PartitionState::Opening, self.status.error());
        let bounds = self.bounds()?;
        let (store, outcome) = Store::open(
            self.paths.clone(),
            self.tp.clone(),
            &self.options,
            self.restore.on_unclean_shutdown,
            Some(bounds),
        )?;
        match &outcome {
            OpenOutcome::Wiped { reason, .. } => self.status.count_wipe(*reason),
            OpenOutcome::Resumed { unclean: true, .. } => {
                self.status.unclean_shutdowns.fetch_add(1, Relaxed);
                tracing::info!(store = %self.status.store, topic = %self.tp.topic, partition = self.tp.partition,
                    "store was not closed cleanly; resuming (on_unclean_shutdown: resume)");
            }
            _ => {}
        }
        tracing::info!(store = %self.status.store, topic = %self.tp.topic, partition = self.tp.partition,
            outcome = ?outcome, log_start = bounds.log_start, end_offset = bounds.high_watermark, "store opened");
        self.restore_loop(store, bounds)
    }

    fn restore_loop(&self, store: Store, bounds: LogBounds) -> Result<(), Failure> {
        let status = &self.status;
        let mut next = store.applied().map_or(bounds.log_start, |a| a + 1);
        // Offset of the last record taken from the log (applied or skipped), committed or not.
        let mut last_taken = store.applied();
        let mut last_commit = Instant::now();
        let mut last_batch = Instant::now();
        let mut last_properties = Instant::now() - PROPERTIES_EVERY;
        let mut was_caught_up = false;
        let mut first_catch_up_flushed = false;
        let mut turn_sized = false;
        status.applied.store(store.applied().unwrap_or(-1), Relaxed);
        status.position.store(next, Relaxed);
        status.catchup_from.store(next, Relaxed);
        status.catchup_target.store(bounds.high_watermark, Relaxed);
        status.set_state(PartitionState::Restoring, None);
        let Some(mut slot) = self.turn_if_needed(next, bounds.high_watermark) else {
            return self.finish(store, last_taken);
        };
        let (mut assignment, mut store) = self.assign(slot.is_some(), next, store, last_taken)?;

        while !self.stop.load(Relaxed) {
            // This partition's share of `max_uncommitted_bytes`, over the partitions known now: a
            // store without a partition list only learns its count from the broker.
            let budget = policy::partition_budget(
                self.restore.max_uncommitted_bytes,
                self.board.partition_count(),
            );
            let batch = self.take_batch(
                assignment.lane,
                &mut store,
                &mut next,
                &mut last_taken,
                budget,
            );
            if let Some(failure) = batch.kafka_failure {
                drop(assignment);
                self.finish(store, last_taken)?;
                return Err(failure.into());
            }
            if let Some(detail) = batch.out_of_range {
                drop(assignment);
                status.set_state(PartitionState::Wiping, None);
                let bounds = match self.bounds() {
                    Ok(bounds) => bounds,
                    Err(failure) => {
                        self.finish(store, last_taken)?;
                        return Err(failure);
                    }
                };
                store = store.wipe(WipeReason::OffsetOutOfRange, &detail)?;
                status.count_wipe(WipeReason::OffsetOutOfRange);
                next = bounds.log_start;
                last_taken = None;
                was_caught_up = false;
                first_catch_up_flushed = false;
                turn_sized = false;
                status.applied.store(-1, Relaxed);
                status.catchup_from.store(next, Relaxed);
                status.catchup_target.store(bounds.high_watermark, Relaxed);
                status.set_state(PartitionState::Restoring, None);
                if slot.is_none() {
                    let Some(acquired) = self.turn_if_needed(next, bounds.high_watermark) else {
                        return self.finish(store, last_taken);
                    };
                    slot = acquired;
                }
                (assignment, store) = self.assign(slot.is_some(), next, store, last_taken)?;
                continue;
            }

            // Markers are never delivered; when idle, the consumer's own position moves past them.
            if batch.records == 0 && batch.null_keys == 0 {
                if let Some(position) = consumer_position(assignment.lane, &self.tp) {
                    next = next.max(position);
                }
            }
            let end = status.end_offset.load(Relaxed);
            let caught_up = policy::caught_up(next, end);
            if was_caught_up && !caught_up {
                status.catchup_from.store(next, Relaxed);
                status.catchup_target.store(end, Relaxed);
            }
            let pending = Pending {
                dirty: last_taken > store.applied(),
                uncommitted_bytes: store.uncommitted_bytes(),
                since_last_commit: last_commit.elapsed(),
                just_caught_up: caught_up && !was_caught_up,
            };
            if let (Some(_), Some(offset)) = (
                policy::commit_due(pending, self.restore.commit_interval, budget),
                last_taken,
            ) {
                let started = Instant::now();
                store.commit(offset)?;
                status
                    .commit_seconds
                    .observe(started.elapsed().as_secs_f64());
                status.commits.fetch_add(1, Relaxed);
                status.applied.store(offset, Relaxed);
                last_commit = Instant::now();
            }
            // The first catch-up after open (or a wipe) is made durable at once. Otherwise, with the
            // WAL off, a process killed again and again before the time-bound flush would restart
            // every restore from scratch. Later catch-ups rely on the time bound.
            if caught_up && !first_catch_up_flushed {
                store.flush()?;
                first_catch_up_flushed = true;
            }
            // While catching up, progress is flushed at least every few seconds: a process killed
            // again and again mid-restore (an OOM loop, a crash loop) still moves forward.
            let now = Instant::now();
            let bound = if caught_up {
                self.options.flush_interval
            } else {
                RESTORING_FLUSH_BOUND
            };
            store.maybe_flush_within(now, bound)?;

            status.records.fetch_add(batch.records, Relaxed);
            status.bytes.fetch_add(batch.bytes, Relaxed);
            status.null_keys.fetch_add(batch.null_keys, Relaxed);
            // The first records of a catch-up show what its size means in memory: the turn is
            // resized to it, and what it took beyond that goes to the partitions waiting.
            if let (Some(slot), false, true) = (slot.as_mut(), turn_sized, batch.records > 0) {
                slot.resize(policy::turn_weight(
                    status.catchup_target.load(Relaxed) - status.catchup_from.load(Relaxed),
                    Some(batch.bytes as f64 / batch.records as f64),
                    self.slots.turn_bytes,
                ));
                turn_sized = true;
            }
            status.position.store(next, Relaxed);
            let rate = policy::smooth_rate(
                status.rate(),
                batch.records + batch.null_keys,
                now - last_batch,
            );
            status.rate_bits.store(rate.to_bits(), Relaxed);
            last_batch = now;
            if (caught_up && !was_caught_up) || now - last_properties >= PROPERTIES_EVERY {
                status.estimated_keys.store(store.estimated_keys(), Relaxed);
                status.disk_bytes.store(store.disk_bytes(), Relaxed);
                last_properties = now;
            }
            // While no broker is reachable the partition is failed, visibly; librdkafka reconnects
            // with its own backoff, and the partition resumes where it was without a restart.
            if let Some(outage) = self.board.kafka_outage() {
                if status.error().as_deref() != Some(outage.as_str()) {
                    status.set_state(PartitionState::Failed, Some(outage));
                }
            } else {
                let state = if caught_up {
                    PartitionState::CaughtUp
                } else {
                    PartitionState::Restoring
                };
                if state != status.state() {
                    status.set_state(state, None);
                }
            }
            // Tailing needs no turn: the next partition waiting to catch up takes it (after the
            // status above says this one is done), and this one moves to the tailing consumer.
            // Its restore buffers are gone by now.
            if caught_up && slot.take().is_some() {
                (assignment, store) = self.assign(false, next, store, last_taken)?;
                crate::memory::release_free();
            }
            was_caught_up = caught_up;
        }

        drop(assignment);
        self.finish(store, last_taken)
    }

    /// Waits for a turn to catch up when the partition is further behind than `ready_max_lag`
    /// (`policy::needs_turn`). `Some(Some(slot))`: the turn, held until caught up; `Some(None)`: no
    /// turn needed; `None`: stopped while waiting.
    fn turn_if_needed(&self, next: i64, end: i64) -> Option<Option<Slot>> {
        if !policy::needs_turn(next, end, self.restore.ready_max_lag) {
            return Some(None);
        }
        let weigh = || {
            policy::turn_weight(
                policy::lag(next, end),
                self.board.bytes_per_record(&self.tp.topic),
                self.slots.turn_bytes,
            )
        };
        self.status.waiting.store(true, Relaxed);
        let slot = self.slots.acquire(weigh, &self.stop);
        self.status.waiting.store(false, Relaxed);
        slot.map(Some)
    }

    /// Assigns the partition at `next` to the loading consumer while it holds a turn, else to the
    /// tailing one. If librdkafka refuses, the store is closed cleanly before the failure goes up,
    /// as for every Kafka failure: dropped open, the retry would find `status` 1 and take it for a
    /// crashed store (and wipe it under `on_unclean_shutdown: wipe`).
    fn assign(
        &self,
        loading: bool,
        next: i64,
        store: Store,
        last_taken: Option<i64>,
    ) -> Result<(Assignment<'_>, Store), Failure> {
        self.status.loading.store(loading, Relaxed);
        let lane = if loading {
            &self.loading
        } else {
            &self.tailing
        };
        match Assignment::new(lane, &self.tp, next) {
            Ok(assignment) => Ok((assignment, store)),
            Err(failure) => {
                self.finish(store, last_taken)?;
                Err(failure)
            }
        }
    }

    /// Clean close: commit everything taken, flush, `status` 0.
    fn finish(&self, mut store: Store, last_taken: Option<i64>) -> Result<(), Failure> {
        if let Some(offset) = last_taken.filter(|o| Some(*o) > store.applied()) {
            store.commit(offset)?;
            self.status.applied.store(offset, Relaxed);
        }
        store.close(None)?;
        tracing::info!(store = %self.status.store, topic = %self.tp.topic, partition = self.tp.partition,
            applied = ?last_taken, "store closed cleanly");
        Ok(())
    }

    /// Drains up to one batch from the partition queue into the store's uncommitted buffer. The
    /// per-record path does no allocation, logging or metric update.
    fn take_batch(
        &self,
        lane: &Lane,
        store: &mut Store,
        next: &mut i64,
        last_taken: &mut Option<i64>,
        budget: usize,
    ) -> Batch {
        let mut batch = Batch::default();
        let mut message = lane.queue.poll(POLL_TIMEOUT);
        while let Some(result) = message {
            match result {
                Ok(m) => {
                    let offset = m.offset();
                    if offset >= *next {
                        match m.key() {
                            None => batch.null_keys += 1,
                            Some(key) => {
                                match m.payload() {
                                    Some(value) => {
                                        store.put(key, value);
                                        batch.bytes += value.len() as u64;
                                    }
                                    None => store.delete(key),
                                }
                                batch.bytes += key.len() as u64;
                                batch.records += 1;
                            }
                        }
                        *next = offset + 1;
                        *last_taken = Some(offset);
                        batch.last_timestamp_ms =
                            m.timestamp().to_millis().or(batch.last_timestamp_ms);
                    }
                }
                // Only if the user turned `enable.partition.eof` on; catch-up is decided from offsets.
                Err(KafkaError::PartitionEOF(_)) => {}
                Err(error) => {
                    // An error that is not a known fetch condition may stand for records
                    // librdkafka dropped.
                    let kind = match &error {
                        KafkaError::MessageConsumption(code) => policy::consume_error(*code),
                        _ => ConsumeError::Fatal,
                    };
                    match kind {
                        ConsumeError::OutOfRange => {
                            batch.out_of_range = Some(format!(
                                "fetch at offset {next} of {} is out of range (retention or compaction passed the store)",
                                self.tp
                            ));
                            break;
                        }
                        ConsumeError::Transient => {
                            tracing::warn!(store = %self.status.store, topic = %self.tp.topic,
                                partition = self.tp.partition, %error, "fetch error; librdkafka retries");
                        }
                        ConsumeError::Fatal => {
                            batch.kafka_failure = Some(KafkaFailure::Consume {
                                tp: self.tp.clone(),
                                after: *last_taken,
                                source: error,
                            });
                            break;
                        }
                    }
                }
            }
            if batch.records as usize >= MAX_BATCH_RECORDS || store.uncommitted_bytes() >= budget {
                break;
            }
            message = lane.queue.poll(Duration::ZERO);
        }
        if let Some(ts) = batch.last_timestamp_ms {
            self.status.last_record_ts_ms.store(ts, Relaxed);
        }
        batch
    }
}

/// librdkafka's position for this partition, which accounts for skipped control records.
fn consumer_position(lane: &Lane, tp: &TopicPartition) -> Option<i64> {
    let positions = lane.consumer.position().ok()?;
    match positions.find_partition(&tp.topic, tp.partition)?.offset() {
        Offset::Offset(o) if o >= 0 => Some(o),
        _ => None,
    }
}
