//! The read path of one open file: ranged GETs pinned to the ETag seen at open, with sequential
//! read-ahead.
//!
//! The file is cut into parts of `part_size` bytes. A read that continues the previous one is
//! "sequential": it is served from whole parts, and the parts after it are fetched in the
//! background, the window doubling from one part up to `max_prefetch` bytes. A read anywhere else
//! resets the window and fetches exactly the bytes asked for. Concurrent readers of a part wait
//! on one fetch. Every GET carries `If-Match: <etag>`, so the bytes of one handle always come
//! from one version of the object; a replaced object makes the reads fail with ESTALE.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use tokio::runtime::Handle;
use tokio::sync::OnceCell;
use tokio::task::AbortHandle;

use crate::s3::{RdmaMode, S3Client, S3Error, S3ErrorKind};

/// Read-ahead tuning.
#[derive(Clone, Copy, Debug)]
pub struct ReadConfig {
    pub part_size: u64,
    /// The most bytes fetched ahead of a sequential reader.
    pub max_prefetch: u64,
}

type Slot = OnceCell<Result<Bytes, S3Error>>;

#[derive(Default)]
struct State {
    /// Parts fetched or being fetched, by part number.
    parts: BTreeMap<u64, Arc<Slot>>,
    /// Background fetches, aborted when the handle goes away.
    tasks: Vec<AbortHandle>,
    /// Where a sequential reader would read next.
    next_offset: u64,
    /// Parts to keep in flight ahead of the reader.
    window: u64,
}

/// One open file's view of one object version.
pub struct ObjectReader {
    s3: S3Client,
    rt: Handle,
    key: String,
    etag: String,
    size: u64,
    cfg: ReadConfig,
    state: Mutex<State>,
}

enum Plan {
    /// Serve from these parts (first part number, slots in order).
    Parts(u64, Vec<Arc<Slot>>),
    /// Fetch exactly the requested range.
    Direct,
}

impl ObjectReader {
    pub fn new(
        s3: S3Client,
        rt: Handle,
        key: String,
        etag: String,
        size: u64,
        cfg: ReadConfig,
    ) -> Self {
        let cfg = ReadConfig {
            part_size: cfg.part_size.max(4096),
            max_prefetch: cfg.max_prefetch,
        };
        ObjectReader {
            s3,
            rt,
            key,
            etag,
            size,
            cfg,
            state: Mutex::new(State::default()),
        }
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn etag(&self) -> &str {
        &self.etag
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Read up to `len` bytes at `offset` (fewer at the end of the object).
    pub async fn read(&self, offset: u64, len: u32) -> Result<Bytes, S3Error> {
        let end = self.size.min(offset.saturating_add(len as u64));
        if offset >= end {
            return Ok(Bytes::new());
        }
        match self.plan(offset, end) {
            Plan::Direct => {
                fetch(
                    self.s3.clone(),
                    self.key.clone(),
                    self.etag.clone(),
                    offset,
                    (end - offset) as usize,
                )
                .await
            }
            Plan::Parts(first, slots) => {
                let mut parts = Vec::with_capacity(slots.len());
                for (i, slot) in slots.iter().enumerate() {
                    let part = first + i as u64;
                    match self.fill(part, slot).await {
                        Ok(b) => parts.push(b),
                        Err(e) => {
                            self.forget(part, slot);
                            return Err(e);
                        }
                    }
                }
                Ok(self.assemble(first, &parts, offset, end))
            }
        }
    }

    /// Decide how to serve `[offset, end)`, and start the read-ahead.
    fn plan(&self, offset: u64, end: u64) -> Plan {
        let ps = self.cfg.part_size;
        let first = offset / ps;
        let last = (end - 1) / ps;
        let last_part = (self.size - 1) / ps;
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let cached = st.parts.contains_key(&first);
        // Forward within one part of where we expected counts as sequential: the kernel's
        // read-ahead issues requests slightly out of order.
        let sequential =
            offset >= st.next_offset.saturating_sub(ps) && offset <= st.next_offset + ps;
        st.next_offset = end;
        if !cached && !sequential {
            st.window = 0;
            st.parts.clear();
            return Plan::Direct;
        }
        if sequential {
            let max_window = (self.cfg.max_prefetch / ps).max(1);
            st.window = (st.window * 2).clamp(1, max_window);
        }
        // Drop parts the reader has left behind (keep one for small backward seeks).
        let keep_from = first.saturating_sub(1);
        st.parts = st.parts.split_off(&keep_from);
        st.tasks.retain(|t| !t.is_finished());
        let slots: Vec<Arc<Slot>> = (first..=last)
            .map(|p| st.parts.entry(p).or_default().clone())
            .collect();
        if sequential {
            let ahead_end = last_part.min(last + st.window);
            for p in last + 1..=ahead_end {
                if st.parts.contains_key(&p) {
                    continue;
                }
                let slot: Arc<Slot> = Arc::default();
                st.parts.insert(p, slot.clone());
                let (s3, key, etag) = (self.s3.clone(), self.key.clone(), self.etag.clone());
                let (start, len) = self.part_range(p);
                let task = self.rt.spawn(async move {
                    slot.get_or_init(|| fetch(s3, key, etag, start, len)).await;
                });
                st.tasks.push(task.abort_handle());
            }
        }
        Plan::Parts(first, slots)
    }

    async fn fill(&self, part: u64, slot: &Slot) -> Result<Bytes, S3Error> {
        let (start, len) = self.part_range(part);
        slot.get_or_init(|| {
            fetch(
                self.s3.clone(),
                self.key.clone(),
                self.etag.clone(),
                start,
                len,
            )
        })
        .await
        .clone()
    }

    /// A failed part is not kept: the next read retries it.
    fn forget(&self, part: u64, slot: &Arc<Slot>) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.parts.get(&part).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            st.parts.remove(&part);
        }
    }

    fn part_range(&self, part: u64) -> (u64, usize) {
        let start = part * self.cfg.part_size;
        let len = self.cfg.part_size.min(self.size - start);
        (start, len as usize)
    }

    fn assemble(&self, first: u64, parts: &[Bytes], offset: u64, end: u64) -> Bytes {
        let ps = self.cfg.part_size;
        let base = first * ps;
        if parts.len() == 1 {
            return parts[0].slice((offset - base) as usize..(end - base) as usize);
        }
        let mut out = BytesMut::with_capacity((end - offset) as usize);
        for (i, part) in parts.iter().enumerate() {
            let pstart = base + i as u64 * ps;
            let from = offset.max(pstart) - pstart;
            let to = end.min(pstart + part.len() as u64) - pstart;
            out.extend_from_slice(&part[from as usize..to as usize]);
        }
        out.freeze()
    }
}

impl Drop for ObjectReader {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        for t in st.tasks.drain(..) {
            t.abort();
        }
    }
}

/// GET one range: over RDMA into a freshly registered buffer when the mount uses RDMA, else
/// over HTTP into plain memory.
async fn fetch(
    s3: S3Client,
    key: String,
    etag: String,
    start: u64,
    len: usize,
) -> Result<Bytes, S3Error> {
    let (s3r, keyr, etagr) = (&s3, &key, &etag);
    let http = || async move {
        let mut buf = vec![0u8; len];
        s3r.get_range_into(keyr, etagr, start, &mut buf)
            .await
            .map(|()| Bytes::from(buf))
    };
    let result = if s3.rdma_mode() == RdmaMode::Off {
        http().await
    } else {
        match cuobj_ffi::RegisteredBuffer::new(len) {
            Ok(mut buf) => s3
                .get_range_rdma(&key, &etag, start, &mut buf)
                .await
                .map(|()| Bytes::from_owner(buf)),
            Err(e) if s3.rdma_mode() == RdmaMode::Required => Err(S3Error::new(
                S3ErrorKind::RdmaDeclined,
                "GetObject",
                &key,
                e.to_string(),
            )),
            Err(e) => {
                tracing::warn!(key, error = %e, "cannot register a read buffer; reading over HTTP");
                http().await
            }
        }
    };
    match result {
        Ok(b) => Ok(b),
        // The version this handle pinned is gone either way: deleted reads like replaced.
        Err(mut e) if e.kind == S3ErrorKind::NotFound => {
            e.kind = S3ErrorKind::PreconditionFailed;
            e.message = format!("object deleted since it was opened ({})", e.message);
            Err(e)
        }
        Err(e) => Err(e),
    }
}
