//! `warmstore inspect STORE_DIR`: what a store holds, as JSON, without changing a byte of it.

use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use warmstore::store::format::{decode_i64, OFFSETS_CF, STATUS_KEY};
use warmstore::store::layout::CURRENT_FILE;
use warmstore::store::meta::{self, StoreMeta};
use warmstore::store::{dir_bytes, estimated_keys, open_read_only};

#[derive(Debug, Serialize)]
pub struct Report {
    pub path: PathBuf,
    /// Applied offset per `"<topic>-<partition>"` key; `null` when the value is not 8 bytes.
    pub offsets: BTreeMap<String, Option<i64>>,
    /// `open`, `closed`, or `absent`.
    pub status: String,
    pub meta: Option<StoreMeta>,
    pub estimated_keys: u64,
    pub disk_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("{0} is not a warmstore store: {1}")]
    NotAStore(PathBuf, String),
}

pub fn inspect(dir: &Path) -> Result<Report, InspectError> {
    let not_a_store = |why: String| InspectError::NotAStore(dir.to_path_buf(), why);
    if !dir.is_dir() {
        return Err(not_a_store("no such directory".into()));
    }
    if !dir.join(CURRENT_FILE).is_file() {
        return Err(not_a_store("it has no RocksDB CURRENT file".into()));
    }
    read_report(dir).map_err(not_a_store)
}

fn read_report(dir: &Path) -> Result<Report, String> {
    // Beside a running service, a compaction can delete a table file between reading the MANIFEST
    // and opening the file; a second look sees the new MANIFEST.
    let mut attempt = 0;
    let db = loop {
        match open_read_only(dir) {
            Ok(db) => break db,
            Err(_) if attempt < 5 => {
                attempt += 1;
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(e) => return Err(e.into_string()),
        }
    };
    let offsets_cf = db
        .cf_handle(OFFSETS_CF)
        .ok_or("it has no `offsets` column family")?;
    let mut offsets = BTreeMap::new();
    let mut status = "absent".to_string();
    for item in db.iterator_cf(offsets_cf, rocksdb::IteratorMode::Start) {
        let (key, value) = item.map_err(|e| e.into_string())?;
        if &*key == STATUS_KEY {
            status = match decode_i64(&value) {
                Some(1) => "open".into(),
                Some(0) => "closed".into(),
                Some(other) => format!("unknown ({other})"),
                None => "unreadable".into(),
            };
        } else {
            offsets.insert(
                String::from_utf8_lossy(&key).into_owned(),
                decode_i64(&value),
            );
        }
    }
    let estimated_keys = estimated_keys(&db);
    Ok(Report {
        path: dir.to_path_buf(),
        offsets,
        status,
        meta: meta::read(dir).ok().flatten(),
        estimated_keys,
        disk_bytes: dir_bytes(dir),
    })
}
