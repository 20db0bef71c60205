//! The deletes that finish renames, run while the caller goes on.
//!
//! S3 has no rename: a file's rename is a server-side copy under the new key, then a delete
//! of the old one. `rsync` renames every file it writes (its temporary name to the real one),
//! one file after another, so the delete's round trip was a third of what each file cost it
//! after the upload. The rename now returns once the copy is stored (the new name holds the
//! bytes and attributes: nothing can be lost from here on), and the source's delete runs in
//! the background.
//!
//! Until it has finished, this mount behaves as if it had: the old name is gone from its
//! namespace, and every operation that would ask S3 about that key or store under it first
//! waits for the delete — a lookup of the name or of a directory above it, a listing of a
//! directory that holds it (`readdir`, the emptiness check of `rmdir`), and a create, symlink,
//! mkdir or rename onto the name. Only operations on other names go on meanwhile. The end of
//! the mount waits for the deletes still running (bounded by [`END_WAIT`]).
//!
//! A delete that fails (after the store's retries) leaves both names on the server, as the
//! in-line delete did when it failed; it is logged at ERROR with both keys and counted
//! (`rename_deletes_failed`), since the rename had already returned. Another client sees the
//! old name for the delete's round trip after the rename returned (S3 renames are never atomic).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tracing::{debug, error, warn};

use s3rdma_client::ObjectStore;

/// How long the end of the mount waits for deletes still running.
pub const END_WAIT: Duration = Duration::from_secs(30);

/// The deletes of renamed sources still running, by key.
pub struct Deletes<S: ObjectStore> {
    s3: S,
    rt: Handle,
    /// Key → deletes of it running (two only if a name is renamed away, made again and
    /// renamed away again before the first delete ends).
    running: Mutex<HashMap<Box<str>, u32>>,
    done: Condvar,
    /// `running.len()` read without the lock: the common case (none) costs one load.
    count: AtomicUsize,
    started: AtomicU64,
    failed: AtomicU64,
    waited: AtomicU64,
}

impl<S: ObjectStore> Deletes<S> {
    pub fn new(s3: S, rt: Handle) -> Self {
        Deletes {
            s3,
            rt,
            running: Mutex::new(HashMap::new()),
            done: Condvar::new(),
            count: AtomicUsize::new(0),
            started: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            waited: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Box<str>, u32>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Delete `key` (the source of a rename to `to`, already copied) in the background.
    pub fn start(self: &Arc<Self>, key: &str, to: &str) {
        {
            let mut running = self.lock();
            *running.entry(key.into()).or_insert(0) += 1;
            self.count.store(running.len(), Ordering::Release);
        }
        self.started.fetch_add(1, Ordering::Relaxed);
        let me = self.clone();
        let (key, to) = (key.to_string(), to.to_string());
        self.rt.spawn(async move {
            match me.s3.delete_object(&key).await {
                Ok(()) => debug!(key = %key, to = %to, "renamed: source deleted"),
                Err(e) => {
                    me.failed.fetch_add(1, Ordering::Relaxed);
                    error!(key = %key, to = %to, error = %e, "renamed by copy, but the source could not be deleted: both names exist on the server (delete the old one by hand)");
                }
            }
            me.finish(&key);
        });
    }

    fn finish(&self, key: &str) {
        let mut running = self.lock();
        if let Some(n) = running.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                running.remove(key);
            }
        }
        self.count.store(running.len(), Ordering::Release);
        drop(running);
        self.done.notify_all();
    }

    /// Wait for the deletes of the entry `name` of the directory whose prefix is `dir`: its
    /// key, and any key under it as a directory (a lookup, or something stored under the
    /// name). Called from FUSE threads, never from the runtime; allocates nothing.
    pub fn wait_name(&self, dir: &str, name: &str) {
        self.wait_while(|k| names_entry(k, dir, name));
    }

    /// Wait for the deletes of keys under `prefix` (a listing of that directory).
    pub fn wait_prefix(&self, prefix: &str) {
        self.wait_while(|k| k.starts_with(prefix));
    }

    fn wait_while(&self, matches: impl Fn(&str) -> bool) {
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut running = self.lock();
        let mut counted = false;
        while running.keys().any(|k| matches(k)) {
            if !counted {
                self.waited.fetch_add(1, Ordering::Relaxed);
                counted = true;
            }
            running = self.done.wait(running).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Wait for every delete running, at most `limit`; how many are still running then.
    pub fn wait_all(&self, limit: Duration) -> usize {
        let deadline = Instant::now() + limit;
        let mut running = self.lock();
        while !running.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                warn!(count = running.len(), keys = ?running.keys().take(10).collect::<Vec<_>>(), "deletes of renamed sources still running; both names may stay on the server");
                return running.len();
            }
            running = self
                .done
                .wait_timeout(running, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        0
    }

    /// Counters for `s3rdma stats` and `/metrics`.
    pub fn report(&self, out: &mut dyn s3rdma_metrics::Sink) {
        use s3rdma_metrics::{load, Value};
        let (c, g) = (Value::counter, Value::gauge);
        out.value(c(
            "rename_deletes",
            "Deletes of renamed sources started.",
            load(&self.started),
        ));
        out.value(g(
            "rename_deletes_running",
            "Names whose rename's delete is still running.",
            self.count.load(Ordering::Relaxed) as u64,
        ));
        out.value(c(
            "rename_deletes_failed",
            "Renames whose source could not be deleted (both names left).",
            load(&self.failed),
        ));
        out.value(c(
            "rename_deletes_waited_for",
            "Operations that waited for a rename's delete.",
            load(&self.waited),
        ));
    }
}

/// Whether `key` is the entry `name` of the directory prefix `dir`, or lies under it.
fn names_entry(key: &str, dir: &str, name: &str) -> bool {
    key.strip_prefix(dir)
        .and_then(|rest| rest.strip_prefix(name))
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::names_entry;

    #[test]
    fn an_entry_is_its_key_and_what_lies_under_it() {
        assert!(names_entry("d/a", "d/", "a"));
        assert!(names_entry("d/a/x", "d/", "a"));
        assert!(names_entry("a", "", "a"));
        assert!(!names_entry("d/ab", "d/", "a"));
        assert!(!names_entry("d/a.tmp", "d/", "a"));
        assert!(!names_entry("e/a", "d/", "a"));
    }
}
