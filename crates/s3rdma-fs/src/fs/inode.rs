//! The inode table: the numbers handed to the kernel, and what the mount knows of each.
//!
//! The kernel counts the entries it was given (each LOOKUP, CREATE, MKDIR, SYMLINK, LINK reply
//! and each READDIRPLUS entry but `.` and `..`) and gives them back with FORGET. An entry the
//! kernel holds keeps its number, as does any entry something in this mount still needs (an
//! open or staged file, a directory made here, attribute changes not yet written back: the
//! caller's `pinned`), and a directory while it has children in the table. Everything else is
//! dropped when the kernel forgets it; a later lookup of the name gets a new number. Numbers
//! are never reused, and a name that changes kind (file to directory or back) gets a new one,
//! so the kernel never sees an inode change type. [S-NS-FORGET]
//!
//! Memory per entry is what a walk of millions of files costs: an entry holds its key once
//! (its name is the key's last component, a slice of it), and a directory's children are a
//! table of the children themselves, hashed by that name — no second copy of any string.

use s3rdma_proto::sync::Lock;
use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Instant, SystemTime};

use hashbrown::HashTable;

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

/// A [`Stat`] as an inode keeps it: the ETag compact and the stored attributes boxed (most
/// entries, from listings, have no attributes), so each of millions of entries stays small.
#[derive(Clone, Debug)]
struct KeptStat {
    size: u64,
    mtime: SystemTime,
    etag: KeptEtag,
    meta: Option<Box<FileMeta>>,
}

impl From<Stat> for KeptStat {
    fn from(s: Stat) -> Self {
        KeptStat {
            size: s.size,
            mtime: s.mtime,
            etag: KeptEtag::new(s.etag),
            meta: s.meta.map(Box::new),
        }
    }
}

impl From<&KeptStat> for Stat {
    fn from(k: &KeptStat) -> Self {
        Stat {
            size: k.size,
            mtime: k.mtime,
            etag: k.etag.text(),
            meta: k.meta.as_deref().cloned(),
        }
    }
}

/// An ETag as an inode keeps it: the usual one (a quoted MD5, 32 lowercase hex digits: what
/// S3 gives an object stored by one PUT) as its 16 bytes, 40 bytes less per entry than the
/// text on the heap; any other as written. [`KeptEtag::text`] gives back the same text.
#[derive(Clone, Debug, PartialEq, Eq)]
enum KeptEtag {
    Md5([u8; 16]),
    Text(Box<str>),
}

impl KeptEtag {
    fn new(etag: String) -> Self {
        fn nibble(c: u8) -> Option<u8> {
            match c {
                b'0'..=b'9' => Some(c - b'0'),
                b'a'..=b'f' => Some(c - b'a' + 10),
                _ => None,
            }
        }
        let b = etag.as_bytes();
        if b.len() == 34 && b[0] == b'"' && b[33] == b'"' {
            let mut md5 = [0u8; 16];
            let ok = md5.iter_mut().enumerate().all(|(i, out)| {
                match (nibble(b[1 + 2 * i]), nibble(b[2 + 2 * i])) {
                    (Some(hi), Some(lo)) => {
                        *out = hi << 4 | lo;
                        true
                    }
                    _ => false,
                }
            });
            if ok {
                return KeptEtag::Md5(md5);
            }
        }
        KeptEtag::Text(etag.into_boxed_str())
    }

    fn text(&self) -> String {
        match self {
            KeptEtag::Text(t) => t.to_string(),
            KeptEtag::Md5(md5) => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                let mut s = String::with_capacity(34);
                s.push('"');
                for &byte in md5 {
                    s.push(HEX[(byte >> 4) as usize] as char);
                    s.push(HEX[(byte & 15) as usize] as char);
                }
                s.push('"');
                s
            }
        }
    }
}

#[derive(Debug, Default)]
struct InodeState {
    stat: Option<KeptStat>,
    /// When `stat` stops being trustworthy; `None` = must ask S3.
    valid_until: Option<Instant>,
    /// When `stat` last came from asking S3 about this very key (a lookup or a HeadObject, not
    /// a directory listing).
    asked_at: Option<Instant>,
    /// The ETag of the last open: the version whose pages the kernel may hold.
    opened_etag: Option<Box<str>>,
}

#[derive(Debug)]
pub struct Inode {
    pub ino: u64,
    pub parent: u64,
    pub kind: Kind,
    /// The key, then the name if the key does not end with it (see [`Inode::name`]).
    text: Box<str>,
    key_len: u32,
    name_at: u32,
    name_len: u32,
    /// Entries of this inode the kernel holds (given minus forgotten).
    lookups: AtomicU64,
    state: Mutex<InodeState>,
}

impl Inode {
    /// `key`: a file's object key, or a directory's key prefix (ending in `/`, or empty for the
    /// root of a whole-bucket mount). `name` is its last component, so it is kept as a slice of
    /// the key.
    fn new(ino: u64, parent: u64, name: &str, kind: Kind, key: String, state: InodeState) -> Self {
        let stem = key.strip_suffix('/').unwrap_or(&key);
        let key_len = key.len();
        let (text, name_at) = if stem.ends_with(name) {
            let at = stem.len() - name.len();
            (key, at)
        } else {
            // Not seen (a child's key is its parent's prefix and its name), but kept right.
            (key + name, key_len)
        };
        Inode {
            ino,
            parent,
            kind,
            text: text.into_boxed_str(),
            key_len: key_len as u32,
            name_at: name_at as u32,
            name_len: name.len() as u32,
            lookups: AtomicU64::new(0),
            state: Mutex::new(state),
        }
    }

    /// A file's object key, or a directory's key prefix.
    pub fn key(&self) -> &str {
        &self.text[..self.key_len as usize]
    }

    /// The name in its parent directory.
    pub fn name(&self) -> &str {
        let at = self.name_at as usize;
        &self.text[at..at + self.name_len as usize]
    }

    /// Entries of this inode the kernel holds.
    pub fn kernel_refs(&self) -> u64 {
        self.lookups.load(Ordering::Relaxed)
    }

    /// The cached stat, if still within its TTL.
    pub fn fresh_stat(&self, now: Instant) -> Option<Stat> {
        let st = self.lock();
        match (&st.stat, st.valid_until) {
            (Some(s), Some(until)) if now < until => Some(s.into()),
            _ => None,
        }
    }

    /// The last stat we know, fresh or not.
    pub fn last_stat(&self) -> Option<Stat> {
        self.lock().stat.as_ref().map(Stat::from)
    }

    /// Record a stat from S3; returns the one it replaced.
    pub fn set_stat(&self, stat: Stat, valid_until: Instant) -> Option<Stat> {
        let mut st = self.lock();
        st.valid_until = Some(valid_until);
        st.stat.replace(stat.into()).map(|old| Stat::from(&old))
    }

    /// Record a stat that S3 returned just now for this key.
    pub fn set_stat_asked(&self, stat: Stat, valid_until: Instant, now: Instant) {
        let mut st = self.lock();
        st.valid_until = Some(valid_until);
        st.asked_at = Some(now);
        st.stat = Some(stat.into());
    }

    /// The stat, if S3 was asked about this key within `window` of `now`.
    pub fn recently_asked(&self, now: Instant, window: std::time::Duration) -> Option<Stat> {
        let st = self.lock();
        match (&st.stat, st.asked_at) {
            (Some(s), Some(at)) if now.saturating_duration_since(at) <= window => Some(s.into()),
            _ => None,
        }
    }

    /// Note that `etag` is being opened; returns the ETag of the previous open.
    pub fn swap_opened_etag(&self, etag: &str) -> Option<String> {
        self.lock()
            .opened_etag
            .replace(etag.into())
            .map(String::from)
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
        self.state.locked()
    }
}

/// A directory's children, hashed by name (the name lives in the child).
type Children = HashTable<Arc<Inode>>;

struct Tables {
    by_ino: HashMap<u64, Arc<Inode>>,
    /// The named children of each directory that has any.
    dirs: HashMap<u64, Children>,
    /// Inodes the kernel forgot that something still pinned: tried again later.
    deferred: HashSet<u64>,
    next_ino: u64,
    hasher: std::collections::hash_map::RandomState,
}

impl Tables {
    fn find(&self, parent: u64, name: &str) -> Option<&Arc<Inode>> {
        let h = self.hasher.hash_one(name);
        self.dirs.get(&parent)?.find(h, |c| c.name() == name)
    }

    /// Give `inode` its name in its parent, replacing whatever had it.
    fn link(&mut self, inode: &Arc<Inode>) {
        let h = self.hasher.hash_one(inode.name());
        let hasher = &self.hasher;
        let table = self.dirs.entry(inode.parent).or_default();
        match table.find_mut(h, |c| c.name() == inode.name()) {
            Some(slot) => *slot = inode.clone(),
            None => {
                table.insert_unique(h, inode.clone(), |c| hasher.hash_one(c.name()));
            }
        }
    }

    /// Take `inode`'s name from its parent, if the name is still its own.
    fn unlink(&mut self, inode: &Inode) {
        let h = self.hasher.hash_one(inode.name());
        let Some(table) = self.dirs.get_mut(&inode.parent) else {
            return;
        };
        if let Ok(e) = table.find_entry(h, |c| c.ino == inode.ino) {
            e.remove();
        }
        if table.is_empty() {
            self.dirs.remove(&inode.parent);
        }
    }

    /// The body of [`InodeTable::rename`]: `stale`, the stat must be asked for again.
    fn move_inode(
        &mut self,
        ino: u64,
        new_parent: u64,
        name: &str,
        key: String,
        stale: bool,
    ) -> Option<Arc<Inode>> {
        let old = self.by_ino.get(&ino)?.clone();
        let state = old.lock();
        let moved = Arc::new(Inode::new(
            ino,
            new_parent,
            name,
            old.kind,
            key,
            InodeState {
                stat: state.stat.clone(),
                valid_until: if stale { None } else { state.valid_until },
                asked_at: None,
                opened_etag: None,
            },
        ));
        drop(state);
        // The kernel keeps its entries of the moved inode (under the write lock: no
        // `remember` or `forget` runs meanwhile).
        moved
            .lookups
            .store(old.lookups.load(Ordering::Relaxed), Ordering::Relaxed);
        self.unlink(&old);
        self.link(&moved);
        self.by_ino.insert(ino, moved.clone());
        Some(moved)
    }

    fn is_live(&self, ino: u64) -> bool {
        self.by_ino
            .get(&ino)
            .is_some_and(|i| i.kernel_refs() > 0 || self.dirs.contains_key(&ino))
    }
}

/// What [`InodeTable::forget`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Forgotten {
    /// Entries dropped (the inode, children the kernel never held, parents kept only for it).
    pub dropped: usize,
    /// Directories whose entries went: their listings and known names go too.
    pub dirs: Vec<u64>,
}

pub struct InodeTable {
    inner: RwLock<Tables>,
}

impl std::fmt::Debug for InodeTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InodeTable")
            .field("len", &self.len())
            .finish()
    }
}

impl InodeTable {
    /// A table holding only the root directory, whose key prefix is `root_prefix`.
    pub fn new(root_prefix: &str) -> Self {
        let root = Arc::new(Inode::new(
            ROOT_INO,
            ROOT_INO,
            "",
            Kind::Dir,
            root_prefix.to_string(),
            InodeState::default(),
        ));
        let mut by_ino = HashMap::new();
        by_ino.insert(ROOT_INO, root);
        InodeTable {
            inner: RwLock::new(Tables {
                by_ino,
                dirs: HashMap::new(),
                deferred: HashSet::new(),
                next_ino: ROOT_INO + 1,
                hasher: Default::default(),
            }),
        }
    }

    pub fn get(&self, ino: u64) -> Option<Arc<Inode>> {
        self.read().by_ino.get(&ino).cloned()
    }

    /// The child `name` of `parent`, if the table has one.
    pub fn child(&self, parent: u64, name: &str) -> Option<Arc<Inode>> {
        self.read().find(parent, name).cloned()
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
        if let Some(existing) = t.find(parent, name) {
            if existing.kind == kind {
                return existing.clone();
            }
        }
        let ino = t.next_ino;
        t.next_ino += 1;
        let inode = Arc::new(Inode::new(
            ino,
            parent,
            name,
            kind,
            key,
            InodeState::default(),
        ));
        t.by_ino.insert(ino, inode.clone());
        t.link(&inode);
        inode
    }

    /// Forget the name `name` in `parent` (the inode itself stays reachable by number while
    /// the kernel holds it).
    pub fn remove_child(&self, parent: u64, name: &str) {
        let mut t = self.write();
        if let Some(child) = t.find(parent, name).cloned() {
            t.unlink(&child);
        }
    }

    /// Move inode `ino` to `name` in `new_parent` with key `key` (after a rename): the same
    /// number, a new entry; whatever had that name loses it. Returns the moved inode.
    pub fn rename(&self, ino: u64, new_parent: u64, name: &str, key: String) -> Option<Arc<Inode>> {
        self.write().move_inode(ino, new_parent, name, key, false)
    }

    /// [`InodeTable::rename`] of a directory: every inode below it keeps its number and name
    /// and takes its key under the new prefix; what they knew of their objects must be asked
    /// again (a copy may have a new ETag).
    pub fn rename_tree(
        &self,
        ino: u64,
        new_parent: u64,
        name: &str,
        prefix: String,
    ) -> Option<Arc<Inode>> {
        let mut t = self.write();
        let moved = t.move_inode(ino, new_parent, name, prefix, false)?;
        let mut dirs = vec![moved.clone()];
        while let Some(dir) = dirs.pop() {
            let kids: Vec<Arc<Inode>> = t
                .dirs
                .get(&dir.ino)
                .map(|c| c.iter().cloned().collect())
                .unwrap_or_default();
            for kid in kids {
                let mut key = format!("{}{}", dir.key(), kid.name());
                if kid.kind == Kind::Dir {
                    key.push('/');
                }
                let name = kid.name().to_string();
                if let Some(m) = t.move_inode(kid.ino, dir.ino, &name, key, true) {
                    if m.kind == Kind::Dir {
                        dirs.push(m);
                    }
                }
            }
        }
        Some(moved)
    }

    /// The kernel was handed an entry of `inode` (a reply on its way). An inode dropped since
    /// it was found (a FORGET of an earlier entry raced this reply) is taken back, by number,
    /// and by name if no other inode took the name meanwhile.
    pub fn remember(&self, inode: &Arc<Inode>) {
        {
            let t = self.read();
            if let Some(cur) = t.by_ino.get(&inode.ino) {
                cur.lookups.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        let mut t = self.write();
        if let Some(cur) = t.by_ino.get(&inode.ino) {
            cur.lookups.fetch_add(1, Ordering::Relaxed);
            return;
        }
        inode.lookups.store(1, Ordering::Relaxed);
        t.by_ino.insert(inode.ino, inode.clone());
        if t.by_ino.contains_key(&inode.parent) && t.find(inode.parent, inode.name()).is_none() {
            t.link(inode);
        }
    }

    /// The kernel forgot `n` entries of `ino`. When it holds none any more, the inode is
    /// dropped unless `pinned` says something in this mount still needs it (then it is tried
    /// again by [`InodeTable::retry_deferred`]); children the kernel never held go with a
    /// directory, and a parent kept only for this child goes with it.
    /// `keep(parent, name)` is told of each name leaving a directory that stays, while the
    /// table still holds it (under the table's lock: `keep` must not use the table).
    pub fn forget(
        &self,
        ino: u64,
        n: u64,
        pinned: &dyn Fn(u64) -> bool,
        keep: &dyn Fn(u64, &str),
    ) -> Forgotten {
        {
            let t = self.read();
            let Some(i) = t.by_ino.get(&ino) else {
                return Forgotten::default();
            };
            let before = i
                .lookups
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| {
                    Some(l.saturating_sub(n))
                })
                .unwrap_or(0);
            if before > n {
                return Forgotten::default();
            }
        }
        let mut out = Forgotten::default();
        self.collect(ino, pinned, keep, &mut out);
        out
    }

    /// Try again the inodes whose drop something pinned.
    pub fn retry_deferred(
        &self,
        pinned: &dyn Fn(u64) -> bool,
        keep: &dyn Fn(u64, &str),
    ) -> Forgotten {
        let inos: Vec<u64> = std::mem::take(&mut self.write().deferred)
            .into_iter()
            .collect();
        let mut out = Forgotten::default();
        for ino in inos {
            self.collect(ino, pinned, keep, &mut out);
        }
        out
    }

    /// Inodes forgotten by the kernel but kept because something pinned them.
    pub fn deferred(&self) -> usize {
        self.read().deferred.len()
    }

    /// Drop `ino` (and what goes with it) if nothing holds it.
    fn collect(
        &self,
        mut ino: u64,
        pinned: &dyn Fn(u64) -> bool,
        keep: &dyn Fn(u64, &str),
        out: &mut Forgotten,
    ) {
        while ino != ROOT_INO {
            // What would go: the inode and its children the kernel never held. Pins are asked
            // without the table's lock (they take locks of their own).
            let (inode, children) = {
                let t = self.read();
                let Some(inode) = t.by_ino.get(&ino).cloned() else {
                    return;
                };
                if inode.kernel_refs() > 0 {
                    return;
                }
                let children: Vec<Arc<Inode>> = t
                    .dirs
                    .get(&ino)
                    .map(|c| c.iter().cloned().collect())
                    .unwrap_or_default();
                if children.iter().any(|c| t.is_live(c.ino)) {
                    return;
                }
                (inode, children)
            };
            if pinned(ino) || children.iter().any(|c| pinned(c.ino)) {
                self.write().deferred.insert(ino);
                return;
            }
            let mut t = self.write();
            // Re-check: an entry may have been handed out, or a child added, meanwhile.
            let same = t.by_ino.get(&ino).is_some_and(|i| Arc::ptr_eq(i, &inode));
            let kids_now = t.dirs.get(&ino).map_or(0, |c| c.len());
            if !same
                || inode.kernel_refs() > 0
                || kids_now != children.len()
                || children.iter().any(|c| t.is_live(c.ino))
            {
                return;
            }
            for c in &children {
                if t.by_ino.get(&c.ino).is_some_and(|i| Arc::ptr_eq(i, c)) {
                    t.by_ino.remove(&c.ino);
                }
                t.deferred.remove(&c.ino);
            }
            let parent = inode.parent;
            let parent_kept = t.by_ino.contains_key(&parent);
            if parent_kept {
                // Before the name leaves: a lookup meanwhile finds it in one place or the other.
                keep(parent, inode.name());
            }
            t.dirs.remove(&ino);
            t.by_ino.remove(&ino);
            t.deferred.remove(&ino);
            t.unlink(&inode);
            out.dropped += 1 + children.len();
            if inode.kind == Kind::Dir {
                out.dirs.push(ino);
            }
            drop(t);
            if !parent_kept {
                return;
            }
            // The parent may have been kept only for this child.
            ino = parent;
        }
    }

    pub fn len(&self) -> usize {
        self.read().by_ino.len()
    }

    /// Every inode number in the table (for tests).
    #[cfg(test)]
    pub fn inos(&self) -> Vec<u64> {
        self.read().by_ino.keys().copied().collect()
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
            t.get(ROOT_INO).map(|i| i.key().to_string()),
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

    #[test]
    fn an_md5_etag_is_kept_in_16_bytes_and_every_etag_reads_back_as_written() {
        let md5 = "\"0123456789abcdef0123456789abcdef\"".to_string();
        assert!(matches!(KeptEtag::new(md5.clone()), KeptEtag::Md5(_)));
        for etag in [
            md5,
            "\"ffffffffffffffffffffffffffffffff\"".into(),
            "\"0123456789ABCDEF0123456789abcdef\"".into(), // upper case: kept as text
            "\"0123456789abcdef0123456789abcdef-3\"".into(), // multipart
            "0123456789abcdef0123456789abcdef".into(),     // unquoted
            "\"0123456789abcdef0123456789abcdeg\"".into(),
            String::new(),
        ] {
            assert_eq!(KeptEtag::new(etag.clone()).text(), etag);
        }
        assert!(std::mem::size_of::<KeptEtag>() <= 24);
    }

    const NOTHING_PINNED: &dyn Fn(u64) -> bool = &|_| false;
    const NO_KEEP: &dyn Fn(u64, &str) = &|_, _| {};

    #[test]
    fn an_entry_keeps_its_key_once_and_its_name_as_a_slice_of_it() {
        let t = InodeTable::new("p/");
        let d = t.upsert_child(ROOT_INO, "d", Kind::Dir, "p/d/".into());
        assert_eq!((d.name(), d.key()), ("d", "p/d/"));
        let f = t.upsert_child(d.ino, "f.bin", Kind::File, "p/d/f.bin".into());
        assert_eq!((f.name(), f.key()), ("f.bin", "p/d/f.bin"));
        assert_eq!(f.text.len(), "p/d/f.bin".len());
        // A key that does not end with the name keeps both.
        let odd = t.upsert_child(d.ino, "x", Kind::File, "elsewhere/y".into());
        assert_eq!((odd.name(), odd.key()), ("x", "elsewhere/y"));
        assert_eq!(t.child(d.ino, "x").map(|i| i.ino), Some(odd.ino));
    }

    // [S-NS-FORGET]
    #[test]
    fn entries_the_kernel_forgot_are_dropped_with_what_only_they_kept() {
        let t = InodeTable::new("");
        let d = t.upsert_child(ROOT_INO, "d", Kind::Dir, "d/".into());
        t.remember(&d);
        let f = t.upsert_child(d.ino, "f", Kind::File, "d/f".into());
        t.remember(&f);
        t.remember(&f);
        // Listed, never handed to the kernel.
        let g = t.upsert_child(d.ino, "g", Kind::File, "d/g".into());
        assert_eq!(t.len(), 4);
        // The directory stays while the kernel holds a child.
        assert_eq!(t.forget(d.ino, 1, NOTHING_PINNED, NO_KEEP).dropped, 0);
        assert_eq!(t.forget(f.ino, 1, NOTHING_PINNED, NO_KEEP).dropped, 0);
        assert_eq!(t.get(f.ino).map(|i| i.kernel_refs()), Some(1));
        // The last entry of f: f goes, then d (kept only for f) with g.
        let kept = std::sync::Mutex::new(Vec::new());
        let keep = |p: u64, n: &str| kept.lock().unwrap().push((p, n.to_string()));
        let out = t.forget(f.ino, 1, NOTHING_PINNED, &keep);
        assert_eq!(out.dropped, 3);
        assert_eq!(out.dirs, vec![d.ino]);
        let kept = kept.into_inner().unwrap();
        assert!(kept.contains(&(d.ino, "f".to_string())));
        assert!(kept.contains(&(ROOT_INO, "d".to_string())));
        assert_eq!(t.len(), 1);
        assert!(t.get(f.ino).is_none() && t.child(ROOT_INO, "d").is_none());
        // Looked up again: a new number; numbers are never reused.
        let d2 = t.upsert_child(ROOT_INO, "d", Kind::Dir, "d/".into());
        assert!(d2.ino > g.ino);
        // A forget of a number the table no longer has changes nothing.
        assert_eq!(
            t.forget(f.ino, 1, NOTHING_PINNED, NO_KEEP),
            Forgotten::default()
        );
        // The root is never dropped.
        assert_eq!(t.forget(ROOT_INO, 1, NOTHING_PINNED, NO_KEEP).dropped, 0);
        assert!(t.get(ROOT_INO).is_some());
    }

    #[test]
    fn a_pinned_entry_is_kept_and_dropped_once_nothing_needs_it() {
        let t = InodeTable::new("");
        let f = t.upsert_child(ROOT_INO, "f", Kind::File, "f".into());
        t.remember(&f);
        let pinned = std::sync::atomic::AtomicBool::new(true);
        let pin = |i: u64| i == f.ino && pinned.load(Ordering::Relaxed);
        assert_eq!(t.forget(f.ino, 1, &pin, NO_KEEP).dropped, 0);
        assert_eq!(t.deferred(), 1);
        assert_eq!(t.child(ROOT_INO, "f").map(|i| i.ino), Some(f.ino));
        assert_eq!(t.retry_deferred(&pin, NO_KEEP).dropped, 0);
        assert_eq!(t.deferred(), 1);
        pinned.store(false, Ordering::Relaxed);
        assert_eq!(t.retry_deferred(&pin, NO_KEEP).dropped, 1);
        assert_eq!(t.deferred(), 0);
        assert!(t.get(f.ino).is_none());
        // A directory with a pinned child the kernel never held (a file being written that
        // it forgot meanwhile) stays too.
        let d = t.upsert_child(ROOT_INO, "d", Kind::Dir, "d/".into());
        t.remember(&d);
        let w = t.upsert_child(d.ino, "w", Kind::File, "d/w".into());
        let pin_w = |i: u64| i == w.ino;
        assert_eq!(t.forget(d.ino, 1, &pin_w, NO_KEEP).dropped, 0);
        assert!(t.get(d.ino).is_some() && t.get(w.ino).is_some());
        assert_eq!(t.retry_deferred(NOTHING_PINNED, NO_KEEP).dropped, 2);
    }

    #[test]
    fn an_entry_dropped_while_a_reply_carried_it_is_taken_back() {
        let t = InodeTable::new("");
        let f = t.upsert_child(ROOT_INO, "f", Kind::File, "f".into());
        // A FORGET of an earlier entry drops it between a lookup finding it and the reply.
        assert_eq!(t.forget(f.ino, 1, NOTHING_PINNED, NO_KEEP).dropped, 1);
        t.remember(&f);
        assert_eq!(t.get(f.ino).map(|i| i.kernel_refs()), Some(1));
        assert_eq!(t.child(ROOT_INO, "f").map(|i| i.ino), Some(f.ino));
        // If another lookup took the name meanwhile, the old number stays reachable by number
        // only: no name ever has two numbers.
        let g = t.upsert_child(ROOT_INO, "g", Kind::File, "g".into());
        assert_eq!(t.forget(g.ino, 1, NOTHING_PINNED, NO_KEEP).dropped, 1);
        let g2 = t.upsert_child(ROOT_INO, "g", Kind::File, "g".into());
        t.remember(&g);
        assert_eq!(t.child(ROOT_INO, "g").map(|i| i.ino), Some(g2.ino));
        assert!(t.get(g.ino).is_some());
        assert_eq!(t.forget(g.ino, 1, NOTHING_PINNED, NO_KEEP).dropped, 1);
        assert_eq!(t.child(ROOT_INO, "g").map(|i| i.ino), Some(g2.ino));
    }

    #[test]
    fn a_rename_keeps_the_kernel_s_entries_and_an_unlinked_inode_lives_until_forgotten() {
        let t = InodeTable::new("");
        let f = t.upsert_child(ROOT_INO, "f", Kind::File, "f".into());
        t.remember(&f);
        t.remember(&f);
        let moved = t.rename(f.ino, ROOT_INO, "g", "g".into()).unwrap();
        assert_eq!(moved.kernel_refs(), 2);
        assert!(t.child(ROOT_INO, "f").is_none());
        assert_eq!(t.forget(f.ino, 1, NOTHING_PINNED, NO_KEEP).dropped, 0);
        t.remove_child(ROOT_INO, "g");
        assert!(t.get(f.ino).is_some());
        assert_eq!(t.forget(f.ino, 1, NOTHING_PINNED, NO_KEEP).dropped, 1);
        assert_eq!(t.len(), 1);
    }
}
