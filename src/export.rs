//! `warmstore export`: a consistent copy of every store of a config, taken beside a running
//! `warmstore run`, into another state directory, in the same layout.

use std::path::{Path, PathBuf};

use warmstore::config::{Config, StoreConfig};
use warmstore::store::export::{self, ExportError, Exported};
use warmstore::store::layout::partitions_on_disk;
use warmstore::store::{Layout, StorePaths, TopicPartition};

/// The first Kafka Streams version that keeps offsets in the store (KIP-1035).
const OFFSETS_IN_STORE: (u32, u32) = (4, 3);

#[derive(Debug, thiserror::Error)]
pub enum ExportCommandError {
    #[error("--kafka-streams-version `{0}` is not a version like 4.2 or 4.3.1")]
    Version(String),
    #[error("store {store}: no partition found under {dir}")]
    NothingToExport { store: String, dir: PathBuf },
    #[error("store {store} partition {partition}: {source}")]
    Export {
        store: String,
        partition: i32,
        source: ExportError,
    },
}

/// Whether an application of this Kafka Streams version reads offsets from `.checkpoint` rather
/// than from the store's `offsets` column family.
pub fn needs_checkpoint_file(version: &str) -> Result<bool, ExportCommandError> {
    let bad = || ExportCommandError::Version(version.to_string());
    let mut parts = version.split('.');
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    if parts.any(|p| p.parse::<u32>().is_err()) {
        return Err(bad());
    }
    Ok((major, minor) < OFFSETS_IN_STORE)
}

/// Exports every partition of every store in `config` found on disk (or listed in the config).
pub fn run(
    config: &Config,
    target_state_dir: &Path,
    kafka_streams_version: Option<&str>,
) -> Result<Vec<Exported>, ExportCommandError> {
    let checkpoint_file = match kafka_streams_version {
        Some(version) => needs_checkpoint_file(version)?,
        None => false,
    };
    let mut exported = Vec::new();
    for store in &config.stores {
        let partitions = store
            .partitions
            .clone()
            .unwrap_or_else(|| partitions_on_disk(&config.state_dir, &store.layout, &store.name));
        if partitions.is_empty() {
            return Err(ExportCommandError::NothingToExport {
                store: store.name.clone(),
                dir: config.state_dir.clone(),
            });
        }
        for partition in partitions {
            exported.push(export_partition(
                config,
                store,
                partition,
                target_state_dir,
                checkpoint_file,
            )?);
        }
    }
    Ok(exported)
}

fn export_partition(
    config: &Config,
    store: &StoreConfig,
    partition: i32,
    target_state_dir: &Path,
    checkpoint_file: bool,
) -> Result<Exported, ExportCommandError> {
    let paths = |dir: &Path| StorePaths::for_layout(dir, &store.layout, &store.name, partition);
    let target = paths(target_state_dir);
    // Kafka Streams holds `<application dir>/.lock` while it runs (and, in older versions, each
    // task directory's `.lock`).
    let locks = match &store.layout {
        Layout::KafkaStreams { application_id, .. } => {
            let app = target_state_dir.join(application_id);
            let task = target
                .db
                .parent()
                .and_then(Path::parent)
                .map(Path::to_path_buf);
            [Some(app.join(".lock")), task.map(|t| t.join(".lock"))]
                .into_iter()
                .flatten()
                .collect()
        }
        Layout::Warmstore => Vec::new(),
    };
    let legacy = checkpoint_file && matches!(store.layout, Layout::KafkaStreams { .. });
    let tp = TopicPartition::new(&store.changelog, partition);
    export::export(&paths(&config.state_dir), &target, &tp, &locks, legacy).map_err(|source| {
        ExportCommandError::Export {
            store: store.name.clone(),
            partition,
            source,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_before_4_3_read_the_checkpoint_file() {
        assert!(needs_checkpoint_file("4.2").unwrap());
        assert!(needs_checkpoint_file("4.2.2").unwrap());
        assert!(needs_checkpoint_file("3.9.1").unwrap());
        assert!(!needs_checkpoint_file("4.3").unwrap());
        assert!(!needs_checkpoint_file("4.3.2").unwrap());
        assert!(!needs_checkpoint_file("5.0").unwrap());
        for bad in ["4", "four.two", "4.2.x", ""] {
            assert!(needs_checkpoint_file(bad).is_err(), "{bad}");
        }
    }
}
