//! Every start-up error: one line naming the problem and the fix, a non-zero exit, no mount.

use std::time::Duration;

use crate::common::*;

const LIMIT: Duration = Duration::from_secs(60);

fn run(args: &[&str]) -> (i32, String) {
    let mut cmd = s3rdma();
    cmd.args(args);
    run_to_end(cmd, LIMIT)
}

fn endpoint_args() -> Vec<String> {
    vec![
        "--endpoint-url".into(),
        server().endpoint.clone(),
        "--force-path-style".into(),
    ]
}

fn run_with_endpoint(source: &str, mnt: &std::path::Path, extra: &[&str]) -> (i32, String) {
    let mut cmd = s3rdma();
    cmd.arg(source).arg(mnt).args(endpoint_args()).args(extra);
    run_to_end(cmd, LIMIT)
}

fn assert_one_line_error(code: i32, err: &str, want_code: i32, needle: &str) {
    assert_eq!(code, want_code, "exit code; stderr: {err}");
    assert!(err.contains(needle), "expected {needle:?} in: {err}");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("s3rdma: error:"))
        .collect();
    assert_eq!(lines.len(), 1, "one error line expected: {err}");
}

// [S-START-MOUNTPOINT]
#[test]
fn mountpoint_problems() {
    let base = mountpoint();
    let missing = base.join("missing");
    let (c, e) = run(&["bkt", missing.to_str().unwrap()]);
    assert_one_line_error(c, &e, 1, "does not exist; create it first: mkdir -p");
    let file = base.join("file");
    std::fs::write(&file, b"x").unwrap();
    let (c, e) = run(&["bkt", file.to_str().unwrap()]);
    assert_one_line_error(c, &e, 1, "is not a directory");
    let full = base.join("full");
    std::fs::create_dir(&full).unwrap();
    std::fs::write(full.join("x"), b"x").unwrap();
    let (c, e) = run(&["bkt", full.to_str().unwrap()]);
    assert_one_line_error(c, &e, 1, "is not empty");
}

// [S-START-MOUNTPOINT]
#[test]
fn second_mount_on_the_same_mountpoint_fails() {
    let b = bucket("twice");
    let m = Mount::new(&b, &[]);
    let (c, e) = run_with_endpoint(&b, &m.path, &["--foreground"]);
    assert_one_line_error(c, &e, 1, "is already a mountpoint");
    assert!(is_mounted(&m.path));
}

// [S-START-ARGS]
#[test]
fn malformed_bucket_prefix_and_options() {
    let mnt = mountpoint();
    let p = mnt.to_str().unwrap();
    let (c, e) = run(&["Bad Bucket!", p]);
    assert_one_line_error(c, &e, 2, "bucket name");
    let (c, e) = run(&["ab", p]);
    assert_one_line_error(c, &e, 2, "3-63 characters");
    let (c, e) = run(&["bkt:/abs/prefix", p]);
    assert_one_line_error(c, &e, 2, "starts with '/'");
    let (c, e) = run(&["bkt:a//b", p]);
    assert_one_line_error(c, &e, 2, "empty path segment");
    let (c, e) = run(&["bkt", p, "-o", "ro,colour=blue"]);
    assert_one_line_error(c, &e, 2, "unknown mount option 'colour'");
    let (c, e) = run(&["bkt", p, "-o", "read_part_size=huge"]);
    assert_one_line_error(
        c,
        &e,
        2,
        "invalid value 'huge' for '--read-part-size <SIZE>'",
    );
    let (c, e) = run(&["bkt", p, "--endpoint-url", "localhost:9000"]);
    assert_one_line_error(c, &e, 2, "must start with http://");
    // clap's own errors (unknown flag, missing argument) are one line too, and exit 2.
    let (c, e) = run(&["bkt", p, "--no-such-flag"]);
    assert_one_line_error(c, &e, 2, "unexpected argument '--no-such-flag'");
    let (c, e) = run(&["warm"]);
    assert_one_line_error(c, &e, 2, "<PATH>");
}

// [S-START-ENDPOINT]
#[test]
fn unreachable_endpoint() {
    let mnt = mountpoint();
    // A loopback port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let (c, e) = run(&[
        "bkt",
        mnt.to_str().unwrap(),
        "--endpoint-url",
        &url,
        "--force-path-style",
        "--max-attempts",
        "2",
    ]);
    assert_one_line_error(c, &e, 1, "cannot reach the S3 endpoint");
    assert!(e.contains(&url) && e.contains("--endpoint-url"), "{e}");
}

// [S-START-CREDENTIALS]
#[test]
fn no_credentials() {
    let b = bucket("nocreds");
    let mnt = mountpoint();
    let mut cmd = s3rdma();
    cmd.env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY");
    cmd.arg(&b).arg(&mnt).args(endpoint_args());
    let (c, e) = run_to_end(cmd, LIMIT);
    assert_one_line_error(c, &e, 1, "no AWS credentials found");
    assert!(
        e.contains("AWS_ACCESS_KEY_ID") && e.contains("--profile"),
        "{e}"
    );
}

// [S-START-CREDENTIALS]
#[test]
fn rejected_credentials() {
    let b = bucket("badcreds");
    let mnt = mountpoint();
    let mut cmd = s3rdma();
    cmd.env("AWS_SECRET_ACCESS_KEY", "wrong-secret");
    cmd.arg(&b).arg(&mnt).args(endpoint_args());
    let (c, e) = run_to_end(cmd, LIMIT);
    assert_one_line_error(c, &e, 1, "rejected the credentials");
}

// [S-START-ACCESS]
#[test]
fn access_denied() {
    let b = bucket("denied");
    let mnt = mountpoint();
    let mut cmd = s3rdma();
    cmd.env("AWS_ACCESS_KEY_ID", LIMITED_ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", LIMITED_SECRET_KEY);
    cmd.arg(&b).arg(&mnt).args(endpoint_args());
    let (c, e) = run_to_end(cmd, LIMIT);
    assert_one_line_error(c, &e, 1, "access denied");
    assert!(e.contains("s3:ListBucket"), "{e}");
}

// [S-START-BUCKET]
#[test]
fn bucket_not_found() {
    let mnt = mountpoint();
    let (c, e) = run_with_endpoint("no-such-bucket-here", &mnt, &[]);
    assert_one_line_error(c, &e, 1, "bucket \"no-such-bucket-here\" does not exist");
    assert!(!is_mounted(&mnt));
}

// [S-START-DAEMON]
#[test]
fn daemon_returns_once_mounted_and_reports_errors() {
    let b = bucket("daemon");
    put(&b, "hello.txt", b"hello".to_vec());
    let mnt = mountpoint();
    // Without --foreground: exit 0 only once the mount is up.
    let (c, e) = run_with_endpoint(&b, &mnt, &[]);
    assert_eq!(c, 0, "{e}");
    assert!(is_mounted(&mnt));
    assert_eq!(std::fs::read(mnt.join("hello.txt")).unwrap(), b"hello");
    // Unmounting ends the daemon.
    unmount(&mnt);
    // A failure inside the daemon comes back to the caller's stderr and exit code.
    let (c, e) = run_with_endpoint("no-such-bucket-daemon", &mnt, &[]);
    assert_one_line_error(c, &e, 1, "does not exist");
}

// [S-START-HELP]
#[test]
fn help_and_version() {
    let out = s3rdma().arg("--version").output().unwrap();
    assert!(out.status.success());
    let version = String::from_utf8_lossy(&out.stdout);
    assert!(
        version.contains("cuObject provider: loopback")
            || version.contains("cuObject provider: nvidia"),
        "{version}"
    );
    assert!(
        version.contains("RDMA device:") && version.contains("max registration: 4294901760"),
        "{version}"
    );
    let out = s3rdma().arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--endpoint-url",
        "--region",
        "--profile",
        "--force-path-style",
        "--read-only",
        "--allow-other",
        "--allow-root",
        "--auto-unmount",
        "--uid",
        "--gid",
        "--file-mode",
        "--dir-mode",
        "--foreground",
        "--prefix",
        "--log-level",
        "--log-file",
        "--metadata-ttl",
        "--max-threads",
        "-o <OPT",
        "stats",
        "warm",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}");
    }
    for (sub, flag) in [("stats", "--watch"), ("warm", "--jobs")] {
        let out = s3rdma().args([sub, "--help"]).output().unwrap();
        assert!(out.status.success(), "{sub} --help");
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains(flag), "{sub} --help lacks {flag}: {help}");
    }
}

// [S-STOP-SIGNAL]
#[test]
fn sigterm_and_sigint_unmount_and_exit_zero() {
    let b = bucket("signal");
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let mnt = mountpoint();
        let mut child = s3rdma()
            .arg(&b)
            .arg(&mnt)
            .args(endpoint_args())
            .arg("--foreground")
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !is_mounted(&mnt) {
            assert!(std::time::Instant::now() < deadline, "not mounted");
            assert!(child.try_wait().unwrap().is_none(), "exited early");
            std::thread::sleep(Duration::from_millis(50));
        }
        // SAFETY: signalling our own child by PID.
        unsafe { libc::kill(child.id() as i32, sig) };
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("daemon did not exit after signal {sig}");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "signal {sig}: {status}");
        assert!(!is_mounted(&mnt));
    }
}

/// `s3rdma ARGS` without CAP_IPC_LOCK (root ignores RLIMIT_MEMLOCK otherwise) and with a
/// memlock limit of 1 MiB.
fn with_small_memlock(args: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new("setpriv");
    cmd.env_clear();
    for (k, v) in s3rdma().get_envs() {
        if let Some(v) = v {
            cmd.env(k, v);
        }
    }
    cmd.args([
        "--bounding-set",
        "-ipc_lock",
        "prlimit",
        "--memlock=1048576:1048576",
        bin(),
    ])
    .args(args)
    .args(endpoint_args());
    cmd
}

// [S-START-MEMORY]
/// A cache that cannot be pinned (RLIMIT_MEMLOCK below it): with --rdma required, a one-line
/// error naming the limit and the fix; with --rdma auto, a warning, and the mount works over
/// HTTP from unpinned memory. A cache larger than the machine's memory is refused up front.
#[test]
fn cache_above_memlock_or_ram() {
    let b = bucket("memlock");
    let data = pattern(3 << 20, 31);
    put(&b, "f", data.clone());
    let mnt = mountpoint();
    let p = mnt.to_str().unwrap();

    let cmd = with_small_memlock(&[&b, p, "--rdma", "required", "--cache-size", "32MiB"]);
    let (c, e) = run_to_end(cmd, LIMIT);
    assert_one_line_error(c, &e, 1, "RLIMIT_MEMLOCK");
    assert!(e.contains("ulimit -l") && e.contains("--cache-size"), "{e}");
    assert!(!is_mounted(&mnt));

    let log = work_dir().join(format!("memlock-{}.log", std::process::id()));
    let log_arg = log.to_str().unwrap();
    let args = [
        &b,
        p,
        "--rdma",
        "auto",
        "--cache-size",
        "32MiB",
        "--log-file",
        log_arg,
    ];
    let (c, e) = run_to_end(with_small_memlock(&args), LIMIT);
    // Unmounted however the checks below end (the daemon goes with its mount).
    struct Unmount<'a>(&'a std::path::Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            if is_mounted(self.0) {
                let _ = std::process::Command::new("umount").arg(self.0).status();
            }
        }
    }
    let _guard = Unmount(&mnt);
    assert_eq!(c, 0, "{e}");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    assert!(text.contains("cannot mlock"), "no warning: {text}");
    assert!(is_mounted(&mnt));
    let got = std::fs::read(mnt.join("f"));
    let (uc, ue) = run_to_end(
        {
            let mut u = std::process::Command::new("umount");
            u.arg(&mnt);
            u
        },
        LIMIT,
    );
    assert!(got.expect("read from an unpinned cache") == data);
    assert_eq!(uc, 0, "{ue}");

    let (c, e) = run(&[&b, p, "--cache-size", "100TiB"]);
    assert_one_line_error(c, &e, 2, "exceed this machine's memory");
}
