//! RocksDB options for a store: the user's overrides first, then what the commit protocol needs.

use crate::units::ByteSize;
use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, DBCompactionStyle, DBCompressionType,
    InfoLogger, LogLevel, MemtableFactory, Options, WriteBufferManager,
};
use serde::Deserialize;
use std::num::NonZeroU32;
use std::time::Duration;

use super::layout::StoreType;

/// Table format every column family is written in. RocksDB 11 defaults to 7, which RocksDB 10.1 and
/// older (including the one Kafka Streams 4.3/4.4 ships) cannot read; 6 keeps stores portable.
pub const TABLE_FORMAT_VERSION: i32 = 6;

/// The `rocksdb:` section of the config. Typed rather than free-form so a typo is a config error
/// instead of a silently ignored option.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RocksDbOverrides {
    pub write_buffer_size: Option<ByteSize>,
    pub max_write_buffer_number: Option<i32>,
    pub max_background_jobs: Option<i32>,
    /// Threads that flush memtables, shared by every store of the process (default half the
    /// cores, at least 1). RocksDB's pools are process-wide and grow only to what one store asks
    /// for, one flush at a time, so without this a process of many stores flushes on a single
    /// thread however many cores it has.
    pub flush_threads: Option<NonZeroU32>,
    /// Threads that compact table files, shared by every store of the process (default a quarter
    /// of the cores, at least 1). A store still compacts one job at a time: more compactions at
    /// once of one store measured more rewriting, not more speed.
    pub compaction_threads: Option<NonZeroU32>,
    pub target_file_size_base: Option<ByteSize>,
    pub level0_file_num_compaction_trigger: Option<i32>,
    /// Codec of new table files. Default `none`, as Kafka Streams writes them; whatever is chosen,
    /// stores written with any codec of this build open.
    pub compression: Option<Compression>,
    /// How RocksDB merges table files (default `universal`, as Kafka Streams opens its stores).
    /// Measured against `leveled` on stores of 10-20M records, universal loaded as fast or faster
    /// and rewrote less, for more disk right after the load (docs/store.md). A store written under
    /// either style opens and compacts under the other.
    pub compaction_style: Option<CompactionStyle>,
    /// Memtable memory shared by every store of the process (default 32 MiB). When the total
    /// exceeds it, RocksDB flushes, so memory stays flat however large the changelogs are.
    pub total_write_buffer_size: Option<ByteSize>,
    /// Files RocksDB keeps open per store (default 20, the smallest RocksDB accepts): at most this
    /// minus 10 table files, beside a handful of files every store holds. Bounds the descriptors
    /// of a process with many partitions; -1 keeps every table file open.
    pub max_open_files: Option<i32>,
    /// Block cache shared by every store of the process (default 8 MiB). warmstore only writes;
    /// reads are the odd lookup, so one small cache serves them all.
    pub block_cache_size: Option<ByteSize>,
    /// Accepted so the error is a warning, never honoured: atomic flush is what keeps data and offsets
    /// on disk from the same commit.
    pub atomic_flush: Option<bool>,
}

/// Table compression codecs this build has (RocksDB built with each).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Compression {
    None,
    Snappy,
    Lz4,
    Zstd,
    Zlib,
    Bzip2,
}

impl Compression {
    fn rocksdb(self) -> DBCompressionType {
        match self {
            Compression::None => DBCompressionType::None,
            Compression::Snappy => DBCompressionType::Snappy,
            Compression::Lz4 => DBCompressionType::Lz4,
            Compression::Zstd => DBCompressionType::Zstd,
            Compression::Zlib => DBCompressionType::Zlib,
            Compression::Bzip2 => DBCompressionType::Bz2,
        }
    }
}

/// RocksDB's compaction styles a store may be written with.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CompactionStyle {
    Leveled,
    Universal,
}

impl CompactionStyle {
    fn rocksdb(self) -> DBCompactionStyle {
        match self {
            CompactionStyle::Leveled => DBCompactionStyle::Level,
            CompactionStyle::Universal => DBCompactionStyle::Universal,
        }
    }
}

/// RocksDB's process-wide pools of background threads, which every store's flushes and
/// compactions queue on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackgroundThreads {
    pub flush: u32,
    pub compaction: u32,
}

impl BackgroundThreads {
    /// What the config asks for, or half the cores for flushes and a quarter for compactions,
    /// at least one each. Flushes are on the restore's path: every catch-up ends in one, and a
    /// store's writer waits while its memtables are full; a profile put the flush thread at a
    /// third of the process's CPU. Compactions are not on it for the small stores that make up
    /// most of a process, and a large store runs one at a time however many threads there are.
    pub fn sized(overrides: &RocksDbOverrides, cores: usize) -> BackgroundThreads {
        let share = |divisor: usize| (cores / divisor).max(1) as u32;
        BackgroundThreads {
            flush: overrides.flush_threads.map_or(share(2), NonZeroU32::get),
            compaction: overrides
                .compaction_threads
                .map_or(share(4), NonZeroU32::get),
        }
    }

    /// Sizes the pools of RocksDB's default environment, the one every store runs on. Stores
    /// opened later can only grow them, to what a store's `max_background_jobs` asks for.
    pub fn apply(self) -> Result<(), rocksdb::Error> {
        let mut env = rocksdb::Env::new()?;
        env.set_high_priority_background_threads(self.flush as i32);
        env.set_low_priority_background_threads(self.compaction as i32);
        Ok(())
    }
}

/// How stores are opened and committed; shared by every store of a process.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub rocksdb: RocksDbOverrides,
    /// Write-ahead log. Off by default, as in Kafka Streams: the commit protocol does not need it.
    pub wal: bool,
    /// Flush once unflushed commits are this old, so a crash never sends a store back further.
    pub flush_interval: Duration,
    /// One memtable budget for all stores of the process; `None` leaves each store unbounded.
    pub memtables: Option<SharedMemtables>,
    /// One block cache for all stores of the process; `None` gives each store RocksDB's own.
    pub block_cache: Option<SharedBlockCache>,
}

/// RocksDB's default options, as a copy of one kept for the process. Each new `Options` builds
/// a default table factory with a 32 MiB block cache of its own, which the factory set here
/// replaces at once: building and tearing that cache down (an `mmap`, then an `munmap` that
/// interrupts the other cores to flush their TLBs) was 3% of the CPU of a 1,000-partition
/// restore, several times per store. A copy shares the one default factory instead.
pub fn bare_options() -> Options {
    static BARE: std::sync::LazyLock<Options> = std::sync::LazyLock::new(Options::default);
    BARE.clone()
}

/// The process-wide memtable budget (RocksDB's `WriteBufferManager`), shared by clones.
#[derive(Clone)]
pub struct SharedMemtables(WriteBufferManager);

impl SharedMemtables {
    pub fn new(bytes: u64) -> Self {
        SharedMemtables(WriteBufferManager::new_write_buffer_manager(
            bytes as usize,
            false,
        ))
    }
}

impl std::fmt::Debug for SharedMemtables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedMemtables")
    }
}

/// The process-wide block cache, shared by clones.
#[derive(Clone)]
pub struct SharedBlockCache(Cache);

impl SharedBlockCache {
    pub fn new(bytes: u64) -> Self {
        SharedBlockCache(Cache::new_lru_cache(bytes as usize))
    }
}

impl std::fmt::Debug for SharedBlockCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedBlockCache")
    }
}

/// Default process-wide block cache.
pub const DEFAULT_BLOCK_CACHE: u64 = 8 << 20;

/// Unit in which a memtable takes memory (and is charged against `total_write_buffer_size`).
const ARENA_BLOCK: usize = 64 << 10;

/// Largest buffer RocksDB puts in front of a file it writes. RocksDB starts each at 64 KiB (and
/// lets one grow to 1 MiB), and every open store keeps two files open for writing, its MANIFEST
/// and its write-ahead log, which hold a few hundred bytes while a store is idle: 1,000 stores
/// held 40-45 MiB of resident memory in them. Table files are written in blocks of this size, so
/// a flush makes a write call per block instead of per 1 MiB; a restore measured no slower.
const FILE_WRITE_BUFFER: u64 = 4 << 10;

/// Disk RocksDB reserves ahead of a store's MANIFEST as it grows, instead of its default 4 MiB. The
/// reservation is held for as long as the store is open, which for a standby is its whole life:
/// 1,000 caught-up stores holding 139 MB took 4.1 GB of disk. A MANIFEST grows by a few hundred
/// bytes a flush, so 16 KiB still covers dozens of flushes per reservation.
const MANIFEST_PREALLOCATION: usize = 16 << 10;

/// Default files RocksDB keeps open per store; RocksDB raises anything lower to 20.
const DEFAULT_MAX_OPEN_FILES: i32 = 20;

/// RocksDB's warnings and errors, in warmstore's log rather than a LOG file in every store: one
/// descriptor fewer per store, and errors end up where operators look. RocksDB's warnings are
/// routine in a bulk load (a write stall while memtables flush, many times a second), so they are
/// logged at debug level (`RUST_LOG=rocksdb=debug` shows them).
fn rocksdb_log(level: LogLevel, message: &str) {
    let message = message.trim_end();
    match level {
        LogLevel::Debug | LogLevel::Info | LogLevel::Warn => {
            tracing::debug!(target: "rocksdb", "{message}")
        }
        LogLevel::Error | LogLevel::Fatal | LogLevel::Header => {
            tracing::error!(target: "rocksdb", "{message}")
        }
    }
}

/// Default process-wide memtable budget.
pub const DEFAULT_TOTAL_WRITE_BUFFER: u64 = 32 << 20;

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            rocksdb: RocksDbOverrides::default(),
            wal: false,
            flush_interval: Duration::from_secs(60),
            memtables: None,
            block_cache: None,
        }
    }
}

impl StoreOptions {
    /// Files RocksDB may keep open per store, as configured or by default.
    pub fn max_open_files(&self) -> i32 {
        self.rocksdb
            .max_open_files
            .unwrap_or(DEFAULT_MAX_OPEN_FILES)
    }

    /// Logs, once per process, that a user tried to set `atomic_flush`.
    pub fn warn_about_ignored_settings(&self) {
        if let Some(value) = self.rocksdb.atomic_flush {
            tracing::warn!(
                requested = value,
                "rocksdb.atomic_flush is always true in warmstore; the setting is ignored"
            );
        }
    }

    fn column_family_options(&self) -> Options {
        let mut options = bare_options();
        let mut table = BlockBasedOptions::default();
        table.set_format_version(TABLE_FORMAT_VERSION);
        if let Some(cache) = &self.block_cache {
            table.set_block_cache(&cache.0);
        }
        options.set_block_based_table_factory(&table);
        // Memtable memory is counted against the shared budget in arena blocks, and RocksDB's
        // default block is 1 MiB: a store holding a few KiB counted as 1 MiB per column family,
        // so 64 small catch-ups "filled" a 32 MiB budget and forced flushes of tiny tables.
        options.set_arena_block_size(ARENA_BLOCK);
        let o = &self.rocksdb;
        // Explicit: RocksDB's own default is Snappy whenever Snappy is built in.
        options.set_compression_type(o.compression.unwrap_or(Compression::None).rocksdb());
        if let Some(size) = o.write_buffer_size {
            options.set_write_buffer_size(size.0 as usize);
        }
        if let Some(n) = o.max_write_buffer_number {
            options.set_max_write_buffer_number(n);
        }
        if let Some(size) = o.target_file_size_base {
            options.set_target_file_size_base(size.0);
        }
        if let Some(n) = o.level0_file_num_compaction_trigger {
            options.set_level_zero_file_num_compaction_trigger(n);
        }
        options.set_compaction_style(
            o.compaction_style
                .unwrap_or(CompactionStyle::Universal)
                .rocksdb(),
        );
        options
    }

    /// The data column family only ever takes writes while warmstore has the store open: nothing
    /// reads it until warmstore has closed it and the application opens it. That is RocksDB's
    /// bulk-load case for a vector memtable: appends instead of skiplist inserts, sorted once at
    /// flush. The skiplist insert was the largest single cost of a restore (a third of the CPU in
    /// a perf profile); the vector measured 10-20% less CPU per record. Reads of an open store
    /// (tests, never the service) still work, they scan.
    fn data_options(&self) -> Options {
        let mut options = self.column_family_options();
        options.set_memtable_factory(MemtableFactory::Vector);
        options
    }

    /// Database options plus one descriptor per column family, each with its own full options:
    /// `DB::open_cf` would give the named families defaults (format_version 7).
    pub fn db_options(
        &self,
        kind: StoreType,
        create: bool,
    ) -> (Options, Vec<ColumnFamilyDescriptor>) {
        let mut db = self.column_family_options();
        if let Some(n) = self.rocksdb.max_background_jobs {
            db.set_max_background_jobs(n);
        }
        if let Some(memtables) = &self.memtables {
            db.set_write_buffer_manager(&memtables.0);
        }
        // A vector memtable takes no concurrent writers; each store has one writer anyway.
        db.set_allow_concurrent_memtable_write(false);
        db.set_log_level(LogLevel::Warn);
        db.set_info_logger(InfoLogger::new_callback_logger(LogLevel::Warn, rocksdb_log));
        // RocksDB computes a statistics dump for every open database every 10 minutes (and keeps
        // a persisted copy), logged at info level, which the logger above drops. At 1,000 stores
        // that was a visible share of an idle standby's CPU (a profile showed the per-level stats
        // maps of the dump), spent on text no one reads.
        db.set_stats_dump_period_sec(0);
        db.set_stats_persist_period_sec(0);
        db.set_max_open_files(self.max_open_files());
        db.set_writable_file_max_buffer_size(FILE_WRITE_BUFFER);
        db.set_manifest_preallocation_size(MANIFEST_PREALLOCATION);
        // One shard, so the table cache's capacity (`max_open_files` - 10) bounds the table files
        // a store keeps open. With RocksDB's default of 64 shards each shard holds at least one,
        // and a store could keep up to 64 table files open whatever `max_open_files` says.
        db.set_table_cache_num_shard_bits(0);
        // Table files are opened on the thread that opens the store, not on threads RocksDB
        // starts for it (16 by default): a store has a handful, and a thousand stores opening
        // would otherwise start thousands of short-lived threads.
        db.set_max_file_opening_threads(1);
        db.create_if_missing(create);
        db.create_missing_column_families(create);
        // Last, so no override can undo it.
        db.set_atomic_flush(true);
        let families = kind
            .families()
            .iter()
            .map(|&name| {
                let options = if name == kind.data_family() {
                    self.data_options()
                } else {
                    self.column_family_options()
                };
                ColumnFamilyDescriptor::new(name, options)
            })
            .collect();
        (db, families)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn background_threads_follow_the_cores_unless_configured() {
        let none = RocksDbOverrides::default();
        let sized = |o: &RocksDbOverrides, cores| BackgroundThreads::sized(o, cores);
        let pools = |flush, compaction| BackgroundThreads { flush, compaction };
        assert_eq!(sized(&none, 1), pools(1, 1));
        assert_eq!(sized(&none, 2), pools(1, 1));
        assert_eq!(sized(&none, 4), pools(2, 1));
        assert_eq!(sized(&none, 16), pools(8, 4));
        let set = RocksDbOverrides {
            flush_threads: NonZeroU32::new(3),
            compaction_threads: NonZeroU32::new(5),
            ..RocksDbOverrides::default()
        };
        assert_eq!(sized(&set, 2), pools(3, 5));
    }
}
