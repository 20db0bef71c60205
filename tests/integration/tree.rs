//! Trees through the mount: rsync, cp -a, mv, tar, rm -r, find, du — checked through the mount
//! and directly on the server (no stray temporary objects, no open multipart uploads).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, UNIX_EPOCH};

use crate::common::*;

/// Every key in the bucket with its size.
fn server_keys(bucket: &str) -> Vec<(String, i64)> {
    let c = client();
    rt().block_on(async {
        let mut out = Vec::new();
        let mut token = None;
        loop {
            let page = c
                .list_objects_v2()
                .bucket(bucket)
                .set_continuation_token(token)
                .send()
                .await
                .expect("list");
            for o in page.contents() {
                out.push((
                    o.key().unwrap_or_default().to_string(),
                    o.size().unwrap_or(0),
                ));
            }
            token = page.next_continuation_token().map(str::to_string);
            if token.is_none() {
                return out;
            }
        }
    })
}

fn server_meta(bucket: &str, key: &str) -> std::collections::HashMap<String, String> {
    let c = client();
    rt().block_on(async {
        c.head_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
            .expect("HEAD")
            .metadata()
            .cloned()
            .unwrap_or_default()
    })
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `rsync -a --itemize-changes src/ dst` finds every file up to date (`what`: which run).
fn assert_rsync_sends_nothing(src: &Path, dst: &Path, what: &str) {
    let again = run(Command::new("rsync")
        .args(["-a", "--itemize-changes"])
        .arg(format!("{}/", src.display()))
        .arg(dst));
    assert!(
        !again.lines().any(|l| l.starts_with(">f")),
        "{what}:\n{again}"
    );
}

/// A local tree of `n` files in nested directories, sizes 0 B .. 40 MiB, with modes and
/// mtimes in the past. Returns its root and the total size.
fn make_tree(tag: &str, n: usize) -> (PathBuf, u64) {
    let root = work_dir().join(format!("tree-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let mut total = 0;
    for i in 0..n {
        let dir = root.join(format!("d{}/e{}", i % 5, i % 3));
        std::fs::create_dir_all(&dir).unwrap();
        let len = match i {
            0 => 0,
            1 | 2 => 40 << 20,
            _ => (i * 997) % (256 << 10),
        };
        let path = dir.join(format!("f{i:03}.bin"));
        std::fs::write(&path, pattern(len, i as u64)).unwrap();
        total += len as u64;
        let mode = [0o644, 0o600, 0o755][i % 3];
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        let t = UNIX_EPOCH + Duration::new(1_600_000_000 + i as u64 * 3600, (i as u32) * 1000);
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_modified(t).unwrap();
    }
    (root, total)
}

fn diff(a: &Path, b: &Path) {
    run(Command::new("diff").arg("-r").arg(a).arg(b));
}

// [S-NS-RSYNC]
#[test]
fn rsync_a_of_a_fresh_tree_with_an_empty_first_file_keeps_every_mtime() {
    // The tree that showed a wrong mtime on 5 of 5 fresh mounts: random contents, default
    // mtimes, sizes (i * 7919) % 3 MiB, so the first file is empty.
    let b = bucket("rsync-mtime");
    let src = work_dir().join("rsync-mtime-src");
    let _ = std::fs::remove_dir_all(&src);
    std::fs::create_dir_all(&src).unwrap();
    for i in 0..60usize {
        std::fs::write(
            src.join(format!("f{i:02}")),
            pattern((i * 7919) % (3 << 20), i as u64),
        )
        .unwrap();
    }
    let m = Mount::new(&b, &[]);
    let dst = m.join("t");
    run(Command::new("rsync")
        .arg("-a")
        .arg(format!("{}/", src.display()))
        .arg(&dst));
    assert_rsync_sends_nothing(&src, &dst, "second rsync transferred files");
    for i in [0usize, 1, 59] {
        let name = format!("f{i:02}");
        let local = std::fs::metadata(src.join(&name)).unwrap();
        let mounted = std::fs::metadata(dst.join(&name)).unwrap();
        assert_eq!(
            mounted.modified().unwrap(),
            local.modified().unwrap(),
            "{name}"
        );
    }
    let _ = std::fs::remove_dir_all(&src);
}

// [S-NS-RSYNC]
#[test]
fn rsync_a_copies_a_tree_and_a_second_run_transfers_nothing() {
    let b = bucket("rsync");
    let (src, _) = make_tree("rsync", 300);
    let m = Mount::new(&b, &[]);
    let dst = m.join("copy");
    run(Command::new("rsync")
        .arg("-a")
        .arg(format!("{}/", src.display()))
        .arg(&dst));
    diff(&src, &dst);
    // Every file under its name on the server; no temporary `.name.XXXXXX` objects left.
    // (And a marker for each directory rsync made.)
    let keys: Vec<(String, i64)> = server_keys(&b)
        .into_iter()
        .filter(|(k, _)| !k.ends_with('/'))
        .collect();
    assert_eq!(keys.len(), 300, "{:?}", &keys[..keys.len().min(5)]);
    assert!(
        keys.iter().all(|(k, _)| !k.contains("/.f")),
        "stray temporary objects"
    );
    assert_eq!(open_uploads(&b), 0);
    // Modes and mtimes are stored and reported back.
    let meta = server_meta(&b, "copy/d1/e1/f001.bin");
    assert_eq!(
        meta.get("mode").map(String::as_str),
        Some("33152"),
        "0600 regular file"
    );
    let local = std::fs::metadata(src.join("d1/e1/f001.bin")).unwrap();
    let mounted = std::fs::metadata(dst.join("d1/e1/f001.bin")).unwrap();
    assert_eq!(mounted.modified().unwrap(), local.modified().unwrap());
    assert_eq!(mounted.permissions().mode() & 0o7777, 0o600);
    // The second run finds every file up to date, on a fresh mount too.
    assert_rsync_sends_nothing(&src, &dst, "second rsync transferred files");
    drop(m);
    let m = Mount::new(&b, &[]);
    assert_rsync_sends_nothing(
        &src,
        &m.join("copy"),
        "rsync after a remount transferred files",
    );
    let _ = std::fs::remove_dir_all(&src);
}

// [S-NS-TREE-TOOLS]
#[test]
fn cp_mv_tar_find_du_and_rm_r_work_on_trees() {
    let b = bucket("tools");
    let (src, total) = make_tree("tools", 40);
    let m = Mount::new(&b, &[]);
    // cp -r and cp -a.
    run(Command::new("cp").arg("-r").arg(&src).arg(m.join("r")));
    diff(&src, &m.join("r"));
    run(Command::new("cp").arg("-a").arg(&src).arg(m.join("a")));
    diff(&src, &m.join("a"));
    let local = std::fs::metadata(src.join("d2/e2/f002.bin")).unwrap();
    let copied = std::fs::metadata(m.join("a/d2/e2/f002.bin")).unwrap();
    assert_eq!(
        copied.modified().unwrap(),
        local.modified().unwrap(),
        "cp -a keeps mtimes"
    );
    assert_eq!(copied.permissions().mode() & 0o7777, 0o755);
    // du -s counts the bytes.
    let du = run(Command::new("du")
        .args(["-s", "-B1", "--apparent-size"])
        .arg(m.join("a")));
    let du: u64 = du.split_whitespace().next().unwrap().parse().unwrap();
    assert_eq!(du, total);
    // mv of a file, and over an existing file.
    let a = m.join("a/d0/e0/f000.bin");
    run(Command::new("mv").arg(&a).arg(m.join("a/moved.bin")));
    assert!(!a.exists());
    assert_eq!(backend_get(&b, "a/moved.bin").unwrap(), b"");
    let (x, y) = (m.join("a/d1/e1/f001.bin"), m.join("a/d2/e2/f002.bin"));
    run(Command::new("mv").arg(&x).arg(&y));
    assert!(!x.exists());
    assert!(
        std::fs::read(&y).unwrap() == pattern(40 << 20, 1),
        "replaced"
    );
    assert!(backend_get(&b, "a/d2/e2/f002.bin").unwrap() == pattern(40 << 20, 1));
    assert_eq!(backend_get(&b, "a/d1/e1/f001.bin"), None);
    assert_eq!(
        std::fs::metadata(&y).unwrap().modified().unwrap(),
        std::fs::metadata(src.join("d1/e1/f001.bin"))
            .unwrap()
            .modified()
            .unwrap(),
        "attributes travel with the rename"
    );
    // mv of a directory: one rename, every key moved [S-NS-DIR-RENAME].
    run(Command::new("mv").arg(m.join("r")).arg(m.join("r2")));
    diff(&src, &m.join("r2"));
    assert!(!m.join("r").exists());
    assert!(server_keys(&b).iter().all(|(k, _)| !k.starts_with("r/")));
    // tar -x.
    let tarball = work_dir().join(format!("tree-{}.tar", std::process::id()));
    run(Command::new("tar")
        .arg("-cf")
        .arg(&tarball)
        .arg("-C")
        .arg(&src)
        .arg("."));
    std::fs::create_dir(m.join("t")).unwrap();
    run(Command::new("tar")
        .arg("-xf")
        .arg(&tarball)
        .arg("-C")
        .arg(m.join("t")));
    diff(&src, &m.join("t"));
    // find -newer: only what was written after the reference.
    std::thread::sleep(Duration::from_millis(1100));
    std::fs::write(m.join("t/ref"), b"r").unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    std::fs::write(m.join("t/d0/new.txt"), b"n").unwrap();
    let newer = run(Command::new("find")
        .arg(m.join("t"))
        .args(["-type", "f", "-newer"])
        .arg(m.join("t/ref")));
    assert_eq!(newer.trim(), m.join("t/d0/new.txt").display().to_string());
    // rm -r of everything: nothing left on the server.
    for d in ["a", "r2", "t"] {
        run(Command::new("rm").arg("-r").arg(m.join(d)));
    }
    assert_eq!(server_keys(&b), Vec::<(String, i64)>::new());
    assert_eq!(std::fs::read_dir(&m.path).unwrap().count(), 0);
    assert_eq!(open_uploads(&b), 0);
    let _ = std::fs::remove_file(&tarball);
    let _ = std::fs::remove_dir_all(&src);
}

// [S-NS-MKDIR]
#[test]
fn mkdir_and_rmdir() {
    let b = bucket("mkdir");
    put(&b, "full/x", b"x".to_vec());
    let m = Mount::new(&b, &["--metadata-ttl", "0", "--no-dir-markers"]);
    std::fs::create_dir(m.join("local")).unwrap();
    assert!(
        m.join("local").is_dir(),
        "a new directory is there before any key"
    );
    assert_eq!(server_keys(&b).len(), 1, "no marker with --no-dir-markers");
    std::fs::write(m.join("local/f"), b"f").unwrap();
    assert_eq!(backend_get(&b, "local/f").unwrap(), b"f");
    let e = std::fs::remove_dir(m.join("local")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY));
    let e = std::fs::remove_dir(m.join("full")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY));
    assert_eq!(
        std::fs::create_dir(m.join("full"))
            .unwrap_err()
            .raw_os_error(),
        Some(libc::EEXIST)
    );
    std::fs::remove_file(m.join("local/f")).unwrap();
    std::fs::remove_dir(m.join("local")).unwrap();
    assert!(!m.join("local").exists());
    drop(m);
    // With markers (the default): an empty directory exists on the server and after a remount.
    let m = Mount::new(&b, &[]);
    std::fs::create_dir(m.join("kept")).unwrap();
    assert_eq!(backend_get(&b, "kept/").unwrap(), b"");
    drop(m);
    let m = Mount::new(&b, &[]);
    assert!(m.join("kept").is_dir());
    std::fs::remove_dir(m.join("kept")).unwrap();
    assert_eq!(backend_get(&b, "kept/"), None);
}

// [S-NS-SETATTR]
#[test]
fn chmod_chown_utimes_and_truncate_are_stored() {
    let b = bucket("setattr");
    put(&b, "f", pattern(1000, 1));
    put(&b, "big", pattern(12 << 20, 2));
    // A low copy threshold makes attribute changes and renames of "big" multipart copies.
    let m = Mount::new(&b, &["--multipart-copy-threshold", "5MiB"]);
    let f = m.join("f");
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o750)).unwrap();
    let t = UNIX_EPOCH + Duration::new(1_500_000_000, 250_000_000);
    let path = std::ffi::CString::new(f.to_string_lossy().as_bytes()).unwrap();
    let times = [
        libc::timespec {
            tv_sec: 1_500_000_000,
            tv_nsec: 250_000_000,
        },
        libc::timespec {
            tv_sec: 1_500_000_000,
            tv_nsec: 250_000_000,
        },
    ];
    assert_eq!(
        // SAFETY: valid path and times.
        unsafe { libc::utimensat(libc::AT_FDCWD, path.as_ptr(), times.as_ptr(), 0) },
        0
    );
    // SAFETY: valid path; chown to another owner (the tests run as root).
    assert_eq!(unsafe { libc::chown(path.as_ptr(), 1234, 5678) }, 0);
    // Written back within a second, or at once by fsync (of any handle) [S-NS-ATTR-WRITEBACK].
    std::fs::File::open(&f).unwrap().sync_all().unwrap();
    let meta = server_meta(&b, "f");
    assert_eq!(meta.get("mode").map(String::as_str), Some("33256"));
    assert_eq!(
        meta.get("mtime").map(String::as_str),
        Some("1500000000.250000000")
    );
    assert_eq!(meta.get("uid").map(String::as_str), Some("1234"));
    assert_eq!(
        backend_get(&b, "f").unwrap(),
        pattern(1000, 1),
        "content untouched"
    );
    drop(m);
    let m = Mount::new(&b, &["--multipart-copy-threshold", "5MiB"]);
    let st = std::fs::metadata(m.join("f")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        (st.mode() & 0o7777, st.uid(), st.gid()),
        (0o750, 1234, 5678)
    );
    assert_eq!(st.modified().unwrap(), t, "after a remount");
    // Rename and chmod of a multipart-copied object.
    std::fs::rename(m.join("big"), m.join("big2")).unwrap();
    assert!(backend_get(&b, "big2").unwrap() == pattern(12 << 20, 2));
    assert!(m.log_text().contains("UploadPartCopy"));
    std::fs::set_permissions(m.join("big2"), std::fs::Permissions::from_mode(0o600)).unwrap();
    assert!(backend_get(&b, "big2").unwrap() == pattern(12 << 20, 2));
    assert_eq!(open_uploads(&b), 0);
    // truncate to another size stages the file (open without O_TRUNC keeps its bytes); to 0
    // stores an empty object.
    std::fs::File::options()
        .write(true)
        .open(m.join("big2"))
        .and_then(|f| f.set_len(10))
        .unwrap();
    assert_eq!(backend_get(&b, "big2").unwrap(), pattern(10, 2));
    let p2 = std::ffi::CString::new(m.join("big2").to_string_lossy().as_bytes()).unwrap();
    // SAFETY: valid path.
    assert_eq!(unsafe { libc::truncate(p2.as_ptr(), 0) }, 0);
    assert_eq!(backend_get(&b, "big2").unwrap(), b"");
    assert_eq!(std::fs::metadata(m.join("big2")).unwrap().len(), 0);
    // Directories keep their attributes for the life of the mount.
    std::fs::create_dir(m.join("d")).unwrap();
    std::fs::set_permissions(m.join("d"), std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(
        std::fs::metadata(m.join("d")).unwrap().permissions().mode() & 0o7777,
        0o700
    );
}

// [S-NS-RENAME]
#[test]
fn rename_of_a_file_being_written_and_rename_noreplace() {
    use std::io::Write;
    let b = bucket("renw");
    put(&b, "old", b"previous version".to_vec());
    let m = Mount::new(&b, &["--write-part-size", "5MiB"]);
    // A multipart file renamed while still open: stored under the new name only.
    let data = pattern(12 << 20, 5);
    let mut f = std::fs::File::create(m.join("draft")).unwrap();
    f.write_all(&data[..8 << 20]).unwrap();
    std::fs::rename(m.join("draft"), m.join("final")).unwrap();
    f.write_all(&data[8 << 20..]).unwrap();
    drop(f);
    std::thread::sleep(Duration::from_millis(200));
    assert!(backend_get(&b, "final").unwrap() == data);
    assert_eq!(backend_get(&b, "draft"), None);
    // An overwrite of an existing object renamed while open: the old name is gone too.
    let mut f = std::fs::File::create(m.join("old")).unwrap();
    f.write_all(b"new version").unwrap();
    std::fs::rename(m.join("old"), m.join("renamed")).unwrap();
    drop(f);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(backend_get(&b, "renamed").unwrap(), b"new version");
    wait_for_delete(&b, "old");
    assert_eq!(open_uploads(&b), 0);
    // renameat2(RENAME_NOREPLACE) onto an existing name.
    let (a, c) = (
        std::ffi::CString::new(m.join("final").to_string_lossy().as_bytes()).unwrap(),
        std::ffi::CString::new(m.join("renamed").to_string_lossy().as_bytes()).unwrap(),
    );
    // SAFETY: valid paths.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EEXIST)
    );
    assert_eq!(backend_get(&b, "renamed").unwrap(), b"new version");
}

// [S-NS-UNLINK]
#[test]
fn unlink_while_a_reader_has_the_file_open() {
    use std::io::Read;
    let b = bucket("unl");
    let data = pattern(24 << 20, 6);
    put(&b, "f", data.clone());
    let m = Mount::new(&b, &["--read-part-size", "1MiB", "--max-prefetch", "2MiB"]);
    let mut r = std::fs::File::open(m.join("f")).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    r.read_exact(&mut buf).unwrap();
    std::fs::remove_file(m.join("f")).unwrap();
    assert_eq!(backend_get(&b, "f"), None);
    assert!(!m.join("f").exists());
    // The reader gets the old bytes (cached) or a clean error, never anything else.
    let mut off = 1 << 20;
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                assert!(buf[..n] == data[off..off + n], "bytes at {off}");
                off += n;
            }
            Err(e) => {
                assert!(
                    matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ESTALE)),
                    "{e}"
                );
                break;
            }
        }
    }
}
