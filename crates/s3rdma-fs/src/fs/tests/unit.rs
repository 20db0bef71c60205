//! Unit tests of the filesystem logic on the in-memory store: namespace mapping, pinned reads,
//! conditional writes and aborts, rename/unlink/setattr, and the requests each costs.
#![cfg(test)]

use std::ffi::OsStr;
use std::time::{Duration, UNIX_EPOCH};

use fuser::{Errno, FileType, RenameFlags};
use s3rdma_client::testing::{Fault, Op};
use s3rdma_client::S3ErrorKind;

use super::super::inode::ROOT_INO;
use super::super::namespace::SetAttr;
use super::BLOCK;
use super::{pattern, strict_config, Fx};

// [S-NS-IMPLICIT] [S-NS-MARKER] [S-NS-DIRS]
#[test]
fn implicit_and_marker_directories_list_as_the_bucket_has_them() {
    let fx = Fx::new();
    fx.mem().put_external("a/b/c.txt", b"abc");
    fx.mem().put_external("a/top", b"t");
    fx.mem().put_external("empty/", b"");
    fx.mem().put_external("z", b"zz");
    assert_eq!(fx.ls("").unwrap(), ["a", "empty", "z"]);
    assert_eq!(fx.ls("a").unwrap(), ["b", "top"]);
    assert_eq!(fx.ls("a/b").unwrap(), ["c.txt"]);
    // A marker alone is an empty directory; the marker is never an entry.
    assert_eq!(fx.ls("empty").unwrap(), Vec::<String>::new());
    assert_eq!(fx.stat("empty").unwrap().kind, FileType::Directory);
    assert_eq!(fx.stat("a/b/c.txt").unwrap().size, 3);
    assert_eq!(fx.stat("a").unwrap().kind, FileType::Directory);
    assert_eq!(fx.stat("nope").unwrap_err(), Errno::ENOENT);
    assert_eq!(fx.stat("z/under").unwrap_err(), Errno::ENOTDIR);
}

// [S-NS-HIDDEN]: keys that SeaweedFS normalises away (`a//b`, `..`, `.`) are made here.
#[test]
fn keys_that_cannot_be_paths_are_hidden_and_never_shadow_good_ones() {
    let fx = Fx::new();
    for key in ["d//x", "d/../y", "d/./z", "d/ok", "..", "./w"] {
        fx.mem().put_external(key, b"k");
    }
    let long = format!("d/{}", "n".repeat(256));
    fx.mem().put_external(&long, b"long");
    assert_eq!(fx.ls("d").unwrap(), ["ok"]);
    assert_eq!(fx.ls("").unwrap(), ["d"]);
    assert_eq!(fx.read("d/ok").unwrap(), b"k");
    assert_eq!(fx.stat(&long).unwrap_err(), Errno::ENAMETOOLONG);
}

// [S-NS-CLASH]
#[test]
fn a_directory_wins_over_a_file_of_the_same_name() {
    let fx = Fx::new();
    fx.mem().put_external("x", b"file");
    fx.mem().put_external("x/inner", b"in");
    assert_eq!(fx.ls("").unwrap(), ["x"]);
    assert_eq!(fx.stat("x").unwrap().kind, FileType::Directory);
    assert_eq!(fx.read("x/inner").unwrap(), b"in");
    // Writing the file name is refused: it is a directory here.
    assert_eq!(fx.write("x", b"new").unwrap_err(), Errno::EISDIR);
    assert_eq!(fx.mem().data("x").unwrap(), b"file");
}

// [S-READ-PINNED] [S-WRITE-READERS-PINNED]
#[test]
fn an_open_file_reads_the_version_it_opened_or_fails_with_estale() {
    let fx = Fx::new();
    let old = pattern(12 << 20, 1);
    fx.mem().put_external("f", &old);
    let fh = fx.open_read("f").unwrap();
    // The first block is fetched under the old ETag.
    assert_eq!(fx.pread(fh, 0, 4096).unwrap(), old[..4096]);
    fx.mem().put_external("f", &pattern(12 << 20, 2));
    // What the handle still returns is the old version; what needs a GET fails.
    match fx.pread(fh, 11 << 20, 4096) {
        Ok(bytes) => assert_eq!(bytes, old[11 << 20..(11 << 20) + 4096]),
        Err(e) => assert_eq!(e, Errno::ESTALE),
    }
    fx.fs.run(fx.fs.do_release(fh));
    // The next open reads the new version.
    assert_eq!(fx.read("f").unwrap(), pattern(12 << 20, 2));
}

// [S-READ-DELETED]
#[test]
fn a_deleted_object_cannot_be_opened_and_an_open_handle_never_reads_another() {
    let fx = Fx::new();
    fx.mem().put_external("gone", &pattern(8 << 20, 3));
    let fh = fx.open_read("gone").unwrap();
    fx.mem().delete_external("gone");
    fx.mem().put_external("gone", &pattern(8 << 20, 4));
    fx.mem().delete_external("gone");
    let e = fx.pread(fh, 6 << 20, 10).unwrap_err();
    assert!(e == Errno::ESTALE || e == Errno::ENOENT, "{e:?}");
    fx.fs.run(fx.fs.do_release(fh));
    assert_eq!(fx.open_read("gone").unwrap_err(), Errno::ENOENT);
}

// [S-OPEN-FRESH]: open asks for the current version; the requests are the store's count.
#[test]
fn open_asks_head_once_and_a_sequential_read_costs_one_get_per_part() {
    let fx = Fx::new();
    fx.mem().put_external("big", &pattern(20 << 20, 5));
    let a = fx.resolve("big").unwrap();
    let (heads, gets) = (fx.mem().requests(Op::Head), fx.mem().requests(Op::Get));
    let fh = fx.fs.serve(
        "open",
        fx.fs
            .do_open(a.ino.0, fuser::OpenFlags(libc::O_RDONLY), 1, None),
    );
    let fh = match fh.unwrap() {
        super::super::Opened::Plain(fh, _) => fh,
        _ => unreachable!("no disk cache here"),
    };
    // The lookup just asked (within 100 ms): open uses that answer.
    assert!(fx.mem().requests(Op::Head) - heads <= 1);
    let mut off = 0;
    while off < 20 << 20 {
        let n = fx.pread(fh, off, 128 << 10).unwrap().len() as u64;
        assert_eq!(n, 128 << 10);
        off += n;
    }
    fx.fs.run(fx.fs.do_release(fh));
    // 20 MiB in 5 MiB parts: 4 GETs, whatever the read size [S-READ-RANGED].
    assert_eq!(fx.mem().requests(Op::Get) - gets, 4);
}

// [S-WRITE-SIZES] [S-WRITE-MULTIPART]
#[test]
fn small_files_are_one_put_and_larger_ones_a_multipart_upload() {
    let fx = Fx::new();
    fx.write("small", &pattern(5 << 20, 6)).unwrap();
    assert_eq!(fx.mem().requests(Op::Put), 1);
    assert_eq!(fx.mem().requests(Op::CreateMultipart), 0);
    let big = pattern((11 << 20) + 1, 7);
    fx.write_chunked("big", &big, 4096).unwrap();
    assert_eq!(fx.mem().requests(Op::CreateMultipart), 1);
    assert_eq!(fx.mem().requests(Op::UploadPart), 3);
    assert_eq!(fx.mem().data("big").unwrap(), big);
    assert_eq!(fx.mem().data("small").unwrap(), pattern(5 << 20, 6));
    assert!(fx.mem().info("big").unwrap().etag.ends_with("-3\""));
    assert!(fx.mem().pending_uploads().is_empty());
    // Visible at once, with its size.
    assert_eq!(fx.stat("big").unwrap().size, big.len() as u64);
}

// [S-WRITE-ALL-OR-NOTHING]
#[test]
fn a_failed_part_fails_close_stores_nothing_and_aborts_the_upload() {
    let fx = Fx::new();
    fx.mem().put_external("keep", b"old bytes");
    fx.store
        .fail_nth(Op::UploadPart, 2, S3ErrorKind::ServerError);
    let e = fx.write("keep", &pattern(16 << 20, 8)).unwrap_err();
    assert_eq!(e, Errno::EIO);
    assert_eq!(fx.mem().data("keep").unwrap(), b"old bytes");
    assert!(fx.no_uploads_left());
    assert_eq!(fx.mem().requests(Op::AbortMultipart), 1);
    // A failed single PUT: nothing is stored.
    fx.store.fail(Op::Put, S3ErrorKind::AccessDenied, 1);
    assert_eq!(fx.write("new", b"x").unwrap_err(), Errno::EACCES);
    assert!(!fx.exists("new"));
}

// [S-WRITE-ALL-OR-NOTHING] [S-FAULT-OUTAGE]
#[test]
fn a_failed_completion_aborts_and_keeps_the_old_object() {
    let fx = Fx::new();
    fx.mem().put_external("f", b"v1");
    fx.store
        .fail(Op::CompleteMultipart, S3ErrorKind::ServerError, 1);
    assert_eq!(fx.write("f", &pattern(6 << 20, 9)).unwrap_err(), Errno::EIO);
    assert_eq!(fx.mem().data("f").unwrap(), b"v1");
    assert!(fx.no_uploads_left());
}

// [S-WRITE-EXCL] [S-WRITE-OVERWRITE]
#[test]
fn commits_are_conditional_on_what_was_seen_at_open() {
    let fx = Fx::new();
    // A new file, created meanwhile by another client: theirs stays, close fails EEXIST.
    let fh = fx.create_or_truncate("n").unwrap();
    fx.fs
        .serve("write", fx.fs.do_write(fh, 0, b"mine"))
        .unwrap();
    fx.mem().put_external("n", b"theirs");
    assert_eq!(fx.close(fh).unwrap_err(), Errno::EEXIST);
    assert_eq!(fx.mem().data("n").unwrap(), b"theirs");
    // An overwrite of a version replaced meanwhile: theirs stays, close fails ESTALE.
    let fh = fx.create_or_truncate("n").unwrap();
    fx.fs
        .serve("write", fx.fs.do_write(fh, 0, b"mine again"))
        .unwrap();
    fx.mem().put_external("n", b"theirs 2");
    assert_eq!(fx.close(fh).unwrap_err(), Errno::ESTALE);
    assert_eq!(fx.mem().data("n").unwrap(), b"theirs 2");
    // Unchanged meanwhile: stored, and visible through the mount at once.
    fx.write("n", b"mine at last").unwrap();
    assert_eq!(fx.read("n").unwrap(), b"mine at last");
}

// [S-WRITE-SEQUENTIAL]
#[test]
fn a_seek_back_fails_with_einval_and_stores_nothing() {
    let fx = Fx::new();
    // Within the part being filled: done in place.
    let fh = fx.create_or_truncate("h").unwrap();
    fx.fs
        .serve("write", fx.fs.do_write(fh, 0, b"hello"))
        .unwrap();
    fx.fs.serve("write", fx.fs.do_write(fh, 0, b"H")).unwrap();
    fx.close(fh).unwrap();
    assert_eq!(fx.store.inner().data("h").unwrap(), b"Hello");
    // Into a part already sent (this mount cannot stage): refused, nothing stored.
    let fh = fx.create_or_truncate("s").unwrap();
    fx.fs
        .serve("write", fx.fs.do_write(fh, 0, &vec![7u8; BLOCK + 1]))
        .unwrap();
    assert_eq!(
        fx.fs
            .serve("write", fx.fs.do_write(fh, 0, b"H"))
            .unwrap_err(),
        Errno::EINVAL
    );
    assert_eq!(fx.close(fh).unwrap_err(), Errno::EINVAL);
    assert!(!fx.exists("s"));
}

// [S-WRITE-WHILE-WRITING]
#[test]
fn a_file_being_written_shows_its_size_and_refuses_other_opens() {
    let fx = Fx::new();
    let fh = fx.create_or_truncate("w").unwrap();
    fx.fs
        .serve("write", fx.fs.do_write(fh, 0, &[7; 1000]))
        .unwrap();
    assert_eq!(fx.stat("w").unwrap().size, 1000);
    assert_eq!(fx.ls("").unwrap(), ["w"]);
    assert_eq!(fx.open_read("w").unwrap_err(), Errno::EBUSY);
    assert!(!fx.exists("w"));
    fx.close(fh).unwrap();
    assert_eq!(fx.mem().data("w").unwrap(), vec![7; 1000]);
}

// [S-NS-UNLINK]
#[test]
fn a_file_unlinked_while_written_stores_nothing() {
    let fx = Fx::new();
    // tar's placeholder of a link: created, closed (its empty object waits for the release),
    // removed.
    let fh = fx.create_or_truncate("placeholder").unwrap();
    fx.fs
        .serve("flush", fx.fs.do_flush(fh, std::process::id()))
        .unwrap();
    fx.unlink("placeholder").unwrap();
    assert_eq!(fx.stat("placeholder").unwrap_err(), Errno::ENOENT);
    fx.fs.run(fx.fs.do_release(fh));
    assert!(!fx.exists("placeholder"));
    // A file written in parts, removed before its close: the upload is aborted; an older
    // version it was replacing goes with the name.
    fx.mem().put_external("big", b"old");
    let fh = fx.create_or_truncate("big").unwrap();
    fx.fs
        .serve("write", fx.fs.do_write(fh, 0, &vec![1; super::BLOCK + 10]))
        .unwrap();
    fx.unlink("big").unwrap();
    assert_eq!(fx.ls("").unwrap(), Vec::<String>::new());
    fx.fs
        .serve(
            "write",
            fx.fs.do_write(fh, (super::BLOCK + 10) as u64, b"more"),
        )
        .unwrap();
    fx.fs.serve("fsync", fx.fs.do_fsync(fh)).unwrap();
    fx.close(fh).unwrap();
    assert!(!fx.exists("big"));
    assert!(fx.no_uploads_left());
}

// [S-NS-RENAME]
#[test]
fn rename_is_a_conditional_copy_then_a_delete() {
    let fx = Fx::new();
    fx.mem().put_external("d/src", b"payload");
    fx.mem().put_external("d/dst", b"replaced");
    fx.rename("d/src", "d/dst").unwrap();
    assert_eq!(fx.mem().data("d/dst").unwrap(), b"payload");
    assert!(!fx.exists("d/src"));
    assert_eq!(fx.mem().requests(Op::Copy), 1);
    assert_eq!(fx.mem().requests(Op::Delete), 1);
    // A source changed since it was looked up: ESTALE, nothing copied.
    fx.mem().put_external("a", b"1");
    fx.resolve("a").unwrap();
    fx.store.inject(
        Some(Op::Copy),
        Fault::Error(S3ErrorKind::PreconditionFailed),
        1,
        1,
    );
    assert_eq!(fx.rename("a", "b").unwrap_err(), Errno::ESTALE);
    assert!(!fx.exists("b"));
    // Directories are renamed too: see `tree.rs`.
}

// [S-NS-RENAME] rsync's way: a staged file stored, its mode changed, renamed to its name.
// The rename copies the attributes the file stored, not a HEAD's, which SeaweedFS may answer
// with older ones under the same ETag right after an attribute change.
#[test]
fn a_staged_file_renamed_keeps_the_attributes_it_stored() {
    let fx = Fx::new();
    let fh = fx.open_with(".f.tmp", libc::O_RDWR).unwrap();
    fx.fs
        .serve("write", fx.fs.do_write(fh, 0, b"data"))
        .unwrap();
    fx.fs.serve("fsync", fx.fs.do_fsync(fh)).unwrap();
    let mode = SetAttr {
        mode: Some(0o751),
        ..SetAttr::default()
    };
    fx.setattr(".f.tmp", mode).unwrap();
    fx.fs.serve("fsync", fx.fs.do_fsync(fh)).unwrap();
    let stored = fx.mem().info(".f.tmp").expect("stored").meta;
    assert_eq!(stored.as_ref().and_then(|m| m.mode), Some(0o751));
    assert!(fx.mem().stale_meta_external(".f.tmp", Default::default()));
    // Renamed while still open (the kernel sends RELEASE after the close returns).
    fx.rename(".f.tmp", "f").unwrap();
    fx.close(fh).unwrap();
    let meta = fx.mem().info("f").expect("renamed").meta;
    assert_eq!(meta.and_then(|m| m.mode), Some(0o751));
    assert_eq!(fx.mem().data("f").unwrap(), b"data");
}

// [S-NS-RENAME]
#[test]
fn a_renames_delete_runs_in_the_background_and_the_old_name_waits_for_it() {
    let fx = Fx::new();
    fx.mem().put_external("d/src", b"payload");
    fx.mem().put_external("d/other", b"x");
    fx.resolve("d/src").unwrap();
    // The source's delete takes a second: the rename returns without it.
    fx.store
        .inject(Some(Op::Delete), Fault::Stall(Duration::from_secs(1)), 1, 1);
    fx.rename("d/src", "d/dst").unwrap();
    assert!(
        fx.store.inner().info("d/src").is_some(),
        "the rename waited for its delete"
    );
    // This mount does not show the old name meanwhile: a listing or a lookup of it waits.
    assert_eq!(fx.ls("d").unwrap(), ["dst", "other"]);
    assert_eq!(fx.stat("d/src").unwrap_err(), Errno::ENOENT);
    // A file made under the old name right after is stored after the delete, not deleted by it.
    fx.store.inject(
        Some(Op::Delete),
        Fault::Stall(Duration::from_millis(300)),
        1,
        1,
    );
    fx.rename("d/dst", "d/src").unwrap();
    fx.write("d/dst", b"again").unwrap();
    assert_eq!(fx.mem().data("d/dst").unwrap(), b"again");
    assert_eq!(fx.mem().data("d/src").unwrap(), b"payload");
    let stats = fx.fs.stats_text();
    assert!(stats.contains("rename_deletes 2\n"), "{stats}");
    assert!(stats.contains("rename_deletes_running 0\n"), "{stats}");
    // A delete that fails leaves both names on the server, counted (the rename had returned).
    fx.store.fail(Op::Delete, S3ErrorKind::ServerError, 1);
    fx.rename("d/other", "d/moved").unwrap();
    assert_eq!(fx.mem().data("d/moved").unwrap(), b"x");
    assert!(fx.exists("d/other"));
    let stats = fx.fs.stats_text();
    assert!(stats.contains("rename_deletes_failed 1\n"), "{stats}");
}

// [S-NS-UNLINK] [S-NS-MKDIR]
#[test]
fn unlink_mkdir_and_rmdir() {
    let fx = Fx::new();
    fx.mem().put_external("dir/f", b"x");
    assert_eq!(fx.rmdir("dir").unwrap_err(), Errno::ENOTEMPTY);
    fx.unlink("dir/f").unwrap();
    assert!(!fx.exists("dir/f"));
    assert_eq!(fx.stat("dir").unwrap_err(), Errno::ENOENT);
    fx.mkdir("made").unwrap();
    assert_eq!(fx.mkdir("made").unwrap_err(), Errno::EEXIST);
    fx.mkdir("made/sub").unwrap();
    assert_eq!(fx.ls("made").unwrap(), ["sub"]);
    assert_eq!(fx.rmdir("made").unwrap_err(), Errno::ENOTEMPTY);
    fx.rmdir("made/sub").unwrap();
    fx.rmdir("made").unwrap();
    assert_eq!(fx.ls("").unwrap(), Vec::<String>::new());
    // Without --dir-markers a directory made here costs no request and is gone at remount.
    assert_eq!(fx.mem().requests(Op::Put), 0);
    fx.mkdir("kept-only-here").unwrap();
    let fx = fx.remount();
    assert_eq!(fx.stat("kept-only-here").unwrap_err(), Errno::ENOENT);
    // With markers it survives.
    let mut cfg = strict_config();
    cfg.dir_markers = true;
    let fx = super::Fx::over(fx.store.clone(), cfg);
    fx.mkdir("marked").unwrap();
    assert!(fx.exists("marked/"));
    let fx = fx.remount();
    assert_eq!(fx.stat("marked").unwrap().kind, FileType::Directory);
    fx.rmdir("marked").unwrap();
    assert!(!fx.exists("marked/"));
}

// [S-NS-SETATTR]
#[test]
fn chmod_and_utimes_are_stored_as_metadata_by_a_copy_onto_itself() {
    let fx = Fx::new();
    fx.mem().put_external("f", b"data");
    let mtime = UNIX_EPOCH + Duration::new(1_500_000_000, 250_000_000);
    let attr = fx
        .setattr(
            "f",
            SetAttr {
                mode: Some(0o100600),
                mtime: Some(mtime),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(attr.perm, 0o600);
    assert_eq!(attr.mtime, mtime);
    // Written back a moment later (here: by the end of the mount).
    assert_eq!(fx.mem().requests(Op::Copy), 0);
    assert_eq!(fx.fs.run(fx.fs.store_pending_attrs()), 0);
    assert_eq!(fx.mem().requests(Op::Copy), 1);
    let info = fx.mem().info("f").unwrap();
    assert_eq!(info.meta.as_ref().and_then(|m| m.mode), Some(0o600));
    assert_eq!(fx.mem().data("f").unwrap(), b"data");
    let fx = fx.remount();
    let attr = fx.stat("f").unwrap();
    assert_eq!((attr.perm, attr.mtime), (0o600, mtime));
    // Truncate to 0 keeps the attributes; to another size too (the file is staged for it).
    fx.setattr(
        "f",
        SetAttr {
            size: Some(0),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(fx.mem().data("f").unwrap(), b"");
    assert_eq!(fx.stat("f").unwrap().perm, 0o600);
    fx.setattr(
        "f",
        SetAttr {
            size: Some(5),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(fx.mem().data("f").unwrap(), vec![0u8; 5]);
    assert_eq!(fx.stat("f").unwrap().perm, 0o600);
}

// [S-NS-INODES]
#[test]
fn inode_numbers_are_stable_while_a_name_keeps_its_kind() {
    let fx = Fx::new();
    fx.mem().put_external("p", b"1");
    let first = fx.stat("p").unwrap().ino;
    fx.mem().put_external("p", b"22");
    assert_eq!(fx.stat("p").unwrap().ino, first);
    assert_eq!(fx.stat("").unwrap().ino.0, 1);
    fx.mem().delete_external("p");
    fx.mem().put_external("p/child", b"c");
    let dir = fx.stat("p").unwrap();
    assert_eq!(dir.kind, FileType::Directory);
    assert_ne!(dir.ino, first);
}

// [S-FAULT-READ]
#[test]
fn an_outage_fails_reads_with_an_errno_and_they_work_again_after_it() {
    let fx = Fx::new();
    let data = pattern(6 << 20, 10);
    fx.mem().put_external("r", &data);
    fx.store.outage(u64::MAX);
    let e = fx.read("r").unwrap_err();
    assert_eq!(e, Errno::EIO);
    // Counted once, in `s3rdma stats`.
    assert!(
        fx.fs.stats_text().contains("failed_eio 1\n"),
        "{}",
        fx.fs.stats_text()
    );
    fx.store.clear();
    assert_eq!(fx.read("r").unwrap(), data);
    // A short transfer is never taken as data.
    fx.store.inject(Some(Op::Get), Fault::Short, 1, 1);
    let fh = fx.open_read("r").unwrap();
    let got = fx.pread(fh, 5 << 20, 4096);
    fx.fs.run(fx.fs.do_release(fh));
    if let Ok(bytes) = got {
        assert_eq!(bytes, data[5 << 20..(5 << 20) + 4096]);
    }
}

fn chmod(mode: u32) -> SetAttr {
    SetAttr {
        mode: Some(mode),
        ..Default::default()
    }
}

fn touch(secs: u64) -> SetAttr {
    SetAttr {
        mtime: Some(UNIX_EPOCH + Duration::from_secs(secs)),
        ..Default::default()
    }
}

/// A mount that trusts what it learnt for a minute (as the defaults do, for a second).
fn trusting() -> Fx {
    let mut cfg = strict_config();
    cfg.metadata_ttl = Duration::from_secs(60);
    cfg.negative_ttl = Duration::from_secs(60);
    Fx::with_config(cfg)
}

// [S-NS-SETATTR] [S-NS-ATTR-WRITEBACK]
#[test]
fn attribute_changes_are_written_back_once_from_what_the_mount_stored() {
    let fx = trusting();
    fx.write("f", b"mine").unwrap();
    // Right after this mount's own write: no HeadObject; three changes, one copy, by itself
    // a second after the first.
    let heads = fx.store.requests(Op::Head);
    fx.setattr("f", touch(1_000)).unwrap();
    fx.setattr("f", chmod(0o600)).unwrap();
    let a = fx
        .setattr(
            "f",
            SetAttr {
                uid: Some(4242),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((a.perm, a.uid), (0o600, 4242), "stat shows them at once");
    assert_eq!(fx.store.requests(Op::Head), heads);
    assert_eq!(fx.mem().requests(Op::Copy), 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while fx.mem().requests(Op::Copy) == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(fx.mem().requests(Op::Copy), 1);
    let meta = fx.mem().info("f").unwrap().meta.unwrap();
    assert_eq!(
        (meta.mode, meta.uid, meta.mtime),
        (
            Some(0o600),
            Some(4242),
            Some(UNIX_EPOCH + Duration::from_secs(1_000))
        )
    );
    assert_eq!(fx.mem().data("f").unwrap(), b"mine");
    // Replaced by another client before the write-back: the newer version keeps its own.
    fx.setattr("f", chmod(0o640)).unwrap();
    fx.mem().put_external("f", b"theirs");
    assert_eq!(fx.fs.run(fx.fs.store_pending_attrs()), 0);
    assert_eq!(fx.mem().data("f").unwrap(), b"theirs");
    assert_eq!(fx.mem().info("f").unwrap().meta.and_then(|m| m.mode), None);
    assert!(fx.fs.stats_text().contains("attr_writebacks_dropped 1\n"));
}

// [S-NS-ATTR-WRITEBACK]
#[test]
fn fsync_and_opens_for_writing_write_attributes_back_first_and_unlink_drops_them() {
    let fx = trusting();
    fx.write("f", b"data").unwrap();
    fx.setattr("f", chmod(0o600)).unwrap();
    let fh = fx.open_read("f").unwrap();
    // A failed write-back is fsync's error, and counted.
    fx.store.fail(Op::Copy, S3ErrorKind::AccessDenied, 1);
    assert!(fx.fs.serve("fsync", fx.fs.do_fsync(fh)).is_err());
    assert!(fx.fs.stats_text().contains("attr_writebacks_failed 1\n"));
    fx.setattr("f", chmod(0o600)).unwrap();
    fx.fs.serve("fsync", fx.fs.do_fsync(fh)).unwrap();
    fx.fs.run(fx.fs.do_release(fh));
    assert_eq!(fx.mem().info("f").unwrap().meta.unwrap().mode, Some(0o600));
    // An append stores the mode set before it with the new version.
    fx.setattr("f", chmod(0o604)).unwrap();
    fx.append("f", b"+").unwrap();
    let info = fx.mem().info("f").unwrap();
    assert_eq!(fx.mem().data("f").unwrap(), b"data+");
    assert_eq!(info.meta.unwrap().mode, Some(0o604));
    // Removed before its write-back: no copy.
    let copies = fx.mem().requests(Op::Copy);
    fx.setattr("f", chmod(0o611)).unwrap();
    fx.unlink("f").unwrap();
    assert_eq!(fx.fs.run(fx.fs.store_pending_attrs()), 0);
    assert_eq!(fx.mem().requests(Op::Copy), copies);
    assert!(!fx.exists("f"));
}

// [S-NS-ATTR-WRITEBACK]
#[test]
fn a_rename_carries_changes_made_on_the_version_it_copies_and_no_other() {
    let fx = trusting();
    fx.write("a", b"mine").unwrap();
    fx.setattr("a", chmod(0o600)).unwrap();
    fx.rename("a", "b").unwrap();
    assert_eq!(fx.mem().info("b").unwrap().meta.unwrap().mode, Some(0o600));
    assert!(fx
        .fs
        .stats_text()
        .contains("attr_changes_folded_into_renames 1\n"));
    // Replaced by another client before the rename: the rename copies their version, whose
    // attributes stay as they are, and the change made on ours is dropped (counted).
    fx.setattr("b", chmod(0o640)).unwrap();
    fx.mem().put_external("b", b"theirs");
    fx.rename("b", "c").unwrap();
    assert_eq!(fx.mem().data("c").unwrap(), b"theirs");
    assert_eq!(fx.mem().info("c").unwrap().meta.and_then(|m| m.mode), None);
    let stats = fx.fs.stats_text();
    assert!(
        stats.contains("attr_changes_folded_into_renames 1\n"),
        "{stats}"
    );
    assert!(stats.contains("attr_writebacks_dropped 1\n"), "{stats}");
    assert_eq!(fx.fs.run(fx.fs.store_pending_attrs()), 0);
    assert_eq!(fx.mem().info("c").unwrap().meta.and_then(|m| m.mode), None);
}

// [S-NS-ATTR-WRITEBACK] [S-NS-KNOWN-DIRS] [S-NS-RSYNC]
#[test]
fn rsyncs_file_costs_a_put_a_copy_and_a_delete() {
    let fx = trusting();
    fx.mkdir("d").unwrap();
    let before = |op| fx.mem().requests(op);
    let (lists, heads) = (before(Op::List), before(Op::Head));
    // rsync: lstat of the final name, create the temporary file, write, close, set its times
    // and mode, rename it into place.
    assert_eq!(fx.resolve("d/file").unwrap_err(), Errno::ENOENT);
    fx.write("d/.file.Ab12Cd", b"contents").unwrap();
    fx.setattr("d/.file.Ab12Cd", touch(1_234)).unwrap();
    fx.setattr("d/.file.Ab12Cd", chmod(0o640)).unwrap();
    fx.rename("d/.file.Ab12Cd", "d/file").unwrap();
    assert_eq!(fx.fs.run(fx.fs.store_pending_attrs()), 0);
    assert_eq!(
        (
            before(Op::List) - lists,
            before(Op::Head) - heads,
            before(Op::Put),
            before(Op::Copy),
            before(Op::Delete)
        ),
        (0, 0, 1, 1, 1),
        "requests: lists, heads, puts, copies, deletes"
    );
    let meta = fx.mem().info("d/file").unwrap().meta.unwrap();
    assert_eq!(
        (meta.mode, meta.mtime),
        (Some(0o640), Some(UNIX_EPOCH + Duration::from_secs(1_234)))
    );
    assert_eq!(fx.mem().keys(), vec!["d/file".to_string()]);
    let a = fx.remount().stat("d/file").unwrap();
    assert_eq!(
        (a.perm, a.mtime),
        (0o640, UNIX_EPOCH + Duration::from_secs(1_234))
    );
}

// [S-NS-KNOWN-DIRS]
#[test]
fn a_known_directory_answers_missing_names_until_its_ttl_then_is_listed_again() {
    let mut cfg = strict_config();
    cfg.metadata_ttl = Duration::from_millis(300);
    cfg.negative_ttl = Duration::from_millis(300);
    let fx = Fx::with_config(cfg);
    fx.mem().put_external("d/a", b"a");
    assert_eq!(fx.ls("d").unwrap(), vec!["a".to_string()]);
    let lists = fx.mem().requests(Op::List);
    assert_eq!(fx.resolve("d/x").unwrap_err(), Errno::ENOENT);
    assert_eq!(
        fx.mem().requests(Op::List),
        lists,
        "answered from the listing"
    );
    // Created elsewhere: missed until the TTL runs out, as a remembered negative answer is.
    fx.mem().put_external("d/y", b"y");
    assert_eq!(fx.resolve("d/y").unwrap_err(), Errno::ENOENT);
    std::thread::sleep(Duration::from_millis(350));
    // Expired: one listing of the directory (and one lookup of `d` itself, whose entry
    // expired too), then its missing names need nothing.
    assert_eq!(fx.resolve("d/z").unwrap_err(), Errno::ENOENT);
    assert_eq!(fx.mem().requests(Op::List), lists + 2);
    assert_eq!(fx.resolve("d/w").unwrap_err(), Errno::ENOENT);
    assert_eq!(fx.mem().requests(Op::List), lists + 2);
    assert!(fx.resolve("d/y").is_ok());
    // A name made by this mount is never hidden by what the directory held before.
    fx.write("d/new", b"n").unwrap();
    assert!(fx.resolve("d/new").is_ok());
    // A zero negative TTL asks every time.
    let fx = Fx::new();
    fx.mkdir("e").unwrap();
    let lists = fx.mem().requests(Op::List);
    assert_eq!(fx.resolve("e/x").unwrap_err(), Errno::ENOENT);
    assert!(fx.mem().requests(Op::List) > lists);
}

// [S-STAGE-SHARED]
#[test]
fn a_readers_close_does_not_store_a_staged_file_its_writers_close_does() {
    let fx = Fx::new();
    fx.write("f", b"old").unwrap();
    let w = fx.open_with("f", libc::O_RDWR).unwrap();
    fx.fs.serve("write", fx.fs.do_write(w, 0, b"NEW")).unwrap();
    let r = fx.open_read("f").unwrap();
    assert_eq!(
        fx.pread(r, 0, 3).unwrap(),
        b"NEW",
        "a reader sees the writer's bytes"
    );
    fx.close(r).unwrap();
    assert_eq!(
        fx.mem().data("f").unwrap(),
        b"old",
        "not stored by the reader's close"
    );
    fx.close(w).unwrap();
    assert_eq!(fx.mem().data("f").unwrap(), b"NEW");
}

// [S-NS-FORGET]
#[test]
fn inodes_the_kernel_forgets_are_dropped_unless_the_mount_still_needs_them() {
    let mut cfg = strict_config();
    // Known directories on: a forgotten name must not turn into "absent".
    cfg.negative_ttl = Duration::from_secs(60);
    let fx = Fx::with_config(cfg);
    fx.mem().put_external("d/a", b"1");
    fx.mem().put_external("d/b", b"2");
    let a = fx.stat("d/a").unwrap();
    assert_eq!(fx.ls("d").unwrap(), ["a", "b"]);
    let before = fx.fs.ns.inodes.len();
    // The kernel forgets a (however many entries it had): it goes, d stays (held).
    fx.fs.do_forget(a.ino.0, 1000);
    assert_eq!(fx.fs.ns.inodes.len(), before - 1);
    assert_eq!(
        fx.fs
            .serve("getattr", fx.fs.do_getattr(a.ino.0))
            .unwrap_err(),
        Errno::ENOENT
    );
    // Looked up again: works, under a new number.
    let a2 = fx.stat("d/a").unwrap();
    assert_ne!(a2.ino, a.ino);
    assert_eq!(fx.read("d/a").unwrap(), b"1");

    // A file being written is kept while it is, even if forgotten; then it goes.
    let fh = fx.create_or_truncate("d/w").unwrap();
    let w = fx.stat("d/w").unwrap();
    fx.fs.do_forget(w.ino.0, 1000);
    assert!(fx.fs.ns.inodes.get(w.ino.0).is_some());
    assert_eq!(fx.fs.ns.inodes.deferred(), 1);
    fx.fs
        .serve("write", fx.fs.do_write(fh, 0, b"written"))
        .unwrap();
    fx.close(fh).unwrap();
    fx.fs.retry_pinned_now();
    assert_eq!(fx.fs.ns.inodes.deferred(), 0);
    assert!(fx.fs.ns.inodes.get(w.ino.0).is_none());
    // d lists what it listed before: the forgotten name made here is asked about, not
    // answered "absent" from d's known names.
    assert_eq!(fx.read("d/w").unwrap(), b"written");

    // A directory made here (in this mount only) is never dropped.
    fx.mkdir("m").unwrap();
    let m = fx.stat("m").unwrap();
    fx.fs.do_forget(m.ino.0, 1000);
    assert_eq!(fx.stat("m").unwrap().ino, m.ino);

    // Everything forgotten: only what is pinned is left, and the counters say so.
    let w2 = fx.stat("d/w").unwrap().ino.0;
    for ino in [fx.stat("d").unwrap().ino.0, a2.ino.0, w2, m.ino.0] {
        fx.fs.do_forget(ino, 1000);
    }
    let stats = fx.fs.stats_text();
    let get = |k: &str| -> u64 {
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{k} ")))
            .and_then(|v| v.parse().ok())
            .unwrap_or(u64::MAX)
    };
    // The root and m.
    assert_eq!(get("inodes"), 2, "{stats}");
    assert!(get("inodes_dropped") >= 5, "{stats}");
}

// [S-NS-FORGET]
#[test]
fn only_entries_handed_to_the_kernel_are_counted_so_exact_forgets_drop_them() {
    // The kernel forgets exactly as many lookups as it was handed: the mount's own lookups
    // (unlink, rmdir, rename of source and target) must not count, or what they touched (and
    // every directory above it) would stay for the life of the mount.
    let fx = Fx::with_config(strict_config());
    for k in ["d/a", "d/b", "d/c"] {
        fx.mem().put_external(k, b"1");
    }
    let root_only = fx.fs.ns.inodes.len();
    let look = |parent: u64, name: &str| {
        fx.fs
            .serve("lookup", fx.fs.do_lookup(parent, OsStr::new(name)))
            .unwrap()
            .ino
            .0
    };
    let d = look(ROOT_INO, "d");
    let (a, b, c) = (look(d, "a"), look(d, "b"), look(d, "c"));
    let e = fx
        .fs
        .serve("mkdir", fx.fs.do_mkdir(d, OsStr::new("e"), 0o755))
        .unwrap()
        .ino
        .0;
    fx.fs
        .serve(
            "rename",
            fx.fs
                .do_rename(d, OsStr::new("a"), d, OsStr::new("b"), RenameFlags::empty()),
        )
        .unwrap();
    fx.fs
        .serve("unlink", fx.fs.do_unlink(d, OsStr::new("c")))
        .unwrap();
    fx.fs
        .serve("rmdir", fx.fs.do_rmdir(d, OsStr::new("e")))
        .unwrap();
    for ino in [a, b, c, e, d] {
        fx.fs.do_forget(ino, 1);
    }
    fx.fs.retry_pinned_now();
    assert_eq!(fx.fs.ns.inodes.len(), root_only, "{}", fx.fs.stats_text());
}

// [S-NS-ATTR-WRITEBACK]
#[test]
fn a_pending_change_shows_through_a_new_inode_of_the_same_key() {
    let fx = Fx::new();
    fx.write("x", b"").unwrap();
    let t = UNIX_EPOCH + Duration::from_secs(1_000);
    fx.setattr("x", touch(1_000)).unwrap();
    // Another client's key makes "x" a directory for a moment: the file's inode goes.
    fx.mem().put_external("x/y", b"y");
    assert_eq!(fx.ls("").unwrap(), ["x"]);
    assert_eq!(fx.stat("x").unwrap().kind, FileType::Directory);
    fx.mem().delete_external("x/y");
    // The file again, under a new inode: its pending mtime shows before it is written back.
    let a = fx.stat("x").unwrap();
    assert_eq!((a.kind, a.mtime), (FileType::RegularFile, t));
}

// [S-WRITE-OVERWRITE]
#[test]
fn a_rewrite_of_an_object_another_client_deleted_fails_with_estale() {
    let fx = Fx::new();
    fx.mem().put_external("x", b"old");
    let fh = fx.create_or_truncate("x").unwrap();
    fx.fs.serve("write", fx.fs.do_write(fh, 0, b"new")).unwrap();
    fx.mem().delete_external("x");
    assert_eq!(
        fx.fs.serve("fsync", fx.fs.do_fsync(fh)).unwrap_err(),
        Errno::ESTALE
    );
    fx.fs.run(fx.fs.do_release(fh));
    assert!(!fx.exists("x"));
}
