//! The cuObject reply contract: how an RDMA GET or PUT answer is judged.
//!
//! - `x-amz-rdma-reply` must be plain ASCII digits in 100..=599; absent or `501` is a decline.
//! - `x-amz-rdma-bytes-transferred` must be plain digits and at most the bytes asked for.
//! - PUT / UploadPart succeed only on HTTP 200 with an ETag and a reply that is absent, 200 or
//!   204. GET succeeds only on (200, 200) or (206, 206) — or (206, 200) when Ceph's deviation is
//!   accepted.
//! - A decline is reply 501 (on any HTTP status, including an error status), and for a GET
//!   also a missing reply header (the server acted as plain S3).

pub const TOKEN_HEADER: &str = "x-amz-rdma-token";
pub const REPLY_HEADER: &str = "x-amz-rdma-reply";
pub const BYTES_HEADER: &str = "x-amz-rdma-bytes-transferred";

/// The value of `x-amz-rdma-reply`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// No header (or an empty one): the server did not speak RDMA.
    Absent,
    /// A well-formed status code.
    Code(u16),
    /// Anything else (signs, spaces, hex, non-ASCII digits, out of range).
    Malformed,
}

pub fn parse_reply(value: Option<&str>) -> Reply {
    match value {
        None | Some("") => Reply::Absent,
        Some(v) if v.bytes().all(|b| b.is_ascii_digit()) && v.len() <= 3 => {
            match v.parse::<u16>() {
                Ok(code) if (100..=599).contains(&code) => Reply::Code(code),
                _ => Reply::Malformed,
            }
        }
        Some(_) => Reply::Malformed,
    }
}

/// `x-amz-rdma-bytes-transferred`: absent or empty is 0; otherwise plain digits ≤ `asked`.
pub fn parse_bytes_transferred(value: Option<&str>, asked: u64) -> Result<u64, String> {
    let v = match value {
        None | Some("") => return Ok(0),
        Some(v) => v,
    };
    if !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{BYTES_HEADER} {v:?} is not a decimal number"));
    }
    let n: u64 = v
        .parse()
        .map_err(|_| format!("{BYTES_HEADER} {v:?} is out of range"))?;
    if n > asked {
        return Err(format!(
            "{BYTES_HEADER} {n} exceeds the {asked} bytes asked for"
        ));
    }
    Ok(n)
}

/// How one RDMA answer is to be taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The transfer happened; for a GET, this many bytes were written into our buffer.
    Done(u64),
    /// The server declined RDMA: resend over HTTP (`rdma=auto`) or fail (`rdma=required`).
    Declined,
    /// The answer breaks the contract; the buffer is garbage.
    Failed(String),
}

/// Judge a GET answer. `accept_ceph_206_200` accepts Ceph's reply 200 on HTTP 206.
pub fn judge_get(
    status: u16,
    reply: Option<&str>,
    bytes: Option<&str>,
    asked: u64,
    accept_ceph_206_200: bool,
) -> Verdict {
    let code = parse_reply(reply);
    let ok = match (status, code) {
        (200, Reply::Code(200)) | (206, Reply::Code(206)) => true,
        (206, Reply::Code(200)) => accept_ceph_206_200,
        _ => false,
    };
    if ok {
        return match parse_bytes_transferred(bytes, asked) {
            Ok(n) => Verdict::Done(n),
            Err(e) => Verdict::Failed(e),
        };
    }
    match code {
        Reply::Absent | Reply::Code(501) => Verdict::Declined,
        _ => Verdict::Failed(format!(
            "RDMA GET failed (http={status}, {REPLY_HEADER}={})",
            reply.unwrap_or("")
        )),
    }
}

/// Judge a PUT or UploadPart answer.
pub fn judge_put(status: u16, reply: Option<&str>, etag: Option<&str>) -> Verdict {
    let code = parse_reply(reply);
    let has_etag = etag.is_some_and(|e| !e.is_empty());
    if status == 200
        && has_etag
        && matches!(code, Reply::Absent | Reply::Code(200) | Reply::Code(204))
    {
        return Verdict::Done(0);
    }
    if code == Reply::Code(501) {
        return Verdict::Declined;
    }
    Verdict::Failed(format!(
        "RDMA PUT failed (http={status}, {REPLY_HEADER}={}, etag {})",
        reply.unwrap_or(""),
        if has_etag { "present" } else { "missing" }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    // [S-RDMA-REPLY]
    #[test]
    fn reply_header_table() {
        let table: &[(Option<&str>, Reply)] = &[
            (None, Reply::Absent),
            (Some(""), Reply::Absent),
            (Some("200"), Reply::Code(200)),
            (Some("206"), Reply::Code(206)),
            (Some("501"), Reply::Code(501)),
            (Some("100"), Reply::Code(100)),
            (Some("599"), Reply::Code(599)),
            (Some("099"), Reply::Malformed),
            (Some("600"), Reply::Malformed),
            (Some(" 200"), Reply::Malformed),
            (Some("200 "), Reply::Malformed),
            (Some("+200"), Reply::Malformed),
            (Some("0x200"), Reply::Malformed),
            (Some("２００"), Reply::Malformed),
            (Some("200xyz"), Reply::Malformed),
            (Some("0200"), Reply::Malformed),
        ];
        for (v, want) in table {
            assert_eq!(parse_reply(*v), *want, "{v:?}");
        }
    }

    #[test]
    fn bytes_transferred_table() {
        assert_eq!(parse_bytes_transferred(None, 10), Ok(0));
        assert_eq!(parse_bytes_transferred(Some(""), 10), Ok(0));
        assert_eq!(parse_bytes_transferred(Some("10"), 10), Ok(10));
        assert_eq!(parse_bytes_transferred(Some("5"), 10), Ok(5));
        assert!(parse_bytes_transferred(Some("11"), 10).is_err());
        assert!(parse_bytes_transferred(Some("-1"), 10).is_err());
        assert!(parse_bytes_transferred(Some("1e3"), 10_000).is_err());
        assert!(parse_bytes_transferred(Some(" 5"), 10).is_err());
        assert!(parse_bytes_transferred(Some("99999999999999999999999"), u64::MAX).is_err());
    }

    #[test]
    fn get_verdicts() {
        use Verdict::*;
        assert_eq!(judge_get(200, Some("200"), Some("10"), 10, false), Done(10));
        assert_eq!(judge_get(206, Some("206"), Some("4"), 10, false), Done(4));
        assert_eq!(judge_get(206, Some("200"), Some("10"), 10, true), Done(10));
        assert!(matches!(
            judge_get(206, Some("200"), Some("10"), 10, false),
            Failed(_)
        ));
        assert!(matches!(
            judge_get(200, Some("206"), None, 10, false),
            Failed(_)
        ));
        assert!(matches!(
            judge_get(200, Some("204"), None, 10, false),
            Failed(_)
        ));
        assert!(matches!(
            judge_get(404, Some("200"), None, 10, false),
            Failed(_)
        ));
        assert!(matches!(
            judge_get(200, Some("200"), Some("11"), 10, false),
            Failed(_)
        ));
        assert_eq!(judge_get(200, None, None, 10, false), Declined);
        assert_eq!(judge_get(200, Some("501"), None, 10, false), Declined);
        assert_eq!(judge_get(501, Some("501"), None, 10, false), Declined);
        assert_eq!(judge_get(503, Some("501"), None, 10, false), Declined);
        assert!(matches!(
            judge_get(500, Some("500"), None, 10, false),
            Failed(_)
        ));
    }

    #[test]
    fn put_verdicts() {
        use Verdict::*;
        assert_eq!(judge_put(200, Some("200"), Some("\"e\"")), Done(0));
        assert_eq!(judge_put(200, None, Some("\"e\"")), Done(0));
        assert_eq!(judge_put(200, Some("204"), Some("\"e\"")), Done(0));
        assert!(matches!(judge_put(200, Some("200"), None), Failed(_)));
        assert!(matches!(judge_put(200, Some("200"), Some("")), Failed(_)));
        assert!(matches!(
            judge_put(200, Some("206"), Some("\"e\"")),
            Failed(_)
        ));
        assert!(matches!(
            judge_put(200, Some("500"), Some("\"e\"")),
            Failed(_)
        ));
        assert!(matches!(
            judge_put(200, Some("200xyz"), Some("\"e\"")),
            Failed(_)
        ));
        assert!(matches!(
            judge_put(500, Some("200"), Some("\"e\"")),
            Failed(_)
        ));
        assert_eq!(judge_put(200, Some("501"), None), Declined);
        assert_eq!(judge_put(501, Some("501"), None), Declined);
        assert_eq!(judge_put(503, Some("501"), None), Declined);
        // A PUT with no reply header and no ETag is a failure, not a decline: resending over
        // HTTP is only safe when the server said it declined.
        assert!(matches!(judge_put(400, None, None), Failed(_)));
    }
}
