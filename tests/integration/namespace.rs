use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, u64>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let md = std::fs::metadata(e.path()).unwrap();
        if md.is_dir() {
            walk(root, &e.path(), out);
        } else {
            let rel = e
                .path()
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            out.insert(rel, md.len());
        }
    }
}

// [S-NS-DIRS] [S-NS-STAT]
#[test]
fn nested_listing_and_stat() {
    let b = bucket("nested");
    let keys = [
        ("a/b/c.txt", 3),
        ("a/d.txt", 5),
        ("e.txt", 7),
        ("a/b/f/g", 11),
        ("x/y/z/w", 13),
    ];
    for (k, n) in keys {
        put(&b, k, vec![b'k'; n]);
    }
    let m = Mount::new(
        &b,
        &[
            "--uid",
            "4242",
            "--gid",
            "4343",
            "--file-mode",
            "0640",
            "--dir-mode",
            "0750",
        ],
    );
    assert_eq!(names(&m.path), ["a", "e.txt", "x"]);
    assert_eq!(names(&m.join("a")), ["b", "d.txt"]);
    assert_eq!(names(&m.join("a/b")), ["c.txt", "f"]);
    let mut found = BTreeMap::new();
    walk(&m.path, &m.path, &mut found);
    let want: BTreeMap<String, u64> = keys
        .iter()
        .map(|(k, n)| (k.to_string(), *n as u64))
        .collect();
    assert_eq!(found, want);
    let f = std::fs::metadata(m.join("a/b/c.txt")).unwrap();
    assert!(f.is_file());
    assert_eq!(
        (f.len(), f.uid(), f.gid(), f.mode() & 0o7777),
        (3, 4242, 4343, 0o640)
    );
    let d = std::fs::metadata(m.join("x/y")).unwrap();
    assert!(d.is_dir());
    assert_eq!(d.mode() & 0o7777, 0o750);
    assert_eq!(std::fs::read(m.join("x/y/z/w")).unwrap(), vec![b'k'; 13]);
    // mtime comes from S3's LastModified.
    let age = std::time::SystemTime::now()
        .duration_since(f.modified().unwrap())
        .unwrap_or_default();
    assert!(age < Duration::from_secs(600), "mtime {age:?} old");
    // Missing names and file-as-directory.
    let e = std::fs::metadata(m.join("a/nope")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    let e = std::fs::metadata(m.join("e.txt/inside")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTDIR));
    let e = std::fs::read_dir(m.join("e.txt")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTDIR));
    let e = std::fs::read(m.join("a")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EISDIR));
}

// [S-NS-NAMES]
#[test]
fn keys_with_spaces_unicode_percent_plus() {
    let b = bucket("names");
    let keys = [
        "with space.txt",
        "ünïcødé/文件.bin",
        "100%.txt",
        "a+b=c.txt",
        "semi;colon&amp",
        "dir with space/x y",
    ];
    for (i, k) in keys.iter().enumerate() {
        put(&b, k, format!("content {i}").into_bytes());
    }
    let m = Mount::new(&b, &[]);
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(
            std::fs::read_to_string(m.join(k)).unwrap(),
            format!("content {i}"),
            "{k}"
        );
    }
    let ls = names(&m.path);
    for top in [
        "with space.txt",
        "ünïcødé",
        "100%.txt",
        "a+b=c.txt",
        "semi;colon&amp",
        "dir with space",
    ] {
        assert!(ls.contains(&top.to_string()), "{top} missing from {ls:?}");
    }
}

// [S-NS-IMPLICIT] [S-NS-MARKER]
#[test]
fn implicit_and_marker_directories() {
    let b = bucket("markers");
    put(&b, "implicit/file", b"1".to_vec());
    put(&b, "marker-only/", Vec::new());
    put(&b, "marker-and-file/", Vec::new());
    put(&b, "marker-and-file/inner", b"2".to_vec());
    let m = Mount::new(&b, &[]);
    assert_eq!(
        names(&m.path),
        ["implicit", "marker-and-file", "marker-only"]
    );
    for d in ["implicit", "marker-only", "marker-and-file"] {
        assert!(std::fs::metadata(m.join(d)).unwrap().is_dir(), "{d}");
    }
    assert!(names(&m.join("marker-only")).is_empty());
    assert_eq!(names(&m.join("marker-and-file")), ["inner"]);
    // Looked up directly, without a listing first, from a fresh mount.
    drop(m);
    let m = Mount::new(&b, &[]);
    assert!(std::fs::metadata(m.join("marker-only")).unwrap().is_dir());
    assert!(std::fs::metadata(m.join("implicit")).unwrap().is_dir());
}

// [S-NS-CLASH]
#[test]
fn file_and_directory_of_the_same_name_shows_the_directory() {
    let b = bucket("clash");
    put(&b, "clash", b"i am a file".to_vec());
    put(&b, "clash/inner", b"i am inside".to_vec());
    let m = Mount::new(&b, &[]);
    // By lookup first (no listing yet).
    assert!(std::fs::metadata(m.join("clash")).unwrap().is_dir());
    assert_eq!(names(&m.path), ["clash"]);
    assert_eq!(
        std::fs::read(m.join("clash/inner")).unwrap(),
        b"i am inside"
    );
    assert!(m.log_text().contains("a directory of the same name exists"));
}

// [S-NS-NAMELEN]
#[test]
fn names_up_to_255_bytes_work_and_longer_ones_are_refused() {
    // SeaweedFS itself normalises or refuses keys that are not valid file names ('a//b',
    // '.'/'..' segments, segments over 255 bytes), so hiding them is tested on the in-memory
    // store (crates/s3rdma-fs/src/fs/tests/unit.rs and the model) rather than here.
    let b = bucket("namelen");
    let max = "M".repeat(255);
    put(&b, &format!("long/{max}"), b"255 bytes is fine".to_vec());
    put(&b, "long/short", b"ok".to_vec());
    let m = Mount::new(&b, &[]);
    assert_eq!(names(&m.join("long")), [max.clone(), "short".to_string()]);
    assert_eq!(
        std::fs::read(m.join("long").join(&max)).unwrap(),
        b"255 bytes is fine"
    );
    let e = std::fs::metadata(m.join("long").join("L".repeat(256))).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENAMETOOLONG));
}

/// The body of the objects `ls -l` lists: larger than any link target, so not a link.
static PAGE: [u8; 4096] = [b'x'; 4096];

// [S-NS-READDIRPLUS] [S-NS-TYPE]
#[test]
fn ls_l_of_10000_keys_lists_without_a_head_per_entry() {
    let b = bucket("tenk");
    let keys: Vec<String> = (0..10_000)
        .map(|i| format!("big/file-{i:05}.bin"))
        .collect();
    put_many(&b, keys, &PAGE);
    // Objects of a link target's size: each asked about once, before the listing is answered.
    let small: Vec<String> = (0..1000).map(|i| format!("small/f-{i:04}")).collect();
    put_many(&b, small, b"0123456789");
    let m = Mount::new(&b, &["--metadata-ttl", "60s"]);
    let start = Instant::now();
    let out = Command::new("ls")
        .arg("-l")
        .arg(m.join("big"))
        .output()
        .unwrap();
    let secs = start.elapsed().as_secs_f64();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let files: Vec<&str> = text.lines().filter(|l| l.starts_with('-')).collect();
    assert_eq!(files.len(), 10_000);
    assert!(
        files.iter().all(|l| l.contains(" 4096 ")),
        "sizes come from the listing"
    );
    let lists = m.count_requests("ListObjectsV2");
    let heads = m.count_requests("HeadObject");
    eprintln!("ls -l of 10,000 entries: {secs:.2} s, {lists} ListObjectsV2, {heads} HeadObject");
    // 10 pages of 1000, plus the start-up check and the lookup of "big" itself (one LIST).
    assert!(lists <= 12, "{lists} ListObjectsV2 calls");
    assert_eq!(heads, 0, "{heads} HeadObject calls");
    let start = Instant::now();
    let out = Command::new("ls")
        .arg("-l")
        .arg(m.join("small"))
        .output()
        .unwrap();
    let secs = start.elapsed().as_secs_f64();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().filter(|l| l.starts_with('-')).count(), 1000);
    let heads = m.count_requests("HeadObject");
    eprintln!("ls -l of 1,000 objects of 10 bytes: {secs:.2} s, {heads} HeadObject");
    assert_eq!(heads, 1000, "one HeadObject per object that may be a link");
    // A listing is not a read: no object's bytes are fetched for it [S-READ-WHOLE].
    assert_eq!(m.count_requests("GetObject"), 0);
}

// [S-NS-LOOKUP-ONE]
#[test]
fn a_lookup_is_one_listing_unless_many_names_share_its_spelling() {
    let b = bucket("probe");
    put(&b, "d/a", b"file a".to_vec());
    put(&b, "d/a.bak", b"sibling".to_vec());
    put(&b, "d/both", b"hidden by the directory".to_vec());
    put(&b, "d/both/x", b"x".to_vec());
    put(&b, "d/sub.x", b"sibling of a directory".to_vec());
    put(&b, "d/sub/inner", b"in".to_vec());
    // 150 names that start with "many": one 100-key probe page cannot tell whether a directory
    // "many/" exists after them, so the lookup asks HEAD + LIST instead.
    put(&b, "d/many", b"the file".to_vec());
    let siblings: Vec<String> = (0..150).map(|i| format!("d/many.{i:03}")).collect();
    put_many(&b, siblings, b"s");
    // With stored attributes asked for (the default), the first lookup of a file adds one
    // request for them: a GET of the whole object, as it is small [S-READ-WHOLE]; a name
    // already known as a file, whose bytes are cached, is asked with HeadObject alone.
    let m = Mount::new(&b, &["--metadata-ttl", "100ms"]);
    let (lists, heads, gets) = (
        m.count_requests("ListObjectsV2"),
        m.count_requests("HeadObject"),
        m.count_requests("GetObject"),
    );
    assert_eq!(std::fs::metadata(m.join("d/a")).unwrap().len(), 6);
    assert_eq!(m.count_requests("HeadObject"), heads);
    assert_eq!(m.count_requests("GetObject"), gets + 1, "the object whole");
    assert_eq!(m.count_requests("ListObjectsV2"), lists + 2, "d and d/a");
    std::thread::sleep(Duration::from_millis(300));
    let (lists, heads) = (
        m.count_requests("ListObjectsV2"),
        m.count_requests("HeadObject"),
    );
    assert_eq!(std::fs::metadata(m.join("d/a")).unwrap().len(), 6);
    assert_eq!(
        m.count_requests("HeadObject"),
        heads + 1,
        "known file: one HEAD"
    );
    assert_eq!(
        m.count_requests("ListObjectsV2"),
        lists + 1,
        "only d is listed again"
    );
    drop(m);
    let m = Mount::new(&b, &["--metadata-ttl", "30s", "--no-file-metadata"]);
    let before = (
        m.count_requests("ListObjectsV2"),
        m.count_requests("HeadObject"),
    );
    let meta = std::fs::metadata(m.join("d/a")).unwrap();
    assert!(meta.is_file());
    assert_eq!(meta.len(), 6);
    // "d" and "d/a": one listing each, no HeadObject.
    let after = (
        m.count_requests("ListObjectsV2"),
        m.count_requests("HeadObject"),
    );
    assert_eq!(after.0 - before.0, 2, "ListObjectsV2 calls");
    assert_eq!(after.1, before.1, "HeadObject calls");
    assert!(std::fs::metadata(m.join("d/both")).unwrap().is_dir());
    let e = std::fs::metadata(m.join("d/nothing")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    assert!(std::fs::metadata(m.join("d/sub")).unwrap().is_dir());
    assert_eq!(std::fs::read(m.join("d/sub/inner")).unwrap(), b"in");
    let heads = m.count_requests("HeadObject");
    assert_eq!(std::fs::read(m.join("d/many")).unwrap(), b"the file");
    assert!(
        m.count_requests("HeadObject") > heads,
        "a truncated probe falls back to HeadObject"
    );
    assert_eq!(std::fs::read(m.join("d/a.bak")).unwrap(), b"sibling");
}

// [S-NS-PREFIX]
#[test]
fn prefix_mount_shows_only_the_prefix() {
    let b = bucket("prefix");
    put(&b, "outside.txt", b"no".to_vec());
    put(&b, "team/data/x.txt", b"yes".to_vec());
    put(&b, "team/datasets/y.txt", b"no".to_vec());
    let m = Mount::new(&format!("{b}:team/data"), &[]);
    assert_eq!(names(&m.path), ["x.txt"]);
    assert_eq!(std::fs::read(m.join("x.txt")).unwrap(), b"yes");
    drop(m);
    let m = Mount::new(&format!("s3://{b}/team/"), &[]);
    assert_eq!(names(&m.path), ["data", "datasets"]);
}

// [S-NS-INODES]
#[test]
fn inode_numbers_are_stable() {
    let b = bucket("inodes");
    put(&b, "d/f", b"1".to_vec());
    let m = Mount::new(&b, &["--metadata-ttl", "100ms"]);
    // Held open: numbers are stable while the kernel holds the names [S-NS-FORGET], and
    // another test's drop_caches may make it forget names nothing holds.
    let _hold_f = std::fs::File::open(m.join("d/f")).unwrap();
    let _hold_d = std::fs::File::open(m.join("d")).unwrap();
    let f1 = std::fs::metadata(m.join("d/f")).unwrap().ino();
    let d1 = std::fs::metadata(m.join("d")).unwrap().ino();
    std::thread::sleep(Duration::from_millis(300));
    let _ = names(&m.join("d"));
    assert_eq!(std::fs::metadata(m.join("d/f")).unwrap().ino(), f1);
    assert_eq!(std::fs::metadata(m.join("d")).unwrap().ino(), d1);
    assert_ne!(f1, d1);
    assert_eq!(std::fs::metadata(&m.path).unwrap().ino(), 1);
}

// [S-NS-FORGET]
#[test]
fn entries_the_kernel_forgets_are_dropped_and_open_files_keep_their_numbers() {
    let b = bucket("forget");
    let keys: Vec<String> = (0..600).map(|i| format!("t/d{}/f{i:04}", i % 6)).collect();
    put_many(&b, keys, b"x");
    let m = Mount::new(&b, &[]);
    let inodes = || stat_value(&mount_stats(&m.path), "inodes");
    assert_eq!(inodes(), 1);
    // The kernel holds what `find` walked: 600 files, 6 directories and t.
    let walk = || {
        let out = Command::new("find")
            .arg(m.join("t"))
            .args(["-type", "f"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).lines().count()
    };
    assert_eq!(walk(), 600);
    let held = inodes();
    assert!(held >= 607, "{held} inodes after the walk");
    // An open file (and the directories above it) keeps its number through the kernel's
    // forgetting; a working directory too.
    let open = std::fs::File::open(m.join("t/d1/f0001")).unwrap();
    let ino = open.metadata().unwrap().ino();
    let d2 = std::fs::metadata(m.join("t/d2")).unwrap().ino();
    let mut sh = Command::new("sleep")
        .arg("30")
        .current_dir(m.join("t/d2"))
        .spawn()
        .unwrap();
    let dropped_before = stat_value(&mount_stats(&m.path), "inodes_dropped");
    drop_caches();
    let after = inodes();
    let dropped = stat_value(&mount_stats(&m.path), "inodes_dropped") - dropped_before;
    eprintln!("inodes: {held} after the walk, {after} after drop_caches ({dropped} dropped)");
    assert!(after < 20, "{after} inodes left after drop_caches");
    assert!(dropped >= 590, "{dropped} dropped");
    assert_eq!(open.metadata().unwrap().ino(), ino);
    assert_eq!(std::fs::metadata(m.join("t/d1/f0001")).unwrap().ino(), ino);
    assert_eq!(std::fs::metadata(m.join("t/d2")).unwrap().ino(), d2);
    let _ = sh.kill();
    let _ = sh.wait();
    // Forgotten names look up again (new numbers, none shared by two names), and the walk
    // finds everything again.
    let mut seen = std::collections::HashMap::new();
    for i in (0..600).step_by(7) {
        let p = format!("t/d{}/f{i:04}", i % 6);
        let meta = std::fs::metadata(m.join(&p)).unwrap();
        assert_eq!(meta.len(), 1);
        if let Some(other) = seen.insert(meta.ino(), p.clone()) {
            panic!("{p} and {other} share inode {}", meta.ino());
        }
    }
    assert_eq!(walk(), 600);
    drop(open);
}

// [S-NS-TTL] [S-NS-NEGATIVE]
#[test]
fn new_and_removed_keys_appear_after_the_ttl() {
    let b = bucket("ttl");
    put(&b, "stay", b"1".to_vec());
    let m = Mount::new(&b, &["--metadata-ttl", "300ms"]);
    assert_eq!(
        std::fs::metadata(m.join("later"))
            .unwrap_err()
            .raw_os_error(),
        Some(libc::ENOENT)
    );
    put(&b, "later", b"22".to_vec());
    delete(&b, "stay");
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(std::fs::metadata(m.join("later")).unwrap().len(), 2);
    assert_eq!(
        std::fs::metadata(m.join("stay"))
            .unwrap_err()
            .raw_os_error(),
        Some(libc::ENOENT)
    );
    assert_eq!(names(&m.path), ["later"]);
}

// [S-NS-LISTING]
#[test]
fn listings_are_reused_within_the_ttl_and_never_hide_this_mounts_changes() {
    let b = bucket("listttl");
    put(&b, "d/a", b"a".to_vec());
    put(&b, "d/b", b"b".to_vec());
    let m = Mount::new(&b, &["--metadata-ttl", "4s"]);
    let d = m.join("d");
    assert_eq!(names(&d), ["a", "b"]);
    let lists = m.count_requests("ListObjectsV2");
    // Within the TTL the directory is listed from the mount's listing: no request...
    assert_eq!(names(&d), ["a", "b"]);
    assert_eq!(m.count_requests("ListObjectsV2"), lists);
    // ...so another client's new key is not seen yet.
    put(&b, "d/c", b"c".to_vec());
    assert_eq!(names(&d), ["a", "b"]);
    assert_eq!(m.count_requests("ListObjectsV2"), lists);
    // This mount's own changes are seen at once (the next listing asks S3 again).
    std::fs::write(d.join("w"), b"w").unwrap();
    assert_eq!(names(&d), ["a", "b", "c", "w"]);
    std::fs::remove_file(d.join("a")).unwrap();
    assert_eq!(names(&d), ["b", "c", "w"]);
    std::fs::rename(d.join("b"), d.join("b2")).unwrap();
    assert_eq!(names(&d), ["b2", "c", "w"]);
    std::fs::create_dir(d.join("sub")).unwrap();
    std::fs::write(d.join("sub/x"), b"x").unwrap();
    assert_eq!(names(&d), ["b2", "c", "sub", "w"]);
    std::fs::remove_file(d.join("sub/x")).unwrap();
    std::fs::remove_dir(d.join("sub")).unwrap();
    assert_eq!(names(&d), ["b2", "c", "w"]);
    // Another client's delete shows once the TTL has passed since the last listing.
    delete(&b, "d/c");
    assert_eq!(names(&d), ["b2", "c", "w"]);
    std::thread::sleep(Duration::from_millis(4500));
    assert_eq!(names(&d), ["b2", "w"]);
    // And `ls -l` shows the sizes the listing had, within the TTL as after it.
    let out = Command::new("ls").arg("-l").arg(&d).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains(" 1 "));
}

// [S-NS-STATFS]
#[test]
fn statfs_reports_sane_values() {
    let b = bucket("statfs");
    let m = Mount::new(&b, &[]);
    let c = std::ffi::CString::new(m.path.to_string_lossy().as_bytes()).unwrap();
    // SAFETY: statvfs is plain old data: all zeroes is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and out-pointer.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    assert_eq!(st.f_bsize, 4096);
    assert_eq!(st.f_namemax, 255);
    assert!(st.f_blocks > 0 && st.f_bavail > 0 && st.f_files > 0);
    assert!(
        st.f_flag & libc::ST_RDONLY == 0,
        "writable unless --read-only"
    );
    let df = Command::new("df").arg(&m.path).output().unwrap();
    assert!(df.status.success());
}

// [S-ATTR-XATTR]
#[test]
fn user_xattrs_through_the_system_calls() {
    let b = bucket("xattr");
    put(&b, "f", b"x".to_vec());
    let m = Mount::new(&b, &[]);
    let path = std::ffi::CString::new(m.join("f").to_string_lossy().as_bytes()).unwrap();
    let errno = || std::io::Error::last_os_error().raw_os_error();
    let name = c"user.test";
    let mut buf = [0u8; 64];
    // SAFETY: valid C strings, and a buffer of the length given (so every call below).
    let r = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), 64) };
    assert_eq!((r, errno()), (-1, Some(libc::ENODATA)));
    // SAFETY: as above.
    let r = unsafe { libc::listxattr(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!(r, 0);
    // SAFETY: as above.
    let r = unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), c"v1".as_ptr().cast(), 2, 0) };
    assert_eq!(r, 0, "{:?}", errno());
    // SAFETY: as above.
    let r = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), 64) };
    assert_eq!((r, &buf[..2]), (2, &b"v1"[..]));
    // SAFETY: as above.
    let r = unsafe { libc::listxattr(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!(&buf[..r as usize], b"user.test\0");
    // Stored in s3fs's layout once written back (fsync writes it back at once).
    std::fs::File::open(m.join("f"))
        .unwrap()
        .sync_all()
        .unwrap();
    let meta = rt().block_on(async {
        client()
            .head_object()
            .bucket(&b)
            .key("f")
            .send()
            .await
            .expect("HEAD")
    });
    assert_eq!(
        meta.metadata()
            .and_then(|m| m.get("xattr"))
            .map(String::as_str),
        Some("%7B%22user.test%22%3A%22djE%3D%22%7D")
    );
    let trusted = c"trusted.x";
    // SAFETY: as above.
    let r = unsafe { libc::setxattr(path.as_ptr(), trusted.as_ptr(), buf.as_ptr().cast(), 1, 0) };
    assert_eq!(r, -1);
    assert!(matches!(
        errno(),
        Some(libc::EOPNOTSUPP) | Some(libc::EPERM)
    ));
    // SAFETY: as above.
    let r = unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) };
    assert_eq!(r, 0);
    // SAFETY: as above.
    let r = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), 64) };
    assert_eq!((r, errno()), (-1, Some(libc::ENODATA)));
}
