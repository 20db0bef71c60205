//! Stores for tests of the layers above (feature `testing`): [`MemStore`], an in-memory bucket
//! with S3's conditional semantics and per-operation counters, and [`Faulty`], a wrapper that
//! injects errors, stalls, RDMA declines and short transfers.

mod faulty;
mod mem;

pub use faulty::{Fault, Faulty};
pub use mem::{MemStore, MIN_PART};

/// The S3 operations the stores count and faults can target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Head,
    List,
    Get,
    Put,
    CreateMultipart,
    UploadPart,
    CompleteMultipart,
    AbortMultipart,
    Delete,
    /// CopyObject, or one UploadPartCopy of a multipart copy.
    Copy,
}

impl Op {
    pub const ALL: [Op; 10] = [
        Op::Head,
        Op::List,
        Op::Get,
        Op::Put,
        Op::CreateMultipart,
        Op::UploadPart,
        Op::CompleteMultipart,
        Op::AbortMultipart,
        Op::Delete,
        Op::Copy,
    ];

    /// The S3 API name, as in logs and errors.
    pub fn name(self) -> &'static str {
        match self {
            Op::Head => "HeadObject",
            Op::List => "ListObjectsV2",
            Op::Get => "GetObject",
            Op::Put => "PutObject",
            Op::CreateMultipart => "CreateMultipartUpload",
            Op::UploadPart => "UploadPart",
            Op::CompleteMultipart => "CompleteMultipartUpload",
            Op::AbortMultipart => "AbortMultipartUpload",
            Op::Delete => "DeleteObject",
            Op::Copy => "CopyObject",
        }
    }
}
