//! Turns: a process-wide bound on the memory of partitions catching up at once. A catching-up
//! partition holds a prefetch queue, an uncommitted buffer and a memtable that keeps everything it
//! has taken until the flush at catch-up, so its memory follows the size of its catch-up, up to what
//! one turn's share of the memtable budget holds. `catch_up_turns` counts full turns; a
//! partition whose catch-up is smaller takes the part of the budget its size calls for (at least
//! `1 / MIN_TURN_PARTS` of a turn, `policy::turn_weight`). So the peak follows the budget, not the
//! changelog: small partitions restore many at a time, large ones a few at a time. Who needs a turn
//! at all is `policy::needs_turn`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

use super::tasks::Stop;

/// How often the head of the line weighs itself again while nothing is released.
const REWEIGH_EVERY: Duration = Duration::from_millis(100);

#[derive(Debug)]
pub struct Turns {
    budget: Mutex<Budget>,
    /// Woken when bytes come back or the head of the line changes.
    freed: Notify,
    total: u64,
    /// Memory one full turn stands for: the memtable budget over `catch_up_turns`.
    pub turn_bytes: u64,
}

#[derive(Debug, Default)]
struct Budget {
    /// Free bytes. Signed: a holder that learns it needs more takes it at once.
    free: i64,
    /// Tickets of the partitions waiting, first come first served: a large catch-up (or one of a
    /// topic whose record size is not known yet) is never overtaken for ever by small ones that
    /// keep fitting into what is left.
    queue: VecDeque<u64>,
    next_ticket: u64,
}

/// Held while a partition catches up; its bytes return to the budget on drop.
#[derive(Debug)]
pub struct Turn {
    turns: Arc<Turns>,
    bytes: u64,
    granted: Instant,
}

/// A place in the line; leaving it (granted, stopped, or the waiting task dropped) lets the next
/// one look.
struct InLine<'a> {
    turns: &'a Turns,
    ticket: u64,
}

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        self.turns.lock().queue.retain(|t| *t != self.ticket);
        self.turns.freed.notify_waiters();
    }
}

enum Look {
    Stopped,
    Granted(u64),
    Wait { head: bool },
}

impl Turns {
    pub fn new(turns: usize, turn_bytes: u64) -> Arc<Turns> {
        let turn_bytes = turn_bytes.max(1);
        let total = turns.max(1) as u64 * turn_bytes;
        Arc::new(Turns {
            budget: Mutex::new(Budget {
                free: total as i64,
                ..Budget::default()
            }),
            freed: Notify::new(),
            total,
            turn_bytes,
        })
    }

    /// Waits, in turn, until the bytes `weigh` asks for are free; `None` when a stop is requested
    /// first. `weigh` is asked again while the partition heads the line: what a catch-up needs
    /// becomes clearer while it waits (the first records of its topic show their size).
    pub async fn acquire(
        self: &Arc<Self>,
        mut weigh: impl FnMut() -> u64,
        stop: &Stop,
    ) -> Option<Turn> {
        let line = {
            let mut budget = self.lock();
            let ticket = budget.next_ticket;
            budget.next_ticket += 1;
            budget.queue.push_back(ticket);
            InLine {
                turns: self,
                ticket,
            }
        };
        loop {
            // Registered before looking, so a release between the look and the wait is not missed.
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            match self.look(line.ticket, &mut weigh, stop) {
                Look::Stopped => return None,
                Look::Granted(bytes) => {
                    // Leaving the line wakes the next in line, which may fit into what is left.
                    drop(line);
                    return Some(Turn {
                        turns: self.clone(),
                        bytes,
                        granted: Instant::now(),
                    });
                }
                // Only the head of the line weighs itself again: the others could not go first
                // anyway, and a thousand waiters waking on a timer would cost a core.
                Look::Wait { head: true } => tokio::select! {
                    _ = &mut freed => {}
                    _ = stop.requested() => {}
                    _ = tokio::time::sleep(REWEIGH_EVERY) => {}
                },
                Look::Wait { head: false } => tokio::select! {
                    _ = &mut freed => {}
                    _ = stop.requested() => {}
                },
            }
        }
    }

    fn look(&self, ticket: u64, weigh: &mut impl FnMut() -> u64, stop: &Stop) -> Look {
        if stop.is_requested() {
            return Look::Stopped;
        }
        let mut budget = self.lock();
        if budget.queue.front() != Some(&ticket) {
            return Look::Wait { head: false };
        }
        let bytes = weigh().clamp(1, self.total);
        if budget.free < bytes as i64 {
            return Look::Wait { head: true };
        }
        budget.queue.pop_front();
        budget.free -= bytes as i64;
        Look::Granted(bytes)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Budget> {
        self.budget.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn give_back(&self, bytes: i64) {
        self.lock().free += bytes;
        if bytes > 0 {
            // Waiters want different amounts: each looks for itself.
            self.freed.notify_waiters();
        }
    }
}

impl Turn {
    /// Holds `bytes` from now on: less once the partition's own records show its catch-up is
    /// smaller than estimated (the rest goes to waiting partitions), more if larger.
    pub fn resize(&mut self, bytes: u64) {
        let bytes = bytes.clamp(1, self.turns.total);
        self.turns.give_back(self.bytes as i64 - bytes as i64);
        self.bytes = bytes;
    }

    /// The memory this turn stands for: what the catch-up holding it is estimated to hold.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// When the partition holding it got it, so that its restore can tell its wait apart.
    pub fn granted(&self) -> Instant {
        self.granted
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.turns.give_back(self.bytes as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::restore::tasks::stop_pair;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

    const TURN: u64 = 1 << 20;

    fn acquire_with(turns: &Arc<Turns>, weigh: impl FnMut() -> u64, stop: bool) -> Option<Turn> {
        let (handle, stop_seen) = stop_pair();
        if stop {
            handle.request();
        }
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime")
            .block_on(turns.acquire(weigh, &stop_seen))
    }

    fn take(turns: &Arc<Turns>, bytes: u64) -> Option<Turn> {
        acquire_with(turns, || bytes, false)
    }

    fn waiter(turns: &Arc<Turns>, bytes: u64) -> std::thread::JoinHandle<bool> {
        let turns = turns.clone();
        std::thread::spawn(move || take(&turns, bytes).is_some())
    }

    fn still_waiting(waiter: &std::thread::JoinHandle<bool>) -> bool {
        std::thread::sleep(Duration::from_millis(150));
        !waiter.is_finished()
    }

    #[test]
    fn full_turns_are_limited_by_count_and_a_release_frees_one() {
        let turns = Turns::new(2, TURN);
        let a = take(&turns, TURN).expect("first");
        let _b = take(&turns, TURN).expect("second");
        let third = waiter(&turns, TURN);
        assert!(still_waiting(&third), "a third full turn waits");
        drop(a);
        assert!(third.join().unwrap(), "and gets the released turn");
    }

    #[test]
    fn small_catch_ups_share_a_turn() {
        let turns = Turns::new(1, TURN);
        let held: Vec<Turn> = (0..8)
            .map(|_| take(&turns, TURN / 8).expect("an eighth"))
            .collect();
        let next = waiter(&turns, TURN / 8);
        assert!(still_waiting(&next), "the turn is used up");
        drop(held);
        assert!(next.join().unwrap());
    }

    #[test]
    fn shrinking_a_turn_lets_a_waiter_in() {
        let turns = Turns::new(1, TURN);
        let mut whole = take(&turns, TURN).expect("whole turn");
        let small = waiter(&turns, TURN / 4);
        assert!(still_waiting(&small));
        whole.resize(TURN / 2);
        assert!(small.join().unwrap(), "the bytes given back are enough");
        assert_eq!(whole.bytes(), TURN / 2);
    }

    #[test]
    fn growing_a_turn_never_waits_but_holds_back_others() {
        let turns = Turns::new(1, TURN);
        let mut first = take(&turns, TURN / 2).expect("half");
        let second = take(&turns, TURN / 2).expect("other half");
        first.resize(TURN);
        drop(second);
        let next = waiter(&turns, TURN / 2);
        assert!(still_waiting(&next), "the grown turn holds the whole turn");
        drop(first);
        assert!(next.join().unwrap());
    }

    #[test]
    fn a_waiter_weighs_itself_again_while_it_waits() {
        let turns = Turns::new(1, TURN);
        let _half = take(&turns, TURN / 2);
        let need = Arc::new(AtomicU64::new(TURN));
        let waiter = {
            let (turns, need) = (turns.clone(), need.clone());
            std::thread::spawn(move || acquire_with(&turns, || need.load(Relaxed), false).is_some())
        };
        assert!(still_waiting(&waiter), "a full turn does not fit");
        need.store(TURN / 4, Relaxed);
        assert!(
            waiter.join().unwrap(),
            "a quarter does, with nothing released"
        );
    }

    #[test]
    fn small_catch_ups_do_not_overtake_a_large_one() {
        let turns = Turns::new(1, TURN);
        let half = take(&turns, TURN / 2).expect("half");
        let large = waiter(&turns, TURN);
        assert!(still_waiting(&large));
        let small = waiter(&turns, TURN / 4);
        assert!(
            still_waiting(&small),
            "a quarter would fit, but the full turn came first"
        );
        drop(half);
        assert!(large.join().unwrap());
    }

    #[test]
    fn a_waiter_that_stops_leaves_the_line() {
        let turns = Turns::new(1, TURN);
        let _whole = take(&turns, TURN);
        assert!(acquire_with(&turns, || TURN, true).is_none());
        assert!(turns.lock().queue.is_empty());
    }

    #[test]
    fn a_request_larger_than_everything_takes_everything() {
        let turns = Turns::new(1, TURN);
        let turn = take(&turns, 10 * TURN);
        assert_eq!(turn.map(|s| s.bytes()), Some(TURN));
    }

    #[test]
    fn stop_ends_the_wait() {
        let turns = Turns::new(1, TURN);
        let _held = take(&turns, TURN);
        let (handle, stop) = stop_pair();
        let waiting = {
            let turns = turns.clone();
            std::thread::spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                    .expect("a runtime")
                    .block_on(turns.acquire(|| 1, &stop))
                    .is_none()
            })
        };
        assert!(still_waiting(&waiting), "the turn is held");
        handle.request();
        assert!(
            waiting.join().unwrap(),
            "a stop while waiting ends the wait"
        );
        assert!(turns.lock().queue.is_empty(), "and leaves the line");
    }
}
