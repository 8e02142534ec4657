//! `warmstore demo`: the real service on an embedded broker (librdkafka's mock cluster), so a
//! newcomer sees a restore, the endpoints and the stores without any Kafka.

use indicatif::{ProgressBar, ProgressStyle};
use rdkafka::config::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use warmstore::config::{Config, HttpConfig, RestoreConfig, StoreConfig};
use warmstore::observe::status::PartitionState;
use warmstore::service::{shutdown_signal, Service};
use warmstore::store::{open_read_only, StorePaths};
use warmstore::testkit::Rng;

pub const TOPIC: &str = "demo-changelog";
pub const STORE: &str = "demo";
/// The mock broker keeps only about 5 MiB per partition; stay well inside it.
pub const MAX_BYTES_PER_PARTITION: u64 = 4 << 20;
const KEY_LEN: u64 = 16;
/// Per-record overhead inside a Kafka record batch, roughly.
const RECORD_OVERHEAD: u64 = 24;

#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Records in the generated changelog, overwrites and tombstones included.
    #[arg(long, default_value_t = 500_000)]
    pub records: u64,
    /// Partitions of the changelog, each restored into a store of its own.
    #[arg(long, default_value_t = 32)]
    pub partitions: i32,
    /// Bytes in each record's value.
    #[arg(long, default_value_t = 100)]
    pub value_size: usize,
    /// Where the stores go (default: a new directory under the system temp dir).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Keep tailing and serving HTTP until Ctrl-C.
    #[arg(long)]
    pub keep_running: bool,
    /// Where /metrics, /readyz, /livez and /stores answer.
    #[arg(long, default_value = "127.0.0.1:9464")]
    pub listen: SocketAddr,
}

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// Sizes the embedded broker cannot hold: a usage error.
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Failed(String),
}

#[derive(Debug)]
pub struct Summary {
    pub records: u64,
    pub keys: u64,
    pub seconds: f64,
    pub state_dir: PathBuf,
}

/// Refuses sizes the mock broker would silently truncate by dropping old batches.
pub fn check_sizes(args: &DemoArgs) -> Result<(), String> {
    if args.partitions < 1 || args.partitions > 1024 {
        return Err(format!(
            "--partitions must be between 1 and 1024, not {}",
            args.partitions
        ));
    }
    if args.records == 0 {
        return Err("--records must be at least 1".into());
    }
    if args.value_size > 512 << 10 {
        return Err(format!(
            "--value-size {} is too large; the demo allows up to 512 KiB",
            args.value_size
        ));
    }
    let per_partition = args.records.div_ceil(args.partitions as u64);
    let bytes = per_partition * (KEY_LEN + args.value_size as u64 + RECORD_OVERHEAD);
    if bytes > MAX_BYTES_PER_PARTITION {
        let fits = MAX_BYTES_PER_PARTITION / (KEY_LEN + args.value_size as u64 + RECORD_OVERHEAD)
            * args.partitions as u64;
        return Err(format!(
            "{} records of {} bytes over {} partitions need about {} KiB per partition, but the embedded \
             broker keeps only about 5 MiB per partition and would drop the oldest records. Use at most \
             {fits} records, more --partitions, or a smaller --value-size.",
            args.records,
            args.value_size,
            args.partitions,
            bytes >> 10
        ));
    }
    Ok(())
}

/// What the changelog leaves in each partition's store: last write wins, tombstones delete.
type Model = Vec<HashMap<Vec<u8>, Vec<u8>>>;

/// Overwrites over a key space of half the record count, and about 5% tombstones.
fn produce(bootstrap: &str, args: &DemoArgs) -> Result<Model, String> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .map_err(|e| format!("cannot create the demo producer: {e}"))?;
    let mut model: Model = vec![HashMap::new(); args.partitions as usize];
    let mut rng = Rng::new(42);
    let key_space = (args.records / 2).max(1);
    let mut value = vec![0u8; args.value_size];
    for _ in 0..args.records {
        let k = rng.below(key_space);
        let key = format!("key-{k:012}").into_bytes();
        let partition = (k % args.partitions as u64) as i32;
        let tombstone = rng.below(100) < 5;
        for b in value.iter_mut() {
            *b = b'a' + rng.below(26) as u8;
        }
        let mut record = BaseRecord::<[u8], [u8]>::to(TOPIC)
            .partition(partition)
            .key(&key[..]);
        if !tombstone {
            record = record.payload(&value[..]);
        }
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((e, returned)) => {
                    if !matches!(
                        e,
                        rdkafka::error::KafkaError::MessageProduction(
                            rdkafka::types::RDKafkaErrorCode::QueueFull
                        )
                    ) {
                        return Err(format!("cannot produce the demo changelog: {e}"));
                    }
                    record = returned;
                    producer.poll(Duration::from_millis(10));
                }
            }
        }
        let slot = &mut model[partition as usize];
        if tombstone {
            slot.remove(&key);
        } else {
            slot.insert(key, value.clone());
        }
    }
    producer
        .flush(Duration::from_secs(60))
        .map_err(|e| format!("cannot flush the demo changelog: {e}"))?;
    Ok(model)
}

fn demo_config(bootstrap: String, state_dir: &Path, listen: SocketAddr) -> Config {
    Config {
        kafka: [("bootstrap.servers".to_string(), bootstrap)].into(),
        state_dir: state_dir.to_path_buf(),
        http: HttpConfig { listen },
        restore: RestoreConfig::default(),
        rocksdb: Default::default(),
        assignment: Default::default(),
        stores: vec![StoreConfig::new(STORE, TOPIC, None)],
    }
}

/// Every store equals the model exactly.
fn verify(state_dir: &Path, model: &Model) -> Result<u64, String> {
    let mut keys = 0;
    for (partition, expected) in model.iter().enumerate() {
        let dir = StorePaths::new(state_dir, STORE, partition as i32).db;
        let db = open_read_only(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut found = 0;
        for item in db.iterator(rocksdb::IteratorMode::Start) {
            let (k, v) = item.map_err(|e| e.to_string())?;
            if expected.get(&*k).map(Vec::as_slice) != Some(&*v) {
                return Err(format!(
                    "partition {partition}: key {} differs from the changelog",
                    String::from_utf8_lossy(&k)
                ));
            }
            found += 1;
        }
        if found != expected.len() {
            return Err(format!(
                "partition {partition}: {found} keys in the store, {} in the changelog",
                expected.len()
            ));
        }
        keys += found as u64;
    }
    Ok(keys)
}

pub async fn run(args: DemoArgs) -> Result<Summary, DemoError> {
    check_sizes(&args).map_err(DemoError::Refused)?;
    let failed = |e: String| DemoError::Failed(e);
    let mock = MockCluster::new(1)
        .map_err(|e| failed(format!("cannot start the embedded broker: {e}")))?;
    mock.create_topic(TOPIC, args.partitions, 1)
        .map_err(|e| failed(format!("cannot create {TOPIC}: {e}")))?;
    let bootstrap = mock.bootstrap_servers();
    eprintln!(
        "embedded broker at {bootstrap}; producing {} records into {} partitions of {TOPIC} ...",
        args.records, args.partitions
    );
    let model = produce(&bootstrap, &args).map_err(failed)?;

    let state_dir = args.state_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("warmstore-demo-{}", std::process::id()))
    });
    let config = demo_config(bootstrap, &state_dir, args.listen);
    let started = Instant::now();
    let service = Service::start(&config)
        .await
        .map_err(|e| failed(e.to_string()))?;
    eprintln!(
        "serving http://{}/metrics, /readyz, /livez and /stores",
        service.http_addr
    );

    let bar = ProgressBar::new(args.records);
    if let Ok(style) = ProgressStyle::with_template(
        "restoring {bar:40} {pos}/{len} records ({per_sec}, eta {eta})",
    ) {
        bar.set_style(style);
    }
    loop {
        let partitions = service.board.partitions();
        let done: u64 = partitions
            .iter()
            .map(|p| p.records.load(Relaxed) + p.null_keys.load(Relaxed))
            .sum();
        bar.set_position(done.min(args.records));
        let all_caught_up = partitions.len() == args.partitions as usize
            && partitions
                .iter()
                .all(|p| p.state() == PartitionState::CaughtUp && p.lag() == Some(0));
        if all_caught_up {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bar.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    let records: u64 = service
        .board
        .partitions()
        .iter()
        .map(|p| p.records.load(Relaxed))
        .sum();

    if args.keep_running {
        eprintln!("caught up; tailing as a warm standby until Ctrl-C");
        shutdown_signal().await;
    }
    service.stop().await;
    let keys =
        verify(&state_dir, &model).map_err(|e| failed(format!("store check failed: {e}")))?;
    drop(mock);
    Ok(Summary {
        records,
        keys,
        seconds,
        state_dir,
    })
}

impl Summary {
    pub fn print(&self) {
        println!("records restored: {}", self.records);
        println!(
            "keys in stores:   {} (checked against the changelog)",
            self.keys
        );
        println!("seconds:          {:.2}", self.seconds);
        println!(
            "records/s:        {:.0}",
            self.records as f64 / self.seconds.max(1e-9)
        );
        println!(
            "stores:           {}/{STORE}/<partition>  (try: warmstore inspect {}/{STORE}/0)",
            self.state_dir.display(),
            self.state_dir.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(records: u64, partitions: i32, value_size: usize) -> DemoArgs {
        DemoArgs {
            records,
            partitions,
            value_size,
            state_dir: None,
            keep_running: false,
            listen: "127.0.0.1:0".parse().unwrap(),
        }
    }

    #[test]
    fn sizes_the_mock_cannot_hold_are_refused() {
        assert!(check_sizes(&args(500_000, 32, 100)).is_ok());
        let e = check_sizes(&args(5_000_000, 32, 100)).unwrap_err();
        assert!(e.contains("5 MiB per partition"), "{e}");
        assert!(check_sizes(&args(10, 0, 100)).is_err());
        assert!(check_sizes(&args(0, 1, 100)).is_err());
    }
}
