//! A store that misbehaves on purpose: [`Faulty`] wraps any [`ObjectStore`] and, by rules a
//! test sets, fails requests with an error kind (a 5xx, throttling after retries, a timeout, an
//! outage), stalls them, declines RDMA (moved over HTTP under `rdma=auto`, an error under
//! `required`) or delivers a short transfer — per operation or for any, from the N-th call on,
//! for a number of calls or forever. Every request is counted per operation, faulted or not.

use s3rdma_proto::sync::Lock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::Op;
use crate::store::{Condition, ListPage, ObjectInfo, ObjectStore, PutSource, RdmaWindow};
use crate::{FileMeta, RdmaMode, S3Error, S3ErrorKind, TransportStats};

/// What a matching request suffers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// It fails with this kind (as after the store's retries), e.g. `ServerError`,
    /// `Throttled`, `Timeout`, `Unreachable`.
    Error(S3ErrorKind),
    /// It waits this long, then goes through.
    Stall(Duration),
    /// The endpoint declines RDMA: a body offered in a registered window moves over HTTP under
    /// `rdma=auto` (a decline and a fallback counted), or fails under `rdma=required`. Requests
    /// that move no body over RDMA are unaffected.
    Decline,
    /// The transfer delivers fewer bytes than asked for (a GET fails with `BadResponse`, as the
    /// SDK store judges it; nothing is stored by a PUT or part).
    Short,
}

#[derive(Clone, Debug)]
struct Rule {
    /// None: every operation.
    op: Option<Op>,
    /// Matching calls to let through before the fault starts.
    skip: u64,
    /// Matching calls to hit once it started (u64::MAX: until cleared).
    times: u64,
    fault: Fault,
}

/// A fault-injecting wrapper around a store.
#[derive(Clone)]
pub struct Faulty<S> {
    inner: S,
    rules: Arc<Mutex<Vec<Rule>>>,
    counts: Arc<[AtomicU64; Op::ALL.len()]>,
}

impl<S: ObjectStore> Faulty<S> {
    pub fn new(inner: S) -> Self {
        Faulty {
            inner,
            rules: Arc::default(),
            counts: Arc::new(Default::default()),
        }
    }

    /// The wrapped store (to make changes or read counters behind the faults' back).
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// From the `nth` matching call on (1 = the next), `times` calls of `op` (None: any
    /// operation) suffer `fault`.
    pub fn inject(&self, op: Option<Op>, fault: Fault, nth: u64, times: u64) {
        self.lock().push(Rule {
            op,
            skip: nth.saturating_sub(1),
            times,
            fault,
        });
    }

    /// The next `times` calls of `op` fail with `kind`.
    pub fn fail(&self, op: Op, kind: S3ErrorKind, times: u64) {
        self.inject(Some(op), Fault::Error(kind), 1, times);
    }

    /// The `nth` call of `op` from now fails with `kind`; the others go through.
    pub fn fail_nth(&self, op: Op, nth: u64, kind: S3ErrorKind) {
        self.inject(Some(op), Fault::Error(kind), nth, 1);
    }

    /// The next `times` requests of any kind fail as if the endpoint could not be reached.
    pub fn outage(&self, times: u64) {
        self.inject(None, Fault::Error(S3ErrorKind::Unreachable), 1, times);
    }

    /// Every rule is dropped: requests go through.
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// Requests of `op` seen so far (faulted or not).
    pub fn requests(&self, op: Op) -> u64 {
        self.counts[op as usize].load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Rule>> {
        self.rules.locked()
    }

    /// Count a request of `op` and return the fault it suffers, if any (the first rule that
    /// applies; a rule that is used up is removed).
    fn fault(&self, op: Op) -> Option<Fault> {
        self.counts[op as usize].fetch_add(1, Ordering::Relaxed);
        let mut rules = self.lock();
        let mut hit = None;
        for (i, r) in rules.iter_mut().enumerate() {
            if r.op.is_some_and(|o| o != op) {
                continue;
            }
            if r.skip > 0 {
                r.skip -= 1;
                continue;
            }
            r.times = r.times.saturating_sub(1);
            hit = Some((i, r.fault.clone(), r.times == 0));
            break;
        }
        let (i, fault, used_up) = hit?;
        if used_up {
            rules.remove(i);
        }
        Some(fault)
    }

    /// Apply the fault of a request that moves no body: errors and stalls; a decline or a short
    /// transfer does not apply to it.
    async fn plain(&self, op: Op, key: &str) -> Result<(), S3Error> {
        match self.fault(op) {
            Some(Fault::Error(kind)) => Err(injected(kind, op, key)),
            Some(Fault::Stall(d)) => {
                tokio::time::sleep(d).await;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Apply the fault of a request that moves a body; returns whether the body should go over
    /// HTTP because RDMA was declined.
    async fn moving(&self, op: Op, key: &str, rdma: bool) -> Result<bool, S3Error> {
        match self.fault(op) {
            None => Ok(false),
            Some(Fault::Error(kind)) => Err(injected(kind, op, key)),
            Some(Fault::Stall(d)) => {
                tokio::time::sleep(d).await;
                Ok(false)
            }
            Some(Fault::Decline) if rdma => {
                self.inner
                    .stats()
                    .decline(self.inner.rdma_mode(), op.name(), key)?;
                Ok(true)
            }
            Some(Fault::Decline) => Ok(false),
            Some(Fault::Short) => {
                TransportStats::add(&self.inner.stats().reply_errors, 1);
                Err(S3Error::new(
                    S3ErrorKind::BadResponse,
                    op.name(),
                    key,
                    "injected fault: short transfer",
                ))
            }
        }
    }
}

fn injected(kind: S3ErrorKind, op: Op, key: &str) -> S3Error {
    S3Error::new(kind, op.name(), key, format!("injected fault: {kind:?}"))
}

impl<S: ObjectStore> ObjectStore for Faulty<S> {
    fn bucket(&self) -> &str {
        self.inner.bucket()
    }

    fn rdma_mode(&self) -> RdmaMode {
        self.inner.rdma_mode()
    }

    fn stats(&self) -> &Arc<TransportStats> {
        self.inner.stats()
    }

    async fn head(&self, key: &str) -> Result<ObjectInfo, S3Error> {
        self.plain(Op::Head, key).await?;
        self.inner.head(key).await
    }

    async fn list_page(
        &self,
        prefix: &str,
        delimiter: Option<&str>,
        token: Option<String>,
        max_keys: i32,
    ) -> Result<ListPage, S3Error> {
        self.plain(Op::List, prefix).await?;
        self.inner
            .list_page(prefix, delimiter, token, max_keys)
            .await
    }

    async fn get_range_into(
        &self,
        key: &str,
        etag: &str,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), S3Error> {
        self.moving(Op::Get, key, false).await?;
        self.inner.get_range_into(key, etag, offset, buf).await
    }

    async fn get_first(&self, key: &str, buf: &mut [u8]) -> Result<(ObjectInfo, usize), S3Error> {
        self.moving(Op::Get, key, false).await?;
        self.inner.get_first(key, buf).await
    }

    async fn get_range_rdma_window(
        &self,
        key: &str,
        etag: &str,
        offset: u64,
        win: RdmaWindow<'_>,
    ) -> Result<(), S3Error> {
        let rdma = self.inner.rdma_mode() != RdmaMode::Off;
        if self.moving(Op::Get, key, rdma).await? {
            return self.inner.get_range_into(key, etag, offset, win.buf).await;
        }
        self.inner
            .get_range_rdma_window(key, etag, offset, win)
            .await
    }

    async fn get_first_rdma_window(
        &self,
        key: &str,
        win: RdmaWindow<'_>,
    ) -> Result<(ObjectInfo, usize), S3Error> {
        let rdma = self.inner.rdma_mode() != RdmaMode::Off;
        if self.moving(Op::Get, key, rdma).await? {
            return self.inner.get_first(key, win.buf).await;
        }
        self.inner.get_first_rdma_window(key, win).await
    }

    async fn put_object_if(
        &self,
        key: &str,
        data: PutSource<'_>,
        cond: &Condition,
        meta: &FileMeta,
    ) -> Result<String, S3Error> {
        let rdma = data.window().is_some() && self.inner.rdma_mode() != RdmaMode::Off;
        let data = if self.moving(Op::Put, key, rdma).await? {
            PutSource::Plain(data.bytes())
        } else {
            data
        };
        self.inner.put_object_if(key, data, cond, meta).await
    }

    async fn create_multipart_with(&self, key: &str, meta: &FileMeta) -> Result<String, S3Error> {
        self.plain(Op::CreateMultipart, key).await?;
        self.inner.create_multipart_with(key, meta).await
    }

    async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        part: i32,
        data: PutSource<'_>,
    ) -> Result<String, S3Error> {
        let rdma = data.window().is_some() && self.inner.rdma_mode() != RdmaMode::Off;
        let data = if self.moving(Op::UploadPart, key, rdma).await? {
            PutSource::Plain(data.bytes())
        } else {
            data
        };
        self.inner.upload_part(key, upload_id, part, data).await
    }

    async fn complete_multipart_if(
        &self,
        key: &str,
        upload_id: &str,
        parts: &[(i32, String)],
        cond: &Condition,
    ) -> Result<String, S3Error> {
        self.plain(Op::CompleteMultipart, key).await?;
        self.inner
            .complete_multipart_if(key, upload_id, parts, cond)
            .await
    }

    async fn abort_multipart(&self, key: &str, upload_id: &str) -> Result<(), S3Error> {
        self.plain(Op::AbortMultipart, key).await?;
        self.inner.abort_multipart(key, upload_id).await
    }

    async fn delete_object(&self, key: &str) -> Result<(), S3Error> {
        self.plain(Op::Delete, key).await?;
        self.inner.delete_object(key).await
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
        self.plain(Op::Copy, key).await?;
        self.inner
            .upload_part_copy(key, upload_id, part, src_key, src_etag, range)
            .await
    }

    async fn copy_object_as_is(
        &self,
        src: &ObjectInfo,
        dst: &str,
        single_limit: u64,
    ) -> Result<String, S3Error> {
        self.plain(Op::Copy, dst).await?;
        self.inner.copy_object_as_is(src, dst, single_limit).await
    }

    async fn copy_object(
        &self,
        src: &ObjectInfo,
        dst: &str,
        meta: &FileMeta,
        single_limit: u64,
    ) -> Result<String, S3Error> {
        self.plain(Op::Copy, dst).await?;
        self.inner.copy_object(src, dst, meta, single_limit).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::MemStore;

    #[test]
    fn rules_hit_the_nth_call_for_a_count_and_every_call_is_counted() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let f = Faulty::new(MemStore::new("b"));
        f.inner().put_external("k", b"v");
        f.fail_nth(Op::Head, 2, S3ErrorKind::ServerError);
        let heads: Vec<bool> = (0..4).map(|_| rt.block_on(f.head("k")).is_ok()).collect();
        assert_eq!(heads, [true, false, true, true]);
        assert_eq!(f.requests(Op::Head), 4);
        assert_eq!(f.inner().requests(Op::Head), 3);
        f.outage(2);
        assert_eq!(
            rt.block_on(f.delete_object("k")).unwrap_err().kind,
            S3ErrorKind::Unreachable
        );
        assert!(rt.block_on(f.list_page("", None, None, 10)).is_err());
        assert!(rt.block_on(f.head("k")).is_ok());
        f.inject(Some(Op::Get), Fault::Short, 1, u64::MAX);
        let mut buf = [0u8; 1];
        for _ in 0..3 {
            let e = rt
                .block_on(f.get_range_into("k", "", 0, &mut buf))
                .unwrap_err();
            assert_eq!(e.kind, S3ErrorKind::BadResponse);
        }
        f.clear();
        rt.block_on(f.get_range_into("k", "", 0, &mut buf)).unwrap();
        assert_eq!(&buf, b"v");
    }

    #[test]
    fn a_decline_moves_a_put_over_http_under_auto_and_fails_under_required() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        for mode in [RdmaMode::Auto, RdmaMode::Required] {
            let f = Faulty::new(MemStore::with_rdma("b", mode));
            let buf = cuobj_ffi::RegisteredBuffer::new(4096).expect("a registered buffer");
            f.inject(Some(Op::Put), Fault::Decline, 1, 1);
            let r = rt.block_on(f.put_object("k", PutSource::Registered(&buf, 10)));
            let stats = f.stats();
            assert_eq!(stats.declines.load(Ordering::Relaxed), 1);
            match mode {
                RdmaMode::Required => {
                    assert_eq!(r.unwrap_err().kind, S3ErrorKind::RdmaDeclined);
                    assert!(f.inner().data("k").is_none());
                }
                _ => {
                    r.unwrap();
                    assert_eq!(stats.fallbacks.load(Ordering::Relaxed), 1);
                    assert_eq!(stats.http_bytes_written.load(Ordering::Relaxed), 10);
                }
            }
            // The next one moves over RDMA.
            rt.block_on(f.put_object("k2", PutSource::Registered(&buf, 10)))
                .unwrap();
            assert_eq!(stats.rdma_bytes_written.load(Ordering::Relaxed), 10);
        }
    }
}
