//! The store on a real RocksDB in temporary directories: layout, bytes, options, lock; the dirty
//! rules in `dirty.rs`.

#[path = "../common/mod.rs"]
mod common;
mod dirty;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use warmstore::store::dirty::{LogBounds, UncleanPolicy, WipeReason};
use warmstore::store::format::TopicPartition;
use warmstore::store::{
    open_read_only, OpenOutcome, RocksDbOverrides, Store, StoreError, StoreOptions, StorePaths,
    StoreType,
};
use warmstore::units::ByteSize;

fn tp() -> TopicPartition {
    TopicPartition::new("wordcount-counts-changelog", 0)
}

fn paths(dir: &Path) -> StorePaths {
    StorePaths::new(dir, "counts", 0)
}

fn open_with(
    dir: &Path,
    tp: TopicPartition,
    policy: UncleanPolicy,
    bounds: Option<LogBounds>,
) -> (Store, OpenOutcome) {
    Store::open(paths(dir), tp, &StoreOptions::default(), policy, bounds).expect("store opens")
}

fn open_with_options(dir: &Path, options: &StoreOptions) -> Store {
    let opened = Store::open(paths(dir), tp(), options, UncleanPolicy::Resume, None);
    opened.expect("store opens").0
}

fn open(dir: &Path) -> (Store, OpenOutcome) {
    open_with(dir, tp(), UncleanPolicy::Resume, None)
}

/// A closed store with a few keys committed at offset 42, flushed into SST files.
fn closed_store(dir: &Path) {
    let (mut store, outcome) = open(dir);
    assert_eq!(outcome, OpenOutcome::Empty);
    store.put(b"apple", b"1", 0).unwrap();
    store.put(b"pear", b"2", 0).unwrap();
    store.commit(41).unwrap();
    store.put(b"plum", b"3", 0).unwrap();
    store.delete(b"pear").unwrap();
    store.close(Some(42)).unwrap();
}

/// What opening `closed_store`'s store again gives when nothing has happened to it.
const CLOSED_STORE_REOPENED: OpenOutcome = OpenOutcome::Resumed {
    applied: 42,
    unclean: false,
};

/// Raw `offsets` entries and `default` contents, read the way any RocksDB reader would.
type Entries = Vec<(Vec<u8>, Vec<u8>)>;

fn raw(dir: &Path) -> (Entries, Entries) {
    // Beside a live writer, a compaction can delete a file between the MANIFEST read and its open.
    let db = (0..20)
        .find_map(|_| {
            open_read_only(&paths(dir).db)
                .map_err(|_| std::thread::sleep(std::time::Duration::from_millis(20)))
                .ok()
        })
        .expect("read-only open");
    let read = |cf| {
        db.iterator_cf(cf, rocksdb::IteratorMode::Start)
            .map(|item| {
                let (k, v) = item.unwrap();
                (k.to_vec(), v.to_vec())
            })
            .collect::<Vec<_>>()
    };
    let offsets = read(db.cf_handle("offsets").unwrap());
    let data = read(db.cf_handle("default").unwrap());
    (offsets, data)
}

fn wiped_reason(outcome: OpenOutcome) -> WipeReason {
    match outcome {
        OpenOutcome::Wiped { reason, .. } => reason,
        other => panic!("expected a wipe, got {other:?}"),
    }
}

fn files_ending(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    files_named(dir, |name| name.ends_with(suffix))
}

fn files_starting(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    files_named(dir, |name| name.starts_with(prefix))
}

/// The files in `dir` whose names `keep` accepts, sorted.
fn files_named(dir: &Path, keep: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let mut files: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| keep(&p.file_name().unwrap().to_string_lossy()))
        .collect();
    files.sort();
    files
}

#[test]
fn round_trip_keeps_offsets_and_data() {
    let dir = tempfile::tempdir().unwrap();
    closed_store(dir.path());
    let (store, outcome) = open(dir.path());
    assert_eq!(outcome, CLOSED_STORE_REOPENED);
    assert_eq!(store.applied(), Some(42));
    assert_eq!(store.get(b"apple").unwrap(), Some(b"1".to_vec()));
    assert_eq!(store.get(b"pear").unwrap(), None);
    assert_eq!(store.get(b"plum").unwrap(), Some(b"3".to_vec()));
}

/// New stores are copies of one empty database made once per process. Each must still have an
/// identity of its own (tools tell databases apart by it), and the same one in its `IDENTITY`
/// file as in what RocksDB reports.
#[test]
fn each_new_store_has_an_identity_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let partition = |p| StorePaths::new(dir.path(), "counts", p);
    let in_file = |p| fs::read_to_string(partition(p).db.join("IDENTITY")).unwrap();
    let reported = |p| {
        let db = open_read_only(&partition(p).db).unwrap();
        String::from_utf8(db.get_db_identity().unwrap()).unwrap()
    };
    for p in 0..3 {
        let tp = TopicPartition::new("wordcount-counts-changelog", p);
        let options = StoreOptions::default();
        let (store, outcome) =
            Store::open(partition(p), tp, &options, UncleanPolicy::Resume, None).unwrap();
        assert_eq!(outcome, OpenOutcome::Empty);
        store.close(None).unwrap();
    }
    let identities: Vec<String> = (0..3).map(in_file).collect();
    for (p, identity) in identities.iter().enumerate() {
        assert_eq!(identity.trim().len(), 36, "{identity:?}");
        assert_eq!(reported(p as i32), identity.trim());
    }
    let distinct: std::collections::HashSet<&String> = identities.iter().collect();
    assert_eq!(distinct.len(), 3, "{identities:?}");
    assert_eq!((0..3).map(in_file).collect::<Vec<_>>(), identities);
}

/// A new store's `IDENTITY` file is written without a sync (its MANIFEST, synced, holds the same
/// identity), so a power loss can leave it empty. The store must still resume as it was, with
/// its identity back.
#[test]
fn a_store_whose_identity_file_lost_its_contents_resumes() {
    let dir = tempfile::tempdir().unwrap();
    closed_store(dir.path());
    let file = paths(dir.path()).db.join("IDENTITY");
    let identity = fs::read_to_string(&file).unwrap();
    fs::write(&file, "").unwrap();
    let (store, outcome) = open(dir.path());
    assert_eq!(outcome, CLOSED_STORE_REOPENED);
    assert_eq!(store.get(b"plum").unwrap(), Some(b"3".to_vec()));
    assert_eq!(fs::read_to_string(&file).unwrap(), identity);
}

#[test]
fn offsets_entries_are_byte_exact_kafka_streams() {
    let dir = tempfile::tempdir().unwrap();
    closed_store(dir.path());
    let (offsets, data) = raw(dir.path());
    assert_eq!(
        offsets,
        vec![
            (b"status".to_vec(), vec![0, 0, 0, 0, 0, 0, 0, 0]),
            (
                b"wordcount-counts-changelog-0".to_vec(),
                vec![0, 0, 0, 0, 0, 0, 0, 42]
            ),
        ]
    );
    assert_eq!(
        data,
        vec![
            (b"apple".to_vec(), b"1".to_vec()),
            (b"plum".to_vec(), b"3".to_vec())
        ]
    );

    // While open, status is 1 (visible here once flushed), and a large offset keeps all 8 bytes.
    let (mut store, _) = open(dir.path());
    store.commit(0x0102_0304_0506).unwrap();
    store.flush().unwrap();
    let (offsets, _) = raw(dir.path());
    assert_eq!(
        offsets[0],
        (b"status".to_vec(), vec![0, 0, 0, 0, 0, 0, 0, 1])
    );
    assert_eq!(offsets[1].1, vec![0, 0, 1, 2, 3, 4, 5, 6]);
}

#[test]
fn uncommitted_writes_never_reach_rocksdb() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = open(dir.path());
    store.put(b"a", b"committed", 0).unwrap();
    store.commit(7).unwrap();
    store.put(b"a", b"uncommitted", 0).unwrap();
    store.put(b"b", b"uncommitted", 0).unwrap();
    assert!(store.uncommitted_bytes() > 0);
    assert_eq!(store.get(b"a").unwrap(), Some(b"committed".to_vec()));
    assert_eq!(store.get(b"b").unwrap(), None);
    drop(store); // no close: like a crash, but RocksDB still flushes what was committed.
    let (store, outcome) = open(dir.path());
    assert_eq!(
        outcome,
        OpenOutcome::Resumed {
            applied: 7,
            unclean: true
        }
    );
    assert_eq!(store.get(b"a").unwrap(), Some(b"committed".to_vec()));
    assert_eq!(store.get(b"b").unwrap(), None);
}

#[test]
fn close_refuses_to_drop_uncommitted_writes_without_an_offset() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = open(dir.path());
    store.put(b"a", b"1", 0).unwrap();
    assert!(matches!(
        store.close(None),
        Err(StoreError::UncommittedAtClose { .. })
    ));
}

#[test]
fn options_file_forces_atomic_flush_and_format_version_6() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions {
        rocksdb: RocksDbOverrides {
            atomic_flush: Some(false),
            write_buffer_size: Some(ByteSize(1 << 20)),
            ..Default::default()
        },
        ..Default::default()
    };
    let store = open_with_options(dir.path(), &options);
    store.close(None).unwrap();
    let options_file = files_starting(&paths(dir.path()).db, "OPTIONS-")
        .pop()
        .expect("an OPTIONS file");
    let text = fs::read_to_string(options_file).unwrap();
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    assert!(lines.contains(&"atomic_flush=true"), "{text}");
    assert!(!lines.contains(&"atomic_flush=false"));
    // The lines under a section's header, up to the next header.
    let section = |header: String| -> Vec<&str> {
        let start = lines
            .iter()
            .position(|l| *l == header)
            .unwrap_or_else(|| panic!("{header} in {text}"));
        lines[start + 1..]
            .iter()
            .take_while(|l| !l.starts_with('['))
            .copied()
            .collect()
    };
    for family in ["default", "offsets"] {
        let table = section(format!("[TableOptions/BlockBasedTable \"{family}\"]"));
        assert!(table.contains(&"format_version=6"), "{family}: {table:?}");
        let family_options = section(format!("[CFOptions \"{family}\"]"));
        assert!(
            family_options.contains(&"write_buffer_size=1048576"),
            "{family}: {family_options:?}"
        );
        // Uncompressed, as Kafka Streams writes: RocksDB itself would pick Snappy.
        assert!(
            family_options.contains(&"compression=kNoCompression"),
            "{family}: {family_options:?}"
        );
    }
}

#[test]
fn unflushed_commits_are_flushed_once_older_than_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let eager = StoreOptions {
        flush_interval: std::time::Duration::ZERO,
        ..Default::default()
    };
    let (mut store, _) =
        Store::open(paths(dir.path()), tp(), &eager, UncleanPolicy::Resume, None).unwrap();
    store.put(b"k", b"v", 0).unwrap();
    store.commit(3).unwrap();
    // WAL off: only a flush puts the commit on disk, where a read-only reader sees it.
    assert_eq!(raw(dir.path()).1, vec![(b"k".to_vec(), b"v".to_vec())]);
    drop(store);

    let dir = tempfile::tempdir().unwrap();
    let lazy = StoreOptions {
        flush_interval: std::time::Duration::from_secs(3600),
        ..Default::default()
    };
    let (mut store, _) =
        Store::open(paths(dir.path()), tp(), &lazy, UncleanPolicy::Resume, None).unwrap();
    store.put(b"k", b"v", 0).unwrap();
    store.commit(3).unwrap();
    assert!(raw(dir.path()).1.is_empty(), "not flushed before the bound");
    assert!(!store.maybe_flush(std::time::Instant::now()).unwrap());
    assert!(store
        .maybe_flush(std::time::Instant::now() + std::time::Duration::from_secs(3600))
        .unwrap());
    assert_eq!(raw(dir.path()).1, vec![(b"k".to_vec(), b"v".to_vec())]);
}

/// What this process's descriptors point at.
fn open_files() -> impl Iterator<Item = PathBuf> {
    fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter_map(|fd| fs::read_link(fd.path()).ok())
}

/// Table files of `dir` this process has open.
fn open_table_files(dir: &Path) -> usize {
    let dir = fs::canonicalize(dir).unwrap();
    open_files()
        .filter(|target| target.starts_with(&dir) && target.extension() == Some("sst".as_ref()))
        .count()
}

/// Disk the store's files take, counted in allocated blocks rather than their lengths.
fn allocated_and_written(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .fold((0, 0), |(blocks, len), m| {
            (blocks + m.blocks() * 512, len + m.len())
        })
}

/// An open store takes about the disk its data needs. RocksDB reserved 4 MiB ahead of each
/// MANIFEST for as long as the store was open: 1,000 small stores of a standby held 4.1 GB of disk
/// for 139 MB of data.
#[test]
fn an_open_store_takes_the_disk_its_files_hold_not_more() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = open(dir.path());
    for i in 0..1000u32 {
        store.put(&i.to_be_bytes(), &[7; 100], 0).unwrap();
    }
    store.commit(999).unwrap();
    store.flush().unwrap();
    let db = paths(dir.path()).db;
    let files = fs::read_dir(&db).unwrap().count() as u64;
    let (allocated, written) = allocated_and_written(&db);
    // Each file may take a few file-system blocks beyond its length (16 KiB ahead of the MANIFEST),
    // nothing more.
    let slack = files * 16 * 1024;
    assert!(
        allocated <= written + slack,
        "{allocated} bytes allocated for {written} written in {files} files"
    );
}

/// `max_open_files` bounds a store's open table files at that minus 10 (the descriptor budget
/// counts on it), however many tables it has: RocksDB's table cache is split into shards of at
/// least one file each, 64 by default, which let a store keep up to 64 open.
#[test]
fn a_store_keeps_at_most_ten_table_files_open() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions {
        rocksdb: RocksDbOverrides {
            // Every flush stays a table of its own.
            level0_file_num_compaction_trigger: Some(1000),
            ..Default::default()
        },
        ..Default::default()
    };
    let mut store = open_with_options(dir.path(), &options);
    for i in 0..40u32 {
        store.put(&i.to_be_bytes(), b"value", 0).unwrap();
        store.commit(i64::from(i)).unwrap();
        store.flush().unwrap();
    }
    for i in 0..40u32 {
        assert_eq!(
            store.get(&i.to_be_bytes()).unwrap(),
            Some(b"value".to_vec())
        );
    }
    let tables = files_ending(&paths(dir.path()).db, ".sst").len();
    assert!(tables >= 80, "{tables} table files");
    let open = open_table_files(dir.path());
    assert!(open <= 10, "{open} of {tables} table files open");
}

/// Descriptors this process has on `path`.
fn descriptors_on(path: &Path) -> usize {
    let path = fs::canonicalize(path).unwrap();
    open_files().filter(|target| *target == path).count()
}

/// While RocksDB has the store open its own lock keeps other processes out, so warmstore's lock
/// file is not held open (a descriptor per store, at a thousand stores). The store stays this
/// process's alone: a second open is refused, under another spelling of its path too, before and
/// after a wipe, and the first store goes on committing.
#[test]
fn an_open_store_holds_no_descriptor_on_its_lock_yet_stays_locked() {
    let dir = tempfile::tempdir().unwrap();
    let alias = dir.path().join("alias");
    std::os::unix::fs::symlink(dir.path(), &alias).unwrap();
    let second_open = |root: &Path| {
        Store::open(
            paths(root),
            tp(),
            &StoreOptions::default(),
            UncleanPolicy::Resume,
            None,
        )
    };
    let (mut store, _) = open(dir.path());
    let lock = paths(dir.path()).lock;
    for _ in 0..2 {
        assert_eq!(descriptors_on(&lock), 0, "the lock file is not held open");
        for root in [dir.path(), alias.as_path()] {
            match second_open(root) {
                Err(e @ StoreError::Locked { .. }) => {
                    assert!(e.to_string().contains("this process"), "{e}")
                }
                Err(other) => panic!("expected a lock error, got {other}"),
                Ok(_) => panic!("a second open through {} got the store", root.display()),
            }
        }
        store.put(b"apple", b"1", 0).unwrap();
        store.commit(7).unwrap();
        assert_eq!(store.get(b"apple").unwrap(), Some(b"1".to_vec()));
        store = store.wipe(WipeReason::OffsetOutOfRange, "test").unwrap();
    }
    drop(store);
    let (store, outcome) = second_open(&alias).expect("free once closed");
    assert_eq!(outcome, OpenOutcome::Empty);
    drop(store);
}

#[test]
fn a_second_process_gets_a_clear_lock_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = Command::new(env!("CARGO_BIN_EXE_warmstore-crash-writer"))
        .args([dir.path().to_str().unwrap(), "1", "protocol", "no-wal"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(writer.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert!(line.starts_with("writing from"), "{line}");
    let crash_paths = StorePaths::new(dir.path(), "crash", 0);
    let result = Store::open(
        crash_paths.clone(),
        TopicPartition::new("crash-changelog", 0),
        &StoreOptions::default(),
        UncleanPolicy::Resume,
        None,
    );
    writer.kill().unwrap();
    writer.wait().unwrap();
    let message = match result {
        Err(e @ StoreError::Locked { .. }) => e.to_string(),
        Err(other) => panic!("expected a lock error, got {other}"),
        Ok(_) => panic!("a second opener got the store"),
    };
    assert!(
        message.contains(&crash_paths.db.display().to_string()),
        "{message}"
    );
    assert!(
        message.contains(&format!("pid {}", writer.id())),
        "{message}"
    );
}

/// Every file in `dir`, sorted, with its size and modification time.
fn listing(dir: &Path) -> Vec<(PathBuf, u64, std::time::SystemTime)> {
    files_named(dir, |_| true)
        .into_iter()
        .map(|path| {
            let m = fs::metadata(&path).unwrap();
            (path, m.len(), m.modified().unwrap())
        })
        .collect()
}

#[test]
fn inspect_prints_json_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    closed_store(dir.path());
    let db = paths(dir.path()).db;
    let before = listing(&db);
    let output = Command::new(env!("CARGO_BIN_EXE_warmstore"))
        .arg("inspect")
        .arg(&db)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["offsets"]["wordcount-counts-changelog-0"], 42);
    assert_eq!(report["status"], "closed");
    assert_eq!(report["meta"]["topic"], "wordcount-counts-changelog");
    // RocksDB's estimate counts a delete against a put, so only a lower bound is certain.
    assert!(report["estimated_keys"].as_u64().unwrap() >= 1, "{report}");
    assert!(report["disk_bytes"].as_u64().unwrap() > 0);
    assert_eq!(listing(&db), before, "inspect must not touch the store");
}

#[test]
fn inspect_refuses_a_directory_that_is_not_a_store() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_warmstore"))
        .arg("inspect")
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "a usage error");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("is not a warmstore store"), "{stderr}");
    assert!(stderr.contains("CURRENT"), "{stderr}");
}

/// Sorted runs in the data column family's level 0.
fn level0_files(store: &Store) -> u64 {
    let files = store.property("rocksdb.num-files-at-level0");
    files
        .and_then(|n| n.trim().parse().ok())
        .expect("a file count")
}

/// Commits and flushes `tables` times, one new table per flush.
fn write_tables(store: &mut Store, tables: i64, first_offset: i64) {
    for t in 0..tables {
        for k in 0..50 {
            store
                .put(format!("key-{k}").as_bytes(), &[t as u8; 100], 0)
                .unwrap();
        }
        store.commit(first_offset + t).unwrap();
        store.flush().unwrap();
    }
}

fn wait_for_merge(store: &Store, what: &str) {
    let merged = || level0_files(store) <= 4;
    common::wait_until(what, std::time::Duration::from_secs(60), merged);
}

/// A large catch-up defers compaction: its tables stay unmerged until it is done, then one merge
/// runs. A store closed (or killed) while deferred compacts again once reopened.
#[test]
fn a_deferred_compaction_merges_once_resumed_or_reopened() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open_with_options(dir.path(), &StoreOptions::default());
    store.defer_compaction().unwrap();
    write_tables(&mut store, 30, 0);
    assert_eq!(level0_files(&store), 30, "no merge while deferred");
    store.resume_compaction().unwrap();
    assert!(!store.compaction_deferred());
    wait_for_merge(&store, "resumed");
    write_tables(&mut store, 5, 30);
    wait_for_merge(&store, "tailing after the merge");

    store.defer_compaction().unwrap();
    write_tables(&mut store, 30, 35);
    store.close(Some(64)).unwrap();
    let mut store = open_with_options(dir.path(), &StoreOptions::default());
    assert!(!store.compaction_deferred());
    write_tables(&mut store, 1, 65);
    wait_for_merge(&store, "reopened");
    for k in 0..50 {
        let value = store.get(format!("key-{k}").as_bytes()).unwrap();
        assert_eq!(
            value,
            Some(vec![0u8; 100]),
            "key-{k}: the last table's value"
        );
    }
}
