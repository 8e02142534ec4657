//! The restore engine: every configured store partition consumed into its own store, resumed from
//! the offset inside the store, rebuilt when dirty, then tailed as a warm standby.

pub mod phase;
pub mod policy;
mod turns;
mod worker;

use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::changelog::{self, ChangelogConsumer, WatermarkCells};
use crate::config::{Config, StoreConfig};
use crate::status::{Board, PartitionStatus};
use crate::store::{StoreOptions, StorePaths, TopicPartition};
use worker::{LaneQueue, Worker};

const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("cannot create the Kafka consumer: {0}")]
    Consumer(#[from] rdkafka::error::KafkaError),
    #[error("cannot start a thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// A running engine. `stop` (or drop) closes every store cleanly.
pub struct Engine {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    board: Arc<Board>,
}

impl Engine {
    pub fn start(config: &Config, board: Arc<Board>) -> Result<Engine, EngineError> {
        let options = config.store_options();
        options.warn_about_ignored_settings();
        let descriptor_limit = match crate::descriptors::raise_limit() {
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
            changelog::create_consumers(&config.kafka, board.clone(), watermarks.clone())?;
        let stop = Arc::new(AtomicBool::new(false));
        let count = config.restore.max_parallel_restores;
        let turns = turns::Turns::new(count, config.memtable_budget() / count.max(1) as u64);
        let mut threads = Vec::new();
        board.restore_alive.store(true, Relaxed);

        // The main queues must be polled to serve statistics and error callbacks; records arrive
        // on the per-partition queues instead.
        for (name, consumer) in [("kafka-poll", &tailing), ("kafka-catch-up", &catching_up)] {
            let (c, s) = (consumer.clone(), stop.clone());
            threads.push(spawn(name, &board, move || {
                while !s.load(Relaxed) {
                    if let Some(Err(e)) = c.poll(Duration::from_millis(100)) {
                        tracing::warn!(error = %e, "consumer error");
                    }
                }
            })?);
        }

        for store in &config.stores {
            let setup = StoreSetup {
                store: store.clone(),
                config: config.clone(),
                tailing: tailing.clone(),
                catching_up: catching_up.clone(),
                board: board.clone(),
                stop: stop.clone(),
                turns: turns.clone(),
                watermarks: watermarks.clone(),
                descriptor_limit,
                options: options.clone(),
            };
            threads.push(spawn(
                &format!("store-{}", store.name),
                &board,
                move || setup.run(),
            )?);
        }
        Ok(Engine {
            stop,
            threads,
            board,
        })
    }

    /// Stops fetching, commits, flushes, writes `status` 0 and closes every store.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Relaxed);
        for thread in self.threads.drain(..) {
            if thread.join().is_err() {
                tracing::error!("a restore thread panicked");
            }
        }
        self.board.restore_alive.store(false, Relaxed);
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Starts a restore thread. If it panics, the board says the engine is no longer alive, which
/// `/livez` reports so Kubernetes restarts the pod.
fn spawn(
    name: &str,
    board: &Arc<Board>,
    f: impl FnOnce() + Send + 'static,
) -> std::io::Result<JoinHandle<()>> {
    let board = board.clone();
    std::thread::Builder::new()
        .name(name.chars().take(15).collect())
        .spawn(move || {
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
                tracing::error!("a restore thread panicked; /livez now fails");
                board.restore_alive.store(false, Relaxed);
            }
        })
}

/// Resolves one store's partitions (retrying while the topic is missing), then runs a worker per
/// partition. A missing topic fails this store only.
struct StoreSetup {
    store: StoreConfig,
    config: Config,
    tailing: Arc<ChangelogConsumer>,
    catching_up: Arc<ChangelogConsumer>,
    board: Arc<Board>,
    stop: Arc<AtomicBool>,
    turns: Arc<turns::Turns>,
    watermarks: Arc<WatermarkCells>,
    /// The process's soft limit on open files, if it could be read.
    descriptor_limit: Option<u64>,
    options: StoreOptions,
}

impl StoreSetup {
    fn run(self) {
        let Some(partitions) = self.resolve_partitions() else {
            return;
        };
        let mut workers = Vec::new();
        for partition in partitions {
            let tp = TopicPartition::new(&self.store.changelog, partition);
            let paths = StorePaths::new(&self.config.state_dir, &self.store.name, partition);
            let status = Arc::new(PartitionStatus::new(
                &self.store.name,
                &tp.topic,
                partition,
                paths.db.clone(),
            ));
            self.board.add(status.clone());
            // Split before assigning, so no record of this partition reaches a main queue.
            let lane = |consumer: &Arc<ChangelogConsumer>| {
                let queue = consumer.split_partition_queue(&tp.topic, partition)?;
                Some(LaneQueue {
                    consumer: consumer.clone(),
                    queue,
                })
            };
            let (Some(tailing), Some(catching_up)) = (lane(&self.tailing), lane(&self.catching_up))
            else {
                status.set_state(
                    crate::status::PartitionState::Failed,
                    Some(format!("cannot create a queue for {tp}")),
                );
                continue;
            };
            let worker = Worker {
                watermarks: self.watermarks.register(&tp.topic, partition),
                tailing,
                catching_up,
                status,
                board: self.board.clone(),
                tp,
                paths,
                options: self.options.clone(),
                restore: self.config.restore.clone(),
                stop: self.stop.clone(),
                turns: self.turns.clone(),
            };
            match spawn(
                &format!("{}-{partition}", self.store.name),
                &self.board,
                move || worker.run(),
            ) {
                Ok(handle) => workers.push(handle),
                Err(e) => {
                    tracing::error!(store = %self.store.name, partition, error = %e, "cannot start a worker")
                }
            }
        }
        self.check_descriptors();
        for worker in workers {
            let _ = worker.join();
        }
    }

    /// Warns when the stores known so far may need more descriptors than the process may open.
    fn check_descriptors(&self) {
        let partitions = self.board.partition_count() as u64;
        let (Some(limit), Some(per_store)) = (
            self.descriptor_limit,
            crate::descriptors::per_store(self.options.max_open_files()),
        ) else {
            return;
        };
        if let Some(missing) = crate::descriptors::shortfall(partitions, per_store, limit) {
            tracing::warn!(partitions, per_store, limit, missing,
                "the open stores may need more file descriptors than the process may open; raise the limit (ulimit -n) or lower rocksdb.max_open_files");
        }
    }

    fn resolve_partitions(&self) -> Option<Vec<i32>> {
        if let Some(partitions) = &self.store.partitions {
            return Some(partitions.clone());
        }
        let mut attempt = 0;
        loop {
            match changelog::partitions_of(&self.tailing, &self.store.changelog, METADATA_TIMEOUT) {
                Ok(partitions) => {
                    self.board.set_store_error(&self.store.name, None);
                    return Some(partitions);
                }
                Err(error) => {
                    let error = format!(
                        "{error}{}",
                        crate::status::cause_suffix(&self.board.kafka_cause())
                    );
                    let delay = policy::backoff(attempt);
                    attempt += 1;
                    tracing::warn!(store = %self.store.name, topic = %self.store.changelog, %error,
                        retry_in_s = delay.as_secs(), "store failed; retrying");
                    self.board.set_store_error(&self.store.name, Some(error));
                    let until = Instant::now() + delay;
                    while Instant::now() < until {
                        if self.stop.load(Relaxed) {
                            return None;
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        }
    }
}
