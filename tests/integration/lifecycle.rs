//! How a mount ends: SIGTERM with files being written (stored whole within the grace period,
//! else aborted — never partial, no multipart upload left), the kernel aborting the FUSE
//! connection, `umount` and `umount -l` by a user, RDMA resources released at exit, and the
//! log going to the journal when daemonized under systemd.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;

/// Wait until `cond` holds, at most `limit`.
fn wait_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn size_of(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// A writer that appends 1 MiB every `pace` until `total` or the first error, then closes.
/// Returns the bytes written so far (shared) and the outcome: Ok, or the errno of the failed
/// write or close.
fn slow_writer(
    path: PathBuf,
    total: usize,
    pace: Duration,
) -> (Arc<AtomicU64>, std::thread::JoinHandle<Result<(), i32>>) {
    let written = Arc::new(AtomicU64::new(0));
    let w = written.clone();
    let h = std::thread::spawn(move || {
        let chunk = pattern(1 << 20, 5);
        let mut f = std::fs::File::create(&path).map_err(|e| e.raw_os_error().unwrap_or(-1))?;
        let mut result = Ok(());
        for _ in 0..total >> 20 {
            if let Err(e) = f.write_all(&chunk) {
                result = Err(e.raw_os_error().unwrap_or(-1));
                break;
            }
            w.fetch_add(chunk.len() as u64, Ordering::SeqCst);
            std::thread::sleep(pace);
        }
        let closed = close_file(f);
        result?;
        closed.map_err(|e| e.raw_os_error().unwrap_or(-1))
    });
    (written, h)
}

fn sha(data: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(data).to_vec()
}

/// [S-LIFE-SIGTERM] SIGTERM while `dd` writes 512 MiB: the writer gets the grace period, the
/// file is stored whole at its close, new files are refused meanwhile, and the daemon exits 0.
#[test]
fn sigterm_lets_a_file_being_written_finish_within_the_grace_period() {
    let b = bucket("life-finish");
    let data = pattern(512 << 20, 77);
    let src = work_dir().join(format!("life-src-{}", std::process::id()));
    std::fs::write(&src, &data).unwrap();
    let mut m = Mount::new(&b, &["--shutdown-grace", "60s"]);
    let target = m.join("big");
    let mut dd = Command::new("dd")
        .arg(format!("if={}", src.display()))
        .arg(format!("of={}", target.display()))
        .args(["bs=1M", "status=none"])
        .spawn()
        .expect("dd");
    wait_until(Duration::from_secs(60), "64 MiB written", || {
        size_of(&target) >= 64 << 20
    });
    m.signal(libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(300));
    if dd.try_wait().unwrap().is_none() {
        // Still writing: the mount is up, and refuses new files.
        let e = std::fs::File::create(m.join("late")).expect_err("created a file after SIGTERM");
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    }
    let status = dd.wait().unwrap();
    assert!(status.success(), "dd failed after SIGTERM: {status}");
    let exit = m
        .wait_exit(Duration::from_secs(60))
        .expect("daemon did not exit");
    let log = m.log_text();
    assert!(exit.success(), "daemon exited {exit}: {}", tail(&log, 3000));
    assert!(!is_mounted(&m.path));
    let stored = backend_get(&b, "big").expect("big was not stored");
    assert_eq!(stored.len(), data.len());
    assert!(sha(&stored) == sha(&data), "stored bytes differ");
    assert_eq!(open_uploads(&b), 0);
    assert!(backend_get(&b, "late").is_none());
    assert!(
        log.contains("files_being_written=1"),
        "{}",
        tail(&log, 3000)
    );
    let _ = std::fs::remove_file(&src);
}

/// [S-LIFE-SIGTERM] A file still being written when the grace period ends is aborted: its
/// writer gets EIO, nothing is stored, no multipart upload is left, the daemon exits 1 and
/// names the key.
#[test]
fn sigterm_aborts_a_file_still_written_after_the_grace_period() {
    let b = bucket("life-abort");
    let mut m = Mount::new(&b, &["--shutdown-grace", "2s", "--write-part-size", "5MiB"]);
    let (written, writer) = slow_writer(m.join("slow"), 512 << 20, Duration::from_millis(40));
    wait_until(Duration::from_secs(30), "20 MiB written", || {
        written.load(Ordering::SeqCst) >= 20 << 20
    });
    assert!(open_uploads(&b) >= 1, "no multipart upload was started");
    let signalled = Instant::now();
    m.signal(libc::SIGTERM);
    let outcome = writer.join().unwrap();
    assert_eq!(
        outcome,
        Err(libc::EIO),
        "the writer was not stopped with EIO"
    );
    let exit = m
        .wait_exit(Duration::from_secs(30))
        .expect("daemon did not exit");
    let took = signalled.elapsed();
    let log = m.log_text();
    assert_eq!(exit.code(), Some(1), "{}", tail(&log, 3000));
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(25),
        "shutdown took {took:?}"
    );
    assert!(written.load(Ordering::SeqCst) < 512 << 20);
    assert!(
        backend_get(&b, "slow").is_none(),
        "a partial object was stored"
    );
    assert_eq!(open_uploads(&b), 0, "a multipart upload was left");
    assert!(
        log.contains("uploads were aborted") && log.contains("\"slow\""),
        "{}",
        tail(&log, 3000)
    );
    assert!(!is_mounted(&m.path));
}

/// A second signal ends the grace period at once.
#[test]
fn a_second_sigterm_ends_the_grace_period() {
    let b = bucket("life-twice");
    let mut m = Mount::new(
        &b,
        &["--shutdown-grace", "10min", "--write-part-size", "5MiB"],
    );
    let (written, writer) = slow_writer(m.join("slow"), 512 << 20, Duration::from_millis(40));
    wait_until(Duration::from_secs(30), "12 MiB written", || {
        written.load(Ordering::SeqCst) >= 12 << 20
    });
    m.signal(libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(500));
    m.signal(libc::SIGINT);
    assert_eq!(writer.join().unwrap(), Err(libc::EIO));
    let exit = m
        .wait_exit(Duration::from_secs(30))
        .expect("daemon did not exit");
    assert_eq!(exit.code(), Some(1));
    assert!(backend_get(&b, "slow").is_none());
    assert_eq!(open_uploads(&b), 0);
}

/// The FUSE connection number of the mount at `path` (its device minor).
fn connection_of(path: &Path) -> String {
    let want = path.to_string_lossy().to_string();
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(want.as_str()))
        .expect("mount in mountinfo");
    let dev = line.split(' ').nth(2).unwrap();
    dev.split_once(':').unwrap().1.to_string()
}

/// [S-LIFE-ABORT] The kernel ending the connection (fusectl `abort`) while a file is being
/// written and another is open for reading: the daemon does not hang — it aborts the upload,
/// detaches the dead mount and exits.
#[test]
fn an_aborted_fuse_connection_ends_the_daemon_cleanly() {
    let ctl = Path::new("/sys/fs/fuse/connections");
    let mut mounted_ctl = false;
    if std::fs::read_dir(ctl).map(|d| d.count()).unwrap_or(0) == 0 {
        let ok = Command::new("mount")
            .args(["-t", "fusectl", "fusectl"])
            .arg(ctl)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("skipped: cannot mount fusectl (needs root)");
            return;
        }
        mounted_ctl = true;
    }
    let b = bucket("life-kabort");
    put(&b, "r", pattern(4 << 20, 3));
    let mut m = Mount::new(&b, &["--write-part-size", "5MiB"]);
    let reader = std::fs::File::open(m.join("r")).unwrap();
    let (written, writer) = slow_writer(m.join("w"), 512 << 20, Duration::from_millis(40));
    wait_until(Duration::from_secs(30), "12 MiB written", || {
        written.load(Ordering::SeqCst) >= 12 << 20
    });
    let conn = connection_of(&m.path);
    let abort = ctl.join(&conn).join("abort");
    assert!(abort.exists(), "no fusectl entry {}", abort.display());
    std::fs::write(&abort, "1").unwrap();
    let outcome = writer.join().unwrap();
    assert!(outcome.is_err(), "the writer kept writing");
    let exit = m.wait_exit(Duration::from_secs(30));
    let log = m.log_text();
    let exit = exit.unwrap_or_else(|| panic!("daemon hung: {}", tail(&log, 3000)));
    assert_eq!(exit.code(), Some(1), "{}", tail(&log, 3000));
    drop(reader);
    assert!(!is_mounted(&m.path), "the dead mount was left behind");
    assert!(backend_get(&b, "w").is_none());
    assert_eq!(open_uploads(&b), 0, "a multipart upload was left");
    assert!(
        log.contains("released every RDMA registration and token registrations=0 tokens=0"),
        "{}",
        tail(&log, 3000)
    );
    if mounted_ctl {
        let _ = Command::new("umount").arg(ctl).status();
    }
}

/// [S-LIFE-UMOUNT] `umount` is refused while a file is open and ends the daemon (exit 0) once
/// it is closed; after `umount -l` a file being written is still stored at its close.
#[test]
fn umount_waits_for_open_files_and_lazy_umount_still_stores_them() {
    let b = bucket("life-umount");
    put(&b, "r", pattern(1 << 20, 4));
    let mut m = Mount::new(&b, &["--write-part-size", "5MiB"]);
    let reader = std::fs::File::open(m.join("r")).unwrap();
    let busy = Command::new("umount").arg(&m.path).output().unwrap();
    assert!(!busy.status.success(), "umount succeeded with a file open");
    assert!(is_mounted(&m.path));
    drop(reader);
    unmount(&m.path);
    let exit = m
        .wait_exit(Duration::from_secs(20))
        .expect("daemon did not exit");
    assert!(exit.success(), "{}", tail(&m.log_text(), 3000));

    let mut m = Mount::new(&b, &["--write-part-size", "5MiB"]);
    let data = pattern(15 << 20, 6);
    let mut f = std::fs::File::create(m.join("lazy")).unwrap();
    f.write_all(&data[..12 << 20]).unwrap();
    let st = Command::new("umount")
        .arg("-l")
        .arg(&m.path)
        .status()
        .unwrap();
    assert!(st.success());
    assert!(!is_mounted(&m.path));
    f.write_all(&data[12 << 20..]).unwrap();
    close_file(f).expect("close after umount -l failed");
    let exit = m
        .wait_exit(Duration::from_secs(20))
        .expect("daemon did not exit");
    assert!(exit.success(), "{}", tail(&m.log_text(), 3000));
    assert!(backend_get(&b, "lazy").expect("not stored") == data);
    assert_eq!(open_uploads(&b), 0);
}

/// [S-LIFE-RELEASE] Over loopback RDMA: `s3rdma stats` shows the registrations (page cache and
/// write buffers) and no token or request left once idle; at exit every registration and token
/// is released.
#[test]
fn rdma_registrations_and_tokens_are_released_at_exit() {
    let ep = RdmaEndpoint::start();
    let b = bucket("life-rdma");
    let data = pattern(6 << 20, 8);
    put(&b, "r", data.clone());
    let m = Mount::new_at(
        &ep.url,
        &b,
        &[
            "--rdma",
            "required",
            "--cache-size",
            "256MiB",
            "--write-buffer-size",
            "64MiB",
        ],
    );
    // [S-MEM-RDMA-SLABS] Registered (and pinned) memory follows use: the cache's first 64 MiB
    // slab at start, no write buffers until the first write.
    let slab = 64u64 << 20;
    let text = mount_stats(&m.path);
    assert_eq!(stat_value(&text, "cache_pinned_bytes"), slab, "{text}");
    assert_eq!(stat_value(&text, "write_pinned_bytes"), 0, "{text}");
    assert_eq!(stat_value(&text, "rdma_registered_bytes"), slab, "{text}");
    assert!(std::fs::read(m.join("r")).unwrap() == data);
    std::fs::write(m.join("w"), &data).unwrap();
    let text = mount_stats(&m.path);
    assert_eq!(stat_value(&text, "write_pinned_bytes"), 64 << 20, "{text}");
    assert_eq!(
        stat_value(&text, "rdma_registered_bytes"),
        stat_value(&text, "cache_pinned_bytes") + (64 << 20),
        "{text}"
    );
    assert!(stat_value(&text, "rdma_registrations") >= 2, "{text}");
    assert!(
        stat_value(&text, "rdma_registered_bytes") >= 128 << 20,
        "{text}"
    );
    assert_eq!(stat_value(&text, "rdma_tokens_live"), 0, "{text}");
    // The getxattr that asks is not an S3 request.
    assert_eq!(stat_value(&text, "requests_in_flight"), 0, "{text}");
    assert!(
        stat_value(&text, "rdma_bytes_read") >= data.len() as u64,
        "{text}"
    );
    let log = m.stop();
    let line = log
        .lines()
        .find(|l| l.contains("released every RDMA registration and token"))
        .unwrap_or_else(|| panic!("no release line: {}", tail(&log, 3000)));
    assert!(
        line.contains("registrations=0") && line.contains("tokens=0"),
        "{line}"
    );
    assert!(backend_get(&b, "w").unwrap() == data);
}

/// [S-LOG-JOURNAL] Daemonized with stderr on the journal (`JOURNAL_STREAM`), the log keeps
/// going to stderr, each line with its syslog priority; a failed operation names its key.
#[test]
fn a_daemon_logs_to_the_journal_stream_with_priorities() {
    let b = bucket("life-journal");
    let path = mountpoint();
    let err = path.with_extension("journal");
    let f = std::fs::File::create(&err).unwrap();
    let meta = f.metadata().unwrap();
    let out = s3rdma()
        .arg(&b)
        .arg(&path)
        .args([
            "--endpoint-url",
            &server().endpoint,
            "--force-path-style",
            "--cache-size",
            "64MiB",
            "--log-level",
            "info",
        ])
        .env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(f)
        .status()
        .unwrap();
    assert!(
        out.success(),
        "mount failed: {}",
        std::fs::read_to_string(&err).unwrap_or_default()
    );
    assert!(is_mounted(&path));
    // A refused operation: reading a file while it is being written.
    let mut w = std::fs::File::create(path.join("x")).unwrap();
    std::io::Write::write_all(&mut w, b"1").unwrap();
    let e = std::fs::File::open(path.join("x")).expect_err("open while written");
    assert_eq!(e.raw_os_error(), Some(libc::EBUSY));
    drop(w);
    let st = Command::new("umount").arg(&path).status().unwrap();
    assert!(st.success());
    wait_until(Duration::from_secs(20), "the daemon's last line", || {
        std::fs::read_to_string(&err)
            .unwrap_or_default()
            .contains("released every RDMA")
    });
    let text = std::fs::read_to_string(&err).unwrap();
    let mounted = text
        .lines()
        .find(|l| l.contains(" mounted bucket="))
        .unwrap_or_else(|| panic!("no mounted line:\n{text}"));
    assert!(mounted.starts_with("<6>"), "{mounted}");
    let refused = text
        .lines()
        .find(|l| l.contains("file is being written in this mount"))
        .unwrap_or_else(|| panic!("no line for the refused open:\n{text}"));
    assert!(
        refused.starts_with("<4>") && refused.contains("key=x"),
        "{refused}"
    );
    // journald adds its own timestamps.
    let dated = |l: &str| {
        let b = l.as_bytes();
        b.len() > 14 && b[3..7].iter().all(u8::is_ascii_digit) && b[7] == b'-' && b[13] == b'T'
    };
    assert!(!text.lines().any(dated), "{text}");
    let _ = std::fs::remove_dir(&path);
}
