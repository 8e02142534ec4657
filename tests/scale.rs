//! Many store partitions in one `warmstore run` process: every store equals its changelog, and
//! the threads and open files stay within bounds a user can plan for.

mod common;

use common::{free_port, http_get, read_store, wait_until, write_config, Broker};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const PARTITIONS: i32 = 300;
const RECORDS_PER_PARTITION: usize = 40;
/// Files an open store holds after its catch-up: RocksDB's WAL, MANIFEST and LOCK, two handles
/// on its directory (a third, which RocksDB opens for each column family it creates, is saved by
/// creating new stores as copies of an empty one with every family in place), and the two table
/// files of the flush at catch-up. More tables would mean flushes before catch-up; warmstore's
/// lock file is not held open while RocksDB's lock stands in for it.
const FILES_PER_STORE: usize = 7;
/// Everything else the process holds: sockets, the log, the standard streams.
const FILES_BESIDES_STORES: usize = 100;

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Threads a process may use whatever its partition count: the restore runtime's workers and
/// blocking threads, the HTTP runtime, librdkafka's and RocksDB's own.
fn thread_bound() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    2 * cores + 16
}

fn threads(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("a thread count")
}

/// Thread names and how many have each.
fn thread_counts(pid: u32) -> std::collections::BTreeMap<String, usize> {
    let mut names = std::collections::BTreeMap::<String, usize>::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        *names.entry(name.trim().to_string()).or_default() += 1;
    }
    names
}

/// Thread names and how many have each, for a failure message.
fn thread_names(pid: u32) -> String {
    format!("{:?}", thread_counts(pid))
}

fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// `warmstore run` warming one store of `topic`, with `partitions` partitions of small records
/// produced beforehand, and `extra` appended to its config.
struct Warming {
    broker: Broker,
    dir: tempfile::TempDir,
    addr: String,
    running: Running,
}

impl Warming {
    fn start(topic: &str, partitions: i32, extra: &str) -> Warming {
        let mut broker = Broker::new();
        broker.create_topic(topic, partitions);
        broker.produce_changelog(topic, partitions, RECORDS_PER_PARTITION, 3);
        let dir = tempfile::tempdir().unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let config = write_config(
            dir.path(),
            &broker.bootstrap,
            &addr,
            &format!("  - name: {topic}\n    changelog: {topic}\n{extra}"),
            "  ready_max_lag: 0\n",
        );
        let child = Command::new(env!("CARGO_BIN_EXE_warmstore"))
            .args(["run", "--config", config.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("warmstore starts");
        Warming {
            broker,
            dir,
            addr,
            running: Running(child),
        }
    }
}

#[test]
fn three_hundred_partitions_restore_with_bounded_threads_and_files() {
    let Warming {
        broker,
        dir,
        addr,
        mut running,
    } = Warming::start("many", PARTITIONS, "");
    let pid = running.0.id();
    let (mut most_threads, mut names) = (0, String::new());
    let mut count_threads = || {
        let now = threads(pid);
        if now > most_threads {
            (most_threads, names) = (now, thread_names(pid));
        }
    };
    wait_until(
        "every partition caught up",
        Duration::from_secs(120),
        || {
            count_threads();
            http_get(&addr, "/readyz").0 == 200
        },
    );
    count_threads();
    let files = open_files(pid);

    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let status = running.0.wait().unwrap();
    assert_eq!(status.code(), Some(0), "a clean stop");

    assert!(
        most_threads <= thread_bound(),
        "{most_threads} threads for {PARTITIONS} partitions; the bound is {}: {names}",
        thread_bound()
    );
    let file_bound = PARTITIONS as usize * FILES_PER_STORE + FILES_BESIDES_STORES;
    assert!(
        files <= file_bound,
        "{files} open files for {PARTITIONS} partitions; the bound is {file_bound}"
    );
    let state = dir.path().join("state");
    for p in 0..PARTITIONS {
        let (applied, data) = read_store(&state, "many", "many", p);
        assert_eq!(
            applied,
            Some(RECORDS_PER_PARTITION as i64 - 1),
            "partition {p}"
        );
        assert_eq!(data, broker.model("many", p, 0), "partition {p}");
    }
}

/// RocksDB's flush and compaction pools are the process's, sized by the config rather than by
/// what one store asks for (one of each): a user on a large machine sees them in `top -H`.
#[test]
fn rocksdb_background_threads_follow_the_config() {
    let warming = Warming::start(
        "pools",
        4,
        "rocksdb:\n  flush_threads: 3\n  compaction_threads: 2\n",
    );
    let (addr, pid) = (&warming.addr, warming.running.0.id());
    // Every catch-up ends in a flush, so the pools have started by the time all are caught up.
    wait_until("every partition caught up", Duration::from_secs(60), || {
        http_get(addr, "/readyz").0 == 200
    });
    let threads = thread_counts(pid);
    let named = |name: &str| threads.get(name).copied().unwrap_or(0);
    assert_eq!(
        (named("rocksdb:high"), named("rocksdb:low")),
        (3, 2),
        "flush and compaction threads: {threads:?}"
    );
}
