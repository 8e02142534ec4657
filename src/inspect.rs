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
    /// The path names no store: a usage error, like a bad config.
    #[error("{0} is not a warmstore store: {1}")]
    NotAStore(PathBuf, String),
    /// A store RocksDB could not open or read.
    #[error("cannot read the store at {0}: {1}")]
    Unreadable(PathBuf, String),
}

impl InspectError {
    /// 2 for a path that is not a store (usage), 1 for a store that cannot be read.
    pub fn exit_code(&self) -> u8 {
        match self {
            InspectError::NotAStore(..) => 2,
            InspectError::Unreadable(..) => 1,
        }
    }
}

pub fn inspect(dir: &Path) -> Result<Report, InspectError> {
    let not_a_store = |why: &str| InspectError::NotAStore(dir.to_path_buf(), why.to_string());
    if !dir.is_dir() {
        return Err(not_a_store("no such directory"));
    }
    if !dir.join(CURRENT_FILE).is_file() {
        return Err(not_a_store("it has no RocksDB CURRENT file"));
    }
    let unreadable = |why: String| InspectError::Unreadable(dir.to_path_buf(), why);
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
            Err(e) => return Err(unreadable(e.into_string())),
        }
    };
    let Some(offsets_cf) = db.cf_handle(OFFSETS_CF) else {
        return Err(not_a_store("it has no `offsets` column family"));
    };
    let mut offsets = BTreeMap::new();
    let mut status = "absent".to_string();
    for item in db.iterator_cf(offsets_cf, rocksdb::IteratorMode::Start) {
        let (key, value) = item.map_err(|e| unreadable(e.into_string()))?;
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
