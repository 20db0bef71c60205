//! Daemonizing once the mount is ready, so that `mount -t fuse.s3rdma` returns only then, and
//! returns the daemon's error when mounting failed.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};

/// Tells whoever started us whether the mount came up.
pub struct Readiness {
    /// The pipe to the waiting parent; `None` in the foreground.
    pipe: Option<File>,
    /// Keep stderr open when detaching (the log goes there: the systemd journal).
    pub keep_stderr: bool,
}

impl Readiness {
    pub fn foreground() -> Self {
        Readiness {
            pipe: None,
            keep_stderr: true,
        }
    }

    /// The mount is up: release the parent (exit 0) and detach from its terminal.
    pub fn ready(&mut self) {
        if let Some(mut p) = self.pipe.take() {
            let _ = p.write_all(b"OK\n");
            detach_stdio(self.keep_stderr);
        }
    }

    /// Start-up failed: report `msg` (one line) and exit non-zero.
    pub fn fail(&mut self, msg: &str) -> ! {
        match self.pipe.take() {
            Some(mut p) => {
                let _ = p.write_all(format!("ERR{msg}\n").as_bytes());
            }
            None => eprintln!("s3rdma: error: {msg}"),
        }
        std::process::exit(1)
    }
}

/// Fork. The parent waits for the child's word and exits with it; the child returns. Must be
/// called before any thread is started.
pub fn daemonize() -> std::io::Result<Readiness> {
    let mut fds = [0i32; 2];
    // SAFETY: plain syscalls on a valid array; no threads exist yet.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the fds were just created and are owned here.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: single-threaded at this point, so fork is sound.
    match unsafe { libc::fork() } {
        -1 => Err(std::io::Error::last_os_error()),
        0 => {
            drop(rd);
            // SAFETY: setsid in the child has no preconditions.
            unsafe { libc::setsid() };
            Ok(Readiness {
                pipe: Some(File::from(wr)),
                keep_stderr: false,
            })
        }
        _child => {
            drop(wr);
            let mut msg = String::new();
            let _ = File::from(rd).read_to_string(&mut msg);
            if msg.starts_with("OK") {
                std::process::exit(0);
            }
            match msg.strip_prefix("ERR") {
                Some(err) => eprintln!("s3rdma: error: {}", err.trim_end()),
                None => eprintln!("s3rdma: error: the daemon exited before the mount was ready (run with --foreground to see why)"),
            }
            std::process::exit(1)
        }
    }
}

fn detach_stdio(keep_stderr: bool) {
    // SAFETY: open/dup2 on valid fds; failures leave the fds as they were.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::dup2(null, 1);
            if !keep_stderr {
                libc::dup2(null, 2);
            }
            if null > 2 {
                libc::close(null);
            }
        }
    }
}
