//! Stores and state directories that another program has open. A Kafka Streams application
//! locks with `fcntl` (its `.lock` files and RocksDB's `LOCK`), which warmstore's own `flock` does
//! not exclude; here a Python process takes the same locks.
//!
//! These tests live in a binary of their own: a process started while another test of the same
//! binary holds a store's `flock` shares that lock until it executes, which made unrelated store
//! tests see their own store as locked.

mod common;

use common::background::FcntlLock;
use common::{read_timestamped_store, write_config, State};
use std::process::Command;

use warmstore::store::dirty::UncleanPolicy;
use warmstore::store::{
    Layout, OpenOutcome, Store, StoreError, StoreOptions, StorePaths, StoreType, TopicPartition,
};

/// A Kafka Streams application with the store open holds RocksDB's `fcntl` lock on `LOCK`
/// (here a Python process takes the same lock). RocksDB's own open would fail like a damaged
/// store; the store must be refused, naming the holder, and keep its contents.
#[test]
fn a_store_another_program_has_open_is_refused_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let paths = || StorePaths::new(dir.path(), "counts", 0);
    let tp = || TopicPartition::new("counts-changelog", 0);
    let open = || {
        Store::open(
            paths(),
            tp(),
            &StoreOptions::default(),
            UncleanPolicy::Resume,
            None,
        )
    };
    let (mut store, _) = open().unwrap();
    store.put(b"apple", b"1", 0).unwrap();
    store.put(b"plum", b"3", 0).unwrap();
    store.close(Some(42)).unwrap();
    let lock_file = paths().db.join("LOCK");
    let holder = FcntlLock::hold(&lock_file);
    let result = open();
    let pid = holder.pid();
    drop(holder);
    match result {
        Err(e @ StoreError::Locked { .. }) => {
            assert!(e.to_string().contains(&format!("pid {pid}")), "{e}")
        }
        Err(other) => panic!("expected a lock error, got {other}"),
        Ok((_, outcome)) => panic!("the store was opened under another program: {outcome:?}"),
    }
    let (store, outcome) = open().unwrap();
    assert_eq!(
        outcome,
        OpenOutcome::Resumed {
            applied: 42,
            unclean: false
        }
    );
    assert_eq!(store.get(b"apple").unwrap(), Some(b"1".to_vec()));
    assert_eq!(store.get(b"plum").unwrap(), Some(b"3".to_vec()));
}

/// Kafka Streams holds `<state.dir>/<application.id>/.lock` while it runs: an export into that
/// state directory is refused, naming the holder, and writes nothing.
#[test]
fn an_export_into_a_running_application_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::KafkaStreams {
        application_id: "app".into(),
        subtopology: 0,
        kind: StoreType::TimestampedKeyValue,
    };
    let source = dir.path().join("state");
    let paths = StorePaths::for_layout(&source, &layout, "counts", 0);
    let tp = TopicPartition::new("app-counts-changelog", 0);
    let (mut store, _) = Store::open(
        paths,
        tp,
        &StoreOptions::default(),
        UncleanPolicy::Resume,
        None,
    )
    .unwrap();
    store.put(b"k", b"v", 5).unwrap();
    store.commit(0).unwrap();
    store.close(None).unwrap();
    let config = write_config(
        dir.path(),
        "127.0.0.1:1",
        "127.0.0.1:0",
        "  - name: counts\n    layout: kafka-streams\n    application_id: app\n    type: timestamped_key_value\n",
        "",
    );
    let target = dir.path().join("application");
    std::fs::create_dir_all(target.join("app")).unwrap();
    let lock_file = target.join("app/.lock");
    std::fs::write(&lock_file, b"").unwrap();
    let holder = FcntlLock::hold(&lock_file);
    let export = || {
        Command::new(env!("CARGO_BIN_EXE_warmstore"))
            .args(["export", "--config"])
            .arg(&config)
            .arg("--to")
            .arg(&target)
            .output()
            .unwrap()
    };
    let refused = export();
    let pid = holder.pid();
    drop(holder);
    let message = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{message}");
    assert!(message.contains(&format!("pid {pid}")), "{message}");
    assert!(!target.join("app/0_0").exists(), "nothing written");
    // Once the application is gone, the same export goes through.
    let out = export();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let copy = read_timestamped_store(
        &target.join("app/0_0/rocksdb/counts"),
        "app-counts-changelog",
        0,
    );
    assert_eq!((copy.applied, copy.status), (Some(0), Some(0)));
    let stamped = [&5i64.to_be_bytes()[..], b"v"].concat();
    assert_eq!(copy.data, State::from([(b"k".to_vec(), stamped)]));
}
