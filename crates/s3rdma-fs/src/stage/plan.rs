//! How a staged file is stored: which ranges of the new version are copied on the server from
//! the base version (UploadPartCopy) and which are sent. Pure, so tested without a store.
//!
//! The file is cut into units of the part size, aligned at 0. A unit that lies wholly within
//! the base's bytes still valid (`base_limit`) and holds no written byte is *clean*: runs of
//! clean units are copied (up to 5 GiB a part); every other unit is one part sent from the
//! staging file (with the base's bytes it holds fetched first). Every part but the last is a
//! whole number of units, so at least S3's 5 MiB.

use std::ops::Range;

use super::ranges::RangeSet;

/// S3's largest part, and so the largest copied range.
const MAX_PART: u64 = 5 << 30;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    /// Copied from the base version on the server.
    Copy(Range<u64>),
    /// Sent from the staging file.
    Send(Range<u64>),
}

impl Part {
    pub fn range(&self) -> &Range<u64> {
        match self {
            Part::Copy(r) | Part::Send(r) => r,
        }
    }
}

/// The parts of a `size`-byte file whose bytes below `base_limit` are the base's except where
/// `dirty`; `unit` is at least 5 MiB.
pub fn compose(size: u64, base_limit: u64, dirty: &RangeSet, unit: u64) -> Vec<Part> {
    let unit = unit.max(1);
    let max_copy = (MAX_PART / unit).max(1) * unit;
    let mut parts: Vec<Part> = Vec::new();
    let mut at = 0;
    while at < size {
        let r = at..(at + unit).min(size);
        let clean = r.end <= base_limit && !dirty.overlaps(&r);
        match (clean, parts.last_mut()) {
            (true, Some(Part::Copy(c))) if c.end - c.start < max_copy => c.end = r.end,
            (true, _) => parts.push(Part::Copy(r.clone())),
            (false, _) => parts.push(Part::Send(r.clone())),
        }
        at = r.end;
    }
    parts
}

/// The smallest unit (a multiple of `block`, doubling) that keeps `size` within S3's 10,000
/// parts; `None` if even `max_blocks` blocks cannot.
pub fn unit_for(size: u64, block: u64, max_blocks: u64) -> Option<u64> {
    let mut k = 1;
    while size.div_ceil(block * k) > 10_000 {
        if k * 2 > max_blocks {
            return None;
        }
        k *= 2;
    }
    Some(block * k)
}

#[cfg(test)]
#[allow(clippy::single_range_in_vec_init)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn dirty(rs: &[Range<u64>]) -> RangeSet {
        let mut s = RangeSet::default();
        for r in rs {
            s.insert(r.clone());
        }
        s
    }

    #[test]
    fn an_edit_in_the_middle_sends_one_unit_and_copies_the_rest() {
        let p = compose(
            64 * MIB,
            64 * MIB,
            &dirty(&[30 * MIB..30 * MIB + 4096]),
            16 * MIB,
        );
        assert_eq!(
            p,
            vec![
                Part::Copy(0..16 * MIB),
                Part::Send(16 * MIB..32 * MIB),
                Part::Copy(32 * MIB..64 * MIB)
            ]
        );
        // Across a unit boundary: two units sent.
        let p = compose(
            64 * MIB,
            64 * MIB,
            &dirty(&[32 * MIB - 1..32 * MIB + 1]),
            16 * MIB,
        );
        let sent: u64 = p
            .iter()
            .filter(|p| matches!(p, Part::Send(_)))
            .map(|p| p.range().end - p.range().start)
            .sum();
        assert_eq!(sent, 32 * MIB);
    }

    #[test]
    fn an_append_copies_the_old_object_and_sends_the_new_bytes() {
        let size = (1 << 30) + MIB;
        let p = compose(size, 1 << 30, &dirty(&[(1 << 30)..size]), 16 * MIB);
        assert_eq!(p, vec![Part::Copy(0..1 << 30), Part::Send((1 << 30)..size)]);
        // An unaligned old size: the unit holding the old end is sent whole.
        let p = compose(40 * MIB, 20 * MIB, &dirty(&[20 * MIB..40 * MIB]), 16 * MIB);
        assert_eq!(
            p,
            vec![
                Part::Copy(0..16 * MIB),
                Part::Send(16 * MIB..32 * MIB),
                Part::Send(32 * MIB..40 * MIB)
            ]
        );
    }

    #[test]
    fn parts_tile_the_file_and_all_but_the_last_are_large_enough() {
        for (size, limit, d) in [
            (0, 0, vec![]),
            (1, 0, vec![0..1]),
            (100 * MIB + 3, 50 * MIB, vec![7..9, 80 * MIB..81 * MIB]),
            (12 << 30, 12 << 30, vec![]),
        ] {
            let p = compose(size, limit, &dirty(&d), 16 * MIB);
            let mut at = 0;
            for (i, part) in p.iter().enumerate() {
                assert_eq!(part.range().start, at);
                at = part.range().end;
                let len = part.range().end - part.range().start;
                assert!(len <= 5 << 30);
                if i + 1 < p.len() {
                    assert!(len >= 5 * MIB);
                }
            }
            assert_eq!(at, size);
        }
        // A truncated base: units past its valid end are sent, not copied.
        let p = compose(32 * MIB, 10 * MIB, &RangeSet::default(), 16 * MIB);
        assert_eq!(
            p,
            vec![Part::Send(0..16 * MIB), Part::Send(16 * MIB..32 * MIB)]
        );
    }

    #[test]
    fn the_unit_grows_to_stay_within_ten_thousand_parts() {
        assert_eq!(unit_for(1 << 30, 16 * MIB, 8), Some(16 * MIB));
        assert_eq!(unit_for(200 << 30, 16 * MIB, 8), Some(32 * MIB));
        assert_eq!(unit_for(2000 << 30, 16 * MIB, 8), None);
    }
}
