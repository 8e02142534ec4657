//! File descriptors: what each open store holds at most, and the process limit they must fit in.
//! Thousands of partitions in one process meet the common limits of 1,024 or 4,096 descriptors,
//! and a store that cannot open a file fails; better to raise the limit where allowed and to say
//! so at start than to fail a partition at random later.

/// Descriptors every open store holds besides its table files, counted on a running process:
/// RocksDB's `LOCK`, `MANIFEST`, current write-ahead log (created even with the WAL off) and two
/// or three handles on the store's directory (three when the open creates a column family, which
/// gets a handle of its own; a new store has every family in place, being a copy of an empty one).
/// warmstore's own lock file is not held open while RocksDB's lock stands in for it.
pub const FILES_PER_OPEN_STORE: u64 = 6;

/// Descriptors left for everything that is not a store: Kafka connections, the HTTP server,
/// standard streams, libraries.
pub const RESERVED: u64 = 256;

/// The most descriptors one open store holds, `None` when unbounded (`max_open_files` -1).
/// RocksDB raises any other value below 20 to 20, and keeps all but 10 of them for table files.
pub fn per_store(max_open_files: i32) -> Option<u64> {
    (max_open_files != -1).then(|| (max_open_files.max(20) - 10) as u64 + FILES_PER_OPEN_STORE)
}

/// How many descriptors `partitions` open stores may need beyond `limit`, if any.
pub fn shortfall(partitions: u64, per_store: u64, limit: u64) -> Option<u64> {
    let need = partitions
        .saturating_mul(per_store)
        .saturating_add(RESERVED);
    (need > limit).then_some(need - limit)
}

/// Raises the soft limit on open files to the hard limit, as far as the system allows, and returns
/// the soft limit in force.
pub fn raise_limit() -> std::io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct passed to them, nothing else.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    Ok(limit.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_holds_ten_table_files_at_the_default_and_the_fixed_ones() {
        assert_eq!(per_store(20), Some(16));
        assert_eq!(per_store(5), Some(16), "RocksDB raises it to 20");
        assert_eq!(per_store(0), Some(16));
        assert_eq!(per_store(110), Some(106));
        assert_eq!(per_store(-1), None);
    }

    #[test]
    fn a_shortfall_counts_every_store_and_the_reserve() {
        assert_eq!(shortfall(1_000, 17, 1_048_576), None);
        assert_eq!(shortfall(1_000, 17, 4_096), Some(17_000 + RESERVED - 4_096));
        assert_eq!(shortfall(0, 17, RESERVED), None);
        assert_eq!(shortfall(0, 17, RESERVED - 1), Some(1));
    }
}
