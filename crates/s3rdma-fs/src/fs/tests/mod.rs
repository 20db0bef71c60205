//! The filesystem logic driven without FUSE, root or a server: `S3Fs` over the in-memory store
//! (wrapped in the fault injector), called the way the FUSE adapter calls it. Request counts
//! come from the store's counters, not from logs. `model.rs` checks generated operation
//! sequences against a reference model of SEMANTICS.md.

mod model;
mod small;
mod tree;
mod unit;

use s3rdma_proto::sync::Lock;
use std::ffi::OsStr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use fuser::{Errno, FileAttr, FileType, OpenFlags, RenameFlags};
use s3rdma_client::testing::{Faulty, MemStore};

use super::inode::ROOT_INO;
use super::namespace::SetAttr;
use super::{FsConfig, S3Fs};
use crate::cache::Cache;
use crate::read::ReadConfig;
use crate::stage::StagingArea;
use crate::upload::pool::WritePool;
use crate::upload::Uploader;

pub(super) type Store = Faulty<MemStore>;

/// The types the kernel was told, by inode number (numbers are never reused).
#[derive(Default)]
struct KernelView {
    types: std::sync::Mutex<std::collections::HashMap<u64, FileType>>,
    contradictions: std::sync::Mutex<Vec<String>>,
}

/// Cache and part blocks: S3's smallest part, so a file of more than 5 MiB is a multipart
/// upload, as on a real mount with the smallest `--write-part-size`.
pub(super) const BLOCK: usize = 5 << 20;

/// A filesystem over an in-memory bucket, with its own runtime.
pub(super) struct Fx {
    pub store: Store,
    pub fs: S3Fs<Store>,
    cfg: FsConfig,
    /// What the kernel was told: the type of every inode handed out (see [`Fx::told`]).
    kernel: KernelView,
    /// The staging directory (a writable mount stages files, as a real one does).
    _staging: Option<tempfile::TempDir>,
    // Dropped last: the filesystem's tasks run on it (only held here).
    _rt: tokio::runtime::Runtime,
}

/// Settings of a mount that trusts nothing it learnt (TTLs 0): every answer comes from the
/// store, so the model can compare each step with the bucket.
pub(super) fn strict_config() -> FsConfig {
    FsConfig {
        uid: 1000,
        gid: 1000,
        file_mode: 0o644,
        dir_mode: 0o755,
        metadata_ttl: Duration::ZERO,
        negative_ttl: Duration::ZERO,
        read: ReadConfig {
            part_size: BLOCK as u64,
            max_prefetch: 2 * BLOCK as u64,
        },
        direct_io: false,
        read_only: false,
        file_metadata: true,
        dir_markers: false,
        max_dir_rename_keys: 10_000,
        multipart_copy_threshold: 5 << 30,
        open_trusts_metadata: false,
        ring_max_write: None,
    }
}

impl Fx {
    pub fn new() -> Fx {
        Fx::with_config(strict_config())
    }

    pub fn with_config(cfg: FsConfig) -> Fx {
        Fx::over(Faulty::new(MemStore::new("bucket")), cfg)
    }

    /// A mount of `store` (e.g. a remount of another fixture's bucket).
    pub fn over(store: Store, cfg: FsConfig) -> Fx {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let cache = Arc::new(Cache::new(store.clone(), BLOCK, 8, 8).expect("cache"));
        let uploader = (!cfg.read_only).then(|| {
            let pool = Arc::new(WritePool::new(BLOCK, 4, false).expect("write pool"));
            Arc::new(Uploader::new(store.clone(), rt.handle().clone(), pool, 2))
        });
        let mut fs = S3Fs::new(
            rt.handle().clone(),
            store.clone(),
            cache,
            "",
            cfg.clone(),
            Arc::new(OnceLock::new()),
            uploader,
        );
        let staging = (!cfg.read_only).then(|| tempfile::tempdir().expect("staging dir"));
        if let Some(dir) = &staging {
            let area = StagingArea::open(dir.path(), 256 << 20).expect("staging area");
            fs.set_staging(Arc::new(area));
        }
        Fx {
            store,
            fs,
            cfg,
            kernel: KernelView::default(),
            _staging: staging,
            _rt: rt,
        }
    }

    /// The same bucket mounted again (what a remount keeps: only the bucket).
    pub fn remount(self) -> Fx {
        let (store, cfg) = (self.store.clone(), self.cfg.clone());
        // What the FUSE session's end (`destroy`) does first.
        self.fs.run(self.fs.store_pending_attrs());
        self.fs.finish_renames();
        drop(self);
        Fx::over(store, cfg)
    }

    /// The bucket, as another client sees it once the mount's background work of renames
    /// (the sources' deletes) is done: tests look at the bucket, or change it as another
    /// client, after the mount's calls returned.
    pub fn mem(&self) -> &MemStore {
        self.fs.finish_renames();
        self.store.inner()
    }

    /// Whether the bucket holds `key` (a test helper that counts no request).
    pub fn exists(&self, key: &str) -> bool {
        self.mem().info(key).is_some()
    }

    /// The inode of `path` ("" is the root), looked up one name at a time as the kernel does.
    pub fn resolve(&self, path: &str) -> Result<FileAttr, Errno> {
        let mut attr = self.fs.serve("getattr", self.fs.do_getattr(ROOT_INO))?;
        for name in path.split('/').filter(|s| !s.is_empty()) {
            if attr.kind != FileType::Directory {
                return Err(Errno::ENOTDIR);
            }
            attr = self
                .fs
                .serve("lookup", self.fs.do_lookup(attr.ino.0, OsStr::new(name)))?;
            self.told(&attr, "lookup");
        }
        Ok(attr)
    }

    /// The kernel keeps the type of an inode for its life: record what an answer told it, and
    /// note any answer that contradicts an earlier one. [S-NS-TYPE]
    pub fn told(&self, attr: &FileAttr, by: &str) {
        let mut seen = self.kernel.types.locked();
        match seen.insert(attr.ino.0, attr.kind) {
            Some(was) if was != attr.kind => {
                let what = format!(
                    "{by} told inode {} is {:?}, earlier {was:?}",
                    attr.ino.0, attr.kind
                );
                self.kernel.contradictions.locked().push(what);
            }
            _ => {}
        }
    }

    /// Answers that contradicted the type the kernel was told earlier.
    pub fn contradictions(&self) -> Vec<String> {
        self.kernel.contradictions.locked().clone()
    }

    /// The parent directory's inode and the last name of `path`.
    pub fn parent_of<'a>(&self, path: &'a str) -> Result<(u64, &'a str), Errno> {
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        let p = self.resolve(dir)?;
        if p.kind != FileType::Directory {
            return Err(Errno::ENOTDIR);
        }
        Ok((p.ino.0, name))
    }

    pub fn stat(&self, path: &str) -> Result<FileAttr, Errno> {
        let a = self.resolve(path)?;
        let a = self.fs.serve("getattr", self.fs.do_getattr(a.ino.0))?;
        self.told(&a, "getattr");
        Ok(a)
    }

    fn pid() -> u32 {
        std::process::id()
    }

    /// Open for reading; the handle.
    pub fn open_read(&self, path: &str) -> Result<u64, Errno> {
        let a = self.resolve(path)?;
        let opened = self
            .fs
            .do_open(a.ino.0, OpenFlags(libc::O_RDONLY), Self::pid(), None);
        match self.fs.serve("open", opened)? {
            super::Opened::Plain(fh, _) | super::Opened::Passthrough(fh, _, _) => Ok(fh),
        }
    }

    /// `len` bytes at `offset` of an open handle.
    pub fn pread(&self, fh: u64, offset: u64, len: u32) -> Result<Vec<u8>, Errno> {
        Ok(self
            .fs
            .serve("read", self.fs.do_read(fh, offset, len))?
            .as_slice()
            .to_vec())
    }

    /// The whole file, read as `cat` would (1 MiB reads until a short one).
    pub fn read(&self, path: &str) -> Result<Vec<u8>, Errno> {
        let fh = self.open_read(path)?;
        let mut out = Vec::new();
        let result = loop {
            match self.pread(fh, out.len() as u64, 1 << 20) {
                Ok(chunk) if chunk.is_empty() => break Ok(()),
                Ok(chunk) => out.extend_from_slice(&chunk),
                Err(e) => break Err(e),
            }
        };
        self.fs.run(self.fs.do_release(fh));
        result.map(|()| out)
    }

    /// `open(O_WRONLY|O_CREAT|O_TRUNC)`, as `cp` and shell redirections do: a new file is
    /// created, an existing one opened with `O_TRUNC`.
    pub fn create_or_truncate(&self, path: &str) -> Result<u64, Errno> {
        self.open_with(path, libc::O_WRONLY | libc::O_TRUNC)
    }

    /// `create`/`O_TRUNC`, sequential writes of `chunk` bytes, then `close` (flush + release);
    /// the first error.
    pub fn write_chunked(&self, path: &str, data: &[u8], chunk: usize) -> Result<(), Errno> {
        let fh = self.create_or_truncate(path)?;
        let mut result = Ok(());
        for (i, piece) in data.chunks(chunk.max(1)).enumerate() {
            if let Err(e) = self
                .fs
                .serve("write", self.fs.do_write(fh, (i * chunk) as u64, piece))
            {
                result = Err(e);
                break;
            }
        }
        let closed = self.close(fh);
        result.and(closed)
    }

    pub fn write(&self, path: &str, data: &[u8]) -> Result<(), Errno> {
        self.write_chunked(path, data, 1 << 20)
    }

    /// `close`: flush by the opener, then the release.
    pub fn close(&self, fh: u64) -> Result<(), Errno> {
        let flushed = self.fs.serve("flush", self.fs.do_flush(fh, Self::pid()));
        self.fs.run(self.fs.do_release(fh));
        flushed
    }

    /// The names `readdir` gives (without `.` and `..`), sorted.
    pub fn ls(&self, path: &str) -> Result<Vec<String>, Errno> {
        Ok(self.ls_typed(path)?.into_iter().map(|(n, _)| n).collect())
    }

    /// The entries READDIRPLUS hands out (without `.` and `..`) with their types, sorted by
    /// name; recorded as told to the kernel.
    pub fn ls_typed(&self, path: &str) -> Result<Vec<(String, FileType)>, Errno> {
        let mut out = Vec::new();
        for (name, attr, counted) in self.readdirplus(path)? {
            if counted {
                self.told(&attr, "readdirplus");
                out.push((name, attr.kind));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Every entry READDIRPLUS hands out, read through as the kernel does (a few at a time, from
    /// the offset after the last): name, attributes, and whether the kernel counts it (not `.`
    /// and `..`).
    pub fn readdirplus(&self, path: &str) -> Result<Vec<(String, FileAttr, bool)>, Errno> {
        let a = self.resolve(path)?;
        let fh = self.fs.serve("opendir", self.fs.do_opendir(a.ino.0))?;
        let mut out: Vec<(String, FileAttr, bool)> = Vec::new();
        let mut offset = 0u64;
        let result = loop {
            let page = self.fs.serve(
                "readdir",
                self.fs
                    .with_dir_entries(a.ino.0, fh, offset, super::kinds::TELL_AHEAD, |d| {
                        let mut page = Vec::new();
                        // A reply holds about 25 entries; gone ones take no room.
                        for (i, e) in d.entries.iter().enumerate().skip(offset as usize) {
                            if page.len() == 25 {
                                break;
                            }
                            match &e.told {
                                super::Told::Ready(attr, inode) => page.push((
                                    i as u64 + 1,
                                    e.name.clone(),
                                    *attr,
                                    inode.is_some(),
                                )),
                                super::Told::Gone => continue,
                                super::Told::Unknown => break,
                            }
                        }
                        page
                    }),
            );
            match page {
                Ok(p) if p.is_empty() => break Ok(()),
                Ok(p) => {
                    offset = p.last().map_or(offset, |l| l.0);
                    out.extend(p.into_iter().map(|(_, n, a, c)| (n, a, c)));
                }
                Err(e) => break Err(e),
            }
        };
        self.fs.do_releasedir(fh);
        result.map(|()| out)
    }

    /// `mkdir`: like the kernel, a name that looks up is EEXIST before the filesystem is asked.
    pub fn mkdir(&self, path: &str) -> Result<(), Errno> {
        let (parent, name) = self.parent_of(path)?;
        if self
            .fs
            .serve("lookup", self.fs.do_lookup(parent, OsStr::new(name)))
            .is_ok()
        {
            return Err(Errno::EEXIST);
        }
        let a = self
            .fs
            .serve("mkdir", self.fs.do_mkdir(parent, OsStr::new(name), 0o755))?;
        self.told(&a, "mkdir");
        Ok(())
    }

    pub fn rmdir(&self, path: &str) -> Result<(), Errno> {
        let (parent, name) = self.parent_of(path)?;
        self.fs
            .serve("rmdir", self.fs.do_rmdir(parent, OsStr::new(name)))
    }

    pub fn unlink(&self, path: &str) -> Result<(), Errno> {
        let (parent, name) = self.parent_of(path)?;
        self.fs
            .serve("unlink", self.fs.do_unlink(parent, OsStr::new(name)))
    }

    pub fn rename(&self, from: &str, to: &str) -> Result<(), Errno> {
        let (p1, n1) = self.parent_of(from)?;
        let (p2, n2) = self.parent_of(to)?;
        self.fs.serve(
            "rename",
            self.fs
                .do_rename(p1, OsStr::new(n1), p2, OsStr::new(n2), RenameFlags::empty()),
        )
    }

    /// `open(path, flags)` of an existing file, or `create` with `flags` of a missing one.
    pub fn open_with(&self, path: &str, flags: i32) -> Result<u64, Errno> {
        match self.resolve(path) {
            Ok(a) => match self.fs.serve(
                "open",
                self.fs
                    .do_open(a.ino.0, OpenFlags(flags), Self::pid(), None),
            )? {
                super::Opened::Plain(fh, _) | super::Opened::Passthrough(fh, _, _) => Ok(fh),
            },
            Err(e) if e == Errno::ENOENT => {
                let (parent, name) = self.parent_of(path)?;
                let (a, fh, _) = self.fs.serve(
                    "create",
                    self.fs.do_create(
                        parent,
                        OsStr::new(name),
                        (Self::pid(), 1000, 1000),
                        0o644,
                        OpenFlags(flags | libc::O_CREAT),
                    ),
                )?;
                self.told(&a, "create");
                Ok(fh)
            }
            Err(e) => Err(e),
        }
    }

    /// Open `path` read-write (created if missing), write `data` at `offset`, close.
    pub fn edit(&self, path: &str, offset: u64, data: &[u8]) -> Result<(), Errno> {
        let fh = self.open_with(path, libc::O_RDWR)?;
        let written = self
            .fs
            .serve("write", self.fs.do_write(fh, offset, data))
            .map(|_| ());
        let closed = self.close(fh);
        written.and(closed)
    }

    /// Open `path` for appending (created if missing), write `data` at its end, close. (The
    /// kernel turns an `O_APPEND` write's offset into the file's size.)
    pub fn append(&self, path: &str, data: &[u8]) -> Result<(), Errno> {
        let fh = self.open_with(path, libc::O_WRONLY | libc::O_APPEND)?;
        let size = self.stat(path).map(|a| a.size);
        let written = size.and_then(|s| {
            self.fs
                .serve("write", self.fs.do_write(fh, s, data))
                .map(|_| ())
        });
        let closed = self.close(fh);
        written.and(closed)
    }

    pub fn symlink(&self, path: &str, target: &str) -> Result<(), Errno> {
        let (parent, name) = self.parent_of(path)?;
        if self
            .fs
            .serve("lookup", self.fs.do_lookup(parent, OsStr::new(name)))
            .is_ok()
        {
            return Err(Errno::EEXIST);
        }
        let a = self.fs.serve(
            "symlink",
            self.fs.do_symlink(
                parent,
                OsStr::new(name),
                std::path::Path::new(target),
                (1000, 1000),
            ),
        )?;
        self.told(&a, "symlink");
        Ok(())
    }

    pub fn readlink(&self, path: &str) -> Result<Vec<u8>, Errno> {
        let a = self.resolve(path)?;
        self.fs.serve("readlink", self.fs.do_readlink(a.ino.0))
    }

    pub fn setattr(&self, path: &str, set: SetAttr) -> Result<FileAttr, Errno> {
        let a = self.resolve(path)?;
        self.fs.serve("setattr", self.fs.do_setattr(a.ino.0, set))
    }

    /// Wait (at most 10 s) until no multipart upload is open in the bucket: aborts run in the
    /// background. Whether none is.
    pub fn no_uploads_left(&self) -> bool {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !self.mem().pending_uploads().is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.mem().pending_uploads().is_empty()
    }
}

/// Bytes that differ from one offset to the next and from one seed to another.
pub(super) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] ^ seed)
        .collect()
}
