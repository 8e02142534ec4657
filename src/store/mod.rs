//! One RocksDB database per changelog partition, in Kafka Streams' KIP-1035 layout, written only
//! through commits: every put and delete since the last commit plus the new applied offset go to
//! RocksDB as one `WriteBatch`. With atomic flush forced on, whatever RocksDB persists, in the
//! background or not, is the state as of some commit together with that commit's offset.

mod compaction;
pub mod descriptors;
pub mod dirty;
pub mod export;
pub mod format;
pub mod layout;
pub mod lock;
pub mod maintenance;
pub mod meta;
pub mod options;

use rocksdb::{FlushOptions, IteratorMode, WriteBatch, WriteOptions, DB};
use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use dirty::{
    Action, Identity, LogBounds, OpenError, StoreFacts, StoredOffset, UncleanPolicy, WipeReason,
};
pub use format::TopicPartition;
use format::{decode_i64, encode_i64, OFFSETS_CF, STATUS_CLOSED, STATUS_KEY, STATUS_OPEN};
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
        let (facts, db) = probe(&paths, &tp, options);
        let (db, outcome) = match dirty::decide(&facts, policy, bounds) {
            Action::Resume { applied, unclean } => match db {
                Some(db) => (db, OpenOutcome::Resumed { applied, unclean }),
                None => unreachable!("a store with an offset was opened"),
            },
            Action::StartEmpty => match db {
                Some(db) => (db, OpenOutcome::Empty),
                None => {
                    let db = under_marker(&paths, "creating the store", || {
                        create_fresh(&paths, &tp, options)
                    })?;
                    (db, OpenOutcome::Empty)
                }
            },
            Action::Wipe { reason, detail } => {
                drop(db);
                (
                    wipe_and_create(&paths, &tp, options, reason, &detail)?,
                    OpenOutcome::Wiped { reason, detail },
                )
            }
        };
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
        if matches!(meta::read(&paths.db), Ok(None)) {
            meta::write(&paths.db, &meta::StoreMeta::new(&tp)).map_err(io_at(&paths.db))?;
        }
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
        let db = wipe_and_create(&paths, &tp, &options, reason, detail)?;
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

/// Learns everything the dirty rules need, opening the database when it exists. Never panics and
/// never changes the store: a failure becomes `open_error`.
fn probe(
    paths: &StorePaths,
    tp: &TopicPartition,
    options: &StoreOptions,
) -> (StoreFacts, Option<DB>) {
    let mut facts = StoreFacts::fresh();
    match fs::read_to_string(&paths.marker) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        found => {
            let under_way = found.map_or_else(
                |e| format!("(unreadable: {e})"),
                |text| text.lines().next().unwrap_or("(empty)").to_string(),
            );
            facts.interrupted_rebuild = Some(under_way);
            return (facts, None);
        }
    }
    match fs::symlink_metadata(&paths.db) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return (facts, None),
        Err(e) => {
            facts.open_error = Some(OpenError::Unreadable(format!(
                "cannot stat the store directory: {e}"
            )));
            return (facts, None);
        }
        Ok(m) if !m.is_dir() => {
            facts.open_error = Some(OpenError::Unreadable(
                "the store path is not a directory".into(),
            ));
            return (facts, None);
        }
        Ok(_) => {}
    }
    if !paths.db.join("CURRENT").exists() {
        let other_files = fs::read_dir(&paths.db)
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .any(|e| e.file_name() != meta::META_FILE)
            })
            .unwrap_or(true);
        if other_files {
            facts.open_error = Some(OpenError::Unreadable(
                "RocksDB's CURRENT file is missing".into(),
            ));
        }
        return (facts, None);
    }
    match meta::read(&paths.db) {
        Ok(Some(m)) => facts.identity = m.identity(tp),
        Ok(None) => facts.identity = Identity::Unknown,
        Err(error) => {
            facts.open_error = Some(OpenError::Unreadable(error.to_string()));
            return (facts, None);
        }
    }
    // RocksDB refuses to open a store without naming each of its families, and Kafka Streams
    // refuses one with a family it does not expect: a store of another type is rebuilt.
    match DB::list_cf(&options::bare_options(), &paths.db) {
        Ok(found) => {
            if let Some(shape) = other_families(paths.kind, found) {
                facts.identity = shape;
                return (facts, None);
            }
        }
        Err(e) => {
            facts.open_error = Some(open_error(e));
            return (facts, None);
        }
    }
    let (db_options, families) = options.db_options(paths.kind, false);
    let db = match DB::open_cf_descriptors(&db_options, &paths.db, families) {
        Ok(db) => db,
        Err(e) => {
            facts.open_error = Some(open_error(e));
            return (facts, None);
        }
    };
    if let Err(error) = read_facts(&db, tp, paths.kind, &mut facts) {
        facts.open_error = Some(error);
        return (facts, None);
    }
    (facts, Some(db))
}

fn open_error(error: rocksdb::Error) -> OpenError {
    OpenError::from_rocksdb(error.kind(), error.into_string())
}

/// `Some` when a store's column families are not exactly those of `kind`.
fn other_families(kind: StoreType, mut found: Vec<String>) -> Option<Identity> {
    let mut expected: Vec<String> = kind.families().iter().map(|f| f.to_string()).collect();
    found.sort();
    expected.sort();
    (found != expected).then(|| Identity::OtherType {
        found: found.join(", "),
        expected: kind.label(),
    })
}

/// Fills status, applied offset, identity (from foreign offset keys) and whether data is present
/// in any family but `offsets` (data in a timestamped store's `default` counts too).
fn read_facts(
    db: &DB,
    tp: &TopicPartition,
    kind: StoreType,
    facts: &mut StoreFacts,
) -> Result<(), OpenError> {
    let offsets = db
        .cf_handle(OFFSETS_CF)
        .ok_or_else(|| OpenError::Unreadable("column family `offsets` is missing".into()))?;
    let own_key = tp.offset_key();
    let mut foreign = None;
    for item in db.iterator_cf(offsets, IteratorMode::Start) {
        let (key, value) = item.map_err(open_error)?;
        if &*key == STATUS_KEY {
            facts.status = decode_i64(&value);
        } else if *key == *own_key {
            facts.applied =
                decode_i64(&value).map_or(StoredOffset::Unreadable, StoredOffset::Valid);
        } else {
            foreign.get_or_insert_with(|| String::from_utf8_lossy(&key).into_owned());
        }
    }
    if let (Some(other), StoredOffset::Absent) = (foreign, facts.applied) {
        facts.identity = Identity::OtherPartition(other);
    }
    for name in kind.families().iter().filter(|&&name| name != OFFSETS_CF) {
        let family = db
            .cf_handle(name)
            .ok_or_else(|| OpenError::Unreadable(format!("column family `{name}` is missing")))?;
        if let Some(item) = db.iterator_cf(family, IteratorMode::Start).next() {
            item.map_err(open_error)?;
            facts.has_data = true;
        }
    }
    Ok(())
}

fn create_fresh(
    paths: &StorePaths,
    tp: &TopicPartition,
    options: &StoreOptions,
) -> Result<DB, StoreError> {
    create_private_dir(&paths.db).map_err(io_at(&paths.db))?;
    meta::write(&paths.db, &meta::StoreMeta::new(tp)).map_err(io_at(&paths.db))?;
    let (db_options, families) = options.db_options(paths.kind, true);
    DB::open_cf_descriptors(&db_options, &paths.db, families).map_err(rocks(&paths.db))
}

/// Destroy, remove, recreate, under the marker. Once the fresh store exists the rebuild is an
/// ordinary restore, which the commit protocol keeps crash-safe, so the marker goes.
fn wipe_and_create(
    paths: &StorePaths,
    tp: &TopicPartition,
    options: &StoreOptions,
    reason: WipeReason,
    detail: &str,
) -> Result<DB, StoreError> {
    tracing::warn!(
        store_dir = %paths.db.display(),
        topic = %tp.topic,
        partition = tp.partition,
        reason = reason.label(),
        detail,
        "wiping store; it will be rebuilt from the changelog's log-start offset"
    );
    let under_way = format!("wiping the store ({}: {detail})", reason.label());
    under_marker(paths, &under_way, || {
        remove_store_dir(&paths.db)?;
        create_fresh(paths, tp, options)
    })
}

/// Runs a change that takes the store's directory outside the commit protocol (creating, wiping,
/// deleting it) under a marker beside the store, so that a kill half-way is found on the next open
/// as `interrupted_rebuild`: what is left then was never committed to, or is being thrown away,
/// and its files are not damaged. Without the marker, a kill while RocksDB creates a store leaves
/// a directory without `CURRENT` (read as `corruption`) or without the `offsets` family (read as
/// `format_mismatch`), and sends an operator to check a healthy volume.
fn under_marker<T>(
    paths: &StorePaths,
    under_way: &str,
    change: impl FnOnce() -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    fs::write(&paths.marker, format!("{under_way}\n")).map_err(io_at(&paths.marker))?;
    let value = change()?;
    fs::remove_file(&paths.marker).map_err(io_at(&paths.marker))?;
    Ok(value)
}

fn remove_store_dir(path: &Path) -> Result<(), StoreError> {
    let result = match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
        Ok(m) if m.is_dir() => {
            // DestroyDB removes what RocksDB knows; remove_dir_all the rest (our metadata, debris).
            let _ = DB::destroy(&options::bare_options(), path);
            match fs::remove_dir_all(path) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                other => other,
            }
        }
        Ok(_) => fs::remove_file(path),
    };
    result.map_err(io_at(path))
}

/// Deletes a closed store and its lock and marker: group mode's end of a store revoked long
/// enough ago. The lock is taken first, so a store that another process has open is left alone.
/// The marker covers the removal: a crash half-way leaves a store that the next open wipes
/// (`interrupted_rebuild`) rather than one it trusts.
pub fn delete(paths: &StorePaths) -> Result<(), StoreError> {
    let lock = StoreLock::acquire(&paths.lock, &paths.db)?;
    under_marker(
        paths,
        "deleting the store (revoked longer than keep_unassigned ago)",
        || remove_store_dir(&paths.db),
    )?;
    drop(lock);
    match fs::remove_file(&paths.lock) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_at(&paths.lock)(e)),
        _ => Ok(()),
    }
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

    #[test]
    fn a_store_of_another_type_is_told_apart_by_its_families() {
        let names = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            other_families(StoreType::KeyValue, names(&["offsets", "default"])),
            None
        );
        assert_eq!(
            other_families(
                StoreType::TimestampedKeyValue,
                names(&["default", "keyValueWithTimestamp", "offsets"])
            ),
            None
        );
        assert_eq!(
            other_families(
                StoreType::TimestampedKeyValue,
                names(&["default", "offsets"])
            ),
            Some(Identity::OtherType {
                found: "default, offsets".into(),
                expected: "timestamped_key_value"
            })
        );
        assert!(other_families(StoreType::KeyValue, names(&["default"])).is_some());
    }
}
