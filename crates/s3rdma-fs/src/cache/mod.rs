//! The page cache: blocks of the pinned, registered arena, keyed by (key, ETag, block number).
//!
//! The ETag in the key is what keeps a file from mixing versions: blocks of a replaced object
//! are never found under the new ETag. A block being filled belongs to its filler alone; a
//! ready block may have many readers; only a ready block with no reader is evicted. Concurrent
//! readers of one missing block wait on one fetch. When every block is busy, a reader waits
//! until one is released (a reader holds one block at a time, so this always ends), and
//! read-ahead simply skips.
//!
//! Eviction (measured against moka's TinyLFU in `sim.rs`): idle blocks sit in three regions,
//! evicted in this order:
//! 1. *probation*, oldest first: blocks that were not admitted — when they were fetched into
//!    a full cache, the frequency sketch rated them no more popular than the block they
//!    displaced — once their reader is done with them (a sequential reader two blocks past
//!    them or at end of file, a random read served);
//! 2. *behind*, oldest first: admitted blocks a sequential reader has left two blocks behind;
//! 3. *in use*, least recently used first: every other idle block (blocks a sequential
//!    reader is in or will reach, whole small files, blocks of random reads).
//!
//! So a scan does not push out a hot set, and a dataset larger than the cache read epoch after
//! epoch keeps part of itself cached instead of none (plain LRU evicts every block before it is
//! read again).

pub mod arena;
mod sim;
mod sketch;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore};

use arena::Arena;
use s3rdma_client::{ObjectStore, RdmaMode, RdmaWindow, S3Error, S3ErrorKind};
use sketch::Sketch;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BlockKey {
    pub key: Arc<str>,
    pub etag: Arc<str>,
    pub index: u64,
}

/// How a reader comes to a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// A sequential reader enters the block: one use of it. The block stays "in use" until the
    /// reader demotes it ([`Cache::demote`]).
    Enter,
    /// A sequential reader reads more of the block it is in: not another use.
    Continue,
    /// A read that is done with the block once it is served (a random read): one use.
    Once,
    /// Read-ahead: never waits for room, and counts as the use to come.
    Prefetch,
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
    /// Position in the eviction order while evictable.
    tick: Option<u64>,
    /// Filled by read-ahead and not read yet.
    unread_prefetch: bool,
    /// Not admitted: goes to probation once its reader is done with it.
    probation: bool,
    /// A sequential reader left it behind: on release it goes behind (or to probation).
    behind: bool,
    /// Its reader is done with it (end of file, a random read): on release it goes to
    /// probation if it was not admitted.
    done: bool,
    /// When a reader last used it; `None`: its pages were never used, or given back.
    used_at: Option<Instant>,
}

#[derive(Debug)]
struct Inner {
    slots: Vec<Slot>,
    map: HashMap<BlockKey, usize>,
    free: Vec<usize>,
    /// Evictable slots (ready, no reader), first to go first: probation (ticks below BEHIND),
    /// behind (below IN_USE), then in use, least recently used first.
    lru: BTreeMap<u64, usize>,
    probation_clock: u64,
    behind_clock: u64,
    clock: u64,
    /// How often blocks were used lately, including blocks no longer cached.
    sketch: Sketch,
}

/// Ticks of the eviction order: probation from 0, behind from here, in use from IN_USE.
const BEHIND: u64 = 1 << 61;
const IN_USE: u64 = 1 << 62;

/// What a reader found.
enum Claim {
    /// Ready (slot, length), and now held.
    Hit(usize, usize),
    /// Being filled by another reader.
    Wait,
    /// Reserved for this reader to fill.
    Fill(usize),
    /// Every block is busy.
    Full,
    /// Read-ahead of a block that is already there or coming.
    Present,
}

/// Counters, readable by the user (logged at unmount).
#[derive(Debug, Default)]
pub struct CacheStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub prefetches: AtomicU64,
    /// Prefetched blocks evicted without ever being read.
    pub prefetch_waste: AtomicU64,
    pub evictions: AtomicU64,
    /// Blocks fetched into a full cache but rated no more popular than the block they
    /// displaced: first to be evicted once read.
    pub not_admitted: AtomicU64,
    /// Times a reader waited for a block to be released (arena full).
    pub waits: AtomicU64,
    /// Read-ahead skipped because the arena was full.
    pub prefetch_skipped: AtomicU64,
    /// Bytes of idle blocks given back to the system (`--memory-idle-timeout`).
    pub given_back: AtomicU64,
}

impl s3rdma_metrics::Report for CacheStats {
    fn report(&self, out: &mut dyn s3rdma_metrics::Sink) {
        use s3rdma_metrics::{load, Value};
        let c = Value::counter;
        out.value(c(
            "cache_hits",
            "Reads served from cache blocks already filled.",
            load(&self.hits),
        ));
        out.value(c(
            "cache_misses",
            "Reads that had to fetch a block from S3.",
            load(&self.misses),
        ));
        out.value(c(
            "prefetches",
            "Blocks fetched ahead of the reader.",
            load(&self.prefetches),
        ));
        out.value(c(
            "prefetch_waste",
            "Prefetched blocks evicted before anyone read them.",
            load(&self.prefetch_waste),
        ));
        out.value(c(
            "evictions",
            "Cache blocks evicted to make room.",
            load(&self.evictions),
        ));
        out.value(c(
            "not_admitted",
            "Blocks not kept because the cache was full of blocks in use.",
            load(&self.not_admitted),
        ));
        out.value(c(
            "cache_waits",
            "Reads that waited for a block being filled.",
            load(&self.waits),
        ));
        out.value(c(
            "prefetch_skipped",
            "Read-ahead skipped because the cache was full.",
            load(&self.prefetch_skipped),
        ));
        out.value(c(
            "cache_given_back_bytes",
            "Bytes of idle cache blocks given back to the system.",
            load(&self.given_back),
        ));
    }
}

pub struct Cache<S: ObjectStore> {
    arena: Arena,
    inner: Mutex<Inner>,
    /// Signalled when a fill ends (ready or failed).
    filled: Notify,
    /// Signalled when a block becomes evictable or free.
    released: Notify,
    /// At most this many GETs in flight for the whole mount.
    fetches: Semaphore,
    s3: S,
    pub stats: CacheStats,
}

/// A reader's hold on a ready block: the block is not evicted or refilled while it lives.
pub struct BlockRef<S: ObjectStore> {
    cache: Arc<Cache<S>>,
    slot: usize,
    len: usize,
    /// Release it as done with ([`Access::Once`]).
    once: bool,
}

impl<S: ObjectStore> BlockRef<S> {
    pub fn data(&self) -> &[u8] {
        // SAFETY: the slot is Ready and we hold a reference: no writer exists.
        unsafe { self.cache.arena.block(self.slot, self.len) }
    }
}

impl<S: ObjectStore> Drop for BlockRef<S> {
    fn drop(&mut self) {
        self.cache.release(self.slot, self.once);
    }
}

impl<S: ObjectStore> Cache<S> {
    /// A cache of `blocks` blocks of `block_size` bytes, registered for RDMA when the mount
    /// uses it. `max_fetches` bounds the GETs in flight.
    pub fn new(
        s3: S,
        block_size: usize,
        blocks: usize,
        max_fetches: usize,
    ) -> Result<Cache<S>, String> {
        let rdma = s3.rdma_mode() != RdmaMode::Off;
        let arena = Arena::new(block_size, blocks, rdma, arena::CACHE_SLAB)?;
        // Only RDMA pins the cache (over HTTP its pages come as blocks are first used).
        if rdma && !arena.pinned() {
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
        Ok(Cache {
            inner: Mutex::new(Inner::new(blocks)),
            arena,
            filled: Notify::new(),
            released: Notify::new(),
            fetches: Semaphore::new(max_fetches.max(1)),
            s3,
            stats: CacheStats::default(),
        })
    }

    /// The cache's memory (for `s3rdma stats`).
    pub fn arena(&self) -> &Arena {
        &self.arena
    }

    pub fn block_size(&self) -> usize {
        self.arena.block_size()
    }

    /// Report the cache's occupancy (blocks holding data or being filled, and all blocks) in
    /// bytes, with its counters.
    pub fn report(&self, out: &mut dyn s3rdma_metrics::Sink) {
        use s3rdma_metrics::Value;
        let (used, all) = {
            let inner = self.lock();
            (inner.map.len(), inner.slots.len())
        };
        let bs = self.block_size() as u64;
        out.value(Value::gauge(
            "cache_used_bytes",
            "Page cache blocks holding data or being filled, in bytes.",
            used as u64 * bs,
        ));
        out.value(Value::gauge(
            "cache_capacity_bytes",
            "The page cache's size (--cache-size).",
            all as u64 * bs,
        ));
        s3rdma_metrics::Report::report(&self.stats, out);
    }

    /// Give back the memory of blocks no reader has used for `idle`: their data leaves the
    /// cache and their pages go back to the system. Nothing on an RDMA mount (its memory is
    /// registered, so pinned). Returns the bytes given back.
    pub fn give_back_idle(&self, idle: Duration) -> u64 {
        if self.arena.registering() {
            return 0;
        }
        let Some(before) = Instant::now().checked_sub(idle) else {
            return 0;
        };
        // Taken out of the free list under the lock, given back without it (readers of
        // other blocks go on meanwhile), then free again.
        let slots = self.lock().detach_idle(before);
        if slots.is_empty() {
            return 0;
        }
        // SAFETY: each slot has no reader, is not being filled and is in no list, so no one
        // can claim it until it is put back below.
        let blocks = unsafe { self.arena.give_back_blocks(&slots) };
        self.lock().free.extend(slots.iter().rev());
        let bytes = (blocks * self.arena.block_size()) as u64;
        self.stats.given_back.fetch_add(bytes, Ordering::Relaxed);
        bytes
    }

    /// Whether the block is cached (ready or being filled).
    pub fn contains(&self, key: &BlockKey) -> bool {
        self.lock().map.contains_key(key)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The block `key` (`len` bytes of the object from `index * block_size`), fetched if
    /// missing. `Access::Prefetch` returns `None` instead of waiting when the block is already
    /// there or coming, or when the arena is full.
    pub async fn get(
        self: &Arc<Self>,
        key: &BlockKey,
        len: usize,
        access: Access,
    ) -> Result<Option<BlockRef<S>>, S3Error> {
        let prefetch = access == Access::Prefetch;
        // A use is counted once, however long the reader waits.
        let mut count_use = matches!(access, Access::Enter | Access::Once);
        let block_ref = |slot, len| BlockRef {
            cache: self.clone(),
            slot,
            len,
            once: access == Access::Once,
        };
        let slot = loop {
            let filled = self.filled.notified();
            let released = self.released.notified();
            tokio::pin!(filled, released);
            let claim = {
                let mut inner = self.lock();
                if std::mem::take(&mut count_use) {
                    inner.sketch.record(key);
                }
                inner.claim(key, len, access, &self.stats)
            };
            match claim {
                Claim::Hit(i, len) => {
                    self.stats.hits.fetch_add(1, Ordering::Relaxed);
                    return Ok(Some(block_ref(i, len)));
                }
                Claim::Present => return Ok(None),
                Claim::Fill(i) => break i,
                Claim::Full if prefetch => {
                    self.stats.prefetch_skipped.fetch_add(1, Ordering::Relaxed);
                    return Ok(None);
                }
                Claim::Full => {
                    self.stats.waits.fetch_add(1, Ordering::Relaxed);
                    released.as_mut().enable();
                }
                Claim::Wait => {
                    filled.as_mut().enable();
                }
            }
            // Both futures were created before `claim` looked: notify_waiters() reaches them
            // from then on, so a fill or release that ended meanwhile is not missed.
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
        let ok = result.is_ok();
        self.lock().filled(slot, ok);
        self.filled.notify_waiters();
        if !ok {
            self.released.notify_waiters();
        }
        result.map(|()| Some(block_ref(slot, len)))
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
        self.arena.prefault(slot, len);
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
        result.map_err(S3Error::pinned_gone)
    }

    /// A sequential reader moved two blocks past this block: it goes behind — or to
    /// probation, if it was not admitted — and is evicted before blocks still in use. A block
    /// being read goes there when its last reader lets go.
    pub fn demote(&self, key: &BlockKey) {
        self.lock().demote(key);
    }

    /// The reader is done with this block (end of file): if it was not admitted it goes to
    /// probation; otherwise it keeps its place (it may be read again, as a whole small file
    /// often is).
    pub fn done_with(&self, key: &BlockKey) {
        self.lock().done_with(key);
    }

    fn release(&self, slot: usize, once: bool) {
        let idle = self.lock().release(slot, once);
        if idle {
            self.released.notify_waiters();
        }
    }
}

impl Inner {
    fn new(blocks: usize) -> Inner {
        let slots = (0..blocks)
            .map(|_| Slot {
                state: State::Free,
                refs: 0,
                key: None,
                len: 0,
                tick: None,
                unread_prefetch: false,
                probation: false,
                behind: false,
                done: false,
                used_at: None,
            })
            .collect();
        Inner {
            slots,
            map: HashMap::new(),
            free: (0..blocks).rev().collect(),
            lru: BTreeMap::new(),
            probation_clock: 0,
            behind_clock: BEHIND,
            clock: IN_USE,
            sketch: Sketch::new(blocks),
        }
    }

    /// Find the block, or reserve a slot to fill it into.
    fn claim(&mut self, key: &BlockKey, len: usize, access: Access, stats: &CacheStats) -> Claim {
        let prefetch = access == Access::Prefetch;
        if let Some(&i) = self.map.get(key) {
            match self.slots[i].state {
                State::Ready if prefetch => return Claim::Present,
                State::Ready => {
                    self.acquire(i, access);
                    return Claim::Hit(i, self.slots[i].len);
                }
                State::Filling if prefetch => return Claim::Present,
                State::Filling => return Claim::Wait,
                // Never happens (freeing a slot unmaps it); heal rather than panic.
                State::Free => {
                    self.map.remove(key);
                }
            }
        }
        let Some((i, admitted)) = self.take_slot(key, prefetch, stats) else {
            return Claim::Full;
        };
        if !admitted {
            stats.not_admitted.fetch_add(1, Ordering::Relaxed);
        }
        let s = &mut self.slots[i];
        s.state = State::Filling;
        s.refs = 1;
        s.key = Some(key.clone());
        s.len = len;
        s.unread_prefetch = prefetch;
        s.probation = !admitted;
        s.behind = false;
        s.done = false;
        s.used_at = Some(Instant::now());
        self.map.insert(key.clone(), i);
        Claim::Fill(i)
    }

    /// A fill ended: the block is ready (held by its filler), or the slot is free again.
    fn filled(&mut self, slot: usize, ok: bool) {
        if ok {
            self.slots[slot].state = State::Ready;
            return;
        }
        let s = &mut self.slots[slot];
        let key = s.key.take();
        s.state = State::Free;
        s.refs = 0;
        s.tick = None;
        if let Some(k) = key {
            self.map.remove(&k);
        }
        self.free.push(slot);
    }

    /// A reader takes a ready block: no longer evictable. A second use of a block that was not
    /// admitted proves it worth keeping.
    fn acquire(&mut self, i: usize, access: Access) {
        let s = &mut self.slots[i];
        s.refs += 1;
        if matches!(access, Access::Enter | Access::Once) && !s.unread_prefetch {
            s.probation = false;
        }
        if access != Access::Continue {
            s.behind = false;
            s.done = false;
        }
        s.unread_prefetch = false;
        if let Some(t) = s.tick.take() {
            self.lru.remove(&t);
        }
    }

    fn demote(&mut self, key: &BlockKey) {
        let Some(&i) = self.map.get(key) else { return };
        match self.slots[i].tick {
            // Held: placed when released.
            None => self.slots[i].behind = true,
            Some(t) if t >= IN_USE => {
                self.lru.remove(&t);
                self.place(i, true);
            }
            Some(_) => {}
        }
    }

    fn done_with(&mut self, key: &BlockKey) {
        let Some(&i) = self.map.get(key) else { return };
        let s = &mut self.slots[i];
        match s.tick {
            None => s.done = true,
            Some(t) if t >= IN_USE && s.probation => {
                self.lru.remove(&t);
                self.place(i, true);
            }
            Some(_) => {}
        }
    }

    /// A reader lets go of a block (`once`: and is done with it); returns whether the block
    /// became evictable.
    fn release(&mut self, slot: usize, once: bool) -> bool {
        let s = &mut self.slots[slot];
        s.refs = s.refs.saturating_sub(1);
        s.done |= once;
        s.used_at = Some(Instant::now());
        if s.refs == 0 && s.state == State::Ready {
            let leave = s.behind || (s.done && s.probation);
            self.place(slot, leave);
            return true;
        }
        false
    }

    /// Put an idle block into the eviction order: in use, or (`leave`) behind or in
    /// probation.
    fn place(&mut self, slot: usize, leave: bool) {
        let s = &mut self.slots[slot];
        let clock = if !leave {
            &mut self.clock
        } else if s.probation {
            &mut self.probation_clock
        } else {
            &mut self.behind_clock
        };
        *clock += 1;
        s.tick = Some(*clock);
        self.lru.insert(*clock, slot);
    }

    /// Slots with no reader, not being filled, unused since `before` and still holding pages:
    /// each leaves the cache (a ready block is dropped as an eviction would), is marked as
    /// holding none and is taken out of the free list (ascending): the caller puts them back.
    fn detach_idle(&mut self, before: Instant) -> Vec<usize> {
        let mut out = Vec::new();
        for i in 0..self.slots.len() {
            let s = &mut self.slots[i];
            let idle = s.used_at.is_some_and(|t| t < before);
            if !idle || s.refs > 0 || s.state == State::Filling {
                continue;
            }
            if s.state == State::Ready {
                if let Some(t) = s.tick.take() {
                    self.lru.remove(&t);
                }
                if let Some(k) = s.key.take() {
                    self.map.remove(&k);
                }
                s.state = State::Free;
            } else if let Some(at) = self.free.iter().position(|&f| f == i) {
                self.free.swap_remove(at);
            } else {
                continue;
            }
            s.used_at = None;
            out.push(i);
        }
        out
    }

    /// A free slot, or the first evictable one, and whether `key` is admitted: a block fetched
    /// into a full cache is admitted only if the sketch rates it more popular than the block
    /// it displaces (read-ahead counting the read to come).
    fn take_slot(
        &mut self,
        key: &BlockKey,
        prefetch: bool,
        stats: &CacheStats,
    ) -> Option<(usize, bool)> {
        if let Some(i) = self.free.pop() {
            return Some((i, true));
        }
        let (&t, &i) = self.lru.iter().next()?;
        self.lru.remove(&t);
        let s = &mut self.slots[i];
        s.tick = None;
        if s.unread_prefetch {
            stats.prefetch_waste.fetch_add(1, Ordering::Relaxed);
        }
        stats.evictions.fetch_add(1, Ordering::Relaxed);
        let victim = s.key.take();
        s.state = State::Free;
        let victim_uses = victim.as_ref().map_or(0, |k| self.sketch.estimate(k));
        if let Some(k) = victim {
            self.map.remove(&k);
        }
        let uses = self.sketch.estimate(key).saturating_add(u8::from(prefetch));
        Some((i, uses > victim_uses))
    }
}

#[cfg(test)]
mod store_tests {
    //! The cache over the in-memory store: the GETs it sends are the store's counters.

    use super::*;
    use s3rdma_client::testing::{MemStore, Op};

    const BS: usize = 64 << 10;

    fn setup(
        blocks: usize,
    ) -> (
        tokio::runtime::Runtime,
        MemStore,
        Arc<Cache<MemStore>>,
        String,
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let store = MemStore::new("b");
        let data: Vec<u8> = (0..BS * 8).map(|i| (i % 251) as u8).collect();
        let etag = store.put_external("obj", &data);
        let cache = Arc::new(Cache::new(store.clone(), BS, blocks, 4).expect("cache"));
        (rt, store, cache, etag)
    }

    fn key(etag: &str, index: u64) -> BlockKey {
        BlockKey {
            key: "obj".into(),
            etag: etag.into(),
            index,
        }
    }

    // [S-CACHE-CONCURRENT]: readers of one block share one GET.
    #[test]
    fn concurrent_readers_of_a_block_share_one_get_and_get_the_right_bytes() {
        let (rt, store, cache, etag) = setup(4);
        let k = key(&etag, 3);
        let reads: Vec<_> = (0..8)
            .map(|_| {
                let (c, k) = (cache.clone(), k.clone());
                rt.spawn(async move {
                    let b = c
                        .get(&k, BS, Access::Once)
                        .await
                        .expect("get")
                        .expect("a block");
                    b.data()[..16].to_vec()
                })
            })
            .collect();
        for r in reads {
            let first = rt.block_on(r).expect("task");
            let want: Vec<u8> = (3 * BS..3 * BS + 16).map(|i| (i % 251) as u8).collect();
            assert_eq!(first, want);
        }
        assert_eq!(store.requests(Op::Get), 1);
    }

    // [S-MEM-GIVE-BACK]: blocks idle for the timeout leave the cache and give their pages
    // back; a block a reader holds stays, and what left is fetched again when read.
    #[test]
    fn idle_blocks_give_their_memory_back_and_held_ones_stay() {
        let (rt, store, cache, etag) = setup(4);
        let held = rt.block_on(async {
            for i in 0..3 {
                cache.get(&key(&etag, i), BS, Access::Once).await.unwrap();
            }
            cache.get(&key(&etag, 3), BS, Access::Once).await.unwrap()
        });
        assert_eq!(store.requests(Op::Get), 4);
        // Nothing has been idle for a minute.
        assert_eq!(cache.give_back_idle(Duration::from_secs(60)), 0);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(
            cache.give_back_idle(Duration::from_millis(10)),
            3 * BS as u64
        );
        assert!(!cache.contains(&key(&etag, 0)) && cache.contains(&key(&etag, 3)));
        assert_eq!(
            cache.stats.given_back.load(Ordering::Relaxed),
            3 * BS as u64
        );
        // Already given back: nothing more to give.
        assert_eq!(cache.give_back_idle(Duration::ZERO), 0);
        let data = rt.block_on(async {
            let b = cache
                .get(&key(&etag, 1), BS, Access::Once)
                .await
                .unwrap()
                .unwrap();
            b.data().to_vec()
        });
        let want: Vec<u8> = (BS..2 * BS).map(|i| (i % 251) as u8).collect();
        assert_eq!(data, want);
        assert_eq!(store.requests(Op::Get), 5);
        drop(held);
    }

    // [S-CACHE-EVICT]: a cache smaller than the object keeps reading it right, refetching
    // what it evicted, and never holds more blocks than it has.
    #[test]
    fn a_small_cache_evicts_and_fetches_again() {
        let (rt, store, cache, etag) = setup(2);
        for round in 0..2u64 {
            for i in 0..8u64 {
                let b = rt
                    .block_on(cache.get(&key(&etag, i), BS, Access::Once))
                    .expect("get")
                    .expect("a block");
                assert_eq!(
                    b.data()[0],
                    ((i as usize * BS) % 251) as u8,
                    "round {round}"
                );
            }
        }
        let held = (0..8).filter(|&i| cache.contains(&key(&etag, i))).count();
        assert!(held <= 2, "{held} blocks held in a 2-block cache");
        // The second round finds at most the two blocks the cache holds.
        let gets = store.requests(Op::Get);
        assert!((14..=16).contains(&gets), "{gets} GETs");
        // A block pinned to a replaced version fails ESTALE (PreconditionFailed), never the
        // new bytes.
        store.put_external("obj", &[9u8; BS * 8]);
        let e = rt
            .block_on(cache.get(&key(&etag, 5), BS, Access::Once))
            .err()
            .expect("an error");
        assert_eq!(e.kind, S3ErrorKind::PreconditionFailed);
        store.delete_external("obj");
        let e = rt
            .block_on(cache.get(&key(&etag, 6), BS, Access::Once))
            .err()
            .expect("an error");
        assert_eq!(
            e.kind,
            S3ErrorKind::PreconditionFailed,
            "a deleted object reads as replaced"
        );
    }
}
