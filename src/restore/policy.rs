//! The restore loop's decisions, free of I/O: caught up or not, commit now or not, how long to back
//! off. Offsets here may have gaps (compaction, aborted transactions) and the end offset may sit past
//! the last record (transaction markers), so nothing assumes `last record + 1 == end`.

use rdkafka::error::RDKafkaErrorCode;
use std::collections::BTreeSet;
use std::time::Duration;

/// Caught up when the consumer position has reached the end offset. The position is where the next
/// fetch starts, and it moves past markers that are never delivered as records.
pub fn caught_up(position: i64, end_offset: i64) -> bool {
    position >= end_offset
}

/// What an error on a partition's queue means for its restore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumeError {
    /// The store's next offset is no longer in the log: wipe and rebuild.
    OutOfRange,
    /// A passing broker or network condition; librdkafka fetches the same offset again.
    Transient,
    /// The partition cannot be consumed as it is: stop applying at once, keep what was taken
    /// before the error, fail the partition with the reason, retry from the store's offset.
    Fatal,
}

/// Sorts an error librdkafka reports on a partition's queue. Anything not known to be passing is
/// fatal, because librdkafka skips a batch it cannot decode (bad CRC, corrupt or unsupported
/// compression) and goes on with the next one: applying on would leave a hole in the store, and
/// logging alone left a partition `restoring` for ever with no reason shown.
pub fn consume_error(code: RDKafkaErrorCode) -> ConsumeError {
    use RDKafkaErrorCode as C;
    match code {
        C::OffsetOutOfRange | C::AutoOffsetReset => ConsumeError::OutOfRange,
        C::BrokerTransportFailure
        | C::AllBrokersDown
        | C::Resolve
        | C::OperationTimedOut
        | C::RequestTimedOut
        | C::LeaderNotAvailable
        | C::NotLeaderForPartition
        | C::BrokerNotAvailable
        | C::ReplicaNotAvailable
        | C::PreferredLeaderNotAvailable
        | C::FencedLeaderEpoch
        | C::UnknownLeaderEpoch
        | C::KafkaStorageError
        | C::OffsetNotAvailable
        | C::PartitionEOF => ConsumeError::Transient,
        _ => ConsumeError::Fatal,
    }
}

/// Records between position and end offset, never negative.
pub fn lag(position: i64, end_offset: i64) -> i64 {
    end_offset.saturating_sub(position).max(0)
}

/// Whether a partition must wait for a turn (`catch_up_turns`) before catching up. Turns
/// bound the memory of long catch-ups; a partition already within `ready_max_lag` is warm by the
/// user's own measure, and topping it up must not wait hours behind other partitions' rebuilds.
pub fn needs_turn(position: i64, end_offset: i64, ready_max_lag: u64) -> bool {
    lag(position, end_offset) as u64 > ready_max_lag
}

/// The smallest part of a turn a catch-up takes, however small: each catching-up partition also costs
/// fetch state and a task's working memory, and without a floor thousands of tiny catch-ups would
/// all load at once.
pub const MIN_TURN_PARTS: u64 = 16;

/// Freed memory goes back to the system once catch-ups that ended have let go of this part of a
/// turn between them (`memory::release_free`): a large catch-up gives its memory back at once,
/// small ones a few at a time, since each give-back walks the whole heap.
pub const RELEASE_TURN_PARTS: u64 = 4;

/// Memory a catching-up partition holds per record beyond its key and value, measured with the
/// bench's changelog (about 195 bytes held per record of 111 bytes of key and value, at 500,000 and
/// at 2,000,000 records): the memtable entry (sequence, lengths, the vector's pointer, arena
/// slack), librdkafka's message header, and the uncommitted batch's framing. The estimate only has
/// to size catch-ups roughly.
pub const HELD_PER_RECORD: f64 = 80.0;

/// Bytes of the turns' budget a catch-up of `records` takes: the memory it is expected to hold,
/// between `1 / MIN_TURN_PARTS` of a turn and a full turn. Without a record size to go by yet
/// (nothing of the topic taken so far) it takes a full turn, and gives back what it does not need
/// once its first records show their size (`Turn::resize`).
pub fn turn_weight(records: i64, bytes_per_record: Option<f64>, turn_bytes: u64) -> u64 {
    let floor = turn_bytes / MIN_TURN_PARTS;
    match bytes_per_record.filter(|b| b.is_finite() && *b >= 0.0) {
        None => turn_bytes,
        Some(per_record) => {
            let held = records.max(0) as f64 * (per_record + HELD_PER_RECORD);
            (held as u64).clamp(floor, turn_bytes)
        }
    }
}

/// Key and value bytes from which a catch-up defers its store's compaction until it is done
/// (`Store::defer_compaction`). Loading 20M records (2.2 GB) into one store, compactions took
/// half the CPU, and with them deferred a restore from a real broker was ready in 16-17 s
/// instead of 26-34 s (four of 10M each: 30-37 s instead of 44-52 s). A small catch-up gains
/// nothing: it flushes a few tables that one merge or none handles. And each switch rewrites
/// RocksDB's OPTIONS file, a cost that adds up over a thousand small stores. From 256 MiB a
/// catch-up flushes at least eight times the whole memtable budget's default.
pub const DEFER_COMPACTION_BYTES: f64 = 256.0 * 1024.0 * 1024.0;

/// Whether a catch-up of `records` more records, of `bytes_per_record` key and value bytes each,
/// is large enough to defer its store's compaction until it is done.
pub fn defers_compaction(records: i64, bytes_per_record: f64) -> bool {
    records.max(0) as f64 * bytes_per_record >= DEFER_COMPACTION_BYTES
}

#[derive(Debug, Clone, Copy)]
pub struct Pending {
    /// Something was applied (or skipped) since the last commit, so the offset would move.
    pub dirty: bool,
    pub uncommitted_bytes: usize,
    pub since_last_commit: Duration,
    /// The partition went from behind to caught up in this batch.
    pub just_caught_up: bool,
}

/// A commit is due when something is pending and the uncommitted buffer reached its share of
/// `max_uncommitted_bytes`, the partition just caught up (make the warm state durable at once), or
/// `commit_interval` has passed since the last commit.
pub fn commit_due(p: Pending, commit_interval: Duration, max_bytes: usize) -> bool {
    p.dirty
        && (p.uncommitted_bytes >= max_bytes
            || p.just_caught_up
            || p.since_last_commit >= commit_interval)
}

/// `max_uncommitted_bytes` bounds the whole process, so each partition gets an equal share (at
/// least 64 KiB, so tiny budgets do not turn into a commit per record), and never more than one
/// turn of the memtable budget (`turn_bytes`). A commit's batch lands in one memtable whole,
/// whatever the memtable's size: with one large partition taking all of the default 64 MiB, two
/// memtables of 70 MiB (one filling, one flushing) and the batch itself took a 20M-record restore
/// to a 440 MiB peak against a 32 MiB memtable budget.
pub fn partition_budget(max_uncommitted_bytes: u64, partitions: usize, turn_bytes: u64) -> usize {
    let share = (max_uncommitted_bytes / partitions.max(1) as u64).min(turn_bytes);
    share.max(64 << 10) as usize
}

/// Exponential backoff for retries of a failed partition: 1 s, 2 s, 4 s ... capped at 30 s.
pub fn backoff(attempt: u32) -> Duration {
    Duration::from_secs(1u64 << attempt.min(5)).min(Duration::from_secs(30))
}

/// The partitions of a changelog listed now that were not started before, in order: those added
/// to the changelog since. A partition no longer listed stays started; its worker shows why it
/// cannot read it.
pub fn added_partitions(started: &BTreeSet<i32>, listed: &[i32]) -> Vec<i32> {
    let mut added: Vec<i32> = listed
        .iter()
        .copied()
        .filter(|p| !started.contains(p))
        .collect();
    added.sort_unstable();
    added.dedup();
    added
}

/// Fraction of the current catch-up done: measured from where it started to the end offset seen
/// then, so it never moves backwards while new records keep arriving.
pub fn progress(from: i64, target: i64, position: i64) -> f64 {
    if target <= from || position >= target {
        1.0
    } else {
        ((position - from).max(0) as f64 / (target - from) as f64).clamp(0.0, 1.0)
    }
}

/// Exponentially smoothed rate: recent batches weigh more, one slow batch does not swing the ETA.
pub fn smooth_rate(previous: f64, records: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        return previous;
    }
    let sample = records as f64 / secs;
    // The weight grows with the sample's length: a 1 s window moves it about 40% of the way.
    let alpha = 1.0 - (-secs / 2.0).exp();
    if previous <= 0.0 {
        sample
    } else {
        previous + alpha * (sample - previous)
    }
}

/// Seconds to catch up at the smoothed rate; `None` (absent / NaN) when the rate is unknown.
pub fn eta_seconds(lag: i64, rate: f64) -> Option<f64> {
    if lag <= 0 {
        Some(0.0)
    } else if rate > 0.0 {
        Some(lag as f64 / rate)
    } else {
        None
    }
}

/// How long after `since_epoch` (time since a process-wide instant) an idle partition looks
/// again: at the next whole multiple of `every`. Every idle partition then wakes on the same tick,
/// and a thousand of them cost the runtime one wake-up a second rather than a thousand spread over
/// it; parking and waking threads that often was the largest part of an idle standby's CPU.
pub fn next_look(since_epoch: Duration, every: Duration) -> Duration {
    let every = every.as_nanos().max(1);
    let ticks = since_epoch.as_nanos() / every + 1;
    Duration::from_nanos(u64::try_from(ticks * every).unwrap_or(u64::MAX))
}

/// How long an idle partition sleeps: until the shared tick (`until_tick`, from `next_look`), or
/// until its own commit or flush falls due if that comes first. A `commit_interval` or
/// `flush_interval` shorter than the tick still holds, and a partition with nothing pending keeps
/// to the tick that every idle partition shares.
pub fn idle_sleep(
    until_tick: Duration,
    commit_due_in: Option<Duration>,
    flush_due_in: Option<Duration>,
) -> Duration {
    [commit_due_in, flush_due_in]
        .into_iter()
        .flatten()
        .fold(until_tick, Duration::min)
}

/// How long until `commit_due` says yes by time alone: `None` when nothing is pending.
pub fn commit_due_in(
    dirty: bool,
    since_last_commit: Duration,
    commit_interval: Duration,
) -> Option<Duration> {
    dirty.then(|| commit_interval.saturating_sub(since_last_commit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_catch_up_of_a_quarter_gib_or_more_defers_compaction() {
        // The bench's records: 16-byte keys and 100-byte values.
        assert!(defers_compaction(20_000_000, 116.0), "one large partition");
        assert!(defers_compaction(2_400_000, 116.0), "just over 256 MiB");
        assert!(!defers_compaction(2_300_000, 116.0), "just under");
        assert!(
            !defers_compaction(31_250, 116.0),
            "2M records over 64 partitions"
        );
        assert!(
            defers_compaction(300, 1_000_000.0),
            "few records, large values"
        );
        assert!(!defers_compaction(-5, 116.0), "nothing left");
        assert!(
            !defers_compaction(20_000_000, 0.0),
            "only tombstones of empty keys so far"
        );
    }

    #[test]
    fn an_idle_partition_wakes_for_its_own_commit_or_flush_before_the_tick() {
        let ms = Duration::from_millis;
        assert_eq!(
            idle_sleep(ms(1500), None, None),
            ms(1500),
            "nothing pending"
        );
        assert_eq!(
            idle_sleep(ms(1500), Some(ms(200)), None),
            ms(200),
            "a commit first"
        );
        assert_eq!(
            idle_sleep(ms(1500), None, Some(ms(300)),),
            ms(300),
            "a flush first"
        );
        assert_eq!(idle_sleep(ms(1500), Some(ms(900)), Some(ms(300))), ms(300));
        assert_eq!(
            idle_sleep(ms(100), Some(ms(900)), Some(ms(300))),
            ms(100),
            "the tick first"
        );
        assert_eq!(
            commit_due_in(false, ms(50), ms(200)),
            None,
            "nothing to commit"
        );
        assert_eq!(commit_due_in(true, ms(50), ms(200)), Some(ms(150)));
        assert_eq!(
            commit_due_in(true, ms(500), ms(200)),
            Some(Duration::ZERO),
            "overdue"
        );
    }

    #[test]
    fn idle_partitions_look_on_a_shared_tick() {
        let second = Duration::from_secs(1);
        let look = |ms| next_look(Duration::from_millis(ms), second);
        assert_eq!(look(0), second);
        assert_eq!(look(1), second);
        assert_eq!(look(999), second);
        assert_eq!(look(1000), 2 * second, "never now: a look is always ahead");
        assert_eq!(look(2500), 3 * second);
        assert_eq!(
            next_look(Duration::from_millis(250), Duration::ZERO),
            Duration::from_nanos(250_000_001),
            "a zero period still moves forward"
        );
    }

    #[test]
    fn undecodable_batches_are_fatal_and_passing_conditions_are_not() {
        use rdkafka::error::RDKafkaErrorCode as C;
        for code in [
            C::BadMessage,
            C::BadCompression,
            C::NotImplemented,
            C::UnsupportedCompressionType,
            C::UnknownTopicOrPartition,
            C::TopicAuthorizationFailed,
            C::Fail,
        ] {
            assert_eq!(consume_error(code), ConsumeError::Fatal, "{code:?}");
        }
        for code in [
            C::NotLeaderForPartition,
            C::BrokerTransportFailure,
            C::RequestTimedOut,
        ] {
            assert_eq!(consume_error(code), ConsumeError::Transient, "{code:?}");
        }
        assert_eq!(consume_error(C::OffsetOutOfRange), ConsumeError::OutOfRange);
        assert_eq!(consume_error(C::AutoOffsetReset), ConsumeError::OutOfRange);
    }

    #[test]
    fn a_catch_up_weighs_its_expected_memory() {
        let turn = 16 << 20;
        // 31,250 records of 116 bytes (3.6 MB, 6.1 MB held).
        assert_eq!(turn_weight(31_250, Some(116.0), turn), 6_125_000);
        // A tiny one takes the smallest part of a turn, an empty one too.
        assert_eq!(turn_weight(100, Some(100.0), turn), turn / MIN_TURN_PARTS);
        assert_eq!(turn_weight(0, Some(100.0), turn), turn / MIN_TURN_PARTS);
        // One far larger than a turn takes the whole turn and no more.
        assert_eq!(turn_weight(10_000_000, Some(1000.0), turn), turn);
    }

    #[test]
    fn without_a_record_size_a_catch_up_takes_a_full_turn() {
        assert_eq!(turn_weight(100, None, 16 << 20), 16 << 20);
        assert_eq!(turn_weight(100, Some(f64::NAN), 16 << 20), 16 << 20);
    }

    #[test]
    fn only_a_catch_up_beyond_ready_max_lag_waits_for_a_turn() {
        assert!(!needs_turn(100, 100, 0), "caught up");
        assert!(needs_turn(99, 100, 0), "behind, and ready only at lag 0");
        assert!(!needs_turn(90_000, 100_000, 10_000), "within ready_max_lag");
        assert!(needs_turn(89_999, 100_000, 10_000));
        assert!(!needs_turn(200, 100, 0), "ahead of a stale end offset");
    }

    #[test]
    fn caught_up_is_position_against_end_offset_never_last_record() {
        // Records at 0..=9, then a commit marker at 10: end offset 11.
        // After consuming record 9 the position is 10: not yet caught up.
        assert!(!caught_up(10, 11));
        // The consumer moves past the marker without delivering it: position 11.
        assert!(caught_up(11, 11));
        assert_eq!(lag(10, 11), 1);
        assert_eq!(lag(11, 11), 0);
    }

    #[test]
    fn gaps_in_offsets_do_not_confuse_the_lag() {
        // Compaction left offsets 0, 5, 9; end offset 10. Position after offset 5 is 6.
        assert_eq!(lag(6, 10), 4);
        assert!(!caught_up(6, 10));
        assert!(caught_up(10, 10));
    }

    #[test]
    fn lag_is_never_negative() {
        // A stale end offset below the position (refreshed periodically).
        assert_eq!(lag(20, 15), 0);
        assert!(caught_up(20, 15));
    }

    fn pending(dirty: bool, bytes: usize, secs: u64, just_caught_up: bool) -> Pending {
        Pending {
            dirty,
            uncommitted_bytes: bytes,
            since_last_commit: Duration::from_secs(secs),
            just_caught_up,
        }
    }

    #[test]
    fn commit_rules() {
        let interval = Duration::from_secs(10);
        assert!(
            !commit_due(pending(false, 1 << 30, 99, true), interval, 1024),
            "nothing pending"
        );
        assert!(
            commit_due(pending(true, 1024, 0, false), interval, 1024),
            "buffer share full"
        );
        assert!(
            commit_due(pending(true, 10, 0, true), interval, 1024),
            "just caught up"
        );
        assert!(
            commit_due(pending(true, 10, 10, false), interval, 1024),
            "interval passed"
        );
        assert!(
            !commit_due(pending(true, 10, 9, false), interval, 1024),
            "none of them"
        );
    }

    #[test]
    fn budget_is_shared_between_partitions() {
        let turn = 8 << 20;
        assert_eq!(partition_budget(64 << 20, 64, turn), 1 << 20);
        assert_eq!(partition_budget(1024, 4, turn), 64 << 10);
        assert_eq!(partition_budget(64 << 20, 16, 64 << 20), 4 << 20);
    }

    #[test]
    fn a_partition_never_buffers_more_than_a_turn_of_the_memtable_budget() {
        let turn = 8 << 20;
        assert_eq!(partition_budget(64 << 20, 1, turn), turn as usize);
        assert_eq!(partition_budget(64 << 20, 0, turn), turn as usize);
        assert_eq!(partition_budget(64 << 20, 4, turn), turn as usize);
        assert_eq!(
            partition_budget(64 << 20, 1, 1024),
            64 << 10,
            "the floor holds"
        );
    }

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(0), Duration::from_secs(1));
        assert_eq!(backoff(1), Duration::from_secs(2));
        assert_eq!(backoff(4), Duration::from_secs(16));
        assert_eq!(backoff(5), Duration::from_secs(30));
        assert_eq!(backoff(100), Duration::from_secs(30));
    }

    #[test]
    fn only_partitions_not_started_yet_are_added() {
        let started = BTreeSet::from([0, 1]);
        assert_eq!(added_partitions(&BTreeSet::new(), &[1, 0]), vec![0, 1]);
        assert_eq!(added_partitions(&started, &[0, 1]), Vec::<i32>::new());
        assert_eq!(added_partitions(&started, &[2, 0, 1, 3]), vec![2, 3]);
        assert_eq!(
            added_partitions(&started, &[0]),
            Vec::<i32>::new(),
            "none taken away"
        );
    }

    #[test]
    fn progress_is_against_the_target_fixed_at_start() {
        assert_eq!(progress(100, 200, 150), 0.5);
        assert_eq!(progress(100, 200, 250), 1.0);
        assert_eq!(progress(100, 100, 100), 1.0);
        assert_eq!(progress(100, 200, 50), 0.0);
    }

    #[test]
    fn rate_and_eta() {
        let r = smooth_rate(0.0, 1000, Duration::from_secs(1));
        assert_eq!(r, 1000.0);
        let r2 = smooth_rate(r, 2000, Duration::from_secs(1));
        assert!(r2 > 1000.0 && r2 < 2000.0, "{r2}");
        assert_eq!(smooth_rate(r, 5, Duration::ZERO), r);
        assert_eq!(eta_seconds(0, 0.0), Some(0.0));
        assert_eq!(eta_seconds(500, 1000.0), Some(0.5));
        assert_eq!(eta_seconds(500, 0.0), None);
    }
}
