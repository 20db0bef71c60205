//! s3rdma's filesystem: everything between the kernel's FUSE requests and the object store,
//! generic over the store so that it runs on the in-memory store in tests.
//!
//! - [`cache`]: the page cache (arena, pinned and registered for RDMA; admission, eviction).
//! - [`read`]: object readers (ETag-pinned ranged GETs, read-ahead).
//! - [`upload`]: the write pool and streaming multipart uploads.
//! - [`stage`]: staged files (edits, appends, truncation, writable `mmap`) in a local area.
//! - [`diskcache`]: the local disk cache served by FUSE passthrough.
//! - [`dirlock`]: one mount per local directory (an exclusive `flock`).
//! - [`setup`]: why a part of the mount could not be set up (one typed error).
//! - [`errno`]: what each layer's errors mean to a process.
//! - [`fs`]: the filesystem logic (inodes, namespace, open files) and its FUSE adapter.

#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod cache;
pub mod dirlock;
pub mod diskcache;
pub mod errno;
pub mod fs;
pub mod read;
pub mod setup;
pub mod stage;
pub mod upload;

/// The cuObject resources this process holds now (all 0 after a clean shutdown).
pub fn report_rdma_live(out: &mut dyn s3rdma_metrics::Sink) {
    use s3rdma_metrics::Value;
    let l = cuobj_ffi::live();
    out.value(Value::gauge(
        "rdma_registrations",
        "Memory registrations held with the cuObject library.",
        l.registrations as u64,
    ));
    out.value(Value::gauge(
        "rdma_registered_bytes",
        "Bytes registered with the cuObject library.",
        l.registered_bytes as u64,
    ));
    out.value(Value::gauge(
        "rdma_tokens_live",
        "RDMA tokens not yet released.",
        l.tokens as u64,
    ));
}

/// At most 2 allocator arenas for the whole daemon (glibc makes up to 8 per core, one per busy
/// thread): memory one FUSE worker freed (inode entries the kernel forgot) is then reused by
/// the next walk whichever worker serves it, instead of each arena keeping its own high-water
/// mark. The hot paths (reads, uploads) do not allocate per call, so the arenas see little
/// contention. And a fixed mmap threshold of 4 MiB: a large buffer (fuser's 16 MiB request
/// buffer per FUSE worker) is always its own mapping, whose pages are touched only as used and
/// go back to the system when freed — glibc's default raises the threshold after the first
/// such free, after which `calloc` zeroes (so touches) every later 16 MiB buffer in the heap —
/// while buffers of a read or an HTTP body (up to 1 MiB) are reused from the heap rather than
/// mapped, faulted in and unmapped on every call. Call before threads start.
pub fn limit_heap_arenas() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets allocator tunables.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
    }
}

/// Hand the allocator's free memory back to the system (glibc keeps freed heap, such as
/// the inode entries FORGET dropped, for reuse otherwise) when at least 16 MiB of it is free,
/// or `anyway`: trimming walks the whole heap, too much to do every tick of a mount holding
/// millions of entries. Blocking: call it off the async runtime's workers.
pub fn trim_heap(anyway: bool) {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallinfo2 only reads the allocator's statistics.
        let free = unsafe { libc::mallinfo2() }.fordblks;
        if anyway || free >= 16 << 20 {
            // SAFETY: malloc_trim only walks and trims the allocator's own free lists.
            unsafe {
                libc::malloc_trim(0);
            }
        }
    }
    #[cfg(not(target_env = "gnu"))]
    let _ = anyway;
}

/// This process's resident memory (from /proc/self/statm), and how much of the page cache
/// and the write pool is pinned (0 without RDMA, where they take memory as used).
pub fn report_memory(
    cache: &cache::arena::Arena,
    pool: Option<&cache::arena::Arena>,
    out: &mut dyn s3rdma_metrics::Sink,
) {
    use s3rdma_metrics::Value;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    let resident = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0)
        * page;
    let pinned = |a: &cache::arena::Arena| a.pinned_bytes() as u64;
    out.value(Value::gauge(
        "resident_bytes",
        "The daemon's resident memory.",
        resident,
    ));
    out.value(Value::gauge(
        "cache_pinned_bytes",
        "Page cache memory pinned (and registered) for RDMA.",
        pinned(cache),
    ));
    out.value(Value::gauge(
        "write_pinned_bytes",
        "Write pool memory pinned (and registered) for RDMA.",
        pool.map_or(0, pinned),
    ));
}
