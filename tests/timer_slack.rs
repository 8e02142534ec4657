//! RocksDB runs every open database's periodic tasks on one timer thread, which it starts inside
//! the first open of the process. A store is opened with a coarse timer slack so that this thread
//! inherits it and serves the tasks of many stores at one wake-up (an idle standby of 1,000
//! stores woke it 100 times a second). Alone in its test binary: the first open of the process
//! must be this test's.

#![cfg(target_os = "linux")]

use std::collections::BTreeSet;

use warmstore::store::dirty::UncleanPolicy;
use warmstore::store::format::TopicPartition;
use warmstore::store::{Store, StoreOptions, StorePaths};

const COARSE_NS: u64 = 1_000_000_000;

fn threads() -> BTreeSet<u32> {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

fn own_slack() -> u64 {
    // SAFETY: reads the calling thread's timer slack only.
    let slack = unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) };
    u64::try_from(slack).expect("PR_GET_TIMERSLACK")
}

#[test]
fn threads_rocksdb_starts_in_a_store_open_have_a_coarse_timer_slack() {
    let own = own_slack();
    assert_ne!(
        own, COARSE_NS,
        "the test thread starts with the kernel's default"
    );
    let before = threads();
    let dir = tempfile::tempdir().unwrap();
    let tp = TopicPartition::new("counts-changelog", 0);
    let paths = StorePaths::new(dir.path(), "counts", 0);
    let (store, _) = Store::open(
        paths,
        tp,
        &StoreOptions::default(),
        UncleanPolicy::Resume,
        None,
    )
    .expect("store opens");
    let started: Vec<u32> = threads().difference(&before).copied().collect();
    assert_eq!(
        own_slack(),
        own,
        "the opening thread gets its own slack back"
    );
    assert!(!started.is_empty(), "RocksDB starts its timer thread");
    for tid in started {
        // Another thread's slack takes CAP_SYS_NICE to read, as in CI; an unprivileged run checks
        // only the opening thread, and says so.
        match std::fs::read_to_string(format!("/proc/{tid}/timerslack_ns")) {
            Ok(text) => assert_eq!(
                text.trim().parse::<u64>().ok(),
                Some(COARSE_NS),
                "thread {tid}"
            ),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                eprintln!(
                    "thread {tid}: timer slack not readable without CAP_SYS_NICE; not checked"
                );
            }
            Err(e) => panic!("thread {tid}: {e}"),
        }
    }
    drop(store);
}
