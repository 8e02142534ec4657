//! The command line as a user meets it: config errors exit 2 naming the problem, the demo runs.

mod common;

use common::background::Running;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

fn warmstore(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_warmstore"))
        .args(args)
        .env_remove("WARMSTORE_BOOTSTRAP_SERVERS")
        .output()
        .expect("warmstore runs")
}

fn check(dir: &Path, text: &str) -> (Option<i32>, String) {
    let path = dir.join("c.yaml");
    std::fs::write(&path, text).unwrap();
    let out = warmstore(&["check-config", "--config", path.to_str().unwrap()]);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const GOOD: &str = "kafka:\n  bootstrap.servers: 127.0.0.1:9092\nrestore:\n  commit_interval: 10s\nstores:\n  - name: counts\n    changelog: t\n";

#[test]
fn a_good_config_passes() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(check(dir.path(), GOOD).0, Some(0));
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/examples/warmstore.yaml");
    let out = warmstore(&["check-config", "--config", example.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A consumer config copied from elsewhere passes (every `kafka:` key goes to librdkafka), but
/// the user is told what it gives up.
#[test]
fn a_kafka_property_that_gives_up_a_guarantee_passes_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let (code, err) = check(dir.path(), GOOD);
    assert_eq!((code, err.contains("warning")), (Some(0), false), "{err}");
    let copied = GOOD.replace(
        "  bootstrap.servers: 127.0.0.1:9092",
        "  bootstrap.servers: 127.0.0.1:9092\n  auto.offset.reset: earliest",
    );
    let (code, err) = check(dir.path(), &copied);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("warning: kafka.auto.offset.reset is `earliest`")
            && err.contains("instead of being wiped and rebuilt"),
        "{err}"
    );
}

#[test]
fn an_unknown_field_names_the_field_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let (code, err) = check(
        dir.path(),
        &GOOD.replace(
            "  commit_interval: 10s",
            "  commit_interval: 10s\n  comit_every: 5s",
        ),
    );
    assert_eq!(code, Some(2));
    assert!(
        err.contains("comit_every") && err.contains("line 5"),
        "{err}"
    );
}

#[test]
fn a_bad_duration_no_stores_and_a_missing_file_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let (code, err) = check(dir.path(), &GOOD.replace("10s", "ten seconds"));
    assert_eq!(code, Some(2));
    assert!(
        err.contains("ten seconds") && err.contains("line 4"),
        "{err}"
    );

    let (code, err) = check(dir.path(), "kafka:\n  bootstrap.servers: x:1\nstores: []\n");
    assert_eq!(code, Some(2));
    assert!(err.contains("at least one store"), "{err}");

    let out = warmstore(&["check-config", "--config", "/nonexistent/warmstore.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read the file"));

    let path = dir.path().join("c.yaml");
    std::fs::write(&path, GOOD.replace("name: counts", "name: ../escape")).unwrap();
    let out = warmstore(&["run", "--config", path.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "run refuses a bad config the same way"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("stores[0].name"));
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(warmstore(&["frobnicate"]).status.code(), Some(2));
    assert_eq!(warmstore(&["run"]).status.code(), Some(2));
    let out = warmstore(&["demo", "--records", "100000000", "--partitions", "2"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("5 MiB per partition"));
}

#[test]
fn the_demo_restores_and_reports() {
    let dir = tempfile::tempdir().unwrap();
    let out = warmstore(&[
        "demo",
        "--records",
        "20000",
        "--partitions",
        "4",
        "--listen",
        "127.0.0.1:0",
        "--state-dir",
        dir.path().to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("records restored: 20000"), "{stdout}");
    assert!(stdout.contains("checked against the changelog"), "{stdout}");
    assert!(dir.path().join("demo/3/CURRENT").exists());
}

/// `warmstore run` on a port another socket holds: it exits 1 right after starting. Returns the
/// port and what it wrote to stderr (a pipe).
fn run_on_a_taken_port() -> (std::net::SocketAddr, Output) {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let config = dir.path().join("c.yaml");
    let state = dir.path().join("state");
    std::fs::write(
        &config,
        format!(
            "kafka:\n  bootstrap.servers: 127.0.0.1:9\nstate_dir: {}\nhttp:\n  listen: {addr}\nstores:\n  - name: counts\n    changelog: t\n",
            state.display()
        ),
    )
    .unwrap();
    (
        addr,
        warmstore(&["run", "--config", config.to_str().unwrap()]),
    )
}

#[test]
fn a_taken_port_is_named_once_with_its_reason() {
    let (addr, out) = run_on_a_taken_port();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line in {err}"));
    assert!(line.contains(&format!("cannot listen on {addr}")), "{line}");
    assert!(
        line.contains("in use") && line.matches("os error").count() == 1,
        "the reason once: {line}"
    );
}

/// Log collectors (`kubectl logs`, a file) read stderr as text: colour codes belong on a terminal
/// only.
#[test]
fn logs_written_to_a_pipe_carry_no_colour_codes() {
    let (_, out) = run_on_a_taken_port();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("warmstore starting"), "{err}");
    assert!(!err.contains('\u{1b}'), "escape codes in {err:?}");
}

/// An unreachable broker is retried ten times a second by librdkafka, and each retry reports its
/// errors again. The log names each kind once (and again a minute later), instead of some forty
/// lines a second for as long as the outage lasts; `/readyz` and `/stores` show it meanwhile.
#[test]
fn an_unreachable_broker_is_logged_once_not_on_every_retry() {
    let stores = "  - name: counts\n    changelog: t\n";
    let text = stopped_in_an_outage("", stores, Duration::from_secs(4));
    let errors = text
        .lines()
        .filter(|l| l.contains("kafka client error") || l.contains("consumer error"))
        .count();
    // Two clients (tailing and catching up), each told by two paths, of a few kinds of error
    // (transport failure and all brokers down here: 8 lines). Logged on every retry, it was about
    // 400 lines in these 4 s.
    assert!((1..=16).contains(&errors), "{errors} error lines:\n{text}");
    // The request under way when SIGTERM came is not retried, nor logged as if it would be.
    let (_, stopping) = text
        .split_once("shutdown requested")
        .expect("a logged shutdown");
    assert!(!stopping.contains("retrying"), "{stopping}");
}

/// In an outage every request to Kafka takes its whole timeout (10 s), and they run a few at a
/// time on the engine's blocking threads. A stop that waited for each partition's request for its
/// log's offsets, and each store's listing of its changelog, took four minutes at 100 partitions
/// (by hand: 246 s), past any pod's grace period, while saying that stores were still closing.
/// Nothing is open yet, so a stop need not wait for any answer.
#[test]
fn a_stop_during_an_outage_does_not_wait_for_requests_to_kafka() {
    let listed: Vec<String> = (0..100).map(|p| p.to_string()).collect();
    let mut stores = format!(
        "  - name: listed\n    changelog: t\n    partitions: [{}]\n",
        listed.join(", ")
    );
    for s in 0..30 {
        stores.push_str(&format!("  - name: s{s}\n    changelog: t{s}\n"));
    }
    // Waiting out the requests takes 100 x 10 s and 30 x 10 s, four at a time.
    stopped_in_an_outage("", &stores, Duration::from_secs(3));
}

/// A group member counts the partitions of its changelogs, one request each: a member of 10
/// changelogs that counted on its own thread took 96 s to stop in an outage.
#[test]
fn a_group_member_stops_during_an_outage_without_waiting_for_kafka() {
    let stores: String = (0..10)
        .map(|s| format!("  - name: s{s}\n    changelog: t{s}\n"))
        .collect();
    let group = "assignment:\n  mode: group\n  group_id: g\n";
    stopped_in_an_outage(group, &stores, Duration::from_secs(3));
}

/// Runs `warmstore run` against a port nothing listens on for `running`, then stops it with
/// SIGTERM: it must exit 0 well before the requests it abandons would have timed out (by hand:
/// about 0.1 s). Returns its log.
fn stopped_in_an_outage(assignment: &str, stores: &str, running: Duration) -> String {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.yaml");
    let text = format!(
        "kafka:\n  bootstrap.servers: 127.0.0.1:9\nstate_dir: {}\nhttp:\n  listen: 127.0.0.1:0\n{assignment}stores:\n{stores}",
        dir.path().join("state").display(),
    );
    std::fs::write(&config, text).unwrap();
    let log = dir.path().join("stderr");
    let child = Running::warmstore_run(&config, &log);
    std::thread::sleep(running);
    let code = child.stop(Duration::from_secs(60));
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("shutdown requested"), "{text}");
    text
}
