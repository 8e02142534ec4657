//! Logs through `tracing`: level from `RUST_LOG`, human-readable by default, JSON when
//! `WARMSTORE_LOG_FORMAT=json` for Kubernetes log pipelines. librdkafka's own log lines arrive
//! through the `log` bridge.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tracing_subscriber::EnvFilter;

pub const FORMAT_ENV: &str = "WARMSTORE_LOG_FORMAT";

/// `default_filter` applies when `RUST_LOG` is unset.
pub fn init(default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let json = std::env::var(FORMAT_ENV).is_ok_and(|v| v.eq_ignore_ascii_case("json"));
    // Colours only on a terminal: `kubectl logs`, a file or `grep` would show the escape codes.
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    let result = if json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
    if let Err(e) = result {
        eprintln!("warning: logging was already set up: {e}");
    }
}

/// How long the same warning stays quiet after it was logged.
pub const REPEAT_QUIET: Duration = Duration::from_secs(60);

/// Keeps warnings that recur on every retry from flooding the log. librdkafka reports an
/// unreachable broker on every reconnect, ten times a second per client, alternating between
/// its errors, and each reaches warmstore twice (the error callback and the consumer's queue);
/// the state itself shows in `/readyz`, `/stores` and the metrics. Each kind of warning is logged
/// the first time, then again once `REPEAT_QUIET` has passed, saying how many were left out.
#[derive(Default)]
pub struct RepeatedWarnings(Mutex<HashMap<String, Repeat>>);

/// Kinds of warning remembered at most; past it they are forgotten and logged afresh. The kinds
/// are error codes and librdkafka's log lines with their numbers masked (`kind_of`): a few dozen
/// at most.
const KINDS_REMEMBERED: usize = 64;

struct Repeat {
    logged_at: Instant,
    left_out: u64,
}

impl RepeatedWarnings {
    /// `due` for a warning's text now, its kind being the text with its numbers masked
    /// (`kind_of`): the same report about another partition, broker or offset is a repeat.
    pub fn due_now(&self, text: &str) -> Option<u64> {
        self.due(&kind_of(text), Instant::now())
    }

    /// `Some(n)` when a warning of this `kind` is to be logged now, `n` being how many of its
    /// repeats were left out since it last was.
    pub fn due(&self, kind: &str, now: Instant) -> Option<u64> {
        let mut kinds = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(repeat) = kinds.get_mut(kind) {
            if now.duration_since(repeat.logged_at) < REPEAT_QUIET {
                repeat.left_out += 1;
                return None;
            }
            repeat.logged_at = now;
            return Some(std::mem::take(&mut repeat.left_out));
        }
        if kinds.len() >= KINDS_REMEMBERED {
            kinds.clear();
        }
        let repeat = Repeat {
            logged_at: now,
            left_out: 0,
        };
        kinds.insert(kind.to_string(), repeat);
        Some(0)
    }
}

/// The kind of a log line for `RepeatedWarnings`: its text with every run of digits masked, so
/// that the same report about another partition, broker or offset counts as a repeat.
fn kind_of(text: &str) -> String {
    let mut kind = String::with_capacity(text.len());
    let mut in_digits = false;
    for c in text.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                kind.push('#');
            }
            in_digits = true;
        } else {
            kind.push(c);
            in_digits = false;
        }
    }
    kind
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_report_about_another_partition_is_of_one_kind() {
        let line = |p: &str| {
            format!(
                "[thrd:app]: warmstore#consumer-1: orders-changelog [{p}]: topic does not exist"
            )
        };
        assert_eq!(kind_of(&line("2")), kind_of(&line("17")));
        assert_eq!(
            kind_of(&line("2")),
            "[thrd:app]: warmstore#consumer-#: orders-changelog [#]: topic does not exist"
        );
        assert_ne!(
            kind_of("Connect to ipv4#10.0.0.1:9092 failed"),
            kind_of("SSL handshake failed")
        );
    }

    #[test]
    fn a_warning_is_logged_once_then_quiet_then_again_with_the_count_left_out() {
        let warning = RepeatedWarnings::default();
        let t0 = Instant::now();
        assert_eq!(warning.due("broker down", t0), Some(0));
        assert_eq!(
            warning.due("broker down", t0 + Duration::from_secs(1)),
            None
        );
        assert_eq!(
            warning.due("broker down", t0 + Duration::from_secs(59)),
            None
        );
        assert_eq!(warning.due("broker down", t0 + REPEAT_QUIET), Some(2));
        assert_eq!(warning.due("broker down", t0 + REPEAT_QUIET), None);
    }

    #[test]
    fn each_kind_of_warning_is_quieted_on_its_own() {
        let warnings = RepeatedWarnings::default();
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(1);
        assert_eq!(warnings.due("broker down", t0), Some(0));
        assert_eq!(warnings.due("transport failure", t0), Some(0));
        assert_eq!(warnings.due("broker down", later), None);
        assert_eq!(warnings.due("transport failure", later), None);
        assert_eq!(warnings.due("login refused", later), Some(0));
    }

    #[test]
    fn past_the_kinds_remembered_every_kind_is_logged_afresh() {
        let warnings = RepeatedWarnings::default();
        let t0 = Instant::now();
        for kind in 0..KINDS_REMEMBERED {
            assert_eq!(warnings.due(&kind.to_string(), t0), Some(0));
        }
        assert_eq!(warnings.due("0", t0), None);
        assert_eq!(warnings.due("one more", t0), Some(0));
        assert_eq!(warnings.due("0", t0), Some(0));
    }
}
