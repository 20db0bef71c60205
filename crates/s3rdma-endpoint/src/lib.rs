//! `s3rdma-endpoint`: a loopback S3-over-RDMA endpoint, for testing the RDMA data plane on a
//! host without a NIC.
//!
//! It serves S3 on 127.0.0.1 in front of a real S3 server (the backend). Requests without
//! `x-amz-rdma-token` pass through unchanged (s3s verifies the client's SigV4; s3s-aws forwards
//! with the endpoint's own credentials). With a loopback token (minted by cuobj-ffi's loopback
//! provider) it moves the payload directly between the backend and the client's registered
//! buffer, with `process_vm_readv`/`process_vm_writev` standing in for RDMA READ/WRITE,
//! validates `x-amz-checksum-crc64nvme` against the bytes it moved, and answers as a real
//! endpoint does: empty body, `x-amz-rdma-reply`, `x-amz-rdma-bytes-transferred`.
//!
//! Faults for tests: a file (`--fault-file`) holding `MODE [COUNT] [op=OP] [after=N]` makes the
//! next COUNT RDMA requests (all, without COUNT) misbehave: `decline` (reply 501), `ignore` (act
//! as plain S3, token ignored), `corrupt` (flip a byte of the transfer), `short` (move one byte
//! less), `throttle` (503 SlowDown), `error` (500 InternalError), `delay:MS` (wait, then serve),
//! `drop` (fail the request with no RDMA headers, as a cut connection would look after
//! retries), `reset` and `trickle:MS` (plain GET bodies cut off or slowed), `noetag` (the ETag
//! header removed from the answer), `garbage` (an XML answer's body replaced by junk), or
//! `none`. `op=` (GetObject, PutObject, UploadPart, CompleteMultipartUpload)
//! narrows the fault to that operation (any S3 operation name, or `any`) and extends it to
//! plain requests (where `throttle`, `error`, `drop` and `delay` apply); `after=N` lets the
//! first N matching requests through; `for=MS` makes it an outage of MS milliseconds.
//!
//! RDMA tokens are served only to a connection whose user may access the token's process
//! (root, or the process's own user), as the kernel would allow process_vm_readv.

#![cfg_attr(test, allow(clippy::too_many_lines))]

mod faulty;
mod forward;
pub mod http_layer;
pub mod plan;

pub use plan::{Fault, FaultPlan};

/// An RDMA-aware PUT-like handler: pull the payload from the client's memory (or pass the
/// request through unchanged), forward it with the bytes as the body, answer with the RDMA
/// reply headers.
macro_rules! rdma_upload_handler {
    ($name:ident, $op:ident, $opname:literal, $input:ident, $output:ident) => {
        async fn $name(
            &self,
            mut req: S3Request<s3s::dto::$input>,
        ) -> S3Result<S3Response<s3s::dto::$output>> {
            let crc = req.input.checksum_crc64nvme.clone();
            let pulled = self
                .pull_payload(
                    $opname,
                    &mut req.headers,
                    &req.extensions,
                    req.input.content_length,
                    crc.as_deref(),
                )
                .await?;
            let Some(data) = pulled else {
                return s3s::S3::$op(&self.proxy, req).await;
            };
            let n = data.len() as u64;
            req.input.content_length = Some(n as i64);
            req.input.body = Some(StreamingBlob::from(s3s::Body::from(data)));
            let mut resp = s3s::S3::$op(&self.proxy, req).await?;
            resp.headers.extend(rdma_headers(200, Some(n)));
            Ok(resp)
        }
    };
}

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderValue};
use s3s::dto::StreamingBlob;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Request, S3Response, S3Result};

use s3rdma_proto::checksum;
use s3rdma_proto::loopback_token::LoopbackToken;
use s3rdma_proto::reply::{BYTES_HEADER, REPLY_HEADER, TOKEN_HEADER};

/// Counters of what the endpoint moved.
#[derive(Debug, Default)]
pub struct EndpointStats {
    pub rdma_gets: AtomicU64,
    pub rdma_puts: AtomicU64,
    pub bytes_written_to_clients: AtomicU64,
    pub bytes_read_from_clients: AtomicU64,
    pub plain_requests: AtomicU64,
}

pub struct Endpoint {
    proxy: s3s_aws::Proxy,
    faults: Arc<FaultPlan>,
    pub stats: EndpointStats,
}

fn rdma_headers(reply: u16, bytes: Option<u64>) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(REPLY_HEADER, HeaderValue::from(reply));
    if let Some(n) = bytes {
        h.insert(BYTES_HEADER, HeaderValue::from(n));
    }
    h
}

fn decline_error() -> S3Error {
    let mut e = S3Error::with_message(
        S3ErrorCode::Custom("RDMANotSupported".into()),
        "this endpoint declines RDMA for this request",
    );
    e.set_status_code(http::StatusCode::NOT_IMPLEMENTED);
    e.set_headers(rdma_headers(501, None));
    e
}

fn transfer_failed(msg: String) -> S3Error {
    let mut e = S3Error::with_message(S3ErrorCode::Custom("RDMATransferFailed".into()), msg);
    e.set_status_code(http::StatusCode::INTERNAL_SERVER_ERROR);
    e
}

/// Copy `data` into the client's memory at the token's window.
fn write_to_client(tok: &LoopbackToken, data: &[u8]) -> Result<(), String> {
    if data.len() as u64 > tok.size {
        return Err(format!(
            "{} bytes do not fit the {}-byte token window",
            data.len(),
            tok.size
        ));
    }
    if data.is_empty() {
        return Ok(());
    }
    let local = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let remote = libc::iovec {
        iov_base: tok.addr as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: local points at `data`; the kernel checks the remote range in the other process.
    let n = unsafe { libc::process_vm_writev(tok.pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    if n != data.len() as isize {
        return Err(format!(
            "process_vm_writev moved {n} of {} bytes: {}",
            data.len(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Copy the token's window out of the client's memory.
fn read_from_client(tok: &LoopbackToken) -> Result<Vec<u8>, String> {
    let mut buf = vec![0u8; tok.size as usize];
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: tok.addr as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: local points at our buffer; the kernel checks the remote range.
    let n = unsafe { libc::process_vm_readv(tok.pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    if n != buf.len() as isize {
        return Err(format!(
            "process_vm_readv moved {n} of {} bytes: {}",
            buf.len(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(buf)
}

impl Endpoint {
    pub fn new(backend: aws_sdk_s3::Client, faults: Arc<FaultPlan>) -> Self {
        Endpoint {
            proxy: s3s_aws::Proxy::from(backend),
            faults,
            stats: EndpointStats::default(),
        }
    }

    /// The fault for this request (operation `op`, carrying an RDMA token or not).
    fn next_fault(&self, op: &str, rdma: bool) -> Fault {
        self.faults.next(op, rdma, false)
    }

    /// The faults that apply to a plain (token-less) request.
    async fn plain_fault(&self, op: &str) -> S3Result<()> {
        Self::plain_error(self.next_fault(op, false)).await
    }

    /// The error (or delay) `fault` makes of a plain request.
    async fn plain_error(fault: Fault) -> S3Result<()> {
        match fault {
            Fault::Throttle => Err(s3_error!(SlowDown, "throttled (fault injection)")),
            Fault::Error => Err(s3_error!(InternalError, "internal error (fault injection)")),
            Fault::Drop => Err(transfer_failed(
                "connection dropped (fault injection)".into(),
            )),
            Fault::Delay(ms) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    pub(crate) async fn complete_multipart_faulty(
        &self,
        req: S3Request<s3s::dto::CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<s3s::dto::CompleteMultipartUploadOutput>> {
        self.plain_fault("CompleteMultipartUpload").await?;
        s3s::S3::complete_multipart_upload(&self.proxy, req).await
    }

    /// The request's loopback token, if it carries one. A token that is malformed, or whose
    /// process is gone, is refused (400 InvalidRDMAToken).
    fn token(
        headers: &HeaderMap,
        extensions: &http::Extensions,
    ) -> S3Result<Option<LoopbackToken>> {
        let Some(v) = headers.get(TOKEN_HEADER) else {
            return Ok(None);
        };
        let s = v
            .to_str()
            .map_err(|_| s3_error!(InvalidRequest, "x-amz-rdma-token is not ASCII"))?;
        let invalid = |why: &str| {
            let mut e = S3Error::with_message(
                S3ErrorCode::Custom("InvalidRDMAToken".into()),
                why.to_string(),
            );
            e.set_status_code(http::StatusCode::BAD_REQUEST);
            e
        };
        let tok = LoopbackToken::parse(s)
            .ok_or_else(|| invalid("not a loopback token (81 hex characters in 7 fields)"))?;
        Self::check_request_rules(headers)?;
        if !tok.is_live_process() {
            return Err(invalid("the process that minted this token is gone"));
        }
        if let Err(why) = http_layer::may_access(extensions.get::<http_layer::Peer>(), tok.pid) {
            tracing::warn!(pid = tok.pid, "refusing an RDMA token: {why}");
            return Err(S3Error::with_message(S3ErrorCode::AccessDenied, why));
        }
        Ok(Some(tok))
    }

    /// The cuObject request rules, enforced as strictly as a real endpoint may: the token is
    /// signed, the payload is `UNSIGNED-PAYLOAD` with `Content-Length: 0`, and there is no
    /// aws-chunked encoding, trailer or Content-MD5.
    fn check_request_rules(headers: &HeaderMap) -> S3Result<()> {
        let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let bad = |why: &str| {
            Err(s3_error!(
                InvalidRequest,
                "RDMA request rule broken: {}",
                why
            ))
        };
        let signed = get("authorization")
            .and_then(|a| a.split("SignedHeaders=").nth(1))
            .map(|rest| rest.split(',').next().unwrap_or(""))
            .is_some_and(|list| list.split(';').any(|h| h == TOKEN_HEADER));
        if !signed {
            return bad("x-amz-rdma-token must be among the SigV4 SignedHeaders");
        }
        if get("x-amz-content-sha256") != Some("UNSIGNED-PAYLOAD") {
            return bad("x-amz-content-sha256 must be UNSIGNED-PAYLOAD");
        }
        if get("content-length") != Some("0") {
            return bad("Content-Length must be 0");
        }
        for h in [
            "transfer-encoding",
            "x-amz-decoded-content-length",
            "x-amz-trailer",
            "content-md5",
        ] {
            if headers.contains_key(h) {
                return bad(&format!("{h} must not be sent"));
            }
        }
        if get("content-encoding").is_some_and(|v| v.contains("aws-chunked")) {
            return bad("Content-Encoding aws-chunked must not be sent");
        }
        Ok(())
    }

    async fn get_object_rdma(
        &self,
        mut req: S3Request<s3s::dto::GetObjectInput>,
    ) -> S3Result<S3Response<s3s::dto::GetObjectOutput>> {
        let Some(tok) = Self::token(&req.headers, &req.extensions)? else {
            return self.get_object_plain(req).await;
        };
        req.headers.remove(TOKEN_HEADER);
        let fault = self.next_fault("GetObject", true);
        match fault {
            Fault::Throttle => return Err(s3_error!(SlowDown, "throttled (fault injection)")),
            Fault::Error => {
                return Err(s3_error!(InternalError, "internal error (fault injection)"))
            }
            Fault::Drop => {
                return Err(transfer_failed(
                    "connection dropped (fault injection)".into(),
                ))
            }
            Fault::Delay(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
            Fault::Ignore => return s3s::S3::get_object(&self.proxy, req).await,
            Fault::Decline => {
                // The spec's decline: HTTP 200 + reply 501, with the object in the body.
                let mut resp = s3s::S3::get_object(&self.proxy, req).await?;
                resp.headers.extend(rdma_headers(501, None));
                return Ok(resp);
            }
            _ => {}
        }
        let mut resp = s3s::S3::get_object(&self.proxy, req).await?;
        let len = self.write_body(&mut resp, &tok, fault).await?;
        let reply = if resp.output.content_range.is_some() {
            206
        } else {
            200
        };
        resp.output.content_length = Some(0);
        resp.output.body = Some(StreamingBlob::from(s3s::Body::empty()));
        if fault == Fault::BadReply {
            resp.headers
                .insert(REPLY_HEADER, HeaderValue::from_static("2x6"));
            resp.headers
                .insert(BYTES_HEADER, HeaderValue::from_static("12abc"));
            return Ok(resp);
        }
        resp.headers.extend(rdma_headers(reply, Some(len)));
        Ok(resp)
    }

    /// A GET without a token: passed through, with the faults a plain request can suffer.
    async fn get_object_plain(
        &self,
        req: S3Request<s3s::dto::GetObjectInput>,
    ) -> S3Result<S3Response<s3s::dto::GetObjectOutput>> {
        self.stats.plain_requests.fetch_add(1, Ordering::Relaxed);
        let fault = self.next_fault("GetObject", false);
        Self::plain_error(fault).await?;
        let mut resp = s3s::S3::get_object(&self.proxy, req).await?;
        if !matches!(fault, Fault::Reset | Fault::Trickle(_)) {
            return Ok(resp);
        }
        if let Some(body) = resp.output.body.take() {
            let data = s3s::Body::from(body)
                .store_all_limited(usize::MAX)
                .await
                .map_err(|e| transfer_failed(format!("backend body: {e}")))?;
            resp.output.body = Some(match fault {
                Fault::Trickle(ms) => faulty::FaultyBody::trickle(data, Duration::from_millis(ms)),
                _ => faulty::FaultyBody::reset(data),
            });
        }
        Ok(resp)
    }

    /// The body of `resp` written into the client's window of `tok` (spoilt as `fault` says);
    /// the bytes written.
    async fn write_body(
        &self,
        resp: &mut S3Response<s3s::dto::GetObjectOutput>,
        tok: &LoopbackToken,
        fault: Fault,
    ) -> S3Result<u64> {
        let body = resp
            .output
            .body
            .take()
            .unwrap_or_else(|| StreamingBlob::from(s3s::Body::empty()));
        let mut body = s3s::Body::from(body);
        let limit = tok.size as usize;
        let bytes = body.store_all_limited(limit).await.map_err(|e| {
            transfer_failed(format!(
                "object does not fit the token window of {limit} bytes: {e}"
            ))
        })?;
        let mut data = bytes.to_vec();
        match fault {
            Fault::Corrupt if !data.is_empty() => data[0] ^= 0xff,
            Fault::Short if !data.is_empty() => {
                data.pop();
            }
            _ => {}
        }
        write_to_client(tok, &data).map_err(transfer_failed)?;
        self.stats.rdma_gets.fetch_add(1, Ordering::Relaxed);
        let len = data.len() as u64;
        self.stats
            .bytes_written_to_clients
            .fetch_add(len, Ordering::Relaxed);
        Ok(len)
    }

    /// For PUT and UploadPart: the bytes to store, moved from the client's memory and checked
    /// against the checksum the client signed. `None`: pass the request through unchanged.
    async fn pull_payload(
        &self,
        op: &str,
        headers: &mut HeaderMap,
        extensions: &http::Extensions,
        content_length: Option<i64>,
        crc64nvme: Option<&str>,
    ) -> S3Result<Option<Vec<u8>>> {
        let Some(tok) = Self::token(headers, extensions)? else {
            self.stats.plain_requests.fetch_add(1, Ordering::Relaxed);
            self.plain_fault(op).await?;
            return Ok(None);
        };
        headers.remove(TOKEN_HEADER);
        if content_length.unwrap_or(0) != 0 {
            return Err(s3_error!(
                InvalidRequest,
                "an RDMA PUT must have an empty body (Content-Length: 0)"
            ));
        }
        let fault = self.next_fault(op, true);
        match fault {
            Fault::Throttle => return Err(s3_error!(SlowDown, "throttled (fault injection)")),
            Fault::Error => {
                return Err(s3_error!(InternalError, "internal error (fault injection)"))
            }
            Fault::Drop => {
                return Err(transfer_failed(
                    "connection dropped (fault injection)".into(),
                ))
            }
            Fault::Decline => return Err(decline_error()),
            Fault::Ignore => return Ok(None),
            _ => {}
        }
        let mut data = read_from_client(&tok).map_err(transfer_failed)?;
        match fault {
            Fault::Corrupt if !data.is_empty() => data[0] ^= 0xff,
            Fault::Short if !data.is_empty() => {
                data.pop();
            }
            _ => {}
        }
        if let Some(want) = crc64nvme {
            let got = checksum::crc64nvme_base64(&data);
            if got != want {
                return Err(s3_error!(
                    BadDigest,
                    "x-amz-checksum-crc64nvme {want} does not match the {} bytes moved ({got})",
                    data.len()
                ));
            }
        }
        self.stats.rdma_puts.fetch_add(1, Ordering::Relaxed);
        self.stats
            .bytes_read_from_clients
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        if let Fault::Delay(ms) = fault {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        Ok(Some(data))
    }

    // PutObject and UploadPart: the same payload move, for two input types.
    rdma_upload_handler!(
        put_object_rdma,
        put_object,
        "PutObject",
        PutObjectInput,
        PutObjectOutput
    );
    rdma_upload_handler!(
        upload_part_rdma,
        upload_part,
        "UploadPart",
        UploadPartInput,
        UploadPartOutput
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    const AUTH: &str = "AWS4-HMAC-SHA256 Credential=k/20261202/us-east-1/s3/aws4_request, SignedHeaders=content-length;host;x-amz-content-sha256;x-amz-date;x-amz-rdma-token, Signature=00";

    #[test]
    fn request_rules() {
        let good = [
            ("authorization", AUTH),
            ("x-amz-content-sha256", "UNSIGNED-PAYLOAD"),
            ("content-length", "0"),
        ];
        assert!(Endpoint::check_request_rules(&headers(&good)).is_ok());
        let unsigned_token = AUTH.replace(";x-amz-rdma-token", "");
        let cases: Vec<Vec<(&'static str, &str)>> = vec![
            vec![("authorization", &unsigned_token), good[1], good[2]],
            vec![
                good[0],
                (
                    "x-amz-content-sha256",
                    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                ),
                good[2],
            ],
            vec![good[0], good[1], ("content-length", "5")],
            vec![good[0], good[1]],
            vec![good[0], good[1], good[2], ("transfer-encoding", "chunked")],
            vec![
                good[0],
                good[1],
                good[2],
                ("content-encoding", "aws-chunked"),
            ],
            vec![
                good[0],
                good[1],
                good[2],
                ("x-amz-trailer", "x-amz-checksum-crc64nvme"),
            ],
            vec![good[0], good[1], good[2], ("content-md5", "AAAA")],
        ];
        for c in cases {
            assert!(
                Endpoint::check_request_rules(&headers(&c)).is_err(),
                "{c:?}"
            );
        }
    }

    #[test]
    fn faults() {
        assert_eq!(Fault::parse("decline"), Ok(Fault::Decline));
        assert_eq!(Fault::parse("delay:250"), Ok(Fault::Delay(250)));
        assert!(Fault::parse("delay:soon").is_err());
        assert!(Fault::parse("explode").is_err());
        assert_eq!(Fault::parse("reset"), Ok(Fault::Reset));
        assert_eq!(Fault::parse("badreply"), Ok(Fault::BadReply));
        assert_eq!(Fault::parse("trickle:40"), Ok(Fault::Trickle(40)));
        assert!(Fault::parse("trickle:").is_err());
    }
}
