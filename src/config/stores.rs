//! The `stores:` section: which changelogs are restored, and in which layout each store is
//! written. Store names and application ids become directory names, so they are checked here.

use serde::Deserialize;
use std::collections::BTreeSet;

use super::ConfigProblem;
use crate::store::{Layout, StoreType};

#[derive(Debug, Clone, PartialEq)]
pub struct StoreConfig {
    pub name: String,
    pub changelog: String,
    /// `None`: every partition of the topic.
    pub partitions: Option<Vec<i32>>,
    pub layout: Layout,
}

impl StoreConfig {
    /// A store in warmstore's own layout.
    pub fn new(name: &str, changelog: &str, partitions: Option<Vec<i32>>) -> StoreConfig {
        StoreConfig {
            name: name.into(),
            changelog: changelog.into(),
            partitions,
            layout: Layout::Warmstore,
        }
    }
}

/// Which layout a store is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
enum LayoutName {
    /// `<state_dir>/<store>/<partition>/`
    #[default]
    Warmstore,
    /// `<state_dir>/<application_id>/<subtopology>_<partition>/rocksdb/<store>/`, opened by Kafka
    /// Streams as its own
    KafkaStreams,
}

/// A store as written in the config file.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStore {
    /// The store's name; in the kafka-streams layout, the Kafka Streams store name
    name: String,
    /// The changelog topic; in the kafka-streams layout it defaults to
    /// `<application_id>-<name>-changelog`
    #[serde(default)]
    changelog: Option<String>,
    /// Partitions to restore; every partition of the topic when left out
    #[serde(default)]
    partitions: Option<Vec<i32>>,
    #[serde(default)]
    layout: LayoutName,
    /// kafka-streams layout: the application's `application.id`
    #[serde(default)]
    application_id: Option<String>,
    /// kafka-streams layout: `key_value` or `timestamped_key_value` (what the DSL materialises)
    #[serde(default, rename = "type")]
    kind: Option<StoreType>,
    /// kafka-streams layout: the sub-topology of the store's tasks (default 0)
    #[serde(default)]
    subtopology: Option<u32>,
}

impl RawStore {
    pub(super) fn into_store(self, index: usize) -> Result<StoreConfig, ConfigProblem> {
        use ConfigProblem as P;
        let layout = match self.layout {
            LayoutName::Warmstore => {
                let only_kafka_streams = [
                    ("application_id", self.application_id.is_some()),
                    ("type", self.kind.is_some()),
                    ("subtopology", self.subtopology.is_some()),
                ];
                if let Some((field, _)) = only_kafka_streams.iter().find(|(_, set)| *set) {
                    return Err(P::OnlyKafkaStreams { index, field });
                }
                Layout::Warmstore
            }
            LayoutName::KafkaStreams => {
                let application_id = self.application_id.ok_or(P::KafkaStreamsNeeds {
                    index,
                    field: "application_id",
                })?;
                validate_store_name(&application_id)
                    .map_err(|problem| P::ApplicationId { index, problem })?;
                Layout::KafkaStreams {
                    application_id,
                    subtopology: self.subtopology.unwrap_or(0),
                    kind: self.kind.ok_or(P::KafkaStreamsNeeds {
                        index,
                        field: "type",
                    })?,
                }
            }
        };
        let changelog = match (&layout, self.changelog) {
            (_, Some(changelog)) => changelog,
            (Layout::KafkaStreams { application_id, .. }, None) => {
                format!("{application_id}-{}-changelog", self.name)
            }
            (Layout::Warmstore, None) => return Err(P::NoChangelog { index }),
        };
        Ok(StoreConfig {
            name: self.name,
            changelog,
            partitions: self.partitions,
            layout,
        })
    }
}

/// Why a store name cannot be a directory name under `state_dir`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreNameProblem {
    #[error("must not be empty")]
    Empty,
    #[error("`{0}` is not a usable directory name")]
    Dots(String),
    #[error("`{name}` contains `{character}`; use letters, digits, '.', '_' and '-' only")]
    Character { name: String, character: char },
}

/// The checks that span the stores: unique names, partitions, directories no two stores share.
pub(super) fn validate(stores: &[StoreConfig]) -> Result<(), ConfigProblem> {
    use ConfigProblem as P;
    let mut names = BTreeSet::new();
    for (index, store) in stores.iter().enumerate() {
        validate_store_name(&store.name).map_err(|problem| P::StoreName { index, problem })?;
        if !names.insert(&store.name) {
            let name = store.name.clone();
            return Err(P::StoreNameTwice { index, name });
        }
        if store.changelog.trim().is_empty() {
            return Err(P::NoChangelog { index });
        }
        if let Layout::KafkaStreams { application_id, .. } = &store.layout {
            let shared = stores
                .iter()
                .any(|s| s.layout == Layout::Warmstore && &s.name == application_id);
            if shared {
                let name = application_id.clone();
                return Err(P::ApplicationIdIsStoreName { index, name });
            }
        }
        if let Some(partitions) = &store.partitions {
            if partitions.is_empty() {
                return Err(P::NoPartitions { index });
            }
            let mut seen = BTreeSet::new();
            for &partition in partitions {
                if partition < 0 {
                    return Err(P::NegativePartition { index, partition });
                }
                if !seen.insert(partition) {
                    return Err(P::PartitionTwice { index, partition });
                }
            }
        }
        if let Some((other, partition)) = stores[..index]
            .iter()
            .find_map(|earlier| shared_partition(earlier, store).map(|p| (earlier, p)))
        {
            return Err(P::ChangelogTwice {
                index,
                changelog: store.changelog.clone(),
                partition,
                other: other.name.clone(),
            });
        }
    }
    Ok(())
}

/// `Some` when two stores read a partition of the same changelog: `Some(Some(p))` naming one
/// both list, `Some(None)` when either takes every partition.
fn shared_partition(a: &StoreConfig, b: &StoreConfig) -> Option<Option<i32>> {
    if a.changelog != b.changelog {
        return None;
    }
    match (&a.partitions, &b.partitions) {
        (Some(x), Some(y)) => x.iter().find(|p| y.contains(p)).map(|p| Some(*p)),
        _ => Some(None),
    }
}

/// Store names become directory names under `state_dir`, so they must never escape it.
pub fn validate_store_name(name: &str) -> Result<(), StoreNameProblem> {
    if name.is_empty() {
        return Err(StoreNameProblem::Empty);
    }
    if name == "." || name == ".." {
        return Err(StoreNameProblem::Dots(name.to_string()));
    }
    if let Some(character) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(StoreNameProblem::Character {
            name: name.to_string(),
            character,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn a_changelog_partition_feeds_one_store() {
        let stores = |a: &str, b: &str| {
            format!(
                "kafka: {{bootstrap.servers: x}}\nstores:\n  - {{name: a, changelog: t{a}}}\n  - {{name: b, changelog: t{b}}}\n"
            )
        };
        let e = Config::parse(&stores("", ""), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("stores[1].changelog: `t` is also read by store `a`"),
            "{e}"
        );
        let e = Config::parse(
            &stores(", partitions: [0, 1]", ", partitions: [2, 1]"),
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("`t` partition 1 is also read by store `a`"),
            "{e}"
        );
        let e = Config::parse(&stores("", ", partitions: [3]"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("is also read by store `a`"), "{e}");
        assert!(Config::parse(&stores(", partitions: [0]", ", partitions: [1]"), None).is_ok());
        let other = stores("", "").replacen("changelog: t}", "changelog: u}", 1);
        assert!(Config::parse(&other, None).is_ok(), "{other}");
    }

    #[test]
    fn store_names_never_escape_the_state_dir() {
        for bad in ["", ".", "..", "a/b", "../x", "a\\b", "c d"] {
            assert!(validate_store_name(bad).is_err(), "{bad:?}");
        }
        for good in ["counts", "word-count.v2", "A_1"] {
            assert!(validate_store_name(good).is_ok(), "{good:?}");
        }
        let text = "kafka: {bootstrap.servers: x}\nstores: [{name: ../etc, changelog: t}]";
        assert!(Config::parse(text, None)
            .unwrap_err()
            .to_string()
            .contains("stores[0].name"));
    }

    #[test]
    fn a_kafka_streams_store_lives_where_the_application_looks() {
        let text = "kafka: {bootstrap.servers: x}\nstores:\n  - name: counts\n    layout: kafka-streams\n    application_id: wordcount\n    type: timestamped_key_value\n  - name: totals\n    layout: kafka-streams\n    application_id: wordcount\n    type: key_value\n    subtopology: 2\n    changelog: own-topic\n";
        let c = Config::parse(text, None).unwrap();
        assert_eq!(c.stores[0].changelog, "wordcount-counts-changelog");
        assert_eq!(
            c.stores[0].layout,
            Layout::KafkaStreams {
                application_id: "wordcount".into(),
                subtopology: 0,
                kind: StoreType::TimestampedKeyValue
            }
        );
        assert_eq!(c.stores[1].changelog, "own-topic");
        assert_eq!(
            c.stores[1].layout,
            Layout::KafkaStreams {
                application_id: "wordcount".into(),
                subtopology: 2,
                kind: StoreType::KeyValue
            }
        );
    }

    #[test]
    fn a_kafka_streams_store_names_what_it_lacks_and_what_does_not_belong() {
        let store = |fields: &str| {
            Config::parse(
                &format!("kafka: {{bootstrap.servers: x}}\nstores:\n  - name: counts\n{fields}"),
                None,
            )
            .unwrap_err()
            .to_string()
        };
        let e = store("    layout: kafka-streams\n    type: key_value\n");
        assert!(e.contains("stores[0].application_id is required"), "{e}");
        let e = store("    layout: kafka-streams\n    application_id: a\n");
        assert!(e.contains("stores[0].type is required"), "{e}");
        let e = store("    changelog: t\n    type: key_value\n");
        assert!(
            e.contains("stores[0].type is only for `layout: kafka-streams`"),
            "{e}"
        );
        let e =
            store("    layout: kafka-streams\n    application_id: ../up\n    type: key_value\n");
        assert!(e.contains("stores[0].application_id"), "{e}");
        let e = store("    layout: kafka-streams\n    application_id: a\n    type: window\n");
        assert!(e.contains("line"), "a YAML error names the line: {e}");
        let e = store("    layout: streams\n");
        assert!(e.contains("line"), "{e}");
        let e = store("    changelog: t\n  - name: other\n    layout: kafka-streams\n    application_id: counts\n    type: key_value\n");
        assert!(e.contains("stores[1].application_id"), "{e}");
        let e = store("    partitions: [0]\n");
        assert!(e.contains("stores[0].changelog"), "{e}");
    }
}
