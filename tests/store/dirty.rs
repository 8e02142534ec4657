//! The dirty rules on real stores: what is wiped, with which reason, and what is resumed.

use super::*;

/// After a wipe the store is empty, usable, and the marker is gone.
fn assert_rebuilt(dir: &Path, store: Store) {
    assert_eq!(store.applied(), None);
    assert_eq!(store.get(b"apple").unwrap(), None);
    assert!(!paths(dir).marker.exists());
    store.close(None).unwrap();
    let (_, outcome) = open(dir);
    assert_eq!(outcome, OpenOutcome::Empty);
}

fn corrupt_and_reopen(damage: impl FnOnce(&Path)) -> WipeReason {
    wiped_after(|paths| damage(&paths.db)).0
}

/// A closed store, damaged, then opened: the wipe's reason and detail, once it is rebuilt.
fn wiped_after(damage: impl FnOnce(&StorePaths)) -> (WipeReason, String) {
    let dir = tempfile::tempdir().unwrap();
    closed_store(dir.path());
    damage(&paths(dir.path()));
    wipe_on_open(dir.path())
}

/// Opens the store in `dir`, which must be wiped: the wipe's reason and detail, once it is
/// rebuilt.
fn wipe_on_open(dir: &Path) -> (WipeReason, String) {
    let (store, outcome) = open(dir);
    let OpenOutcome::Wiped { reason, detail } = outcome else {
        panic!("expected a wipe, got {outcome:?}");
    };
    assert_rebuilt(dir, store);
    (reason, detail)
}

#[test]
fn truncated_sst_is_corruption() {
    let reason = corrupt_and_reopen(|db| {
        let sst = files_ending(db, ".sst").pop().expect("an SST file");
        let len = fs::metadata(&sst).unwrap().len();
        fs::OpenOptions::new()
            .write(true)
            .open(&sst)
            .unwrap()
            .set_len(len / 2)
            .unwrap();
    });
    assert_eq!(reason, WipeReason::Corruption);
}

#[test]
fn garbage_sst_is_corruption() {
    let reason = corrupt_and_reopen(|db| {
        let sst = files_ending(db, ".sst").pop().expect("an SST file");
        let len = fs::metadata(&sst).unwrap().len() as usize;
        let garbage: Vec<u8> = (0..len).map(|i| (i * 7 + 13) as u8).collect();
        fs::write(&sst, garbage).unwrap();
    });
    assert_eq!(reason, WipeReason::Corruption);
}

/// warmstore's metadata file, cut short by something other than its own write (which renames a
/// complete file into place): the store is not trusted, and the detail names the file.
#[test]
fn an_unreadable_metadata_file_is_corruption() {
    let (reason, detail) = wiped_after(|paths| {
        fs::write(
            paths.db.join("warmstore.json"),
            b"{\"format_version\": 1, \"to",
        )
        .unwrap()
    });
    assert_eq!(reason, WipeReason::Corruption);
    assert!(detail.contains("warmstore.json is unreadable"), "{detail}");
}

#[test]
fn missing_current_is_corruption() {
    let reason = corrupt_and_reopen(|db| fs::remove_file(db.join("CURRENT")).unwrap());
    assert_eq!(reason, WipeReason::Corruption);
}

/// A database with `CURRENT` and only `default`, as a kill leaves one while RocksDB creates it, but
/// without warmstore's creation marker (another program made it, or an older warmstore): its
/// families are not a key-value store's, so the next open rebuilds it, and it takes commits as any
/// other. With the marker it is an interrupted rebuild (tests/crash_store.rs).
#[test]
fn a_store_cut_short_before_its_column_families_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let db = paths(dir.path()).db;
    fs::create_dir_all(&db).unwrap();
    let mut options = rocksdb::Options::default();
    options.create_if_missing(true);
    drop(rocksdb::DB::open(&options, &db).unwrap());
    let (mut store, outcome) = open(dir.path());
    assert_eq!(wiped_reason(outcome), WipeReason::FormatMismatch);
    store.put(b"apple", b"1", 0).unwrap();
    store.commit(0).unwrap();
    store.close(Some(0)).unwrap();
    let (store, outcome) = open(dir.path());
    assert!(
        matches!(outcome, OpenOutcome::Resumed { applied: 0, .. }),
        "{outcome:?}"
    );
    assert_eq!(store.get(b"apple").unwrap().as_deref(), Some(&b"1"[..]));
}

#[test]
fn missing_manifest_is_corruption() {
    let reason = corrupt_and_reopen(|db| {
        for manifest in files_starting(db, "MANIFEST-") {
            fs::remove_file(manifest).unwrap();
        }
    });
    assert_eq!(reason, WipeReason::Corruption);
}

#[test]
fn a_file_where_the_store_directory_should_be_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("counts")).unwrap();
    fs::write(paths(dir.path()).db, b"not a directory").unwrap();
    assert_eq!(wipe_on_open(dir.path()).0, WipeReason::Corruption);
}

/// Writes straight into a store's column families, as a foreign or broken writer would.
fn raw_write(dir: &Path, default: &[(&[u8], &[u8])], offsets: &[(&[u8], &[u8])]) {
    let (db_options, families) = StoreOptions::default().db_options(StoreType::KeyValue, true);
    fs::create_dir_all(&paths(dir).db).unwrap();
    let db = rocksdb::DB::open_cf_descriptors(&db_options, &paths(dir).db, families).unwrap();
    for (k, v) in default {
        db.put(k, v).unwrap();
    }
    let cf = db.cf_handle("offsets").unwrap();
    for (k, v) in offsets {
        db.put_cf(cf, k, v).unwrap();
    }
    db.flush_cfs_opt(
        &[db.cf_handle("default").unwrap(), cf],
        &rocksdb::FlushOptions::default(),
    )
    .unwrap();
}

#[test]
fn data_without_an_offset_is_missing_offsets() {
    let dir = tempfile::tempdir().unwrap();
    raw_write(dir.path(), &[(b"apple", b"1")], &[(b"status", &[0; 8])]);
    assert_eq!(wipe_on_open(dir.path()).0, WipeReason::MissingOffsets);
}

#[test]
fn garbage_offset_bytes_are_missing_offsets() {
    let dir = tempfile::tempdir().unwrap();
    raw_write(
        dir.path(),
        &[(b"apple", b"1")],
        &[(b"wordcount-counts-changelog-0", b"forty-two")],
    );
    assert_eq!(wipe_on_open(dir.path()).0, WipeReason::MissingOffsets);
}

#[test]
fn offsets_of_another_topic_are_format_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    raw_write(
        dir.path(),
        &[(b"apple", b"1")],
        &[(b"orders-changelog-0", &[0, 0, 0, 0, 0, 0, 0, 9])],
    );
    assert_eq!(wipe_on_open(dir.path()).0, WipeReason::FormatMismatch);
}

#[test]
fn a_store_of_another_partition_is_format_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    closed_store(dir.path());
    let (store, outcome) = open_with(
        dir.path(),
        TopicPartition::new("wordcount-counts-changelog", 5),
        UncleanPolicy::Resume,
        None,
    );
    assert_eq!(wiped_reason(outcome), WipeReason::FormatMismatch);
    drop(store);
}

#[test]
fn a_newer_format_version_is_format_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    closed_store(dir.path());
    let meta = paths(dir.path()).db.join("warmstore.json");
    let text = fs::read_to_string(&meta)
        .unwrap()
        .replace("\"format_version\": 1", "\"format_version\": 99");
    fs::write(&meta, text).unwrap();
    assert_eq!(wipe_on_open(dir.path()).0, WipeReason::FormatMismatch);
}

/// A store without warmstore's metadata (as Kafka Streams leaves one) is judged by its offsets,
/// resumed, and given the metadata, so the next open knows whose it is.
#[test]
fn a_store_without_metadata_resumes_and_gets_it() {
    let dir = tempfile::tempdir().unwrap();
    closed_store(dir.path());
    let meta = paths(dir.path()).db.join("warmstore.json");
    fs::remove_file(&meta).unwrap();
    let (store, outcome) = open(dir.path());
    assert_eq!(outcome, CLOSED_STORE_REOPENED);
    let written = fs::read_to_string(&meta).expect("the metadata is written on open");
    assert!(written.contains("wordcount-counts-changelog"), "{written}");
    drop(store);
}

/// A store left open (status 1), its data flushed, as after a crash.
fn unclean_store(dir: &Path) {
    let (mut store, _) = open(dir);
    store.put(b"apple", b"1", 0).unwrap();
    store.commit(9).unwrap();
    drop(store); // no close: status stays 1, as when the process dies.
}

#[test]
fn unclean_shutdown_resumes_or_wipes_by_policy() {
    let dir = tempfile::tempdir().unwrap();
    unclean_store(dir.path());
    let (store, outcome) = open_with(dir.path(), tp(), UncleanPolicy::Resume, None);
    assert_eq!(
        outcome,
        OpenOutcome::Resumed {
            applied: 9,
            unclean: true
        }
    );
    assert_eq!(store.get(b"apple").unwrap(), Some(b"1".to_vec()));
    drop(store);

    let dir = tempfile::tempdir().unwrap();
    unclean_store(dir.path());
    let (store, outcome) = open_with(dir.path(), tp(), UncleanPolicy::Wipe, None);
    assert_eq!(wiped_reason(outcome), WipeReason::UncleanShutdown);
    assert_rebuilt(dir.path(), store);
}

/// Opening writes nothing: `status` 1 rides in the first commit. A store closed cleanly, opened
/// and then dropped before any commit (as when the process dies there) is still the store that
/// was closed, byte for byte, so it is not unclean and `on_unclean_shutdown: wipe` keeps it.
#[test]
fn a_store_dropped_before_its_first_commit_is_still_clean() {
    let dir = tempfile::tempdir().unwrap();
    closed_store(dir.path());
    let (store, _) = open(dir.path());
    drop(store);
    let (store, outcome) = open_with(dir.path(), tp(), UncleanPolicy::Wipe, None);
    assert_eq!(outcome, CLOSED_STORE_REOPENED);
    assert_eq!(store.get(b"plum").unwrap(), Some(b"3".to_vec()));

    // The first commit marks it open, and whatever reaches the disk from then on says so.
    let mut store = store;
    store.put(b"fig", b"4", 0).unwrap();
    store.commit(43).unwrap();
    store.flush().unwrap();
    drop(store);
    let (_, outcome) = open(dir.path());
    assert_eq!(
        outcome,
        OpenOutcome::Resumed {
            applied: 43,
            unclean: true
        }
    );
}

#[test]
fn a_leftover_wipe_marker_is_an_interrupted_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    closed_store(dir.path());
    fs::write(
        paths(dir.path()).marker,
        b"corruption: earlier run died here\n",
    )
    .unwrap();
    assert_eq!(wipe_on_open(dir.path()).0, WipeReason::InterruptedRebuild);
}

/// A kill between the marker's creation and its one line leaves it empty: still a rebuild, and
/// the detail says the marker was being written rather than showing nothing.
#[test]
fn an_empty_marker_is_an_interrupted_rebuild() {
    let (reason, detail) = wiped_after(|paths| fs::write(&paths.marker, b"").unwrap());
    assert_eq!(reason, WipeReason::InterruptedRebuild);
    assert!(detail.contains("as it wrote the marker"), "{detail}");
}

#[test]
fn offsets_outside_the_log_are_out_of_range() {
    for bounds in [
        LogBounds {
            log_start: 50,
            high_watermark: 100,
        },
        LogBounds {
            log_start: 0,
            high_watermark: 42,
        },
    ] {
        let dir = tempfile::tempdir().unwrap();
        closed_store(dir.path());
        let (store, outcome) = open_with(dir.path(), tp(), UncleanPolicy::Resume, Some(bounds));
        assert_eq!(
            wiped_reason(outcome),
            WipeReason::OffsetOutOfRange,
            "{bounds:?}"
        );
        assert_rebuilt(dir.path(), store);
    }
    let dir = tempfile::tempdir().unwrap();
    closed_store(dir.path());
    let (_, outcome) = open_with(
        dir.path(),
        tp(),
        UncleanPolicy::Resume,
        Some(LogBounds {
            log_start: 43,
            high_watermark: 43,
        }),
    );
    assert_eq!(outcome, CLOSED_STORE_REOPENED);
}

#[test]
fn wipe_at_run_time_keeps_the_lock_and_leaves_an_empty_store() {
    let dir = tempfile::tempdir().unwrap();
    closed_store(dir.path());
    let (store, _) = open(dir.path());
    let store = store.wipe(WipeReason::OffsetOutOfRange, "test").unwrap();
    // Still ours: a second opener is refused.
    let second = Store::open(
        paths(dir.path()),
        tp(),
        &StoreOptions::default(),
        UncleanPolicy::Resume,
        None,
    );
    assert!(matches!(second, Err(StoreError::Locked { .. })));
    assert_rebuilt(dir.path(), store);
}

/// A creation that fails with an error (no descriptor or no space left, say), rather than one a
/// kill cut short, takes back what it made. Left under its marker, the next attempt found "an
/// earlier run was cut short" and counted a wipe of a store that never held anything: by hand,
/// 70 such wipes of 200 partitions, and their alert, after a run short of descriptors was given
/// more (11 with this, where the removal ran short of descriptors too). The failure here: a
/// directory where the metadata file goes, which the write cannot replace.
#[test]
fn a_creation_that_fails_is_taken_back_not_wiped_later() {
    let dir = tempfile::tempdir().unwrap();
    let paths = paths(dir.path());
    fs::create_dir_all(paths.db.join("warmstore.json").join("in-the-way")).unwrap();
    let failed = Store::open(
        paths.clone(),
        tp(),
        &StoreOptions::default(),
        UncleanPolicy::Resume,
        None,
    );
    assert!(failed.is_err(), "the creation fails");
    assert!(!paths.marker.exists(), "the marker is taken back");
    assert!(!paths.db.exists(), "what the creation made is taken back");
    let (store, outcome) = open(dir.path());
    assert_eq!(outcome, OpenOutcome::Empty);
    store.close(None).unwrap();
}
