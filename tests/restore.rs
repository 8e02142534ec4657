//! The restore engine end to end, in-process, against the mock cluster over loopback TCP and real
//! RocksDB stores.

mod common;

use common::{read_store, runtime, service_config, store, wait_caught_up, wait_until, Broker};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use warmstore::config::Config;
use warmstore::observe::status::PartitionState;
use warmstore::service::Service;
use warmstore::store::dirty::WipeReason;
use warmstore::units::ByteSize;

/// Runs the service until caught up, then stops it cleanly; returns records read per partition.
fn restore_once(
    rt: &tokio::runtime::Runtime,
    config: &Config,
    partitions: usize,
) -> Vec<(i32, u64, u64)> {
    rt.block_on(async {
        let service = Service::start(config).await.expect("service starts");
        let s = &service;
        tokio::task::block_in_place(|| wait_caught_up(s, partitions));
        let figures = service
            .board
            .partitions()
            .iter()
            .map(|p| {
                (
                    p.partition,
                    p.records.load(Relaxed),
                    p.wipes(WipeReason::OffsetOutOfRange),
                )
            })
            .collect();
        service.stop().await;
        figures
    })
}

#[test]
fn end_to_end_stores_equal_the_changelog() {
    let mut broker = Broker::new();
    broker.create_topic("e2e", 4);
    broker.produce_changelog("e2e", 4, 1500, 1);
    let dir = tempfile::tempdir().unwrap();
    let config = service_config(
        &broker.bootstrap,
        dir.path(),
        vec![store("counts", "e2e", None)],
        &[],
    );
    let figures = restore_once(&runtime(), &config, 4);
    for (partition, records, _) in figures {
        assert_eq!(
            records, 1500,
            "partition {partition} read every record once"
        );
    }
    for p in 0..4 {
        let (applied, data) = read_store(dir.path(), "counts", "e2e", p);
        assert_eq!(applied, Some(1499), "applied offset is the last offset");
        assert_eq!(data, broker.model("e2e", p, 0), "partition {p}");
        assert!(!data.is_empty());
    }
}

#[test]
fn resume_reads_only_new_records() {
    let mut broker = Broker::new();
    broker.create_topic("resume", 2);
    broker.produce_changelog("resume", 2, 1000, 2);
    let dir = tempfile::tempdir().unwrap();
    let config = service_config(
        &broker.bootstrap,
        dir.path(),
        vec![store("s", "resume", Some(vec![0, 1]))],
        &[],
    );
    let rt = runtime();
    restore_once(&rt, &config, 2);
    broker.produce_changelog("resume", 2, 300, 3);
    let figures = restore_once(&rt, &config, 2);
    for (partition, records, _) in figures {
        assert_eq!(
            records, 300,
            "partition {partition} read only the new records"
        );
    }
    for p in 0..2 {
        let (applied, data) = read_store(dir.path(), "s", "resume", p);
        assert_eq!(applied, Some(1299));
        assert_eq!(data, broker.model("resume", p, 0));
    }
}

/// Stores written with compressed tables, as a Kafka Streams `RocksDBConfigSetter` or a tool with
/// Snappy as its default would write them, open and resume: no wipe, only the new records read.
#[test]
fn stores_compressed_by_another_program_open_and_resume() {
    use warmstore::store::{Compression, StorePaths};
    for (codec, name) in [
        (Compression::Snappy, "kSnappyCompression"),
        (Compression::Lz4, "kLZ4Compression"),
        (Compression::Zstd, "kZSTD"),
    ] {
        let mut broker = Broker::new();
        broker.create_topic("packed", 1);
        broker.produce_changelog("packed", 1, 2000, 4);
        let dir = tempfile::tempdir().unwrap();
        let mut config = service_config(
            &broker.bootstrap,
            dir.path(),
            vec![store("s", "packed", None)],
            &[],
        );
        config.rocksdb.compression = Some(codec);
        let rt = runtime();
        restore_once(&rt, &config, 1);
        let db = StorePaths::new(dir.path(), "s", 0).db;
        assert_eq!(common::table_compression(&db), [name, name], "{codec:?}");
        let tables = std::fs::read_dir(&db)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension() == Some("sst".as_ref()))
            .count();
        assert!(tables > 0, "{codec:?}: the catch-up flushed table files");

        broker.produce_changelog("packed", 1, 300, 5);
        config.rocksdb.compression = None;
        let figures = restore_once(&rt, &config, 1);
        assert_eq!(figures, [(0, 300, 0)], "{codec:?}: resumed, not rebuilt");
        let (applied, data) = read_store(dir.path(), "s", "packed", 0);
        assert_eq!(applied, Some(2299));
        assert_eq!(data, broker.model("packed", 0, 0), "{codec:?}");
    }
}

#[test]
fn null_keys_are_skipped_and_counted_and_empty_values_kept() {
    let mut broker = Broker::new();
    broker.create_topic("nulls", 1);
    broker.send("nulls", 0, Some(b"a"), Some(b"1"));
    broker.send("nulls", 0, None, Some(b"orphan"));
    broker.send("nulls", 0, Some(b"b"), Some(b""));
    broker.send("nulls", 0, None, None);
    broker.send("nulls", 0, Some(&[0, 255, 10]), Some(&[1, 0, 2]));
    broker.flush();
    let dir = tempfile::tempdir().unwrap();
    let config = service_config(
        &broker.bootstrap,
        dir.path(),
        vec![store("s", "nulls", None)],
        &[],
    );
    let rt = runtime();
    let nulls = rt.block_on(async {
        let service = Service::start(&config).await.unwrap();
        let s = &service;
        tokio::task::block_in_place(|| wait_caught_up(s, 1));
        let nulls = service.board.partitions()[0].null_keys.load(Relaxed);
        service.stop().await;
        nulls
    });
    assert_eq!(nulls, 2);
    let (applied, data) = read_store(dir.path(), "s", "nulls", 0);
    assert_eq!(applied, Some(4), "skipped records still move the offset");
    assert_eq!(data, broker.model("nulls", 0, 0));
    assert_eq!(
        data.get(&b"b"[..]),
        Some(&Vec::new()),
        "an empty value is a value, not a delete"
    );
}

#[test]
fn retention_past_the_store_wipes_and_rebuilds() {
    let mut broker = Broker::new();
    broker.create_topic("retained", 1);
    broker.produce_changelog("retained", 1, 200, 4);
    let dir = tempfile::tempdir().unwrap();
    let config = service_config(
        &broker.bootstrap,
        dir.path(),
        vec![store("s", "retained", None)],
        &[],
    );
    let rt = runtime();
    restore_once(&rt, &config, 1);
    assert_eq!(read_store(dir.path(), "s", "retained", 0).0, Some(199));

    // About 7 MiB more: the mock keeps ~5 MiB, so the oldest batches (and the store's offset) go.
    let value = vec![b'x'; 1024];
    for i in 0..7000 {
        let key = format!("big{:04}", i % 500).into_bytes();
        broker.send("retained", 0, Some(&key), Some(&value));
        if i % 500 == 0 {
            broker.flush();
        }
    }
    broker.flush();
    let (log_start, high) = broker.watermarks("retained", 0);
    assert!(
        log_start > 200,
        "retention must pass the store's offset (log-start {log_start})"
    );

    let figures = restore_once(&rt, &config, 1);
    assert_eq!(figures[0].2, 1, "one offset_out_of_range wipe");
    let (applied, data) = read_store(dir.path(), "s", "retained", 0);
    assert_eq!(applied, Some(high - 1));
    assert_eq!(
        data,
        broker.model("retained", 0, log_start as usize),
        "rebuilt from what the log holds"
    );
}

#[test]
fn a_missing_topic_fails_only_its_store() {
    let mut broker = Broker::new();
    broker.create_topic("present", 2);
    broker.produce_changelog("present", 2, 100, 5);
    let dir = tempfile::tempdir().unwrap();
    let config = service_config(
        &broker.bootstrap,
        dir.path(),
        vec![
            store("good", "present", None),
            store("whole-topic-missing", "absent-topic", None),
            store("partition-missing", "absent-too", Some(vec![0])),
        ],
        &[],
    );
    let rt = runtime();
    rt.block_on(async {
        let service = Service::start(&config).await.unwrap();
        let s = &service;
        tokio::task::block_in_place(|| {
            wait_until(
                "good store caught up, the others failed",
                Duration::from_secs(60),
                || {
                    let partitions = s.board.partitions();
                    let good = partitions
                        .iter()
                        .filter(|p| p.store == "good")
                        .all(|p| p.state() == PartitionState::CaughtUp)
                        && partitions.iter().filter(|p| p.store == "good").count() == 2;
                    let failed = partitions.iter().any(|p| {
                        p.store == "partition-missing" && p.state() == PartitionState::Failed
                    });
                    good && failed && s.board.store_errors().contains_key("whole-topic-missing")
                },
            )
        });
        let readiness = service.board.readiness(10_000);
        assert!(!readiness.ready);
        let names: Vec<_> = readiness
            .not_ready
            .iter()
            .map(|n| n.store.as_str())
            .collect();
        assert!(
            names.contains(&"whole-topic-missing") && names.contains(&"partition-missing"),
            "{names:?}"
        );
        assert!(!names.contains(&"good"));
        // The store that cannot list its partitions is failed in the metrics too.
        let scraped = warmstore::observe::metrics::render(&warmstore::observe::metrics::registry(
            service.board.clone(),
            10_000,
        ));
        assert!(
            scraped.contains(r#"warmstore_store_state{store="whole-topic-missing",topic="",partition="",state="failed"} 1"#),
            "{scraped}"
        );
        service.stop().await;
    });
    for p in 0..2 {
        assert_eq!(
            read_store(dir.path(), "good", "present", p).1,
            broker.model("present", p, 0)
        );
    }
}

/// Restores `records` records of 200 bytes into each of `partitions` partitions of `topic`, with
/// commits on time turned off (only the size budget and catch-up commit) and `configure`'s changes;
/// checks every store against the log and returns each partition's (partition, bytes, commits).
fn commits_of_a_restore(
    topic: &str,
    partitions: i32,
    records: usize,
    configure: impl FnOnce(&mut Config),
) -> Vec<(i32, u64, u64)> {
    let mut broker = Broker::new();
    broker.create_topic(topic, partitions);
    let value = vec![b'v'; 200];
    for p in 0..partitions {
        for i in 0..records {
            broker.send(
                topic,
                p,
                Some(format!("key-{i:05}").as_bytes()),
                Some(&value),
            );
        }
    }
    broker.flush();
    let dir = tempfile::tempdir().unwrap();
    let mut config = service_config(
        &broker.bootstrap,
        dir.path(),
        vec![store("s", topic, None)],
        &[],
    );
    config.restore.commit_interval = Duration::from_secs(3600);
    configure(&mut config);
    let figures = runtime().block_on(async {
        let service = Service::start(&config).await.expect("service starts");
        let s = &service;
        tokio::task::block_in_place(|| wait_caught_up(s, partitions as usize));
        let figures = service
            .board
            .partitions()
            .iter()
            .map(|p| (p.partition, p.bytes.load(Relaxed), p.commits.load(Relaxed)))
            .collect();
        service.stop().await;
        figures
    });
    for p in 0..partitions {
        assert_eq!(
            read_store(dir.path(), "s", topic, p).1,
            broker.model(topic, p, 0)
        );
    }
    figures
}

/// Regression: a store without a partition list used to count as one partition when
/// `max_uncommitted_bytes` was split, so each of its partitions buffered the whole budget and a
/// large changelog sat uncommitted in memory until catch-up.
#[test]
fn the_uncommitted_budget_is_split_over_discovered_partitions() {
    // 64 KiB per partition.
    let figures = commits_of_a_restore("budget", 4, 7500, |config| {
        config.restore.max_uncommitted_bytes = 256 << 10;
    });
    let share = 64 << 10;
    for (partition, bytes, commits) in figures {
        assert!(
            commits >= bytes / (2 * share),
            "partition {partition}: {commits} commits for {bytes} bytes; a 64 KiB share needs about {}",
            bytes / share
        );
    }
}

/// Regression: one partition took the whole `max_uncommitted_bytes` (64 MiB by default) as its
/// commit batch, which RocksDB puts into one memtable whole: a 20M-record partition peaked at
/// 440 MiB against a 32 MiB memtable budget. A partition's batch is now at most one turn of the
/// memtable budget, here 256 KiB (1 MiB over 4 turns).
#[test]
fn a_large_partition_commits_within_a_turn_of_the_memtable_budget() {
    let turn = 256 << 10;
    let figures = commits_of_a_restore("large", 1, 15_000, |config| {
        config.rocksdb.total_write_buffer_size = Some(ByteSize(4 * turn));
        config.restore.catch_up_turns = 4;
    });
    let (_, bytes, commits) = figures[0];
    assert!(
        commits >= bytes / (2 * turn),
        "{commits} commits for {bytes} bytes; batches of a 256 KiB turn need about {}",
        bytes / turn
    );
}

/// What a restore with a single turn (`catch_up_turns: 1`) looked like while it ran.
struct Turns {
    /// Most partitions seen loading (started, not at the end) at one moment.
    most_loading: usize,
    saw_waiting: bool,
    waiting_after_catch_up: bool,
    /// Partitions still fetched by the catching-up consumer once all were caught up.
    loading_after_catch_up: usize,
}

/// Restores 4 partitions of `records` records each with one turn worth `turn_bytes` (the memtable
/// budget, over one turn), sampling the board until all are caught up, then produces more and waits
/// until every store has applied it (a partition done with its turn moves to the tailing consumer,
/// which must keep it warm), and checks every store against the changelog.
fn restore_with_one_turn(
    topic: &str,
    records: usize,
    ready_max_lag: u64,
    turn_bytes: u64,
) -> Turns {
    let mut broker = Broker::new();
    broker.create_topic(topic, 4);
    broker.produce_changelog(topic, 4, records, 5);
    let dir = tempfile::tempdir().unwrap();
    let mut config = service_config(
        &broker.bootstrap,
        dir.path(),
        vec![store("s", topic, None)],
        &[],
    );
    config.restore.catch_up_turns = 1;
    config.restore.ready_max_lag = ready_max_lag;
    config.rocksdb.total_write_buffer_size = Some(ByteSize(turn_bytes));
    let turns = runtime().block_on(async {
        let service = Service::start(&config).await.expect("service starts");
        let s = &service;
        let turns = tokio::task::block_in_place(|| {
            let mut turns = Turns {
                most_loading: 0,
                saw_waiting: false,
                waiting_after_catch_up: false,
                loading_after_catch_up: 0,
            };
            // Sampled densely: a catch-up of this size takes a few tens of milliseconds.
            let until = std::time::Instant::now() + Duration::from_secs(60);
            let mut sample = || {
                let partitions = s.board.partitions();
                // The ones waiting say so (in /stores, /readyz and warmstore_restore_waiting).
                turns.saw_waiting |= partitions.iter().any(|p| p.waiting.load(Relaxed));
                let loading = partitions
                    .iter()
                    .filter(|p| {
                        let position = p.position.load(Relaxed);
                        position > p.catchup_from.load(Relaxed)
                            && position < p.end_offset.load(Relaxed)
                    })
                    .count();
                turns.most_loading = turns.most_loading.max(loading);
                common::all_caught_up(s, 4)
            };
            while !sample() {
                assert!(
                    std::time::Instant::now() < until,
                    "timed out waiting for catch-up"
                );
                std::thread::sleep(Duration::from_millis(2));
            }
            turns.waiting_after_catch_up =
                s.board.partitions().iter().any(|p| p.waiting.load(Relaxed));
            turns.loading_after_catch_up = s
                .board
                .partitions()
                .iter()
                .filter(|p| p.catching_up.load(Relaxed))
                .count();
            broker.produce_changelog(topic, 4, 400, 6);
            let ends: Vec<i64> = (0..4).map(|p| broker.watermarks(topic, p).1).collect();
            wait_until("tailing", Duration::from_secs(30), || {
                s.board
                    .partitions()
                    .iter()
                    .all(|p| p.applied.load(Relaxed) + 1 == ends[p.partition as usize])
            });
            turns
        });
        service.stop().await;
        turns
    });
    for p in 0..4 {
        assert_eq!(
            read_store(dir.path(), "s", topic, p).1,
            broker.model(topic, p, 0)
        );
    }
    turns
}

/// With `catch_up_turns: 1` and catch-ups larger than a turn (40,000 records of about 28
/// bytes, 1.1 MB, against a 512 KiB turn), the partitions catch up one after another, never two at
/// once, and every store still ends equal to the changelog.
#[test]
fn partitions_take_turns_when_parallel_restores_are_limited() {
    let turns = restore_with_one_turn("turns", 40_000, 0, 512 << 10);
    assert_eq!(turns.most_loading, 1, "one partition loads at a time");
    assert!(turns.saw_waiting, "three partitions waited for their turn");
    assert!(
        !turns.waiting_after_catch_up,
        "nobody waits once all are caught up"
    );
    assert_eq!(
        turns.loading_after_catch_up, 0,
        "caught-up partitions are tailed by the tailing consumer"
    );
}

/// A partition already within `ready_max_lag` is warm by the user's measure: topping it up does not
/// wait for a turn, however few turns there are.
#[test]
fn partitions_within_ready_max_lag_need_no_turn() {
    let turns = restore_with_one_turn("topup", 5_000, 100_000, 512 << 10);
    assert!(!turns.saw_waiting, "no partition waited for a turn");
}

/// Catch-ups far smaller than a turn (80,000 records of about 28 bytes, 2.2 MB, against a 256 MiB
/// turn) share it: once the first records show their size, the partitions that waited for the
/// first one are let in and load together. Memory follows the budget, not the partition count.
#[test]
fn small_catch_ups_share_a_turn() {
    let turns = restore_with_one_turn("sharing", 80_000, 0, 256 << 20);
    assert!(
        turns.most_loading > 1,
        "several partitions loaded at once, saw {}",
        turns.most_loading
    );
    assert_eq!(turns.loading_after_catch_up, 0);
}
