//! s3rdma: the binary's library half: command line, mount, daemon, lifecycle, logging, and the
//! `stats` / `warm` subcommands. The filesystem itself is `s3rdma-fs`; the object store seam is
//! `s3rdma-client`.

#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod cli;
pub mod daemon;
pub mod lifecycle;
pub mod logging;
pub mod metrics;
pub mod mount;
mod robustness;
pub mod startup;
pub mod stats;
pub mod transport;
pub mod warm;
