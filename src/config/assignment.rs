//! The `assignment:` section: whether this process restores every configured partition, or shares
//! them with other processes through Kafka's consumer-group protocol.

use serde::Deserialize;
use std::time::Duration;

use super::ConfigProblem;
use crate::units::HumanDuration;

/// `WARMSTORE_INSTANCE_ID=pod-0` sets `assignment.instance_id: pod-0`: the chart passes the pod's
/// name through the downward API, so a restarted pod rejoins as the same static member.
pub const INSTANCE_ID_ENV: &str = "WARMSTORE_INSTANCE_ID";

/// Kafka Streams' `state.cleanup.delay.ms` default: a partition revoked and handed back within this
/// resumes from its store instead of rebuilding it.
pub const DEFAULT_KEEP_UNASSIGNED: Duration = Duration::from_secs(600);

/// Who decides which partitions this process restores.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Assignment {
    /// Every configured partition, in this process alone.
    #[default]
    All,
    /// The partitions a consumer group assigns to this process.
    Group(GroupConfig),
}

#[derive(Debug, Clone, PartialEq)]
pub struct GroupConfig {
    pub group_id: String,
    /// Static membership (`group.instance.id`); `None` joins as a dynamic member.
    pub instance_id: Option<String>,
    /// How long a revoked store stays on disk before it is deleted.
    pub keep_unassigned: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
enum Mode {
    /// this process restores every configured partition
    #[default]
    All,
    /// share partitions with other processes through Kafka's consumer-group protocol
    Group,
}

/// The section as written in the config file.
#[derive(Deserialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAssignment {
    #[serde(default)]
    mode: Mode,
    /// group mode: the consumer group the processes that share the partitions join
    #[serde(default)]
    group_id: Option<String>,
    /// group mode: static membership (`group.instance.id`); WARMSTORE_INSTANCE_ID overrides it
    #[serde(default)]
    instance_id: Option<String>,
    /// group mode: how long a revoked store stays on disk before it is deleted (default 10m)
    #[serde(default)]
    keep_unassigned: Option<HumanDuration>,
}

fn nonempty(value: Option<String>) -> Option<String> {
    value.filter(|s| !s.trim().is_empty())
}

impl Assignment {
    /// The same, with the instance named by `WARMSTORE_INSTANCE_ID` (its value, passed in so tests
    /// need not touch the environment), when set and not empty.
    pub fn with_instance_override(self, instance: Option<String>) -> Assignment {
        match (self, nonempty(instance)) {
            (Assignment::Group(group), Some(instance)) => Assignment::Group(GroupConfig {
                instance_id: Some(instance),
                ..group
            }),
            (assignment, _) => assignment,
        }
    }
}

impl RawAssignment {
    pub(super) fn into_assignment(self) -> Result<Assignment, ConfigProblem> {
        match self.mode {
            Mode::All => {
                let group_only = [
                    ("group_id", self.group_id.is_some()),
                    ("instance_id", self.instance_id.is_some()),
                    ("keep_unassigned", self.keep_unassigned.is_some()),
                ];
                match group_only.iter().find(|(_, set)| *set) {
                    Some((field, _)) => Err(ConfigProblem::OnlyGroupMode { field }),
                    None => Ok(Assignment::All),
                }
            }
            Mode::Group => Ok(Assignment::Group(GroupConfig {
                group_id: nonempty(self.group_id).ok_or(ConfigProblem::NoGroupId)?,
                instance_id: nonempty(self.instance_id),
                keep_unassigned: self
                    .keep_unassigned
                    .map_or(DEFAULT_KEEP_UNASSIGNED, |d| d.0),
            })),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, instance: Option<&str>) -> Result<Assignment, ConfigProblem> {
        let raw: RawAssignment = serde_yaml::from_str(text).unwrap();
        Ok(raw
            .into_assignment()?
            .with_instance_override(instance.map(str::to_string)))
    }

    #[test]
    fn all_is_the_default_and_takes_no_group_settings() {
        assert_eq!(parse("{}", None).unwrap(), Assignment::All);
        assert_eq!(parse("mode: all", Some("pod-1")).unwrap(), Assignment::All);
        let e = parse("mode: all\ngroup_id: g", None).unwrap_err();
        assert!(e.to_string().contains("assignment.group_id"), "{e}");
    }

    #[test]
    fn group_mode_needs_a_group_id_and_defaults_the_rest() {
        let e = parse("mode: group", None).unwrap_err();
        assert!(e.to_string().contains("assignment.group_id"), "{e}");
        let e = parse("mode: group\ngroup_id: ' '", None).unwrap_err();
        assert!(e.to_string().contains("assignment.group_id"), "{e}");
        let group = GroupConfig {
            group_id: "standby".into(),
            instance_id: None,
            keep_unassigned: DEFAULT_KEEP_UNASSIGNED,
        };
        assert_eq!(
            parse("mode: group\ngroup_id: standby", None).unwrap(),
            Assignment::Group(group.clone())
        );
        let text = "mode: group\ngroup_id: standby\ninstance_id: pod-0\nkeep_unassigned: 30s";
        assert_eq!(
            parse(text, None).unwrap(),
            Assignment::Group(GroupConfig {
                instance_id: Some("pod-0".into()),
                keep_unassigned: Duration::from_secs(30),
                ..group
            })
        );
    }

    #[test]
    fn the_environment_names_the_instance() {
        let text = "mode: group\ngroup_id: g\ninstance_id: pod-0";
        let instance = |a: Assignment| match a {
            Assignment::Group(g) => g.instance_id,
            Assignment::All => panic!("group mode expected"),
        };
        assert_eq!(
            instance(parse(text, Some("pod-7")).unwrap()).as_deref(),
            Some("pod-7")
        );
        assert_eq!(
            instance(parse(text, Some("")).unwrap()).as_deref(),
            Some("pod-0")
        );
        assert_eq!(
            instance(parse("mode: group\ngroup_id: g", Some("pod-2")).unwrap()).as_deref(),
            Some("pod-2")
        );
    }
}
