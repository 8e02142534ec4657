//! What is on disk when a store is opened, learnt without changing anything: the facts that the
//! dirty rules (`dirty::decide`) judge. Every failure becomes a fact rather than an error, so that a
//! damaged store is rebuilt instead of failing its partition.

use rocksdb::{IteratorMode, DB};
use std::fs;
use std::io;

use super::dirty::{Identity, OpenError, StoreFacts, StoredOffset};
use super::format::{decode_i64, OFFSETS_CF, STATUS_KEY};
use super::layout::CURRENT_FILE;
use super::{meta, options, timer, StoreOptions, StorePaths, StoreType, TopicPartition};

/// Learns everything the dirty rules need, opening the database when it exists. Never panics and
/// never changes the store: a failure becomes `open_error`.
pub(super) fn probe(
    paths: &StorePaths,
    tp: &TopicPartition,
    options: &StoreOptions,
) -> (StoreFacts, Option<DB>) {
    let mut facts = StoreFacts::fresh();
    match fs::read_to_string(&paths.marker) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        found => {
            // An empty marker: the kill came between its creation and its one line.
            let under_way = found.map_or_else(
                |e| format!("(unreadable: {e})"),
                |text| {
                    text.lines()
                        .next()
                        .unwrap_or("nothing yet; the run was cut short as it wrote the marker")
                        .to_string()
                },
            );
            facts.interrupted_rebuild = Some(under_way);
            return (facts, None);
        }
    }
    match fs::symlink_metadata(&paths.db) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return (facts, None),
        Err(e) => {
            facts.open_error = Some(OpenError::Unreadable(format!(
                "cannot stat the store directory: {e}"
            )));
            return (facts, None);
        }
        Ok(m) if !m.is_dir() => {
            facts.open_error = Some(OpenError::Unreadable(
                "the store path is not a directory".into(),
            ));
            return (facts, None);
        }
        Ok(_) => {}
    }
    if !paths.db.join(CURRENT_FILE).exists() {
        let other_files = fs::read_dir(&paths.db)
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .any(|e| e.file_name() != meta::META_FILE)
            })
            .unwrap_or(true);
        if other_files {
            facts.open_error = Some(OpenError::Unreadable(
                "RocksDB's CURRENT file is missing".into(),
            ));
        }
        return (facts, None);
    }
    match meta::read(&paths.db) {
        Ok(Some(m)) => facts.identity = m.identity(tp),
        Ok(None) => facts.identity = Identity::Unknown,
        Err(error) => {
            facts.open_error = Some(OpenError::Unreadable(error.to_string()));
            return (facts, None);
        }
    }
    // RocksDB refuses to open a store without naming each of its families, and Kafka Streams
    // refuses one with a family it does not expect: a store of another type is rebuilt.
    match DB::list_cf(&options::bare_options(), &paths.db) {
        Ok(found) => {
            if let Some(shape) = other_families(paths.kind, found) {
                facts.identity = shape;
                return (facts, None);
            }
        }
        Err(e) => {
            facts.open_error = Some(open_error(e));
            return (facts, None);
        }
    }
    let (db_options, families) = options.db_options(paths.kind, false);
    let db = match timer::open_db(&db_options, &paths.db, families) {
        Ok(db) => db,
        Err(e) => {
            facts.open_error = Some(open_error(e));
            return (facts, None);
        }
    };
    if let Err(error) = read_facts(&db, tp, paths.kind, &mut facts) {
        facts.open_error = Some(error);
        return (facts, None);
    }
    (facts, Some(db))
}

fn open_error(error: rocksdb::Error) -> OpenError {
    OpenError::from_rocksdb(error.kind(), error.into_string())
}

/// `Some` when a store's column families are not exactly those of `kind`.
fn other_families(kind: StoreType, mut found: Vec<String>) -> Option<Identity> {
    let mut expected: Vec<String> = kind.families().iter().map(|f| f.to_string()).collect();
    found.sort();
    expected.sort();
    (found != expected).then(|| Identity::OtherType {
        found: found.join(", "),
        expected: kind.label(),
    })
}

/// Fills status, applied offset, identity (from foreign offset keys) and whether data is present
/// in any family but `offsets` (data in a timestamped store's `default` counts too).
fn read_facts(
    db: &DB,
    tp: &TopicPartition,
    kind: StoreType,
    facts: &mut StoreFacts,
) -> Result<(), OpenError> {
    let offsets = db
        .cf_handle(OFFSETS_CF)
        .ok_or_else(|| OpenError::Unreadable("column family `offsets` is missing".into()))?;
    let own_key = tp.offset_key();
    let mut foreign = None;
    for item in db.iterator_cf(offsets, IteratorMode::Start) {
        let (key, value) = item.map_err(open_error)?;
        if &*key == STATUS_KEY {
            facts.status = decode_i64(&value);
        } else if *key == *own_key {
            facts.applied =
                decode_i64(&value).map_or(StoredOffset::Unreadable, StoredOffset::Valid);
        } else {
            foreign.get_or_insert_with(|| String::from_utf8_lossy(&key).into_owned());
        }
    }
    if let (Some(other), StoredOffset::Absent) = (foreign, facts.applied) {
        facts.identity = Identity::OtherPartition(other);
    }
    for name in kind.families().iter().filter(|&&name| name != OFFSETS_CF) {
        let family = db
            .cf_handle(name)
            .ok_or_else(|| OpenError::Unreadable(format!("column family `{name}` is missing")))?;
        if let Some(item) = db.iterator_cf(family, IteratorMode::Start).next() {
            item.map_err(open_error)?;
            facts.has_data = true;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_of_another_type_is_told_apart_by_its_families() {
        let names = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            other_families(StoreType::KeyValue, names(&["offsets", "default"])),
            None
        );
        assert_eq!(
            other_families(
                StoreType::TimestampedKeyValue,
                names(&["default", "keyValueWithTimestamp", "offsets"])
            ),
            None
        );
        assert_eq!(
            other_families(
                StoreType::TimestampedKeyValue,
                names(&["default", "offsets"])
            ),
            Some(Identity::OtherType {
                found: "default, offsets".into(),
                expected: "timestamped_key_value"
            })
        );
        assert!(other_families(StoreType::KeyValue, names(&["default"])).is_some());
    }
}
