//! (a) the fetch limit and (b) the write limit, and with them (c) and (e) on one changelog.

use crate::broker::Broker;
use crate::peer::measure_peer;
use crate::run::{proc_figures, warmstore_run, Run};
use crate::TOPIC;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use std::path::Path;
use std::time::{Duration, Instant};

/// (a): consume everything; returns (records, bytes, seconds) and, with `keep`, the records, which
/// (b) writes. Without `keep` (large changelogs) the records are only counted.
type Records = Vec<Vec<(Vec<u8>, Option<Vec<u8>>)>>;

fn fetch_limit(bootstrap: &str, partitions: u64, keep: bool) -> (u64, u64, f64, Records) {
    use warmstore::kafka::batch::{BatchQueue, Fetched, MAX_TAKEN};
    let mut config = warmstore::kafka::consumers::client_config(
        &[("bootstrap.servers".to_string(), bootstrap.to_string())].into(),
    );
    config.set("group.id", "bench-fetch");
    let consumer: std::sync::Arc<BaseConsumer> = std::sync::Arc::new(config.create().unwrap());
    let mut list = TopicPartitionList::new();
    let mut highs = Vec::new();
    // As warmstore takes records: each partition's queue split off and taken from in batches,
    // and a wake-up when one of them has records.
    let wake = std::sync::Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
    let mut queues = Vec::new();
    for p in 0..partitions as i32 {
        let (_, high) = consumer
            .fetch_watermarks(TOPIC, p, Duration::from_secs(10))
            .unwrap();
        highs.push(high);
        list.add_partition_offset(TOPIC, p, Offset::Beginning)
            .unwrap();
        let mut split = consumer.split_partition_queue(TOPIC, p).unwrap();
        let wake = wake.clone();
        split.set_nonempty_callback(move || {
            *wake.0.lock().unwrap() = true;
            wake.1.notify_one();
        });
        let batches = BatchQueue::new(&consumer, TOPIC, p).unwrap();
        queues.push((split, batches));
    }
    let mut records: Records = vec![Vec::new(); partitions as usize];
    let mut remaining = highs.iter().filter(|h| **h > 0).count();
    let (mut count, mut bytes) = (0u64, 0u64);
    let started = Instant::now();
    consumer.assign(&list).unwrap();
    while remaining > 0 {
        *wake.0.lock().unwrap() = false;
        let mut taken = 0;
        for (p, (_, batches)) in queues.iter().enumerate() {
            taken += batches.take(MAX_TAKEN, |fetched| {
                if let Fetched::Record {
                    offset, key, value, ..
                } = fetched
                {
                    let key = key.unwrap_or_default();
                    count += 1;
                    bytes += (key.len() + value.map_or(0, <[u8]>::len)) as u64;
                    if keep {
                        records[p].push((key.to_vec(), value.map(<[u8]>::to_vec)));
                    }
                    if offset + 1 == highs[p] {
                        remaining -= 1;
                    }
                }
                true
            });
        }
        if taken == 0 {
            let (woken, signal) = &*wake;
            let woken = woken.lock().unwrap();
            let _ = signal
                .wait_timeout_while(woken, Duration::from_millis(100), |w| !*w)
                .unwrap();
        }
    }
    (count, bytes, started.elapsed().as_secs_f64(), records)
}

/// (b): the same records into one RocksDB per partition, with warmstore's options, as WriteBatches
/// of about 1 MiB with WAL off.
fn write_limit(dir: &Path, records: &Records) -> f64 {
    let options = warmstore::store::StoreOptions::default();
    let started = Instant::now();
    for (p, partition) in records.iter().enumerate() {
        let (db_options, families) =
            options.db_options(warmstore::store::StoreType::KeyValue, true);
        let db = rocksdb::DB::open_cf_descriptors(&db_options, dir.join(p.to_string()), families)
            .unwrap();
        let mut write_options = rocksdb::WriteOptions::default();
        write_options.disable_wal(true);
        let mut batch = rocksdb::WriteBatch::default();
        for (k, v) in partition {
            match v {
                Some(v) => batch.put(k, v),
                None => batch.delete(k),
            }
            if batch.size_in_bytes() >= 1 << 20 {
                db.write_opt(std::mem::take(&mut batch), &write_options)
                    .unwrap();
            }
        }
        db.write_opt(batch, &write_options).unwrap();
        db.flush().unwrap();
    }
    started.elapsed().as_secs_f64()
}

/// (a), (b), (c) and (e) on one changelog.
pub struct Limits {
    pub a_rate: f64,
    pub a_cpu: f64,
    pub b_rate: f64,
    pub b_cpu: f64,
    pub c: Run,
    pub e_rate: Option<f64>,
}

impl Limits {
    /// The ratios the targets are stated in; `label` names the changelog ("" for the plain one).
    pub fn print_ratios(&self, label: &str) {
        println!(
            "ratio c / min(a, b){label}: {:.2}",
            self.c.rate() / self.a_rate.min(self.b_rate)
        );
        // What running fetch and write together costs beyond each alone (1.0: nothing).
        println!(
            "pipeline overhead{label}, CPU(c) / (CPU(a) + CPU(b)): {:.2}",
            self.c.cpu_seconds / (self.a_cpu + self.b_cpu)
        );
        if let Some(e_rate) = self.e_rate {
            println!("ratio c / e{label}: {:.1}", self.c.rate() / e_rate);
        }
    }
}

/// Measures and prints (a), (b), (c) and, with `peer`, (e) on the broker's changelog; `label`
/// names the changelog in every line ("" for the plain one). Stores go under `work`.
pub fn limits(
    broker: &mut Broker,
    work: &Path,
    label: &str,
    partitions: u64,
    kafka: &[String],
    peer: bool,
) -> Limits {
    std::fs::create_dir_all(work).unwrap();
    let own_cpu = || proc_figures(std::process::id()).0;
    let a = measure_fetch(&broker.bootstrap, partitions, true, label);
    let (a_records, a_rate, a_cpu, data) = (a.records, a.rate, a.cpu, a.data);
    let per_million = |cpu: f64| cpu / (a_records as f64 / 1e6);
    let before_b = own_cpu();
    let b_secs = write_limit(&work.join("write-limit"), &data);
    let b_cpu = own_cpu() - before_b;
    drop(data);
    let b_rate = a_records as f64 / b_secs;
    println!(
        "(b) write limit{label}: {a_records} records in {b_secs:.2} s = {b_rate:.0} records/s, {:.2} CPU s per million records",
        per_million(b_cpu)
    );
    let c = warmstore_run(&broker.bootstrap, &work.join("state"), partitions, kafka);
    println!("(c) warmstore empty to caught up{label}: {}", c.figures());
    let e_rate = if peer {
        Some(measure_peer(broker, &work.join("quix"), partitions, label))
    } else {
        println!("(e) peer{label}: skipped (--no-peer)");
        None
    };
    Limits {
        a_rate,
        a_cpu,
        b_rate,
        b_cpu,
        c,
        e_rate,
    }
}

/// What (a) measured.
pub struct Fetch {
    pub records: u64,
    pub bytes: u64,
    pub rate: f64,
    /// CPU seconds of this process over the fetch.
    pub cpu: f64,
    /// The records, when kept for (b).
    pub data: Records,
}

/// (a) on the broker's changelog, printed under `label`; `keep` holds the records for (b).
pub fn measure_fetch(bootstrap: &str, partitions: u64, keep: bool, label: &str) -> Fetch {
    let own_cpu = || proc_figures(std::process::id()).0;
    let before = own_cpu();
    let (records, bytes, seconds, data) = fetch_limit(bootstrap, partitions, keep);
    let cpu = own_cpu() - before;
    let rate = records as f64 / seconds;
    println!(
        "(a) fetch limit{label}: {records} records in {seconds:.2} s = {rate:.0} records/s, {:.1} MB/s, {:.2} CPU s per million records",
        bytes as f64 / seconds / 1e6,
        cpu / (records as f64 / 1e6)
    );
    Fetch {
        records,
        bytes,
        rate,
        cpu,
        data,
    }
}
