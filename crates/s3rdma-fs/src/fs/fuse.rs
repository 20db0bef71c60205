//! The FUSE adapter: each kernel request is a span, one call into the filesystem logic
//! (`S3Fs::do_*`, which returns domain results and errno values) and one reply. What a reply
//! needs of the session (passthrough registration, kernel capabilities at init) stays here.

use std::ffi::OsStr;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    BsdFileFlags, Errno, FileHandle, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};
use s3rdma_client::ObjectStore;
use tracing::{debug, debug_span, info, warn};

use super::inode::ROOT_INO;
use super::kinds::TELL_AHEAD;
use super::namespace::SetAttr;
use super::report::FuseOp;
use super::{names, FsResult, Opened, S3Fs, Told, BLOCK_SIZE, STATS_XATTR};

impl<S: ObjectStore> fuser::Filesystem for S3Fs<S> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // ATOMIC_O_TRUNC: open(O_TRUNC) arrives as one OPEN with O_TRUNC, not OPEN + SETATTR.
        // CACHE_SYMLINKS: the kernel keeps a link's target, so following it costs no GET.
        let wanted = InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_ATOMIC_O_TRUNC
            | InitFlags::FUSE_CACHE_SYMLINKS;
        if let Err(missing) = config.add_capabilities(wanted) {
            debug!(?missing, "kernel lacks some FUSE capabilities");
        }
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        if let Err(max) = config.set_max_readahead(1 << 20) {
            let _ = config.set_max_readahead(max);
        }
        // Staged handles use direct I/O when shared mmap of such files is allowed (see staged.rs).
        if config
            .add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
            .is_ok()
        {
            self.writes.staged_direct.store(true, Ordering::Relaxed);
        } else {
            info!("the kernel cannot mmap direct-I/O files (Linux 6.6+); staged files go through the page cache, which writes them several times slower");
        }
        if self.disk.is_some() && self.pass.wanted {
            // The kernel serves files of the disk cache itself: one level of stacking.
            match config.add_capabilities(InitFlags::FUSE_PASSTHROUGH) {
                Ok(()) if config.set_max_stack_depth(1).is_ok() => {
                    self.pass.on.store(true, Ordering::Relaxed);
                    info!("FUSE passthrough on: files in the disk cache are read by the kernel directly");
                }
                _ => info!("the kernel does not offer FUSE passthrough (Linux 6.9+); files in the disk cache are served by the daemon"),
            }
        }
        self.ask_for_rings(config);
        info!(bucket = self.s3.bucket(), "filesystem initialised");
        Ok(())
    }

    /// The session ended (unmounted, or the connection was aborted). A file still open for
    /// writing now can never be closed by its writer: abort it, so no multipart upload is left.
    fn destroy(&mut self) {
        let failed = self.run(self.store_pending_attrs());
        if failed > 0 {
            warn!(failed, "attribute changes of some files could not be stored as the mount ended (each is logged above)");
        }
        self.finish_renames();
        let control = self.control();
        let aborted = self.run(async {
            tokio::time::timeout(
                Duration::from_secs(60),
                control.abort_writes("the mount ended (unmounted lazily, or its FUSE connection was aborted) while the file was open for writing"),
            )
            .await
        });
        match aborted {
            Ok(keys) if keys.is_empty() => {}
            Ok(keys) => warn!(count = keys.len(), keys = ?keys, "files still open for writing when the mount ended were not stored"),
            Err(_) => warn!("aborting the files still being written took over 60 s; some multipart uploads may be left (a bucket lifecycle rule removes them)"),
        }
        if let Some(up) = &self.writes.uploader {
            let left = self.run(up.wait_for_aborts(Duration::from_secs(30)));
            if left > 0 {
                warn!(count = left, "multipart uploads of failed writes could not be aborted (the endpoint is still failing); a bucket lifecycle rule removes them");
            }
        }
        // No handle can be used again: let go of their cache blocks and write buffers.
        self.lock_files().clear();
        self.lock_dirs().clear();
        // Passthrough registrations go while the FUSE connection can still take them back.
        self.pass.clear();
        if let Some(d) = &self.disk {
            d.detach_all();
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _t = self.counters.time(FuseOp::Lookup);
        let _s = debug_span!("fuse", op = "lookup", parent = parent.0, name = ?name).entered();
        match self.serve("lookup", self.do_lookup(parent.0, name)) {
            Ok(attr) => reply.entry(&self.entry_ttl(), &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    /// FORGET, and each node of a BATCH_FORGET (fuser 0.18 keeps the batch's node type
    /// private: its default `batch_forget` calls this per node).
    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let _t = self.counters.time(FuseOp::Forget);
        let _s = debug_span!("fuse", op = "forget", ino = ino.0, nlookup).entered();
        self.do_forget(ino.0, nlookup);
        self.retry_pinned();
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _t = self.counters.time(FuseOp::Getattr);
        let _s = debug_span!("fuse", op = "getattr", ino = ino.0).entered();
        match self.serve("getattr", self.do_getattr(ino.0)) {
            Ok(attr) => reply.attr(&self.entry_ttl(), &attr),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _t = self.counters.time(FuseOp::Open);
        let _s = debug_span!("fuse", op = "open", ino = ino.0).entered();
        match self.serve("open", self.do_open(ino.0, flags, req.pid(), Some(&reply))) {
            Ok(Opened::Plain(fh, fl)) => reply.opened(FileHandle(fh), fl),
            Ok(Opened::Passthrough(fh, fl, backing)) => {
                reply.opened_passthrough(FileHandle(fh), fl, &backing)
            }
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
        let _t = self.counters.time(FuseOp::Read);
        let _s = debug_span!("fuse", op = "read", ino = ino.0, offset, size).entered();
        match self.serve("read", self.do_read(fh.0, offset, size)) {
            Ok(data) => reply.data(data.as_slice()),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        let _t = self.counters.time(FuseOp::Flush);
        let _s = debug_span!("fuse", op = "flush", ino = ino.0).entered();
        match self.serve("flush", self.do_flush(fh.0, req.pid())) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, fh: FileHandle, _ds: bool, reply: ReplyEmpty) {
        let _t = self.counters.time(FuseOp::Fsync);
        let _s = debug_span!("fuse", op = "fsync", ino = ino.0).entered();
        match self.serve("fsync", self.do_fsync(fh.0)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
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
        let _t = self.counters.time(FuseOp::Release);
        self.run(self.do_release(fh.0));
        reply.ok();
        self.retry_pinned();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _t = self.counters.time(FuseOp::Create);
        let _s = debug_span!("fuse", op = "create", parent = parent.0, name = ?name).entered();
        if self.cfg.read_only {
            return reply.error(Errno::EROFS);
        }
        match self.serve(
            "create",
            self.do_create(
                parent.0,
                name,
                (req.pid(), req.uid(), req.gid()),
                mode & !umask,
                OpenFlags(flags),
            ),
        ) {
            Ok((attr, fh, fl)) => {
                reply.created(&self.entry_ttl(), &attr, Generation(0), FileHandle(fh), fl)
            }
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _t = self.counters.time(FuseOp::Write);
        let _s = debug_span!("fuse", op = "write", ino = ino.0, offset, len = data.len()).entered();
        match self.serve("write", self.do_write(fh.0, offset, data)) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _t = self.counters.time(FuseOp::Setattr);
        let _s = debug_span!("fuse", op = "setattr", ino = ino.0).entered();
        let _ = atime;
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            mtime: mtime.map(|t| match t {
                TimeOrNow::Now => SystemTime::now(),
                TimeOrNow::SpecificTime(t) => t,
            }),
            xattrs: None,
        };
        match self.serve("setattr", self.do_setattr(ino.0, set)) {
            Ok(attr) => reply.attr(&self.entry_ttl(), &attr),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        let _t = self.counters.time(FuseOp::Symlink);
        let _s =
            debug_span!("fuse", op = "symlink", parent = parent.0, name = ?link_name).entered();
        match self.serve(
            "symlink",
            self.do_symlink(parent.0, link_name, target, (req.uid(), req.gid())),
        ) {
            Ok(attr) => reply.entry(&self.entry_ttl(), &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let _t = self.counters.time(FuseOp::Readlink);
        let _s = debug_span!("fuse", op = "readlink", ino = ino.0).entered();
        match self.serve("readlink", self.do_readlink(ino.0)) {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(e),
        }
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let _t = self.counters.time(FuseOp::Link);
        match self.serve("link", self.do_link(ino.0)) {
            Ok(attr) => reply.entry(&self.entry_ttl(), &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let _t = self.counters.time(FuseOp::Mkdir);
        let _s = debug_span!("fuse", op = "mkdir", parent = parent.0, name = ?name).entered();
        if self.cfg.read_only {
            return reply.error(Errno::EROFS);
        }
        match self.serve("mkdir", self.do_mkdir(parent.0, name, mode & !umask)) {
            Ok(attr) => reply.entry(&self.entry_ttl(), &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.counters.time(FuseOp::Rmdir);
        let _s = debug_span!("fuse", op = "rmdir", parent = parent.0, name = ?name).entered();
        if self.cfg.read_only {
            return reply.error(Errno::EROFS);
        }
        match self.serve("rmdir", self.do_rmdir(parent.0, name)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.counters.time(FuseOp::Unlink);
        let _s = debug_span!("fuse", op = "unlink", parent = parent.0, name = ?name).entered();
        if self.cfg.read_only {
            return reply.error(Errno::EROFS);
        }
        match self.serve("unlink", self.do_unlink(parent.0, name)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _t = self.counters.time(FuseOp::Rename);
        let _s = debug_span!("fuse", op = "rename", parent = parent.0, name = ?name, newparent = newparent.0, newname = ?newname).entered();
        if self.cfg.read_only {
            return reply.error(Errno::EROFS);
        }
        match self.serve(
            "rename",
            self.do_rename(parent.0, name, newparent.0, newname, flags),
        ) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _t = self.counters.time(FuseOp::Opendir);
        match self.serve("opendir", self.do_opendir(ino.0)) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
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
        let _t = self.counters.time(FuseOp::Readdir);
        let _s = debug_span!("fuse", op = "readdir", ino = ino.0, offset).entered();
        let entries = self.with_dir_entries(ino.0, fh.0, offset, TELL_AHEAD, |out| {
            for (i, e) in out.entries.iter().enumerate().skip(offset as usize) {
                let attr = match &e.told {
                    Told::Ready(attr, _) => attr,
                    Told::Gone => continue,
                    // Told when the kernel asks from here.
                    Told::Unknown => break,
                };
                if reply.add(attr.ino, i as u64 + 1, attr.kind, &e.name) {
                    break;
                }
            }
        });
        match self.serve("readdir", entries) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _t = self.counters.time(FuseOp::Readdirplus);
        let _s = debug_span!("fuse", op = "readdirplus", ino = ino.0, offset).entered();
        let entries = self.with_dir_entries(ino.0, fh.0, offset, TELL_AHEAD, |out| {
            let now = Instant::now();
            for (i, e) in out.entries.iter().enumerate().skip(offset as usize) {
                let (attr, inode) = match &e.told {
                    Told::Ready(attr, inode) => (attr, inode),
                    Told::Gone => continue,
                    // Told when the kernel asks from here.
                    Told::Unknown => break,
                };
                let ttl = self.ns.known.listings.remaining(e.at, now);
                // The kernel counts each entry but `.` and `..` (until FORGET): counted before
                // the reply goes, and taken back for the one that did not fit.
                if let Some(inode) = inode {
                    self.handed(inode);
                }
                if reply.add(attr.ino, i as u64 + 1, &e.name, &ttl, attr, Generation(0)) {
                    if let Some(inode) = inode {
                        self.do_forget(inode.ino, 1);
                    }
                    break;
                }
            }
        });
        match self.serve("readdirplus", entries) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let _t = self.counters.time(FuseOp::Releasedir);
        self.do_releasedir(fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _t = self.counters.time(FuseOp::Statfs);
        // An object store has no fixed capacity: report 1 PiB, like other S3 file systems, so
        // that tools which check free space before writing do not refuse. S3 has no cheap
        // "bucket size": what is used is what this mount has written since it was mounted.
        const BLOCKS: u64 = (1u64 << 50) / BLOCK_SIZE as u64;
        const FILES: u64 = 1 << 32;
        let (written, files) = self.writes.uploader.as_ref().map_or((0, 0), |u| {
            (
                u.stats.bytes_written.load(Ordering::Relaxed),
                u.stats.objects_written.load(Ordering::Relaxed),
            )
        });
        let used = written.div_ceil(BLOCK_SIZE as u64);
        let free = BLOCKS.saturating_sub(used);
        reply.statfs(
            BLOCKS,
            free,
            free,
            FILES,
            FILES.saturating_sub(files),
            BLOCK_SIZE,
            names::NAME_MAX as u32,
            BLOCK_SIZE,
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _t = self.counters.time(FuseOp::Getxattr);
        let _s = debug_span!("fuse", op = "getxattr", ino = ino.0, name = ?name).entered();
        let value = self.serve("getxattr", async {
            // The mount's own: the root's counters, and whether a file is in the disk cache.
            if ino.0 == ROOT_INO && name == STATS_XATTR {
                return Ok(self.stats_text().into_bytes());
            }
            if name == s3rdma_proto::xattr::CACHED && self.disk.is_some() {
                let cached = self.is_disk_cached(ino.0).await.ok_or(Errno::ENOENT)?;
                return Ok(if cached { b"1".to_vec() } else { b"0".to_vec() });
            }
            // EOPNOTSUPP, not ENOSYS, for other namespaces: ENOSYS makes the kernel stop asking.
            let name = name.to_str().ok_or(Errno::ENODATA)?;
            self.do_getxattr(ino.0, name).await
        });
        reply_xattr(reply, size, value);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _t = self.counters.time(FuseOp::Getxattr);
        let _s = debug_span!("fuse", op = "listxattr", ino = ino.0).entered();
        let listed = self.serve("listxattr", self.do_listxattr(ino.0));
        reply_xattr(reply, size, listed);
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let _t = self.counters.time(FuseOp::Setattr);
        let _s = debug_span!("fuse", op = "setxattr", ino = ino.0, name = ?name).entered();
        let done = self.serve("setxattr", async {
            let name = name.to_str().ok_or(Errno::EINVAL)?;
            self.do_setxattr(ino.0, name, value, flags).await
        });
        match done {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.counters.time(FuseOp::Setattr);
        let _s = debug_span!("fuse", op = "removexattr", ino = ino.0, name = ?name).entered();
        let done = self.serve("removexattr", async {
            let name = name.to_str().ok_or(Errno::ENODATA)?;
            self.do_removexattr(ino.0, name).await
        });
        match done {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        let _t = self.counters.time(FuseOp::Other);
        // Permissions are checked by the kernel (default_permissions); existence here.
        match self.ns.inodes.get(ino.0) {
            Some(_) => reply.ok(),
            None => reply.error(Errno::ENOENT),
        }
    }
}

/// A `getxattr`/`listxattr` answer: the size when asked with 0, `ERANGE` when the caller's
/// buffer is too small.
fn reply_xattr(reply: ReplyXattr, size: u32, value: Result<Vec<u8>, Errno>) {
    match value {
        Err(e) => reply.error(e),
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
        Ok(v) => reply.data(&v),
    }
}

impl<S: ObjectStore> S3Fs<S> {
    /// FUSE over io_uring, when the mount made rings for it: the entries' payload bounds
    /// `max_write`, and the kernel hands requests to the rings once they are registered.
    fn ask_for_rings(&self, config: &mut KernelConfig) {
        let Some(max_write) = self.cfg.ring_max_write else {
            return;
        };
        if let Err(max) = config.set_max_write(max_write) {
            let _ = config.set_max_write(max);
        }
        match config.add_capabilities(InitFlags::FUSE_OVER_IO_URING) {
            Ok(()) => {
                self.counters.ring_granted.store(true, Ordering::Relaxed);
                info!("FUSE over io_uring: the kernel hands requests to the rings")
            }
            Err(_) => warn!("the kernel did not offer FUSE over io_uring at INIT although it is switched on; requests go over /dev/fuse"),
        }
    }

    /// Serve one request: its work runs to the end on this FUSE worker thread, and a failure
    /// is reported once (see `error`) and becomes the errno of the reply.
    pub(super) fn serve<T>(
        &self,
        op: &'static str,
        work: impl Future<Output = FsResult<T>>,
    ) -> Result<T, Errno> {
        self.run(work).map_err(|e| self.failed(op, e))
    }

    /// The adapter's one `block_on`: the file-system logic is async (its S3 requests, its
    /// waits for uploads), the FUSE callbacks are not.
    pub(super) fn run<T>(&self, work: impl Future<Output = T>) -> T {
        self.rt.block_on(work)
    }
}
