//! A Kafka-protocol broker in its own process, for benchmarks and reliability runs: librdkafka's
//! mock cluster with one changelog topic, filled with a seeded changelog (16-byte keys over a key
//! space of half the record count, fixed-size values, a share of tombstones).
//!
//! With `--broker HOST:PORT` it fills the same changelog into a topic of an existing Kafka broker
//! instead, for partitions larger than the mock cluster keeps (about 5 MiB each). The topic and any
//! created with `create` are deleted first if they exist, and again on exit.
//!
//! usage: mock_broker [--topic T] [--partitions P] [--records N] [--value-size B] [--tombstones PCT]
//!                    [--compression CODEC] [--broker HOST:PORT]
//!
//! Prints `bootstrap=HOST:PORT`, then `ready` once the records are in. Then reads commands from
//! stdin, answering `ok` or `error: ...`: `produce N` (N more records of the same changelog),
//! `create TOPIC PARTITIONS`, `down`, `up`, `rtt MS` (mock cluster only), `watermarks` (prints
//! `P LOW HIGH` per partition). Exits on EOF.

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::io::{BufRead, Write};
use std::time::Duration;
use warmstore::testkit::Rng;

struct Changelog {
    topic: String,
    partitions: i32,
    key_space: u64,
    value: Vec<u8>,
    tombstones: u64,
    rng: Rng,
}

impl Changelog {
    fn produce(&mut self, producer: &BaseProducer, count: u64) -> Result<(), String> {
        for _ in 0..count {
            let k = self.rng.below(self.key_space);
            let key = format!("key-{k:012}");
            let partition = (k % self.partitions as u64) as i32;
            let tombstone = self.rng.below(100) < self.tombstones;
            let stamp = self.rng.next_u64().to_le_bytes();
            let n = stamp.len().min(self.value.len());
            self.value[..n].copy_from_slice(&stamp[..n]);
            let mut record = BaseRecord::<[u8], [u8]>::to(&self.topic)
                .partition(partition)
                .key(key.as_bytes());
            if !tombstone {
                record = record.payload(&self.value[..]);
            }
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((e, r)) => {
                        if !matches!(
                            e,
                            rdkafka::error::KafkaError::MessageProduction(
                                rdkafka::types::RDKafkaErrorCode::QueueFull
                            )
                        ) {
                            return Err(e.to_string());
                        }
                        record = r;
                        producer.poll(Duration::from_millis(5));
                    }
                }
            }
        }
        producer
            .flush(Duration::from_secs(120))
            .map_err(|e| e.to_string())
    }
}

/// Where the changelog lives: the mock cluster, or topics of an existing broker.
enum Cluster {
    Mock(MockCluster<'static, rdkafka::producer::DefaultProducerContext>),
    Real {
        admin: AdminClient<DefaultClientContext>,
        runtime: tokio::runtime::Runtime,
        /// Topics this process made, deleted again on exit.
        topics: Vec<String>,
    },
}

impl Cluster {
    fn real(bootstrap: &str) -> Result<Cluster, String> {
        let admin = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .create()
            .map_err(|e| e.to_string())?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Cluster::Real {
            admin,
            runtime,
            topics: Vec::new(),
        })
    }

    fn create_topic(&mut self, topic: &str, partitions: i32) -> Result<(), String> {
        match self {
            Cluster::Mock(mock) => mock
                .create_topic(topic, partitions, 1)
                .map_err(|e| e.to_string()),
            Cluster::Real {
                admin,
                runtime,
                topics,
            } => {
                let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
                // A topic left by an earlier run would mix its records into this one's.
                let _ = runtime.block_on(admin.delete_topics(&[topic], &options));
                let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
                // Deletion is asynchronous in the broker: creating may fail until it finishes.
                let until = std::time::Instant::now() + Duration::from_secs(60);
                loop {
                    let results = runtime
                        .block_on(admin.create_topics([&new], &options))
                        .map_err(|e| e.to_string())?;
                    match results.into_iter().next() {
                        Some(Ok(_)) => break,
                        Some(Err((_, code))) if std::time::Instant::now() < until => {
                            eprintln!("creating {topic}: {code}; retrying");
                            std::thread::sleep(Duration::from_millis(500));
                        }
                        Some(Err((_, code))) => return Err(format!("creating {topic}: {code}")),
                        None => return Err(format!("creating {topic}: no answer")),
                    }
                }
                topics.push(topic.to_string());
                Ok(())
            }
        }
    }

    fn mock(
        &self,
    ) -> Result<&MockCluster<'static, rdkafka::producer::DefaultProducerContext>, String> {
        match self {
            Cluster::Mock(mock) => Ok(mock),
            Cluster::Real { .. } => Err("only the mock cluster takes this command".to_string()),
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Cluster::Real {
            admin,
            runtime,
            topics,
        } = self
        {
            let names: Vec<&str> = topics.iter().map(String::as_str).collect();
            let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
            let _ = runtime.block_on(admin.delete_topics(&names, &options));
        }
    }
}

fn arg(args: &[String], name: &str, default: &str) -> String {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| default.to_string())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let number = |name: &str, default: &str| -> u64 {
        arg(&args, name, default).parse().unwrap_or_else(|_| {
            eprintln!("{name} must be a number");
            std::process::exit(2)
        })
    };
    let partitions = number("--partitions", "64") as i32;
    let records = number("--records", "2000000");
    let mut changelog = Changelog {
        topic: arg(&args, "--topic", "bench-changelog"),
        partitions,
        key_space: (records / 2).max(1),
        value: vec![b'v'; number("--value-size", "100") as usize],
        tombstones: number("--tombstones", "5"),
        rng: Rng::new(number("--seed", "1")),
    };
    let (mut cluster, bootstrap) = match args.iter().position(|a| a == "--broker") {
        Some(_) => {
            let bootstrap = arg(&args, "--broker", "");
            let cluster = Cluster::real(&bootstrap).unwrap_or_else(|e| {
                eprintln!("error: {e}");
                std::process::exit(1)
            });
            (cluster, bootstrap)
        }
        None => {
            let mock = MockCluster::new(1).expect("mock cluster");
            let bootstrap = mock.bootstrap_servers();
            (Cluster::Mock(mock), bootstrap)
        }
    };
    if let Err(e) = cluster.create_topic(&changelog.topic, partitions) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
    println!("bootstrap={bootstrap}");
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .set("queue.buffering.max.messages", "1000000")
        .set("compression.type", arg(&args, "--compression", "none"))
        .create()
        .expect("producer");
    if let Err(e) = changelog.produce(&producer, records) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
    println!("ready");
    let _ = std::io::stdout().flush();

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "mock-broker")
        .create()
        .expect("consumer");
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        let result = match words.as_slice() {
            ["produce", n] => n
                .parse()
                .map_err(|_| "produce N".to_string())
                .and_then(|n| changelog.produce(&producer, n)),
            // The mock cluster answers CreateTopics requests with a timeout, so clients that need
            // a topic of their own (the Quix peer) have it created here.
            ["create", topic, n] => n
                .parse()
                .map_err(|_| "create TOPIC PARTITIONS".to_string())
                .and_then(|n| cluster.create_topic(topic, n)),
            ["down"] => cluster
                .mock()
                .and_then(|mock| mock.broker_down(1).map_err(|e| e.to_string())),
            ["up"] => cluster
                .mock()
                .and_then(|mock| mock.broker_up(1).map_err(|e| e.to_string())),
            ["rtt", ms] => ms.parse().map_err(|_| "rtt MS".to_string()).and_then(|ms| {
                cluster.mock().and_then(|mock| {
                    mock.broker_round_trip_time(1, Duration::from_millis(ms))
                        .map_err(|e| e.to_string())
                })
            }),
            ["watermarks"] => {
                for p in 0..partitions {
                    match consumer.fetch_watermarks(&changelog.topic, p, Duration::from_secs(10)) {
                        Ok((low, high)) => println!("{p} {low} {high}"),
                        Err(e) => println!("{p} error {e}"),
                    }
                }
                Ok(())
            }
            _ => Err(format!("unknown command: {line}")),
        };
        match result {
            Ok(()) => println!("ok"),
            Err(e) => println!("error: {e}"),
        }
        let _ = std::io::stdout().flush();
    }
}
