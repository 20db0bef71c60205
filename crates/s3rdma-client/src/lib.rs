//! s3rdma's object store seam: [`ObjectStore`] (the operations the filesystem needs, buffer-in
//! so RDMA stays zero-copy), the AWS SDK store [`S3Client`] with its RDMA interceptor and mode
//! policy, errors that know their errno, and (feature `testing`) an in-memory store and a
//! fault-injecting wrapper for tests of the layers above.
//!
//! SDK types stay inside this crate: callers see [`ObjectInfo`], [`PutSource`], [`S3Error`].

#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod error;
pub mod meta;
pub mod mode;
pub mod rdma;
mod sdk;
mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod xattr;

pub use error::{errno_for, S3Error, S3ErrorKind};
pub use meta::FileMeta;
pub use rdma::{RdmaMode, TransportStats};
pub use sdk::{S3Client, S3Options};
pub use store::{Condition, ListPage, ObjectInfo, ObjectStore, PutSource, RdmaWindow};
