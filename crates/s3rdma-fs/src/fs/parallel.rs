//! Many independent S3 requests at once, bounded: the keys of a listing whose type must be
//! asked for, the copies and deletes of a directory rename. Each runs as a task on the
//! runtime; at most `limit` are in flight.

use std::future::Future;

/// `f` of every item, at most `limit` at a time; the results in the items' order.
pub(super) async fn map_bounded<I, O, F, Fut>(items: Vec<I>, limit: usize, f: F) -> Vec<O>
where
    I: Send + 'static,
    O: Send + 'static,
    F: Fn(I) -> Fut,
    Fut: Future<Output = O> + Send + 'static,
{
    let mut out: Vec<Option<O>> = (0..items.len()).map(|_| None).collect();
    let mut set = tokio::task::JoinSet::new();
    let mut todo = items.into_iter().enumerate();
    loop {
        while set.len() < limit.max(1) {
            let Some((i, item)) = todo.next() else { break };
            let fut = f(item);
            set.spawn(async move { (i, fut.await) });
        }
        match set.join_next().await {
            Some(Ok((i, o))) => out[i] = Some(o),
            // A task panicked: the caller's thread panics as it would have run it itself.
            Some(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Cancelled: only when the runtime shuts down, and then nothing waits for this.
            Some(Err(_)) => {}
            None => break,
        }
    }
    out.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_order_and_bound() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let live = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let got = rt.block_on(map_bounded((0..50u64).collect(), 4, |i| {
            let (live, most) = (live.clone(), most.clone());
            async move {
                let now = live.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(std::time::Duration::from_millis(50 - i)).await;
                live.fetch_sub(1, Ordering::SeqCst);
                i * 2
            }
        }));
        assert_eq!(got, (0..50u64).map(|i| i * 2).collect::<Vec<_>>());
        assert!(most.load(Ordering::SeqCst) <= 4);
        assert!(most.load(Ordering::SeqCst) >= 2);
    }
}
