//! `s3rdma warm PATH...`: fill the disk cache with every file under PATH, ahead of training.
//!
//! Reads each file once through the mount (in parallel), skipping files the mount reports as
//! cached already (extended attribute `user.s3rdma.cached`), then waits for the daemon to
//! finish writing them to its cache directory. Progress goes to stderr: a bar on a terminal,
//! a line every 5 s otherwise.

use s3rdma_proto::sync::Lock;
use std::ffi::CString;
use std::io::{IsTerminal, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use s3rdma_proto::xattr::CACHED as CACHED_XATTR;

use crate::cli::WarmArgs;

/// Whether the mount says the file is in its disk cache: Some(true/false), None if the file is
/// not on an s3rdma mount with a disk cache.
pub fn is_cached(path: &Path) -> Option<bool> {
    let p = CString::new(path.as_os_str().as_bytes()).ok()?;
    let name = CString::new(CACHED_XATTR).ok()?;
    let mut buf = [0u8; 8];
    // SAFETY: the buffers outlive the call and their lengths are passed.
    let n = unsafe {
        libc::getxattr(
            p.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return None;
    }
    Some(&buf[..n as usize] == b"1")
}

/// Every regular file under `path`, with its size.
fn walk(path: &Path, out: &mut Vec<(PathBuf, u64)>, errors: &mut Vec<String>) {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_file() => out.push((path.to_path_buf(), m.len())),
        Ok(m) if m.is_dir() => match std::fs::read_dir(path) {
            Ok(rd) => {
                let mut children: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
                children.sort();
                for c in children {
                    walk(&c, out, errors);
                }
            }
            Err(e) => errors.push(format!("{}: {e}", path.display())),
        },
        Ok(_) => {}
        Err(e) => errors.push(format!("{}: {e}", path.display())),
    }
}

fn human(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    }
}

struct Progress {
    total_bytes: u64,
    total_files: usize,
    bytes: AtomicU64,
    files: AtomicUsize,
    start: Instant,
    tty: bool,
}

impl Progress {
    fn line(&self) -> String {
        let bytes = self.bytes.load(Ordering::Relaxed);
        let files = self.files.load(Ordering::Relaxed);
        let frac = if self.total_bytes == 0 {
            1.0
        } else {
            bytes as f64 / self.total_bytes as f64
        };
        let secs = self.start.elapsed().as_secs_f64().max(0.001);
        let width = 30;
        let filled = ((frac * width as f64) as usize).min(width);
        format!(
            "[{}{}] {:3.0}%  {} / {}  {}/{} files  {:.0} MiB/s",
            "#".repeat(filled),
            ".".repeat(width - filled),
            frac * 100.0,
            human(bytes),
            human(self.total_bytes),
            files,
            self.total_files,
            bytes as f64 / secs / (1u64 << 20) as f64
        )
    }

    fn show(&self, last: bool) {
        let mut err = std::io::stderr();
        if self.tty {
            let _ = write!(err, "\r{}{}", self.line(), if last { "\n" } else { "" });
        } else {
            let _ = writeln!(err, "s3rdma warm: {}", self.line());
        }
        let _ = err.flush();
    }
}

/// Read the whole file (the daemon keeps what passes), then tell the kernel to drop the pages.
fn read_through(path: &Path, progress: &Progress) -> std::io::Result<()> {
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        progress.bytes.fetch_add(n as u64, Ordering::Relaxed);
    }
    use std::os::fd::AsRawFd;
    // SAFETY: advice on an fd we own.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    Ok(())
}

/// The `warm` command; returns the exit status.
pub fn run(args: &WarmArgs) -> i32 {
    let (jobs, paths) = (usize::from(args.jobs), args.paths.as_slice());
    if let Err(msg) = check_paths(paths) {
        eprintln!("s3rdma warm: error: {msg}");
        return 1;
    }
    let mut files = Vec::new();
    let mut errors = Vec::new();
    for p in paths {
        walk(p, &mut files, &mut errors);
    }
    let (cached, todo): (Vec<_>, Vec<_>) = files
        .into_iter()
        .partition(|(p, _)| is_cached(p) == Some(true));
    let progress = Arc::new(Progress {
        total_bytes: todo.iter().map(|(_, s)| s).sum(),
        total_files: todo.len(),
        bytes: AtomicU64::new(0),
        files: AtomicUsize::new(0),
        start: Instant::now(),
        tty: std::io::stderr().is_terminal(),
    });
    eprintln!(
        "s3rdma warm: {} files to read ({}), {} already cached",
        todo.len(),
        human(progress.total_bytes),
        cached.len()
    );
    let failures = read_all(&todo, jobs, &progress, errors);
    // The daemon writes to its disk behind the reads: wait for it (bounded).
    let pending = wait_cached(todo.into_iter().map(|(p, _)| p).collect());
    for f in &failures {
        eprintln!("s3rdma warm: error: {f}");
    }
    let not_cached = pending.saturating_sub(failures.len());
    if not_cached > 0 {
        eprintln!(
            "s3rdma warm: {not_cached} files were read but are not in the disk cache (too large for it, the cache is full of files in use, or it turned itself off; see the mount's log)"
        );
    }
    eprintln!(
        "s3rdma warm: done in {:.1} s: {} read, {} files now cached",
        progress.start.elapsed().as_secs_f64(),
        human(progress.bytes.load(Ordering::Relaxed)),
        progress.total_files + cached.len() - pending.min(progress.total_files)
    );
    i32::from(!(failures.is_empty() && not_cached == 0))
}

/// Each path exists and is on an s3rdma mount with a disk cache.
fn check_paths(paths: &[PathBuf]) -> Result<(), String> {
    for p in paths {
        std::fs::symlink_metadata(p).map_err(|e| format!("{}: {e}", p.display()))?;
        if is_cached(p).is_none() {
            return Err(format!(
                "{} is not on an s3rdma mount with a disk cache; mount with --cache-dir DIR",
                p.display()
            ));
        }
    }
    Ok(())
}

/// Read `todo` through the mount with `jobs` threads, showing progress; the failures (after
/// `errors`, those of the walk).
fn read_all(
    todo: &[(PathBuf, u64)],
    jobs: usize,
    progress: &Arc<Progress>,
    errors: Vec<String>,
) -> Vec<String> {
    let queue = Arc::new(Mutex::new(todo.to_vec()));
    let failures = Arc::new(Mutex::new(errors));
    let workers: Vec<_> = (0..jobs.min(todo.len().max(1)))
        .map(|_| {
            let (queue, progress, failures) = (queue.clone(), progress.clone(), failures.clone());
            std::thread::spawn(move || loop {
                let next = queue.locked().pop();
                let Some((path, _)) = next else { break };
                if let Err(e) = read_through(&path, &progress) {
                    failures.locked().push(format!("{}: {e}", path.display()));
                }
                progress.files.fetch_add(1, Ordering::Relaxed);
            })
        })
        .collect();
    let tick = if progress.tty {
        Duration::from_millis(200)
    } else {
        Duration::from_secs(5)
    };
    let mut last = Instant::now();
    while workers.iter().any(|w| !w.is_finished()) {
        std::thread::sleep(Duration::from_millis(50));
        if last.elapsed() >= tick {
            progress.show(false);
            last = Instant::now();
        }
    }
    for w in workers {
        let _ = w.join();
    }
    progress.show(true);
    let failures = failures.locked().clone();
    failures
}

/// Wait (at most 2 minutes) until the mount says each file is in its disk cache; how many
/// are not.
fn wait_cached(mut pending: Vec<PathBuf>) -> usize {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        pending.retain(|p| is_cached(p) != Some(true));
        if pending.is_empty() || Instant::now() >= deadline {
            return pending.len();
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
