//! The broker every run reads: the `mock_broker` example in its own process.

use crate::{exe_dir, TOPIC};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Broker {
    pub child: Child,
    /// Closed on drop, so that the broker process deletes the topics it made on a real broker.
    pub stdin: Option<ChildStdin>,
    pub out: BufReader<std::process::ChildStdout>,
    pub bootstrap: String,
    /// The codec the changelog was produced with; the peer's copy is produced with it too.
    pub compression: String,
}

/// The Kafka broker every run reads: the mock cluster by default, or with `--broker HOST:PORT` an
/// existing Kafka broker, which the `mock_broker` process fills in the same way.
#[derive(Clone, Copy)]
pub struct Source<'a> {
    pub real: Option<&'a str>,
    pub value_size: u64,
}

impl Broker {
    pub fn start(source: Source, records: u64, partitions: u64) -> Broker {
        Broker::start_compressed(source, records, partitions, "none")
    }

    /// A broker whose changelog was produced with `compression` (a librdkafka codec name).
    pub fn start_compressed(
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

    pub fn command(&mut self, command: &str) {
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
