//! librdkafka's statistics and errors, routed: end and log-start offsets to each partition's
//! `Watermarks` (so end offsets are refreshed without a request per partition), broker states and
//! errors to the status board.

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::ClientContext;
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32};
use std::sync::{Arc, RwLock, Weak};

use super::consumers::{placeholder_group_refused, Role};
use crate::observe::logging::RepeatedWarnings;
use crate::observe::status::Board;

/// The log's offsets for one store partition, as the statistics of the consumer fetching it last
/// reported them, with the broker's answer at open as the starting point.
#[derive(Debug)]
pub struct Watermarks {
    end_offset: AtomicI64,
    log_start: AtomicI64,
    /// Which consumer fetches the partition now: only its statistics are fresh.
    catching_up: AtomicBool,
    /// Reports in a row from that consumer that did not find the partition in its topic's
    /// metadata.
    unlisted_reports: AtomicU32,
}

/// Reports in a row that make a partition gone: a partition just assigned can be reported once
/// before its topic's metadata arrives.
const GONE_AFTER_REPORTS: u32 = 2;

impl Watermarks {
    fn new() -> Self {
        Watermarks {
            end_offset: AtomicI64::new(-1),
            log_start: AtomicI64::new(-1),
            catching_up: AtomicBool::new(false),
            unlisted_reports: AtomicU32::new(0),
        }
    }

    /// The end offset (the last stable offset under `read_committed`); -1 before any is known.
    pub fn end_offset(&self) -> i64 {
        self.end_offset.load(Relaxed)
    }

    pub fn log_start(&self) -> i64 {
        self.log_start.load(Relaxed)
    }

    /// Whether the partition has left its topic's metadata while fetched: the changelog was
    /// deleted (or this client may no longer describe it). librdkafka then stops fetching it and
    /// says so only in its log, so without this a tailing partition would go on showing
    /// `caught_up` over a changelog that no longer exists.
    pub fn gone(&self) -> bool {
        self.unlisted_reports.load(Relaxed) >= GONE_AFTER_REPORTS
    }

    /// Offsets asked of the broker directly (at open, before a wipe): the partition exists.
    pub fn set(&self, log_start: i64, end_offset: i64) {
        self.log_start.store(log_start, Relaxed);
        self.end_offset.store(end_offset, Relaxed);
        self.unlisted_reports.store(0, Relaxed);
    }

    pub fn set_catching_up(&self, catching_up: bool) {
        self.catching_up.store(catching_up, Relaxed);
        self.unlisted_reports.store(0, Relaxed);
    }

    fn reported(&self, listed: bool) {
        if listed {
            self.unlisted_reports.store(0, Relaxed);
        } else {
            self.unlisted_reports.fetch_add(1, Relaxed);
        }
    }
}

/// The cells of one topic partition. Held weakly: a store partition that stops (revoked in group
/// mode) drops its cell, and a later one registers anew, possibly before the old one is dropped.
type CellsOf = Vec<Weak<Watermarks>>;

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
            let of = cells.entry((topic.to_string(), partition)).or_default();
            of.retain(|c| c.strong_count() > 0);
            of.push(Arc::downgrade(&cell));
        }
        cell
    }

    /// Whether any partition is on the catching-up consumer: when none is, that consumer's
    /// statistics are fresh for no one and are not even decoded.
    fn any_catching_up(&self) -> bool {
        self.cells.read().is_ok_and(|cells| {
            cells
                .values()
                .flatten()
                .filter_map(Weak::upgrade)
                .any(|cell| cell.catching_up.load(Relaxed))
        })
    }

    fn find(&self, topic: &str, partition: i32) -> Vec<Arc<Watermarks>> {
        self.cells
            .read()
            .ok()
            .and_then(|cells| {
                cells
                    .get(&(topic.to_string(), partition))
                    .map(|of| of.iter().filter_map(Weak::upgrade).collect())
            })
            .unwrap_or_default()
    }
}

/// The part of librdkafka's statistics that warmstore reads. rdkafka's own `Statistics` decodes
/// every field (dozens per partition, with strings and windows), and at 1,000 partitions doing so
/// each second for each consumer was a visible share of an idle standby's CPU; what is not named
/// here is skipped without being decoded.
#[derive(Debug, Default, Deserialize)]
struct Reported {
    #[serde(default)]
    brokers: HashMap<String, BrokerReported>,
    #[serde(default)]
    topics: HashMap<String, TopicReported>,
}

#[derive(Debug, Deserialize)]
struct BrokerReported {
    #[serde(default)]
    nodename: String,
    #[serde(default)]
    state: String,
}

#[derive(Debug, Default, Deserialize)]
struct TopicReported {
    /// By partition id; librdkafka also lists its internal partition -1.
    #[serde(default)]
    partitions: HashMap<i32, PartitionReported>,
}

#[derive(Debug, Deserialize)]
struct PartitionReported {
    #[serde(default = "unknown")]
    hi_offset: i64,
    #[serde(default = "unknown")]
    lo_offset: i64,
    #[serde(default = "unknown")]
    ls_offset: i64,
    /// Not in the topic's metadata: librdkafka keeps a partition it was asked to fetch listed
    /// after its topic is deleted, with this set.
    #[serde(default, rename = "unknown")]
    unlisted: bool,
}

fn unknown() -> i64 {
    -1
}

/// Routes librdkafka's statistics to the partitions' watermarks, and its errors to the status
/// board.
pub struct EngineContext {
    pub(super) board: Arc<Board>,
    pub(super) watermarks: Arc<WatermarkCells>,
    /// Under read_committed the end offset a partition catches up to is the last stable offset.
    pub(super) read_committed: bool,
    pub(super) role: Role,
    /// librdkafka repeats an error on every reconnect; the log gets each kind once a while.
    pub(super) warnings: RepeatedWarnings,
}

impl ClientContext for EngineContext {
    fn stats_raw(&self, json: &[u8]) {
        if self.role == Role::CatchingUp && !self.watermarks.any_catching_up() {
            return;
        }
        match serde_json::from_slice::<Reported>(json) {
            Ok(reported) => self.route(reported),
            // End offsets then stay as they were: lag and catch-up go stale, so say why.
            Err(error) => {
                tracing::warn!(%error, "librdkafka's statistics could not be read; end offsets are not refreshed")
            }
        }
    }

    /// librdkafka logs some errors itself as often as it meets them: a deleted topic's partitions
    /// three times a second each, until they are let go. Warnings and errors are logged once a
    /// while per kind, as `error` logs its errors.
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        use RDKafkaLogLevel as L;
        match level {
            L::Emerg | L::Alert | L::Critical | L::Error | L::Warning => {
                let text = format!("{fac} {log_message}");
                let Some(repeats_not_logged) = self.warnings.due_now(&text) else {
                    return;
                };
                if matches!(level, L::Warning) {
                    tracing::warn!(target: "librdkafka", repeats_not_logged, "librdkafka: {fac} {log_message}");
                } else {
                    tracing::error!(target: "librdkafka", repeats_not_logged, "librdkafka: {fac} {log_message}");
                }
            }
            L::Notice | L::Info => {
                tracing::info!(target: "librdkafka", "librdkafka: {fac} {log_message}")
            }
            L::Debug => tracing::debug!(target: "librdkafka", "librdkafka: {fac} {log_message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let due = self.warnings.due_now(&error.to_string());
        if placeholder_group_refused(&error) {
            if due.is_some() {
                tracing::info!(reason, "the broker refuses the lookup of the consumers' placeholder group.id; harmless, they never join or commit to it");
            }
            return;
        }
        if let Some(repeats_not_logged) = due {
            tracing::warn!(%error, reason, repeats_not_logged, "kafka client error; librdkafka retries on its own");
        }
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
    fn route(&self, reported: Reported) {
        // The catching-up consumer is idle between restores and may hold no connection then.
        if self.role == Role::Tailing {
            let states: Vec<(String, String)> = reported
                .brokers
                .into_values()
                .map(|b| (b.nodename, b.state))
                .collect();
            self.track_outage(&states);
        }
        for (topic, t) in reported.topics {
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
                    cell.reported(!p.unlisted);
                }
            }
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    fn brokers(states: &[(&str, &str)]) -> Vec<(String, String)> {
        states
            .iter()
            .map(|(n, s)| (n.to_string(), s.to_string()))
            .collect()
    }

    /// librdkafka's statistics as it writes them (trimmed): the fields warmstore reads beside ones
    /// it skips, nested objects and all.
    const REPORTED: &str = r#"{
      "name": "rdkafka#consumer-1", "type": "consumer", "ts": 1, "time": 1, "replyq": 0,
      "brokers": {
        "127.0.0.1:9092/1": {"name": "127.0.0.1:9092/1", "nodeid": 1, "nodename": "127.0.0.1:9092",
          "state": "UP", "rtt": {"min": 1, "max": 2, "avg": 1, "p99": 2, "cnt": 3},
          "req": {"Fetch": 10, "Metadata": 1}, "toppars": {"t-0": {"topic": "t", "partition": 0}}}
      },
      "topics": {
        "t": {"topic": "t", "age": 10, "metadata_age": 5,
          "batchsize": {"min": 0, "max": 0, "avg": 0},
          "partitions": {
            "0": {"partition": 0, "broker": 1, "leader": 1, "desired": true, "fetch_state": "active",
              "query_offset": -1001, "next_offset": 40, "app_offset": 40, "committed_offset": -1001,
              "lo_offset": 5, "hi_offset": 42, "ls_offset": 40, "consumer_lag": 0, "txmsgs": 0},
            "-1": {"partition": -1, "broker": -1, "lo_offset": -1, "hi_offset": -1, "ls_offset": -1}
          }}
      },
      "cgrp": {"state": "init", "rebalance_cnt": 0}
    }"#;

    fn context(watermarks: Arc<WatermarkCells>, read_committed: bool) -> EngineContext {
        EngineContext {
            board: Arc::new(Board::default()),
            watermarks,
            read_committed,
            role: Role::Tailing,
            warnings: Default::default(),
        }
    }

    #[test]
    fn statistics_reach_the_partition_cells() {
        let cells = Arc::new(WatermarkCells::default());
        let committed = cells.register("t", 0);
        let other = cells.register("t", 1);
        context(cells.clone(), true).stats_raw(REPORTED.as_bytes());
        assert_eq!((committed.log_start(), committed.end_offset()), (5, 40));
        assert_eq!((other.log_start(), other.end_offset()), (-1, -1));

        let cells = Arc::new(WatermarkCells::default());
        let uncommitted = cells.register("t", 0);
        let ctx = context(cells.clone(), false);
        ctx.stats_raw(REPORTED.as_bytes());
        assert_eq!(uncommitted.end_offset(), 42);
        assert_eq!(ctx.board.kafka_outage(), None);

        // Unreadable statistics change nothing.
        uncommitted.set(0, 7);
        ctx.stats_raw(b"{\"topics\": [");
        assert_eq!((uncommitted.log_start(), uncommitted.end_offset()), (0, 7));
    }

    #[test]
    fn only_a_partition_on_the_consumer_takes_its_statistics() {
        let cells = Arc::new(WatermarkCells::default());
        let cell = cells.register("t", 0);
        let catching_up = EngineContext {
            role: Role::CatchingUp,
            ..context(cells.clone(), true)
        };
        catching_up.stats_raw(REPORTED.as_bytes());
        assert_eq!(cell.end_offset(), -1);
        cell.set_catching_up(true);
        catching_up.stats_raw(REPORTED.as_bytes());
        assert_eq!(cell.end_offset(), 40);
        context(cells, true).stats_raw(REPORTED.replace("40", "41").as_bytes());
        assert_eq!(
            cell.end_offset(),
            40,
            "the tailing consumer's figures are stale for it"
        );
    }

    #[test]
    fn a_partition_unlisted_in_two_reports_in_a_row_is_gone() {
        let cells = Arc::new(WatermarkCells::default());
        let cell = cells.register("t", 0);
        let ctx = context(cells, true);
        let unlisted =
            REPORTED.replace("\"desired\": true", "\"desired\": true, \"unknown\": true");
        ctx.stats_raw(unlisted.as_bytes());
        assert!(!cell.gone(), "one report may precede the topic's metadata");
        ctx.stats_raw(REPORTED.as_bytes());
        ctx.stats_raw(unlisted.as_bytes());
        assert!(!cell.gone(), "the reports must come in a row");
        ctx.stats_raw(unlisted.as_bytes());
        assert!(cell.gone());
        ctx.stats_raw(REPORTED.as_bytes());
        assert!(!cell.gone(), "listed again");

        ctx.stats_raw(unlisted.as_bytes());
        ctx.stats_raw(unlisted.as_bytes());
        cell.set(0, 40);
        assert!(!cell.gone(), "the broker answered for it at open");
        ctx.stats_raw(unlisted.as_bytes());
        ctx.stats_raw(unlisted.as_bytes());
        cell.set_catching_up(true);
        assert!(!cell.gone(), "the other consumer has said nothing yet");
        ctx.stats_raw(unlisted.as_bytes());
        ctx.stats_raw(unlisted.as_bytes());
        assert!(!cell.gone(), "only the consumer fetching it counts");
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
