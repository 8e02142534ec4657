//! A consistent copy of a store, taken while `warmstore run` keeps writing it, for an application
//! to start from.
//!
//! The copy is a RocksDB checkpoint of a read-only open: the read-only open sees the store as of
//! its last flush, which atomic flush makes one commit's data together with that commit's offset;
//! the checkpoint hard-links its table files (copies them across file systems) and copies the
//! MANIFEST up to that point. The copy is then closed as a clean close would leave it (`status`
//! 0), written beside its destination and renamed into place.
//!
//! Kafka Streams before 4.3 has no `offsets` column family and refuses a store with one; for it the
//! family is dropped from the copy and the offset goes into the task directory's `.checkpoint`.

use rocksdb::checkpoint::Checkpoint;
use rocksdb::{FlushOptions, WriteBatch, DB};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::format::{decode_i64, encode_i64, OFFSETS_CF, STATUS_CLOSED, STATUS_KEY};
use super::{create_private_dir, lock, open_read_only, StoreOptions, StorePaths, TopicPartition};

/// Kafka Streams' name for the offsets file of a task directory (`OffsetCheckpoint`).
pub const CHECKPOINT_FILE: &str = ".checkpoint";
/// A read-only open or a checkpoint can meet a table file that the running writer's compaction
/// just deleted; a second look sees the newer MANIFEST.
const ATTEMPTS: u32 = 5;

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("{path} is locked by a running process (pid {pid}); export into a directory no application has open")]
    InUse { path: PathBuf, pid: i32 },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("RocksDB failed on {path}: {source}")]
    Rocks {
        path: PathBuf,
        source: rocksdb::Error,
    },
    #[error("{path} holds no offset for {tp}: nothing committed yet to export, or the store was made for another changelog partition (`warmstore inspect` shows its offsets)")]
    NoOffset { path: PathBuf, tp: TopicPartition },
    #[error("no store at {path}: this partition was never restored into this state directory")]
    NoStore { path: PathBuf },
}

/// Where a copy went and the offset of the commit it holds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Exported {
    pub path: PathBuf,
    pub topic: String,
    pub partition: i32,
    pub applied_offset: i64,
    /// The offset went into the task's `.checkpoint` (Kafka Streams before 4.3).
    pub checkpoint_file: bool,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ExportError + '_ {
    move |source| ExportError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn rocks(path: &Path) -> impl FnOnce(rocksdb::Error) -> ExportError + '_ {
    move |source| ExportError::Rocks {
        path: path.to_path_buf(),
        source,
    }
}

/// Copies the store at `source` to `target`. `locks` are files an application holds with `fcntl`
/// while it runs (Kafka Streams' `.lock` files); a held one refuses the export.
pub fn export(
    source: &StorePaths,
    target: &StorePaths,
    tp: &TopicPartition,
    locks: &[PathBuf],
    checkpoint_file: bool,
) -> Result<Exported, ExportError> {
    // Checked before anything is written to the target.
    if !source.db.exists() {
        return Err(ExportError::NoStore {
            path: source.db.clone(),
        });
    }
    for path in locks.iter().chain([&target.db.join("LOCK")]) {
        if let Some(pid) = lock::fcntl_lock_holder(path).map_err(io(path))? {
            return Err(ExportError::InUse {
                path: path.clone(),
                pid,
            });
        }
    }
    let parent = target.db.parent().unwrap_or(Path::new("."));
    create_private_dir(parent).map_err(io(parent))?;
    let name = target
        .db
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let staging = parent.join(format!(".{name}.export"));
    // A copy that fails half way is not left in the application's state directory.
    let applied = match checkpoint(&source.db, &staging)
        .and_then(|()| close_cleanly(&staging, target, tp, checkpoint_file))
    {
        Ok(applied) => applied,
        Err(error) => {
            let _ = remove_dir(&staging);
            return Err(error);
        }
    };
    install(&staging, &target.db)?;
    if checkpoint_file {
        let task_dir = parent.parent().unwrap_or(parent);
        write_checkpoint_file(task_dir, tp, applied)?;
    }
    Ok(Exported {
        path: target.db.clone(),
        topic: tp.topic.clone(),
        partition: tp.partition,
        applied_offset: applied,
        checkpoint_file,
    })
}

/// A checkpoint of the store's flushed state into `staging`, which must not exist.
fn checkpoint(source: &Path, staging: &Path) -> Result<(), ExportError> {
    let mut attempt = 0;
    loop {
        remove_dir(staging)?;
        let result = open_read_only(source).and_then(|db| {
            let result = Checkpoint::new(&db)?.create_checkpoint(staging);
            drop(db);
            result
        });
        match result {
            Ok(()) => return Ok(()),
            Err(_) if attempt + 1 < ATTEMPTS => {
                attempt += 1;
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(source_error) => return Err(rocks(source)(source_error)),
        }
    }
}

/// Opens the copy, marks it closed, drops `offsets` for a `.checkpoint` reader, and flushes
/// everything into table files; returns the applied offset it holds.
fn close_cleanly(
    staging: &Path,
    target: &StorePaths,
    tp: &TopicPartition,
    checkpoint_file: bool,
) -> Result<i64, ExportError> {
    let (db_options, families) = StoreOptions::default().db_options(target.kind, false);
    let mut db = DB::open_cf_descriptors(&db_options, staging, families).map_err(rocks(staging))?;
    let offsets = db
        .cf_handle(OFFSETS_CF)
        .ok_or_else(|| missing(staging, OFFSETS_CF))?;
    let applied = db
        .get_cf(offsets, tp.offset_key())
        .map_err(rocks(staging))?
        .and_then(|v| decode_i64(&v))
        .ok_or_else(|| ExportError::NoOffset {
            path: staging.to_path_buf(),
            tp: tp.clone(),
        })?;
    let mut batch = WriteBatch::default();
    batch.put_cf(offsets, STATUS_KEY, encode_i64(STATUS_CLOSED));
    db.write(batch).map_err(rocks(staging))?;
    let handles = target
        .kind
        .families()
        .iter()
        .map(|name| db.cf_handle(name).ok_or_else(|| missing(staging, name)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut flush = FlushOptions::default();
    flush.set_wait(true);
    db.flush_cfs_opt(&handles, &flush).map_err(rocks(staging))?;
    if checkpoint_file {
        db.drop_cf(OFFSETS_CF).map_err(rocks(staging))?;
    }
    drop(db);
    Ok(applied)
}

fn missing(path: &Path, family: &str) -> ExportError {
    ExportError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::other(format!("column family `{family}` is missing")),
    }
}

/// Renames the finished copy into place. A store already there is moved aside first and removed
/// after, so the destination holds the old store or the new one, never a mix.
fn install(staging: &Path, destination: &Path) -> Result<(), ExportError> {
    let replaced = destination.with_file_name(format!(
        ".{}.replaced",
        destination
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    ));
    remove_dir(&replaced)?;
    if destination.exists() {
        fs::rename(destination, &replaced).map_err(io(destination))?;
    }
    fs::rename(staging, destination).map_err(io(destination))?;
    remove_dir(&replaced)?;
    sync_dir(destination.parent().unwrap_or(Path::new(".")))
}

fn remove_dir(path: &Path) -> Result<(), ExportError> {
    match fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(path)(e)),
        _ => Ok(()),
    }
}

fn sync_dir(path: &Path) -> Result<(), ExportError> {
    fs::File::open(path)
        .and_then(|dir| dir.sync_all())
        .map_err(io(path))
}

/// Kafka Streams' `OffsetCheckpoint` text: version `0`, the number of entries, then one
/// `topic partition offset` line each, the offset being the last one the store holds.
pub fn checkpoint_text(entries: &[(TopicPartition, i64)]) -> String {
    let mut text = format!("0\n{}\n", entries.len());
    for (tp, offset) in entries {
        text += &format!("{} {} {offset}\n", tp.topic, tp.partition);
    }
    text
}

/// The entries of a `.checkpoint` text; `None` for a version or line this does not understand.
pub fn parse_checkpoint(text: &str) -> Option<Vec<(TopicPartition, i64)>> {
    let mut lines = text.lines();
    if lines.next()?.trim() != "0" {
        return None;
    }
    let count: usize = lines.next()?.trim().parse().ok()?;
    let entries = lines
        .take(count)
        .map(|line| {
            let mut fields = line.split_whitespace();
            let topic = fields.next()?;
            let partition = fields.next()?.parse().ok()?;
            let offset = fields.next()?.parse().ok()?;
            Some((TopicPartition::new(topic, partition), offset))
        })
        .collect::<Option<Vec<_>>>()?;
    (entries.len() == count).then_some(entries)
}

/// Adds or replaces this partition's entry in the task's `.checkpoint` (other stores of the task
/// keep theirs), written to `.checkpoint.tmp` and renamed, as Kafka Streams writes it.
fn write_checkpoint_file(
    task_dir: &Path,
    tp: &TopicPartition,
    applied: i64,
) -> Result<(), ExportError> {
    let path = task_dir.join(CHECKPOINT_FILE);
    let mut entries = match fs::read_to_string(&path) {
        Ok(text) => parse_checkpoint(&text).unwrap_or_default(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io(&path)(e)),
    };
    entries.retain(|(other, _)| other != tp);
    entries.push((tp.clone(), applied));
    entries.sort();
    let tmp = task_dir.join(format!("{CHECKPOINT_FILE}.tmp"));
    let mut file = fs::File::create(&tmp).map_err(io(&tmp))?;
    file.write_all(checkpoint_text(&entries).as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(io(&tmp))?;
    fs::rename(&tmp, &path).map_err(io(&path))?;
    sync_dir(task_dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checkpoint_text_is_kafka_streams_offset_checkpoint() {
        let entries = vec![
            (TopicPartition::new("app-counts-changelog", 3), 41),
            (TopicPartition::new("app-totals-changelog", 3), 7),
        ];
        assert_eq!(
            checkpoint_text(&entries),
            "0\n2\napp-counts-changelog 3 41\napp-totals-changelog 3 7\n"
        );
        assert_eq!(parse_checkpoint(&checkpoint_text(&entries)), Some(entries));
        assert_eq!(checkpoint_text(&[]), "0\n0\n");
    }

    /// Found by hand: a partition listed in the config with no store on disk failed with
    /// RocksDB's "No such file or directory ... CURRENT", and a copy without the partition's
    /// offset (a store made for another changelog) left its staging directory in the target.
    #[test]
    fn an_export_that_cannot_copy_says_why_and_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let (source, target) = (dir.path().join("live"), dir.path().join("copy"));
        let tp = TopicPartition::new("counts-changelog", 0);
        let (from, to) = (
            StorePaths::new(&source, "s", 0),
            StorePaths::new(&target, "s", 0),
        );
        match export(&from, &to, &tp, &[], false) {
            Err(ExportError::NoStore { path }) => assert_eq!(path, from.db),
            other => panic!("expected no store, got {other:?}"),
        }

        // A store whose offsets are another changelog partition's.
        let mut options = rocksdb::Options::default();
        options.create_if_missing(true);
        options.create_missing_column_families(true);
        let db = DB::open_cf(&options, &from.db, from.kind.families()).unwrap();
        let offsets = db.cf_handle(OFFSETS_CF).unwrap();
        let other = TopicPartition::new("other-changelog", 0);
        db.put_cf(offsets, other.offset_key(), encode_i64(5))
            .unwrap();
        drop(db);
        match export(&from, &to, &tp, &[], false) {
            Err(error @ ExportError::NoOffset { .. }) => {
                assert!(error
                    .to_string()
                    .contains("made for another changelog partition"))
            }
            other => panic!("expected no offset, got {other:?}"),
        }
        let left: Vec<_> = fs::read_dir(to.db.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "left in the target: {left:?}");
    }

    #[test]
    fn a_checkpoint_text_this_does_not_understand_is_none() {
        assert_eq!(parse_checkpoint("1\n0\n"), None);
        assert_eq!(parse_checkpoint("0\n2\nt 0 1\n"), None);
        assert_eq!(parse_checkpoint("0\n1\nt zero 1\n"), None);
        assert_eq!(parse_checkpoint(""), None);
    }
}
