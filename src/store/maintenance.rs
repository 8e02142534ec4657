//! What a store offers beside the commit path: a full compaction, a whole read, and RocksDB's own
//! figures. The store benchmark uses them to compare compaction styles on the store `run` writes.

use super::{family, rocks, Store, StoreError};

impl Store {
    /// Merges every column family into its bottom level, then turns automatic compaction back on
    /// if it was deferred.
    pub fn compact(&mut self) -> Result<(), StoreError> {
        for name in self.paths.kind.families() {
            let cf = family(&self.db, &self.paths.db, name)?;
            self.db.compact_range_cf(cf, None::<&[u8]>, None::<&[u8]>);
        }
        self.resume_compaction()
    }

    /// Keys the store holds, counted by reading all of them (committed ones only).
    pub fn count_keys(&self) -> Result<usize, StoreError> {
        let cf = family(&self.db, &self.paths.db, self.paths.kind.data_family())?;
        let mut count = 0;
        for item in self.db.iterator_cf(cf, rocksdb::IteratorMode::Start) {
            item.map_err(rocks(&self.paths.db))?;
            count += 1;
        }
        Ok(count)
    }

    /// A database-wide RocksDB property (`rocksdb.dbstats`, for one), if RocksDB has it.
    pub fn property(&self, name: &str) -> Option<String> {
        self.db.property_value(name).ok().flatten()
    }
}
