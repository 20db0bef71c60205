//! Directory listings: one full ListObjectsV2 walk (delimiter `/`) turned into sorted entries,
//! and the listings this mount reuses within `--metadata-ttl`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::fs::names::{self, BadName, Entry};
use s3rdma_client::{ListPage, ObjectInfo};

/// One entry of a listed directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listed {
    File(ListedFile),
    Dir,
}

/// What a listing says of a file (its key is the directory's prefix and its name): kept small,
/// as a cached listing holds one per entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedFile {
    pub size: u64,
    pub last_modified: SystemTime,
    pub etag: Box<str>,
}

impl From<ObjectInfo> for ListedFile {
    fn from(o: ObjectInfo) -> Self {
        ListedFile {
            size: o.size,
            last_modified: o.last_modified,
            etag: o.etag.into_boxed_str(),
        }
    }
}

/// A key the listing could not show, and why.
#[derive(Debug, PartialEq, Eq)]
pub struct Hidden {
    pub key: String,
    pub why: &'static str,
}

/// Accumulates listing pages of the directory `prefix` into entries sorted by name.
///
/// Rules: a name that is both a file and a directory is the directory (the file is hidden);
/// the directory's own marker object is not an entry; keys that are not valid names are hidden.
#[derive(Debug, Default)]
pub struct DirBuilder {
    prefix: String,
    entries: BTreeMap<String, Listed>,
    hidden: Vec<Hidden>,
}

impl DirBuilder {
    pub fn new(prefix: &str) -> Self {
        DirBuilder {
            prefix: prefix.to_string(),
            ..Default::default()
        }
    }

    pub fn add_page(&mut self, page: ListPage) {
        for p in page.prefixes {
            match names::prefix_entry(&self.prefix, &p) {
                Ok(Entry::Dir(name)) => {
                    let name = name.to_string();
                    let key = names::child_key(&self.prefix, &name);
                    if let Some(Listed::File(_)) = self.entries.insert(name, Listed::Dir) {
                        self.hide(key, "a directory of the same name exists");
                    }
                }
                Ok(_) => {}
                Err(why) => self.hide_bad(p, why),
            }
        }
        for o in page.objects {
            match names::object_entry(&self.prefix, &o.key) {
                Ok(Entry::File(name)) => {
                    if self.entries.get(name) == Some(&Listed::Dir) {
                        let key = o.key.clone();
                        self.hide(key, "a directory of the same name exists");
                    } else {
                        self.entries
                            .insert(name.to_string(), Listed::File(o.into()));
                    }
                }
                Ok(_) => {}
                Err(why) => {
                    let key = o.key.clone();
                    self.hide_bad(key, why)
                }
            }
        }
    }

    fn hide_bad(&mut self, key: String, why: BadName) {
        self.hide(key, why.describe());
    }

    fn hide(&mut self, key: String, why: &'static str) {
        self.hidden.push(Hidden { key, why });
    }

    /// The entries, sorted by name, and the keys that were hidden.
    pub fn finish(self) -> (Vec<(String, Listed)>, Vec<Hidden>) {
        (self.entries.into_iter().collect(), self.hidden)
    }
}

/// Entries held by all cached listings together, at most (about 150 bytes each).
const MAX_CACHED_ENTRIES: u64 = 500_000;

/// A complete listing of one directory, as S3 gave it.
pub struct CachedListing {
    /// When it was asked for (before the first page was requested).
    pub at: Instant,
    generation: u64,
    pub entries: Vec<(String, Listed)>,
}

/// Complete directory listings, reused by `readdir` while younger than the metadata TTL —
/// "directory entries are trusted for `--metadata-ttl`", as attributes are — unless this mount
/// has changed the namespace since (any create, write, delete, rename, mkdir, rmdir or setattr
/// drops them all: a listing must never hide what this mount just did).
pub struct ListingCache {
    ttl: Duration,
    generation: AtomicU64,
    cache: Option<moka::sync::Cache<u64, Arc<CachedListing>>>,
}

impl ListingCache {
    pub fn new(ttl: Duration) -> Self {
        let cache = (!ttl.is_zero()).then(|| {
            moka::sync::Cache::builder()
                .max_capacity(MAX_CACHED_ENTRIES)
                .weigher(|_, l: &Arc<CachedListing>| l.entries.len().max(1) as u32)
                .time_to_live(ttl)
                .build()
        });
        ListingCache {
            ttl,
            generation: AtomicU64::new(0),
            cache,
        }
    }

    /// Take before asking S3 for a listing; hand back to `put`.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// The listing of directory `ino`, if it is younger than the TTL and nothing changed since.
    pub fn get(&self, ino: u64, now: Instant) -> Option<Arc<CachedListing>> {
        let l = self.cache.as_ref()?.get(&ino)?;
        (l.generation == self.generation() && now.saturating_duration_since(l.at) < self.ttl)
            .then_some(l)
    }

    /// Keep a listing asked for at `at`, when the generation was `generation`.
    pub fn put(
        &self,
        ino: u64,
        at: Instant,
        generation: u64,
        entries: Vec<(String, Listed)>,
    ) -> Arc<CachedListing> {
        let l = Arc::new(CachedListing {
            at,
            generation,
            entries,
        });
        if let Some(c) = &self.cache {
            c.insert(ino, l.clone());
        }
        l
    }

    /// Directory `ino` left the inode table: its listing goes with it.
    pub fn forget(&self, ino: u64) {
        if let Some(c) = &self.cache {
            c.invalidate(&ino);
        }
    }

    /// This mount is changing the namespace: no listing taken before the change (or during
    /// it, see [`NamespaceChange`]) is used again.
    pub fn changed(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// What is left of the TTL of a listing taken at `at`.
    pub fn remaining(&self, at: Instant, now: Instant) -> Duration {
        self.ttl.saturating_sub(now.saturating_duration_since(at))
    }
}

/// Held across a change to the namespace: marks it changed when taken and when dropped, so a
/// listing that ran alongside the change is not kept either.
pub struct NamespaceChange<'a>(&'a ListingCache);

impl<'a> NamespaceChange<'a> {
    pub fn new(cache: &'a ListingCache) -> Self {
        cache.changed();
        NamespaceChange(cache)
    }
}

impl Drop for NamespaceChange<'_> {
    fn drop(&mut self) {
        self.0.changed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn obj(key: &str, size: u64) -> ObjectInfo {
        ObjectInfo {
            key: key.into(),
            size,
            etag: "\"x\"".into(),
            last_modified: SystemTime::UNIX_EPOCH,
            meta: None,
        }
    }

    // [S-NS-HIDDEN] [S-NS-CLASH]
    #[test]
    fn merges_pages_and_applies_rules() {
        let mut b = DirBuilder::new("d/");
        b.add_page(ListPage {
            objects: vec![obj("d/", 0), obj("d/a", 1), obj("d/clash", 2)],
            prefixes: vec!["d/sub/".into()],
            next_token: Some("t".into()),
        });
        // The directory "clash/" arrives on a later page than the file "clash".
        b.add_page(ListPage {
            objects: vec![obj("d/z z", 3), obj("d/..", 4)],
            prefixes: vec!["d/clash/".into(), "d//".into()],
            next_token: None,
        });
        let (entries, hidden) = b.finish();
        let names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a", "clash", "sub", "z z"]);
        assert_eq!(entries[1].1, Listed::Dir);
        assert_eq!(entries[0].1, Listed::File(obj("d/a", 1).into()));
        let hidden_keys: Vec<&str> = hidden.iter().map(|h| h.key.as_str()).collect();
        assert_eq!(hidden_keys.len(), 3, "{hidden:?}");
        assert!(hidden_keys.contains(&"d/clash"));
        assert!(hidden_keys.contains(&"d/.."));
        assert!(hidden_keys.contains(&"d//"));
    }

    #[test]
    fn listings_are_reused_within_the_ttl_until_the_namespace_changes() {
        let c = ListingCache::new(Duration::from_secs(60));
        let t0 = Instant::now();
        let g = c.generation();
        c.put(7, t0, g, vec![("a".into(), Listed::Dir)]);
        assert_eq!(c.get(7, t0).map(|l| l.entries.len()), Some(1));
        assert!(c.get(8, t0).is_none());
        // Older than the TTL: asked again.
        assert!(c.get(7, t0 + Duration::from_secs(60)).is_none());
        assert_eq!(
            c.remaining(t0, t0 + Duration::from_secs(45)),
            Duration::from_secs(15)
        );
        // A change made by this mount drops it...
        drop(NamespaceChange::new(&c));
        assert!(c.get(7, t0).is_none());
        // ...and so does one that ran alongside the listing.
        let g = c.generation();
        let change = NamespaceChange::new(&c);
        c.put(7, t0, g, vec![]);
        drop(change);
        assert!(c.get(7, t0).is_none());
        // A listing taken while a change is still going on is not kept either.
        let change = NamespaceChange::new(&c);
        let g = c.generation();
        c.put(7, t0, g, vec![]);
        drop(change);
        assert!(c.get(7, t0).is_none());
        // No TTL, no cache.
        let none = ListingCache::new(Duration::ZERO);
        none.put(1, t0, none.generation(), vec![]);
        assert!(none.get(1, t0).is_none());
    }

    #[test]
    fn file_after_dir_is_hidden() {
        let mut b = DirBuilder::new("");
        b.add_page(ListPage {
            objects: vec![obj("x", 1)],
            prefixes: vec!["x/".into()],
            next_token: None,
        });
        let (entries, hidden) = b.finish();
        assert_eq!(entries, vec![("x".to_string(), Listed::Dir)]);
        assert_eq!(hidden[0].key, "x");
    }
}
