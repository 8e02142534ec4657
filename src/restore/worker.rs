//! One task per store partition: open the store under the dirty rules, assign the partition at
//! the store's own offset, apply records in commits, keep tailing. The task runs on the engine's
//! own runtime (`tasks`), never on the one serving HTTP; it waits for records without holding a
//! thread, woken by librdkafka when the partition's queue receives something.

use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

use super::phase::{self, Event, Phase, Transition};
use super::policy::{self, ConsumeError, Pending};
use super::tasks::{blocking, Stop};
use super::turns::{Turn, Turns};
use crate::config::RestoreConfig;
use crate::kafka::batch::{BatchQueue, Fetched, MAX_TAKEN};
use crate::kafka::consumers::ChangelogConsumer;
use crate::kafka::statistics::{EngineContext, Watermarks};
use crate::observe::status::{cause_suffix, PartitionState, PartitionStatus};
use crate::store::dirty::{LogBounds, WipeReason};
use crate::store::{OpenOutcome, Store, StoreError, StoreOptions, StorePaths, TopicPartition};

/// How often a partition with nothing to read looks again anyway: to commit once
/// `commit_interval` has passed, to flush within its bound, to see an end offset that moved past
/// transaction markers (which are never delivered), and to show an outage. End offsets arrive with
/// librdkafka's statistics every two seconds, so looking more often would find nothing new.
const IDLE_LOOK_EVERY: Duration = Duration::from_secs(2);
/// The instant idle looks are counted from (`policy::next_look`), one for the process.
static IDLE_LOOK_EPOCH: OnceLock<tokio::time::Instant> = OnceLock::new();
/// How often a partition waiting for the log's offsets checks whether Kafka is known to be down.
const OUTAGE_LOOK_EVERY: Duration = Duration::from_secs(1);
const WATERMARK_TIMEOUT: Duration = Duration::from_secs(10);
/// Bookkeeping (commit decision, status update) happens at least this often in records.
const MAX_BATCH_RECORDS: usize = 10_000;
/// How often the store's estimated keys and size on disk are read again while records arrive.
/// Not while idle: they only move with writes (and compactions that follow them), and reading them
/// walks the store's directory, which a thousand idle partitions would pay for every few seconds.
const PROPERTIES_EVERY: Duration = Duration::from_secs(5);

/// One consumer and this partition's queue in it (`kafka` explains the two consumers).
pub struct LaneQueue {
    pub consumer: Arc<ChangelogConsumer>,
    /// The partition's queue, split off the consumer's main queue; held for as long as the lane,
    /// as it wakes the worker when records arrive. Records are taken through `batches`.
    pub _split: PartitionQueue<EngineContext>,
    /// The same partition queue, taken from in batches.
    pub batches: BatchQueue,
}

pub struct Worker {
    pub tailing: LaneQueue,
    pub catching_up: LaneQueue,
    /// Where the worker learns the log's offsets; `status` is only where it reports.
    pub watermarks: Arc<Watermarks>,
    pub status: Arc<PartitionStatus>,
    pub board: Arc<crate::observe::status::Board>,
    pub tp: TopicPartition,
    pub paths: StorePaths,
    pub options: StoreOptions,
    pub restore: RestoreConfig,
    pub stop: Stop,
    /// Notified by librdkafka when either lane's queue receives something while empty.
    pub wake: Arc<Notify>,
    pub turns: Arc<Turns>,
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

impl Failure {
    /// The phase machine's event for this failure.
    fn event(&self) -> Event {
        match self {
            Failure::Kafka(_) => Event::KafkaFailed,
            Failure::Store(_) => Event::StoreFailed,
        }
    }
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
    lane: &'a LaneQueue,
    list: TopicPartitionList,
}

impl<'a> Assignment<'a> {
    fn new(lane: &'a LaneQueue, tp: &TopicPartition, offset: i64) -> Result<Self, Failure> {
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

/// What one attempt carries from step to step besides the store.
struct Run<'a> {
    /// The offset to take next: the store's position in the log.
    next: i64,
    /// Offset of the last record taken from the log (applied or skipped), committed or not.
    last_taken: Option<i64>,
    assignment: Option<Assignment<'a>>,
    turn: Option<Turn>,
    /// Whether the turn was resized to the catch-up's record size yet.
    turn_sized: bool,
    /// Where the current catch-up started, and the end offset it started towards.
    catch_up: (i64, i64),
    last_commit: Instant,
    last_batch: Instant,
    last_properties: Instant,
    /// Something was taken since the properties were last read.
    taken_since_properties: bool,
    /// The last batch emptied the lane's queue: wait to be woken before the next.
    drained: bool,
}

impl Run<'_> {
    /// Records were taken that the store has not committed yet.
    fn uncommitted(&self, store: &Store) -> bool {
        self.last_taken > store.applied()
    }
}

/// What the message loop saw in one batch.
#[derive(Default)]
struct Batch {
    records: u64,
    bytes: u64,
    null_keys: u64,
    /// The next offset is no longer in the log (retention or compaction passed the store).
    out_of_range: bool,
    /// The partition cannot be consumed (topic or partition gone, or a batch librdkafka could not
    /// decode, which it would skip), or the store refused a write.
    failure: Option<Failure>,
    /// The queue had nothing more when the batch ended.
    drained: bool,
    /// Timestamp of the last record taken, published once per batch (lag in seconds).
    last_timestamp_ms: Option<i64>,
}

impl Worker {
    /// Runs until the stop flag is set; failures are logged, shown as `failed` and retried with
    /// exponential backoff.
    pub async fn run(self) {
        let mut attempt = 0;
        while !self.stop.is_requested() {
            let started = Instant::now();
            match self.attempt().await {
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
                    self.stop.sleep(delay).await;
                }
            }
        }
    }

    /// The log's offsets, asked of the broker. The request blocks for up to its timeout, so it
    /// runs on a blocking thread; while it waits (or waits for a thread), a known outage shows.
    /// It goes through the catching-up consumer: a broker answers one connection's requests in
    /// order, and the tailing consumer's connection carries a fetch the broker holds for up to
    /// `fetch.wait.max.ms`, which every open queued behind (8 opens a second at 1,000 partitions).
    async fn bounds(&self) -> Result<LogBounds, Failure> {
        let (consumer, tp) = (self.catching_up.consumer.clone(), self.tp.clone());
        let request =
            blocking(move || consumer.fetch_watermarks(&tp.topic, tp.partition, WATERMARK_TIMEOUT));
        tokio::pin!(request);
        let answer = loop {
            tokio::select! {
                answer = &mut request => break answer,
                _ = tokio::time::sleep(OUTAGE_LOOK_EVERY) => {
                    self.show_outage();
                }
            }
        };
        let (low, high) = answer.map_err(|source| KafkaFailure::Offsets {
            tp: self.tp.clone(),
            source,
            cause: self.board.kafka_cause(),
        })?;
        self.watermarks.set(low, high);
        self.status.log_start.store(low, Relaxed);
        self.status.end_offset.store(high, Relaxed);
        Ok(LogBounds {
            log_start: low,
            high_watermark: high,
        })
    }

    async fn attempt(&self) -> Result<(), Failure> {
        self.status
            .set_state(PartitionState::Opening, self.status.error());
        let bounds = self.bounds().await?;
        let (paths, tp, options) = (self.paths.clone(), self.tp.clone(), self.options.clone());
        let on_unclean = self.restore.on_unclean_shutdown;
        let (store, outcome) =
            blocking(move || Store::open(paths, tp, &options, on_unclean, Some(bounds))).await?;
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
        self.restore_loop(store, bounds).await
    }

    /// Runs the partition's phase machine (`phase`) from an open store until it closes or fails:
    /// each pass of the loop performs one phase's step, which reports an event, and the transition
    /// the event leads to.
    async fn restore_loop(&self, store: Store, bounds: LogBounds) -> Result<(), Failure> {
        let mut store = store;
        let mut run = Run {
            next: store.applied().map_or(bounds.log_start, |a| a + 1),
            last_taken: store.applied(),
            assignment: None,
            turn: None,
            turn_sized: false,
            catch_up: (-1, -1),
            last_commit: Instant::now(),
            last_batch: Instant::now(),
            last_properties: Instant::now() - PROPERTIES_EVERY,
            taken_since_properties: true,
            drained: false,
        };
        self.status
            .applied
            .store(store.applied().unwrap_or(-1), Relaxed);
        self.start_catch_up(&mut run, bounds.high_watermark);
        let opened = phase::opened(self.far_behind(run.next, bounds.high_watermark));
        let mut phase = opened.to;
        let mut transition = Some(opened);
        let mut failure = None;
        loop {
            if let Some(t) = transition.take() {
                phase = t.to;
                if let Err(f) = self.perform(&mut run, &mut store, t) {
                    transition = failed(phase, f, &mut failure);
                    continue;
                }
            }
            let step = match phase {
                Phase::Closing => {
                    drop(run.assignment.take());
                    self.finish(store, run.last_taken)?;
                    return failure.map_or(Ok(()), Err);
                }
                Phase::Dropped => return failure.map_or(Ok(()), Err),
                _ if self.stop.is_requested() => Ok(Some(Event::StopRequested)),
                Phase::Waiting => Ok(Some(self.wait_for_turn(&mut run).await)),
                Phase::Wiping { .. } => match self.wiping_bounds().await {
                    Ok(bounds) => {
                        // A wipe that fails leaves no store to close: the attempt ends here, as
                        // the machine's `Dropped` would end it.
                        store = self.wipe(store, &mut run, bounds).await?;
                        Ok(Some(Event::Positioned {
                            far_behind: self.far_behind(run.next, bounds.high_watermark),
                        }))
                    }
                    Err(f) => Err(f),
                },
                Phase::CatchingUp { .. } | Phase::Tailing => {
                    let step = self.fetch(&mut run, &mut store, phase);
                    if matches!(step, Ok(None)) && run.drained {
                        let (commit_due_in, flush_due_in) = self.due_in(&run, &store, phase);
                        self.idle(commit_due_in, flush_due_in).await;
                    } else {
                        // Many partitions share a few threads: a busy one lets the others run.
                        tokio::task::yield_now().await;
                    }
                    step
                }
            };
            transition = match step {
                Ok(event) => event.and_then(|e| phase.on(e)),
                Err(f) => failed(phase, f, &mut failure),
            };
        }
    }

    /// Waits until the lane's queue receives something, a stop is requested, or it is time to
    /// look anyway: on the process's next idle tick, shared by every idle partition, or sooner when
    /// this partition's own commit or flush falls due.
    async fn idle(&self, commit_due_in: Option<Duration>, flush_due_in: Option<Duration>) {
        let now = tokio::time::Instant::now();
        let epoch = *IDLE_LOOK_EPOCH.get_or_init(|| now);
        // `next_look` counts from the epoch, and is always ahead of now.
        let tick = epoch + policy::next_look(now.duration_since(epoch), IDLE_LOOK_EVERY);
        let look = now + policy::idle_sleep(tick.duration_since(now), commit_due_in, flush_due_in);
        tokio::select! {
            _ = self.wake.notified() => {}
            _ = self.stop.requested() => {}
            _ = tokio::time::sleep_until(look) => {}
        }
    }

    /// How long until this partition's next commit and its next flush fall due by time alone
    /// (`None` for one with nothing pending).
    fn due_in(
        &self,
        run: &Run,
        store: &Store,
        phase: Phase,
    ) -> (Option<Duration>, Option<Duration>) {
        let now = Instant::now();
        let commit = policy::commit_due_in(
            run.uncommitted(store),
            now.saturating_duration_since(run.last_commit),
            self.restore.commit_interval,
        );
        let flush = store.flush_due_in(now, phase.flush_bound(self.options.flush_interval));
        (commit, flush)
    }

    /// Further behind than `ready_max_lag`: the partition must wait for a turn to catch up.
    fn far_behind(&self, next: i64, end: i64) -> bool {
        policy::needs_turn(next, end, self.restore.ready_max_lag)
    }

    /// Marks the start of a catch-up at the current position: at open, after a wipe, and when a
    /// tailing partition falls behind. Progress is measured against the end offset seen now.
    fn start_catch_up(&self, run: &mut Run, end: i64) {
        run.catch_up = (run.next, end);
        self.status.position.store(run.next, Relaxed);
        self.status.catchup_from.store(run.next, Relaxed);
        self.status.catchup_target.store(end, Relaxed);
        self.status.set_state(PartitionState::Restoring, None);
    }

    /// Does what a transition asks for, in order: leave the lane, flush, join the next lane, show
    /// the state, give the turn back. The flush comes before the turn goes: until then this
    /// partition's memtables still hold its catch-up, and the next partition's would come on top.
    fn perform<'a>(
        &'a self,
        run: &mut Run<'a>,
        store: &mut Store,
        t: Transition,
    ) -> Result<(), Failure> {
        if t.unassign {
            drop(run.assignment.take());
        }
        if t.flush {
            off_the_worker(|| store.flush())?;
        }
        // After the flush: the merge it starts must not delay the catch-up's tables.
        if t.to == Phase::Tailing && store.compaction_deferred() {
            off_the_worker(|| store.resume_compaction())?;
        }
        // What the catch-up held, by its turn's estimate. The turn itself goes last, once this
        // partition shows its position at the end: the next partition's loading must not overlap
        // this one's still showing as loading.
        let done = if t.release_turn {
            run.turn_sized = false;
            run.turn.take()
        } else {
            None
        };
        let let_go = done.as_ref().map_or(0, Turn::bytes);
        if let Some(lane) = t.assign {
            drop(run.assignment.take());
            let catching_up = lane == phase::Lane::CatchingUp;
            self.watermarks.set_catching_up(catching_up);
            self.status.catching_up.store(catching_up, Relaxed);
            let queue = match lane {
                phase::Lane::CatchingUp => &self.catching_up,
                phase::Lane::Tailing => &self.tailing,
            };
            run.assignment = Some(Assignment::new(queue, &self.tp, run.next)?);
            // A partition done catching up has no restore buffers left to hold.
            if t.release_turn {
                let threshold = self.turns.turn_bytes / policy::RELEASE_TURN_PARTS;
                crate::memory::release_free(let_go, threshold);
            }
        }
        if t.to == Phase::Tailing {
            self.show_state(run.next, true);
        }
        drop(done);
        Ok(())
    }

    /// Waits for a turn to catch up (`policy::needs_turn` said the partition is far behind),
    /// sized by the lag and the topic's record size seen so far.
    async fn wait_for_turn(&self, run: &mut Run<'_>) -> Event {
        let (next, end) = (run.next, self.watermarks.end_offset());
        let weigh = || {
            policy::turn_weight(
                policy::lag(next, end),
                self.board.bytes_per_record(&self.tp.topic),
                self.turns.turn_bytes,
            )
        };
        self.status.waiting.store(true, Relaxed);
        run.turn = self.turns.acquire(weigh, &self.stop).await;
        self.status.waiting.store(false, Relaxed);
        if run.turn.is_some() {
            Event::TurnGranted
        } else {
            Event::StopRequested
        }
    }

    /// The log's bounds for a rebuild, shown as `wiping` while asked for.
    async fn wiping_bounds(&self) -> Result<LogBounds, Failure> {
        self.status.set_state(PartitionState::Wiping, None);
        self.bounds().await
    }

    /// Out of range: wipes the store and positions it at log-start, to be rebuilt.
    async fn wipe(
        &self,
        store: Store,
        run: &mut Run<'_>,
        bounds: LogBounds,
    ) -> Result<Store, StoreError> {
        let detail = format!(
            "fetch at offset {} of {} is out of range (retention or compaction passed the store)",
            run.next, self.tp
        );
        let store = blocking(move || store.wipe(WipeReason::OffsetOutOfRange, &detail)).await?;
        self.status.count_wipe(WipeReason::OffsetOutOfRange);
        run.next = bounds.log_start;
        run.last_taken = None;
        run.turn_sized = false;
        self.status.applied.store(-1, Relaxed);
        self.start_catch_up(run, bounds.high_watermark);
        Ok(store)
    }

    /// One batch from the partition's lane into the store, then the bookkeeping: commit when due,
    /// flush within the phase's bound, publish progress. Reports reaching the end offset, falling
    /// behind it, or a condition of the log.
    fn fetch(
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
        let lane = assignment.lane;
        let batch = self.take_batch(lane, store, &mut run.next, &mut run.last_taken, budget);
        run.drained = batch.drained;
        if let Some(failure) = batch.failure {
            return Err(failure);
        }
        if batch.out_of_range {
            return Ok(Some(Event::OutOfRange));
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
                run.catch_up.1 - run.catch_up.0,
                Some(per_record),
                self.turns.turn_bytes,
            ));
            run.turn_sized = true;
            if policy::defers_compaction(run.catch_up.1 - run.next, per_record) {
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

    /// Shows the position and the state together. `/readyz` reads readiness from the position,
    /// so a position at the end shown before the first catch-up's flush made a standby ready
    /// while its restore was only in memory (with the WAL off, lost to a kill). While no broker
    /// is reachable the partition is failed, visibly; librdkafka reconnects with its own backoff,
    /// and the partition resumes where it was without a restart.
    fn show_state(&self, next: i64, caught_up: bool) {
        let status = &self.status;
        status.position.store(next, Relaxed);
        if self.show_outage() {
            return;
        }
        let state = if caught_up {
            PartitionState::CaughtUp
        } else {
            PartitionState::Restoring
        };
        if state != status.state() {
            status.set_state(state, None);
        }
    }

    /// Shows a known Kafka outage on this partition as `failed`, with the outage as the reason;
    /// false when Kafka is not known to be down.
    fn show_outage(&self) -> bool {
        let Some(outage) = self.board.kafka_outage() else {
            return false;
        };
        if self.status.error().as_deref() != Some(outage.as_str()) {
            self.status.set_state(PartitionState::Failed, Some(outage));
        }
        true
    }

    /// Clean close: commit everything taken, flush, `status` 0.
    fn finish(&self, mut store: Store, last_taken: Option<i64>) -> Result<(), Failure> {
        if let Some(offset) = last_taken.filter(|o| Some(*o) > store.applied()) {
            store.commit(offset)?;
            self.status.applied.store(offset, Relaxed);
        }
        off_the_worker(|| store.close(None))?;
        tracing::info!(store = %self.status.store, topic = %self.tp.topic, partition = self.tp.partition,
            applied = ?last_taken, "store closed cleanly");
        Ok(())
    }

    /// Drains up to one batch from the partition queue into the store's uncommitted buffer. The
    /// per-record path does no allocation, logging or metric update.
    fn take_batch(
        &self,
        lane: &LaneQueue,
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

/// The transition a failure leads to; the failure is kept to be returned once the store is closed
/// (or dropped).
fn failed(phase: Phase, f: Failure, failure: &mut Option<Failure>) -> Option<Transition> {
    let transition = phase.on(f.event());
    *failure = Some(f);
    transition
}

/// Runs a call that waits on the disk (a flush), handing this worker thread's other partitions to
/// another thread meanwhile: with a thread per core, a flush would otherwise stop them all.
fn off_the_worker<T>(call: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(call)
}

/// librdkafka's position for this partition, which accounts for skipped control records.
fn consumer_position(lane: &LaneQueue, tp: &TopicPartition) -> Option<i64> {
    let positions = lane.consumer.position().ok()?;
    match positions.find_partition(&tp.topic, tp.partition)?.offset() {
        Offset::Offset(o) if o >= 0 => Some(o),
        _ => None,
    }
}
