//! `warmstore run` as a user starts it, timed to `/readyz` 200 and read from `/proc`.

use crate::{exe_dir, mib, num_cpus, TOPIC};
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

pub struct Run {
    pub seconds: f64,
    pub cpu_seconds: f64,
    pub peak_rss: u64,
    pub records: u64,
    /// Threads and open descriptors of the process once caught up.
    pub threads: u64,
    pub fds: u64,
    /// Share of one core used while tailing with nothing new to read, when measured.
    pub idle_cpu: Option<f64>,
    /// (seconds since spawn, records restored), sampled every 250 ms when watched.
    pub progress: Vec<(f64, u64)>,
    /// CPU seconds by kind of thread until caught up (`cpu_by_thread`).
    pub cpu_by_thread: Vec<(String, f64)>,
    /// Bytes the process wrote to disk (`/proc/PID/io`) until caught up.
    pub written: u64,
    /// Disk the stores take once warmstore has stopped.
    pub disk: u64,
}

/// What to watch in a run beyond the figures every run gives.
#[derive(Clone, Copy, Default)]
pub struct Watch {
    /// The CPU of this many seconds of tailing once caught up.
    pub idle: Option<Duration>,
    /// Pinned to this core alone, as `taskset -c N`.
    pub core: Option<usize>,
    /// Restore progress over time, for the rate of the first and the last 10%.
    pub progress: bool,
}

impl Run {
    pub fn rate(&self) -> f64 {
        self.records as f64 / self.seconds
    }

    /// Records, time, rate, CPU per million records and peak RSS, as every (c) line gives them.
    pub fn figures(&self) -> String {
        format!(
            "{} records in {:.2} s = {:.0} records/s, {:.2} CPU s per million records, peak RSS {:.1} MiB",
            self.records,
            self.seconds,
            self.rate(),
            self.cpu_seconds / (self.records as f64 / 1e6),
            mib(self.peak_rss)
        )
    }

    /// Cores kept busy on average until caught up, then the CPU seconds of each kind of thread.
    pub fn cpu_figures(&self) -> String {
        let threads: Vec<String> = self
            .cpu_by_thread
            .iter()
            .filter(|(_, cpu)| *cpu >= 0.01)
            .map(|(kind, cpu)| format!("{kind} {cpu:.2}"))
            .collect();
        format!(
            "{:.2} cores busy; CPU s by thread: {}",
            self.cpu_seconds / self.seconds,
            threads.join(", ")
        )
    }
}

/// CPU seconds (user and system) in a `/proc/.../stat` file, of a process or of one thread.
fn cpu_in(path: &Path) -> f64 {
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (field(11) + field(12)) / ticks
}

pub fn proc_figures(pid: u32) -> (f64, u64) {
    let cpu = cpu_in(Path::new(&format!("/proc/{pid}/stat")));
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let hwm = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024;
    (cpu, hwm)
}

fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::Read;
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return (0, String::new());
    };
    let _ = write!(s, "GET {path} HTTP/1.0\r\n\r\n");
    let mut r = String::new();
    let _ = s.read_to_string(&mut r);
    let status = r
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (
        status,
        r.split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default(),
    )
}

/// (c) and (d): `warmstore run` from spawn to `/readyz` 200 with `ready_max_lag: 0`.
pub fn warmstore_run(bootstrap: &str, state_dir: &Path, partitions: u64, kafka: &[String]) -> Run {
    let bin = exe_dir().parent().unwrap().join("warmstore");
    warmstore_run_with(
        &bin,
        bootstrap,
        state_dir,
        partitions,
        kafka,
        Watch::default(),
    )
}

/// One copy of (c) per core, all at once, each pinned to its own core and on its own state: work
/// that shares nothing inside a process, so their joint rate over one pinned copy's is what this
/// machine, its memory and the broker allow for "N cores / one core". Gives the records of all
/// copies and the seconds of the slowest.
pub fn copies_on_their_own_cores(
    bin: &Path,
    bootstrap: &str,
    work: &Path,
    partitions: u64,
    kafka: &[String],
) -> (u64, f64) {
    let runs: Vec<Run> = std::thread::scope(|s| {
        let copies: Vec<_> = (0..num_cpus())
            .map(|core| {
                let state = work.join(format!("state-core-{core}"));
                s.spawn(move || {
                    let watch = Watch {
                        core: Some(core),
                        ..Watch::default()
                    };
                    warmstore_run_with(bin, bootstrap, &state, partitions, kafka, watch)
                })
            })
            .collect();
        copies.into_iter().map(|c| c.join().unwrap()).collect()
    });
    (
        runs.iter().map(|r| r.records).sum(),
        runs.iter().map(|r| r.seconds).fold(0.0, f64::max),
    )
}

/// CPU seconds of a process by kind of thread, largest first. Threads are named by kind
/// (`restore`, `rocksdb:high`) or by kind and number (librdkafka's `rdk:broker1`, `rdk:broker-1`);
/// the number is dropped, so that each kind is one figure.
fn cpu_by_thread(pid: u32) -> Vec<(String, f64)> {
    let mut kinds: Vec<(String, f64)> = Vec::new();
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return kinds;
    };
    for thread in threads.flatten() {
        let dir = thread.path();
        let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let kind = name
            .trim_end()
            .trim_end_matches(|c: char| c.is_ascii_digit() || c == '-')
            .to_string();
        let cpu = cpu_in(&dir.join("stat"));
        match kinds.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, sum)) => *sum += cpu,
            None => kinds.push((kind, cpu)),
        }
    }
    kinds.sort_by(|a, b| b.1.total_cmp(&a.1));
    kinds
}

/// Threads (`/proc/PID/status`) and open descriptors (`/proc/PID/fd`) of a process.
fn threads_and_fds(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let threads = status
        .lines()
        .find(|l| l.starts_with("Threads:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64);
    (threads, fds)
}

/// `warmstore_run` with a given binary, watching what `watch` asks for.
pub fn warmstore_run_with(
    bin: &Path,
    bootstrap: &str,
    state_dir: &Path,
    partitions: u64,
    kafka: &[String],
    watch: Watch,
) -> Run {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let config = state_dir.with_extension("yaml");
    std::fs::write(
        &config,
        format!(
            "kafka:\n  bootstrap.servers: {bootstrap}\n{}state_dir: {}\nhttp:\n  listen: {addr}\nrestore:\n  ready_max_lag: 0\n{}stores:\n  - name: bench\n    changelog: {TOPIC}\n",
            kafka.iter().filter_map(|kv| kv.split_once('=')).map(|(k, v)| format!("  {k}: \"{v}\"\n")).collect::<String>(),
            state_dir.display(),
            std::env::var("WARMSTORE_BENCH_CONFIG").unwrap_or_default()
        ),
    )
    .unwrap();
    let started = Instant::now();
    let mut command = Command::new(bin);
    command
        .args(["run", "--config", config.to_str().unwrap()])
        .env("RUST_LOG", "warn");
    if let Some(core) = watch.core {
        // As `taskset -c N`: set before exec, so every thread warmstore starts inherits it.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(core, &mut set);
                if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = command.spawn().expect("warmstore is built");
    let mut progress = Vec::new();
    loop {
        let (status, _) = http_get(&addr, "/readyz");
        if status == 200 {
            break;
        }
        assert!(child.try_wait().unwrap().is_none(), "warmstore exited");
        let since = started.elapsed().as_secs_f64();
        if watch.progress && progress.last().is_none_or(|(t, _)| since - t >= 0.25) {
            if let Some(records) = restored(&addr) {
                progress.push((since, records));
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let seconds = started.elapsed().as_secs_f64();
    let (cpu_seconds, peak_rss) = proc_figures(child.id());
    let cpu_by_thread = cpu_by_thread(child.id());
    let written = written_bytes(child.id());
    let (threads, fds) = threads_and_fds(child.id());
    let idle_cpu = watch.idle.map(|idle| {
        // The first catch-up's flushes and the turn hand-over settle before the idle window.
        std::thread::sleep(Duration::from_secs(2));
        let (before, _) = proc_figures(child.id());
        std::thread::sleep(idle);
        let (after, _) = proc_figures(child.id());
        (after - before) / idle.as_secs_f64()
    });
    let (_, stores) = http_get(&addr, "/stores");
    let stores: serde_json::Value = serde_json::from_str(&stores).unwrap();
    assert_eq!(
        stores["partitions"].as_array().unwrap().len() as u64,
        partitions
    );
    let records = restored(&addr).unwrap();
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success(), "warmstore exits 0 on SIGTERM");
    Run {
        seconds,
        cpu_seconds,
        peak_rss,
        records,
        threads,
        fds,
        idle_cpu,
        progress,
        cpu_by_thread,
        written,
        disk: disk_bytes(state_dir),
    }
}

/// Records restored so far over every partition, from `/stores`.
fn restored(addr: &str) -> Option<u64> {
    let (_, stores) = http_get(addr, "/stores");
    let stores: serde_json::Value = serde_json::from_str(&stores).ok()?;
    stores["partitions"]
        .as_array()?
        .iter()
        .map(|p| p["records"].as_u64())
        .sum()
}

/// Bytes a process has caused to be written to disk (`write_bytes` of `/proc/PID/io`).
fn written_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("write_bytes:")?.trim().parse().ok())
        .unwrap_or(0)
}

/// Disk allocated to the files under `dir`, as `du` counts it.
fn disk_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => disk_bytes(&e.path()),
            Ok(m) => m.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}
