//! The page cache: blocks of the pinned, registered arena, keyed by (key, ETag, block number).
//!
//! The ETag in the key is what keeps a file from mixing versions: blocks of a replaced object
//! are never found under the new ETag. A block being filled belongs to its filler alone; a
//! ready block may have many readers; only a ready block with no reader is evicted (least
//! recently used first). Concurrent readers of one missing block wait on one fetch. When every
//! block is busy, a reader waits until one is released (a reader holds one block at a time, so
//! this always ends), and read-ahead simply skips.

pub mod arena;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, Semaphore};

use crate::s3::{RdmaMode, RdmaWindow, S3Client, S3Error, S3ErrorKind};
use arena::Arena;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BlockKey {
    pub key: Arc<str>,
    pub etag: Arc<str>,
    pub index: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Free,
    Filling,
    Ready,
}

#[derive(Debug)]
struct Slot {
    state: State,
    refs: u32,
    key: Option<BlockKey>,
    len: usize,
    /// Position in the LRU list while evictable.
    tick: Option<u64>,
    /// Filled by read-ahead and not read yet.
    unread_prefetch: bool,
}

#[derive(Debug)]
struct Inner {
    slots: Vec<Slot>,
    map: HashMap<BlockKey, usize>,
    free: Vec<usize>,
    /// Evictable slots (ready, no reader), first to go first: blocks a sequential reader has
    /// left behind (ticks below WARM), then the least recently used.
    lru: BTreeMap<u64, usize>,
    clock: u64,
    cold_clock: u64,
}

/// LRU ticks of recently used blocks start here; demoted (left-behind) blocks sort below.
const WARM: u64 = 1 << 62;

/// Counters, readable by the user (logged at unmount).
#[derive(Debug, Default)]
pub struct CacheStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub prefetches: AtomicU64,
    /// Prefetched blocks evicted without ever being read.
    pub prefetch_waste: AtomicU64,
    pub evictions: AtomicU64,
    /// Times a reader waited for a block to be released (arena full).
    pub waits: AtomicU64,
    /// Read-ahead skipped because the arena was full.
    pub prefetch_skipped: AtomicU64,
}

impl CacheStats {
    pub fn summary(&self) -> String {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "cache_hits={} cache_misses={} prefetches={} prefetch_waste={} evictions={} cache_waits={} prefetch_skipped={}",
            g(&self.hits),
            g(&self.misses),
            g(&self.prefetches),
            g(&self.prefetch_waste),
            g(&self.evictions),
            g(&self.waits),
            g(&self.prefetch_skipped)
        )
    }
}

pub struct Cache {
    arena: Arena,
    inner: Mutex<Inner>,
    /// Signalled when a fill ends (ready or failed).
    filled: Notify,
    /// Signalled when a block becomes evictable or free.
    released: Notify,
    /// At most this many GETs in flight for the whole mount.
    fetches: Semaphore,
    s3: S3Client,
    pub stats: CacheStats,
}

/// A reader's hold on a ready block: the block is not evicted or refilled while it lives.
pub struct BlockRef {
    cache: Arc<Cache>,
    slot: usize,
    len: usize,
}

impl BlockRef {
    pub fn data(&self) -> &[u8] {
        // SAFETY: the slot is Ready and we hold a reference: no writer exists.
        unsafe { self.cache.arena.block(self.slot, self.len) }
    }
}

impl Drop for BlockRef {
    fn drop(&mut self) {
        self.cache.release(self.slot);
    }
}

impl Cache {
    /// A cache of `blocks` blocks of `block_size` bytes, registered for RDMA when the mount
    /// uses it. `max_fetches` bounds the GETs in flight.
    pub fn new(
        s3: S3Client,
        block_size: usize,
        blocks: usize,
        max_fetches: usize,
    ) -> Result<Cache, String> {
        let rdma = s3.rdma_mode() != RdmaMode::Off;
        let arena = Arena::new(block_size, blocks, rdma)?;
        if !arena.pinned() {
            if s3.rdma_mode() == RdmaMode::Required {
                return Err(format!(
                    "cannot pin the {}-byte cache (mlock failed: RLIMIT_MEMLOCK too low?) and rdma=required; raise the limit (ulimit -l, LimitMEMLOCK= in systemd) or lower --cache-size",
                    arena.len()
                ));
            }
            tracing::warn!(
                bytes = arena.len(),
                "cannot mlock the cache (RLIMIT_MEMLOCK too low?); it stays unpinned; raise ulimit -l or LimitMEMLOCK="
            );
        }
        if rdma && !arena.registered() && s3.rdma_mode() == RdmaMode::Required {
            return Err("cannot register the cache with cuObject and rdma=required".into());
        }
        let slots = (0..blocks)
            .map(|_| Slot {
                state: State::Free,
                refs: 0,
                key: None,
                len: 0,
                tick: None,
                unread_prefetch: false,
            })
            .collect();
        Ok(Cache {
            inner: Mutex::new(Inner {
                slots,
                map: HashMap::new(),
                free: (0..blocks).rev().collect(),
                lru: BTreeMap::new(),
                clock: WARM,
                cold_clock: 0,
            }),
            arena,
            filled: Notify::new(),
            released: Notify::new(),
            fetches: Semaphore::new(max_fetches.max(1)),
            s3,
            stats: CacheStats::default(),
        })
    }

    pub fn block_size(&self) -> usize {
        self.arena.block_size()
    }

    /// Whether the block is cached (ready or being filled).
    pub fn contains(&self, key: &BlockKey) -> bool {
        self.lock().map.contains_key(key)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The block `key` (`len` bytes of the object from `index * block_size`), fetched if
    /// missing. With `prefetch`, returns `None` instead of waiting when the arena is full, and
    /// the block counts as read-ahead.
    pub async fn get(
        self: &Arc<Self>,
        key: &BlockKey,
        len: usize,
        prefetch: bool,
    ) -> Result<Option<BlockRef>, S3Error> {
        let slot = loop {
            let filled = self.filled.notified();
            let released = self.released.notified();
            tokio::pin!(filled, released);
            {
                let mut inner = self.lock();
                if let Some(&i) = inner.map.get(key) {
                    match inner.slots[i].state {
                        State::Ready => {
                            if prefetch {
                                return Ok(None);
                            }
                            inner.acquire(i);
                            self.stats.hits.fetch_add(1, Ordering::Relaxed);
                            let len = inner.slots[i].len;
                            return Ok(Some(BlockRef {
                                cache: self.clone(),
                                slot: i,
                                len,
                            }));
                        }
                        State::Filling if prefetch => return Ok(None),
                        State::Filling => {
                            filled.as_mut().enable();
                        }
                        State::Free => {
                            // Never happens (freeing a slot unmaps it); heal rather than panic.
                            inner.map.remove(key);
                            continue;
                        }
                    }
                } else if let Some(i) = inner.take_slot(&self.stats) {
                    let s = &mut inner.slots[i];
                    s.state = State::Filling;
                    s.refs = 1;
                    s.key = Some(key.clone());
                    s.len = len;
                    s.unread_prefetch = prefetch;
                    inner.map.insert(key.clone(), i);
                    break i;
                } else if prefetch {
                    self.stats.prefetch_skipped.fetch_add(1, Ordering::Relaxed);
                    return Ok(None);
                } else {
                    self.stats.waits.fetch_add(1, Ordering::Relaxed);
                    released.as_mut().enable();
                }
            }
            tokio::select! {
                _ = &mut filled => {},
                _ = &mut released => {},
            }
        };
        if prefetch {
            self.stats.prefetches.fetch_add(1, Ordering::Relaxed);
        } else {
            self.stats.misses.fetch_add(1, Ordering::Relaxed);
        }
        let result = self.fill(slot, key, len).await;
        let mut inner = self.lock();
        match result {
            Ok(()) => {
                inner.slots[slot].state = State::Ready;
                drop(inner);
                self.filled.notify_waiters();
                Ok(Some(BlockRef {
                    cache: self.clone(),
                    slot,
                    len,
                }))
            }
            Err(e) => {
                inner.map.remove(key);
                let s = &mut inner.slots[slot];
                s.state = State::Free;
                s.refs = 0;
                s.key = None;
                inner.free.push(slot);
                drop(inner);
                self.filled.notify_waiters();
                self.released.notify_waiters();
                Err(e)
            }
        }
    }

    async fn fill(&self, slot: usize, key: &BlockKey, len: usize) -> Result<(), S3Error> {
        let _permit = self.fetches.acquire().await.map_err(|_| {
            S3Error::new(
                S3ErrorKind::Other,
                "GetObject",
                &key.key,
                "cache is shutting down",
            )
        })?;
        let offset = key.index * self.arena.block_size() as u64;
        // SAFETY: the slot is Filling and we are its only holder until we mark it Ready.
        let buf = unsafe { self.arena.block_mut(slot, len) };
        let result = match (self.s3.rdma_mode(), self.arena.registration_of(slot)) {
            (RdmaMode::Off, _) | (_, None) => {
                self.s3
                    .get_range_into(&key.key, &key.etag, offset, buf)
                    .await
            }
            (_, Some((reg, reg_offset))) => {
                // SAFETY: `buf` is exactly the block at `reg_offset` of its slab's registration,
                // and it is ours alone while Filling.
                let win = unsafe { RdmaWindow::new(reg, reg_offset, buf) };
                self.s3
                    .get_range_rdma_window(&key.key, &key.etag, offset, win)
                    .await
            }
        };
        result.map_err(crate::read::pinned_gone)
    }

    /// A sequential reader has moved past this block: evict it before any other idle block, so
    /// that a scan does not push out blocks that are read again (drop-behind).
    pub fn demote(&self, key: &BlockKey) {
        let mut inner = self.lock();
        let Some(&i) = inner.map.get(key) else { return };
        let Some(t) = inner.slots[i].tick else { return };
        if t < WARM {
            return;
        }
        inner.lru.remove(&t);
        inner.cold_clock += 1;
        let cold = inner.cold_clock;
        inner.slots[i].tick = Some(cold);
        inner.lru.insert(cold, i);
    }

    fn release(&self, slot: usize) {
        let mut inner = self.lock();
        let s = &mut inner.slots[slot];
        s.refs = s.refs.saturating_sub(1);
        if s.refs == 0 && s.state == State::Ready {
            inner.clock += 1;
            let t = inner.clock;
            inner.slots[slot].tick = Some(t);
            inner.lru.insert(t, slot);
            drop(inner);
            self.released.notify_waiters();
        }
    }
}

impl Inner {
    /// A reader takes a ready block: no longer evictable.
    fn acquire(&mut self, i: usize) {
        let s = &mut self.slots[i];
        s.refs += 1;
        s.unread_prefetch = false;
        if let Some(t) = s.tick.take() {
            self.lru.remove(&t);
        }
    }

    /// A free slot, or the least recently used evictable one.
    fn take_slot(&mut self, stats: &CacheStats) -> Option<usize> {
        if let Some(i) = self.free.pop() {
            return Some(i);
        }
        let (&t, &i) = self.lru.iter().next()?;
        self.lru.remove(&t);
        let s = &mut self.slots[i];
        s.tick = None;
        if s.unread_prefetch {
            stats.prefetch_waste.fetch_add(1, Ordering::Relaxed);
        }
        stats.evictions.fetch_add(1, Ordering::Relaxed);
        if let Some(k) = s.key.take() {
            self.map.remove(&k);
        }
        s.state = State::Free;
        Some(i)
    }
}
