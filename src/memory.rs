//! The allocator. A restore allocates in waves: a catching-up partition fills a memtable, a write
//! batch and librdkafka's prefetch queue, then frees them all when it catches up, and the next
//! partition starts over. glibc keeps freed memory for reuse, so without help the process stays at
//! the size of its largest wave for good, and the gaps between long-lived allocations grow with the
//! changelog (BENCHMARKS.md).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Limits glibc to two malloc arenas. glibc gives threads their own arenas (up to 8 per core), and
/// memory freed in one stays resident there; with a thread per store partition, as the engine ran
/// before its tasks, two arenas measured 60-120 MiB lower peaks. A fixed mmap threshold saved another 20 MiB but cost 15-20%
/// more CPU in page faults, so glibc keeps its own. Call before any thread starts. A user's own
/// malloc settings win.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn tune() {
    if std::env::var_os("GLIBC_TUNABLES").is_none()
        && std::env::var_os("MALLOC_ARENA_MAX").is_none()
    {
        // SAFETY: mallopt only changes allocator parameters; no other thread exists yet.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
}

/// Memory let go since free memory was last given back to the system, in bytes as the turns
/// estimate what each catch-up held.
#[derive(Default)]
pub struct LetGo(AtomicU64);

impl LetGo {
    pub const fn new() -> LetGo {
        LetGo(AtomicU64::new(0))
    }

    /// Counts `bytes` let go; true for the one caller that brings the count to `threshold`, which
    /// is then to give memory back, and the count starts over.
    pub fn add(&self, bytes: u64, threshold: u64) -> bool {
        let count = self.0.fetch_add(bytes, Relaxed) + bytes;
        count >= threshold && self.0.swap(0, Relaxed) >= threshold
    }
}

static LET_GO: LetGo = LetGo::new();

/// Gives memory that is free inside the heap back to the system once partitions ending their
/// catch-up have let go of `threshold` bytes between them, so what a restore leaves resident
/// beyond its live data is less than that. Without it the freed pages stay resident, part of
/// every later peak, and a standby that has finished restoring keeps the size of its restore.
/// Not at every catch-up: each `malloc_trim` walks the whole heap and returns each free stretch
/// with a call of its own that interrupts the other cores, about 170 calls per partition at 1,000
/// small partitions, for a few hundred KiB each.
pub fn release_free(bytes: u64, threshold: u64) {
    if LET_GO.add(bytes, threshold) {
        trim();
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() {
    // SAFETY: malloc_trim only returns free pages; it takes the allocator's own locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn tune() {}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_given_back_once_a_threshold_has_gathered() {
        let let_go = LetGo::new();
        assert!(!let_go.add(3, 10));
        assert!(!let_go.add(6, 10));
        assert!(let_go.add(1, 10), "the tenth byte");
        assert!(!let_go.add(9, 10), "the count started over");
        assert!(let_go.add(20, 10), "one large catch-up is enough");
        assert!(!let_go.add(0, 10));
    }
}
