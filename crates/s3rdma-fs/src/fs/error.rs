//! One error path (mountpoint-s3's `fs/error.rs` is the anchor): every `do_*` method returns
//! [`Error`], and `?` turns the error of any layer below — the store, a staged file, a name
//! that cannot be a key — into one that keeps its cause. The FUSE adapter hands each to
//! [`S3Fs::failed`], the one place a failure is logged at the level its kind deserves,
//! counted (`s3rdma stats`: `failed_<errno>`) and turned into the errno the kernel returns.
//!
//! A plain errno (`ENOENT` for a missing name, `EBADF` for a closed handle) is an answer,
//! not a failure: it carries no cause and is neither logged nor counted. So is the error of
//! a layer that reports its own failures (an upload, an attribute write-back): see
//! [`Error::reported`].

use fuser::Errno;
use s3rdma_client::ObjectStore;
use s3rdma_client::{S3Error, S3ErrorKind};
use tracing::{debug, warn};

use super::names::BadName;
use super::S3Fs;
use crate::errno::ToErrno;
use crate::stage::StageError;

/// Why a file operation failed: the errno the process gets, and the failure behind it where
/// it is still to be reported.
#[derive(Debug)]
pub struct Error {
    errno: Errno,
    /// Boxed: an operation's `Result` stays as small as its answer.
    cause: Option<Box<Cause>>,
}

#[derive(Debug)]
enum Cause {
    /// An S3 request failed (after its retries).
    S3(S3Error),
    /// An operation on the staged file of `key` failed (its bytes stay staged).
    Stage { key: String, error: StageError },
}

/// What a `do_*` method returns.
pub type FsResult<T> = Result<T, Error>;

impl Error {
    /// The errno the process gets.
    pub fn errno(&self) -> Errno {
        self.errno
    }

    /// An operation on the staged file of `key` failed.
    pub fn staged(key: impl Into<String>, error: StageError) -> Self {
        match error {
            StageError::S3(e) => e.into(),
            error => Error {
                errno: Errno::from_i32(error.to_errno()),
                cause: Some(Box::new(Cause::Stage {
                    key: key.into(),
                    error,
                })),
            },
        }
    }

    /// The failure of a layer that logs and counts its own (the uploader, the attribute
    /// write-back): only its errno goes on.
    pub fn reported(e: &impl ToErrno) -> Self {
        Errno::from_i32(e.to_errno()).into()
    }
}

impl From<Errno> for Error {
    fn from(errno: Errno) -> Self {
        Error { errno, cause: None }
    }
}

impl From<S3Error> for Error {
    fn from(e: S3Error) -> Self {
        Error {
            errno: Errno::from_i32(e.to_errno()),
            cause: Some(Box::new(Cause::S3(e))),
        }
    }
}

impl From<BadName> for Error {
    /// A name that cannot be a key is the answer to the request that named it.
    fn from(b: BadName) -> Self {
        Errno::from_i32(b.to_errno()).into()
    }
}

impl From<Error> for Errno {
    fn from(e: Error) -> Self {
        e.errno
    }
}

impl PartialEq<Errno> for Error {
    fn eq(&self, other: &Errno) -> bool {
        self.errno == *other
    }
}

impl<S: ObjectStore> S3Fs<S> {
    /// The one place a failed operation is reported: its cause logged and counted, its errno
    /// returned for the reply.
    pub(super) fn failed(&self, op: &'static str, e: Error) -> Errno {
        let Some(cause) = &e.cause else {
            return e.errno;
        };
        self.counters.failures.count(e.errno.code());
        match &**cause {
            Cause::S3(e) => log_s3(op, e),
            // The staged file logged where it kept the bytes.
            Cause::Stage {
                error: StageError::Conflict { .. },
                ..
            } => {}
            Cause::Stage { key, error } => {
                warn!(op, key = %key, error = %error, "staged file operation failed")
            }
        }
        e.errno
    }
}

/// An S3 failure, at the level its kind deserves.
fn log_s3(op: &'static str, e: &S3Error) {
    match e.kind {
        S3ErrorKind::NotFound => debug!(op, key = %e.key, "not found"),
        S3ErrorKind::PreconditionFailed => warn!(
            op,
            key = %e.key,
            "object was replaced or deleted since it was opened; reads on this handle fail with ESTALE, reopen the file to read the new version"
        ),
        _ => warn!(op, key = %e.key, error = %e, "operation failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_keep_their_errno_and_plain_answers_have_none() {
        let s3 = Error::from(S3Error::new(
            S3ErrorKind::AccessDenied,
            "GetObject",
            "k",
            "no",
        ));
        assert_eq!(s3, Errno::EACCES);
        assert!(s3.cause.is_some());
        let full = Error::staged("k", StageError::Full);
        assert_eq!((full.errno(), full.cause.is_some()), (Errno::ENOSPC, true));
        let via_stage = Error::staged(
            "k",
            StageError::S3(S3Error::new(
                S3ErrorKind::Throttled,
                "PutObject",
                "k",
                "slow",
            )),
        );
        assert!(matches!(via_stage.cause.as_deref(), Some(Cause::S3(_))));
        assert_eq!(via_stage, Errno::EAGAIN);
        let plain = Error::from(Errno::ENOENT);
        assert_eq!(
            (plain.errno(), plain.cause.is_none()),
            (Errno::ENOENT, true)
        );
        let name = Error::from(BadName::TooLong);
        assert_eq!(
            (name.errno(), name.cause.is_none()),
            (Errno::ENAMETOOLONG, true)
        );
    }
}
