//! s3rdma: a FUSE file system over an S3 bucket.

pub mod fs;
pub mod read;
pub mod s3;
