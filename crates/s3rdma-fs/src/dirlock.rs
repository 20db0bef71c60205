//! One mount per local directory (the disk cache's, the staging area's): an exclusive `flock`
//! on `DIR/lock`, held for the life of the returned file.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

use crate::setup::SetupError;

/// Lock `dir`, the directory given by `--{flag}` (`cache-dir`, `staging-dir`); `shown` is the
/// directory the user named, for the message.
pub fn lock(dir: &Path, flag: &'static str, shown: &Path) -> Result<File, SetupError> {
    let path = dir.join("lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|source| SetupError::Dir {
            flag,
            path: path.clone(),
            source,
        })?;
    // SAFETY: flock on an fd we own, for the life of the File.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(SetupError::InUse {
            flag,
            path: shown.to_path_buf(),
        });
    }
    Ok(f)
}
