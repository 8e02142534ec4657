//! Turns: a process-wide limit on how many partitions catch up at once (`max_parallel_restores`),
//! one slot per turn. Every partition that is loading holds a prefetch queue, an uncommitted buffer
//! and a growing memtable; with hundreds loading together those add up to hundreds of MiB. With a
//! fixed number of loaders the peak is bounded by the loaders, not the partition count, and on a
//! few cores the total time is the same. Who needs a turn is `policy::needs_turn`.

use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

#[derive(Debug)]
pub struct Slots {
    free: Mutex<usize>,
    freed: Condvar,
}

/// Held while a partition catches up; the slot returns on drop.
#[derive(Debug)]
pub struct Slot(Arc<Slots>);

impl Slots {
    pub fn new(count: usize) -> Arc<Slots> {
        Arc::new(Slots {
            free: Mutex::new(count.max(1)),
            freed: Condvar::new(),
        })
    }

    /// Waits for a free slot; `None` when `stop` is set first.
    pub fn acquire(self: &Arc<Self>, stop: &AtomicBool) -> Option<Slot> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if stop.load(Relaxed) {
                return None;
            }
            if *free > 0 {
                *free -= 1;
                return Some(Slot(self.clone()));
            }
            // Woken by a release, or every 100 ms to look at the stop flag.
            free = self
                .freed
                .wait_timeout(free, Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut free = self.0.free.lock().unwrap_or_else(|e| e.into_inner());
        *free += 1;
        self.0.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_count_slots_are_held_and_a_release_frees_one() {
        let slots = Slots::new(2);
        let stop = AtomicBool::new(false);
        let a = slots.acquire(&stop).expect("first");
        let _b = slots.acquire(&stop).expect("second");
        let waiter = {
            let slots = slots.clone();
            std::thread::spawn(move || slots.acquire(&AtomicBool::new(false)).is_some())
        };
        std::thread::sleep(Duration::from_millis(150));
        assert!(!waiter.is_finished(), "a third loader waits");
        drop(a);
        assert!(waiter.join().unwrap(), "and gets the released slot");
    }

    #[test]
    fn stop_ends_the_wait() {
        let slots = Slots::new(1);
        let _held = slots.acquire(&AtomicBool::new(false));
        let stop = AtomicBool::new(true);
        assert!(slots.acquire(&stop).is_none());
    }
}
