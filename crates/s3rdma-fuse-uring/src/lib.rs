//! FUSE over io_uring (Linux 6.14+, FUSE protocol 7.42): the kernel hands requests to the
//! daemon through io_uring instead of `read(/dev/fuse)`, and a reply goes back with the
//! command that fetches the next request.
//!
//! After the usual INIT over `/dev/fuse` (where the file system asks for
//! `FUSE_OVER_IO_URING`), each of `queues × depth` threads registers its entry (of one kernel
//! queue; the kernel has one per possible CPU; see `queue_of`) on its own ring, then serves what
//! arrives in it through fuser's
//! `Dispatcher` (a patch of fuser 0.18: `vendor/fuser/PATCHES.md`) with the same `Filesystem`
//! the `/dev/fuse` threads serve: the file-system code does not know the transport.
//! FORGET, INTERRUPT and notifications still travel over `/dev/fuse`, as the kernel wants.
//!
//! - [`probe`]: whether the kernel offers the transport now (the switch, io_uring itself).
//! - [`abi`]: the kernel's structures; [`frame`]: a ring entry ↔ the `/dev/fuse` format.
//! - `entry`: an entry's buffers; `ring`: a worker's ring, its loop and reply sink.

pub mod abi;
mod entry;
pub mod frame;
pub mod probe;
mod ring;

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

pub use probe::{offered, NotOffered};
pub use ring::Ring;

/// The payload area of each entry: the largest request or reply the mount lets the kernel
/// send (`max_write`, and `max_pages` × page, 1 MiB by default).
pub const PAYLOAD: usize = 1 << 20;

/// What the transport did, for `s3rdma stats` and `/metrics`.
#[derive(Debug, Default)]
pub struct Stats {
    /// The rings serve the mount (the kernel granted the transport at INIT).
    pub on: AtomicBool,
    /// Requests served through the rings.
    pub requests: AtomicU64,
    /// Entries the kernel refused (their requests then go over `/dev/fuse`).
    pub refused: AtomicU64,
}

impl s3rdma_metrics::Report for Stats {
    fn report(&self, out: &mut dyn s3rdma_metrics::Sink) {
        use s3rdma_metrics::Value;
        out.value(Value::gauge(
            "fuse_over_io_uring",
            "1 when the kernel hands FUSE requests to the daemon through io_uring rings, 0 over /dev/fuse (--fuse-transport).",
            u64::from(self.on.load(Ordering::Relaxed)),
        ));
        out.value(Value::counter(
            "fuse_ring_requests",
            "FUSE requests served through the io_uring rings.",
            self.requests(),
        ));
        out.value(Value::counter(
            "fuse_ring_entries_refused",
            "Ring entries the kernel refused (their requests then go over /dev/fuse).",
            self.refused(),
        ));
    }
}

impl Stats {
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// The kernel queue ring worker `w` holds its entry of: workers are dealt round the queues, so
/// `queues × depth` workers give each queue `depth` entries. Every queue needs one (the
/// kernel uses the rings only once each has), and a worker holds one entry only: with two, a
/// request could land in one while the worker serves the other, and wait behind it.
fn queue_of(w: usize, queues: usize) -> u16 {
    (w % queues) as u16
}

/// Entries per kernel queue when `--fuse-queue-depth` is not given: `--max-threads` shared
/// among the queues, at least one each.
pub fn default_depth(max_threads: usize, queues: usize) -> usize {
    max_threads.div_ceil(queues.max(1)).max(1)
}

/// The rings of a mount, each with its thread, made and started before the mount asks the
/// kernel for the transport: a mount granted the rings whose entries are never registered
/// would wait forever, so nothing that can fail (memory, io_uring, a thread) is left for after
/// INIT. The threads wait for [`Rings::serve`] (or for the rings to be dropped: they end).
pub struct Rings<FS: fuser::Filesystem> {
    go: Vec<mpsc::Sender<Connection<FS>>>,
    threads: Vec<JoinHandle<io::Result<()>>>,
    stats: Arc<Stats>,
}

/// What a ring thread serves: the connection's fd and the session's dispatcher.
struct Connection<FS: fuser::Filesystem> {
    dev: Arc<OwnedFd>,
    dispatcher: fuser::Dispatcher<FS>,
}

impl<FS: fuser::Filesystem> Rings<FS> {
    /// `depth` rings with their threads for each of the kernel's `queues` (one entry each; see
    /// [`queue_of`]).
    pub fn new(queues: usize, depth: usize, stats: Arc<Stats>) -> io::Result<Rings<FS>> {
        let (queues, workers) = (queues.max(1), queues.max(1) * depth.max(1));
        let mut rings = Rings {
            go: Vec::with_capacity(workers),
            threads: Vec::with_capacity(workers),
            stats,
        };
        for w in 0..workers {
            let ring = Ring::new(queue_of(w, queues), PAYLOAD)?;
            let (go, wait) = mpsc::channel::<Connection<FS>>();
            let stats = rings.stats.clone();
            let t = std::thread::Builder::new()
                .name(format!("fuse-ring-{w}"))
                .spawn(move || match wait.recv() {
                    Ok(c) => ring.serve(&c.dev, &c.dispatcher, &stats),
                    // Not granted, or the mount did not start: nothing was registered.
                    Err(_) => Ok(()),
                })?;
            rings.go.push(go);
            rings.threads.push(t);
        }
        Ok(rings)
    }

    /// Serve the connection `dev` (a `/dev/fuse` fd of the mount, after INIT granted the
    /// transport): each ring registers its entries; its thread ends when the connection does.
    pub fn serve(
        mut self,
        dev: OwnedFd,
        dispatcher: fuser::Dispatcher<FS>,
    ) -> Vec<JoinHandle<io::Result<()>>> {
        let dev = Arc::new(dev);
        self.stats.on.store(true, Ordering::Relaxed);
        for go in self.go.drain(..) {
            let c = Connection {
                dev: dev.clone(),
                dispatcher: dispatcher.clone(),
            };
            // A thread that is gone took its ring with it (it cannot have registered).
            let _ = go.send(c);
        }
        std::mem::take(&mut self.threads)
    }
}

impl<FS: fuser::Filesystem> Drop for Rings<FS> {
    /// Rings never served: their threads end without registering anything.
    fn drop(&mut self) {
        self.go.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{default_depth, queue_of};

    #[test]
    fn every_queue_gets_depth_entries() {
        for (queues, depth) in [(2, 8), (1, 1), (64, 1), (3, 5)] {
            let mut per_queue = vec![0; queues];
            for w in 0..queues * depth {
                per_queue[usize::from(queue_of(w, queues))] += 1;
            }
            assert!(
                per_queue.iter().all(|&n| n == depth),
                "{queues}×{depth}: {per_queue:?}"
            );
        }
    }

    #[test]
    fn the_default_depth_shares_the_threads_among_the_queues() {
        assert_eq!(default_depth(16, 2), 8);
        assert_eq!(default_depth(16, 3), 6);
        assert_eq!(default_depth(16, 64), 1);
        assert_eq!(default_depth(1, 1), 1);
    }
}
