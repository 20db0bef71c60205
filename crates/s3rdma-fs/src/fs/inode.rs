//! The inode table: numbers handed to the kernel, stable for the life of the mount.
//!
//! A (parent, name) pair keeps its inode number for as long as the mount lives, as long as it
//! keeps its kind; a name that turns from file into directory (or back) gets a new number, so the
//! kernel never sees an inode change type. Entries are never reused.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Instant, SystemTime};

use s3rdma_client::{FileMeta, ObjectInfo};

pub const ROOT_INO: u64 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    /// A symbolic link: an object whose stored mode says so (its body is the target).
    Symlink,
}

impl Kind {
    /// The kind of an object with these stored attributes (not known: a file).
    pub fn of_object(meta: Option<&FileMeta>) -> Kind {
        match meta {
            Some(m) if m.is_symlink() => Kind::Symlink,
            _ => Kind::File,
        }
    }
}

/// How much later than what this mount last learnt of an object a listing's Last-Modified may
/// be and still be the same version (see [`Stat::inherit`]).
pub const SAME_VERSION_SLACK: std::time::Duration = std::time::Duration::from_secs(2);

/// What S3 last told us about a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    pub size: u64,
    /// S3's Last-Modified.
    pub mtime: SystemTime,
    pub etag: String,
    /// Stored attributes; `None` = not known (from a listing).
    pub meta: Option<FileMeta>,
}

impl From<&ObjectInfo> for Stat {
    fn from(o: &ObjectInfo) -> Self {
        Stat {
            size: o.size,
            mtime: o.last_modified,
            etag: o.etag.clone(),
            meta: o.meta.clone(),
        }
    }
}

impl Stat {
    /// Take `old`'s stored attributes if this is the same version of the object and this stat
    /// does not know its own: the same ETag, and a Last-Modified no later than `old`'s time
    /// plus [`SAME_VERSION_SLACK`]. (A listing's time is finer than HEAD's; after this mount's
    /// own write `old`'s time is the local clock at the write, which S3's Last-Modified may
    /// pass by a little — across a second boundary, the exact comparison this replaced gave
    /// rsync's freshly renamed files S3's time instead of the mtime stored with them. A copy
    /// that changes only attributes keeps the ETag: one made by another client is told by its
    /// later Last-Modified.)
    pub fn inherit(mut self, old: Option<&Stat>) -> Stat {
        if self.meta.is_none() {
            if let Some(old) = old {
                let no_later = self
                    .mtime
                    .duration_since(old.mtime)
                    .map_or(true, |d| d <= SAME_VERSION_SLACK);
                if old.etag == self.etag && no_later {
                    self.meta = old.meta.clone();
                }
            }
        }
        self
    }
}

#[derive(Debug, Default)]
pub struct InodeState {
    pub stat: Option<Stat>,
    /// When `stat` stops being trustworthy; `None` = must ask S3.
    pub valid_until: Option<Instant>,
    /// When `stat` last came from asking S3 about this very key (a lookup or a HeadObject, not
    /// a directory listing).
    pub asked_at: Option<Instant>,
    /// The ETag of the last open: the version whose pages the kernel may hold.
    pub opened_etag: Option<String>,
}

#[derive(Debug)]
pub struct Inode {
    pub ino: u64,
    pub parent: u64,
    pub name: String,
    pub kind: Kind,
    /// A file's object key, or a directory's key prefix (ending in `/`, or empty for the root of
    /// a whole-bucket mount).
    pub key: String,
    state: Mutex<InodeState>,
}

impl Inode {
    /// The cached stat, if still within its TTL.
    pub fn fresh_stat(&self, now: Instant) -> Option<Stat> {
        let st = self.lock();
        match (&st.stat, st.valid_until) {
            (Some(s), Some(until)) if now < until => Some(s.clone()),
            _ => None,
        }
    }

    /// The last stat we know, fresh or not.
    pub fn last_stat(&self) -> Option<Stat> {
        self.lock().stat.clone()
    }

    /// Record a stat from S3; returns the one it replaced.
    pub fn set_stat(&self, stat: Stat, valid_until: Instant) -> Option<Stat> {
        let mut st = self.lock();
        st.valid_until = Some(valid_until);
        st.stat.replace(stat)
    }

    /// Record a stat that S3 returned just now for this key.
    pub fn set_stat_asked(&self, stat: Stat, valid_until: Instant, now: Instant) {
        let mut st = self.lock();
        st.valid_until = Some(valid_until);
        st.asked_at = Some(now);
        st.stat = Some(stat);
    }

    /// The stat, if S3 was asked about this key within `window` of `now`.
    pub fn recently_asked(&self, now: Instant, window: std::time::Duration) -> Option<Stat> {
        let st = self.lock();
        match (&st.stat, st.asked_at) {
            (Some(s), Some(at)) if now.saturating_duration_since(at) <= window => Some(s.clone()),
            _ => None,
        }
    }

    /// Note that `etag` is being opened; returns the ETag of the previous open.
    pub fn swap_opened_etag(&self, etag: &str) -> Option<String> {
        self.lock().opened_etag.replace(etag.to_string())
    }

    /// Forget which version the kernel's pages are of: the next open starts from none.
    pub fn forget_opened(&self) {
        self.lock().opened_etag = None;
    }

    /// Forget the cached stat (the object is gone, or changed under us).
    pub fn invalidate(&self) {
        let mut st = self.lock();
        st.valid_until = None;
        st.asked_at = None;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, InodeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Debug)]
struct Tables {
    by_ino: HashMap<u64, Arc<Inode>>,
    children: HashMap<(u64, String), u64>,
    next_ino: u64,
}

#[derive(Debug)]
pub struct InodeTable {
    inner: RwLock<Tables>,
}

impl InodeTable {
    /// A table holding only the root directory, whose key prefix is `root_prefix`.
    pub fn new(root_prefix: &str) -> Self {
        let root = Arc::new(Inode {
            ino: ROOT_INO,
            parent: ROOT_INO,
            name: String::new(),
            kind: Kind::Dir,
            key: root_prefix.to_string(),
            state: Mutex::new(InodeState::default()),
        });
        let mut by_ino = HashMap::new();
        by_ino.insert(ROOT_INO, root);
        InodeTable {
            inner: RwLock::new(Tables {
                by_ino,
                children: HashMap::new(),
                next_ino: ROOT_INO + 1,
            }),
        }
    }

    pub fn get(&self, ino: u64) -> Option<Arc<Inode>> {
        self.read().by_ino.get(&ino).cloned()
    }

    /// The child `name` of `parent`, if one was ever looked up or listed.
    pub fn child(&self, parent: u64, name: &str) -> Option<Arc<Inode>> {
        let t = self.read();
        let ino = t.children.get(&(parent, name.to_string()))?;
        t.by_ino.get(ino).cloned()
    }

    /// The inode for `name` in `parent` with this kind: the existing one if it has the same kind,
    /// otherwise a new number. `key` is the child's key (or prefix, for a directory).
    pub fn upsert_child(&self, parent: u64, name: &str, kind: Kind, key: String) -> Arc<Inode> {
        if let Some(existing) = self.child(parent, name) {
            if existing.kind == kind {
                return existing;
            }
        }
        let mut t = self.write();
        // Re-check under the write lock: another thread may have won the race.
        if let Some(ino) = t.children.get(&(parent, name.to_string())) {
            if let Some(existing) = t.by_ino.get(ino) {
                if existing.kind == kind {
                    return existing.clone();
                }
            }
        }
        let ino = t.next_ino;
        t.next_ino += 1;
        let inode = Arc::new(Inode {
            ino,
            parent,
            name: name.to_string(),
            kind,
            key,
            state: Mutex::new(InodeState::default()),
        });
        t.by_ino.insert(ino, inode.clone());
        t.children.insert((parent, name.to_string()), ino);
        inode
    }

    /// Forget the name `name` in `parent` (the inode itself stays reachable by number).
    pub fn remove_child(&self, parent: u64, name: &str) {
        self.write().children.remove(&(parent, name.to_string()));
    }

    /// Move inode `ino` to `name` in `new_parent` with key `key` (after a rename): the same
    /// number, a new entry; whatever had that name loses it. Returns the moved inode.
    pub fn rename(&self, ino: u64, new_parent: u64, name: &str, key: String) -> Option<Arc<Inode>> {
        let mut t = self.write();
        let old = t.by_ino.get(&ino)?.clone();
        let state = old.lock();
        let moved = Arc::new(Inode {
            ino,
            parent: new_parent,
            name: name.to_string(),
            kind: old.kind,
            key,
            state: Mutex::new(InodeState {
                stat: state.stat.clone(),
                valid_until: state.valid_until,
                asked_at: None,
                opened_etag: None,
            }),
        });
        drop(state);
        t.children.remove(&(old.parent, old.name.clone()));
        t.children.insert((new_parent, name.to_string()), ino);
        t.by_ino.insert(ino, moved.clone());
        Some(moved)
    }

    pub fn len(&self) -> usize {
        self.read().by_ino.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Tables> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Tables> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_listing_keeps_the_attributes_of_the_same_version_across_a_second_boundary() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_700_000_000_999);
        let meta = FileMeta {
            mtime: Some(std::time::UNIX_EPOCH),
            ..Default::default()
        };
        let ours = Stat {
            size: 0,
            mtime: t,
            etag: "\"e\"".into(),
            meta: Some(meta.clone()),
        };
        let listed = |ms: u64, etag: &str| Stat {
            size: 0,
            mtime: t + std::time::Duration::from_millis(ms),
            etag: etag.into(),
            meta: None,
        };
        // S3's Last-Modified a moment after this mount's clock, in the next second.
        assert_eq!(
            listed(5, "\"e\"").inherit(Some(&ours)).meta,
            Some(meta.clone())
        );
        assert_eq!(listed(1500, "\"e\"").inherit(Some(&ours)).meta, Some(meta));
        // Another version: another ETag, or the same bytes copied with new attributes later.
        assert_eq!(listed(5, "\"f\"").inherit(Some(&ours)).meta, None);
        assert_eq!(listed(60_000, "\"e\"").inherit(Some(&ours)).meta, None);
    }
    use super::*;
    use std::time::Duration;

    #[test]
    fn numbers_are_stable_and_kind_changes_renumber() {
        let t = InodeTable::new("p/");
        let a = t.upsert_child(ROOT_INO, "a", Kind::File, "p/a".into());
        let again = t.upsert_child(ROOT_INO, "a", Kind::File, "p/a".into());
        assert_eq!(a.ino, again.ino);
        let b = t.upsert_child(ROOT_INO, "b", Kind::Dir, "p/b/".into());
        assert_ne!(a.ino, b.ino);
        let a_dir = t.upsert_child(ROOT_INO, "a", Kind::Dir, "p/a/".into());
        assert_ne!(a_dir.ino, a.ino);
        // The old inode stays reachable by number (an open handle may use it).
        assert_eq!(t.get(a.ino).map(|i| i.kind), Some(Kind::File));
        assert_eq!(t.child(ROOT_INO, "a").map(|i| i.ino), Some(a_dir.ino));
        assert_eq!(
            t.get(ROOT_INO).map(|i| i.key.clone()),
            Some("p/".to_string())
        );
    }

    #[test]
    fn stat_ttl() {
        let t = InodeTable::new("");
        let f = t.upsert_child(ROOT_INO, "f", Kind::File, "f".into());
        let now = Instant::now();
        assert!(f.fresh_stat(now).is_none());
        let s = Stat {
            size: 3,
            mtime: SystemTime::UNIX_EPOCH,
            etag: "\"e\"".into(),
            meta: None,
        };
        f.set_stat(s.clone(), now + Duration::from_secs(1));
        assert_eq!(f.fresh_stat(now), Some(s.clone()));
        assert!(f.fresh_stat(now + Duration::from_secs(2)).is_none());
        f.invalidate();
        assert!(f.fresh_stat(now).is_none());
        assert_eq!(f.last_stat(), Some(s));
    }
}
