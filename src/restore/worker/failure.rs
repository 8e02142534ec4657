//! How a restore attempt ends badly, and which event of the phase machine each failure is.

use rdkafka::error::KafkaError;

use crate::observe::status::cause_suffix;
use crate::restore::phase::{Event, Phase, Transition};
use crate::store::{StoreError, TopicPartition};

/// How a restore attempt ended badly. Kafka trouble leaves the store healthy (it is closed cleanly
/// before retrying); store trouble drops it unclosed and reopens it through the dirty rules.
#[derive(Debug, thiserror::Error)]
pub(super) enum Failure {
    #[error(transparent)]
    Kafka(Box<KafkaFailure>),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Failure {
    /// The phase machine's event for this failure.
    pub(super) fn event(&self) -> Event {
        match self {
            Failure::Kafka(_) => Event::KafkaFailed,
            Failure::Store(_) => Event::StoreFailed,
        }
    }
}

impl From<KafkaFailure> for Failure {
    fn from(failure: KafkaFailure) -> Self {
        Failure::Kafka(Box::new(failure))
    }
}

/// What went wrong on the Kafka side of one partition. `cause` is what is known to be wrong with
/// Kafka as a whole (no broker reachable, a refused login): "timed out" alone does not tell a
/// wrong CA from a wrong password.
#[derive(Debug, thiserror::Error)]
pub(super) enum KafkaFailure {
    #[error("cannot read the offsets of {tp}: {source}{}", cause_suffix(cause))]
    Offsets {
        tp: TopicPartition,
        source: KafkaError,
        cause: Option<String>,
    },
    #[error("librdkafka has no queue for {tp}")]
    Queue { tp: TopicPartition },
    #[error("cannot assign {tp}: {source}")]
    Assign {
        tp: TopicPartition,
        source: KafkaError,
    },
    /// An error on the partition's queue that may stand for records librdkafka skipped.
    #[error("cannot consume {tp} {}: {source}; the store keeps every record before it and the partition is retried from there", after.map_or("from where its store is".to_string(), |o| format!("after offset {o}")))]
    Consume {
        tp: TopicPartition,
        after: Option<i64>,
        source: KafkaError,
    },
    /// librdkafka stops fetching a partition whose topic was deleted, and says so only in its log.
    #[error("{tp} is no longer in its topic's metadata (the changelog was deleted, or this client may no longer describe it); the store is kept as it is and the partition is retried")]
    Gone { tp: TopicPartition },
}

/// The transition a failure leads to; the failure is kept to be returned once the store is closed
/// (or dropped).
pub(super) fn failed(
    phase: Phase,
    f: Failure,
    failure: &mut Option<Failure>,
) -> Option<Transition> {
    let transition = phase.on(f.event());
    *failure = Some(f);
    transition
}
