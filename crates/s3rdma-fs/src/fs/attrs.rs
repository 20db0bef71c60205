//! Attribute changes of stored files, written back shortly after they are made.
//!
//! S3 stores a file's mode, owner and mtime as user metadata, which only a copy of the object
//! onto itself can change. Tools set several attributes in a row — `rsync` closes its temporary
//! file, then sets its times, its mode (and owner as root), then renames it — and a copy per
//! call made `rsync` cost four server-side copies per file. So a `chmod`, `chown` or `utimes`
//! of a stored file (not open for writing) is checked against S3 at once (the version it
//! applies to must exist), shown by `stat` at once, and written back by one copy [`DELAY`]
//! after the first change, whatever follows meanwhile. A rename that comes first takes the
//! changes into its own copy (no copy of their own); an unlink drops them; an open for writing,
//! a truncation, `fsync` of a handle and the end of the mount write them back first.
//!
//! This is the durability of metadata on a local file system (a change is durable after
//! `fsync`, or when the journal commits). A change whose write-back fails is logged at ERROR
//! and counted (`attr_writebacks_failed`); one whose object was replaced by another client
//! meanwhile is dropped (the newer version wins, as it would have had it come after a
//! synchronous change), logged and counted (`attr_writebacks_dropped`).

use s3rdma_proto::sync::Lock;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::sync::Semaphore;
use tracing::{debug, error, warn};

use super::inode::{Inode, Stat};
use s3rdma_client::{FileMeta, ObjectInfo, ObjectStore, S3Error, S3ErrorKind};

/// How long after its first change a file's attributes are written back.
pub const DELAY: Duration = Duration::from_secs(1);

/// Write-backs running at once (a `chmod -R` of many files does not become a burst of copies).
const CONCURRENCY: usize = 16;

/// Changes waiting to be written back to one object.
pub struct Pending {
    pub inode: Arc<Inode>,
    /// The version they apply to (its ETag and stored attributes).
    pub base: ObjectInfo,
    /// What changes, merged over all calls since the first.
    pub change: FileMeta,
}

impl Pending {
    /// The stored attributes once written back.
    pub fn meta(&self) -> FileMeta {
        self.base
            .meta
            .clone()
            .unwrap_or_default()
            .merged(&self.change)
    }
}

enum Start {
    Run(Box<Pending>),
    Nothing,
    Busy,
}

#[derive(Default)]
struct Table {
    pending: HashMap<u64, Pending>,
    /// The inode of each key with pending changes (a later inode of the same key finds them).
    by_key: HashMap<Box<str>, u64>,
    /// Inodes whose write-back is running now.
    running: HashSet<u64>,
}

impl Table {
    /// Whether `ino` had no pending changes before.
    fn insert(&mut self, p: Pending) -> bool {
        let ino = p.inode.ino;
        self.by_key.insert(p.inode.key().into(), ino);
        self.pending.insert(ino, p).is_none()
    }

    fn remove(&mut self, ino: u64) -> Option<Pending> {
        let p = self.pending.remove(&ino)?;
        if self.by_key.get(p.inode.key()) == Some(&ino) {
            self.by_key.remove(p.inode.key());
        }
        Some(p)
    }

    /// The changes pending for `inode`: its own, or those made through another inode of the
    /// same key and kind (the name was a directory for a moment, another client's key under it).
    fn find(&self, inode: &Inode) -> Option<&Pending> {
        self.pending.get(&inode.ino).or_else(|| {
            let ino = self.by_key.get(inode.key())?;
            self.pending.get(ino).filter(|p| p.inode.kind == inode.kind)
        })
    }
}

/// The attribute changes of a mount waiting to be written back.
pub struct Writeback<S: ObjectStore> {
    s3: S,
    rt: Handle,
    table: Mutex<Table>,
    done: Condvar,
    /// `pending.len()`, read without the lock by `stat`.
    count: AtomicUsize,
    slots: Semaphore,
    ttl: Duration,
    copy_threshold: u64,
    stored: AtomicU64,
    folded: AtomicU64,
    failed: AtomicU64,
    dropped: AtomicU64,
}

impl<S: ObjectStore> Writeback<S> {
    pub fn new(s3: S, rt: Handle, ttl: Duration, copy_threshold: u64) -> Self {
        Writeback {
            s3,
            rt,
            table: Mutex::new(Table::default()),
            done: Condvar::new(),
            count: AtomicUsize::new(0),
            slots: Semaphore::new(CONCURRENCY),
            ttl,
            copy_threshold,
            stored: AtomicU64::new(0),
            folded: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.locked()
    }

    /// Change the attributes of `inode`, whose stored version is `base`: merged into what is
    /// pending, written back [`DELAY`] after the first change.
    pub fn defer(self: &Arc<Self>, inode: Arc<Inode>, base: ObjectInfo, change: &FileMeta) {
        let ino = inode.ino;
        let mut t = self.lock();
        match t.pending.get_mut(&ino) {
            // A newer version than the one the changes were made on: the new one is the base.
            Some(p) if p.base.etag == base.etag => p.change = p.change.merged(change),
            _ => {
                let first = t.insert(Pending {
                    inode,
                    base,
                    change: change.clone(),
                });
                self.count.store(t.pending.len(), Ordering::Relaxed);
                drop(t);
                if first {
                    let me = self.clone();
                    self.rt.spawn(async move {
                        tokio::time::sleep(DELAY).await;
                        // A failure is logged and counted there.
                        let _ = me.write_back(ino).await;
                    });
                }
            }
        }
    }

    /// Whether changes of `ino` wait to be written back, or are being.
    pub fn holds(&self, ino: u64) -> bool {
        let t = self.lock();
        t.pending.contains_key(&ino) || t.running.contains(&ino)
    }

    /// What `stat` shows of `inode` whose known state is `stat`: the pending changes over it,
    /// if they were made on this version — also when they were made through another inode of
    /// the same key (the name was a directory for a moment, another client's key under it).
    pub fn overlay(&self, inode: &Inode, stat: &Stat) -> Option<Stat> {
        if self.count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let t = self.lock();
        let p = t.find(inode)?;
        (p.base.etag == stat.etag).then(|| Stat {
            meta: Some(stat.meta.clone().unwrap_or_default().merged(&p.change)),
            ..stat.clone()
        })
    }

    /// The pending changes of `ino`, taken (a rename folds them into its copy; an unlink drops
    /// them). Waits for a write-back of `ino` running now, so that no copy of the old name
    /// lands after the caller's own request.
    pub fn take(&self, ino: u64) -> Option<Pending> {
        let mut t = self.lock();
        while t.running.contains(&ino) {
            t = self.done.wait(t).unwrap_or_else(|e| e.into_inner());
        }
        let p = t.remove(ino);
        self.count.store(t.pending.len(), Ordering::Relaxed);
        p
    }

    /// Put back changes [`Self::take`] took, when what was to carry them failed.
    pub fn restore(self: &Arc<Self>, p: Pending) {
        let change = p.change.clone();
        self.defer(p.inode.clone(), p.base, &change);
    }

    /// What became of changes a rename took: carried in its copy, or dropped because the copy
    /// was of a newer version another client stored (which keeps its own attributes).
    pub fn renamed(&self, p: &Pending, carried: bool) {
        if carried {
            self.folded.fetch_add(1, Ordering::Relaxed);
        } else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            warn!(key = %p.inode.key(), change = ?p.change, "the object was replaced by another client before the attributes set here were written back; the renamed newer version keeps its own");
        }
    }

    /// Write back the changes of `ino` now (fsync, open for writing, truncate); an error is
    /// the caller's to report.
    pub async fn flush(&self, ino: u64) -> Result<(), S3Error> {
        if self.count.load(Ordering::Relaxed) == 0 && !self.lock().running.contains(&ino) {
            return Ok(());
        }
        self.write_back(ino).await
    }

    /// Write back every pending change (the end of the mount); returns how many failed.
    pub async fn flush_all(self: &Arc<Self>) -> usize {
        let inos: Vec<u64> = self.lock().pending.keys().copied().collect();
        async {
            let mut all = tokio::task::JoinSet::new();
            for ino in inos {
                let me = self.clone();
                all.spawn(async move { me.write_back(ino).await });
            }
            let mut failed = 0;
            while let Some(r) = all.join_next().await {
                if !matches!(r, Ok(Ok(()))) {
                    failed += 1;
                }
            }
            failed
        }
        .await
    }

    async fn write_back(&self, ino: u64) -> Result<(), S3Error> {
        let Ok(_slot) = self.slots.acquire().await else {
            return Ok(());
        };
        // Another write-back of it running now is waited for, then what is left done.
        let p = loop {
            match self.start(ino) {
                Start::Run(p) => break p,
                Start::Nothing => return Ok(()),
                Start::Busy => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        };
        let r = self.copy(&p).await;
        self.lock().running.remove(&ino);
        self.done.notify_all();
        r
    }

    /// Take `ino`'s changes to write them back, unless a write-back of it is running.
    fn start(&self, ino: u64) -> Start {
        let mut t = self.lock();
        if t.running.contains(&ino) {
            return Start::Busy;
        }
        let Some(p) = t.remove(ino) else {
            return Start::Nothing;
        };
        self.count.store(t.pending.len(), Ordering::Relaxed);
        t.running.insert(ino);
        Start::Run(Box::new(p))
    }

    /// The copy onto itself, conditional on the base version.
    async fn copy(&self, p: &Pending) -> Result<(), S3Error> {
        let key = p.inode.key();
        let meta = p.meta();
        match self
            .s3
            .copy_object(&p.base, key, &meta, self.copy_threshold)
            .await
        {
            Ok(etag) => {
                let now = Instant::now();
                let stat = Stat {
                    size: p.base.size,
                    mtime: std::time::SystemTime::now(),
                    etag,
                    meta: Some(meta),
                };
                let until = now.checked_add(self.ttl).unwrap_or(now);
                p.inode.set_stat_asked(stat, until, now);
                self.stored.fetch_add(1, Ordering::Relaxed);
                debug!(key, change = ?p.change, "attributes written back");
                Ok(())
            }
            Err(e)
                if matches!(
                    e.kind,
                    S3ErrorKind::PreconditionFailed | S3ErrorKind::NotFound
                ) =>
            {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                warn!(key, change = ?p.change, "the object was replaced or removed by another client before the attributes set here were written back; the newer version keeps its own");
                p.inode.invalidate();
                Ok(())
            }
            Err(e) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                error!(key, change = ?p.change, error = %e, "the attributes set here could not be written back to S3 (the file's bytes are stored; set them again)");
                p.inode.invalidate();
                Err(e)
            }
        }
    }

    /// Counters for `s3rdma stats` and `/metrics`.
    pub fn report(&self, out: &mut dyn s3rdma_metrics::Sink) {
        use s3rdma_metrics::Value;
        let (c, g) = (Value::counter, Value::gauge);
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        out.value(c(
            "attr_writebacks",
            "Attribute changes written back by a copy.",
            l(&self.stored),
        ));
        out.value(c(
            "attr_changes_folded_into_renames",
            "Attribute changes carried by a rename's copy.",
            l(&self.folded),
        ));
        out.value(c(
            "attr_writebacks_failed",
            "Attribute write-backs that failed (logged).",
            l(&self.failed),
        ));
        out.value(c(
            "attr_writebacks_dropped",
            "Attribute changes dropped: another client replaced the object.",
            l(&self.dropped),
        ));
        out.value(g(
            "attr_changes_pending",
            "Files whose attribute changes wait to be written back.",
            self.count.load(Ordering::Relaxed) as u64,
        ));
    }
}
