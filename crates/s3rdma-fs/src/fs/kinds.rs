//! What a listing may tell the kernel about an entry's type. [S-NS-TYPE]
//!
//! ListObjectsV2 gives a key's size and ETag but not its stored mode, and a symbolic link is an
//! object whose mode says `S_IFLNK` (s3fs's layout; see `symlink`). The kernel keeps the type
//! of every entry it is handed (READDIRPLUS fills its entry and attribute caches, READDIR's
//! `d_type` steers `find` and `os.walk`), and an inode cannot change type afterwards: so no
//! entry is handed out before its type is known. An object that cannot be a link (empty, or
//! longer than the longest link target) is a file; so is one whose stored attributes this
//! mount already knows for this version, and every object with `--no-file-metadata`. Any
//! other (1 to 4,095 bytes, attributes not known) is asked about with HeadObject just before
//! the kernel reads that far into the directory: the next [`TELL_AHEAD`] entries' at once
//! ([`HEADS_AT_ONCE`] in flight), so the questions go while the reader takes the entries
//! before them, and each answer is fresh for the metadata TTL when it is handed out. The
//! answer also gives the stored mode, owner and mtime, so `ls -l` and rsync's quick check see
//! them on a fresh mount too.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::inode::{Inode, Stat};
use super::{names, parallel, DirOut, FsResult, S3Fs, Told};
use s3rdma_client::{ObjectStore, S3ErrorKind};

/// HeadObject requests one directory keeps in flight.
pub const HEADS_AT_ONCE: usize = 32;

/// Entries whose type is told at once, from where the kernel reads (a READDIRPLUS reply holds
/// about 25 of a 4 KiB page).
pub const TELL_AHEAD: usize = 256;

/// Linux's longest symbolic link target: a larger object is never a link.
pub const MAX_LINK_TARGET: u64 = 4095;

/// Whether an object of `size` bytes may be a symbolic link.
pub fn may_be_link(size: u64) -> bool {
    (1..=MAX_LINK_TARGET).contains(&size)
}

impl<S: ObjectStore> S3Fs<S> {
    /// Tell the types of the entries of `dir` from `from` to `from + ahead` not known yet: one
    /// HeadObject each, all at once. An object deleted meanwhile is no entry.
    pub(super) async fn tell_kinds(
        &self,
        dir: &Inode,
        out: &mut DirOut,
        from: usize,
        ahead: usize,
    ) -> FsResult<()> {
        let end = from.saturating_add(ahead).min(out.entries.len());
        let todo: Vec<(usize, String)> = (from.min(end)..end)
            .filter(|&i| matches!(out.entries[i].told, Told::Unknown))
            .map(|i| (i, names::child_key(dir.key(), &out.entries[i].name)))
            .collect();
        if todo.is_empty() {
            return Ok(());
        }
        self.counters
            .listing_heads
            .fetch_add(todo.len() as u64, Ordering::Relaxed);
        let s3 = self.s3.clone();
        let answers = parallel::map_bounded(todo, HEADS_AT_ONCE, move |(i, key)| {
            let s3 = s3.clone();
            async move {
                let r = s3.head(&key).await;
                (i, r, Instant::now())
            }
        })
        .await;
        for (i, answer, at) in answers {
            let e = &mut out.entries[i];
            match answer {
                Ok(info) => {
                    let stat = Stat::from(&info);
                    let child = self.asked_file(dir, &e.name, &stat, at);
                    let stat = self.local_stat(child.ino).unwrap_or(stat);
                    e.told = Told::Ready(self.attr(&child, &stat), Some(child));
                    e.at = at;
                }
                Err(err) if err.kind == S3ErrorKind::NotFound => e.told = Told::Gone,
                Err(err) => return Err(err.into()),
            }
        }
        Ok(())
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
