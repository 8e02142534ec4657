//! The YAML config. Parsing is strict: an unknown field is an error that names
//! the field and its line, because a silently ignored typo in a restore service costs hours.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::store::dirty::UncleanPolicy;
use crate::store::options::{
    SharedBlockCache, SharedMemtables, DEFAULT_BLOCK_CACHE, DEFAULT_TOTAL_WRITE_BUFFER,
};
use crate::store::{RocksDbOverrides, StoreOptions};
use crate::units::{ByteSize, HumanDuration};

mod assignment;
mod stores;
use assignment::RawAssignment;
pub use assignment::{Assignment, GroupConfig, DEFAULT_KEEP_UNASSIGNED, INSTANCE_ID_ENV};
use stores::RawStore;
pub use stores::{validate_store_name, StoreConfig, StoreNameProblem};

/// Environment variable that overrides `kafka.bootstrap.servers` (Helm and Kubernetes set it).
pub const BOOTSTRAP_ENV: &str = "WARMSTORE_BOOTSTRAP_SERVERS";
/// `WARMSTORE_KAFKA_SASL_PASSWORD=x` sets `kafka.sasl.password: x`, so secrets can come from a
/// Kubernetes Secret instead of the ConfigMap.
pub const KAFKA_ENV_PREFIX: &str = "WARMSTORE_KAFKA_";

/// librdkafka properties named by `WARMSTORE_KAFKA_*` variables: the rest of the name, lowercased,
/// with `_` read as `.` (librdkafka's property names use dots, never underscores).
pub fn kafka_properties_from_env(
    vars: impl IntoIterator<Item = (String, String)>,
) -> Vec<(String, String)> {
    vars.into_iter()
        .filter_map(|(name, value)| {
            let property = name.strip_prefix(KAFKA_ENV_PREFIX)?;
            (!property.is_empty()).then(|| (property.to_ascii_lowercase().replace('_', "."), value))
        })
        .collect()
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// librdkafka properties, passed through as given.
    pub kafka: BTreeMap<String, String>,
    pub state_dir: PathBuf,
    pub http: HttpConfig,
    pub restore: RestoreConfig,
    pub rocksdb: RocksDbOverrides,
    pub assignment: Assignment,
    pub stores: Vec<StoreConfig>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// host:port of /metrics, /livez, /readyz and /stores
    #[serde(default = "default_listen")]
    #[schemars(with = "String")]
    pub listen: SocketAddr,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RestoreConfig {
    pub commit_interval: Duration,
    pub max_uncommitted_bytes: u64,
    pub on_unclean_shutdown: UncleanPolicy,
    pub ready_max_lag: u64,
    /// Flush once unflushed commits are this old (KAFKA-20663).
    pub flush_interval: Duration,
    /// RocksDB's write-ahead log; off as in Kafka Streams.
    pub wal: bool,
    /// Turns of memory for partitions catching up: a turn is the memtable budget over this count,
    /// and a catch-up smaller than that takes part of one (`restore::turns`). Tailing needs none.
    pub catch_up_turns: usize,
    /// Settings given under an old name, to warn about at start.
    pub deprecated: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
#[error("config {path}: {problem}")]
pub struct ConfigError {
    pub path: String,
    pub problem: ConfigProblem,
}

/// What is wrong with a config; each names the field (and YAML errors the line).
#[derive(Debug, thiserror::Error)]
pub enum ConfigProblem {
    #[error("cannot read the file: {0}")]
    Unreadable(#[from] std::io::Error),
    #[error("{0}")]
    Yaml(#[from] serde_yaml::Error),
    #[error("kafka.{key} must be a string, number or boolean")]
    KafkaValue { key: String },
    #[error("kafka.bootstrap.servers is required (or set {BOOTSTRAP_ENV})")]
    NoBootstrapServers,
    #[error("assignment.{field} is only for `mode: group`")]
    OnlyGroupMode { field: &'static str },
    #[error("assignment.group_id is required with `mode: group`: the processes that share the partitions join this consumer group")]
    NoGroupId,
    #[error("stores: at least one store is required")]
    NoStores,
    #[error("{field} must be greater than 0")]
    Zero { field: &'static str },
    #[error("restore.max_parallel_restores is the old name of restore.catch_up_turns; set only catch_up_turns")]
    BothTurnNames,
    #[error("stores[{index}].name: {problem}")]
    StoreName {
        index: usize,
        problem: StoreNameProblem,
    },
    #[error("stores[{index}].name: `{name}` is used twice")]
    StoreNameTwice { index: usize, name: String },
    #[error("stores[{index}].changelog is required and must not be empty")]
    NoChangelog { index: usize },
    #[error("stores[{index}].{field} is only for `layout: kafka-streams`")]
    OnlyKafkaStreams { index: usize, field: &'static str },
    #[error("stores[{index}].{field} is required with `layout: kafka-streams`")]
    KafkaStreamsNeeds { index: usize, field: &'static str },
    #[error("stores[{index}].application_id: {problem}")]
    ApplicationId {
        index: usize,
        problem: StoreNameProblem,
    },
    #[error("stores[{index}].application_id: `{name}` is also the name of a store in warmstore's layout, whose directory it would share")]
    ApplicationIdIsStoreName { index: usize, name: String },
    #[error("stores[{index}].partitions is empty; leave it out to restore every partition")]
    NoPartitions { index: usize },
    #[error("stores[{index}].partitions: {partition} is negative")]
    NegativePartition { index: usize, partition: i32 },
    #[error("stores[{index}].partitions: {partition} is listed twice")]
    PartitionTwice { index: usize, partition: i32 },
    #[error("stores[{index}].changelog: `{changelog}`{} is also read by store `{other}`; a changelog partition feeds one store (the consumers assign each partition once, so one of the two would stay failed)", partition.map_or(String::new(), |p| format!(" partition {p}")))]
    ChangelogTwice {
        index: usize,
        changelog: String,
        /// The partition both read, when either lists its partitions.
        partition: Option<i32>,
        other: String,
    },
}

/// The config file as written: what the schema describes and what parsing starts from.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "warmstore config")]
struct RawConfig {
    /// librdkafka properties, passed through as given
    #[serde(default)]
    #[schemars(schema_with = "kafka_properties_schema")]
    kafka: BTreeMap<String, serde_yaml::Value>,
    #[serde(default = "default_state_dir")]
    state_dir: PathBuf,
    #[serde(default)]
    http: Option<HttpConfig>,
    #[serde(default)]
    restore: RawRestore,
    #[serde(default)]
    rocksdb: RocksDbOverrides,
    /// which partitions this process restores: every configured one, or those a consumer group
    /// assigns it
    #[serde(default)]
    assignment: RawAssignment,
    #[serde(default)]
    stores: Vec<RawStore>,
}

#[derive(Deserialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawRestore {
    commit_interval: Option<HumanDuration>,
    max_uncommitted_bytes: Option<ByteSize>,
    #[serde(default)]
    on_unclean_shutdown: UncleanPolicy,
    ready_max_lag: Option<u64>,
    flush_interval: Option<HumanDuration>,
    #[serde(default)]
    wal: bool,
    catch_up_turns: Option<usize>,
    /// The former name of `catch_up_turns`; still read, with a warning.
    max_parallel_restores: Option<usize>,
}

fn kafka_properties_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "additionalProperties": {"type": ["string", "number", "boolean"]}
    })
}

/// The JSON schema of the config file (draft 7, every subschema inline so it can be embedded in
/// another schema, as the Helm chart's values schema does).
pub fn json_schema() -> serde_json::Value {
    let generator = schemars::generate::SchemaSettings::draft07()
        .with(|s| s.inline_subschemas = true)
        .into_generator();
    generator.into_root_schema_for::<RawConfig>().to_value()
}

fn default_state_dir() -> PathBuf {
    PathBuf::from("./state")
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9464))
}

impl Default for RestoreConfig {
    fn default() -> Self {
        RestoreConfig {
            commit_interval: Duration::from_secs(10),
            max_uncommitted_bytes: 64 << 20,
            on_unclean_shutdown: UncleanPolicy::Resume,
            ready_max_lag: 10_000,
            flush_interval: Duration::from_secs(60),
            wal: false,
            catch_up_turns: 4,
            deprecated: Vec::new(),
        }
    }
}

impl Config {
    /// Reads and validates a config file; `bootstrap_override` is the value of
    /// `WARMSTORE_BOOTSTRAP_SERVERS`, passed in so tests need not touch the environment.
    pub fn load(path: &Path, bootstrap_override: Option<String>) -> Result<Config, ConfigError> {
        let error = |problem| ConfigError {
            path: path.display().to_string(),
            problem,
        };
        let text = std::fs::read_to_string(path).map_err(|e| error(e.into()))?;
        let mut config = Config::parse(&text, bootstrap_override).map_err(error)?;
        config
            .kafka
            .extend(kafka_properties_from_env(std::env::vars()));
        config.assignment = config
            .assignment
            .with_instance_override(std::env::var(INSTANCE_ID_ENV).ok());
        Ok(config)
    }

    pub fn parse(text: &str, bootstrap_override: Option<String>) -> Result<Config, ConfigProblem> {
        let raw: RawConfig = serde_yaml::from_str(text)?;
        let mut kafka = BTreeMap::new();
        for (key, value) in raw.kafka {
            let text = match value {
                serde_yaml::Value::String(s) => s,
                serde_yaml::Value::Number(n) => n.to_string(),
                serde_yaml::Value::Bool(b) => b.to_string(),
                _ => return Err(ConfigProblem::KafkaValue { key }),
            };
            kafka.insert(key, text);
        }
        if let Some(servers) = bootstrap_override.filter(|s| !s.trim().is_empty()) {
            kafka.insert("bootstrap.servers".into(), servers);
        }
        let defaults = RestoreConfig::default();
        let r = raw.restore;
        let mut deprecated = Vec::new();
        let catch_up_turns = match (r.catch_up_turns, r.max_parallel_restores) {
            (Some(_), Some(_)) => return Err(ConfigProblem::BothTurnNames),
            (Some(turns), None) => turns,
            (None, Some(turns)) => {
                deprecated.push(
                    "restore.max_parallel_restores is deprecated; it is now called restore.catch_up_turns"
                        .to_string(),
                );
                turns
            }
            (None, None) => defaults.catch_up_turns,
        };
        let restore = RestoreConfig {
            commit_interval: r.commit_interval.map_or(defaults.commit_interval, |d| d.0),
            max_uncommitted_bytes: r
                .max_uncommitted_bytes
                .map_or(defaults.max_uncommitted_bytes, |b| b.0),
            on_unclean_shutdown: r.on_unclean_shutdown,
            ready_max_lag: r.ready_max_lag.unwrap_or(defaults.ready_max_lag),
            flush_interval: r.flush_interval.map_or(defaults.flush_interval, |d| d.0),
            wal: r.wal,
            catch_up_turns,
            deprecated,
        };
        let config = Config {
            kafka,
            state_dir: raw.state_dir,
            http: raw.http.unwrap_or(HttpConfig {
                listen: default_listen(),
            }),
            restore,
            rocksdb: raw.rocksdb,
            assignment: raw.assignment.into_assignment()?,
            stores: raw
                .stores
                .into_iter()
                .enumerate()
                .map(|(index, store)| store.into_store(index))
                .collect::<Result<_, _>>()?,
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigProblem> {
        use ConfigProblem as P;
        if !self.kafka.contains_key("bootstrap.servers") {
            return Err(P::NoBootstrapServers);
        }
        if self.stores.is_empty() {
            return Err(P::NoStores);
        }
        let restore = &self.restore;
        let rocksdb = &self.rocksdb;
        // A zero memtable budget is RocksDB's "no budget": memtables would grow with the stores.
        let zero_bytes = |size: Option<ByteSize>| size.is_some_and(|b| b.0 == 0);
        for (field, zero) in [
            ("restore.commit_interval", restore.commit_interval.is_zero()),
            (
                "restore.max_uncommitted_bytes",
                restore.max_uncommitted_bytes == 0,
            ),
            ("restore.catch_up_turns", restore.catch_up_turns == 0),
            (
                "rocksdb.total_write_buffer_size",
                zero_bytes(rocksdb.total_write_buffer_size),
            ),
            (
                "rocksdb.write_buffer_size",
                zero_bytes(rocksdb.write_buffer_size),
            ),
        ] {
            if zero {
                return Err(P::Zero { field });
            }
        }
        stores::validate(&self.stores)
    }

    /// What to warn about at start (and in `check-config`): deprecated names, and `kafka:`
    /// properties that give up one of the consumers' guarantees.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = self.restore.deprecated.clone();
        warnings.extend(crate::kafka::consumers::weakened_defaults(&self.kafka));
        warnings
    }

    /// Store options for this process. Call once: each call makes a new shared memtable budget.
    pub fn store_options(&self) -> StoreOptions {
        StoreOptions {
            rocksdb: self.rocksdb.clone(),
            wal: self.restore.wal,
            flush_interval: self.restore.flush_interval,
            memtables: Some(SharedMemtables::new(self.memtable_budget())),
            block_cache: Some(SharedBlockCache::new(
                self.rocksdb
                    .block_cache_size
                    .map_or(DEFAULT_BLOCK_CACHE, |b| b.0),
            )),
        }
    }

    /// Memtable memory shared by every store of the process (`rocksdb.total_write_buffer_size`).
    pub fn memtable_budget(&self) -> u64 {
        self.rocksdb
            .total_write_buffer_size
            .map_or(DEFAULT_TOTAL_WRITE_BUFFER, |b| b.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"
kafka:
  bootstrap.servers: 127.0.0.1:9092
  fetch.wait.max.ms: 100
  enable.partition.eof: false
state_dir: ./state
http:
  listen: 127.0.0.1:9464
restore:
  commit_interval: 10s
  max_uncommitted_bytes: 64MiB
  on_unclean_shutdown: resume
  ready_max_lag: 10000
rocksdb:
  write_buffer_size: 64MiB
stores:
  - name: counts
    changelog: wordcount-counts-changelog
    partitions: [0, 1]
"#;

    #[test]
    fn the_documented_example_parses() {
        let c = Config::parse(FULL, None).unwrap();
        assert_eq!(c.kafka["bootstrap.servers"], "127.0.0.1:9092");
        assert_eq!(c.kafka["fetch.wait.max.ms"], "100");
        assert_eq!(c.kafka["enable.partition.eof"], "false");
        assert_eq!(c.restore.commit_interval, Duration::from_secs(10));
        assert_eq!(c.restore.max_uncommitted_bytes, 64 << 20);
        assert_eq!(c.rocksdb.write_buffer_size, Some(ByteSize(64 << 20)));
        assert_eq!(c.stores[0].partitions, Some(vec![0, 1]));
        assert_eq!(c.http.listen, "127.0.0.1:9464".parse().unwrap());
    }

    #[test]
    fn environment_overrides_bootstrap_servers() {
        let c = Config::parse(FULL, Some("broker:9093".into())).unwrap();
        assert_eq!(c.kafka["bootstrap.servers"], "broker:9093");
        let minimal = "stores: [{name: s, changelog: t}]";
        assert!(Config::parse(minimal, None)
            .unwrap_err()
            .to_string()
            .contains("bootstrap.servers"));
        assert!(Config::parse(minimal, Some("b:1".into())).is_ok());
    }

    #[test]
    fn secrets_can_come_from_the_environment() {
        let vars = [
            (
                "WARMSTORE_KAFKA_SASL_PASSWORD".to_string(),
                "s3cret".to_string(),
            ),
            (
                "WARMSTORE_KAFKA_SSL_CA_LOCATION".to_string(),
                "/etc/tls/ca.crt".to_string(),
            ),
            ("WARMSTORE_KAFKA_".to_string(), "ignored".to_string()),
            ("HOME".to_string(), "/home/app".to_string()),
        ];
        assert_eq!(
            kafka_properties_from_env(vars),
            vec![
                ("sasl.password".to_string(), "s3cret".to_string()),
                ("ssl.ca.location".to_string(), "/etc/tls/ca.crt".to_string()),
            ]
        );
    }

    #[test]
    fn unknown_fields_name_the_field_and_line() {
        let text = FULL.replace(
            "  ready_max_lag: 10000",
            "  ready_max_lag: 10000\n  comit_interval: 5s",
        );
        let e = Config::parse(&text, None).unwrap_err().to_string();
        assert!(e.contains("comit_interval"), "{e}");
        assert!(e.contains("line 14"), "{e}");
    }

    #[test]
    fn background_threads_take_a_count_of_at_least_one() {
        let with = |line: &str| FULL.replace("  write_buffer_size: 64MiB", line);
        let c = Config::parse(&with("  flush_threads: 4\n  compaction_threads: 6"), None).unwrap();
        assert_eq!(c.rocksdb.flush_threads.map(|n| n.get()), Some(4));
        assert_eq!(c.rocksdb.compaction_threads.map(|n| n.get()), Some(6));
        let e = Config::parse(&with("  flush_threads: 0"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("rocksdb.flush_threads"), "{e}");
        assert!(e.contains("line 15"), "{e}");
    }

    #[test]
    fn the_old_name_of_catch_up_turns_still_works_with_a_warning() {
        let with = |line: &str| FULL.replace("  ready_max_lag: 10000", line);
        let c = Config::parse(&with("  max_parallel_restores: 3"), None).unwrap();
        assert_eq!(c.restore.catch_up_turns, 3);
        assert_eq!(c.restore.deprecated.len(), 1);
        assert!(c.restore.deprecated[0].contains("restore.catch_up_turns"));
        let e = Config::parse(
            &with("  max_parallel_restores: 3\n  catch_up_turns: 2"),
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("set only catch_up_turns"), "{e}");
    }

    #[test]
    fn bad_values_are_explained() {
        let e = Config::parse(&FULL.replace("10s", "10 parsecs"), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("restore.commit_interval") || e.contains("parsecs"),
            "{e}"
        );
        assert!(e.contains("line"), "{e}");
        let e = Config::parse(&FULL.replace("resume", "maybe"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("maybe"), "{e}");
        let with = |line: &str| FULL.replace("  ready_max_lag: 10000", line);
        assert_eq!(Config::parse(FULL, None).unwrap().restore.catch_up_turns, 4);
        let c = Config::parse(&with("  catch_up_turns: 2"), None).unwrap();
        assert_eq!(c.restore.catch_up_turns, 2);
        assert!(c.restore.deprecated.is_empty());
        let e = Config::parse(&with("  catch_up_turns: 0"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("restore.catch_up_turns"), "{e}");
        for (line, field) in [
            ("  write_buffer_size: 0", "rocksdb.write_buffer_size"),
            (
                "  write_buffer_size: 64MiB\n  total_write_buffer_size: 0B",
                "rocksdb.total_write_buffer_size",
            ),
        ] {
            let e = Config::parse(&FULL.replace("  write_buffer_size: 64MiB", line), None)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("{field} must be greater than 0")),
                "{e}"
            );
        }
        let no_stores = "kafka: {bootstrap.servers: x}\nstores: []";
        assert!(Config::parse(no_stores, None)
            .unwrap_err()
            .to_string()
            .contains("at least one store"));
    }

    #[test]
    fn partitions_must_be_sane() {
        let e = Config::parse(&FULL.replace("[0, 1]", "[0, 0]"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("listed twice"), "{e}");
        let e = Config::parse(&FULL.replace("[0, 1]", "[-1]"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("negative"), "{e}");
        let e = Config::parse(&FULL.replace("[0, 1]", "[]"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("empty"), "{e}");
    }

    #[test]
    fn the_memtable_budget_is_a_size() {
        let text = FULL.replace(
            "  write_buffer_size: 64MiB",
            "  write_buffer_size: 64MiB\n  total_write_buffer_size: 32MiB",
        );
        let c = Config::parse(&text, None).unwrap();
        assert_eq!(c.rocksdb.total_write_buffer_size, Some(ByteSize(32 << 20)));
        assert!(c.store_options().memtables.is_some());
    }

    #[test]
    fn atomic_flush_is_accepted_but_not_a_knob() {
        let text = FULL.replace(
            "  write_buffer_size: 64MiB",
            "  write_buffer_size: 64MiB\n  atomic_flush: false",
        );
        let c = Config::parse(&text, None).unwrap();
        assert_eq!(c.rocksdb.atomic_flush, Some(false));
    }
}
