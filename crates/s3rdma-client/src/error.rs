//! S3 errors, classified once, and the table that turns them into errno values.

use std::fmt;

/// What went wrong, independent of which S3 call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum S3ErrorKind {
    /// 404 / NoSuchKey: the object is not there.
    NotFound,
    /// NoSuchBucket: the bucket is not there.
    NoSuchBucket,
    /// 403 AccessDenied (policy refuses the request).
    AccessDenied,
    /// InvalidAccessKeyId / SignatureDoesNotMatch / ExpiredToken: the credentials were rejected.
    BadCredentials,
    /// No credentials could be found in the AWS chain.
    NoCredentials,
    /// 412 PreconditionFailed: the object no longer has the ETag we pinned.
    PreconditionFailed,
    /// 416 InvalidRange.
    InvalidRange,
    /// 503 SlowDown / throttling, still failing after all retries.
    Throttled,
    /// 5xx after all retries.
    ServerError,
    /// The endpoint could not be reached (DNS, connection refused, reset).
    Unreachable,
    /// A connect or per-attempt timeout.
    Timeout,
    /// InvalidObjectState: archived (Glacier / Deep Archive) and not restored.
    Archived,
    /// The response did not match what we asked for (short body, wrong length, a reply that
    /// breaks the RDMA contract).
    BadResponse,
    /// The endpoint declined RDMA under `rdma=required`.
    RdmaDeclined,
    /// The server does not implement what the request asked for (501 NotImplemented).
    Unsupported,
    /// Anything else.
    Other,
}

/// One failed S3 request, with what a log line or an error message needs.
#[derive(Clone, Debug)]
pub struct S3Error {
    pub kind: S3ErrorKind,
    /// The S3 operation, e.g. "GetObject".
    pub op: &'static str,
    /// The key (or prefix) the request was about.
    pub key: String,
    /// HTTP status, when a response came back.
    pub status: Option<u16>,
    /// S3 error code, e.g. "NoSuchBucket".
    pub code: Option<String>,
    /// Human-readable detail (S3 message or transport error).
    pub message: String,
    /// `x-amz-request-id`, when the server sent one.
    pub request_id: Option<String>,
}

impl S3Error {
    pub fn new(kind: S3ErrorKind, op: &'static str, key: &str, message: impl Into<String>) -> Self {
        S3Error {
            kind,
            op,
            key: key.to_string(),
            status: None,
            code: None,
            message: message.into(),
            request_id: None,
        }
    }

    /// The error of a read pinned to a version (`If-Match`): a deleted object reads like a
    /// replaced one, since the version the reader pinned is gone either way.
    pub fn pinned_gone(mut self) -> S3Error {
        if self.kind == S3ErrorKind::NotFound {
            self.kind = S3ErrorKind::PreconditionFailed;
            self.message = format!("object deleted since it was opened ({})", self.message);
        }
        self
    }
}

/// The S3-error → errno table (see SEMANTICS.md, "Errors").
pub fn errno_for(kind: S3ErrorKind) -> i32 {
    use S3ErrorKind::*;
    match kind {
        NotFound | NoSuchBucket => libc::ENOENT,
        AccessDenied | BadCredentials | NoCredentials | Archived => libc::EACCES,
        PreconditionFailed => libc::ESTALE,
        InvalidRange => libc::EINVAL,
        Unsupported => libc::EOPNOTSUPP,
        Throttled => libc::EAGAIN,
        Timeout => libc::ETIMEDOUT,
        ServerError | Unreachable | BadResponse | RdmaDeclined | Other => libc::EIO,
    }
}

/// Classify from what the server said (status + error code).
pub fn classify(status: Option<u16>, code: Option<&str>) -> S3ErrorKind {
    use S3ErrorKind::*;
    match code {
        Some("NoSuchKey") | Some("NotFound") => return NotFound,
        Some("NoSuchBucket") => return NoSuchBucket,
        Some("AccessDenied") | Some("AllAccessDisabled") => return AccessDenied,
        Some("InvalidAccessKeyId")
        | Some("SignatureDoesNotMatch")
        | Some("ExpiredToken")
        | Some("InvalidToken")
        | Some("TokenRefreshRequired") => return BadCredentials,
        Some("PreconditionFailed") => return PreconditionFailed,
        Some("InvalidRange") => return InvalidRange,
        Some("SlowDown")
        | Some("Throttling")
        | Some("ThrottlingException")
        | Some("RequestLimitExceeded")
        | Some("TooManyRequests") => return Throttled,
        Some("InvalidObjectState") => return Archived,
        _ => {}
    }
    match status {
        Some(404) => NotFound,
        Some(403) => AccessDenied,
        Some(412) => PreconditionFailed,
        Some(416) => InvalidRange,
        Some(429) | Some(503) => Throttled,
        Some(s) if s >= 500 => ServerError,
        _ => Other,
    }
}

impl fmt::Display for S3Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} of {:?} failed: ", self.op, self.key)?;
        if let Some(status) = self.status {
            write!(f, "HTTP {status} ")?;
        }
        if let Some(code) = &self.code {
            write!(f, "{code} ")?;
        }
        write!(f, "({})", self.message)?;
        if let Some(id) = &self.request_id {
            write!(f, " [request id {id}]")?;
        }
        Ok(())
    }
}

impl std::error::Error for S3Error {}

#[cfg(test)]
mod tests {
    use super::S3ErrorKind::*;
    use super::*;

    #[test]
    fn codes_win_over_status() {
        assert_eq!(classify(Some(404), Some("NoSuchBucket")), NoSuchBucket);
        assert_eq!(
            classify(Some(403), Some("SignatureDoesNotMatch")),
            BadCredentials
        );
        assert_eq!(classify(Some(403), Some("InvalidObjectState")), Archived);
        assert_eq!(classify(Some(503), Some("SlowDown")), Throttled);
    }

    #[test]
    fn bare_status_without_body() {
        // HEAD responses carry no body, so only the status is known.
        assert_eq!(classify(Some(404), None), NotFound);
        assert_eq!(classify(Some(403), None), AccessDenied);
        assert_eq!(classify(Some(412), None), PreconditionFailed);
        assert_eq!(classify(Some(500), None), ServerError);
        assert_eq!(classify(Some(502), None), ServerError);
        assert_eq!(classify(Some(429), None), Throttled);
        assert_eq!(classify(Some(400), None), Other);
        assert_eq!(classify(None, None), Other);
    }

    // [S-ERR-TABLE]
    #[test]
    fn errno_table() {
        let table = [
            (NotFound, libc::ENOENT),
            (NoSuchBucket, libc::ENOENT),
            (AccessDenied, libc::EACCES),
            (BadCredentials, libc::EACCES),
            (NoCredentials, libc::EACCES),
            (Archived, libc::EACCES),
            (PreconditionFailed, libc::ESTALE),
            (InvalidRange, libc::EINVAL),
            (Throttled, libc::EAGAIN),
            (Timeout, libc::ETIMEDOUT),
            (ServerError, libc::EIO),
            (Unreachable, libc::EIO),
            (BadResponse, libc::EIO),
            (RdmaDeclined, libc::EIO),
            (Other, libc::EIO),
        ];
        for (kind, errno) in table {
            assert_eq!(errno_for(kind), errno, "{kind:?}");
        }
    }

    #[test]
    fn display_names_op_key_and_request_id() {
        let mut e = S3Error::new(PreconditionFailed, "GetObject", "a/b", "etag changed");
        e.status = Some(412);
        e.request_id = Some("R1".into());
        let s = e.to_string();
        assert!(
            s.contains("GetObject")
                && s.contains("\"a/b\"")
                && s.contains("412")
                && s.contains("R1"),
            "{s}"
        );
    }
}
