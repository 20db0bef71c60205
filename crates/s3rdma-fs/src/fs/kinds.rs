//! What a listing may tell the kernel about an entry's type. [S-NS-TYPE]
//!
//! ListObjectsV2 gives a key's size and ETag but not its stored mode, and a symbolic link is an
//! object whose mode says `S_IFLNK` (s3fs's layout; see `symlink`). The kernel keeps the type
//! of every entry it is handed (READDIRPLUS fills its entry and attribute caches, READDIR's
//! `d_type` steers `find` and `os.walk`), and an inode cannot change type afterwards: so no
//! entry is handed out before its type is known. An object that cannot be a link (empty, or
//! longer than the longest link target) is a file; so is one whose stored attributes this
//! mount already knows for this version. Any other (1 to 4,095 bytes, attributes not known)
//! is asked for with HeadObject before the listing is answered, all of a directory's at once
//! ([`HEADS_AT_ONCE`] in flight): its answer also gives the stored mode, owner and mtime, so
//! `ls -l` and rsync's quick check see them on a fresh mount too.

use std::collections::HashMap;

use tracing::debug;

use super::dir::Listed;
use super::inode::{Inode, Stat};
use super::{names, parallel, FsResult, S3Fs};
use s3rdma_client::{ObjectInfo, ObjectStore, S3Error, S3ErrorKind};

/// HeadObject requests one listing keeps in flight.
pub const HEADS_AT_ONCE: usize = 32;

/// Linux's longest symbolic link target: a larger object is never a link.
pub const MAX_LINK_TARGET: u64 = 4095;

/// Whether an object of `size` bytes may be a symbolic link.
pub fn may_be_link(size: u64) -> bool {
    (1..=MAX_LINK_TARGET).contains(&size)
}

/// What HeadObject told of the listed names whose type was not known.
#[derive(Default)]
pub(super) struct Learnt {
    pub found: HashMap<String, ObjectInfo>,
    /// Listed, but gone by the time they were asked about: not entries.
    pub gone: Vec<String>,
}

impl<S: ObjectStore> S3Fs<S> {
    /// The listing's files whose type is not known yet, asked for all at once.
    pub(super) fn learn_kinds(
        &self,
        dir: &Inode,
        entries: &[(String, Listed)],
    ) -> FsResult<Learnt> {
        if !self.cfg.file_metadata {
            return Ok(Learnt::default());
        }
        let unknown: Vec<String> = entries
            .iter()
            .filter_map(|(name, listed)| match listed {
                Listed::File(info) if may_be_link(info.size) => {
                    let child = self.inodes.child(dir.ino, name);
                    let stat = Stat {
                        size: info.size,
                        mtime: info.last_modified,
                        etag: info.etag.to_string(),
                        meta: None,
                    }
                    .inherit(child.and_then(|c| c.last_stat()).as_ref());
                    stat.meta
                        .is_none()
                        .then(|| names::child_key(dir.key(), name))
                }
                _ => None,
            })
            .collect();
        if unknown.is_empty() {
            return Ok(Learnt::default());
        }
        debug!(dir = %dir.key(), count = unknown.len(), "asking the type of listed objects");
        self.counters
            .listing_heads
            .fetch_add(unknown.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let s3 = self.s3.clone();
        let answers: Vec<(String, Result<ObjectInfo, S3Error>)> =
            self.rt
                .block_on(parallel::map_bounded(unknown, HEADS_AT_ONCE, move |key| {
                    let s3 = s3.clone();
                    async move {
                        let r = s3.head(&key).await;
                        (key, r)
                    }
                }));
        let mut learnt = Learnt::default();
        for (key, answer) in answers {
            let name = key[dir.key().len()..].to_string();
            match answer {
                Ok(info) => {
                    learnt.found.insert(name, info);
                }
                Err(e) if e.kind == S3ErrorKind::NotFound => learnt.gone.push(name),
                Err(e) => return Err(self.fail("readdir", &e)),
            }
        }
        Ok(learnt)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_objects_the_size_of_a_link_target_may_be_links() {
        assert!(!super::may_be_link(0));
        assert!(super::may_be_link(1));
        assert!(super::may_be_link(4095));
        assert!(!super::may_be_link(4096));
    }
}
