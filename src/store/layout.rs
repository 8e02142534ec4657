//! Where a store partition lives on disk and which column families hold its data.
//!
//! Two layouts exist. warmstore's own keeps every store under `<state_dir>/<store>/<partition>/`.
//! The Kafka Streams layout puts the store exactly where a Kafka Streams application looks for
//! it, `<state_dir>/<application_id>/<subtopology>_<partition>/rocksdb/<store>/`, with the column
//! families that Kafka Streams 4.3 opens, so the application starts on the warm copy instead of
//! restoring the changelog. The bytes of the `offsets` family are the same in both.

use serde::Deserialize;
use std::path::{Path, PathBuf};

use super::format::OFFSETS_CF;

/// RocksDB's file naming a database's current MANIFEST: a directory without it holds no database.
pub const CURRENT_FILE: &str = "CURRENT";

/// The column family Kafka Streams keeps a timestamped store's data in.
pub const TIMESTAMPED_CF: &str = "keyValueWithTimestamp";

/// Which column families a store has, as Kafka Streams names its persistent key-value stores.
/// warmstore's own layout is always `key_value`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StoreType {
    /// `default` holds the changelog's key and value bytes unchanged.
    #[default]
    KeyValue,
    /// What the DSL materialises by default: `keyValueWithTimestamp` holds the record timestamp
    /// (8 bytes, big-endian) followed by the value. `default` stays empty: a Kafka Streams store
    /// with data in `default` opens in its upgrade mode.
    TimestampedKeyValue,
}

impl StoreType {
    /// Every column family, in the order they are opened. Kafka Streams refuses a store with any
    /// other family ("Unexpected column family"), and RocksDB refuses to open a store without
    /// naming all of its families, so this list is exact.
    pub fn families(self) -> &'static [&'static str] {
        match self {
            StoreType::KeyValue => &[rocksdb::DEFAULT_COLUMN_FAMILY_NAME, OFFSETS_CF],
            StoreType::TimestampedKeyValue => &[
                rocksdb::DEFAULT_COLUMN_FAMILY_NAME,
                TIMESTAMPED_CF,
                OFFSETS_CF,
            ],
        }
    }

    /// The family that takes the changelog's records.
    pub fn data_family(self) -> &'static str {
        match self {
            StoreType::KeyValue => rocksdb::DEFAULT_COLUMN_FAMILY_NAME,
            StoreType::TimestampedKeyValue => TIMESTAMPED_CF,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            StoreType::KeyValue => "key_value",
            StoreType::TimestampedKeyValue => "timestamped_key_value",
        }
    }

    /// The stored value of a record: the raw value, or for a timestamped store the timestamp in
    /// front of it (Java's `long`, big-endian; -1 when the record has none, as Kafka Streams'
    /// own restore writes it). `out` is reused across records.
    pub fn encode_value(self, timestamp: i64, value: &[u8], out: &mut Vec<u8>) {
        out.clear();
        if self == StoreType::TimestampedKeyValue {
            out.extend_from_slice(&timestamp.to_be_bytes());
        }
        out.extend_from_slice(value);
    }
}

/// How a configured store is laid out on disk.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Layout {
    /// `<state_dir>/<store>/<partition>/`, key-value.
    #[default]
    Warmstore,
    /// Where a Kafka Streams application opens the store as its own.
    KafkaStreams {
        application_id: String,
        subtopology: u32,
        kind: StoreType,
    },
}

impl Layout {
    pub fn kind(&self) -> StoreType {
        match self {
            Layout::Warmstore => StoreType::KeyValue,
            Layout::KafkaStreams { kind, .. } => *kind,
        }
    }
}

/// Where one store partition lives, and its column families. The lock and the wipe marker sit
/// beside the database directory, so wiping the database never drops the lock or the marker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorePaths {
    pub db: PathBuf,
    pub lock: PathBuf,
    pub marker: PathBuf,
    pub kind: StoreType,
}

impl StorePaths {
    /// warmstore's own layout: `<state_dir>/<store>/<partition>/`, the lock and the marker
    /// beside it. The store name is validated by the config.
    pub fn new(state_dir: &Path, store: &str, partition: i32) -> Self {
        let parent = state_dir.join(store);
        StorePaths {
            db: parent.join(partition.to_string()),
            lock: parent.join(format!("{partition}.lock")),
            marker: parent.join(format!("{partition}.wiping")),
            kind: StoreType::KeyValue,
        }
    }

    /// Where `layout` puts partition `partition` of the store `store`.
    ///
    /// In the Kafka Streams layout the lock and the marker go into the task's `rocksdb/`
    /// directory, named after the store: Kafka Streams only opens the store directories it knows
    /// by name there, and counts a task directory as holding state whatever else it holds.
    pub fn for_layout(state_dir: &Path, layout: &Layout, store: &str, partition: i32) -> Self {
        match layout {
            Layout::Warmstore => StorePaths::new(state_dir, store, partition),
            Layout::KafkaStreams {
                application_id,
                subtopology,
                kind,
            } => {
                let parent = state_dir
                    .join(application_id)
                    .join(format!("{subtopology}_{partition}"))
                    .join("rocksdb");
                StorePaths {
                    db: parent.join(store),
                    lock: parent.join(format!("{store}.warmstore.lock")),
                    marker: parent.join(format!("{store}.warmstore-wiping")),
                    kind: *kind,
                }
            }
        }
    }
}

/// The partitions of `store` that have a store directory under `state_dir`, in `layout`.
pub fn partitions_on_disk(state_dir: &Path, layout: &Layout, store: &str) -> Vec<i32> {
    let (parent, subtopology) = match layout {
        Layout::Warmstore => (state_dir.join(store), None),
        Layout::KafkaStreams {
            application_id,
            subtopology,
            ..
        } => (state_dir.join(application_id), Some(*subtopology)),
    };
    let Ok(entries) = std::fs::read_dir(&parent) else {
        return Vec::new();
    };
    let mut partitions: Vec<i32> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let partition = match subtopology {
                None => name.parse().ok()?,
                Some(sub) => {
                    let (task_sub, partition) = name.split_once('_')?;
                    (task_sub.parse::<u32>().ok()? == sub).then_some(())?;
                    partition.parse().ok()?
                }
            };
            let paths = StorePaths::for_layout(state_dir, layout, store, partition);
            paths.db.is_dir().then_some(partition)
        })
        .collect();
    partitions.sort_unstable();
    partitions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmstore_paths_follow_its_layout() {
        let p = StorePaths::new(Path::new("/state"), "counts", 3);
        assert_eq!(p.db, Path::new("/state/counts/3"));
        assert_eq!(p.lock, Path::new("/state/counts/3.lock"));
        assert_eq!(p.marker, Path::new("/state/counts/3.wiping"));
        assert_eq!(p.kind, StoreType::KeyValue);
    }

    #[test]
    fn kafka_streams_paths_are_where_the_application_looks() {
        let layout = Layout::KafkaStreams {
            application_id: "wordcount".into(),
            subtopology: 0,
            kind: StoreType::TimestampedKeyValue,
        };
        let p = StorePaths::for_layout(Path::new("/state"), &layout, "counts", 3);
        assert_eq!(p.db, Path::new("/state/wordcount/0_3/rocksdb/counts"));
        assert_eq!(
            p.lock,
            Path::new("/state/wordcount/0_3/rocksdb/counts.warmstore.lock")
        );
        assert_eq!(
            p.marker,
            Path::new("/state/wordcount/0_3/rocksdb/counts.warmstore-wiping")
        );
        assert_eq!(p.kind, StoreType::TimestampedKeyValue);
    }

    #[test]
    fn partitions_on_disk_are_the_store_directories_of_the_layout() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::KafkaStreams {
            application_id: "app".into(),
            subtopology: 1,
            kind: StoreType::KeyValue,
        };
        for (task, store) in [("1_0", "s"), ("1_2", "s"), ("0_1", "s"), ("1_3", "other")] {
            std::fs::create_dir_all(
                dir.path()
                    .join("app")
                    .join(task)
                    .join("rocksdb")
                    .join(store),
            )
            .unwrap();
        }
        std::fs::write(dir.path().join("app/.lock"), b"").unwrap();
        assert_eq!(partitions_on_disk(dir.path(), &layout, "s"), [0, 2]);
        for partition in ["0", "5", "x"] {
            std::fs::create_dir_all(dir.path().join("w").join(partition)).unwrap();
        }
        std::fs::write(dir.path().join("w/0.lock"), b"").unwrap();
        assert_eq!(
            partitions_on_disk(dir.path(), &Layout::Warmstore, "w"),
            [0, 5]
        );
        assert!(partitions_on_disk(dir.path(), &Layout::Warmstore, "none").is_empty());
    }

    #[test]
    fn families_are_exactly_those_kafka_streams_opens() {
        assert_eq!(StoreType::KeyValue.families(), ["default", "offsets"]);
        assert_eq!(
            StoreType::TimestampedKeyValue.families(),
            ["default", "keyValueWithTimestamp", "offsets"]
        );
        assert_eq!(StoreType::KeyValue.data_family(), "default");
        assert_eq!(
            StoreType::TimestampedKeyValue.data_family(),
            "keyValueWithTimestamp"
        );
    }

    #[test]
    fn a_timestamped_value_is_the_big_endian_timestamp_then_the_value() {
        let mut out = vec![9, 9];
        StoreType::TimestampedKeyValue.encode_value(0x0102_0304_0506_0708, b"v", &mut out);
        assert_eq!(out, [1, 2, 3, 4, 5, 6, 7, 8, b'v']);
        StoreType::TimestampedKeyValue.encode_value(-1, b"", &mut out);
        assert_eq!(out, [0xff; 8]);
        StoreType::KeyValue.encode_value(42, b"raw", &mut out);
        assert_eq!(out, b"raw");
    }
}
