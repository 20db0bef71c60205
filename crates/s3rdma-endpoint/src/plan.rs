//! What the fault file asks for: which fault, for which requests, how many times.

use s3rdma_proto::sync::Lock;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A misbehaviour the endpoint can be told to show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    None,
    Decline,
    Ignore,
    Corrupt,
    Short,
    Throttle,
    Delay(u64),
    Drop,
    Error,
    /// Plain GetObject: half the body, then the connection is reset.
    Reset,
    /// RDMA GetObject: the bytes are moved, but the reply headers are garbage.
    BadReply,
    /// Plain GetObject: the body in 16 KiB pieces, one every N ms.
    Trickle(u64),
    /// Any response: the `ETag` header removed (applied in front of the S3 handlers).
    NoEtag,
    /// A successful response's body replaced by bytes that are not XML, status kept.
    Garbage,
}

impl Fault {
    /// Faults applied to the HTTP response in front of the S3 handlers (http_layer), rather
    /// than by a handler.
    pub fn is_http_level(self) -> bool {
        matches!(self, Fault::NoEtag | Fault::Garbage)
    }

    pub fn parse(s: &str) -> Result<Fault, String> {
        Ok(match s {
            "none" => Fault::None,
            "decline" => Fault::Decline,
            "ignore" => Fault::Ignore,
            "corrupt" => Fault::Corrupt,
            "short" => Fault::Short,
            "throttle" => Fault::Throttle,
            "drop" => Fault::Drop,
            "error" => Fault::Error,
            "reset" => Fault::Reset,
            "badreply" => Fault::BadReply,
            "noetag" => Fault::NoEtag,
            "garbage" => Fault::Garbage,
            t if t.starts_with("trickle:") => Fault::Trickle(
                t[8..]
                    .parse()
                    .map_err(|_| format!("bad trickle {t:?}: write trickle:MILLISECONDS"))?,
            ),
            d if d.starts_with("delay:") => Fault::Delay(
                d[6..]
                    .parse()
                    .map_err(|_| format!("bad delay {d:?}: write delay:MILLISECONDS"))?,
            ),
            other => return Err(format!("unknown fault {other:?}")),
        })
    }
}

/// The fault file and what has been matched against its current text.
pub struct FaultPlan {
    file: Option<PathBuf>,
    /// (file contents, requests already matched by them, when they were first seen).
    state: Mutex<(String, u64, Instant)>,
}

impl FaultPlan {
    pub fn new(file: Option<PathBuf>) -> FaultPlan {
        FaultPlan {
            file,
            state: Mutex::new((String::new(), 0, Instant::now())),
        }
    }

    /// The fault for this request (operation `op`, carrying an RDMA token or not), from the
    /// fault file. `http_level`: asked by the HTTP layer, which applies only HTTP-level faults
    /// (and the handlers only the others), so a request is counted once.
    pub fn next(&self, op: &str, rdma: bool, http_level: bool) -> Fault {
        let Some(path) = &self.file else {
            return Fault::None;
        };
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let text = text.trim().to_string();
        let mut st = self.state.locked();
        if st.0 != text {
            *st = (text.clone(), 0, Instant::now());
        }
        let mut words = text.split_whitespace();
        let Some(mode) = words.next() else {
            return Fault::None;
        };
        let fault = match Fault::parse(mode) {
            Ok(f) if f.is_http_level() == http_level => f,
            Ok(_) => return Fault::None,
            Err(e) => {
                if !http_level {
                    tracing::warn!(error = %e, "ignoring the fault file");
                }
                return Fault::None;
            }
        };
        let (mut count, mut only, mut after, mut window) = (u64::MAX, None, 0u64, None);
        for w in words {
            if let Some(o) = w.strip_prefix("op=") {
                only = Some(o);
            } else if let Some(n) = w.strip_prefix("after=") {
                after = n.parse().unwrap_or(0);
            } else if let Some(ms) = w.strip_prefix("for=") {
                window = ms.parse().ok().map(Duration::from_millis);
            } else if let Ok(n) = w.parse() {
                count = n;
            }
        }
        let matches = match only {
            Some("any") => true,
            Some(o) => o == op,
            None => rdma,
        };
        if !matches {
            return Fault::None;
        }
        // for=MS: every matching request during MS after the file changed (an outage).
        if let Some(w) = window {
            if st.2.elapsed() >= w {
                return Fault::None;
            }
            tracing::info!(op, ?fault, "injecting a fault (window)");
            return fault;
        }
        st.1 += 1;
        if st.1 <= after || st.1 - after > count {
            return Fault::None;
        }
        tracing::info!(op, ?fault, "injecting a fault");
        fault
    }
}
