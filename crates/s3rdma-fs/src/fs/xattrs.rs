//! User extended attributes (`user.*`) of files, stored with the object in s3fs's layout (see
//! `s3rdma_client::xattr`) so that either tool reads the other's. [S-ATTR-XATTR]
//!
//! A change is a change of the file's stored attributes like `chmod`: it goes with the upload
//! of a file being written or staged, else with the attribute write-back copy (one copy for the
//! changes of a moment, see `attrs`). S3 holds at most 2 KiB of user metadata per object (mode,
//! owner and times included): a change that would pass it fails with `ENOSPC` (`E2BIG` for one
//! value larger than the whole limit), logged once with the key. Other namespaces
//! (`security.`, `trusted.`, `system.`) are not supported (`ENOTSUP`); the mount's own
//! `user.s3rdma.*` attributes are read-only and not listed. Directories and links have none.

use fuser::Errno;
use tracing::warn;

use super::inode::{Inode, Kind, Stat};
use super::namespace::SetAttr;
use super::{FsResult, S3Fs};
use s3rdma_client::xattr::{self, Xattrs};
use s3rdma_client::{FileMeta, ObjectStore};

/// S3's limit on an object's user metadata (names and values).
pub const MAX_USER_METADATA: usize = 2048;

/// `setxattr` flags (`<sys/xattr.h>`).
const XATTR_CREATE: i32 = 1;
const XATTR_REPLACE: i32 = 2;

/// The prefix of the mount's own read-only attributes.
const OWN_PREFIX: &str = "user.s3rdma.";

/// Whether `name` is one this mount stores (`user.*`, not its own), else the errno to give.
fn stored_name(name: &str) -> FsResult<()> {
    if name.starts_with(OWN_PREFIX) {
        return Err(Errno::EPERM.into());
    }
    if !name.starts_with("user.") {
        return Err(Errno::EOPNOTSUPP.into());
    }
    if !xattr::storable_name(name) {
        warn!(
            name,
            "an extended attribute's name cannot hold '\"' or ',' in S3 (s3fs's layout)"
        );
        return Err(Errno::EINVAL.into());
    }
    Ok(())
}

impl<S: ObjectStore> S3Fs<S> {
    /// The file's stored attributes as they stand (pending changes included): what this
    /// mount wrote or learnt within the metadata TTL, else what HeadObject answers.
    async fn meta_now(&self, inode: &Inode) -> FsResult<FileMeta> {
        let stat = match self.local_stat(inode.ino) {
            Some(s) => s,
            None => Stat::from(&self.known_version(inode).await?),
        };
        let stat = self.ns.attrs.overlay(inode, &stat).unwrap_or(stat);
        Ok(stat.meta.unwrap_or_default())
    }

    /// The file's user attributes as they stand; none for directories and links.
    async fn xattrs_of(&self, ino: u64) -> FsResult<Xattrs> {
        let inode = self.ns.inodes.get(ino).ok_or(Errno::ENOENT)?;
        if inode.kind != Kind::File {
            return Ok(Xattrs::new());
        }
        Ok(self.meta_now(&inode).await?.xattrs.unwrap_or_default())
    }

    /// `getxattr` of a stored attribute.
    pub(super) async fn do_getxattr(&self, ino: u64, name: &str) -> FsResult<Vec<u8>> {
        if !name.starts_with("user.") {
            return Err(Errno::EOPNOTSUPP.into());
        }
        self.xattrs_of(ino)
            .await?
            .remove(name)
            .ok_or(Errno::ENODATA.into())
    }

    /// `listxattr`: the names, each ended by a NUL.
    pub(super) async fn do_listxattr(&self, ino: u64) -> FsResult<Vec<u8>> {
        let mut out = Vec::new();
        for name in self.xattrs_of(ino).await?.keys() {
            out.extend_from_slice(name.as_bytes());
            out.push(0);
        }
        Ok(out)
    }

    /// `setxattr`, honouring `XATTR_CREATE` and `XATTR_REPLACE`.
    pub(super) async fn do_setxattr(
        &self,
        ino: u64,
        name: &str,
        value: &[u8],
        flags: i32,
    ) -> FsResult<()> {
        self.change_xattrs(ino, name, |attrs| {
            let exists = attrs.contains_key(name);
            if flags & XATTR_CREATE != 0 && exists {
                return Err(Errno::EEXIST.into());
            }
            if flags & XATTR_REPLACE != 0 && !exists {
                return Err(Errno::ENODATA.into());
            }
            if value.len() > MAX_USER_METADATA {
                return Err(Errno::E2BIG.into());
            }
            attrs.insert(name.to_string(), value.to_vec());
            Ok(())
        })
        .await
    }

    /// `removexattr`.
    pub(super) async fn do_removexattr(&self, ino: u64, name: &str) -> FsResult<()> {
        self.change_xattrs(ino, name, |attrs| {
            attrs.remove(name).map(|_| ()).ok_or(Errno::ENODATA.into())
        })
        .await
    }

    /// Change the user attributes of file `ino` by `edit` and store them with the file (its
    /// upload, or the attribute write-back), if S3 can hold them with the rest (`ENOSPC`).
    /// One change at a time: each rewrites the file's whole set.
    async fn change_xattrs(
        &self,
        ino: u64,
        name: &str,
        edit: impl FnOnce(&mut Xattrs) -> FsResult<()>,
    ) -> FsResult<()> {
        stored_name(name)?;
        if self.cfg.read_only {
            return Err(Errno::EROFS.into());
        }
        let inode = self.ns.inodes.get(ino).ok_or(Errno::ENOENT)?;
        if inode.kind != Kind::File {
            warn!(key = %inode.key(), "extended attributes are stored with files only, not on directories or links");
            return Err(Errno::EOPNOTSUPP.into());
        }
        let _one = self.ns.made.xattr_change.lock().await;
        let current = self.meta_now(&inode).await?;
        let mut attrs = current.xattrs.clone().unwrap_or_default();
        edit(&mut attrs).inspect_err(|e| {
            if *e == Errno::E2BIG {
                warn!(key = %inode.key(), name, limit = MAX_USER_METADATA, "an extended attribute's value is larger than S3's user metadata of an object can be");
            }
        })?;
        let change = FileMeta {
            xattrs: Some(attrs),
            ..Default::default()
        };
        let len = current.merged(&change).stored_len();
        if len > MAX_USER_METADATA {
            warn!(key = %inode.key(), bytes = len, limit = MAX_USER_METADATA, "extended attributes do not fit in S3's user metadata of the object; remove some first");
            return Err(Errno::ENOSPC.into());
        }
        let set = SetAttr {
            xattrs: change.xattrs,
            ..Default::default()
        };
        self.do_setattr(ino, set).await.map(|_| ())
    }
}
