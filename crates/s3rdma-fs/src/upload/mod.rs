//! Writing a file: its bytes fill part-size chunks of the pinned, registered write pool; a full
//! chunk is uploaded as a multipart part (RDMA or HTTP, with CRC64NVME) as soon as the next byte
//! arrives, while the file is still being written, with at most `--upload-concurrency` parts in
//! flight for the whole mount. Committing (close, fsync) uploads the last part and completes
//! the upload; a file that never filled a part is one PutObject. Every failure aborts the
//! multipart upload (after the parts in flight have ended, so none is left behind) and is
//! returned by the next write and by the commit: nothing is ever stored under the key unless
//! every byte was.
//!
//! Part sizes: parts 1–1000 are one block (`--write-part-size`), and the size doubles every
//! 1000 parts up to the largest power-of-two run that leaves room for a second part in the pool
//! (and at most 5 GiB), so that S3's 10,000-part limit allows very large files
//! ([`Uploader::max_file_size`]).

pub mod pool;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::runtime::Handle;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use pool::{Chunk, WritePool};
use s3rdma_client::{
    Condition, FileMeta, ObjectInfo, ObjectStore, PutSource, S3Error, S3ErrorKind,
};

/// S3's limit on the parts of one upload.
pub const MAX_PARTS: i32 = 10_000;
/// Parts of one size before the size doubles.
pub const PARTS_PER_SIZE: i32 = 1_000;
/// S3's largest part.
pub const MAX_PART_BYTES: u64 = 5 << 30;
/// S3's smallest part (but the last).
pub const MIN_PART_BYTES: u64 = 5 << 20;

/// Counters, readable by the user.
#[derive(Debug, Default)]
pub struct UploadStats {
    pub objects_written: AtomicU64,
    pub bytes_written: AtomicU64,
    pub parts_uploaded: AtomicU64,
    pub uploads_failed: AtomicU64,
    pub uploads_aborted: AtomicU64,
    pub parts_in_flight: AtomicU64,
    /// Aborts of failed uploads still being retried in the background (the endpoint was down).
    pub aborts_pending: AtomicU64,
}

/// What every file being written shares: the pool, the upload slots, the client.
pub struct Uploader<S: ObjectStore> {
    pub(crate) s3: S,
    pub(crate) rt: Handle,
    pub(crate) pool: Arc<WritePool>,
    /// Upload slots shared by every file of the mount (`--upload-concurrency`).
    pub(crate) permits: Arc<Semaphore>,
    pub(crate) max_blocks: usize,
    pub stats: UploadStats,
}

impl<S: ObjectStore> Uploader<S> {
    pub fn new(s3: S, rt: Handle, pool: Arc<WritePool>, concurrency: usize) -> Self {
        let block = pool.block_size() as u64;
        let mut max_blocks = 1usize;
        while max_blocks * 2 <= (pool.blocks() / 2).max(1)
            && (max_blocks as u64 * 2) * block <= MAX_PART_BYTES
        {
            max_blocks *= 2;
        }
        Uploader {
            s3,
            rt,
            pool,
            permits: Arc::new(Semaphore::new(concurrency.max(1))),
            max_blocks,
            stats: UploadStats::default(),
        }
    }

    /// Blocks in part `n` (1-based).
    pub fn blocks_for_part(&self, n: i32) -> usize {
        let doublings = ((n.max(1) - 1) / PARTS_PER_SIZE).min(30) as u32;
        (1usize << doublings).min(self.max_blocks)
    }

    /// The write buffers.
    pub fn pool(&self) -> Arc<WritePool> {
        self.pool.clone()
    }

    /// The largest file this mount can write: 10,000 parts of the growing sizes.
    pub fn max_file_size(&self) -> u64 {
        let block = self.pool.block_size() as u64;
        (1..=MAX_PARTS)
            .map(|n| self.blocks_for_part(n) as u64 * block)
            .sum()
    }

    /// Start writing `key`, to carry the attributes `meta` (nothing is sent until a part fills
    /// or the file is committed).
    pub fn start(self: &Arc<Self>, key: &str, cond: Condition, meta: FileMeta) -> Upload<S> {
        Upload {
            up: self.clone(),
            key: key.into(),
            cond,
            meta,
            meta_sent: None,
            target: None,
            size: 0,
            chunk: None,
            fill: 0,
            next_part: 1,
            upload_id: None,
            tasks: Vec::new(),
            done: Vec::new(),
            state: State::Open,
            discarded: false,
        }
    }

    /// Wait (at most `limit`) for the aborts being retried in the background; returns how many
    /// are still pending.
    pub async fn wait_for_aborts(&self, limit: Duration) -> u64 {
        let end = Instant::now() + limit;
        loop {
            let n = self.stats.aborts_pending.load(Ordering::Relaxed);
            if n == 0 || Instant::now() >= end {
                return n;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The uploader's counters (see [`s3rdma_metrics::Report`]).
    pub fn report(&self, out: &mut dyn s3rdma_metrics::Sink) {
        use s3rdma_metrics::{load, Value};
        let (c, g) = (Value::counter, Value::gauge);
        let s = &self.stats;
        out.value(c(
            "objects_written",
            "Files stored by the streaming write path.",
            load(&s.objects_written),
        ));
        out.value(c(
            "bytes_written",
            "Bytes stored by the streaming write path.",
            load(&s.bytes_written),
        ));
        out.value(c(
            "parts_uploaded",
            "Multipart parts uploaded.",
            load(&s.parts_uploaded),
        ));
        out.value(g(
            "parts_in_flight",
            "Multipart parts being uploaded now.",
            load(&s.parts_in_flight),
        ));
        out.value(c(
            "uploads_failed",
            "Uploads that failed (the error went to close or fsync).",
            load(&s.uploads_failed),
        ));
        out.value(c(
            "uploads_aborted",
            "Multipart uploads aborted.",
            load(&s.uploads_aborted),
        ));
        out.value(g(
            "aborts_pending",
            "Multipart uploads whose abort has not succeeded yet.",
            load(&s.aborts_pending),
        ));
        out.value(c(
            "write_waits",
            "Writes that waited for a free part buffer.",
            load(&self.pool.stats.waits),
        ));
        out.value(c(
            "write_overflow",
            "Part buffers taken beyond the write pool (small files).",
            load(&self.pool.stats.overflow),
        ));
    }
}

/// Why a write or a commit failed.
#[derive(Clone, Debug)]
pub enum WriteError {
    /// An S3 request failed (after its retries).
    S3(S3Error),
    /// `If-None-Match: *` failed: someone else created the key since this file was created.
    Exists(S3Error),
    /// `If-Match` failed: the object changed since this file was opened for writing.
    Changed(S3Error),
    /// A write somewhere other than the end: S3 objects are written front to back.
    NotSequential { expected: u64, got: u64 },
    /// Past the 10,000th part.
    TooLarge { limit: u64 },
    /// A write after the file was committed by fsync.
    Committed,
    /// No memory for a write buffer.
    Memory(String),
    /// The mount shut down while the file was still open for writing.
    Shutdown(String),
    /// The handle went on as a staged file (it was written out of order or truncated).
    Staged,
    /// The file was unlinked while open: nothing was stored, as asked.
    Unlinked,
}

impl crate::errno::ToErrno for WriteError {
    fn to_errno(&self) -> i32 {
        match self {
            WriteError::S3(e) => match e.kind {
                S3ErrorKind::AccessDenied
                | S3ErrorKind::BadCredentials
                | S3ErrorKind::NoCredentials => libc::EACCES,
                S3ErrorKind::Unsupported => libc::EOPNOTSUPP,
                _ => libc::EIO,
            },
            WriteError::Exists(_) => libc::EEXIST,
            WriteError::Changed(_) => libc::ESTALE,
            WriteError::NotSequential { .. } => libc::EINVAL,
            WriteError::TooLarge { .. } => libc::EFBIG,
            WriteError::Committed => libc::EOPNOTSUPP,
            WriteError::Memory(_) => libc::ENOMEM,
            WriteError::Shutdown(_) => libc::EIO,
            WriteError::Staged => libc::EBADF,
            WriteError::Unlinked => libc::ENOENT,
        }
    }
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteError::S3(e) => write!(f, "{e}"),
            WriteError::Exists(e) => write!(f, "another client created the key while this file was written ({e}); nothing was stored"),
            WriteError::Changed(e) => write!(f, "the object was replaced or deleted since this file was opened for writing ({e}); nothing was stored"),
            WriteError::NotSequential { expected, got } => write!(f, "write at offset {got}, but S3 objects are written sequentially and the next byte is at {expected}; the upload is abandoned (write files front to back, e.g. without seeking back)"),
            WriteError::TooLarge { limit } => write!(f, "file exceeds the largest object this mount can write ({limit} bytes = 10,000 parts); raise --write-part-size or --write-buffer-size"),
            WriteError::Committed => write!(f, "the file was completed by fsync; S3 objects cannot be appended to, so write it again with O_TRUNC"),
            WriteError::Memory(e) => write!(f, "no memory for a write buffer: {e}"),
            WriteError::Shutdown(why) => write!(f, "{why}; the upload was aborted and nothing was stored (close files before unmounting, or allow more time with --shutdown-grace)"),
            WriteError::Staged => write!(f, "the file went on as a staged file"),
            WriteError::Unlinked => write!(f, "the file was removed while open; nothing was stored"),
        }
    }
}

#[derive(Clone, Debug)]
enum State {
    Open,
    Committed(ObjectInfo),
    Failed(WriteError),
}

type PartResult = Result<(i32, String), S3Error>;

/// One file being written.
pub struct Upload<S: ObjectStore> {
    up: Arc<Uploader<S>>,
    key: Arc<str>,
    cond: Condition,
    /// The attributes the object is to carry (changed by setattr while writing).
    meta: FileMeta,
    /// What CreateMultipartUpload carried (a multipart object's metadata is fixed there).
    meta_sent: Option<FileMeta>,
    /// Where the file goes instead of `key` (renamed while written).
    target: Option<Arc<str>>,
    size: u64,
    chunk: Option<Chunk>,
    fill: usize,
    next_part: i32,
    upload_id: Option<Arc<str>>,
    tasks: Vec<JoinHandle<PartResult>>,
    done: Vec<(i32, String)>,
    state: State,
    /// Unlinked while open: its commit stores nothing (see [`Upload::discard`]).
    discarded: bool,
}

impl<S: ObjectStore> Upload<S> {
    /// Bytes accepted so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The key the file is being written to.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Give up on an open file: nothing is stored, its multipart upload is aborted, and `e`
    /// is what its later writes and its close return.
    pub async fn cancel(&mut self, e: WriteError) {
        if self.is_open() {
            self.fail(e).await;
        }
    }

    /// What the file's commit stored, once it has.
    pub fn committed(&self) -> Option<&ObjectInfo> {
        match &self.state {
            State::Committed(info) => Some(info),
            _ => None,
        }
    }

    pub fn is_open(&self) -> bool {
        matches!(self.state, State::Open)
    }

    /// Attributes set while the file is written (chmod, chown, utimes on it).
    pub fn set_meta(&mut self, m: &FileMeta) {
        self.meta = self.meta.merged(m);
    }

    /// The file was unlinked while open: writes go on being taken, and its commit stores
    /// nothing (a multipart upload already begun is aborted) and fails with
    /// [`WriteError::Unlinked`], which the file system answers as a success.
    pub fn discard(&mut self) {
        self.discarded = true;
    }

    /// Whether the file was unlinked while open.
    pub fn is_discarded(&self) -> bool {
        self.discarded
    }

    /// Store the file under `key` instead (a rename while it is written). Nothing is stored
    /// under the old key: a single PUT goes straight to the new key; a multipart upload (bound
    /// to the old key) is completed there, copied to the new key and deleted. An old version
    /// the file was replacing is deleted as well, as a rename leaves nothing behind.
    pub fn retarget(&mut self, key: &str) {
        self.target = Some(key.into());
    }

    /// Append `data`, which must start at the end of what was written.
    pub async fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), WriteError> {
        match &self.state {
            State::Open => {}
            State::Committed(_) => {
                warn!(key = %self.key, offset, "{}", WriteError::Committed);
                return Err(WriteError::Committed);
            }
            State::Failed(e) => return Err(e.clone()),
        }
        let mut data = data;
        if offset != self.size {
            match self.patch(offset, data) {
                Some(rest) => data = rest,
                None => {
                    let e = WriteError::NotSequential {
                        expected: self.size,
                        got: offset,
                    };
                    // Nothing sent yet: the caller may go on with a staged file instead.
                    if self.upload_id.is_none() {
                        return Err(e);
                    }
                    return Err(self.fail(e).await);
                }
            }
        }
        if let Err(e) = self.reap().await {
            return Err(self.fail(e).await);
        }
        let mut rest = data;
        while !rest.is_empty() {
            if self
                .chunk
                .as_ref()
                .is_some_and(|c| self.fill == c.capacity())
            {
                if let Err(e) = self.submit().await {
                    return Err(self.fail(e).await);
                }
            }
            if self.chunk.is_none() {
                if self.next_part > MAX_PARTS {
                    let e = WriteError::TooLarge {
                        limit: self.up.max_file_size(),
                    };
                    return Err(self.fail(e).await);
                }
                let k = self.up.blocks_for_part(self.next_part);
                match self.up.pool.take(k).await {
                    Ok(c) => self.chunk = Some(c),
                    Err(e) => return Err(self.fail(WriteError::Memory(e)).await),
                }
                self.fill = 0;
            }
            let Some(chunk) = self.chunk.as_mut() else {
                continue;
            };
            let n = rest.len().min(chunk.capacity() - self.fill);
            chunk.as_mut_slice()[self.fill..self.fill + n].copy_from_slice(&rest[..n]);
            self.fill += n;
            self.size += n as u64;
            rest = &rest[n..];
        }
        Ok(())
    }

    /// A write that is not at the end but lands in the part still being filled (a seek back
    /// to fill in a header, or a short hole): done in place. Returns what is left to append at
    /// the end, or `None` if the write reaches bytes already sent (or past the part).
    fn patch<'d>(&mut self, offset: u64, data: &'d [u8]) -> Option<&'d [u8]> {
        let fill = self.fill;
        let chunk = self.chunk.as_mut()?;
        let start = self.size - fill as u64;
        if offset < start {
            return None;
        }
        let at = (offset - start) as usize;
        if offset < self.size {
            let n = data.len().min(fill - at);
            chunk.as_mut_slice()[at..at + n].copy_from_slice(&data[..n]);
            return Some(&data[n..]);
        }
        // A hole within the part: zeros, then the write appends.
        if at >= chunk.capacity() {
            return None;
        }
        chunk.as_mut_slice()[fill..at].fill(0);
        self.fill = at;
        self.size = offset;
        Some(data)
    }

    /// Hand over a file that has sent nothing yet, to go on as a staged file: its bytes, the
    /// condition it was to be stored under, its attributes and key. The upload ends here.
    pub fn take_unsent(&mut self) -> Option<(Vec<u8>, Condition, FileMeta, String)> {
        if !self.is_open() || self.upload_id.is_some() {
            return None;
        }
        let bytes = match self.chunk.as_mut() {
            Some(c) => c.as_mut_slice()[..self.fill].to_vec(),
            None => Vec::new(),
        };
        self.chunk = None;
        self.state = State::Failed(WriteError::Staged);
        let key = self.target.as_deref().unwrap_or(&self.key).to_string();
        let cond = match &self.target {
            Some(_) => Condition::None,
            None => self.cond.clone(),
        };
        Some((bytes, cond, self.meta.clone(), key))
    }

    /// Send the current chunk as the next part (starting the multipart upload first).
    async fn submit(&mut self) -> Result<(), WriteError> {
        let upload_id = match &self.upload_id {
            Some(id) => id.clone(),
            None => {
                let id: Arc<str> = self
                    .up
                    .s3
                    .create_multipart_with(&self.key, &self.meta)
                    .await
                    .map_err(WriteError::S3)?
                    .into();
                debug!(key = %self.key, upload_id = %id, "multipart upload started");
                self.upload_id = Some(id.clone());
                self.meta_sent = Some(self.meta.clone());
                id
            }
        };
        let Some(chunk) = self.chunk.take() else {
            return Ok(());
        };
        let part = chunk.into_part(self.fill);
        self.fill = 0;
        let n = self.next_part;
        self.next_part += 1;
        let (s3, key, permits) = (
            self.up.s3.clone(),
            self.key.clone(),
            self.up.permits.clone(),
        );
        let up = self.up.clone();
        self.tasks.push(self.up.rt.spawn(async move {
            let _permit = permits.acquire_owned().await;
            up.stats.parts_in_flight.fetch_add(1, Ordering::Relaxed);
            let r = s3.upload_part(&key, &upload_id, n, part.source()).await;
            up.stats.parts_in_flight.fetch_sub(1, Ordering::Relaxed);
            if r.is_ok() {
                up.stats.parts_uploaded.fetch_add(1, Ordering::Relaxed);
            }
            drop(part);
            r.map(|etag| (n, etag))
        }));
        Ok(())
    }

    /// Collect the parts that have finished; the first failure is returned.
    async fn reap(&mut self) -> Result<(), WriteError> {
        let mut i = 0;
        while i < self.tasks.len() {
            if self.tasks[i].is_finished() {
                let t = self.tasks.swap_remove(i);
                self.done.push(join(t).await.map_err(WriteError::S3)?);
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// Wait for every part in flight; the first failure is returned (after all have ended).
    async fn drain(&mut self) -> Result<(), WriteError> {
        let mut first = None;
        for t in std::mem::take(&mut self.tasks) {
            match join(t).await {
                Ok(p) => self.done.push(p),
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        match first {
            Some(e) => Err(WriteError::S3(e)),
            None => Ok(()),
        }
    }

    /// Give up: wait for the parts in flight, abort the multipart upload, remember `e`.
    async fn fail(&mut self, e: WriteError) -> WriteError {
        let _ = self.drain().await;
        self.chunk = None;
        if let Some(id) = self.upload_id.take() {
            abort(&self.up, &self.key, &id).await;
        }
        self.up.stats.uploads_failed.fetch_add(1, Ordering::Relaxed);
        warn!(key = %self.key, size = self.size, error = %e, "write failed; nothing was stored under the key");
        self.state = State::Failed(e.clone());
        e
    }

    /// The commit of a file unlinked while open: nothing stored, a multipart upload aborted.
    async fn drop_unlinked(&mut self) -> WriteError {
        let _ = self.drain().await;
        self.chunk = None;
        if let Some(id) = self.upload_id.take() {
            abort(&self.up, &self.key, &id).await;
        }
        debug!(key = %self.key, size = self.size, "unlinked while open: nothing stored");
        self.state = State::Failed(WriteError::Unlinked);
        WriteError::Unlinked
    }

    /// Store the file: the last part and CompleteMultipartUpload, or one PutObject. Returns
    /// what was stored; committing again returns the same (or the same error).
    pub async fn commit(&mut self) -> Result<ObjectInfo, WriteError> {
        match &self.state {
            State::Open => {}
            State::Committed(info) => return Ok(info.clone()),
            State::Failed(e) => return Err(e.clone()),
        }
        if self.discarded {
            return Err(self.drop_unlinked().await);
        }
        let stored = match self.upload_id.clone() {
            None => self.put_whole().await,
            Some(id) => match self.complete(&id).await {
                Ok(r) => r,
                Err(e) => return Err(self.fail(e).await),
            },
        };
        let stored = match (stored, self.target.clone(), self.upload_id.is_some()) {
            // Completed under the old key: move it where it was renamed to.
            (Ok(etag), Some(target), true) => self.move_completed(etag, &target).await,
            (r, _, _) => r,
        };
        let stored = match stored {
            Ok(etag) if etag.is_empty() => self.confirm_stored().await,
            r => r,
        };
        match stored {
            Ok(etag) => Ok(self.stored(etag).await),
            Err(e) => {
                let e = self.write_error(e);
                Err(self.fail(e).await)
            }
        }
    }

    /// A file that never began a multipart upload: one PutObject, conditional as opened (or,
    /// renamed while written, unconditional under the new name, the old one then deleted).
    async fn put_whole(&mut self) -> Result<String, S3Error> {
        let chunk = self.chunk.take();
        let part = chunk.map(|c| c.into_part(self.fill));
        let src = match &part {
            Some(p) => p.source(),
            None => PutSource::Plain(&[]),
        };
        let Some(target) = self.target.clone() else {
            let put = self
                .up
                .s3
                .put_object_if(&self.key, src, &self.cond, &self.meta);
            return put.await;
        };
        let r = self
            .up
            .s3
            .put_object_if(&target, src, &Condition::None, &self.meta)
            .await;
        if r.is_ok() {
            self.drop_replaced().await;
        }
        r
    }

    /// The last part, then CompleteMultipartUpload of upload `id` (its answer); a part that
    /// failed is the error.
    async fn complete(&mut self, id: &str) -> Result<Result<String, S3Error>, WriteError> {
        if self.fill > 0 {
            self.submit().await?;
        }
        self.drain().await?;
        self.done.sort_unstable_by_key(|(n, _)| *n);
        let done = self
            .up
            .s3
            .complete_multipart_if(&self.key, id, &self.done, &self.cond)
            .await;
        Ok(match done {
            // HTTP 200 with a body that could not be read: the upload may well be complete;
            // the server knows.
            Err(e) if e.status == Some(200) && self.target.is_none() => {
                warn!(key = %self.key, error = %e, "unreadable answer to CompleteMultipartUpload");
                Ok(String::new())
            }
            r => r,
        })
    }

    /// The file is stored as `etag`: what it is (attributes set after the multipart upload
    /// began go on by a copy onto itself), counted.
    async fn stored(&mut self, etag: String) -> ObjectInfo {
        self.upload_id = None;
        let mut info = ObjectInfo {
            key: self.target.as_deref().unwrap_or(&self.key).to_string(),
            size: self.size,
            etag,
            last_modified: SystemTime::now(),
            meta: Some(self.meta_sent.clone().unwrap_or_else(|| self.meta.clone())),
        };
        if info.meta.as_ref() != Some(&self.meta) {
            let copy = self
                .up
                .s3
                .copy_object(&info, &info.key, &self.meta, MAX_PART_BYTES);
            match copy.await {
                Ok(etag) => {
                    info.etag = etag;
                    info.meta = Some(self.meta.clone());
                }
                Err(e) => {
                    warn!(key = %self.key, error = %e, "the file is stored, but the attributes set while it was written (mode, owner, times) could not be")
                }
            }
        }
        let stats = &self.up.stats;
        stats.objects_written.fetch_add(1, Ordering::Relaxed);
        stats.bytes_written.fetch_add(self.size, Ordering::Relaxed);
        debug!(key = %self.key, size = self.size, parts = self.done.len(), "object stored");
        self.state = State::Committed(info.clone());
        info
    }

    /// What a failed store means for the writer, by the condition it was made on.
    fn write_error(&self, e: S3Error) -> WriteError {
        match (&self.cond, e.kind) {
            (Condition::IfNoneMatch, S3ErrorKind::PreconditionFailed) => WriteError::Exists(e),
            // Replaced (412), or deleted (S3 answers a conditional PUT of a missing key with
            // 404).
            (Condition::IfMatch(_), S3ErrorKind::PreconditionFailed | S3ErrorKind::NotFound) => {
                WriteError::Changed(e)
            }
            _ => WriteError::S3(e),
        }
    }

    /// After a renamed file is stored: delete the version it was replacing under the old key.
    async fn drop_replaced(&self) {
        if let Condition::IfMatch(_) = self.cond {
            if let Err(e) = self.up.s3.delete_object(&self.key).await {
                warn!(key = %self.key, error = %e, "the file was renamed while written; the old version under its first name could not be deleted");
            }
        }
    }

    /// A multipart upload completed under the old key (ETag `etag`): copy it to `target`,
    /// delete the old key. Returns the new ETag.
    async fn move_completed(&mut self, etag: String, target: &str) -> Result<String, S3Error> {
        let at_old = ObjectInfo {
            key: self.key.to_string(),
            size: self.size,
            etag,
            last_modified: SystemTime::now(),
            meta: None,
        };
        let new = self
            .up
            .s3
            .copy_object(&at_old, target, &self.meta, MAX_PART_BYTES)
            .await?;
        self.meta_sent = Some(self.meta.clone());
        if let Err(e) = self.up.s3.delete_object(&self.key).await {
            warn!(key = %self.key, to = target, error = %e, "the file was renamed while written and stored under its new name; its first name could not be deleted");
        }
        Ok(new)
    }

    /// The write was answered with success but no ETag (a body that could not be read, or a
    /// server that left the header out): ask the server what is under the key now. It is taken
    /// as ours only if its size is the size written; otherwise the write fails.
    async fn confirm_stored(&self) -> Result<String, S3Error> {
        let key = self.target.as_deref().unwrap_or(&self.key);
        warn!(
            key,
            "the server confirmed the write without an ETag; checking the object with HEAD"
        );
        let info = self.up.s3.head(key).await?;
        // A multipart object's ETag ends in "-<parts>" (AWS, MinIO, Ceph, SeaweedFS).
        let parts_match = self.done.is_empty()
            || info
                .etag
                .trim_matches('"')
                .ends_with(&format!("-{}", self.done.len()));
        if info.size != self.size || info.etag.is_empty() || !parts_match {
            return Err(S3Error::new(
                S3ErrorKind::BadResponse,
                "CompleteMultipartUpload",
                key,
                format!(
                    "the server's answer could not be read, and the object now under the key is not the file as written ({} bytes, ETag {:?}; {} bytes in {} parts were written)",
                    info.size, info.etag, self.size, self.done.len()
                ),
            ));
        }
        Ok(info.etag)
    }

    /// Abandon the file (nothing is stored): for a handle dropped without a commit.
    pub async fn abandon(&mut self) {
        if self.is_open() {
            let _ = self.drain().await;
            self.chunk = None;
            if let Some(id) = self.upload_id.take() {
                abort(&self.up, &self.key, &id).await;
            }
            self.state = State::Failed(WriteError::S3(S3Error::new(
                S3ErrorKind::Other,
                "Write",
                &self.key,
                "abandoned",
            )));
        }
    }
}

impl<S: ObjectStore> Drop for Upload<S> {
    fn drop(&mut self) {
        // A multipart upload must never be left behind: abort it once its parts have ended.
        if let Some(id) = self.upload_id.take() {
            let (up, key, tasks) = (
                self.up.clone(),
                self.key.clone(),
                std::mem::take(&mut self.tasks),
            );
            self.up.rt.spawn(async move {
                for t in tasks {
                    let _ = t.await;
                }
                abort(&up, &key, &id).await;
            });
        }
    }
}

async fn join(t: JoinHandle<PartResult>) -> PartResult {
    t.await.unwrap_or_else(|e| {
        Err(S3Error::new(
            S3ErrorKind::Other,
            "UploadPart",
            "",
            format!("upload task ended: {e}"),
        ))
    })
}

/// How long an abort that fails for a passing reason (the endpoint down, 5xx, throttling) is
/// retried in the background after the request's own attempts are spent.
const ABORT_PERSIST: Duration = Duration::from_secs(600);

/// AbortMultipartUpload, retried like any request. When the endpoint is unreachable or failing
/// (the usual reason the upload failed in the first place), the abort goes on in the background
/// with backoff for up to `ABORT_PERSIST`, so an outage does not leave the upload's parts
/// behind; `s3rdma stats` counts those still pending, and unmounting waits for them a while.
async fn abort<S: ObjectStore>(up: &Arc<Uploader<S>>, key: &str, upload_id: &str) {
    match up.s3.abort_multipart(key, upload_id).await {
        Ok(()) => aborted(up, key, upload_id),
        Err(e) if e.kind == S3ErrorKind::NotFound => {
            debug!(key, upload_id, "multipart upload already gone")
        }
        Err(e) if transient(&e) => {
            warn!(key, upload_id, error = %e, "cannot abort the multipart upload now; retrying in the background");
            up.stats.aborts_pending.fetch_add(1, Ordering::Relaxed);
            let (up2, key, id) = (up.clone(), key.to_string(), upload_id.to_string());
            up.rt.spawn(async move {
                let start = Instant::now();
                let mut wait = Duration::from_millis(500);
                let last = loop {
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(10));
                    match up2.s3.abort_multipart(&key, &id).await {
                        Ok(()) => {
                            aborted(&up2, &key, &id);
                            break None;
                        }
                        Err(e) if e.kind == S3ErrorKind::NotFound => break None,
                        Err(e) if transient(&e) && start.elapsed() < ABORT_PERSIST => {}
                        Err(e) => break Some(e),
                    }
                };
                if let Some(e) = last {
                    orphaned(&key, &id, &e);
                }
                up2.stats.aborts_pending.fetch_sub(1, Ordering::Relaxed);
            });
        }
        Err(e) => orphaned(key, upload_id, &e),
    }
}

fn transient(e: &S3Error) -> bool {
    matches!(
        e.kind,
        S3ErrorKind::ServerError
            | S3ErrorKind::Throttled
            | S3ErrorKind::Unreachable
            | S3ErrorKind::Timeout
    )
}

fn aborted<S: ObjectStore>(up: &Uploader<S>, key: &str, upload_id: &str) {
    up.stats.uploads_aborted.fetch_add(1, Ordering::Relaxed);
    debug!(key, upload_id, "multipart upload aborted");
}

fn orphaned(key: &str, upload_id: &str, e: &S3Error) {
    warn!(
        key,
        upload_id,
        error = %e,
        "cannot abort the multipart upload; its parts stay billed until aborted (aws s3api abort-multipart-upload) or removed by a bucket lifecycle rule"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_sizes_grow_to_reach_large_files() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let s3 = s3rdma_client::testing::MemStore::new("b");
        let pool = Arc::new(WritePool::new(16 << 20, 16, false).unwrap());
        let up = Uploader::new(s3.clone(), rt.handle().clone(), pool, 4);
        assert_eq!(up.blocks_for_part(1), 1);
        assert_eq!(up.blocks_for_part(1000), 1);
        assert_eq!(up.blocks_for_part(1001), 2);
        assert_eq!(up.blocks_for_part(3001), 8);
        // Capped at half the pool: 8 blocks of 16 MiB.
        assert_eq!(up.blocks_for_part(9000), 8);
        let gib = up.max_file_size() >> 30;
        assert!((980..=990).contains(&gib), "{gib} GiB");
        // A pool of two blocks cannot grow parts: 10,000 × the part size.
        let small = Uploader::new(
            s3,
            rt.handle().clone(),
            Arc::new(WritePool::new(8 << 20, 2, false).unwrap()),
            1,
        );
        assert_eq!(small.max_file_size(), 10_000 * (8 << 20));
    }
}
