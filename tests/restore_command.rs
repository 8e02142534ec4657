//! `warmstore restore`, the init container: it exits 1 with the reason when a store fails or time
//! runs out, and when it is SIGKILLed at random moments the next run resumes and the final stores
//! (in the Kafka Streams layout, timestamped) equal the model.

mod common;

use common::{fold, read_timestamped_store, write_config, Broker, State, TimestampedStore};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use warmstore::store::StoreType;
use warmstore::testkit::Rng;

const TOPIC: &str = "app-counts-changelog";
const PARTITIONS: i32 = 3;
const FIRST_TIMESTAMP: i64 = 1_700_000_000_000;

/// `warmstore restore --config CONFIG`, to add to before it runs.
fn restore_command(config: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_warmstore"));
    command.args(["restore", "--config"]).arg(config);
    command
}

fn restore(config: &Path, extra: &[&str]) -> Output {
    restore_command(config)
        .args(extra)
        .output()
        .expect("warmstore runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_missing_topic_exits_1_naming_the_store() {
    let broker = Broker::new();
    let dir = tempfile::tempdir().unwrap();
    let stores = "  - name: gone\n    changelog: no-such-topic\n";
    let config = write_config(dir.path(), &broker.bootstrap, "127.0.0.1:0", stores, "");
    let out = restore(&config, &["--timeout", "60s"]);
    let log = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{log}");
    assert!(log.contains("store gone"), "{log}");
    assert!(log.contains("failed"), "{log}");
}

#[test]
fn the_timeout_exits_1_listing_what_is_not_warm() {
    let mut broker = Broker::new();
    broker.create_topic("slow", 1);
    broker.produce_changelog("slow", 1, 100, 1);
    let dir = tempfile::tempdir().unwrap();
    let stores = "  - name: slow\n    changelog: slow\n";
    let config = write_config(dir.path(), &broker.bootstrap, "127.0.0.1:0", stores, "");
    let out = restore(&config, &["--timeout", "0s"]);
    let log = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{log}");
    assert!(log.contains("not warm after 0s"), "{log}");
    assert!(log.contains("store slow"), "{log}");
}

/// The init container's log says, for each store partition, that it was restored and from where
/// to where, with the time spent waiting for a turn, catching up and flushing: how a user finds
/// what a slow restore waited on, as Kafka Streams logs each changelog it has restored.
#[test]
fn each_restored_partition_is_logged_with_where_its_time_went() {
    let mut broker = Broker::new();
    broker.create_topic("logged", 2);
    broker.produce_changelog("logged", 2, 300, 3);
    let dir = tempfile::tempdir().unwrap();
    let stores = "  - name: logged\n    changelog: logged\n";
    // Without it, a partition within the default lag is warm before it takes anything.
    let wait_for_all = "  ready_max_lag: 0\n";
    let config = write_config(
        dir.path(),
        &broker.bootstrap,
        "127.0.0.1:0",
        stores,
        wait_for_all,
    );
    let out = restore_command(&config)
        .env("WARMSTORE_LOG_FORMAT", "json")
        .env_remove("RUST_LOG")
        .output()
        .expect("warmstore runs");
    let log = stderr(&out);
    assert!(out.status.success(), "{log}");
    let restored: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| line["message"] == "store partition restored")
        .collect();
    let mut partitions: Vec<i64> = restored
        .iter()
        .filter_map(|line| line["partition"].as_i64())
        .collect();
    partitions.sort();
    assert_eq!(partitions, [0, 1], "one line per partition:\n{log}");
    for line in &restored {
        let partition = line["partition"].as_i64().unwrap() as i32;
        assert_eq!(line["from"], 0, "{line}");
        assert_eq!(
            line["to"],
            broker.watermarks("logged", partition).1,
            "{line}"
        );
        for phase in ["waited_for_turn_s", "catching_up_s", "flushing_s"] {
            let seconds = line[phase].as_f64();
            assert!(seconds.is_some_and(|s| s >= 0.0), "{phase} in {line}");
        }
    }
}

/// The store partition (timestamps included), when it exists yet. A kill can land while RocksDB
/// creates it, after its `CURRENT` file and before its column families: nothing is in it yet, and
/// the next run wipes and creates it again.
fn on_disk(state_dir: &Path, partition: i32) -> Option<TimestampedStore> {
    let dir = store_dir(state_dir, partition);
    let families = rocksdb::DB::list_cf(&rocksdb::Options::default(), &dir).ok()?;
    StoreType::TimestampedKeyValue
        .families()
        .iter()
        .all(|name| families.iter().any(|f| f == name))
        .then(|| read_timestamped_store(&dir, TOPIC, partition))
}

fn store_dir(state_dir: &Path, partition: i32) -> PathBuf {
    state_dir.join(format!("app/0_{partition}/rocksdb/counts"))
}

/// What the first `count` records of a partition make in a timestamped store: each record's
/// timestamp is FIRST_TIMESTAMP + its offset.
fn timestamped_model(broker: &Broker, partition: i32, count: usize) -> State {
    let records = &broker.log[&(TOPIC.to_string(), partition)][..count];
    let stamped: Vec<_> = records
        .iter()
        .enumerate()
        .map(|(offset, (key, value))| {
            let stamp = (FIRST_TIMESTAMP + offset as i64).to_be_bytes();
            let value = value.as_ref().map(|v| [&stamp[..], v].concat());
            (key.clone(), value)
        })
        .collect();
    fold(stamped.iter())
}

#[test]
fn sigkill_at_random_moments_resumes_and_ends_equal_to_the_model() {
    let mut broker = Broker::new();
    broker.create_topic(TOPIC, PARTITIONS);
    let mut rng = Rng::new(5);
    let per_partition = 60_000;
    for partition in 0..PARTITIONS {
        for offset in 0..per_partition {
            let key = format!("k{:05}", rng.below(5_000)).into_bytes();
            let value = (rng.below(10) > 0).then(|| format!("v{}", rng.next_u64()).into_bytes());
            let stamp = FIRST_TIMESTAMP + offset as i64;
            broker.send_at(TOPIC, partition, Some(&key), value.as_deref(), Some(stamp));
        }
    }
    broker.flush();
    let dir = tempfile::tempdir().unwrap();
    let stores = "  - name: counts\n    layout: kafka-streams\n    application_id: app\n    type: timestamped_key_value\n";
    // Small commits and flushes, so kills land between many of them.
    let config = write_config(
        dir.path(),
        &broker.bootstrap,
        "127.0.0.1:0",
        stores,
        "  ready_max_lag: 0\n  flush_interval: 100ms\n  max_uncommitted_bytes: 64KiB\n",
    );
    let state_dir = dir.path().join("state");
    let log = dir.path().join("restore.log");
    let (mut kills, mut stored) = (0, 0);
    let mut last_applied = vec![None; PARTITIONS as usize];
    // Kills come later and later: the first land while the stores open, the later ones after
    // commits were flushed, so later runs resume from stored offsets. Slowly: a run resumes
    // where the last was killed, and with steps of 50 ms a fast machine finished the whole
    // restore before the third kill.
    for round in 0..15 {
        let mut child = restore_command(&config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(50 + 25 * round + rng.below(50)));
        if let Some(status) = child.try_wait().unwrap() {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(status.success(), "warmstore restore failed:\n{log}");
            break;
        }
        child.kill().unwrap();
        child.wait().unwrap();
        kills += 1;
        for partition in 0..PARTITIONS {
            let Some(TimestampedStore {
                applied,
                data: state,
                ..
            }) = on_disk(&state_dir, partition)
            else {
                continue;
            };
            let count = applied.map_or(0, |a| a as usize + 1);
            assert_eq!(
                state,
                timestamped_model(&broker, partition, count),
                "partition {partition} after kill {kills}: the store must be the model at its offset {applied:?}"
            );
            assert!(
                applied >= last_applied[partition as usize],
                "partition {partition}: the stored offset went back from {:?} to {applied:?}; a restart must resume, never rebuild",
                last_applied[partition as usize]
            );
            if applied.is_some() {
                stored += 1;
            }
            last_applied[partition as usize] = applied;
        }
    }
    let out = restore(&config, &["--timeout", "120s"]);
    assert!(out.status.success(), "{}", stderr(&out));
    for partition in 0..PARTITIONS {
        let store = on_disk(&state_dir, partition).expect("the store exists");
        assert_eq!(store.applied, Some(per_partition as i64 - 1));
        assert_eq!(store.status, Some(0), "closed cleanly");
        assert_eq!(
            store.data,
            timestamped_model(&broker, partition, per_partition)
        );
    }
    println!(
        "warmstore restore: {kills} kills; {stored} times a killed partition had an offset stored"
    );
    assert!(kills >= 3, "the loop must really kill restores: {kills}");
    assert!(
        stored >= 2,
        "kills must also land after offsets are stored, so restarts resume: {stored}"
    );
}
