//! The HTTP layer in front of the S3 handlers: learns who connected (the peer's user, from the
//! kernel's socket table), and applies the faults that concern the response as a whole (a
//! missing ETag, a body that is not XML).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::header::{CONTENT_LENGTH, ETAG};
use http::{HeaderMap, HeaderValue, Method, Uri};
use s3s::service::S3Service;
use s3s::{HttpError, HttpResponse};

use super::plan::{Fault, FaultPlan};

/// Who is on the other end of a connection, attached to every request as an extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    pub addr: SocketAddr,
    /// The user owning the client's socket; `None` when it cannot be found (then no RDMA token
    /// is served).
    pub uid: Option<u32>,
}

/// The S3 operation a request asks for, as named in fault files.
pub fn operation(method: &Method, uri: &Uri, headers: &HeaderMap) -> &'static str {
    let query = uri.query().unwrap_or("");
    let has = |name: &str| {
        query
            .split('&')
            .any(|kv| kv == name || kv.starts_with(&format!("{name}=")))
    };
    // Path-style: "/bucket" is a bucket request, "/bucket/key" an object request.
    let object = uri
        .path()
        .trim_start_matches('/')
        .split_once('/')
        .is_some_and(|(_, key)| !key.is_empty());
    match *method {
        Method::HEAD if object => "HeadObject",
        Method::HEAD => "HeadBucket",
        Method::GET if !object && has("list-type") => "ListObjectsV2",
        Method::GET if !object && has("uploads") => "ListMultipartUploads",
        Method::GET if !object => "ListObjects",
        Method::GET if has("uploadId") => "ListParts",
        Method::GET => "GetObject",
        Method::PUT if has("partNumber") && headers.contains_key("x-amz-copy-source") => {
            "UploadPartCopy"
        }
        Method::PUT if has("partNumber") => "UploadPart",
        Method::PUT if headers.contains_key("x-amz-copy-source") => "CopyObject",
        Method::PUT if object => "PutObject",
        Method::PUT => "CreateBucket",
        Method::POST if has("uploads") => "CreateMultipartUpload",
        Method::POST if has("uploadId") => "CompleteMultipartUpload",
        Method::POST if has("delete") => "DeleteObjects",
        Method::DELETE if has("uploadId") => "AbortMultipartUpload",
        Method::DELETE if object => "DeleteObject",
        Method::DELETE => "DeleteBucket",
        _ => "Other",
    }
}

/// Operations whose answer is an XML document (where `garbage` applies).
fn answers_xml(op: &str) -> bool {
    matches!(
        op,
        "ListObjectsV2"
            | "ListObjects"
            | "ListMultipartUploads"
            | "ListParts"
            | "CreateMultipartUpload"
            | "CompleteMultipartUpload"
            | "CopyObject"
            | "UploadPartCopy"
            | "DeleteObjects"
    )
}

/// Operations whose handlers apply the request-level faults themselves.
const HANDLER_FAULTED: &[&str] = &[
    "GetObject",
    "PutObject",
    "UploadPart",
    "CompleteMultipartUpload",
];

/// The answer a request-level fault gives instead of the real one (after waiting, for delay).
async fn failure(fault: Fault) -> Option<HttpResponse> {
    let (status, code) = match fault {
        Fault::Throttle => (503, "SlowDown"),
        Fault::Error | Fault::Drop => (500, "InternalError"),
        Fault::Delay(ms) => {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            return None;
        }
        _ => return None,
    };
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>{code} (fault injection)</Message></Error>"
    );
    http::Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/xml")
        .body(s3s::Body::from(body))
        .ok()
}

/// Serve one request: the S3 service, with `peer` attached and the HTTP-level fault applied.
pub async fn serve(
    service: S3Service,
    faults: Arc<FaultPlan>,
    peer: Peer,
    req: http::Request<hyper::body::Incoming>,
) -> Result<HttpResponse, HttpError> {
    let op = operation(req.method(), req.uri(), req.headers());
    let rdma = req
        .headers()
        .contains_key(s3rdma_proto::reply::TOKEN_HEADER);
    // Operations the S3 handlers do not fault themselves get throttle/error/drop/delay here, so
    // an outage (`error op=any for=MS`) covers every request.
    if !HANDLER_FAULTED.contains(&op) {
        if let Some(resp) = failure(faults.next(op, rdma, false)).await {
            return Ok(resp);
        }
    }
    let fault = faults.next(op, rdma, true);
    let mut req = req.map(s3s::Body::from);
    req.extensions_mut().insert(peer);
    let mut resp = service.call(req).await?;
    match fault {
        Fault::NoEtag => {
            resp.headers_mut().remove(ETAG);
        }
        Fault::Garbage if resp.status().is_success() && answers_xml(op) => {
            let junk: &'static [u8] = b"<?xml version=\"1.0\"?><Complete\x00 this is <<not xml";
            resp.headers_mut()
                .insert(CONTENT_LENGTH, HeaderValue::from(junk.len()));
            *resp.body_mut() = s3s::Body::from(bytes::Bytes::from_static(junk));
        }
        _ => {}
    }
    Ok(resp)
}

/// `/proc/net/tcp{,6}` spelling of an address: the 32-bit words in host byte order, in hex.
fn proc_net_addr(addr: SocketAddr) -> String {
    let ip = match addr.ip() {
        IpAddr::V4(v4) => format!("{:08X}", u32::from_ne_bytes(v4.octets())),
        IpAddr::V6(v6) => v6
            .octets()
            .chunks(4)
            .map(|w| format!("{:08X}", u32::from_ne_bytes([w[0], w[1], w[2], w[3]])))
            .collect(),
    };
    format!("{ip}:{:04X}", addr.port())
}

/// The user owning the client end of a loopback TCP connection from `peer` to `local`, from
/// the kernel's socket table (only sockets of this network namespace are visible).
pub fn peer_uid(peer: SocketAddr, local: SocketAddr) -> Option<u32> {
    let (want_local, want_remote) = (proc_net_addr(peer), proc_net_addr(local));
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 7 && f[1] == want_local && f[2] == want_remote {
                return f[7].parse().ok();
            }
        }
    }
    None
}

/// The real, effective, saved and filesystem user ids of `pid`.
fn process_uids(pid: u32) -> Option<[u32; 4]> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    let ids: Vec<u32> = line[4..]
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    ids.try_into().ok()
}

/// Whether the user connected as `peer` may have the endpoint move bytes to or from the memory
/// of process `pid` — the rule the kernel applies to process_vm_readv by that user itself: root
/// may; anyone else only for a process all of whose user ids are theirs.
pub fn may_access(peer: Option<&Peer>, pid: u32) -> Result<(), String> {
    let Some(peer) = peer else {
        return Err("the connection's peer is unknown".into());
    };
    let Some(uid) = peer.uid else {
        return Err(format!(
            "cannot tell which user connected from {}; RDMA tokens are served only to local users",
            peer.addr
        ));
    };
    if uid == 0 {
        return Ok(());
    }
    match process_uids(pid) {
        Some(ids) if ids.iter().all(|&i| i == uid) => Ok(()),
        Some(_) => Err(format!(
            "the token names process {pid}, which user {uid} (the connection's owner) may not access"
        )),
        None => Err(format!("the token's process {pid} is gone")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations() {
        let op = |m: Method, u: &str, copy: bool| {
            let mut h = HeaderMap::new();
            if copy {
                h.insert("x-amz-copy-source", HeaderValue::from_static("b/k"));
            }
            operation(&m, &u.parse().unwrap(), &h)
        };
        assert_eq!(
            op(Method::GET, "/b?list-type=2&prefix=a", false),
            "ListObjectsV2"
        );
        assert_eq!(op(Method::GET, "/b/k", false), "GetObject");
        assert_eq!(op(Method::HEAD, "/b/k/x", false), "HeadObject");
        assert_eq!(
            op(Method::PUT, "/b/k?partNumber=2&uploadId=u", false),
            "UploadPart"
        );
        assert_eq!(op(Method::PUT, "/b/k", true), "CopyObject");
        assert_eq!(op(Method::PUT, "/b/k", false), "PutObject");
        assert_eq!(
            op(Method::POST, "/b/k?uploads", false),
            "CreateMultipartUpload"
        );
        assert_eq!(
            op(Method::POST, "/b/k?uploadId=u", false),
            "CompleteMultipartUpload"
        );
        assert_eq!(
            op(Method::DELETE, "/b/k?uploadId=u", false),
            "AbortMultipartUpload"
        );
        assert_eq!(op(Method::DELETE, "/b/k", false), "DeleteObject");
    }

    /// The owner of a connection's client socket is found in the kernel's table, and the access
    /// rule follows the kernel's: root may, another user may not touch root's process.
    #[test]
    fn peer_user_and_access_rule() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, peer_addr) = listener.accept().unwrap();
        let uid = peer_uid(peer_addr, server.local_addr().unwrap());
        // SAFETY: getuid cannot fail.
        assert_eq!(uid, Some(unsafe { libc::getuid() }));
        drop(client);
        let me = std::process::id();
        let peer = |uid| Peer {
            addr: peer_addr,
            uid,
        };
        assert!(may_access(Some(&peer(uid)), me).is_ok());
        assert!(may_access(Some(&peer(Some(0))), me).is_ok());
        assert!(may_access(Some(&peer(None)), me).is_err());
        assert!(may_access(None, me).is_err());
        // pid 1 runs as root: user 65534 may not use it.
        let e = may_access(Some(&peer(Some(65534))), 1).unwrap_err();
        assert!(e.contains("may not access"), "{e}");
        assert_eq!(
            proc_net_addr("127.0.0.1:8080".parse().unwrap()),
            "0100007F:1F90"
        );
    }
}
