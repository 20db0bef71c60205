//! What each layer's errors mean to a process: [`ToErrno`] gives the errno the kernel returns
//! for an error of the store, the staging area, an upload or a name. The errno tables live
//! beside the error types they read (`s3rdma_client::errno_for`, `StageError`, `WriteError`,
//! `BadName`); `fs::error` carries them to the FUSE adapter.

use s3rdma_client::{errno_for, S3Error};

/// The errno a failed file operation returns for this error.
pub trait ToErrno {
    fn to_errno(&self) -> i32;
}

impl ToErrno for S3Error {
    /// The S3-error → errno table of SEMANTICS.md, "Errors".
    fn to_errno(&self) -> i32 {
        errno_for(self.kind)
    }
}
