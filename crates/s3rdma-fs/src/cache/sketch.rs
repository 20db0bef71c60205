//! How often each block has been read lately, approximately: a count-min sketch of 4-bit
//! counters (TinyLFU's frequency filter). It remembers blocks the cache no longer holds, which
//! is what lets the cache keep part of a dataset that is read epoch after epoch but is larger
//! than the cache (plain LRU keeps none of it). Counters are halved every `10 × blocks` reads,
//! so old popularity fades.

use std::collections::hash_map::DefaultHasher;
use std::hash::{BuildHasher, BuildHasherDefault, Hash};

/// Counters saturate here (4 bits' worth).
const MAX: u8 = 15;
/// Positions probed per key.
const PROBES: usize = 4;

#[derive(Debug)]
pub struct Sketch {
    counters: Vec<u8>,
    mask: usize,
    /// Fixed keys: the same reads give the same estimates (reproducible measurements).
    hasher: BuildHasherDefault<DefaultHasher>,
    samples: usize,
    reset_at: usize,
}

impl Sketch {
    /// A sketch for a cache of `blocks` blocks.
    pub fn new(blocks: usize) -> Sketch {
        let size = (blocks.max(64) * 32).next_power_of_two();
        Sketch {
            counters: vec![0; size],
            mask: size - 1,
            hasher: Default::default(),
            samples: 0,
            reset_at: blocks.max(64) * 10,
        }
    }

    fn probes<K: Hash>(&self, key: &K) -> [usize; PROBES] {
        let h = self.hasher.hash_one(key);
        let (h1, h2) = (h as usize, ((h >> 32) as usize) | 1);
        std::array::from_fn(|i| h1.wrapping_add(i.wrapping_mul(h2)) & self.mask)
    }

    /// One read of `key`.
    pub fn record<K: Hash>(&mut self, key: &K) {
        for i in self.probes(key) {
            let c = &mut self.counters[i];
            *c = (*c + 1).min(MAX);
        }
        self.samples += 1;
        if self.samples >= self.reset_at {
            for c in &mut self.counters {
                *c /= 2;
            }
            self.samples /= 2;
        }
    }

    /// About how many times `key` was read lately (never less than the truth, until aging).
    pub fn estimate<K: Hash>(&self, key: &K) -> u8 {
        self.probes(key)
            .iter()
            .map(|&i| self.counters[i])
            .min()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_saturate_and_age() {
        let mut s = Sketch::new(64);
        for _ in 0..3 {
            s.record(&"a");
        }
        assert!(s.estimate(&"a") >= 3);
        assert_eq!(s.estimate(&"never"), 0);
        for _ in 0..40 {
            s.record(&"b");
        }
        assert_eq!(s.estimate(&"b"), MAX);
        // The 640th read halves every counter (a saturated one drops to 7).
        for i in 0..(640 - 43u32) {
            s.record(&i);
        }
        assert!(s.estimate(&"b") <= MAX / 2, "{}", s.estimate(&"b"));
    }
}
