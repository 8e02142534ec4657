//! Deterministic changelogs for crash tests and benchmarks: the operations of commit `n` depend only
//! on the seed and `n`, so the expected store state at any applied offset can be recomputed after a
//! kill. Not part of the public API.

use std::collections::BTreeMap;

/// splitmix64: tiny, fast and stable across versions, which a seeded test needs more than quality.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform-enough in `0..n` for test data.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// One changelog operation: `None` is a tombstone.
pub type Op = (Vec<u8>, Option<Vec<u8>>);

#[derive(Debug, Clone, Copy)]
pub struct Workload {
    pub seed: u64,
    pub ops_per_commit: usize,
    pub key_space: u64,
    pub value_size: usize,
    /// Out of 100.
    pub delete_percent: u64,
}

impl Workload {
    /// The workload the crash writer commits and the crash tests replay: small operations over a
    /// small key space, so that keys are overwritten and deleted many times between kills. One
    /// definition, since the tests rebuild the writer's commits from its seed alone.
    pub fn crash(seed: u64) -> Workload {
        Workload {
            seed,
            ops_per_commit: 50,
            key_space: 2000,
            value_size: 100,
            delete_percent: 10,
        }
    }

    /// The operations committed at `offset`. Values name their offset, so stale data is visible.
    pub fn ops(&self, offset: i64) -> Vec<Op> {
        let mut rng = Rng::new(self.seed ^ (offset as u64).wrapping_mul(0xA24B_AED4_963E_E407));
        (0..self.ops_per_commit)
            .map(|i| {
                let key = format!("key-{:08}", rng.below(self.key_space)).into_bytes();
                if rng.below(100) < self.delete_percent {
                    (key, None)
                } else {
                    let mut value = format!("{offset}:{i}:").into_bytes();
                    while value.len() < self.value_size {
                        value.push(b'a' + rng.below(26) as u8);
                    }
                    (key, Some(value))
                }
            })
            .collect()
    }

    /// The store state after every commit from 0 through `applied`.
    pub fn model(&self, applied: Option<i64>) -> BTreeMap<Vec<u8>, Vec<u8>> {
        let mut state = BTreeMap::new();
        for offset in 0..=applied.unwrap_or(-1) {
            apply(&mut state, self.ops(offset));
        }
        state
    }
}

/// Last write wins per key; tombstones delete.
pub fn apply(state: &mut BTreeMap<Vec<u8>, Vec<u8>>, ops: impl IntoIterator<Item = Op>) {
    for (key, value) in ops {
        match value {
            Some(value) => state.insert(key, value),
            None => state.remove(&key),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_are_a_function_of_seed_and_offset() {
        let w = Workload {
            seed: 7,
            ops_per_commit: 50,
            key_space: 100,
            value_size: 32,
            delete_percent: 10,
        };
        assert_eq!(w.ops(3), w.ops(3));
        assert_ne!(w.ops(3), w.ops(4));
        let deletes = (0..100)
            .flat_map(|o| w.ops(o))
            .filter(|(_, v)| v.is_none())
            .count();
        assert!(
            (300..700).contains(&deletes),
            "about 10% deletes, got {deletes}"
        );
        let mut state = w.model(Some(1));
        assert_eq!(state, {
            let mut s = w.model(Some(0));
            apply(&mut s, w.ops(1));
            s
        });
        apply(&mut state, vec![(b"x".to_vec(), None)]);
        assert!(w.model(None).is_empty());
    }
}
