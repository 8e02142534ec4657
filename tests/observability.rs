//! What users watch: `/metrics` values after a real restore, `/readyz` during and after one, wipes and
//! invalid records in the counters, a real Prometheus scraping the service, and `promtool`.

mod common;

use common::{http_get, runtime, service_config, store, wait_caught_up, wait_until, Broker};
use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use warmstore::service::Service;

type Labels = BTreeMap<String, String>;

/// Parses the text exposition into (name, labels, value).
fn parse(text: &str) -> Vec<(String, Labels, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("name and value");
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => {
                    let labels = rest
                        .trim_end_matches('}')
                        .split("\",")
                        .filter(|p| !p.is_empty())
                        .map(|pair| {
                            let (k, v) = pair.split_once('=').unwrap();
                            (k.to_string(), v.trim_matches('"').to_string())
                        })
                        .collect();
                    (name.to_string(), labels)
                }
                None => (series.to_string(), Labels::new()),
            };
            (name, labels, value.parse().unwrap_or(f64::NAN))
        })
        .collect()
}

/// The one series of `name` whose labels include `want`.
fn value(metrics: &[(String, Labels, f64)], name: &str, want: &[(&str, &str)]) -> f64 {
    let found: Vec<f64> = metrics
        .iter()
        .filter(|(n, labels, _)| {
            n == name
                && want
                    .iter()
                    .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, _, v)| *v)
        .collect();
    assert_eq!(found.len(), 1, "{name} {want:?}: {found:?}");
    found[0]
}

/// This process's user and system CPU seconds, as the kernel counts them for `getrusage`.
fn own_cpu_seconds() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    assert_eq!(
        unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) },
        0
    );
    let usage = unsafe { usage.assume_init() };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

fn scrape(addr: &str) -> String {
    let (status, body) = http_get(addr, "/metrics");
    assert_eq!(status, 200);
    body
}

/// `promtool check metrics` on an exposition: no errors, no lint complaints.
fn promtool_check(text: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool is installed (Debian package prometheus; .ci/run installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn metrics_after_a_restore_have_the_right_values() {
    let mut broker = Broker::new();
    broker.create_topic("obs", 3);
    broker.produce_changelog("obs", 3, 400, 21);
    broker.send("obs", 0, None, Some(b"no key"));
    broker.flush();
    let dir = tempfile::tempdir().unwrap();
    let config = service_config(
        &broker.bootstrap,
        dir.path(),
        vec![store("obs", "obs", None)],
        &[],
    );
    let rt = runtime();
    let text = rt.block_on(async {
        let service = Service::start(&config).await.unwrap();
        let s = &service;
        tokio::task::block_in_place(|| wait_caught_up(s, 3));
        let addr = service.http_addr.to_string();
        let cpu_before = own_cpu_seconds();
        let text = tokio::task::block_in_place(|| scrape(&addr));
        let cpu_after = own_cpu_seconds();
        service.stop().await;
        (text, cpu_before, cpu_after)
    });
    let (text, cpu_before, cpu_after) = text;
    let m = parse(&text);
    // The process's CPU as the kernel counts it at the scrape, not in whole seconds.
    let cpu = value(&m, "process_cpu_seconds_total", &[]);
    assert!(
        cpu > 0.0 && cpu >= cpu_before && cpu <= cpu_after,
        "process_cpu_seconds_total {cpu}; the process had used {cpu_before} s before the scrape and {cpu_after} s after"
    );
    for p in 0..3 {
        let part = p.to_string();
        let l = [
            ("store", "obs"),
            ("topic", "obs"),
            ("partition", part.as_str()),
        ];
        let records = &broker.log[&("obs".to_string(), p)];
        let keyed: Vec<_> = records.iter().filter(|(k, _)| k.is_some()).collect();
        let bytes: usize = keyed
            .iter()
            .map(|(k, v)| k.as_ref().unwrap().len() + v.as_ref().map_or(0, Vec::len))
            .sum();
        assert_eq!(
            value(&m, "warmstore_records_restored_total", &l),
            keyed.len() as f64,
            "p{p}"
        );
        assert_eq!(
            value(&m, "warmstore_bytes_restored_total", &l),
            bytes as f64,
            "p{p}"
        );
        assert_eq!(value(&m, "warmstore_restore_lag_records", &l), 0.0);
        assert_eq!(value(&m, "warmstore_restore_lag_seconds", &l), 0.0);
        assert_eq!(value(&m, "warmstore_restore_progress_ratio", &l), 1.0);
        assert_eq!(value(&m, "warmstore_restore_eta_seconds", &l), 0.0);
        assert_eq!(
            value(&m, "warmstore_store_applied_offset", &l),
            (records.len() - 1) as f64
        );
        assert_eq!(
            value(&m, "warmstore_changelog_end_offset", &l),
            records.len() as f64
        );
        assert_eq!(value(&m, "warmstore_changelog_start_offset", &l), 0.0);
        for state in ["opening", "wiping", "restoring", "failed"] {
            assert_eq!(
                value(&m, "warmstore_store_state", &[l[2], ("state", state)]),
                0.0
            );
        }
        assert_eq!(
            value(&m, "warmstore_store_state", &[l[2], ("state", "caught_up")]),
            1.0
        );
        let nulls = if p == 0 { 1.0 } else { 0.0 };
        assert_eq!(
            value(
                &m,
                "warmstore_invalid_records_total",
                &[l[2], ("reason", "null_key")]
            ),
            nulls
        );
        assert_eq!(
            value(
                &m,
                "warmstore_store_wipes_total",
                &[l[2], ("reason", "corruption")]
            ),
            0.0
        );
        assert_eq!(value(&m, "warmstore_unclean_shutdowns_total", &l), 0.0);
        assert!(value(&m, "warmstore_commits_total", &l) >= 1.0);
        assert!(value(&m, "warmstore_commit_duration_seconds_count", &l) >= 1.0);
        assert!(value(&m, "warmstore_store_estimated_keys", &l) > 0.0);
        assert!(value(&m, "warmstore_store_disk_bytes", &l) > 0.0);
    }
    assert_eq!(value(&m, "warmstore_ready", &[]), 1.0);
    assert!(value(&m, "process_resident_memory_bytes", &[]) > 0.0);
    promtool_check(&text);
}

#[test]
fn readyz_is_503_while_restoring_and_200_after() {
    let mut broker = Broker::new();
    broker.create_topic("slow", 2);
    broker.produce_changelog("slow", 2, 2000, 22);
    // Tiny fetches over a slow link: the restore takes seconds, long enough to watch.
    broker
        .mock()
        .broker_round_trip_time(1, Duration::from_millis(100))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = service_config(
        &broker.bootstrap,
        dir.path(),
        vec![store("obs", "slow", None)],
        &[
            ("max.partition.fetch.bytes", "4096"),
            ("fetch.max.bytes", "4096"),
            ("message.max.bytes", "4096"),
        ],
    );
    let rt = runtime();
    rt.block_on(async {
        let service = Service::start(&config).await.unwrap();
        let addr = service.http_addr.to_string();
        tokio::task::block_in_place(|| {
            let mut lagging = String::new();
            wait_until(
                "a 503 naming a lagging partition",
                Duration::from_secs(60),
                || {
                    let (status, body) = http_get(&addr, "/readyz");
                    if status == 503 && body.contains("restoring: lag") {
                        lagging = body;
                        true
                    } else {
                        false
                    }
                },
            );
            let body: serde_json::Value = serde_json::from_str(&lagging).unwrap();
            assert_eq!(body["ready"], false);
            let first = &body["not_ready"][0];
            assert_eq!(first["store"], "obs");
            assert_eq!(first["topic"], "slow");
            assert!(first["partition"].is_number(), "{body}");
            let m = parse(&scrape(&addr));
            assert_eq!(value(&m, "warmstore_ready", &[]), 0.0);
            wait_until("readyz 200", Duration::from_secs(120), || {
                http_get(&addr, "/readyz").0 == 200
            });
            assert_eq!(http_get(&addr, "/livez").0, 200);
            let (status, stores) = http_get(&addr, "/stores");
            assert_eq!(status, 200);
            let stores: serde_json::Value = serde_json::from_str(&stores).unwrap();
            assert_eq!(stores["partitions"].as_array().unwrap().len(), 2);
            assert_eq!(stores["partitions"][0]["state"], "caught_up");
            assert_eq!(stores["partitions"][0]["lag"], 0);
        });
        service.stop().await;
    });
}

#[test]
fn a_forced_wipe_is_counted_with_its_reason() {
    let mut broker = Broker::new();
    broker.create_topic("wiped", 2);
    broker.produce_changelog("wiped", 2, 100, 23);
    let dir = tempfile::tempdir().unwrap();
    let config = service_config(
        &broker.bootstrap,
        dir.path(),
        vec![store("obs", "wiped", None)],
        &[],
    );
    let rt = runtime();
    let run = |rt: &tokio::runtime::Runtime| {
        rt.block_on(async {
            let service = Service::start(&config).await.unwrap();
            let s = &service;
            tokio::task::block_in_place(|| wait_caught_up(s, 2));
            let addr = service.http_addr.to_string();
            let text = tokio::task::block_in_place(|| scrape(&addr));
            service.stop().await;
            text
        })
    };
    run(&rt);
    // An interrupted wipe left its marker beside partition 1's store.
    std::fs::write(
        dir.path().join("obs/1.wiping"),
        "corruption: killed mid-wipe\n",
    )
    .unwrap();
    let m = parse(&run(&rt));
    let p1 = ("partition", "1");
    assert_eq!(
        value(
            &m,
            "warmstore_store_wipes_total",
            &[p1, ("reason", "interrupted_rebuild")]
        ),
        1.0
    );
    for reason in [
        "unclean_shutdown",
        "corruption",
        "missing_offsets",
        "offset_out_of_range",
        "format_mismatch",
    ] {
        assert_eq!(
            value(&m, "warmstore_store_wipes_total", &[p1, ("reason", reason)]),
            0.0,
            "{reason}"
        );
    }
    let p0 = ("partition", "0");
    assert_eq!(
        value(
            &m,
            "warmstore_store_wipes_total",
            &[p0, ("reason", "interrupted_rebuild")]
        ),
        0.0
    );
    assert_eq!(
        value(&m, "warmstore_records_restored_total", &[p0]),
        0.0,
        "partition 0 resumed"
    );
    assert_eq!(
        value(&m, "warmstore_records_restored_total", &[p1]),
        100.0,
        "partition 1 rebuilt"
    );
}

#[test]
fn a_real_prometheus_scrapes_the_service() {
    let mut broker = Broker::new();
    broker.create_topic("scraped", 2);
    broker.produce_changelog("scraped", 2, 300, 24);
    let dir = tempfile::tempdir().unwrap();
    let config = service_config(
        &broker.bootstrap,
        dir.path(),
        vec![store("obs", "scraped", None)],
        &[],
    );
    let rt = runtime();
    rt.block_on(async {
        let service = Service::start(&config).await.unwrap();
        let s = &service;
        tokio::task::block_in_place(|| wait_caught_up(s, 2));
        let target = service.http_addr.to_string();
        tokio::task::block_in_place(|| {
            let prom = common::Prometheus::start(dir.path(), &target);
            let query = "sum(warmstore_records_restored_total{store=\"obs\"})";
            let mut seen = None;
            wait_until(
                "Prometheus to have scraped warmstore",
                Duration::from_secs(60),
                || {
                    seen = prom.query_scalar(query);
                    seen == Some(600.0)
                },
            );
            assert_eq!(prom.query_scalar("warmstore_ready"), Some(1.0));
            assert_eq!(
                prom.query_scalar("max(warmstore_restore_lag_records)"),
                Some(0.0)
            );
        });
        service.stop().await;
    });
}
