//! Group mode: the store partitions this process owns are the ones the consumer group assigns it.
//! An assigned partition is started as in `all` mode (opened under the dirty rules, restored,
//! tailed); a revoked one is committed, flushed and closed before the rebalance callback returns,
//! then kept on disk for `keep_unassigned` so that it resumes if it comes back, and deleted after.

use rdkafka::error::KafkaError;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::tasks::{blocking, Stop};
use super::{EngineError, Launcher, Running};
use crate::config::{Config, GroupConfig, StoreConfig};
use crate::kafka::consumers::ChangelogConsumer;
use crate::kafka::group::{self, Rebalance, MEMBER_POLL};
use crate::observe::group::GroupView;
use crate::observe::status::{Board, PartitionState};
use crate::store::StorePaths;

/// A store partition: the store's index in the config, and the partition.
type StoreKey = (usize, i32);

/// What a set of assigned changelog partitions means for the configured stores.
#[derive(Debug, Default, PartialEq)]
struct Placement {
    /// Store partitions to own.
    own: Vec<StoreKey>,
    /// Assigned, but every store of that changelog lists partitions without this one.
    excluded: Vec<(String, i32)>,
}

/// Every store of an assigned changelog partition is owned, unless its `partitions:` leaves it out.
fn place(stores: &[StoreConfig], assigned: &[(String, i32)]) -> Placement {
    let mut placement = Placement::default();
    for (topic, partition) in assigned {
        let mut taken = false;
        for (index, store) in stores.iter().enumerate() {
            let listed = store
                .partitions
                .as_ref()
                .is_none_or(|p| p.contains(partition));
            if store.changelog == *topic && listed {
                placement.own.push((index, *partition));
                taken = true;
            }
        }
        if !taken {
            placement.excluded.push((topic.clone(), *partition));
        }
    }
    placement
}

/// The store partitions of these changelog partitions, among `owned`.
fn of_changelogs<'a>(
    stores: &[StoreConfig],
    owned: impl Iterator<Item = &'a StoreKey>,
    revoked: &[(String, i32)],
) -> Vec<StoreKey> {
    owned
        .filter(|(index, partition)| {
            revoked
                .iter()
                .any(|(topic, p)| stores[*index].changelog == *topic && p == partition)
        })
        .copied()
        .collect()
}

/// The kept stores whose time is up.
fn expired(kept: &BTreeMap<StoreKey, Instant>, now: Instant, keep: Duration) -> Vec<StoreKey> {
    kept.iter()
        .filter(|(_, since)| now.saturating_duration_since(**since) >= keep)
        .map(|(key, _)| *key)
        .collect()
}

struct Ownership {
    launcher: Launcher,
    keep_unassigned: Duration,
    owned: Mutex<Owned>,
}

#[derive(Default)]
struct Owned {
    running: BTreeMap<StoreKey, Running>,
    /// Revoked stores still on disk, and since when.
    kept: BTreeMap<StoreKey, Instant>,
}

impl Ownership {
    fn stores(&self) -> &[StoreConfig] {
        &self.launcher.config.stores
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Owned> {
        self.owned.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn paths(&self, (index, partition): StoreKey) -> StorePaths {
        let store = &self.stores()[index];
        StorePaths::for_layout(
            &self.launcher.config.state_dir,
            &store.layout,
            &store.name,
            partition,
        )
    }

    /// Deletes the revoked stores kept longer than `keep_unassigned`, and their series.
    fn delete_expired(&self, now: Instant) {
        let mut owned = self.lock();
        for key in expired(&owned.kept, now, self.keep_unassigned) {
            let store = &self.stores()[key.0].name;
            match crate::store::delete(&self.paths(key)) {
                Ok(()) => {
                    owned.kept.remove(&key);
                    self.launcher.board.remove(store, key.1);
                    tracing::info!(
                        store,
                        partition = key.1,
                        keep_unassigned_s = self.keep_unassigned.as_secs(),
                        "deleted a store revoked longer than keep_unassigned ago"
                    );
                }
                Err(error) => {
                    // Tried again after another `keep_unassigned`.
                    owned.kept.insert(key, now);
                    tracing::warn!(store, partition = key.1, %error, "cannot delete a revoked store");
                }
            }
        }
    }

    /// librdkafka ended the member for good: a fatal error, which for a consumer means another
    /// process joined with this one's instance id and the group fenced this one. No revoke comes,
    /// and the group has handed the partitions to the other process, so every store is closed and
    /// kept here as on a revoke. The member does not join again: with the same instance id it
    /// would fence the other process in turn. Only a restart joins again.
    fn ended(&self, error: String) {
        tracing::error!(%error, "the consumer group ended this member; its stores are closed and kept, and it joins again only when the process restarts (is another process using the same instance_id?)");
        let owned: Vec<(String, i32)> = self
            .lock()
            .running
            .keys()
            .map(|&(index, partition)| (self.stores()[index].changelog.clone(), partition))
            .collect();
        self.revoked(&owned);
        self.launcher.board.with_group(|g| g.ended(error));
    }
}

impl Rebalance for Ownership {
    fn assigned(&self, partitions: &[(String, i32)]) {
        let placement = place(self.stores(), partitions);
        for (topic, partition) in &placement.excluded {
            tracing::warn!(%topic, partition, "the group assigned this partition, but the stores' `partitions:` leave it out; nobody restores it");
        }
        let mut owned = self.lock();
        for key in &placement.own {
            if owned.running.contains_key(key) {
                continue;
            }
            owned.kept.remove(key);
            let running = self.launcher.start(&self.stores()[key.0], key.1);
            owned.running.insert(*key, running);
        }
        tracing::info!(
            assigned = partitions.len(),
            store_partitions = owned.running.len(),
            "the consumer group assigned partitions"
        );
        self.launcher
            .board
            .with_group(|g| g.assigned(partitions.to_vec()));
        drop(owned);
        self.launcher.check_descriptors();
    }

    fn revoked(&self, partitions: &[(String, i32)]) {
        let started = Instant::now();
        let mut owned = self.lock();
        let keys = of_changelogs(self.stores(), owned.running.keys(), partitions);
        let closing: Vec<(StoreKey, Running)> = keys
            .iter()
            .filter_map(|key| owned.running.remove(key).map(|r| (*key, r)))
            .collect();
        // Every one is asked first, so they close side by side.
        for (_, running) in &closing {
            running.stop.request();
        }
        for (key, running) in closing {
            running.close();
            let store = &self.stores()[key.0].name;
            if let Some(status) = self.launcher.board.find(store, key.1) {
                status.set_state(PartitionState::Unassigned, None);
            }
            owned.kept.insert(key, Instant::now());
        }
        tracing::info!(
            revoked = partitions.len(),
            store_partitions = keys.len(),
            closed_in_ms = started.elapsed().as_millis() as u64,
            "the consumer group revoked partitions; their stores are closed and kept"
        );
        self.launcher.board.with_group(|g| g.revoked());
    }

    fn failed(&self, error: String) {
        tracing::warn!(%error, "the consumer group could not rebalance; librdkafka retries");
        self.launcher.board.with_group(|g| g.failed(error));
    }
}

/// Every partition of the subscribed changelogs: what the members of the group should own between
/// them. A partition that nobody owns shows on no member, so each member exports this count and an
/// alert compares it with the sum of what the members were assigned. `None` if a changelog cannot
/// be listed. Such a changelog is shown as the failure of each store reading it, as in `all`
/// mode: the group assigns only partitions that exist, so a store whose changelog is missing (a
/// typo, a topic not created yet, or deleted) would otherwise be on no member, and each ready.
fn count_changelog_partitions(
    consumer: &ChangelogConsumer,
    changelogs: &[String],
    stores: &[StoreConfig],
    board: &Board,
) -> Option<usize> {
    let mut total = Some(0);
    for topic in changelogs {
        let listed = crate::kafka::consumers::partitions_of(consumer, topic);
        total = match (total, &listed) {
            (Some(total), Ok(partitions)) => Some(total + partitions.len()),
            _ => None,
        };
        let error = match listed {
            Ok(_) => None,
            Err(e) if e.answered() => Some(e.to_string()),
            // A request that failed on the way says nothing about the topic (an outage shows on
            // its own): what is shown stays as it was.
            Err(_) => continue,
        };
        for store in stores.iter().filter(|s| &s.changelog == topic) {
            let shown = board.store_errors().remove(&store.name);
            if error.is_some() && shown != error {
                tracing::warn!(store = %store.name, topic, error = error.as_deref(),
                    "the store's changelog cannot be listed; the group assigns none of its partitions");
            }
            board.set_store_error(&store.name, error.clone());
        }
    }
    total
}

/// Counts the changelogs' partitions (`count_changelog_partitions`) every
/// `LIST_PARTITIONS_EVERY`, as a task of the engine beside the member, the way `all` mode lists its
/// changelogs again: neither the member's polls nor a stop wait for it. In an outage each listing
/// takes its whole timeout (10 s), and a member of 10 changelogs that counted on its own thread
/// took 96 s to stop. It lists through the engine's tailing consumer.
async fn census(launcher: Launcher, changelogs: Arc<[String]>) {
    let stop = launcher.stop.clone();
    loop {
        let (consumer, board) = (launcher.tailing.clone(), launcher.board.clone());
        let (stores, topics) = (launcher.config.stores.clone(), changelogs.clone());
        let count =
            blocking(move || count_changelog_partitions(&consumer, &topics, &stores, &board));
        match stop.unless_requested(count).await {
            None => return,
            Some(Some(total)) => launcher
                .board
                .with_group(|g| g.changelog_partitions = Some(total)),
            Some(None) => {}
        }
        if stop.sleep(super::LIST_PARTITIONS_EVERY).await {
            return;
        }
    }
}

/// Joins the group and starts the thread that serves the member: rebalances, and the deletion of
/// stores revoked longer than `keep_unassigned` ago. The thread ends once `stop` is requested,
/// after closing the member (a static member leaves no gap: the group waits for it to return).
pub(super) fn join(
    config: &Config,
    group: &GroupConfig,
    launcher: Launcher,
    stop: Stop,
) -> Result<std::thread::JoinHandle<()>, EngineError> {
    let board = launcher.board.clone();
    board.join_group(GroupView::new(
        &group.group_id,
        group.instance_id.as_deref(),
    ));
    let ownership = Arc::new(Ownership {
        launcher,
        keep_unassigned: group.keep_unassigned,
        owned: Mutex::default(),
    });
    let mut changelogs: Vec<String> = config.stores.iter().map(|s| s.changelog.clone()).collect();
    changelogs.sort_unstable();
    changelogs.dedup();
    let names: Vec<&str> = changelogs.iter().map(String::as_str).collect();
    let member = group::join(&config.kafka, group, &names, ownership.clone())?;
    tracing::info!(group_id = %group.group_id, instance_id = group.instance_id.as_deref().unwrap_or("(dynamic)"),
        changelogs = changelogs.len(), "joining the consumer group");
    let launcher = ownership.launcher.clone();
    launcher.tasks.spawn(
        "changelog census".into(),
        census(launcher.clone(), changelogs.into()),
    );
    std::thread::Builder::new()
        .name("group-member".into())
        .spawn(move || {
            let mut ended = false;
            while !stop.is_requested() {
                if ended {
                    // Kept stores still expire.
                    std::thread::sleep(MEMBER_POLL);
                    ownership.delete_expired(Instant::now());
                    continue;
                }
                match member.poll(MEMBER_POLL) {
                    Some(Err(error @ KafkaError::MessageConsumptionFatal(_))) => {
                        ownership.ended(error.to_string());
                        ended = true;
                    }
                    Some(Err(error)) => {
                        tracing::warn!(%error, "consumer group member");
                        let refused = group::refused(&error);
                        board.with_group(|g| g.member_error(error.to_string(), refused));
                    }
                    _ => {}
                }
                ownership.delete_expired(Instant::now());
            }
            drop(member);
        })
        .map_err(EngineError::MemberThread)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stores() -> Vec<StoreConfig> {
        vec![
            StoreConfig::new("counts", "counts-changelog", None),
            StoreConfig::new("totals", "totals-changelog", Some(vec![0, 1])),
            StoreConfig::new("mirror", "counts-changelog", Some(vec![1])),
        ]
    }

    fn tp(topic: &str, partition: i32) -> (String, i32) {
        (topic.to_string(), partition)
    }

    #[test]
    fn every_store_of_an_assigned_changelog_is_owned_unless_it_lists_others() {
        let placement = place(
            &stores(),
            &[
                tp("counts-changelog", 1),
                tp("counts-changelog", 2),
                tp("totals-changelog", 0),
                tp("totals-changelog", 2),
            ],
        );
        assert_eq!(
            placement,
            Placement {
                own: vec![(0, 1), (2, 1), (0, 2), (1, 0)],
                excluded: vec![tp("totals-changelog", 2)],
            }
        );
        assert_eq!(place(&stores(), &[]), Placement::default());
    }

    #[test]
    fn a_revoked_changelog_partition_closes_each_of_its_stores_only() {
        let owned = [(0, 1), (2, 1), (0, 2), (1, 1)];
        assert_eq!(
            of_changelogs(&stores(), owned.iter(), &[tp("counts-changelog", 1)]),
            vec![(0, 1), (2, 1)]
        );
        assert_eq!(
            of_changelogs(&stores(), owned.iter(), &[tp("other", 1)]),
            Vec::<StoreKey>::new()
        );
    }

    #[test]
    fn a_kept_store_expires_after_keep_unassigned() {
        let now = Instant::now();
        let keep = Duration::from_secs(600);
        let kept = BTreeMap::from([
            ((0, 1), now - Duration::from_secs(601)),
            ((0, 2), now - Duration::from_secs(599)),
            ((1, 0), now - keep),
        ]);
        assert_eq!(expired(&kept, now, keep), vec![(0, 1), (1, 0)]);
        assert!(expired(&kept, now, Duration::from_secs(3600)).is_empty());
    }
}
