//! Kafka Streams itself judges the kafka-streams layout. A small application
//! (`tests/kafka-streams/WarmApp.java`, Kafka Streams 4.3 from Maven Central) materialises a
//! timestamped key-value store and a plain one from the real broker's changelogs. `warmstore
//! restore` warms its state directory first; the application must then restore only the records
//! produced after that, and its interactive queries must return the model.

mod common;

use common::kafka::{kafka, maven_classpath};
use common::{fold, Broker, Record, State};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use warmstore::store::format::decode_i64;
use warmstore::store::open_read_only;
use warmstore::testkit::Rng;

const PARTITIONS: i32 = 2;
const TS_STORE: &str = "ts-store";
const KV_STORE: &str = "kv-store";
const FIRST_TIMESTAMP: i64 = 1_700_000_000_000;

/// One application: its input topic, the changelogs of its two stores, and every record produced
/// to them with its timestamp.
struct App {
    id: String,
    input: String,
    broker: Broker,
    /// Timestamp of each produced record, per (topic, partition), in offset order.
    timestamps: BTreeMap<(String, i32), Vec<i64>>,
    next_timestamp: i64,
}

impl App {
    fn new(id: &str) -> App {
        let broker = Broker::real(&[]);
        let input = format!("{id}-input");
        kafka().create_topic(&input, PARTITIONS, &[]);
        let app = App {
            id: id.to_string(),
            input,
            broker,
            timestamps: BTreeMap::new(),
            next_timestamp: FIRST_TIMESTAMP,
        };
        for store in [TS_STORE, KV_STORE] {
            kafka().create_topic(
                &app.changelog(store),
                PARTITIONS,
                &[("cleanup.policy", "compact")],
            );
        }
        app
    }

    fn changelog(&self, store: &str) -> String {
        format!("{}-{store}-changelog", self.id)
    }

    /// `count` records per partition of each changelog, as Kafka Streams would log them: string
    /// keys and values, about one in ten a tombstone, every record with its own timestamp.
    fn produce(&mut self, count: usize, seed: u64) {
        let mut rng = Rng::new(seed);
        for store in [TS_STORE, KV_STORE] {
            let topic = self.changelog(store);
            for partition in 0..PARTITIONS {
                for _ in 0..count {
                    // A key lives in one partition, as in a real changelog.
                    let key = format!("p{partition}-k{:04}", rng.below(count as u64 / 2 + 1));
                    let value = format!("v{seed}-{}", rng.below(1_000_000));
                    let value = (rng.below(10) != 0).then_some(value.as_bytes());
                    let timestamp = self.next_timestamp;
                    self.next_timestamp += 1;
                    self.broker.send_at(
                        &topic,
                        partition,
                        Some(key.as_bytes()),
                        value,
                        Some(timestamp),
                    );
                    self.timestamps
                        .entry((topic.clone(), partition))
                        .or_default()
                        .push(timestamp);
                }
            }
        }
        self.broker.flush();
    }

    fn records(&self, store: &str, partition: i32) -> &[Record] {
        self.broker
            .log
            .get(&(self.changelog(store), partition))
            .map_or(&[], Vec::as_slice)
    }

    fn model(&self, store: &str, partition: i32) -> State {
        fold(self.records(store, partition).iter())
    }

    /// The model with each value as a timestamped store holds it: the timestamp of the record
    /// that wrote it, 8 bytes big-endian, then the value.
    fn timestamped_model(&self, store: &str, partition: i32) -> State {
        let timestamps = &self.timestamps[&(self.changelog(store), partition)];
        let mut state = State::new();
        for ((key, value), timestamp) in self.records(store, partition).iter().zip(timestamps) {
            let key = key.clone().expect("every test record has a key");
            match value {
                Some(v) => state.insert(key, [&timestamp.to_be_bytes()[..], v].concat()),
                None => state.remove(&key),
            };
        }
        state
    }

    fn produced(&self, store: &str) -> usize {
        (0..PARTITIONS).map(|p| self.records(store, p).len()).sum()
    }

    /// Records produced so far to each store's changelog: (ts-store, kv-store).
    fn produced_per_store(&self) -> [usize; 2] {
        [self.produced(TS_STORE), self.produced(KV_STORE)]
    }

    fn config(&self, dir: &Path) -> PathBuf {
        let stores: String = [(TS_STORE, "timestamped_key_value"), (KV_STORE, "key_value")]
            .iter()
            .map(|(name, kind)| {
                format!(
                    "  - name: {name}\n    layout: kafka-streams\n    application_id: {}\n    type: {kind}\n",
                    self.id
                )
            })
            .collect();
        let path = dir.join("warmstore.yaml");
        let text = format!(
            "kafka:\n  bootstrap.servers: {}\nstate_dir: {}\nhttp:\n  listen: 127.0.0.1:0\nrestore:\n  commit_interval: 200ms\n  ready_max_lag: 0\nstores:\n{stores}",
            self.broker.bootstrap,
            dir.join("state").display()
        );
        std::fs::write(&path, text).unwrap();
        path
    }
}

/// Runs `warmstore restore` and returns its log (stderr); it must exit 0.
fn warmstore_restore(config: &Path) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_warmstore"))
        .args(["restore", "--timeout", "120s", "--config"])
        .arg(config)
        .output()
        .expect("warmstore runs");
    let log = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "warmstore restore failed:\n{log}");
    log
}

/// What the application printed.
#[derive(Debug, Default)]
struct AppRun {
    restored: BTreeMap<String, u64>,
    running_ms: u64,
    /// `ts-store` through interactive queries: key -> (value, timestamp).
    timestamped: BTreeMap<String, (String, i64)>,
    plain: BTreeMap<String, String>,
}

impl AppRun {
    /// The application restored exactly the records produced after `before`, and no more: a
    /// store it had to rebuild would have restored its whole changelog.
    fn assert_restored_only_since(&self, app: &App, before: [usize; 2]) {
        let now = app.produced_per_store();
        assert_eq!(self.restored[TS_STORE], (now[0] - before[0]) as u64);
        assert_eq!(self.restored[KV_STORE], (now[1] - before[1]) as u64);
    }
}

/// Starts the application on `state_dir`, waits for it to print and close, and parses its output.
fn run_app(app: &App, state_dir: &Path, guarantee: &str) -> AppRun {
    run_app_on(KAFKA_STREAMS, app, state_dir, guarantee)
}

/// The Kafka Streams version of the pom, and the last one that reads offsets from `.checkpoint`.
const KAFKA_STREAMS: &str = "4.3.2";
const KAFKA_STREAMS_LEGACY: &str = "4.2.2";

/// `run_app` on another Kafka Streams version.
fn run_app_on(version: &str, app: &App, state_dir: &Path, guarantee: &str) -> AppRun {
    let classpath = maven_classpath(
        "tests/kafka-streams/pom.xml",
        &format!("kafka-streams-{version}"),
        &[("kafka.streams.version", version)],
    );
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/kafka-streams/WarmApp.java");
    let log = state_dir.with_extension("app.log");
    // A file, not a pipe: the application prints every entry of its stores, which would fill a
    // pipe read only after it exits.
    let printed = state_dir.with_extension("app.out");
    let mut child = Command::new("java")
        .arg("-cp")
        .arg(&classpath)
        .arg(&source)
        .args([&app.broker.bootstrap, &state_dir.display().to_string()])
        .args([&app.id, guarantee, &app.input])
        .stdout(std::fs::File::create(&printed).unwrap())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("java runs (./x test installs a JDK)");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(240) {
            let _ = child.kill();
            panic!(
                "the Kafka Streams application did not finish:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = std::fs::read_to_string(&printed).unwrap();
    assert!(
        status.success(),
        "the Kafka Streams application failed ({status}):\n{stdout}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let mut run = AppRun::default();
    for line in stdout.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        match fields.as_slice() {
            ["restored", store, n] => {
                run.restored.insert(store.to_string(), n.parse().unwrap());
            }
            ["running_ms", ms] => run.running_ms = ms.parse().unwrap(),
            [TS_STORE, key, value, timestamp] => {
                let entry = (value.to_string(), timestamp.parse().unwrap());
                run.timestamped.insert(key.to_string(), entry);
            }
            [KV_STORE, key, value] => {
                run.plain.insert(key.to_string(), value.to_string());
            }
            _ => panic!("unexpected line from the application: {line}"),
        }
    }
    run
}

/// One store partition as any RocksDB reader sees it: its column families, the contents of each
/// one but `offsets`, the applied offset and the status.
struct OnDisk {
    families: Vec<String>,
    data: BTreeMap<String, State>,
    applied: Option<i64>,
    status: Option<i64>,
}

fn on_disk(state_dir: &Path, app: &App, store: &str, partition: i32) -> OnDisk {
    let dir = state_dir
        .join(&app.id)
        .join(format!("0_{partition}"))
        .join("rocksdb")
        .join(store);
    let mut families = rocksdb::DB::list_cf(&rocksdb::Options::default(), &dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    families.sort();
    let db = open_read_only(&dir).unwrap();
    let mut data = BTreeMap::new();
    for family in families.iter().filter(|f| *f != "offsets") {
        let handle = db.cf_handle(family).unwrap();
        let contents: State = db
            .iterator_cf(handle, rocksdb::IteratorMode::Start)
            .map(|item| {
                let (k, v) = item.unwrap();
                (k.to_vec(), v.to_vec())
            })
            .collect();
        data.insert(family.clone(), contents);
    }
    let offsets = db.cf_handle("offsets").unwrap();
    let read = |key: &[u8]| {
        db.get_cf(offsets, key)
            .unwrap()
            .and_then(|v| decode_i64(&v))
    };
    OnDisk {
        families,
        applied: read(format!("{}-{partition}", app.changelog(store)).as_bytes()),
        status: read(b"status"),
        data,
    }
}

/// Each partition of both stores holds exactly the model, in Kafka Streams' column families, with
/// the offset of the last record and status 0 (closed cleanly).
fn assert_stores_match(state_dir: &Path, app: &App) {
    for partition in 0..PARTITIONS {
        let ts = on_disk(state_dir, app, TS_STORE, partition);
        assert_eq!(ts.families, ["default", "keyValueWithTimestamp", "offsets"]);
        assert!(
            ts.data["default"].is_empty(),
            "a timestamped store's default family stays empty"
        );
        assert_eq!(
            ts.data["keyValueWithTimestamp"],
            app.timestamped_model(TS_STORE, partition),
            "{TS_STORE} partition {partition}"
        );
        let kv = on_disk(state_dir, app, KV_STORE, partition);
        assert_eq!(kv.families, ["default", "offsets"]);
        assert_eq!(
            kv.data["default"],
            app.model(KV_STORE, partition),
            "{KV_STORE} partition {partition}"
        );
        for (store, disk) in [(TS_STORE, &ts), (KV_STORE, &kv)] {
            let last = app.records(store, partition).len() as i64 - 1;
            assert_eq!(
                disk.applied,
                Some(last),
                "{store} {partition}: the last applied offset"
            );
            assert_eq!(disk.status, Some(0), "{store} {partition}: closed cleanly");
        }
    }
}

/// What an independent reader, rocksdict (RocksDB's Python binding from PyPI), sees in one store
/// partition: its column families and each family's entries.
fn read_with_python(dir: &Path) -> (Vec<String>, BTreeMap<String, State>) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/read_store.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(dir)
        .output()
        .expect("python3 runs (./x test puts rocksdict in target/test-venv)");
    assert!(
        out.status.success(),
        "rocksdict cannot read {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let families = json["families"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_string())
        .collect();
    let hex = |v: &serde_json::Value| -> Vec<u8> {
        let text = v.as_str().unwrap();
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
            .collect()
    };
    let data = json["data"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(family, entries)| {
            let entries = entries
                .as_array()
                .unwrap()
                .iter()
                .map(|pair| (hex(&pair[0]), hex(&pair[1])))
                .collect();
            (family.clone(), entries)
        })
        .collect();
    (families, data)
}

/// rocksdict lists exactly Kafka Streams' column families and reads the model, the offsets and
/// the status, as warmstore's own reader does.
fn assert_python_reads_the_model(state_dir: &Path, app: &App) {
    for partition in 0..PARTITIONS {
        for (store, families, data_family, model) in [
            (
                TS_STORE,
                vec!["default", "keyValueWithTimestamp", "offsets"],
                "keyValueWithTimestamp",
                app.timestamped_model(TS_STORE, partition),
            ),
            (
                KV_STORE,
                vec!["default", "offsets"],
                "default",
                app.model(KV_STORE, partition),
            ),
        ] {
            let dir = state_dir
                .join(&app.id)
                .join(format!("0_{partition}"))
                .join("rocksdb")
                .join(store);
            let (found, data) = read_with_python(&dir);
            assert_eq!(found, families, "{}", dir.display());
            assert_eq!(
                data[data_family], model,
                "{store} {partition} read by rocksdict"
            );
            let last = app.records(store, partition).len() as i64 - 1;
            let offsets = State::from([
                (
                    format!("{}-{partition}", app.changelog(store)).into_bytes(),
                    last.to_be_bytes().to_vec(),
                ),
                (b"status".to_vec(), 0i64.to_be_bytes().to_vec()),
            ]);
            assert_eq!(
                data["offsets"], offsets,
                "{store} {partition} offsets read by rocksdict"
            );
        }
    }
}

/// The union of every partition's model, as the application's queries print it.
fn queried_model(app: &App, store: &str) -> BTreeMap<String, String> {
    let text = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
    (0..PARTITIONS)
        .flat_map(|p| app.model(store, p))
        .map(|(k, v)| (text(&k), text(&v)))
        .collect()
}

fn warm_then_open(guarantee: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut app = App::new(&format!("warm-{}", guarantee.replace('_', "-")));
    // Records per partition of each changelog before the warm-up; WARMSTORE_KS_RECORDS sizes a
    // measurement of warm against cold starts (the figures this test prints).
    let records = std::env::var("WARMSTORE_KS_RECORDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(400);
    app.produce(records, 1);
    let config = app.config(dir.path());
    let state_dir = dir.path().join("state");

    warmstore_restore(&config);
    assert_stores_match(&state_dir, &app);
    assert_python_reads_the_model(&state_dir, &app);
    let task_dir = state_dir.join(&app.id).join("0_0");
    let mut in_task: Vec<String> = std::fs::read_dir(&task_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    in_task.sort();
    assert_eq!(
        in_task,
        ["rocksdb"],
        "warmstore writes nothing else into a task directory"
    );
    assert!(!state_dir
        .join(&app.id)
        .join("kafka-streams-process-metadata")
        .exists());

    // Records the application has not seen: a warm start restores only these.
    let warmed = app.produced_per_store();
    app.produce(50, 2);
    let run = run_app(&app, &state_dir, guarantee);
    run.assert_restored_only_since(&app, warmed);
    let expected: BTreeMap<String, (String, i64)> = (0..PARTITIONS)
        .flat_map(|p| app.timestamped_model(TS_STORE, p))
        .map(|(k, v)| {
            let timestamp = i64::from_be_bytes(v[..8].try_into().unwrap());
            let value = String::from_utf8(v[8..].to_vec()).unwrap();
            (String::from_utf8(k).unwrap(), (value, timestamp))
        })
        .collect();
    assert_eq!(
        run.timestamped, expected,
        "{TS_STORE} through interactive queries"
    );
    assert_eq!(
        run.plain,
        queried_model(&app, KV_STORE),
        "{KV_STORE} through interactive queries"
    );

    // The reverse: what the application wrote and closed, warmstore resumes without a wipe.
    app.produce(30, 3);
    let log = warmstore_restore(&config);
    assert!(!log.contains("wiping store"), "no wipe expected:\n{log}");
    assert_stores_match(&state_dir, &app);

    // The same application on an empty state directory restores every record: the count above
    // is the listener's, not a constant.
    let cold_dir = dir.path().join("cold");
    let cold = run_app(&app, &cold_dir, guarantee);
    assert_eq!(cold.restored[TS_STORE], app.produced(TS_STORE) as u64);
    assert_eq!(cold.restored[KV_STORE], app.produced(KV_STORE) as u64);
    assert_eq!(cold.plain, queried_model(&app, KV_STORE));
    eprintln!(
        "{guarantee}: warm start restored {} records and was RUNNING after {} ms; cold start restored {} records, RUNNING after {} ms",
        run.restored.values().sum::<u64>(),
        run.running_ms,
        cold.restored.values().sum::<u64>(),
        cold.running_ms
    );
}

#[test]
fn kafka_streams_opens_what_warmstore_warmed() {
    warm_then_open("at_least_once");
}

#[test]
fn kafka_streams_opens_it_under_exactly_once_without_a_wipe() {
    warm_then_open("exactly_once_v2");
}

/// An export for Kafka Streams 4.2, which has no `offsets` column family: the copy drops it, and
/// the task's `.checkpoint` carries the offsets, byte for byte as Kafka Streams writes it. Kafka
/// Streams 4.2 then starts on it and restores only the newer records.
#[test]
fn an_export_for_4_2_opens_from_its_checkpoint_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = App::new("export-legacy");
    app.produce(300, 1);
    let config = app.config(dir.path());
    warmstore_restore(&config);
    let legacy = dir.path().join("legacy");
    let out = Command::new(env!("CARGO_BIN_EXE_warmstore"))
        .args(["export", "--kafka-streams-version", "4.2", "--to"])
        .arg(&legacy)
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let exported: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(exported.as_array().unwrap().len(), 2 * PARTITIONS as usize);
    for partition in 0..PARTITIONS {
        let task = legacy.join(&app.id).join(format!("0_{partition}"));
        let last = |store: &str| app.records(store, partition).len() - 1;
        let expected = format!(
            "0\n2\n{} {partition} {}\n{} {partition} {}\n",
            app.changelog(KV_STORE),
            last(KV_STORE),
            app.changelog(TS_STORE),
            last(TS_STORE)
        );
        assert_eq!(
            std::fs::read_to_string(task.join(".checkpoint")).unwrap(),
            expected
        );
        for (store, families) in [
            (TS_STORE, vec!["default", "keyValueWithTimestamp"]),
            (KV_STORE, vec!["default"]),
        ] {
            let db = task.join("rocksdb").join(store);
            let mut found = rocksdb::DB::list_cf(&rocksdb::Options::default(), &db).unwrap();
            found.sort();
            assert_eq!(found, families, "{}", db.display());
        }
    }
    let warmed = app.produced_per_store();
    app.produce(40, 2);
    let run = run_app_on(KAFKA_STREAMS_LEGACY, &app, &legacy, "at_least_once");
    run.assert_restored_only_since(&app, warmed);
    assert_eq!(run.plain, queried_model(&app, KV_STORE));
}
