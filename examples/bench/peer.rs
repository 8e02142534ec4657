//! (e): the peer, Quix Streams' recovery on a copy of the same changelog.

use crate::broker::Broker;
use crate::TOPIC;
use std::path::Path;
use std::process::{Command, Stdio};

/// (e) on the broker's changelog, printed under `label`; returns records/s.
pub fn measure_peer(broker: &mut Broker, state_dir: &Path, partitions: u64, label: &str) -> f64 {
    let (records, seconds) = quix_peer(broker, state_dir, partitions);
    let rate = records as f64 / seconds;
    println!("(e) peer, Quix Streams recovery{label}: {records} records in {seconds:.2} s = {rate:.0} records/s");
    rate
}

/// (e): `bench/quix_peer.py` copies the changelog into a topic of its own with Quix's header
/// (untimed), then times Quix's recovery; returns (records, seconds).
fn quix_peer(broker: &mut Broker, state_dir: &Path, partitions: u64) -> (u64, f64) {
    const QUIX_TOPIC: &str = "bench-changelog-quix";
    broker.command(&format!("create {QUIX_TOPIC} {partitions}"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/quix_peer.py");
    let output = Command::new("python3")
        .env("PYTHONWARNINGS", "ignore")
        .arg(&script)
        .args(["--bootstrap", &broker.bootstrap, "--topic", TOPIC])
        .args(["--compression", &broker.compression])
        .args([
            "--quix-topic",
            QUIX_TOPIC,
            "--partitions",
            &partitions.to_string(),
        ])
        .arg("--state-dir")
        .arg(state_dir)
        .stderr(Stdio::inherit())
        .output()
        .expect("python3 runs bench/quix_peer.py (pip install quixstreams)");
    assert!(
        output.status.success(),
        "the Quix peer failed, its error above (`pip install quixstreams` installs it; --no-peer skips it)"
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    let field = |name: &str| {
        last.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in the peer's output: {last}"))
            .to_string()
    };
    (
        field("records=").parse().unwrap(),
        field("seconds=").parse().unwrap(),
    )
}
