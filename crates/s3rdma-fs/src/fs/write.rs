//! The write side of the file system: `create`, `open` for writing, `write`, `flush`, `fsync`,
//! `release` of a file being written, and what `stat`, `lookup` and `readdir` show meanwhile.
//!
//! A file being written exists only in this mount until it is committed: `stat` shows the
//! bytes written so far, `readdir` lists it, other clients see the old version (or nothing).
//! The commit happens at the `close` (flush) by the process that opened the file — so its
//! error is `close`'s — or at `fsync`, or at the last release when only other processes (a
//! forked child) still held it, or when nothing had been written at that close (an empty file,
//! or a shell redirection's first close).

use s3rdma_proto::sync::Lock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FopenFlags, OpenFlags};
use tracing::{debug, warn};

use super::inode::{Inode, Kind, Stat};
use super::{names, staged, Error, FsResult, OpenFile, S3Fs, OPEN_REVALIDATE_WINDOW};
use crate::upload::{Upload, WriteError};
use s3rdma_client::{Condition, FileMeta, ObjectInfo, ObjectStore, S3ErrorKind};

/// How long an operation on a file being stored waits for the store to end.
const COMMIT_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// A file being written, as `stat` and `readdir` show it until it is committed.
#[derive(Debug)]
pub struct Writing {
    size: AtomicU64,
    mtime_ns: AtomicU64,
    /// The attributes the object will carry (set at create, changed by setattr).
    meta: std::sync::Mutex<FileMeta>,
}

impl Writing {
    fn new(meta: FileMeta) -> Self {
        let w = Writing {
            size: AtomicU64::new(0),
            mtime_ns: AtomicU64::new(0),
            meta: std::sync::Mutex::new(meta),
        };
        w.touch(0);
        w
    }

    fn touch(&self, size: u64) {
        self.size.store(size, Ordering::Relaxed);
        let ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        self.mtime_ns.store(ns, Ordering::Relaxed);
    }

    pub fn meta(&self) -> FileMeta {
        self.meta.locked().clone()
    }

    pub fn set_meta(&self, change: &FileMeta) {
        let mut m = self.meta.locked();
        *m = m.merged(change);
    }

    pub fn stat(&self) -> Stat {
        Stat {
            size: self.size.load(Ordering::Relaxed),
            mtime: UNIX_EPOCH
                + std::time::Duration::from_nanos(self.mtime_ns.load(Ordering::Relaxed)),
            etag: String::new(),
            meta: Some(self.meta()),
        }
    }
}

/// An open handle of a file being written.
pub struct WriteFile<S: ObjectStore> {
    /// The process that opened it: its `close` commits the file.
    opener: Option<u32>,
    pub(super) upload: tokio::sync::Mutex<Upload<S>>,
    writing: Arc<Writing>,
}

/// The process (thread group) of a thread id from a FUSE request.
fn tgid_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

impl<S: ObjectStore> S3Fs<S> {
    /// The local state of `ino`, if it is being written in this mount.
    pub(super) fn writing(&self, ino: u64) -> Option<Arc<Writing>> {
        self.lock_writing().get(&ino).cloned()
    }

    /// What `stat` shows of a file that exists in this mount beyond what S3 has: being
    /// written, or staged.
    pub(super) fn local_stat(&self, ino: u64) -> Option<Stat> {
        if let Some(w) = self.writing(ino) {
            return Some(w.stat());
        }
        self.staged(ino).map(|s| s.stat())
    }

    /// Inodes of files being written or staged in this mount.
    pub(super) fn local_files(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.lock_writing().keys().copied().collect();
        v.extend(self.staged_inodes());
        v
    }

    /// Files being written or staged in directory `parent`: (ino, what stat shows).
    pub(super) fn local_files_in(&self, parent: u64) -> Vec<(u64, Stat)> {
        self.local_files()
            .into_iter()
            .filter(|i| self.ns.inodes.get(*i).is_some_and(|n| n.parent == parent))
            .filter_map(|i| self.local_stat(i).map(|s| (i, s)))
            .collect()
    }

    pub(super) fn lock_writing(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, Arc<Writing>>> {
        self.writes.writing.locked()
    }

    /// Register a writer for `inode`; EBUSY if one is already writing it.
    fn begin_write(
        &self,
        inode: &Inode,
        cond: Condition,
        pid: u32,
        meta: FileMeta,
    ) -> FsResult<(u64, Arc<Writing>)> {
        if self.writes.uploader.is_none() {
            return Err(Errno::EROFS.into());
        }
        if self.writes.closing.load(Ordering::SeqCst) {
            warn!(key = %inode.key(), "the mount is shutting down: no new files can be written");
            return Err(Errno::EROFS.into());
        }
        let writing = {
            let mut w = self.lock_writing();
            if w.contains_key(&inode.ino) {
                warn!(key = %inode.key(), "file is already being written in this mount; close the other writer first");
                return Err(Errno::EBUSY.into());
            }
            let state = Arc::new(Writing::new(meta.clone()));
            w.insert(inode.ino, state.clone());
            state
        };
        let Some(uploader) = &self.writes.uploader else {
            return Err(Errno::EROFS.into());
        };
        let upload = uploader.start(inode.key(), cond, meta);
        let fh = self.handles.next_fh();
        let file = WriteFile {
            opener: tgid_of(pid),
            upload: tokio::sync::Mutex::new(upload),
            writing: writing.clone(),
        };
        self.lock_files()
            .insert(fh, Arc::new(OpenFile::Write(inode.ino, file)));
        Ok((fh, writing))
    }

    pub(super) async fn do_create(
        &self,
        parent: u64,
        name: &std::ffi::OsStr,
        req: (u32, u32, u32),
        mode: u32,
        flags: OpenFlags,
    ) -> FsResult<(FileAttr, u64, FopenFlags)> {
        let _ns = self.ns_change();
        let (pid, uid, gid) = req;
        let p = self.ns.inodes.get(parent).ok_or(Errno::ENOENT)?;
        if p.kind != Kind::Dir {
            return Err(Errno::ENOTDIR.into());
        }
        let name = name.to_str().ok_or_else(|| {
            warn!(parent = %p.key(), "a file name must be UTF-8 to be an S3 key");
            Errno::EINVAL
        })?;
        names::check_name(name)?;
        let key = names::child_key(p.key(), name);
        self.ns.deletes.wait_name(p.key(), name);
        let inode = self.ns.inodes.upsert_child(parent, name, Kind::File, key);
        if let Some(neg) = &self.ns.known.negative {
            neg.invalidate(inode.key());
        }
        // Attributes that differ from the mount's defaults are stored with the object.
        let mode = mode & 0o7777;
        let meta = FileMeta {
            mode: (mode as u16 != self.cfg.file_mode).then_some(mode),
            uid: (uid != self.cfg.uid).then_some(uid),
            gid: (gid != self.cfg.gid).then_some(gid),
            mtime: None,
            xattrs: None,
        };
        // The kernel found no such name: the object must still not exist when it is stored.
        if self.can_stage() && staged::wants_staging(flags, 0) {
            let st = self.stage(&inode, None, Condition::IfNoneMatch, meta)?;
            let stat = st.stat();
            let (fh, fl) = self.open_staged(inode.ino, st, flags)?;
            debug!(key = %inode.key(), fh, "created, staged");
            return Ok((self.entry(&inode, &stat), fh, fl));
        }
        let (fh, writing) = self.begin_write(&inode, Condition::IfNoneMatch, pid, meta)?;
        debug!(key = %inode.key(), fh, "created");
        Ok((
            self.entry(&inode, &writing.stat()),
            fh,
            FopenFlags::FOPEN_DIRECT_IO,
        ))
    }

    /// `open` with write access of an existing file.
    pub(super) async fn open_for_write(
        &self,
        inode: &Arc<Inode>,
        flags: OpenFlags,
        pid: u32,
    ) -> FsResult<(u64, FopenFlags)> {
        let _ns = self.ns_change();
        if self.cfg.read_only {
            return Err(Errno::EROFS.into());
        }
        let now = Instant::now();
        let current = match inode.recently_asked(now, OPEN_REVALIDATE_WINDOW) {
            Some(stat) => Some(stat),
            None => match self.head_stat(inode).await {
                Ok(stat) => Some(stat),
                Err(e) if e.kind == S3ErrorKind::NotFound => None,
                Err(e) => return Err(e.into()),
            },
        };
        let truncate = flags.0 & libc::O_TRUNC != 0;
        // A rewrite keeps the mode and owner stored with the old version, not its mtime.
        let meta = FileMeta {
            mtime: None,
            ..current
                .as_ref()
                .and_then(|s| s.meta.clone())
                .unwrap_or_default()
        };
        if self.can_stage() && staged::wants_staging(flags, current.as_ref().map_or(0, |s| s.size))
        {
            if self.writing(inode.ino).is_some() {
                warn!(key = %inode.key(), "file is already being written in this mount; close the other writer first");
                return Err(Errno::EBUSY.into());
            }
            return self.open_staged_existing(inode, current, flags, meta);
        }
        let cond = match current {
            // Gone since the kernel looked: this writes a new object.
            None => Condition::IfNoneMatch,
            Some(stat) if !truncate && stat.size > 0 => {
                warn!(key = %inode.key(), size = stat.size, "an existing object cannot be modified or appended to in place; open it with O_TRUNC to replace it");
                return Err(Errno::EPERM.into());
            }
            Some(stat) if stat.etag.is_empty() => Condition::None,
            Some(stat) => Condition::IfMatch(stat.etag),
        };
        let (fh, _) = self.begin_write(inode, cond, pid, meta)?;
        debug!(key = %inode.key(), fh, "opened for writing");
        Ok((fh, FopenFlags::FOPEN_DIRECT_IO))
    }

    pub(super) async fn do_write(&self, fh: u64, offset: u64, data: &[u8]) -> FsResult<u32> {
        let file = self.lock_files().get(&fh).cloned().ok_or(Errno::EBADF)?;
        let (ino, w) = match &*file {
            OpenFile::Write(ino, w) => (*ino, w),
            OpenFile::Staged {
                file: s,
                writes: true,
                ..
            } => return self.write_staged(s, offset, data),
            _ => return Err(Errno::EBADF.into()),
        };
        let mut up = w.upload.lock().await;
        match up.write(offset, data).await {
            Ok(()) => {
                w.writing.touch(up.size());
                Ok(data.len() as u32)
            }
            // Out of order before any part was sent: the file goes on staged.
            Err(WriteError::NotSequential { .. }) if up.is_open() && self.can_stage() => {
                let s = self.turn_to_staged(fh, ino, w, &mut up)?;
                drop(up);
                self.write_staged(&s, offset, data)
            }
            // Written on after fsync stored it: the file goes on staged from what was stored.
            Err(WriteError::Committed) if self.can_stage() => {
                let info = up.committed().cloned().ok_or(Errno::EBADF)?;
                drop(up);
                let s = self.continue_staged(fh, ino, &info)?;
                self.write_staged(&s, offset, data)
            }
            Err(e) => {
                if up.is_open() {
                    warn!(key = %up.key(), offset, "{e}");
                    up.cancel(e.clone()).await;
                }
                Err(Error::reported(&e))
            }
        }
    }

    /// A streaming handle whose file `fsync` stored as `info` goes on as a staged file based
    /// on that version: handle `fh` is now a handle of the staged file.
    fn continue_staged(
        &self,
        fh: u64,
        ino: u64,
        info: &ObjectInfo,
    ) -> FsResult<Arc<staged::Staged<S>>> {
        let inode = self.ns.inodes.get(ino).ok_or(Errno::ENOENT)?;
        let meta = info.meta.clone().unwrap_or_default();
        let s = self.stage(
            &inode,
            Some(info),
            Condition::IfMatch(info.etag.clone()),
            meta,
        )?;
        self.adopt_handle(fh, ino, &s)?;
        debug!(key = %inode.key(), "a file written on after fsync goes on as a staged file");
        Ok(s)
    }

    /// Handle `fh` (of a streaming write) becomes a handle of staged file `s`.
    fn adopt_handle(&self, fh: u64, ino: u64, s: &Arc<staged::Staged<S>>) -> FsResult<()> {
        let (new_fh, _) = self.open_staged(ino, s.clone(), OpenFlags(libc::O_WRONLY))?;
        let mut files = self.lock_files();
        if let Some(h) = files.remove(&new_fh) {
            files.insert(fh, h);
        }
        Ok(())
    }

    /// A streaming handle that has sent nothing yet goes on as a staged file, with the bytes
    /// it holds: handle `fh` is now a handle of the staged file.
    fn turn_to_staged(
        &self,
        fh: u64,
        ino: u64,
        w: &WriteFile<S>,
        up: &mut Upload<S>,
    ) -> FsResult<Arc<staged::Staged<S>>> {
        let inode = self.ns.inodes.get(ino).ok_or(Errno::ENOENT)?;
        let Some((bytes, cond, meta, key)) = up.take_unsent() else {
            return Err(Errno::EINVAL.into());
        };
        {
            let mut map = self.lock_writing();
            if map.get(&ino).is_some_and(|s| Arc::ptr_eq(s, &w.writing)) {
                map.remove(&ino);
            }
        }
        let s = self.stage(&inode, None, cond, meta)?;
        if key != inode.key() {
            s.file.moved(&key, None, Condition::None);
        }
        self.write_staged(&s, 0, &bytes)?;
        // The kernel keeps using `fh`: it now names the staged handle.
        self.adopt_handle(fh, ino, &s)?;
        debug!(key = %inode.key(), "a file written out of order goes on as a staged file");
        Ok(s)
    }

    /// `close` (flush): the opener's close commits the file; others' closes do nothing.
    pub(super) async fn do_flush(&self, fh: u64, pid: u32) -> FsResult<()> {
        let Some(file) = self.lock_files().get(&fh).cloned() else {
            return Ok(());
        };
        let (ino, w) = match &*file {
            OpenFile::Write(ino, w) => (ino, w),
            // A reader's close stores nothing: the writers decide when a version is whole.
            OpenFile::Staged {
                ino,
                file: s,
                writes: true,
            } => return self.commit_staged(*ino, s).await,
            _ => return Ok(()),
        };
        if w.opener.is_some() && w.opener != tgid_of(pid) {
            debug!(
                fh,
                "close by another process than the opener: not committing yet"
            );
            return Ok(());
        }
        // A shell redirection (`cmd > file`) opens the file, dup2()s it and closes the first
        // descriptor before anything is written: that close must not store an empty object.
        // An empty file is stored at its last release instead.
        if w.writing.stat().size == 0 {
            debug!(fh, "close before any write: committing at release");
            return Ok(());
        }
        self.commit(*ino, w).await
    }

    pub(super) async fn do_fsync(&self, fh: u64) -> FsResult<()> {
        let Some(file) = self.lock_files().get(&fh).cloned() else {
            return Ok(());
        };
        match &*file {
            // Unlinked while open: nothing to make durable (the close stores nothing either).
            OpenFile::Write(_, w) if w.upload.lock().await.is_discarded() => Ok(()),
            OpenFile::Write(ino, w) => self.commit(*ino, w).await,
            OpenFile::Staged { ino, file: s, .. } => self.commit_staged(*ino, s).await,
            OpenFile::Read(ino, _) | OpenFile::Disk(ino, _) => self.store_attrs(*ino).await,
        }
    }

    /// The last release of a handle: commit if no close did (errors can only be logged now).
    pub(super) async fn release_write(&self, ino: u64, w: &WriteFile<S>) {
        if let Err(e) = self.commit(ino, w).await {
            warn!(ino, errno = ?e, "file committed at release failed; no process was left to report it to");
        }
    }

    /// Store the file (once; later calls return the same outcome).
    async fn commit(&self, ino: u64, w: &WriteFile<S>) -> FsResult<()> {
        let _ns = self.ns_change();
        let mut up = w.upload.lock().await;
        let was_open = up.is_open();
        let result = up.commit().await;
        {
            // Stored or failed, the file is no longer being written.
            let mut map = self.lock_writing();
            if map.get(&ino).is_some_and(|s| Arc::ptr_eq(s, &w.writing)) {
                map.remove(&ino);
            }
        }
        if let Some(inode) = self.ns.inodes.get(ino) {
            match &result {
                Ok(info) if was_open => {
                    let now = Instant::now();
                    self.remember(&inode, Stat::from(info), now);
                    inode.forget_opened();
                }
                Ok(_) => {}
                Err(_) => inode.invalidate(),
            }
        }
        match result {
            Ok(_) => Ok(()),
            // Unlinked while open: storing nothing was the point.
            Err(WriteError::Unlinked) => Ok(()),
            Err(e) => Err(Error::reported(&e)),
        }
    }

    /// Apply `f` to the upload of the file being written as `ino`, if a handle of this mount
    /// still has it open (not yet committing); false otherwise.
    async fn apply_to_open_upload(&self, ino: u64, f: &mut dyn FnMut(&mut Upload<S>)) -> bool {
        let file = self
            .lock_files()
            .values()
            .find(|f| matches!(&***f, OpenFile::Write(i, _) if *i == ino))
            .cloned();
        let Some(file) = file else { return false };
        let OpenFile::Write(_, w) = &*file else {
            return false;
        };
        let mut up = w.upload.lock().await;
        if !up.is_open() {
            return false;
        }
        f(&mut up);
        true
    }

    /// For an operation on a file that may be being written: apply `f` to its open upload
    /// (Ok(true)), or, once it is stored (its last close or release may be committing it right
    /// now: wait for that), Ok(false) — the caller then acts on the stored object.
    pub(super) async fn while_writing(
        &self,
        ino: u64,
        f: &mut dyn FnMut(&mut Upload<S>),
    ) -> FsResult<bool> {
        let deadline = Instant::now() + COMMIT_WAIT;
        while self.writing(ino).is_some() {
            if self.apply_to_open_upload(ino, f).await {
                return Ok(true);
            }
            if Instant::now() > deadline {
                warn!(ino, "waited too long for the file to be stored");
                return Err(Errno::EBUSY.into());
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        Ok(false)
    }

    /// `truncate`/`ftruncate` of a file being written: to its current size (e.g. 0 right
    /// after `open`) nothing changes; to another, a file that has sent nothing yet goes on
    /// staged; one that has sent parts cannot be changed so.
    pub(super) async fn truncate_writing(&self, ino: u64, size: u64) -> FsResult<()> {
        let Some(w) = self.writing(ino) else {
            return Err(Errno::EOPNOTSUPP.into());
        };
        let now = w.stat().size;
        if size == now {
            return Ok(());
        }
        if self.can_stage() {
            let handle = self
                .lock_files()
                .iter()
                .find(|(_, f)| matches!(&***f, OpenFile::Write(i, _) if *i == ino))
                .map(|(fh, f)| (*fh, f.clone()));
            if let Some((fh, file)) = handle {
                if let OpenFile::Write(_, wf) = &*file {
                    let mut up = wf.upload.lock().await;
                    if up.is_open() {
                        if let Ok(s) = self.turn_to_staged(fh, ino, wf, &mut up) {
                            drop(up);
                            return self.setattr_staged(&s, Some(size), &FileMeta::default());
                        }
                    }
                }
            }
        }
        warn!(
            ino,
            size,
            written = now,
            "a file being written can only be truncated to its current size"
        );
        Err(Errno::EOPNOTSUPP.into())
    }
}
