//! What the mount's lifecycle needs of the file system once the FUSE session owns it: refuse
//! new writes when shutting down, and abort the files still being written when time is up.

use s3rdma_client::ObjectStore;
use s3rdma_proto::sync::Lock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::OpenFile;
use crate::upload::WriteError;

pub(super) type FileTable<S> = Arc<Mutex<HashMap<u64, Arc<OpenFile<S>>>>>;

/// A handle on the open files of a mount, usable from the signal handler.
#[derive(Clone)]
pub struct FsControl<S: ObjectStore> {
    pub(super) counters: Arc<super::report::FsCounters>,
    pub(super) files: FileTable<S>,
    pub(super) closing: Arc<AtomicBool>,
    /// Files aborted because the mount ended while they were being written.
    pub(super) aborted: Arc<AtomicUsize>,
}

impl<S: ObjectStore> FsControl<S> {
    /// From now on, opening a file for writing fails (EROFS); files already open for writing
    /// can still be written and closed.
    pub fn begin_shutdown(&self) {
        self.closing.store(true, Ordering::SeqCst);
    }

    /// Whether the kernel granted FUSE over io_uring at INIT (known once the session exists).
    pub fn ring_granted(&self) -> bool {
        self.counters.ring_granted.load(Ordering::Relaxed)
    }

    /// How many files were aborted by [`FsControl::abort_writes`] so far.
    pub fn aborted(&self) -> usize {
        self.aborted.load(Ordering::SeqCst)
    }

    fn write_files(&self) -> Vec<Arc<OpenFile<S>>> {
        self.files
            .locked()
            .values()
            .filter(|f| matches!(&***f, OpenFile::Write(..)))
            .cloned()
            .collect()
    }

    /// The files open for writing whose data is not stored yet: their number, and the keys of
    /// those not busy this instant (a file in the middle of a write or of its commit is
    /// counted without waiting for it).
    pub fn open_writes(&self) -> (usize, Vec<String>) {
        let mut count = 0;
        let mut keys = Vec::new();
        for f in self.write_files() {
            if let OpenFile::Write(_, w) = &*f {
                match w.upload.try_lock() {
                    Ok(up) if up.is_open() => {
                        count += 1;
                        keys.push(up.key().to_string());
                    }
                    Ok(_) => {}
                    Err(_) => count += 1,
                }
            }
        }
        (count, keys)
    }

    /// Abort every file still being written (nothing is stored, multipart uploads are
    /// aborted; its writer gets EIO from its next write and from close). A file whose commit
    /// is running is waited for. Returns the keys that were aborted.
    pub async fn abort_writes(&self, why: &str) -> Vec<String> {
        let mut keys = Vec::new();
        for f in self.write_files() {
            if let OpenFile::Write(_, w) = &*f {
                let mut up = w.upload.lock().await;
                if up.is_open() {
                    keys.push(up.key().to_string());
                    up.cancel(WriteError::Shutdown(why.to_string())).await;
                    self.aborted.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        keys
    }
}
