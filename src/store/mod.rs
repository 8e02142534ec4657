//! One RocksDB database per changelog partition, in Kafka Streams' KIP-1035 layout, written only
//! through commits: every put and delete since the last commit plus the new applied offset go to
//! RocksDB as one `WriteBatch`. With atomic flush forced on, whatever RocksDB persists, in the
//! background or not, is the state as of some commit together with that commit's offset.

mod compaction;
pub mod descriptors;
mod directory;
pub mod dirty;
pub mod export;
pub mod format;
pub mod layout;
pub mod lock;
pub mod maintenance;
pub mod meta;
pub mod options;
mod probe;
mod seed;
mod timer;

use rocksdb::{FlushOptions, WriteBatch, WriteOptions, DB};
use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use directory::delete;
use dirty::{Action, Identity, LogBounds, UncleanPolicy, WipeReason};
pub use format::TopicPartition;
use format::{encode_i64, OFFSETS_CF, STATUS_CLOSED, STATUS_KEY, STATUS_OPEN};
pub use layout::{Layout, StorePaths, StoreType};
use lock::StoreLock;
pub use options::{
    BackgroundThreads, CompactionStyle, Compression, RocksDbOverrides, StoreOptions,
};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store {dir} is locked by {holder}; only one warmstore process may open a store")]
    Locked { dir: PathBuf, holder: String },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("RocksDB failed on {dir}: {source}")]
    Rocks {
        dir: PathBuf,
        source: rocksdb::Error,
    },
    #[error("store {dir} has uncommitted writes and no offset to commit them at")]
    UncommittedAtClose { dir: PathBuf },
}

/// What `open` did, for logs and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenOutcome {
    Resumed { applied: i64, unclean: bool },
    Empty,
    Wiped { reason: WipeReason, detail: String },
}

pub struct Store {
    db: DB,
    paths: StorePaths,
    tp: TopicPartition,
    offset_key: Vec<u8>,
    options: StoreOptions,
    write_options: WriteOptions,
    /// The uncommitted buffer (KIP-892): nothing in it is visible to RocksDB until `commit`.
    batch: WriteBatch,
    /// The stored form of the value being put, reused across records.
    value: Vec<u8>,
    applied: Option<i64>,
    /// When the oldest commit not yet flushed was written.
    unflushed_since: Option<Instant>,
    /// Whether `status` 1 has been written since open. It rides in the first commit's batch, so
    /// whatever reaches the disk after open carries it, and opening costs no write and no flush: a
    /// crash before that commit's flush leaves the store exactly as it was closed.
    marked_open: bool,
    /// Whether a large catch-up turned automatic compaction off (`compaction`).
    compaction_deferred: bool,
    /// Declared after `db`, so the database closes before the lock goes.
    lock: StoreLock,
}

/// The time-bound flush rule (KAFKA-20663): flush once the oldest unflushed commit is `interval` old,
/// so a crash with WAL off never sends a store back further than that.
pub fn flush_due(unflushed_since: Option<Instant>, now: Instant, interval: Duration) -> bool {
    flush_due_in(unflushed_since, now, interval) == Some(Duration::ZERO)
}

/// How long until the time-bound rule says flush: `None` when everything committed is flushed,
/// zero when a flush is due now.
pub fn flush_due_in(
    unflushed_since: Option<Instant>,
    now: Instant,
    interval: Duration,
) -> Option<Duration> {
    unflushed_since.map(|since| interval.saturating_sub(now.saturating_duration_since(since)))
}

fn rocks(dir: &Path) -> impl FnOnce(rocksdb::Error) -> StoreError + '_ {
    move |source| StoreError::Rocks {
        dir: dir.to_path_buf(),
        source,
    }
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// State directories are 0750, as Kafka Streams makes them.
pub fn create_private_dir(path: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(path)
}

impl Store {
    /// Locks the store, applies the dirty rules to what is on disk and returns a store ready for
    /// commits: resumed, empty, or wiped and recreated. `bounds` are the partition's offsets when the
    /// broker could be asked; without them only the local rules apply.
    pub fn open(
        paths: StorePaths,
        tp: TopicPartition,
        options: &StoreOptions,
        policy: UncleanPolicy,
        bounds: Option<LogBounds>,
    ) -> Result<(Store, OpenOutcome), StoreError> {
        if let Some(parent) = paths.db.parent() {
            create_private_dir(parent).map_err(io_at(parent))?;
        }
        let lock = StoreLock::acquire(&paths.lock, &paths.db)?;
        match lock::rocksdb_lock_holder(&paths.db) {
            Ok(None) => {}
            Ok(Some(pid)) => {
                return Err(StoreError::Locked {
                    dir: paths.db.clone(),
                    holder: format!("another process (pid {pid}) that has the database open"),
                })
            }
            Err(source) => {
                let path = paths.db.join("LOCK");
                return Err(StoreError::Io { path, source });
            }
        }
        let (facts, db) = probe::probe(&paths, &tp, options);
        let action = dirty::decide(&facts, policy, bounds);
        // A store kept as found lacks warmstore's metadata only when something else made it
        // (Kafka Streams); a created or rebuilt one has it from its creation.
        let adopted = db.is_some()
            && !matches!(action, Action::Wipe { .. })
            && matches!(facts.identity, Identity::Unknown);
        let (db, outcome) = match action {
            Action::Resume { applied, unclean } => match db {
                Some(db) => (db, OpenOutcome::Resumed { applied, unclean }),
                None => unreachable!("a store with an offset was opened"),
            },
            Action::StartEmpty => match db {
                Some(db) => (db, OpenOutcome::Empty),
                None => (directory::create(&paths, &tp, options)?, OpenOutcome::Empty),
            },
            Action::Wipe { reason, detail } => {
                drop(db);
                (
                    directory::wipe_and_create(&paths, &tp, options, reason, &detail)?,
                    OpenOutcome::Wiped { reason, detail },
                )
            }
        };
        if adopted {
            meta::write(&paths.db, &meta::StoreMeta::new(&tp)).map_err(io_at(&paths.db))?;
        }
        let applied = match outcome {
            OpenOutcome::Resumed { applied, .. } => Some(applied),
            _ => None,
        };
        let store = Store::ready(db, lock, paths, tp, options.clone(), applied)?;
        Ok((store, outcome))
    }

    /// Sets up the empty buffer; `status` 1 waits for the first commit.
    fn ready(
        db: DB,
        mut lock: StoreLock,
        paths: StorePaths,
        tp: TopicPartition,
        options: StoreOptions,
        applied: Option<i64>,
    ) -> Result<Store, StoreError> {
        lock.yield_to_rocksdb();
        let mut write_options = WriteOptions::default();
        write_options.disable_wal(!options.wal);
        Ok(Store {
            db,
            offset_key: tp.offset_key(),
            tp,
            options,
            write_options,
            batch: WriteBatch::default(),
            value: Vec::new(),
            applied,
            unflushed_since: None,
            marked_open: false,
            compaction_deferred: false,
            lock,
            paths,
        })
    }

    /// Offset of the last record whose effect is committed; `None` for an empty store.
    pub fn applied(&self) -> Option<i64> {
        self.applied
    }

    /// Buffers a put until the next commit. `timestamp` is the record's (milliseconds, -1 for
    /// none); only a timestamped store keeps it.
    pub fn put(&mut self, key: &[u8], value: &[u8], timestamp: i64) -> Result<(), StoreError> {
        let kind = self.paths.kind;
        match kind {
            // The value as it came: no copy on the common path.
            StoreType::KeyValue => self.batch.put(key, value),
            StoreType::TimestampedKeyValue => {
                kind.encode_value(timestamp, value, &mut self.value);
                let family = family(&self.db, &self.paths.db, kind.data_family())?;
                self.batch.put_cf(family, key, &self.value);
            }
        }
        Ok(())
    }

    /// Buffers a delete (a tombstone) until the next commit.
    pub fn delete(&mut self, key: &[u8]) -> Result<(), StoreError> {
        let kind = self.paths.kind;
        match kind {
            StoreType::KeyValue => self.batch.delete(key),
            StoreType::TimestampedKeyValue => {
                let family = family(&self.db, &self.paths.db, kind.data_family())?;
                self.batch.delete_cf(family, key);
            }
        }
        Ok(())
    }

    /// Size of the uncommitted buffer, compared against `max_uncommitted_bytes`.
    pub fn uncommitted_bytes(&self) -> usize {
        self.batch.size_in_bytes()
    }

    pub fn has_uncommitted(&self) -> bool {
        !self.batch.is_empty()
    }

    /// Writes the buffer and `applied_offset` as one batch, then flushes if the oldest unflushed
    /// commit is older than the flush interval. On error the buffer is gone: the caller resumes from
    /// `applied()`, which replays what was lost (replay is idempotent).
    pub fn commit(&mut self, applied_offset: i64) -> Result<(), StoreError> {
        let offsets = offsets_cf(&self.db, &self.paths.db)?;
        let mut batch = std::mem::take(&mut self.batch);
        batch.put_cf(offsets, &self.offset_key, encode_i64(applied_offset));
        if !self.marked_open {
            batch.put_cf(offsets, STATUS_KEY, encode_i64(STATUS_OPEN));
        }
        self.db
            .write_opt(batch, &self.write_options)
            .map_err(rocks(&self.paths.db))?;
        self.marked_open = true;
        self.applied = Some(applied_offset);
        let now = Instant::now();
        self.unflushed_since.get_or_insert(now);
        self.maybe_flush(now)?;
        Ok(())
    }

    /// Flushes when the time bound says so; also called on a timer so idle stores get flushed.
    pub fn maybe_flush(&mut self, now: Instant) -> Result<bool, StoreError> {
        if self.flush_due_within(now, self.options.flush_interval) {
            self.flush()?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Whether a flush is due under a bound tighter than the configured one (never a looser one).
    /// The caller flushes: it knows whether waiting on the disk may hold a shared thread.
    pub fn flush_due_within(&self, now: Instant, bound: Duration) -> bool {
        self.flush_due_in(now, bound) == Some(Duration::ZERO)
    }

    /// How long until a flush falls due under `bound` (as in `flush_due_within`); `None` when
    /// everything committed is flushed. An idle partition wakes for it rather than waiting for the
    /// next idle tick, so a short `flush_interval` holds.
    pub fn flush_due_in(&self, now: Instant, bound: Duration) -> Option<Duration> {
        flush_due_in(
            self.unflushed_since,
            now,
            bound.min(self.options.flush_interval),
        )
    }

    /// One atomic flush of every column family.
    pub fn flush(&mut self) -> Result<(), StoreError> {
        let families = self
            .paths
            .kind
            .families()
            .iter()
            .map(|name| family(&self.db, &self.paths.db, name))
            .collect::<Result<Vec<_>, _>>()?;
        let mut flush_options = FlushOptions::default();
        flush_options.set_wait(true);
        self.db
            .flush_cfs_opt(&families, &flush_options)
            .map_err(rocks(&self.paths.db))?;
        self.unflushed_since = None;
        Ok(())
    }

    /// Clean close: commit what is buffered (at `applied_offset`), write `status` 0, flush, close.
    pub fn close(mut self, applied_offset: Option<i64>) -> Result<(), StoreError> {
        if self.has_uncommitted() {
            let offset = applied_offset.ok_or_else(|| StoreError::UncommittedAtClose {
                dir: self.paths.db.clone(),
            })?;
            self.commit(offset)?;
        }
        self.write_status(STATUS_CLOSED)?;
        self.flush()
    }

    /// Destroys this store and recreates it empty, keeping the lock. Used when the log no longer
    /// matches the store at run time (retention passed it, or the topic was recreated).
    pub fn wipe(self, reason: WipeReason, detail: &str) -> Result<Store, StoreError> {
        let Store {
            db,
            paths,
            tp,
            options,
            mut lock,
            ..
        } = self;
        lock.take_back()?;
        drop(db);
        let db = directory::wipe_and_create(&paths, &tp, &options, reason, detail)?;
        Store::ready(db, lock, paths, tp, options, None)
    }

    /// Reads a committed value as stored (a timestamped store's with its timestamp); the
    /// uncommitted buffer is not visible.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let family = family(&self.db, &self.paths.db, self.paths.kind.data_family())?;
        self.db.get_cf(family, key).map_err(rocks(&self.paths.db))
    }

    /// RocksDB's estimate of the number of keys the store holds.
    pub fn estimated_keys(&self) -> u64 {
        estimated_keys(&self.db)
    }

    /// Bytes of the store directory on disk.
    pub fn disk_bytes(&self) -> u64 {
        dir_bytes(&self.paths.db)
    }

    fn write_status(&mut self, status: i64) -> Result<(), StoreError> {
        let mut batch = WriteBatch::default();
        batch.put_cf(
            offsets_cf(&self.db, &self.paths.db)?,
            STATUS_KEY,
            encode_i64(status),
        );
        self.db
            .write_opt(batch, &self.write_options)
            .map_err(rocks(&self.paths.db))
    }
}

/// RocksDB's estimate of the keys in every family but `offsets` (a timestamped store keeps its
/// data in `keyValueWithTimestamp`, not `default`).
pub fn estimated_keys(db: &DB) -> u64 {
    let mut families = vec![rocksdb::DEFAULT_COLUMN_FAMILY_NAME];
    if db.cf_handle(layout::TIMESTAMPED_CF).is_some() {
        families.push(layout::TIMESTAMPED_CF);
    }
    families
        .into_iter()
        .filter_map(|name| db.cf_handle(name))
        .filter_map(|family| {
            db.property_int_value_cf(family, "rocksdb.estimate-num-keys")
                .ok()
                .flatten()
        })
        .sum()
}

fn offsets_cf<'a>(db: &'a DB, dir: &Path) -> Result<&'a rocksdb::ColumnFamily, StoreError> {
    family(db, dir, OFFSETS_CF)
}

fn family<'a>(db: &'a DB, dir: &Path, name: &str) -> Result<&'a rocksdb::ColumnFamily, StoreError> {
    db.cf_handle(name).ok_or_else(|| StoreError::Io {
        path: dir.to_path_buf(),
        source: io::Error::other(format!("column family `{name}` is missing")),
    })
}

/// Sum of the sizes of the regular files directly in `dir` (RocksDB keeps no subdirectories).
pub fn dir_bytes(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Opens a store read-only, for `inspect` and tests; RocksDB's info log goes to warmstore's log
/// (`StoreOptions::db_options`), so the store's own files are left exactly as they were.
///
/// Every table file is opened at once (`max_open_files` -1): beside a running service a compaction
/// may delete a file after the open read the MANIFEST, and a file opened late would be gone, while
/// one opened early stays readable.
///
/// Every column family the store has is opened, whatever its type.
pub fn open_read_only(dir: &Path) -> Result<DB, rocksdb::Error> {
    let found = DB::list_cf(&options::bare_options(), dir)?;
    let kind = if found.iter().any(|f| f == layout::TIMESTAMPED_CF) {
        StoreType::TimestampedKeyValue
    } else {
        StoreType::KeyValue
    };
    let (db_options, mut families) = StoreOptions {
        rocksdb: RocksDbOverrides {
            max_open_files: Some(-1),
            ..Default::default()
        },
        ..Default::default()
    }
    .db_options(kind, false);
    families.retain(|f| found.iter().any(|name| name == f.name()));
    let known: Vec<String> = families.iter().map(|f| f.name().to_string()).collect();
    for name in found.into_iter().filter(|name| !known.contains(name)) {
        families.push(rocksdb::ColumnFamilyDescriptor::new(
            name,
            options::bare_options(),
        ));
    }
    DB::open_cf_descriptors_read_only(&db_options, dir, families, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flush_is_due_only_when_the_oldest_unflushed_commit_is_old_enough() {
        let now = Instant::now();
        let interval = Duration::from_secs(60);
        assert!(!flush_due(None, now, interval));
        assert!(!flush_due(Some(now), now, interval));
        assert!(!flush_due(
            Some(now),
            now + Duration::from_secs(59),
            interval
        ));
        assert!(flush_due(
            Some(now),
            now + Duration::from_secs(60),
            interval
        ));
    }
}
