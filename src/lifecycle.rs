//! How a mount ends.
//!
//! - `umount`/`fusermount3 -u` by a user: the kernel refuses while files are open (EBUSY), so
//!   every file was closed — and stored at that close — before the session ends.
//! - SIGTERM/SIGINT: files open for writing get a grace period (`--shutdown-grace`) to be
//!   closed and stored; no new file can be opened for writing meanwhile. The mount is
//!   unmounted as soon as nothing holds it. When the grace period ends (or at a second signal)
//!   the files still being written are aborted (nothing stored, multipart uploads aborted,
//!   their writers get EIO), the mount is detached and the FUSE connection ended.
//! - The connection aborted by the kernel (`/sys/fs/fuse/connections/N/abort`) or a lazy
//!   unmount: the session ends; files still being written are aborted in `destroy`.
//!
//! At the end the daemon drops its caches and write buffers, so every cuObject registration
//! and token is released, and logs what is left (zero).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::signal::unix::Signal;
use tracing::{error, info, warn};

use s3rdma_client::S3Client;
use s3rdma_fs::fs::control::FsControl;

/// What the signal handler needs to end the mount.
pub struct Shutdown {
    pub mountpoint: PathBuf,
    /// The mount's device number (`major:minor`, from mountinfo), to tell it from another
    /// mount later placed on the same path.
    pub dev: Option<String>,
    pub grace: Duration,
    pub control: FsControl<S3Client>,
}

/// How long the end of a shutdown (aborts, the session's last requests, releasing memory)
/// may take after the grace period before the process exits regardless.
const FINISH_LIMIT: Duration = Duration::from_secs(60);

/// Wait for SIGTERM or SIGINT, then end the mount as described in the module docs.
pub async fn on_signals(mut term: Signal, mut int: Signal, sd: Shutdown) {
    let name = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    sd.control.begin_shutdown();
    watchdog(sd.grace.saturating_add(FINISH_LIMIT), "shutdown");
    let (writing, keys) = sd.control.open_writes();
    info!(
        signal = name,
        mountpoint = %sd.mountpoint.display(),
        grace_s = sd.grace.as_secs_f64(),
        files_being_written = writing,
        keys = ?keys,
        "unmounting: files being written get the grace period to be closed; no new files can be written"
    );
    let deadline = Instant::now() + sd.grace;
    let mut second_signal = false;
    loop {
        if try_unmount(&sd, false) {
            return;
        }
        if Instant::now() >= deadline {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = term.recv() => { second_signal = true; }
            _ = int.recv() => { second_signal = true; }
        }
        if second_signal {
            warn!("second signal: ending the grace period now");
            break;
        }
    }
    let why = if second_signal {
        format!("the mount was stopped by a second {name} while the file was open for writing")
    } else {
        format!(
            "the file was still open for writing {:.0} s after {name} (--shutdown-grace)",
            sd.grace.as_secs_f64()
        )
    };
    let aborted = sd.control.abort_writes(&why).await;
    if !aborted.is_empty() {
        error!(
            count = aborted.len(),
            keys = ?aborted,
            "files still open for writing were not stored: their uploads were aborted"
        );
    }
    // Writers that just got EIO close their files: give them a moment.
    for _ in 0..10 {
        if try_unmount(&sd, false) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    warn!(
        mountpoint = %sd.mountpoint.display(),
        "the mount is still in use: detaching it; processes with files open on it get ENOTCONN"
    );
    if is_mounted(&sd.mountpoint, sd.dev.as_deref()) {
        if let Err(e) = unmount(&sd.mountpoint, true) {
            error!(error = %e, "cannot detach the mount; unmount it with fusermount3 -uz");
        }
    }
    // Ending the connection ends the session, which then finishes normally.
    if sd.dev.as_deref().is_some_and(abort_connection) {
        return;
    }
    error!("cannot end the FUSE connection (fusectl is not mounted, or not root): exiting with files still open");
    std::process::exit(1);
}

/// Unmount unless something holds the mount; true when it is gone (or was detached before).
fn try_unmount(sd: &Shutdown, lazy: bool) -> bool {
    if !is_mounted(&sd.mountpoint, sd.dev.as_deref()) {
        // Unmounted by someone else, or detached: the session ends when its files close.
        return false;
    }
    match unmount(&sd.mountpoint, lazy) {
        Ok(()) => true,
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => false,
        Err(e) => {
            warn!(error = %e, mountpoint = %sd.mountpoint.display(), "unmount failed");
            false
        }
    }
}

/// Unmount `mountpoint` (`lazy`: detach it even while in use). Root calls umount2; others go
/// through the setuid fusermount3, as FUSE allows.
pub fn unmount(mountpoint: &Path, lazy: bool) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: a valid C string; umount2 has no other preconditions.
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EPERM) {
        return Err(e);
    }
    let mut cmd = std::process::Command::new("fusermount3");
    cmd.arg(if lazy { "-uz" } else { "-u" })
        .arg("--")
        .arg(mountpoint);
    let out = cmd.output()?;
    if out.status.success() {
        return Ok(());
    }
    let msg = String::from_utf8_lossy(&out.stderr);
    if msg.contains("busy") {
        Err(std::io::Error::from_raw_os_error(libc::EBUSY))
    } else {
        Err(std::io::Error::other(format!(
            "fusermount3: {}",
            msg.trim()
        )))
    }
}

/// Tell the kernel to end the FUSE connection of the mount with device `dev`, through fusectl
/// (root, `/sys/fs/fuse/connections` mounted). False when that is not possible.
fn abort_connection(dev: &str) -> bool {
    let Some((_, minor)) = dev.split_once(':') else {
        return false;
    };
    let path = format!("/sys/fs/fuse/connections/{minor}/abort");
    match std::fs::write(&path, "1") {
        Ok(()) => {
            info!(path, "FUSE connection ended");
            true
        }
        Err(e) => {
            tracing::debug!(path, error = %e, "cannot end the FUSE connection");
            false
        }
    }
}

/// Undo mountinfo's octal escapes (`\040` for a space, ...).
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        if let (b'\\', Some(d)) = (b[i], octal) {
            let v = d.iter().fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
            out.push(v as u8);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The device number (`major:minor`) of the last mount at `mountpoint`, from mountinfo.
pub fn mount_dev(mountpoint: &Path) -> Option<String> {
    let want = mountpoint.to_string_lossy();
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines()
        .rfind(|l| l.split(' ').nth(4).map(unescape).as_deref() == Some(want.as_ref()))
        .and_then(|l| l.split(' ').nth(2).map(str::to_string))
}

/// Whether our mount (device `dev`) is still at `mountpoint`.
pub fn is_mounted(mountpoint: &Path, dev: Option<&str>) -> bool {
    match (mount_dev(mountpoint), dev) {
        (Some(found), Some(ours)) => found == ours,
        (found, None) => found.is_some(),
        (None, _) => false,
    }
}

/// Exit with an error if the process has not exited `after` from now.
pub fn watchdog(after: Duration, what: &'static str) {
    let spawned = std::thread::Builder::new()
        .name("s3rdma-watchdog".into())
        .spawn(move || {
            std::thread::sleep(after);
            error!(
                what,
                seconds = after.as_secs(),
                "did not finish in time; exiting"
            );
            std::process::exit(1);
        });
    if let Err(e) = spawned {
        warn!(error = %e, "cannot start the shutdown watchdog");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape("/mnt/a\\040b"), "/mnt/a b");
        assert_eq!(unescape("/mnt/x\\011y\\134z"), "/mnt/x\ty\\z");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape("/end\\04"), "/end\\04");
    }
}
