//! The one module that talks to S3: every request the filesystem makes goes through [`S3Client`].
//!
//! Retries (with jittered exponential backoff on throttling, 5xx and connection errors) and
//! timeouts are the AWS SDK's standard retry strategy, configured here; each call converts the
//! SDK's error into an [`S3Error`] that knows its errno.

pub mod error;

use std::time::{Duration, Instant, SystemTime};

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::BehaviorVersion;
use aws_sdk_s3::config::Region;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::operation::RequestId;
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use tracing::{debug, Instrument};

pub use error::{S3Error, S3ErrorKind};

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
}

/// Metadata of one object, from HEAD or from a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    pub key: String,
    pub size: u64,
    pub etag: String,
    pub last_modified: SystemTime,
}

/// One page of ListObjectsV2 with a delimiter.
#[derive(Debug, Default)]
pub struct ListPage {
    pub objects: Vec<ObjectInfo>,
    /// Common prefixes, each ending with the delimiter.
    pub prefixes: Vec<String>,
    pub next_token: Option<String>,
}

/// A cheap-to-clone handle on the bucket.
#[derive(Clone, Debug)]
pub struct S3Client {
    client: aws_sdk_s3::Client,
    bucket: String,
    endpoint: String,
    request_timeout: Duration,
    credentials: Option<aws_credential_types::provider::SharedCredentialsProvider>,
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
        S3Client {
            client: aws_sdk_s3::Client::from_conf(conf.build()),
            bucket: opts.bucket.clone(),
            endpoint,
            request_timeout: opts.request_timeout,
            credentials: sdk.credentials_provider(),
        }
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
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

    /// HeadObject.
    pub async fn head(&self, key: &str) -> Result<ObjectInfo, S3Error> {
        let span = tracing::debug_span!(
            "s3",
            op = "HeadObject",
            key,
            request_id = tracing::field::Empty
        );
        async {
            let start = Instant::now();
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
                etag: out.e_tag().unwrap_or_default().to_string(),
                last_modified: to_system_time(out.last_modified()),
            })
        }
        .instrument(span)
        .await
    }

    /// One page of ListObjectsV2. `delimiter` is usually "/"; `max_keys` at most 1000.
    pub async fn list_page(
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
            let start = Instant::now();
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
                        etag: o.e_tag().unwrap_or_default().to_string(),
                        last_modified: to_system_time(o.last_modified()),
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

    /// Ranged GetObject of `buf.len()` bytes at `offset`, conditional on `etag` (`If-Match`),
    /// written straight into `buf`. Fails with `PreconditionFailed` if the object changed, and
    /// with `BadResponse` if the server sent more or fewer bytes than asked for.
    pub async fn get_range_into(
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
            let start = Instant::now();
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
            let mut body = out.body;
            let mut filled = 0usize;
            loop {
                let chunk = tokio::time::timeout(self.request_timeout, body.next())
                    .await
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
        .instrument(span)
        .await
    }
}

fn to_system_time(t: Option<&aws_smithy_types::DateTime>) -> SystemTime {
    t.and_then(|t| SystemTime::try_from(*t).ok())
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// One debug line per request: what the tests and `--log-level debug` users count on.
fn log_outcome<T, E>(
    op: &'static str,
    key: &str,
    start: Instant,
    res: &Result<T, SdkError<E, HttpResponse>>,
) where
    T: RequestId,
{
    let ms = start.elapsed().as_secs_f64() * 1e3;
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
