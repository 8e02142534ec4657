//! The restore engine: every configured store partition consumed into its own store, resumed from
//! the offset inside the store, rebuilt when dirty, then tailed as a warm standby.

mod ownership;
pub mod phase;
pub mod policy;
mod tasks;
mod turns;
mod worker;

use rdkafka::message::Message;
use std::collections::BTreeSet;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

use crate::config::{Assignment, Config, StoreConfig};
use crate::kafka::consumers::{self, ChangelogConsumer};
use crate::kafka::statistics::WatermarkCells;
use crate::observe::logging::RepeatedWarnings;
use crate::observe::status::{Board, PartitionState, PartitionStatus};
use crate::store::{BackgroundThreads, StoreOptions, StorePaths, TopicPartition};
use tasks::{blocking, Stop, StopHandle, Tasks};
use worker::Worker;

/// How often a changelog's partitions are listed again once its store runs: `mode: all` restores
/// partitions added to it, group mode counts what the group should own.
const LIST_PARTITIONS_EVERY: Duration = Duration::from_secs(30);

/// How often the consumers' main queues are served (statistics and error callbacks).
const MAIN_QUEUE_EVERY: Duration = Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("cannot create the Kafka consumer: {0}")]
    Consumer(#[from] rdkafka::error::KafkaError),
    #[error("cannot start the restore runtime: {0}")]
    Runtime(#[from] std::io::Error),
    #[error("cannot start the consumer group member's thread: {0}")]
    MemberThread(std::io::Error),
    #[error("cannot size RocksDB's background threads: {0}")]
    BackgroundThreads(#[source] rocksdb::Error),
}

/// A running engine. `stop` (or drop) closes every store cleanly.
pub struct Engine {
    /// Group mode's member thread: it ends once the stop is requested, after the group member
    /// has closed.
    member: Option<std::thread::JoinHandle<()>>,
    stop: StopHandle,
    runtime: Option<tokio::runtime::Runtime>,
    tasks: Tasks,
    board: Arc<Board>,
}

impl Engine {
    pub fn start(config: &Config, board: Arc<Board>) -> Result<Engine, EngineError> {
        let options = config.store_options();
        options.warn_about_ignored_settings();
        let pools = BackgroundThreads::sized(&options.rocksdb, tasks::cores());
        pools.apply().map_err(EngineError::BackgroundThreads)?;
        tracing::info!(
            flush = pools.flush,
            compaction = pools.compaction,
            "RocksDB background threads"
        );
        for message in config.warnings() {
            tracing::warn!("{message}");
        }
        let descriptor_limit = match crate::store::descriptors::raise_limit() {
            Ok(limit) => {
                tracing::info!(limit, "open files limit");
                Some(limit)
            }
            Err(error) => {
                tracing::warn!(%error, "cannot read the open files limit");
                None
            }
        };
        let watermarks = Arc::new(WatermarkCells::default());
        let (tailing, catching_up) =
            consumers::create_consumers(&config.kafka, board.clone(), watermarks.clone())?;
        let (stop_handle, stop) = tasks::stop_pair();
        let count = config.restore.catch_up_turns;
        let turns = turns::Turns::new(count, config.memtable_budget() / count.max(1) as u64);
        let runtime = tasks::runtime()?;
        let tasks = Tasks::new(runtime.handle().clone(), board.clone());
        board.restore_alive.store(true, Relaxed);

        // The main queues must be served for statistics and error callbacks; records arrive on
        // the per-partition queues instead.
        for (name, consumer) in [("kafka-poll", &tailing), ("kafka-catch-up", &catching_up)] {
            let (consumer, stop) = (consumer.clone(), stop.clone());
            tasks.spawn(name.to_string(), async move {
                // The same errors reach the client's error callback; each kind is logged once a
                // while.
                let warnings = RepeatedWarnings::default();
                while !stop.is_requested() {
                    while let Some(result) = consumer.poll(Duration::ZERO) {
                        match result {
                            // The client's error callback has said why this one is harmless.
                            Err(error) if consumers::placeholder_group_refused(&error) => {}
                            Err(error) => {
                                if let Some(repeats_not_logged) =
                                    warnings.due_now(&error.to_string())
                                {
                                    tracing::warn!(%error, repeats_not_logged, "consumer error");
                                }
                            }
                            // Only a partition whose queue was not split off sends records here,
                            // and its store never sees them: a bug, shown as loudly as can be.
                            Ok(record) => {
                                let kind = format!("record {}", record.topic());
                                if let Some(repeats_not_logged) = warnings.due_now(&kind) {
                                    tracing::error!(topic = record.topic(), partition = record.partition(),
                                        offset = record.offset(), repeats_not_logged,
                                        "a record reached the consumer's main queue instead of its partition's queue and is not applied");
                                }
                            }
                        }
                    }
                    stop.sleep(MAIN_QUEUE_EVERY).await;
                }
            });
        }

        let launcher = Launcher {
            config: config.clone(),
            tailing,
            catching_up,
            board: board.clone(),
            stop: stop.clone(),
            tasks: tasks.clone(),
            turns,
            watermarks,
            descriptor_limit,
            options,
        };
        let member = match &config.assignment {
            Assignment::All => {
                for store in &config.stores {
                    board.expect_store(&store.name);
                }
                for store in &config.stores {
                    let setup = StoreSetup {
                        store: store.clone(),
                        launcher: launcher.clone(),
                    };
                    tasks.spawn(format!("store {}", store.name), setup.run());
                }
                None
            }
            Assignment::Group(group) => Some(ownership::join(config, group, launcher, stop)?),
        };
        Ok(Engine {
            member,
            stop: stop_handle,
            runtime: Some(runtime),
            tasks,
            board,
        })
    }

    /// Stops fetching, commits, flushes, writes `status` 0 and closes every store.
    pub fn stop(mut self) {
        self.shutdown();
    }

    /// Counts what `stop` still waits for, from another thread while it waits.
    pub fn stop_progress(&self) -> StopProgress {
        StopProgress(self.tasks.clone())
    }

    fn shutdown(&mut self) {
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        self.stop.request();
        if let Some(member) = self.member.take() {
            if member.join().is_err() {
                tracing::error!("the consumer group member panicked");
            }
        }
        self.tasks.wait();
        // Every task has finished; what is left are blocking calls nobody waits for any more.
        runtime.shutdown_background();
        self.board.restore_alive.store(false, Relaxed);
    }
}

/// What a stopping engine still waits for.
pub struct StopProgress(Tasks);

impl StopProgress {
    /// Tasks not finished: mostly store partitions still committing, flushing and closing.
    pub fn unfinished(&self) -> usize {
        self.0.unfinished()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// What every store partition's task is started with, shared by all of them; `start` runs one.
#[derive(Clone)]
struct Launcher {
    config: Config,
    tailing: Arc<ChangelogConsumer>,
    catching_up: Arc<ChangelogConsumer>,
    board: Arc<Board>,
    stop: Stop,
    tasks: Tasks,
    turns: Arc<turns::Turns>,
    watermarks: Arc<WatermarkCells>,
    /// The process's soft limit on open files, if it could be read.
    descriptor_limit: Option<u64>,
    options: StoreOptions,
}

/// A running store partition: asked to stop by `stop`; `done` disconnects once its store is closed.
struct Running {
    stop: StopHandle,
    done: std::sync::mpsc::Receiver<()>,
}

impl Running {
    /// Asks the partition to commit, flush and close, and waits until it has.
    fn close(self) {
        self.stop.request();
        let _ = self.done.recv();
    }
}

impl Launcher {
    /// Puts the partition on the board (again, if it was there before) and starts its task.
    fn start(&self, store: &StoreConfig, partition: i32) -> Running {
        let tp = TopicPartition::new(&store.changelog, partition);
        let paths = StorePaths::for_layout(
            &self.config.state_dir,
            &store.layout,
            &store.name,
            partition,
        );
        let status = self.board.find(&store.name, partition).unwrap_or_else(|| {
            let status = Arc::new(PartitionStatus::new(
                &store.name,
                &tp.topic,
                partition,
                paths.db.clone(),
            ));
            self.board.add(status.clone());
            status
        });
        status.set_state(PartitionState::Opening, None);
        let (stop_handle, stop) = self.stop.child();
        let worker = Worker {
            watermarks: self.watermarks.register(&tp.topic, partition),
            tailing: self.tailing.clone(),
            catching_up: self.catching_up.clone(),
            status,
            board: self.board.clone(),
            tp,
            paths,
            options: self.options.clone(),
            restore: self.config.restore.clone(),
            stop,
            wake: Arc::new(Notify::new()),
            turns: self.turns.clone(),
        };
        let (done_tx, done) = std::sync::mpsc::channel::<()>();
        self.tasks
            .spawn(format!("{}-{partition}", store.name), async move {
                worker.run().await;
                drop(done_tx);
            });
        Running {
            stop: stop_handle,
            done,
        }
    }

    /// Warns when the stores known so far may need more descriptors than the process may open.
    fn check_descriptors(&self) {
        let partitions = self.board.partition_count() as u64;
        let (Some(limit), Some(per_store)) = (
            self.descriptor_limit,
            crate::store::descriptors::per_store(self.options.max_open_files()),
        ) else {
            return;
        };
        if let Some(missing) = crate::store::descriptors::shortfall(partitions, per_store, limit) {
            tracing::warn!(partitions, per_store, limit, missing,
                "the open stores may need more file descriptors than the process may open; raise the limit (ulimit -n) or lower rocksdb.max_open_files");
        }
    }
}

/// Resolves one store's partitions (retrying while the topic is missing), then starts each: what
/// `mode: all` does for every configured store. A missing topic fails this store only.
struct StoreSetup {
    store: StoreConfig,
    launcher: Launcher,
}

impl StoreSetup {
    async fn run(self) {
        let Some(partitions) = self.resolve_partitions().await else {
            return;
        };
        let mut started = BTreeSet::new();
        self.start_added(&partitions, &mut started);
        self.launcher.board.store_resolved(&self.store.name);
        if self.store.partitions.is_none() {
            self.follow_added_partitions(started).await;
        }
    }

    /// Starts each partition of `listed` not started yet; returns how many.
    fn start_added(&self, listed: &[i32], started: &mut BTreeSet<i32>) -> usize {
        let added = policy::added_partitions(started, listed);
        for &partition in &added {
            // The engine's own stop ends the partition; its handle is not needed.
            drop(self.launcher.start(&self.store, partition));
            started.insert(partition);
        }
        if !added.is_empty() {
            self.launcher.check_descriptors();
        }
        added.len()
    }

    /// "Every partition of the topic" stays true when partitions are added to the changelog: it is
    /// listed again every `LIST_PARTITIONS_EVERY` and each new partition is restored, so /readyz
    /// waits for it rather than answering ready without it. A listing that fails changes nothing:
    /// a deleted changelog already fails each of its partitions.
    async fn follow_added_partitions(&self, mut started: BTreeSet<i32>) {
        let stop = &self.launcher.stop;
        while !stop.sleep(LIST_PARTITIONS_EVERY).await {
            let (consumer, topic) = (self.launcher.tailing.clone(), self.store.changelog.clone());
            let listing = blocking(move || consumers::partitions_of(&consumer, &topic));
            let Some(listed) = stop.unless_requested(listing).await else {
                return;
            };
            match listed {
                Ok(listed) => {
                    let added = self.start_added(&listed, &mut started);
                    if added > 0 {
                        tracing::info!(store = %self.store.name, topic = %self.store.changelog,
                            added, partitions = started.len(),
                            "the changelog has new partitions; restoring them");
                    }
                }
                Err(error) => {
                    tracing::debug!(store = %self.store.name, %error, "cannot list the changelog's partitions again")
                }
            }
        }
    }

    async fn resolve_partitions(&self) -> Option<Vec<i32>> {
        if let Some(partitions) = &self.store.partitions {
            return Some(partitions.clone());
        }
        let mut attempt = 0;
        loop {
            let (consumer, topic) = (self.launcher.tailing.clone(), self.store.changelog.clone());
            let request = blocking(move || consumers::partitions_of(&consumer, &topic));
            match self.launcher.stop.unless_requested(request).await? {
                Ok(partitions) => {
                    self.launcher.board.set_store_error(&self.store.name, None);
                    return Some(partitions);
                }
                // A request that ends after shutdown began is not retried, nor logged as if.
                Err(_) if self.launcher.stop.is_requested() => return None,
                Err(error) => {
                    let error = format!(
                        "{error}{}",
                        crate::observe::status::cause_suffix(&self.launcher.board.kafka_cause())
                    );
                    let delay = policy::backoff(attempt);
                    attempt += 1;
                    tracing::warn!(store = %self.store.name, topic = %self.store.changelog, %error,
                        retry_in_s = delay.as_secs(), "store failed; retrying");
                    self.launcher
                        .board
                        .set_store_error(&self.store.name, Some(error));
                    if self.launcher.stop.sleep(delay).await {
                        return None;
                    }
                }
            }
        }
    }
}
