//! The filesystem logic, generic over the object store: maps kernel requests onto the inode
//! table, listings, object readers and uploads. `fuse.rs` is the thin adapter that calls the
//! `do_*` methods here (which return attributes, handles and errno values, never reply
//! themselves); `tests/` drives the same methods on the in-memory store.
//!
//! FUSE worker threads (`--max-threads`) call in concurrently; each blocks on the tokio runtime
//! for its S3 requests, while read-ahead runs as tasks on that runtime.

pub mod attrs;
pub mod control;
mod deletes;
pub mod dir;
mod dirrename;
pub mod error;
mod forget;
mod fuse;
pub mod inode;
pub mod kinds;
pub mod names;
pub mod namespace;
mod parallel;
mod passthrough;
pub mod probe;
pub mod report;
pub mod small;
mod staged;
mod symlink;
pub mod whole_dirs;
pub mod write;
pub mod xattrs;

#[cfg(test)]
mod tests;

use s3rdma_proto::sync::Lock;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    BackingId, Errno, FileAttr, FileType, FopenFlags, INodeNo, Notifier, OpenAccMode, OpenFlags,
    ReplyOpen,
};
use tokio::runtime::Handle;
use tracing::{debug, warn};

use crate::cache::Cache;
use crate::diskcache::{CachedFile, DiskCache};
use crate::read::{ObjectReader, ReadConfig, ReadData};
use crate::stage::StagingArea;
use crate::upload::Uploader;
use dir::{DirBuilder, Listed};
use error::{Error, FsResult};
use inode::{Inode, InodeTable, Kind, Stat, ROOT_INO};
use probe::Probe;
use s3rdma_client::{FileMeta, ObjectStore, S3Error, S3ErrorKind};

/// Filesystem-level settings from the command line.
#[derive(Clone, Debug)]
pub struct FsConfig {
    pub uid: u32,
    pub gid: u32,
    pub file_mode: u16,
    pub dir_mode: u16,
    /// How long attributes and directory entries are trusted (ours and the kernel's).
    pub metadata_ttl: Duration,
    /// How long "no such key" is remembered.
    pub negative_ttl: Duration,
    pub read: ReadConfig,
    /// Open files with FOPEN_DIRECT_IO: no kernel page cache, every read reaches the daemon.
    pub direct_io: bool,
    /// Refuse every write (the kernel mount is read-only too).
    pub read_only: bool,
    /// Ask HeadObject for a file's stored attributes (mode, owner, mtime) when a lookup finds
    /// a version whose attributes are not known yet.
    pub file_metadata: bool,
    /// `mkdir` stores a `dir/` marker object (else the directory lives in this mount until
    /// something is written in it).
    pub dir_markers: bool,
    /// A directory rename moves at most this many keys; above, `EXDEV` (see `dirrename`).
    pub max_dir_rename_keys: usize,
    /// Objects above this size are copied (rename, attribute changes) with UploadPartCopy.
    pub multipart_copy_threshold: u64,
    /// `open` uses attributes younger than `metadata_ttl` (from a lookup or a listing) instead
    /// of asking S3 again: for data that does not change while mounted.
    pub open_trusts_metadata: bool,
    /// Ask the kernel for FUSE over io_uring at INIT, with this `max_write` (the payload of
    /// the rings' entries): the rings are made and will be registered. None: `/dev/fuse` only.
    pub ring_max_write: Option<u32>,
}

/// How old an answer about the key (lookup or HeadObject) may be for `open` to use it instead
/// of asking again.
const OPEN_REVALIDATE_WINDOW: Duration = Duration::from_millis(100);

/// Block size reported by `statfs` (and the unit of its block counts).
const BLOCK_SIZE: u32 = 4096;
/// The preferred I/O size `stat` reports (`st_blksize`) for a file the daemon serves: `cp`,
/// `cat` and stdio size their buffers by it, and 1 MiB writes cost an eighth of the FUSE
/// requests of the usual 128 KiB. (A file the kernel reads itself from the disk cache reports
/// the cache file system's size instead: see `S3Fs::io_size`.)
const IO_SIZE: u32 = 1 << 20;
/// The extended attribute of the mount's root that holds the live counters
/// (`s3rdma stats MOUNTPOINT` reads it).
pub use s3rdma_proto::xattr::STATS as STATS_XATTR;

/// Keys under one prefix that we log as hidden, at most once each.
const HIDDEN_LOG_CAPACITY: u64 = 100_000;

// Each lives in its own Arc: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum OpenFile<S: ObjectStore> {
    Read(u64, ObjectReader<S>),
    Write(u64, write::WriteFile<S>),
    /// Served from the disk cache: by the kernel when `backing` is set (passthrough), else by
    /// `pread` here.
    Disk(u64, DiskFile),
    /// A handle of a staged file.
    Staged {
        ino: u64,
        file: Arc<staged::Staged<S>>,
        /// Opened for writing: its close stores the file.
        writes: bool,
    },
}

struct DiskFile {
    key: String,
    etag: String,
    cached: CachedFile,
    /// Served by the kernel (counted in `Passthrough`).
    passthrough: bool,
    /// Opened in the kernel's cached mode (counted in `Passthrough`).
    cached_mode: bool,
}

/// What `do_open` decided; `open` sends it.
enum Opened {
    Plain(u64, FopenFlags),
    Passthrough(u64, FopenFlags, Arc<BackingId>),
}

struct OpenDir {
    /// Held while the directory is listed (async: the listing awaits S3).
    entries: tokio::sync::Mutex<Option<DirOut>>,
}

/// What `readdir` hands out for one open directory: its entries, in the listing's order.
#[derive(Default)]
struct DirOut {
    entries: Vec<DirEntryOut>,
}

struct DirEntryOut {
    name: String,
    /// When what it tells was learnt (the listing, or the HeadObject that told its type): the
    /// kernel trusts it for what is left of the metadata TTL from then.
    at: Instant,
    told: Told,
}

/// What an entry tells the kernel.
enum Told {
    /// Its attributes, and its inode (which the kernel counts; none for `.` and `..`).
    Ready(FileAttr, Option<Arc<Inode>>),
    /// Not handed out yet: an object that may be a symbolic link, asked about just before the
    /// kernel reads this far (see `kinds`: HeadObject, not the whole object — a listing does
    /// not mean a read, and `ls -l` of 10,000 objects of 1 KiB took 3.0 s so, 4.2 s with GETs).
    Unknown,
    /// Listed, but gone by the time it was asked about: no entry.
    Gone,
}

impl DirEntryOut {
    fn ready(name: String, at: Instant, attr: FileAttr, inode: Option<Arc<Inode>>) -> Self {
        DirEntryOut {
            name,
            at,
            told: Told::Ready(attr, inode),
        }
    }
}

/// The filesystem: what the kernel's requests are answered from. Each part is one concern.
pub struct S3Fs<S: ObjectStore> {
    rt: Handle,
    s3: S,
    cache: Arc<Cache<S>>,
    cfg: FsConfig,
    /// The names, kinds and attributes this mount knows, and what it changes of them.
    ns: Namespace<S>,
    /// Open files and directories.
    handles: Handles<S>,
    /// Files being written, and the uploads behind them.
    writes: Writes<S>,
    /// The local disk cache (`--cache-dir`).
    disk: Option<Arc<DiskCache>>,
    /// Which inodes the kernel reads itself from the disk cache.
    pass: passthrough::Passthrough,
    /// Failures, inodes dropped, FUSE latency.
    counters: Arc<report::FsCounters>,
    notifier: Arc<OnceLock<Notifier>>,
    mount_time: SystemTime,
}

/// The namespace of a mount (mountpoint-s3's superblock is the anchor): the inode table,
/// the answers it may reuse, what this mount made, and the changes it finishes in the
/// background.
struct Namespace<S: ObjectStore> {
    /// Inode numbers ↔ keys, with what was last learnt of each.
    inodes: Arc<InodeTable>,
    known: Known,
    made: Made,
    /// Attribute changes of stored files waiting to be written back.
    attrs: Arc<attrs::Writeback<S>>,
    /// Deletes of renamed sources, finished in the background.
    deletes: Arc<deletes::Deletes<S>>,
    /// When pinned inodes were last tried again.
    forget_retried: Mutex<Instant>,
}

/// Answers about names a mount may reuse instead of asking S3 again.
struct Known {
    /// "No such key" answers, for `--negative-ttl`.
    negative: Option<moka::sync::Cache<String, ()>>,
    /// Complete listings, reused within the metadata TTL.
    listings: dir::ListingCache,
    /// Directories whose every name is known (lookups of missing names ask nothing).
    whole_dirs: whole_dirs::WholeDirs,
    /// Keys logged as hidden, at most once each.
    hidden_logged: moka::sync::Cache<String, ()>,
    /// Lookups ask HeadObject + ListObjectsV2 instead of one listing (the server refused one).
    exact_probes: AtomicBool,
    /// The largest small file found by lookups in each directory (see `small`).
    siblings: small::Siblings,
}

/// What this mount made of the namespace that S3 may not hold (yet).
struct Made {
    /// Directories made with `mkdir` in this mount (they may have no key in S3 yet).
    local_dirs: Mutex<std::collections::HashSet<u64>>,
    /// Mode, owner and times set on directories (kept for the life of the mount).
    dir_attrs: Mutex<HashMap<u64, FileMeta>>,
    /// Held across an extended attribute change: each rewrites the file's whole set.
    xattr_change: tokio::sync::Mutex<()>,
}

/// The open handles of a mount, by handle number.
struct Handles<S: ObjectStore> {
    /// Open files (shared with [`control::FsControl`] for shutdown).
    files: control::FileTable<S>,
    dirs: Mutex<HashMap<u64, Arc<OpenDir>>>,
    next: AtomicU64,
}

impl<S: ObjectStore> Handles<S> {
    fn next_fh(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }
}

/// The write side of a mount.
struct Writes<S: ObjectStore> {
    /// Files being written in this mount, by inode.
    writing: Arc<Mutex<HashMap<u64, Arc<write::Writing>>>>,
    /// None on a read-only mount (no write buffers at all).
    uploader: Option<Arc<Uploader<S>>>,
    /// Set once the mount is shutting down: no new files are opened for writing.
    closing: Arc<AtomicBool>,
    /// Files aborted because the mount ended while they were written.
    aborted: Arc<std::sync::atomic::AtomicUsize>,
    /// Where staged files keep their bytes (None: read-only, or no staging).
    stage: Option<Arc<StagingArea>>,
    /// Staged files, by inode.
    staged: Mutex<HashMap<u64, Arc<staged::Staged<S>>>>,
    /// The kernel allows shared `mmap` of direct-I/O files (FUSE_DIRECT_IO_ALLOW_MMAP, Linux
    /// 6.6+): staged handles are opened with direct I/O (see `staged`).
    staged_direct: AtomicBool,
}

impl<S: ObjectStore> S3Fs<S> {
    /// `root_prefix` is the normalised mount prefix ("" or ending in "/"). `notifier` is filled in
    /// once the session exists; until then no invalidation is sent.
    pub fn new(
        rt: Handle,
        s3: S,
        cache: Arc<Cache<S>>,
        root_prefix: &str,
        cfg: FsConfig,
        notifier: Arc<OnceLock<Notifier>>,
        uploader: Option<Arc<Uploader<S>>>,
    ) -> Self {
        let negative = (!cfg.negative_ttl.is_zero()).then(|| {
            moka::sync::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(cfg.negative_ttl)
                .build()
        });
        let attrs = Arc::new(attrs::Writeback::new(
            s3.clone(),
            rt.clone(),
            cfg.metadata_ttl,
            cfg.multipart_copy_threshold,
        ));
        S3Fs {
            ns: Namespace {
                inodes: Arc::new(InodeTable::new(root_prefix)),
                known: Known {
                    negative,
                    listings: dir::ListingCache::new(cfg.metadata_ttl),
                    whole_dirs: whole_dirs::WholeDirs::new(cfg.negative_ttl),
                    hidden_logged: moka::sync::Cache::new(HIDDEN_LOG_CAPACITY),
                    exact_probes: AtomicBool::new(false),
                    siblings: small::Siblings::new(),
                },
                made: Made {
                    local_dirs: Mutex::new(Default::default()),
                    dir_attrs: Mutex::new(HashMap::new()),
                    xattr_change: tokio::sync::Mutex::new(()),
                },
                attrs,
                deletes: Arc::new(deletes::Deletes::new(s3.clone(), rt.clone())),
                forget_retried: Mutex::new(Instant::now()),
            },
            rt,
            s3,
            cache,
            handles: Handles {
                files: Arc::new(Mutex::new(HashMap::new())),
                dirs: Mutex::new(HashMap::new()),
                next: AtomicU64::new(1),
            },
            writes: Writes {
                writing: Default::default(),
                uploader,
                closing: Arc::new(AtomicBool::new(false)),
                aborted: Default::default(),
                stage: None,
                staged: Mutex::new(HashMap::new()),
                staged_direct: AtomicBool::new(false),
            },
            notifier,
            mount_time: SystemTime::now(),
            cfg,
            disk: None,
            pass: Default::default(),
            counters: Default::default(),
        }
    }

    /// Serve and fill the disk cache; `passthrough`: let the kernel read cached files itself.
    pub fn set_disk_cache(&mut self, disk: Arc<DiskCache>, passthrough: bool) {
        // Blocks the cache had to drop (its disk fell behind the reads) are fetched again by
        // its writer, pinned to the same ETag.
        let (s3, rt) = (self.s3.clone(), self.rt.clone());
        disk.set_fetch(Box::new(move |key, etag, offset, buf| {
            rt.block_on(s3.get_range_into(key, etag, offset, buf))
                .map_err(|e| match e.kind {
                    S3ErrorKind::NotFound | S3ErrorKind::PreconditionFailed => {
                        crate::diskcache::FetchError::Changed
                    }
                    _ => crate::diskcache::FetchError::Failed,
                })
        }));
        self.disk = Some(disk);
        self.pass.wanted = passthrough;
    }

    /// Stage files in `area` (opens for read-write, appends, edits in place, truncation).
    pub fn set_staging(&mut self, area: Arc<StagingArea>) {
        self.writes.stage = Some(area);
    }

    fn ttl_from(&self, now: Instant) -> Instant {
        now.checked_add(self.cfg.metadata_ttl)
            .unwrap_or(now + Duration::from_secs(100 * 365 * 86400))
    }

    fn dir_stat(&self) -> Stat {
        Stat {
            size: 0,
            mtime: self.mount_time,
            etag: String::new(),
            meta: None,
        }
    }

    /// The attributes of an entry the kernel is being handed (it counts the entry until it
    /// forgets it: see `forget`).
    fn entry(&self, inode: &Arc<Inode>, stat: &Stat) -> FileAttr {
        self.handed(inode);
        self.attr(inode, stat)
    }

    /// The attributes of `inode`: stored attributes win over the mount's defaults; a file's
    /// ctime is S3's Last-Modified.
    fn attr(&self, inode: &Inode, stat: &Stat) -> FileAttr {
        // Attributes set here and not written back yet show at once.
        let overlaid = self.ns.attrs.overlay(inode, stat);
        let stat = overlaid.as_ref().unwrap_or(stat);
        let (kind, perm, nlink) = match inode.kind {
            Kind::File => (FileType::RegularFile, self.cfg.file_mode, 1),
            Kind::Dir => (FileType::Directory, self.cfg.dir_mode, 2),
            Kind::Symlink => (FileType::Symlink, 0o777, 1),
        };
        let dir_meta = match inode.kind {
            Kind::Dir => self.dir_meta(inode.ino),
            Kind::File | Kind::Symlink => None,
        };
        let meta = dir_meta.as_ref().or(stat.meta.as_ref());
        let mtime = meta.and_then(|m| m.mtime).unwrap_or(stat.mtime);
        FileAttr {
            ino: INodeNo(inode.ino),
            size: stat.size,
            blocks: stat.size.div_ceil(512),
            atime: mtime,
            mtime,
            ctime: stat.mtime,
            crtime: stat.mtime,
            kind,
            perm: meta
                .and_then(|m| m.mode)
                .filter(|_| inode.kind != Kind::Symlink)
                .map_or(perm, |m| (m & 0o7777) as u16),
            nlink,
            uid: meta.and_then(|m| m.uid).unwrap_or(self.cfg.uid),
            gid: meta.and_then(|m| m.gid).unwrap_or(self.cfg.gid),
            rdev: 0,
            blksize: self.io_size(inode, stat),
            flags: 0,
        }
    }

    /// `st_blksize`: the preferred I/O size of whoever serves the file's bytes. The daemon
    /// (every read or write may be a FUSE request): 1 MiB. The kernel itself, reading this
    /// version from the disk cache by passthrough: the cache file system's own — so `cat` or
    /// stdio reading many small files does not allocate and fault a 1 MiB buffer for each.
    fn io_size(&self, inode: &Inode, stat: &Stat) -> u32 {
        match &self.disk {
            Some(d)
                if inode.kind == Kind::File
                    && stat.size > 0
                    && self.pass.is_on()
                    && d.contains(inode.key(), &stat.etag) =>
            {
                d.io_size()
            }
            _ => IO_SIZE,
        }
    }

    fn log_hidden(&self, key: &str, why: &str) {
        if !self.ns.known.hidden_logged.contains_key(key) {
            self.ns.known.hidden_logged.insert(key.to_string(), ());
            warn!(
                key,
                reason = why,
                "key is not shown in the mount: it cannot be a file name here"
            );
        }
    }

    fn negative_hit(&self, key: &str) -> bool {
        self.ns
            .known
            .negative
            .as_ref()
            .is_some_and(|c| c.contains_key(key))
    }

    fn remember_missing(&self, key: String) {
        if let Some(c) = &self.ns.known.negative {
            c.insert(key, ());
        }
    }

    /// LOOKUP: the entry `name` of `parent`, handed to the kernel (counted until it forgets).
    async fn do_lookup(&self, parent: u64, name: &OsStr) -> FsResult<FileAttr> {
        let (inode, stat) = self.resolve(parent, name).await?;
        Ok(self.entry(&inode, &stat))
    }

    /// The inode and attributes of `name` in `parent` (asking S3 if the inode table has no
    /// fresh answer), for the mount's own use: not counted as handed to the kernel.
    async fn resolve(&self, parent: u64, name: &OsStr) -> FsResult<(Arc<Inode>, Stat)> {
        let p = self.ns.inodes.get(parent).ok_or(Errno::ENOENT)?;
        if p.kind != Kind::Dir {
            return Err(Errno::ENOTDIR.into());
        }
        // S3 keys are UTF-8: a name that is not cannot exist.
        let name = name.to_str().ok_or(Errno::ENOENT)?;
        names::check_name(name)?;
        let now = Instant::now();
        if let Some(child) = self.ns.inodes.child(parent, name) {
            if let Some(stat) = self.local_stat(child.ino) {
                return Ok((child, stat));
            }
            if child.kind == Kind::Dir && self.is_local_dir(child.ino) {
                return Ok((child, self.dir_stat()));
            }
            if let Some(stat) = child.fresh_stat(now) {
                return Ok((child, stat));
            }
        }
        let key = names::child_key(p.key(), name);
        self.ns.deletes.wait_name(p.key(), name);
        if self.negative_hit(&key) || self.absent_by_listing(&p, name, now).await? {
            return Err(Errno::ENOENT.into());
        }
        if let Some(found) = self.recheck_file(parent, name, now).await {
            return Ok(found);
        }
        self.probe_name(parent, name, key, now).await
    }

    /// A name last seen as a file (in a listing, or an earlier lookup) is most likely still
    /// one: HeadObject alone answers it, stored attributes included (or the GET of a small
    /// one, see `small`). Anything else (gone, or turned into a directory) is left to the full
    /// probe (`None`).
    async fn recheck_file(
        &self,
        parent: u64,
        name: &str,
        now: Instant,
    ) -> Option<(Arc<Inode>, Stat)> {
        if !self.cfg.file_metadata {
            return None;
        }
        let child = self.ns.inodes.child(parent, name)?;
        if child.kind == Kind::Dir {
            return None;
        }
        let info = self.ask_file(&child).await.ok()?;
        let stat = Stat::from(&info);
        // A file that turned out to be a symbolic link (or back): a new inode.
        let kind = Kind::of_object(stat.meta.as_ref());
        let child = if kind == child.kind {
            child
        } else {
            self.ns
                .inodes
                .upsert_child(parent, name, kind, child.key().to_string())
        };
        self.remember(&child, stat.clone(), now);
        Some((child, stat))
    }

    /// Ask S3 what `name` (key `key`) in `parent` is: the probe, with the GET of a file like
    /// the last one found there sent beside it (see `small`).
    async fn probe_name(
        &self,
        parent: u64,
        name: &str,
        key: String,
        now: Instant,
    ) -> FsResult<(Arc<Inode>, Stat)> {
        let dir_prefix = names::dir_prefix_of(&key);
        // (Exact probes send HeadObject beside their listing already.)
        let ahead = self.cfg.file_metadata && !self.ns.known.exact_probes.load(Ordering::Relaxed);
        let sibling = ahead
            .then(|| self.ns.known.siblings.largest(parent))
            .flatten();
        let beside = sibling.map(|size| small::fetch_beside(&self.rt, &self.cache, &key, size));
        let probe = self.probe(&key, &dir_prefix).await;
        // Its answer, when it is one (a 404 or a failure says nothing the probe does not).
        let beside = match beside {
            Some(task) => small::joined(task, "GetObject", &key).await.ok(),
            None => None,
        };
        let probe = probe?;
        if ahead {
            let file_size = probe.file.as_ref().filter(|_| !probe.dir).map(|f| f.size);
            self.ns.known.siblings.found(parent, file_size);
        }
        // A directory wins over a file of the same name.
        if probe.dir {
            if probe.file.is_some() {
                self.log_hidden(&key, "a directory of the same name exists");
            }
            let child = self
                .ns
                .inodes
                .upsert_child(parent, name, Kind::Dir, dir_prefix);
            let stat = self.dir_stat();
            child.set_stat(stat.clone(), self.ttl_from(now));
            return Ok((child, stat));
        }
        match probe.file {
            Some(info) => self.found_file(parent, name, key, info, beside, now).await,
            None => {
                if let Some(child) = self.ns.inodes.child(parent, name) {
                    child.invalidate();
                }
                self.remember_missing(key);
                Err(Errno::ENOENT.into())
            }
        }
    }

    /// The probe found file `info` at `key`; `beside` is the answer of a GET sent with it.
    async fn found_file(
        &self,
        parent: u64,
        name: &str,
        key: String,
        info: s3rdma_client::ObjectInfo,
        beside: Option<s3rdma_client::ObjectInfo>,
        now: Instant,
    ) -> FsResult<(Arc<Inode>, Stat)> {
        let known = self.ns.inodes.child(parent, name);
        let mut stat = Stat::from(&info).inherit(known.and_then(|c| c.last_stat()).as_ref());
        if stat.meta.is_none() && self.cfg.file_metadata {
            // A listing does not carry the stored attributes: ask for them once per version
            // (rsync's quick check needs the mtime it set; a symbolic link is known by its
            // mode), unless the GET sent beside the probe answered for this very version.
            let head = match beside.filter(|b| b.etag == info.etag) {
                Some(head) => head,
                None => {
                    let last = Some((info.size, info.etag.as_str()));
                    let asked = small::ask_file(&self.cache, &self.s3, &key, last);
                    match asked.await {
                        Ok(head) => head,
                        Err(e) if e.kind == S3ErrorKind::NotFound => {
                            if let Some(c) = self.ns.inodes.child(parent, name) {
                                c.invalidate();
                            }
                            return Err(Errno::ENOENT.into());
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
            };
            stat = Stat::from(&head);
        }
        let kind = Kind::of_object(stat.meta.as_ref());
        let child = self.ns.inodes.upsert_child(parent, name, kind, key);
        self.remember(&child, stat.clone(), now);
        Ok((child, stat))
    }

    /// Whether `name` is missing from directory `p` as far as this mount knows without asking
    /// about the name itself (see `whole_dirs`): a directory it made or listed in full within the
    /// negative TTL; a small one whose knowledge expired is listed again (one page).
    async fn absent_by_listing(&self, p: &Inode, name: &str, now: Instant) -> FsResult<bool> {
        // A name this mount has an inode for is answered by the usual path.
        if self.ns.inodes.child(p.ino, name).is_some() {
            return Ok(false);
        }
        match self.ns.known.whole_dirs.answer(p.ino, name, now) {
            whole_dirs::Answer::Absent => Ok(true),
            whole_dirs::Answer::Listed | whole_dirs::Answer::Unknown => Ok(false),
            whole_dirs::Answer::Expired => {
                let page = self
                    .s3
                    .list_page(p.key(), Some("/"), None, whole_dirs::MAX_NAMES as i32)
                    .await?;
                if page.next_token.is_some() {
                    self.ns.known.whole_dirs.large(p.ino, now);
                    return Ok(false);
                }
                let mut builder = DirBuilder::new(p.key());
                builder.add_page(page);
                let (entries, _) = builder.finish();
                self.ns.known.whole_dirs.listed(
                    p.ino,
                    now,
                    entries.iter().map(|(n, _)| n.as_str()),
                );
                Ok(!entries.iter().any(|(n, _)| n == name)
                    && self.ns.inodes.child(p.ino, name).is_none())
            }
        }
    }

    /// What S3 says of file `inode` now (see `small`: a small one comes whole).
    /// What S3 answered about `inode` at `at`: its attributes from then on, trusted for the
    /// metadata TTL (`at` is when it was asked, not when the answer came).
    fn remember(&self, inode: &Inode, stat: Stat, at: Instant) -> Stat {
        inode.set_stat_asked(stat.clone(), self.ttl_from(at), at);
        stat
    }

    /// HeadObject of the file `inode`, remembered.
    async fn head_stat(&self, inode: &Inode) -> Result<Stat, S3Error> {
        let at = Instant::now();
        let info = self.s3.head(inode.key()).await?;
        Ok(self.remember(inode, Stat::from(&info), at))
    }

    async fn ask_file(&self, inode: &Inode) -> Result<s3rdma_client::ObjectInfo, S3Error> {
        let last = inode.last_stat();
        let last = last.as_ref().map(|s| (s.size, s.etag.as_str()));
        small::ask_file(&self.cache, &self.s3, inode.key(), last).await
    }

    /// Ask S3 what `key` is: one listing of the name, or (when that cannot be sure, or the
    /// server refuses such a listing) HeadObject and a listing of `key/`, concurrently.
    async fn probe(&self, key: &str, dir_prefix: &str) -> Result<Probe, S3Error> {
        if !self.ns.known.exact_probes.load(Ordering::Relaxed) {
            match self
                .s3
                .list_page(key, Some("/"), None, probe::PROBE_MAX_KEYS)
                .await
            {
                Ok(page) => {
                    if let Some(p) = probe::answer(page, key, dir_prefix) {
                        return Ok(p);
                    }
                }
                Err(e) if e.status == Some(400) => {
                    warn!(key, error = %e, "the server refuses a listing prefix that is not a directory; lookups use HeadObject + ListObjectsV2 from now on");
                    self.ns.known.exact_probes.store(true, Ordering::Relaxed);
                }
                Err(e) => return Err(e),
            }
        }
        let (head, list) = tokio::join!(
            self.s3.head(key),
            self.s3.list_page(dir_prefix, Some("/"), None, 1)
        );
        let list = list?;
        let dir = !list.objects.is_empty() || !list.prefixes.is_empty();
        let file = match head {
            Ok(info) => Some(info),
            // A directory's answer does not depend on the file's.
            Err(e) if dir || e.kind == S3ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        Ok(Probe { file, dir })
    }

    async fn do_getattr(&self, ino: u64) -> FsResult<FileAttr> {
        let inode = self.ns.inodes.get(ino).ok_or(Errno::ENOENT)?;
        if let Some(stat) = self.local_stat(ino) {
            return Ok(self.attr(&inode, &stat));
        }
        let now = Instant::now();
        if let Some(stat) = inode.fresh_stat(now) {
            return Ok(self.attr(&inode, &stat));
        }
        match inode.kind {
            // A directory has no object of its own to ask about; its existence is checked by
            // lookup when the kernel's entry expires.
            Kind::Dir => {
                let stat = self.dir_stat();
                inode.set_stat(stat.clone(), self.ttl_from(now));
                Ok(self.attr(&inode, &stat))
            }
            Kind::File | Kind::Symlink => {
                let stat = self
                    .head_stat(&inode)
                    .await
                    .inspect_err(|_| inode.invalidate())?;
                Ok(self.attr(&inode, &stat))
            }
        }
    }

    async fn do_open(
        &self,
        ino: u64,
        flags: OpenFlags,
        pid: u32,
        reply: Option<&ReplyOpen>,
    ) -> FsResult<Opened> {
        let inode = self.ns.inodes.get(ino).ok_or(Errno::ENOENT)?;
        match inode.kind {
            Kind::Dir => return Err(Errno::EISDIR.into()),
            // The kernel follows links itself; it never opens one.
            Kind::Symlink => return Err(Errno::ELOOP.into()),
            Kind::File => {}
        }
        if let Some(staged) = self.acquire_staged(ino) {
            let (fh, fl) = self.open_staged(ino, staged, flags)?;
            return Ok(Opened::Plain(fh, fl));
        }
        if flags.acc_mode() != OpenAccMode::O_RDONLY || flags.0 & libc::O_TRUNC != 0 {
            // Attributes set before are stored with the version they were set on.
            self.store_attrs(ino).await?;
            return self
                .open_for_write(&inode, flags, pid)
                .await
                .map(|(fh, fl)| Opened::Plain(fh, fl));
        }
        if self.writing(ino).is_some() {
            warn!(key = %inode.key(), "file is being written in this mount; it can be read once it is closed");
            return Err(Errno::EBUSY.into());
        }
        let stat = self.open_version(&inode).await?;
        let keep_cache = self.keep_kernel_pages(&inode, &stat);
        let cached = self.disk.as_ref();
        let cached = cached.and_then(|d| d.lookup(inode.key(), &stat.etag, stat.size));
        if let Some(cached) = cached {
            return Ok(self.open_cached(&inode, &stat, cached, keep_cache, reply));
        }
        let reader = ObjectReader::new(
            self.cache.clone(),
            self.s3.clone(),
            self.rt.clone(),
            inode.key(),
            &stat.etag,
            stat.size,
            self.cfg.read,
        )
        .with_disk_cache(self.disk.clone());
        let (flags, cached_mode) = self
            .pass
            .read_open_flags(ino, keep_cache, self.cfg.direct_io);
        let fh = self.handles.next_fh();
        self.lock_files().insert(
            fh,
            Arc::new(OpenFile::Read(ino, reader.with_cached_mode(cached_mode))),
        );
        Ok(Opened::Plain(fh, flags))
    }

    /// The version an open for reading pins. Close-to-open: every open asks S3 for the current
    /// version. The kernel's lookup right before this open may already have asked: an answer
    /// younger than OPEN_REVALIDATE_WINDOW is that same question (a listing is not: it may be
    /// old).
    async fn open_version(&self, inode: &Inode) -> FsResult<Stat> {
        let now = Instant::now();
        let trusted = if self.cfg.open_trusts_metadata {
            inode.fresh_stat(now).filter(|s| !s.etag.is_empty())
        } else {
            None
        };
        if let Some(stat) = trusted.or_else(|| inode.recently_asked(now, OPEN_REVALIDATE_WINDOW)) {
            return Ok(stat);
        }
        let info = self
            .ask_file(inode)
            .await
            .inspect_err(|_| inode.invalidate())?;
        Ok(self.remember(inode, Stat::from(&info), now))
    }

    /// Whether the kernel's pages of `inode` are of the version `stat` (kept across the open);
    /// a changed version drops its pages and size first.
    fn keep_kernel_pages(&self, inode: &Inode, stat: &Stat) -> bool {
        let previous = inode.swap_opened_etag(&stat.etag);
        let changed = previous.as_ref().is_some_and(|e| *e != stat.etag);
        if changed {
            if let Some(n) = self.notifier.get() {
                if let Err(e) = n.inval_inode(INodeNo(inode.ino), 0, 0) {
                    debug!(ino = inode.ino, error = %e, "inval_inode failed");
                }
            }
        }
        previous.is_some() && !changed
    }

    /// An open served from the disk cache: by FUSE passthrough when the kernel takes the
    /// backing file, else by the daemon's reads of it.
    fn open_cached(
        &self,
        inode: &Inode,
        stat: &Stat,
        cached: crate::diskcache::CachedFile,
        keep_cache: bool,
        reply: Option<&ReplyOpen>,
    ) -> Opened {
        let (ino, fh) = (inode.ino, self.handles.next_fh());
        let disk = self.disk.as_deref();
        let backing = reply.and_then(|r| {
            self.pass
                .backing_for(ino, inode.key(), &stat.etag, &cached, r, disk)
        });
        let (flags, cached_mode) = match &backing {
            Some(_) => (FopenFlags::FOPEN_NOFLUSH, false),
            None => self
                .pass
                .read_open_flags(ino, keep_cache, self.cfg.direct_io),
        };
        let file = DiskFile {
            key: inode.key().to_string(),
            etag: stat.etag.to_string(),
            cached,
            passthrough: backing.is_some(),
            cached_mode,
        };
        self.lock_files()
            .insert(fh, Arc::new(OpenFile::Disk(ino, file)));
        match backing {
            Some(b) => {
                if let Some(d) = disk {
                    d.stats.passthrough_opens.fetch_add(1, Ordering::Relaxed);
                }
                Opened::Passthrough(fh, flags, b)
            }
            None => Opened::Plain(fh, flags),
        }
    }

    async fn do_read(&self, fh: u64, offset: u64, size: u32) -> FsResult<ReadData<S>> {
        let file = self.lock_files().get(&fh).cloned().ok_or(Errno::EBADF)?;
        let reader = match &*file {
            OpenFile::Read(_, reader) => reader,
            OpenFile::Disk(_, d) => return self.read_cached(d, offset, size).await,
            OpenFile::Staged { file: s, .. } => {
                return self.read_staged(s, offset, size).await.map(ReadData::Owned)
            }
            OpenFile::Write(..) => {
                warn!(fh, "reading a file while writing it is not supported; close it and open it again to read");
                return Err(Errno::EOPNOTSUPP.into());
            }
        };
        let data = reader.read(offset, size).await?;
        if let Some(opened) = reader.first_read() {
            self.counters.first_byte(opened);
        }
        Ok(data)
    }

    /// The directory's entries: from a listing younger than the metadata TTL if this mount
    /// has one (and changed nothing since), else from S3.
    async fn list_dir(&self, inode: &Inode) -> FsResult<DirOut> {
        let now = Instant::now();
        let (listing, cached) = match self.ns.known.listings.get(inode.ino, now) {
            Some(l) => (l, true),
            None => {
                let generation = self.ns.known.listings.generation();
                let entries = self.list_from_s3(inode).await?;
                self.ns.known.whole_dirs.listed(
                    inode.ino,
                    now,
                    entries.iter().map(|(n, _)| n.as_str()),
                );
                let listing = self
                    .ns
                    .known
                    .listings
                    .put(inode.ino, now, generation, entries);
                (listing, false)
            }
        };
        debug!(key = %inode.key(), entries = listing.entries.len(), cached, "listed");
        let mut out = Vec::with_capacity(listing.entries.len() + 2);
        let parent = self.ns.inodes.get(inode.parent).unwrap_or_else(|| {
            self.ns
                .inodes
                .get(ROOT_INO)
                .expect("the root inode always exists")
        });
        let (dir_stat, at) = (self.dir_stat(), listing.at);
        for (name, dir) in [(".", inode), ("..", &*parent)] {
            let attr = self.attr(dir, &dir_stat);
            out.push(DirEntryOut::ready(name.into(), at, attr, None));
        }
        // Directories this mount keeps whatever S3 says (made here, or holding one or a file
        // being written).
        let kept = self.local_dirs_in(inode.ino);
        for (name, listed) in &listing.entries {
            out.extend(self.listed_entry(inode, name, listed, &kept, cached, now, at));
        }
        self.local_entries(inode, kept, at, &mut out);
        Ok(DirOut { entries: out })
    }

    /// The entry of `name` in a listing of `dir` made at `at` (`cached`: reused); none for a
    /// file hidden by a directory of this mount (in `kept`).
    #[allow(clippy::too_many_arguments)]
    fn listed_entry(
        &self,
        dir: &Inode,
        name: &str,
        listed: &Listed,
        kept: &[Arc<Inode>],
        cached: bool,
        now: Instant,
        at: Instant,
    ) -> Option<DirEntryOut> {
        let until = self.ttl_from(at);
        let (child, stat) = match listed {
            Listed::Dir => {
                let prefix = names::dir_prefix_of(&names::child_key(dir.key(), name));
                let child = self
                    .ns
                    .inodes
                    .upsert_child(dir.ino, name, Kind::Dir, prefix);
                let stat = self.listed_stat(&child, self.dir_stat(), cached, until, now);
                (child, stat)
            }
            // A directory made in this mount wins over a file another client stored under the
            // same name since [S-NS-CLASH].
            Listed::File(_) if kept.iter().any(|c| c.name() == name) => {
                let key = names::child_key(dir.key(), name);
                self.log_hidden(&key, "a directory of the same name exists");
                return None;
            }
            Listed::File(info) => match self.listed_file(dir, name, info) {
                Some((child, stat)) => {
                    let stat = self.listed_stat(&child, stat, cached, until, now);
                    (child, stat)
                }
                None => {
                    let told = Told::Unknown;
                    return Some(DirEntryOut {
                        name: name.to_string(),
                        at,
                        told,
                    });
                }
            },
        };
        let stat = self.local_stat(child.ino).unwrap_or(stat);
        let attr = self.attr(&child, &stat);
        Some(DirEntryOut::ready(name.to_string(), at, attr, Some(child)))
    }

    /// Directories made here and files being written exist in this mount before S3 has them:
    /// added to `out` where the listing did not have them.
    fn local_entries(
        &self,
        dir: &Inode,
        kept: Vec<Arc<Inode>>,
        at: Instant,
        out: &mut Vec<DirEntryOut>,
    ) {
        let dir_stat = self.dir_stat();
        let files = self.local_files_in(dir.ino).into_iter();
        let files = files.filter_map(|(ino, stat)| Some((self.ns.inodes.get(ino)?, stat)));
        let kept = kept.into_iter().map(|c| (c, dir_stat.clone()));
        for (child, stat) in kept.chain(files) {
            if !out.iter().any(|e| e.name == child.name()) {
                let attr = self.attr(&child, &stat);
                let name = child.name().to_string();
                out.push(DirEntryOut::ready(name, at, attr, Some(child)));
            }
        }
    }

    /// A listed file whose type and attributes HeadObject told at `at` (see `kinds`).
    fn asked_file(&self, dir: &Inode, name: &str, stat: &Stat, at: Instant) -> Arc<Inode> {
        let kind = Kind::of_object(stat.meta.as_ref());
        let key = names::child_key(dir.key(), name);
        let child = self.ns.inodes.upsert_child(dir.ino, name, kind, key);
        self.remember(&child, stat.clone(), at);
        child
    }

    /// A listed file as the listing tells it, with the stored attributes this mount knows of
    /// this version: its type is theirs, and a file where none are known and the object cannot
    /// be a link. None: its type is not known yet (see `kinds`).
    fn listed_file(
        &self,
        dir: &Inode,
        name: &str,
        info: &dir::ListedFile,
    ) -> Option<(Arc<Inode>, Stat)> {
        let known = self.ns.inodes.child(dir.ino, name);
        let stat = Stat {
            size: info.size,
            mtime: info.last_modified,
            etag: info.etag.to_string(),
            meta: None,
        }
        .inherit(known.and_then(|c| c.last_stat()).as_ref());
        if stat.meta.is_none() && self.cfg.file_metadata && kinds::may_be_link(info.size) {
            return None;
        }
        let kind = Kind::of_object(stat.meta.as_ref());
        let key = names::child_key(dir.key(), name);
        Some((self.ns.inodes.upsert_child(dir.ino, name, kind, key), stat))
    }

    /// The stat a listed entry gets: a reused listing never overrides what was learnt after
    /// it.
    fn listed_stat(
        &self,
        child: &Inode,
        stat: Stat,
        cached: bool,
        until: Instant,
        now: Instant,
    ) -> Stat {
        match cached.then(|| child.fresh_stat(now)).flatten() {
            Some(newer) => newer,
            None => {
                child.set_stat(stat.clone(), until);
                stat
            }
        }
    }

    /// One full ListObjectsV2 walk of the directory.
    async fn list_from_s3(&self, inode: &Inode) -> FsResult<Vec<(String, Listed)>> {
        self.ns.deletes.wait_prefix(inode.key());
        let mut builder = DirBuilder::new(inode.key());
        let result: Result<(), S3Error> = async {
            let mut token = None;
            loop {
                let mut page = self
                    .s3
                    .list_page(inode.key(), Some("/"), token, 1000)
                    .await?;
                token = page.next_token.take();
                builder.add_page(page);
                if token.is_none() {
                    return Ok(());
                }
            }
        }
        .await;
        result?;
        let (entries, hidden) = builder.finish();
        for h in hidden {
            self.log_hidden(&h.key, h.why);
        }
        Ok(entries)
    }

    /// `f` of the entries of open directory `fh` (listed at offset 0), the types of those from
    /// `offset` to `offset + ahead` told (see `kinds`).
    async fn with_dir_entries<R>(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        ahead: usize,
        f: impl FnOnce(&DirOut) -> R,
    ) -> FsResult<R> {
        let dir = self.lock_dirs().get(&fh).cloned().ok_or(Errno::EBADF)?;
        let mut cached = dir.entries.lock().await;
        let inode = self.ns.inodes.get(ino).ok_or(Errno::ENOENT)?;
        if offset == 0 || cached.is_none() {
            *cached = Some(self.list_dir(&inode).await?);
        }
        let out = cached.get_or_insert_with(DirOut::default);
        // Told until the first entry to hand out is known: a reply that stopped before any
        // entry would end the directory for the kernel.
        let mut from = offset as usize;
        loop {
            self.tell_kinds(&inode, out, from, ahead).await?;
            let next = out
                .entries
                .iter()
                .skip(from)
                .position(|e| !matches!(e.told, Told::Gone));
            match next {
                Some(n) if matches!(out.entries[from + n].told, Told::Unknown) => from += n,
                _ => break,
            }
        }
        Ok(f(out))
    }

    /// Write back the attribute changes of `ino` waiting to be (before its bytes change, at
    /// `fsync`).
    async fn store_attrs(&self, ino: u64) -> FsResult<()> {
        self.ns
            .attrs
            .flush(ino)
            .await
            .map_err(|e| Error::reported(&e))
    }

    /// Write back every attribute change waiting to be (the end of the mount); how many
    /// failed (each logged).
    pub async fn store_pending_attrs(&self) -> usize {
        self.ns.attrs.flush_all().await
    }

    /// Wait for the deletes that finish renames (the end of the mount); how many were still
    /// running when the wait ended.
    pub fn finish_renames(&self) -> usize {
        self.ns.deletes.wait_all(deletes::END_WAIT)
    }

    /// The live counters, one `name value` per line (`s3rdma stats`).
    pub fn stats_text(&self) -> String {
        let mut text = s3rdma_metrics::StatsText::default();
        s3rdma_metrics::Report::report(&self.reporter(), &mut text);
        text.text
    }

    /// Add the FUSE transport's counters to what the mount reports.
    pub fn set_transport_report(&self, r: Arc<dyn s3rdma_metrics::Report + Send + Sync>) {
        let _ = self.counters.transport.set(r);
    }

    /// Everything this mount counts, through shared handles: what `s3rdma stats` and the
    /// metrics endpoint read. Take it once the disk cache and staging area are set.
    pub fn reporter(&self) -> report::FsReport<S> {
        report::FsReport {
            s3: self.s3.clone(),
            cache: self.cache.clone(),
            uploader: self.writes.uploader.clone(),
            stage: self.writes.stage.clone(),
            disk: self.disk.clone(),
            attrs: self.ns.attrs.clone(),
            deletes: self.ns.deletes.clone(),
            counters: self.counters.clone(),
            files: self.handles.files.clone(),
            writing: self.writes.writing.clone(),
            inodes: self.ns.inodes.clone(),
        }
    }

    /// A handle for the mount's lifecycle (signals, unmount), kept when the session takes
    /// the file system.
    pub fn control(&self) -> control::FsControl<S> {
        control::FsControl {
            counters: self.counters.clone(),
            files: self.handles.files.clone(),
            closing: self.writes.closing.clone(),
            aborted: self.writes.aborted.clone(),
        }
    }

    fn lock_files(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<OpenFile<S>>>> {
        self.handles.files.locked()
    }

    fn lock_dirs(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<OpenDir>>> {
        self.handles.dirs.locked()
    }

    fn entry_ttl(&self) -> Duration {
        self.cfg.metadata_ttl
    }

    /// Hold across anything that changes the namespace in S3 (create, write, delete, rename,
    /// mkdir, rmdir, setattr): cached listings are not used again.
    fn ns_change(&self) -> dir::NamespaceChange<'_> {
        dir::NamespaceChange::new(&self.ns.known.listings)
    }
}

impl<S: ObjectStore> S3Fs<S> {
    /// Whether the file's current version (as last seen) is in the disk cache.
    async fn is_disk_cached(&self, ino: u64) -> Option<bool> {
        let inode = self.ns.inodes.get(ino)?;
        if inode.kind == Kind::Dir {
            return Some(false);
        }
        let stat = match inode.recently_asked(Instant::now(), self.cfg.metadata_ttl) {
            Some(stat) => stat,
            None => {
                let info = self.s3.head(inode.key()).await.ok()?;
                Stat::from(&info)
            }
        };
        let disk = self.disk.as_ref()?;
        Some(stat.size == 0 || disk.contains(inode.key(), &stat.etag))
    }
}

impl<S: ObjectStore> S3Fs<S> {
    /// A read of a file open from the disk cache (when the kernel does not read it itself). A
    /// local read error is no read error: the bytes come from S3 instead (same ETag).
    async fn read_cached(&self, d: &DiskFile, offset: u64, size: u32) -> FsResult<ReadData<S>> {
        use std::os::unix::fs::FileExt;
        let end = d.cached.size.min(offset.saturating_add(size as u64));
        if offset >= end {
            return Ok(ReadData::Owned(Vec::new()));
        }
        let mut buf = vec![0u8; (end - offset) as usize];
        if let Err(e) = d.cached.file.read_exact_at(&mut buf, offset) {
            warn!(key = %d.key, error = %e, "reading the disk cache failed; reading from S3");
            self.s3
                .get_range_into(&d.key, &d.etag, offset, &mut buf)
                .await
                .map_err(S3Error::pinned_gone)?;
        }
        Ok(ReadData::Owned(buf))
    }
}

impl<S: ObjectStore> S3Fs<S> {
    /// The last handle of an open file is closed (the kernel's RELEASE): its reader, disk cache
    /// hold or write goes.
    async fn do_release(&self, fh: u64) {
        let file = self.lock_files().remove(&fh);
        match file.as_deref() {
            Some(OpenFile::Read(ino, reader)) => {
                if reader.cached_mode() {
                    self.pass.release_cached_mode(*ino);
                }
                debug!(ino, key = reader.key(), "released");
            }
            Some(OpenFile::Disk(ino, d)) => {
                if d.cached_mode {
                    self.pass.release_cached_mode(*ino);
                }
                if d.passthrough {
                    self.pass.release(*ino);
                }
                debug!(ino, key = d.key, passthrough = d.passthrough, "released");
            }
            Some(OpenFile::Write(ino, w)) => self.release_write(*ino, w).await,
            Some(OpenFile::Staged { ino, file: s, .. }) => {
                // Its errors are logged (no process is left to report them to).
                let _ = self.release_staged(*ino, s).await;
            }
            None => {}
        }
    }

    /// Open directory `ino` for listing; returns its handle.
    async fn do_opendir(&self, ino: u64) -> FsResult<u64> {
        match self.ns.inodes.get(ino) {
            Some(i) if i.kind == Kind::Dir => {
                let fh = self.handles.next_fh();
                self.lock_dirs().insert(
                    fh,
                    Arc::new(OpenDir {
                        entries: tokio::sync::Mutex::new(None),
                    }),
                );
                Ok(fh)
            }
            Some(_) => Err(Errno::ENOTDIR.into()),
            None => Err(Errno::ENOENT.into()),
        }
    }

    fn do_releasedir(&self, fh: u64) {
        self.lock_dirs().remove(&fh);
    }
}
