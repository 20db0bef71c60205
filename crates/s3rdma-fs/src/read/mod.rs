//! The read path of one open file: blocks of the shared page cache, pinned to the ETag seen at
//! open, with sequential read-ahead.
//!
//! A read that continues the previous one is "sequential": it is served from cache blocks (one
//! `--read-part-size` ranged GET each, over RDMA into the registered block when the mount uses
//! RDMA), and the blocks after it are fetched in the background, the window doubling from one
//! block up to `--max-prefetch` bytes. A read anywhere else is served from the cache if its
//! block is there; otherwise, in a file larger than one block, it fetches exactly the bytes
//! asked for (over HTTP) and resets the window. Every GET carries `If-Match: <etag>`, and the
//! cache is keyed by ETag, so one handle's bytes always come from one version of the object.

use s3rdma_proto::sync::Lock;
use std::sync::{Arc, Mutex};

use tokio::runtime::Handle;

use crate::cache::{Access, BlockKey, BlockRef, Cache};
use crate::diskcache::DiskCache;
use s3rdma_client::{ObjectStore, S3Error, S3ErrorKind};

/// Read-ahead tuning.
#[derive(Clone, Copy, Debug)]
pub struct ReadConfig {
    pub part_size: u64,
    /// The most bytes fetched ahead of a sequential reader.
    pub max_prefetch: u64,
}

#[derive(Default)]
struct State {
    /// Where a sequential reader would read next.
    next_offset: u64,
    /// Blocks to keep in flight ahead of the reader.
    window: u64,
    /// Read-ahead has been started for blocks below this one.
    prefetched_to: u64,
    /// The last block of the previous read (a read that starts elsewhere enters a block).
    last_block: Option<u64>,
}

/// What a read returns: a slice of a cache block (held while the reply is sent), or bytes of
/// its own.
pub enum ReadData<S: ObjectStore> {
    Block(BlockRef<S>, usize, usize),
    Owned(Vec<u8>),
}

impl<S: ObjectStore> ReadData<S> {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            ReadData::Block(b, from, to) => &b.data()[*from..*to],
            ReadData::Owned(v) => v,
        }
    }
}

/// One open file's view of one object version.
pub struct ObjectReader<S: ObjectStore> {
    cache: Arc<Cache<S>>,
    s3: S,
    rt: Handle,
    key: Arc<str>,
    etag: Arc<str>,
    size: u64,
    max_window: u64,
    state: Mutex<State>,
    /// Blocks read from S3 are offered to the disk cache.
    disk: Option<Arc<DiskCache>>,
    /// The handle is open in the kernel's cached mode (see fs::PassState).
    cached_mode: bool,
    /// When the handle was opened, until its first read has been answered.
    opened: std::time::Instant,
    first_read_done: std::sync::atomic::AtomicBool,
}

impl<S: ObjectStore> ObjectReader<S> {
    pub fn new(
        cache: Arc<Cache<S>>,
        s3: S,
        rt: Handle,
        key: &str,
        etag: &str,
        size: u64,
        cfg: ReadConfig,
    ) -> Self {
        let bs = cache.block_size() as u64;
        ObjectReader {
            max_window: (cfg.max_prefetch / bs).max(1),
            cache,
            s3,
            rt,
            key: key.into(),
            etag: etag.into(),
            size,
            state: Mutex::new(State::default()),
            disk: None,
            cached_mode: false,
            opened: std::time::Instant::now(),
            first_read_done: Default::default(),
        }
    }

    /// When the handle was opened, the first time this is asked (after its first read); then
    /// None (one relaxed load per read after that).
    pub fn first_read(&self) -> Option<std::time::Instant> {
        use std::sync::atomic::Ordering;
        if self.first_read_done.load(Ordering::Relaxed)
            || self.first_read_done.swap(true, Ordering::Relaxed)
        {
            return None;
        }
        Some(self.opened)
    }

    pub fn with_disk_cache(mut self, disk: Option<Arc<DiskCache>>) -> Self {
        self.disk = disk;
        self
    }

    pub fn with_cached_mode(mut self, cached_mode: bool) -> Self {
        self.cached_mode = cached_mode;
        self
    }

    pub fn cached_mode(&self) -> bool {
        self.cached_mode
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    fn block_key(&self, index: u64) -> BlockKey {
        BlockKey {
            key: self.key.clone(),
            etag: self.etag.clone(),
            index,
        }
    }

    fn block_len(&self, index: u64) -> usize {
        let bs = self.cache.block_size() as u64;
        bs.min(self.size - index * bs) as usize
    }

    /// Read up to `len` bytes at `offset` (fewer at the end of the object).
    pub async fn read(&self, offset: u64, len: u32) -> Result<ReadData<S>, S3Error> {
        let end = self.size.min(offset.saturating_add(len as u64));
        if offset >= end {
            return Ok(ReadData::Owned(Vec::new()));
        }
        let bs = self.cache.block_size() as u64;
        let (first, last) = (offset / bs, (end - 1) / bs);
        let (sequential, entered_block) = {
            let mut st = self.state.locked();
            // Forward within one block of where we expected counts as sequential: the kernel's
            // read-ahead issues requests slightly out of order.
            let seq = offset >= st.next_offset.saturating_sub(bs) && offset <= st.next_offset + bs;
            st.next_offset = end;
            if seq {
                st.window = (st.window * 2).clamp(1, self.max_window);
                let last_block = (self.size - 1) / bs;
                let from = st.prefetched_to.max(last + 1);
                let to = last_block.min(last + st.window);
                for index in from..=to {
                    self.spawn_prefetch(index);
                }
                st.prefetched_to = st.prefetched_to.max(to + 1);
            } else {
                st.window = 0;
                st.prefetched_to = 0;
            }
            let entered = st.last_block != Some(first);
            st.last_block = Some(last);
            (seq, entered)
        };
        if sequential && entered_block && first >= 2 {
            // Two blocks behind a sequential reader: done with (one is kept for small
            // backward seeks).
            self.cache.demote(&self.block_key(first - 2));
        }
        // How this read uses its first block; later blocks of a read are always entered.
        let access = match (sequential, entered_block) {
            (false, _) => Access::Once,
            (true, true) => Access::Enter,
            (true, false) => Access::Continue,
        };
        let at_end = sequential && end == self.size;
        if !sequential
            && self.size > bs
            && first == last
            && !self.cache.contains(&self.block_key(first))
        {
            // A seek in a large file: exactly the bytes asked for.
            let mut buf = vec![0u8; (end - offset) as usize];
            self.s3
                .get_range_into(&self.key, &self.etag, offset, &mut buf)
                .await
                .map_err(S3Error::pinned_gone)?;
            return Ok(ReadData::Owned(buf));
        }
        if first == last {
            let b = self.block(first, access).await?;
            if at_end {
                // The reader is done with the file (a block not admitted goes first).
                self.cache.done_with(&self.block_key(last));
            }
            let base = first * bs;
            return Ok(ReadData::Block(
                b,
                (offset - base) as usize,
                (end - base) as usize,
            ));
        }
        // Across blocks: hold one block at a time, so that a tiny cache cannot deadlock.
        let mut out = Vec::with_capacity((end - offset) as usize);
        for index in first..=last {
            let access = match access {
                Access::Continue if index > first => Access::Enter,
                a => a,
            };
            let b = self.block(index, access).await?;
            let base = index * bs;
            let from = offset.max(base) - base;
            let to = end.min(base + b.data().len() as u64) - base;
            out.extend_from_slice(&b.data()[from as usize..to as usize]);
        }
        if at_end {
            self.cache.done_with(&self.block_key(last));
        }
        Ok(ReadData::Owned(out))
    }

    async fn block(&self, index: u64, access: Access) -> Result<BlockRef<S>, S3Error> {
        let key = self.block_key(index);
        match self.cache.get(&key, self.block_len(index), access).await? {
            Some(b) => {
                // Once per entry into a block: the reads that continue in it (a 1 MiB kernel
                // read at a time) would only find it offered already.
                if let (Some(d), false) = (&self.disk, access == Access::Continue) {
                    d.offer(&self.key, &self.etag, self.size, index, b.data());
                }
                Ok(b)
            }
            None => Err(S3Error::new(
                S3ErrorKind::Other,
                "GetObject",
                &self.key,
                "cache returned no block",
            )),
        }
    }

    fn spawn_prefetch(&self, index: u64) {
        let cache = self.cache.clone();
        let key = self.block_key(index);
        let len = self.block_len(index);
        let (disk, size) = (self.disk.clone(), self.size);
        // Read-ahead is best effort: it never waits for room, and a failure is left for the
        // reader to meet (and report) when it gets there.
        self.rt.spawn(async move {
            match cache.get(&key, len, Access::Prefetch).await {
                Ok(Some(b)) => {
                    if let Some(d) = &disk {
                        d.offer(&key.key, &key.etag, size, key.index, b.data());
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::debug!(key = %key.key, block = key.index, error = %e, "read-ahead failed")
                }
            }
        });
    }
}
