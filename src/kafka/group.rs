//! Group mode's member: a third consumer that joins the consumer group, subscribed to every
//! configured changelog, so that Kafka's group coordinator shares the partitions out among the
//! processes. It never fetches: when the group assigns it partitions it takes an empty assignment
//! for itself and hands the partitions to the engine, whose two fetching consumers restore them as
//! in `all` mode. It never commits offsets either; the stores hold them.
//!
//! The rebalance callback runs on the thread that polls the member, and it blocks until the engine
//! has done what the rebalance asks: a revoked partition is committed, flushed and closed (status
//! 0) before the member tells the group it let go, so no two processes ever write one partition's
//! next state at once.

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, TopicPartitionList};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::consumers::client_config;
use crate::config::GroupConfig;
use crate::observe::logging::RepeatedWarnings;

/// Co-partitioned changelogs (the same partition count) must land on one process, partition by
/// partition, as a Kafka Streams task owns partition p of every store in its sub-topology. The
/// range assignor guarantees it: it gives each member the same range of partition numbers of every
/// topic with the same partition count and subscribers. Cooperative-sticky moves fewer partitions
/// but does not promise this.
const ASSIGNOR: &str = "range";
/// With static membership a member that leaves is not replaced until this passes, so a restarted
/// pod that rejoins within it moves nothing. A minute covers a pod restart on its node; a node lost
/// hands its partitions on after it.
const STATIC_SESSION_TIMEOUT_MS: &str = "60000";
/// How often the member looks at the subscribed changelogs' metadata: as often as it counts their
/// partitions, so that one created late is assigned about when its stores stop showing failed.
const SUBSCRIBED_TOPICS_REFRESH_MS: &str = "30000";

/// Whether the broker denied the member outright: no ACL for its group or for a changelog it
/// subscribes to. librdkafka goes on asking, and only a grant helps, so a one-shot restore stops
/// waiting for an assignment that cannot come.
pub fn refused(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::GroupAuthorizationFailed | RDKafkaErrorCode::TopicAuthorizationFailed
        )
    )
}

/// What the engine does when the group moves partitions. Both calls block until it is done.
pub trait Rebalance: Send + Sync + 'static {
    /// This process now owns these partitions (every one it owns, the ones it kept included).
    fn assigned(&self, partitions: &[(String, i32)]);
    /// This process gives these up; return only once their stores are closed.
    fn revoked(&self, partitions: &[(String, i32)]);
    /// The group could not rebalance (an error from the coordinator).
    fn failed(&self, error: String);
}

pub struct MemberContext {
    engine: Arc<dyn Rebalance>,
    /// librdkafka repeats an error on every reconnect; the log gets each kind once a while.
    warnings: RepeatedWarnings,
}

pub type GroupMember = BaseConsumer<MemberContext>;

impl ClientContext for MemberContext {
    fn error(&self, error: KafkaError, reason: &str) {
        if let Some(repeats_not_logged) = self.warnings.due_now(&error.to_string()) {
            // librdkafka's own wording; a fatal error also reaches the member's poll, where it
            // ends the member.
            let next = if reason.starts_with("Fatal") {
                "fatal: the member ends"
            } else {
                "librdkafka retries on its own"
            };
            tracing::warn!(%error, reason, repeats_not_logged, "consumer group member: kafka client error; {next}");
        }
    }
}

fn partitions(list: &TopicPartitionList) -> Vec<(String, i32)> {
    list.elements()
        .iter()
        .map(|e| (e.topic().to_string(), e.partition()))
        .collect()
}

impl ConsumerContext for MemberContext {
    fn rebalance(
        &self,
        member: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let cooperative = matches!(member.rebalance_protocol(), RebalanceProtocol::Cooperative);
        let answer = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                self.engine.assigned(&partitions(tpl));
                // The member fetches nothing itself: it takes an empty assignment, which tells
                // the group the rebalance is handled.
                if cooperative {
                    member.incremental_assign(&TopicPartitionList::new())
                } else {
                    member.assign(&TopicPartitionList::new())
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                self.engine.revoked(&partitions(tpl));
                if cooperative {
                    member.incremental_unassign(&TopicPartitionList::new())
                } else {
                    member.unassign()
                }
            }
            other => {
                let error = KafkaError::Rebalance(other.into());
                self.engine.failed(error.to_string());
                member.unassign()
            }
        };
        if let Err(error) = answer {
            tracing::warn!(%error, "consumer group member: cannot answer the rebalance");
        }
    }
}

/// The member's librdkafka config: the user's `kafka:` properties, then what group mode needs.
pub fn member_config(kafka: &BTreeMap<String, String>, group: &GroupConfig) -> ClientConfig {
    let mut config = client_config(kafka);
    if let Some(instance) = &group.instance_id {
        config.set("group.instance.id", instance);
        if !kafka.contains_key("session.timeout.ms") {
            config.set("session.timeout.ms", STATIC_SESSION_TIMEOUT_MS);
        }
    }
    // A changelog created after the member subscribed is only assigned once librdkafka looks at
    // the subscribed topics again: every 5 minutes by default, while the missing changelog's
    // stores show failed until it is.
    if !kafka.contains_key("topic.metadata.refresh.interval.ms") {
        config.set(
            "topic.metadata.refresh.interval.ms",
            SUBSCRIBED_TOPICS_REFRESH_MS,
        );
    }
    match kafka.get("partition.assignment.strategy") {
        None => {
            config.set("partition.assignment.strategy", ASSIGNOR);
        }
        Some(chosen) if chosen != ASSIGNOR => tracing::warn!(
            partition.assignment.strategy = %chosen,
            "only the range assignor keeps partition p of co-partitioned changelogs on one process"
        ),
        Some(_) => {}
    }
    config
        .set("group.id", &group.group_id)
        // Statistics of a member that fetches nothing would say nothing.
        .set("statistics.interval.ms", "0")
        .set("enable.auto.commit", "false");
    config
}

/// Creates the member and subscribes it to the changelogs; it joins the group on its first poll.
pub fn join(
    kafka: &BTreeMap<String, String>,
    group: &GroupConfig,
    changelogs: &[&str],
    engine: Arc<dyn Rebalance>,
) -> Result<GroupMember, KafkaError> {
    let member: GroupMember = member_config(kafka, group).create_with_context(MemberContext {
        engine,
        warnings: Default::default(),
    })?;
    member.subscribe(changelogs)?;
    Ok(member)
}

/// How long one poll of the member waits for a group event.
pub const MEMBER_POLL: Duration = Duration::from_millis(100);

#[cfg(test)]
mod tests {
    use super::*;

    fn group(instance: Option<&str>) -> GroupConfig {
        GroupConfig {
            group_id: "standby".into(),
            instance_id: instance.map(str::to_string),
            keep_unassigned: Duration::from_secs(600),
        }
    }

    #[test]
    fn a_static_member_waits_a_minute_and_the_user_may_say_otherwise() {
        let mut kafka = BTreeMap::new();
        let config = member_config(&kafka, &group(Some("pod-0")));
        assert_eq!(config.get("group.id"), Some("standby"));
        assert_eq!(config.get("group.instance.id"), Some("pod-0"));
        assert_eq!(config.get("session.timeout.ms"), Some("60000"));
        assert_eq!(config.get("partition.assignment.strategy"), Some("range"));
        assert_eq!(config.get("enable.auto.commit"), Some("false"));
        let dynamic = member_config(&kafka, &group(None));
        assert_eq!(dynamic.get("group.instance.id"), None);
        assert_eq!(dynamic.get("session.timeout.ms"), None);
        kafka.insert("session.timeout.ms".into(), "10000".into());
        kafka.insert("group.id".into(), "ignored".into());
        let config = member_config(&kafka, &group(Some("pod-0")));
        assert_eq!(config.get("session.timeout.ms"), Some("10000"));
        assert_eq!(config.get("group.id"), Some("standby"));
    }
}
