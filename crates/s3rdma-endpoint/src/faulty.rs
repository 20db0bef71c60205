//! Response bodies that misbehave on purpose: cut off mid-way (the connection is reset) or
//! trickled slowly (a stalled transfer).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use s3s::dto::StreamingBlob;

/// A body that sends `data` in `chunk`-byte pieces, waiting `pause` before each one, and ends
/// with an error (a reset connection) after `fail_after` bytes if set.
pub struct FaultyBody {
    data: Bytes,
    sent: usize,
    chunk: usize,
    pause: Option<Duration>,
    fail_after: Option<usize>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl FaultyBody {
    /// Half of `data`, then a reset.
    pub fn reset(data: Bytes) -> StreamingBlob {
        let half = data.len() / 2;
        Self::blob(FaultyBody {
            data,
            sent: 0,
            chunk: 64 << 10,
            pause: None,
            fail_after: Some(half),
            sleep: None,
        })
    }

    /// 16 KiB every `pause`.
    pub fn trickle(data: Bytes, pause: Duration) -> StreamingBlob {
        Self::blob(FaultyBody {
            data,
            sent: 0,
            chunk: 16 << 10,
            pause: Some(pause),
            fail_after: None,
            sleep: None,
        })
    }

    fn blob(b: FaultyBody) -> StreamingBlob {
        StreamingBlob::wrap(b)
    }
}

impl futures_core::Stream for FaultyBody {
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Some(limit) = this.fail_after {
            if this.sent >= limit {
                this.fail_after = None;
                this.sent = this.data.len();
                return Poll::Ready(Some(Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "connection reset (fault injection)",
                ))));
            }
        }
        if this.sent >= this.data.len() {
            return Poll::Ready(None);
        }
        if let Some(p) = this.pause {
            let sleep = this
                .sleep
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(p)));
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            this.sleep = None;
        }
        let mut end = (this.sent + this.chunk).min(this.data.len());
        if let Some(limit) = this.fail_after {
            end = end.min(limit);
        }
        let piece = this.data.slice(this.sent..end);
        this.sent = end;
        Poll::Ready(Some(Ok(piece)))
    }
}
