//! The allocator. A restore allocates in waves: a catching-up partition fills a memtable, a write
//! batch and librdkafka's prefetch queue, then frees them all when it catches up, and the next
//! partition starts over. glibc keeps freed memory for reuse, so without help the process stays at
//! the size of its largest wave for good, and the gaps between long-lived allocations grow with the
//! changelog (BENCHMARKS.md).

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

/// Gives memory that is free inside the heap back to the system. Called when a partition ends its
/// catch-up and its buffers are gone: a few calls per partition over a whole restore, each well
/// under a millisecond. Without it the freed pages stay resident, part of every later peak, and
/// a standby that has finished restoring keeps the size of its restore.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn release_free() {
    // SAFETY: malloc_trim only returns free pages; it takes the allocator's own locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn tune() {}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn release_free() {}
