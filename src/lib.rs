//! s3rdma: a FUSE file system over an S3 bucket.

pub mod cache;
pub mod cli;
pub mod daemon;
pub mod diskcache;
pub mod endpoint;
pub mod fs;
pub mod lifecycle;
pub mod logging;
pub mod mount;
pub mod rdma;
pub mod read;
mod robustness;
pub mod s3;
pub mod startup;
pub mod stats;
pub mod upload;
pub mod warm;
