//! The benchmark harness runs end to end at tiny sizes and produces every figure. It checks no speed:
//! timed assertions are flaky; the figures go to BENCHMARKS.md.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn warmstore() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_warmstore"))
}

/// Runs the example `name` with `args`, asserts it succeeds, and returns what it printed.
fn run_example(name: &str, args: &[&std::ffi::OsStr]) -> String {
    let example = warmstore().parent().unwrap().join("examples").join(name);
    let out = Command::new(&example)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", example.display()));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Runs the harness with `args` and asserts it succeeds and prints every one of `figures`.
fn assert_bench_prints(args: &[&str], baseline: Option<&Path>, figures: &[&str]) -> String {
    let mut args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    if let Some(baseline) = baseline {
        args.extend(["--baseline".as_ref(), baseline.as_os_str()]);
    }
    let stdout = run_example("bench", &args);
    for figure in figures {
        assert!(stdout.contains(figure), "missing `{figure}` in:\n{stdout}");
    }
    stdout
}

#[test]
fn the_harness_produces_every_figure() {
    let stdout = assert_bench_prints(
        &[
            "--records",
            "20000",
            "--partitions",
            "4",
            "--rss-records",
            "5000",
            "--compressed",
            "zstd",
            "--one-core",
            "--rounds",
            "2",
        ],
        None,
        &[
            "(a) fetch limit: 20000 records",
            "(b) write limit: 20000 records",
            "(c) warmstore empty to caught up: 20000 records",
            "CPU s per million records",
            "(d) warmstore resume with 10% new records: 2000 records",
            "(e) peer, Quix Streams recovery: 20000 records",
            "ratio c / min(a, b):",
            "pipeline overhead, CPU(c) / (CPU(a) + CPU(b)):",
            "ratio c / e:",
            "(c) at 5000 records: peak RSS",
            "(a) fetch limit on the zstd changelog: 20000 records",
            "(b) write limit on the zstd changelog: 20000 records",
            "(c) warmstore empty to caught up on the zstd changelog: 20000 records",
            "(e) peer, Quix Streams recovery on the zstd changelog: 20000 records",
            "ratio c / min(a, b) on the zstd changelog:",
            "pipeline overhead on the zstd changelog, CPU(c) / (CPU(a) + CPU(b)):",
            "ratio c / e on the zstd changelog:",
            "ratio (c) on the zstd changelog / (c) uncompressed:",
            "(c) pinned to one core, round 1: 20000 records",
            "(c) pinned to one core, round 2: 20000 records",
            "cores busy; CPU s by thread: ",
            "cores / (c) on one core: ",
            "(median ",
            "copies of (c) at once, each pinned to a core of its own:",
            "their rate over (c) on one core:",
        ],
    );
    for limit in ["(a) fetch limit", "(b) write limit"] {
        for line in stdout.lines().filter(|l| l.starts_with(limit)) {
            assert!(line.ends_with("CPU s per million records"), "{line}");
        }
    }
}

/// `--scale` reports what many partitions cost, for this build and a baseline (here the same
/// binary), and the ratios between them, per round and their median, each round alternating
/// which binary runs first.
#[test]
fn the_scale_run_produces_every_figure() {
    let stdout = assert_bench_prints(
        &[
            "--records",
            "20000",
            "--scale",
            "2,8",
            "--rounds",
            "2",
            "--idle-seconds",
            "1",
        ],
        Some(&warmstore()),
        &[
            "(c) 2 partitions, baseline, round 1: 20000 records",
            "(c) 8 partitions, this build, round 2: 20000 records",
            "threads, ",
            "open fds (",
            "idle CPU ",
            "ratio of the rate at 8 partitions to 2 partitions, this build:",
            "ratio this build / baseline at 8 partitions:",
            "(median ",
        ],
    );
    // The second round runs this build first.
    let at = |line: &str| {
        stdout
            .find(line)
            .unwrap_or_else(|| panic!("no `{line}`:\n{stdout}"))
    };
    assert!(
        at("(c) 2 partitions, this build, round 2") < at("(c) 2 partitions, baseline, round 2"),
        "round 2 starts with this build:\n{stdout}"
    );
}

/// `--large` fills topics of the tests' real Kafka broker (the mock cluster keeps only about 5 MiB
/// per partition) and reports (a), (c) with its rate over time, write amplification and disk, and
/// (e) for each shape; the topics it made are gone afterwards.
#[test]
fn the_large_run_on_a_real_broker_produces_every_figure() {
    let broker = &common::kafka::kafka().plaintext;
    assert_bench_prints(
        &["--large", "20000x1,10000x2", "--broker", broker],
        None,
        &[
            "(a) fetch limit (20000 x 1): 20000 records",
            "(c) warmstore empty to caught up (20000 x 1): 20000 records",
            "(c) (20000 x 1) records/s over the first 10%: ",
            "write amplification ",
            "stores on disk ",
            "(e) peer, Quix Streams recovery (20000 x 1): 20000 records",
            "ratio c / e (20000 x 1):",
            "(a) fetch limit (10000 x 2): 10000 records",
            "(c) warmstore empty to caught up (10000 x 2): 10000 records",
            "(e) peer, Quix Streams recovery (10000 x 2): 10000 records",
            "ratio c / a (10000 x 2):",
        ],
    );
    let consumer: rdkafka::consumer::BaseConsumer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", broker)
        .create()
        .unwrap();
    let metadata = rdkafka::consumer::Consumer::fetch_metadata(
        &consumer,
        None,
        std::time::Duration::from_secs(10),
    )
    .unwrap();
    let left: Vec<&str> = metadata
        .topics()
        .iter()
        .map(|t| t.name())
        .filter(|t| t.starts_with("bench-"))
        .collect();
    assert!(left.is_empty(), "the bench left topics behind: {left:?}");
}

/// The store benchmark with `args`, its stores in a directory of their own; its standard output.
fn store_load(args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    args.extend([std::ffi::OsStr::new("--dir"), dir.path().as_os_str()]);
    run_example("store_load", &args)
}

/// The store benchmark loads and tails each compaction candidate, then opens what each wrote under
/// the other style and reads back every key (it fails if a key is missing).
#[test]
fn the_store_benchmark_produces_every_figure() {
    let stdout = store_load(&["--records", "30000", "--partitions", "2"]);
    for candidate in ["leveled", "universal", "bulk"] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("| {candidate} |")))
            .unwrap_or_else(|| panic!("no {candidate} row in:\n{stdout}"));
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        assert_eq!(cells.len(), 14, "{line}");
        assert!(!line.contains("NaN"), "{line}");
    }
}

/// The store benchmark's idle mode reports what open stores cost with nothing to do.
#[test]
fn the_store_benchmark_reports_the_cpu_of_idle_stores() {
    let stdout = store_load(&["--idle", "20", "--idle-seconds", "1"]);
    let figure = stdout
        .strip_prefix("20 open stores, idle, nothing else in the process: ")
        .and_then(|rest| rest.split_once("% of one core over 1 s"))
        .and_then(|(percent, _)| percent.parse::<f64>().ok());
    assert!(figure.is_some_and(f64::is_finite), "{stdout}");
}

/// A run takes minutes: `--help` prints the usage and a misspelt flag is refused, neither starting one.
#[test]
fn help_and_a_misspelt_flag_start_no_run() {
    let usage = run_example("bench", &["--help".as_ref()]);
    assert!(
        usage.starts_with("usage:") && usage.contains("--scale"),
        "{usage}"
    );
    let example = warmstore().parent().unwrap().join("examples/bench");
    let out = Command::new(&example)
        .args(["--record", "5"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("unknown argument --record"), "{err}");
    assert!(
        out.stdout.is_empty(),
        "no run started: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}
