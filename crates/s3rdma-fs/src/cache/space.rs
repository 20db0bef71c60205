//! The page cache's free space: a buddy allocator over the arena's units.
//!
//! The arena is cut into read parts (`--read-part-size`, 8 MiB by default), each part into
//! `2^top` units (16 KiB by default). An entry takes a run of `2^order` units aligned to its own
//! length, so a small file takes space near its size (a 16 KiB file one unit, a 256 KiB file
//! sixteen) while a part of a large file still takes one whole, aligned part: one contiguous RDMA
//! window inside one registered slab. A freed run merges with its free buddy, up to a whole
//! part, so space never stays cut into pieces nobody asks for.
//!
//! Free runs are kept by order in ordered sets, lowest address first, so allocation packs the
//! start of the arena and leaves whole parts free at the end as long as it can.

use std::collections::BTreeSet;

#[derive(Debug)]
pub struct Space {
    /// Free runs of each order (0 ..= top), by their first unit.
    free: Vec<BTreeSet<usize>>,
    top: u32,
    /// Units in free runs.
    free_units: usize,
}

impl Space {
    /// `parts` parts of `2^top` units each, all free.
    pub fn new(parts: usize, top: u32) -> Space {
        let mut free = vec![BTreeSet::new(); top as usize + 1];
        free[top as usize] = (0..parts).map(|p| p << top).collect();
        Space {
            free,
            top,
            free_units: parts << top,
        }
    }

    pub fn free_units(&self) -> usize {
        self.free_units
    }

    /// A free run of `2^order` units, cut from the smallest free run that holds it.
    pub fn alloc(&mut self, order: u32) -> Option<usize> {
        let from = (order..=self.top).find(|&o| !self.free[o as usize].is_empty())?;
        let unit = self.free[from as usize].pop_first()?;
        // The upper halves of what was cut stay free.
        for o in (order..from).rev() {
            self.free[o as usize].insert(unit + (1 << o));
        }
        self.free_units -= 1 << order;
        Some(unit)
    }

    /// Give back the run of `2^order` units at `unit`, merged with its free buddies.
    pub fn free(&mut self, mut unit: usize, mut order: u32) {
        debug_assert!(unit.is_multiple_of(1 << order) && order <= self.top);
        self.free_units += 1 << order;
        while order < self.top {
            let buddy = unit ^ (1 << order);
            if !self.free[order as usize].remove(&buddy) {
                break;
            }
            unit = unit.min(buddy);
            order += 1;
        }
        self.free[order as usize].insert(unit);
    }

    /// Keep the first `2^to` units of the run of `2^from` units at `unit` and free the rest.
    pub fn shrink(&mut self, unit: usize, from: u32, to: u32) {
        for o in to..from {
            self.free(unit + (1 << o), o);
        }
    }

    /// Take every free run out (for giving their pages back); put them back with
    /// [`Space::free`].
    pub fn take_all(&mut self) -> Vec<(usize, u32)> {
        let mut out = Vec::new();
        for (o, set) in self.free.iter_mut().enumerate() {
            out.extend(std::mem::take(set).into_iter().map(|u| (u, o as u32)));
        }
        self.free_units = 0;
        out
    }
}

/// The order of the smallest run of units of `unit` bytes holding `len` bytes.
pub fn order_for(len: usize, unit: usize) -> u32 {
    len.div_ceil(unit)
        .max(1)
        .next_power_of_two()
        .trailing_zeros()
}

/// The unit size for read parts of `part` bytes: the part halved while the half stays a whole
/// number of pages and at least [`MIN_UNIT`], at most [`MAX_SPLIT`] times. Returns the unit
/// and `top` (part = unit << top).
pub fn unit_for(part: usize) -> (usize, u32) {
    let mut top = 0;
    while top < MAX_SPLIT && part.is_multiple_of(2 << top) {
        let half = part >> (top + 1);
        if half < MIN_UNIT || !half.is_multiple_of(4096) {
            break;
        }
        top += 1;
    }
    (part >> top, top)
}

/// The smallest unit of cache space: what a file of a few KiB costs.
pub const MIN_UNIT: usize = 16 << 10;

/// At most this many halvings of a read part (an 8 MiB part gives 16 KiB units).
const MAX_SPLIT: u32 = 9;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_for_part_sizes() {
        assert_eq!(unit_for(8 << 20), (16 << 10, 9));
        assert_eq!(unit_for(1 << 20), (16 << 10, 6));
        assert_eq!(unit_for(64 << 10), (16 << 10, 2));
        assert_eq!(unit_for(16 << 10), (16 << 10, 0));
        assert_eq!(unit_for(5 << 20), (20 << 10, 8));
        // Not a whole number of pages once halved: one unit per part, as before.
        assert_eq!(unit_for(1_000_000), (1_000_000, 0));
        assert_eq!(order_for(1, 64 << 10), 0);
        assert_eq!(order_for(64 << 10, 64 << 10), 0);
        assert_eq!(order_for((64 << 10) + 1, 64 << 10), 1);
        assert_eq!(order_for(256 << 10, 64 << 10), 2);
        assert_eq!(order_for(8 << 20, 64 << 10), 7);
        assert_eq!(order_for(0, 64 << 10), 0);
    }

    #[test]
    fn runs_split_merge_and_shrink() {
        let mut s = Space::new(2, 3); // two parts of 8 units
        assert_eq!(s.free_units(), 16);
        let a = s.alloc(0).unwrap();
        let b = s.alloc(1).unwrap();
        let c = s.alloc(0).unwrap();
        assert_eq!((a, b, c), (0, 2, 1));
        let d = s.alloc(3).unwrap();
        assert_eq!(d, 8, "a whole part comes from the untouched one");
        assert_eq!(s.alloc(3), None, "no whole part left");
        assert_eq!(s.free_units(), 4);
        s.free(a, 0);
        s.free(c, 0);
        s.free(b, 1);
        assert_eq!(s.alloc(3), Some(0), "freed pieces merge back into the part");
        s.free(0, 3);
        s.shrink(d, 3, 1);
        assert_eq!(s.free_units(), 14);
        assert_eq!(
            s.alloc(2),
            Some(12),
            "from the smallest free run that holds it"
        );
        let all = s.take_all();
        assert_eq!(s.free_units(), 0);
        let units: usize = all.iter().map(|&(_, o)| 1 << o).sum();
        assert_eq!(units, 10);
        for (u, o) in all {
            s.free(u, o);
        }
        assert_eq!(s.free_units(), 10);
    }
}
