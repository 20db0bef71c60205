//! A tree written on one mount reads back the same on the next, type for type: links listed
//! before they are looked up, directory renames, user extended attributes, empty directories.

use std::ffi::OsStr;
use std::time::Duration;

use fuser::{Errno, FileType, RenameFlags};
use s3rdma_client::testing::{Fault, Op};
use s3rdma_client::{FileMeta, S3ErrorKind};

use super::{strict_config, Fx};
use crate::fs::FsConfig;

/// Defaults as a real mount has them: markers on, answers trusted for a while.
fn defaults() -> FsConfig {
    let mut cfg = strict_config();
    cfg.dir_markers = true;
    cfg.metadata_ttl = Duration::from_secs(60);
    cfg.negative_ttl = Duration::from_secs(60);
    cfg
}

/// The entries of `path` as a READDIRPLUS hands them out: (name, type), sorted.
fn listed(fx: &Fx, path: &str) -> Vec<(String, FileType)> {
    fx.ls_typed(path).expect("readdir")
}

// [S-NS-TYPE]
#[test]
fn a_link_met_first_by_a_listing_is_a_link() {
    let fx = Fx::with_config(defaults());
    fx.mkdir("a").unwrap();
    fx.mkdir("a/b").unwrap();
    fx.write("a/f3.bin", b"three").unwrap();
    fx.symlink("a/b/link3", "../f3.bin").unwrap();
    // s3fs's link, a file of link size, and files that cannot be links.
    let s3fs_link = FileMeta::symlink(None, None);
    fx.mem()
        .put_external_with("a/b/s3fs-link", b"/etc/hosts", s3fs_link);
    fx.mem().put_external("a/b/small", b"../f3.bin");
    fx.mem().put_external("a/b/empty", b"");
    fx.mem().put_external("a/b/big", &vec![7u8; 5000]);
    let fx = fx.remount();
    let before = fx.mem().requests(Op::Head);
    let entries = listed(&fx, "a/b");
    assert_eq!(
        entries,
        [
            ("big".to_string(), FileType::RegularFile),
            ("empty".to_string(), FileType::RegularFile),
            ("link3".to_string(), FileType::Symlink),
            ("s3fs-link".to_string(), FileType::Symlink),
            ("small".to_string(), FileType::RegularFile),
        ]
    );
    // Only the three objects of a link's size were asked about.
    assert_eq!(fx.mem().requests(Op::Head) - before, 3);
    // What the listing said stands: the lookups after it agree, at no request.
    let heads = fx.mem().requests(Op::Head);
    let listed_ino = fx
        .readdirplus("a/b")
        .unwrap()
        .into_iter()
        .find(|(n, _, _)| n == "link3")
        .unwrap()
        .1
        .ino;
    let looked = fx.stat("a/b/link3").unwrap();
    assert_eq!((looked.ino, looked.kind), (listed_ino, FileType::Symlink));
    assert_eq!(fx.readlink("a/b/link3").unwrap(), b"../f3.bin");
    assert_eq!(fx.mem().requests(Op::Head), heads);
    // A listed object deleted before it was asked about is no entry.
    fx.mem().put_external("a/gone-soon", b"x");
    let fx = fx.remount();
    fx.store.inject(
        Some(Op::Head),
        Fault::Stall(Duration::from_millis(200)),
        1,
        u64::MAX,
    );
    let other = fx.mem().clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        other.delete_external("a/gone-soon");
    });
    let names: Vec<String> = listed(&fx, "a").into_iter().map(|(n, _)| n).collect();
    t.join().unwrap();
    fx.store.clear();
    assert_eq!(names, ["b", "f3.bin"]);
}

#[test]
fn without_stored_attributes_a_listing_asks_nothing() {
    let mut cfg = defaults();
    cfg.file_metadata = false;
    let fx = Fx::with_config(cfg);
    fx.mem().put_external("d/one", b"1");
    fx.mem().put_external("d/two", b"2");
    assert_eq!(listed(&fx, "d").len(), 2);
    assert_eq!(fx.mem().requests(Op::Head), 0);
}

/// A tree of `n` files with attributes and a marker, under `dir/`.
fn tree(fx: &Fx, dir: &str, n: usize) {
    fx.mkdir(dir).unwrap();
    fx.mkdir(&format!("{dir}/sub")).unwrap();
    fx.mkdir(&format!("{dir}/empty")).unwrap();
    for i in 0..n {
        fx.write(&format!("{dir}/sub/f{i}"), format!("file {i}").as_bytes())
            .unwrap();
    }
    fx.symlink(&format!("{dir}/link"), "sub/f0").unwrap();
}

// [S-NS-DIR-RENAME]
#[test]
fn a_directory_rename_moves_every_key_and_keeps_inode_numbers() {
    let fx = Fx::with_config(defaults());
    tree(&fx, "tmp-ckpt", 20);
    let held = fx.stat("tmp-ckpt/sub/f3").unwrap().ino;
    let dir_ino = fx.stat("tmp-ckpt").unwrap().ino;
    let keys_before = fx.mem().keys().len();
    let (copies, deletes) = (fx.mem().requests(Op::Copy), fx.mem().requests(Op::Delete));
    fx.rename("tmp-ckpt", "ckpt-100").unwrap();
    // 20 files, a link, 3 markers: one copy and one delete each.
    assert_eq!(fx.mem().requests(Op::Copy) - copies, 24);
    assert_eq!(fx.mem().requests(Op::Delete) - deletes, 24);
    assert_eq!(fx.mem().keys().len(), keys_before);
    assert!(fx.mem().keys().iter().all(|k| !k.starts_with("tmp-ckpt")));
    assert_eq!(fx.stat("tmp-ckpt").unwrap_err(), Errno::ENOENT);
    assert_eq!(fx.stat("ckpt-100").unwrap().ino, dir_ino);
    // The kernel's inode of a file inside still names it, under the new name.
    assert_eq!(
        fx.fs
            .serve("getattr", fx.fs.do_getattr(held.0))
            .unwrap()
            .ino,
        held
    );
    assert_eq!(fx.read("ckpt-100/sub/f3").unwrap(), b"file 3");
    let fx = fx.remount();
    assert_eq!(fx.ls("ckpt-100").unwrap(), ["empty", "link", "sub"]);
    assert_eq!(fx.stat("ckpt-100/link").unwrap().kind, FileType::Symlink);
    assert_eq!(fx.readlink("ckpt-100/link").unwrap(), b"sub/f0");
    assert_eq!(fx.stat("ckpt-100/empty").unwrap().kind, FileType::Directory);
    assert_eq!(fx.read("ckpt-100/sub/f19").unwrap(), b"file 19");
    // Onto an empty directory: replaced; onto a full one or a file: refused.
    fx.mkdir("target").unwrap();
    fx.rename("ckpt-100/empty", "target").unwrap();
    assert!(fx.exists("target/") && !fx.exists("ckpt-100/empty/"));
    fx.write("target/x", b"x").unwrap();
    assert_eq!(
        fx.rename("ckpt-100", "target").unwrap_err(),
        Errno::ENOTEMPTY
    );
    fx.write("file", b"x").unwrap();
    assert_eq!(fx.rename("ckpt-100", "file").unwrap_err(), Errno::ENOTDIR);
    let (p, _) = fx.parent_of("ckpt-100").unwrap();
    let noreplace = fx.fs.serve(
        "rename",
        fx.fs.do_rename(
            p,
            OsStr::new("ckpt-100"),
            p,
            OsStr::new("target"),
            RenameFlags::RENAME_NOREPLACE,
        ),
    );
    assert_eq!(noreplace.unwrap_err(), Errno::EEXIST);
}

#[test]
fn a_copy_failing_midway_leaves_the_source_whole_and_no_copy() {
    let fx = Fx::with_config(defaults());
    tree(&fx, "src", 30);
    let before = fx.mem().keys();
    fx.store.inject(
        Some(Op::Copy),
        Fault::Error(S3ErrorKind::ServerError),
        10,
        1,
    );
    assert_eq!(fx.rename("src", "dst").unwrap_err(), Errno::EIO);
    assert_eq!(fx.mem().keys(), before);
    assert_eq!(fx.read("src/sub/f29").unwrap(), b"file 29");
    assert_eq!(fx.stat("dst").unwrap_err(), Errno::ENOENT);
    // An outage: the same.
    fx.store.inject(
        Some(Op::Copy),
        Fault::Error(S3ErrorKind::Unreachable),
        3,
        u64::MAX,
    );
    assert!(fx.rename("src", "dst").is_err());
    fx.store.clear();
    assert_eq!(fx.mem().keys(), before);
    // Then it works, and survives a remount.
    fx.rename("src", "dst").unwrap();
    let fx = fx.remount();
    assert_eq!(fx.ls("dst/sub").unwrap().len(), 30);
    assert_eq!(fx.stat("src").unwrap_err(), Errno::ENOENT);
}

#[test]
fn another_client_changing_the_directory_midway() {
    let fx = Fx::with_config(defaults());
    tree(&fx, "src", 10);
    // Another client deletes a key while the copies are under way: nothing is moved.
    fx.store.inject(
        Some(Op::Copy),
        Fault::Stall(Duration::from_millis(200)),
        1,
        u64::MAX,
    );
    let other = fx.mem().clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        other.delete_external("src/sub/f4");
    });
    assert_eq!(fx.rename("src", "dst").unwrap_err(), Errno::ESTALE);
    t.join().unwrap();
    assert!(fx.mem().keys().iter().all(|k| !k.starts_with("dst")));
    // Another client's new key under the old name stays there; the rest moves.
    let other = fx.mem().clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        other.put_external("src/sub/new", b"n");
    });
    fx.rename("src", "dst").unwrap();
    t.join().unwrap();
    fx.store.clear();
    assert!(fx.exists("dst/sub/f3"));
    assert_eq!(fx.mem().data("src/sub/new").unwrap(), b"n");
}

#[test]
fn directory_renames_in_memory_busy_and_above_the_bound() {
    let mut cfg = strict_config();
    cfg.max_dir_rename_keys = 5;
    let fx = Fx::with_config(cfg);
    // Made here without a marker: renamed in memory, no request.
    fx.mkdir("local").unwrap();
    fx.mkdir("local/inner").unwrap();
    let (copies, deletes) = (fx.mem().requests(Op::Copy), fx.mem().requests(Op::Delete));
    fx.rename("local", "moved").unwrap();
    assert_eq!(fx.mem().requests(Op::Copy), copies);
    assert_eq!(fx.mem().requests(Op::Delete), deletes);
    assert_eq!(fx.ls("moved").unwrap(), ["inner"]);
    // A file open for writing inside: EBUSY.
    let fh = fx.create_or_truncate("moved/inner/open").unwrap();
    assert_eq!(fx.rename("moved", "again").unwrap_err(), Errno::EBUSY);
    fx.close(fh).unwrap();
    fx.rename("moved", "again").unwrap();
    assert_eq!(fx.read("again/inner/open").unwrap(), b"");
    // More keys than the bound: EXDEV, and nothing moved.
    fx.mkdir("big").unwrap();
    for i in 0..6 {
        fx.write(&format!("big/f{i}"), b"x").unwrap();
    }
    assert_eq!(fx.rename("big", "big2").unwrap_err(), Errno::EXDEV);
    assert_eq!(fx.ls("big").unwrap().len(), 6);
}

fn xattrs(fx: &Fx, path: &str) -> Vec<String> {
    let ino = fx.stat(path).unwrap().ino.0;
    let raw = fx.fs.serve("listxattr", fx.fs.do_listxattr(ino)).unwrap();
    raw.split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect()
}

// [S-ATTR-XATTR]
#[test]
fn user_xattrs_are_stored_with_the_object_as_s3fs_stores_them() {
    let fx = Fx::with_config(defaults());
    fx.write("f", b"data").unwrap();
    let ino = fx.stat("f").unwrap().ino.0;
    fx.fs
        .serve(
            "setxattr",
            fx.fs.do_setxattr(ino, "user.origin", b"run-7", 0),
        )
        .unwrap();
    fx.fs
        .serve("setxattr", fx.fs.do_setxattr(ino, "user.empty", b"", 0))
        .unwrap();
    assert_eq!(
        fx.fs
            .serve("getxattr", fx.fs.do_getxattr(ino, "user.origin"))
            .unwrap(),
        b"run-7"
    );
    assert_eq!(xattrs(&fx, "f"), ["user.empty", "user.origin"]);
    assert_eq!(
        fx.fs
            .serve("setxattr", fx.fs.do_setxattr(ino, "user.origin", b"x", 1))
            .unwrap_err(),
        Errno::EEXIST
    );
    assert_eq!(
        fx.fs
            .serve("setxattr", fx.fs.do_setxattr(ino, "user.none", b"x", 2))
            .unwrap_err(),
        Errno::ENODATA
    );
    for ns in ["security.x", "trusted.x", "system.x"] {
        assert_eq!(
            fx.fs
                .serve("setxattr", fx.fs.do_setxattr(ino, ns, b"x", 0))
                .unwrap_err(),
            Errno::EOPNOTSUPP
        );
    }
    assert_eq!(
        fx.fs
            .serve(
                "setxattr",
                fx.fs.do_setxattr(ino, "user.s3rdma.cached", b"1", 0)
            )
            .unwrap_err(),
        Errno::EPERM
    );
    // Too much for S3's 2 KiB of user metadata.
    let big = vec![b'v'; 1500];
    assert_eq!(
        fx.fs
            .serve("setxattr", fx.fs.do_setxattr(ino, "user.big", &big, 0))
            .unwrap_err(),
        Errno::ENOSPC
    );
    assert_eq!(
        fx.fs
            .serve(
                "setxattr",
                fx.fs.do_setxattr(ino, "user.huge", &vec![0u8; 4096], 0)
            )
            .unwrap_err(),
        Errno::E2BIG
    );
    fx.fs
        .serve("removexattr", fx.fs.do_removexattr(ino, "user.empty"))
        .unwrap();
    assert_eq!(
        fx.fs
            .serve("removexattr", fx.fs.do_removexattr(ino, "user.empty"))
            .unwrap_err(),
        Errno::ENODATA
    );
    let fx = fx.remount();
    assert_eq!(xattrs(&fx, "f"), ["user.origin"]);
    let ino = fx.stat("f").unwrap().ino.0;
    assert_eq!(
        fx.fs
            .serve("getxattr", fx.fs.do_getxattr(ino, "user.origin"))
            .unwrap(),
        b"run-7"
    );
    // The header is s3fs's.
    let meta = fx.mem().info("f").unwrap().meta.unwrap();
    assert_eq!(
        meta.to_map()["xattr"],
        "%7B%22user.origin%22%3A%22cnVuLTc%3D%22%7D"
    );
    // A file being written takes its attributes with its upload: no copy.
    let copies = fx.mem().requests(Op::Copy);
    let fh = fx.create_or_truncate("g").unwrap();
    let gino = fx.stat("g").unwrap().ino.0;
    fx.fs
        .serve("setxattr", fx.fs.do_setxattr(gino, "user.k", b"v", 0))
        .unwrap();
    fx.close(fh).unwrap();
    assert_eq!(fx.mem().requests(Op::Copy), copies);
    let fx = fx.remount();
    let gino = fx.stat("g").unwrap().ino.0;
    assert_eq!(
        fx.fs
            .serve("getxattr", fx.fs.do_getxattr(gino, "user.k"))
            .unwrap(),
        b"v"
    );
    // Renames carry them.
    fx.rename("f", "f2").unwrap();
    let fx = fx.remount();
    assert_eq!(xattrs(&fx, "f2"), ["user.origin"]);
    // Directories have none and take none.
    fx.mkdir("d").unwrap();
    let d = fx.stat("d").unwrap().ino.0;
    assert!(fx
        .fs
        .serve("listxattr", fx.fs.do_listxattr(d))
        .unwrap()
        .is_empty());
    assert_eq!(
        fx.fs
            .serve("setxattr", fx.fs.do_setxattr(d, "user.a", b"1", 0))
            .unwrap_err(),
        Errno::EOPNOTSUPP
    );
}

// [S-NS-MKDIR]
#[test]
fn empty_directories_persist_by_default_and_rmdir_removes_the_marker() {
    let fx = Fx::with_config(defaults());
    fx.mkdir("repo").unwrap();
    fx.mkdir("repo/.git").unwrap();
    fx.mkdir("repo/.git/branches").unwrap();
    assert!(fx.exists("repo/.git/branches/"));
    let fx = fx.remount();
    assert_eq!(fx.ls("repo/.git").unwrap(), ["branches"]);
    fx.rmdir("repo/.git/branches").unwrap();
    assert!(!fx.exists("repo/.git/branches/"));
    let fx = fx.remount();
    assert!(fx.ls("repo/.git").unwrap().is_empty());
}

// [S-NS-TYPE]
#[test]
fn types_are_asked_for_just_ahead_of_the_reader() {
    let fx = Fx::with_config(defaults());
    for i in 0..600 {
        fx.mem().put_external(&format!("d/f{i:03}"), b"tiny");
    }
    let d = fx.resolve("d").unwrap().ino.0;
    let fh = fx.fs.serve("opendir", fx.fs.do_opendir(d)).unwrap();
    let ahead = crate::fs::kinds::TELL_AHEAD;
    // The first page: the entries up to TELL_AHEAD are asked about, no more.
    let first = fx
        .fs
        .serve("readdir", fx.fs.with_dir_entries(d, fh, 0, ahead, |_| ()));
    assert_eq!(first, Ok(()));
    assert_eq!(fx.mem().requests(Op::Head), ahead as u64 - 2);
    // Reading on asks about the rest as the reader gets there.
    let all = fx.readdirplus("d").unwrap();
    assert_eq!(all.len(), 602);
    fx.fs.do_releasedir(fh);
    assert!(fx.mem().requests(Op::Head) >= 600);
}

// [S-NS-DIR-RENAME]
#[test]
fn a_large_file_in_a_renamed_directory_is_a_multipart_copy_keeping_its_attributes() {
    let mut cfg = defaults();
    cfg.multipart_copy_threshold = 1 << 20;
    let fx = Fx::with_config(cfg);
    fx.mkdir("d").unwrap();
    fx.write("d/big", &super::pattern(2 << 20, 3)).unwrap();
    fx.setattr(
        "d/big",
        crate::fs::namespace::SetAttr {
            mode: Some(0o600),
            ..Default::default()
        },
    )
    .unwrap();
    let ino = fx.stat("d/big").unwrap().ino.0;
    fx.fs
        .serve("setxattr", fx.fs.do_setxattr(ino, "user.k", b"v", 0))
        .unwrap();
    let multipart = fx.mem().requests(Op::CreateMultipart);
    fx.rename("d", "e").unwrap();
    // The pending mode and xattr are written back first (one copy), then the rename's copy.
    assert_eq!(fx.mem().requests(Op::CreateMultipart), multipart + 2);
    let fx = fx.remount();
    assert_eq!(fx.read("e/big").unwrap(), super::pattern(2 << 20, 3));
    assert_eq!(fx.stat("e/big").unwrap().perm, 0o600);
    let ino = fx.stat("e/big").unwrap().ino.0;
    assert_eq!(
        fx.fs
            .serve("getxattr", fx.fs.do_getxattr(ino, "user.k"))
            .unwrap(),
        b"v"
    );
}

// [S-NS-TYPE]
#[test]
fn a_page_of_deleted_objects_does_not_end_the_listing() {
    let fx = Fx::with_config(defaults());
    // 301 objects that may be links; the 256 the first page asks about are gone by then.
    for i in 0..301 {
        fx.mem().put_external(&format!("d/f{i:03}"), b"tiny");
    }
    let d = fx.resolve("d").unwrap().ino.0;
    let fh = fx.fs.serve("opendir", fx.fs.do_opendir(d)).unwrap();
    fx.fs
        .serve("readdir", fx.fs.with_dir_entries(d, fh, 0, 0, |_| ()))
        .unwrap();
    for i in 0..256 {
        fx.mem().delete_external(&format!("d/f{i:03}"));
    }
    let listed = fx
        .fs
        .with_dir_entries(d, fh, 2, crate::fs::kinds::TELL_AHEAD, |out| {
            out.entries
                .iter()
                .skip(2)
                .take_while(|e| !matches!(e.told, crate::fs::Told::Unknown))
                .filter(|e| matches!(e.told, crate::fs::Told::Ready(..)))
                .count()
        });
    let names = fx.fs.serve("readdir", listed).unwrap();
    fx.fs.do_releasedir(fh);
    assert!(
        names > 0,
        "the reply after a page of gone entries holds entries"
    );
    assert_eq!(fx.ls("d").unwrap().len(), 45);
}
