//! The benchmark harness: on one generated changelog, in one invocation, it measures
//! (a) the fetch limit: librdkafka consuming every partition into memory, with its CPU seconds
//!     (taken in batches from each partition's queue, as warmstore takes them),
//! (b) the write limit: RocksDB loading the same records as WriteBatches with WAL off, with its CPU,
//! (c) warmstore from empty to caught up: records/s, CPU seconds per million records, peak RSS,
//! (d) warmstore resuming after a clean stop with 10% new records,
//! (e) the peer, Quix Streams' recovery (`bench/quix_peer.py`) on a copy of the same changelog,
//! and, with `--rss-records N`, (c) again on a changelog of N records for the memory comparison, and
//! with `--compressed CODEC,...`, (a), (b), (c) and (e) again on the same changelog produced with
//! each codec, and with `--one-core`, (c) again pinned to the first core (as `taskset -c 0`), with
//! how busy each run kept its cores and the CPU of each kind of thread (`--rounds N` pairs the two N
//! times, alternating which runs first, and gives the median ratio), then one copy of (c) per core
//! at once, each pinned to its own: work that shares nothing, so its rate over the pinned run's is
//! the most "N cores / one core" this machine and broker allow.
//! CPU(c) / (CPU(a) + CPU(b)) is the pipeline's overhead: what fetching and writing
//! together cost beyond each alone.
//! With `--scale P1,P2,...` it measures only (c) on a changelog of the same records spread over each
//! partition count, adding what many partitions cost: threads and open descriptors once caught up,
//! and the CPU of 10 idle seconds of tailing (`--idle-seconds S`); `--baseline BIN` runs another
//! warmstore binary (an older build) interleaved with this one, on the same changelog, and
//! `--rounds N` does so N times, alternating which of the two runs first.
//! With `--large RECORDSxPARTITIONS,...` it measures (a), (c) and (e) on each large changelog, with
//! (c)'s rate over its first and last 10%, its write amplification and the disk its stores take.
//! The broker is the mock cluster hosted by the `mock_broker` example in its own process, so its CPU
//! is not counted as warmstore's. The mock cluster keeps only about 5 MiB per partition; with
//! `--broker HOST:PORT` the same process fills a topic of an existing Kafka broker instead
//! (docs/testing.md says how to run one), and deletes it at the end.
//!
//! `--help` prints the usage.

mod broker;
mod cores;
mod limits;
mod peer;
mod run;
mod shapes;

use broker::{Broker, Source};
use limits::limits;
use run::warmstore_run;
use shapes::{large, scale};
use std::path::PathBuf;
use std::time::Duration;

pub const TOPIC: &str = "bench-changelog";

const USAGE: &str =
    "usage: cargo run --release --example bench -- [--records N] [--partitions P] [--value-size B]
       [--rss-records N] [--compressed CODEC,...] [--one-core [--rounds N]] [--kafka key=value ...] [--no-peer]
       [--scale P1,P2,... [--baseline BIN] [--rounds N] [--idle-seconds S]] [--large RECORDSxPARTITIONS,...]
       [--broker HOST:PORT]";

/// Flags followed by a value, and flags alone.
const TAKES_VALUE: [&str; 12] = [
    "--records",
    "--partitions",
    "--value-size",
    "--rss-records",
    "--compressed",
    "--kafka",
    "--scale",
    "--baseline",
    "--idle-seconds",
    "--rounds",
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

pub fn exe_dir() -> PathBuf {
    std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf()
}

pub fn mib(bytes: u64) -> f64 {
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
        let rounds = arg(&args, "--rounds", 1).max(1);
        scale(
            source,
            records,
            &counts,
            baseline.as_deref(),
            rounds,
            idle,
            &work,
        );
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
        let rounds = arg(&args, "--rounds", 1).max(1);
        cores::one_core(
            &bin,
            &broker.bootstrap,
            &work,
            partitions,
            &kafka,
            &plain.c,
            rounds,
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

pub fn num_cpus() -> usize {
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
