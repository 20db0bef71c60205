//! The local disk cache (`--cache-dir`): whole objects, written as their blocks pass through
//! the registered memory cache, keyed by bucket, key and ETag, each with the CRC-64/NVME of
//! every block kept beside it. An object fully present with the ETag an `open` pinned is served
//! from its file — by the kernel itself (FUSE passthrough) where it can, else by `pread`.
//!
//! Layout under DIR: `s3rdma-cache-v1/lock` (flock: one mount per directory), and per object
//! `XX/NAME.data` (the bytes), `XX/NAME.meta` (bucket, key, ETag, size, block size, block CRCs),
//! `XX/NAME.part` while it is being filled. NAME is two CRC-64s of (bucket, key, ETag); the meta
//! file is compared in full, so a collision is a miss, never wrong bytes.
//!
//! - Filling never slows a read: blocks are copied to a writer thread through a bounded queue.
//!   A full queue drops the copy; the writer fetches such blocks itself (ranged GET with
//!   `If-Match`) once it is idle and the object's reader has moved on, so an object read
//!   faster than the disk can write is still complete after one pass.
//! - LRU eviction keeps the files (complete and being filled) within `--cache-dir-size`.
//! - Remount: entries found at start are trusted only after their blocks' CRCs are checked
//!   again, at their first use (an `open` that pinned the same ETag, asked of S3 at that open);
//!   a mismatch drops the entry (logged, counted) and the object is read from S3.
//! - A full disk (ENOSPC/EDQUOT): the cache shrinks to 90 % of what it holds; after three
//!   failures in a row, or below 64 MiB, it turns itself off with a warning. Reads never fail
//!   because of the disk cache.

mod store;

use s3rdma_proto::sync::Lock;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::setup::SetupError;
use store::Meta;

/// Bytes of blocks waiting for the writer thread, at most.
const MAX_QUEUED: u64 = 256 << 20;
/// Objects being filled at once, at most (the oldest is dropped for a new one).
const MAX_PARTIALS: usize = 512;
/// Below this the cache turns itself off rather than shrink further.
const MIN_LIMIT: u64 = 64 << 20;
/// Data files kept open at most (each pins about 1 KiB of kernel memory: file, dentry, inode).
const MAX_OPEN_FILES: usize = 16384;

/// `limit`, or less where the file system of `root` (holding `used` bytes of the cache) has
/// less room: 95 % of what is free, with one warning.
fn limit_within_room(dir: &Path, root: &Path, limit: u64, used: u64) -> u64 {
    let avail = store::available(root).unwrap_or(u64::MAX);
    let room = used.saturating_add(avail / 100 * 95);
    if room >= limit {
        return limit;
    }
    warn!(
        requested = limit,
        usable = room,
        dir = %dir.display(),
        "the cache directory's file system has less room than --cache-dir-size; the disk cache is limited to what fits"
    );
    room
}

/// The writer thread: runs the jobs of `rx` (blocks to write behind reads); when idle,
/// fetches blocks the cache had to drop, until blocks are offered again. Ends with the cache.
fn write_behind(cache: &std::sync::Weak<DiskCache>, rx: &std::sync::mpsc::Receiver<Job>) {
    loop {
        match rx.recv_timeout(REFILL_POLL) {
            Ok(job) => {
                let Some(c) = cache.upgrade() else { break };
                c.run(job);
            }
            Err(RecvTimeoutError::Timeout) => {
                let Some(c) = cache.upgrade() else { break };
                while c.refill_one() {
                    if let Ok(job) = rx.try_recv() {
                        c.run(job);
                        break;
                    }
                }
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
}

/// How many entries may keep their data file open: a quarter of the descriptors the process
/// may hold, at most MAX_OPEN_FILES.
fn fd_budget() -> usize {
    use nix::sys::resource::{getrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, _)) => ((soft / 4) as usize).min(MAX_OPEN_FILES),
        Err(_) => 0,
    }
}

/// A dropped block is fetched again once its object has had no offer for this long.
const REFILL_AFTER: Duration = Duration::from_secs(1);
/// How often an idle writer looks for dropped blocks to fetch.
const REFILL_POLL: Duration = Duration::from_millis(200);
/// Failed fetches of one object's dropped blocks before the object is given up.
const REFILL_ATTEMPTS: u32 = 3;

/// Why a block could not be fetched for the cache.
#[derive(Debug, PartialEq, Eq)]
pub enum FetchError {
    /// The object is gone or has another ETag now: drop what was filled.
    Changed,
    /// Anything else (try again later).
    Failed,
}

/// Reads `buf.len()` bytes of `key` at `offset`, only if its ETag is still `etag`.
pub type Fetch = Box<dyn Fn(&str, &str, u64, &mut [u8]) -> Result<(), FetchError> + Send + Sync>;

/// The default `--cache-dir-size`: half of the space free on DIR's file system now.
pub fn default_size(dir: &Path) -> u64 {
    let probe = if dir.exists() {
        dir.to_path_buf()
    } else {
        dir.parent().unwrap_or(Path::new("/")).to_path_buf()
    };
    store::available(&probe).unwrap_or(0) / 2
}

/// Counters, readable by the user.
#[derive(Debug, Default)]
pub struct DiskStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub stored: AtomicU64,
    pub evicted: AtomicU64,
    pub corrupt: AtomicU64,
    pub dropped: AtomicU64,
    pub errors: AtomicU64,
    pub passthrough_opens: AtomicU64,
    /// Cache files registered with the kernel for passthrough (one per entry while it keeps
    /// its file open, else one per inode's run of opens).
    pub passthrough_registrations: AtomicU64,
}

struct Entry {
    meta: Meta,
    last_use: u64,
    /// CRCs checked against the file since this mount started (or written by it).
    verified: bool,
    /// The data file, kept open (up to `fd_budget` entries) so that an open of the object
    /// needs no path lookup on the cache's file system (its inode stays in memory).
    file: Option<Arc<File>>,
    /// What the user of the cache tied to the kept file (the file system: its FUSE passthrough
    /// registration), dropped with the entry.
    attached: Option<Attachment>,
}

/// Something tied to a kept cache file, living as long as its entry.
pub type Attachment = Arc<dyn std::any::Any + Send + Sync>;

struct Partial {
    meta: Meta,
    file: Arc<File>,
    have: Vec<bool>,
    queued: Vec<bool>,
    /// Offered, but dropped because the writer was behind: to be fetched again.
    lost: Vec<bool>,
    lost_count: usize,
    missing: usize,
    born: u64,
    last_offer: Instant,
    refill_failures: u32,
}

impl Partial {
    fn lose(&mut self, i: usize) {
        self.queued[i] = false;
        if !self.lost[i] && !self.have[i] {
            self.lost[i] = true;
            self.lost_count += 1;
        }
    }

    fn found(&mut self, i: usize) {
        if self.lost[i] {
            self.lost[i] = false;
            self.lost_count -= 1;
        }
    }
}

struct State {
    limit: u64,
    used: u64,
    entries: HashMap<String, Entry>,
    partials: HashMap<String, Partial>,
    clock: u64,
    failures: u32,
    /// Entries whose data file is kept open.
    open_files: usize,
}

enum Job {
    Write {
        name: String,
        index: u64,
        data: Vec<u8>,
    },
}

pub struct DiskCache {
    root: PathBuf,
    bucket: String,
    block_size: u64,
    state: Mutex<State>,
    tx: Mutex<Option<SyncSender<Job>>>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    queued: AtomicU64,
    /// Entries whose data file may be kept open (a quarter of RLIMIT_NOFILE, ≤ MAX_OPEN_FILES).
    fd_budget: usize,
    /// Bytes the queue may hold (`MAX_QUEUED`; smaller in tests).
    queue_limit: u64,
    fetch: OnceLock<Fetch>,
    closing: AtomicBool,
    enabled: AtomicBool,
    /// The preferred I/O size (`st_blksize`) of the cache directory's file system.
    io_size: u32,
    pub stats: DiskStats,
    _lock: File,
}

/// A cached object, opened for reading.
pub struct CachedFile {
    pub file: Arc<File>,
    pub size: u64,
    /// What `attach` tied to this very file, if anything.
    pub attached: Option<Attachment>,
}

impl DiskCache {
    /// Open (or create) the cache under `dir` for `bucket`, holding at most `limit` bytes (less
    /// if the file system has less room). Entries from earlier mounts are kept, to be checked
    /// at first use; files being filled when they ended are removed.
    pub fn open(
        dir: &Path,
        limit: u64,
        bucket: &str,
        block_size: u64,
    ) -> Result<Arc<DiskCache>, SetupError> {
        Self::open_with_queue(dir, limit, bucket, block_size, MAX_QUEUED)
    }

    fn open_with_queue(
        dir: &Path,
        limit: u64,
        bucket: &str,
        block_size: u64,
        queue_limit: u64,
    ) -> Result<Arc<DiskCache>, SetupError> {
        let root = dir.join("s3rdma-cache-v1");
        std::fs::create_dir_all(&root).map_err(|source| SetupError::Dir {
            flag: "cache-dir",
            path: root.clone(),
            source,
        })?;
        let lock = store::lock_dir(&root)?;
        let io_size = {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(&root).map_or(4096, |m| m.blksize().clamp(512, 1 << 20) as u32)
        };
        let (found, used) = store::scan(&root);
        let limit_now = limit_within_room(dir, &root, limit, used);
        let entries: HashMap<_, _> = found
            .into_iter()
            .map(|(name, meta)| {
                let entry = Entry {
                    meta,
                    last_use: 0,
                    verified: false,
                    file: None,
                    attached: None,
                };
                (name, entry)
            })
            .collect();
        info!(dir = %root.display(), entries = entries.len(), bytes = used, limit = limit_now, "disk cache opened");
        let cache = Arc::new(DiskCache {
            root,
            bucket: bucket.to_string(),
            block_size,
            state: Mutex::new(State {
                limit: limit_now,
                used,
                entries,
                partials: HashMap::new(),
                clock: 1,
                failures: 0,
                open_files: 0,
            }),
            tx: Mutex::new(None),
            writer: Mutex::new(None),
            queued: AtomicU64::new(0),
            queue_limit,
            fd_budget: fd_budget(),
            fetch: OnceLock::new(),
            closing: AtomicBool::new(false),
            enabled: AtomicBool::new(limit_now >= MIN_LIMIT),
            io_size,
            stats: DiskStats::default(),
            _lock: lock,
        });
        if !cache.enabled.load(Ordering::Relaxed) {
            warn!(
                limit = limit_now,
                "the disk cache has less than 64 MiB to use; it stays off"
            );
        }
        {
            let mut st = cache.lock();
            let limit = st.limit;
            st.evict_to(limit, &cache);
        }
        let (tx, rx) = sync_channel::<Job>(1024);
        let weak = Arc::downgrade(&cache);
        let handle = std::thread::Builder::new()
            .name("s3rdma-diskcache".into())
            .spawn(move || write_behind(&weak, &rx))
            .map_err(|source| SetupError::Thread {
                what: "disk cache writer",
                source,
            })?;
        *cache.tx.locked() = Some(tx);
        *cache.writer.locked() = Some(handle);
        Ok(cache)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.locked()
    }

    fn name(&self, key: &str, etag: &str) -> String {
        store::entry_name(&self.bucket, key, etag)
    }

    fn path(&self, name: &str, ext: &str) -> PathBuf {
        store::entry_path(&self.root, name, ext)
    }

    /// The preferred I/O size of the cache directory's file system (its `st_blksize`).
    pub fn io_size(&self) -> u32 {
        self.io_size
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Whether the object (this version) is complete in the cache.
    pub fn contains(&self, key: &str, etag: &str) -> bool {
        let name = self.name(key, etag);
        self.lock()
            .entries
            .get(&name)
            .is_some_and(|e| e.meta.is(&self.bucket, key, etag))
    }

    /// The object's file, if it is complete in the cache with this ETag and size. An entry
    /// from an earlier mount is checked block by block first; a bad one is dropped.
    pub fn lookup(&self, key: &str, etag: &str, size: u64) -> Option<CachedFile> {
        if !self.enabled() || size == 0 {
            return None;
        }
        let name = self.name(key, etag);
        let (verified, open) = {
            let mut st = self.lock();
            st.clock += 1;
            let clock = st.clock;
            match st.entries.get_mut(&name) {
                Some(e) if e.meta.is(&self.bucket, key, etag) && e.meta.size == size => {
                    e.last_use = clock;
                    (e.verified, e.file.clone().map(|f| (f, e.attached.clone())))
                }
                _ => {
                    self.stats.misses.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
            }
        };
        if let Some((file, attached)) = open.filter(|_| verified) {
            self.stats.hits.fetch_add(1, Ordering::Relaxed);
            return Some(CachedFile {
                file,
                size,
                attached,
            });
        }
        let path = self.path(&name, "data");
        let file = match File::open(&path) {
            Ok(f) => Arc::new(f),
            Err(e) => {
                warn!(key, error = %e, "a disk cache entry cannot be opened; dropping it");
                self.drop_entry(&name);
                self.stats.misses.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        };
        if !verified {
            let meta = match self.lock().entries.get(&name) {
                Some(e) => e.meta.clone(),
                None => return None,
            };
            if let Err(why) = store::verify(&file, &meta) {
                warn!(
                    key,
                    etag, "disk cache entry is corrupt ({why}); dropping it and reading from S3"
                );
                self.stats.corrupt.fetch_add(1, Ordering::Relaxed);
                self.drop_entry(&name);
                return None;
            }
        }
        {
            let mut st = self.lock();
            let unopened = st.entries.get(&name).is_some_and(|e| e.file.is_none());
            let kept = if unopened {
                st.keep_open(self.fd_budget, file.clone())
            } else {
                None
            };
            if let Some(e) = st.entries.get_mut(&name) {
                e.verified = true;
                if kept.is_some() {
                    e.file = kept;
                }
            }
        }
        self.stats.hits.fetch_add(1, Ordering::Relaxed);
        Some(CachedFile {
            file,
            size,
            attached: None,
        })
    }

    /// Tie `thing` to the entry of `key` at `etag` for as long as the entry keeps `file` open
    /// (it goes with the entry: evicted, dropped, or the cache closed). False, and `thing` not
    /// kept, if the entry does not keep that file.
    pub fn attach(&self, key: &str, etag: &str, file: &Arc<File>, thing: Attachment) -> bool {
        let name = self.name(key, etag);
        let mut st = self.lock();
        match st.entries.get_mut(&name) {
            Some(e) if e.file.as_ref().is_some_and(|f| Arc::ptr_eq(f, file)) => {
                e.attached = Some(thing);
                true
            }
            _ => false,
        }
    }

    /// Let go of everything `attach` tied to entries (before the FUSE connection goes).
    pub fn detach_all(&self) {
        let taken: Vec<Attachment> = {
            let mut st = self.lock();
            st.entries
                .values_mut()
                .filter_map(|e| e.attached.take())
                .collect()
        };
        drop(taken);
    }

    fn drop_entry(&self, name: &str) {
        let mut st = self.lock();
        if let Some(e) = st.entries.remove(name) {
            st.used = st.used.saturating_sub(e.meta.size);
            st.open_files -= usize::from(e.file.is_some());
            store::remove(&self.root, name);
        }
    }

    /// Block `index` of object `key` (version `etag`, `size` bytes) has been read from S3:
    /// keep a copy, if the cache wants the object and the writer is keeping up.
    pub fn offer(&self, key: &str, etag: &str, size: u64, index: u64, data: &[u8]) {
        if !self.enabled() || size == 0 || etag.is_empty() {
            return;
        }
        let blocks = size.div_ceil(self.block_size) as usize;
        if index as usize >= blocks
            || data.len() as u64 != self.block_size.min(size - index * self.block_size)
        {
            return;
        }
        let name = self.name(key, etag);
        {
            let mut st = self.lock();
            if st.entries.contains_key(&name) {
                return;
            }
            if !st.partials.contains_key(&name) {
                match self.begin_partial(&mut st, &name, key, etag, size) {
                    Ok(true) => {}
                    Ok(false) => return,
                    Err(e) => {
                        drop(st);
                        self.failed(&name, &e);
                        return;
                    }
                }
            }
            let Some(p) = st.partials.get_mut(&name) else {
                return;
            };
            p.last_offer = Instant::now();
            if p.have[index as usize] || p.queued[index as usize] {
                return;
            }
            let len = data.len() as u64;
            if self.queued.load(Ordering::Relaxed) + len > self.queue_limit {
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                p.lose(index as usize);
                return;
            }
            p.queued[index as usize] = true;
            self.queued.fetch_add(len, Ordering::Relaxed);
        }
        let job = Job::Write {
            name,
            index,
            data: data.to_vec(),
        };
        let sent = match &*self.tx.locked() {
            Some(tx) => tx.try_send(job).is_ok(),
            None => false,
        };
        if !sent {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            self.queued.fetch_sub(data.len() as u64, Ordering::Relaxed);
            if let Some(p) = self.lock().partials.get_mut(&self.name(key, etag)) {
                p.lose(index as usize);
            }
        }
    }

    /// Make room for, and start, the partial file of object `key` at `etag` (`name`), whose
    /// blocks are then offered one by one; false when it is not to be cached (over half the
    /// cache, or no room without evicting entries in use).
    fn begin_partial(
        &self,
        st: &mut State,
        name: &str,
        key: &str,
        etag: &str,
        size: u64,
    ) -> std::io::Result<bool> {
        if size > st.limit / 2 {
            return Ok(false);
        }
        if st.partials.len() >= MAX_PARTIALS {
            st.drop_oldest_partial(self);
        }
        let target = st.limit.saturating_sub(size);
        if !st.evict_to(target, self) {
            return Ok(false);
        }
        let file = store::create_part(&self.root, name, size)?;
        let blocks = size.div_ceil(self.block_size) as usize;
        st.used += size;
        st.clock += 1;
        let partial = Partial {
            meta: Meta::new(&self.bucket, key, etag, size, self.block_size),
            file: Arc::new(file),
            have: vec![false; blocks],
            queued: vec![false; blocks],
            lost: vec![false; blocks],
            lost_count: 0,
            missing: blocks,
            born: st.clock,
            last_offer: Instant::now(),
            refill_failures: 0,
        };
        st.partials.insert(name.to_string(), partial);
        Ok(true)
    }

    /// Where the cache gets dropped blocks from (set once, by the file system).
    pub fn set_fetch(&self, fetch: Fetch) {
        let _ = self.fetch.set(fetch);
    }

    /// The writer thread, when idle: fetch one dropped block of an object whose reader has
    /// moved on. False when there is nothing to do.
    fn refill_one(&self) -> bool {
        let Some(fetch) = self.fetch.get() else {
            return false;
        };
        if !self.enabled() || self.closing.load(Ordering::Relaxed) {
            return false;
        }
        let now = Instant::now();
        let pick = {
            let mut st = self.lock();
            let found = st.partials.iter_mut().find(|(_, p)| {
                p.lost_count > 0 && now.saturating_duration_since(p.last_offer) >= REFILL_AFTER
            });
            found.and_then(|(name, p)| {
                let i = p.lost.iter().position(|&l| l)?;
                p.found(i);
                p.queued[i] = true;
                Some((
                    name.clone(),
                    p.meta.key.clone(),
                    p.meta.etag.clone(),
                    i,
                    p.meta.size,
                ))
            })
        };
        let Some((name, key, etag, i, size)) = pick else {
            return false;
        };
        let offset = i as u64 * self.block_size;
        let mut data = vec![0u8; self.block_size.min(size - offset) as usize];
        match fetch(&key, &etag, offset, &mut data) {
            Ok(()) => self.store_block(&name, i as u64, &data),
            Err(e) => {
                let mut st = self.lock();
                let give_up = match st.partials.get_mut(&name) {
                    Some(p) => {
                        p.lose(i);
                        p.last_offer = Instant::now();
                        p.refill_failures += 1;
                        e == FetchError::Changed || p.refill_failures >= REFILL_ATTEMPTS
                    }
                    None => false,
                };
                if give_up {
                    warn!(key, etag, error = ?e, "cannot fetch the blocks the disk cache dropped; this object is not cached");
                    st.drop_partial(&name, self);
                }
            }
        }
        true
    }

    /// The writer thread: one block into its object's file; the object is complete when its
    /// last block is written.
    fn run(&self, job: Job) {
        let Job::Write { name, index, data } = job;
        self.queued.fetch_sub(data.len() as u64, Ordering::Relaxed);
        self.store_block(&name, index, &data);
    }

    fn store_block(&self, name: &str, index: u64, data: &[u8]) {
        let file = match self.lock().partials.get(name) {
            Some(p) => p.file.clone(),
            None => return,
        };
        if let Err(e) = store::write_block(&file, index * self.block_size, data) {
            self.failed(name, &e);
            return;
        }
        let crc = s3rdma_proto::checksum::crc64nvme(data);
        let done = {
            let mut st = self.lock();
            let Some(p) = st.partials.get_mut(name) else {
                return;
            };
            let i = index as usize;
            if !p.have[i] {
                p.have[i] = true;
                p.found(i);
                p.meta.crcs[i] = crc;
                p.missing -= 1;
            }
            p.missing == 0
        };
        if done {
            self.finish(name);
        }
    }

    /// Every block is written: make the entry visible. Done under the lock, so that no offer
    /// starts the same object again while its files are being renamed.
    fn finish(&self, name: &str) {
        let mut st = self.lock();
        let Some(p) = st.partials.remove(name) else {
            return;
        };
        match store::commit(&self.root, name, &p.meta) {
            Ok(()) => {
                st.clock += 1;
                let clock = st.clock;
                st.failures = 0;
                let file = st.keep_open(self.fd_budget, p.file);
                st.entries.insert(
                    name.to_string(),
                    Entry {
                        meta: p.meta,
                        last_use: clock,
                        verified: true,
                        file,
                        attached: None,
                    },
                );
                self.stats.stored.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                st.used = st.used.saturating_sub(p.meta.size);
                store::remove(&self.root, name);
                drop(st);
                self.failed(name, &e);
            }
        }
    }

    /// Writing `name` failed: drop it; on a full disk shrink the cache, and turn it off when
    /// that keeps happening.
    fn failed(&self, name: &str, e: &std::io::Error) {
        self.stats.errors.fetch_add(1, Ordering::Relaxed);
        let full = matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT));
        let mut st = self.lock();
        st.drop_partial(name, self);
        st.failures += 1;
        if full {
            let limit = st.used / 10 * 9;
            warn!(error = %e, from = st.limit, to = limit, "the disk cache's file system is full; shrinking the cache");
            st.limit = limit;
            st.evict_to(limit, self);
        } else {
            warn!(error = %e, "cannot write to the disk cache; this object is not cached");
        }
        if st.failures >= 3 || st.limit < MIN_LIMIT {
            if self.enabled.swap(false, Ordering::Relaxed) {
                warn!(failures = st.failures, limit = st.limit, "the disk cache keeps failing; it is turned off for this mount (reads go on from S3)");
            }
            st.drop_partials(self);
        }
    }

    /// The disk cache's counters (see [`s3rdma_metrics::Report`]).
    pub fn report(&self, out: &mut dyn s3rdma_metrics::Sink) {
        use s3rdma_metrics::{load, Value};
        let (c, g) = (Value::counter, Value::gauge);
        let s = &self.stats;
        let (entries, used, limit) = {
            let st = self.lock();
            (st.entries.len(), st.used, st.limit)
        };
        out.value(c(
            "disk_cache_hits",
            "Opens served from the disk cache.",
            load(&s.hits),
        ));
        out.value(c(
            "disk_cache_misses",
            "Opens of files not (wholly) in the disk cache.",
            load(&s.misses),
        ));
        out.value(c(
            "disk_cache_stored",
            "Objects stored whole in the disk cache.",
            load(&s.stored),
        ));
        out.value(c(
            "disk_cache_evicted",
            "Disk cache entries evicted.",
            load(&s.evicted),
        ));
        out.value(c(
            "disk_cache_corrupt",
            "Disk cache blocks that failed their CRC check (dropped, read from S3).",
            load(&s.corrupt),
        ));
        out.value(c(
            "disk_cache_dropped",
            "Blocks not written to the disk cache because it fell behind.",
            load(&s.dropped),
        ));
        out.value(c(
            "disk_cache_errors",
            "I/O errors of the disk cache.",
            load(&s.errors),
        ));
        out.value(g(
            "disk_cache_entries",
            "Objects in the disk cache.",
            entries as u64,
        ));
        out.value(g("disk_cache_bytes", "Bytes the disk cache holds.", used));
        out.value(
            g(
                "disk_cache_limit",
                "The disk cache's size limit in bytes.",
                limit,
            )
            .exported("disk_cache_limit_bytes", &[]),
        );
        out.value(g(
            "disk_cache_enabled",
            "1 while the disk cache is on.",
            u64::from(self.enabled()),
        ));
        out.value(c(
            "passthrough_opens",
            "Opens the kernel reads itself from the disk cache (FUSE passthrough).",
            load(&s.passthrough_opens),
        ));
        out.value(c(
            "passthrough_registrations",
            "Disk cache files registered for FUSE passthrough.",
            load(&s.passthrough_registrations),
        ));
    }

    /// Stop the writer (blocks already queued are written) and remove unfinished files.
    pub fn close(&self) {
        self.closing.store(true, Ordering::Relaxed);
        drop(self.tx.locked().take());
        if let Some(h) = self.writer.locked().take() {
            let _ = h.join();
        }
        let mut st = self.lock();
        st.drop_partials(self);
        drop(st);
        self.detach_all();
    }
}

impl State {
    /// `file` to keep open with its entry, if fewer than `budget` are.
    fn keep_open(&mut self, budget: usize, file: Arc<File>) -> Option<Arc<File>> {
        (self.open_files < budget).then(|| {
            self.open_files += 1;
            file
        })
    }

    /// Evict least recently used entries until `used <= target`; false if that is impossible
    /// (what is left is being filled).
    fn evict_to(&mut self, target: u64, cache: &DiskCache) -> bool {
        while self.used > target {
            let Some(victim) = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.last_use)
                .map(|(n, _)| n.clone())
            else {
                return false;
            };
            if let Some(e) = self.entries.remove(&victim) {
                self.used = self.used.saturating_sub(e.meta.size);
                self.open_files -= usize::from(e.file.is_some());
                store::remove(&cache.root, &victim);
                cache.stats.evicted.fetch_add(1, Ordering::Relaxed);
            }
        }
        true
    }

    fn drop_oldest_partial(&mut self, cache: &DiskCache) {
        let oldest = self
            .partials
            .iter()
            .min_by_key(|(_, p)| p.born)
            .map(|(n, _)| n.clone());
        if let Some(n) = oldest {
            self.drop_partial(&n, cache);
        }
    }

    /// Stop filling `name`: its reservation and its files go.
    fn drop_partial(&mut self, name: &str, cache: &DiskCache) {
        if let Some(p) = self.partials.remove(name) {
            self.used = self.used.saturating_sub(p.meta.size);
            store::remove_unfinished(&cache.root, name);
        }
    }

    fn drop_partials(&mut self, cache: &DiskCache) {
        let names: Vec<String> = self.partials.keys().cloned().collect();
        for n in names {
            self.drop_partial(&n, cache);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn wait_for(mut done: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if done() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Blocks the writer could not take (here: a queue of zero bytes drops every offer) are
    /// fetched again once the reader has moved on, so the object is complete after one pass
    /// (and its file is kept open); an object that changed in the meantime is given up.
    #[test]
    fn dropped_blocks_are_fetched_again() {
        let dir = tempfile::tempdir().unwrap();
        let bs: u64 = 64 << 10;
        let c = DiskCache::open_with_queue(dir.path(), 1 << 30, "bkt", bs, 0).unwrap();
        let size = 32 * bs + 1000;
        let data: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
        let fetched = Arc::new(AtomicU64::new(0));
        let (src, n) = (data.clone(), fetched.clone());
        c.set_fetch(Box::new(move |key, etag, offset, buf| {
            if key == "changed" {
                return Err(FetchError::Changed);
            }
            assert_eq!((key, etag), ("k", "e1"));
            n.fetch_add(1, Ordering::Relaxed);
            let at = offset as usize;
            buf.copy_from_slice(&src[at..at + buf.len()]);
            Ok(())
        }));
        let blocks = size.div_ceil(bs);
        for i in 0..blocks {
            let start = (i * bs) as usize;
            let end = (start + bs as usize).min(size as usize);
            c.offer("k", "e1", size, i, &data[start..end]);
        }
        assert_eq!(c.stats.dropped.load(Ordering::Relaxed), blocks);
        assert!(!c.contains("k", "e1"));
        assert!(wait_for(|| c.contains("k", "e1")), "never completed");
        assert_eq!(fetched.load(Ordering::Relaxed), blocks);
        let f = c.lookup("k", "e1", size).unwrap();
        let mut back = vec![0u8; size as usize];
        f.file.read_exact_at(&mut back, 0).unwrap();
        assert!(back == data, "the refilled object has other bytes");
        // The complete entry keeps its file open, so an open of it needs no path lookup: it is
        // served even with the file's name gone.
        std::fs::remove_file(c.path(&c.name("k", "e1"), "data")).unwrap();
        let again = c
            .lookup("k", "e1", size)
            .expect("not served from the kept file");
        let mut back = vec![0u8; size as usize];
        again.file.read_exact_at(&mut back, 0).unwrap();
        assert!(back == data);
        for i in 0..8 {
            c.offer("changed", "e1", 8 * bs, i, &data[..bs as usize]);
        }
        assert!(wait_for(|| c.lock().partials.is_empty()), "not given up");
        assert!(!c.contains("changed", "e1"));
        c.close();
    }

    /// What is attached to an entry's kept file (the file system's passthrough registration)
    /// comes back with every lookup of that file, and goes with the entry: evicted, or the
    /// cache closed — never kept for a file the entry does not hold.
    #[test]
    fn attachments_live_and_die_with_their_entry() {
        let dir = tempfile::tempdir().unwrap();
        let bs: u64 = 64 << 10;
        let c = DiskCache::open(dir.path(), 1 << 30, "bkt", bs).unwrap();
        let data: Vec<u8> = (0..bs).map(|i| (i % 253) as u8).collect();
        for key in ["a", "b"] {
            c.offer(key, "e1", bs, 0, &data);
            assert!(wait_for(|| c.contains(key, "e1")), "{key} never completed");
        }
        let a = c.lookup("a", "e1", bs).unwrap();
        assert!(a.attached.is_none());
        let thing: Attachment = Arc::new(7u32);
        let weak = Arc::downgrade(&thing);
        let other = Arc::new(File::open(c.path(&c.name("a", "e1"), "data")).unwrap());
        assert!(
            !c.attach("a", "e1", &other, thing.clone()),
            "not the kept file"
        );
        assert!(
            !c.attach("a", "e2", &a.file, thing.clone()),
            "another version"
        );
        assert!(c.attach("a", "e1", &a.file, thing));
        let again = c.lookup("a", "e1", bs).unwrap();
        let got = again.attached.clone().unwrap().downcast::<u32>().unwrap();
        assert_eq!(*got, 7);
        drop((a, again, got));
        assert!(weak.upgrade().is_some(), "dropped while its entry is there");
        {
            let mut st = c.lock();
            st.clock += 1;
            let clock = st.clock;
            st.entries.get_mut(&c.name("b", "e1")).unwrap().last_use = clock;
            let keep = st.used - bs;
            assert!(st.evict_to(keep, &c));
        }
        assert!(!c.contains("a", "e1"));
        assert!(weak.upgrade().is_none(), "outlived its evicted entry");
        let b = c.lookup("b", "e1", bs).unwrap();
        let thing: Attachment = Arc::new(8u32);
        let weak = Arc::downgrade(&thing);
        assert!(c.attach("b", "e1", &b.file, thing));
        drop(b);
        c.close();
        assert!(weak.upgrade().is_none(), "outlived the cache's close");
    }
}
