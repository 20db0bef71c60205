//! Why a part of a mount could not be set up (the page cache, the write buffers, the disk
//! cache, the staging area): one typed error for the constructors, whose `Display` is the one
//! line the user reads — the problem and the fix.

use std::fmt;
use std::path::PathBuf;

/// A part of the mount could not be set up.
#[derive(Debug)]
pub enum SetupError {
    /// Its size leaves no room for one block, or overflows the address space.
    Size {
        what: &'static str,
        fix: &'static str,
    },
    /// Its memory could not be mapped.
    Map {
        what: &'static str,
        source: cuobj_ffi::Error,
    },
    /// Its thread could not be started.
    Thread {
        what: &'static str,
        source: std::io::Error,
    },
    /// RDMA was required and the memory could not be pinned.
    Unpinned { what: &'static str, bytes: usize },
    /// RDMA was required and the memory could not be registered with cuObject.
    Unregistered { what: &'static str },
    /// A local directory (`--{flag}`) cannot be created or opened.
    Dir {
        flag: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// Another mount uses the local directory (`--{flag}`).
    InUse { flag: &'static str, path: PathBuf },
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetupError::Size { what, fix } => {
                write!(f, "the {what} has no room for one block or overflows; {fix}")
            }
            SetupError::Map { what, source } => write!(
                f,
                "cannot map the {what}: {source}; lower its size or free memory"
            ),
            SetupError::Unpinned { what, bytes } => write!(
                f,
                "cannot pin the {bytes}-byte {what} (mlock failed: RLIMIT_MEMLOCK too low?) and rdma=required; raise the limit (ulimit -l, LimitMEMLOCK= in systemd) or lower its size"
            ),
            SetupError::Thread { what, source } => write!(
                f,
                "cannot start the {what} thread: {source}; raise the process or thread limit (ulimit -u)"
            ),
            SetupError::Unregistered { what } => write!(
                f,
                "cannot register the {what} with cuObject and rdma=required; check the RDMA device (s3rdma logs the library's error above) or mount with rdma=auto"
            ),
            SetupError::Dir { flag, path, source } => write!(
                f,
                "cannot use {}: {source}; give a writable --{flag}",
                path.display()
            ),
            SetupError::InUse { flag, path } => write!(
                f,
                "{} is in use by another s3rdma mount; give each mount its own --{flag}",
                path.display()
            ),
        }
    }
}

impl SetupError {
    /// The same error, of the part named `what` (memory set up for it by a lower layer).
    pub fn named(self, what: &'static str) -> Self {
        match self {
            SetupError::Size { fix, .. } => SetupError::Size { what, fix },
            SetupError::Map { source, .. } => SetupError::Map { what, source },
            SetupError::Unpinned { bytes, .. } => SetupError::Unpinned { what, bytes },
            SetupError::Unregistered { .. } => SetupError::Unregistered { what },
            other => other,
        }
    }
}

impl std::error::Error for SetupError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SetupError::Map { source, .. } => Some(source),
            SetupError::Thread { source, .. } | SetupError::Dir { source, .. } => Some(source),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_is_one_line_naming_the_fix() {
        let io = || std::io::Error::from_raw_os_error(libc::EACCES);
        let all = [
            SetupError::Size {
                what: "page cache",
                fix: "raise --cache-size",
            },
            SetupError::Map {
                what: "page cache",
                source: cuobj_ffi::Error("mmap failed".into()),
            },
            SetupError::Thread {
                what: "disk cache writer",
                source: io(),
            },
            SetupError::Unpinned {
                what: "page cache",
                bytes: 1 << 30,
            },
            SetupError::Dir {
                flag: "staging-dir",
                path: "/x".into(),
                source: io(),
            },
            SetupError::InUse {
                flag: "cache-dir",
                path: "/x".into(),
            },
            SetupError::Unregistered { what: "page cache" },
        ];
        for e in all {
            let line = e.to_string();
            assert!(!line.contains('\n'), "{line}");
            // The problem, then what to do.
            let fix = line.split_once("; ").map(|(_, fix)| fix);
            assert!(fix.is_some_and(|f| f.len() > 10), "{line}");
        }
    }
}
