//! The readiness rule: when `/readyz` says 200, and why not otherwise. A process is ready when every
//! store partition it holds is within `ready_max_lag` records of the end and every configured store
//! knows its partitions; `warmstore restore` reads the same answer to decide when to exit, and
//! gives up on a partition that failed rather than wait for a retry an init container cannot see.

use serde::Serialize;

use super::status::{Board, PartitionSnapshot, PartitionState};

/// One partition (or store) that keeps `/readyz` at 503, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NotReady {
    pub store: String,
    pub topic: Option<String>,
    pub partition: Option<i32>,
    pub reason: String,
    /// In state `failed` (as opposed to on its way): `warmstore restore` gives up on it.
    #[serde(skip)]
    pub failed: bool,
}

/// `/readyz`'s answer: ready when every assigned partition is within `ready_max_lag` records.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Readiness {
    pub ready: bool,
    pub not_ready: Vec<NotReady>,
    /// Why a ready process holds nothing, when it does (group mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Why one partition is not ready, from its state and lag; `None` when it is ready.
pub fn not_ready_reason(snapshot: &PartitionSnapshot, ready_max_lag: u64) -> Option<String> {
    match snapshot.state {
        PartitionState::Failed => Some(format!(
            "failed: {}",
            snapshot.error.as_deref().unwrap_or("unknown error")
        )),
        PartitionState::Wiping => Some("wiping: the store is being rebuilt".into()),
        PartitionState::Opening => {
            Some("opening: reading the store and the changelog's offsets".into())
        }
        PartitionState::Unassigned => None,
        PartitionState::Restoring | PartitionState::CaughtUp => match snapshot.lag {
            None => Some("restoring: end offset not known yet".into()),
            Some(lag) if snapshot.waiting && lag as u64 > ready_max_lag => Some(format!(
                "waiting for its turn (catch_up_turns): lag {lag} records"
            )),
            Some(lag) if lag as u64 > ready_max_lag => Some(format!(
                "restoring: lag {lag} records (ready at {ready_max_lag} or fewer)"
            )),
            Some(_) => None,
        },
    }
}

impl Board {
    pub fn readiness(&self, ready_max_lag: u64) -> Readiness {
        let mut not_ready: Vec<NotReady> = self
            .store_errors()
            .into_iter()
            .map(|(store, error)| NotReady {
                store,
                topic: None,
                partition: None,
                reason: format!("failed: {error}"),
                failed: true,
            })
            .collect();
        for store in self.unresolved_stores() {
            if !not_ready.iter().any(|n| n.store == store) {
                not_ready.push(NotReady {
                    store,
                    topic: None,
                    partition: None,
                    reason: "starting: asking Kafka for the changelog's partitions".into(),
                    failed: false,
                });
            }
        }
        let group = self.group();
        if let Some(group) = &group {
            if let Some(reason) = group.not_ready_reason() {
                not_ready.push(NotReady {
                    store: String::new(),
                    topic: None,
                    partition: None,
                    reason,
                    failed: group.stuck(),
                });
            }
        }
        let partitions = self.partitions();
        for status in &partitions {
            let snapshot = status.snapshot();
            if let Some(reason) = not_ready_reason(&snapshot, ready_max_lag) {
                not_ready.push(NotReady {
                    failed: snapshot.state == PartitionState::Failed,
                    store: snapshot.store,
                    topic: Some(snapshot.topic),
                    partition: Some(snapshot.partition),
                    reason,
                });
            }
        }
        if partitions.is_empty() && not_ready.is_empty() && group.is_none() {
            not_ready.push(NotReady {
                store: String::new(),
                topic: None,
                partition: None,
                reason: "starting: no store partition assigned yet".into(),
                failed: false,
            });
        }
        let ready = not_ready.is_empty();
        let owns_none = partitions
            .iter()
            .all(|p| p.state() == PartitionState::Unassigned);
        Readiness {
            ready,
            not_ready,
            note: group
                .filter(|_| ready && owns_none)
                .and_then(|g| g.idle_note()),
        }
    }
}

/// Where a one-shot restore (`warmstore restore`) stands.
#[derive(Debug, Clone, PartialEq)]
pub enum WarmUp {
    /// Every store partition is within `ready_max_lag`: close and exit.
    Warm,
    /// Still restoring, opening or starting.
    Restoring,
    /// These are `failed`: an init container exits non-zero rather than hide a failure behind
    /// a retry the application cannot see.
    Failed(Vec<NotReady>),
}

impl Readiness {
    pub fn warm_up(&self) -> WarmUp {
        let failed: Vec<NotReady> = self
            .not_ready
            .iter()
            .filter(|n| n.failed)
            .cloned()
            .collect();
        if !failed.is_empty() {
            WarmUp::Failed(failed)
        } else if self.ready {
            WarmUp::Warm
        } else {
            WarmUp::Restoring
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::status::PartitionStatus;
    use std::path::PathBuf;
    use std::sync::atomic::Ordering::Relaxed;
    use std::sync::Arc;

    fn snapshot(state: PartitionState, lag: Option<i64>) -> PartitionSnapshot {
        let status = PartitionStatus::new("s", "t", 0, PathBuf::from("/x"));
        status.set_state(
            state,
            (state == PartitionState::Failed).then(|| "broker down".to_string()),
        );
        let mut s = status.snapshot();
        s.lag = lag;
        s
    }

    #[test]
    fn readiness_follows_state_and_lag() {
        assert_eq!(
            not_ready_reason(&snapshot(PartitionState::CaughtUp, Some(0)), 10),
            None
        );
        assert_eq!(
            not_ready_reason(&snapshot(PartitionState::Restoring, Some(10)), 10),
            None
        );
        let r = not_ready_reason(&snapshot(PartitionState::Restoring, Some(11)), 10).unwrap();
        assert!(r.contains("lag 11"), "{r}");
        let r = not_ready_reason(&snapshot(PartitionState::Failed, Some(0)), 10).unwrap();
        assert!(r.contains("broker down"), "{r}");
        assert!(not_ready_reason(&snapshot(PartitionState::Wiping, Some(0)), 10).is_some());
        assert!(not_ready_reason(&snapshot(PartitionState::Restoring, None), 10).is_some());
        let mut waiting = snapshot(PartitionState::Restoring, Some(11));
        waiting.waiting = true;
        let r = not_ready_reason(&waiting, 10).unwrap();
        assert!(
            r.contains("waiting for its turn") && r.contains("lag 11"),
            "{r}"
        );
    }

    #[test]
    fn an_empty_board_or_a_failed_store_is_not_ready() {
        let board = Board::default();
        assert!(!board.readiness(10).ready);
        caught_up(&board, "s");
        assert!(board.readiness(10).ready);
        board.set_store_error("other", Some("topic missing not found".into()));
        let r = board.readiness(10);
        assert!(!r.ready);
        assert_eq!(r.not_ready[0].store, "other");
    }

    fn caught_up(board: &Board, store: &str) -> Arc<PartitionStatus> {
        let status = Arc::new(PartitionStatus::new(store, "t", 0, PathBuf::from("/x")));
        status.position.store(5, Relaxed);
        status.end_offset.store(5, Relaxed);
        status.set_state(PartitionState::CaughtUp, None);
        board.add(status.clone());
        status
    }

    #[test]
    fn a_store_whose_partitions_are_not_known_yet_keeps_the_process_unready() {
        let board = Board::default();
        board.expect_store("a");
        board.expect_store("b");
        caught_up(&board, "a");
        board.store_resolved("a");
        let r = board.readiness(10);
        assert!(!r.ready, "store b has no partition on the board yet");
        assert_eq!(r.not_ready.len(), 1);
        assert_eq!(r.not_ready[0].store, "b");
        assert_eq!(r.warm_up(), WarmUp::Restoring);
        caught_up(&board, "b");
        board.store_resolved("b");
        assert!(board.readiness(10).ready);
        assert_eq!(board.readiness(10).warm_up(), WarmUp::Warm);
    }

    #[test]
    fn a_one_shot_restore_gives_up_on_a_failed_partition_or_store() {
        let board = Board::default();
        board.expect_store("a");
        let status = caught_up(&board, "a");
        board.store_resolved("a");
        let lagging = Arc::new(PartitionStatus::new("a", "t", 1, PathBuf::from("/y")));
        lagging.position.store(0, Relaxed);
        lagging.end_offset.store(50, Relaxed);
        lagging.set_state(PartitionState::Restoring, None);
        board.add(lagging);
        assert_eq!(board.readiness(10).warm_up(), WarmUp::Restoring);
        status.set_state(PartitionState::Failed, Some("disk full".into()));
        match board.readiness(10).warm_up() {
            WarmUp::Failed(failed) => {
                assert_eq!(failed.len(), 1);
                assert_eq!(failed[0].partition, Some(0));
                assert!(failed[0].reason.contains("disk full"), "{:?}", failed[0]);
            }
            other => panic!("expected a failure, got {other:?}"),
        }
        status.set_state(PartitionState::CaughtUp, None);
        board.set_store_error("a", Some("topic gone".into()));
        assert!(matches!(board.readiness(10).warm_up(), WarmUp::Failed(_)));
    }

    #[test]
    fn a_one_shot_restore_waits_out_a_group_error_but_not_a_refusal_or_an_end() {
        use crate::observe::group::GroupView;
        let board = Board::default();
        board.join_group(GroupView::new("standby", None));
        assert_eq!(board.readiness(10).warm_up(), WarmUp::Restoring);
        board.with_group(|g| g.member_error("coordinator not available".into(), false));
        assert_eq!(board.readiness(10).warm_up(), WarmUp::Restoring);
        board.with_group(|g| g.member_error("GroupAuthorizationFailed".into(), true));
        match board.readiness(10).warm_up() {
            WarmUp::Failed(failed) => {
                assert!(
                    failed[0].reason.contains("GroupAuthorizationFailed"),
                    "{failed:?}"
                );
            }
            other => panic!("expected a failure, got {other:?}"),
        }
        board.with_group(|g| g.assigned(Vec::new()));
        assert_eq!(board.readiness(10).warm_up(), WarmUp::Warm, "granted since");
        board.with_group(|g| g.ended("FencedInstanceId".into()));
        assert!(matches!(board.readiness(10).warm_up(), WarmUp::Failed(_)));
    }
}
