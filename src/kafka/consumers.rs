//! The two consumers (tailing and catching-up): their config, their creation, and what a store
//! asks the broker before it opens (its partitions, the build's features).

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::statistics::{EngineContext, WatermarkCells};
use crate::observe::status::Board;

pub type ChangelogConsumer = BaseConsumer<EngineContext>;

/// Defaults chosen for a standby that bulk-loads, then tails, with bounded memory. Every one can be
/// overridden under `kafka:`.
pub const CONSUMER_DEFAULTS: &[(&str, &str)] = &[
    // librdkafka assigns partitions only to a consumer with a group; this one is never joined or
    // committed to (see `placeholder_group_refused`).
    ("group.id", "warmstore"),
    ("enable.auto.commit", "false"),
    ("enable.auto.offset.store", "false"),
    // Out of range must reach warmstore (it wipes and rebuilds), never silently jump.
    ("auto.offset.reset", "error"),
    ("isolation.level", "read_committed"),
    // A damaged uncompressed batch would otherwise be stored as it came, wrong values and all.
    // CRC32C runs in hardware; a failed check fails the partition with the reason.
    ("check.crcs", "true"),
    ("enable.partition.eof", "false"),
    ("allow.auto.create.topics", "false"),
    // End offsets, log-start offsets and positions, every two seconds. Lag moves no faster than a
    // scrape reads it; at once a second, writing and decoding the statistics of 1,000 partitions
    // was a fifth of an idle standby's CPU.
    ("statistics.interval.ms", "2000"),
    // Per-partition prefetch bound (partition queues are split): memory stays flat with topic size.
    ("queued.max.messages.kbytes", "1024"),
    ("queued.min.messages", "20000"),
    // librdkafka waits this long after a full queue before fetching again; 1 s stalls bulk loads.
    ("fetch.queue.backoff.ms", "10"),
    ("fetch.max.bytes", "16777216"),
    // Kafka's own default. A broker answers a long poll as soon as a record arrives, so this bounds
    // only how often an idle standby asks: at 100 ms, walking 1,000 idle partitions ten times a
    // second was over a quarter of an idle standby's CPU.
    ("fetch.wait.max.ms", "500"),
];

/// Longest the catching-up consumer lets the broker wait for data (the user's `fetch.wait.max.ms`
/// applies if shorter). Its partitions are behind, so the broker rarely waits at all.
pub const CATCHING_UP_FETCH_WAIT_MS: u32 = 10;

/// Which consumer a context serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Tailing,
    CatchingUp,
}

/// The consumer config: defaults, then the user's properties on top.
pub fn client_config(kafka: &BTreeMap<String, String>) -> ClientConfig {
    let mut config = ClientConfig::new();
    for (key, value) in CONSUMER_DEFAULTS {
        config.set(*key, *value);
    }
    for (key, value) in kafka {
        config.set(key, value);
    }
    config
}

/// The tailing and the catching-up consumer, in that order (see the module's doc).
pub fn create_consumers(
    kafka: &BTreeMap<String, String>,
    board: Arc<Board>,
    watermarks: Arc<WatermarkCells>,
) -> Result<(Arc<ChangelogConsumer>, Arc<ChangelogConsumer>), KafkaError> {
    let tailing = create_consumer(
        client_config(kafka),
        board.clone(),
        watermarks.clone(),
        Role::Tailing,
    )?;
    let catching_up = create_consumer(
        catching_up_config(kafka),
        board,
        watermarks,
        Role::CatchingUp,
    )?;
    Ok((tailing, catching_up))
}

/// Whether `error` is the broker refusing the lookup of the engine consumers' `group.id`. librdkafka
/// looks up the coordinator of a consumer's group even when it only assigns partitions, and a
/// broker with ACLs refuses that unless the principal may describe the group. These consumers never
/// join the group or commit to it, so the refusal costs nothing: it must not read as a fault, nor
/// send a platform team to grant ACLs on a group that is never used.
pub fn placeholder_group_refused(error: &KafkaError) -> bool {
    error.rdkafka_error_code() == Some(RDKafkaErrorCode::GroupAuthorizationFailed)
}

/// What the user's `kafka:` properties give up of the defaults above, one sentence each: they are
/// passed through as given, but a copied consumer config can quietly trade away a guarantee.
pub fn weakened_defaults(kafka: &BTreeMap<String, String>) -> Vec<String> {
    let set = |key: &str| kafka.get(key).map(|v| v.trim().to_ascii_lowercase());
    let mut warnings = Vec::new();
    if let Some(reset) = set("auto.offset.reset").filter(|v| v != "error") {
        warnings.push(format!(
            "kafka.auto.offset.reset is `{reset}`: a partition whose position falls out of range (retention or compaction passing it) then jumps on silently instead of being wiped and rebuilt, so its store can keep records the changelog no longer has; the default is `error`"
        ));
    }
    if set("isolation.level").as_deref() == Some("read_uncommitted") {
        warnings.push("kafka.isolation.level is `read_uncommitted`: records of aborted transactions reach the stores, which is harmless only if nothing writes the changelogs in transactions (exactly-once); the default is `read_committed`".to_string());
    }
    if set("check.crcs").as_deref() == Some("false") {
        warnings.push("kafka.check.crcs is `false`: a damaged uncompressed batch is stored as it came instead of failing its partition; the default is `true`".to_string());
    }
    warnings
}

/// The catching-up consumer's config: the same, with a short fetch wait.
pub fn catching_up_config(kafka: &BTreeMap<String, String>) -> ClientConfig {
    let mut config = client_config(kafka);
    let wait = config
        .get("fetch.wait.max.ms")
        .and_then(|v| v.parse::<u32>().ok())
        .map_or(CATCHING_UP_FETCH_WAIT_MS, |w| {
            w.min(CATCHING_UP_FETCH_WAIT_MS)
        });
    config.set("fetch.wait.max.ms", wait.to_string());
    config
}

fn create_consumer(
    config: ClientConfig,
    board: Arc<Board>,
    watermarks: Arc<WatermarkCells>,
    role: Role,
) -> Result<Arc<ChangelogConsumer>, KafkaError> {
    let read_committed = config.get("isolation.level") != Some("read_uncommitted");
    let consumer = config.create_with_context(EngineContext {
        board,
        watermarks,
        read_committed,
        role,
        warnings: Default::default(),
    })?;
    Ok(Arc::new(consumer))
}

/// librdkafka as linked into this binary: its version and `builtin.features` (ssl, sasl_scram,
/// zstd, ...). The first thing to check when a security setting or a codec is refused.
pub fn librdkafka_build() -> String {
    let (_, version) = rdkafka::util::get_rdkafka_version();
    format!(
        "librdkafka {version} (builtin.features: {})",
        builtin_features()
    )
}

fn builtin_features() -> String {
    use rdkafka::bindings as rd;
    use std::ffi::{c_char, CStr};
    let mut buffer = [0 as c_char; 512];
    let mut size = buffer.len();
    // SAFETY: a fresh default config is read into a buffer whose size is passed along, then freed.
    let result = unsafe {
        let conf = rd::rd_kafka_conf_new();
        let result = rd::rd_kafka_conf_get(
            conf,
            c"builtin.features".as_ptr(),
            buffer.as_mut_ptr(),
            &mut size,
        );
        rd::rd_kafka_conf_destroy(conf);
        result
    };
    if result != rd::rd_kafka_conf_res_t::RD_KAFKA_CONF_OK {
        return "unknown".to_string();
    }
    // SAFETY: librdkafka wrote a NUL-terminated string that fits the buffer.
    unsafe { CStr::from_ptr(buffer.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// Why a changelog's partitions cannot be listed.
#[derive(Debug, thiserror::Error)]
pub enum TopicError {
    #[error("cannot read metadata of topic {topic}: {source}")]
    Metadata { topic: String, source: KafkaError },
    #[error("topic {topic} not found")]
    NotFound { topic: String },
    #[error("topic {topic}: {code}")]
    Broker {
        topic: String,
        code: RDKafkaErrorCode,
    },
    #[error("topic {topic} has no partitions")]
    NoPartitions { topic: String },
}

impl TopicError {
    /// The broker answered about the topic (missing, refused, empty): not a request that failed
    /// on the way, which says nothing about the topic itself.
    pub fn answered(&self) -> bool {
        !matches!(self, TopicError::Metadata { .. })
    }
}

/// How long a lookup of a topic's partitions waits for the broker (a blocking librdkafka call).
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a lookup of a partition's offsets waits for the broker (a blocking librdkafka call).
const WATERMARK_TIMEOUT: Duration = Duration::from_secs(10);

/// A partition's log-start and end offsets, asked of the broker. librdkafka first finds the
/// partition in its metadata cache, and a partition missing from a topic it knows is final there
/// (`UnknownPartition`) until the cache's next periodic refresh, minutes later: a partition added
/// to a changelog since would fail that long. Such an answer is checked once against the broker's
/// metadata, which refreshes the cache.
pub fn log_bounds(
    consumer: &ChangelogConsumer,
    topic: &str,
    partition: i32,
) -> Result<(i64, i64), KafkaError> {
    let bounds = consumer.fetch_watermarks(topic, partition, WATERMARK_TIMEOUT);
    match bounds {
        Err(KafkaError::MetadataFetch(RDKafkaErrorCode::UnknownPartition)) => {
            if consumer
                .fetch_metadata(Some(topic), METADATA_TIMEOUT)
                .is_err()
            {
                return bounds;
            }
            consumer.fetch_watermarks(topic, partition, WATERMARK_TIMEOUT)
        }
        bounds => bounds,
    }
}

/// Every partition of `topic`, or an error that says why there are none (missing topic).
pub fn partitions_of<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
) -> Result<Vec<i32>, TopicError> {
    let topic_name = || topic.to_string();
    let metadata = consumer
        .fetch_metadata(Some(topic), METADATA_TIMEOUT)
        .map_err(|source| TopicError::Metadata {
            topic: topic_name(),
            source,
        })?;
    let t = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .ok_or_else(|| TopicError::NotFound {
            topic: topic_name(),
        })?;
    if let Some(error) = t.error() {
        return Err(TopicError::Broker {
            topic: topic_name(),
            code: error.into(),
        });
    }
    let partitions: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
    if partitions.is_empty() {
        return Err(TopicError::NoPartitions {
            topic: topic_name(),
        });
    }
    Ok(partitions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catching_up_consumer_waits_briefly_unless_the_user_asked_for_less() {
        let mut kafka = BTreeMap::new();
        let wait = |kafka: &BTreeMap<String, String>| {
            catching_up_config(kafka)
                .get("fetch.wait.max.ms")
                .map(str::to_string)
        };
        assert_eq!(wait(&kafka).as_deref(), Some("10"));
        kafka.insert("fetch.wait.max.ms".to_string(), "500".to_string());
        assert_eq!(wait(&kafka).as_deref(), Some("10"));
        assert_eq!(client_config(&kafka).get("fetch.wait.max.ms"), Some("500"));
        kafka.insert("fetch.wait.max.ms".to_string(), "2".to_string());
        assert_eq!(wait(&kafka).as_deref(), Some("2"));
    }

    #[test]
    fn overriding_a_guarantee_is_warned_about_and_restating_a_default_is_not() {
        let kafka = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(weakened_defaults(&kafka(&[])).is_empty());
        let defaults = kafka(&[
            ("auto.offset.reset", "error"),
            ("isolation.level", "read_committed"),
            ("check.crcs", "true"),
            ("fetch.wait.max.ms", "100"),
        ]);
        assert!(weakened_defaults(&defaults).is_empty());
        let copied = kafka(&[
            ("auto.offset.reset", "earliest"),
            ("isolation.level", "READ_UNCOMMITTED"),
            ("check.crcs", "false"),
        ]);
        let warnings = weakened_defaults(&copied);
        assert_eq!(warnings.len(), 3, "{warnings:#?}");
        assert!(warnings[0].starts_with("kafka.auto.offset.reset is `earliest`"));
        assert!(warnings[1].contains("aborted transactions"));
        assert!(warnings[2].contains("damaged"));
    }

    #[test]
    fn the_build_has_tls_sasl_and_every_codec() {
        let build = librdkafka_build();
        for feature in [
            "ssl",
            "sasl_plain",
            "sasl_scram",
            "sasl_oauthbearer",
            "gzip",
            "snappy",
            "lz4",
            "zstd",
        ] {
            assert!(
                build.split([' ', ',', ')']).any(|f| f == feature),
                "{feature} missing from {build}"
            );
        }
    }
}
