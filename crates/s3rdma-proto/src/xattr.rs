//! The extended attributes the mount answers, shared by the daemon and its subcommands.

/// On the mount's root: the live counters (`s3rdma stats MOUNTPOINT` reads it).
pub const STATS: &str = "user.s3rdma.stats";

/// On a file: how much of its current version the disk cache holds (`s3rdma warm` reads it).
pub const CACHED: &str = "user.s3rdma.cached";
