//! The system's mount: `mount -t fuse.s3rdma` through mount.fuse3, an fstab line, and their
//! errors. mount.fuse3 finds `s3rdma` on the system PATH only, so the test links
//! /usr/local/bin/s3rdma to the binary under test for its duration (and skips if another
//! s3rdma is installed there).

use s3rdma_proto::sync::Lock;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;

const INSTALLED: &str = "/usr/local/bin/s3rdma";

/// The link to the binary under test, removed on drop. Tests holding one run one at a time.
struct Linked(#[allow(dead_code)] std::sync::MutexGuard<'static, ()>);

static LINK_USERS: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Linked {
    fn new() -> Option<Linked> {
        let guard = LINK_USERS.locked();
        let target = Path::new(INSTALLED);
        match std::fs::read_link(target) {
            Ok(p) if p == Path::new(bin()) => return Some(Linked(guard)),
            Ok(_) | Err(_) if target.exists() => return None,
            _ => {}
        }
        std::fs::create_dir_all("/usr/local/bin").ok()?;
        std::os::unix::fs::symlink(bin(), target).ok()?;
        Some(Linked(guard))
    }
}

impl Drop for Linked {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(INSTALLED);
    }
}

/// Unmounts (lazily, if need be) on drop.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        if is_mounted(&self.0) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

fn mount_cmd() -> Command {
    let mut c = Command::new("mount");
    c.env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_EC2_METADATA_DISABLED", "true");
    c
}

/// `mount -t fuse.s3rdma BUCKET MOUNTPOINT -o OPTS`: (succeeded, stderr).
fn mount_t(bucket: &str, mnt: &Path, opts: &str) -> (bool, String) {
    let out = mount_cmd()
        .args(["-t", "fuse.s3rdma", bucket])
        .arg(mnt)
        .args(["-o", opts])
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

// [S-MOUNT-T]
#[test]
fn mount_t_fuse_s3rdma_and_an_fstab_line_work_and_fail_with_the_message() {
    let Some(_link) = Linked::new() else {
        eprintln!("skipped: {INSTALLED} is another installation of s3rdma");
        return;
    };
    let b = bucket("mount-t");
    put(&b, "hello.txt", b"hello from mount -t".to_vec());
    let mnt = mountpoint();
    let _guard = Mounted(mnt.clone());
    let opts = format!(
        "endpoint_url={},force_path_style,rw,nodev,nosuid,_netdev,cache_size=64M,write_buffer_size=32M",
        server().endpoint
    );
    let (ok, err) = mount_t(&b, &mnt, &opts);
    assert!(ok, "mount -t: {err}");
    assert!(is_mounted(&mnt));
    assert_eq!(
        std::fs::read(mnt.join("hello.txt")).unwrap(),
        b"hello from mount -t"
    );
    std::fs::write(mnt.join("written.txt"), b"w").unwrap();
    assert_eq!(backend_get(&b, "written.txt").unwrap(), b"w");
    // A second mount on the same mountpoint fails clearly.
    let (ok, err) = mount_t(&b, &mnt, &opts);
    assert!(!ok);
    assert!(err.contains("already a mountpoint"), "{err}");
    unmount(&mnt);

    // An fstab line (an alternate fstab file, mount -T).
    let fstab = work_dir().join(format!("fstab-{}", std::process::id()));
    std::fs::write(
        &fstab,
        format!(
            "{b} {} fuse.s3rdma {opts},nofail,x-systemd.automount 0 0\n",
            mnt.display()
        ),
    )
    .unwrap();
    let out = mount_cmd()
        .arg("-T")
        .arg(&fstab)
        .arg(&mnt)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mount -T: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read(mnt.join("hello.txt")).unwrap(),
        b"hello from mount -t"
    );
    unmount(&mnt);
    let _ = std::fs::remove_file(&fstab);

    // Errors: mount exits non-zero with the daemon's message.
    for (extra, want) in [
        ("colour=blue", "unknown mount option 'colour'"),
        (
            "endpoint_url=http://127.0.0.1:1",
            "cannot reach the S3 endpoint",
        ),
    ] {
        let (ok, err) = mount_t(&b, &mnt, &format!("{opts},{extra}"));
        assert!(!ok, "{extra}: mount succeeded");
        assert!(err.contains(want), "{extra}: {err}");
        assert!(!is_mounted(&mnt));
    }
}

/// The example unit's or fstab line's fields with the test's bucket, mountpoint and endpoint
/// (and a small cache) put in.
fn localise(text: &str, bucket: &str, mnt: &Path) -> String {
    let opts_extra = ",cache_size=64M,write_buffer_size=32M";
    text.replace("my-bucket", bucket)
        .replace("/mnt/ckpt", &mnt.to_string_lossy())
        .replace("http://10.0.0.5:8333", &server().endpoint)
        .replace(
            "shutdown_grace=30s",
            &format!("shutdown_grace=30s{opts_extra}"),
        )
}

// [S-MOUNT-T]
#[test]
fn the_example_systemd_unit_and_fstab_line_mount_as_systemd_runs_them() {
    let Some(_link) = Linked::new() else {
        eprintln!("skipped: {INSTALLED} is another installation of s3rdma");
        return;
    };
    let b = bucket("unit");
    put(&b, "ckpt/in.txt", b"in".to_vec());
    let mnt = mountpoint();
    let _guard = Mounted(mnt.clone());
    let unit = std::fs::read_to_string(repo_root().join("scripts/systemd/mnt-ckpt.mount")).unwrap();
    let unit = localise(&unit, &b, &mnt);
    let field = |name: &str| -> String {
        unit.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name}= in the unit"))
            .to_string()
    };
    assert_eq!(field("Where"), mnt.to_string_lossy());
    // What systemd runs to start a mount unit (credentials from its EnvironmentFile).
    let out = mount_cmd()
        .arg(field("What"))
        .arg(field("Where"))
        .args(["-t", &field("Type"), "-o", &field("Options")])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mount: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(mnt.join("in.txt")).unwrap(), b"in");
    std::fs::write(mnt.join("out.txt"), b"out").unwrap();
    assert_eq!(backend_get(&b, "ckpt/out.txt").unwrap(), b"out");
    // ... and to stop it.
    unmount(&mnt);

    let fstab_text =
        std::fs::read_to_string(repo_root().join("scripts/systemd/fstab.example")).unwrap();
    let fstab = work_dir().join(format!("fstab-example-{}", std::process::id()));
    std::fs::write(&fstab, localise(&fstab_text, &b, &mnt)).unwrap();
    let out = mount_cmd()
        .arg("-T")
        .arg(&fstab)
        .arg(&mnt)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mount -T: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(mnt.join("out.txt")).unwrap(), b"out");
    unmount(&mnt);
    let _ = std::fs::remove_file(&fstab);
}

/// scripts/install.sh puts the binaries and the examples under a prefix and removes them.
#[test]
fn install_sh_installs_and_uninstalls() {
    let prefix = work_dir().join(format!("prefix-{}", std::process::id()));
    let bin_dir = Path::new(bin()).parent().unwrap();
    let out = Command::new(repo_root().join("scripts/install.sh"))
        .current_dir(repo_root())
        .arg("--prefix")
        .arg(&prefix)
        .arg("--bin-dir")
        .arg(bin_dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "install.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let installed = [
        "bin/s3rdma",
        "bin/s3rdma-endpoint",
        "share/doc/s3rdma/examples/mnt-ckpt.mount",
        "share/doc/s3rdma/examples/fstab.example",
        "share/doc/s3rdma/examples/s3rdma-dashboard.json",
        "share/doc/s3rdma/examples/prometheus-scrape.yml",
    ];
    for f in installed {
        assert!(prefix.join(f).is_file(), "{f} not installed");
    }
    let v = Command::new(prefix.join("bin/s3rdma"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(v.status.success());
    let out = Command::new(repo_root().join("scripts/install.sh"))
        .current_dir(repo_root())
        .arg("--uninstall")
        .arg("--prefix")
        .arg(&prefix)
        .output()
        .unwrap();
    assert!(out.status.success());
    for f in installed {
        assert!(!prefix.join(f).exists(), "{f} left behind");
    }
    assert!(!prefix.join("share/doc/s3rdma").exists());
    let _ = std::fs::remove_dir_all(&prefix);
}
