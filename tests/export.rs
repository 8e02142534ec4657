//! `warmstore export` beside a running `warmstore run` that tails a changelog a producer keeps
//! writing: every copy is internally consistent (its data equals the model at its own stored
//! offset), closed cleanly, and opens read-only; and the copies follow the live store.

mod common;

use common::{free_port, http_get, wait_until, write_config, Broker};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use warmstore::store::format::decode_i64;
use warmstore::store::open_read_only;
use warmstore::testkit::Rng;

const TOPIC: &str = "app-counts-changelog";
const PARTITIONS: i32 = 2;

type State = BTreeMap<Vec<u8>, Vec<u8>>;
type Log = Vec<Vec<(Vec<u8>, Option<Vec<u8>>)>>;

/// Kills `warmstore run` if a failing test unwinds past it.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Produces bursts until stopped; returns what it wrote per partition, in offset order.
fn producer(bootstrap: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Log> {
    std::thread::spawn(move || {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("linger.ms", "5")
            .create()
            .unwrap();
        let mut rng = Rng::new(21);
        let mut log: Log = vec![Vec::new(); PARTITIONS as usize];
        while !stop.load(Relaxed) {
            for _ in 0..20 {
                for p in 0..PARTITIONS {
                    let key = format!("k{:04}", rng.below(500)).into_bytes();
                    let value =
                        (rng.below(10) > 0).then(|| format!("v{}", rng.next_u64()).into_bytes());
                    let mut record = BaseRecord::<[u8], [u8]>::to(TOPIC)
                        .partition(p)
                        .key(&key[..]);
                    if let Some(v) = &value {
                        record = record.payload(&v[..]);
                    }
                    if producer.send(record).is_ok() {
                        log[p as usize].push((key, value));
                    }
                }
            }
            producer.poll(Duration::from_millis(20));
        }
        producer.flush(Duration::from_secs(30)).unwrap();
        log
    })
}

/// One exported store partition: applied offset, status, and its data with timestamps stripped.
struct Copy {
    applied: Option<i64>,
    status: Option<i64>,
    data: State,
}

fn read_copy(state_dir: &Path, partition: i32) -> Copy {
    let dir = state_dir.join(format!("app/0_{partition}/rocksdb/counts"));
    let db = open_read_only(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
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
            (k.to_vec(), v[8..].to_vec())
        })
        .collect();
    Copy {
        applied: read(format!("{TOPIC}-{partition}").as_bytes()),
        status: read(b"status"),
        data,
    }
}

fn model(records: &[(Vec<u8>, Option<Vec<u8>>)]) -> State {
    let mut state = State::new();
    for (k, v) in records {
        match v {
            Some(v) => state.insert(k.clone(), v.clone()),
            None => state.remove(k),
        };
    }
    state
}

#[test]
fn exports_beside_a_running_service_are_consistent_copies() {
    let broker = Broker::new();
    broker.create_topic(TOPIC, PARTITIONS);
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let stores = "  - name: counts\n    layout: kafka-streams\n    application_id: app\n    type: timestamped_key_value\n";
    // Frequent flushes, so the copies, which see the store as of its last flush, move on.
    let config = write_config(
        dir.path(),
        &broker.bootstrap,
        &addr,
        stores,
        "  ready_max_lag: 1000000\n  flush_interval: 200ms\n",
    );
    let stop = Arc::new(AtomicBool::new(false));
    let writer = producer(broker.bootstrap.clone(), stop.clone());
    let log_file = dir.path().join("warmstore.log");
    let service = Running(
        Command::new(env!("CARGO_BIN_EXE_warmstore"))
            .args(["run", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_file).unwrap())
            .spawn()
            .unwrap(),
    );
    wait_until("the service is ready", Duration::from_secs(60), || {
        http_get(&addr, "/readyz").0 == 200
    });
    // A commit must have been flushed before there is anything to copy.
    std::thread::sleep(Duration::from_millis(500));

    let mut copies = Vec::new();
    for round in 0..10 {
        std::thread::sleep(Duration::from_millis(300));
        // Three targets in turn: later exports replace an earlier copy in place.
        let target = dir.path().join(format!("export-{}", round % 3));
        let out = Command::new(env!("CARGO_BIN_EXE_warmstore"))
            .args(["export", "--config"])
            .arg(&config)
            .arg("--to")
            .arg(&target)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "export {round}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let partitions: Vec<Copy> = (0..PARTITIONS).map(|p| read_copy(&target, p)).collect();
        for (p, copy) in partitions.iter().enumerate() {
            assert_eq!(
                printed[p]["applied_offset"].as_i64(),
                copy.applied,
                "export {round} prints the offset its copy holds"
            );
        }
        copies.push(partitions);
    }
    stop.store(true, Relaxed);
    let log = writer.join().unwrap();
    drop(service);

    let mut moved = 0;
    for (round, partitions) in copies.iter().enumerate() {
        for (p, copy) in partitions.iter().enumerate() {
            let applied = copy.applied.expect("a copy holds an offset") as usize;
            assert_eq!(
                copy.status,
                Some(0),
                "export {round} partition {p} is closed cleanly"
            );
            assert_eq!(
                copy.data,
                model(&log[p][..=applied]),
                "export {round} partition {p}: the data must be the model at its own offset {applied}"
            );
            if round > 0 && copy.applied > copies[round - 1][p].applied {
                moved += 1;
            }
        }
    }
    let produced: usize = log.iter().map(Vec::len).sum();
    println!("10 exports while {produced} records were produced; the copy moved on {moved} times");
    assert!(moved >= 5, "the copies must follow the live store: {moved}");
}

/// Kafka Streams holds `<state.dir>/<application.id>/.lock` while it runs: an export into that
/// state directory is refused, naming the holder, and writes nothing.
#[test]
fn an_export_into_a_running_application_is_refused() {
    use warmstore::store::dirty::UncleanPolicy;
    use warmstore::store::{Layout, Store, StoreOptions, StorePaths, StoreType, TopicPartition};
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::KafkaStreams {
        application_id: "app".into(),
        subtopology: 0,
        kind: StoreType::TimestampedKeyValue,
    };
    let source = dir.path().join("state");
    let paths = StorePaths::for_layout(&source, &layout, "counts", 0);
    let tp = TopicPartition::new(TOPIC, 0);
    let (mut store, _) = Store::open(
        paths,
        tp,
        &StoreOptions::default(),
        UncleanPolicy::Resume,
        None,
    )
    .unwrap();
    store.put(b"k", b"v", 5).unwrap();
    store.commit(0).unwrap();
    store.close(None).unwrap();
    let config = write_config(
        dir.path(),
        "127.0.0.1:1",
        "127.0.0.1:0",
        "  - name: counts\n    layout: kafka-streams\n    application_id: app\n    type: timestamped_key_value\n",
        "",
    );
    let target = dir.path().join("application");
    std::fs::create_dir_all(target.join("app")).unwrap();
    let lock_file = target.join("app/.lock");
    std::fs::write(&lock_file, b"").unwrap();
    let mut holder = Command::new("python3")
        .args([
            "-c",
            "import fcntl, sys\n\
             f = open(sys.argv[1], 'r+')\n\
             fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n\
             print('locked', flush=True)\n\
             sys.stdin.read()",
        ])
        .arg(&lock_file)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "locked");
    let export = || {
        Command::new(env!("CARGO_BIN_EXE_warmstore"))
            .args(["export", "--config"])
            .arg(&config)
            .arg("--to")
            .arg(&target)
            .output()
            .unwrap()
    };
    let refused = export();
    drop(holder.stdin.take());
    holder.wait().unwrap();
    let message = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{message}");
    assert!(
        message.contains(&format!("pid {}", holder.id())),
        "{message}"
    );
    assert!(!target.join("app/0_0").exists(), "nothing written");
    // Once the application is gone, the same export goes through.
    let out = export();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let copy = read_copy(&target, 0);
    assert_eq!((copy.applied, copy.status), (Some(0), Some(0)));
    assert_eq!(copy.data, State::from([(b"k".to_vec(), b"v".to_vec())]));
}
