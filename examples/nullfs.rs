//! A do-nothing FUSE file system: one file of SIZE zero bytes served from memory. Reading it
//! measures the FUSE ceiling of this kernel and CPU (what any FUSE client could reach).
//!
//!   nullfs MOUNTPOINT SIZE_BYTES      (unmount to stop)

use std::ffi::OsStr;
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags,
    ReplyAttr, ReplyData, ReplyDirectory, ReplyEntry, ReplyOpen, Request,
};

struct NullFs {
    size: u64,
    zeros: Vec<u8>,
}

fn attr(ino: u64, size: u64, dir: bool) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size.div_ceil(512),
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind: if dir {
            FileType::Directory
        } else {
            FileType::RegularFile
        },
        perm: if dir { 0o755 } else { 0o644 },
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

impl fuser::Filesystem for NullFs {
    fn lookup(&self, _r: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent.0 == 1 && name == "zero" {
            reply.entry(
                &Duration::from_secs(3600),
                &attr(2, self.size, false),
                Generation(0),
            );
        } else {
            reply.error(Errno::ENOENT);
        }
    }
    fn getattr(&self, _r: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        reply.attr(
            &Duration::from_secs(3600),
            &attr(ino.0, if ino.0 == 1 { 0 } else { self.size }, ino.0 == 1),
        );
    }
    fn open(&self, _r: &Request, _ino: INodeNo, _f: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE);
    }
    fn read(
        &self,
        _r: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _f: OpenFlags,
        _l: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let end = self.size.min(offset + size as u64);
        let n = end.saturating_sub(offset) as usize;
        reply.data(&self.zeros[..n.min(self.zeros.len())]);
    }
    fn readdir(
        &self,
        _r: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if offset == 0 {
            let _ = reply.add(INodeNo(2), 1, FileType::RegularFile, "zero");
        }
        reply.ok();
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(mnt), Some(size)) = (args.get(1), args.get(2).and_then(|s| s.parse().ok())) else {
        eprintln!("usage: nullfs MOUNTPOINT SIZE_BYTES");
        std::process::exit(2)
    };
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::RO,
        fuser::MountOption::FSName("nullfs".into()),
    ];
    config.n_threads = Some(4);
    let fs = NullFs {
        size,
        zeros: vec![0u8; 16 << 20],
    };
    if let Err(e) = fuser::mount(fs, mnt, &config) {
        eprintln!("nullfs: {e}");
        std::process::exit(1);
    }
}
