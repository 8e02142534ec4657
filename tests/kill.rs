//! SIGKILL of the real `warmstore run` process at random moments, during restore and tailing, while a
//! producer keeps writing. After the last restart every store equals the model.

mod common;

use common::background::{producer, Running};
use common::{fold, free_port, http_get, read_store, wait_until, write_config, Broker};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use warmstore::testkit::Rng;

const TOPIC: &str = "killed";
const PARTITIONS: i32 = 3;

#[test]
fn sigkill_during_restore_and_tailing_loses_nothing() {
    let broker = Broker::new();
    broker.create_topic(TOPIC, PARTITIONS);
    // Every restart restores what was produced since its store was last flushed, so kills land in
    // restores as well as in tailing.
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let stores = format!("  - name: s\n    changelog: {TOPIC}\n");
    // Two loaders for three partitions: kills also land while a partition waits its turn.
    let config = write_config(
        dir.path(),
        &broker.bootstrap,
        &addr,
        &stores,
        "  ready_max_lag: 0\n  catch_up_turns: 2\n",
    );
    let log_file = dir.path().join("warmstore.log");

    let stop = Arc::new(AtomicBool::new(false));
    let writer = producer(
        broker.bootstrap.clone(),
        TOPIC,
        PARTITIONS,
        400,
        99,
        stop.clone(),
    );
    // 10 kills in CI; WARMSTORE_KILLS=100 for the long run in RELIABILITY.md.
    let kills: usize = std::env::var("WARMSTORE_KILLS")
        .ok()
        .and_then(|k| k.parse().ok())
        .unwrap_or(10);
    let mut rng = Rng::new(7);
    for _ in 0..kills {
        let mut child = Running::warmstore_run(&config, &log_file);
        std::thread::sleep(Duration::from_millis(300 + rng.below(1500)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
    }
    stop.store(true, Relaxed);
    let log = writer.join().unwrap();

    let child = Running::warmstore_run(&config, &log_file);
    let until = std::time::Instant::now() + Duration::from_secs(120);
    while http_get(&addr, "/readyz").0 != 200 {
        if std::time::Instant::now() > until {
            let text = std::fs::read_to_string(&log_file).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            panic!(
                "not ready 120 s after the last restart: {}\n{}",
                http_get(&addr, "/readyz").1,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        child.stop(Duration::from_secs(10)),
        Some(0),
        "SIGTERM exits 0"
    );
    let text = std::fs::read_to_string(&log_file).unwrap();
    let resumed = text
        .matches("store was not closed cleanly; resuming")
        .count();
    let wipes = text.matches("wiping store").count();
    let mut divergences = 0;
    for p in 0..PARTITIONS {
        let (applied, data) = read_store(&dir.path().join("state"), "s", TOPIC, p);
        let records = &log[p as usize];
        if applied != Some(records.len() as i64 - 1) || data != fold(records.iter()) {
            divergences += 1;
        }
    }
    println!(
        "kills: {kills}, records produced: {}, unclean resumes: {resumed}, wipes: {wipes}, divergent stores: {divergences}",
        log.iter().map(Vec::len).sum::<usize>()
    );
    assert_eq!(
        divergences, 0,
        "every store equals the model after the last restart"
    );
    assert!(
        resumed >= kills / 2,
        "most kills leave stores open, which are resumed:\n{text}"
    );
}

/// `warmstore run` on one store over a changelog of `partitions` partitions of `records` records
/// each, started and warm (`/readyz` 200). `restore` adds lines to the config's `restore:` section.
struct Warm {
    broker: Broker,
    dir: tempfile::TempDir,
    addr: String,
    config: PathBuf,
    log_file: PathBuf,
}

impl Warm {
    fn start(topic: &str, partitions: i32, records: usize, restore: &str) -> (Warm, Running) {
        let warm = Warm::new(topic, partitions, records, restore);
        let child = warm.restart();
        (warm, child)
    }

    /// The changelog produced and the config written; nothing started.
    fn new(topic: &str, partitions: i32, records: usize, restore: &str) -> Warm {
        let mut broker = Broker::new();
        broker.create_topic(topic, partitions);
        broker.produce_changelog(topic, partitions, records, 8);
        let dir = tempfile::tempdir().unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let stores = format!("  - name: s\n    changelog: {topic}\n");
        let restore = format!("  ready_max_lag: 0\n{restore}");
        let config = write_config(dir.path(), &broker.bootstrap, &addr, &stores, &restore);
        let log_file = dir.path().join("warmstore.log");
        Warm {
            broker,
            dir,
            addr,
            config,
            log_file,
        }
    }

    /// Starts the process (again) and waits until it is warm.
    fn restart(&self) -> Running {
        let child = Running::warmstore_run(&self.config, &self.log_file);
        wait_until("/readyz 200", Duration::from_secs(120), || {
            http_get(&self.addr, "/readyz").0 == 200
        });
        child
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log_file).unwrap_or_default()
    }
}

#[test]
fn sigkill_with_the_wipe_policy_rebuilds_and_says_why() {
    let (warm, mut child) = Warm::start("eos", 2, 500, "  on_unclean_shutdown: wipe\n");
    child.kill().unwrap();
    child.wait().unwrap();

    let child = warm.restart();
    assert_eq!(child.stop(Duration::from_secs(10)), Some(0));
    let text = warm.log();
    assert!(
        text.contains("wiping store") && text.contains("unclean_shutdown"),
        "{text}"
    );
    for p in 0..2 {
        let (applied, data) = read_store(&warm.dir.path().join("state"), "s", "eos", p);
        assert_eq!(applied, Some(499));
        assert_eq!(data, warm.broker.model("eos", p, 0));
    }
}

/// A closing terminal sends SIGHUP, which ended the process as SIGKILL does: under the wipe
/// policy the next start rebuilt every store. It now closes them as SIGTERM does.
#[test]
fn sighup_closes_every_store_cleanly() {
    let (warm, child) = Warm::start("hangup", 2, 300, "  on_unclean_shutdown: wipe\n");
    assert_eq!(
        child.stop_with(libc::SIGHUP, Duration::from_secs(10)),
        Some(0)
    );
    let child = warm.restart();
    assert_eq!(child.stop(Duration::from_secs(10)), Some(0));
    let text = warm.log();
    assert!(!text.contains("wiping store"), "{text}");
    for p in 0..2 {
        let (applied, data) = read_store(&warm.dir.path().join("state"), "s", "hangup", p);
        assert_eq!(applied, Some(299));
        assert_eq!(data, warm.broker.model("hangup", p, 0));
    }
}

/// Ready means the restore survives a kill: a partition shows it has reached the end only once its
/// first catch-up is flushed (with the WAL off, only flushed commits survive). Found by the group
/// test that kills a member as soon as the group has settled: its position reached the end before
/// the flush did, so `/readyz` said 200 while a store's restore was still only in memory, and the
/// restarted member found that store empty.
#[test]
fn a_standby_killed_the_moment_it_is_ready_keeps_every_restore() {
    const PARTITIONS: i32 = 64;
    let warm = Warm::new("ready", PARTITIONS, 50, "");
    let mut child = Running::warmstore_run(&warm.config, &warm.log_file);
    // Polled without a pause: the 64 first flushes queue on one flush thread, and the kill must
    // land while the last of them may still be waiting.
    let until = std::time::Instant::now() + Duration::from_secs(120);
    while http_get(&warm.addr, "/readyz").0 != 200 {
        assert!(
            std::time::Instant::now() < until,
            "timed out waiting for /readyz 200"
        );
    }
    child.kill().unwrap();
    child.wait().unwrap();
    for p in 0..PARTITIONS {
        let (applied, data) = read_store(&warm.dir.path().join("state"), "s", "ready", p);
        assert_eq!(applied, Some(49), "partition {p}: ready, then killed");
        assert_eq!(data, warm.broker.model("ready", p, 0), "partition {p}");
    }
}

/// Stores that cannot be flushed make a stop slow: RocksDB retries a failed flush after a
/// second, on the flush threads every store of the process shares (one on two cores). Found
/// with a 1,000-partition process whose state directory was deleted under it, which then took
/// minutes to stop and said nothing. Now the stop says what it waits for, and a second SIGTERM
/// exits 1 at once.
#[test]
fn a_stop_that_cannot_flush_says_so_and_a_second_sigterm_exits() {
    let (warm, child) = Warm::start("stuck", 60, 20, "");
    // Every store's closing flush now fails: its directory is gone.
    let state = warm.dir.path().join("state");
    wait_until(
        "the state directory removed",
        Duration::from_secs(10),
        || std::fs::remove_dir_all(&state).is_ok() || !state.exists(),
    );
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    wait_until("the stop to say it waits", Duration::from_secs(60), || {
        warm.log()
            .contains("stopping: store partitions are still committing")
    });
    let mut child = child;
    assert!(
        child.try_wait().unwrap().is_none(),
        "the stop is still waiting for the stores (one a second): the case under test"
    );
    let code = child.stop(Duration::from_secs(10));
    assert_eq!(code, Some(1), "a forced stop exits 1:\n{}", warm.log());
    assert!(warm.log().contains("exiting before every store was closed"));
}
