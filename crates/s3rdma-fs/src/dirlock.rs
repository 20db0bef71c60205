//! One mount per local directory (the disk cache's, the staging area's): an exclusive `flock`
//! on `DIR/lock`, held for the life of the returned file.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

/// Lock `dir`, the `what` directory (`cache`, `staging`) given by `--{what}-dir`; `shown` is
/// the directory the user named, for the message.
pub fn lock(dir: &Path, what: &str, shown: &Path) -> Result<File, String> {
    let path = dir.join("lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| {
            format!(
                "cannot open {}: {e}; give a writable --{what}-dir",
                path.display()
            )
        })?;
    // SAFETY: flock on an fd we own, for the life of the File.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(format!(
            "the {what} directory {} is in use by another s3rdma mount; give each mount its own --{what}-dir",
            shown.display()
        ));
    }
    Ok(f)
}
