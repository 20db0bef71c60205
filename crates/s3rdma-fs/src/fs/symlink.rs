//! Symbolic links, stored as s3fs stores them so that a bucket written by either reads right
//! in the other: an object whose body is the target and whose `x-amz-meta-mode` carries
//! `S_IFLNK`. A listing does not carry that mode, so a link not yet looked up in this mount is
//! listed as a regular file; the first lookup (one HeadObject, as for any file whose stored
//! attributes are not known yet) tells it, and every link made here is known at once.
//! Hard links are refused (`EPERM`): an object has one name.

use std::ffi::OsStr;
use std::time::{Instant, SystemTime};

use fuser::{Errno, FileAttr};
use tracing::{debug, info, warn};

use super::inode::{Kind, Stat};
use super::{names, Error, FsResult, S3Fs};
use s3rdma_client::{Condition, FileMeta, ObjectInfo, ObjectStore, PutSource, S3Error};

/// Linux's longest symbolic link target.
const MAX_TARGET: usize = 4095;

impl<S: ObjectStore> S3Fs<S> {
    /// `symlink(target, parent/name)`: one PutObject (`If-None-Match: *`).
    pub(super) async fn do_symlink(
        &self,
        parent: u64,
        name: &OsStr,
        target: &std::path::Path,
        owner: (u32, u32),
    ) -> FsResult<FileAttr> {
        let _ns = self.ns_change();
        if self.cfg.read_only {
            return Err(Errno::EROFS.into());
        }
        let (p, name) = self.dir_and_name(parent, name)?;
        let target = target.as_os_str().as_encoded_bytes();
        if target.is_empty() || target.len() > MAX_TARGET {
            return Err(Errno::ENAMETOOLONG.into());
        }
        let key = names::child_key(p.key(), name);
        let (uid, gid) = owner;
        let meta = FileMeta::symlink(
            (uid != self.cfg.uid).then_some(uid),
            (gid != self.cfg.gid).then_some(gid),
        );
        let etag = self
            .s3
            .put_object_if(
                &key,
                PutSource::Plain(target),
                &Condition::IfNoneMatch,
                &meta,
            )
            .await
            .map_err(|e| match e.kind {
                s3rdma_client::S3ErrorKind::PreconditionFailed => Errno::EEXIST.into(),
                _ => Error::from(e),
            })?;
        if let Some(neg) = &self.ns.known.negative {
            neg.invalidate(&key);
        }
        let child = self
            .ns
            .inodes
            .upsert_child(parent, name, Kind::Symlink, key.clone());
        let stat = Stat::from(&ObjectInfo {
            key,
            size: target.len() as u64,
            etag,
            last_modified: SystemTime::now(),
            meta: Some(meta),
        });
        let now = Instant::now();
        self.remember(&child, stat.clone(), now);
        debug!(key = %child.key(), "symlink made");
        Ok(self.entry(&child, &stat))
    }

    /// `readlink`: the object's body (one GET, pinned to the version last seen).
    pub(super) async fn do_readlink(&self, ino: u64) -> FsResult<Vec<u8>> {
        let inode = self.ns.inodes.get(ino).ok_or(Errno::ENOENT)?;
        if inode.kind != Kind::Symlink {
            return Err(Errno::EINVAL.into());
        }
        let stat = match inode.last_stat() {
            Some(s) => s,
            None => Stat::from(&self.s3.head(inode.key()).await?),
        };
        if stat.size as usize > MAX_TARGET {
            warn!(key = %inode.key(), size = stat.size, "a symbolic link's object is larger than a link target can be");
            return Err(Errno::EIO.into());
        }
        let mut buf = vec![0u8; stat.size as usize];
        self.s3
            .get_range_into(inode.key(), &stat.etag, 0, &mut buf)
            .await
            .map_err(S3Error::pinned_gone)?;
        Ok(buf)
    }

    /// `link`: refused, an object has one name.
    pub(super) async fn do_link(&self, ino: u64) -> FsResult<FileAttr> {
        let key = self
            .ns
            .inodes
            .get(ino)
            .map(|i| i.key().to_string())
            .unwrap_or_default();
        info!(key, "hard links are not supported (an S3 object has one name); use a symbolic link or a copy");
        Err(Errno::EPERM.into())
    }
}
