//! An empty database of each store type, made once per process and copied into each new store.
//!
//! RocksDB creates a database in steps that each sync a file and then its directory: the identity,
//! a first MANIFEST, `CURRENT`, then each column family after `default`. Opening it then writes
//! and syncs a MANIFEST, `CURRENT` and an options file of its own anyway. Where a sync costs an
//! exit to the hypervisor and an interrupt, as on the virtual disks stores usually live on, the
//! creation's syncs were a large share of what a new store costs, and a process with 1,000
//! partitions creates 1,000 stores. An empty database's `CURRENT` and MANIFEST, copied into a new
//! directory, open as that database with only the open's syncs: 11 syncs per store up to its first
//! flush instead of 17.
//!
//! The copies are not synced. They are written under the store's creation marker, so a crash
//! before the open has made them durable leaves a store the next open rebuilds
//! (`interrupted_rebuild`).
//!
//! Each store still gets an identity of its own. The seed is made without its identity in the
//! MANIFEST, and each copy gets a fresh `IDENTITY` file, which the open records in the store's
//! MANIFEST (synced). Should a power loss drop that file's contents, RocksDB writes it again from
//! the MANIFEST on the next open.

use std::fs;
use std::io::{self, Read};
use std::path::Path;
use std::sync::{Arc, Mutex};

use super::layout::{StorePaths, StoreType, CURRENT_FILE};
use super::{create_private_dir, io_at, rocks, timer, StoreError, StoreOptions};

/// RocksDB's file holding the database's identity.
const IDENTITY: &str = "IDENTITY";

/// The files of an empty database, by name.
struct Seed {
    files: Vec<(String, Vec<u8>)>,
}

/// One seed per store type (the column families decide the MANIFEST; options do not reach it),
/// made by the first store of that type the process creates.
static SEEDS: Mutex<Vec<(StoreType, Arc<Seed>)>> = Mutex::new(Vec::new());

/// Writes an empty database of the store's type into `paths.db`, a directory without RocksDB's
/// files, for `DB::open` to open.
pub(super) fn plant(paths: &StorePaths, options: &StoreOptions) -> Result<(), StoreError> {
    let seed = seed_for(paths, options)?;
    for (name, bytes) in &seed.files {
        let path = paths.db.join(name);
        fs::write(&path, bytes).map_err(io_at(&path))?;
    }
    // Without random bytes the identity is left to RocksDB, which makes and syncs one itself.
    if let Ok(identity) = fresh_identity() {
        let path = paths.db.join(IDENTITY);
        fs::write(&path, identity).map_err(io_at(&path))?;
    }
    Ok(())
}

fn seed_for(paths: &StorePaths, options: &StoreOptions) -> Result<Arc<Seed>, StoreError> {
    let mut seeds = SEEDS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((_, seed)) = seeds.iter().find(|(kind, _)| *kind == paths.kind) {
        return Ok(seed.clone());
    }
    // Inside the new store's directory, so that a crash half-way leaves it under the marker too.
    let dir = paths.db.join("seed");
    let seed = Arc::new(make(&dir, paths.kind, options)?);
    fs::remove_dir_all(&dir).map_err(io_at(&dir))?;
    seeds.push((paths.kind, seed.clone()));
    Ok(seed)
}

/// Creates an empty database in `dir`, closes it and reads back the files that make it.
fn make(dir: &Path, kind: StoreType, options: &StoreOptions) -> Result<Seed, StoreError> {
    create_private_dir(dir).map_err(io_at(dir))?;
    let (mut db_options, families) = options.db_options(kind, true);
    // Each store's open then writes the identity it finds in its own `IDENTITY` file.
    db_options.set_write_dbid_to_manifest(false);
    drop(timer::open_db(&db_options, dir, families).map_err(rocks(dir))?);
    let read = |name: &str| {
        let path = dir.join(name);
        fs::read(&path).map_err(io_at(&path))
    };
    let current = read(CURRENT_FILE)?;
    let manifest = String::from_utf8_lossy(&current).trim_end().to_string();
    Ok(Seed {
        files: vec![
            (manifest.clone(), read(&manifest)?),
            (CURRENT_FILE.to_string(), current),
        ],
    })
}

/// A random identity in RocksDB's form (`8-4-4-4-12` hexadecimal digits).
fn fresh_identity() -> io::Result<String> {
    let mut bytes = [0u8; 16];
    fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok([
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..],
    ]
    .join("-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_are_fresh_and_in_rocksdbs_form() {
        let (a, b) = (fresh_identity().unwrap(), fresh_identity().unwrap());
        assert_ne!(a, b);
        let groups: Vec<usize> = a.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12]);
        assert!(a.chars().all(|c| c == '-' || c.is_ascii_hexdigit()));
    }
}
