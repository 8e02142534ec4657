//! Compaction deferred while a large catch-up loads a store. Loading gigabytes into one store,
//! RocksDB spent half of the two cores merging sorted runs that the next flushes made obsolete,
//! and the load went at the compactions' pace. With compaction off the catch-up only writes
//! tables, and one merge of them all starts once it is done, while the partition tails.

use super::{family, rocks, Store, StoreError};

/// RocksDB's triggers that slow and stop writes on sorted runs, while compaction is deferred and
/// until the store is reopened. RocksDB ignores them while compaction is off; once it is back on,
/// the runs a large catch-up left (one per flush, hundreds for a few GB) would be over its
/// default stop trigger (36), and the tail would stop until the merge had caught up.
const DEFERRED_RUN_TRIGGER: &str = "1000000";

impl Store {
    /// Turns automatic compaction of the data off until `resume_compaction`. Each call writes
    /// RocksDB's OPTIONS file, so only a catch-up large enough to gain from it asks.
    pub fn defer_compaction(&mut self) -> Result<(), StoreError> {
        if self.compaction_deferred {
            return Ok(());
        }
        self.set_data_options(&[
            ("level0_slowdown_writes_trigger", DEFERRED_RUN_TRIGGER),
            ("level0_stop_writes_trigger", DEFERRED_RUN_TRIGGER),
            ("disable_auto_compactions", "true"),
        ])?;
        self.compaction_deferred = true;
        Ok(())
    }

    /// Turns automatic compaction back on if it was deferred. RocksDB schedules the merge of
    /// what the catch-up wrote at once and runs it in the background. A store closed while its
    /// compaction is deferred needs no call: every open starts with compaction on.
    pub fn resume_compaction(&mut self) -> Result<(), StoreError> {
        if !self.compaction_deferred {
            return Ok(());
        }
        self.set_data_options(&[("disable_auto_compactions", "false")])?;
        self.compaction_deferred = false;
        Ok(())
    }

    /// Whether compaction waits for `resume_compaction`.
    pub fn compaction_deferred(&self) -> bool {
        self.compaction_deferred
    }

    fn set_data_options(&self, options: &[(&str, &str)]) -> Result<(), StoreError> {
        let cf = family(&self.db, &self.paths.db, self.paths.kind.data_family())?;
        self.db
            .set_options_cf(cf, options)
            .map_err(rocks(&self.paths.db))
    }
}
