//! Shared test fixtures: Kafka-protocol brokers on loopback (librdkafka's mock cluster in-process,
//! and a real Apache Kafka broker in `kafka`), a producer that keeps the model of what each store
//! must hold, and small helpers.
#![allow(dead_code)]

pub mod background;
pub mod kafka;
pub mod proxy;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext, Producer};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use warmstore::config::{Config, HttpConfig, RestoreConfig, StoreConfig};
use warmstore::observe::status::PartitionState;
use warmstore::service::Service;
use warmstore::store::format::decode_i64;
use warmstore::store::{open_read_only, StorePaths};
use warmstore::testkit::Rng;

pub type State = BTreeMap<Vec<u8>, Vec<u8>>;
/// One produced record: key and value, either of which may be null.
pub type Record = (Option<Vec<u8>>, Option<Vec<u8>>);

pub struct Broker {
    /// `None` when the broker is the real one (`kafka::kafka()`).
    mock: Option<MockCluster<'static, DefaultProducerContext>>,
    pub bootstrap: String,
    producer: BaseProducer,
    /// Every record produced per (topic, partition), in offset order: (key, value).
    pub log: BTreeMap<(String, i32), Vec<Record>>,
}

impl Broker {
    pub fn new() -> Broker {
        Broker::with_producer(&[])
    }

    /// A broker whose test producer has extra librdkafka properties (compression, say).
    pub fn with_producer(properties: &[(&str, &str)]) -> Broker {
        let mock = MockCluster::new(1).expect("mock cluster starts");
        let bootstrap = mock.bootstrap_servers();
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &bootstrap)
            .set("linger.ms", "5")
            .set("message.max.bytes", "10000000");
        for (key, value) in properties {
            config.set(*key, *value);
        }
        let producer = config.create().expect("producer");
        Broker {
            mock: Some(mock),
            bootstrap,
            producer,
            log: BTreeMap::new(),
        }
    }

    /// The real broker of this test binary, produced to over its plaintext listener with extra
    /// producer properties (compression, say).
    pub fn real(properties: &[(&str, &str)]) -> Broker {
        let bootstrap = kafka::kafka().plaintext.clone();
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &bootstrap)
            .set("linger.ms", "5")
            .set("enable.idempotence", "true");
        for (key, value) in properties {
            config.set(*key, *value);
        }
        Broker {
            mock: None,
            bootstrap,
            producer: config.create().expect("producer"),
            log: BTreeMap::new(),
        }
    }

    /// The mock cluster, for tests that inject faults.
    pub fn mock(&self) -> &MockCluster<'static, DefaultProducerContext> {
        self.mock.as_ref().expect("a mock cluster broker")
    }

    pub fn create_topic(&self, topic: &str, partitions: i32) {
        match &self.mock {
            Some(mock) => mock
                .create_topic(topic, partitions, 1)
                .expect("topic created"),
            None => kafka::kafka().create_topic(topic, partitions, &[]),
        }
    }

    /// Gives a topic of the real broker more partitions, `partitions` in all. The test producer
    /// reads the topic's metadata again: librdkafka's cache would refuse the new partitions.
    pub fn add_partitions(&self, topic: &str, partitions: i32) {
        kafka::kafka().add_partitions(topic, partitions);
        self.producer
            .client()
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .expect("the topic's metadata");
    }

    /// Produces one record and waits for it, so offsets follow the order of calls.
    pub fn send(&mut self, topic: &str, partition: i32, key: Option<&[u8]>, value: Option<&[u8]>) {
        self.send_at(topic, partition, key, value, None)
    }

    /// `send` with the record's timestamp set (milliseconds), or the producer's clock for `None`.
    pub fn send_at(
        &mut self,
        topic: &str,
        partition: i32,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        timestamp: Option<i64>,
    ) {
        let mut record = BaseRecord::<[u8], [u8]>::to(topic).partition(partition);
        if let Some(timestamp) = timestamp {
            record = record.timestamp(timestamp);
        }
        if let Some(k) = key {
            record = record.key(k);
        }
        if let Some(v) = value {
            record = record.payload(v);
        }
        loop {
            match self.producer.send(record) {
                Ok(()) => break,
                Err((
                    rdkafka::error::KafkaError::MessageProduction(
                        rdkafka::types::RDKafkaErrorCode::QueueFull,
                    ),
                    r,
                )) => {
                    record = r;
                    self.producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => panic!("cannot produce to {topic}: {e}"),
            }
        }
        self.log
            .entry((topic.to_string(), partition))
            .or_default()
            .push((key.map(<[u8]>::to_vec), value.map(<[u8]>::to_vec)));
    }

    pub fn flush(&self) {
        self.producer.flush(Duration::from_secs(30)).expect("flush");
    }

    /// `count` records per partition over a small key space: overwrites and ~10% tombstones.
    pub fn produce_changelog(&mut self, topic: &str, partitions: i32, count: usize, seed: u64) {
        let mut rng = Rng::new(seed);
        for p in 0..partitions {
            for _ in 0..count {
                let key = format!("k{:05}", rng.below(count as u64 / 3 + 1)).into_bytes();
                if rng.below(10) == 0 {
                    self.send(topic, p, Some(&key), None);
                } else {
                    let value = format!("v{}-{}", seed, rng.next_u64()).into_bytes();
                    self.send(topic, p, Some(&key), Some(&value));
                }
            }
        }
        self.flush();
    }

    /// The store the first `count` records of a partition make.
    pub fn model_of_first(&self, topic: &str, partition: i32, count: usize) -> State {
        fold(self.records(topic, partition).take(count))
    }

    /// The store a changelog partition must produce from offset `from` on: last write wins,
    /// tombstones delete, null keys are skipped.
    pub fn model(&self, topic: &str, partition: i32, from: usize) -> State {
        fold(self.records(topic, partition).skip(from))
    }

    fn records(&self, topic: &str, partition: i32) -> impl Iterator<Item = &Record> {
        self.log
            .get(&(topic.to_string(), partition))
            .into_iter()
            .flatten()
    }

    pub fn produced(&self, topic: &str, partition: i32) -> usize {
        self.log
            .get(&(topic.to_string(), partition))
            .map_or(0, Vec::len)
    }

    /// (log-start, high watermark) as the broker reports them.
    pub fn watermarks(&self, topic: &str, partition: i32) -> (i64, i64) {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("group.id", "test")
            .create()
            .unwrap();
        consumer
            .fetch_watermarks(topic, partition, Duration::from_secs(10))
            .unwrap()
    }
}

/// The store a sequence of records makes: last write wins, tombstones delete, null keys are
/// skipped.
pub fn fold<'a>(records: impl Iterator<Item = &'a Record>) -> State {
    let mut state = State::new();
    for (key, value) in records {
        let Some(key) = key else { continue };
        match value {
            Some(v) => state.insert(key.clone(), v.clone()),
            None => state.remove(key),
        };
    }
    state
}

/// A config file for `warmstore run` against the broker.
pub fn write_config(
    dir: &Path,
    bootstrap: &str,
    listen: &str,
    stores: &str,
    restore: &str,
) -> PathBuf {
    let path = dir.join("warmstore.yaml");
    let text = format!(
        "kafka:\n  bootstrap.servers: {bootstrap}\nstate_dir: {}\nhttp:\n  listen: {listen}\nrestore:\n  commit_interval: 200ms\n{restore}stores:\n{stores}",
        dir.join("state").display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// The store's contents and applied offset, read the way any RocksDB reader would.
pub fn read_store(
    state_dir: &Path,
    store: &str,
    topic: &str,
    partition: i32,
) -> (Option<i64>, State) {
    let dir = StorePaths::new(state_dir, store, partition).db;
    let db = open_read_only(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let offsets = db.cf_handle("offsets").unwrap();
    let applied = db
        .get_cf(offsets, format!("{topic}-{partition}"))
        .unwrap()
        .and_then(|v| decode_i64(&v));
    let data = db
        .iterator(rocksdb::IteratorMode::Start)
        .map(|i| {
            let (k, v) = i.unwrap();
            (k.to_vec(), v.to_vec())
        })
        .collect();
    (applied, data)
}

/// A timestamped store as any RocksDB reader sees it: the applied offset of `topic`-`partition`,
/// the status, and the entries of `keyValueWithTimestamp` (timestamps included).
pub struct TimestampedStore {
    pub applied: Option<i64>,
    pub status: Option<i64>,
    pub data: State,
}

pub fn read_timestamped_store(dir: &Path, topic: &str, partition: i32) -> TimestampedStore {
    let db = open_read_only(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let offsets = db.cf_handle("offsets").unwrap();
    let read = |key: &[u8]| {
        db.get_cf(offsets, key)
            .unwrap()
            .and_then(|v| decode_i64(&v))
    };
    let family = db.cf_handle("keyValueWithTimestamp").unwrap();
    let data = db
        .iterator_cf(family, rocksdb::IteratorMode::Start)
        .map(|item| {
            let (k, v) = item.unwrap();
            (k.to_vec(), v.to_vec())
        })
        .collect();
    TimestampedStore {
        applied: read(format!("{topic}-{partition}").as_bytes()),
        status: read(b"status"),
        data,
    }
}

/// The `compression=` settings of a store's newest OPTIONS file, one per column family: the codec
/// RocksDB writes that family's table files with.
pub fn table_compression(db: &Path) -> Vec<String> {
    let newest = std::fs::read_dir(db)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with("OPTIONS-"))
        .max_by_key(|name| name[8..].parse::<u64>().unwrap_or(0))
        .expect("an OPTIONS file");
    std::fs::read_to_string(db.join(newest))
        .unwrap()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("compression="))
        .map(str::to_string)
        .collect()
}

pub fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let waited = poll_until(timeout, || done().then_some(()));
    assert!(waited.is_some(), "timed out waiting for {what}");
}

/// Polls `get` every 50 ms until it gives a value; `None` once `timeout` has passed without one.
pub fn poll_until<T>(timeout: Duration, mut get: impl FnMut() -> Option<T>) -> Option<T> {
    let until = Instant::now() + timeout;
    loop {
        if let Some(value) = get() {
            return Some(value);
        }
        if Instant::now() >= until {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A free loopback port (bound, then released).
pub fn free_port() -> u16 {
    free_ports::<1>()[0]
}

/// `N` distinct free loopback ports. Each is held until all are found: one released before the
/// next is asked for can come back again, and a broker given one port for two listeners refuses
/// to start (it happened).
pub fn free_ports<const N: usize>() -> [u16; N] {
    let held = [(); N].map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    held.map(|listener| listener.local_addr().unwrap().port())
}

/// Minimal HTTP/1.0 GET: (status, body). Errors become status 0 so callers can poll.
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    let Ok(mut stream) = std::net::TcpStream::connect(addr) else {
        return (0, String::new());
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    if write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").is_err() {
        return (0, String::new());
    }
    let mut response = String::new();
    if stream.read_to_string(&mut response).is_err() {
        return (0, String::new());
    }
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// A real Prometheus server (Debian's `prometheus` package) scraping one target every second,
/// stopped when dropped.
pub struct Prometheus {
    child: std::process::Child,
    pub addr: String,
}

impl Prometheus {
    pub fn start(dir: &Path, target: &str) -> Prometheus {
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: warmstore\n    static_configs:\n      - targets: ['{target}']\n        labels:\n          namespace: test\n          pod: warmstore-0\n"
            ),
        )
        .unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let child = std::process::Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("prometheus-data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
            .spawn()
            .expect("prometheus is installed (Debian package prometheus; .ci/run installs it)");
        let prometheus = Prometheus { child, addr };
        wait_until("Prometheus to start", Duration::from_secs(60), || {
            http_get(&prometheus.addr, "/-/ready").0 == 200
        });
        prometheus
    }

    /// Runs an instant query; the JSON answer.
    pub fn query(&self, promql: &str) -> serde_json::Value {
        let (status, body) = http_get(
            &self.addr,
            &format!("/api/v1/query?query={}", percent_encode(promql)),
        );
        serde_json::from_str(&body)
            .unwrap_or_else(|_| panic!("query {promql}: HTTP {status}: {body}"))
    }

    /// The single value of a query that returns one sample, if any.
    pub fn query_scalar(&self, promql: &str) -> Option<f64> {
        let answer = self.query(promql);
        let value = &answer["data"]["result"][0]["value"][1];
        value.as_str()?.parse().ok()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

pub fn store(name: &str, topic: &str, partitions: Option<Vec<i32>>) -> StoreConfig {
    StoreConfig::new(name, topic, partitions)
}

/// A service config for in-process tests: any free port, quick commits, ready only at lag 0.
pub fn service_config(
    bootstrap: &str,
    state_dir: &Path,
    stores: Vec<StoreConfig>,
    kafka: &[(&str, &str)],
) -> Config {
    let mut properties: BTreeMap<String, String> =
        [("bootstrap.servers".to_string(), bootstrap.to_string())].into();
    properties.extend(kafka.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    Config {
        kafka: properties,
        state_dir: state_dir.to_path_buf(),
        http: HttpConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
        },
        restore: RestoreConfig {
            commit_interval: Duration::from_millis(200),
            ready_max_lag: 0,
            ..Default::default()
        },
        rocksdb: Default::default(),
        assignment: Default::default(),
        stores,
    }
}

pub fn all_caught_up(service: &Service, count: usize) -> bool {
    let p = service.board.partitions();
    p.len() == count
        && p.iter()
            .all(|p| p.state() == PartitionState::CaughtUp && p.lag() == Some(0))
}

pub fn wait_caught_up(service: &Service, count: usize) {
    wait_until("catch-up", Duration::from_secs(60), || {
        all_caught_up(service, count)
    });
}
