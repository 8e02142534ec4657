//! Group mode against the real Apache Kafka broker's group coordinator: `warmstore run` processes
//! that share the partitions of two co-partitioned changelogs, with static membership, kills,
//! restarts, scaling, and stores revoked and handed back.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::background::{producer, Running};
use common::kafka::kafka;
use common::{fold, http_get, poll_until, read_store, wait_until, Broker, Record};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use warmstore::store::StorePaths;

const PARTITIONS: i32 = 12;
const RECORDS: usize = 200;
/// The broker's smallest allowed session timeout is 6 s; a little more keeps a busy machine from
/// dropping a live member.
const SESSION_TIMEOUT_MS: u64 = 10_000;
const SETTLE: Duration = Duration::from_secs(120);

type Owned = BTreeSet<(String, i32)>;

/// Two changelogs of the same partition count, with `RECORDS` records per partition.
struct Changelogs {
    broker: Broker,
    topics: [String; 2],
    partitions: i32,
}

impl Changelogs {
    fn new(test: &str) -> Changelogs {
        Changelogs::with_partitions(test, PARTITIONS)
    }

    fn with_partitions(test: &str, partitions: i32) -> Changelogs {
        Changelogs::produced(test, partitions, RECORDS)
    }

    fn produced(test: &str, partitions: i32, records: usize) -> Changelogs {
        let mut broker = Broker::real(&[]);
        let topics = [format!("{test}-orders"), format!("{test}-totals")];
        for (seed, topic) in topics.iter().enumerate() {
            broker.create_topic(topic, partitions);
            if records > 0 {
                broker.produce_changelog(topic, partitions, records, seed as u64 + 1);
            }
        }
        Changelogs {
            broker,
            topics,
            partitions,
        }
    }

    fn all(&self) -> Owned {
        self.topics
            .iter()
            .flat_map(|t| (0..self.partitions).map(move |p| (t.clone(), p)))
            .collect()
    }

    /// The store warmstore keeps for a changelog.
    fn store_of(&self, topic: &str) -> &'static str {
        if *topic == self.topics[0] {
            "orders"
        } else {
            "totals"
        }
    }
}

/// One `warmstore run` process of the group, with its own state directory and port.
struct Member {
    instance: String,
    dir: PathBuf,
    addr: String,
    config: PathBuf,
    log: PathBuf,
    child: Option<Running>,
}

impl Member {
    fn new(
        root: &Path,
        changelogs: &Changelogs,
        group: &str,
        instance: &str,
        keep: &str,
    ) -> Member {
        Member::with(root, changelogs, group, instance, true, keep, 0)
    }

    /// A member that joins as a static member (`instance_id`) or a dynamic one (the name is then
    /// only the test's), and is ready within `ready_max_lag` records.
    fn with(
        root: &Path,
        changelogs: &Changelogs,
        group: &str,
        instance: &str,
        is_static: bool,
        keep: &str,
        ready_max_lag: u64,
    ) -> Member {
        let dir = root.join(instance);
        std::fs::create_dir_all(&dir).unwrap();
        let [orders, totals] = &changelogs.topics;
        let text = format!(
            "kafka:
  bootstrap.servers: {bootstrap}
  session.timeout.ms: {SESSION_TIMEOUT_MS}
state_dir: {state}
http:
  listen: 127.0.0.1:0
restore:
  commit_interval: 200ms
  ready_max_lag: {ready_max_lag}
assignment:
  mode: group
  group_id: {group}
{instance_line}  keep_unassigned: {keep}
stores:
  - name: orders
    changelog: {orders}
  - name: totals
    changelog: {totals}
",
            bootstrap = kafka().plaintext,
            state = dir.join("state").display(),
            instance_line = if is_static {
                format!("  instance_id: {instance}\n")
            } else {
                String::new()
            },
        );
        let config = dir.join("warmstore.yaml");
        std::fs::write(&config, text).unwrap();
        let log = dir.join("warmstore.log");
        Member {
            instance: instance.to_string(),
            dir,
            addr: String::new(),
            config,
            log,
            child: None,
        }
    }

    /// Starts the process on a port the system picks as it binds, and learns the port from the
    /// log: a port picked before the start could go to a client's connection meanwhile.
    fn start(&mut self) {
        let from = std::fs::metadata(&self.log).map_or(0, |m| m.len());
        let mut child = Running::warmstore_run(&self.config, &self.log);
        self.addr = child.served_address(&self.log, from);
        self.child = Some(child);
    }

    fn running(&self) -> bool {
        self.child.is_some()
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// SIGTERM, and the exit code once it has exited.
    fn stop(&mut self) -> Option<i32> {
        let child = self.child.take().expect("a running member");
        child.stop(Duration::from_secs(30))
    }

    fn ready(&self) -> bool {
        http_get(&self.addr, "/readyz").0 == 200
    }

    /// The changelog partitions the group assigned to this member, as `/stores` shows them.
    fn assigned(&self) -> Option<Owned> {
        let (code, body) = http_get(&self.addr, "/stores");
        if code != 200 {
            return None;
        }
        let stores: serde_json::Value = serde_json::from_str(&body).ok()?;
        let assigned = stores["group"]["assigned"].as_array()?;
        Some(
            assigned
                .iter()
                .map(|tp| {
                    let topic = tp[0].as_str().unwrap().to_string();
                    (topic, tp[1].as_i64().unwrap() as i32)
                })
                .collect(),
        )
    }

    /// One series of `/metrics`: its family's name and every label it has.
    fn metric(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let (_, body) = http_get(&self.addr, "/metrics");
        body.lines().find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (family, rest) = series.split_once('{').unwrap_or((series, "}"));
            let pairs: BTreeSet<&str> = rest
                .trim_end_matches('}')
                .split(',')
                .filter(|p| !p.is_empty())
                .collect();
            let wanted: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
            let matches = family == name
                && pairs.len() == wanted.len()
                && wanted.iter().all(|w| pairs.contains(w.as_str()));
            matches.then(|| value.parse().ok()).flatten()
        })
    }

    fn records_restored(&self, store: &str, topic: &str, partition: i32) -> Option<f64> {
        let partition = partition.to_string();
        self.metric(
            "warmstore_records_restored_total",
            &[
                ("store", store),
                ("topic", topic),
                ("partition", &partition),
            ],
        )
    }

    fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }

    /// Every store partition this member restores is at the end offset it last saw.
    fn caught_up(&self) -> bool {
        let (code, body) = http_get(&self.addr, "/stores");
        let Ok(stores) = serde_json::from_str::<serde_json::Value>(&body) else {
            return false;
        };
        let partitions = stores["partitions"].as_array().cloned().unwrap_or_default();
        code == 200
            && partitions
                .iter()
                .all(|p| p["state"] == "unassigned" || (p["state"] == "caught_up" && p["lag"] == 0))
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// What a test that timed out needs to see of this member: readiness, assignment, log tail.
    fn report(&self) -> String {
        let (ready, why) = http_get(&self.addr, "/readyz");
        let (_, stores) = http_get(&self.addr, "/stores");
        let log = self.log_text();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!(
            "--- {} on {}: /readyz {ready} {why}\n/stores {stores}\nlog:\n{}\n",
            self.instance,
            self.addr,
            tail.join("\n")
        )
    }
}

/// Every running member is ready, and their assignments split `all` between them exactly once.
fn settled(members: &[Member], all: &Owned) -> Option<BTreeMap<String, Owned>> {
    let mut owners = BTreeMap::new();
    for member in members.iter().filter(|m| m.running()) {
        if !member.ready() {
            return None;
        }
        owners.insert(member.instance.clone(), member.assigned()?);
    }
    let total: usize = owners.values().map(BTreeSet::len).sum();
    let union: Owned = owners.values().flatten().cloned().collect();
    (total == all.len() && union == *all).then_some(owners)
}

fn wait_settled(members: &[Member], all: &Owned) -> BTreeMap<String, Owned> {
    poll_until(SETTLE, || settled(members, all)).unwrap_or_else(|| {
        let report: String = members
            .iter()
            .filter(|m| m.running())
            .map(Member::report)
            .collect();
        panic!("the group did not settle within {SETTLE:?}\n{report}");
    })
}

/// Partition p of one changelog is owned where partition p of the other is.
fn assert_co_partitioned(owners: &BTreeMap<String, Owned>, changelogs: &Changelogs) {
    for (instance, owned) in owners {
        let of = |topic: &String| -> BTreeSet<i32> {
            owned
                .iter()
                .filter(|(t, _)| t == topic)
                .map(|(_, p)| *p)
                .collect()
        };
        let [orders, totals] = &changelogs.topics;
        assert_eq!(of(orders), of(totals), "{instance} owns {owned:?}");
    }
}

/// After a clean stop, each member's stores of what it owned equal the model.
fn assert_stores_equal_the_model(
    members: &[Member],
    owners: &BTreeMap<String, Owned>,
    changelogs: &Changelogs,
) {
    for member in members {
        for (topic, partition) in owners.get(&member.instance).into_iter().flatten() {
            let store = changelogs.store_of(topic);
            let (applied, data) = read_store(&member.state_dir(), store, topic, *partition);
            assert_eq!(
                applied,
                Some(RECORDS as i64 - 1),
                "{} {store}-{partition}",
                member.instance
            );
            assert_eq!(
                data,
                changelogs.broker.model(topic, *partition, 0),
                "{} {store}-{partition}",
                member.instance
            );
        }
    }
}

fn members(
    root: &Path,
    changelogs: &Changelogs,
    group: &str,
    count: usize,
    keep: &str,
) -> Vec<Member> {
    (0..count)
        .map(|i| Member::new(root, changelogs, group, &format!("pod-{i}"), keep))
        .collect()
}

#[test]
fn three_processes_share_two_changelogs_partition_by_partition() {
    let changelogs = Changelogs::new("share");
    let root = tempfile::tempdir().unwrap();
    let mut members = members(root.path(), &changelogs, "share-standby", 3, "10m");
    for member in &mut members {
        member.start();
    }
    let owners = wait_settled(&members, &changelogs.all());
    for (instance, owned) in &owners {
        assert_eq!(owned.len(), 8, "{instance} owns {owned:?}");
    }
    assert_co_partitioned(&owners, &changelogs);
    for member in &members {
        assert_eq!(
            member.metric("warmstore_assigned_partitions", &[]),
            Some(8.0),
            "{}",
            member.instance
        );
        assert!(member.metric("warmstore_rebalances_total", &[("kind", "assign")]) >= Some(1.0));
        // What the unowned-partitions alert sums and compares.
        assert_eq!(
            member.metric("warmstore_group_assigned_partitions", &[]),
            Some(8.0)
        );
        assert_eq!(
            member.metric("warmstore_group_changelog_partitions", &[]),
            Some(24.0)
        );
    }
    for member in &mut members {
        assert_eq!(member.stop(), Some(0), "{}", member.log_text());
    }
    assert_stores_equal_the_model(&members, &owners, &changelogs);
}

/// With 12 partitions and 3 processes, round robin and sticky assignors happen to keep partition p
/// of both changelogs together as well; with 10 they do not.
#[test]
fn co_partitioned_changelogs_stay_together_when_the_processes_do_not_divide_them() {
    let changelogs = Changelogs::with_partitions("uneven", 10);
    let root = tempfile::tempdir().unwrap();
    let mut members = members(root.path(), &changelogs, "uneven-standby", 3, "10m");
    for member in &mut members {
        member.start();
    }
    let owners = wait_settled(&members, &changelogs.all());
    assert_co_partitioned(&owners, &changelogs);
    for member in &mut members {
        assert_eq!(member.stop(), Some(0), "{}", member.log_text());
    }
    assert_stores_equal_the_model(&members, &owners, &changelogs);
}

#[test]
fn a_killed_member_is_replaced_after_the_session_timeout_and_a_quick_restart_moves_nothing() {
    let changelogs = Changelogs::new("failover");
    let root = tempfile::tempdir().unwrap();
    let mut members = members(root.path(), &changelogs, "failover-standby", 3, "10m");
    for member in &mut members {
        member.start();
    }
    let all = changelogs.all();
    let before = wait_settled(&members, &all);
    let revokes = |m: &Member| m.metric("warmstore_rebalances_total", &[("kind", "revoke")]);
    let seen: Vec<_> = members.iter().map(revokes).collect();

    // A restart inside the session timeout: the static member takes its place again, and nobody
    // else notices.
    members[2].kill();
    members[2].start();
    let after = wait_settled(&members, &all);
    assert_eq!(after, before);
    for (member, seen) in members.iter().zip(&seen).take(2) {
        assert_eq!(revokes(member), *seen, "{} rebalanced", member.instance);
    }
    // It resumed its own stores: flushed at the end of the first catch-up, they read nothing again.
    for (topic, partition) in &before["pod-2"] {
        let store = changelogs.store_of(topic);
        assert_eq!(
            members[2].records_restored(store, topic, *partition),
            Some(0.0),
            "{store}-{partition}: {}",
            members[2].log_text()
        );
    }

    // Killed for good: its partitions move to the others once the session times out.
    members[2].kill();
    let moved = wait_settled(&members, &all);
    assert_eq!(moved.len(), 2);
    assert_co_partitioned(&moved, &changelogs);
    for member in members.iter_mut().take(2) {
        assert_eq!(member.stop(), Some(0), "{}", member.log_text());
    }
    assert_stores_equal_the_model(&members, &moved, &changelogs);
}

#[test]
fn a_partition_handed_back_resumes_from_its_kept_store() {
    let changelogs = Changelogs::new("scale");
    let root = tempfile::tempdir().unwrap();
    let mut members = members(root.path(), &changelogs, "scale-standby", 4, "1h");
    for member in members.iter_mut().take(3) {
        member.start();
    }
    let all = changelogs.all();
    let three = wait_settled(&members, &all);
    let restored = |m: &Member, owned: &Owned| -> f64 {
        owned
            .iter()
            .map(|(t, p)| m.records_restored(changelogs.store_of(t), t, *p).unwrap())
            .sum()
    };
    let first: Vec<f64> = members
        .iter()
        .take(3)
        .map(|m| restored(m, &three[&m.instance]))
        .collect();

    // Scale to 4: every process gives up some partitions, and keeps their stores.
    members[3].start();
    let four = wait_settled(&members, &all);
    assert_co_partitioned(&four, &changelogs);
    // Range moves half the partitions when a fourth process joins three (docs/group.md).
    let owner = |owners: &BTreeMap<String, Owned>, tp: &(String, i32)| {
        owners
            .iter()
            .find(|(_, o)| o.contains(tp))
            .map(|(i, _)| i.clone())
    };
    let moved = all
        .iter()
        .filter(|tp| owner(&three, tp) != owner(&four, tp))
        .count();
    assert_eq!(moved, 12, "{three:?} then {four:?}");
    let given_up: Vec<(String, i32)> = three["pod-0"].difference(&four["pod-0"]).cloned().collect();
    assert!(!given_up.is_empty(), "{three:?} then {four:?}");
    for (topic, partition) in &given_up {
        let db = members[0]
            .state_dir()
            .join(changelogs.store_of(topic))
            .join(partition.to_string());
        assert!(db.exists(), "{} was deleted too soon", db.display());
    }

    // Back to 3: the partitions come back to their kept stores, which read nothing again.
    assert_eq!(members[3].stop(), Some(0), "{}", members[3].log_text());
    let back = wait_settled(&members, &all);
    assert_eq!(back, three);
    for (i, member) in members.iter().enumerate().take(3) {
        assert_eq!(
            restored(member, &three[&member.instance]),
            first[i],
            "{} read records again: {}",
            member.instance,
            member.log_text()
        );
    }
    for member in members.iter_mut().take(3) {
        assert_eq!(member.stop(), Some(0), "{}", member.log_text());
    }
    assert_stores_equal_the_model(&members, &back, &changelogs);
}

#[test]
fn a_store_revoked_longer_than_keep_unassigned_is_deleted_with_its_series() {
    let changelogs = Changelogs::new("expiry");
    let root = tempfile::tempdir().unwrap();
    let mut members = members(root.path(), &changelogs, "expiry-standby", 2, "2s");
    members[0].start();
    let all = changelogs.all();
    wait_settled(&members, &all);
    members[1].start();
    let two = wait_settled(&members, &all);
    let gone: Vec<&(String, i32)> = two["pod-1"].iter().collect();
    assert_eq!(gone.len(), 12);
    let db = |(topic, partition): &(String, i32)| {
        members[0]
            .state_dir()
            .join(changelogs.store_of(topic))
            .join(partition.to_string())
    };
    wait_until("revoked stores deleted", Duration::from_secs(60), || {
        gone.iter().all(|tp| !db(tp).exists())
    });
    for (topic, partition) in &gone {
        assert_eq!(
            members[0].records_restored(changelogs.store_of(topic), topic, *partition),
            None,
            "{topic}-{partition} still has series"
        );
    }
    for (topic, partition) in &two["pod-0"] {
        assert!(db(&(topic.clone(), *partition)).exists());
    }
    let text = members[0].log_text();
    assert!(text.contains("deleted a store revoked"), "{text}");
    for member in &mut members {
        assert_eq!(member.stop(), Some(0), "{}", member.log_text());
    }
}

/// Every store on a member's disk, owned, kept or left by a kill, holds exactly the records of its
/// changelog up to its applied offset: last write wins, tombstones delete.
fn assert_every_store_is_a_prefix(
    member: &Member,
    changelogs: &Changelogs,
    logs: &[Vec<Vec<Record>>; 2],
) {
    for (topic, log) in changelogs.topics.iter().zip(logs) {
        let store = changelogs.store_of(topic);
        for partition in 0..changelogs.partitions {
            let db = StorePaths::new(&member.state_dir(), store, partition).db;
            // A kill can land while RocksDB creates a store, before its `CURRENT` file or before
            // its column families: nothing was ever committed there, so it holds the empty
            // prefix, and the next start rebuilds it.
            let families = rocksdb::DB::list_cf(&rocksdb::Options::default(), &db);
            if !families.is_ok_and(|f| f.iter().any(|name| name == "offsets")) {
                continue;
            }
            let (applied, data) = read_store(&member.state_dir(), store, topic, partition);
            let taken = applied.map_or(0, |a| a as usize + 1);
            let records = &log[partition as usize];
            assert!(
                taken <= records.len(),
                "{} {store}-{partition}",
                member.instance
            );
            assert_eq!(
                data,
                fold(records[..taken].iter()),
                "{} {store}-{partition} at {applied:?}",
                member.instance
            );
        }
    }
}

#[test]
fn a_rebalance_storm_while_a_producer_writes_loses_nothing() {
    const TOPICS: [&str; 2] = ["storm-orders", "storm-totals"];
    let changelogs = Changelogs::produced("storm", PARTITIONS, 0);
    assert_eq!(changelogs.topics, TOPICS.map(str::to_string));
    let stop = Arc::new(AtomicBool::new(false));
    let producers = TOPICS.map(|topic| {
        producer(
            kafka().plaintext.clone(),
            topic,
            PARTITIONS,
            500,
            7,
            stop.clone(),
        )
    });
    let root = tempfile::tempdir().unwrap();
    let member = |name: &str, is_static: bool| {
        Member::with(
            root.path(),
            &changelogs,
            "storm-standby",
            name,
            is_static,
            "10m",
            1_000_000,
        )
    };
    let mut members: Vec<Member> = (0..3).map(|i| member(&format!("pod-{i}"), true)).collect();
    // Dynamic members leave the group as soon as they stop, so each toggle is a rebalance.
    members.extend((0..2).map(|i| member(&format!("extra-{i}"), false)));
    for member in members.iter_mut().take(3) {
        member.start();
    }
    let all = changelogs.all();
    wait_settled(&members, &all);
    for round in 0..20 {
        let extra = 3 + (round / 2) % 2;
        if round % 2 == 0 {
            members[extra].start();
        } else if round % 4 == 3 {
            members[extra].kill();
        } else {
            assert_eq!(
                members[extra].stop(),
                Some(0),
                "{}",
                members[extra].log_text()
            );
        }
        std::thread::sleep(Duration::from_millis(1500));
    }
    stop.store(true, Relaxed);
    let logs = producers.map(|p| p.join().unwrap());
    let owners = wait_settled(&members, &all);
    assert_eq!(owners.len(), 3);
    assert_co_partitioned(&owners, &changelogs);
    wait_until("every owned store caught up", SETTLE, || {
        members
            .iter()
            .filter(|m| m.running())
            .all(Member::caught_up)
    });
    for member in members.iter_mut().filter(|m| m.running()) {
        assert_eq!(member.stop(), Some(0), "{}", member.log_text());
    }
    for member in &members {
        assert_every_store_is_a_prefix(member, &changelogs, &logs);
    }
    for (instance, owned) in &owners {
        let member = members.iter().find(|m| m.instance == *instance).unwrap();
        for (topic, partition) in owned {
            let index = changelogs.topics.iter().position(|t| t == topic).unwrap();
            let produced = logs[index][*partition as usize].len() as i64;
            let (applied, _) = read_store(
                &member.state_dir(),
                changelogs.store_of(topic),
                topic,
                *partition,
            );
            assert_eq!(
                applied,
                Some(produced - 1),
                "{instance} {topic}-{partition}"
            );
        }
    }
}

/// A changelog missing when the member starts (not created yet, or its name mistyped): the group
/// assigns none of its partitions, so the member was ready without that store and nothing but one
/// log line said so. Its store shows failed in `/readyz`, naming the topic, as in `all` mode; once
/// the topic is created its partitions are assigned and restored.
#[test]
fn a_missing_changelog_fails_its_store_until_it_is_created() {
    let mut broker = Broker::real(&[]);
    let topics = ["late-orders".to_string(), "late-totals".to_string()];
    broker.create_topic(&topics[0], 2);
    broker.produce_changelog(&topics[0], 2, RECORDS, 1);
    let mut changelogs = Changelogs {
        broker,
        topics,
        partitions: 2,
    };
    let root = tempfile::tempdir().unwrap();
    let mut member = Member::new(root.path(), &changelogs, "late-standby", "pod-0", "10m");
    member.start();
    wait_until("/readyz naming the missing changelog", SETTLE, || {
        let (code, body) = http_get(&member.addr, "/readyz");
        code == 503 && body.contains("failed: topic late-totals")
    });
    let late = changelogs.topics[1].clone();
    changelogs.broker.create_topic(&late, 2);
    changelogs.broker.produce_changelog(&late, 2, RECORDS, 2);
    let mut members = [member];
    let owners = wait_settled(&members, &changelogs.all());
    assert_eq!(members[0].stop(), Some(0));
    assert_stores_equal_the_model(&members, &owners, &changelogs);
}

/// Two processes given one instance id (a copied `WARMSTORE_INSTANCE_ID`, say): when the second
/// joins, the group fences the first, and librdkafka ends its member for good. The first went on
/// tailing every partition and answering ready, out of the group for ever, with only a log line
/// saying so. It now closes its stores (kept, as on a revoke) and answers 503 saying why; the
/// second owns everything.
#[test]
fn a_member_fenced_by_another_with_its_instance_id_lets_go_and_says_so() {
    let changelogs = Changelogs::with_partitions("fenced", 2);
    let all = changelogs.all();
    let (first_root, second_root) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut first = Member::new(
        first_root.path(),
        &changelogs,
        "fenced-standby",
        "pod-0",
        "10m",
    );
    first.start();
    let mut members = vec![first];
    wait_settled(&members, &all);
    let mut second = Member::new(
        second_root.path(),
        &changelogs,
        "fenced-standby",
        "pod-0",
        "10m",
    );
    second.start();
    let first = &members[0];
    wait_until("the fenced member's /readyz saying why", SETTLE, || {
        let (code, body) = http_get(&first.addr, "/readyz");
        code == 503 && body.contains("out of consumer group fenced-standby")
    });
    let (_, stores) = http_get(&first.addr, "/stores");
    let stores: serde_json::Value = serde_json::from_str(&stores).unwrap();
    let states: Vec<&str> = stores["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["unassigned"; 4], "{}", first.report());
    assert!(
        first.metric("warmstore_rebalances_total", &[("kind", "error")]) >= Some(1.0),
        "{}",
        first.report()
    );
    let mut fenced = members.remove(0);
    members.push(second);
    let owners = wait_settled(&members, &all);
    assert_eq!(fenced.stop(), Some(0), "{}", fenced.log_text());
    assert_eq!(members[0].stop(), Some(0), "{}", members[0].log_text());
    assert_stores_equal_the_model(&members, &owners, &changelogs);
    // The fenced member's stores were closed cleanly and hold what they had restored.
    for (topic, partition) in &all {
        let store = changelogs.store_of(topic);
        let (applied, data) = read_store(&fenced.state_dir(), store, topic, *partition);
        assert_eq!(applied, Some(RECORDS as i64 - 1), "{store}-{partition}");
        assert_eq!(data, changelogs.broker.model(topic, *partition, 0));
    }
}
