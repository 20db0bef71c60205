//! Payload moves over S3-over-RDMA (cuObject): the token interceptor, the RDMA GET and PUT, and
//! the fallback to HTTP when the endpoint declines.
//!
//! Request rules: `x-amz-rdma-token` is added before SigV4 signing, and a fresh token is minted
//! for every attempt (retries re-sign); the body is empty with `Content-Length: 0` and
//! `x-amz-content-sha256: UNSIGNED-PAYLOAD`; the SDK's own checksums run only "when required";
//! PUT carries `x-amz-checksum-crc64nvme` of the real payload.

use s3rdma_proto::sync::Lock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use s3rdma_metrics::{load, Histogram, Report, Sink, Value};

use aws_sdk_s3::config::interceptors::{
    BeforeDeserializationInterceptorContextRef, BeforeTransmitInterceptorContextMut,
};
use aws_sdk_s3::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_smithy_runtime_api::box_error::BoxError;
use cuobj_ffi::{Op, OwnedToken, Registration};

use s3rdma_proto::reply::{self, Verdict, BYTES_HEADER, REPLY_HEADER, TOKEN_HEADER};

/// `rdma=` on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RdmaMode {
    /// Never mint tokens: plain HTTP.
    Off,
    /// Use RDMA; when the endpoint declines, move that request over HTTP and count it.
    #[default]
    Auto,
    /// Use RDMA; a decline is an error.
    Required,
}

impl std::str::FromStr for RdmaMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(RdmaMode::Off),
            "auto" => Ok(RdmaMode::Auto),
            "required" => Ok(RdmaMode::Required),
            other => Err(format!(
                "rdma mode {other:?} is not one of off, auto, required"
            )),
        }
    }
}

/// Counters of the data plane, readable by the user.
#[derive(Debug, Default)]
pub struct TransportStats {
    pub rdma_bytes_read: AtomicU64,
    pub rdma_bytes_written: AtomicU64,
    pub http_bytes_read: AtomicU64,
    pub http_bytes_written: AtomicU64,
    pub tokens_minted: AtomicU64,
    pub declines: AtomicU64,
    pub fallbacks: AtomicU64,
    pub reply_errors: AtomicU64,
    /// S3 requests sent and not yet answered (a gauge).
    pub requests_in_flight: AtomicU64,
    /// Whether the first decline has been logged at WARN (later ones log at DEBUG).
    pub warned_decline: std::sync::atomic::AtomicBool,
    /// Times `rdma=auto` stopped sending tokens after declines in a row, and the requests
    /// sent over HTTP meanwhile without trying RDMA.
    pub rdma_pauses: AtomicU64,
    pub rdma_paused_requests: AtomicU64,
    pause: Mutex<Pause>,
    /// Whether `pause` holds anything (declines or a pause): read without its lock on every
    /// RDMA request.
    pause_engaged: std::sync::atomic::AtomicBool,
    /// Latency of every S3 request, by operation and transport (index: [`S3Request`] ×
    /// [`Transport`]).
    latency: [[Histogram; 2]; S3Request::ALL.len()],
}

/// The S3 operations this mount sends (a label of the latency histograms).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum S3Request {
    Head,
    List,
    Get,
    Put,
    CreateMultipart,
    UploadPart,
    CompleteMultipart,
    AbortMultipart,
    UploadPartCopy,
    Copy,
    Delete,
}

impl S3Request {
    pub const ALL: [S3Request; 11] = [
        S3Request::Head,
        S3Request::List,
        S3Request::Get,
        S3Request::Put,
        S3Request::CreateMultipart,
        S3Request::UploadPart,
        S3Request::CompleteMultipart,
        S3Request::AbortMultipart,
        S3Request::UploadPartCopy,
        S3Request::Copy,
        S3Request::Delete,
    ];

    /// The S3 API's name of the operation.
    pub fn name(self) -> &'static str {
        match self {
            S3Request::Head => "HeadObject",
            S3Request::List => "ListObjectsV2",
            S3Request::Get => "GetObject",
            S3Request::Put => "PutObject",
            S3Request::CreateMultipart => "CreateMultipartUpload",
            S3Request::UploadPart => "UploadPart",
            S3Request::CompleteMultipart => "CompleteMultipartUpload",
            S3Request::AbortMultipart => "AbortMultipartUpload",
            S3Request::UploadPartCopy => "UploadPartCopy",
            S3Request::Copy => "CopyObject",
            S3Request::Delete => "DeleteObject",
        }
    }

    /// Its line prefix in `s3rdma stats`.
    fn stat(self) -> &'static str {
        match self {
            S3Request::Head => "s3_head",
            S3Request::List => "s3_list",
            S3Request::Get => "s3_get",
            S3Request::Put => "s3_put",
            S3Request::CreateMultipart => "s3_create_multipart",
            S3Request::UploadPart => "s3_upload_part",
            S3Request::CompleteMultipart => "s3_complete_multipart",
            S3Request::AbortMultipart => "s3_abort_multipart",
            S3Request::UploadPartCopy => "s3_upload_part_copy",
            S3Request::Copy => "s3_copy",
            S3Request::Delete => "s3_delete",
        }
    }
}

/// How a request's body moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Http = 0,
    Rdma = 1,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::Http => "http",
            Transport::Rdma => "rdma",
        }
    }
}

/// Declines in a row before `rdma=auto` stops sending tokens for a while.
pub const DECLINES_TO_PAUSE: u32 = 3;
/// The first pause; each one that follows a failed retry doubles, up to [`MAX_PAUSE`].
pub const FIRST_PAUSE: std::time::Duration = std::time::Duration::from_secs(30);
pub const MAX_PAUSE: std::time::Duration = std::time::Duration::from_secs(600);

/// The decline memory of `rdma=auto` (see [`TransportStats::rdma_paused`]).
#[derive(Debug, Default)]
struct Pause {
    in_a_row: u32,
    until: Option<std::time::Instant>,
    /// The next pause's length (zero: [`FIRST_PAUSE`]).
    next: std::time::Duration,
}

/// One S3 request under way: counted in `requests_in_flight` until dropped, when its time
/// goes into the latency histogram of its operation and transport.
pub struct RequestTimer {
    pub start: std::time::Instant,
    stats: Arc<TransportStats>,
    op: S3Request,
    transport: Transport,
}

impl Drop for RequestTimer {
    fn drop(&mut self) {
        self.stats
            .requests_in_flight
            .fetch_sub(1, Ordering::Relaxed);
        self.stats.latency[self.op as usize][self.transport as usize].observe(self.start.elapsed());
    }
}

impl TransportStats {
    /// A request starts now.
    pub fn request(self: &Arc<Self>, op: S3Request, transport: Transport) -> RequestTimer {
        self.requests_in_flight.fetch_add(1, Ordering::Relaxed);
        RequestTimer {
            start: std::time::Instant::now(),
            stats: self.clone(),
            op,
            transport,
        }
    }

    /// The endpoint declined RDMA for one request: counted; an error under `rdma=required`,
    /// else a fallback to HTTP (counted and logged).
    pub fn decline(
        &self,
        mode: RdmaMode,
        op: &'static str,
        key: &str,
    ) -> Result<(), crate::S3Error> {
        Self::add(&self.declines, 1);
        if mode == RdmaMode::Required {
            return Err(crate::S3Error::new(
                crate::S3ErrorKind::RdmaDeclined,
                op,
                key,
                "the endpoint declined RDMA (x-amz-rdma-reply 501 or none) and rdma=required; use rdma=auto to fall back to HTTP",
            ));
        }
        Self::add(&self.fallbacks, 1);
        if self.warned_decline.swap(true, Ordering::Relaxed) {
            tracing::debug!(
                op,
                key,
                "endpoint declined RDMA; moving this request over HTTP"
            );
        } else {
            tracing::warn!(
                op,
                key,
                "endpoint declined RDMA; moving this request over HTTP (later declines log at DEBUG; see declines in s3rdma stats)"
            );
        }
        let mut p = self.pause.locked();
        self.pause_engaged.store(true, Ordering::Relaxed);
        p.in_a_row += 1;
        if p.in_a_row >= DECLINES_TO_PAUSE && p.until.is_none() {
            let pause = if p.next.is_zero() {
                FIRST_PAUSE
            } else {
                p.next
            };
            p.until = Some(std::time::Instant::now() + pause);
            p.next = (pause * 2).min(MAX_PAUSE);
            p.in_a_row = 0;
            Self::add(&self.rdma_pauses, 1);
            tracing::info!(
                declines = DECLINES_TO_PAUSE,
                pause_s = pause.as_secs(),
                "the endpoint declined RDMA for several requests in a row: requests go over HTTP without trying RDMA for a while, then RDMA is tried again (rdma_pauses in s3rdma stats)"
            );
        }
        Ok(())
    }

    /// Whether `rdma=auto` should skip RDMA for the next request (it is then counted): the
    /// endpoint declined [`DECLINES_TO_PAUSE`] in a row and the pause has not run out. When it
    /// runs out, requests try RDMA again; a decline then pauses anew for twice as long (up to
    /// [`MAX_PAUSE`]), a transfer over RDMA forgets it all.
    pub fn rdma_paused(&self) -> bool {
        self.paused_at(std::time::Instant::now())
    }

    fn paused_at(&self, now: std::time::Instant) -> bool {
        if !self.pause_engaged.load(Ordering::Relaxed) {
            return false;
        }
        let mut p = self.pause.locked();
        match p.until {
            Some(t) if now < t => {
                Self::add(&self.rdma_paused_requests, 1);
                true
            }
            Some(_) => {
                // Try again; the first decline pauses anew.
                p.until = None;
                p.in_a_row = DECLINES_TO_PAUSE - 1;
                false
            }
            None => false,
        }
    }

    /// A transfer went over RDMA: the endpoint takes it.
    pub fn rdma_worked(&self) {
        if !self.pause_engaged.load(Ordering::Relaxed) {
            return;
        }
        let mut p = self.pause.locked();
        *p = Pause::default();
        self.pause_engaged.store(false, Ordering::Relaxed);
    }

    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// A counter as reported: (name in `s3rdma stats`, help, counter, name in /metrics when it
/// differs).
type Reported<'a> = (
    &'static str,
    &'static str,
    &'a AtomicU64,
    Option<&'static str>,
);

impl TransportStats {
    /// The RDMA counters, as reported.
    fn rdma_counters(&self) -> [Reported<'_>; 6] {
        [
            (
                "tokens",
                "RDMA tokens minted (one per RDMA attempt).",
                &self.tokens_minted,
                Some("rdma_tokens"),
            ),
            (
                "declines",
                "Requests the endpoint declined to serve over RDMA.",
                &self.declines,
                Some("rdma_declines"),
            ),
            (
                "fallbacks",
                "Declined requests moved over HTTP instead (rdma=auto).",
                &self.fallbacks,
                Some("rdma_fallbacks"),
            ),
            (
                "rdma_pauses",
                "Times rdma=auto stopped sending tokens after declines in a row.",
                &self.rdma_pauses,
                None,
            ),
            (
                "rdma_paused_requests",
                "Requests sent over HTTP without trying RDMA during a pause.",
                &self.rdma_paused_requests,
                None,
            ),
            (
                "reply_errors",
                "RDMA replies that did not match the request (refused, moved over HTTP or failed).",
                &self.reply_errors,
                Some("rdma_reply_errors"),
            ),
        ]
    }
}

impl Report for TransportStats {
    fn report(&self, out: &mut dyn Sink) {
        const MOVED: &str = "Object bytes moved, by direction and transport.";
        for (stat, direction, transport, c) in [
            ("rdma_bytes_read", "read", "rdma", &self.rdma_bytes_read),
            (
                "rdma_bytes_written",
                "written",
                "rdma",
                &self.rdma_bytes_written,
            ),
            ("http_bytes_read", "read", "http", &self.http_bytes_read),
            (
                "http_bytes_written",
                "written",
                "http",
                &self.http_bytes_written,
            ),
        ] {
            let labels: &[(&str, &str)] = &[("direction", direction), ("transport", transport)];
            out.value(Value::counter(stat, MOVED, load(c)).exported("transfer_bytes", labels));
        }
        for (stat, help, c, exported) in self.rdma_counters() {
            let v = Value::counter(stat, help, load(c));
            out.value(match exported {
                Some(name) => v.exported(name, &[]),
                None => v,
            });
        }
        out.value(
            Value::gauge(
                "requests_in_flight",
                "S3 requests sent and not yet answered.",
                load(&self.requests_in_flight),
            )
            .exported("s3_requests_in_flight", &[]),
        );
        for op in S3Request::ALL {
            for t in [Transport::Http, Transport::Rdma] {
                out.histogram(
                    &format!("{}_{}", op.stat(), t.name()),
                    "s3_request_seconds",
                    &[("operation", op.name()), ("transport", t.name())],
                    "Time from sending an S3 request to its answer (retries each count), by operation and transport.",
                    &self.latency[op as usize][t as usize],
                );
            }
        }
    }
}

/// What the interceptor saw of the last attempt's response.
#[derive(Debug, Default, Clone)]
pub struct ReplySeen {
    pub status: u16,
    pub reply: Option<String>,
    pub bytes: Option<String>,
    pub etag: Option<String>,
}

/// Mints a fresh token for every attempt (before signing) and records the RDMA reply headers.
#[derive(Debug)]
pub struct TokenInterceptor {
    reg: Arc<Registration>,
    offset: usize,
    len: usize,
    op: Op,
    stats: Arc<TransportStats>,
    token: Mutex<Option<OwnedToken>>,
    seen: Arc<Mutex<ReplySeen>>,
}

impl TokenInterceptor {
    pub fn new(
        reg: Arc<Registration>,
        offset: usize,
        len: usize,
        op: Op,
        stats: Arc<TransportStats>,
        seen: Arc<Mutex<ReplySeen>>,
    ) -> Self {
        TokenInterceptor {
            reg,
            offset,
            len,
            op,
            stats,
            token: Mutex::new(None),
            seen,
        }
    }
}

impl Intercept for TokenInterceptor {
    fn name(&self) -> &'static str {
        "S3rdmaRdmaToken"
    }

    fn modify_before_signing(
        &self,
        context: &mut BeforeTransmitInterceptorContextMut<'_>,
        _rc: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        // The payload is not signed (the body is empty; the bytes move over RDMA).
        cfg.interceptor_state()
            .store_put(aws_runtime::auth::PayloadSigningOverride::unsigned_payload());
        let mut slot = self.token.locked();
        // The previous attempt's token is released before the next one is minted.
        drop(slot.take());
        let token = OwnedToken::mint(&self.reg, self.offset, self.len, self.op)?;
        TransportStats::add(&self.stats.tokens_minted, 1);
        let headers = context.request_mut().headers_mut();
        headers.insert(TOKEN_HEADER, token.as_str().to_string());
        headers.insert("content-length", "0");
        headers.remove("content-md5");
        *slot = Some(token);
        Ok(())
    }

    fn read_before_deserialization(
        &self,
        context: &BeforeDeserializationInterceptorContextRef<'_>,
        _rc: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let r = context.response();
        let h = r.headers();
        *self.seen.locked() = ReplySeen {
            status: r.status().as_u16(),
            reply: h.get(REPLY_HEADER).map(str::to_string),
            bytes: h.get(BYTES_HEADER).map(str::to_string),
            etag: h.get("etag").map(str::to_string),
        };
        Ok(())
    }
}

/// Judge what the interceptor recorded for a GET of `asked` bytes.
pub fn judge_get(seen: &ReplySeen, asked: u64, accept_ceph: bool) -> Verdict {
    reply::judge_get(
        seen.status,
        seen.reply.as_deref(),
        seen.bytes.as_deref(),
        asked,
        accept_ceph,
    )
}

/// Judge what the interceptor recorded for a PUT / UploadPart.
pub fn judge_put(seen: &ReplySeen) -> Verdict {
    reply::judge_put(seen.status, seen.reply.as_deref(), seen.etag.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    // [S-RDMA-DECLINE]
    #[test]
    fn declines_in_a_row_pause_rdma_for_longer_each_time_until_it_works() {
        let st = TransportStats::default();
        let decline = || st.decline(RdmaMode::Auto, "PutObject", "k").unwrap();
        decline();
        decline();
        assert!(!st.rdma_paused());
        decline();
        let t = Instant::now();
        assert!(st.paused_at(t));
        assert!(st.paused_at(t + FIRST_PAUSE - Duration::from_secs(1)));
        assert_eq!(st.rdma_pauses.load(Ordering::Relaxed), 1);
        // Run out: RDMA is tried again; one more decline pauses twice as long.
        assert!(!st.paused_at(t + FIRST_PAUSE + Duration::from_secs(1)));
        decline();
        let t = Instant::now();
        assert!(st.paused_at(t + 2 * FIRST_PAUSE - Duration::from_secs(1)));
        assert!(!st.paused_at(t + 2 * FIRST_PAUSE + Duration::from_secs(1)));
        // A transfer over RDMA forgets it: three declines in a row are needed again.
        st.rdma_worked();
        decline();
        decline();
        assert!(!st.rdma_paused());
        assert_eq!(st.rdma_pauses.load(Ordering::Relaxed), 2);
        // Under rdma=required a decline is an error and pauses nothing.
        let req = TransportStats::default();
        for _ in 0..5 {
            assert!(req.decline(RdmaMode::Required, "GetObject", "k").is_err());
        }
        assert!(!req.rdma_paused());
    }
}
