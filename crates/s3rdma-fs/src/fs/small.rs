//! Small files in one request.
//!
//! A dataset of small files is read file by file: look up, open, read to the end, close. The
//! open must ask S3 for the current version (close-to-open), and that answer used to be a
//! HeadObject, followed by a GET for the bytes: two requests per file, where an SDK reading
//! the same object sends one. Here, wherever the mount would ask HeadObject about a file that
//! is small as last seen (1 byte to [`WHOLE_MAX`]) and whose bytes at the version last seen are
//! not cached already, it sends one GET of the object's first `WHOLE_MAX` bytes instead. The
//! answer carries everything HeadObject would (size, ETag, time, `x-amz-meta-*`), and the body,
//! when it is the whole object, lands in the page cache as the block of that ETag, so the
//! reads that follow need no request (`Cache::fetch_first`).
//!
//! A listing's questions about the types of its entries (`kinds`) stay HeadObject: a listing
//! is not a read (`ls -l` of 10,000 objects of 1 KiB took 3.0 s so, 4.2 s with GETs). What
//! this costs a file nobody reads (a `stat` of a path not listed before) is its bytes, at most
//! `WHOLE_MAX`, counted in `whole_fetch_waste_bytes` once evicted unread. A larger object is
//! never fetched by a `stat`: it is asked about with HeadObject, and one that grew past the
//! bound since it was last seen costs the first `WHOLE_MAX` bytes (counted too).
//!
//! A name never seen (a path from a manifest, in a directory not listed) is asked about with
//! one listing (`probe`), which says whether it is a file or a directory, and only then could
//! the GET be sent: two round trips before the first byte, where a bare GET takes one. So in a
//! directory whose last name looked up was a small file ([`Siblings`]), the lookup sends the
//! GET beside the listing, with room for twice the largest small file found there in a row
//! (at most `WHOLE_MAX`): a dataset's files are alike. When the listing says it is that file
//! at that ETag, the GET is its answer, and its bytes are cached when they are the whole file
//! (a larger one is read as usual: one GET more). When the listing says otherwise (a
//! directory, nothing) the GET was one request and a bounded transfer in vain (counted as
//! waste), and the directory sends no GET beside its next lookup until a small file is found
//! there.

use std::sync::Arc;

use tokio::task::JoinHandle;

use crate::cache::{BlockKey, Cache};
use s3rdma_client::{ObjectInfo, ObjectStore, S3Error, S3ErrorKind};

/// The largest object fetched whole where HeadObject would be asked.
pub const WHOLE_MAX: u64 = 1 << 20;

/// What S3 says of the file `key` now, as HeadObject says it; `last` is its size and ETag as
/// last seen. A small object not cached at that ETag comes whole with the answer (see above).
pub(super) async fn ask_file<S: ObjectStore>(
    cache: &Arc<Cache<S>>,
    s3: &S,
    key: &str,
    last: Option<(u64, &str)>,
) -> Result<ObjectInfo, S3Error> {
    let whole = last.filter(|&(size, etag)| {
        (1..=WHOLE_MAX).contains(&size)
            && !cache.contains(&BlockKey {
                key: key.into(),
                etag: etag.into(),
                index: 0,
            })
    });
    let whole = whole.map(|(size, _)| size);
    let op = if whole.is_some() {
        "GetObject"
    } else {
        "HeadObject"
    };
    let (cache, s3, owned) = (cache.clone(), s3.clone(), key.to_string());
    let task = tokio::spawn(async move {
        match whole {
            Some(size) => cache.fetch_first(&owned, WHOLE_MAX as usize, size).await,
            None => s3.head(&owned).await,
        }
    });
    joined(task, op, key).await
}

/// Sends a GET of the first bytes of `key` (room for twice `sibling`, at most `WHOLE_MAX`)
/// now, beside a lookup's listing (see above); its answer is awaited with [`joined`].
pub(super) fn fetch_beside<S: ObjectStore>(
    rt: &tokio::runtime::Handle,
    cache: &Arc<Cache<S>>,
    key: &str,
    sibling: u64,
) -> JoinHandle<Result<ObjectInfo, S3Error>> {
    let (cache, owned) = (cache.clone(), key.to_string());
    let room = sibling.saturating_mul(2).min(WHOLE_MAX);
    rt.spawn(async move { cache.fetch_first(&owned, room as usize, room).await })
}

/// The answer of a request sent as a task of the runtime, beside the connection that carries
/// it: the answer's frames then pass between tasks of the I/O threads, and only the finished
/// answer wakes the FUSE thread that waits for it (polled on that thread, each frame would: a
/// quarter more context switches and 10 % more CPU per small file, measured).
pub(super) async fn joined(
    task: JoinHandle<Result<ObjectInfo, S3Error>>,
    op: &'static str,
    key: &str,
) -> Result<ObjectInfo, S3Error> {
    match task.await {
        Ok(answer) => answer,
        Err(e) => Err(S3Error::new(
            S3ErrorKind::Other,
            op,
            key,
            format!("the request's task ended early: {e}"),
        )),
    }
}

/// The most directories whose last file found is remembered.
const SIBLING_DIRS: u64 = 4096;

/// For each directory, the largest small file found by its lookups since the last one that
/// found something else (a directory, nothing, or a file larger than `WHOLE_MAX`).
pub(super) struct Siblings(moka::sync::Cache<u64, u64>);

impl Siblings {
    pub fn new() -> Self {
        Siblings(moka::sync::Cache::new(SIBLING_DIRS))
    }

    /// The size of the largest small file found in a row in directory `dir`.
    pub fn largest(&self, dir: u64) -> Option<u64> {
        self.0.get(&dir)
    }

    /// A lookup in `dir` found a file of `size` (`None`: no file).
    pub fn found(&self, dir: u64, size: Option<u64>) {
        match size.filter(|s| (1..=WHOLE_MAX).contains(s)) {
            Some(s) if self.0.get(&dir).is_some_and(|l| l >= s) => {}
            Some(s) => self.0.insert(dir, s),
            None => self.0.invalidate(&dir),
        }
    }
}
