//! Logs through `tracing`: level from `RUST_LOG`, human-readable by default, JSON when
//! `WARMSTORE_LOG_FORMAT=json` for Kubernetes log pipelines. librdkafka's own log lines arrive
//! through the `log` bridge.

use std::io::IsTerminal;
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
