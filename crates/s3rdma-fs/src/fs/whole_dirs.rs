//! Directories whose every name this mount knows, so that a lookup of a missing name needs no
//! request: one made here (empty when made), or one listed in full — each for
//! `--negative-metadata-ttl` from when it was made or listed, with this mount's own changes
//! since in the inode table (a name this mount created, renamed or removed there is answered
//! from the table, never from here). A name created by another client meanwhile is missed for
//! at most that long, as a remembered negative answer is.
//!
//! A small directory (one listing page, up to [`MAX_NAMES`] names) is listed again when its
//! knowledge has expired and a missing name is asked for: `rsync` and `tar` look up every
//! name before creating it, and one listing per directory per TTL replaces a probe per name.
//!
//! A name is kept as a 64-bit hash of it (8 bytes, not a copy of the name): two names that
//! share a hash only make a missing name "listed", so it is asked about — never the reverse.

use std::collections::HashSet;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The most names kept for one directory (one ListObjectsV2 page): a larger directory is not
/// known, and its lookups ask S3 name by name.
pub const MAX_NAMES: usize = 1000;

/// The most names kept for all directories together.
const MAX_TOTAL_NAMES: u64 = 200_000;

struct Names {
    at: Instant,
    /// `None`: too many to keep (the directory is not known).
    names: Option<HashSet<u64>>,
}

/// What the known directories say of a name.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    /// Not there (as far as this mount can know without asking).
    Absent,
    /// Listed: ask about it.
    Listed,
    /// A small directory whose knowledge has expired: list it again, then ask once more.
    Expired,
    /// Nothing known.
    Unknown,
}

pub struct WholeDirs {
    ttl: Duration,
    hasher: std::collections::hash_map::RandomState,
    cache: Option<moka::sync::Cache<u64, Arc<Names>>>,
}

impl WholeDirs {
    /// `ttl`: how long a directory's names are trusted (0: never).
    pub fn new(ttl: Duration) -> Self {
        let cache = (!ttl.is_zero()).then(|| {
            moka::sync::Cache::builder()
                .max_capacity(MAX_TOTAL_NAMES)
                .weigher(|_, n: &Arc<Names>| n.names.as_ref().map_or(1, |s| s.len().max(1) as u32))
                // Kept past the TTL, so that an expired small directory is listed again
                // rather than probed name by name.
                .time_to_idle(ttl.saturating_mul(30).max(Duration::from_secs(60)))
                .build()
        });
        WholeDirs {
            ttl,
            hasher: Default::default(),
            cache,
        }
    }

    /// Directory `ino` was made here at `at`: it had no names.
    pub fn made(&self, ino: u64, at: Instant) {
        self.listed(ino, at, std::iter::empty::<&str>());
    }

    /// Directory `ino` was listed in full, the listing asked for at `at`.
    pub fn listed<'a>(&self, ino: u64, at: Instant, names: impl IntoIterator<Item = &'a str>) {
        let Some(c) = &self.cache else { return };
        let mut set = HashSet::new();
        for n in names {
            if set.len() == MAX_NAMES {
                return self.large(ino, at);
            }
            set.insert(self.hasher.hash_one(n));
        }
        c.insert(
            ino,
            Arc::new(Names {
                at,
                names: Some(set),
            }),
        );
    }

    /// Directory `ino` has more than [`MAX_NAMES`] names (listed at `at`).
    pub fn large(&self, ino: u64, at: Instant) {
        if let Some(c) = &self.cache {
            c.insert(ino, Arc::new(Names { at, names: None }));
        }
    }

    /// Directory `ino` was removed.
    pub fn forget(&self, ino: u64) {
        if let Some(c) = &self.cache {
            c.invalidate(&ino);
        }
    }

    /// The inode table is letting go of `name` in directory `ino` (the kernel forgot it): from
    /// now on the name is answered from here, so one this mount made after the listing must be
    /// here too (as listed: a lookup asks about it). Called before the name leaves the table,
    /// so no lookup in between finds neither; atomic per directory (concurrent forgets of two
    /// names of one directory both stay).
    pub fn keep_name(&self, ino: u64, name: &str) {
        let Some(c) = &self.cache else { return };
        let h = self.hasher.hash_one(name);
        c.entry(ino).and_compute_with(|cur| {
            let Some(cur) = cur else {
                return moka::ops::compute::Op::Nop;
            };
            let n = cur.value();
            let Some(names) = &n.names else {
                return moka::ops::compute::Op::Nop;
            };
            if names.contains(&h) {
                return moka::ops::compute::Op::Nop;
            }
            if names.len() == MAX_NAMES {
                return moka::ops::compute::Op::Put(Arc::new(Names {
                    at: n.at,
                    names: None,
                }));
            }
            let mut names = names.clone();
            names.insert(h);
            moka::ops::compute::Op::Put(Arc::new(Names {
                at: n.at,
                names: Some(names),
            }))
        });
    }

    /// What is known of `name` in directory `ino` (whose inode has no child of that name).
    pub fn answer(&self, ino: u64, name: &str, now: Instant) -> Answer {
        let Some(n) = self.cache.as_ref().and_then(|c| c.get(&ino)) else {
            return Answer::Unknown;
        };
        let Some(names) = &n.names else {
            return Answer::Unknown;
        };
        if now.saturating_duration_since(n.at) >= self.ttl {
            Answer::Expired
        } else if names.contains(&self.hasher.hash_one(name)) {
            Answer::Listed
        } else {
            Answer::Absent
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_trusted_for_the_ttl_then_expire() {
        let k = WholeDirs::new(Duration::from_secs(1));
        let t = Instant::now();
        assert_eq!(k.answer(5, "a", t), Answer::Unknown);
        k.made(5, t);
        assert_eq!(k.answer(5, "a", t), Answer::Absent);
        k.listed(5, t, ["a", "b"]);
        assert_eq!(k.answer(5, "a", t), Answer::Listed);
        assert_eq!(
            k.answer(5, "c", t + Duration::from_millis(999)),
            Answer::Absent
        );
        assert_eq!(
            k.answer(5, "c", t + Duration::from_secs(1)),
            Answer::Expired
        );
        // A name the inode table let go of is asked about, not taken as absent.
        k.keep_name(5, "made-here");
        assert_eq!(k.answer(5, "made-here", t), Answer::Listed);
        k.forget(5);
        assert_eq!(k.answer(5, "c", t), Answer::Unknown);
    }

    #[test]
    fn large_directories_and_a_zero_ttl_are_never_known() {
        let k = WholeDirs::new(Duration::from_secs(1));
        let t = Instant::now();
        let names: Vec<String> = (0..=MAX_NAMES).map(|i| i.to_string()).collect();
        k.listed(7, t, names.iter().map(String::as_str));
        assert_eq!(k.answer(7, "x", t), Answer::Unknown);
        let off = WholeDirs::new(Duration::ZERO);
        off.made(1, t);
        assert_eq!(off.answer(1, "x", t), Answer::Unknown);
    }
}
