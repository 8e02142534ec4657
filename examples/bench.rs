//! The benchmark harness: on one generated changelog, in one invocation, it measures
//! (a) the fetch limit: librdkafka consuming every partition into memory, with its CPU seconds
//!     (taken in batches from each partition's queue, as warmstore takes them),
//! (b) the write limit: RocksDB loading the same records as WriteBatches with WAL off, with its CPU,
//! (c) warmstore from empty to caught up: records/s, CPU seconds per million records, peak RSS,
//! (d) warmstore resuming after a clean stop with 10% new records,
//! (e) the peer, Quix Streams' recovery (`bench/quix_peer.py`) on a copy of the same changelog,
//! and, with `--rss-records N`, (c) again on a changelog of N records for the memory comparison, and
//! with `--compressed CODEC,...`, (a), (b), (c) and (e) again on the same changelog produced with
//! each codec, and with `--one-core`, (c) again pinned to the first core (as `taskset -c 0`), then
//! one copy of (c) per core at once, each pinned to its own: work that shares nothing, so its rate
//! over the pinned run's is the most "N cores / one core" this machine and broker allow.
//! CPU(c) / (CPU(a) + CPU(b)) is the pipeline's overhead: what fetching and writing
//! together cost beyond each alone.
//! With `--scale P1,P2,...` it measures only (c) on a changelog of the same records spread over each
//! partition count, adding what many partitions cost: threads and open descriptors once caught up,
//! and the CPU of 10 idle seconds of tailing (`--idle-seconds S`); `--baseline BIN` runs another
//! warmstore binary
//! (an older build) interleaved with this one, on the same changelog.
//! With `--large RECORDSxPARTITIONS,...` it measures (a), (c) and (e) on each large changelog, with
//! (c)'s rate over its first and last 10%, its write amplification and the disk its stores take.
//! The broker is the mock cluster hosted by the `mock_broker` example in its own process, so its CPU
//! is not counted as warmstore's. The mock cluster keeps only about 5 MiB per partition; with
//! `--broker HOST:PORT` the same process fills a topic of an existing Kafka broker instead
//! (docs/testing.md says how to run one), and deletes it at the end.
//!
//! `--help` prints the usage.

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

const TOPIC: &str = "bench-changelog";

const USAGE: &str =
    "usage: cargo run --release --example bench -- [--records N] [--partitions P] [--value-size B]
       [--rss-records N] [--compressed CODEC,...] [--one-core] [--kafka key=value ...] [--no-peer]
       [--scale P1,P2,... [--baseline BIN] [--idle-seconds S]] [--large RECORDSxPARTITIONS,...]
       [--broker HOST:PORT]";

/// Flags followed by a value, and flags alone.
const TAKES_VALUE: [&str; 11] = [
    "--records",
    "--partitions",
    "--value-size",
    "--rss-records",
    "--compressed",
    "--kafka",
    "--scale",
    "--baseline",
    "--idle-seconds",
    "--large",
    "--broker",
];
const SWITCHES: [&str; 2] = ["--one-core", "--no-peer"];

/// A run takes minutes, so `--help` or a misspelt flag must not start one: the usage instead,
/// on stdout for `--help` (exit 0) and on stderr naming the flag otherwise (exit 2).
fn check_args(args: &[String]) {
    let mut rest = args.iter().skip(1);
    while let Some(a) = rest.next() {
        if a == "--help" || a == "-h" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let problem = if TAKES_VALUE.contains(&a.as_str()) {
            rest.next().is_none().then(|| format!("{a} takes a value"))
        } else if SWITCHES.contains(&a.as_str()) {
            None
        } else {
            Some(format!("unknown argument {a}"))
        };
        if let Some(problem) = problem {
            eprintln!("error: {problem}\n{USAGE}");
            std::process::exit(2);
        }
    }
}

fn arg(args: &[String], name: &str, default: u64) -> u64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} must be a number"))
        })
        .unwrap_or(default)
}

fn exe_dir() -> PathBuf {
    std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf()
}

struct Broker {
    child: Child,
    /// Closed on drop, so that the broker process deletes the topics it made on a real broker.
    stdin: Option<ChildStdin>,
    out: BufReader<std::process::ChildStdout>,
    bootstrap: String,
    /// The codec the changelog was produced with; the peer's copy is produced with it too.
    compression: String,
}

/// The Kafka broker every run reads: the mock cluster by default, or with `--broker HOST:PORT` an
/// existing Kafka broker, which the `mock_broker` process fills in the same way.
#[derive(Clone, Copy)]
struct Source<'a> {
    real: Option<&'a str>,
    value_size: u64,
}

impl Broker {
    fn start(source: Source, records: u64, partitions: u64) -> Broker {
        Broker::start_compressed(source, records, partitions, "none")
    }

    /// A broker whose changelog was produced with `compression` (a librdkafka codec name).
    fn start_compressed(
        source: Source,
        records: u64,
        partitions: u64,
        compression: &str,
    ) -> Broker {
        let value_size = source.value_size;
        let mut command = Command::new(exe_dir().join("mock_broker"));
        if let Some(real) = source.real {
            command.args(["--broker", real]);
        }
        let mut child = command
            .args(["--topic", TOPIC, "--records", &records.to_string()])
            .args(["--compression", compression])
            .args([
                "--partitions",
                &partitions.to_string(),
                "--value-size",
                &value_size.to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the mock_broker example is built beside this one");
        let stdin = child.stdin.take().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut bootstrap = String::new();
        loop {
            let mut line = String::new();
            if out.read_line(&mut line).unwrap() == 0 {
                break;
            }
            let line = line.trim_end();
            if let Some(b) = line.strip_prefix("bootstrap=") {
                bootstrap = b.to_string();
            }
            if line == "ready" {
                break;
            }
        }
        assert!(!bootstrap.is_empty(), "mock broker did not start");
        Broker {
            child,
            stdin: Some(stdin),
            out,
            bootstrap,
            compression: compression.to_string(),
        }
    }

    fn command(&mut self, command: &str) {
        writeln!(self.stdin.as_mut().unwrap(), "{command}").unwrap();
        let mut answer = String::new();
        self.out.read_line(&mut answer).unwrap();
        assert_eq!(answer.trim(), "ok", "{command}");
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let until = Instant::now() + Duration::from_secs(60);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// (a): consume everything; returns (records, bytes, seconds) and, with `keep`, the records, which
/// (b) writes. Without `keep` (large changelogs) the records are only counted.
type Records = Vec<Vec<(Vec<u8>, Option<Vec<u8>>)>>;

fn fetch_limit(bootstrap: &str, partitions: u64, keep: bool) -> (u64, u64, f64, Records) {
    use warmstore::kafka::batch::{BatchQueue, Fetched, MAX_TAKEN};
    let mut config = warmstore::kafka::consumers::client_config(
        &[("bootstrap.servers".to_string(), bootstrap.to_string())].into(),
    );
    config.set("group.id", "bench-fetch");
    let consumer: std::sync::Arc<BaseConsumer> = std::sync::Arc::new(config.create().unwrap());
    let mut list = TopicPartitionList::new();
    let mut highs = Vec::new();
    // As warmstore takes records: each partition's queue split off and taken from in batches,
    // and a wake-up when one of them has records.
    let wake = std::sync::Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
    let mut queues = Vec::new();
    for p in 0..partitions as i32 {
        let (_, high) = consumer
            .fetch_watermarks(TOPIC, p, Duration::from_secs(10))
            .unwrap();
        highs.push(high);
        list.add_partition_offset(TOPIC, p, Offset::Beginning)
            .unwrap();
        let mut split = consumer.split_partition_queue(TOPIC, p).unwrap();
        let wake = wake.clone();
        split.set_nonempty_callback(move || {
            *wake.0.lock().unwrap() = true;
            wake.1.notify_one();
        });
        let batches = BatchQueue::new(&consumer, TOPIC, p).unwrap();
        queues.push((split, batches));
    }
    let mut records: Records = vec![Vec::new(); partitions as usize];
    let mut remaining = highs.iter().filter(|h| **h > 0).count();
    let (mut count, mut bytes) = (0u64, 0u64);
    let started = Instant::now();
    consumer.assign(&list).unwrap();
    while remaining > 0 {
        *wake.0.lock().unwrap() = false;
        let mut taken = 0;
        for (p, (_, batches)) in queues.iter().enumerate() {
            taken += batches.take(MAX_TAKEN, |fetched| {
                if let Fetched::Record {
                    offset, key, value, ..
                } = fetched
                {
                    let key = key.unwrap_or_default();
                    count += 1;
                    bytes += (key.len() + value.map_or(0, <[u8]>::len)) as u64;
                    if keep {
                        records[p].push((key.to_vec(), value.map(<[u8]>::to_vec)));
                    }
                    if offset + 1 == highs[p] {
                        remaining -= 1;
                    }
                }
                true
            });
        }
        if taken == 0 {
            let (woken, signal) = &*wake;
            let woken = woken.lock().unwrap();
            let _ = signal
                .wait_timeout_while(woken, Duration::from_millis(100), |w| !*w)
                .unwrap();
        }
    }
    (count, bytes, started.elapsed().as_secs_f64(), records)
}

/// (b): the same records into one RocksDB per partition, with warmstore's options, as WriteBatches
/// of about 1 MiB with WAL off.
fn write_limit(dir: &Path, records: &Records) -> f64 {
    let options = warmstore::store::StoreOptions::default();
    let started = Instant::now();
    for (p, partition) in records.iter().enumerate() {
        let (db_options, families) =
            options.db_options(warmstore::store::StoreType::KeyValue, true);
        let db = rocksdb::DB::open_cf_descriptors(&db_options, dir.join(p.to_string()), families)
            .unwrap();
        let mut write_options = rocksdb::WriteOptions::default();
        write_options.disable_wal(true);
        let mut batch = rocksdb::WriteBatch::default();
        for (k, v) in partition {
            match v {
                Some(v) => batch.put(k, v),
                None => batch.delete(k),
            }
            if batch.size_in_bytes() >= 1 << 20 {
                db.write_opt(std::mem::take(&mut batch), &write_options)
                    .unwrap();
            }
        }
        db.write_opt(batch, &write_options).unwrap();
        db.flush().unwrap();
    }
    started.elapsed().as_secs_f64()
}

struct Run {
    seconds: f64,
    cpu_seconds: f64,
    peak_rss: u64,
    records: u64,
    /// Threads and open descriptors of the process once caught up.
    threads: u64,
    fds: u64,
    /// Share of one core used while tailing with nothing new to read, when measured.
    idle_cpu: Option<f64>,
    /// (seconds since spawn, records restored), sampled every 250 ms when watched.
    progress: Vec<(f64, u64)>,
    /// Bytes the process wrote to disk (`/proc/PID/io`) until caught up.
    written: u64,
    /// Disk the stores take once warmstore has stopped.
    disk: u64,
}

/// What to watch in a run beyond the figures every run gives.
#[derive(Clone, Copy, Default)]
struct Watch {
    /// The CPU of this many seconds of tailing once caught up.
    idle: Option<Duration>,
    /// Pinned to this core alone, as `taskset -c N`.
    core: Option<usize>,
    /// Restore progress over time, for the rate of the first and the last 10%.
    progress: bool,
}

impl Run {
    fn rate(&self) -> f64 {
        self.records as f64 / self.seconds
    }

    /// Records, time, rate, CPU per million records and peak RSS, as every (c) line gives them.
    fn figures(&self) -> String {
        format!(
            "{} records in {:.2} s = {:.0} records/s, {:.2} CPU s per million records, peak RSS {:.1} MiB",
            self.records,
            self.seconds,
            self.rate(),
            self.cpu_seconds / (self.records as f64 / 1e6),
            mib(self.peak_rss)
        )
    }
}

fn proc_figures(pid: u32) -> (f64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let cpu = (fields
        .get(11)
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
        + fields
            .get(12)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0))
        / ticks;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let hwm = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024;
    (cpu, hwm)
}

fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::Read;
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return (0, String::new());
    };
    let _ = write!(s, "GET {path} HTTP/1.0\r\n\r\n");
    let mut r = String::new();
    let _ = s.read_to_string(&mut r);
    let status = r
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (
        status,
        r.split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default(),
    )
}

/// (c) and (d): `warmstore run` from spawn to `/readyz` 200 with `ready_max_lag: 0`.
fn warmstore_run(bootstrap: &str, state_dir: &Path, partitions: u64, kafka: &[String]) -> Run {
    let bin = exe_dir().parent().unwrap().join("warmstore");
    warmstore_run_with(
        &bin,
        bootstrap,
        state_dir,
        partitions,
        kafka,
        Watch::default(),
    )
}

/// One copy of (c) per core, all at once, each pinned to its own core and on its own state: work
/// that shares nothing inside a process, so their joint rate over one pinned copy's is what this
/// machine, its memory and the broker allow for "N cores / one core". Gives the records of all
/// copies and the seconds of the slowest.
fn copies_on_their_own_cores(
    bin: &Path,
    bootstrap: &str,
    work: &Path,
    partitions: u64,
    kafka: &[String],
) -> (u64, f64) {
    let runs: Vec<Run> = std::thread::scope(|s| {
        let copies: Vec<_> = (0..num_cpus())
            .map(|core| {
                let state = work.join(format!("state-core-{core}"));
                s.spawn(move || {
                    let watch = Watch {
                        core: Some(core),
                        ..Watch::default()
                    };
                    warmstore_run_with(bin, bootstrap, &state, partitions, kafka, watch)
                })
            })
            .collect();
        copies.into_iter().map(|c| c.join().unwrap()).collect()
    });
    (
        runs.iter().map(|r| r.records).sum(),
        runs.iter().map(|r| r.seconds).fold(0.0, f64::max),
    )
}

/// Threads (`/proc/PID/status`) and open descriptors (`/proc/PID/fd`) of a process.
fn threads_and_fds(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let threads = status
        .lines()
        .find(|l| l.starts_with("Threads:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64);
    (threads, fds)
}

/// `warmstore_run` with a given binary, watching what `watch` asks for.
fn warmstore_run_with(
    bin: &Path,
    bootstrap: &str,
    state_dir: &Path,
    partitions: u64,
    kafka: &[String],
    watch: Watch,
) -> Run {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let config = state_dir.with_extension("yaml");
    std::fs::write(
        &config,
        format!(
            "kafka:\n  bootstrap.servers: {bootstrap}\n{}state_dir: {}\nhttp:\n  listen: {addr}\nrestore:\n  ready_max_lag: 0\n{}stores:\n  - name: bench\n    changelog: {TOPIC}\n",
            kafka.iter().filter_map(|kv| kv.split_once('=')).map(|(k, v)| format!("  {k}: \"{v}\"\n")).collect::<String>(),
            state_dir.display(),
            std::env::var("WARMSTORE_BENCH_CONFIG").unwrap_or_default()
        ),
    )
    .unwrap();
    let started = Instant::now();
    let mut command = Command::new(bin);
    command
        .args(["run", "--config", config.to_str().unwrap()])
        .env("RUST_LOG", "warn");
    if let Some(core) = watch.core {
        // As `taskset -c N`: set before exec, so every thread warmstore starts inherits it.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(core, &mut set);
                if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = command.spawn().expect("warmstore is built");
    let mut progress = Vec::new();
    loop {
        let (status, _) = http_get(&addr, "/readyz");
        if status == 200 {
            break;
        }
        assert!(child.try_wait().unwrap().is_none(), "warmstore exited");
        let since = started.elapsed().as_secs_f64();
        if watch.progress && progress.last().is_none_or(|(t, _)| since - t >= 0.25) {
            if let Some(records) = restored(&addr) {
                progress.push((since, records));
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let seconds = started.elapsed().as_secs_f64();
    let (cpu_seconds, peak_rss) = proc_figures(child.id());
    let written = written_bytes(child.id());
    let (threads, fds) = threads_and_fds(child.id());
    let idle_cpu = watch.idle.map(|idle| {
        // The first catch-up's flushes and the turn hand-over settle before the idle window.
        std::thread::sleep(Duration::from_secs(2));
        let (before, _) = proc_figures(child.id());
        std::thread::sleep(idle);
        let (after, _) = proc_figures(child.id());
        (after - before) / idle.as_secs_f64()
    });
    let (_, stores) = http_get(&addr, "/stores");
    let stores: serde_json::Value = serde_json::from_str(&stores).unwrap();
    assert_eq!(
        stores["partitions"].as_array().unwrap().len() as u64,
        partitions
    );
    let records = restored(&addr).unwrap();
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success(), "warmstore exits 0 on SIGTERM");
    Run {
        seconds,
        cpu_seconds,
        peak_rss,
        records,
        threads,
        fds,
        idle_cpu,
        progress,
        written,
        disk: disk_bytes(state_dir),
    }
}

/// Records restored so far over every partition, from `/stores`.
fn restored(addr: &str) -> Option<u64> {
    let (_, stores) = http_get(addr, "/stores");
    let stores: serde_json::Value = serde_json::from_str(&stores).ok()?;
    stores["partitions"]
        .as_array()?
        .iter()
        .map(|p| p["records"].as_u64())
        .sum()
}

/// Bytes a process has caused to be written to disk (`write_bytes` of `/proc/PID/io`).
fn written_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("write_bytes:")?.trim().parse().ok())
        .unwrap_or(0)
}

/// Disk allocated to the files under `dir`, as `du` counts it.
fn disk_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => disk_bytes(&e.path()),
            Ok(m) => m.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}

/// `--scale`: (c) at each partition count on the same records, with threads, descriptors and idle
/// CPU; with a baseline binary, each run of it is interleaved with one of this build.
fn scale(
    source: Source,
    records: u64,
    counts: &[u64],
    baseline: Option<&Path>,
    idle: Duration,
    work: &Path,
) {
    let this = exe_dir().parent().unwrap().join("warmstore");
    let mut binaries = vec![("this build", this.as_path())];
    if let Some(baseline) = baseline {
        binaries.insert(0, ("baseline", baseline));
    }
    let mut rates = Vec::new();
    // Every run's stores stay until the end of the invocation. Deleting one run's thousands of
    // files just before the next run created its own made the second run pay for the first: on an
    // ext4 without a journal the kernel skips, for each new file, the free inodes deleted in the
    // last minute or more (`recently_deleted`; a fifth to a third of a 1,000-partition restore's
    // CPU in profiles), so the binary that ran second looked slower.
    let mut kept = Vec::new();
    for &partitions in counts {
        let broker = Broker::start(source, records, partitions);
        for (name, bin) in &binaries {
            let state = work.join(format!("scale-{partitions}-{}", name.replace(' ', "-")));
            let run = warmstore_run_with(
                bin,
                &broker.bootstrap,
                &state,
                partitions,
                &[],
                Watch {
                    idle: Some(idle),
                    ..Watch::default()
                },
            );
            println!(
                "(c) {partitions} partitions, {name}: {}; {} threads, {} open fds ({:.1} per partition), idle CPU {:.1}% of a core",
                run.figures(),
                run.threads,
                run.fds,
                run.fds as f64 / partitions as f64,
                run.idle_cpu.unwrap_or(0.0) * 100.0
            );
            rates.push((partitions, *name, run.rate()));
            kept.push(state);
        }
    }
    for state in kept {
        let _ = std::fs::remove_dir_all(state);
    }
    for (name, _) in &binaries {
        let of = |p: u64| rates.iter().find(|r| r.0 == p && r.1 == *name).map(|r| r.2);
        if let (Some(first), Some(last)) = (of(counts[0]), of(*counts.last().unwrap())) {
            println!(
                "ratio of the rate at {} partitions to {} partitions, {name}: {:.2}",
                counts.last().unwrap(),
                counts[0],
                last / first
            );
        }
    }
    if baseline.is_some() {
        for &p in counts {
            let of = |n: &str| rates.iter().find(|r| r.0 == p && r.1 == n).map(|r| r.2);
            if let (Some(new), Some(old)) = (of("this build"), of("baseline")) {
                println!(
                    "ratio this build / baseline at {p} partitions: {:.2}",
                    new / old
                );
            }
        }
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    check_args(&args);
    let records = arg(&args, "--records", 2_000_000);
    let partitions = arg(&args, "--partitions", 64);
    let value_size = arg(&args, "--value-size", 100);
    let rss_records = arg(&args, "--rss-records", 0);
    // Extra librdkafka properties for warmstore, as `--kafka key=value` (repeatable).
    let kafka: Vec<String> = args
        .windows(2)
        .filter(|w| w[0] == "--kafka")
        .map(|w| w[1].clone())
        .collect();
    let broker = args
        .iter()
        .position(|a| a == "--broker")
        .and_then(|i| args.get(i + 1));
    let source = Source {
        real: broker.map(String::as_str),
        value_size,
    };
    let work = std::env::temp_dir().join(format!("warmstore-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    println!("machine: {} cores, {} MiB memory", num_cpus(), mem_mib());
    if let Some(counts) = args
        .iter()
        .position(|a| a == "--scale")
        .and_then(|i| args.get(i + 1))
    {
        let counts: Vec<u64> = counts
            .split(',')
            .map(|c| {
                c.parse()
                    .expect("--scale takes partition counts, as 64,300,1000")
            })
            .collect();
        let baseline = args
            .iter()
            .position(|a| a == "--baseline")
            .and_then(|i| args.get(i + 1))
            .map(PathBuf::from);
        println!("changelog: {records} records over each partition count, 16-byte keys over {} keys, {value_size}-byte values, 5% tombstones", records / 2);
        let idle = Duration::from_secs(arg(&args, "--idle-seconds", 10));
        scale(source, records, &counts, baseline.as_deref(), idle, &work);
        let _ = std::fs::remove_dir_all(&work);
        return;
    }
    let peer = !args.iter().any(|a| a == "--no-peer");
    if let Some(shapes) = args
        .iter()
        .position(|a| a == "--large")
        .and_then(|i| args.get(i + 1))
    {
        for shape in shapes.split(',') {
            let (records, partitions) = shape
                .split_once('x')
                .and_then(|(r, p)| Some((r.parse().ok()?, p.parse().ok()?)))
                .expect("--large takes RECORDSxPARTITIONS shapes, as 20000000x1,10000000x4");
            large(source, records, partitions, &kafka, peer, &work.join(shape));
        }
        let _ = std::fs::remove_dir_all(&work);
        return;
    }
    println!("changelog: {records} records, {partitions} partitions, 16-byte keys over {} keys, {value_size}-byte values, 5% tombstones", records / 2);

    let mut broker = Broker::start(source, records, partitions);
    let plain = limits(&mut broker, &work, "", partitions, &kafka, peer);
    // Before (d) adds records, so both runs read the same changelog.
    if args.iter().any(|a| a == "--one-core") {
        let bin = exe_dir().parent().unwrap().join("warmstore");
        let state = work.join("state-one-core");
        let one = warmstore_run_with(
            &bin,
            &broker.bootstrap,
            &state,
            partitions,
            &kafka,
            Watch {
                core: Some(0),
                ..Watch::default()
            },
        );
        println!("(c) pinned to one core: {}", one.figures());
        println!(
            "ratio (c) on {} cores / (c) on one core: {:.2}",
            num_cpus(),
            plain.c.rate() / one.rate()
        );
        let (copied, slowest) =
            copies_on_their_own_cores(&bin, &broker.bootstrap, &work, partitions, &kafka);
        println!(
            "ceiling, {} copies of (c) at once, each pinned to a core of its own: {copied} records in all in {slowest:.2} s; their rate over (c) on one core: {:.2}",
            num_cpus(),
            copied as f64 / slowest / one.rate()
        );
    }
    broker.command(&format!("produce {}", records / 10));
    let d = warmstore_run(&broker.bootstrap, &work.join("state"), partitions, &kafka);
    println!(
        "(d) warmstore resume with 10% new records: {} records in {:.2} s to caught up",
        d.records, d.seconds
    );
    drop(broker);
    plain.print_ratios("");
    let c = plain.c;

    // `--compressed zstd,lz4`: the same figures on the changelog produced with each codec.
    let codecs = args
        .iter()
        .position(|a| a == "--compressed")
        .and_then(|i| args.get(i + 1))
        .map(|list| list.split(',').collect::<Vec<_>>())
        .unwrap_or_default();
    for codec in codecs {
        let mut broker = Broker::start_compressed(source, records, partitions, codec);
        let label = format!(" on the {codec} changelog");
        let z = limits(
            &mut broker,
            &work.join(codec),
            &label,
            partitions,
            &kafka,
            peer,
        );
        z.print_ratios(&label);
        println!(
            "ratio (c){label} / (c) uncompressed: {:.2}",
            z.c.rate() / c.rate()
        );
    }

    if rss_records > 0 {
        let broker = Broker::start(source, rss_records, partitions);
        let small = warmstore_run(
            &broker.bootstrap,
            &work.join("state-rss"),
            partitions,
            &kafka,
        );
        println!(
            "(c) at {rss_records} records: peak RSS {:.1} MiB; at {records}: {:.1} MiB; ratio {:.2}",
            mib(small.peak_rss),
            mib(c.peak_rss),
            c.peak_rss as f64 / small.peak_rss as f64
        );
    }
    let _ = std::fs::remove_dir_all(&work);
}

/// (a), (b), (c) and (e) on one changelog.
struct Limits {
    a_rate: f64,
    a_cpu: f64,
    b_rate: f64,
    b_cpu: f64,
    c: Run,
    e_rate: Option<f64>,
}

impl Limits {
    /// The ratios the targets are stated in; `label` names the changelog ("" for the plain one).
    fn print_ratios(&self, label: &str) {
        println!(
            "ratio c / min(a, b){label}: {:.2}",
            self.c.rate() / self.a_rate.min(self.b_rate)
        );
        // What running fetch and write together costs beyond each alone (1.0: nothing).
        println!(
            "pipeline overhead{label}, CPU(c) / (CPU(a) + CPU(b)): {:.2}",
            self.c.cpu_seconds / (self.a_cpu + self.b_cpu)
        );
        if let Some(e_rate) = self.e_rate {
            println!("ratio c / e{label}: {:.1}", self.c.rate() / e_rate);
        }
    }
}

/// Measures and prints (a), (b), (c) and, with `peer`, (e) on the broker's changelog; `label`
/// names the changelog in every line ("" for the plain one). Stores go under `work`.
fn limits(
    broker: &mut Broker,
    work: &Path,
    label: &str,
    partitions: u64,
    kafka: &[String],
    peer: bool,
) -> Limits {
    std::fs::create_dir_all(work).unwrap();
    let own_cpu = || proc_figures(std::process::id()).0;
    let a = measure_fetch(&broker.bootstrap, partitions, true, label);
    let (a_records, a_rate, a_cpu, data) = (a.records, a.rate, a.cpu, a.data);
    let per_million = |cpu: f64| cpu / (a_records as f64 / 1e6);
    let before_b = own_cpu();
    let b_secs = write_limit(&work.join("write-limit"), &data);
    let b_cpu = own_cpu() - before_b;
    drop(data);
    let b_rate = a_records as f64 / b_secs;
    println!(
        "(b) write limit{label}: {a_records} records in {b_secs:.2} s = {b_rate:.0} records/s, {:.2} CPU s per million records",
        per_million(b_cpu)
    );
    let c = warmstore_run(&broker.bootstrap, &work.join("state"), partitions, kafka);
    println!("(c) warmstore empty to caught up{label}: {}", c.figures());
    let e_rate = if peer {
        Some(measure_peer(broker, &work.join("quix"), partitions, label))
    } else {
        println!("(e) peer{label}: skipped (--no-peer)");
        None
    };
    Limits {
        a_rate,
        a_cpu,
        b_rate,
        b_cpu,
        c,
        e_rate,
    }
}

/// `--large RECORDSxPARTITIONS`: (a), (c) and (e) on one large changelog, with (c)'s rate over its
/// first and last 10%, its writes against the bytes it ingested, and the disk its stores take.
/// (b) is left out: its records would have to be held in memory; `examples/store_load.rs` measures
/// the store alone at these sizes.
fn large(source: Source, records: u64, partitions: u64, kafka: &[String], peer: bool, work: &Path) {
    println!(
        "changelog: {records} records, {partitions} partitions, 16-byte keys over {} keys, {}-byte values, 5% tombstones, on {}",
        records / 2,
        source.value_size,
        source.real.map_or("the mock cluster".to_string(), |b| format!("the broker at {b}"))
    );
    std::fs::create_dir_all(work).unwrap();
    let produced = Instant::now();
    let mut broker = Broker::start(source, records, partitions);
    println!("produced in {:.0} s", produced.elapsed().as_secs_f64());
    let label = format!(" ({records} x {partitions})");
    let a = measure_fetch(&broker.bootstrap, partitions, false, &label);
    let bin = exe_dir().parent().unwrap().join("warmstore");
    let c = warmstore_run_with(
        &bin,
        &broker.bootstrap,
        &work.join("state"),
        partitions,
        kafka,
        Watch {
            progress: true,
            ..Watch::default()
        },
    );
    println!("(c) warmstore empty to caught up{label}: {}", c.figures());
    let (first, last) = tenths(&c.progress, c.records, c.seconds);
    println!("(c){label} records/s over the first 10%: {first:.0}, over the last 10%: {last:.0}");
    println!(
        "(c){label} wrote {:.2} GB until caught up for {:.2} GB of keys and values ingested: write amplification {:.2}; stores on disk after stop {:.2} GB",
        c.written as f64 / 1e9,
        a.bytes as f64 / 1e9,
        c.written as f64 / a.bytes as f64,
        c.disk as f64 / 1e9
    );
    let _ = std::fs::remove_dir_all(work.join("state"));
    println!("ratio c / a{label}: {:.2}", c.rate() / a.rate);
    if peer {
        let e_rate = measure_peer(&mut broker, &work.join("quix"), partitions, &label);
        println!("ratio c / e{label}: {:.1}", c.rate() / e_rate);
        let _ = std::fs::remove_dir_all(work.join("quix"));
    }
}

/// Records/s over the first and the last tenth of a restore of `total` records that took
/// `seconds`, from progress samples (seconds since start, records restored so far); a tenth's
/// bound is placed by linear interpolation between the samples around it.
fn tenths(progress: &[(f64, u64)], total: u64, seconds: f64) -> (f64, f64) {
    let mut points = vec![(0.0, 0u64)];
    points.extend_from_slice(progress);
    points.push((seconds, total));
    let at = |target: f64| -> f64 {
        for pair in points.windows(2) {
            let ((t0, r0), (t1, r1)) = (pair[0], pair[1]);
            if r1 as f64 >= target && r1 > r0 {
                let share = (target - r0 as f64) / (r1 - r0) as f64;
                return t0 + share.clamp(0.0, 1.0) * (t1 - t0);
            }
        }
        seconds
    };
    let tenth = total as f64 / 10.0;
    (
        tenth / at(tenth),
        tenth / (seconds - at(total as f64 - tenth)),
    )
}

/// What (a) measured.
struct Fetch {
    records: u64,
    bytes: u64,
    rate: f64,
    /// CPU seconds of this process over the fetch.
    cpu: f64,
    /// The records, when kept for (b).
    data: Records,
}

/// (a) on the broker's changelog, printed under `label`; `keep` holds the records for (b).
fn measure_fetch(bootstrap: &str, partitions: u64, keep: bool, label: &str) -> Fetch {
    let own_cpu = || proc_figures(std::process::id()).0;
    let before = own_cpu();
    let (records, bytes, seconds, data) = fetch_limit(bootstrap, partitions, keep);
    let cpu = own_cpu() - before;
    let rate = records as f64 / seconds;
    println!(
        "(a) fetch limit{label}: {records} records in {seconds:.2} s = {rate:.0} records/s, {:.1} MB/s, {:.2} CPU s per million records",
        bytes as f64 / seconds / 1e6,
        cpu / (records as f64 / 1e6)
    );
    Fetch {
        records,
        bytes,
        rate,
        cpu,
        data,
    }
}

/// (e) on the broker's changelog, printed under `label`; returns records/s.
fn measure_peer(broker: &mut Broker, state_dir: &Path, partitions: u64, label: &str) -> f64 {
    let (records, seconds) = quix_peer(broker, state_dir, partitions);
    let rate = records as f64 / seconds;
    println!("(e) peer, Quix Streams recovery{label}: {records} records in {seconds:.2} s = {rate:.0} records/s");
    rate
}

/// (e): `bench/quix_peer.py` copies the changelog into a topic of its own with Quix's header
/// (untimed), then times Quix's recovery; returns (records, seconds).
fn quix_peer(broker: &mut Broker, state_dir: &Path, partitions: u64) -> (u64, f64) {
    const QUIX_TOPIC: &str = "bench-changelog-quix";
    broker.command(&format!("create {QUIX_TOPIC} {partitions}"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/quix_peer.py");
    let output = Command::new("python3")
        .env("PYTHONWARNINGS", "ignore")
        .arg(&script)
        .args(["--bootstrap", &broker.bootstrap, "--topic", TOPIC])
        .args(["--compression", &broker.compression])
        .args([
            "--quix-topic",
            QUIX_TOPIC,
            "--partitions",
            &partitions.to_string(),
        ])
        .arg("--state-dir")
        .arg(state_dir)
        .stderr(Stdio::inherit())
        .output()
        .expect("python3 runs bench/quix_peer.py (pip install quixstreams)");
    assert!(
        output.status.success(),
        "the Quix peer failed, its error above (`pip install quixstreams` installs it; --no-peer skips it)"
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    let field = |name: &str| {
        last.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in the peer's output: {last}"))
            .to_string()
    };
    (
        field("records=").parse().unwrap(),
        field("seconds=").parse().unwrap(),
    )
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn mem_mib() -> u64 {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    info.lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0)
        / 1024
}
