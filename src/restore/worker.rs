//! One task per store partition: open the store under the dirty rules, assign the partition at
//! the store's own offset, apply records in commits, keep tailing. The task runs on the engine's
//! own runtime (`tasks`), never on the one serving HTTP; it waits for records without holding a
//! thread, woken by librdkafka when the partition's queue receives something.

use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

use super::phase::{self, Event, Phase, Transition};
use super::policy;
use super::tasks::{blocking, Stop};
use super::turns::{Turn, Turns};
use crate::config::RestoreConfig;
use crate::kafka::batch::BatchQueue;
use crate::kafka::consumers::{self, ChangelogConsumer};
use crate::kafka::statistics::{EngineContext, Watermarks};
use crate::observe::status::{PartitionState, PartitionStatus};
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

mod failure;
mod records;

use failure::{failed, Failure, KafkaFailure};
use records::PROPERTIES_EVERY;

/// This partition's queue in one consumer (`kafka` explains the two), split off the consumer's
/// main queue so that its records reach no other queue.
pub struct LaneQueue<'a> {
    pub consumer: &'a Arc<ChangelogConsumer>,
    /// Held for as long as the assignment, as it wakes the worker when records arrive. Records
    /// are taken through `batches`.
    _split: PartitionQueue<EngineContext>,
    /// The same partition queue, taken from in batches.
    pub batches: BatchQueue,
}

pub struct Worker {
    /// The two consumers (`kafka` explains them); the partition is in at most one at a time.
    pub tailing: Arc<ChangelogConsumer>,
    pub catching_up: Arc<ChangelogConsumer>,
    /// Where the worker learns the log's offsets; `status` is only where it reports.
    pub watermarks: Arc<Watermarks>,
    pub status: Arc<PartitionStatus>,
    pub board: Arc<crate::observe::status::Board>,
    pub tp: TopicPartition,
    pub paths: StorePaths,
    pub options: StoreOptions,
    pub restore: RestoreConfig,
    pub stop: Stop,
    /// Notified by librdkafka when the partition's queue receives something while empty.
    pub wake: Arc<Notify>,
    pub turns: Arc<Turns>,
}

/// Keeps the partition assigned in one lane while alive; unassigns on drop, on every exit path.
/// Its queue is split anew for each assignment: when a topic is deleted and created again,
/// librdkafka makes new partitions with new queues, and a queue split before that receives
/// nothing more while the new topic's records go to the consumer's main queue.
struct Assignment<'a> {
    queue: LaneQueue<'a>,
    list: TopicPartitionList,
}

impl<'a> Assignment<'a> {
    fn new(
        consumer: &'a Arc<ChangelogConsumer>,
        wake: &Arc<Notify>,
        tp: &TopicPartition,
        offset: i64,
    ) -> Result<Self, Failure> {
        let no_queue = || KafkaFailure::Queue { tp: tp.clone() };
        // Split before assigning, so no record of this partition reaches the main queue.
        let mut split = consumer
            .split_partition_queue(&tp.topic, tp.partition)
            .ok_or_else(no_queue)?;
        let batches = BatchQueue::new(consumer, &tp.topic, tp.partition).ok_or_else(no_queue)?;
        let wake = wake.clone();
        split.set_nonempty_callback(move || wake.notify_one());
        let assign = |source| KafkaFailure::Assign {
            tp: tp.clone(),
            source,
        };
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(&tp.topic, tp.partition, Offset::Offset(offset))
            .map_err(assign)?;
        consumer.incremental_assign(&list).map_err(assign)?;
        let queue = LaneQueue {
            consumer,
            _split: split,
            batches,
        };
        Ok(Assignment { queue, list })
    }
}

impl Drop for Assignment<'_> {
    fn drop(&mut self) {
        let _ = self.queue.consumer.incremental_unassign(&self.list);
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
    catch_up: CatchUp,
    last_commit: Instant,
    last_batch: Instant,
    last_properties: Instant,
    /// Something was taken since the properties were last read.
    taken_since_properties: bool,
    /// The last batch emptied the lane's queue: wait to be woken before the next.
    drained: bool,
}

/// The current catch-up: where it started, the end offset it started towards, and when.
#[derive(Debug, Clone, Copy)]
struct CatchUp {
    from: i64,
    target: i64,
    started: Instant,
}

impl Run<'_> {
    /// Records were taken that the store has not committed yet.
    fn uncommitted(&self, store: &Store) -> bool {
        self.last_taken > store.applied()
    }
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

    /// The log's offsets, asked of the broker, or `None` when a stop comes first. The request
    /// blocks for up to its timeout, so it runs on a blocking thread; while it waits (or waits for
    /// a thread), a known outage shows. A stop does not wait for the answer: in an outage every
    /// partition's request takes its whole timeout, a few blocking threads at a time, and 100
    /// partitions took four minutes to stop, past any pod's grace period.
    /// It goes through the catching-up consumer: a broker answers one connection's requests in
    /// order, and the tailing consumer's connection carries a fetch the broker holds for up to
    /// `fetch.wait.max.ms`, which every open queued behind (8 opens a second at 1,000 partitions).
    async fn bounds(&self) -> Result<Option<LogBounds>, Failure> {
        let (consumer, tp) = (self.catching_up.clone(), self.tp.clone());
        let request = blocking(move || consumers::log_bounds(&consumer, &tp.topic, tp.partition));
        tokio::pin!(request);
        let answer = loop {
            tokio::select! {
                answer = &mut request => break answer,
                _ = self.stop.requested() => return Ok(None),
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
        Ok(Some(LogBounds {
            log_start: low,
            high_watermark: high,
        }))
    }

    async fn attempt(&self) -> Result<(), Failure> {
        self.status
            .set_state(PartitionState::Opening, self.status.error());
        let Some(bounds) = self.bounds().await? else {
            return Ok(());
        };
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
            catch_up: CatchUp {
                from: -1,
                target: -1,
                started: Instant::now(),
            },
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
                    Ok(Some(bounds)) => {
                        // A wipe that fails leaves no store to close: the attempt ends here, as
                        // the machine's `Dropped` would end it.
                        store = self.wipe(store, &mut run, bounds).await?;
                        Ok(Some(Event::Positioned {
                            far_behind: self.far_behind(run.next, bounds.high_watermark),
                        }))
                    }
                    Ok(None) => Ok(Some(Event::StopRequested)),
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
        run.catch_up = CatchUp {
            from: run.next,
            target: end,
            started: Instant::now(),
        };
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
            let flushing = Instant::now();
            off_the_worker(|| store.flush())?;
            self.log_restored(run, flushing);
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
            let consumer = match lane {
                phase::Lane::CatchingUp => &self.catching_up,
                phase::Lane::Tailing => &self.tailing,
            };
            run.assignment = Some(Assignment::new(consumer, &self.wake, &self.tp, run.next)?);
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

    /// One line per store partition restored (its first catch-up since open or wipe, just made
    /// durable), as Kafka Streams logs each changelog it has restored, with where the time went:
    /// waiting for a turn of memory, fetching and applying, and the flush. A flush queues behind
    /// other partitions' on RocksDB's flush threads, so a restore paced by them shows it here.
    fn log_restored(&self, run: &Run, flushing: Instant) {
        let started = run.catch_up.started;
        let granted = run
            .turn
            .as_ref()
            .map_or(started, |turn| turn.granted().max(started));
        tracing::info!(store = %self.status.store, topic = %self.tp.topic, partition = self.tp.partition,
            from = run.catch_up.from, to = run.next,
            waited_for_turn_s = seconds(granted.duration_since(started)),
            catching_up_s = seconds(flushing.duration_since(granted)),
            flushing_s = seconds(flushing.elapsed()),
            "store partition restored");
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

    /// The log's bounds for a rebuild, shown as `wiping` while asked for; `None` on a stop.
    async fn wiping_bounds(&self) -> Result<Option<LogBounds>, Failure> {
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
}

/// Seconds to the millisecond, as a log shows them.
fn seconds(duration: Duration) -> f64 {
    (duration.as_secs_f64() * 1000.0).round() / 1000.0
}

/// Runs a call that waits on the disk (a flush), handing this worker thread's other partitions to
/// another thread meanwhile: with a thread per core, a flush would otherwise stop them all.
fn off_the_worker<T>(call: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(call)
}
