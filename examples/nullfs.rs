//! A do-nothing FUSE file system, served from memory: what any FUSE client could reach on this
//! kernel and CPU (the FUSE ceiling of the benchmarks).
//!
//! - `zero`: SIZE_BYTES of zeros to read;
//! - `sink`: a file that accepts (and discards) writes, also through `cp`'s O_TRUNC;
//! - `many/`: ENTRIES files of 1 KiB (`f00000`, ...), for `ls -l` and first-byte latency.
//!
//!   nullfs MOUNTPOINT SIZE_BYTES [ENTRIES]      (unmount to stop)

// Tests and benchmark tools may keep a table of steps in one function.
#![allow(clippy::too_many_lines)]

use std::ffi::OsStr;
use std::time::{Duration, SystemTime};

use fuser::{
    BsdFileFlags, Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo,
    LockOwner, OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

struct NullFs {
    size: u64,
    entries: u64,
    zeros: Vec<u8>,
}

const ZERO: u64 = 2;
const SINK: u64 = 3;
const MANY: u64 = 4;
/// Files of `many/` are inodes FIRST, FIRST + 1, ...
const FIRST: u64 = 100;
const SMALL: u64 = 1024;
const TTL: Duration = Duration::from_secs(3600);

impl NullFs {
    fn attr_of(&self, ino: u64) -> Option<FileAttr> {
        Some(match ino {
            1 | MANY => attr(ino, 0, true),
            ZERO => attr(ino, self.size, false),
            SINK => attr(ino, 0, false),
            i if (FIRST..FIRST + self.entries).contains(&i) => attr(i, SMALL, false),
            _ => return None,
        })
    }

    fn size_of(&self, ino: u64) -> u64 {
        match ino {
            ZERO => self.size,
            i if i >= FIRST => SMALL,
            _ => 0,
        }
    }
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
        let name = name.to_str().unwrap_or("");
        let ino = match (parent.0, name) {
            (1, "zero") => Some(ZERO),
            (1, "sink") => Some(SINK),
            (1, "many") => Some(MANY),
            (MANY, n) => n
                .strip_prefix('f')
                .and_then(|i| i.parse::<u64>().ok())
                .filter(|i| *i < self.entries)
                .map(|i| FIRST + i),
            _ => None,
        };
        match ino.and_then(|i| self.attr_of(i)) {
            Some(a) => reply.entry(&TTL, &a, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }
    fn getattr(&self, _r: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr_of(ino.0) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }
    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &self,
        _r: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        match self.attr_of(ino.0) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }
    fn open(&self, _r: &Request, _ino: INodeNo, _f: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE);
    }
    fn read(
        &self,
        _r: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _f: OpenFlags,
        _l: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let end = self.size_of(ino.0).min(offset + size as u64);
        let n = end.saturating_sub(offset) as usize;
        reply.data(&self.zeros[..n.min(self.zeros.len())]);
    }
    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        _r: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        data: &[u8],
        _wf: WriteFlags,
        _f: OpenFlags,
        _l: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        reply.written(data.len() as u32);
    }
    fn flush(&self, _r: &Request, _i: INodeNo, _fh: FileHandle, _l: LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }
    /// Every new file is the sink.
    fn create(
        &self,
        _r: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        reply.created(
            &TTL,
            &attr(SINK, 0, false),
            Generation(0),
            FileHandle(0),
            FopenFlags::empty(),
        );
    }
    fn unlink(&self, _r: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.ok();
    }
    fn readdir(
        &self,
        _r: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino.0 == MANY {
            for i in offset..self.entries {
                if reply.add(
                    INodeNo(FIRST + i),
                    i + 1,
                    FileType::RegularFile,
                    format!("f{i:05}"),
                ) {
                    break;
                }
            }
        } else {
            let top = [(ZERO, "zero"), (SINK, "sink"), (MANY, "many")];
            for (k, (i, name)) in top.iter().enumerate().skip(offset as usize) {
                let kind = if *i == MANY {
                    FileType::Directory
                } else {
                    FileType::RegularFile
                };
                if reply.add(INodeNo(*i), k as u64 + 1, kind, name) {
                    break;
                }
            }
        }
        reply.ok();
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(mnt), Some(size)) = (args.get(1), args.get(2).and_then(|s| s.parse().ok())) else {
        eprintln!("usage: nullfs MOUNTPOINT SIZE_BYTES [ENTRIES]");
        std::process::exit(2)
    };
    let entries = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(0);
    let mut config = fuser::Config::default();
    config.mount_options = vec![fuser::MountOption::FSName("nullfs".into())];
    config.n_threads = Some(4);
    let fs = NullFs {
        size,
        entries,
        zeros: vec![0u8; 16 << 20],
    };
    if let Err(e) = fuser::mount(fs, mnt, &config) {
        eprintln!("nullfs: {e}");
        std::process::exit(1);
    }
}
