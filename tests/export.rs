//! `warmstore export` beside a running `warmstore run` that tails a changelog a producer keeps
//! writing: every copy is internally consistent (its data equals the model at its own stored
//! offset), closed cleanly, and opens read-only; and the copies follow the live store.

mod common;

use common::background::{producer, Running};
use common::{
    fold, free_port, http_get, read_timestamped_store, wait_until, write_config, Broker,
    TimestampedStore,
};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

const TOPIC: &str = "app-counts-changelog";
const PARTITIONS: i32 = 2;

/// One exported store partition, its values without their timestamps.
fn read_copy(state_dir: &Path, partition: i32) -> TimestampedStore {
    let dir = state_dir.join(format!("app/0_{partition}/rocksdb/counts"));
    let mut copy = read_timestamped_store(&dir, TOPIC, partition);
    for value in copy.data.values_mut() {
        value.drain(..8);
    }
    copy
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
    let writer = producer(
        broker.bootstrap.clone(),
        TOPIC,
        PARTITIONS,
        500,
        21,
        stop.clone(),
    );
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
        let partitions: Vec<TimestampedStore> =
            (0..PARTITIONS).map(|p| read_copy(&target, p)).collect();
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
                fold(log[p][..=applied].iter()),
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
