//! s3rdma's filesystem: everything between the kernel's FUSE requests and the object store,
//! generic over the store so that it runs on the in-memory store in tests.
//!
//! - [`cache`]: the pinned, registered page cache (arena, admission, eviction).
//! - [`read`]: object readers (ETag-pinned ranged GETs, read-ahead).
//! - [`upload`]: the write pool and streaming multipart uploads.
//! - [`diskcache`]: the local disk cache served by FUSE passthrough.
//! - [`fs`]: the filesystem logic (inodes, namespace, open files) and its FUSE adapter.

pub mod cache;
pub mod dirlock;
pub mod diskcache;
pub mod fs;
pub mod read;
pub mod stage;
pub mod upload;

/// The cuObject resources this process holds now: `rdma_registrations=… rdma_registered_bytes=…
/// rdma_tokens_live=…` (all 0 after a clean shutdown).
pub fn rdma_live_summary() -> String {
    let l = cuobj_ffi::live();
    format!(
        "rdma_registrations={} rdma_registered_bytes={} rdma_tokens_live={}",
        l.registrations, l.registered_bytes, l.tokens
    )
}
