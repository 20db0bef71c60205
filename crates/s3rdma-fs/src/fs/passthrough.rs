//! FUSE passthrough: which inodes the kernel reads itself from the disk cache (one backing
//! file per inode at a time, registered once per cache entry and kept with it), and which are
//! open in the kernel's page-cache mode — the kernel refuses to mix the two on one inode.

use s3rdma_proto::sync::Lock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use fuser::{BackingId, FopenFlags, ReplyOpen};
use tracing::warn;

use crate::diskcache::{CachedFile, DiskCache};

/// Which inodes the kernel serves by passthrough, and which are open in its cached mode: the
/// kernel refuses to mix the two on one inode.
#[derive(Default)]
struct PassState {
    /// Inode → the backing file its open passthrough handles use (the kernel takes one per
    /// inode at a time).
    live: HashMap<u64, LivePassthrough>,
    /// Inode → read handles open in the kernel's cached (page cache) mode.
    cached: HashMap<u64, usize>,
}

struct LivePassthrough {
    etag: String,
    backing: Arc<BackingId>,
    handles: usize,
}

/// The passthrough side of a mount.
#[derive(Default)]
pub(super) struct Passthrough {
    /// Asked for (`--cache-dir` without `--no-passthrough`).
    pub wanted: bool,
    /// Granted by the kernel at init (cleared if registering a backing file fails).
    pub on: AtomicBool,
    state: Mutex<PassState>,
}

impl Passthrough {
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, PassState> {
        self.state.locked()
    }

    /// Let go of every registration (the session ends: the connection can still take them).
    pub fn clear(&self) {
        self.lock().live.clear();
    }

    /// The backing registration for a passthrough open of `ino` (`key` at `etag`), counted as
    /// one more passthrough handle: the one the inode's open handles use (the kernel takes one
    /// per inode), else the one tied to the cache entry, else a new one (tied to the entry if
    /// it keeps its file open, so the next epoch's open costs no registration). None when the
    /// kernel cannot take it now (the inode is open in cached mode, or by another version).
    pub fn backing_for(
        &self,
        ino: u64,
        key: &str,
        etag: &str,
        cached: &CachedFile,
        reply: &ReplyOpen,
        disk: Option<&DiskCache>,
    ) -> Option<Arc<BackingId>> {
        if !self.is_on() {
            return None;
        }
        let mut pass = self.lock();
        if pass.cached.get(&ino).copied().unwrap_or(0) > 0 {
            return None;
        }
        if let Some(live) = pass.live.get_mut(&ino) {
            if live.etag != etag {
                return None;
            }
            live.handles += 1;
            return Some(live.backing.clone());
        }
        let tied = cached
            .attached
            .clone()
            .and_then(|a| a.downcast::<BackingId>().ok());
        let backing = match tied {
            Some(b) => b,
            None => match reply.open_backing(&cached.file) {
                Ok(id) => {
                    let b = Arc::new(id);
                    if let Some(d) = disk {
                        d.stats
                            .passthrough_registrations
                            .fetch_add(1, Ordering::Relaxed);
                        d.attach(key, etag, &cached.file, b.clone());
                    }
                    b
                }
                Err(e) => {
                    if self.on.swap(false, Ordering::Relaxed) {
                        warn!(error = %e, "FUSE passthrough is not available (it needs Linux 6.9+ and CAP_SYS_ADMIN); files in the disk cache are served by the daemon instead");
                    }
                    return None;
                }
            },
        };
        pass.live.insert(
            ino,
            LivePassthrough {
                etag: etag.to_string(),
                backing: backing.clone(),
                handles: 1,
            },
        );
        Some(backing)
    }

    /// A passthrough handle of `ino` is closed.
    pub fn release(&self, ino: u64) {
        let mut pass = self.lock();
        if let Some(live) = pass.live.get_mut(&ino) {
            live.handles -= 1;
            if live.handles == 0 {
                pass.live.remove(&ino);
            }
        }
    }

    /// Open flags for a read handle that the kernel serves from its page cache (or not: an
    /// inode being served by passthrough takes only direct I/O opens). A read handle has
    /// nothing to do at close: FOPEN_NOFLUSH spares the kernel the FLUSH round trip.
    pub fn read_open_flags(
        &self,
        ino: u64,
        keep_cache: bool,
        direct_io: bool,
    ) -> (FopenFlags, bool) {
        let mut pass = self.lock();
        let passthrough_live = pass.live.contains_key(&ino);
        if direct_io || passthrough_live {
            return (
                FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_NOFLUSH,
                false,
            );
        }
        *pass.cached.entry(ino).or_insert(0) += 1;
        let flags = if keep_cache {
            FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        };
        (flags | FopenFlags::FOPEN_NOFLUSH, true)
    }

    /// A read handle of `ino` opened in the kernel's cached mode is closed.
    pub fn release_cached_mode(&self, ino: u64) {
        let mut pass = self.lock();
        if let Some(n) = pass.cached.get_mut(&ino) {
            *n -= 1;
            if *n == 0 {
                pass.cached.remove(&ino);
            }
        }
    }
}
