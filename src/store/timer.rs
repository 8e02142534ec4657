//! RocksDB's timer thread. Every open database registers a task that flushes its info log every
//! 10 s, with no option to turn it off, and one thread of the process runs all such tasks. Each
//! store's task keeps the phase of the moment the store was opened, so 1,000 stores woke that
//! thread about 100 times a second: a third of an idle standby's CPU, for flushes of a log that
//! warmstore routes elsewhere (BENCHMARKS.md).
//!
//! A thread takes its timer slack (how late the kernel may end its timed waits, to serve several
//! at one wake-up) from the thread that starts it, and RocksDB starts its timer thread inside
//! the first open of a database. So stores are opened with a coarse slack on the opening thread,
//! which gets its own back afterwards: the timer thread then sleeps up to a second past a task's
//! time, runs every task due by then back to back, and the tasks stay bunched from then on. Its
//! other tasks (a check for time-based compaction, every 12 hours) can be a second late as well.

use rocksdb::{ColumnFamilyDescriptor, Options, DB};
use std::path::Path;

/// How late RocksDB's timer thread may wake.
#[cfg(target_os = "linux")]
const TIMER_SLACK_NS: libc::c_ulong = 1_000_000_000;

/// Opens a database as `DB::open_cf_descriptors` does, with the calling thread's timer slack
/// coarse for the duration, so that a timer thread RocksDB starts meanwhile inherits it.
pub(super) fn open_db(
    options: &Options,
    path: &Path,
    families: Vec<ColumnFamilyDescriptor>,
) -> Result<DB, rocksdb::Error> {
    #[cfg(target_os = "linux")]
    let _coarse = CoarseSlack::set();
    DB::open_cf_descriptors(options, path, families)
}

/// The calling thread's timer slack, coarse until dropped, when dropped back to `previous`.
#[cfg(target_os = "linux")]
struct CoarseSlack {
    previous: libc::c_ulong,
}

#[cfg(target_os = "linux")]
impl CoarseSlack {
    /// `None` when the slack cannot be read, and is then left alone: that costs only CPU.
    fn set() -> Option<CoarseSlack> {
        // SAFETY: PR_GET_TIMERSLACK and PR_SET_TIMERSLACK read and change only the calling
        // thread's timer slack.
        let previous = unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) };
        let previous = libc::c_ulong::try_from(previous).ok()?;
        // SAFETY: as above.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, TIMER_SLACK_NS, 0, 0, 0) };
        Some(CoarseSlack { previous })
    }
}

#[cfg(target_os = "linux")]
impl Drop for CoarseSlack {
    fn drop(&mut self) {
        // SAFETY: as in `set`.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, self.previous, 0, 0, 0) };
    }
}
