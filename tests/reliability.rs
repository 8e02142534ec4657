//! Faults injected at random or on purpose, then the stores checked against the model: broker
//! outages, request errors and latency, corruption beside healthy stores, a full disk, malformed
//! config, and the HTTP surface. `WARMSTORE_LONG=1` runs the long versions (RELIABILITY.md).

mod common;

use common::{
    all_caught_up, free_port, http_get, read_store, runtime, service_config, store, wait_until,
    Broker,
};
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use warmstore::config::Config;
use warmstore::observe::status::PartitionState;
use warmstore::service::Service;
use warmstore::store::dirty::WipeReason;
use warmstore::testkit::Rng;

fn long() -> bool {
    std::env::var("WARMSTORE_LONG").is_ok_and(|v| v == "1")
}

fn config(
    bootstrap: &str,
    state_dir: &Path,
    stores: &[(&str, &str)],
    kafka: &[(&str, &str)],
) -> Config {
    let stores = stores
        .iter()
        .map(|(name, topic)| store(name, topic, None))
        .collect();
    service_config(bootstrap, state_dir, stores, kafka)
}

fn assert_stores_match(broker: &Broker, state: &Path, store: &str, topic: &str, partitions: i32) {
    for p in 0..partitions {
        let (applied, data) = read_store(state, store, topic, p);
        assert_eq!(
            applied,
            Some(broker.produced(topic, p) as i64 - 1),
            "{store}/{p} offset"
        );
        let model = broker.model(topic, p, 0);
        if data != model {
            let differing = model
                .iter()
                .find(|(k, v)| data.get(*k) != Some(*v))
                .map(|(k, _)| String::from_utf8_lossy(k).into_owned());
            let extra = data
                .keys()
                .find(|k| !model.contains_key(*k))
                .map(|k| String::from_utf8_lossy(k).into_owned());
            panic!("{store}/{p}: {} keys stored, {} expected; first missing or different: {differing:?}; first unexpected: {extra:?}", data.len(), model.len());
        }
    }
}

/// Small fetches over a slow link, so a restore takes long enough to fault in the middle.
const SLOW_FETCH: &[(&str, &str)] = &[
    ("max.partition.fetch.bytes", "2048"),
    ("fetch.max.bytes", "2048"),
    ("message.max.bytes", "2048"),
];

#[test]
fn a_broker_outage_mid_restore_is_shown_and_survived_without_restart() {
    let outage = Duration::from_secs(if long() { 30 } else { 5 });
    let mut broker = Broker::new();
    broker.create_topic("outage", 3);
    broker.produce_changelog("outage", 3, 3000, 41);
    broker
        .mock()
        .broker_round_trip_time(1, Duration::from_millis(30))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = config(
        &broker.bootstrap,
        dir.path(),
        &[("s", "outage")],
        SLOW_FETCH,
    );
    let rt = runtime();
    rt.block_on(async {
        let service = Service::start(&config).await.unwrap();
        let addr = service.http_addr.to_string();
        let s = &service;
        tokio::task::block_in_place(|| {
            wait_until("restore under way", Duration::from_secs(60), || {
                let p = s.board.partitions();
                p.len() == 3 && p.iter().map(|p| p.records.load(Relaxed)).sum::<u64>() > 0
            });
            assert!(!all_caught_up(s, 3), "the restore must still be running when the broker goes");
            broker.mock().broker_down(1).unwrap();
            let down_at = Instant::now();
            wait_until("/readyz to name the outage", Duration::from_secs(30), || {
                let (status, body) = http_get(&addr, "/readyz");
                status == 503 && body.contains("no Kafka broker reachable")
            });
            let (_, metrics) = http_get(&addr, "/metrics");
            assert!(
                metrics.contains("warmstore_store_state{partition=\"0\",state=\"failed\",store=\"s\",topic=\"outage\"} 1")
                    || metrics.lines().any(|l| l.starts_with("warmstore_store_state") && l.contains("state=\"failed\"") && l.ends_with(" 1")),
                "the failed state shows in the metrics"
            );
            std::thread::sleep(outage.saturating_sub(down_at.elapsed()));
            broker.mock().broker_up(1).unwrap();
            wait_until("catch-up after the outage", Duration::from_secs(120), || all_caught_up(s, 3));
            assert_eq!(http_get(&addr, "/readyz").0, 200);
        });
        println!("outage of {outage:?} survived");
        service.stop().await;
    });
    assert_stores_match(&broker, dir.path(), "s", "outage", 3);
}

#[test]
fn request_errors_on_fetch_and_list_offsets_and_slow_round_trips_are_survived() {
    let mut broker = Broker::new();
    broker.create_topic("flaky", 2);
    broker.produce_changelog("flaky", 2, 1500, 42);
    broker.mock().request_errors(
        RDKafkaApiKey::ListOffsets,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT; 3],
    );
    broker.mock().request_errors(
        RDKafkaApiKey::Fetch,
        &[
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
        ],
    );
    broker
        .mock()
        .broker_round_trip_time(1, Duration::from_millis(200))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = config(&broker.bootstrap, dir.path(), &[("s", "flaky")], &[]);
    let rt = runtime();
    rt.block_on(async {
        let service = Service::start(&config).await.unwrap();
        let s = &service;
        tokio::task::block_in_place(|| {
            wait_until("catch-up", Duration::from_secs(120), || all_caught_up(s, 2))
        });
        service.stop().await;
    });
    assert_stores_match(&broker, dir.path(), "s", "flaky", 2);
}

fn run_until_caught_up(
    rt: &tokio::runtime::Runtime,
    config: &Config,
    count: usize,
) -> Vec<(String, i32, u64, u64)> {
    rt.block_on(async {
        let service = Service::start(config).await.unwrap();
        let s = &service;
        tokio::task::block_in_place(|| {
            wait_until("catch-up", Duration::from_secs(60), || {
                all_caught_up(s, count)
            })
        });
        let figures = service
            .board
            .partitions()
            .iter()
            .map(|p| {
                let wipes = WipeReason::ALL.iter().map(|r| p.wipes(*r)).sum();
                (p.store.clone(), p.partition, p.records.load(Relaxed), wipes)
            })
            .collect();
        service.stop().await;
        figures
    })
}

#[test]
fn corrupt_stores_are_rebuilt_and_the_others_are_untouched() {
    let mut broker = Broker::new();
    broker.create_topic("hurt", 3);
    broker.create_topic("healthy", 2);
    broker.produce_changelog("hurt", 3, 500, 43);
    broker.produce_changelog("healthy", 2, 500, 44);
    let dir = tempfile::tempdir().unwrap();
    let config = config(
        &broker.bootstrap,
        dir.path(),
        &[("hurt", "hurt"), ("healthy", "healthy")],
        &[],
    );
    let rt = runtime();
    run_until_caught_up(&rt, &config, 5);

    // Partition 0: a garbage SST. Partition 1: garbage offset bytes. Partition 2: a file instead of the store.
    let db = |p: i32| dir.path().join(format!("hurt/{p}"));
    let sst = std::fs::read_dir(db(0))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "sst"))
        .expect("an SST");
    let len = std::fs::metadata(&sst).unwrap().len() as usize;
    std::fs::write(&sst, vec![0x5a; len]).unwrap();
    {
        let (options, families) = warmstore::store::StoreOptions::default()
            .db_options(warmstore::store::StoreType::KeyValue, false);
        let raw = rocksdb::DB::open_cf_descriptors(&options, db(1), families).unwrap();
        raw.put_cf(raw.cf_handle("offsets").unwrap(), "hurt-1", b"garbage")
            .unwrap();
        raw.flush_cfs_opt(
            &[
                raw.cf_handle("default").unwrap(),
                raw.cf_handle("offsets").unwrap(),
            ],
            &rocksdb::FlushOptions::default(),
        )
        .unwrap();
    }
    std::fs::remove_dir_all(db(2)).unwrap();
    std::fs::write(db(2), b"not a store").unwrap();

    let figures = run_until_caught_up(&rt, &config, 5);
    for (store, partition, records, wipes) in &figures {
        if store == "healthy" {
            assert_eq!((*records, *wipes), (0, 0), "healthy/{partition} untouched");
        } else {
            assert_eq!((*records, *wipes), (500, 1), "hurt/{partition} rebuilt");
        }
    }
    assert_stores_match(&broker, dir.path(), "hurt", "hurt", 3);
    assert_stores_match(&broker, dir.path(), "healthy", "healthy", 2);
}

#[test]
fn a_full_disk_fails_only_the_store_that_writes_and_recovers_without_restart() {
    let mut broker = Broker::new();
    broker.create_topic("big", 1);
    broker.create_topic("small", 1);
    broker.produce_changelog("big", 1, 200, 45);
    broker.produce_changelog("small", 1, 200, 46);
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=24m", "tmpfs"])
        .arg(&state)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        println!("SKIPPED: cannot mount a tmpfs here (needs root); the full-disk test did not run");
        return;
    }
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(self.0)
                .status();
        }
    }
    let _unmount = Unmount(&state);
    let mut config = config(
        &broker.bootstrap,
        &state,
        &[("big", "big"), ("small", "small")],
        &[],
    );
    // Flush every second, so new records reach the full disk rather than waiting in memtables.
    config.restore.flush_interval = Duration::from_secs(1);
    let rt = runtime();
    rt.block_on(async {
        let service = Service::start(&config).await.unwrap();
        let s = &service;
        tokio::task::block_in_place(|| {
            wait_until("catch-up", Duration::from_secs(60), || all_caught_up(s, 2));
            // Fill the disk, then let only `big` receive records.
            let filler = state.join("filler");
            let mut f = std::fs::File::create(&filler).unwrap();
            let chunk = vec![0u8; 1 << 20];
            while f.write_all(&chunk).is_ok() {}
            let _ = f.sync_all();
            drop(f);
            let value = vec![b'z'; 4000];
            // 2.4 MB: more than the disk has left, less than the mock's 5 MiB retention.
            for i in 0..600 {
                broker.send("big", 0, Some(format!("big{i}").as_bytes()), Some(&value));
            }
            broker.flush();
            let big = || {
                s.board
                    .partitions()
                    .into_iter()
                    .find(|p| p.store == "big")
                    .unwrap()
            };
            let small = || {
                s.board
                    .partitions()
                    .into_iter()
                    .find(|p| p.store == "small")
                    .unwrap()
            };
            wait_until(
                "big to fail on the full disk",
                Duration::from_secs(60),
                || big().state() == PartitionState::Failed,
            );
            println!("big failed with: {:?}", big().error());
            assert_eq!(
                small().state(),
                PartitionState::CaughtUp,
                "small is untouched"
            );
            std::fs::remove_file(&filler).unwrap();
            wait_until(
                "big to recover without a restart",
                Duration::from_secs(120),
                || all_caught_up(s, 2),
            );
        });
        service.stop().await;
    });
    assert_stores_match(&broker, &state, "big", "big", 1);
    assert_stores_match(&broker, &state, "small", "small", 1);
}

/// Mutations of a valid config: byte flips, cuts, duplicated lines and stray tokens.
fn mutate(rng: &mut Rng, text: &str) -> String {
    let mut bytes = text.as_bytes().to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(bytes.len() as u64 + 1) as usize;
        match rng.below(5) {
            0 if !bytes.is_empty() => {
                let i = at.min(bytes.len() - 1);
                bytes[i] = rng.below(256) as u8;
            }
            1 => bytes.truncate(at),
            2 => {
                let token: &[u8] = [
                    &b": "[..],
                    b"\n  - ",
                    b"[",
                    b"{",
                    b"\"",
                    b"-1",
                    b"99999999999999999999",
                    b"\t",
                    b"&a *a",
                    b"!!binary",
                ][rng.below(10) as usize];
                bytes.splice(at..at, token.iter().copied());
            }
            3 => {
                let end = (at + rng.below(40) as usize).min(bytes.len());
                bytes.drain(at..end);
            }
            _ => {
                let copy: Vec<u8> = bytes[at..(at + 30).min(bytes.len())].to_vec();
                bytes.splice(at..at, copy);
            }
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

#[test]
fn malformed_configs_never_panic() {
    let example = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/examples/warmstore.yaml"),
    )
    .unwrap();
    let cases = if long() { 100_000 } else { 5_000 };
    let mut rng = Rng::new(47);
    let (mut ok, mut errors) = (0, 0);
    for _ in 0..cases {
        let text = mutate(&mut rng, &example);
        match std::panic::catch_unwind(|| Config::parse(&text, None)) {
            Ok(Ok(_)) => ok += 1,
            Ok(Err(message)) => {
                assert!(!message.to_string().is_empty());
                errors += 1;
            }
            Err(_) => panic!("Config::parse panicked on:\n{text}"),
        }
    }
    println!("config fuzz: {cases} cases, {ok} valid, {errors} rejected with a message, 0 panics");
}

#[test]
fn http_answers_only_get_and_refuses_bodies_and_state_dirs_are_private() {
    let mut broker = Broker::new();
    broker.create_topic("http", 1);
    broker.produce_changelog("http", 1, 10, 48);
    let dir = tempfile::tempdir().unwrap();
    let config = config(&broker.bootstrap, dir.path(), &[("s", "http")], &[]);
    let rt = runtime();
    rt.block_on(async {
        let service = Service::start(&config).await.unwrap();
        let addr = service.http_addr.to_string();
        let s = &service;
        tokio::task::block_in_place(|| {
            wait_until("catch-up", Duration::from_secs(60), || all_caught_up(s, 1));
            let raw = |request: String| {
                let mut stream = std::net::TcpStream::connect(&addr).unwrap();
                stream.write_all(request.as_bytes()).unwrap();
                let mut answer = String::new();
                let _ = stream.read_to_string(&mut answer);
                answer.split_whitespace().nth(1).unwrap_or("").to_string()
            };
            assert_eq!(
                raw("POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n".into()),
                "405"
            );
            assert_eq!(raw("DELETE /stores HTTP/1.0\r\n\r\n".into()), "405");
            let body = "x".repeat(4096);
            assert_eq!(
                raw(format!(
                    "GET /readyz HTTP/1.0\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                )),
                "413"
            );
            assert_eq!(raw("GET /nope HTTP/1.0\r\n\r\n".into()), "404");
            assert_eq!(http_get(&addr, "/livez").0, 200);
        });
        service.stop().await;
    });
    for dir in [dir.path().join("s"), dir.path().join("s/0")] {
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o750, "{}", dir.display());
    }
}

#[test]
fn large_binary_and_empty_records_round_trip() {
    let mut broker = Broker::new();
    broker.create_topic("odd", 1);
    let big = vec![7u8; 3 << 20];
    broker.send("odd", 0, Some(&[0, 1, 2, 255]), Some(&[255, 0, 128]));
    broker.send("odd", 0, Some(b"empty"), Some(b""));
    broker.send("odd", 0, Some(b"big"), Some(&big));
    broker.send("odd", 0, Some(&[]), Some(b"empty key"));
    broker.flush();
    let dir = tempfile::tempdir().unwrap();
    let config = config(&broker.bootstrap, dir.path(), &[("s", "odd")], &[]);
    run_until_caught_up(&runtime(), &config, 1);
    assert_stores_match(&broker, dir.path(), "s", "odd", 1);
    let _ = free_port();
}

/// A 10 MiB value. The mock broker keeps about 5 MiB per partition and drops a larger batch whole,
/// so the record is sent compressed (as producers of large values do); warmstore receives and
/// stores it decompressed, byte for byte.
#[test]
fn a_ten_mib_value_round_trips() {
    let mut broker = Broker::with_producer(&[
        ("compression.type", "lz4"),
        ("message.max.bytes", "16000000"),
    ]);
    broker.create_topic("huge", 1);
    let huge: Vec<u8> = (0..10usize << 20).map(|i| (i % 251) as u8).collect();
    broker.send("huge", 0, Some(b"before"), Some(b"small"));
    broker.send("huge", 0, Some(b"huge"), Some(&huge));
    broker.send("huge", 0, Some(b"after"), Some(b"small"));
    broker.flush();
    assert_eq!(
        broker.watermarks("huge", 0),
        (0, 3),
        "the broker kept all three"
    );
    let dir = tempfile::tempdir().unwrap();
    let config = config(&broker.bootstrap, dir.path(), &[("s", "huge")], &[]);
    run_until_caught_up(&runtime(), &config, 1);
    assert_stores_match(&broker, dir.path(), "s", "huge", 1);
    let (_, data) = read_store(dir.path(), "s", "huge", 0);
    assert_eq!(data.get(b"huge".as_slice()).map(Vec::len), Some(10 << 20));
}
