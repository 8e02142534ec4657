//! Which stores can be trusted. Everything found when a store is opened goes in, one action comes out.
//! Kept free of I/O so every row of the contract's dirty table is a unit test.

use serde::Deserialize;
use std::fmt;

/// What to do with a store that was found open (`status` = 1), i.e. not closed cleanly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum UncleanPolicy {
    /// Trust it: the commit protocol guarantees data and offset on disk belong to the same commit.
    #[default]
    Resume,
    /// Rebuild it, as Kafka Streams does under exactly-once.
    Wipe,
}

/// Why a store is wiped; `label()` is the `reason` label of `warmstore_store_wipes_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WipeReason {
    UncleanShutdown,
    Corruption,
    MissingOffsets,
    OffsetOutOfRange,
    FormatMismatch,
    InterruptedRebuild,
}

impl WipeReason {
    pub const ALL: [WipeReason; 6] = [
        WipeReason::UncleanShutdown,
        WipeReason::Corruption,
        WipeReason::MissingOffsets,
        WipeReason::OffsetOutOfRange,
        WipeReason::FormatMismatch,
        WipeReason::InterruptedRebuild,
    ];

    pub fn label(self) -> &'static str {
        match self {
            WipeReason::UncleanShutdown => "unclean_shutdown",
            WipeReason::Corruption => "corruption",
            WipeReason::MissingOffsets => "missing_offsets",
            WipeReason::OffsetOutOfRange => "offset_out_of_range",
            WipeReason::FormatMismatch => "format_mismatch",
            WipeReason::InterruptedRebuild => "interrupted_rebuild",
        }
    }
}

impl fmt::Display for WipeReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// Why RocksDB could not open or read a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenError {
    /// Damaged or missing files: the store cannot be trusted.
    Unreadable(String),
    /// The files may be fine, but they need something this build lacks (a compression codec,
    /// say). Another program wrote them; that is a format mismatch, never corruption.
    MissingFeature(String),
}

impl OpenError {
    /// Sorts a RocksDB error: "Not implemented" (RocksDB's `NotSupported` status, as in "Snappy not
    /// supported in this build") is a missing feature; everything else makes the store unreadable.
    pub fn from_rocksdb(kind: rocksdb::ErrorKind, message: String) -> OpenError {
        match kind {
            rocksdb::ErrorKind::NotSupported => OpenError::MissingFeature(message),
            _ => OpenError::Unreadable(message),
        }
    }
}

/// Whose store this is, according to its metadata file and the keys in `offsets`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// Written by warmstore for this topic-partition.
    Matches,
    /// No metadata (a new store, or one made by Kafka Streams); judged by its offsets alone.
    Unknown,
    /// Made for another topic-partition (named here).
    OtherPartition(String),
    /// Written by a newer warmstore whose format this one does not know.
    NewerFormat(u32),
    /// Its column families are those of another store type (the config's `type` changed).
    OtherType {
        found: String,
        expected: &'static str,
    },
}

/// The applied offset as read from `offsets`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoredOffset {
    Absent,
    Valid(i64),
    /// Present but not an 8-byte big-endian integer.
    Unreadable,
}

/// Everything learnt about a store directory at open, before any decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreFacts {
    /// What the marker left by an interrupted process says was under way (creating, wiping or
    /// deleting the store), if one was left.
    pub interrupted_rebuild: Option<String>,
    /// RocksDB could not open or read the store.
    pub open_error: Option<OpenError>,
    pub identity: Identity,
    /// Raw `status` value, if any.
    pub status: Option<i64>,
    pub applied: StoredOffset,
    /// The `default` column family holds at least one key.
    pub has_data: bool,
}

impl StoreFacts {
    /// A directory with nothing in it yet.
    pub fn fresh() -> Self {
        StoreFacts {
            interrupted_rebuild: None,
            open_error: None,
            identity: Identity::Unknown,
            status: None,
            applied: StoredOffset::Absent,
            has_data: false,
        }
    }
}

/// The changelog partition's offsets, when the broker could be asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogBounds {
    /// Earliest offset still in the log.
    pub log_start: i64,
    /// Offset the next record will get (end offset).
    pub high_watermark: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Continue from `applied + 1`. `unclean` means it was found open and is resumed by policy.
    Resume { applied: i64, unclean: bool },
    /// Nothing is stored yet: consume from the log-start offset.
    StartEmpty,
    /// Destroy the store and rebuild it from log-start. `detail` is for the log line.
    Wipe { reason: WipeReason, detail: String },
}

fn wipe(reason: WipeReason, detail: impl Into<String>) -> Action {
    Action::Wipe {
        reason,
        detail: detail.into(),
    }
}

/// The dirty rules (docs/store.md has the table). Rows are checked from "cannot read it at all" to
/// "readable but no longer matches the log", so the reason given is the most fundamental one.
///
/// Out of range follows Kafka's own fetch rule: resuming reads `applied + 1`, which must lie in
/// `[log_start, high_watermark]`. A store whose next offset is exactly log-start has lost nothing, so it
/// is resumed, where a literal `applied < log-start` would wipe it (docs/store.md).
pub fn decide(facts: &StoreFacts, policy: UncleanPolicy, bounds: Option<LogBounds>) -> Action {
    if let Some(under_way) = &facts.interrupted_rebuild {
        return wipe(
            WipeReason::InterruptedRebuild,
            format!("an earlier run was cut short; its marker says: {under_way}"),
        );
    }
    match &facts.open_error {
        Some(OpenError::Unreadable(detail)) => return wipe(WipeReason::Corruption, detail.clone()),
        Some(OpenError::MissingFeature(detail)) => {
            return wipe(
                WipeReason::FormatMismatch,
                format!("this build cannot read the store: {detail}"),
            )
        }
        None => {}
    }
    match &facts.identity {
        Identity::OtherPartition(other) => {
            return wipe(
                WipeReason::FormatMismatch,
                format!("store was made for {other}"),
            )
        }
        Identity::NewerFormat(version) => {
            return wipe(
                WipeReason::FormatMismatch,
                format!("store format version {version} is newer than this warmstore knows"),
            )
        }
        Identity::OtherType { found, expected } => {
            return wipe(
                WipeReason::FormatMismatch,
                format!("store has the column families {found}, not those of a {expected} store"),
            )
        }
        Identity::Matches | Identity::Unknown => {}
    }
    let unclean = facts.status == Some(1);
    if unclean && policy == UncleanPolicy::Wipe {
        return wipe(
            WipeReason::UncleanShutdown,
            "store was not closed cleanly and on_unclean_shutdown is wipe",
        );
    }
    let applied = match facts.applied {
        StoredOffset::Unreadable => {
            return wipe(
                WipeReason::MissingOffsets,
                "the stored offset is not an 8-byte integer",
            )
        }
        StoredOffset::Absent if facts.has_data => {
            return wipe(
                WipeReason::MissingOffsets,
                "store holds data but no offset for its partition",
            )
        }
        StoredOffset::Absent => return Action::StartEmpty,
        StoredOffset::Valid(applied) => applied,
    };
    if let Some(reason) = bounds.and_then(|b| out_of_range(applied, b)) {
        return wipe(WipeReason::OffsetOutOfRange, reason);
    }
    Action::Resume { applied, unclean }
}

/// `Some(explanation)` when resuming at `applied + 1` cannot continue the log: records between the
/// store and log-start are gone, or the log is behind the store (topic recreated or truncated).
pub fn out_of_range(applied: i64, bounds: LogBounds) -> Option<String> {
    let next = applied.saturating_add(1);
    if next < bounds.log_start {
        Some(format!(
            "applied offset {applied} is below log-start {} (retention or compaction passed the store)",
            bounds.log_start
        ))
    } else if applied >= bounds.high_watermark {
        Some(format!(
            "applied offset {applied} is at or past the high watermark {} (topic recreated or truncated)",
            bounds.high_watermark
        ))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(applied: i64) -> StoreFacts {
        StoreFacts {
            identity: Identity::Matches,
            status: Some(0),
            applied: StoredOffset::Valid(applied),
            has_data: true,
            ..StoreFacts::fresh()
        }
    }

    fn reason(action: Action) -> WipeReason {
        match action {
            Action::Wipe { reason, .. } => reason,
            other => panic!("expected a wipe, got {other:?}"),
        }
    }

    const BOUNDS: LogBounds = LogBounds {
        log_start: 100,
        high_watermark: 200,
    };

    #[test]
    fn fresh_store_starts_empty() {
        assert_eq!(
            decide(&StoreFacts::fresh(), UncleanPolicy::Resume, Some(BOUNDS)),
            Action::StartEmpty
        );
    }

    #[test]
    fn clean_store_in_range_resumes() {
        assert_eq!(
            decide(&stored(150), UncleanPolicy::Wipe, Some(BOUNDS)),
            Action::Resume {
                applied: 150,
                unclean: false
            }
        );
        // Bounds unknown (broker not asked yet): only local rules apply.
        assert_eq!(
            decide(&stored(5), UncleanPolicy::Resume, None),
            Action::Resume {
                applied: 5,
                unclean: false
            }
        );
    }

    #[test]
    fn unclean_store_follows_the_policy() {
        let facts = StoreFacts {
            status: Some(1),
            ..stored(150)
        };
        assert_eq!(
            decide(&facts, UncleanPolicy::Resume, Some(BOUNDS)),
            Action::Resume {
                applied: 150,
                unclean: true
            }
        );
        assert_eq!(
            reason(decide(&facts, UncleanPolicy::Wipe, Some(BOUNDS))),
            WipeReason::UncleanShutdown
        );
    }

    #[test]
    fn open_errors_are_corruption() {
        let facts = StoreFacts {
            open_error: Some(OpenError::Unreadable("Corruption: truncated block".into())),
            ..stored(150)
        };
        assert_eq!(
            reason(decide(&facts, UncleanPolicy::Resume, None)),
            WipeReason::Corruption
        );
    }

    #[test]
    fn a_store_this_build_cannot_decode_is_a_format_mismatch_not_corruption() {
        let error = OpenError::from_rocksdb(
            rocksdb::ErrorKind::NotSupported,
            "Not implemented: Snappy not supported in this build".into(),
        );
        assert!(matches!(error, OpenError::MissingFeature(_)));
        let facts = StoreFacts {
            open_error: Some(error),
            ..stored(150)
        };
        match decide(&facts, UncleanPolicy::Resume, None) {
            Action::Wipe { reason, detail } => {
                assert_eq!(reason, WipeReason::FormatMismatch);
                assert!(detail.contains("Snappy not supported"), "{detail}");
            }
            other => panic!("expected a wipe, got {other:?}"),
        }
        let damaged = OpenError::from_rocksdb(rocksdb::ErrorKind::Corruption, "bad block".into());
        assert_eq!(damaged, OpenError::Unreadable("bad block".into()));
    }

    #[test]
    fn data_without_a_readable_offset_is_missing_offsets() {
        let absent = StoreFacts {
            applied: StoredOffset::Absent,
            ..stored(0)
        };
        assert_eq!(
            reason(decide(&absent, UncleanPolicy::Resume, None)),
            WipeReason::MissingOffsets
        );
        let garbage = StoreFacts {
            applied: StoredOffset::Unreadable,
            has_data: false,
            ..stored(0)
        };
        assert_eq!(
            reason(decide(&garbage, UncleanPolicy::Resume, None)),
            WipeReason::MissingOffsets
        );
    }

    #[test]
    fn an_offset_without_data_is_fine() {
        // Every key was deleted by tombstones: nothing to distrust.
        let facts = StoreFacts {
            has_data: false,
            ..stored(120)
        };
        assert!(matches!(
            decide(&facts, UncleanPolicy::Resume, Some(BOUNDS)),
            Action::Resume { applied: 120, .. }
        ));
    }

    #[test]
    fn out_of_range_follows_kafkas_fetch_rule() {
        // Next offset 99 < log-start 100: record 99 is gone.
        assert_eq!(
            reason(decide(&stored(98), UncleanPolicy::Resume, Some(BOUNDS))),
            WipeReason::OffsetOutOfRange
        );
        // Next offset is exactly log-start: nothing lost.
        assert!(matches!(
            decide(&stored(99), UncleanPolicy::Resume, Some(BOUNDS)),
            Action::Resume { applied: 99, .. }
        ));
        // Caught up exactly: applied is the last offset before the high watermark.
        assert!(matches!(
            decide(&stored(199), UncleanPolicy::Resume, Some(BOUNDS)),
            Action::Resume { applied: 199, .. }
        ));
        // The log is behind the store: the topic was recreated.
        assert_eq!(
            reason(decide(&stored(200), UncleanPolicy::Resume, Some(BOUNDS))),
            WipeReason::OffsetOutOfRange
        );
        let recreated = LogBounds {
            log_start: 0,
            high_watermark: 0,
        };
        assert_eq!(
            reason(decide(&stored(0), UncleanPolicy::Resume, Some(recreated))),
            WipeReason::OffsetOutOfRange
        );
    }

    #[test]
    fn markers_past_the_last_record_keep_the_store_in_range() {
        // EOS: last record at 150, commit marker at 151, high watermark 152.
        let bounds = LogBounds {
            log_start: 0,
            high_watermark: 152,
        };
        assert!(matches!(
            decide(&stored(150), UncleanPolicy::Resume, Some(bounds)),
            Action::Resume { applied: 150, .. }
        ));
    }

    #[test]
    fn foreign_or_newer_stores_are_format_mismatch() {
        let other = StoreFacts {
            identity: Identity::OtherPartition("orders-changelog-7".into()),
            ..stored(150)
        };
        assert_eq!(
            reason(decide(&other, UncleanPolicy::Resume, Some(BOUNDS))),
            WipeReason::FormatMismatch
        );
        let newer = StoreFacts {
            identity: Identity::NewerFormat(99),
            ..stored(150)
        };
        assert_eq!(
            reason(decide(&newer, UncleanPolicy::Resume, None)),
            WipeReason::FormatMismatch
        );
        let other_type = StoreFacts {
            identity: Identity::OtherType {
                found: "default, offsets".into(),
                expected: "timestamped_key_value",
            },
            ..StoreFacts::fresh()
        };
        assert_eq!(
            reason(decide(&other_type, UncleanPolicy::Resume, None)),
            WipeReason::FormatMismatch
        );
    }

    #[test]
    fn a_leftover_marker_wins_over_everything() {
        let facts = StoreFacts {
            interrupted_rebuild: Some("wiping the store (corruption)".into()),
            open_error: Some(OpenError::Unreadable("Corruption".into())),
            ..stored(150)
        };
        let action = decide(&facts, UncleanPolicy::Resume, Some(BOUNDS));
        assert!(
            matches!(&action, Action::Wipe { detail, .. } if detail.contains("wiping the store")),
            "the detail says what was cut short: {action:?}"
        );
        assert_eq!(reason(action), WipeReason::InterruptedRebuild);
    }

    #[test]
    fn labels_are_the_metric_reasons() {
        let labels: Vec<_> = WipeReason::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(
            labels,
            [
                "unclean_shutdown",
                "corruption",
                "missing_offsets",
                "offset_out_of_range",
                "format_mismatch",
                "interrupted_rebuild"
            ]
        );
    }
}
