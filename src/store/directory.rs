//! Changes to a store's directory outside the commit protocol (creating, wiping and deleting a
//! store), each under a marker beside the store, so that a kill half-way is found on the next open.

use rocksdb::DB;
use std::fs;
use std::io;
use std::path::Path;

use super::dirty::WipeReason;
use super::lock::StoreLock;
use super::{
    create_private_dir, io_at, meta, options, rocks, seed, timer, StoreError, StoreOptions,
    StorePaths, TopicPartition,
};

/// A new store, under the marker: RocksDB writes a database in steps, and a kill between them
/// leaves files that, read without the marker, look damaged or foreign.
///
/// A creation that fails with an error (no space or no descriptor left, say) takes back what it
/// made, marker included: there is no store yet, only its debris. Left under the marker, the next
/// attempt would report an earlier run cut short and count a wipe of a store that never held
/// anything, which raises the wipe alert. If taking it back fails too (out of descriptors, the
/// removal often is), the marker stays and the next open rebuilds the store as before.
pub(super) fn create(
    paths: &StorePaths,
    tp: &TopicPartition,
    options: &StoreOptions,
) -> Result<DB, StoreError> {
    let created = under_marker(paths, "creating the store", || {
        create_fresh(paths, tp, options)
    });
    if created.is_err() && remove_store_dir(&paths.db).is_ok() {
        let _ = fs::remove_file(&paths.marker);
    }
    created
}

fn create_fresh(
    paths: &StorePaths,
    tp: &TopicPartition,
    options: &StoreOptions,
) -> Result<DB, StoreError> {
    create_private_dir(&paths.db).map_err(io_at(&paths.db))?;
    meta::write(&paths.db, &meta::StoreMeta::new(tp)).map_err(io_at(&paths.db))?;
    seed::plant(paths, options)?;
    let (db_options, families) = options.db_options(paths.kind, true);
    timer::open_db(&db_options, &paths.db, families).map_err(rocks(&paths.db))
}

/// Destroy, remove, recreate, under the marker. Once the fresh store exists the rebuild is an
/// ordinary restore, which the commit protocol keeps crash-safe, so the marker goes.
pub(super) fn wipe_and_create(
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
