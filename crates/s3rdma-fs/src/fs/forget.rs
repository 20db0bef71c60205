//! FORGET and BATCH_FORGET: the kernel let go of entries it was given; inodes it no longer
//! holds and nothing here needs are dropped from the table (see `inode` for the rule), with
//! what the mount kept about them (a directory's listing and known names).
//!
//! "Needs" (the pins): a file being written or staged, a directory made here that S3 may not
//! have yet, attributes set on a directory, attribute changes not written back. A pinned inode
//! is kept and tried again once its pin may have gone: at the next release of a handle or
//! FORGET, at most once a second.

use s3rdma_proto::sync::Lock;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use s3rdma_client::ObjectStore;
use tracing::debug;

use super::inode::{Forgotten, Inode};
use super::S3Fs;

/// How often pinned inodes are tried again, at most.
const RETRY_EVERY: Duration = Duration::from_secs(1);

impl<S: ObjectStore> S3Fs<S> {
    /// `inode` is in a reply on its way to the kernel (an entry it counts until FORGET).
    pub(super) fn handed(&self, inode: &std::sync::Arc<Inode>) {
        self.ns.inodes.remember(inode);
    }

    /// The kernel forgot `n` entries of `ino`.
    pub(super) fn do_forget(&self, ino: u64, n: u64) {
        let pinned = |i| self.pinned(i);
        let keep = |parent, name: &str| self.ns.known.whole_dirs.keep_name(parent, name);
        let out = self.ns.inodes.forget(ino, n, &pinned, &keep);
        self.forgotten(out);
    }

    /// Pinned inodes whose pin may have gone are tried again (at most once a second).
    pub(super) fn retry_pinned(&self) {
        {
            let mut last = self.ns.forget_retried.locked();
            let now = Instant::now();
            if now.saturating_duration_since(*last) < RETRY_EVERY {
                return;
            }
            *last = now;
        }
        self.retry_pinned_now();
    }

    /// Pinned inodes whose pin has gone are dropped now.
    pub(super) fn retry_pinned_now(&self) {
        let pinned = |i| self.pinned(i);
        let keep = |parent, name: &str| self.ns.known.whole_dirs.keep_name(parent, name);
        let out = self.ns.inodes.retry_deferred(&pinned, &keep);
        self.forgotten(out);
    }

    /// Whether something in this mount still needs inode `ino`.
    fn pinned(&self, ino: u64) -> bool {
        self.writes.writing.locked().contains_key(&ino)
            || self.writes.staged.locked().contains_key(&ino)
            || self.ns.made.local_dirs.locked().contains(&ino)
            || self.ns.made.dir_attrs.locked().contains_key(&ino)
            || self.ns.attrs.holds(ino)
    }

    /// What went with a forget: a dropped directory's listing and known names (a name dropped
    /// from a directory that stays was kept in its known names as it went).
    fn forgotten(&self, out: Forgotten) {
        if out.dropped == 0 {
            return;
        }
        for ino in &out.dirs {
            self.ns.known.listings.forget(*ino);
            self.ns.known.whole_dirs.forget(*ino);
        }
        self.counters
            .inodes_dropped
            .fetch_add(out.dropped as u64, Ordering::Relaxed);
        debug!(
            dropped = out.dropped,
            "inodes the kernel forgot were dropped"
        );
    }

    /// The kernel forgets every entry but those of open files, as `drop_caches` makes it do
    /// (for tests).
    #[cfg(test)]
    pub(super) fn forget_all_but_open(&self) {
        use super::OpenFile;
        let open: std::collections::HashSet<u64> = self
            .lock_files()
            .values()
            .map(|f| match &**f {
                OpenFile::Read(ino, _)
                | OpenFile::Write(ino, _)
                | OpenFile::Disk(ino, _)
                | OpenFile::Staged { ino, .. } => *ino,
            })
            .collect();
        for ino in self.ns.inodes.inos() {
            if !open.contains(&ino) {
                self.do_forget(ino, u64::MAX);
            }
        }
        self.retry_pinned_now();
    }
}
