//! What warmstore needs to know about a store beyond the KIP-1035 layout lives in a small JSON file
//! inside the store directory, never as extra keys in `offsets`, so the store stays byte-compatible
//! with Kafka Streams.

use serde::{Deserialize, Serialize};
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::format::TopicPartition;
use crate::store::dirty::Identity;

pub const META_FILE: &str = "warmstore.json";
/// Bumped when the on-disk layout changes in a way older warmstores cannot read.
pub const FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StoreMeta {
    pub format_version: u32,
    pub topic: String,
    pub partition: i32,
    pub created_unix_ms: u64,
}

impl StoreMeta {
    pub fn new(tp: &TopicPartition) -> Self {
        let created_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        StoreMeta {
            format_version: FORMAT_VERSION,
            topic: tp.topic.clone(),
            partition: tp.partition,
            created_unix_ms,
        }
    }

    /// How this metadata relates to the partition the store is opened for.
    pub fn identity(&self, tp: &TopicPartition) -> Identity {
        if self.format_version > FORMAT_VERSION {
            Identity::NewerFormat(self.format_version)
        } else if self.topic != tp.topic || self.partition != tp.partition {
            Identity::OtherPartition(format!("{}-{}", self.topic, self.partition))
        } else {
            Identity::Matches
        }
    }
}

/// Why a store's metadata file could not be read; the store is then judged unreadable.
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("{} is unreadable: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("{} is unreadable: {source}", path.display())]
    Malformed {
        path: PathBuf,
        source: serde_json::Error,
    },
}

/// `Ok(None)` when there is no file.
pub fn read(dir: &Path) -> Result<Option<StoreMeta>, MetaError> {
    let path = dir.join(META_FILE);
    match fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| MetaError::Malformed { path, source }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(MetaError::Io { path, source }),
    }
}

/// Written to a temporary name and renamed, so a crash leaves the old file or the new one.
pub fn write(dir: &Path, meta: &StoreMeta) -> io::Result<()> {
    let tmp = dir.join(format!("{META_FILE}.tmp"));
    let mut file = fs::File::create(&tmp)?;
    file.write_all(&serde_json::to_vec_pretty(meta).map_err(io::Error::other)?)?;
    file.sync_all()?;
    fs::rename(&tmp, dir.join(META_FILE))
}
