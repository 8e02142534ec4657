//! Against a real Apache Kafka broker: every changelog codec, exactly-once changelogs with aborted
//! transactions, compaction, TLS with a client certificate, SASL SCRAM over TLS, wrong credentials,
//! a principal allowed only to read, and batches that cannot be decoded. The mock cluster models
//! none of these.

mod common;

use common::kafka::{kafka, Listener};
use common::proxy::Damage;
use common::{read_store, runtime, service_config, store, wait_caught_up, wait_until, Broker};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use warmstore::config::{Config, StoreConfig};
use warmstore::observe::status::PartitionState;
use warmstore::service::Service;
use warmstore::store::dirty::WipeReason;

/// Starts the service, runs `f` on it off the async runtime, then stops it cleanly.
fn with_service<T>(config: &Config, f: impl FnOnce(&Service) -> T) -> T {
    runtime().block_on(async {
        let service = Service::start(config).await.expect("service starts");
        let result = tokio::task::block_in_place(|| f(&service));
        service.stop().await;
        result
    })
}

fn config_for(listener: Listener, dir: &std::path::Path, stores: Vec<StoreConfig>) -> Config {
    let properties = kafka().client_properties(listener);
    let pairs: Vec<(&str, &str)> = properties
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    // bootstrap.servers comes with the listener's properties.
    service_config("", dir, stores, &pairs)
}

fn total_wipes(service: &Service) -> u64 {
    service
        .board
        .partitions()
        .iter()
        .map(|p| WipeReason::ALL.iter().map(|r| p.wipes(*r)).sum::<u64>())
        .sum()
}

#[test]
fn every_codec_restores_to_the_model() {
    let codecs = ["none", "gzip", "snappy", "lz4", "zstd"];
    let mut brokers = Vec::new();
    for (seed, codec) in codecs.iter().enumerate() {
        let topic = format!("codec-{codec}");
        let mut broker = Broker::real(&[("compression.type", codec)]);
        broker.create_topic(&topic, 2);
        broker.produce_changelog(&topic, 2, 3000, seed as u64);
        brokers.push((topic, broker));
    }
    let dir = tempfile::tempdir().unwrap();
    let stores = codecs
        .iter()
        .map(|c| store(c, &format!("codec-{c}"), None))
        .collect();
    let config = config_for(Listener::Plaintext, dir.path(), stores);
    with_service(&config, |s| wait_caught_up(s, 2 * codecs.len()));
    for (codec, (topic, broker)) in codecs.iter().zip(&brokers) {
        for p in 0..2 {
            let (applied, data) = read_store(dir.path(), codec, topic, p);
            assert_eq!(applied, Some(2999), "{codec} partition {p}: applied offset");
            assert_eq!(data, broker.model(topic, p, 0), "{codec} partition {p}");
        }
    }
}

/// Transactions committed and aborted in alternation, ending with an abort: no aborted record
/// reaches the store, the partition catches up through the markers, and the applied offset is the
/// last committed record's.
#[test]
fn an_exactly_once_changelog_restores_only_committed_records() {
    const TRANSACTIONS: i64 = 10;
    const PER_TRANSACTION: i64 = 50;
    let topic = "eos";
    let mut broker = Broker::real(&[]);
    broker.create_topic(topic, 1);
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &kafka().plaintext)
        .set("transactional.id", "warmstore-test-eos")
        .create()
        .unwrap();
    let timeout = Duration::from_secs(30);
    producer.init_transactions(timeout).unwrap();
    for t in 0..TRANSACTIONS {
        let commit = t % 2 == 0;
        producer.begin_transaction().unwrap();
        for i in 0..PER_TRANSACTION {
            // Aborted transactions overwrite committed keys and add keys of their own.
            let key = if commit || i % 2 == 0 {
                format!("k{i}")
            } else {
                format!("aborted-{t}-{i}")
            };
            let value = format!("t{t}-{i}");
            let record = BaseRecord::<str, str>::to(topic)
                .partition(0)
                .key(&key)
                .payload(&value);
            producer.send(record).map_err(|(e, _)| e).unwrap();
            if commit {
                broker
                    .log
                    .entry((topic.into(), 0))
                    .or_default()
                    .push((Some(key.into_bytes()), Some(value.into_bytes())));
            }
        }
        producer.flush(timeout).unwrap();
        if commit {
            producer.commit_transaction(timeout).unwrap();
        } else {
            producer.abort_transaction(timeout).unwrap();
        }
    }
    // Each transaction takes its records and one marker.
    let end = TRANSACTIONS * (PER_TRANSACTION + 1);
    assert_eq!(broker.watermarks(topic, 0).1, end);
    let last_committed = (TRANSACTIONS - 2) * (PER_TRANSACTION + 1) + PER_TRANSACTION - 1;

    let dir = tempfile::tempdir().unwrap();
    let config = config_for(
        Listener::Plaintext,
        dir.path(),
        vec![store("eos", topic, None)],
    );
    let records = with_service(&config, |s| {
        wait_caught_up(s, 1);
        s.board.partitions()[0].records.load(Relaxed)
    });
    assert_eq!(records as i64, TRANSACTIONS / 2 * PER_TRANSACTION);
    let (applied, data) = read_store(dir.path(), "eos", topic, 0);
    assert_eq!(applied, Some(last_committed));
    assert_eq!(data, broker.model(topic, 0, 0));
    assert!(data.keys().all(|k| !k.starts_with(b"aborted")));
}

/// Compaction has removed overwritten records and tombstones before the restore starts.
#[test]
fn a_compacted_changelog_restores_to_the_model() {
    let topic = "compacted";
    let mut broker = Broker::real(&[]);
    kafka().create_topic(
        topic,
        1,
        &[
            ("cleanup.policy", "compact"),
            ("segment.ms", "100"),
            ("min.cleanable.dirty.ratio", "0.01"),
            ("delete.retention.ms", "0"),
            ("min.compaction.lag.ms", "0"),
        ],
    );
    broker.produce_changelog(topic, 1, 3000, 7);
    let produced = broker.produced(topic, 0);
    // The active segment is never cleaned: keep rolling it with a record of a key of its own. The
    // first cleaning drops overwritten records and marks the tombstones; a later one removes them.
    wait_until("compaction", Duration::from_secs(120), || {
        broker.send(topic, 0, Some(b"roll"), Some(b"x"));
        broker.flush();
        std::thread::sleep(Duration::from_millis(300));
        let remaining = read_topic(topic);
        remaining.len() < produced / 2 && remaining.iter().all(|(_, v)| v.is_some())
    });
    let keys: std::collections::BTreeSet<_> = broker.log[&(topic.to_string(), 0)]
        .iter()
        .map(|(k, _)| k.clone())
        .collect();
    assert!(
        broker.model(topic, 0, 0).len() < keys.len(),
        "some keys end deleted, and no tombstone of theirs is left in the log"
    );
    let dir = tempfile::tempdir().unwrap();
    let config = config_for(
        Listener::Plaintext,
        dir.path(),
        vec![store("compacted", topic, None)],
    );
    with_service(&config, |s| wait_caught_up(s, 1));
    let (applied, data) = read_store(dir.path(), "compacted", topic, 0);
    assert_eq!(data, broker.model(topic, 0, 0));
    let (_, end) = broker.watermarks(topic, 0);
    assert_eq!(
        applied,
        Some(end - 1),
        "the last record survives compaction"
    );
}

/// Every record of partition 0 still in the log, as a consumer sees it.
fn read_topic(topic: &str) -> Vec<common::Record> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Message;
    use rdkafka::{Offset, TopicPartitionList};
    let consumer: BaseConsumer = kafka()
        .client_config(Listener::Plaintext)
        .set("enable.partition.eof", "true")
        .create()
        .unwrap();
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&list).unwrap();
    let mut records = Vec::new();
    loop {
        match consumer.poll(Duration::from_secs(10)) {
            Some(Ok(m)) => {
                records.push((m.key().map(<[u8]>::to_vec), m.payload().map(<[u8]>::to_vec)))
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => return records,
            Some(Err(e)) => panic!("reading {topic}: {e}"),
            None => panic!("reading {topic}: no end of partition"),
        }
    }
}

fn secured_restore(listener: Listener, topic: &str) {
    let mut broker = Broker::real(&[]);
    broker.create_topic(topic, 2);
    broker.produce_changelog(topic, 2, 2000, 11);
    let dir = tempfile::tempdir().unwrap();
    let config = config_for(listener, dir.path(), vec![store("secure", topic, None)]);
    with_service(&config, |s| wait_caught_up(s, 2));
    for p in 0..2 {
        let (applied, data) = read_store(dir.path(), "secure", topic, p);
        assert_eq!(applied, Some(1999));
        assert_eq!(data, broker.model(topic, p, 0), "partition {p}");
    }
}

#[test]
fn restores_over_tls_with_a_client_certificate() {
    secured_restore(Listener::Ssl, "over-tls");
}

#[test]
fn restores_over_sasl_ssl_with_scram_sha_512() {
    secured_restore(Listener::SaslSsl, "over-sasl-ssl");
}

/// A wrong setting fails the store with the reason in `/readyz` and `/stores`, keeps it as it was,
/// and a restart with the right setting catches up. With `partitions` listed, the failure is the
/// partition's; without, the store's (its partitions cannot even be listed).
fn wrong_setting_fails_visibly_and_recovers(
    listener: Listener,
    topic: &str,
    partitions: Option<Vec<i32>>,
    key: &str,
    wrong: String,
    expected: &str,
) {
    let mut broker = Broker::real(&[]);
    broker.create_topic(topic, 1);
    broker.produce_changelog(topic, 1, 1000, 3);
    let dir = tempfile::tempdir().unwrap();
    let good = config_for(listener, dir.path(), vec![store("s", topic, partitions)]);
    with_service(&good, |s| wait_caught_up(s, 1));
    broker.produce_changelog(topic, 1, 500, 4);

    let mut bad = good.clone();
    bad.kafka.insert(key.to_string(), wrong);
    with_service(&bad, |s| {
        let addr = s.http_addr.to_string();
        wait_until("the reason in /readyz", Duration::from_secs(60), || {
            let (status, body) = common::http_get(&addr, "/readyz");
            status == 503 && body.contains(expected)
        });
        let (_, body) = common::http_get(&addr, "/readyz");
        println!("/readyz with a wrong {key}: {body}");
        let (_, stores) = common::http_get(&addr, "/stores");
        assert!(stores.contains(expected), "/stores: {stores}");
        assert_eq!(total_wipes(s), 0);
    });
    let (applied, data) = read_store(dir.path(), "s", topic, 0);
    assert_eq!(applied, Some(999), "the failed run changed nothing");
    assert_eq!(data, broker.model_of_first(topic, 0, 1000));

    with_service(&good, |s| {
        wait_caught_up(s, 1);
        assert_eq!(total_wipes(s), 0);
    });
    let (applied, data) = read_store(dir.path(), "s", topic, 0);
    assert_eq!(applied, Some(1499));
    assert_eq!(data, broker.model(topic, 0, 0));
}

#[test]
fn a_wrong_ca_fails_visibly_and_recovers() {
    let other_ca = kafka().dir.join("other-ca.pem").display().to_string();
    wrong_setting_fails_visibly_and_recovers(
        Listener::Ssl,
        "wrong-ca",
        None,
        "ssl.ca.location",
        other_ca,
        "certificate verify failed",
    );
}

#[test]
fn a_wrong_password_fails_visibly_and_recovers() {
    wrong_setting_fails_visibly_and_recovers(
        Listener::SaslSsl,
        "wrong-password",
        Some(vec![0]),
        "sasl.password",
        "not-the-password".into(),
        "Authentication failed",
    );
}

/// librdkafka skips a batch it cannot decode and goes on with the next one. The partition must
/// fail with the reason instead, keep every record before the batch, and catch up once the batch
/// reads well again; never hang in `restoring`, never skip.
fn an_undecodable_batch_fails_the_partition(
    codec: &str,
    damage: Damage,
    kafka_properties: &[(&str, &str)],
) {
    let topic = format!("undecodable-{codec}-{damage:?}");
    // Several batches, so records before the damaged one can be kept.
    let mut broker = Broker::real(&[("compression.type", codec), ("batch.num.messages", "500")]);
    broker.create_topic(&topic, 1);
    broker.produce_changelog(&topic, 1, 3000, 5);
    let proxy = common::proxy::corrupting_proxy();
    proxy.damage_fetches(damage);
    let dir = tempfile::tempdir().unwrap();
    let config = service_config(
        &kafka().corruptible_proxy,
        dir.path(),
        vec![store("s", &topic, None)],
        kafka_properties,
    );
    with_service(&config, |s| {
        let addr = s.http_addr.to_string();
        wait_until("a failed partition", Duration::from_secs(60), || {
            s.board.partitions().iter().any(|p| {
                p.state() == PartitionState::Failed
                    && p.error().is_some_and(|e| e.contains("cannot consume"))
            })
        });
        assert!(proxy.corrupted() > 0);
        let (status, body) = common::http_get(&addr, "/readyz");
        assert_eq!(status, 503);
        assert!(body.contains("cannot consume"), "/readyz: {body}");
        let partition = &s.board.partitions()[0];
        assert!(
            partition.applied.load(Relaxed) < 2999,
            "nothing past the bad batch is applied"
        );
        proxy.damage_fetches(Damage::None);
        wait_caught_up(s, 1);
        assert_eq!(total_wipes(s), 0);
    });
    let (applied, data) = read_store(dir.path(), "s", &topic, 0);
    assert_eq!(applied, Some(2999));
    assert_eq!(data, broker.model(&topic, 0, 0));
}

#[test]
fn a_batch_failing_its_crc_fails_the_partition() {
    // check.crcs is on by default: a flipped byte in an uncompressed batch would otherwise pass.
    an_undecodable_batch_fails_the_partition("none", Damage::Payload, &[]);
    an_undecodable_batch_fails_the_partition("zstd", Damage::Payload, &[]);
}

#[test]
fn a_batch_that_cannot_be_decompressed_fails_the_partition() {
    // Without the CRC check, the broken frame reaches the decompressor.
    an_undecodable_batch_fails_the_partition("zstd", Damage::ZstdFrame, &[("check.crcs", "false")]);
}

/// A changelog deleted under a tailing standby (an application reset, say): librdkafka stops
/// fetching its partitions and says so only in its log. They must not go on showing `caught_up`:
/// each fails with the reason, keeps its store, and once the topic is created again (shorter than
/// the stores) is wiped as out of range and rebuilt from the new log. Rebuilt within
/// `ready_max_lag`, it goes straight back to the tailing consumer, where librdkafka has made new
/// partitions with new queues for the new topic: a queue split off before the deletion received
/// nothing, and the store showed `caught_up` with none of the new records (applied offset none).
#[test]
fn a_deleted_changelog_fails_its_partitions_and_a_recreated_one_is_rebuilt() {
    let topic = "deleted-under-a-standby";
    let mut broker = Broker::real(&[]);
    broker.create_topic(topic, 2);
    broker.produce_changelog(topic, 2, 1000, 6);
    let dir = tempfile::tempdir().unwrap();
    let mut config = config_for(
        Listener::Plaintext,
        dir.path(),
        vec![store("s", topic, None)],
    );
    config.restore.ready_max_lag = 10_000;
    let stores_hold = |broker: &Broker, offset: Option<i64>, what: &str| {
        for p in 0..2 {
            let (applied, data) = read_store(dir.path(), "s", topic, p);
            assert_eq!(applied, offset, "partition {p} {what}: applied offset");
            assert_eq!(data, broker.model(topic, p, 0), "partition {p} {what}");
        }
    };
    with_service(&config, |s| {
        wait_caught_up(s, 2);
        kafka().delete_topic(topic);
        let addr = s.http_addr.to_string();
        wait_until(
            "/readyz naming the deleted changelog",
            Duration::from_secs(60),
            || {
                let (status, body) = common::http_get(&addr, "/readyz");
                status == 503 && body.contains("no longer in its topic's metadata")
            },
        );
        wait_until("both partitions failed", Duration::from_secs(60), || {
            s.board
                .partitions()
                .iter()
                .all(|p| p.state() == PartitionState::Failed)
        });
        assert_eq!(total_wipes(s), 0, "a missing changelog wipes nothing");
        stores_hold(&broker, Some(999), "kept as they were");

        // Until a retry has found the topic missing: by then librdkafka has let go of what it
        // knew of the old partitions, and what it makes for the new topic is new too.
        wait_until("a retry finding no topic", Duration::from_secs(60), || {
            let (_, body) = common::http_get(&addr, "/readyz");
            body.matches("cannot read the offsets").count() == 2
        });
        for p in 0..2 {
            broker.log.remove(&(topic.to_string(), p));
        }
        broker.create_topic(topic, 2);
        broker.produce_changelog(topic, 2, 100, 7);
        wait_until(
            "the rebuilt stores caught up",
            Duration::from_secs(90),
            || common::all_caught_up(s, 2) && total_wipes(s) == 2,
        );
        for p in &s.board.partitions() {
            assert_eq!(p.wipes(WipeReason::OffsetOutOfRange), 1);
        }
    });
    stores_hold(&broker, Some(99), "rebuilt from the new log");
}

/// A store that reads every partition of its changelog still does when partitions are added to
/// the changelog under a running standby: the new one is restored, not left out of a ready
/// process.
#[test]
fn a_partition_added_to_a_changelog_is_restored() {
    let topic = "grown-under-a-standby";
    let mut broker = Broker::real(&[]);
    broker.create_topic(topic, 2);
    broker.produce_changelog(topic, 2, 200, 8);
    let dir = tempfile::tempdir().unwrap();
    let config = config_for(
        Listener::Plaintext,
        dir.path(),
        vec![store("s", topic, None)],
    );
    with_service(&config, |s| {
        wait_caught_up(s, 2);
        broker.add_partitions(topic, 3);
        broker.produce_changelog(topic, 3, 100, 9);
        wait_until(
            "the added partition caught up",
            Duration::from_secs(90),
            || common::all_caught_up(s, 3),
        );
    });
    for (p, last) in [(0, 299), (1, 299), (2, 99)] {
        let (applied, data) = read_store(dir.path(), "s", topic, p);
        assert_eq!(applied, Some(last), "partition {p}: applied offset");
        assert_eq!(data, broker.model(topic, p, 0), "partition {p}");
    }
}

/// A config file for one store of `topic`, read as `READER_USER` (who has only the ACLs a test
/// grants), with `extra` top-level sections; the stores go under `dir/state`.
fn reader_config(dir: &std::path::Path, topic: &str, extra: &str) -> std::path::PathBuf {
    let kafka_lines: String = kafka()
        .client_properties(Listener::SaslSslReader)
        .iter()
        .map(|(key, value)| format!("  {key}: {value}\n"))
        .collect();
    let config = dir.join("warmstore.yaml");
    std::fs::write(
        &config,
        format!(
            "kafka:\n{kafka_lines}state_dir: {}\nhttp:\n  listen: 127.0.0.1:0\nrestore:\n  ready_max_lag: 0\n{extra}stores:\n  - name: s\n    changelog: {topic}\n",
            dir.join("state").display()
        ),
    )
    .unwrap();
    config
}

/// A platform team grants warmstore's principal Read on its changelogs and nothing more, as Kafka
/// Streams' restore consumer needs. Before the grant the store fails with the broker's reason;
/// after it, the store catches up on its next retry. librdkafka looks up the coordinator of the
/// engine consumers' placeholder `group.id`, which the broker refuses; those consumers never use
/// the group, so the refusal must not read as a fault in the log or in a failure's reason.
#[test]
fn a_principal_allowed_only_to_read_its_changelog_restores_it() {
    use common::background::Running;
    use common::kafka::READER_USER;
    let topic = "read-only-principal";
    let mut broker = Broker::real(&[]);
    broker.create_topic(topic, 2);
    broker.produce_changelog(topic, 2, 500, 21);
    let dir = tempfile::tempdir().unwrap();
    let state_dir = dir.path().join("state");
    let config = reader_config(dir.path(), topic, "");
    let log = dir.path().join("warmstore.log");
    let mut child = Running::warmstore_run(&config, &log);
    let addr = child.served_address(&log, 0);

    let mut refused = String::new();
    wait_until("the refusal in /readyz", Duration::from_secs(60), || {
        let (status, body) = common::http_get(&addr, "/readyz");
        refused = body;
        status == 503 && refused.contains("TopicAuthorizationFailed")
    });
    kafka().allow(READER_USER, "READ", "TOPIC", topic);
    wait_until("ready after the grant", Duration::from_secs(90), || {
        common::http_get(&addr, "/readyz").0 == 200
    });
    assert_eq!(child.stop(Duration::from_secs(30)), Some(0));

    for p in 0..2 {
        let (applied, data) = read_store(&state_dir, "s", topic, p);
        assert_eq!(applied, Some(499), "partition {p}: applied offset");
        assert_eq!(data, broker.model(topic, p, 0), "partition {p}");
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let blamed: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("Group authorization"))
        .collect();
    assert!(
        blamed.is_empty(),
        "the unused group read as a fault: {blamed:#?}"
    );
    assert!(
        !refused.contains("Group authorization"),
        "/readyz blamed the unused group: {refused}"
    );
}

/// `warmstore restore` as an init container in group mode, its principal allowed to read the
/// changelog but not yet to use the group: librdkafka would ask for ever, so the restore exits 1
/// at once with the broker's answer rather than hang until its timeout. With the group granted it
/// warms the stores and exits 0.
#[test]
fn a_group_restore_refused_by_the_broker_exits_with_the_reason() {
    use common::kafka::READER_USER;
    let topic = "read-only-group";
    let mut broker = Broker::real(&[]);
    broker.create_topic(topic, 2);
    broker.produce_changelog(topic, 2, 300, 22);
    kafka().allow(READER_USER, "READ", "TOPIC", topic);
    let dir = tempfile::tempdir().unwrap();
    let config = reader_config(
        dir.path(),
        topic,
        &format!("assignment:\n  mode: group\n  group_id: {topic}\n"),
    );
    let restore = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_warmstore"))
            .args(["restore", "--timeout", "20s", "--config"])
            .arg(&config)
            .output()
            .expect("warmstore runs")
    };

    let refused = restore();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    let last = stderr.lines().rev().take(3).collect::<Vec<_>>().join("\n");
    assert!(last.contains("GroupAuthorizationFailed"), "{last}");
    assert!(
        !last.contains("not warm after"),
        "waited for its timeout: {last}"
    );

    kafka().allow(READER_USER, "READ", "GROUP", topic);
    let granted = restore();
    let stderr = String::from_utf8_lossy(&granted.stderr);
    assert_eq!(granted.status.code(), Some(0), "{stderr}");
    for p in 0..2 {
        let (applied, data) = read_store(&dir.path().join("state"), "s", topic, p);
        assert_eq!(applied, Some(299), "partition {p}: applied offset");
        assert_eq!(data, broker.model(topic, p, 0), "partition {p}");
    }
}
