//! The `nvidia` build against NVIDIA's real cuObject library, on a host without GPU or RDMA NIC
//! (CI: `scripts/nvidia-test.sh` builds with `--features nvidia` and
//! `CUOBJ_HOME=../shared/cuobject-sdk` and runs these). With the loopback provider they return
//! at once: the default build's own tests cover it.
//!
//! The binary runs with a cleared environment (no `LD_LIBRARY_PATH`): it finds the library and
//! the library its own `libcufile.so.0` through the binary's RPATH.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;

fn version() -> String {
    let out = s3rdma().arg("--version").output().expect("run s3rdma");
    assert!(
        out.status.success(),
        "s3rdma --version failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether this build links NVIDIA's library (else the test has nothing to check).
fn nvidia() -> bool {
    let v = version();
    if !v.contains("cuObject provider: nvidia") {
        eprintln!("loopback build: the nvidia tests run in scripts/nvidia-test.sh");
        return false;
    }
    true
}

fn no_device() -> bool {
    !std::path::Path::new("/sys/class/infiniband").exists()
}

/// `s3rdma` with the test-only hook that skips the device check (the real library then spins).
fn assuming_a_device() -> Command {
    let mut cmd = s3rdma();
    cmd.env("S3RDMA_TEST_ASSUME_RDMA_DEVICE", "1");
    cmd
}

/// Start `cmd` on bucket `b` with `args`: it must exit non-zero within `limit`, mount nothing
/// and say why in one error line, which is returned.
fn refused(mut cmd: Command, b: &str, args: &[&str], limit: Duration) -> String {
    let mnt = mountpoint();
    cmd.arg(b)
        .arg(&mnt)
        .args(["--endpoint-url", &server().endpoint, "--force-path-style"])
        .args(args);
    let started = Instant::now();
    let (code, err) = run_to_end(cmd, Duration::from_secs(30));
    assert!(started.elapsed() < limit, "took {:?}", started.elapsed());
    assert_ne!(code, 0, "{err}");
    assert!(!is_mounted(&mnt));
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("s3rdma: error:"))
        .collect();
    assert_eq!(lines.len(), 1, "{err}");
    lines[0].to_string()
}

// [S-RDMA-NOHANG]
#[test]
fn the_nvidia_binary_starts_and_names_the_library_it_loaded() {
    if !nvidia() {
        return;
    }
    let started = Instant::now();
    let v = version();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "--version took {:?}",
        started.elapsed()
    );
    assert!(v.contains("cuObject library: libcuobjclient 1."), "{v}");
    assert!(v.contains("max registration: 4294901760 bytes"), "{v}");
    if no_device() {
        assert!(v.contains("RDMA device: none: no RDMA device"), "{v}");
    }
}

// [S-RDMA-NOHANG]
#[test]
fn without_a_device_auto_mounts_over_http_and_required_refuses_in_one_line() {
    if !nvidia() || !no_device() {
        return;
    }
    let b = bucket("nv-auto");
    let started = Instant::now();
    let m = Mount::new(&b, &["--rdma", "auto"]);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "mounting took {:?}",
        started.elapsed()
    );
    let data = pattern(3 << 20, 3);
    std::fs::write(m.join("f"), &data).unwrap();
    assert!(std::fs::read(m.join("f")).unwrap() == data);
    assert!(backend_get(&b, "f").unwrap() == data);
    let log = m.log_text();
    assert!(
        log.contains("RDMA off for this mount") && log.contains("no RDMA device"),
        "the log must say why RDMA is off: {}",
        tail(&log, 2000)
    );
    let log = m.stop();
    assert_eq!(unmount_counter(&log, "tokens"), 0);
    assert!(unmount_counter(&log, "http_bytes_written") >= 3 << 20);

    let line = refused(
        s3rdma(),
        &b,
        &["--rdma", "required"],
        Duration::from_secs(10),
    );
    assert!(
        line.contains("rdma=required cannot be honoured") && line.contains("no RDMA device"),
        "{line}"
    );
}

// [S-RDMA-NOHANG]
#[test]
fn a_construction_that_does_not_return_is_abandoned_at_the_deadline() {
    if !nvidia() || !no_device() {
        return;
    }
    let b = bucket("nv-deadline");
    // auto: the mount comes up over HTTP once the deadline has passed.
    let started = Instant::now();
    let m = Mount::new_under(
        &["env", "S3RDMA_TEST_ASSUME_RDMA_DEVICE=1"],
        &server().endpoint,
        &b,
        &["--rdma", "auto", "--rdma-init-timeout", "2s"],
    );
    let took = started.elapsed();
    assert!(took < Duration::from_secs(15), "mounting took {took:?}");
    std::fs::write(m.join("f"), b"over http").unwrap();
    assert_eq!(std::fs::read(m.join("f")).unwrap(), b"over http");
    let log = m.log_text();
    // NVIDIA's library spins when constructed with no device: the deadline is what ends it.
    assert!(
        log.contains("RDMA off for this mount") && log.contains("did not return within 2s"),
        "{}",
        tail(&log, 2000)
    );
    drop(m);
    // required: refused, in bounded time.
    let line = refused(
        assuming_a_device(),
        &b,
        &["--rdma", "required", "--rdma-init-timeout", "2s"],
        Duration::from_secs(15),
    );
    assert!(
        line.contains("rdma=required cannot be honoured")
            && line.contains("did not return within 2s"),
        "{line}"
    );
}
