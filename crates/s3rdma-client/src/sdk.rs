//! The AWS SDK store: [`S3Client`] implements [`ObjectStore`] over HTTP and S3-over-RDMA.
//!
//! Retries (with jittered exponential backoff on throttling, 5xx and connection errors) and
//! timeouts are the AWS SDK's standard retry strategy, configured here; each call converts the
//! SDK's error into an [`S3Error`] that knows its errno.

use s3rdma_proto::sync::Lock;
use std::time::{Duration, SystemTime};

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::BehaviorVersion;
use std::sync::{Arc, Mutex};

use aws_sdk_s3::config::{Region, RequestChecksumCalculation, ResponseChecksumValidation};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::operation::get_object::GetObjectOutput;
use aws_sdk_s3::operation::RequestId;
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use cuobj_ffi::Op;
use tracing::{debug, Instrument};

use crate::rdma::{RdmaMode, S3Request, Transport, TransportStats};
use crate::store::{Condition, ListPage, ObjectInfo, ObjectStore, PutSource, RdmaWindow};
use crate::{FileMeta, S3Error, S3ErrorKind};

use crate::error;
use crate::rdma::{self, ReplySeen, RequestTimer, TokenInterceptor};
use s3rdma_proto::checksum;
use s3rdma_proto::reply::{Verdict, REPLY_HEADER};

/// How to reach the endpoint: the user's choices from the command line.
#[derive(Clone, Debug, Default)]
pub struct S3Options {
    pub bucket: String,
    pub endpoint_url: Option<String>,
    pub region: Option<String>,
    pub profile: Option<String>,
    pub force_path_style: bool,
    pub no_sign_request: bool,
    /// Total attempts per request (1 = no retry).
    pub max_attempts: u32,
    pub connect_timeout: Duration,
    /// Limit for one attempt, and for any pause between two chunks of a GET body.
    pub request_timeout: Duration,
    /// `rdma=off|auto|required`.
    pub rdma: RdmaMode,
    /// Accept Ceph RGW's `x-amz-rdma-reply: 200` on an HTTP 206 ranged GET.
    pub rdma_accept_206_200: bool,
    /// Fixed (access key, secret) instead of the AWS chain: for programs that embed the client.
    pub static_credentials: Option<(String, String)>,
}

/// A cheap-to-clone handle on the bucket.
#[derive(Clone, Debug)]
pub struct S3Client {
    client: aws_sdk_s3::Client,
    /// The same endpoint with the SDK's checksums "when required": RDMA bodies are empty.
    rdma_client: aws_sdk_s3::Client,
    rdma: RdmaMode,
    accept_206_200: bool,
    stats: Arc<TransportStats>,
    bucket: String,
    endpoint: String,
    request_timeout: Duration,
    /// Attempts per request: also how often a GET whose body fails is fetched again.
    max_attempts: u32,
    credentials: Option<aws_credential_types::provider::SharedCredentialsProvider>,
    /// The server answered 501 to If-None-Match / If-Match on a write.
    no_conditional_writes: Arc<std::sync::atomic::AtomicBool>,
    /// Upload bodies are covered by their signed CRC64NVME checksum instead of SigV4's SHA-256
    /// of the payload (which costs more CPU than everything else an upload does): over HTTPS
    /// and to loopback. Over plain HTTP to another host the payload stays signed.
    unsigned_payload: bool,
}

impl S3Client {
    /// Build the client from the standard AWS configuration chain plus the user's overrides.
    /// Makes no request.
    pub async fn new(opts: &S3Options) -> S3Client {
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .retry_config(RetryConfig::standard().with_max_attempts(opts.max_attempts.max(1)))
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(opts.connect_timeout)
                    .operation_attempt_timeout(opts.request_timeout)
                    .build(),
            );
        if let Some(profile) = &opts.profile {
            loader = loader.profile_name(profile);
        }
        // With a custom endpoint the region is a formality: do not let the SDK look for one in
        // instance metadata (slow, and off-host) when the environment names none.
        let env_region = ["AWS_REGION", "AWS_DEFAULT_REGION"]
            .iter()
            .find_map(|v| std::env::var(v).ok().filter(|r| !r.is_empty()));
        let region = opts.region.clone().or(env_region).or_else(|| {
            (opts.endpoint_url.is_some() && opts.profile.is_none()).then(|| "us-east-1".to_string())
        });
        if let Some(region) = region {
            loader = loader.region(Region::new(region));
        }
        if let Some(url) = &opts.endpoint_url {
            loader = loader.endpoint_url(url);
        }
        if opts.no_sign_request {
            loader = loader.no_credentials();
        } else if let Some((key, secret)) = &opts.static_credentials {
            loader = loader.credentials_provider(aws_credential_types::Credentials::new(
                key, secret, None, None, "s3rdma",
            ));
        }
        let sdk = loader.load().await;
        let mut conf =
            aws_sdk_s3::config::Builder::from(&sdk).force_path_style(opts.force_path_style);
        if sdk.region().is_none() {
            conf = conf.region(Region::from_static("us-east-1"));
        }
        let endpoint = opts
            .endpoint_url
            .clone()
            .or_else(|| sdk.endpoint_url().map(str::to_string))
            .unwrap_or_else(|| "the AWS S3 endpoint".to_string());
        let conf = conf.build();
        let rdma_conf = conf
            .to_builder()
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
            .build();
        S3Client {
            client: aws_sdk_s3::Client::from_conf(conf),
            rdma_client: aws_sdk_s3::Client::from_conf(rdma_conf),
            // The mount resolved the mode first, with its own deadline: this answers at once.
            rdma: crate::mode::resolve_mode(
                opts.rdma,
                opts.endpoint_url.as_deref(),
                cuobj_ffi::DEFAULT_DEADLINE,
            )
            .unwrap_or(RdmaMode::Off),
            accept_206_200: opts.rdma_accept_206_200,
            stats: Arc::new(TransportStats::default()),
            bucket: opts.bucket.clone(),
            endpoint,
            request_timeout: opts.request_timeout,
            max_attempts: opts.max_attempts.max(1),
            credentials: sdk.credentials_provider(),
            no_conditional_writes: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            unsigned_payload: opts
                .endpoint_url
                .as_deref()
                .is_none_or(|u| u.starts_with("https://") || crate::mode::is_loopback_url(u)),
        }
    }

    /// The endpoint in words, for error messages.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Resolve credentials from the chain now, so that "no credentials" is a start-up error
    /// rather than an EIO on the first `ls`. A no-op with `--no-sign-request`.
    pub async fn check_credentials(&self) -> Result<(), S3Error> {
        use aws_credential_types::provider::ProvideCredentials;
        let Some(provider) = &self.credentials else {
            return Ok(());
        };
        match provider.provide_credentials().await {
            Ok(_) => Ok(()),
            Err(e) => Err(S3Error::new(
                S3ErrorKind::NoCredentials,
                "LoadCredentials",
                "",
                error_chain(&e),
            )),
        }
    }
}

impl ObjectStore for S3Client {
    fn bucket(&self) -> &str {
        &self.bucket
    }

    fn rdma_mode(&self) -> RdmaMode {
        self.rdma
    }

    fn stats(&self) -> &Arc<TransportStats> {
        &self.stats
    }

    /// HeadObject.
    async fn head(&self, key: &str) -> Result<ObjectInfo, S3Error> {
        let span = tracing::debug_span!(
            "s3",
            op = "HeadObject",
            key,
            request_id = tracing::field::Empty
        );
        async {
            let start = self.stats.request(S3Request::Head, Transport::Http);
            let res = self
                .client
                .head_object()
                .bucket(&self.bucket)
                .key(key)
                .send()
                .await;
            log_outcome("HeadObject", key, start, &res);
            let out = res.map_err(|e| convert("HeadObject", key, e))?;
            Ok(ObjectInfo {
                key: key.to_string(),
                size: out.content_length().unwrap_or(0).max(0) as u64,
                etag: out.e_tag().map(quoted_etag).unwrap_or_default(),
                last_modified: to_system_time(out.last_modified()),
                meta: Some(FileMeta::from_map(out.metadata())),
            })
        }
        .instrument(span)
        .await
    }

    /// One page of ListObjectsV2. `delimiter` is usually "/"; `max_keys` at most 1000.
    async fn list_page(
        &self,
        prefix: &str,
        delimiter: Option<&str>,
        token: Option<String>,
        max_keys: i32,
    ) -> Result<ListPage, S3Error> {
        let span = tracing::debug_span!(
            "s3",
            op = "ListObjectsV2",
            key = prefix,
            request_id = tracing::field::Empty
        );
        async {
            let start = self.stats.request(S3Request::List, Transport::Http);
            let res = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(prefix)
                .set_delimiter(delimiter.map(str::to_string))
                .set_continuation_token(token)
                .max_keys(max_keys)
                .send()
                .await;
            log_outcome("ListObjectsV2", prefix, start, &res);
            let out = res.map_err(|e| convert("ListObjectsV2", prefix, e))?;
            let objects = out
                .contents()
                .iter()
                .filter_map(|o| {
                    Some(ObjectInfo {
                        key: o.key()?.to_string(),
                        size: o.size().unwrap_or(0).max(0) as u64,
                        etag: o.e_tag().map(quoted_etag).unwrap_or_default(),
                        last_modified: to_system_time(o.last_modified()),
                        meta: None,
                    })
                })
                .collect();
            let prefixes = out
                .common_prefixes()
                .iter()
                .filter_map(|p| p.prefix().map(str::to_string))
                .collect();
            let next_token = if out.is_truncated().unwrap_or(false) {
                out.next_continuation_token().map(str::to_string)
            } else {
                None
            };
            Ok(ListPage {
                objects,
                prefixes,
                next_token,
            })
        }
        .instrument(span)
        .await
    }

    /// [`S3Client::get_range_rdma`] into a window of a registration (e.g. one cache block).
    async fn get_range_rdma_window(
        &self,
        key: &str,
        etag: &str,
        offset: u64,
        win: RdmaWindow<'_>,
    ) -> Result<(), S3Error> {
        if self.rdma == RdmaMode::Auto && self.stats.rdma_paused() {
            return self.get_range_into(key, etag, offset, win.buf).await;
        }
        let len = win.buf.len();
        let end = offset + len as u64 - 1;
        let span = tracing::debug_span!(
            "s3",
            op = "GetObject",
            transport = "rdma",
            key,
            range = %format_args!("{offset}-{end}"),
            request_id = tracing::field::Empty
        );
        async {
            let range = format!("bytes={offset}-{end}");
            match self.rdma_get(key, etag, range, &win).await? {
                RdmaGot::Moved(_, n) if n == len as u64 => Ok(()),
                RdmaGot::Moved(_, n) => Err(self.short_rdma(key, n, len)),
                RdmaGot::DeclinedBody(out) => {
                    // A declining server sends the object in the body, as plain S3 does.
                    self.read_body_into(out.body, key, win.buf).await?;
                    TransportStats::add(&self.stats.http_bytes_read, len as u64);
                    Ok(())
                }
                RdmaGot::Declined => self.get_range_into(key, etag, offset, win.buf).await,
            }
        }
        .instrument(span)
        .await
    }

    async fn get_first_rdma_window(
        &self,
        key: &str,
        win: RdmaWindow<'_>,
    ) -> Result<(ObjectInfo, usize), S3Error> {
        if self.rdma == RdmaMode::Auto && self.stats.rdma_paused() {
            return self.get_first(key, win.buf).await;
        }
        let len = win.buf.len();
        let span = tracing::debug_span!(
            "s3",
            op = "GetObject",
            transport = "rdma",
            key,
            range = %format_args!("0-{}", len.saturating_sub(1)),
            request_id = tracing::field::Empty
        );
        async {
            let range = format!("bytes=0-{}", len.saturating_sub(1));
            match self.rdma_get(key, "", range, &win).await {
                Ok(RdmaGot::Moved(out, n)) => {
                    // The body went over RDMA: the size is Content-Range's (a range answer)
                    // or, for the whole object, what was moved.
                    let size = match out.content_range() {
                        Some(r) => range_total(key, r)?,
                        None => n,
                    };
                    if n != size.min(len as u64) {
                        return Err(self.short_rdma(key, n, size.min(len as u64) as usize));
                    }
                    Ok((first_object_info(key, &out, size), n as usize))
                }
                Ok(RdmaGot::DeclinedBody(out)) => {
                    let (info, n) = first_info(key, &out, len)?;
                    self.read_body_into(out.body, key, &mut win.buf[..n])
                        .await?;
                    TransportStats::add(&self.stats.http_bytes_read, n as u64);
                    Ok((info, n))
                }
                Ok(RdmaGot::Declined) => self.get_first(key, win.buf).await,
                // An empty object answers a range with 416; HeadObject says what it is.
                Err(e) if e.kind == S3ErrorKind::InvalidRange => Ok((self.head(key).await?, 0)),
                Err(e) => Err(e),
            }
        }
        .instrument(span)
        .await
    }

    /// [`S3Client::put_object`] under a precondition (`If-None-Match: *` or `If-Match`): a
    /// key that no longer satisfies it fails with `PreconditionFailed` and stores nothing.
    async fn put_object_if(
        &self,
        key: &str,
        data: PutSource<'_>,
        cond: &Condition,
        meta: &FileMeta,
    ) -> Result<String, S3Error> {
        let cond = &self.usable(cond);
        let user_meta = meta_map(meta);
        let bytes = data.bytes();
        let crc = checksum::crc64nvme_base64(bytes);
        let span = tracing::debug_span!(
            "s3",
            op = "PutObject",
            transport = data.transport(self.rdma),
            key,
            len = bytes.len(),
            request_id = tracing::field::Empty
        );
        async {
            let rdma = self
                .rdma_upload(S3Request::Put, key, &data, |icpt| {
                    self.rdma_client
                        .put_object()
                        .bucket(&self.bucket)
                        .key(key)
                        .set_if_none_match(cond.if_none_match())
                        .set_if_match(cond.if_match())
                        .set_metadata(user_meta.clone())
                        .checksum_crc64_nvme(&crc)
                        .content_length(0)
                        .customize()
                        .interceptor(icpt)
                        .send()
                })
                .await?;
            if let Some(out) = rdma {
                return Ok(out.e_tag().map(quoted_etag).unwrap_or_default());
            }
            let start = self.stats.request(S3Request::Put, Transport::Http);
            let res = self
                .client
                .put_object()
                .bucket(&self.bucket)
                .key(key)
                .set_if_none_match(cond.if_none_match())
                .set_if_match(cond.if_match())
                .set_metadata(user_meta)
                .checksum_crc64_nvme(&crc)
                .body(body_of(&data))
                .customize();
            let res = if self.unsigned_payload {
                res.disable_payload_signing()
            } else {
                res
            }
            .send()
            .await;
            log_outcome("PutObject", key, start, &res);
            let out = res.map_err(|e| self.note_unsupported(cond, convert("PutObject", key, e)))?;
            TransportStats::add(&self.stats.http_bytes_written, bytes.len() as u64);
            Ok(out.e_tag().map(quoted_etag).unwrap_or_default())
        }
        .instrument(span)
        .await
    }

    /// UploadPart `part` of the multipart upload `upload_id`, like [`S3Client::put_object`]:
    /// RDMA from a registered buffer (or HTTP), with `x-amz-checksum-crc64nvme`. Returns the
    /// part's ETag.
    async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        part: i32,
        data: PutSource<'_>,
    ) -> Result<String, S3Error> {
        let bytes = data.bytes();
        let crc = checksum::crc64nvme_base64(bytes);
        let span = tracing::debug_span!(
            "s3",
            op = "UploadPart",
            transport = data.transport(self.rdma),
            key,
            part,
            len = bytes.len(),
            request_id = tracing::field::Empty
        );
        async {
            let rdma = self
                .rdma_upload(S3Request::UploadPart, key, &data, |icpt| {
                    self.rdma_client
                        .upload_part()
                        .bucket(&self.bucket)
                        .key(key)
                        .upload_id(upload_id)
                        .part_number(part)
                        .checksum_crc64_nvme(&crc)
                        .content_length(0)
                        .customize()
                        .interceptor(icpt)
                        .send()
                })
                .await?;
            if let Some(out) = rdma {
                return Ok(out.e_tag().map(quoted_etag).unwrap_or_default());
            }
            let start = self.stats.request(S3Request::UploadPart, Transport::Http);
            let res = self
                .client
                .upload_part()
                .bucket(&self.bucket)
                .key(key)
                .upload_id(upload_id)
                .part_number(part)
                .checksum_crc64_nvme(&crc)
                .body(body_of(&data))
                .customize();
            let res = if self.unsigned_payload {
                res.disable_payload_signing()
            } else {
                res
            }
            .send()
            .await;
            log_outcome("UploadPart", key, start, &res);
            let out = res.map_err(|e| convert("UploadPart", key, e))?;
            TransportStats::add(&self.stats.http_bytes_written, bytes.len() as u64);
            Ok(out.e_tag().map(quoted_etag).unwrap_or_default())
        }
        .instrument(span)
        .await
    }

    /// CreateMultipartUpload of an object that will carry `meta`.
    async fn create_multipart_with(&self, key: &str, meta: &FileMeta) -> Result<String, S3Error> {
        let start = self
            .stats
            .request(S3Request::CreateMultipart, Transport::Http);
        let res = self
            .client
            .create_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .set_metadata(meta_map(meta))
            .send()
            .await;
        log_outcome("CreateMultipartUpload", key, start, &res);
        let out = res.map_err(|e| convert("CreateMultipartUpload", key, e))?;
        out.upload_id().map(str::to_string).ok_or_else(|| {
            S3Error::new(
                S3ErrorKind::BadResponse,
                "CreateMultipartUpload",
                key,
                "no upload id",
            )
        })
    }

    /// [`S3Client::complete_multipart`] under a precondition. On `PreconditionFailed` the
    /// upload stays open: the caller aborts it.
    async fn complete_multipart_if(
        &self,
        key: &str,
        upload_id: &str,
        parts: &[(i32, String)],
        cond: &Condition,
    ) -> Result<String, S3Error> {
        let cond = &self.usable(cond);
        use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
        let done = CompletedMultipartUpload::builder()
            .set_parts(Some(
                parts
                    .iter()
                    .map(|(n, etag)| CompletedPart::builder().part_number(*n).e_tag(etag).build())
                    .collect(),
            ))
            .build();
        let start = self
            .stats
            .request(S3Request::CompleteMultipart, Transport::Http);
        let res = self
            .client
            .complete_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .set_if_none_match(cond.if_none_match())
            .set_if_match(cond.if_match())
            .multipart_upload(done)
            .send()
            .await;
        log_outcome("CompleteMultipartUpload", key, start, &res);
        let out = res
            .map_err(|e| self.note_unsupported(cond, convert("CompleteMultipartUpload", key, e)))?;
        Ok(out.e_tag().map(quoted_etag).unwrap_or_default())
    }

    /// AbortMultipartUpload: drops every part uploaded so far.
    async fn abort_multipart(&self, key: &str, upload_id: &str) -> Result<(), S3Error> {
        let start = self
            .stats
            .request(S3Request::AbortMultipart, Transport::Http);
        let res = self
            .client
            .abort_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .send()
            .await;
        log_outcome("AbortMultipartUpload", key, start, &res);
        res.map(|_| ())
            .map_err(|e| convert("AbortMultipartUpload", key, e))
    }

    /// DeleteObject (deleting a missing key succeeds, as in S3).
    async fn delete_object(&self, key: &str) -> Result<(), S3Error> {
        let start = self.stats.request(S3Request::Delete, Transport::Http);
        let res = self
            .client
            .delete_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await;
        log_outcome("DeleteObject", key, start, &res);
        res.map(|_| ()).map_err(|e| convert("DeleteObject", key, e))
    }

    /// Server-side copy of `src` (which must still have ETag `src_etag`) to `dst`, carrying
    /// `meta` (replacing the source's metadata). Objects above `single_limit` bytes (at most
    /// S3's 5 GiB) are copied as a multipart upload of UploadPartCopy ranges, 8 at a time,
    /// aborted on any failure. Returns the new object's ETag.
    async fn copy_object(
        &self,
        src: &ObjectInfo,
        dst: &str,
        meta: &FileMeta,
        single_limit: u64,
    ) -> Result<String, S3Error> {
        if src.size <= single_limit.min(5 << 30) {
            return self.copy_single(src, dst, Some(meta)).await;
        }
        let id = self.create_multipart_with(dst, meta).await?;
        let part = COPY_PART_BYTES
            .min(single_limit.max(5 << 20))
            .max(src.size.div_ceil(10_000));
        let ranges: Vec<(i32, u64, u64)> = (0..src.size.div_ceil(part))
            .map(|i| (i as i32 + 1, i * part, ((i + 1) * part).min(src.size) - 1))
            .collect();
        let copies = run_bounded(ranges.into_iter().map(|(n, a, b)| {
            let id = id.clone();
            async move {
                let etag = self
                    .upload_part_copy(dst, &id, n, &src.key, &src.etag, a..b + 1)
                    .await?;
                Ok::<_, S3Error>((n, etag))
            }
        }))
        .await;
        let done = match copies {
            Ok(parts) => self.complete_multipart(dst, &id, &parts).await,
            Err(e) => Err(e),
        };
        if done.is_err() {
            if let Err(e) = self.abort_multipart(dst, &id).await {
                tracing::warn!(key = dst, upload_id = %id, error = %e, "cannot abort the multipart copy");
            }
        }
        done
    }

    /// One CopyObject with the `COPY` metadata directive up to `single_limit` (at most S3's
    /// 5 GiB); above, HeadObject for the attributes and a multipart copy.
    async fn copy_object_as_is(
        &self,
        src: &ObjectInfo,
        dst: &str,
        single_limit: u64,
    ) -> Result<String, S3Error> {
        if src.size > single_limit.min(5 << 30) {
            return crate::store::copy_with_stored_meta(self, src, dst, single_limit).await;
        }
        self.copy_single(src, dst, None).await
    }

    async fn upload_part_copy(
        &self,
        key: &str,
        upload_id: &str,
        part: i32,
        src_key: &str,
        src_etag: &str,
        range: std::ops::Range<u64>,
    ) -> Result<String, S3Error> {
        let source = format!("{}/{}", self.bucket, encode_key(src_key));
        let start = self
            .stats
            .request(S3Request::UploadPartCopy, Transport::Http);
        let res = self
            .client
            .upload_part_copy()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .part_number(part)
            .copy_source(&source)
            .copy_source_if_match(src_etag)
            .copy_source_range(format!(
                "bytes={}-{}",
                range.start,
                range.end.saturating_sub(1)
            ))
            .send()
            .await;
        log_outcome("UploadPartCopy", key, start, &res);
        let out = res.map_err(|e| convert("UploadPartCopy", key, e))?;
        Ok(out
            .copy_part_result()
            .and_then(|r| r.e_tag())
            .map(quoted_etag)
            .unwrap_or_default())
    }

    /// Ranged GetObject of `buf.len()` bytes at `offset`, conditional on `etag` (`If-Match`),
    /// written straight into `buf`. Fails with `PreconditionFailed` if the object changed, and
    /// with `BadResponse` if the server sent more or fewer bytes than asked for.
    async fn get_range_into(
        &self,
        key: &str,
        etag: &str,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), S3Error> {
        if buf.is_empty() {
            return Ok(());
        }
        let end = offset + buf.len() as u64 - 1;
        let span = tracing::debug_span!(
            "s3",
            op = "GetObject",
            key,
            range = %format_args!("{offset}-{end}"),
            request_id = tracing::field::Empty
        );
        async {
            // The SDK retries a request until its response starts; a body that then breaks
            // (reset, stall, short) is fetched again here, within the same attempt budget.
            let mut attempt = 1;
            loop {
                let start = self.stats.request(S3Request::Get, Transport::Http);
                let mut req = self
                    .client
                    .get_object()
                    .bucket(&self.bucket)
                    .key(key)
                    .range(format!("bytes={offset}-{end}"));
                if !etag.is_empty() {
                    req = req.if_match(etag);
                }
                let res = req.send().await;
                log_outcome("GetObject", key, start, &res);
                let out = res.map_err(|e| convert("GetObject", key, e))?;
                match self.read_body_into(out.body, key, buf).await {
                    Ok(()) => break,
                    Err(e) if attempt < self.max_attempts => {
                        let pause = backoff(attempt);
                        tracing::warn!(key, attempt, error = %e, pause_ms = pause.as_millis() as u64, "GET body failed; fetching the range again");
                        tokio::time::sleep(pause).await;
                        attempt += 1;
                    }
                    Err(e) => return Err(e),
                }
            }
            TransportStats::add(&self.stats.http_bytes_read, buf.len() as u64);
            Ok(())
        }
        .instrument(span)
        .await
    }

    /// One GetObject of the first `buf.len()` bytes, unconditional: the object's size comes
    /// from `Content-Range` (or, for a whole-object answer, `Content-Length`), its ETag, time
    /// and `x-amz-meta-*` attributes from the headers HeadObject would send. An empty object
    /// answers a range with 416; HeadObject then says what it is.
    async fn get_first(&self, key: &str, buf: &mut [u8]) -> Result<(ObjectInfo, usize), S3Error> {
        let span = tracing::debug_span!(
            "s3",
            op = "GetObject",
            key,
            range = %format_args!("0-{}", buf.len().saturating_sub(1)),
            request_id = tracing::field::Empty
        );
        async {
            let mut attempt = 1;
            loop {
                let start = self.stats.request(S3Request::Get, Transport::Http);
                let res = self
                    .client
                    .get_object()
                    .bucket(&self.bucket)
                    .key(key)
                    .range(format!("bytes=0-{}", buf.len().saturating_sub(1)))
                    .send()
                    .await;
                log_outcome("GetObject", key, start, &res);
                let out = match res.map_err(|e| convert("GetObject", key, e)) {
                    Err(e) if e.kind == S3ErrorKind::InvalidRange => {
                        return Ok((self.head(key).await?, 0))
                    }
                    r => r?,
                };
                let (info, n) = first_info(key, &out, buf.len())?;
                match self.read_body_into(out.body, key, &mut buf[..n]).await {
                    Ok(()) => {
                        TransportStats::add(&self.stats.http_bytes_read, n as u64);
                        return Ok((info, n));
                    }
                    Err(e) if attempt < self.max_attempts => {
                        let pause = backoff(attempt);
                        tracing::warn!(key, attempt, error = %e, pause_ms = pause.as_millis() as u64, "GET body failed; fetching again");
                        tokio::time::sleep(pause).await;
                        attempt += 1;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        .instrument(span)
        .await
    }
}

/// What a GetObject of the first `max` bytes says of the object, and how many body bytes
/// follow; more than asked for is a bad response.
fn first_info(
    key: &str,
    out: &GetObjectOutput,
    max: usize,
) -> Result<(ObjectInfo, usize), S3Error> {
    let len = out.content_length().unwrap_or(0).max(0) as u64;
    let size = match out.content_range() {
        Some(r) => range_total(key, r)?,
        None => len,
    };
    if len > max as u64 || len != size.min(max as u64) {
        return Err(S3Error::new(
            S3ErrorKind::BadResponse,
            "GetObject",
            key,
            format!("asked for the first {max} bytes of {size}, the answer holds {len}"),
        ));
    }
    Ok((first_object_info(key, out, size), len as usize))
}

/// The object's total size from a `Content-Range` (`bytes 0-1023/4096`).
fn range_total(key: &str, range: &str) -> Result<u64, S3Error> {
    range
        .rsplit('/')
        .next()
        .and_then(|t| t.parse::<u64>().ok())
        .ok_or_else(|| {
            S3Error::new(
                S3ErrorKind::BadResponse,
                "GetObject",
                key,
                format!("unreadable Content-Range {range:?}"),
            )
        })
}

/// The object a GetObject answered about, `size` bytes long: what HeadObject would say.
fn first_object_info(key: &str, out: &GetObjectOutput, size: u64) -> ObjectInfo {
    ObjectInfo {
        key: key.to_string(),
        size,
        etag: out.e_tag().map(quoted_etag).unwrap_or_default(),
        last_modified: to_system_time(out.last_modified()),
        meta: Some(FileMeta::from_map(out.metadata())),
    }
}

/// What one GET with an RDMA token came to.
enum RdmaGot {
    /// The endpoint wrote this many bytes into the window; the answer's headers.
    Moved(GetObjectOutput, u64),
    /// The endpoint declined and sent the bytes in the body, as plain S3 does (allowed).
    DeclinedBody(GetObjectOutput),
    /// The endpoint declined with an error: send the request again over HTTP (allowed).
    Declined,
}

impl S3Client {
    /// One GetObject of `range` (conditional on `etag` unless empty) with a token for `win`:
    /// a decline is counted (and under `rdma=required` is the error), a broken reply is an
    /// error, bytes moved over RDMA are counted.
    async fn rdma_get(
        &self,
        key: &str,
        etag: &str,
        range: String,
        win: &RdmaWindow<'_>,
    ) -> Result<RdmaGot, S3Error> {
        let len = win.buf.len();
        let seen = Arc::new(Mutex::new(ReplySeen::default()));
        let icpt = TokenInterceptor::new(
            win.reg.clone(),
            win.offset,
            len,
            Op::Get,
            self.stats.clone(),
            seen.clone(),
        );
        let start = self.stats.request(S3Request::Get, Transport::Rdma);
        let mut req = self
            .rdma_client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .range(range);
        if !etag.is_empty() {
            req = req.if_match(etag);
        }
        let res = req.customize().interceptor(icpt).send().await;
        log_outcome("GetObject", key, start, &res);
        let out = match res {
            Ok(out) => out,
            Err(e) if self.declined_by_error(&e) => {
                self.decline("GetObject", key)?;
                return Ok(RdmaGot::Declined);
            }
            Err(e) => return Err(convert("GetObject", key, e)),
        };
        let seen = seen.locked().clone();
        match rdma::judge_get(&seen, len as u64, self.accept_206_200) {
            Verdict::Done(n) => {
                TransportStats::add(&self.stats.rdma_bytes_read, n);
                self.stats.rdma_worked();
                Ok(RdmaGot::Moved(out, n))
            }
            Verdict::Declined => {
                self.decline("GetObject", key)?;
                Ok(RdmaGot::DeclinedBody(out))
            }
            Verdict::Failed(msg) => {
                TransportStats::add(&self.stats.reply_errors, 1);
                Err(S3Error::new(
                    S3ErrorKind::BadResponse,
                    "GetObject",
                    key,
                    msg,
                ))
            }
        }
    }

    /// An RDMA GET that moved `n` bytes where `want` were due.
    fn short_rdma(&self, key: &str, n: u64, want: usize) -> S3Error {
        TransportStats::add(&self.stats.reply_errors, 1);
        S3Error::new(
            S3ErrorKind::BadResponse,
            "GetObject",
            key,
            format!("RDMA transfer delivered {n} of {want} bytes"),
        )
    }
}

impl S3Client {
    /// One CopyObject of `src` (conditional on its ETag) to `dst`, carrying `meta` (replacing
    /// the source's), or, with None, the source's own (the `COPY` directive). Returns the new
    /// ETag.
    async fn copy_single(
        &self,
        src: &ObjectInfo,
        dst: &str,
        meta: Option<&FileMeta>,
    ) -> Result<String, S3Error> {
        use aws_sdk_s3::types::MetadataDirective;
        let source = format!("{}/{}", self.bucket, encode_key(&src.key));
        let start = self.stats.request(S3Request::Copy, Transport::Http);
        let directive = match meta {
            Some(_) => MetadataDirective::Replace,
            None => MetadataDirective::Copy,
        };
        let res = self
            .client
            .copy_object()
            .bucket(&self.bucket)
            .key(dst)
            .copy_source(&source)
            .copy_source_if_match(&src.etag)
            .metadata_directive(directive)
            .set_metadata(meta.and_then(meta_map))
            .send()
            .await;
        log_outcome("CopyObject", dst, start, &res);
        let out = res.map_err(|e| convert("CopyObject", dst, e))?;
        Ok(out
            .copy_object_result()
            .and_then(|r| r.e_tag())
            .map(quoted_etag)
            .unwrap_or_default())
    }

    /// The RDMA attempt of a PUT or UploadPart: `Some(output)` when the endpoint moved the
    /// bytes, `None` when it declined and the caller should send them over HTTP (`rdma=auto`),
    /// an error otherwise. Does nothing (`None`) for plain memory, `rdma=off` or no bytes.
    async fn rdma_upload<O, E, Fut>(
        &self,
        req: S3Request,
        key: &str,
        data: &PutSource<'_>,
        send: impl FnOnce(TokenInterceptor) -> Fut,
    ) -> Result<Option<O>, S3Error>
    where
        Fut: std::future::Future<Output = Result<O, SdkError<E, HttpResponse>>>,
        E: ProvideErrorMetadata + std::error::Error + 'static,
        O: RequestId,
    {
        let Some((reg, offset)) = data.window() else {
            return Ok(None);
        };
        let len = data.bytes().len();
        if self.rdma == RdmaMode::Off
            || len == 0
            || (self.rdma == RdmaMode::Auto && self.stats.rdma_paused())
        {
            return Ok(None);
        }
        let seen = Arc::new(Mutex::new(ReplySeen::default()));
        let icpt = TokenInterceptor::new(
            reg.clone(),
            offset,
            len,
            Op::Put,
            self.stats.clone(),
            seen.clone(),
        );
        let start = self.stats.request(req, Transport::Rdma);
        let res = send(icpt).await;
        let op = req.name();
        log_outcome(op, key, start, &res);
        match res {
            Ok(out) => {
                let seen = seen.locked().clone();
                match rdma::judge_put(&seen) {
                    Verdict::Done(_) => {
                        TransportStats::add(&self.stats.rdma_bytes_written, len as u64);
                        self.stats.rdma_worked();
                        Ok(Some(out))
                    }
                    Verdict::Declined => self.decline(op, key).map(|()| None),
                    Verdict::Failed(msg) => {
                        TransportStats::add(&self.stats.reply_errors, 1);
                        Err(S3Error::new(S3ErrorKind::BadResponse, op, key, msg))
                    }
                }
            }
            Err(e) if self.declined_by_error(&e) || ignored_token(&e) => {
                self.decline(op, key).map(|()| None)
            }
            Err(e) => Err(convert(op, key, e)),
        }
    }

    /// The condition to send: none once the server has refused conditional writes.
    fn usable(&self, cond: &Condition) -> Condition {
        if self
            .no_conditional_writes
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            Condition::None
        } else {
            cond.clone()
        }
    }

    /// A server that does not implement conditional writes answers 501 NotImplemented: remember
    /// it (later writes go unconditionally, WARN once) and fail this write with `Unsupported`,
    /// which the caller may retry.
    fn note_unsupported(&self, cond: &Condition, e: S3Error) -> S3Error {
        let refused = *cond != Condition::None
            && (e.status == Some(501) || e.code.as_deref() == Some("NotImplemented"));
        if !refused {
            return e;
        }
        if !self
            .no_conditional_writes
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::warn!(key = %e.key, error = %e, "the server does not support conditional writes (If-None-Match / If-Match); writes from now on cannot detect a concurrent writer");
        }
        S3Error {
            kind: S3ErrorKind::Unsupported,
            ..e
        }
    }

    fn declined_by_error<E>(&self, e: &SdkError<E, HttpResponse>) -> bool {
        e.raw_response()
            .and_then(|r| r.headers().get(REPLY_HEADER))
            .is_some_and(|v| v == "501")
    }

    /// Count a decline; under `rdma=required` it is the request's error.
    fn decline(&self, op: &'static str, key: &str) -> Result<(), S3Error> {
        self.stats.decline(self.rdma, op, key)
    }

    /// Drain a GET body into `buf`, which it must fill exactly.
    async fn read_body_into(
        &self,
        mut body: aws_sdk_s3::primitives::ByteStream,
        key: &str,
        buf: &mut [u8],
    ) -> Result<(), S3Error> {
        let mut filled = 0usize;
        // A body that stops for the request timeout, or trickles so slowly that it takes longer
        // than the timeout plus a second per MiB, is given up (and fetched again by the caller).
        let deadline = tokio::time::Instant::now()
            + self.request_timeout
            + Duration::from_secs((buf.len() as u64).div_ceil(MIN_BODY_RATE));
        loop {
            let next = tokio::time::timeout(self.request_timeout, body.next());
            let chunk = tokio::time::timeout_at(deadline, next)
                .await
                .map_err(|_| {
                    S3Error::new(
                        S3ErrorKind::Timeout,
                        "GetObject",
                        key,
                        format!(
                            "response body too slow: {filled} of {} bytes by the deadline",
                            buf.len()
                        ),
                    )
                })?
                .map_err(|_| {
                    S3Error::new(
                        S3ErrorKind::Timeout,
                        "GetObject",
                        key,
                        "response body stalled",
                    )
                })?;
            let Some(chunk) = chunk else { break };
            let chunk = chunk.map_err(|e| {
                S3Error::new(S3ErrorKind::Unreachable, "GetObject", key, error_chain(&e))
            })?;
            let room = buf.len() - filled;
            if chunk.len() > room {
                return Err(S3Error::new(
                    S3ErrorKind::BadResponse,
                    "GetObject",
                    key,
                    format!("server sent more than the {} bytes asked for", buf.len()),
                ));
            }
            buf[filled..filled + chunk.len()].copy_from_slice(&chunk);
            filled += chunk.len();
        }
        if filled != buf.len() {
            return Err(S3Error::new(
                S3ErrorKind::BadResponse,
                "GetObject",
                key,
                format!("short body: {filled} of {} bytes", buf.len()),
            ));
        }
        Ok(())
    }
}

/// A server that ignores the RDMA token sees an empty body whose CRC64NVME does not match, and
/// refuses it: that refusal (with no RDMA reply header) is a decline, never a stored object.
fn ignored_token<E: ProvideErrorMetadata>(e: &SdkError<E, HttpResponse>) -> bool {
    let no_reply = e
        .raw_response()
        .is_some_and(|r| r.headers().get(REPLY_HEADER).is_none());
    let code = e.as_service_error().and_then(|se| se.code());
    no_reply
        && matches!(
            code,
            Some("BadDigest") | Some("XAmzContentChecksumMismatch") | Some("InvalidDigest")
        )
}

/// The bytes of a PUT as an HTTP body: zero-copy for owned bytes, a copy otherwise.
fn body_of(data: &PutSource<'_>) -> aws_sdk_s3::primitives::ByteStream {
    let b = match data {
        PutSource::Window { bytes, .. } | PutSource::Owned(bytes) => bytes.clone(),
        other => bytes::Bytes::copy_from_slice(other.bytes()),
    };
    aws_sdk_s3::primitives::ByteStream::from(b)
}

/// Parts of a multipart copy (more for objects above 5 TB / 10,000 parts).
const COPY_PART_BYTES: u64 = 512 << 20;

/// Run the copies 8 at a time, in order; the first error wins (after all started ones end).
async fn run_bounded<F, T>(jobs: impl Iterator<Item = F>) -> Result<Vec<T>, S3Error>
where
    F: std::future::Future<Output = Result<T, S3Error>>,
{
    let jobs: Vec<F> = jobs.collect();
    let sem = tokio::sync::Semaphore::new(8);
    let all = jobs.into_iter().map(|f| async {
        let _p = sem.acquire().await;
        f.await
    });
    let results = futures_util::future::join_all(all).await;
    results.into_iter().collect()
}

/// User metadata to send: none when nothing is stored.
fn meta_map(meta: &FileMeta) -> Option<std::collections::HashMap<String, String>> {
    (!meta.is_empty()).then(|| meta.to_map())
}

/// An ETag in the form S3 gives it in HEAD and listings: a quoted string. (SeaweedFS answers
/// CopyObject and UploadPartCopy with the bare hex; compared with a listing's, the same version
/// would look like another one.)
fn quoted_etag(etag: &str) -> String {
    if etag.is_empty() || etag.starts_with('"') || etag.starts_with("W/") {
        etag.to_string()
    } else {
        format!("\"{etag}\"")
    }
}

/// A key as it goes in `x-amz-copy-source`: percent-encoded but for `/` and the unreserved
/// characters.
fn encode_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn to_system_time(t: Option<&aws_smithy_types::DateTime>) -> SystemTime {
    t.and_then(|t| SystemTime::try_from(*t).ok())
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// One debug line per request: what the tests and `--log-level debug` users count on.
fn log_outcome<T, E>(
    op: &'static str,
    key: &str,
    start: RequestTimer,
    res: &Result<T, SdkError<E, HttpResponse>>,
) where
    T: RequestId,
{
    let ms = start.start.elapsed().as_secs_f64() * 1e3;
    let (status, request_id) = match res {
        Ok(out) => (200, out.request_id().map(str::to_string)),
        Err(e) => (
            e.raw_response().map(|r| r.status().as_u16()).unwrap_or(0),
            e.request_id().map(str::to_string),
        ),
    };
    if let Some(id) = &request_id {
        tracing::Span::current().record("request_id", id.as_str());
    }
    debug!(op, key, status, ms = format_args!("{ms:.1}"), "s3 request");
}

/// The slowest GET body accepted (bytes per second, after the request timeout's allowance).
const MIN_BODY_RATE: u64 = 1 << 20;

/// Jittered exponential backoff before attempt `attempt + 1`: 50–100 % of 200 ms × 2^(n-1),
/// at most 20 s (the SDK's own retries use the same shape).
fn backoff(attempt: u32) -> Duration {
    let base = Duration::from_millis(200)
        .saturating_mul(1 << attempt.saturating_sub(1).min(16))
        .min(Duration::from_secs(20));
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    base.mul_f64(0.5 + f64::from(nanos % 1000) / 2000.0)
}

/// The full error chain of a transport error, for messages ("connection refused", ...).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        let m = inner.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = inner.source();
    }
    s
}

fn convert<E>(op: &'static str, key: &str, err: SdkError<E, HttpResponse>) -> S3Error
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let request_id = err.request_id().map(str::to_string);
    let status = err.raw_response().map(|r| r.status().as_u16());
    let (kind, code, message) = match &err {
        SdkError::ServiceError(se) => {
            let e = se.err();
            let code = e.code().map(str::to_string);
            let kind = error::classify(status, code.as_deref());
            let message = e
                .message()
                .map(str::to_string)
                .unwrap_or_else(|| match status {
                    Some(s) => format!("HTTP status {s}"),
                    None => "service error".into(),
                });
            (kind, code, message)
        }
        SdkError::TimeoutError(_) => (S3ErrorKind::Timeout, None, "request timed out".into()),
        SdkError::DispatchFailure(d) => {
            let kind = if d.is_timeout() {
                S3ErrorKind::Timeout
            } else if d.is_io() {
                S3ErrorKind::Unreachable
            } else {
                S3ErrorKind::Other
            };
            (kind, None, error_chain(&err))
        }
        SdkError::ResponseError(_) => (S3ErrorKind::BadResponse, None, error_chain(&err)),
        SdkError::ConstructionFailure(_) => {
            let chain = error_chain(&err);
            let kind = if chain.contains("credentials") || chain.contains("identity") {
                S3ErrorKind::NoCredentials
            } else {
                S3ErrorKind::Other
            };
            (kind, None, chain)
        }
        _ => (error::classify(status, None), None, error_chain(&err)),
    };
    S3Error {
        kind,
        op,
        key: key.to_string(),
        status,
        code,
        message,
        request_id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_retry_backoff_grows_with_jitter_and_is_capped() {
        for attempt in 1..40 {
            let b = backoff(attempt);
            let full = Duration::from_millis(200)
                .saturating_mul(1 << (attempt - 1).min(16))
                .min(Duration::from_secs(20));
            assert!(b >= full / 2 && b <= full, "{attempt}: {b:?}");
        }
        assert!(backoff(1) <= Duration::from_millis(200));
        assert!(backoff(30) <= Duration::from_secs(20));
    }

    #[test]
    fn a_501_to_a_conditional_write_turns_conditions_off_for_the_mount() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let s3 = rt.block_on(S3Client::new(&S3Options {
            bucket: "b".into(),
            endpoint_url: Some("http://127.0.0.1:1".into()),
            no_sign_request: true,
            ..Default::default()
        }));
        let cond = Condition::IfMatch("\"e\"".into());
        let err = |status| S3Error {
            status: Some(status),
            ..S3Error::new(S3ErrorKind::ServerError, "PutObject", "k", "x")
        };
        // Another failure, or a 501 to an unconditional write, changes nothing.
        assert_eq!(
            s3.note_unsupported(&cond, err(500)).kind,
            S3ErrorKind::ServerError
        );
        assert_eq!(
            s3.note_unsupported(&Condition::None, err(501)).kind,
            S3ErrorKind::ServerError
        );
        assert_eq!(s3.usable(&cond), cond);
        let e = s3.note_unsupported(&cond, err(501));
        assert_eq!(
            (e.kind, crate::errno_for(e.kind)),
            (S3ErrorKind::Unsupported, libc::EOPNOTSUPP)
        );
        assert_eq!(s3.usable(&cond), Condition::None);
        assert_eq!(s3.usable(&Condition::IfNoneMatch), Condition::None);
    }

    #[test]
    fn etags_are_quoted_as_in_head_and_listings() {
        assert_eq!(quoted_etag("abc"), "\"abc\"");
        assert_eq!(quoted_etag("\"abc\""), "\"abc\"");
        assert_eq!(quoted_etag("W/\"abc\""), "W/\"abc\"");
        assert_eq!(quoted_etag(""), "");
    }

    #[test]
    fn copy_source_keys_are_percent_encoded() {
        assert_eq!(encode_key("a/b c+d%é"), "a/b%20c%2Bd%25%C3%A9");
    }
}
