//! The seam between the filesystem and object storage: [`ObjectStore`], the operations the
//! filesystem needs, and the types they speak in. Implemented by the AWS SDK store
//! ([`crate::S3Client`], HTTP and S3-over-RDMA) and, for tests, by the in-memory store and the
//! fault-injecting wrapper (feature `testing`).
//!
//! Buffer-in: a GET writes into the caller's memory (a cache block, maybe an RDMA window) and a
//! PUT reads from it, so RDMA stays zero-copy. Callers are generic over the store (no `dyn`):
//! the futures are `Send` and monomorphised into the hot paths.

use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use cuobj_ffi::{RegisteredBuffer, Registration};

use crate::{FileMeta, RdmaMode, S3Error, S3ErrorKind, TransportStats};

/// The object store the filesystem runs on. Every operation is one S3 request (or, for
/// [`ObjectStore::copy_object`] of a large object, one multipart copy), already retried as the
/// store's policy says; errors carry their [`crate::S3ErrorKind`] and so their errno.
pub trait ObjectStore: Clone + Send + Sync + 'static {
    /// The bucket's name, for messages.
    fn bucket(&self) -> &str;

    /// The RDMA mode in force: `Off` means every body moves over HTTP.
    fn rdma_mode(&self) -> RdmaMode;

    /// Counters of bytes moved by transport, declines, fallbacks and requests in flight.
    fn stats(&self) -> &Arc<TransportStats>;

    /// HeadObject: size, ETag, modification time and stored attributes.
    fn head(&self, key: &str) -> impl Future<Output = Result<ObjectInfo, S3Error>> + Send;

    /// One page of ListObjectsV2 under `prefix`; `delimiter` is usually "/", `max_keys` at most
    /// 1000; `token` continues a listing from the page before.
    fn list_page(
        &self,
        prefix: &str,
        delimiter: Option<&str>,
        token: Option<String>,
        max_keys: i32,
    ) -> impl Future<Output = Result<ListPage, S3Error>> + Send;

    /// Ranged GetObject of `buf.len()` bytes at `offset`, conditional on `etag` (`If-Match`;
    /// empty: none), written straight into `buf`. Fails with `PreconditionFailed` if the object
    /// changed, and with `BadResponse` if the server sent more or fewer bytes than asked for.
    fn get_range_into(
        &self,
        key: &str,
        etag: &str,
        offset: u64,
        buf: &mut [u8],
    ) -> impl Future<Output = Result<(), S3Error>> + Send;

    /// GetObject of the object's first `buf.len()` bytes (all of it when it is no larger),
    /// with no condition, written into `buf`: what HeadObject would say of it (size, ETag,
    /// time, stored attributes) and how many bytes were written (`min(size, buf.len())`).
    /// One request where HeadObject and then a GET would be two; an empty object is answered
    /// too (0 bytes).
    fn get_first(
        &self,
        key: &str,
        buf: &mut [u8],
    ) -> impl Future<Output = Result<(ObjectInfo, usize), S3Error>> + Send;

    /// Like [`ObjectStore::get_first`], into a window of a registration, over RDMA when the
    /// mode allows (declines as for [`ObjectStore::get_range_rdma_window`]).
    fn get_first_rdma_window(
        &self,
        key: &str,
        win: RdmaWindow<'_>,
    ) -> impl Future<Output = Result<(ObjectInfo, usize), S3Error>> + Send;

    /// Like [`ObjectStore::get_range_into`], into a window of a registration, over RDMA when
    /// the mode allows: a decline moves the bytes over HTTP under `rdma=auto` (counted), or
    /// fails with `RdmaDeclined` under `rdma=required`.
    fn get_range_rdma_window(
        &self,
        key: &str,
        etag: &str,
        offset: u64,
        win: RdmaWindow<'_>,
    ) -> impl Future<Output = Result<(), S3Error>> + Send;

    /// PutObject of `data` under `cond`, carrying `meta`; returns the new ETag. A key that no
    /// longer satisfies `cond` fails with `PreconditionFailed` and stores nothing.
    fn put_object_if(
        &self,
        key: &str,
        data: PutSource<'_>,
        cond: &Condition,
        meta: &FileMeta,
    ) -> impl Future<Output = Result<String, S3Error>> + Send;

    /// CreateMultipartUpload of an object that will carry `meta`; returns the upload id.
    fn create_multipart_with(
        &self,
        key: &str,
        meta: &FileMeta,
    ) -> impl Future<Output = Result<String, S3Error>> + Send;

    /// UploadPart `part` of `upload_id`; returns the part's ETag.
    fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        part: i32,
        data: PutSource<'_>,
    ) -> impl Future<Output = Result<String, S3Error>> + Send;

    /// CompleteMultipartUpload from (part number, ETag) pairs under `cond`; returns the
    /// object's ETag. On `PreconditionFailed` the upload stays open: the caller aborts it.
    fn complete_multipart_if(
        &self,
        key: &str,
        upload_id: &str,
        parts: &[(i32, String)],
        cond: &Condition,
    ) -> impl Future<Output = Result<String, S3Error>> + Send;

    /// AbortMultipartUpload: drops every part uploaded so far.
    fn abort_multipart(
        &self,
        key: &str,
        upload_id: &str,
    ) -> impl Future<Output = Result<(), S3Error>> + Send;

    /// DeleteObject (deleting a missing key succeeds, as in S3).
    fn delete_object(&self, key: &str) -> impl Future<Output = Result<(), S3Error>> + Send;

    /// Server-side copy of `src` (which must still have ETag `src.etag`) to `dst`, carrying
    /// `meta` (replacing the source's). Objects above `single_limit` bytes (at most S3's
    /// 5 GiB) are copied as a multipart upload of UploadPartCopy ranges. Returns the new ETag.
    fn copy_object(
        &self,
        src: &ObjectInfo,
        dst: &str,
        meta: &FileMeta,
        single_limit: u64,
    ) -> impl Future<Output = Result<String, S3Error>> + Send;

    /// [`ObjectStore::copy_object`] keeping the source's own stored attributes (a directory
    /// rename moves keys it has only listed). The default asks HeadObject for them, then
    /// copies; a store that can copy metadata as it is (one CopyObject with the `COPY`
    /// directive) does so for objects up to `single_limit`.
    fn copy_object_as_is(
        &self,
        src: &ObjectInfo,
        dst: &str,
        single_limit: u64,
    ) -> impl Future<Output = Result<String, S3Error>> + Send {
        copy_with_stored_meta(self, src, dst, single_limit)
    }

    /// UploadPartCopy: part `part` of `upload_id` becomes bytes `range` (end exclusive) of
    /// `src_key`, which must still have ETag `src_etag` (`x-amz-copy-source-if-match`; a
    /// changed source fails with `PreconditionFailed`). Returns the part's ETag.
    fn upload_part_copy(
        &self,
        key: &str,
        upload_id: &str,
        part: i32,
        src_key: &str,
        src_etag: &str,
        range: std::ops::Range<u64>,
    ) -> impl Future<Output = Result<String, S3Error>> + Send;

    /// Unconditional PutObject with no stored attributes.
    fn put_object(
        &self,
        key: &str,
        data: PutSource<'_>,
    ) -> impl Future<Output = Result<String, S3Error>> + Send {
        async move {
            self.put_object_if(key, data, &Condition::None, &FileMeta::default())
                .await
        }
    }

    /// CreateMultipartUpload with no stored attributes.
    fn create_multipart(&self, key: &str) -> impl Future<Output = Result<String, S3Error>> + Send {
        async move { self.create_multipart_with(key, &FileMeta::default()).await }
    }

    /// Unconditional CompleteMultipartUpload.
    fn complete_multipart(
        &self,
        key: &str,
        upload_id: &str,
        parts: &[(i32, String)],
    ) -> impl Future<Output = Result<String, S3Error>> + Send {
        async move {
            self.complete_multipart_if(key, upload_id, parts, &Condition::None)
                .await
        }
    }

    /// Ranged GetObject over RDMA into the whole of a registered buffer.
    fn get_range_rdma(
        &self,
        key: &str,
        etag: &str,
        offset: u64,
        buf: &mut RegisteredBuffer,
    ) -> impl Future<Output = Result<(), S3Error>> + Send {
        self.get_range_rdma_window(key, etag, offset, RdmaWindow::of_buffer(buf))
    }
}

/// Metadata of one object, from HEAD or from a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    pub key: String,
    pub size: u64,
    pub etag: String,
    pub last_modified: SystemTime,
    /// The attributes stored with the object: `None` when not asked (a listing does not
    /// carry them), `Some` (maybe empty) from HeadObject or our own write.
    pub meta: Option<FileMeta>,
}

/// One page of ListObjectsV2 with a delimiter.
#[derive(Debug, Default)]
pub struct ListPage {
    pub objects: Vec<ObjectInfo>,
    /// Common prefixes, each ending with the delimiter.
    pub prefixes: Vec<String>,
    pub next_token: Option<String>,
}

/// Memory the endpoint may write a GET into: `buf` is exactly the bytes at `offset` of `reg`.
pub struct RdmaWindow<'a> {
    pub(crate) reg: &'a Arc<Registration>,
    pub(crate) offset: usize,
    pub(crate) buf: &'a mut [u8],
}

impl<'a> RdmaWindow<'a> {
    /// The whole of a registered buffer.
    pub fn of_buffer(buf: &'a mut RegisteredBuffer) -> Self {
        // A RegisteredBuffer's slice is exactly its registration.
        let (reg, slice) = buf.split_for_write();
        RdmaWindow {
            reg,
            offset: 0,
            buf: slice,
        }
    }

    /// A window of a larger registration.
    ///
    /// # Safety
    /// `buf` must be the memory at `offset..offset + buf.len()` of `reg`, and nothing else may
    /// read or write it until the transfer ends: the endpoint writes there behind Rust's back.
    pub unsafe fn new(reg: &'a Arc<Registration>, offset: usize, buf: &'a mut [u8]) -> Self {
        RdmaWindow { reg, offset, buf }
    }
}

/// Where the bytes of a PUT come from.
pub enum PutSource<'a> {
    /// Plain memory: always HTTP.
    Plain(&'a [u8]),
    /// The first `len` bytes of a registered buffer: RDMA unless `rdma=off`.
    Registered(&'a RegisteredBuffer, usize),
    /// Bytes that lie at `offset` of a registration (a write-pool chunk): RDMA unless
    /// `rdma=off`; over HTTP they are sent without a copy.
    Window {
        reg: &'a Arc<Registration>,
        offset: usize,
        bytes: bytes::Bytes,
    },
    /// Owned plain bytes (sent over HTTP without a copy).
    Owned(bytes::Bytes),
}

impl PutSource<'_> {
    pub fn bytes(&self) -> &[u8] {
        match self {
            PutSource::Plain(b) => b,
            PutSource::Registered(buf, len) => &buf.as_slice()[..*len],
            PutSource::Window { bytes, .. } | PutSource::Owned(bytes) => bytes,
        }
    }

    /// The registration and offset an RDMA transfer may read the bytes from.
    pub fn window(&self) -> Option<(&Arc<Registration>, usize)> {
        match self {
            PutSource::Registered(buf, _) => Some((buf.registration(), 0)),
            PutSource::Window { reg, offset, .. } => Some((reg, *offset)),
            _ => None,
        }
    }

    pub fn transport(&self, mode: RdmaMode) -> &'static str {
        match (self.window(), mode) {
            (Some(_), RdmaMode::Auto | RdmaMode::Required) => "rdma",
            _ => "http",
        }
    }
}

/// The precondition of a write: what must be true of the key for the write to take effect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Condition {
    /// None: the write replaces whatever is there.
    None,
    /// `If-None-Match: *`: the key must not exist (a new file).
    IfNoneMatch,
    /// `If-Match: ETAG`: the key must still hold this version (an overwrite).
    IfMatch(String),
}

impl Condition {
    pub fn if_none_match(&self) -> Option<String> {
        matches!(self, Condition::IfNoneMatch).then(|| "*".to_string())
    }

    pub fn if_match(&self) -> Option<String> {
        match self {
            Condition::IfMatch(e) => Some(e.clone()),
            _ => None,
        }
    }
}

/// [`ObjectStore::copy_object`] of `src` with the attributes HeadObject gives for it, if it is
/// still the version listed (else `PreconditionFailed`).
pub async fn copy_with_stored_meta<S: ObjectStore>(
    s3: &S,
    src: &ObjectInfo,
    dst: &str,
    single_limit: u64,
) -> Result<String, S3Error> {
    let now = s3.head(&src.key).await?;
    if now.etag != src.etag {
        return Err(S3Error::new(
            S3ErrorKind::PreconditionFailed,
            "CopyObject",
            &src.key,
            "the source changed since it was listed",
        ));
    }
    let meta = now.meta.clone().unwrap_or_default();
    s3.copy_object(&now, dst, &meta, single_limit).await
}
