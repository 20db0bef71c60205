//! One staged file: a local, sparse copy of a file being changed in ways an S3 object cannot
//! be written (in place, out of order, appended, truncated), shared by every handle of its
//! inode, and stored as a new version at `fsync` and close.
//!
//! Its bytes are those of a *base* version on the server (the object as it was at open,
//! pinned by ETag, or the last version this file stored), changed by the writes since: ranges
//! of the base are fetched only when read (`If-Match`), written ranges are tracked, and a
//! commit sends only what changed — small results as one PutObject, large ones as a multipart
//! upload that copies unchanged units from the base on the server (see `plan`). Every commit
//! is conditional on the base's ETag (`If-None-Match: *` for a file never stored); if the
//! object changed meanwhile, the bytes are moved to the staging area's `conflicts/` and the
//! commit fails with `ESTALE`: nothing is overwritten, nothing is lost.

use s3rdma_proto::sync::Lock;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use tracing::{debug, error, warn};

use super::area::{Label, StagingArea};
use super::plan::{self, Part};
use super::ranges::RangeSet;
use crate::errno::ToErrno;
use crate::upload::Uploader;
use s3rdma_client::{
    Condition, FileMeta, ObjectInfo, ObjectStore, PutSource, S3Error, S3ErrorKind,
};

/// Reads of the base fetch whole aligned runs of this size (clipped to what is missing).
const FETCH_ALIGN: u64 = 1 << 20;

/// Why an operation on a staged file failed.
#[derive(Clone, Debug)]
pub enum StageError {
    /// The staging area is full (`--staging-size`) or its disk is.
    Full,
    /// The local staging file could not be read or written.
    Io(String),
    /// The object changed (or was deleted or created) on the server since it was opened: the
    /// bytes are kept in the conflicts directory. `exists`: a new file found the key taken.
    Conflict { exists: bool },
    /// An S3 request failed (after its retries); the bytes are still staged.
    S3(S3Error),
    /// Past what 10,000 parts can hold.
    TooLarge,
}

impl crate::errno::ToErrno for StageError {
    fn to_errno(&self) -> i32 {
        match self {
            StageError::Full => libc::ENOSPC,
            StageError::Io(_) => libc::EIO,
            StageError::Conflict { exists: true } => libc::EEXIST,
            StageError::Conflict { exists: false } => libc::ESTALE,
            StageError::S3(e) => e.to_errno(),
            StageError::TooLarge => libc::EFBIG,
        }
    }
}

impl std::fmt::Display for StageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StageError::Full => write!(f, "the staging area is full; raise --staging-size or give a --staging-dir with more room"),
            StageError::Io(e) => write!(f, "the staging file failed: {e}"),
            StageError::Conflict { .. } => write!(f, "the object changed on the server since this file was opened; its bytes were kept in the staging directory's conflicts/"),
            StageError::S3(e) => write!(f, "{e}"),
            StageError::TooLarge => write!(f, "the file is larger than 10,000 parts can hold; raise --write-part-size"),
        }
    }
}

/// The version a staged file starts from.
#[derive(Clone, Debug)]
struct Base {
    key: String,
    etag: String,
    size: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Life {
    Live,
    /// Removed from the namespace while open: nothing is stored any more.
    Unlinked,
    /// Its bytes went to conflicts/: every operation fails with this errno.
    Failed(i32),
}

struct Inner {
    id: u64,
    file: Arc<File>,
    key: String,
    base: Option<Base>,
    /// The base's bytes are valid below this (a truncation shortens it).
    base_limit: u64,
    size: u64,
    /// Bytes held in the staging file (written, or fetched from the base).
    present: RangeSet,
    /// Bytes written since the base.
    dirty: RangeSet,
    meta: FileMeta,
    meta_dirty: bool,
    cond: Condition,
    /// Bytes of the staging area this file holds.
    charged: u64,
    life: Life,
    mtime: SystemTime,
}

pub struct StagedFile<S: ObjectStore> {
    area: Arc<StagingArea>,
    up: Arc<Uploader<S>>,
    inner: Mutex<Inner>,
}

/// What `stat` shows of a staged file.
pub struct StagedStat {
    pub size: u64,
    pub mtime: SystemTime,
    pub meta: FileMeta,
}

impl<S: ObjectStore> StagedFile<S> {
    /// Stage `key`: starting from `base` (the object as opened; `None`: an empty new file) and
    /// stored under `cond`.
    pub fn new(
        area: Arc<StagingArea>,
        up: Arc<Uploader<S>>,
        key: &str,
        base: Option<&ObjectInfo>,
        cond: Condition,
        meta: FileMeta,
    ) -> Result<Self, StageError> {
        let label = Label {
            bucket: up.s3.bucket(),
            key,
            base_etag: base.map_or("", |b| &b.etag),
        };
        let (id, file) = area.create(&label).map_err(io_error)?;
        let size = base.map_or(0, |b| b.size);
        if let Err(e) = file.set_len(size) {
            area.remove(id, 0);
            return Err(io_error(e));
        }
        Ok(StagedFile {
            area,
            up,
            inner: Mutex::new(Inner {
                id,
                file: Arc::new(file),
                key: key.to_string(),
                base: base.map(|b| Base {
                    key: b.key.clone(),
                    etag: b.etag.clone(),
                    size: b.size,
                }),
                base_limit: size,
                size,
                present: RangeSet::default(),
                dirty: RangeSet::default(),
                meta,
                meta_dirty: false,
                cond,
                charged: 0,
                life: Life::Live,
                mtime: SystemTime::now(),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.locked()
    }

    pub fn stat(&self) -> StagedStat {
        let i = self.lock();
        StagedStat {
            size: i.size,
            mtime: i.mtime,
            meta: i.meta.clone(),
        }
    }

    pub fn key(&self) -> String {
        self.lock().key.clone()
    }

    /// Whether the file has changes not stored yet.
    pub fn is_dirty(&self) -> bool {
        let i = self.lock();
        i.life == Life::Live && i.needs_commit()
    }

    /// The base's ETag and key, if the file has one on the server.
    pub fn base(&self) -> Option<(String, String)> {
        self.lock()
            .base
            .as_ref()
            .map(|b| (b.key.clone(), b.etag.clone()))
    }

    /// Up to `len` bytes at `offset`.
    // The file's state is held while its base is fetched: one operation at a time per file.
    // The future is never spawned; it runs on the FUSE thread that serves the read.
    #[allow(clippy::await_holding_lock)]
    pub async fn read(&self, offset: u64, len: u32) -> Result<Vec<u8>, StageError> {
        let mut i = self.lock();
        i.live()?;
        let end = i.size.min(offset.saturating_add(len as u64));
        if offset >= end {
            return Ok(Vec::new());
        }
        let mut out = vec![0u8; (end - offset) as usize];
        // Base bytes not held yet: fetched in aligned runs, kept when the area has room.
        let mut overlays = Vec::new();
        for m in i.present.missing(offset..end.min(i.base_limit)) {
            let a = m.start / FETCH_ALIGN * FETCH_ALIGN;
            let b = (m.end.div_ceil(FETCH_ALIGN) * FETCH_ALIGN).min(i.base_limit);
            let mut buf = vec![0u8; (b - a) as usize];
            self.fetch(&i, a, &mut buf).await?;
            for gap in i.present.missing(a..b) {
                let bytes = &buf[(gap.start - a) as usize..(gap.end - a) as usize];
                let n = gap.end - gap.start;
                if self.area.charge(n) {
                    if i.file.write_all_at(bytes, gap.start).is_ok() {
                        i.present.insert(gap.clone());
                        i.charged += n;
                        continue;
                    }
                    self.area.uncharge(n);
                }
                overlays.push((gap.start, bytes.to_vec()));
            }
        }
        read_full_at(&i.file, &mut out, offset).map_err(io_error)?;
        for (at, bytes) in overlays {
            overlay(&mut out, offset, at, &bytes);
        }
        Ok(out)
    }

    async fn fetch(&self, i: &Inner, offset: u64, buf: &mut [u8]) -> Result<(), StageError> {
        let Some(base) = &i.base else {
            return Ok(());
        };
        let r = self
            .up
            .s3
            .get_range_into(&base.key, &base.etag, offset, buf)
            .await;
        match r {
            Ok(()) => {
                self.area
                    .stats
                    .bytes_fetched
                    .fetch_add(buf.len() as u64, Ordering::Relaxed);
                Ok(())
            }
            Err(e) if changed(&e) => {
                warn!(key = %i.key, "the object changed on the server since it was opened; its old bytes cannot be read (ESTALE)");
                Err(StageError::Conflict { exists: false })
            }
            Err(e) => Err(StageError::S3(e)),
        }
    }

    /// Write `data` at `offset` (anywhere: a hole reads as zeros).
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), StageError> {
        let mut i = self.lock();
        i.live()?;
        let end = offset + data.len() as u64;
        if end > self.up.max_file_size() {
            return Err(StageError::TooLarge);
        }
        let r = offset..end;
        let new: u64 = i
            .present
            .missing(r.clone())
            .iter()
            .map(|m| m.end - m.start)
            .sum();
        if !self.area.charge(new) {
            return Err(self.give_up_full(&mut i));
        }
        if let Err(e) = i.file.write_all_at(data, offset) {
            self.area.uncharge(new);
            if matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)) {
                self.area.stats.full.fetch_add(1, Ordering::Relaxed);
                return Err(self.give_up_full(&mut i));
            }
            return Err(io_error(e));
        }
        i.charged += new;
        i.present.insert(r.clone());
        i.dirty.insert(r);
        i.size = i.size.max(end);
        i.mtime = SystemTime::now();
        Ok(())
    }

    /// A write found the staging area full: the file can no longer be stored whole, so it is
    /// not stored at all. What it holds goes to conflicts/; every later operation (its close
    /// included) fails with ENOSPC.
    fn give_up_full(&self, i: &mut Inner) -> StageError {
        let charged = std::mem::take(&mut i.charged);
        let label = i.label(self.up.s3.bucket());
        let path = self.area.keep(
            i.id,
            charged,
            &label,
            "the staging area was full: the file is incomplete and was not stored",
        );
        error!(key = %i.key, limit = self.area.limit(), path = %path.display(), "the staging area is full: the file was NOT stored (nothing partial is); what was written is kept at this path; raise --staging-size or give a --staging-dir with more room");
        i.life = Life::Failed(libc::ENOSPC);
        StageError::Full
    }

    /// `truncate` to `n` bytes (longer: zeros).
    pub fn truncate(&self, n: u64) -> Result<(), StageError> {
        let mut i = self.lock();
        i.live()?;
        if n > self.up.max_file_size() {
            return Err(StageError::TooLarge);
        }
        i.file.set_len(n).map_err(io_error)?;
        if n < i.size {
            let freed = i.present.truncate(n);
            i.dirty.truncate(n);
            i.base_limit = i.base_limit.min(n);
            i.charged -= freed;
            self.area.uncharge(freed);
        }
        i.size = n;
        i.mtime = SystemTime::now();
        Ok(())
    }

    /// Attributes set on the file (chmod, chown, utimes): stored with the next commit.
    pub fn set_meta(&self, change: &FileMeta) {
        let mut i = self.lock();
        let merged = i.meta.merged(change);
        if merged != i.meta {
            i.meta = merged;
            i.meta_dirty = true;
        }
    }

    /// The file now lives under `key` (renamed). `base`: where its base version now is on the
    /// server (moved along by the rename), if it has one. `cond`: what the next commit needs.
    pub fn moved(&self, key: &str, base: Option<(String, String)>, cond: Condition) {
        let mut i = self.lock();
        i.key = key.to_string();
        if let (Some(b), Some((bkey, etag))) = (i.base.as_mut(), base) {
            b.key = bkey;
            b.etag = etag;
        }
        i.cond = cond;
    }

    /// Removed from the namespace: nothing is stored from now on.
    pub fn unlink(&self) {
        let mut i = self.lock();
        if i.life == Life::Live {
            i.life = Life::Unlinked;
        }
    }

    /// The last handle is gone: a file with changes that could not be stored keeps its bytes
    /// in conflicts/ (with `why`); otherwise the staging file is removed.
    pub fn finish(&self, why: Option<&str>) {
        let mut i = self.lock();
        let charged = std::mem::take(&mut i.charged);
        match i.life {
            Life::Failed(_) => return,
            Life::Live if i.needs_commit() => {
                let label = i.label(self.up.s3.bucket());
                let why = why.unwrap_or("its last version could not be stored");
                let path = self.area.keep(i.id, charged, &label, why);
                error!(key = %i.key, path = %path.display(), reason = why, "a staged file was closed with changes that were not stored; its bytes were kept");
            }
            _ => self.area.remove(i.id, charged),
        }
        i.life = Life::Failed(libc::EBADF);
    }

    /// Store the file's current bytes and attributes as a new version (if anything changed).
    /// Returns what was stored.
    // Held while the file is stored, as `read` holds it.
    #[allow(clippy::await_holding_lock)]
    pub async fn commit(&self) -> Result<Option<ObjectInfo>, StageError> {
        let mut i = self.lock();
        match i.life {
            Life::Live => {}
            Life::Unlinked => return Ok(None),
            Life::Failed(e) => return Err(errno_error(e)),
        }
        if !i.needs_commit() {
            return Ok(None);
        }
        let block = self.up.pool.block_size() as u64;
        let unit =
            plan::unit_for(i.size, block, self.up.max_blocks as u64).ok_or(StageError::TooLarge)?;
        let limit = if i.base.is_some() { i.base_limit } else { 0 };
        let parts = plan::compose(i.size, limit, &i.dirty, unit);
        let result = self.store(&i, &parts, unit).await;
        match result {
            Ok(info) => {
                let sent: u64 = parts
                    .iter()
                    .filter(|p| matches!(p, Part::Send(_)))
                    .map(|p| p.range().end - p.range().start)
                    .sum();
                let st = &self.area.stats;
                st.commits.fetch_add(1, Ordering::Relaxed);
                st.bytes_sent.fetch_add(sent, Ordering::Relaxed);
                st.bytes_copied.fetch_add(i.size - sent, Ordering::Relaxed);
                self.up
                    .stats
                    .objects_written
                    .fetch_add(1, Ordering::Relaxed);
                self.up
                    .stats
                    .bytes_written
                    .fetch_add(sent, Ordering::Relaxed);
                debug!(key = %i.key, size = i.size, sent, parts = parts.len(), "staged file stored");
                i.base = Some(Base {
                    key: info.key.clone(),
                    etag: info.etag.clone(),
                    size: info.size,
                });
                i.base_limit = info.size;
                i.dirty.clear();
                i.meta_dirty = false;
                i.cond = Condition::IfMatch(info.etag.clone());
                Ok(Some(info))
            }
            Err(e) if changed(&e) => {
                let exists = matches!(i.cond, Condition::IfNoneMatch);
                let charged = std::mem::take(&mut i.charged);
                let label = i.label(self.up.s3.bucket());
                let why = if exists {
                    "another client created the key after this file was created here"
                } else {
                    "the object changed on the server after this file was opened"
                };
                let path = self.area.keep(i.id, charged, &label, why);
                self.area.stats.conflicts.fetch_add(1, Ordering::Relaxed);
                let err = StageError::Conflict { exists };
                i.life = Life::Failed(err.to_errno());
                error!(key = %i.key, path = %path.display(), "{why}: NOT stored, so as not to overwrite it; the bytes written here were kept at this path");
                Err(err)
            }
            Err(e) => {
                warn!(key = %i.key, error = %e, "storing the staged file failed; its bytes stay staged and the next fsync or close tries again");
                Err(StageError::S3(e))
            }
        }
    }

    /// Send `parts` of the file: one PutObject, one CopyObject, or a multipart upload.
    async fn store(&self, i: &Inner, parts: &[Part], unit: u64) -> Result<ObjectInfo, S3Error> {
        let s3 = &self.up.s3;
        let base = i.base.as_ref();
        let etag = match parts {
            [] => {
                s3.put_object_if(&i.key, PutSource::Plain(&[]), &i.cond, &i.meta)
                    .await?
            }
            // Only the attributes (or nothing) changed: a copy onto itself.
            [Part::Copy(r)] if base.is_some_and(|b| r.end == b.size && b.key == i.key) => {
                let b = base
                    .map(|b| b.info())
                    .unwrap_or_else(|| unreachable_base(&i.key));
                s3.copy_object(&b, &i.key, &i.meta, 5 << 30).await?
            }
            [Part::Send(r)] => {
                let part = self.assemble(i, r.clone(), unit).await?;
                s3.put_object_if(&i.key, part.source(), &i.cond, &i.meta)
                    .await?
            }
            _ => self.multipart(i, parts, unit).await?,
        };
        let etag = if etag.is_empty() {
            s3.head(&i.key).await?.etag
        } else {
            etag
        };
        Ok(ObjectInfo {
            key: i.key.clone(),
            size: i.size,
            etag,
            last_modified: SystemTime::now(),
            meta: Some(i.meta.clone()),
        })
    }

    async fn multipart(&self, i: &Inner, parts: &[Part], unit: u64) -> Result<String, S3Error> {
        let s3 = &self.up.s3;
        let id = s3.create_multipart_with(&i.key, &i.meta).await?;
        let mut set = tokio::task::JoinSet::new();
        let mut done = Vec::with_capacity(parts.len());
        let mut first_err = None;
        for (n, part) in parts.iter().enumerate() {
            let n = n as i32 + 1;
            // Collect what has finished; stop sending after a failure.
            while let Some(r) = set.try_join_next() {
                collect(r, &mut done, &mut first_err);
            }
            if first_err.is_some() {
                break;
            }
            match part {
                Part::Copy(r) => {
                    let Some(b) = i.base.clone() else { break };
                    let permit = self.up.permits.clone().acquire_owned().await;
                    let (s3, key, id, r) = (s3.clone(), i.key.clone(), id.clone(), r.clone());
                    set.spawn(async move {
                        let _permit = permit;
                        s3.upload_part_copy(&key, &id, n, &b.key, &b.etag, r)
                            .await
                            .map(|e| (n, e))
                    });
                }
                Part::Send(r) => {
                    // The buffer first, then the upload slot: a slot is never held while
                    // waiting for write-pool memory that uploads waiting for slots hold.
                    let filled = match self.assemble(i, r.clone(), unit).await {
                        Ok(p) => p,
                        Err(e) => {
                            first_err = Some(e);
                            break;
                        }
                    };
                    let permit = self.up.permits.clone().acquire_owned().await;
                    let (s3, key, id) = (s3.clone(), i.key.clone(), id.clone());
                    set.spawn(async move {
                        let _permit = permit;
                        s3.upload_part(&key, &id, n, filled.source())
                            .await
                            .map(|e| (n, e))
                    });
                }
            }
        }
        while let Some(r) = set.join_next().await {
            collect(r, &mut done, &mut first_err);
        }
        let result = match first_err {
            Some(e) => Err(e),
            None => {
                done.sort_unstable_by_key(|(n, _)| *n);
                s3.complete_multipart_if(&i.key, &id, &done, &i.cond).await
            }
        };
        if result.is_err() {
            if let Err(e) = s3.abort_multipart(&i.key, &id).await {
                warn!(key = %i.key, upload_id = %id, error = %e, "cannot abort the multipart upload of a staged file");
            } else {
                self.up
                    .stats
                    .uploads_aborted
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        result
    }

    /// The bytes of `r` in a write-pool chunk (registered: sent over RDMA when on): from the
    /// staging file, with the base's bytes it does not hold fetched in.
    async fn assemble(
        &self,
        i: &Inner,
        r: Range<u64>,
        unit: u64,
    ) -> Result<crate::upload::pool::Part, S3Error> {
        let k = (unit / self.up.pool.block_size() as u64).max(1) as usize;
        let mut chunk = self.up.pool.take(k).await.map_err(|e| {
            S3Error::new(
                S3ErrorKind::Other,
                "UploadPart",
                &i.key,
                format!("no memory for a part: {e}"),
            )
        })?;
        let len = (r.end - r.start) as usize;
        let buf = &mut chunk.as_mut_slice()[..len];
        read_full_at(&i.file, buf, r.start).map_err(|e| {
            S3Error::new(
                S3ErrorKind::Other,
                "UploadPart",
                &i.key,
                format!("reading the staging file: {e}"),
            )
        })?;
        if let Some(b) = &i.base {
            for m in i.present.missing(r.start..r.end.min(i.base_limit)) {
                let at = (m.start - r.start) as usize;
                let dst = &mut buf[at..at + (m.end - m.start) as usize];
                self.up
                    .s3
                    .get_range_into(&b.key, &b.etag, m.start, dst)
                    .await?;
                self.area
                    .stats
                    .bytes_fetched
                    .fetch_add(m.end - m.start, Ordering::Relaxed);
            }
        }
        Ok(chunk.into_part(len))
    }
}

impl<S: ObjectStore> Drop for StagedFile<S> {
    fn drop(&mut self) {
        let i = self.lock();
        let live = i.life != Life::Failed(libc::EBADF);
        drop(i);
        if live {
            self.finish(None);
        }
    }
}

impl Inner {
    fn live(&self) -> Result<(), StageError> {
        match self.life {
            Life::Failed(e) => Err(errno_error(e)),
            _ => Ok(()),
        }
    }

    fn needs_commit(&self) -> bool {
        match &self.base {
            None => true,
            Some(b) => {
                !self.dirty.is_empty()
                    || self.meta_dirty
                    || self.size != b.size
                    || self.base_limit < b.size
            }
        }
    }

    fn label<'a>(&'a self, bucket: &'a str) -> Label<'a> {
        Label {
            bucket,
            key: &self.key,
            base_etag: self.base.as_ref().map_or("", |b| &b.etag),
        }
    }
}

impl Base {
    fn info(&self) -> ObjectInfo {
        ObjectInfo {
            key: self.key.clone(),
            size: self.size,
            etag: self.etag.clone(),
            last_modified: SystemTime::now(),
            meta: None,
        }
    }
}

fn unreachable_base(key: &str) -> ObjectInfo {
    ObjectInfo {
        key: key.to_string(),
        size: 0,
        etag: String::new(),
        last_modified: SystemTime::now(),
        meta: None,
    }
}

fn collect(
    r: Result<Result<(i32, String), S3Error>, tokio::task::JoinError>,
    done: &mut Vec<(i32, String)>,
    first_err: &mut Option<S3Error>,
) {
    match r {
        Ok(Ok(p)) => done.push(p),
        Ok(Err(e)) => {
            first_err.get_or_insert(e);
        }
        Err(e) => {
            first_err.get_or_insert(S3Error::new(
                S3ErrorKind::Other,
                "UploadPart",
                "",
                format!("upload task ended: {e}"),
            ));
        }
    }
}

/// The base changed under us: a 412 on a conditional request, or the object gone.
fn changed(e: &S3Error) -> bool {
    matches!(
        e.kind,
        S3ErrorKind::PreconditionFailed | S3ErrorKind::NotFound
    )
}

fn io_error(e: std::io::Error) -> StageError {
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => StageError::Full,
        _ => StageError::Io(e.to_string()),
    }
}

fn errno_error(e: i32) -> StageError {
    match e {
        libc::EEXIST => StageError::Conflict { exists: true },
        libc::ESTALE => StageError::Conflict { exists: false },
        libc::ENOSPC => StageError::Full,
        _ => StageError::Io(format!("the staged file is closed (errno {e})")),
    }
}

/// `pread` all of `buf` at `offset`; past the file's end reads as zeros.
fn read_full_at(f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => {
                buf[done..].fill(0);
                return Ok(());
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Copy `bytes` (which lie at `at` of the file) over `out` (which lies at `offset`).
fn overlay(out: &mut [u8], offset: u64, at: u64, bytes: &[u8]) {
    let start = at.max(offset);
    let end = (at + bytes.len() as u64).min(offset + out.len() as u64);
    if start < end {
        out[(start - offset) as usize..(end - offset) as usize]
            .copy_from_slice(&bytes[(start - at) as usize..(end - at) as usize]);
    }
}
