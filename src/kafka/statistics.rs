//! librdkafka's statistics and errors, routed: end and log-start offsets to each partition's
//! `Watermarks` (so end offsets are refreshed without a request per partition), broker states and
//! errors to the status board.

use rdkafka::consumer::ConsumerContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{ClientContext, Statistics};
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicI64};
use std::sync::{Arc, RwLock};

use super::consumers::Role;
use crate::observe::status::Board;

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
    pub(super) board: Arc<Board>,
    pub(super) watermarks: Arc<WatermarkCells>,
    /// Under read_committed the end offset a partition catches up to is the last stable offset.
    pub(super) read_committed: bool,
    pub(super) role: Role,
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
