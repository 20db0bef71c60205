//! The write buffers: one arena, cut into blocks of the write part size, mapped by the first
//! write (a mount that only reads never has one); with RDMA pinned and registered with cuObject
//! then, once. A part of `k` blocks (`k` a power of two, for the parts of very large
//! files) takes `k` adjacent blocks aligned to `k`, so every part is one RDMA window.
//!
//! A writer that finds no room waits while uploads hold blocks (each upload gives its blocks
//! back when it ends, so the wait always ends). When no upload holds any block, every block is
//! being filled by an open file that is not writing right now; waiting could then last forever
//! (one program writing many files in turn), so the chunk comes from ordinary memory instead
//! (an *overflow* chunk, counted; RDMA-registered on its own when RDMA is on).

use s3rdma_proto::sync::Lock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use cuobj_ffi::{RegisteredBuffer, Registration};
use tokio::sync::Notify;

use crate::cache::arena::Arena;
use crate::setup::SetupError;
use s3rdma_client::PutSource;

/// Counters, readable by the user.
#[derive(Debug, Default)]
pub struct PoolStats {
    /// Times a writer waited for an upload to give blocks back.
    pub waits: AtomicU64,
    /// Chunks taken from ordinary memory because every block was being filled.
    pub overflow: AtomicU64,
}

pub struct WritePool {
    block_size: usize,
    blocks: usize,
    /// Pin and register the arena (RDMA).
    register: bool,
    /// Mapped by the first `take`.
    arena: OnceLock<Arena>,
    mapping: Mutex<()>,
    state: Mutex<PoolState>,
    freed: Notify,
    register_overflow: bool,
    pub stats: PoolStats,
}

#[derive(Debug)]
struct PoolState {
    used: Vec<bool>,
    /// When each block was last given back by a part; `None`: its pages were never used, or
    /// went back to the system.
    used_at: Vec<Option<Instant>>,
    /// Blocks held by parts handed to an upload (queued or in flight).
    uploading: usize,
}

impl PoolState {
    /// The first free run of `k` blocks aligned to `k`.
    fn find_run(&self, k: usize) -> Option<usize> {
        (0..self.used.len())
            .step_by(k)
            .find(|&s| s + k <= self.used.len() && self.used[s..s + k].iter().all(|u| !u))
    }
}

impl WritePool {
    /// `blocks` blocks of `block_size` bytes; `register`: register the arena (and overflow
    /// chunks) for RDMA.
    pub fn new(block_size: usize, blocks: usize, register: bool) -> Result<WritePool, SetupError> {
        let size = SetupError::Size {
            what: "write buffers (--write-buffer-size)",
            fix: "give at least one --write-part-size",
        };
        if block_size == 0 || blocks == 0 {
            return Err(size);
        }
        block_size.checked_mul(blocks).ok_or(size)?;
        Ok(WritePool {
            block_size,
            blocks,
            register,
            arena: OnceLock::new(),
            mapping: Mutex::new(()),
            state: Mutex::new(PoolState {
                used: vec![false; blocks],
                used_at: vec![None; blocks],
                uploading: 0,
            }),
            freed: Notify::new(),
            register_overflow: register,
            stats: PoolStats::default(),
        })
    }

    /// The pool's memory, once the first write mapped it (for `s3rdma stats`).
    pub fn arena(&self) -> Option<&Arena> {
        self.arena.get()
    }

    /// The arena, mapped (pinned and registered with RDMA) on first use.
    fn mapped(&self) -> Result<&Arena, String> {
        if let Some(a) = self.arena.get() {
            return Ok(a);
        }
        let _one = self.mapping.locked();
        if let Some(a) = self.arena.get() {
            return Ok(a);
        }
        // One slab: a part of many blocks must lie in one registration.
        let a = Arena::new(
            self.block_size,
            self.blocks,
            self.register,
            usize::MAX,
            self.block_size,
        )
        .map_err(|e| e.named("write buffers (--write-buffer-size)").to_string())?;
        tracing::info!(
            bytes = a.len(),
            pinned = a.pinned(),
            registered = a.registered(),
            "write buffers mapped by the first write"
        );
        Ok(self.arena.get_or_init(|| a))
    }

    /// The arena of a pool that has handed out a chunk (mapped by then).
    fn live(&self) -> &Arena {
        self.arena
            .get()
            .expect("a pool chunk exists only once its arena is mapped")
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Whether the write buffers are pinned (false until the first write maps them).
    pub fn pinned(&self) -> bool {
        self.arena.get().is_some_and(|a| a.pinned())
    }

    /// Whether the write buffers are registered for RDMA (false until the first write).
    pub fn registered(&self) -> bool {
        self.arena.get().is_some_and(|a| a.registered())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.locked()
    }

    /// A chunk of `k` blocks (a power of two, at most [`WritePool::blocks`]): from the arena,
    /// waiting while uploads hold blocks, else from ordinary memory.
    pub async fn take(self: &Arc<Self>, k: usize) -> Result<Chunk, String> {
        debug_assert!(k.is_power_of_two() && k <= self.blocks());
        self.mapped()?;
        let mut waited = false;
        loop {
            let notified = self.freed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = self.lock();
                if let Some(start) = st.find_run(k) {
                    st.used[start..start + k].fill(true);
                    return Ok(Chunk {
                        pool: self.clone(),
                        mem: Mem::Pool { start, blocks: k },
                        uploading: false,
                    });
                }
                if st.uploading == 0 {
                    drop(st);
                    return self.overflow(k);
                }
            }
            if !waited {
                self.stats.waits.fetch_add(1, Ordering::Relaxed);
                waited = true;
            }
            notified.await;
        }
    }

    fn overflow(self: &Arc<Self>, k: usize) -> Result<Chunk, String> {
        self.stats.overflow.fetch_add(1, Ordering::Relaxed);
        let len = k * self.block_size();
        let mem = if self.register_overflow {
            match RegisteredBuffer::new(len) {
                Ok(b) => Mem::Registered(b),
                Err(e) => {
                    tracing::debug!(error = %e, "overflow write buffer not registered; its part goes over HTTP");
                    Mem::Heap(vec![0u8; len].into_boxed_slice())
                }
            }
        } else {
            Mem::Heap(vec![0u8; len].into_boxed_slice())
        };
        Ok(Chunk {
            pool: self.clone(),
            mem,
            uploading: false,
        })
    }

    /// Give the pages of blocks no part has used for `idle` back to the system (nothing on a
    /// pinned, RDMA pool). Returns the bytes given back.
    pub fn give_back_idle(&self, idle: Duration) -> u64 {
        let Some(before) = Instant::now().checked_sub(idle) else {
            return 0;
        };
        let Some(arena) = self.arena.get() else {
            return 0;
        };
        if arena.registering() {
            return 0;
        }
        // Marked used under the lock (no part can take them), given back without it, then
        // free again.
        let idle: Vec<usize> = {
            let mut st = self.lock();
            let idle: Vec<usize> = (0..st.used.len())
                .filter(|&i| !st.used[i] && st.used_at[i].is_some_and(|t| t < before))
                .collect();
            for &i in &idle {
                st.used[i] = true;
                st.used_at[i] = None;
            }
            idle
        };
        if idle.is_empty() {
            return 0;
        }
        // SAFETY: the blocks are marked used, so no part holds or takes them until freed below.
        let n = unsafe { arena.give_back_blocks(&idle) };
        let mut st = self.lock();
        for &i in &idle {
            st.used[i] = false;
        }
        drop(st);
        self.freed.notify_waiters();
        (n * self.block_size()) as u64
    }

    /// Blocks free right now (for tests and stats).
    pub fn free_blocks(&self) -> usize {
        self.lock().used.iter().filter(|u| !**u).count()
    }

    fn give_back(&self, start: usize, blocks: usize, uploading: bool) {
        let mut st = self.lock();
        st.used[start..start + blocks].fill(false);
        st.used_at[start..start + blocks].fill(Some(Instant::now()));
        if uploading {
            st.uploading -= blocks;
        }
        drop(st);
        self.freed.notify_waiters();
    }
}

enum Mem {
    Pool { start: usize, blocks: usize },
    Registered(RegisteredBuffer),
    Heap(Box<[u8]>),
}

/// A part being filled, then uploaded; its memory goes back to the pool when dropped.
pub struct Chunk {
    pool: Arc<WritePool>,
    mem: Mem,
    uploading: bool,
}

impl Chunk {
    pub fn capacity(&self) -> usize {
        match &self.mem {
            Mem::Pool { blocks, .. } => blocks * self.pool.block_size(),
            Mem::Registered(b) => b.len(),
            Mem::Heap(h) => h.len(),
        }
    }

    /// Whether this chunk came from ordinary memory (the pool was full).
    pub fn is_overflow(&self) -> bool {
        !matches!(self.mem, Mem::Pool { .. })
    }

    /// The chunk's memory, to fill.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let cap = self.capacity();
        match &mut self.mem {
            // SAFETY: the run is ours alone (marked used) until this chunk is dropped, and
            // `&mut self` makes this the only access.
            Mem::Pool { start, .. } => unsafe { self.pool.live().block_mut_run(*start, cap) },
            Mem::Registered(b) => b.as_mut_slice(),
            Mem::Heap(h) => h,
        }
    }

    fn as_slice(&self) -> &[u8] {
        let cap = self.capacity();
        match &self.mem {
            // SAFETY: as above; once uploading, nothing writes the chunk any more.
            Mem::Pool { start, .. } => unsafe { self.pool.live().block_run(*start, cap) },
            Mem::Registered(b) => b.as_slice(),
            Mem::Heap(h) => h,
        }
    }

    /// Hand the first `len` bytes to an upload: counted as held by uploads (so writers wait
    /// for them rather than overflow) until the returned part is dropped.
    pub fn into_part(mut self, len: usize) -> Part {
        if let Mem::Pool { blocks, .. } = self.mem {
            self.pool.lock().uploading += blocks;
            self.uploading = true;
        }
        let chunk = Arc::new(self);
        let bytes = bytes::Bytes::from_owner(Filled {
            chunk: chunk.clone(),
            len,
        });
        Part { chunk, bytes }
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        if let Mem::Pool { start, blocks } = self.mem {
            self.pool.give_back(start, blocks, self.uploading);
        }
    }
}

/// The filled bytes of a chunk, as the owner of a `Bytes` (HTTP bodies borrow no copy).
struct Filled {
    chunk: Arc<Chunk>,
    len: usize,
}

impl AsRef<[u8]> for Filled {
    fn as_ref(&self) -> &[u8] {
        &self.chunk.as_slice()[..self.len]
    }
}

/// A filled chunk on its way to S3.
pub struct Part {
    chunk: Arc<Chunk>,
    bytes: bytes::Bytes,
}

impl Part {
    /// The bytes as an upload source: an RDMA window when the memory is registered.
    pub fn source(&self) -> PutSource<'_> {
        match self.window() {
            Some((reg, offset)) => PutSource::Window {
                reg,
                offset,
                bytes: self.bytes.clone(),
            },
            None => PutSource::Owned(self.bytes.clone()),
        }
    }

    fn window(&self) -> Option<(&Arc<Registration>, usize)> {
        match &self.chunk.mem {
            Mem::Pool { start, .. } => self.chunk.pool.live().registration_of(*start),
            Mem::Registered(b) => Some((b.registration(), 0)),
            Mem::Heap(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    // [S-MEM-GIVE-BACK]
    #[test]
    fn free_blocks_idle_for_the_timeout_give_their_pages_back() {
        rt().block_on(async {
            let pool = Arc::new(WritePool::new(4096, 4, false).unwrap());
            let mut a = pool.take(1).await.unwrap();
            let b = pool.take(1).await.unwrap();
            a.as_mut_slice().fill(7);
            drop(a);
            // Never used, or used a moment ago: kept.
            assert_eq!(pool.give_back_idle(Duration::from_secs(60)), 0);
            std::thread::sleep(Duration::from_millis(20));
            // Block 0 (free) goes; block 1 is held by a part.
            assert_eq!(pool.give_back_idle(Duration::from_millis(10)), 4096);
            assert_eq!(pool.give_back_idle(Duration::ZERO), 0);
            // Given back: it reads as zeros, and works as before.
            let mut c = pool.take(1).await.unwrap();
            assert!(matches!(c.mem, Mem::Pool { start: 0, .. }));
            assert!(c.as_mut_slice().iter().all(|&x| x == 0));
            drop((b, c));
        });
    }

    #[test]
    fn runs_are_aligned_and_given_back() {
        rt().block_on(async {
            let pool = Arc::new(WritePool::new(4096, 8, false).unwrap());
            let a = pool.take(1).await.unwrap();
            let b = pool.take(2).await.unwrap();
            let c = pool.take(4).await.unwrap();
            assert_eq!(pool.free_blocks(), 1);
            assert!(matches!(a.mem, Mem::Pool { start: 0, .. }));
            assert!(matches!(b.mem, Mem::Pool { start: 2, .. }));
            assert!(matches!(c.mem, Mem::Pool { start: 4, .. }));
            assert_eq!(c.capacity(), 4 * 4096);
            drop(b);
            assert_eq!(pool.free_blocks(), 3);
            // Nothing uploads: a chunk that does not fit comes from ordinary memory.
            let d = pool.take(4).await.unwrap();
            assert!(d.is_overflow());
            assert_eq!(pool.stats.overflow.load(Ordering::Relaxed), 1);
        });
    }

    #[test]
    fn a_writer_waits_for_an_upload_and_never_for_an_idle_writer() {
        rt().block_on(async {
            let pool = Arc::new(WritePool::new(4096, 2, false).unwrap());
            let mut a = pool.take(1).await.unwrap();
            a.as_mut_slice()[..3].copy_from_slice(b"abc");
            let part = a.into_part(3);
            assert_eq!(&part.bytes[..], b"abc");
            let _b = pool.take(1).await.unwrap();
            // The pool is full and an upload holds a block: the next writer waits for it.
            let p2 = pool.clone();
            let waiter = tokio::spawn(async move { p2.take(1).await.unwrap().is_overflow() });
            tokio::task::yield_now().await;
            assert!(!waiter.is_finished());
            drop(part);
            assert!(!waiter.await.unwrap(), "got the block the upload gave back");
            assert_eq!(pool.stats.waits.load(Ordering::Relaxed), 1);
        });
    }
}
