//! The FUSE transport of a mount (`--fuse-transport`): io_uring rings when they are asked for
//! (`uring`; `auto` keeps `/dev/fuse` until the rings measure ahead of it), else `/dev/fuse`.
//! The rings and their threads are made before the mount asks the kernel for them at INIT (a
//! mount granted the transport that cannot register its entries would hang), and serve once
//! the session runs, beside its `/dev/fuse` threads (the kernel still sends FORGET, INTERRUPT
//! and the requests of before the rings there).

use std::os::fd::AsFd;
use std::sync::Arc;

use s3rdma_client::S3Client;
use s3rdma_fs::fs::{control::FsControl, S3Fs};
use s3rdma_fuse_uring::{Rings, Stats, PAYLOAD};
use tracing::{info, warn};

use crate::cli::{FuseTransport, Settings};

/// Why `auto` serves over `/dev/fuse` where the kernel offers the rings: they do not measure
/// ahead of it yet (docs/performance.md, "FUSE over io_uring").
const AUTO_KEEPS_DEV: &str = "the kernel offers FUSE over io_uring, but auto keeps /dev/fuse \
     until the rings measure ahead of it; --fuse-transport uring uses them";

/// `/dev/fuse` threads beside the rings.
const DEV_THREADS_WITH_RINGS: usize = 2;

/// How a mount's FUSE requests will reach it.
pub struct Transport {
    rings: Option<Rings<S3Fs<S3Client>>>,
    pub stats: Arc<Stats>,
}

impl Transport {
    /// The transport `--fuse-transport` asks for: `uring` where the kernel does not offer it
    /// is the one-line error that names the switch; `auto` serves over `/dev/fuse` (the rings
    /// do not measure ahead of it yet) and says why in one INFO line.
    pub fn choose(settings: &Settings) -> Result<Transport, String> {
        let stats = Arc::<Stats>::default();
        let rings = match settings.kernel.fuse_transport {
            FuseTransport::Dev => None,
            FuseTransport::Uring => Some(Self::make_rings(settings, &stats)?),
            FuseTransport::Auto => {
                let why = match s3rdma_fuse_uring::offered() {
                    Ok(()) => AUTO_KEEPS_DEV.to_string(),
                    Err(why) => why.to_string(),
                };
                info!("FUSE requests go over /dev/fuse ({why})");
                None
            }
        };
        Ok(Transport { rings, stats })
    }

    /// The rings `uring` asks for, or the one line that says why there are none.
    fn make_rings(
        settings: &Settings,
        stats: &Arc<Stats>,
    ) -> Result<Rings<S3Fs<S3Client>>, String> {
        s3rdma_fuse_uring::offered().map_err(|why| why.to_string())?;
        let queues = s3rdma_fuse_uring::probe::queues();
        let depth = settings.kernel.fuse_queue_depth.unwrap_or_else(|| {
            s3rdma_fuse_uring::default_depth(settings.kernel.max_threads, queues)
        });
        Rings::new(queues, depth, stats.clone())
            .map_err(|e| format!("cannot make the io_uring rings: {e}; use --fuse-transport dev"))
    }

    /// The `max_write` INIT asks for with the rings (their entries' payload); None without.
    pub fn ring_max_write(&self) -> Option<u32> {
        self.rings.as_ref().map(|_| PAYLOAD as u32)
    }

    /// The session's `/dev/fuse` threads: all of `--max-threads` without rings.
    pub fn dev_threads(&self, max_threads: usize) -> usize {
        if self.rings.is_some() {
            DEV_THREADS_WITH_RINGS.min(max_threads)
        } else {
            max_threads
        }
    }

    /// Serve the session until it ends: with the rings when the kernel granted them at INIT.
    pub fn run(
        self,
        session: fuser::Session<S3Fs<S3Client>>,
        control: &FsControl<S3Client>,
    ) -> std::io::Result<()> {
        let Some(rings) = self.rings else {
            return session.run();
        };
        if !control.ring_granted() {
            warn!("serving over /dev/fuse with {DEV_THREADS_WITH_RINGS} threads: the kernel did not grant FUSE over io_uring");
            return session.run();
        }
        let dev = session.as_fd().try_clone_to_owned()?;
        session.run_with(move |dispatcher| Ok(rings.serve(dev, dispatcher)))
    }
}
