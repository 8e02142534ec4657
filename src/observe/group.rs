//! What group mode shows: the group this process joined, what it was assigned, and how often the
//! group rebalanced. Written by the group member's thread, read by `/readyz`, `/stores` and
//! `/metrics`.

use serde::Serialize;
use std::time::Instant;

/// What a rebalance did to this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RebalanceKind {
    Assign,
    Revoke,
    /// The group could not rebalance.
    Error,
}

impl RebalanceKind {
    pub const ALL: [RebalanceKind; 3] = [
        RebalanceKind::Assign,
        RebalanceKind::Revoke,
        RebalanceKind::Error,
    ];

    pub fn label(self) -> &'static str {
        match self {
            RebalanceKind::Assign => "assign",
            RebalanceKind::Revoke => "revoke",
            RebalanceKind::Error => "error",
        }
    }
}

/// The group as this process sees it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GroupView {
    pub group_id: String,
    pub instance_id: Option<String>,
    /// The changelog partitions the group assigned to this process; `None` until the first
    /// assignment.
    pub assigned: Option<Vec<(String, i32)>>,
    /// Every partition of the subscribed changelogs, as the broker last listed them.
    pub changelog_partitions: Option<usize>,
    /// Rebalances by kind, in `RebalanceKind::ALL`'s order.
    #[serde(skip)]
    pub rebalances: [u64; 3],
    #[serde(skip)]
    pub last_rebalance: Option<Instant>,
    /// The last error of the member or of a rebalance, cleared by the next assignment.
    pub error: Option<String>,
    /// The broker denied the member, as of its last error (no ACL for the group or a changelog).
    /// Cleared by the next assignment.
    #[serde(skip)]
    pub refused: bool,
    /// Why librdkafka ended the member for good (a fatal error), if it did: the process is out of
    /// the group until it restarts.
    pub ended: Option<String>,
}

impl GroupView {
    pub fn new(group_id: &str, instance_id: Option<&str>) -> GroupView {
        GroupView {
            group_id: group_id.to_string(),
            instance_id: instance_id.map(str::to_string),
            ..GroupView::default()
        }
    }

    fn count(&mut self, kind: RebalanceKind) {
        self.rebalances[kind as usize] += 1;
        self.last_rebalance = Some(Instant::now());
    }

    pub fn assigned(&mut self, partitions: Vec<(String, i32)>) {
        self.count(RebalanceKind::Assign);
        self.assigned = Some(partitions);
        self.error = None;
        self.refused = false;
    }

    /// Until the next assignment the process holds nothing, and is not ready: the group is
    /// rebalancing.
    pub fn revoked(&mut self) {
        self.count(RebalanceKind::Revoke);
        self.assigned = None;
    }

    /// An error of the member itself, outside a rebalance; `refused` when the broker denied it.
    pub fn member_error(&mut self, error: String, refused: bool) {
        self.error = Some(error);
        self.refused = refused;
    }

    /// Partitions cannot come without someone acting: the member ended, or the broker refuses it.
    /// `warmstore restore` then exits rather than wait.
    pub fn stuck(&self) -> bool {
        self.ended.is_some() || self.refused
    }

    pub fn failed(&mut self, error: String) {
        self.count(RebalanceKind::Error);
        self.error = Some(error);
    }

    /// The member is gone for good and holds nothing; only a restart joins again.
    pub fn ended(&mut self, error: String) {
        self.count(RebalanceKind::Error);
        self.assigned = None;
        self.ended = Some(error);
    }

    pub fn rebalances(&self, kind: RebalanceKind) -> u64 {
        self.rebalances[kind as usize]
    }

    /// Why the process is not ready as a member, if it is not: it has no assignment yet. A member
    /// assigned nothing is ready (`idle_note` says why it holds nothing).
    pub fn not_ready_reason(&self) -> Option<String> {
        if let Some(ended) = &self.ended {
            return Some(format!(
                "out of consumer group {}: the member ended ({ended}); it holds nothing and joins again only when the process restarts",
                self.group_id
            ));
        }
        if self.assigned.is_some() {
            return None;
        }
        let error = self
            .error
            .as_deref()
            .map(|e| format!("; last error: {e}"))
            .unwrap_or_default();
        Some(format!(
            "waiting for consumer group {} to assign partitions{error}",
            self.group_id
        ))
    }

    /// What `/readyz` says of a member that holds no partition.
    pub fn idle_note(&self) -> Option<String> {
        match &self.assigned {
            Some(assigned) if assigned.is_empty() => Some(format!(
                "consumer group {} assigned this process no partition: the group has more members than partitions",
                self.group_id
            )),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_is_not_ready_before_its_first_assignment_and_ready_with_none() {
        let mut group = GroupView::new("standby", Some("pod-0"));
        let reason = group.not_ready_reason().unwrap();
        assert!(
            reason.contains("waiting for consumer group standby"),
            "{reason}"
        );
        group.failed("coordinator not available".into());
        assert!(group
            .not_ready_reason()
            .unwrap()
            .contains("coordinator not available"));
        group.assigned(Vec::new());
        assert_eq!(group.not_ready_reason(), None);
        assert_eq!(group.error, None);
        assert!(group
            .idle_note()
            .unwrap()
            .contains("more members than partitions"));
        group.revoked();
        assert!(group.not_ready_reason().is_some());
        group.assigned(vec![("t".into(), 3)]);
        assert_eq!(group.idle_note(), None);
        assert_eq!(RebalanceKind::ALL.map(|k| group.rebalances(k)), [2, 1, 1]);
    }

    #[test]
    fn an_ended_member_is_not_ready_and_says_why() {
        let mut group = GroupView::new("standby", Some("pod-0"));
        group.assigned(vec![("t".into(), 3)]);
        assert_eq!(group.not_ready_reason(), None);
        group.ended("FencedInstanceId".into());
        let reason = group.not_ready_reason().unwrap();
        assert!(reason.contains("out of consumer group standby"), "{reason}");
        assert!(reason.contains("FencedInstanceId"), "{reason}");
        assert_eq!(group.assigned, None);
        assert_eq!(group.rebalances(RebalanceKind::Error), 1);
    }
}
