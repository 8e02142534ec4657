//! Crash safety of the commit protocol: a child process commits a seeded workload continuously and
//! is SIGKILLed at random moments. After each kill the store must hold exactly the model state at
//! its stored offset. Two broken writers run through the same loop as negative controls, so a pass
//! here means something.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use warmstore::store::dirty::{UncleanPolicy, WipeReason};
use warmstore::store::format::{decode_i64, TopicPartition};
use warmstore::store::layout::TIMESTAMPED_CF;
use warmstore::store::{open_read_only, OpenOutcome, Store, StoreOptions, StorePaths};
use warmstore::testkit::{apply, Rng, Workload};

#[derive(Debug, Default)]
struct Figures {
    kills: usize,
    divergences: usize,
    advanced: usize,
    empty: usize,
    last_offset: Option<i64>,
}

/// The store as found after a kill: its offset for our partition, and the data family's contents.
/// A timestamped store's values lose their timestamp, which must be the offset of a commit at or
/// before the stored one.
fn read_store(dir: &Path) -> (Option<i64>, BTreeMap<Vec<u8>, Vec<u8>>) {
    let db = match open_read_only(dir) {
        Ok(db) => db,
        Err(e) if !dir.join("CURRENT").exists() => {
            let _ = e;
            return (None, BTreeMap::new());
        }
        Err(e) => panic!("store unreadable after a kill: {e}"),
    };
    let offsets = db.cf_handle("offsets").unwrap();
    let key = TopicPartition::new("crash-changelog", 0).offset_key();
    let applied = db
        .get_cf(offsets, key)
        .unwrap()
        .map(|v| decode_i64(&v).expect("8-byte offset"));
    let timestamped = db.cf_handle(TIMESTAMPED_CF);
    let family = timestamped.unwrap_or_else(|| db.cf_handle("default").unwrap());
    let data = db
        .iterator_cf(family, rocksdb::IteratorMode::Start)
        .map(|item| {
            let (k, v) = item.unwrap();
            if timestamped.is_none() {
                return (k.to_vec(), v.to_vec());
            }
            let stamp = i64::from_be_bytes(v[..8].try_into().unwrap());
            assert!(
                Some(stamp) <= applied,
                "a value stamped {stamp} beyond the stored offset {applied:?}"
            );
            (k.to_vec(), v[8..].to_vec())
        })
        .collect();
    (applied, data)
}

/// Recomputes the model incrementally: offsets usually move forward between kills.
struct Model {
    work: Workload,
    at: Option<i64>,
    state: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl Model {
    fn at(&mut self, applied: Option<i64>) -> &BTreeMap<Vec<u8>, Vec<u8>> {
        if applied < self.at {
            self.at = None;
            self.state.clear();
        }
        let from = self.at.map_or(0, |a| a + 1);
        for offset in from..=applied.unwrap_or(-1) {
            apply(&mut self.state, self.work.ops(offset));
        }
        self.at = applied;
        &self.state
    }
}

/// Starts the helper on `state` with `args` (seed, mode, wal) and waits until it says it has begun.
fn start_writer(state: &Path, args: [&str; 3], begun: &str) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_warmstore-crash-writer"))
        .arg(state)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("writer starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with(begun), "writer failed to start: {line:?}");
    child
}

/// Runs `kills` rounds of start, wait a random while, SIGKILL, verify. Broken modes start each round
/// from an empty store so every round is an independent observation.
fn kill_loop(mode: &str, wal: bool, kills: usize, seed: u64) -> Figures {
    let state = tempfile::tempdir().unwrap();
    let db_dir = if mode == "kafka-streams" {
        state.path().join("crash-app/0_0/rocksdb/crash")
    } else {
        StorePaths::new(state.path(), "crash", 0).db
    };
    let mut model = Model {
        work: Workload::crash(seed),
        at: None,
        state: BTreeMap::new(),
    };
    let through_the_store = mode == "protocol" || mode == "kafka-streams";
    let mut rng = Rng::new(seed);
    let mut figures = Figures::default();
    for _ in 0..kills {
        if !through_the_store {
            let _ = std::fs::remove_dir_all(&db_dir);
        }
        let wal = if wal { "wal" } else { "no-wal" };
        let mut child = start_writer(state.path(), [&seed.to_string(), mode, wal], "writing from");
        std::thread::sleep(Duration::from_millis(50 + rng.below(400)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        figures.kills += 1;

        let (applied, data) = read_store(&db_dir);
        if applied.is_none() {
            figures.empty += 1;
        }
        if applied > figures.last_offset {
            figures.advanced += 1;
        }
        if through_the_store {
            assert!(
                applied >= figures.last_offset,
                "stored offset went backwards"
            );
            figures.last_offset = applied;
        }
        if &data != model.at(applied) {
            figures.divergences += 1;
        }
    }
    println!("{mode} wal={wal}: {figures:?}");
    figures
}

#[test]
fn protocol_survives_sigkill_with_wal_off() {
    let f = kill_loop("protocol", false, 20, 11);
    assert_eq!(f.divergences, 0, "{f:?}");
    assert!(
        f.advanced >= 10,
        "the stored offset must really advance between kills: {f:?}"
    );
}

#[test]
fn protocol_survives_sigkill_with_wal_on() {
    let f = kill_loop("protocol", true, 20, 12);
    assert_eq!(f.divergences, 0, "{f:?}");
    assert!(
        f.advanced >= 10,
        "the stored offset must really advance between kills: {f:?}"
    );
}

/// The same protocol into a timestamped store in the Kafka Streams layout, where the data lives in
/// `keyValueWithTimestamp`: one more column family in every atomic flush.
#[test]
fn protocol_survives_sigkill_in_the_kafka_streams_layout() {
    let f = kill_loop("kafka-streams", false, 20, 15);
    assert_eq!(f.divergences, 0, "{f:?}");
    assert!(
        f.advanced >= 10,
        "the stored offset must really advance between kills: {f:?}"
    );
}

#[test]
fn negative_control_without_atomic_flush_diverges() {
    let f = kill_loop("no-atomic-flush", false, 10, 13);
    assert!(
        f.divergences >= 5,
        "the crash check must see a broken writer: {f:?}"
    );
}

#[test]
fn negative_control_offset_before_data_diverges() {
    let f = kill_loop("offset-first", false, 10, 14);
    assert!(
        f.divergences >= 5,
        "the crash check must see a broken writer: {f:?}"
    );
}

/// A kill while RocksDB creates a store (a pod evicted during its first restore) leaves a
/// directory without `CURRENT`, or with `CURRENT` and only the `default` family. Nothing was ever
/// committed in it, and the files are not damaged: the next open must say `interrupted_rebuild`,
/// not `corruption` or `format_mismatch`, which send an operator to check the volume.
#[test]
fn a_kill_while_a_store_is_created_is_an_interrupted_rebuild() {
    let mut rng = Rng::new(16);
    let mut cut_short = 0;
    let mut kills = 0;
    while kills < 30 && (kills < 10 || cut_short == 0) {
        let state = tempfile::tempdir().unwrap();
        let mut child = start_writer(state.path(), ["0", "create", "no-wal"], "creating");
        std::thread::sleep(Duration::from_millis(20 + rng.below(200)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        kills += 1;

        // Each partition leaves its directory, lock and perhaps marker, all named after it.
        let touched = std::fs::read_dir(state.path().join("crash")).map_or(0, |entries| {
            entries
                .filter_map(|e| {
                    e.ok()?
                        .file_name()
                        .to_str()?
                        .split('.')
                        .next()?
                        .parse()
                        .ok()
                })
                .map(|p: i32| p + 1)
                .max()
                .unwrap_or(0)
        });
        for partition in 0..touched {
            let paths = StorePaths::new(state.path(), "crash", partition);
            let tp = TopicPartition::new("crash-changelog", partition);
            let options = StoreOptions::default();
            let (store, outcome) =
                Store::open(paths, tp, &options, UncleanPolicy::Resume, None).unwrap();
            match outcome {
                OpenOutcome::Empty => {}
                OpenOutcome::Wiped {
                    reason: WipeReason::InterruptedRebuild,
                    detail,
                } => {
                    // Or the kill came while the marker itself was written.
                    assert!(
                        detail.contains("creating the store")
                            || detail.contains("as it wrote the marker"),
                        "{detail}"
                    );
                    cut_short += 1;
                }
                other => panic!("store {partition} after a kill during creation: {other:?}"),
            }
            assert_eq!(store.applied(), None);
        }
    }
    println!("{kills} kills, {cut_short} stores cut short while created");
    assert!(
        cut_short >= 1,
        "no kill landed while a store was created, so this test saw nothing"
    );
}
