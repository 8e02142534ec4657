//! Test helper for the crash tests: commits a seeded workload into a store forever, until it is
//! killed. `protocol` goes through warmstore's store; the two broken variants exist only as negative
//! controls, proving the crash test can see the divergence they cause.
//!
//! `kafka-streams` is `protocol` into a timestamped store in the Kafka Streams layout
//! (`<STATE_DIR>/crash-app/0_0/rocksdb/crash`), each value stamped with the offset of its commit.
//!
//! `create` opens new stores `crash/0`, `crash/1`, ... one after another through `Store::open`, so a
//! kill lands while RocksDB creates one.
//!
//! usage: warmstore-crash-writer STATE_DIR SEED protocol|kafka-streams|create|no-atomic-flush|offset-first wal|no-wal

use rocksdb::{BlockBasedOptions, ColumnFamilyDescriptor, Options, WriteBatch, WriteOptions, DB};
use std::io::Write;
use std::path::Path;
use warmstore::store::dirty::UncleanPolicy;
use warmstore::store::format::{decode_i64, encode_i64, TopicPartition, OFFSETS_CF};
use warmstore::store::{Layout, RocksDbOverrides, Store, StoreOptions, StorePaths, StoreType};
use warmstore::testkit::Workload;
use warmstore::units::ByteSize;

/// Small memtables so background flushes happen many times between kills.
const WRITE_BUFFER: u64 = 64 << 10;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 5 {
        eprintln!("usage: warmstore-crash-writer STATE_DIR SEED protocol|kafka-streams|create|no-atomic-flush|offset-first wal|no-wal");
        std::process::exit(2);
    }
    let state_dir = Path::new(&args[1]);
    let Ok(seed) = args[2].parse::<u64>() else {
        eprintln!("SEED must be an integer");
        std::process::exit(2);
    };
    let wal = args[4] == "wal";
    let paths = StorePaths::new(state_dir, "crash", 0);
    let tp = TopicPartition::new("crash-changelog", 0);
    let result = match args[3].as_str() {
        "protocol" => protocol(paths, tp, seed, wal),
        "kafka-streams" => {
            let layout = Layout::KafkaStreams {
                application_id: "crash-app".into(),
                subtopology: 0,
                kind: StoreType::TimestampedKeyValue,
            };
            protocol(
                StorePaths::for_layout(state_dir, &layout, "crash", 0),
                tp,
                seed,
                wal,
            )
        }
        "create" => create(state_dir),
        "no-atomic-flush" => broken(&paths.db, &tp, seed, wal, false),
        "offset-first" => broken(&paths.db, &tp, seed, wal, true),
        other => Err(format!("unknown mode {other}")),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn announce(next: i64) {
    println!("writing from {next}");
    let _ = std::io::stdout().flush();
}

fn protocol(paths: StorePaths, tp: TopicPartition, seed: u64, wal: bool) -> Result<(), String> {
    let options = StoreOptions {
        rocksdb: RocksDbOverrides {
            write_buffer_size: Some(ByteSize(WRITE_BUFFER)),
            ..Default::default()
        },
        wal,
        ..Default::default()
    };
    let (mut store, _) =
        Store::open(paths, tp, &options, UncleanPolicy::Resume, None).map_err(|e| e.to_string())?;
    let work = Workload::crash(seed);
    let mut next = store.applied().map_or(0, |a| a + 1);
    announce(next);
    loop {
        for (key, value) in work.ops(next) {
            match value {
                Some(value) => store.put(&key, &value, next),
                None => store.delete(&key),
            }
            .map_err(|e| e.to_string())?;
        }
        store.commit(next).map_err(|e| e.to_string())?;
        next += 1;
    }
}

/// New stores, never committed to, until killed.
fn create(state_dir: &Path) -> Result<(), String> {
    println!("creating stores");
    let _ = std::io::stdout().flush();
    for partition in 0.. {
        let paths = StorePaths::new(state_dir, "crash", partition);
        let tp = TopicPartition::new("crash-changelog", partition);
        Store::open(
            paths,
            tp,
            &StoreOptions::default(),
            UncleanPolicy::Resume,
            None,
        )
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// `offset_first`: the offset in its own write, then each record on its own (a store without an
/// uncommitted buffer). Otherwise one batch per commit, but with atomic flush off.
fn broken(
    dir: &Path,
    tp: &TopicPartition,
    seed: u64,
    wal: bool,
    offset_first: bool,
) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let cf_options = || {
        let mut o = Options::default();
        let mut table = BlockBasedOptions::default();
        table.set_format_version(6);
        o.set_block_based_table_factory(&table);
        o.set_write_buffer_size(WRITE_BUFFER as usize);
        o
    };
    let mut db_options = cf_options();
    db_options.create_if_missing(true);
    db_options.create_missing_column_families(true);
    db_options.set_atomic_flush(offset_first);
    let families = ["default", OFFSETS_CF].map(|n| ColumnFamilyDescriptor::new(n, cf_options()));
    let db = DB::open_cf_descriptors(&db_options, dir, families).map_err(|e| e.to_string())?;
    let offsets = db.cf_handle(OFFSETS_CF).ok_or("no offsets cf")?;
    let key = tp.offset_key();
    let stored = db.get_cf(offsets, &key).map_err(|e| e.to_string())?;
    let mut write_options = WriteOptions::default();
    write_options.disable_wal(!wal);
    let work = Workload::crash(seed);
    let mut next = stored.and_then(|v| decode_i64(&v)).map_or(0, |a| a + 1);
    announce(next);
    loop {
        let ops = work.ops(next);
        if offset_first {
            let mut batch = WriteBatch::default();
            batch.put_cf(offsets, &key, encode_i64(next));
            db.write_opt(batch, &write_options)
                .map_err(|e| e.to_string())?;
            for (k, v) in ops {
                let mut batch = WriteBatch::default();
                match v {
                    Some(v) => batch.put(&k, &v),
                    None => batch.delete(&k),
                }
                db.write_opt(batch, &write_options)
                    .map_err(|e| e.to_string())?;
            }
        } else {
            let mut batch = WriteBatch::default();
            for (k, v) in ops {
                match v {
                    Some(v) => batch.put(&k, &v),
                    None => batch.delete(&k),
                }
            }
            batch.put_cf(offsets, &key, encode_i64(next));
            db.write_opt(batch, &write_options)
                .map_err(|e| e.to_string())?;
        }
        next += 1;
    }
}
