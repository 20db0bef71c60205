//! What the file system reports to `s3rdma stats` and `/metrics`: its own counters (operations
//! failed by S3, inodes dropped, FUSE latency by opcode, time to the first byte of a read) and,
//! through [`FsReport`], those of every part it is made of (transport, page cache, uploader,
//! staging area, disk cache, write-backs, rename deletes, memory). [`FsReport`] holds only
//! shared handles, so the metrics endpoint reads it without a FUSE request and while every
//! FUSE worker is busy.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use s3rdma_client::ObjectStore;
use s3rdma_metrics::{load, Histogram, Report, Sink, Value};

use super::inode::InodeTable;
use super::{attrs, deletes, write, OpenFile};
use crate::cache::Cache;
use crate::diskcache::DiskCache;
use crate::stage::StagingArea;
use crate::upload::Uploader;

/// Operations that failed because of S3, by the errno the kernel got.
#[derive(Default)]
pub(super) struct Failures([AtomicU64; Failures::NAMES.len()]);

impl Failures {
    const NAMES: [(i32, &'static str, &'static str); 7] = [
        (libc::EIO, "failed_eio", "eio"),
        (libc::ESTALE, "failed_estale", "estale"),
        (libc::ENOENT, "failed_enoent", "enoent"),
        (libc::EACCES, "failed_eacces", "eacces"),
        (libc::EAGAIN, "failed_eagain", "eagain"),
        (libc::ETIMEDOUT, "failed_etimedout", "etimedout"),
        (0, "failed_other", "other"),
    ];

    pub(super) fn count(&self, errno: i32) {
        let i = Self::NAMES
            .iter()
            .position(|&(e, _, _)| e == errno)
            .unwrap_or(Self::NAMES.len() - 1);
        self.0[i].fetch_add(1, Ordering::Relaxed);
    }
}

/// The FUSE operations timed, by opcode (a label of the latency histogram).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FuseOp {
    Lookup,
    Forget,
    Getattr,
    Setattr,
    Readlink,
    Symlink,
    Mkdir,
    Unlink,
    Rmdir,
    Rename,
    Link,
    Open,
    Read,
    Write,
    Flush,
    Release,
    Fsync,
    Opendir,
    Readdir,
    Readdirplus,
    Releasedir,
    Statfs,
    Getxattr,
    Create,
    /// `access` and anything else.
    Other,
}

impl FuseOp {
    pub const ALL: [FuseOp; 25] = [
        FuseOp::Lookup,
        FuseOp::Forget,
        FuseOp::Getattr,
        FuseOp::Setattr,
        FuseOp::Readlink,
        FuseOp::Symlink,
        FuseOp::Mkdir,
        FuseOp::Unlink,
        FuseOp::Rmdir,
        FuseOp::Rename,
        FuseOp::Link,
        FuseOp::Open,
        FuseOp::Read,
        FuseOp::Write,
        FuseOp::Flush,
        FuseOp::Release,
        FuseOp::Fsync,
        FuseOp::Opendir,
        FuseOp::Readdir,
        FuseOp::Readdirplus,
        FuseOp::Releasedir,
        FuseOp::Statfs,
        FuseOp::Getxattr,
        FuseOp::Create,
        FuseOp::Other,
    ];

    /// The opcode's name, as FUSE calls it.
    pub fn name(self) -> &'static str {
        match self {
            FuseOp::Lookup => "lookup",
            FuseOp::Forget => "forget",
            FuseOp::Getattr => "getattr",
            FuseOp::Setattr => "setattr",
            FuseOp::Readlink => "readlink",
            FuseOp::Symlink => "symlink",
            FuseOp::Mkdir => "mkdir",
            FuseOp::Unlink => "unlink",
            FuseOp::Rmdir => "rmdir",
            FuseOp::Rename => "rename",
            FuseOp::Link => "link",
            FuseOp::Open => "open",
            FuseOp::Read => "read",
            FuseOp::Write => "write",
            FuseOp::Flush => "flush",
            FuseOp::Release => "release",
            FuseOp::Fsync => "fsync",
            FuseOp::Opendir => "opendir",
            FuseOp::Readdir => "readdir",
            FuseOp::Readdirplus => "readdirplus",
            FuseOp::Releasedir => "releasedir",
            FuseOp::Statfs => "statfs",
            FuseOp::Getxattr => "getxattr",
            FuseOp::Create => "create",
            FuseOp::Other => "other",
        }
    }
}

/// Counters the file system keeps itself.
#[derive(Default)]
pub(super) struct FsCounters {
    pub failures: Failures,
    /// Inodes dropped after the kernel forgot them.
    pub inodes_dropped: AtomicU64,
    /// HeadObject requests a listing made to learn the type of objects that may be links.
    pub listing_heads: AtomicU64,
    /// Directory renames done, keys they moved, renames undone (a copy failed), and source
    /// keys left behind (their delete failed: both names remain).
    pub dir_renames: AtomicU64,
    pub dir_rename_keys: AtomicU64,
    pub dir_renames_undone: AtomicU64,
    pub dir_rename_deletes_failed: AtomicU64,
    /// Time from a FUSE request to its reply, by opcode.
    fuse: [Histogram; FuseOp::ALL.len()],
    /// Time from an open for reading to the reply of its first read.
    first_byte: Histogram,
    /// The kernel granted FUSE over io_uring at INIT.
    pub ring_granted: AtomicBool,
    /// What the FUSE transport reports (set by the binary, which runs it).
    pub transport: OnceLock<Arc<dyn Report + Send + Sync>>,
}

/// Times a FUSE request from its arrival to its reply (when dropped, after the reply).
pub struct FuseTimer<'a> {
    start: Instant,
    h: &'a Histogram,
}

impl Drop for FuseTimer<'_> {
    fn drop(&mut self) {
        self.h.observe(self.start.elapsed());
    }
}

impl FsCounters {
    pub(super) fn time(&self, op: FuseOp) -> FuseTimer<'_> {
        FuseTimer {
            start: Instant::now(),
            h: &self.fuse[op as usize],
        }
    }

    /// A read handle opened at `opened` got its first bytes now.
    pub(super) fn first_byte(&self, opened: Instant) {
        self.first_byte.observe(opened.elapsed());
    }
}

/// Every part of a mount that counts something, shared: what `s3rdma stats` and `/metrics`
/// read.
pub struct FsReport<S: ObjectStore> {
    pub(super) s3: S,
    pub(super) cache: Arc<Cache<S>>,
    pub(super) uploader: Option<Arc<Uploader<S>>>,
    pub(super) stage: Option<Arc<StagingArea>>,
    pub(super) disk: Option<Arc<DiskCache>>,
    pub(super) attrs: Arc<attrs::Writeback<S>>,
    pub(super) deletes: Arc<deletes::Deletes<S>>,
    pub(super) counters: Arc<FsCounters>,
    pub(super) files: Arc<Mutex<HashMap<u64, Arc<OpenFile<S>>>>>,
    pub(super) writing: Arc<Mutex<HashMap<u64, Arc<write::Writing>>>>,
    pub(super) inodes: Arc<InodeTable>,
}

impl<S: ObjectStore> Report for FsReport<S> {
    fn report(&self, out: &mut dyn Sink) {
        self.s3.stats().report(out);
        self.cache.report(out);
        if let Some(u) = &self.uploader {
            u.report(out);
        }
        if let Some(a) = &self.stage {
            a.report(out);
        }
        if let Some(d) = &self.disk {
            d.report(out);
        }
        self.attrs.report(out);
        self.deletes.report(out);
        if let Some(t) = self.counters.transport.get() {
            t.report(out);
        }
        crate::report_memory(
            self.cache.arena(),
            self.uploader.as_ref().and_then(|u| u.pool.arena()),
            out,
        );
        crate::report_rdma_live(out);
        let files = self.files.lock().map(|m| m.len()).unwrap_or(0) as u64;
        let writing = self.writing.lock().map(|m| m.len()).unwrap_or(0) as u64;
        let g = Value::gauge;
        out.value(g("open_files", "Files open now.", files));
        out.value(g(
            "files_being_written",
            "Files being written now (streamed or staged).",
            writing,
        ));
        out.value(g(
            "inodes",
            "Entries in the inode table.",
            self.inodes.len() as u64,
        ));
        let c = &self.counters;
        out.value(Value::counter(
            "inodes_dropped",
            "Inodes dropped after the kernel forgot them.",
            load(&c.inodes_dropped),
        ));
        out.value(g(
            "inodes_pinned",
            "Inodes the kernel forgot that the mount still needs.",
            self.inodes.deferred() as u64,
        ));
        let counters: [(&str, &str, &AtomicU64); 5] = [
            ("listing_heads", "HeadObject requests listings made to learn whether small objects are symbolic links.", &c.listing_heads),
            ("dir_renames", "Directories renamed (every key copied, then the sources deleted).", &c.dir_renames),
            ("dir_rename_keys", "Keys moved by directory renames.", &c.dir_rename_keys),
            ("dir_renames_undone", "Directory renames undone because a copy failed (the source left whole).", &c.dir_renames_undone),
            ("dir_rename_deletes_failed", "Source keys a directory rename could not delete (both names remain).", &c.dir_rename_deletes_failed),
        ];
        for (name, help, v) in counters {
            out.value(Value::counter(name, help, load(v)));
        }
        const FAILED: &str = "Operations that failed because of S3, by the errno returned.";
        for ((_, stat, errno), n) in Failures::NAMES.iter().zip(&c.failures.0) {
            let labels: &[(&str, &str)] = &[("errno", errno)];
            out.value(Value::counter(stat, FAILED, load(n)).exported("failed_operations", labels));
        }
        for op in FuseOp::ALL {
            out.histogram(
                &format!("fuse_{}", op.name()),
                "fuse_request_seconds",
                &[("opcode", op.name())],
                "Time from a FUSE request's arrival to its reply, by opcode.",
                &c.fuse[op as usize],
            );
        }
        out.histogram(
            "read_first_byte",
            "read_first_byte_seconds",
            &[],
            "Time from opening a file for reading to the reply of its first read.",
            &c.first_byte,
        );
    }
}
