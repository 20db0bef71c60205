//! The page cache: blocks of the pinned, registered arena, keyed by (key, ETag, block number).
//!
//! A block is one read part of an object (`--read-part-size`) or less at its end, so a small
//! file is one block of its own size. Space is allocated in units of 16 KiB (`space.rs`: a
//! buddy allocator, runs aligned to their length), so a 16 KiB file takes one unit and a
//! 256 KiB file sixteen, not a whole part: a 1 GiB cache holds 65,536 and 4,096 such files,
//! not 128. Eviction
//! frees runs until one of the needed length is free; a victim smaller than that run takes the
//! idle entries around it in the same aligned run along (a part of a large file displaces at
//! most one part's worth of small files).
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
mod space;

use s3rdma_proto::sync::Lock;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore};

use crate::setup::SetupError;
use arena::Arena;
use s3rdma_client::{ObjectInfo, ObjectStore, RdmaMode, RdmaWindow, S3Error, S3ErrorKind};
use sketch::Sketch;
use space::Space;

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
    Filling,
    Ready,
}

/// One entry: a block's run of units.
#[derive(Debug)]
struct Slot {
    /// Its first unit and its length (`2^order` units).
    unit: usize,
    order: u32,
    state: State,
    refs: u32,
    key: BlockKey,
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
    /// Fetched whole by [`Cache::fetch_first`] and not read yet.
    unread_whole: bool,
    /// When a reader last used it.
    used_at: Instant,
}

#[derive(Debug)]
struct Inner {
    /// Entries by slot number; `None`: a number free for the next entry (in `spare`).
    slots: Vec<Option<Slot>>,
    spare: Vec<usize>,
    map: HashMap<BlockKey, usize>,
    /// Entries by first unit (to find the entries of an aligned run).
    by_unit: BTreeMap<usize, usize>,
    space: Space,
    /// Bytes per unit.
    unit: usize,
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

/// How many evictable entries are looked at for a run before a reader waits instead.
const MAX_VICTIMS: usize = 256;

/// What a reader found.
enum Claim {
    /// Ready (slot, unit, length), and now held.
    Hit(usize, usize, usize),
    /// Being filled by another reader.
    Wait,
    /// Reserved for this reader to fill (slot, unit).
    Fill(usize, usize),
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
    /// Objects fetched whole by the request that revalidated or looked them up.
    pub whole_fetches: AtomicU64,
    /// Bytes fetched that way and never read: evicted unread, or the first part of an object
    /// that turned out larger than the bound.
    pub whole_fetch_waste: AtomicU64,
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
        out.value(c(
            "whole_fetches",
            "Small objects fetched whole by the request that looked them up or opened them.",
            load(&self.whole_fetches),
        ));
        out.value(c(
            "whole_fetch_waste_bytes",
            "Bytes of objects fetched whole that no reader read.",
            load(&self.whole_fetch_waste),
        ));
    }
}

pub struct Cache<S: ObjectStore> {
    /// Units of `part >> top` bytes.
    arena: Arena,
    /// The read part size: the largest block.
    part: usize,
    /// Numbers the placeholder keys of whole fetches in flight.
    placeholders: AtomicU64,
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
    unit: usize,
    len: usize,
    /// Release it as done with ([`Access::Once`]).
    once: bool,
}

impl<S: ObjectStore> BlockRef<S> {
    pub fn data(&self) -> &[u8] {
        // SAFETY: the entry is Ready and we hold a reference: no writer exists, and its run
        // (from `unit`, at least `len` bytes) stays its own while we do.
        unsafe { self.cache.arena.block_run(self.unit, self.len) }
    }
}

impl<S: ObjectStore> Drop for BlockRef<S> {
    fn drop(&mut self) {
        self.cache.release(self.slot, self.once);
    }
}

/// The page cache, as its setup errors name it.
const WHAT: &str = "page cache (--cache-size)";

impl<S: ObjectStore> Cache<S> {
    /// A cache of `blocks` read parts of `block_size` bytes, registered for RDMA when the mount
    /// uses it. `max_fetches` bounds the GETs in flight.
    pub fn new(
        s3: S,
        block_size: usize,
        blocks: usize,
        max_fetches: usize,
    ) -> Result<Cache<S>, SetupError> {
        let rdma = s3.rdma_mode() != RdmaMode::Off;
        let (unit, top) = space::unit_for(block_size);
        let units = blocks.checked_mul(1 << top).ok_or(SetupError::Size {
            what: WHAT,
            fix: "lower --cache-size",
        })?;
        let arena = Arena::new(unit, units, rdma, arena::CACHE_SLAB, block_size)
            .map_err(|e| e.named(WHAT))?;
        // Only RDMA pins the cache (over HTTP its pages come as blocks are first used).
        if rdma && !arena.pinned() {
            if s3.rdma_mode() == RdmaMode::Required {
                return Err(SetupError::Unpinned {
                    what: WHAT,
                    bytes: arena.len(),
                });
            }
            tracing::warn!(
                bytes = arena.len(),
                "cannot mlock the cache (RLIMIT_MEMLOCK too low?); it stays unpinned; raise ulimit -l or LimitMEMLOCK="
            );
        }
        if rdma && !arena.registered() && s3.rdma_mode() == RdmaMode::Required {
            return Err(SetupError::Unregistered { what: WHAT });
        }
        Ok(Cache {
            inner: Mutex::new(Inner::new(blocks, unit, top)),
            arena,
            part: block_size,
            placeholders: AtomicU64::new(0),
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

    /// The read part size: blocks are this long (less at the end of an object).
    pub fn block_size(&self) -> usize {
        self.part
    }

    /// Bytes held by blocks (holding data or being filled; each rounded up to its run of
    /// units), and entries.
    pub fn used(&self) -> (u64, usize) {
        let inner = self.lock();
        let free = inner.space.free_units() as u64;
        let all = self.arena.blocks() as u64;
        ((all - free) * inner.unit as u64, inner.map.len())
    }

    /// Report the cache's occupancy (space holding data or being filled, and all of it) in
    /// bytes, with its counters.
    pub fn report(&self, out: &mut dyn s3rdma_metrics::Sink) {
        use s3rdma_metrics::Value;
        let (used, entries) = self.used();
        out.value(Value::gauge(
            "cache_used_bytes",
            "Page cache space holding data or being filled, in bytes.",
            used,
        ));
        out.value(Value::gauge(
            "cache_entries",
            "Blocks in the page cache (a small file is one).",
            entries as u64,
        ));
        out.value(Value::gauge(
            "cache_capacity_bytes",
            "The page cache's size (--cache-size).",
            self.arena.len() as u64,
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
        // Taken out of the free space under the lock, given back without it (readers of
        // other blocks go on meanwhile), then free again.
        let runs = self.lock().detach_idle(before);
        let mut units: Vec<usize> = runs
            .iter()
            .flat_map(|&(u, o)| u..u + (1 << o))
            .filter(|&u| self.arena.holds_pages(u))
            .collect();
        units.sort_unstable();
        if units.is_empty() {
            let mut inner = self.lock();
            runs.into_iter().for_each(|(u, o)| inner.space.free(u, o));
            return 0;
        }
        // SAFETY: each unit is in a run taken out of the free space (no entry holds it), so
        // no one can claim it until the runs are freed below.
        let given = unsafe { self.arena.give_back_blocks(&units) };
        let mut inner = self.lock();
        runs.into_iter().for_each(|(u, o)| inner.space.free(u, o));
        drop(inner);
        let bytes = (given * self.arena.block_size()) as u64;
        self.stats.given_back.fetch_add(bytes, Ordering::Relaxed);
        bytes
    }

    /// Whether the block is cached (ready or being filled).
    pub fn contains(&self, key: &BlockKey) -> bool {
        self.lock().map.contains_key(key)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.locked()
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
        let block_ref = |slot, unit, len| BlockRef {
            cache: self.clone(),
            slot,
            unit,
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
                Claim::Hit(i, unit, len) => {
                    self.stats.hits.fetch_add(1, Ordering::Relaxed);
                    return Ok(Some(block_ref(i, unit, len)));
                }
                Claim::Present => return Ok(None),
                Claim::Fill(i, unit) => break (i, unit),
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
        let (slot, unit) = slot;
        let result = self.fill(unit, key, len).await;
        let ok = result.is_ok();
        self.lock().filled(slot, ok);
        self.filled.notify_waiters();
        if !ok {
            self.released.notify_waiters();
        }
        result.map(|()| Some(block_ref(slot, unit, len)))
    }

    async fn fill(&self, unit: usize, key: &BlockKey, len: usize) -> Result<(), S3Error> {
        let _permit = self.fetches.acquire().await.map_err(|_| {
            S3Error::new(
                S3ErrorKind::Other,
                "GetObject",
                &key.key,
                "cache is shutting down",
            )
        })?;
        let offset = key.index * self.part as u64;
        self.arena.prefault(unit, len);
        // SAFETY: the entry is Filling and we are its only holder until we mark it Ready; its
        // run from `unit` holds `len` bytes.
        let buf = unsafe { self.arena.block_mut_run(unit, len) };
        let result = match (self.s3.rdma_mode(), self.arena.registration_of(unit)) {
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

    /// One unconditional GET of the first bytes of `key` into cache space: when that is the
    /// whole object, it stays cached as the object's block 0 under the ETag the answer
    /// carried, so that the open and the reads that follow need no request. Returns what the
    /// answer says of the object, as HeadObject would. `expect` is the size last seen: the GET
    /// asks for the run of units that holds it (an object grown since up to that still comes
    /// whole), at most `max` bytes and a part. With no space free or evictable at once,
    /// HeadObject answers instead.
    pub async fn fetch_first(
        self: &Arc<Self>,
        key: &str,
        max: usize,
        expect: u64,
    ) -> Result<ObjectInfo, S3Error> {
        let unit = self.arena.block_size();
        let expect = usize::try_from(expect).unwrap_or(usize::MAX).min(self.part);
        let run = unit << space::order_for(expect, unit);
        let max = max.min(self.part).min(run);
        let n = self.placeholders.fetch_add(1, Ordering::Relaxed);
        let holder = BlockKey {
            key: key.into(),
            etag: Arc::from(""),
            index: u64::MAX - n,
        };
        let claim = self
            .lock()
            .claim(&holder, max, Access::Prefetch, &self.stats);
        let Claim::Fill(slot, unit) = claim else {
            return self.s3.head(key).await;
        };
        let result = self.fill_first(unit, key, max, expect).await;
        let kept = {
            let mut inner = self.lock();
            let kept = match &result {
                Ok((info, len)) => inner.keep_whole(slot, info, *len),
                Err(_) => false,
            };
            inner.filled(slot, kept);
            kept && inner.release(slot, false)
        };
        match &result {
            Ok(_) if kept => {
                self.stats.whole_fetches.fetch_add(1, Ordering::Relaxed);
            }
            Ok((info, len)) if info.size > *len as u64 => {
                let n = *len as u64;
                self.stats.whole_fetch_waste.fetch_add(n, Ordering::Relaxed);
            }
            _ => {}
        }
        self.released.notify_waiters();
        result.map(|(info, _)| info)
    }

    async fn fill_first(
        &self,
        unit: usize,
        key: &str,
        max: usize,
        expect: usize,
    ) -> Result<(ObjectInfo, usize), S3Error> {
        let _permit = self.fetches.acquire().await.map_err(|_| {
            S3Error::new(
                S3ErrorKind::Other,
                "GetObject",
                key,
                "cache is shutting down",
            )
        })?;
        self.arena.prefault(unit, expect.min(max));
        self.arena.note_used(unit, max);
        // SAFETY: the entry is Filling and we are its only holder until it is marked Ready or
        // freed; its run from `unit` holds `max` bytes.
        let buf = unsafe { self.arena.block_mut_run(unit, max) };
        match (self.s3.rdma_mode(), self.arena.registration_of(unit)) {
            (RdmaMode::Off, _) | (_, None) => self.s3.get_first(key, buf).await,
            (_, Some((reg, reg_offset))) => {
                // SAFETY: `buf` is exactly the run at `reg_offset` of its slab's registration,
                // and it is ours alone while Filling.
                let win = unsafe { RdmaWindow::new(reg, reg_offset, buf) };
                self.s3.get_first_rdma_window(key, win).await
            }
        }
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
    /// `parts` read parts of `unit << top` bytes.
    fn new(parts: usize, unit: usize, top: u32) -> Inner {
        let units = parts << top;
        Inner {
            slots: Vec::new(),
            spare: Vec::new(),
            map: HashMap::new(),
            by_unit: BTreeMap::new(),
            space: Space::new(parts, top),
            unit,
            lru: BTreeMap::new(),
            probation_clock: 0,
            behind_clock: BEHIND,
            clock: IN_USE,
            sketch: Sketch::new(units.min(parts.saturating_mul(64))),
        }
    }

    fn slot(&mut self, i: usize) -> &mut Slot {
        self.slots[i].as_mut().expect("a live cache entry")
    }

    /// Find the block, or reserve space to fill it into.
    fn claim(&mut self, key: &BlockKey, len: usize, access: Access, stats: &CacheStats) -> Claim {
        let prefetch = access == Access::Prefetch;
        if let Some(&i) = self.map.get(key) {
            let (state, unit, len) = {
                let s = self.slot(i);
                (s.state, s.unit, s.len)
            };
            return match state {
                State::Ready if prefetch => Claim::Present,
                State::Ready => {
                    self.acquire(i, access);
                    Claim::Hit(i, unit, len)
                }
                State::Filling if prefetch => Claim::Present,
                State::Filling => Claim::Wait,
            };
        }
        let order = space::order_for(len, self.unit);
        let Some((unit, admitted)) = self.take_room(key, order, prefetch, stats) else {
            return Claim::Full;
        };
        if !admitted {
            stats.not_admitted.fetch_add(1, Ordering::Relaxed);
        }
        let entry = Slot {
            unit,
            order,
            state: State::Filling,
            refs: 1,
            key: key.clone(),
            len,
            tick: None,
            unread_prefetch: prefetch,
            probation: !admitted,
            behind: false,
            done: false,
            unread_whole: false,
            used_at: Instant::now(),
        };
        let i = match self.spare.pop() {
            Some(i) => {
                self.slots[i] = Some(entry);
                i
            }
            None => {
                self.slots.push(Some(entry));
                self.slots.len() - 1
            }
        };
        self.map.insert(key.clone(), i);
        self.by_unit.insert(unit, i);
        Claim::Fill(i, unit)
    }

    /// A fill ended: the block is ready (held by its filler), or its space is free again.
    fn filled(&mut self, slot: usize, ok: bool) {
        if ok {
            self.slot(slot).state = State::Ready;
        } else {
            self.remove(slot);
        }
    }

    /// Take entry `slot` out of the cache and free its space.
    fn remove(&mut self, slot: usize) -> Slot {
        let s = self.slots[slot].take().expect("a live cache entry");
        if let Some(t) = s.tick {
            self.lru.remove(&t);
        }
        self.map.remove(&s.key);
        self.by_unit.remove(&s.unit);
        self.space.free(s.unit, s.order);
        self.spare.push(slot);
        s
    }

    /// A reader takes a ready block: no longer evictable. A second use of a block that was not
    /// admitted proves it worth keeping.
    fn acquire(&mut self, i: usize, access: Access) {
        let s = self.slot(i);
        s.refs += 1;
        if matches!(access, Access::Enter | Access::Once) && !s.unread_prefetch {
            s.probation = false;
        }
        if access != Access::Continue {
            s.behind = false;
            s.done = false;
        }
        s.unread_prefetch = false;
        s.unread_whole = false;
        if let Some(t) = s.tick.take() {
            self.lru.remove(&t);
        }
    }

    fn demote(&mut self, key: &BlockKey) {
        let Some(&i) = self.map.get(key) else { return };
        match self.slot(i).tick {
            // Held: placed when released.
            None => self.slot(i).behind = true,
            Some(t) if t >= IN_USE => {
                self.lru.remove(&t);
                self.place(i, true);
            }
            Some(_) => {}
        }
    }

    fn done_with(&mut self, key: &BlockKey) {
        let Some(&i) = self.map.get(key) else { return };
        let s = self.slot(i);
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
        let s = self.slot(slot);
        s.refs = s.refs.saturating_sub(1);
        s.done |= once;
        s.used_at = Instant::now();
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
        let (behind, probation) = {
            let s = self.slot(slot);
            (leave && !s.probation, leave && s.probation)
        };
        let clock = if probation {
            &mut self.probation_clock
        } else if behind {
            &mut self.behind_clock
        } else {
            &mut self.clock
        };
        *clock += 1;
        let t = *clock;
        self.slot(slot).tick = Some(t);
        self.lru.insert(t, slot);
    }

    /// For giving pages back: entries with no reader unused since `before` leave the cache
    /// (as an eviction would), and every free run is taken out of the free space. Returns
    /// those runs (the caller frees them again).
    fn detach_idle(&mut self, before: Instant) -> Vec<(usize, u32)> {
        let idle: Vec<usize> = self
            .lru
            .values()
            .copied()
            .filter(|&i| self.slots[i].as_ref().is_some_and(|s| s.used_at < before))
            .collect();
        for i in idle {
            self.remove(i);
        }
        self.space.take_all()
    }

    /// A free run of `2^order` units, evicting for it if need be, and whether `key` is
    /// admitted: a block fetched into a full cache is admitted only if the sketch rates it
    /// more popular than the first block it displaces (read-ahead counting the read to come).
    /// Victims go in eviction order; one shorter than the run goes with every entry in the
    /// aligned run around it, all idle (else the next victim is tried).
    fn take_room(
        &mut self,
        key: &BlockKey,
        order: u32,
        prefetch: bool,
        stats: &CacheStats,
    ) -> Option<(usize, bool)> {
        let mut victim_uses: Option<u8> = None;
        let mut after: Option<u64> = None;
        let mut looked = 0;
        loop {
            if let Some(unit) = self.space.alloc(order) {
                let uses = self.sketch.estimate(key).saturating_add(u8::from(prefetch));
                return Some((unit, victim_uses.is_none_or(|v| uses > v)));
            }
            let from = after.map_or(0, |t| t + 1);
            let (&tick, &i) = self.lru.range(from..).next()?;
            looked += 1;
            if looked > MAX_VICTIMS {
                return None;
            }
            let s = self.slots[i].as_ref().expect("a live cache entry");
            let o = order.max(s.order);
            let start = s.unit & !((1usize << o) - 1);
            let run: Vec<usize> = self
                .by_unit
                .range(start..start + (1 << o))
                .map(|(_, &j)| j)
                .collect();
            let idle = run
                .iter()
                .all(|&j| self.slots[j].as_ref().is_some_and(|s| s.tick.is_some()));
            if !idle {
                after = Some(tick);
                continue;
            }
            if victim_uses.is_none() {
                victim_uses = Some(self.sketch.estimate(&s.key));
            }
            for j in run {
                self.evict(j, stats);
            }
        }
    }

    fn evict(&mut self, slot: usize, stats: &CacheStats) {
        let s = self.remove(slot);
        if s.unread_prefetch && !s.unread_whole {
            stats.prefetch_waste.fetch_add(1, Ordering::Relaxed);
        }
        if s.unread_whole {
            stats
                .whole_fetch_waste
                .fetch_add(s.len as u64, Ordering::Relaxed);
        }
        stats.evictions.fetch_add(1, Ordering::Relaxed);
    }

    /// A whole fetch into `slot` (under a placeholder key) answered: keep its `len` bytes as
    /// block 0 of the version `info` names, shrinking its run to fit, if that is the whole
    /// object and no entry has that block already.
    fn keep_whole(&mut self, slot: usize, info: &ObjectInfo, len: usize) -> bool {
        let key = BlockKey {
            key: self.slot(slot).key.key.clone(),
            etag: info.etag.as_str().into(),
            index: 0,
        };
        if info.size != len as u64 || len == 0 || self.map.contains_key(&key) {
            return false;
        }
        let unit = self.unit;
        let s = self.slot(slot);
        let holder = std::mem::replace(&mut s.key, key.clone());
        let order = space::order_for(len, unit);
        let (first, from) = (s.unit, s.order);
        s.order = order;
        s.len = len;
        s.unread_whole = true;
        self.space.shrink(first, from, order);
        self.map.remove(&holder);
        self.map.insert(key, slot);
        true
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

#[cfg(test)]
mod space_tests {
    //! Small files at their size: the buddy-allocated cache over the in-memory store
    //! [S-CACHE-UNITS].

    use super::*;
    use s3rdma_client::testing::{MemStore, Op};

    const PART: usize = 1 << 20;
    const UNIT: usize = 16 << 10;

    fn setup(parts: usize) -> (tokio::runtime::Runtime, MemStore, Arc<Cache<MemStore>>) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let store = MemStore::new("b");
        let cache = Arc::new(Cache::new(store.clone(), PART, parts, 4).expect("cache"));
        (rt, store, cache)
    }

    fn body(len: usize, seed: usize) -> Vec<u8> {
        (0..len).map(|i| ((i * 7 + seed) % 251) as u8).collect()
    }

    /// Read block `index` of `name` (`len` bytes) and check its bytes.
    fn read(
        rt: &tokio::runtime::Runtime,
        c: &Arc<Cache<MemStore>>,
        name: &str,
        etag: &str,
        index: u64,
        want: &[u8],
    ) {
        let k = BlockKey {
            key: name.into(),
            etag: etag.into(),
            index,
        };
        let b = rt
            .block_on(c.get(&k, want.len(), Access::Once))
            .expect("get")
            .expect("a block");
        assert!(b.data() == want, "{name} block {index}");
    }

    #[test]
    fn small_files_take_space_near_their_size_and_stay_cached() {
        let (rt, store, cache) = setup(4);
        let files: Vec<(String, String, Vec<u8>)> = (0..40)
            .map(|i| {
                let (name, data) = (format!("f{i}"), body(16 << 10, i));
                let etag = store.put_external(&name, &data);
                (name, etag, data)
            })
            .collect();
        for (n, e, d) in &files {
            read(&rt, &cache, n, e, 0, d);
        }
        assert_eq!(cache.used(), (40 * UNIT as u64, 40), "one 16 KiB unit each");
        for (n, e, d) in &files {
            read(&rt, &cache, n, e, 0, d);
        }
        assert_eq!(store.requests(Op::Get), 40, "the second pass is all hits");
        // 200 KiB takes a run of 16 units (256 KiB).
        let mid = body(200 << 10, 1);
        let e = store.put_external("mid", &mid);
        read(&rt, &cache, "mid", &e, 0, &mid);
        assert_eq!(cache.used().0, 56 * UNIT as u64);
    }

    #[test]
    fn a_mix_of_small_files_and_parts_under_pressure_reads_right_and_never_overfills() {
        use rand::{Rng, SeedableRng};
        let (rt, store, cache) = setup(4);
        let big = body(6 * PART, 9);
        let big_etag = store.put_external("big", &big);
        // 25 small files take 45 units of the 64; a part takes 16.
        let small: Vec<(String, String, Vec<u8>)> = (0..25)
            .map(|i| {
                let len = [1usize, 16 << 10, 64 << 10, 100 << 10, 200 << 10][i % 5];
                let (name, data) = (format!("s{i}"), body(len, i));
                let etag = store.put_external(&name, &data);
                (name, etag, data)
            })
            .collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..2000 {
            if rng.gen_bool(0.1) {
                let i = rng.gen_range(0..6);
                read(
                    &rt,
                    &cache,
                    "big",
                    &big_etag,
                    i,
                    &big[i as usize * PART..(i as usize + 1) * PART],
                );
            } else {
                let (n, e, d) = &small[rng.gen_range(0..small.len())];
                read(&rt, &cache, n, e, 0, d);
            }
            let (used, _) = cache.used();
            assert!(used <= 4 * PART as u64, "{used} bytes used of {}", 4 * PART);
        }
        let s = &cache.stats;
        assert!(s.evictions.load(Ordering::Relaxed) > 0);
        assert!(
            s.hits.load(Ordering::Relaxed) > 500,
            "small files stay cached"
        );
        // Everything idle again: all of it can be given back, and then nothing.
        std::thread::sleep(Duration::from_millis(5));
        let given = cache.give_back_idle(Duration::from_millis(1));
        assert!(given > 0 && given <= 4 * PART as u64, "{given}");
        assert_eq!(cache.used(), (0, 0));
        assert_eq!(cache.give_back_idle(Duration::ZERO), 0);
        read(&rt, &cache, "big", &big_etag, 5, &big[5 * PART..]);
    }

    #[test]
    fn a_whole_fetch_answers_as_head_does_and_serves_the_reads_that_follow() {
        let (rt, store, cache) = setup(2);
        let data = body(20 << 10, 3);
        store.put_external("f", &data);
        let head = rt.block_on(store.head("f")).expect("head");
        let info = rt
            .block_on(cache.fetch_first("f", 256 << 10, 20 << 10))
            .expect("fetch");
        assert_eq!(
            (info.size, &info.etag, info.last_modified, &info.meta),
            (head.size, &head.etag, head.last_modified, &head.meta)
        );
        assert_eq!(store.requests(Op::Get), 1);
        read(&rt, &cache, "f", &info.etag, 0, &data);
        assert_eq!(
            store.requests(Op::Get),
            1,
            "the read was served from the fetch"
        );
        assert_eq!(cache.stats.whole_fetches.load(Ordering::Relaxed), 1);
        assert_eq!(
            cache.used(),
            (2 * UNIT as u64, 1),
            "shrunk to the run that holds it"
        );
        // A new version: fetched again, under its own ETag; the old block is never served
        // for it.
        let v2 = body(20 << 10, 4);
        let e2 = store.put_external("f", &v2);
        let info2 = rt
            .block_on(cache.fetch_first("f", 256 << 10, 20 << 10))
            .expect("fetch");
        assert_eq!(info2.etag, e2);
        read(&rt, &cache, "f", &e2, 0, &v2);
        assert_eq!(store.requests(Op::Get), 2);
        // Larger than the bound: its size is told, its first bytes are waste, nothing stays.
        store.put_external("large", &body(PART + 5, 1));
        let info = rt
            .block_on(cache.fetch_first("large", 256 << 10, 200 << 10))
            .expect("fetch");
        assert_eq!(info.size, PART as u64 + 5);
        assert_eq!(
            cache.stats.whole_fetch_waste.load(Ordering::Relaxed),
            256 << 10
        );
        assert_eq!(cache.used().1, 2);
        // An empty object, and a missing one.
        store.put_external("empty", b"");
        let info = rt
            .block_on(cache.fetch_first("empty", 256 << 10, 0))
            .expect("fetch");
        assert_eq!(info.size, 0);
        let e = rt
            .block_on(cache.fetch_first("missing", 256 << 10, 0))
            .expect_err("missing");
        assert_eq!(e.kind, S3ErrorKind::NotFound);
        assert_eq!(cache.used().1, 2);
        // Fetched whole and never read: waste once evicted.
        for i in 0..40 {
            store.put_external(&format!("u{i}"), &body(60 << 10, i));
            rt.block_on(cache.fetch_first(&format!("u{i}"), 256 << 10, 0))
                .expect("fetch");
        }
        assert!(cache.stats.whole_fetch_waste.load(Ordering::Relaxed) > 256 << 10);
    }
}
