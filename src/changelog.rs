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
//! up to 100 ms per turn, which made a restore of many small partitions up to twice as slow with 4
//! turns, and 4.5 times with 1 (docs/restore.md).

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{ClientContext, Statistics};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicI64};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::status::Board;

pub type ChangelogConsumer = BaseConsumer<EngineContext>;

/// Defaults chosen for a standby that bulk-loads, then tails, with bounded memory. Every one can be
/// overridden under `kafka:`.
pub const CONSUMER_DEFAULTS: &[(&str, &str)] = &[
    // Required by librdkafka; never used to subscribe or commit.
    ("group.id", "warmstore"),
    ("enable.auto.commit", "false"),
    ("enable.auto.offset.store", "false"),
    // Out of range must reach warmstore (it wipes and rebuilds), never silently jump.
    ("auto.offset.reset", "error"),
    ("isolation.level", "read_committed"),
    // A damaged uncompressed batch would otherwise be stored as it came, wrong values and all.
    // CRC32C runs in hardware; a failed check fails the partition with the reason.
    ("check.crcs", "true"),
    ("enable.partition.eof", "false"),
    ("allow.auto.create.topics", "false"),
    // End offsets, log-start offsets and positions, once a second.
    ("statistics.interval.ms", "1000"),
    // Per-partition prefetch bound (partition queues are split): memory stays flat with topic size.
    ("queued.max.messages.kbytes", "1024"),
    ("queued.min.messages", "20000"),
    // librdkafka waits this long after a full queue before fetching again; 1 s stalls bulk loads.
    ("fetch.queue.backoff.ms", "10"),
    ("fetch.max.bytes", "16777216"),
    ("fetch.wait.max.ms", "100"),
];

/// Longest the catching-up consumer lets the broker wait for data (the user's `fetch.wait.max.ms`
/// applies if shorter). Its partitions are behind, so the broker rarely waits at all.
pub const CATCHING_UP_FETCH_WAIT_MS: u32 = 10;

/// Which consumer a context serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Tailing,
    CatchingUp,
}

/// The log's offsets for one store partition, as the statistics of the consumer fetching it last
/// reported them, with the broker's answer at open as the starting point.
#[derive(Debug)]
pub struct Watermarks {
    end_offset: AtomicI64,
    log_start: AtomicI64,
    /// Which consumer fetches the partition now: only its statistics are fresh.
    catching_up: AtomicBool,
}

impl Watermarks {
    fn new() -> Self {
        Watermarks {
            end_offset: AtomicI64::new(-1),
            log_start: AtomicI64::new(-1),
            catching_up: AtomicBool::new(false),
        }
    }

    /// The end offset (the last stable offset under `read_committed`); -1 before any is known.
    pub fn end_offset(&self) -> i64 {
        self.end_offset.load(Relaxed)
    }

    pub fn log_start(&self) -> i64 {
        self.log_start.load(Relaxed)
    }

    /// Offsets asked of the broker directly (at open, before a wipe).
    pub fn set(&self, log_start: i64, end_offset: i64) {
        self.log_start.store(log_start, Relaxed);
        self.end_offset.store(end_offset, Relaxed);
    }

    pub fn set_catching_up(&self, catching_up: bool) {
        self.catching_up.store(catching_up, Relaxed);
    }
}

/// The cells of one topic partition: two stores may read one changelog.
type CellsOf = Vec<Arc<Watermarks>>;

/// Every partition's `Watermarks`, by topic and partition.
#[derive(Debug, Default)]
pub struct WatermarkCells {
    cells: RwLock<HashMap<(String, i32), CellsOf>>,
}

impl WatermarkCells {
    /// A new cell for one store partition, fed from now on.
    pub fn register(&self, topic: &str, partition: i32) -> Arc<Watermarks> {
        let cell = Arc::new(Watermarks::new());
        if let Ok(mut cells) = self.cells.write() {
            cells
                .entry((topic.to_string(), partition))
                .or_default()
                .push(cell.clone());
        }
        cell
    }

    fn find(&self, topic: &str, partition: i32) -> Vec<Arc<Watermarks>> {
        self.cells
            .read()
            .ok()
            .and_then(|cells| cells.get(&(topic.to_string(), partition)).cloned())
            .unwrap_or_default()
    }
}

/// Routes librdkafka's statistics to the partitions' watermarks, and its errors to the status
/// board.
pub struct EngineContext {
    board: Arc<Board>,
    watermarks: Arc<WatermarkCells>,
    read_committed: bool,
    role: Role,
}

impl ClientContext for EngineContext {
    fn stats(&self, statistics: Statistics) {
        // The catching-up consumer is idle between restores and may hold no connection then.
        if self.role == Role::Tailing {
            let states: Vec<(String, String)> = statistics
                .brokers
                .values()
                .map(|b| (b.nodename.clone(), b.state.clone()))
                .collect();
            self.track_outage(&states);
        }
        for (topic, t) in statistics.topics {
            for (partition, p) in t.partitions {
                if partition < 0 {
                    continue;
                }
                // Under read_committed the end is the last stable offset.
                let end = if self.read_committed && p.ls_offset >= 0 {
                    p.ls_offset
                } else {
                    p.hi_offset
                };
                // Only the consumer fetching the partition now has fresh offsets for it.
                for cell in self.watermarks.find(&topic, partition) {
                    if cell.catching_up.load(Relaxed) != (self.role == Role::CatchingUp) {
                        continue;
                    }
                    if end >= 0 {
                        cell.end_offset.store(end, Relaxed);
                    }
                    if p.lo_offset >= 0 {
                        cell.log_start.store(p.lo_offset, Relaxed);
                    }
                }
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(%error, reason, "kafka client error; librdkafka retries on its own");
        // "All brokers down" follows the error that says why (a refused handshake or login);
        // keep that one.
        if error.rdkafka_error_code() != Some(RDKafkaErrorCode::AllBrokersDown) {
            self.board
                .set_kafka_client_error(Some(format!("last Kafka client error: {reason}")));
        }
    }
}

impl ConsumerContext for EngineContext {}

impl EngineContext {
    fn track_outage(&self, states: &[(String, String)]) {
        if let Some(mut outage) = outage(states) {
            if let Some(error) = self.board.kafka_client_error() {
                outage = format!("{outage}; {error}");
            }
            if self.board.kafka_outage().is_none() {
                tracing::warn!(%outage, "Kafka unreachable; librdkafka keeps reconnecting");
            }
            self.board.set_kafka_outage(Some(outage));
        } else {
            if self.board.kafka_outage().is_some() {
                tracing::info!("Kafka reachable again");
                self.board.set_kafka_outage(None);
            }
            // With a broker up, an earlier error (an idle connection closed, say) explains nothing.
            self.board.set_kafka_client_error(None);
        }
    }
}

/// `Some(explanation)` when no broker connection is up, from (broker, state) pairs of librdkafka's
/// statistics; the bootstrap entries count, so an outage from the start is seen too.
pub fn outage(brokers: &[(String, String)]) -> Option<String> {
    if brokers.iter().any(|(_, state)| state == "UP") {
        return None;
    }
    // librdkafka lists a placeholder broker with no name; it says nothing to a reader.
    let mut names: Vec<String> = brokers
        .iter()
        .filter(|(n, _)| !n.is_empty())
        .map(|(n, s)| format!("{n} {s}"))
        .collect();
    names.sort();
    names.dedup();
    Some(format!("no Kafka broker reachable ({})", names.join(", ")))
}

/// The consumer config: defaults, then the user's properties on top.
pub fn client_config(kafka: &BTreeMap<String, String>) -> ClientConfig {
    let mut config = ClientConfig::new();
    for (key, value) in CONSUMER_DEFAULTS {
        config.set(*key, *value);
    }
    for (key, value) in kafka {
        config.set(key, value);
    }
    config
}

/// The tailing and the catching-up consumer, in that order (see the module's doc).
pub fn create_consumers(
    kafka: &BTreeMap<String, String>,
    board: Arc<Board>,
    watermarks: Arc<WatermarkCells>,
) -> Result<(Arc<ChangelogConsumer>, Arc<ChangelogConsumer>), KafkaError> {
    let tailing = create_consumer(
        client_config(kafka),
        board.clone(),
        watermarks.clone(),
        Role::Tailing,
    )?;
    let catching_up = create_consumer(
        catching_up_config(kafka),
        board,
        watermarks,
        Role::CatchingUp,
    )?;
    Ok((tailing, catching_up))
}

/// The catching-up consumer's config: the same, with a short fetch wait.
pub fn catching_up_config(kafka: &BTreeMap<String, String>) -> ClientConfig {
    let mut config = client_config(kafka);
    let wait = config
        .get("fetch.wait.max.ms")
        .and_then(|v| v.parse::<u32>().ok())
        .map_or(CATCHING_UP_FETCH_WAIT_MS, |w| {
            w.min(CATCHING_UP_FETCH_WAIT_MS)
        });
    config.set("fetch.wait.max.ms", wait.to_string());
    config
}

fn create_consumer(
    config: ClientConfig,
    board: Arc<Board>,
    watermarks: Arc<WatermarkCells>,
    role: Role,
) -> Result<Arc<ChangelogConsumer>, KafkaError> {
    let read_committed = config.get("isolation.level") != Some("read_uncommitted");
    let consumer = config.create_with_context(EngineContext {
        board,
        watermarks,
        read_committed,
        role,
    })?;
    Ok(Arc::new(consumer))
}

/// librdkafka as linked into this binary: its version and `builtin.features` (ssl, sasl_scram,
/// zstd, ...). The first thing to check when a security setting or a codec is refused.
pub fn librdkafka_build() -> String {
    let (_, version) = rdkafka::util::get_rdkafka_version();
    format!(
        "librdkafka {version} (builtin.features: {})",
        builtin_features()
    )
}

fn builtin_features() -> String {
    use rdkafka::bindings as rd;
    use std::ffi::{c_char, CStr};
    let mut buffer = [0 as c_char; 512];
    let mut size = buffer.len();
    // SAFETY: a fresh default config is read into a buffer whose size is passed along, then freed.
    let result = unsafe {
        let conf = rd::rd_kafka_conf_new();
        let result = rd::rd_kafka_conf_get(
            conf,
            c"builtin.features".as_ptr(),
            buffer.as_mut_ptr(),
            &mut size,
        );
        rd::rd_kafka_conf_destroy(conf);
        result
    };
    if result != rd::rd_kafka_conf_res_t::RD_KAFKA_CONF_OK {
        return "unknown".to_string();
    }
    // SAFETY: librdkafka wrote a NUL-terminated string that fits the buffer.
    unsafe { CStr::from_ptr(buffer.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// Why a changelog's partitions cannot be listed.
#[derive(Debug, thiserror::Error)]
pub enum TopicError {
    #[error("cannot read metadata of topic {topic}: {source}")]
    Metadata { topic: String, source: KafkaError },
    #[error("topic {topic} not found")]
    NotFound { topic: String },
    #[error("topic {topic}: {code}")]
    Broker {
        topic: String,
        code: RDKafkaErrorCode,
    },
    #[error("topic {topic} has no partitions")]
    NoPartitions { topic: String },
}

/// Every partition of `topic`, or an error that says why there are none (missing topic).
pub fn partitions_of(
    consumer: &ChangelogConsumer,
    topic: &str,
    timeout: Duration,
) -> Result<Vec<i32>, TopicError> {
    let topic_name = || topic.to_string();
    let metadata = consumer
        .fetch_metadata(Some(topic), timeout)
        .map_err(|source| TopicError::Metadata {
            topic: topic_name(),
            source,
        })?;
    let t = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .ok_or_else(|| TopicError::NotFound {
            topic: topic_name(),
        })?;
    if let Some(error) = t.error() {
        return Err(TopicError::Broker {
            topic: topic_name(),
            code: error.into(),
        });
    }
    let partitions: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
    if partitions.is_empty() {
        return Err(TopicError::NoPartitions {
            topic: topic_name(),
        });
    }
    Ok(partitions)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brokers(states: &[(&str, &str)]) -> Vec<(String, String)> {
        states
            .iter()
            .map(|(n, s)| (n.to_string(), s.to_string()))
            .collect()
    }

    #[test]
    fn the_catching_up_consumer_waits_briefly_unless_the_user_asked_for_less() {
        let mut kafka = BTreeMap::new();
        let wait = |kafka: &BTreeMap<String, String>| {
            catching_up_config(kafka)
                .get("fetch.wait.max.ms")
                .map(str::to_string)
        };
        assert_eq!(wait(&kafka).as_deref(), Some("10"));
        kafka.insert("fetch.wait.max.ms".to_string(), "500".to_string());
        assert_eq!(wait(&kafka).as_deref(), Some("10"));
        assert_eq!(client_config(&kafka).get("fetch.wait.max.ms"), Some("500"));
        kafka.insert("fetch.wait.max.ms".to_string(), "2".to_string());
        assert_eq!(wait(&kafka).as_deref(), Some("2"));
    }

    #[test]
    fn the_build_has_tls_sasl_and_every_codec() {
        let build = librdkafka_build();
        for feature in [
            "ssl",
            "sasl_plain",
            "sasl_scram",
            "sasl_oauthbearer",
            "gzip",
            "snappy",
            "lz4",
            "zstd",
        ] {
            assert!(
                build.split([' ', ',', ')']).any(|f| f == feature),
                "{feature} missing from {build}"
            );
        }
    }

    #[test]
    fn an_outage_is_no_broker_up() {
        assert_eq!(
            outage(&brokers(&[("b:9092", "UP"), ("c:9092", "DOWN")])),
            None
        );
        let o = outage(&brokers(&[("b:9092", "CONNECT"), ("c:9092", "DOWN")])).unwrap();
        assert!(
            o.contains("b:9092 CONNECT") && o.contains("c:9092 DOWN"),
            "{o}"
        );
        assert!(outage(&[]).is_some());
        let o = outage(&brokers(&[("", "INIT"), ("b:9092", "TRY_CONNECT")])).unwrap();
        assert_eq!(o, "no Kafka broker reachable (b:9092 TRY_CONNECT)");
    }
}
