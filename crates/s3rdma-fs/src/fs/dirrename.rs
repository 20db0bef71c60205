//! Directory rename as one operation of this mount. [S-NS-DIR-RENAME]
//!
//! S3 has no directories: renaming one moves every key under its prefix. Each key is copied on
//! the server to its new name (conditional on the ETag the listing gave, [`COPIES_AT_ONCE`] in
//! flight, UploadPartCopy above the copy threshold; markers are keys and move too), and only
//! once every copy is stored are the sources deleted. So:
//! - a copy failing (an outage, or another client changing or deleting a key meanwhile)
//!   before any delete removes the copies made and leaves the source whole: `rename` fails
//!   with `ESTALE` (the tree changed) or the errno of the failure (`EIO`, ...);
//! - a crash part-way loses no key: both names may remain, the new one complete or partial,
//!   the old one whole until its deletes ran (a delete that fails is logged and counted,
//!   `dir_rename_deletes_failed`, and leaves that key under the old name too);
//! - while it runs, the kernel holds both parent directories locked, so this mount shows the
//!   directory under one name; a key another client writes under the old name meanwhile stays
//!   there.
//!
//! Files open for writing or staged below it make the rename fail with `EBUSY` (close them
//! first); attribute changes waiting to be written back are stored first. A directory made here
//! that has no key (with `--no-dir-markers`) is renamed in memory. Above
//! `--max-dir-rename-keys` keys the rename fails with `EXDEV`, so `mv` copies and deletes file by
//! file instead. The target may be an empty directory (replaced), never a file (`ENOTDIR`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use fuser::{Errno, RenameFlags};
use tracing::{error, info, warn};

use super::inode::{Inode, Kind};
use super::{names, parallel, FsResult, S3Fs};
use s3rdma_client::{ObjectInfo, ObjectStore, S3Error, S3ErrorKind};

/// Copies (and then deletes) one directory rename keeps in flight.
pub const COPIES_AT_ONCE: usize = 16;

impl<S: ObjectStore> S3Fs<S> {
    /// `rename` of the directory `src` to `new_name` in `np`.
    pub(super) async fn rename_dir(
        &self,
        src: &Arc<Inode>,
        np: &Inode,
        new_name: &str,
        flags: RenameFlags,
    ) -> FsResult<()> {
        let dst_prefix = names::dir_prefix_of(&names::child_key(np.key(), new_name));
        if dst_prefix == src.key() {
            return Ok(());
        }
        if dst_prefix.starts_with(src.key()) {
            // Into itself (the kernel refuses it before asking).
            return Err(Errno::EINVAL.into());
        }
        let replaced = self
            .rename_dir_target(np, new_name, &dst_prefix, flags)
            .await?;
        self.rename_dir_settle(src).await?;
        let keys = self.keys_under(src.key()).await?;
        if keys.is_empty() && !self.is_local_dir(src.ino) {
            return Err(Errno::ENOENT.into());
        }
        info!(from = %src.key(), to = %dst_prefix, keys = keys.len(), "renaming a directory: copying its keys, then deleting the sources");
        self.copy_all(&keys, src.key(), &dst_prefix).await?;
        if let Some(neg) = &self.ns.known.negative {
            neg.invalidate_all();
        }
        if let Some(d) = replaced {
            self.forget_dir(&d);
        }
        self.ns
            .inodes
            .rename_tree(src.ino, np.ino, new_name, dst_prefix.clone());
        self.delete_all(keys).await;
        self.counters.dir_renames.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// What the new name holds may be replaced: nothing, or an empty directory (returned).
    async fn rename_dir_target(
        &self,
        np: &Inode,
        new_name: &str,
        dst_prefix: &str,
        flags: RenameFlags,
    ) -> FsResult<Option<Arc<Inode>>> {
        let dst = match self.resolve(np.ino, std::ffi::OsStr::new(new_name)).await {
            Ok((inode, _)) => inode,
            Err(e) if e == Errno::ENOENT => return Ok(None),
            Err(e) => return Err(e),
        };
        if flags.contains(RenameFlags::RENAME_NOREPLACE) {
            return Err(Errno::EEXIST.into());
        }
        if dst.kind != Kind::Dir {
            return Err(Errno::ENOTDIR.into());
        }
        if !self.local_files_in(dst.ino).is_empty() || !self.local_dirs_in(dst.ino).is_empty() {
            return Err(Errno::ENOTEMPTY.into());
        }
        self.ns.deletes.wait_prefix(dst_prefix);
        let page = self.s3.list_page(dst_prefix, Some("/"), None, 2).await?;
        if !page.prefixes.is_empty() || page.objects.iter().any(|o| o.key != dst_prefix) {
            return Err(Errno::ENOTEMPTY.into());
        }
        Ok(Some(dst))
    }

    /// Nothing below `src` may be half-written: files being written or staged there make the
    /// rename fail (`EBUSY`); attribute changes not written back yet are stored first.
    async fn rename_dir_settle(&self, src: &Inode) -> FsResult<()> {
        let busy = self
            .local_files()
            .into_iter()
            .any(|f| self.ancestry(f).any(|i| i.ino == src.ino && i.ino != f));
        if busy {
            warn!(key = %src.key(), "cannot rename a directory while a file in it is open for writing in this mount; close it first");
            return Err(Errno::EBUSY.into());
        }
        if self.ns.attrs.flush_all().await > 0 {
            return Err(Errno::EIO.into());
        }
        self.ns.deletes.wait_prefix(src.key());
        Ok(())
    }

    /// Every key under `prefix` (no delimiter), or `EXDEV` past `--max-dir-rename-keys`.
    async fn keys_under(&self, prefix: &str) -> FsResult<Vec<ObjectInfo>> {
        let max = self.cfg.max_dir_rename_keys;
        let listed: Result<Option<Vec<ObjectInfo>>, S3Error> = async {
            let mut keys = Vec::new();
            let mut token = None;
            loop {
                let mut page = self.s3.list_page(prefix, None, token, 1000).await?;
                keys.append(&mut page.objects);
                if keys.len() > max {
                    return Ok(None);
                }
                token = page.next_token.take();
                if token.is_none() {
                    return Ok(Some(keys));
                }
            }
        }
        .await;
        match listed? {
            Some(keys) => Ok(keys),
            None => {
                info!(key = %prefix, max, "directory rename refused with EXDEV: it holds more keys than --max-dir-rename-keys; mv copies and deletes instead");
                Err(Errno::EXDEV.into())
            }
        }
    }

    /// Copy every key to the new prefix; on any failure, remove the copies made.
    async fn copy_all(&self, keys: &[ObjectInfo], from: &str, to: &str) -> FsResult<()> {
        let s3 = self.s3.clone();
        let threshold = self.cfg.multipart_copy_threshold;
        let jobs: Vec<(ObjectInfo, String)> = keys
            .iter()
            .map(|k| (k.clone(), format!("{to}{}", &k.key[from.len()..])))
            .collect();
        let done = parallel::map_bounded(jobs, COPIES_AT_ONCE, move |(k, dst)| {
            let s3 = s3.clone();
            async move {
                let r = move_key(&s3, &k, &dst, threshold).await;
                (dst, r)
            }
        })
        .await;
        let Some(err) = done.iter().find_map(|(_, r)| r.as_ref().err()).cloned() else {
            self.counters
                .dir_rename_keys
                .fetch_add(keys.len() as u64, Ordering::Relaxed);
            return Ok(());
        };
        let made: Vec<String> = done
            .into_iter()
            .filter_map(|(dst, r)| r.ok().map(|_| dst))
            .collect();
        warn!(from, to, error = %err, copies = made.len(), "a directory rename failed before any source was deleted; removing its copies, the directory keeps its name");
        self.counters
            .dir_renames_undone
            .fetch_add(1, Ordering::Relaxed);
        let left = self.delete_keys(made).await;
        if left > 0 {
            error!(to, left, "copies of an undone directory rename could not be removed; they remain under the new name");
        }
        Err(match err.kind {
            S3ErrorKind::PreconditionFailed | S3ErrorKind::NotFound => Errno::ESTALE.into(),
            _ => err.into(),
        })
    }

    /// Delete the renamed sources; one that fails is logged and counted (both names remain).
    async fn delete_all(&self, keys: Vec<ObjectInfo>) {
        let failed = self
            .delete_keys(keys.into_iter().map(|k| k.key).collect())
            .await;
        if failed > 0 {
            self.counters
                .dir_rename_deletes_failed
                .fetch_add(failed as u64, Ordering::Relaxed);
        }
    }

    /// Delete `keys`; how many failed (each logged). Markers go last, the deepest first: a
    /// server that keeps directories of its own (SeaweedFS) removes a marker's directory only
    /// once nothing is left in it, and would otherwise list the old name on as an empty
    /// directory.
    async fn delete_keys(&self, keys: Vec<String>) -> usize {
        let (mut markers, files): (Vec<String>, Vec<String>) =
            keys.into_iter().partition(|k| k.ends_with('/'));
        markers.sort_by_key(|k| std::cmp::Reverse(k.matches('/').count()));
        let mut failed = self.delete_batch(files).await;
        while let Some(first) = markers.first() {
            let depth = first.matches('/').count();
            let split = markers.partition_point(|k| k.matches('/').count() == depth);
            let rest = markers.split_off(split);
            failed += self
                .delete_batch(std::mem::replace(&mut markers, rest))
                .await;
        }
        failed
    }

    /// Delete `keys` at once ([`COPIES_AT_ONCE`] in flight); how many failed (each logged).
    async fn delete_batch(&self, keys: Vec<String>) -> usize {
        let s3 = self.s3.clone();
        let results = parallel::map_bounded(keys, COPIES_AT_ONCE, move |key| {
            let s3 = s3.clone();
            async move {
                let r = s3.delete_object(&key).await;
                (key, r)
            }
        })
        .await;
        let mut failed = 0;
        for (key, r) in results {
            if let Err(e) = r {
                error!(key, error = %e, "a renamed directory's key could not be deleted; it remains under the old name too");
                failed += 1;
            }
        }
        failed
    }
}

/// Store the key `k` under `dst`: a server-side copy keeping its attributes. A directory
/// marker (`dir/`, no bytes) that the server cannot copy (SeaweedFS answers 404: its markers
/// are directories of its own) is stored anew, empty.
async fn move_key<S: ObjectStore>(
    s3: &S,
    k: &ObjectInfo,
    dst: &str,
    threshold: u64,
) -> Result<String, S3Error> {
    match s3.copy_object_as_is(k, dst, threshold).await {
        Err(e) if e.kind == S3ErrorKind::NotFound && k.key.ends_with('/') && k.size == 0 => {
            s3.put_object(dst, s3rdma_client::PutSource::Plain(&[]))
                .await
        }
        r => r,
    }
}
