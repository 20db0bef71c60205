//! A set of byte ranges (half-open, sorted, disjoint, merged): which bytes of a staged file are
//! held locally, and which were written since its base version.

use std::ops::Range;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeSet(Vec<Range<u64>>);

impl RangeSet {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Bytes in the set.
    pub fn total(&self) -> u64 {
        self.0.iter().map(|r| r.end - r.start).sum()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Range<u64>> {
        self.0.iter()
    }

    /// Add `r`; returns how many bytes were not in the set before.
    pub fn insert(&mut self, r: Range<u64>) -> u64 {
        if r.start >= r.end {
            return 0;
        }
        let before = self.total();
        let (mut start, mut end) = (r.start, r.end);
        // Every range touching or overlapping [start, end) merges into it.
        let first = self.0.partition_point(|x| x.end < start);
        let mut last = first;
        while last < self.0.len() && self.0[last].start <= end {
            start = start.min(self.0[last].start);
            end = end.max(self.0[last].end);
            last += 1;
        }
        self.0.splice(first..last, std::iter::once(start..end));
        self.total() - before
    }

    /// Drop everything at or past `n`; returns how many bytes went.
    pub fn truncate(&mut self, n: u64) -> u64 {
        let before = self.total();
        self.0.retain(|r| r.start < n);
        if let Some(last) = self.0.last_mut() {
            last.end = last.end.min(n);
        }
        before - self.total()
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// Whether any byte of `r` is in the set.
    pub fn overlaps(&self, r: &Range<u64>) -> bool {
        let i = self.0.partition_point(|x| x.end <= r.start);
        i < self.0.len() && self.0[i].start < r.end
    }

    /// The parts of `r` that are not in the set, in order.
    pub fn missing(&self, r: Range<u64>) -> Vec<Range<u64>> {
        let mut out = Vec::new();
        let mut at = r.start;
        let i = self.0.partition_point(|x| x.end <= r.start);
        for x in &self.0[i..] {
            if x.start >= r.end {
                break;
            }
            if x.start > at {
                out.push(at..x.start);
            }
            at = at.max(x.end);
        }
        if at < r.end {
            out.push(at..r.end);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn merges_and_reports_new_bytes() {
        let mut s = RangeSet::default();
        assert_eq!(s.insert(10..20), 10);
        assert_eq!(s.insert(30..40), 10);
        assert_eq!(s.insert(15..35), 10);
        assert_eq!(s.iter().cloned().collect::<Vec<_>>(), vec![10..40]);
        assert_eq!(s.insert(40..41), 1);
        assert_eq!(s.missing(0..50), vec![0..10, 41..50]);
        assert!(s.overlaps(&(40..45)));
        assert!(!s.overlaps(&(41..45)));
        assert_eq!(s.truncate(12), 29);
        assert_eq!(s.iter().cloned().collect::<Vec<_>>(), vec![10..12]);
    }

    proptest! {
        /// The set agrees with a bitmap under any sequence of inserts and truncations.
        #[test]
        fn agrees_with_a_bitmap(ops in proptest::collection::vec((0u64..64, 0u64..64, any::<bool>()), 1..40)) {
            let mut s = RangeSet::default();
            let mut bits = [false; 64];
            for (a, b, trunc) in ops {
                if trunc {
                    let gone = s.truncate(a);
                    let want = bits[a as usize..].iter().filter(|x| **x).count() as u64;
                    prop_assert_eq!(gone, want);
                    bits[a as usize..].iter_mut().for_each(|x| *x = false);
                } else {
                    let (a, b) = (a.min(b), a.max(b));
                    let new = s.insert(a..b);
                    let want = bits[a as usize..b as usize].iter().filter(|x| !**x).count() as u64;
                    prop_assert_eq!(new, want);
                    bits[a as usize..b as usize].iter_mut().for_each(|x| *x = true);
                }
                prop_assert_eq!(s.total(), bits.iter().filter(|x| **x).count() as u64);
                let missing: u64 = s.missing(0..64).iter().map(|r| r.end - r.start).sum();
                prop_assert_eq!(missing, 64 - s.total());
                for w in s.iter().collect::<Vec<_>>().windows(2) {
                    prop_assert!(w[0].end < w[1].start);
                }
            }
        }
    }
}
