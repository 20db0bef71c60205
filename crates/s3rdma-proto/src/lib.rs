//! s3rdma's formats, with no I/O: what the daemon, the loopback endpoint and the fuzz targets
//! must agree on byte for byte. The leaf of the crate graph (std plus two small pure crates for
//! the checksum), so a fuzz build compiles in seconds and never the AWS SDK.
//!
//! - [`reply`]: the cuObject reply contract (`x-amz-rdma-*` headers and how answers are judged).
//! - [`checksum`]: CRC-64/NVME, sent with every upload.
//! - [`loopback_token`]: the loopback provider's token format.
//! - [`units`]: sizes, durations, modes, booleans and `-o` lists as users write them.
//! - [`xattr`]: the extended attributes the mount answers.
//! - [`sync`]: the one way every crate takes a lock (through a poisoning).

#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod checksum;
pub mod loopback_token;
pub mod reply;
pub mod sync;
pub mod units;
pub mod xattr;
