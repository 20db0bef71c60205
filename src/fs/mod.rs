//! The FUSE filesystem: maps kernel requests onto the inode table, listings and object readers.
//!
//! FUSE worker threads (`--max-threads`) call in concurrently; each blocks on the tokio runtime
//! for its S3 requests, while read-ahead runs as tasks on that runtime.

pub mod dir;
pub mod inode;
pub mod names;
pub mod probe;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, Notifier, OpenAccMode, OpenFlags, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, Request,
};
use tokio::runtime::Handle;
use tracing::{debug, debug_span, info, warn};

use crate::cache::Cache;
use crate::read::{ObjectReader, ReadConfig, ReadData};
use crate::s3::{S3Client, S3Error, S3ErrorKind};
use dir::{DirBuilder, Listed};
use inode::{Inode, InodeTable, Kind, Stat, ROOT_INO};
use probe::Probe;

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
}

/// How old an answer about the key (lookup or HeadObject) may be for `open` to use it instead
/// of asking again.
const OPEN_REVALIDATE_WINDOW: Duration = Duration::from_millis(100);

/// Block size reported by `stat` and `statfs`.
const BLOCK_SIZE: u32 = 4096;
/// Keys under one prefix that we log as hidden, at most once each.
const HIDDEN_LOG_CAPACITY: u64 = 100_000;

struct OpenFile {
    ino: u64,
    reader: ObjectReader,
}

struct OpenDir {
    entries: Mutex<Option<Arc<Vec<DirEntryOut>>>>,
}

struct DirEntryOut {
    name: String,
    attr: FileAttr,
}

pub struct S3Fs {
    rt: Handle,
    s3: S3Client,
    cache: Arc<Cache>,
    cfg: FsConfig,
    inodes: InodeTable,
    negative: Option<moka::sync::Cache<String, ()>>,
    hidden_logged: moka::sync::Cache<String, ()>,
    files: Mutex<HashMap<u64, Arc<OpenFile>>>,
    dirs: Mutex<HashMap<u64, Arc<OpenDir>>>,
    next_fh: AtomicU64,
    /// Lookups ask HeadObject + ListObjectsV2 instead of one listing (the server refused one).
    exact_probes: AtomicBool,
    notifier: Arc<OnceLock<Notifier>>,
    mount_time: SystemTime,
}

type FsResult<T> = Result<T, Errno>;

fn errno(e: i32) -> Errno {
    Errno::from_i32(e)
}

impl S3Fs {
    /// `root_prefix` is the normalised mount prefix ("" or ending in "/"). `notifier` is filled in
    /// once the session exists; until then no invalidation is sent.
    pub fn new(
        rt: Handle,
        s3: S3Client,
        cache: Arc<Cache>,
        root_prefix: &str,
        cfg: FsConfig,
        notifier: Arc<OnceLock<Notifier>>,
    ) -> Self {
        let negative = (!cfg.negative_ttl.is_zero()).then(|| {
            moka::sync::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(cfg.negative_ttl)
                .build()
        });
        S3Fs {
            rt,
            s3,
            cache,
            inodes: InodeTable::new(root_prefix),
            negative,
            hidden_logged: moka::sync::Cache::new(HIDDEN_LOG_CAPACITY),
            files: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            exact_probes: AtomicBool::new(false),
            notifier,
            mount_time: SystemTime::now(),
            cfg,
        }
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
        }
    }

    fn attr(&self, inode: &Inode, stat: &Stat) -> FileAttr {
        let (kind, perm, nlink) = match inode.kind {
            Kind::File => (FileType::RegularFile, self.cfg.file_mode, 1),
            Kind::Dir => (FileType::Directory, self.cfg.dir_mode, 2),
        };
        FileAttr {
            ino: INodeNo(inode.ino),
            size: stat.size,
            blocks: stat.size.div_ceil(512),
            atime: stat.mtime,
            mtime: stat.mtime,
            ctime: stat.mtime,
            crtime: stat.mtime,
            kind,
            perm,
            nlink,
            uid: self.cfg.uid,
            gid: self.cfg.gid,
            rdev: 0,
            blksize: BLOCK_SIZE,
            flags: 0,
        }
    }

    /// Log an S3 failure of a user-visible operation and turn it into the errno to return.
    fn fail(&self, op: &str, e: &S3Error) -> Errno {
        match e.kind {
            S3ErrorKind::NotFound => debug!(op, key = %e.key, "not found"),
            S3ErrorKind::PreconditionFailed => warn!(
                op,
                key = %e.key,
                "object was replaced or deleted since it was opened; reads on this handle fail with ESTALE, reopen the file to read the new version"
            ),
            _ => warn!(op, key = %e.key, error = %e, "operation failed"),
        }
        errno(e.errno())
    }

    fn log_hidden(&self, key: &str, why: &str) {
        if !self.hidden_logged.contains_key(key) {
            self.hidden_logged.insert(key.to_string(), ());
            warn!(
                key,
                reason = why,
                "key is not shown in the mount: it cannot be a file name here"
            );
        }
    }

    fn negative_hit(&self, key: &str) -> bool {
        self.negative.as_ref().is_some_and(|c| c.contains_key(key))
    }

    fn remember_missing(&self, key: String) {
        if let Some(c) = &self.negative {
            c.insert(key, ());
        }
    }

    fn do_lookup(&self, parent: u64, name: &OsStr) -> FsResult<FileAttr> {
        let p = self.inodes.get(parent).ok_or(Errno::ENOENT)?;
        if p.kind != Kind::Dir {
            return Err(Errno::ENOTDIR);
        }
        // S3 keys are UTF-8: a name that is not cannot exist.
        let name = name.to_str().ok_or(Errno::ENOENT)?;
        names::check_name(name).map_err(|b| errno(b.errno()))?;
        let now = Instant::now();
        if let Some(child) = self.inodes.child(parent, name) {
            if let Some(stat) = child.fresh_stat(now) {
                return Ok(self.attr(&child, &stat));
            }
        }
        let key = names::child_key(&p.key, name);
        if self.negative_hit(&key) {
            return Err(Errno::ENOENT);
        }
        let dir_prefix = names::dir_prefix_of(&key);
        let probe = self.rt.block_on(self.probe(&key, &dir_prefix));
        let probe = probe.map_err(|e| self.fail("lookup", &e))?;
        // A directory wins over a file of the same name.
        if probe.dir {
            if probe.file.is_some() {
                self.log_hidden(&key, "a directory of the same name exists");
            }
            let child = self
                .inodes
                .upsert_child(parent, name, Kind::Dir, dir_prefix);
            let stat = self.dir_stat();
            child.set_stat(stat.clone(), self.ttl_from(now));
            return Ok(self.attr(&child, &stat));
        }
        match probe.file {
            Some(info) => {
                let child = self.inodes.upsert_child(parent, name, Kind::File, key);
                let stat = Stat::from(&info);
                child.set_stat_asked(stat.clone(), self.ttl_from(now), now);
                Ok(self.attr(&child, &stat))
            }
            None => {
                if let Some(child) = self.inodes.child(parent, name) {
                    child.invalidate();
                }
                self.remember_missing(key);
                Err(Errno::ENOENT)
            }
        }
    }

    /// Ask S3 what `key` is: one listing of the name, or (when that cannot be sure, or the
    /// server refuses such a listing) HeadObject and a listing of `key/`, concurrently.
    async fn probe(&self, key: &str, dir_prefix: &str) -> Result<Probe, S3Error> {
        if !self.exact_probes.load(Ordering::Relaxed) {
            match self
                .s3
                .list_page(key, Some("/"), None, probe::PROBE_MAX_KEYS)
                .await
            {
                Ok(page) => {
                    if let Some(p) = probe::resolve(page, key, dir_prefix) {
                        return Ok(p);
                    }
                }
                Err(e) if e.status == Some(400) => {
                    warn!(key, error = %e, "the server refuses a listing prefix that is not a directory; lookups use HeadObject + ListObjectsV2 from now on");
                    self.exact_probes.store(true, Ordering::Relaxed);
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

    fn do_getattr(&self, ino: u64) -> FsResult<FileAttr> {
        let inode = self.inodes.get(ino).ok_or(Errno::ENOENT)?;
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
            Kind::File => match self.rt.block_on(self.s3.head(&inode.key)) {
                Ok(info) => {
                    let stat = Stat::from(&info);
                    inode.set_stat_asked(stat.clone(), self.ttl_from(now), now);
                    Ok(self.attr(&inode, &stat))
                }
                Err(e) => {
                    inode.invalidate();
                    Err(self.fail("getattr", &e))
                }
            },
        }
    }

    fn do_open(&self, ino: u64, flags: OpenFlags) -> FsResult<(u64, FopenFlags)> {
        let inode = self.inodes.get(ino).ok_or(Errno::ENOENT)?;
        if inode.kind == Kind::Dir {
            return Err(Errno::EISDIR);
        }
        if flags.acc_mode() != OpenAccMode::O_RDONLY || flags.0 & libc::O_TRUNC != 0 {
            return Err(Errno::EROFS);
        }
        // Close-to-open: every open asks S3 for the current version and pins its ETag. The
        // kernel's lookup right before this open may already have asked: an answer younger
        // than OPEN_REVALIDATE_WINDOW is that same question (a listing is not: it may be old).
        let now = Instant::now();
        let stat = match inode.recently_asked(now, OPEN_REVALIDATE_WINDOW) {
            Some(stat) => stat,
            None => {
                let info = self.rt.block_on(self.s3.head(&inode.key)).map_err(|e| {
                    inode.invalidate();
                    self.fail("open", &e)
                })?;
                let stat = Stat::from(&info);
                inode.set_stat_asked(stat.clone(), self.ttl_from(now), now);
                stat
            }
        };
        let previous = inode.swap_opened_etag(&stat.etag);
        let changed = previous.as_ref().is_some_and(|e| *e != stat.etag);
        if changed {
            // The kernel may hold the old version's size and pages: drop both before the
            // first read.
            if let Some(n) = self.notifier.get() {
                if let Err(e) = n.inval_inode(INodeNo(ino), 0, 0) {
                    debug!(ino, error = %e, "inval_inode failed");
                }
            }
        }
        // Keep the kernel's pages only if they are of this very version.
        let keep_cache = previous.is_some() && !changed;
        let reader = ObjectReader::new(
            self.cache.clone(),
            self.s3.clone(),
            self.rt.clone(),
            &inode.key,
            &stat.etag,
            stat.size,
            self.cfg.read,
        );
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.lock_files()
            .insert(fh, Arc::new(OpenFile { ino, reader }));
        let flags = if self.cfg.direct_io {
            FopenFlags::FOPEN_DIRECT_IO
        } else if keep_cache {
            FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        };
        Ok((fh, flags))
    }

    fn do_read(&self, fh: u64, offset: u64, size: u32) -> FsResult<ReadData> {
        let file = self.lock_files().get(&fh).cloned().ok_or(Errno::EBADF)?;
        self.rt
            .block_on(file.reader.read(offset, size))
            .map_err(|e| self.fail("read", &e))
    }

    /// List the directory fully and cache the entries' attributes.
    fn list_dir(&self, inode: &Inode) -> FsResult<Vec<DirEntryOut>> {
        let mut builder = DirBuilder::new(&inode.key);
        let result: Result<(), S3Error> = self.rt.block_on(async {
            let mut token = None;
            loop {
                let mut page = self
                    .s3
                    .list_page(&inode.key, Some("/"), token, 1000)
                    .await?;
                token = page.next_token.take();
                builder.add_page(page);
                if token.is_none() {
                    return Ok(());
                }
            }
        });
        result.map_err(|e| self.fail("readdir", &e))?;
        let (entries, hidden) = builder.finish();
        for h in hidden {
            self.log_hidden(&h.key, h.why);
        }
        let now = Instant::now();
        let until = self.ttl_from(now);
        let mut out = Vec::with_capacity(entries.len() + 2);
        let parent = self.inodes.get(inode.parent).unwrap_or_else(|| {
            self.inodes
                .get(ROOT_INO)
                .expect("the root inode always exists")
        });
        let dir_stat = self.dir_stat();
        out.push(DirEntryOut {
            name: ".".into(),
            attr: self.attr(inode, &dir_stat),
        });
        out.push(DirEntryOut {
            name: "..".into(),
            attr: self.attr(&parent, &dir_stat),
        });
        for (name, listed) in entries {
            let (child, stat) = match listed {
                Listed::Dir => {
                    let prefix = names::dir_prefix_of(&names::child_key(&inode.key, &name));
                    (
                        self.inodes
                            .upsert_child(inode.ino, &name, Kind::Dir, prefix),
                        dir_stat.clone(),
                    )
                }
                Listed::File(info) => {
                    let key = info.key.clone();
                    (
                        self.inodes.upsert_child(inode.ino, &name, Kind::File, key),
                        Stat::from(&info),
                    )
                }
            };
            child.set_stat(stat.clone(), until);
            out.push(DirEntryOut {
                attr: self.attr(&child, &stat),
                name,
            });
        }
        Ok(out)
    }

    fn dir_entries(&self, ino: u64, fh: u64, offset: u64) -> FsResult<Arc<Vec<DirEntryOut>>> {
        let dir = self.lock_dirs().get(&fh).cloned().ok_or(Errno::EBADF)?;
        let mut cached = dir.entries.lock().unwrap_or_else(|e| e.into_inner());
        if offset == 0 || cached.is_none() {
            let inode = self.inodes.get(ino).ok_or(Errno::ENOENT)?;
            *cached = Some(Arc::new(self.list_dir(&inode)?));
        }
        Ok(cached.clone().unwrap_or_default())
    }

    fn lock_files(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<OpenFile>>> {
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_dirs(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<OpenDir>>> {
        self.dirs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn entry_ttl(&self) -> Duration {
        self.cfg.metadata_ttl
    }
}

impl fuser::Filesystem for S3Fs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let wanted = InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_PARALLEL_DIROPS;
        if let Err(missing) = config.add_capabilities(wanted) {
            debug!(?missing, "kernel lacks some FUSE capabilities");
        }
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        if let Err(max) = config.set_max_readahead(1 << 20) {
            let _ = config.set_max_readahead(max);
        }
        info!(bucket = self.s3.bucket(), "filesystem initialised");
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _s = debug_span!("fuse", op = "lookup", parent = parent.0, name = ?name).entered();
        match self.do_lookup(parent.0, name) {
            Ok(attr) => reply.entry(&self.entry_ttl(), &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _s = debug_span!("fuse", op = "getattr", ino = ino.0).entered();
        match self.do_getattr(ino.0) {
            Ok(attr) => reply.attr(&self.entry_ttl(), &attr),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _s = debug_span!("fuse", op = "open", ino = ino.0).entered();
        match self.do_open(ino.0, flags) {
            Ok((fh, fl)) => reply.opened(FileHandle(fh), fl),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _s = debug_span!("fuse", op = "read", ino = ino.0, offset, size).entered();
        match self.do_read(fh.0, offset, size) {
            Ok(data) => reply.data(data.as_slice()),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if let Some(f) = self.lock_files().remove(&fh.0) {
            debug!(ino = f.ino, key = f.reader.key(), "released");
        }
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.inodes.get(ino.0) {
            Some(i) if i.kind == Kind::Dir => {
                let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
                self.lock_dirs().insert(
                    fh,
                    Arc::new(OpenDir {
                        entries: Mutex::new(None),
                    }),
                );
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Some(_) => reply.error(Errno::ENOTDIR),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _s = debug_span!("fuse", op = "readdir", ino = ino.0, offset).entered();
        let entries = match self.dir_entries(ino.0, fh.0, offset) {
            Ok(e) => e,
            Err(e) => return reply.error(e),
        };
        for (i, e) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(e.attr.ino, i as u64 + 1, e.attr.kind, &e.name) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _s = debug_span!("fuse", op = "readdirplus", ino = ino.0, offset).entered();
        let entries = match self.dir_entries(ino.0, fh.0, offset) {
            Ok(e) => e,
            Err(e) => return reply.error(e),
        };
        let ttl = self.entry_ttl();
        for (i, e) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(
                e.attr.ino,
                i as u64 + 1,
                &e.name,
                &ttl,
                &e.attr,
                Generation(0),
            ) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.lock_dirs().remove(&fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // An object store has no fixed capacity: report 1 PiB free, like other S3 file systems,
        // so that tools which check free space before writing do not refuse.
        const BLOCKS: u64 = (1u64 << 50) / BLOCK_SIZE as u64;
        const FILES: u64 = 1 << 32;
        reply.statfs(
            BLOCKS,
            BLOCKS,
            BLOCKS,
            FILES,
            FILES,
            BLOCK_SIZE,
            names::NAME_MAX as u32,
            BLOCK_SIZE,
        );
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // Permissions are checked by the kernel (default_permissions); existence here.
        match self.inodes.get(ino.0) {
            Some(_) => reply.ok(),
            None => reply.error(Errno::ENOENT),
        }
    }
}
