//! The `warmstore` command line. Errors become exit codes here and nowhere else:
//! 0 ok, 1 runtime failure, 2 bad config or usage.

mod demo;
mod export;
mod inspect;

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

use demo::{DemoArgs, DemoError};
use warmstore::config::{Config, BOOTSTRAP_ENV};
use warmstore::service::{shutdown_signal, Service};

#[derive(Parser)]
#[command(
    name = "warmstore",
    version,
    about = "Keeps local RocksDB copies of Kafka changelog topics warm"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the service: restore every configured store and keep it warm.
    Run {
        #[command(flatten)]
        config: ConfigFile,
    },
    /// Restore every store until warm, close every store cleanly and exit 0: an init container
    /// that warms an application's volume before it starts. Exits 1 when a store partition fails
    /// or on --timeout.
    Restore {
        #[command(flatten)]
        config: ConfigFile,
        /// Give up after this long, as in 30s, 10m or 2h.
        #[arg(long, value_parser = parse_timeout)]
        timeout: Option<std::time::Duration>,
    },
    /// Copy every store of the config, consistent and closed cleanly, into another state
    /// directory in the same layout; safe beside a running `warmstore run`. Prints what it copied
    /// as JSON.
    Export {
        #[command(flatten)]
        config: ConfigFile,
        /// The state directory to copy into (an application's state.dir).
        #[arg(long)]
        to: PathBuf,
        /// The Kafka Streams version that will open the copy; before 4.3 the offsets go into the
        /// task's .checkpoint instead of the store.
        #[arg(long)]
        kafka_streams_version: Option<String>,
    },
    /// The same service on an embedded broker: generate a changelog, restore it, print a summary.
    Demo(DemoArgs),
    /// Print a store's offsets, status, estimated keys and size as JSON; never changes the store.
    Inspect {
        /// A store partition directory: <state_dir>/<store>/<partition>
        store_dir: PathBuf,
    },
    /// Validate a config file: exit 0, or 2 with a message naming the problem.
    CheckConfig {
        #[command(flatten)]
        config: ConfigFile,
    },
    /// Print the JSON schema of the config file (for editors; the Helm chart embeds it).
    ConfigSchema,
}

/// `--config`, as every command that reads a config file takes it.
#[derive(clap::Args)]
struct ConfigFile {
    /// The YAML config file (`warmstore config-schema` prints its schema).
    #[arg(long = "config", value_name = "FILE")]
    path: PathBuf,
}

impl ConfigFile {
    /// The config, or exit code 2 once the problem is printed.
    fn load(&self) -> Result<Config, ExitCode> {
        Config::load(&self.path, std::env::var(BOOTSTRAP_ENV).ok()).map_err(|e| {
            eprintln!("error: {e}");
            ExitCode::from(2)
        })
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

fn run(config: Config) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let service = Service::start(&config).await?;
        shutdown_signal().await;
        stop_unless_signalled_again(service).await;
        anyhow::Ok(())
    })
}

/// Stops the service, or exits 1 at once on a second SIGTERM, SIGINT or SIGHUP. Stores not yet closed
/// are left as a crash leaves them (status 1), which the next start resumes or wipes under
/// `on_unclean_shutdown`: the commit protocol keeps them consistent.
async fn stop_unless_signalled_again(service: Service) {
    tokio::select! {
        _ = service.stop() => {}
        _ = shutdown_signal() => {
            tracing::error!(
                "a signal while stopping: exiting before every store was closed; those \
                 left open are treated as unclean shutdowns on the next start"
            );
            // SAFETY: _exit ends the process without running exit handlers or static
            // destructors, which would race RocksDB's background threads still working on the
            // stores left open.
            unsafe { libc::_exit(1) }
        }
    }
}

fn parse_timeout(text: &str) -> Result<std::time::Duration, String> {
    warmstore::units::parse_duration(text).map_err(|e| e.to_string())
}

/// Restores until warm, then closes every store as `run` does on SIGTERM.
fn restore(config: Config, timeout: Option<std::time::Duration>) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let service = Service::start(&config).await?;
        let warm = service
            .until_warm(config.restore.ready_max_lag, timeout, shutdown_signal())
            .await;
        stop_unless_signalled_again(service).await;
        warm?;
        tracing::info!("every store is warm and closed cleanly");
        anyhow::Ok(())
    })
}

fn demo(args: DemoArgs) -> ExitCode {
    let result = runtime()
        .map_err(|e| DemoError::Failed(one_line(&e)))
        .and_then(|rt| rt.block_on(demo::run(args)));
    match result {
        Ok(summary) => {
            summary.print();
            ExitCode::SUCCESS
        }
        Err(DemoError::Refused(message)) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
        Err(DemoError::Failed(message)) => {
            eprintln!("error: {message}");
            ExitCode::from(1)
        }
    }
}

fn start_logging() {
    warmstore::observe::logging::init("info");
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        kafka_client = %warmstore::kafka::consumers::librdkafka_build(),
        "warmstore starting"
    );
}

/// A runtime failure: logged, on stderr, exit 1.
fn exit_code(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let line = one_line(&e);
            tracing::error!("{line}");
            eprintln!("error: {line}");
            ExitCode::from(1)
        }
    }
}

/// The error and its causes on one line. Most of warmstore's errors name their cause in their own
/// message, so that `/stores` and the log show it too; a cause is added only where the text so far
/// does not already end with it, so no reason is printed twice.
fn one_line(error: &anyhow::Error) -> String {
    let mut line = error.to_string();
    for cause in error.chain().skip(1) {
        let cause = cause.to_string();
        if !line.ends_with(&cause) {
            line.push_str(": ");
            line.push_str(&cause);
        }
    }
    line
}

/// Prints `value` as indented JSON on stdout.
fn print_json(value: &impl serde::Serialize) -> ExitCode {
    match serde_json::to_string_pretty(value) {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

fn main() -> ExitCode {
    warmstore::memory::tune();
    // The version names librdkafka and its built-in features: the first thing to check when a
    // security setting or a codec is refused.
    let version = format!(
        "{}\n{}",
        env!("CARGO_PKG_VERSION"),
        warmstore::kafka::consumers::librdkafka_build()
    );
    let command = Cli::command().version(version);
    let cli = match command
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m))
    {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match cli.command {
        Command::Run { config } => {
            let config = match config.load() {
                Ok(c) => c,
                Err(code) => return code,
            };
            start_logging();
            exit_code(run(config))
        }
        Command::Restore { config, timeout } => {
            let config = match config.load() {
                Ok(c) => c,
                Err(code) => return code,
            };
            start_logging();
            exit_code(restore(config, timeout))
        }
        Command::Export {
            config,
            to,
            kafka_streams_version,
        } => {
            let config = match config.load() {
                Ok(c) => c,
                Err(code) => return code,
            };
            if let Some(version) = &kafka_streams_version {
                if let Err(e) = export::needs_checkpoint_file(version) {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            }
            warmstore::observe::logging::init("warn");
            match export::run(&config, &to, kafka_streams_version.as_deref()) {
                Ok(exported) => print_json(&exported),
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Command::Demo(args) => {
            warmstore::observe::logging::init("warn");
            demo(args)
        }
        Command::Inspect { store_dir } => match inspect::inspect(&store_dir) {
            Ok(report) => print_json(&report),
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(e.exit_code())
            }
        },
        Command::ConfigSchema => print_json(&warmstore::config::json_schema()),
        Command::CheckConfig { config } => match config.load() {
            Ok(c) => {
                for message in c.warnings() {
                    eprintln!("warning: {message}");
                }
                println!("{}: ok ({} stores)", config.path.display(), c.stores.len());
                ExitCode::SUCCESS
            }
            Err(code) => code,
        },
    }
}
