//! The store's own commit path at production sizes, without Kafka: records generated in the process
//! go through `Store::put`, `Store::delete` and `Store::commit`, the calls `warmstore run` makes,
//! with `run`'s process-wide memtable budget and block cache, one thread per partition. It
//! separates what the store costs from what the fetch costs.
//!
//! The records have the bench's shape: 16-byte keys over a key space of half the records of the
//! partition (so half the puts overwrite), 100-byte values, 5% tombstones.
//!
//! Each candidate runs in a process of its own, so peak RSS and bytes written are its alone:
//! - `leveled`: RocksDB's leveled compaction;
//! - `universal`: universal compaction, as Kafka Streams configures its stores, warmstore's default;
//! - `bulk`: universal, with compaction off during the load and one full compaction at the end
//!   (Kafka Streams' old bulk-load mode).
//!
//! For each it reports, for the load: records/s over the first and the last 10% of the records,
//! CPU seconds per million records, write stalls (RocksDB's cumulative stall time), bytes written
//! to disk over bytes ingested (write amplification), size on disk and peak RSS. Then, for tailing,
//! 10% more records committed 100 at a time: records/s and write amplification. Last, the stores
//! are opened under the other compaction style, written to and read back whole, as an application
//! with its own options would.
//!
//! With `--idle N` it measures instead what N open stores cost with nothing to do: each opened as
//! `run` opens it, given one committed and flushed record (a caught-up partition), then the process
//! CPU over `--idle-seconds` (30 by default) with nothing else in the process. That is the floor
//! under the idle CPU `bench --scale` reports for `warmstore run`.
//!
//! usage: store_load [--records N] [--partitions P] [--styles leveled,universal,bulk] [--dir D]
//!        store_load --idle N [--idle-seconds S] [--dir D]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use warmstore::config::Config;
use warmstore::store::dirty::UncleanPolicy;
use warmstore::store::{CompactionStyle, Store, StoreOptions, StorePaths, TopicPartition};
use warmstore::testkit::Rng;

const VALUE_SIZE: usize = 100;
const TOMBSTONE_PERCENT: u64 = 5;
/// Uncommitted bytes at which the load commits: `run` commits a poll's worth at a time.
const COMMIT_BYTES: usize = 1 << 20;
/// Records per commit while tailing: a trickle of new records, each committed soon.
const TAIL_COMMIT: u64 = 100;
const STORE: &str = "bench";

fn arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

fn number(args: &[String], name: &str, default: u64) -> u64 {
    arg(args, name).map_or(default, |v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name} must be a number"))
    })
}

/// One partition's changelog, generated as it is applied.
struct Changelog {
    rng: Rng,
    key_space: u64,
    value: Vec<u8>,
    /// One bit per key, set while the key is live after the records applied so far: the model
    /// the stores are read back against, small enough not to weigh in the peak RSS.
    live: Vec<u64>,
    offset: i64,
}

impl Changelog {
    fn new(seed: u64, records: u64) -> Changelog {
        let key_space = (records / 2).max(1);
        Changelog {
            rng: Rng::new(seed),
            key_space,
            value: vec![b'v'; VALUE_SIZE],
            live: vec![0; key_space.div_ceil(64) as usize],
            offset: 0,
        }
    }

    /// Applies `count` records, committing every `commit_bytes` or `commit_records`, whichever
    /// comes first; returns the bytes of keys and values ingested.
    fn apply(
        &mut self,
        store: &mut Store,
        count: u64,
        commit_records: u64,
        done: &AtomicU64,
    ) -> u64 {
        let mut ingested = 0;
        let mut since_commit = 0;
        for _ in 0..count {
            let k = self.rng.below(self.key_space);
            let key = format!("key-{k:012}");
            let stamp = self.rng.next_u64().to_le_bytes();
            self.value[..stamp.len()].copy_from_slice(&stamp);
            if self.rng.below(100) < TOMBSTONE_PERCENT {
                store.delete(key.as_bytes()).unwrap();
                self.live[(k / 64) as usize] &= !(1 << (k % 64));
                ingested += key.len() as u64;
            } else {
                store.put(key.as_bytes(), &self.value, 0).unwrap();
                self.live[(k / 64) as usize] |= 1 << (k % 64);
                ingested += (key.len() + self.value.len()) as u64;
            }
            since_commit += 1;
            if store.uncommitted_bytes() >= COMMIT_BYTES || since_commit >= commit_records {
                store.commit(self.offset).unwrap();
                done.fetch_add(since_commit, Relaxed);
                since_commit = 0;
            }
            self.offset += 1;
        }
        if since_commit > 0 {
            store.commit(self.offset - 1).unwrap();
            done.fetch_add(since_commit, Relaxed);
        }
        ingested
    }

    fn live_keys(&self) -> usize {
        self.live.iter().map(|w| w.count_ones() as usize).sum()
    }
}

/// What `/proc/self` says: CPU seconds, peak RSS, and bytes the process had written to storage
/// (less what was deleted before it reached the disk).
fn proc_self() -> (f64, u64, u64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let cpu = (fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap()) / ticks;
    let field = |text: &str, name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let io = std::fs::read_to_string("/proc/self/io").unwrap();
    let written = field(&io, "write_bytes:").saturating_sub(field(&io, "cancelled_write_bytes:"));
    (cpu, field(&status, "VmHWM:") * 1024, written)
}

/// RocksDB's cumulative write stall of a store, in seconds, from its "Cumulative stall" line.
fn stall_seconds(store: &Store) -> f64 {
    let stats = store.property("rocksdb.dbstats").unwrap_or_default();
    let Some(line) = stats.lines().find(|l| l.starts_with("Cumulative stall:")) else {
        return 0.0;
    };
    // "Cumulative stall: 00:00:1.234 H:M:S, 0.5 percent"
    let hms = line.split_whitespace().nth(2).unwrap_or("0:0:0");
    hms.split(':')
        .filter_map(|p| p.parse::<f64>().ok())
        .fold(0.0, |total, part| total * 60.0 + part)
}

/// The store options of a candidate, and whether it defers compaction for the whole load.
fn options_for(style: &str) -> (StoreOptions, bool) {
    let config = Config::parse(
        "kafka:\n  bootstrap.servers: unused:9092\nstores:\n  - name: bench\n    changelog: bench\n",
        None,
    )
    .unwrap();
    let mut options = config.store_options();
    let (compaction_style, deferred) = match style {
        "leveled" => (CompactionStyle::Leveled, false),
        "universal" => (CompactionStyle::Universal, false),
        "bulk" => (CompactionStyle::Universal, true),
        other => panic!("unknown style {other}"),
    };
    options.rocksdb.compaction_style = Some(compaction_style);
    (options, deferred)
}

fn open(dir: &Path, partition: i32, options: &StoreOptions) -> Store {
    let paths = StorePaths::new(dir, STORE, partition);
    let tp = TopicPartition::new("bench-changelog", partition);
    Store::open(paths, tp, options, UncleanPolicy::Wipe, None)
        .unwrap()
        .0
}

/// Opens `stores` stores as caught-up partitions and reports the process's CPU while they idle.
fn idle(dir: &Path, stores: u64, window: Duration) {
    let (options, _) = options_for("universal");
    let opened: Vec<Store> = (0..stores)
        .map(|p| {
            let mut store = open(dir, p as i32, &options);
            store.put(b"key", b"value", 0).unwrap();
            store.commit(0).unwrap();
            store.flush().unwrap();
            store
        })
        .collect();
    // `--idle-seconds 0` opens and closes the stores only, to time or profile that.
    if !window.is_zero() {
        // As `bench` does for `run`: what opening set off settles before the window.
        std::thread::sleep(Duration::from_secs(2));
        let (before, ..) = proc_self();
        std::thread::sleep(window);
        let (after, ..) = proc_self();
        println!(
            "{stores} open stores, idle, nothing else in the process: {:.1}% of one core over {} s",
            (after - before) / window.as_secs_f64() * 100.0,
            window.as_secs()
        );
    }
    for store in opened {
        let applied = store.applied();
        store.close(applied).unwrap();
    }
}

/// Runs one candidate in this process and prints its figures as one `result` line.
fn candidate(style: &str, dir: &Path, records: u64, partitions: u64) {
    let (options, deferred) = options_for(style);
    let done = Arc::new(AtomicU64::new(0));
    let total = records * partitions;
    let started = Instant::now();
    // The moments the whole load passed 10% and 90% of its records.
    let marks = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut marks = [None, None];
            while done.load(Relaxed) < total {
                let now = started.elapsed().as_secs_f64();
                let d = done.load(Relaxed);
                if marks[0].is_none() && d * 10 >= total {
                    marks[0] = Some(now);
                }
                if marks[1].is_none() && d * 10 >= total * 9 {
                    marks[1] = Some(now);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            marks
        })
    };
    let loads: Vec<_> = (0..partitions)
        .map(|p| {
            let (options, done, dir) = (options.clone(), done.clone(), dir.to_path_buf());
            std::thread::spawn(move || {
                let mut store = open(&dir, p as i32, &options);
                if deferred {
                    store.defer_compaction().unwrap();
                }
                let mut changelog = Changelog::new(p + 1, records);
                let ingested = changelog.apply(&mut store, records, u64::MAX, &done);
                store.flush().unwrap();
                let stall = stall_seconds(&store);
                (store, changelog, ingested, stall)
            })
        })
        .collect();
    let mut loaded: Vec<_> = loads.into_iter().map(|h| h.join().unwrap()).collect();
    let loaded_at = started.elapsed().as_secs_f64();
    if deferred {
        let compactions: Vec<_> = loaded
            .into_iter()
            .map(|mut l| {
                std::thread::spawn(move || {
                    l.0.compact().unwrap();
                    l
                })
            })
            .collect();
        loaded = compactions.into_iter().map(|h| h.join().unwrap()).collect();
    }
    let load_seconds = started.elapsed().as_secs_f64();
    let marks = marks.join().unwrap();
    let (cpu, peak_rss, written) = proc_self();
    let ingested: u64 = loaded.iter().map(|l| l.2).sum();
    let stall: f64 = loaded.iter().map(|l| l.3).sum();
    let first = total as f64 / 10.0 / marks[0].unwrap_or(loaded_at);
    let last = total as f64 / 10.0 / (loaded_at - marks[1].unwrap_or(0.0)).max(1e-3);
    let size: u64 = loaded.iter().map(|l| l.0.disk_bytes()).sum();

    // Tailing: 10% more records, committed a hundred at a time.
    let tail_records = records / 10;
    let tail_started = Instant::now();
    let tails: Vec<_> = loaded
        .drain(..)
        .map(|(mut store, mut changelog, ..)| {
            let done = Arc::new(AtomicU64::new(0));
            std::thread::spawn(move || {
                let ingested = changelog.apply(&mut store, tail_records, TAIL_COMMIT, &done);
                store.flush().unwrap();
                let applied = store.applied();
                store.close(applied).unwrap();
                (changelog, ingested)
            })
        })
        .collect();
    let tailed: Vec<_> = tails.into_iter().map(|h| h.join().unwrap()).collect();
    let tail_seconds = tail_started.elapsed().as_secs_f64();
    let (_, _, written_after) = proc_self();
    let tail_ingested: u64 = tailed.iter().map(|t| t.1).sum();

    // An application with the other style's options opens each store, writes and reads it whole.
    let other = if style == "leveled" {
        "universal"
    } else {
        "leveled"
    };
    let (other_options, _) = options_for(other);
    for (p, (changelog, _)) in tailed.iter().enumerate() {
        let mut store = open(dir, p as i32, &other_options);
        let applied = store.applied().expect("a committed store");
        store.put(b"opened-by-the-other", b"x", 0).unwrap();
        store.commit(applied).unwrap();
        store.compact().unwrap();
        let keys = store.count_keys().unwrap();
        assert_eq!(
            keys,
            changelog.live_keys() + 1,
            "{style} store {p} read under {other}"
        );
        store.close(Some(applied)).unwrap();
    }

    println!(
        "result {style} load_s={load_seconds:.1} compaction_s={:.1} first={first:.0} last={last:.0} \
         cpu_per_m={:.2} stall_s={stall:.1} wamp={:.2} size={} rss={} tail_rate={:.0} tail_wamp={:.2} opens_under={other}",
        load_seconds - loaded_at,
        cpu / (total as f64 / 1e6),
        written as f64 / ingested as f64,
        size,
        peak_rss,
        (tail_records * partitions) as f64 / tail_seconds,
        written_after.saturating_sub(written) as f64 / tail_ingested as f64,
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let records = number(&args, "--records", 2_000_000);
    let partitions = number(&args, "--partitions", 1);
    if arg(&args, "--idle").is_some() {
        let stores = number(&args, "--idle", 0);
        let seconds = number(&args, "--idle-seconds", 30);
        let dir = arg(&args, "--dir").unwrap_or(".");
        let root = tempfile::Builder::new()
            .prefix("store-idle-")
            .tempdir_in(dir)
            .unwrap_or_else(|e| {
                eprintln!("store_load: cannot make a directory in --dir {dir}: {e}");
                std::process::exit(2)
            });
        idle(root.path(), stores, Duration::from_secs(seconds));
        return;
    }
    if let Some(style) = arg(&args, "--only") {
        let dir = PathBuf::from(arg(&args, "--dir").expect("--dir"));
        candidate(style, &dir, records, partitions);
        return;
    }
    let styles = arg(&args, "--styles").unwrap_or("leveled,universal,bulk");
    let root = tempfile::Builder::new()
        .prefix("store-load-")
        .tempdir_in(arg(&args, "--dir").unwrap_or("."))
        .unwrap();
    println!(
        "{partitions} partition(s) of {records} records, {VALUE_SIZE}-byte values, key space of half the records"
    );
    println!(
        "| candidate | load s | final compaction s | first 10% rec/s | last 10% rec/s | CPU s / M | stall s | write amp | size on disk | peak RSS | tail rec/s | tail write amp |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for style in styles.split(',') {
        let dir = root.path().join(style);
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--only", style, "--dir", dir.to_str().unwrap()])
            .args(["--records", &records.to_string()])
            .args(["--partitions", &partitions.to_string()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&output.stdout);
        let Some(line) = text.lines().find(|l| l.starts_with("result ")) else {
            panic!(
                "{style} failed: {text}{}",
                String::from_utf8_lossy(&output.stderr)
            );
        };
        let field = |name: &str| -> f64 {
            line.split_whitespace()
                .find_map(|f| f.strip_prefix(&format!("{name}=")))
                .and_then(|v| v.parse().ok())
                .unwrap_or(f64::NAN)
        };
        println!(
            "| {style} | {:.1} | {:.1} | {:.0} | {:.0} | {:.2} | {:.1} | {:.2} | {:.0} MiB | {:.0} MiB | {:.0} | {:.2} |",
            field("load_s"),
            field("compaction_s"),
            field("first"),
            field("last"),
            field("cpu_per_m"),
            field("stall_s"),
            field("wamp"),
            field("size") / 1048576.0,
            field("rss") / 1048576.0,
            field("tail_rate"),
            field("tail_wamp"),
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
