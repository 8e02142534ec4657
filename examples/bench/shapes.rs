//! `--scale` (many partitions) and `--large` (large partitions).

use crate::broker::{Broker, Source};
use crate::exe_dir;
use crate::limits::measure_fetch;
use crate::peer::measure_peer;
use crate::run::{warmstore_run_with, Watch};
use std::path::Path;
use std::time::{Duration, Instant};

/// `--scale`: (c) at each partition count on the same records, with threads, descriptors and idle
/// CPU; with a baseline binary, each run of it is interleaved with one of this build.
///
/// The build that runs second at a size runs on a machine the first has warmed and filled (the
/// same binary on both sides gave 0.93 at 64 partitions), so with `rounds` above one the order
/// alternates: baseline first in odd rounds, this build first in even ones, and each ratio is
/// given per round and as the median.
pub fn scale(
    source: Source,
    records: u64,
    counts: &[u64],
    baseline: Option<&Path>,
    rounds: u64,
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
        for round in 1..=rounds {
            let mut order = binaries.clone();
            if round % 2 == 0 {
                order.reverse();
            }
            for (name, bin) in order {
                let state = work.join(format!(
                    "scale-{partitions}-{}-{round}",
                    name.replace(' ', "-")
                ));
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
                    "(c) {partitions} partitions, {name}{}: {}; {} threads, {} open fds ({:.1} per partition), idle CPU {:.1}% of a core",
                    if rounds > 1 { format!(", round {round}") } else { String::new() },
                    run.figures(),
                    run.threads,
                    run.fds,
                    run.fds as f64 / partitions as f64,
                    run.idle_cpu.unwrap_or(0.0) * 100.0
                );
                rates.push(ScaleRate {
                    partitions,
                    name,
                    round,
                    rate: run.rate(),
                });
                kept.push(state);
            }
        }
    }
    for state in kept {
        let _ = std::fs::remove_dir_all(state);
    }
    let (first, last) = (counts[0], *counts.last().unwrap());
    // One partition count has no rate to set against another.
    for (name, _) in binaries.iter().filter(|_| first != last) {
        let ratios = per_round(rounds, |r| {
            Some(rate_of(&rates, last, name, r)? / rate_of(&rates, first, name, r)?)
        });
        println!("ratio of the rate at {last} partitions to {first} partitions, {name}: {ratios}");
    }
    if baseline.is_some() {
        for &p in counts {
            let ratios = per_round(rounds, |r| {
                Some(rate_of(&rates, p, "this build", r)? / rate_of(&rates, p, "baseline", r)?)
            });
            println!("ratio this build / baseline at {p} partitions: {ratios}");
        }
    }
}

/// One run of `--scale`.
struct ScaleRate {
    partitions: u64,
    name: &'static str,
    round: u64,
    rate: f64,
}

fn rate_of(rates: &[ScaleRate], partitions: u64, name: &str, round: u64) -> Option<f64> {
    rates
        .iter()
        .find(|r| r.partitions == partitions && r.name == name && r.round == round)
        .map(|r| r.rate)
}

/// A ratio of each round: "0.93" for one round, "0.93, 1.01, 0.97 (median 0.97)" for more.
pub fn per_round(rounds: u64, ratio: impl Fn(u64) -> Option<f64>) -> String {
    let mut ratios: Vec<f64> = (1..=rounds).filter_map(ratio).collect();
    let listed = ratios
        .iter()
        .map(|r| format!("{r:.2}"))
        .collect::<Vec<_>>()
        .join(", ");
    if ratios.len() < 2 {
        return listed;
    }
    ratios.sort_by(f64::total_cmp);
    format!("{listed} (median {:.2})", median(&ratios))
}

/// The median of sorted figures.
fn median(sorted: &[f64]) -> f64 {
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    }
}

/// `--large RECORDSxPARTITIONS`: (a), (c) and (e) on one large changelog, with (c)'s rate over its
/// first and last 10%, its writes against the bytes it ingested, and the disk its stores take.
/// (b) is left out: its records would have to be held in memory; `examples/store_load.rs` measures
/// the store alone at these sizes.
pub fn large(
    source: Source,
    records: u64,
    partitions: u64,
    kafka: &[String],
    peer: bool,
    work: &Path,
) {
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
