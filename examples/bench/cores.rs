//! `--one-core`: (c) on every core against (c) pinned to one, and the most this machine allows.

use crate::num_cpus;
use crate::run::{copies_on_their_own_cores, warmstore_run_with, Run, Watch};
use crate::shapes::per_round;
use std::path::Path;

/// (c) pinned to the first core against (c) on every core, `rounds` times. Round 1 pairs the
/// pinned run with `first`, the (c) the limits measured just before; later rounds run both again,
/// alternating which runs first. The speed of this machine drifts by a fifth from one run to the
/// next, which is as much as the ratio's distance from its target, so one pair can say little and
/// the median of several says more. Then the ceiling: one copy of (c) per core at once, over the
/// last pinned run, the one nearest to it in time.
pub fn one_core(
    bin: &Path,
    bootstrap: &str,
    work: &Path,
    partitions: u64,
    kafka: &[String],
    first: &Run,
    rounds: u64,
) {
    let cores = num_cpus();
    let run = |name: &str, round: u64, core: Option<usize>| {
        let state = work.join(format!("state-{name}-{round}"));
        let watch = Watch {
            core,
            ..Watch::default()
        };
        warmstore_run_with(bin, bootstrap, &state, partitions, kafka, watch)
    };
    let mut rates = Vec::new();
    for round in 1..=rounds {
        let (all, one) = match round {
            1 => (None, run("one-core", round, Some(0))),
            _ if round % 2 == 0 => {
                let one = run("one-core", round, Some(0));
                (Some(run("all-cores", round, None)), one)
            }
            _ => {
                let all = run("all-cores", round, None);
                (Some(all), run("one-core", round, Some(0)))
            }
        };
        let all = all.as_ref().unwrap_or(first);
        let of_round = if rounds > 1 {
            format!(", round {round}")
        } else {
            String::new()
        };
        if round > 1 {
            println!("(c) on {cores} cores{of_round}: {}", all.figures());
        }
        println!("(c) pinned to one core{of_round}: {}", one.figures());
        // Where the second core goes: how busy each run kept its cores, and which threads ran.
        println!("(c) on {cores} cores{of_round}: {}", all.cpu_figures());
        println!("(c) pinned to one core{of_round}: {}", one.cpu_figures());
        rates.push((all.rate(), one.rate()));
    }
    println!(
        "ratio (c) on {cores} cores / (c) on one core: {}",
        per_round(rounds, |r| rates
            .get(r as usize - 1)
            .map(|(all, one)| all / one))
    );
    let (copied, slowest) = copies_on_their_own_cores(bin, bootstrap, work, partitions, kafka);
    let last_pinned = rates.last().map_or(f64::NAN, |(_, one)| *one);
    println!(
        "ceiling, {cores} copies of (c) at once, each pinned to a core of its own: {copied} records in all in {slowest:.2} s; their rate over (c) on one core: {:.2}",
        copied as f64 / slowest / last_pinned
    );
}
