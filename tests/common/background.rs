//! Processes and threads a test runs beside the one under test: a producer that keeps writing,
//! a child process killed if the test unwinds, and a process holding an `fcntl` lock as a running
//! Kafka Streams application holds its `.lock` files.

use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::io::BufRead;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::Record;
use warmstore::testkit::Rng;

/// A child process (`warmstore run`, say), killed if a failing test unwinds past it, so nothing
/// outlives the test.
pub struct Running(pub Child);

impl std::ops::Deref for Running {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Running {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Running {
    /// `warmstore run` with `config`, its log (at info) appended to `log`.
    pub fn warmstore_run(config: &Path, log: &Path) -> Running {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_warmstore"))
            .args(["run", "--config"])
            .arg(config)
            .env("RUST_LOG", "warmstore=info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("warmstore starts");
        Running(child)
    }

    /// The address the process serves on, from its log line `serving ... http_addr=ADDR` written
    /// after byte `from` of `log`: a port picked before the start could go to another connection
    /// meanwhile, so `http.listen` names port 0. Panics with the log if the process exits first.
    pub fn served_address(&mut self, log: &Path, from: u64) -> String {
        let served = super::poll_until(Duration::from_secs(60), || {
            if let Some(status) = self.try_wait().unwrap() {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                panic!("warmstore exited ({status}) before serving:\n{text}");
            }
            let text = std::fs::read(log).unwrap_or_default();
            let new = String::from_utf8_lossy(text.get(from as usize..).unwrap_or_default());
            new.lines()
                .find(|l| l.contains("serving /metrics"))
                .and_then(|l| l.split("http_addr=").nth(1))
                .and_then(|rest| rest.split_whitespace().next())
                .map(str::to_string)
        });
        served.expect("warmstore serves within 60 s")
    }

    /// SIGTERM, then the exit code once the process has exited; panics if it takes longer than
    /// `within`.
    pub fn stop(self, within: Duration) -> Option<i32> {
        self.stop_with(libc::SIGTERM, within)
    }

    /// `stop` with another signal.
    pub fn stop_with(mut self, signal: libc::c_int, within: Duration) -> Option<i32> {
        unsafe { libc::kill(self.id() as i32, signal) };
        let started = std::time::Instant::now();
        while started.elapsed() < within {
            if let Some(status) = self.try_wait().unwrap() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the process did not exit within {within:?} of signal {signal}");
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Produces to `partitions` partitions of `topic` until `stop`, in bursts (so the broker stores
/// batches of many records, as from a real producer) over `keys` keys with one record in ten a
/// tombstone. Returns what it wrote per partition, in offset order.
pub fn producer(
    bootstrap: String,
    topic: &'static str,
    partitions: i32,
    keys: u64,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Vec<Vec<Record>>> {
    std::thread::spawn(move || {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("linger.ms", "5")
            .create()
            .unwrap();
        let mut rng = Rng::new(seed);
        let mut log = vec![Vec::new(); partitions as usize];
        while !stop.load(Relaxed) {
            for _ in 0..20 {
                for p in 0..partitions {
                    let key = format!("k{:04}", rng.below(keys)).into_bytes();
                    let value =
                        (rng.below(10) > 0).then(|| format!("v{}", rng.next_u64()).into_bytes());
                    let mut record = BaseRecord::<[u8], [u8]>::to(topic)
                        .partition(p)
                        .key(&key[..]);
                    if let Some(v) = &value {
                        record = record.payload(&v[..]);
                    }
                    if producer.send(record).is_ok() {
                        log[p as usize].push((Some(key), value));
                    }
                }
            }
            producer.poll(Duration::from_millis(20));
        }
        producer.flush(Duration::from_secs(30)).unwrap();
        log
    })
}

/// Another process holding an exclusive `fcntl` lock on a file (Python's `lockf`, the same lock
/// Java's `FileChannel` and RocksDB take) until dropped.
pub struct FcntlLock {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl FcntlLock {
    /// Returns once the lock is held.
    pub fn hold(path: &Path) -> FcntlLock {
        let mut child = Command::new("python3")
            .args([
                "-c",
                "import fcntl, sys\n\
                 f = open(sys.argv[1], 'r+')\n\
                 fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n\
                 print('locked', flush=True)\n\
                 sys.stdin.read()",
            ])
            .arg(path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(
            line.trim(),
            "locked",
            "the lock on {} is held",
            path.display()
        );
        let stdin = child.stdin.take();
        FcntlLock { child, stdin }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for FcntlLock {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}
