//! The `warmstore` command line. Errors become exit codes here and nowhere else:
//! 0 ok, 1 runtime failure, 2 bad config or usage.

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

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
    /// Print a store's offsets, status, estimated keys and size as JSON; never changes the store.
    Inspect {
        /// A store partition directory: <state_dir>/<store>/<partition>
        store_dir: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
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
        Command::Inspect { store_dir } => match warmstore::inspect::inspect(&store_dir) {
            Ok(report) => match serde_json::to_string_pretty(&report) {
                Ok(json) => {
                    println!("{json}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(1)
                }
            },
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(1)
            }
        },
    }
}
