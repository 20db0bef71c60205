//! An in-memory object store with the semantics the filesystem relies on: ETags that change with
//! every write, conditional writes (`If-None-Match: *`, `If-Match`) and ranged reads pinned to
//! an ETag, multipart uploads (parts of at least 5 MiB but the last, ETags `"…-N"`, abort),
//! server-side copy conditional on the source's ETag, user metadata, ListObjectsV2 with a
//! delimiter and continuation, and a counter per operation. Another client's changes are made
//! with [`MemStore::put_external`] and [`MemStore::delete_external`] (not counted).
//!
//! Keys are stored as given: keys a real server normalises away (`a//b`, `..`, `./x`) can be
//! made here, so tests can show how the filesystem hides them.

use s3rdma_proto::sync::Lock;
use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use super::Op;
use crate::store::{Condition, ListPage, ObjectInfo, ObjectStore, PutSource, RdmaWindow};
use crate::{FileMeta, RdmaMode, S3Error, S3ErrorKind, TransportStats};

/// S3's smallest part, for every part of a multipart upload but the last.
pub const MIN_PART: usize = 5 << 20;

/// A cheap-to-clone handle on one in-memory bucket.
#[derive(Clone)]
pub struct MemStore {
    inner: Arc<Inner>,
}

struct Inner {
    bucket: String,
    rdma: RdmaMode,
    stats: Arc<TransportStats>,
    state: Mutex<State>,
    counts: [AtomicU64; Op::ALL.len()],
}

#[derive(Default)]
struct State {
    objects: BTreeMap<String, Object>,
    uploads: HashMap<String, Pending>,
    /// Source of ETags and upload ids: every write gets a new one.
    serial: u64,
}

#[derive(Clone)]
struct Object {
    data: Arc<[u8]>,
    etag: String,
    last_modified: SystemTime,
    meta: FileMeta,
}

struct Pending {
    key: String,
    meta: FileMeta,
    parts: BTreeMap<i32, (String, Arc<[u8]>)>,
}

fn err(kind: S3ErrorKind, op: Op, key: &str, status: u16, msg: &str) -> S3Error {
    let mut e = S3Error::new(kind, op.name(), key, msg);
    e.status = Some(status);
    e
}

impl State {
    fn next(&mut self) -> u64 {
        self.serial += 1;
        self.serial
    }

    fn etag(&mut self) -> String {
        format!("\"{:032x}\"", self.next())
    }

    /// Whether a write of `key` under `cond` may take effect.
    fn check(&self, op: Op, key: &str, cond: &Condition) -> Result<(), S3Error> {
        let cur = self.objects.get(key);
        match (cond, cur) {
            (Condition::None, _) => Ok(()),
            (Condition::IfNoneMatch, None) => Ok(()),
            (Condition::IfNoneMatch, Some(_)) => Err(err(
                S3ErrorKind::PreconditionFailed,
                op,
                key,
                412,
                "At least one of the pre-conditions you specified did not hold",
            )),
            (Condition::IfMatch(_), None) => Err(err(
                S3ErrorKind::NotFound,
                op,
                key,
                404,
                "The specified key does not exist.",
            )),
            (Condition::IfMatch(e), Some(o)) if *e == o.etag => Ok(()),
            (Condition::IfMatch(_), Some(_)) => Err(err(
                S3ErrorKind::PreconditionFailed,
                op,
                key,
                412,
                "At least one of the pre-conditions you specified did not hold",
            )),
        }
    }

    fn store(&mut self, key: &str, data: Arc<[u8]>, etag: String, meta: FileMeta) {
        self.objects.insert(
            key.to_string(),
            Object {
                data,
                etag,
                last_modified: SystemTime::now(),
                meta,
            },
        );
    }

    /// The object `key` at version `etag` (any version when empty), for a read.
    fn version(&self, op: Op, key: &str, etag: &str) -> Result<&Object, S3Error> {
        let o = self.objects.get(key).ok_or_else(|| {
            err(
                S3ErrorKind::NotFound,
                op,
                key,
                404,
                "The specified key does not exist.",
            )
        })?;
        if !etag.is_empty() && o.etag != etag {
            return Err(err(
                S3ErrorKind::PreconditionFailed,
                op,
                key,
                412,
                "At least one of the pre-conditions you specified did not hold",
            ));
        }
        Ok(o)
    }
}

impl MemStore {
    /// An empty bucket; bodies move "over HTTP" (`RdmaMode::Off`).
    pub fn new(bucket: &str) -> MemStore {
        MemStore::with_rdma(bucket, RdmaMode::Off)
    }

    /// An empty bucket whose bodies count as moved over RDMA when the caller offers a
    /// registered window (`Auto` or `Required`).
    pub fn with_rdma(bucket: &str, rdma: RdmaMode) -> MemStore {
        MemStore {
            inner: Arc::new(Inner {
                bucket: bucket.to_string(),
                rdma,
                stats: Arc::new(TransportStats::default()),
                state: Mutex::new(State::default()),
                counts: Default::default(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.state.locked()
    }

    fn count(&self, op: Op) {
        self.inner.counts[op as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Requests of `op` made through [`ObjectStore`] so far.
    pub fn requests(&self, op: Op) -> u64 {
        self.inner.counts[op as usize].load(Ordering::Relaxed)
    }

    /// Every request made through [`ObjectStore`] so far.
    pub fn total_requests(&self) -> u64 {
        Op::ALL.iter().map(|&op| self.requests(op)).sum()
    }

    /// The counters as `(operation, count)` pairs with a non-zero count, for messages.
    pub fn request_counts(&self) -> Vec<(&'static str, u64)> {
        Op::ALL
            .iter()
            .map(|&op| (op.name(), self.requests(op)))
            .filter(|&(_, n)| n > 0)
            .collect()
    }

    /// Another client stores `data` at `key` (not counted); returns its ETag.
    pub fn put_external(&self, key: &str, data: &[u8]) -> String {
        let mut st = self.lock();
        let etag = st.etag();
        st.store(key, data.into(), etag.clone(), FileMeta::default());
        etag
    }

    /// Another client stores `data` at `key` with stored attributes `meta` (as s3fs stores a
    /// link or a file's mode and extended attributes; not counted); returns its ETag.
    pub fn put_external_with(&self, key: &str, data: &[u8], meta: FileMeta) -> String {
        let mut st = self.lock();
        let etag = st.etag();
        st.store(key, data.into(), etag.clone(), meta);
        etag
    }

    /// What SeaweedFS answers a HEAD with right after an attribute change stored by a copy
    /// onto itself: older attributes `meta` under the same ETag. Replaces the stored attributes
    /// of `key` without changing its ETag (not counted); whether it was there.
    pub fn stale_meta_external(&self, key: &str, meta: FileMeta) -> bool {
        match self.lock().objects.get_mut(key) {
            Some(o) => {
                o.meta = meta;
                true
            }
            None => false,
        }
    }

    /// Another client deletes `key` (not counted); whether it was there.
    pub fn delete_external(&self, key: &str) -> bool {
        self.lock().objects.remove(key).is_some()
    }

    /// The bytes of `key` now, if it exists.
    pub fn data(&self, key: &str) -> Option<Vec<u8>> {
        self.lock().objects.get(key).map(|o| o.data.to_vec())
    }

    /// What HeadObject would say of `key`, without counting a request.
    pub fn info(&self, key: &str) -> Option<ObjectInfo> {
        self.lock().objects.get(key).map(|o| info_of(key, o))
    }

    /// Every key, in order.
    pub fn keys(&self) -> Vec<String> {
        self.lock().objects.keys().cloned().collect()
    }

    /// The keys of multipart uploads neither completed nor aborted.
    pub fn pending_uploads(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .lock()
            .uploads
            .values()
            .map(|u| u.key.clone())
            .collect();
        keys.sort();
        keys
    }

    fn read_into(
        &self,
        op: Op,
        key: &str,
        etag: &str,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), S3Error> {
        if buf.is_empty() {
            return Ok(());
        }
        let st = self.lock();
        let o = st.version(op, key, etag)?;
        let size = o.data.len() as u64;
        if offset >= size {
            return Err(err(
                S3ErrorKind::InvalidRange,
                op,
                key,
                416,
                "The requested range is not satisfiable",
            ));
        }
        let end = offset + buf.len() as u64;
        if end > size {
            // What the SDK store reports when the server sends fewer bytes than asked.
            return Err(S3Error::new(
                S3ErrorKind::BadResponse,
                op.name(),
                key,
                format!("short body: {} of {} bytes", size - offset, buf.len()),
            ));
        }
        buf.copy_from_slice(&o.data[offset as usize..end as usize]);
        Ok(())
    }

    fn counter_for(&self, rdma: bool, read: bool) -> &AtomicU64 {
        let s = &self.inner.stats;
        match (rdma, read) {
            (true, true) => &s.rdma_bytes_read,
            (true, false) => &s.rdma_bytes_written,
            (false, true) => &s.http_bytes_read,
            (false, false) => &s.http_bytes_written,
        }
    }

    fn written(&self, data: &PutSource<'_>) {
        let rdma = data.window().is_some() && self.inner.rdma != RdmaMode::Off;
        TransportStats::add(self.counter_for(rdma, false), data.bytes().len() as u64);
    }
}

impl MemStore {
    /// The object's first `buf.len()` bytes (all of it if no larger) into `buf`.
    fn first_into(&self, key: &str, buf: &mut [u8]) -> Result<(ObjectInfo, usize), S3Error> {
        let st = self.lock();
        let o = st.version(Op::Get, key, "")?;
        let n = o.data.len().min(buf.len());
        buf[..n].copy_from_slice(&o.data[..n]);
        Ok((info_of(key, o), n))
    }
}

fn info_of(key: &str, o: &Object) -> ObjectInfo {
    ObjectInfo {
        key: key.to_string(),
        size: o.data.len() as u64,
        etag: o.etag.clone(),
        last_modified: o.last_modified,
        meta: Some(o.meta.clone()),
    }
}

impl ObjectStore for MemStore {
    fn bucket(&self) -> &str {
        &self.inner.bucket
    }

    fn rdma_mode(&self) -> RdmaMode {
        self.inner.rdma
    }

    fn stats(&self) -> &Arc<TransportStats> {
        &self.inner.stats
    }

    async fn head(&self, key: &str) -> Result<ObjectInfo, S3Error> {
        self.count(Op::Head);
        let st = self.lock();
        let o = st.version(Op::Head, key, "")?;
        Ok(info_of(key, o))
    }

    async fn list_page(
        &self,
        prefix: &str,
        delimiter: Option<&str>,
        token: Option<String>,
        max_keys: i32,
    ) -> Result<ListPage, S3Error> {
        self.count(Op::List);
        let max = if max_keys <= 0 {
            1000
        } else {
            max_keys.min(1000)
        } as usize;
        let st = self.lock();
        let start = match &token {
            Some(t) => Bound::Excluded(t.clone()),
            None => Bound::Included(prefix.to_string()),
        };
        let mut page = ListPage::default();
        let mut last: Option<String> = None;
        let mut taken = 0usize;
        for (key, o) in st.objects.range((start, Bound::Unbounded)) {
            // The keys under a prefix are one run in key order, from the prefix (or the
            // token, which lies in that run) on.
            if !key.starts_with(prefix) {
                break;
            }
            let rest = &key[prefix.len()..];
            let common = delimiter.filter(|d| !d.is_empty()).and_then(|d| {
                rest.find(d)
                    .map(|i| key[..prefix.len() + i + d.len()].to_string())
            });
            let item = match &common {
                Some(cp) => {
                    // Keys under a prefix already returned (on this page or as the token).
                    if last.as_deref() == Some(cp.as_str())
                        || token.as_deref().is_some_and(|t| t >= cp.as_str())
                    {
                        continue;
                    }
                    cp.clone()
                }
                None => key.clone(),
            };
            if taken == max {
                page.next_token = last.clone();
                break;
            }
            taken += 1;
            match common {
                Some(cp) => page.prefixes.push(cp),
                None => page.objects.push(ObjectInfo {
                    meta: None,
                    ..info_of(key, o)
                }),
            }
            last = Some(item);
        }
        Ok(page)
    }

    async fn get_range_into(
        &self,
        key: &str,
        etag: &str,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), S3Error> {
        self.count(Op::Get);
        self.read_into(Op::Get, key, etag, offset, buf)?;
        TransportStats::add(self.counter_for(false, true), buf.len() as u64);
        Ok(())
    }

    async fn get_first(&self, key: &str, buf: &mut [u8]) -> Result<(ObjectInfo, usize), S3Error> {
        self.count(Op::Get);
        let (info, n) = self.first_into(key, buf)?;
        TransportStats::add(self.counter_for(false, true), n as u64);
        Ok((info, n))
    }

    async fn get_first_rdma_window(
        &self,
        key: &str,
        win: RdmaWindow<'_>,
    ) -> Result<(ObjectInfo, usize), S3Error> {
        self.count(Op::Get);
        let (info, n) = self.first_into(key, win.buf)?;
        let rdma = self.inner.rdma != RdmaMode::Off;
        TransportStats::add(self.counter_for(rdma, true), n as u64);
        Ok((info, n))
    }

    async fn get_range_rdma_window(
        &self,
        key: &str,
        etag: &str,
        offset: u64,
        win: RdmaWindow<'_>,
    ) -> Result<(), S3Error> {
        self.count(Op::Get);
        self.read_into(Op::Get, key, etag, offset, win.buf)?;
        let rdma = self.inner.rdma != RdmaMode::Off;
        TransportStats::add(self.counter_for(rdma, true), win.buf.len() as u64);
        Ok(())
    }

    async fn put_object_if(
        &self,
        key: &str,
        data: PutSource<'_>,
        cond: &Condition,
        meta: &FileMeta,
    ) -> Result<String, S3Error> {
        self.count(Op::Put);
        let mut st = self.lock();
        st.check(Op::Put, key, cond)?;
        let etag = st.etag();
        st.store(key, data.bytes().into(), etag.clone(), meta.clone());
        drop(st);
        self.written(&data);
        Ok(etag)
    }

    async fn create_multipart_with(&self, key: &str, meta: &FileMeta) -> Result<String, S3Error> {
        self.count(Op::CreateMultipart);
        let mut st = self.lock();
        let id = format!("upload-{}", st.next());
        st.uploads.insert(
            id.clone(),
            Pending {
                key: key.to_string(),
                meta: meta.clone(),
                parts: BTreeMap::new(),
            },
        );
        Ok(id)
    }

    async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        part: i32,
        data: PutSource<'_>,
    ) -> Result<String, S3Error> {
        self.count(Op::UploadPart);
        if !(1..=10_000).contains(&part) {
            return Err(err(
                S3ErrorKind::Other,
                Op::UploadPart,
                key,
                400,
                "InvalidArgument: part number",
            ));
        }
        let mut st = self.lock();
        let etag = st.etag();
        let up = st
            .uploads
            .get_mut(upload_id)
            .filter(|u| u.key == key)
            .ok_or_else(|| {
                err(
                    S3ErrorKind::NotFound,
                    Op::UploadPart,
                    key,
                    404,
                    "NoSuchUpload",
                )
            })?;
        up.parts.insert(part, (etag.clone(), data.bytes().into()));
        drop(st);
        self.written(&data);
        Ok(etag)
    }

    async fn complete_multipart_if(
        &self,
        key: &str,
        upload_id: &str,
        parts: &[(i32, String)],
        cond: &Condition,
    ) -> Result<String, S3Error> {
        let op = Op::CompleteMultipart;
        self.count(op);
        let mut st = self.lock();
        let up = st
            .uploads
            .get(upload_id)
            .filter(|u| u.key == key)
            .ok_or_else(|| err(S3ErrorKind::NotFound, op, key, 404, "NoSuchUpload"))?;
        if parts.is_empty() || parts.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(err(S3ErrorKind::Other, op, key, 400, "InvalidPartOrder"));
        }
        let mut data = Vec::new();
        for (i, (n, etag)) in parts.iter().enumerate() {
            let Some((_, bytes)) = up.parts.get(n).filter(|(e, _)| e == etag) else {
                return Err(err(S3ErrorKind::Other, op, key, 400, "InvalidPart"));
            };
            if i + 1 < parts.len() && bytes.len() < MIN_PART {
                return Err(err(S3ErrorKind::Other, op, key, 400, "EntityTooSmall"));
            }
            data.extend_from_slice(bytes);
        }
        st.check(op, key, cond)?;
        let meta = up.meta.clone();
        st.uploads.remove(upload_id);
        let etag = format!("\"{:032x}-{}\"", st.next(), parts.len());
        st.store(key, data.into(), etag.clone(), meta);
        Ok(etag)
    }

    async fn upload_part_copy(
        &self,
        key: &str,
        upload_id: &str,
        part: i32,
        src_key: &str,
        src_etag: &str,
        range: std::ops::Range<u64>,
    ) -> Result<String, S3Error> {
        let op = Op::Copy;
        self.count(op);
        let mut st = self.lock();
        let src = st.version(op, src_key, src_etag)?.data.clone();
        if range.start >= range.end
            || range.end > src.len() as u64
            || range.end - range.start > 5 << 30
        {
            return Err(err(S3ErrorKind::Other, op, key, 416, "InvalidRange"));
        }
        let etag = st.etag();
        let up = st
            .uploads
            .get_mut(upload_id)
            .filter(|u| u.key == key)
            .ok_or_else(|| err(S3ErrorKind::NotFound, op, key, 404, "NoSuchUpload"))?;
        let bytes: Arc<[u8]> = src[range.start as usize..range.end as usize].into();
        up.parts.insert(part, (etag.clone(), bytes));
        Ok(etag)
    }

    async fn abort_multipart(&self, key: &str, upload_id: &str) -> Result<(), S3Error> {
        self.count(Op::AbortMultipart);
        let mut st = self.lock();
        match st.uploads.get(upload_id) {
            Some(u) if u.key == key => {
                st.uploads.remove(upload_id);
                Ok(())
            }
            _ => Err(err(
                S3ErrorKind::NotFound,
                Op::AbortMultipart,
                key,
                404,
                "NoSuchUpload",
            )),
        }
    }

    async fn delete_object(&self, key: &str) -> Result<(), S3Error> {
        self.count(Op::Delete);
        self.lock().objects.remove(key);
        Ok(())
    }

    async fn copy_object_as_is(
        &self,
        src: &ObjectInfo,
        dst: &str,
        single_limit: u64,
    ) -> Result<String, S3Error> {
        let meta = {
            let st = self.lock();
            st.version(Op::Copy, &src.key, &src.etag)?.meta.clone()
        };
        self.copy_object(src, dst, &meta, single_limit).await
    }

    async fn copy_object(
        &self,
        src: &ObjectInfo,
        dst: &str,
        meta: &FileMeta,
        single_limit: u64,
    ) -> Result<String, S3Error> {
        let mut st = self.lock();
        let data = st.version(Op::Copy, &src.key, &src.etag)?.data.clone();
        let etag = if data.len() as u64 <= single_limit.min(5 << 30) {
            self.count(Op::Copy);
            st.etag()
        } else {
            // CreateMultipartUpload, UploadPartCopy per 512 MiB, CompleteMultipartUpload.
            let parts = (data.len() as u64).div_ceil(512 << 20);
            self.count(Op::CreateMultipart);
            for _ in 0..parts {
                self.count(Op::Copy);
            }
            self.count(Op::CompleteMultipart);
            format!("\"{:032x}-{parts}\"", st.next())
        };
        st.store(dst, data, etag.clone(), meta.clone());
        Ok(etag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    fn kind<T: std::fmt::Debug>(r: Result<T, S3Error>) -> S3ErrorKind {
        r.expect_err("an error").kind
    }

    #[test]
    fn writes_are_conditional_and_reads_pinned() {
        let rt = rt();
        let s = MemStore::new("b");
        let meta = FileMeta::default();
        let put = |k, d: &'static [u8], c: Condition| {
            rt.block_on(s.put_object_if(k, PutSource::Plain(d), &c, &meta))
        };
        let e1 = put("k", b"one", Condition::IfNoneMatch).unwrap();
        assert_eq!(
            kind(put("k", b"x", Condition::IfNoneMatch)),
            S3ErrorKind::PreconditionFailed
        );
        assert_eq!(
            kind(put("k", b"x", Condition::IfMatch("\"no\"".into()))),
            S3ErrorKind::PreconditionFailed
        );
        assert_eq!(
            kind(put("new", b"x", Condition::IfMatch(e1.clone()))),
            S3ErrorKind::NotFound
        );
        let e2 = put("k", b"two", Condition::IfMatch(e1.clone())).unwrap();
        assert_ne!(e1, e2);
        let mut buf = [0u8; 2];
        assert_eq!(
            kind(rt.block_on(s.get_range_into("k", &e1, 0, &mut buf))),
            S3ErrorKind::PreconditionFailed
        );
        rt.block_on(s.get_range_into("k", &e2, 1, &mut buf))
            .unwrap();
        assert_eq!(&buf, b"wo");
        assert_eq!(
            kind(rt.block_on(s.get_range_into("k", "", 3, &mut buf))),
            S3ErrorKind::InvalidRange
        );
        assert_eq!(
            kind(rt.block_on(s.get_range_into("k", "", 2, &mut buf))),
            S3ErrorKind::BadResponse
        );
        assert_eq!(kind(rt.block_on(s.head("gone"))), S3ErrorKind::NotFound);
        assert_eq!(s.requests(Op::Put), 5);
        assert_eq!(s.requests(Op::Get), 4);
        assert_eq!(s.requests(Op::Head), 1);
        assert_eq!(s.stats().http_bytes_written.load(Ordering::Relaxed), 6);
        assert_eq!(s.stats().http_bytes_read.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn multipart_uploads_follow_s3s_rules() {
        let rt = rt();
        let s = MemStore::new("b");
        let part = vec![1u8; MIN_PART];
        let id = rt.block_on(s.create_multipart("k")).unwrap();
        let p1 = rt
            .block_on(s.upload_part("k", &id, 1, PutSource::Plain(b"small")))
            .unwrap();
        let p2 = rt
            .block_on(s.upload_part("k", &id, 2, PutSource::Plain(b"end")))
            .unwrap();
        let parts = [(1, p1), (2, p2.clone())];
        // Every part but the last must be at least 5 MiB.
        let e = rt
            .block_on(s.complete_multipart("k", &id, &parts))
            .unwrap_err();
        assert_eq!(e.message, "EntityTooSmall");
        let p1 = rt
            .block_on(s.upload_part("k", &id, 1, PutSource::Plain(&part)))
            .unwrap();
        assert!(rt
            .block_on(s.complete_multipart("k", &id, &[(2, p2.clone()), (1, p1.clone())]))
            .is_err());
        assert!(rt
            .block_on(s.complete_multipart("k", &id, &[(1, "\"bad\"".into()), (2, p2.clone())]))
            .is_err());
        // Conditions are checked at completion; a failed one leaves the upload open.
        s.put_external("k", b"theirs");
        let cond = Condition::IfNoneMatch;
        let parts = [(1, p1), (2, p2)];
        assert_eq!(
            kind(rt.block_on(s.complete_multipart_if("k", &id, &parts, &cond))),
            S3ErrorKind::PreconditionFailed
        );
        assert_eq!(s.pending_uploads(), ["k"]);
        let etag = rt.block_on(s.complete_multipart("k", &id, &parts)).unwrap();
        assert!(etag.ends_with("-2\""), "{etag}");
        assert_eq!(s.data("k").unwrap().len(), MIN_PART + 3);
        assert!(s.pending_uploads().is_empty());
        assert_eq!(
            kind(rt.block_on(s.abort_multipart("k", &id))),
            S3ErrorKind::NotFound
        );
        let id = rt.block_on(s.create_multipart("k")).unwrap();
        rt.block_on(s.abort_multipart("k", &id)).unwrap();
        assert!(s.pending_uploads().is_empty());
    }

    #[test]
    fn copies_are_conditional_on_the_source_and_replace_metadata() {
        let rt = rt();
        let s = MemStore::new("b");
        s.put_external("src", b"data");
        let mut info = s.info("src").unwrap();
        let meta = FileMeta {
            mode: Some(0o600),
            ..Default::default()
        };
        rt.block_on(s.copy_object(&info, "dst", &meta, 5 << 30))
            .unwrap();
        assert_eq!(s.data("dst").unwrap(), b"data");
        assert_eq!(s.info("dst").unwrap().meta.unwrap().mode, Some(0o600));
        info.etag = "\"old\"".into();
        assert_eq!(
            kind(rt.block_on(s.copy_object(&info, "dst2", &meta, 5 << 30))),
            S3ErrorKind::PreconditionFailed
        );
        // Above the single-copy limit: a multipart copy (create, part copies, complete).
        let info = s.info("src").unwrap();
        let etag = rt.block_on(s.copy_object(&info, "dst3", &meta, 2)).unwrap();
        assert!(etag.ends_with("-1\""));
        assert_eq!(s.requests(Op::CreateMultipart), 1);
    }

    /// What ListObjectsV2 with a delimiter returns, computed the obvious way.
    fn expected(keys: &[&str], prefix: &str, delim: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let mut sorted: Vec<&str> = keys.to_vec();
        sorted.sort();
        for k in sorted.into_iter().filter(|k| k.starts_with(prefix)) {
            let item = match k[prefix.len()..].find(delim) {
                Some(i) if !delim.is_empty() => {
                    format!("P:{}", &k[..prefix.len() + i + delim.len()])
                }
                _ => format!("O:{k}"),
            };
            if !out.contains(&item) {
                out.push(item);
            }
        }
        out.sort_by(|a, b| a[2..].cmp(&b[2..]));
        out
    }

    #[test]
    fn listings_page_through_objects_and_common_prefixes_in_order() {
        let rt = rt();
        let s = MemStore::new("b");
        let keys = [
            "a", "a/", "a/1", "a/2/x", "a/2/y", "a//z", "ab", "b/c/d", "b/e", "c", "c/", "d/../e",
        ];
        for k in keys {
            s.put_external(k, b"");
        }
        for prefix in ["", "a", "a/", "a/2/", "b/", "zz"] {
            for delim in ["/", ""] {
                for max in [1, 2, 3, 1000] {
                    let mut got = Vec::new();
                    let mut token = None;
                    for _ in 0..100 {
                        let d = (!delim.is_empty()).then_some(delim);
                        let page = rt.block_on(s.list_page(prefix, d, token, max)).unwrap();
                        assert!(page.objects.len() + page.prefixes.len() <= max as usize);
                        let mut items: Vec<String> = page
                            .objects
                            .iter()
                            .map(|o| format!("O:{}", o.key))
                            .chain(page.prefixes.iter().map(|p| format!("P:{p}")))
                            .collect();
                        items.sort_by(|a, b| a[2..].cmp(&b[2..]));
                        got.extend(items);
                        token = page.next_token;
                        if token.is_none() {
                            break;
                        }
                    }
                    assert_eq!(
                        got,
                        expected(&keys, prefix, delim),
                        "{prefix:?} {delim:?} {max}"
                    );
                }
            }
        }
    }
}
