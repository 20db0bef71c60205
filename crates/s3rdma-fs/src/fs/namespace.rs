//! Namespace operations: `mkdir`, `rmdir`, `unlink`, `rename` and `setattr`.
//!
//! S3 has no directories and no rename: a directory made here lives in this mount (or as a
//! `dir/` marker, unless `--no-dir-markers`) until keys exist under it; a file rename is a
//! server-side copy conditional on the source's ETag, then a delete of the source; a
//! directory rename moves every key under it (see `dirrename`). Mode, owner, mtime and user
//! extended attributes of a file are stored as user metadata (see `s3rdma_client::meta`), by
//! a copy of the object onto itself when the file is already stored; a directory's are kept in
//! memory for the life of the mount.

use s3rdma_proto::sync::Lock;
use std::ffi::OsStr;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use fuser::{Errno, FileAttr, RenameFlags};
use tracing::{debug, warn};

use super::inode::{Inode, Kind, Stat, ROOT_INO};
use super::{names, FsResult, S3Fs};
use s3rdma_client::{Condition, FileMeta, ObjectInfo, ObjectStore, PutSource, S3ErrorKind};

/// What a `setattr` asks to change.
#[derive(Debug, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub mtime: Option<SystemTime>,
    /// The file's user extended attributes, all of them (see `xattrs`).
    pub xattrs: Option<s3rdma_client::xattr::Xattrs>,
}

impl SetAttr {
    fn meta(&self) -> FileMeta {
        FileMeta {
            mode: self.mode.map(|m| m & 0o7777),
            uid: self.uid,
            gid: self.gid,
            mtime: self.mtime,
            xattrs: self.xattrs.clone(),
        }
    }
}

impl<S: ObjectStore> S3Fs<S> {
    /// The directories this mount keeps whatever S3 says: those made here (and not removed
    /// since), and those holding a file being written here.
    fn anchors(&self) -> Vec<u64> {
        let mut dirs: Vec<u64> = {
            let set = self.ns.made.local_dirs.locked();
            set.iter().copied().collect()
        };
        dirs.extend(
            self.local_files()
                .into_iter()
                .filter_map(|i| self.ns.inodes.get(i))
                .map(|f| f.parent),
        );
        dirs
    }

    /// `ino` and its parents up to the root.
    pub(super) fn ancestry(&self, ino: u64) -> impl Iterator<Item = Arc<Inode>> + '_ {
        std::iter::successors(self.ns.inodes.get(ino), move |i| {
            (i.ino != ROOT_INO)
                .then(|| self.ns.inodes.get(i.parent))
                .flatten()
        })
    }

    /// Whether directory `ino` exists in this mount whatever S3 says: it was made here, or a
    /// directory made here or a file being written here lies below it (a directory exists
    /// while it has an entry).
    pub(super) fn is_local_dir(&self, ino: u64) -> bool {
        self.anchors()
            .into_iter()
            .any(|l| self.ancestry(l).any(|i| i.ino == ino))
    }

    /// The directories in `parent` that exist in this mount whatever S3 says (see
    /// [`S3Fs::is_local_dir`]).
    pub(super) fn local_dirs_in(&self, parent: u64) -> Vec<Arc<Inode>> {
        let mut out: Vec<Arc<Inode>> = Vec::new();
        for l in self.anchors() {
            let child = self
                .ancestry(l)
                .find(|i| i.parent == parent && i.ino != parent);
            if let Some(c) = child {
                if !out.iter().any(|o| o.ino == c.ino) {
                    out.push(c);
                }
            }
        }
        out
    }

    pub(super) fn dir_meta(&self, ino: u64) -> Option<FileMeta> {
        self.ns.made.dir_attrs.locked().get(&ino).cloned()
    }

    /// The parent directory and the name as a key (EINVAL for non-UTF-8, ENAMETOOLONG...).
    pub(super) fn dir_and_name<'a>(
        &self,
        parent: u64,
        name: &'a OsStr,
    ) -> FsResult<(Arc<Inode>, &'a str)> {
        let p = self.ns.inodes.get(parent).ok_or(Errno::ENOENT)?;
        if p.kind != Kind::Dir {
            return Err(Errno::ENOTDIR.into());
        }
        let name = name.to_str().ok_or_else(|| {
            warn!(parent = %p.key(), "a file name must be UTF-8 to be an S3 key");
            Errno::EINVAL
        })?;
        names::check_name(name)?;
        // Something is to be stored under this name: a rename's delete of it finishes first.
        self.ns.deletes.wait_name(p.key(), name);
        Ok((p, name))
    }

    /// The existing child `name` of `parent` (asking S3 if the inode table has no fresh
    /// answer).
    async fn existing_child(&self, parent: u64, name: &OsStr) -> FsResult<Arc<Inode>> {
        self.resolve(parent, name).await.map(|(inode, _)| inode)
    }

    pub(super) async fn do_mkdir(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
    ) -> FsResult<FileAttr> {
        let _ns = self.ns_change();
        let (p, name) = self.dir_and_name(parent, name)?;
        let prefix = names::dir_prefix_of(&names::child_key(p.key(), name));
        if self.cfg.dir_markers {
            let stored = self
                .s3
                .put_object_if(
                    &prefix,
                    PutSource::Plain(&[]),
                    &Condition::IfNoneMatch,
                    &FileMeta::default(),
                )
                .await;
            match stored {
                Ok(_) => {}
                Err(e) if e.kind == S3ErrorKind::PreconditionFailed => {
                    return Err(Errno::EEXIST.into())
                }
                Err(e) => return Err(e.into()),
            }
        }
        let child = self.ns.inodes.upsert_child(parent, name, Kind::Dir, prefix);
        self.ns.made.local_dirs.locked().insert(child.ino);
        if (mode & 0o7777) as u16 != self.cfg.dir_mode {
            self.ns.made.dir_attrs.locked().insert(
                child.ino,
                FileMeta {
                    mode: Some(mode & 0o7777),
                    ..Default::default()
                },
            );
        }
        let now = Instant::now();
        // Nothing was under it when the kernel's lookup asked.
        self.ns.known.whole_dirs.made(child.ino, now);
        let stat = self.dir_stat();
        child.set_stat(stat.clone(), self.ttl_from(now));
        debug!(key = %child.key(), "directory made");
        Ok(self.entry(&child, &stat))
    }

    pub(super) async fn do_rmdir(&self, parent: u64, name: &OsStr) -> FsResult<()> {
        let _ns = self.ns_change();
        let child = self.existing_child(parent, name).await?;
        if child.kind != Kind::Dir {
            return Err(Errno::ENOTDIR.into());
        }
        if !self.local_files_in(child.ino).is_empty() || !self.local_dirs_in(child.ino).is_empty() {
            return Err(Errno::ENOTEMPTY.into());
        }
        self.ns.deletes.wait_prefix(child.key());
        let page = self.s3.list_page(child.key(), Some("/"), None, 2).await?;
        let marker = page.objects.iter().any(|o| o.key == child.key());
        if !page.prefixes.is_empty() || page.objects.iter().any(|o| o.key != child.key()) {
            return Err(Errno::ENOTEMPTY.into());
        }
        if marker {
            self.s3.delete_object(child.key()).await?;
        }
        self.forget_dir(&child);
        debug!(key = %child.key(), "directory removed");
        Ok(())
    }

    pub(super) fn forget_dir(&self, child: &Inode) {
        self.ns.known.whole_dirs.forget(child.ino);
        self.ns.made.local_dirs.locked().remove(&child.ino);
        self.ns.made.dir_attrs.locked().remove(&child.ino);
        child.invalidate();
        self.ns.inodes.remove_child(child.parent, child.name());
    }

    pub(super) async fn do_unlink(&self, parent: u64, name: &OsStr) -> FsResult<()> {
        let _ns = self.ns_change();
        let child = self.existing_child(parent, name).await?;
        if child.kind == Kind::Dir {
            return Err(Errno::EISDIR.into());
        }
        if let Some(s) = self.acquire_staged(child.ino) {
            let r = self.unlink_staged(&s).await;
            let _ = self.release_staged(child.ino, &s).await;
            r?;
            self.forget_file(&child);
            debug!(key = %child.key(), "removed while staged");
            return Ok(());
        }
        // Removed while being written (tar's placeholder for a link, a temporary file): the name
        // goes now, and what its open handles write is stored nowhere. One already being
        // stored is waited for, then deleted as any stored file.
        if self.writing(child.ino).is_some()
            && self
                .while_writing(child.ino, &mut |up| up.discard())
                .await?
        {
            self.lock_writing().remove(&child.ino);
        }
        // Attribute changes not written back yet go with the object.
        let pending = self.ns.attrs.take(child.ino);
        if let Err(e) = self.s3.delete_object(child.key()).await {
            if let Some(p) = pending {
                self.ns.attrs.restore(p);
            }
            return Err(e.into());
        }
        self.forget_file(&child);
        debug!(key = %child.key(), "removed");
        Ok(())
    }

    fn forget_file(&self, child: &Inode) {
        child.invalidate();
        child.forget_opened();
        self.ns.inodes.remove_child(child.parent, child.name());
        self.remember_missing(child.key().to_string());
    }

    pub(super) async fn do_rename(
        &self,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> FsResult<()> {
        let _ns = self.ns_change();
        if flags.contains(RenameFlags::RENAME_EXCHANGE)
            || flags.contains(RenameFlags::RENAME_WHITEOUT)
        {
            return Err(Errno::EINVAL.into());
        }
        let src = self.existing_child(parent, name).await?;
        let (np, new_name) = self.dir_and_name(new_parent, new_name)?;
        if src.kind == Kind::Dir {
            return self.rename_dir(&src, &np, new_name, flags).await;
        }
        let dst_key = names::child_key(np.key(), new_name);
        if dst_key == src.key() {
            return Ok(());
        }
        let dst = self.rename_target(new_parent, new_name, flags).await?;
        let to = (new_parent, new_name, dst_key.as_str());
        if let Some(s) = self.acquire_staged(src.ino) {
            return self.rename_staged_file(&src, &s, dst.as_deref(), to).await;
        }
        // A staged file replaced by the rename stores nothing any more.
        if let Some(d) = dst.as_deref().and_then(|d| self.staged(d.ino)) {
            d.replaced();
        }
        // A file not stored yet (still open) will be stored under the new name. One being
        // stored right now (its last close or release is committing it) is waited for.
        if self
            .while_writing(src.ino, &mut |up| up.retarget(&dst_key))
            .await?
        {
            self.moved(&src, dst.as_deref(), new_parent, new_name, &dst_key, None);
            debug!(from = %src.key(), to = %dst_key, "renamed while being written");
            return Ok(());
        }
        self.rename_stored(&src, dst.as_deref(), to).await
    }

    /// What a file rename to `new_name` in `new_parent` replaces (a file, or nothing), or why
    /// it may not.
    async fn rename_target(
        &self,
        new_parent: u64,
        new_name: &str,
        flags: RenameFlags,
    ) -> FsResult<Option<Arc<Inode>>> {
        let dst = match self.resolve(new_parent, OsStr::new(new_name)).await {
            Ok((inode, _)) => inode,
            Err(e) if e == Errno::ENOENT => return Ok(None),
            Err(e) => return Err(e),
        };
        if flags.contains(RenameFlags::RENAME_NOREPLACE) {
            return Err(Errno::EEXIST.into());
        }
        if dst.kind == Kind::Dir {
            return Err(Errno::EISDIR.into());
        }
        if self.writing(dst.ino).is_some() {
            return Err(Errno::EBUSY.into());
        }
        Ok(Some(dst))
    }

    /// The rename of a staged file `src` (acquired as `s`) to `to` (parent, name, key): it is
    /// stored under the new name once its last handle is gone.
    async fn rename_staged_file(
        &self,
        src: &Inode,
        s: &Arc<super::staged::Staged<S>>,
        dst: Option<&Inode>,
        (new_parent, new_name, dst_key): (u64, &str, &str),
    ) -> FsResult<()> {
        let r = self.rename_staged(s, dst_key, dst.is_some()).await;
        if r.is_err() {
            let _ = self.release_staged(src.ino, s).await;
            return r;
        }
        if let Some(d) = dst.and_then(|d| self.staged(d.ino)) {
            d.replaced();
        }
        self.moved(src, dst, new_parent, new_name, dst_key, None);
        // Its last handle gone, it is stored now, under the new name.
        self.release_staged(src.ino, s).await?;
        debug!(from = %src.key(), to = %dst_key, "renamed while staged");
        Ok(())
    }

    /// The rename of a stored file: a server-side copy conditional on the source's ETag (its
    /// attributes, and changes not written back yet, go along), then the source's delete in
    /// the background (see `deletes`).
    async fn rename_stored(
        &self,
        src: &Inode,
        dst: Option<&Inode>,
        (new_parent, new_name, dst_key): (u64, &str, &str),
    ) -> FsResult<()> {
        // Attribute changes not written back yet go along with the copy (when it copies the
        // version they were made on).
        let pending = self.ns.attrs.take(src.ino);
        let with_changes = |info: &ObjectInfo| {
            let meta = info.meta.clone().unwrap_or_default();
            match &pending {
                Some(p) if p.base.etag == info.etag => meta.merged(&p.change),
                _ => meta,
            }
        };
        let copied = self
            .copy_known(src, |info| (dst_key.to_string(), with_changes(info)))
            .await;
        let (info, etag) = match copied {
            Ok(c) => c,
            Err(e) => {
                if let Some(p) = pending {
                    self.ns.attrs.restore(p);
                }
                return Err(e);
            }
        };
        let meta = with_changes(&info);
        if let Some(p) = &pending {
            self.ns.attrs.renamed(p, p.base.etag == info.etag);
        }
        self.ns.deletes.start(src.key(), dst_key);
        let stat = Stat::from(&ObjectInfo {
            key: dst_key.to_string(),
            size: info.size,
            etag,
            last_modified: SystemTime::now(),
            meta: Some(meta),
        });
        self.moved(src, dst, new_parent, new_name, dst_key, Some(stat));
        debug!(from = %src.key(), to = %dst_key, "renamed");
        Ok(())
    }

    /// A server-side copy of the object `inode` names, to the key and with the attributes
    /// `target` gives for the source's current state; returns that state and the new ETag.
    /// The source is what this mount last learnt of it (its own write, or a lookup, within
    /// the metadata TTL, attributes known) rather than a HeadObject: a copy keeps the
    /// source's ETag, so a HEAD right after an attribute change may still answer the old
    /// attributes under the same ETag (SeaweedFS does), and rsync's chmod, utimes and rename in
    /// a row would store a stale mtime. The copy is conditional on that ETag; if the object
    /// changed meanwhile, the source is asked for (HeadObject) and the copy tried once more.
    async fn copy_known(
        &self,
        inode: &Inode,
        target: impl Fn(&ObjectInfo) -> (String, FileMeta),
    ) -> FsResult<(ObjectInfo, String)> {
        let known = self.learnt_version(inode);
        let copy = |info: &ObjectInfo| {
            let (dst, meta) = target(info);
            let info = info.clone();
            let threshold = self.cfg.multipart_copy_threshold;
            async move { self.s3.copy_object(&info, &dst, &meta, threshold).await }
        };
        if let Some(info) = known {
            match copy(&info).await {
                Ok(etag) => return Ok((info, etag)),
                Err(e) if e.kind == S3ErrorKind::PreconditionFailed => {
                    debug!(key = %inode.key(), "changed since this mount last saw it; asking S3")
                }
                Err(e) => return Err(e.into()),
            }
        }
        let info = self.s3.head(inode.key()).await?;
        let etag = copy(&info).await?;
        Ok((info, etag))
    }

    /// The version of `inode` this mount learnt from S3 (or stored) within the metadata TTL,
    /// stored attributes included.
    fn learnt_version(&self, inode: &Inode) -> Option<ObjectInfo> {
        inode
            .recently_asked(Instant::now(), self.cfg.metadata_ttl)
            .filter(|s| !s.etag.is_empty() && s.meta.is_some())
            .map(|s| ObjectInfo {
                key: inode.key().to_string(),
                size: s.size,
                etag: s.etag,
                last_modified: s.mtime,
                meta: s.meta,
            })
    }

    /// What [`Self::known`] gives, else what HeadObject answers now (and is remembered).
    pub(super) async fn known_version(&self, inode: &Inode) -> FsResult<ObjectInfo> {
        if let Some(info) = self.learnt_version(inode) {
            return Ok(info);
        }
        let info = self.s3.head(inode.key()).await?;
        let now = Instant::now();
        self.remember(inode, Stat::from(&info), now);
        Ok(info)
    }

    /// Bookkeeping of a rename: the inode moves to its new name, whatever had that name and
    /// the old name are forgotten.
    fn moved(
        &self,
        src: &Inode,
        dst: Option<&Inode>,
        new_parent: u64,
        new_name: &str,
        dst_key: &str,
        stat: Option<Stat>,
    ) {
        if let Some(d) = dst {
            d.invalidate();
            d.forget_opened();
            // Replaced: changes to its attributes not written back yet are moot.
            self.ns.attrs.take(d.ino);
        }
        if let Some(neg) = &self.ns.known.negative {
            neg.invalidate(dst_key);
        }
        self.remember_missing(src.key().to_string());
        if let Some(moved) =
            self.ns
                .inodes
                .rename(src.ino, new_parent, new_name, dst_key.to_string())
        {
            if let Some(stat) = stat {
                let now = Instant::now();
                self.remember(&moved, stat, now);
            }
        }
    }

    /// `setattr`. Files: mode, owner and mtime are stored as user metadata — with the upload
    /// for a file being written, else by a copy of the object onto itself (conditional on its
    /// ETag); `truncate` to 0 stores an empty object, to the current size of a file being
    /// written does nothing, to any other size stages the file (see `staged`; EOPNOTSUPP on a
    /// mount that cannot stage). Directories: kept in memory for the life of the mount. atime
    /// is not kept (the mount is noatime).
    pub(super) async fn do_setattr(&self, ino: u64, set: SetAttr) -> FsResult<FileAttr> {
        let _ns = self.ns_change();
        let inode = self.ns.inodes.get(ino).ok_or(Errno::ENOENT)?;
        if self.cfg.read_only {
            return Err(Errno::EROFS.into());
        }
        let mut change = set.meta();
        if inode.kind == Kind::Symlink {
            // A link has no mode of its own (chmod follows it); its type bits stay stored.
            change.mode = None;
            if set.size.is_some() {
                return Err(Errno::EINVAL.into());
            }
        }
        if inode.kind == Kind::Dir {
            if !change.is_empty() {
                let mut map = self.ns.made.dir_attrs.locked();
                let merged = map.get(&ino).cloned().unwrap_or_default().merged(&change);
                map.insert(ino, merged);
            }
            return self.do_getattr(ino).await;
        }
        if self.setattr_staged_file(ino, set.size, &change).await? {
            return self.do_getattr(ino).await;
        }
        if let Some(w) = self.writing(ino) {
            if let Some(size) = set.size {
                self.truncate_writing(ino, size).await?;
            }
            let applied = self
                .while_writing(ino, &mut |up| {
                    up.set_meta(&change);
                    w.set_meta(&change);
                })
                .await?;
            if applied {
                return self.do_getattr(ino).await;
            }
        }
        match set.size {
            None if change.is_empty() => self.do_getattr(ino).await,
            // Only attributes: written back shortly, by one copy for all the changes that
            // follow (see `attrs`), onto the version this mount knows.
            None => {
                let base = self.known_version(&inode).await?;
                let stat = Stat::from(&base);
                self.ns.attrs.defer(inode.clone(), base, &change);
                Ok(self.attr(&inode, &stat))
            }
            Some(size) => self.truncate_stored_file(&inode, size, &change).await,
        }
    }

    /// `setattr` of a staged file: applied to it and `true`, or `false` when it is not staged
    /// (any more). Counted as a handle meanwhile, so that a last release running now cannot
    /// drop the change; if no other handle is left, the change is stored at once.
    async fn setattr_staged_file(
        &self,
        ino: u64,
        size: Option<u64>,
        change: &FileMeta,
    ) -> FsResult<bool> {
        let Some(s) = self.acquire_staged(ino) else {
            return Ok(false);
        };
        // Its last handle has just gone (the kernel's release races the `utimes` that `rsync`
        // sends after `close`) and its bytes are stored: the state is dropped and the change
        // deferred as for any stored file, not stored by a copy of its own.
        let closing =
            size.is_none() && s.handles() == 1 && !s.file.is_dirty() && s.file.base().is_some();
        if closing {
            self.release_staged(ino, &s).await?;
            return Ok(false);
        }
        let r = self.setattr_staged(&s, size, change);
        let stored = self.release_staged(ino, &s).await;
        r.and(stored)?;
        Ok(true)
    }

    /// `truncate` of a stored file (with the attribute `change`): to 0 an empty object in its
    /// place, to its size a copy onto itself, to another size the file staged (the unchanged
    /// bytes copied on the server), all conditional on its ETag.
    async fn truncate_stored_file(
        &self,
        inode: &Arc<Inode>,
        size: u64,
        change: &FileMeta,
    ) -> FsResult<FileAttr> {
        self.store_attrs(inode.ino).await?;
        let info = self.s3.head(inode.key()).await?;
        let meta = info.meta.clone().unwrap_or_default().merged(change);
        let etag = if size == 0 {
            let unchanged = Condition::IfMatch(info.etag.clone());
            let put = self
                .s3
                .put_object_if(inode.key(), PutSource::Plain(&[]), &unchanged, &meta);
            put.await?
        } else if size != info.size && self.can_stage() {
            self.truncate_stored(inode, &info, size, change).await?;
            return self.do_getattr(inode.ino).await;
        } else if size != info.size {
            warn!(key = %inode.key(), size, "an object can only be truncated to 0 (or rewritten with O_TRUNC) on a mount that cannot stage files");
            return Err(Errno::EOPNOTSUPP.into());
        } else {
            let threshold = self.cfg.multipart_copy_threshold;
            let copy = self.s3.copy_object(&info, inode.key(), &meta, threshold);
            copy.await?
        };
        let now = Instant::now();
        let stat = Stat::from(&ObjectInfo {
            key: inode.key().to_string(),
            size,
            etag,
            last_modified: SystemTime::now(),
            meta: Some(meta),
        });
        self.remember(inode, stat.clone(), now);
        if size != info.size {
            inode.forget_opened();
        }
        Ok(self.attr(inode, &stat))
    }
}
