//! How records reach the store: one batch from the partition's lane into the store's uncommitted
//! buffer (`take_batch`, `apply`: the per-record path), then what that batch makes due (`fetch`:
//! the commit with its offset, a flush, the progress shown).

use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::Offset;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use super::failure::{Failure, KafkaFailure};
use super::{off_the_worker, LaneQueue, Run, Worker};
use crate::kafka::batch::{Fetched, MAX_TAKEN};
use crate::restore::phase::{Event, Phase};
use crate::restore::policy::{self, ConsumeError, Pending};
use crate::store::{Store, TopicPartition};

/// Bookkeeping (commit decision, status update) happens at least this often in records.
const MAX_BATCH_RECORDS: usize = 10_000;
/// How often the store's estimated keys and size on disk are read again while records arrive.
/// Not while idle: they only move with writes (and compactions that follow them), and reading them
/// walks the store's directory, which a thousand idle partitions would pay for every few seconds.
pub(super) const PROPERTIES_EVERY: Duration = Duration::from_secs(5);

/// What the message loop saw in one batch.
#[derive(Default)]
struct Batch {
    records: u64,
    bytes: u64,
    null_keys: u64,
    /// The next offset is no longer in the log (retention or compaction passed the store).
    out_of_range: bool,
    /// The partition cannot be consumed (a batch librdkafka could not decode, which it would
    /// skip), or the store refused a write.
    failure: Option<Failure>,
    /// The queue had nothing more when the batch ended.
    drained: bool,
    /// Timestamp of the last record taken, published once per batch (lag in seconds).
    last_timestamp_ms: Option<i64>,
}

impl Worker {
    /// One batch from the partition's lane into the store, then the bookkeeping: commit when due,
    /// flush within the phase's bound, publish progress. Reports reaching the end offset, falling
    /// behind it, or a condition of the log.
    pub(super) fn fetch(
        &self,
        run: &mut Run,
        store: &mut Store,
        phase: Phase,
    ) -> Result<Option<Event>, Failure> {
        let status = &self.status;
        // This partition's share of `max_uncommitted_bytes`, over the partitions known now (a
        // store without a partition list only learns its count from the broker), within a turn.
        let budget = policy::partition_budget(
            self.restore.max_uncommitted_bytes,
            self.board.partition_count(),
            self.turns.turn_bytes,
        );
        // Every phase with a lane is entered through an assignment; a failed one leads to Closing.
        let Some(assignment) = run.assignment.as_ref() else {
            return Ok(None);
        };
        let lane = &assignment.queue;
        let batch = self.take_batch(lane, store, &mut run.next, &mut run.last_taken, budget);
        run.drained = batch.drained;
        if let Some(failure) = batch.failure {
            return Err(failure);
        }
        if batch.out_of_range {
            return Ok(Some(Event::OutOfRange));
        }
        if self.watermarks.gone() {
            return Err(KafkaFailure::Gone {
                tp: self.tp.clone(),
            }
            .into());
        }
        // Markers are never delivered; when idle and behind, the consumer's own position moves
        // past them. Only then: the position call lists every partition of the consumer, so a
        // thousand idle tailing partitions asking it ten times a second cost whole cores.
        let end = self.watermarks.end_offset();
        if batch.records == 0 && batch.null_keys == 0 && run.next < end {
            if let Some(position) = consumer_position(lane, &self.tp) {
                run.next = run.next.max(position);
            }
        }
        status.end_offset.store(end, Relaxed);
        status.log_start.store(self.watermarks.log_start(), Relaxed);
        let caught_up = policy::caught_up(run.next, end);
        let event = match (phase, caught_up) {
            (Phase::CatchingUp { .. }, true) => Some(Event::CaughtUp),
            (Phase::Tailing, false) => {
                self.start_catch_up(run, end);
                Some(Event::FellBehind)
            }
            _ => None,
        };
        let pending = Pending {
            dirty: run.uncommitted(store),
            uncommitted_bytes: store.uncommitted_bytes(),
            since_last_commit: run.last_commit.elapsed(),
            just_caught_up: event == Some(Event::CaughtUp),
        };
        if let (true, Some(offset)) = (
            policy::commit_due(pending, self.restore.commit_interval, budget),
            run.last_taken,
        ) {
            let started = Instant::now();
            store.commit(offset)?;
            status
                .commit_seconds
                .observe(started.elapsed().as_secs_f64());
            status.commits.fetch_add(1, Relaxed);
            status.applied.store(offset, Relaxed);
            run.last_commit = Instant::now();
        }
        let now = Instant::now();
        if store.flush_due_within(now, phase.flush_bound(self.options.flush_interval)) {
            off_the_worker(|| store.flush())?;
        }

        status.records.fetch_add(batch.records, Relaxed);
        status.bytes.fetch_add(batch.bytes, Relaxed);
        status.null_keys.fetch_add(batch.null_keys, Relaxed);
        // The first records of a catch-up show what its size means in memory: the turn is
        // resized to it, and what it took beyond that goes to the partitions waiting. They also
        // show whether it is large enough to defer its compaction until it is done.
        if let (Some(turn), false, true) = (run.turn.as_mut(), run.turn_sized, batch.records > 0) {
            let per_record = batch.bytes as f64 / batch.records as f64;
            turn.resize(policy::turn_weight(
                run.catch_up.target - run.catch_up.from,
                Some(per_record),
                self.turns.turn_bytes,
            ));
            run.turn_sized = true;
            if policy::defers_compaction(run.catch_up.target - run.next, per_record) {
                off_the_worker(|| store.defer_compaction())?;
            }
        }
        let rate = policy::smooth_rate(
            status.rate(),
            batch.records + batch.null_keys,
            now - run.last_batch,
        );
        status.rate_bits.store(rate.to_bits(), Relaxed);
        run.last_batch = now;
        run.taken_since_properties |= batch.records + batch.null_keys > 0;
        if event == Some(Event::CaughtUp)
            || (run.taken_since_properties && now - run.last_properties >= PROPERTIES_EVERY)
        {
            status.estimated_keys.store(store.estimated_keys(), Relaxed);
            status.disk_bytes.store(store.disk_bytes(), Relaxed);
            run.last_properties = now;
            run.taken_since_properties = false;
        }
        // Reaching the end shows once the transition is done: the first catch-up flushed, and the
        // partition off the catching-up consumer.
        if event != Some(Event::CaughtUp) {
            self.show_state(run.next, caught_up);
        }
        Ok(event)
    }

    /// Drains up to one batch from the partition queue into the store's uncommitted buffer. The
    /// per-record path does no allocation, logging or metric update.
    fn take_batch(
        &self,
        lane: &LaneQueue<'_>,
        store: &mut Store,
        next: &mut i64,
        last_taken: &mut Option<i64>,
        budget: usize,
    ) -> Batch {
        let mut batch = Batch::default();
        loop {
            let want = MAX_TAKEN.min(MAX_BATCH_RECORDS - batch.records as usize);
            let taken = lane.batches.take(want, |fetched| {
                self.apply(fetched, store, next, last_taken, &mut batch)
            });
            if taken < want {
                batch.drained = true;
            }
            if batch.drained || batch.failure.is_some() || batch.out_of_range {
                break;
            }
            if batch.records as usize >= MAX_BATCH_RECORDS || store.uncommitted_bytes() >= budget {
                break;
            }
        }
        if let Some(ts) = batch.last_timestamp_ms {
            self.status.last_record_ts_ms.store(ts, Relaxed);
        }
        batch
    }

    /// Applies one fetched message to the store's uncommitted buffer; false when the batch must
    /// end here (a failure, or the log moved out of range).
    fn apply(
        &self,
        fetched: Fetched<'_>,
        store: &mut Store,
        next: &mut i64,
        last_taken: &mut Option<i64>,
        batch: &mut Batch,
    ) -> bool {
        match fetched {
            Fetched::Record {
                offset,
                key,
                value,
                timestamp,
            } => {
                if offset < *next {
                    return true;
                }
                match key {
                    None => batch.null_keys += 1,
                    Some(key) => {
                        let written = match value {
                            Some(value) => {
                                batch.bytes += value.len() as u64;
                                store.put(key, value, timestamp.unwrap_or(-1))
                            }
                            None => store.delete(key),
                        };
                        if let Err(error) = written {
                            batch.failure = Some(error.into());
                            return false;
                        }
                        batch.bytes += key.len() as u64;
                        batch.records += 1;
                    }
                }
                *next = offset + 1;
                *last_taken = Some(offset);
                batch.last_timestamp_ms = timestamp.or(batch.last_timestamp_ms);
                true
            }
            // Only if the user turned `enable.partition.eof` on; catch-up is decided from offsets.
            Fetched::Error(KafkaError::PartitionEOF(_)) => true,
            Fetched::Error(error) => {
                // An error that is not a known fetch condition may stand for records
                // librdkafka dropped.
                let kind = match &error {
                    KafkaError::MessageConsumption(code) => policy::consume_error(*code),
                    _ => ConsumeError::Fatal,
                };
                match kind {
                    ConsumeError::OutOfRange => {
                        batch.out_of_range = true;
                        false
                    }
                    ConsumeError::Transient => {
                        tracing::warn!(store = %self.status.store, topic = %self.tp.topic,
                            partition = self.tp.partition, %error, "fetch error; librdkafka retries");
                        true
                    }
                    ConsumeError::Fatal => {
                        batch.failure = Some(
                            KafkaFailure::Consume {
                                tp: self.tp.clone(),
                                after: *last_taken,
                                source: error,
                            }
                            .into(),
                        );
                        false
                    }
                }
            }
        }
    }
}

/// librdkafka's position for this partition, which accounts for skipped control records.
fn consumer_position(lane: &LaneQueue<'_>, tp: &TopicPartition) -> Option<i64> {
    let positions = lane.consumer.position().ok()?;
    match positions.find_partition(&tp.topic, tp.partition)?.offset() {
        Offset::Offset(o) if o >= 0 => Some(o),
        _ => None,
    }
}
