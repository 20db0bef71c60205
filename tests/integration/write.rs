//! Writing through the mount: files are uploaded while written and stored on close, all or
//! nothing, checked through the mount and directly on the server.

use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::common::*;

const PART: usize = 5 << 20;
/// Small parts, so that a few MiB make a multipart upload.
const SMALL_PARTS: [&str; 2] = ["--write-part-size", "5MiB"];

fn mount_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = SMALL_PARTS.to_vec();
    v.extend_from_slice(extra);
    v
}

/// Write `data` in `chunk`-sized writes and close, returning the first error (of a write or of
/// `close` itself, which std's File drop would ignore).
fn write_and_close(path: &Path, data: &[u8], chunk: usize) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    for c in data.chunks(chunk.max(1)) {
        f.write_all(c)?;
    }
    close_file(f)
}

fn errno_of(r: std::io::Result<()>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

fn sha_of_file(path: &Path) -> Vec<u8> {
    let mut f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 4 << 20];
    loop {
        let n = f.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    h.finalize().to_vec()
}

fn sha_of_object(bucket: &str, key: &str) -> Vec<u8> {
    let c = client();
    rt().block_on(async {
        let out = c
            .get_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
            .expect("GET");
        let mut body = out.body;
        let mut h = Sha256::new();
        while let Some(chunk) = body.next().await {
            h.update(chunk.expect("body"));
        }
        h.finalize().to_vec()
    })
}

// [S-WRITE-MULTIPART]
#[test]
fn cp_of_a_1_gib_file_reads_back_the_same_through_the_mount_and_from_the_server() {
    let b = bucket("cp1g");
    let src = work_dir().join(format!("src-1g-{}", std::process::id()));
    {
        let mut f = std::fs::File::create(&src).unwrap();
        for i in 0..64 {
            f.write_all(&pattern(16 << 20, 1000 + i)).unwrap();
        }
    }
    let m = Mount::new(&b, &[]);
    let st = std::process::Command::new("cp")
        .arg(&src)
        .arg(m.join("big.bin"))
        .status()
        .unwrap();
    assert!(st.success(), "cp failed");
    assert_eq!(
        std::fs::metadata(m.join("big.bin")).unwrap().len(),
        1 << 30,
        "stat right after close"
    );
    let st = std::process::Command::new("cmp")
        .arg(&src)
        .arg(m.join("big.bin"))
        .status()
        .unwrap();
    assert!(st.success(), "cmp through the mount");
    let want = sha_of_file(&src);
    assert_eq!(sha_of_object(&b, "big.bin"), want, "bytes on the server");
    let _ = std::fs::remove_file(&src);
    let parts = m.count_requests("UploadPart");
    assert!(
        parts >= 64,
        "1 GiB in 16 MiB parts uploaded while written: {parts} parts"
    );
    assert_eq!(m.count_requests("CompleteMultipartUpload"), 1);
    assert_eq!(open_uploads(&b), 0);
}

// [S-WRITE-SIZES]
#[test]
fn files_of_0_1_one_part_and_one_part_plus_one_bytes() {
    let b = bucket("sizes");
    // rdma=off: each PUT is one request to count (RDMA would try first and fall back).
    let m = Mount::new(&b, &mount_args(&["--rdma", "off"]));
    let cases = [
        ("zero", 0usize),
        ("one", 1),
        ("part", PART),
        ("part1", PART + 1),
        ("parts3", 3 * PART - 7),
    ];
    for (name, len) in cases {
        let data = pattern(len, len as u64);
        write_and_close(&m.join(name), &data, 128 << 10).unwrap_or_else(|e| panic!("{name}: {e}"));
        if len == 0 {
            // Stored at the last release, which the kernel sends just after close returns.
            wait_for_object(&b, name);
        }
        assert_eq!(
            backend_get(&b, name).as_deref(),
            Some(&data[..]),
            "{name} on the server"
        );
        assert_eq!(
            std::fs::read(m.join(name)).unwrap(),
            data,
            "{name} through the mount"
        );
        assert_eq!(std::fs::metadata(m.join(name)).unwrap().len(), len as u64);
    }
    // Up to one part: one PutObject each; above: multipart.
    assert_eq!(m.count_requests("PutObject"), 3);
    assert_eq!(m.count_requests("CreateMultipartUpload"), 2);
    assert_eq!(m.count_requests("CompleteMultipartUpload"), 2);
    assert_eq!(open_uploads(&b), 0);
}

// [S-WRITE-DD]
#[test]
fn dd_with_block_sizes_from_4_kib_to_4_mib() {
    let b = bucket("dd");
    let src = work_dir().join(format!("src-dd-{}", std::process::id()));
    let data = pattern(23 << 20, 7);
    std::fs::write(&src, &data).unwrap();
    let m = Mount::new(&b, &mount_args(&[]));
    for bs in ["4K", "64K", "1M", "4M"] {
        let out = std::process::Command::new("dd")
            .arg(format!("if={}", src.display()))
            .arg(format!("of={}", m.join(&format!("dd{bs}")).display()))
            .arg(format!("bs={bs}"))
            .arg("status=none")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "dd bs={bs}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            backend_get(&b, &format!("dd{bs}")).unwrap() == data,
            "dd bs={bs}"
        );
    }
    let _ = std::fs::remove_file(&src);
}

// [S-WRITE-CONCURRENT]
#[test]
fn many_concurrent_writers_of_different_files() {
    let b = bucket("conc");
    let m = Mount::new(&b, &mount_args(&[]));
    let threads: Vec<_> = (0..12u64)
        .map(|i| {
            let path = m.join(&format!("w{i}"));
            std::thread::spawn(move || {
                let data = pattern(7 << 20 | (i as usize * 4097), 300 + i);
                write_and_close(&path, &data, 256 << 10).expect("write");
                data
            })
        })
        .collect();
    for (i, t) in threads.into_iter().enumerate() {
        let data = t.join().unwrap();
        assert!(backend_get(&b, &format!("w{i}")).unwrap() == data, "w{i}");
    }
    assert_eq!(open_uploads(&b), 0);
}

// [S-WRITE-BACKPRESSURE]
#[test]
fn writers_wait_for_uploads_when_the_write_buffers_are_full_and_complete() {
    let b = bucket("press");
    let ep = RdmaEndpoint::start();
    // Slow parts, two part buffers, one upload at a time: writers must wait for uploads.
    std::fs::write(&ep.fault_file, "delay:200 op=UploadPart\n").unwrap();
    let m = Mount::new_at(
        &ep.url,
        &b,
        &mount_args(&[
            "--write-buffer-size",
            "10MiB",
            "--upload-concurrency",
            "1",
            "--rdma",
            "off",
        ]),
    );
    let threads: Vec<_> = (0..3u64)
        .map(|i| {
            let path = m.join(&format!("p{i}"));
            std::thread::spawn(move || {
                let data = pattern(21 << 20, 400 + i);
                write_and_close(&path, &data, 1 << 20).expect("write");
                data
            })
        })
        .collect();
    let datas: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    for (i, data) in datas.iter().enumerate() {
        assert!(
            backend_get(&b, &format!("p{i}")).as_ref() == Some(data),
            "p{i}"
        );
    }
    let log = m.stop();
    assert!(unmount_counter(&log, "write_waits") > 0, "writers waited");
    assert_eq!(unmount_counter(&log, "parts_in_flight"), 0);
    assert_eq!(open_uploads(&b), 0);
}

// [S-WRITE-ALL-OR-NOTHING]
#[test]
fn a_failed_part_fails_close_and_leaves_no_object_and_no_upload() {
    let b = bucket("fail");
    let ep = RdmaEndpoint::start();
    let m = Mount::new_at(&ep.url, &b, &mount_args(&["--max-attempts", "2"]));
    // An HTTP 500 on the third part and on every retry of it.
    std::fs::write(&ep.fault_file, "error 1000 op=UploadPart after=2\n").unwrap();
    let data = pattern(6 * PART, 9);
    let r = write_and_close(&m.join("f500"), &data, 1 << 20);
    assert_eq!(
        errno_of(r),
        Some(libc::EIO),
        "write or close fails with EIO"
    );
    assert_eq!(backend_get(&b, "f500"), None, "no object");
    assert_eq!(open_uploads(&b), 0, "no orphan upload");
    assert!(
        m.log_text()
            .contains("write failed; nothing was stored under the key")
            && m.log_text().contains("key=f500"),
        "logged with the key"
    );
    // A dropped RDMA transfer on the second part (over loopback RDMA).
    std::fs::write(&ep.fault_file, "drop 1000 op=UploadPart after=1\n").unwrap();
    let r = write_and_close(&m.join("fdrop"), &data, 1 << 20);
    assert_eq!(errno_of(r), Some(libc::EIO));
    assert_eq!(backend_get(&b, "fdrop"), None);
    // The completion itself fails.
    std::fs::write(&ep.fault_file, "error 1000 op=CompleteMultipartUpload\n").unwrap();
    let r = write_and_close(&m.join("fcomplete"), &data, 1 << 20);
    assert_eq!(errno_of(r), Some(libc::EIO));
    assert_eq!(backend_get(&b, "fcomplete"), None);
    // A small file's single PUT fails: the error is close's.
    std::fs::write(&ep.fault_file, "error 1000 op=PutObject\n").unwrap();
    let mut f = std::fs::File::create(m.join("fsmall")).unwrap();
    f.write_all(b"small").expect("buffered write succeeds");
    assert_eq!(errno_of(close_file(f)), Some(libc::EIO), "close reports it");
    assert_eq!(backend_get(&b, "fsmall"), None);
    assert_eq!(open_uploads(&b), 0, "no orphan upload");
    // The failed names do not linger in the mount.
    std::fs::write(&ep.fault_file, "none\n").unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    for n in ["f500", "fdrop", "fcomplete", "fsmall"] {
        assert!(!m.join(n).exists(), "{n} still shown");
    }
    // And the mount still writes, over loopback RDMA.
    write_and_close(&m.join("ok"), &data, 1 << 20).unwrap();
    assert!(backend_get(&b, "ok").unwrap() == data);
    let log = m.stop();
    assert!(unmount_counter(&log, "rdma_bytes_written") >= data.len() as u64);
    assert!(unmount_counter(&log, "uploads_failed") >= 4);
}

// [S-WRITE-SEQUENTIAL]
#[test]
fn a_write_that_seeks_back_fails_and_stores_nothing() {
    use std::os::unix::fs::FileExt;
    let b = bucket("seek");
    let m = Mount::new(&b, &mount_args(&[]));
    let f = std::fs::File::create(m.join("s")).unwrap();
    f.write_all_at(&pattern(PART + 10, 1), 0).unwrap();
    let e = f.write_at(b"header", 0).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    assert_eq!(
        errno_of(close_file(f)),
        Some(libc::EINVAL),
        "close repeats the error"
    );
    assert_eq!(backend_get(&b, "s"), None);
    assert_eq!(open_uploads(&b), 0);
    assert!(m.log_text().contains("written sequentially"));
    // A gap forward past the part being filled, once a part was sent, is refused the same way.
    let f = std::fs::File::create(m.join("gap")).unwrap();
    f.write_all_at(&pattern(PART + 10, 2), 0).unwrap();
    assert_eq!(
        f.write_at(b"x", 3 * PART as u64)
            .unwrap_err()
            .raw_os_error(),
        Some(libc::EINVAL)
    );
    drop(f);
    assert_eq!(backend_get(&b, "gap"), None);
    // Within the part still being filled, a seek back (a header filled in) and a short hole
    // are done in place, and the file streams on.
    let f = std::fs::File::create(m.join("hdr")).unwrap();
    let mut want = pattern(2 * PART + 7, 3);
    f.write_all_at(&want[..PART + 100], 0).unwrap();
    f.write_all_at(b"HEADER", PART as u64 + 10).unwrap();
    want[PART + 10..PART + 16].copy_from_slice(b"HEADER");
    f.write_all_at(&want[PART + 200..], PART as u64 + 200)
        .unwrap();
    want[PART + 100..PART + 200].fill(0);
    close_file(f).unwrap();
    assert!(backend_get(&b, "hdr").unwrap() == want);
    // Before any part was sent, any out-of-order write turns the file into a staged one.
    let f = std::fs::File::create(m.join("early")).unwrap();
    f.write_all_at(b"tail", 100).unwrap();
    f.write_all_at(b"head", 0).unwrap();
    close_file(f).unwrap();
    let mut want = vec![0u8; 104];
    want[..4].copy_from_slice(b"head");
    want[100..].copy_from_slice(b"tail");
    assert_eq!(backend_get(&b, "early").unwrap(), want);
}

// [S-WRITE-EXCL]
#[test]
fn create_new_on_an_existing_object_is_eexist_and_a_racing_creator_fails_close() {
    let b = bucket("excl");
    put(&b, "there", b"old".to_vec());
    let m = Mount::new(&b, &mount_args(&[]));
    let e = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(m.join("there"))
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
    // Another client creates the key while this mount writes it: close fails, theirs stays.
    for (name, len) in [("race-small", 100usize), ("race-big", 2 * PART + 3)] {
        let mut f = std::fs::File::create(m.join(name)).unwrap();
        f.write_all(&pattern(len, 2)).unwrap();
        put(&b, name, b"theirs".to_vec());
        assert_eq!(errno_of(close_file(f)), Some(libc::EEXIST), "{name}");
        assert_eq!(backend_get(&b, name).unwrap(), b"theirs", "{name}");
    }
    assert_eq!(open_uploads(&b), 0);
}

// [S-WRITE-OVERWRITE]
#[test]
fn overwrite_is_conditional_on_the_version_opened_and_visible_at_once() {
    let b = bucket("over");
    put(&b, "f", pattern(3 << 20, 1));
    let m = Mount::new(&b, &mount_args(&["--metadata-ttl", "1h"]));
    assert_eq!(std::fs::read(m.join("f")).unwrap(), pattern(3 << 20, 1));
    // Overwrite through the mount: the new bytes and size are visible at once, in spite of
    // the hour-long metadata TTL and the kernel's pages of the old version.
    let v2 = pattern(PART + 100, 2);
    write_and_close(&m.join("f"), &v2, 1 << 20).unwrap();
    assert_eq!(
        std::fs::metadata(m.join("f")).unwrap().len(),
        v2.len() as u64
    );
    assert!(std::fs::read(m.join("f")).unwrap() == v2);
    assert!(backend_get(&b, "f").unwrap() == v2);
    // Another client replaces it while this mount rewrites it: close fails with ESTALE.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(m.join("f"))
        .unwrap();
    f.write_all(&pattern(2 * PART, 3)).unwrap();
    put(&b, "f", b"theirs".to_vec());
    assert_eq!(errno_of(close_file(f)), Some(libc::ESTALE));
    assert_eq!(backend_get(&b, "f").unwrap(), b"theirs");
    assert_eq!(open_uploads(&b), 0);
}

// [S-WRITE-READERS-PINNED]
#[test]
fn a_reader_of_an_overwritten_file_keeps_its_version_or_fails_never_mixes() {
    let b = bucket("pinw");
    let v1 = pattern(24 << 20, 11);
    put(&b, "f", v1.clone());
    let m = Mount::new(
        &b,
        &mount_args(&["--read-part-size", "1MiB", "--max-prefetch", "2MiB"]),
    );
    let mut r = std::fs::File::open(m.join("f")).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    r.read_exact(&mut buf).unwrap();
    assert!(buf[..] == v1[..1 << 20]);
    let v2 = pattern(24 << 20, 12);
    let other = std::process::Command::new("dd")
        .arg("if=/dev/stdin")
        .arg(format!("of={}", m.join("f").display()))
        .arg("bs=1M")
        .arg("status=none")
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut other = other;
    other.stdin.take().unwrap().write_all(&v2).unwrap();
    assert!(other.wait().unwrap().success());
    assert!(backend_get(&b, "f").unwrap() == v2);
    // The old reader: each read is of version 1, or ESTALE; never version 2's bytes.
    let mut off = 1 << 20;
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                assert!(
                    buf[..n] == v1[off..off + n],
                    "bytes at {off} not of version 1"
                );
                off += n;
            }
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}");
                break;
            }
        }
    }
    drop(r);
    assert!(
        std::fs::read(m.join("f")).unwrap() == v2,
        "a new open reads version 2"
    );
}

// [S-WRITE-WHILE-WRITING]
#[test]
fn a_file_being_written_is_listed_and_stats_its_size_and_is_busy_for_readers() {
    let b = bucket("during");
    let m = Mount::new(&b, &mount_args(&["--metadata-ttl", "0"]));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.join("w"))
        .unwrap();
    f.write_all(&pattern(PART + 5, 1)).unwrap();
    assert_eq!(
        std::fs::metadata(m.join("w")).unwrap().len(),
        (PART + 5) as u64,
        "stat shows the bytes written so far"
    );
    let names: Vec<_> = std::fs::read_dir(&m.path)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["w"], "listed before S3 has it");
    assert_eq!(backend_get(&b, "w"), None, "not on the server before close");
    let e = std::fs::File::open(m.join("w")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EBUSY));
    let e = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(m.join("w"))
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EBUSY), "one writer at a time");
    close_file(f).unwrap();
    assert_eq!(std::fs::read(m.join("w")).unwrap(), pattern(PART + 5, 1));
}

// [S-WRITE-FSYNC]
#[test]
fn fsync_stores_the_file_and_later_writes_go_on_staged() {
    let b = bucket("fsync");
    let m = Mount::new(&b, &mount_args(&[]));
    let mut f = std::fs::File::create(m.join("f")).unwrap();
    let data = pattern(PART + 3, 4);
    f.write_all(&data).unwrap();
    f.sync_all().unwrap();
    assert!(backend_get(&b, "f").unwrap() == data, "stored at fsync");
    // Writing on: the file goes on staged from the stored version; close stores the rest.
    f.write_all(b"more").unwrap();
    close_file(f).unwrap();
    let mut want = data.clone();
    want.extend_from_slice(b"more");
    assert!(
        backend_get(&b, "f").unwrap() == want,
        "close stores what followed"
    );
}

// [S-WRITE-SHELL]
#[test]
fn shell_redirections_touch_and_df_du_work() {
    let b = bucket("shell");
    let m = Mount::new(&b, &mount_args(&[]));
    let df_used = || {
        let out = std::process::Command::new("df")
            .args(["-B1", "--output=used"])
            .arg(&m.path)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .and_then(|l| l.trim().parse::<u64>().ok())
            .expect("df output")
    };
    let before = df_used();
    let script = format!(
        "set -e; cd {}; echo hello > a; {{ echo one; echo two; }} > b; touch empty; head -c 3000000 /dev/zero > z; du -sb . | cut -f1",
        m.path.display()
    );
    let out = std::process::Command::new("sh")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(backend_get(&b, "a").unwrap(), b"hello\n");
    assert_eq!(backend_get(&b, "b").unwrap(), b"one\ntwo\n");
    assert_eq!(std::fs::read(m.join("b")).unwrap(), b"one\ntwo\n");
    assert_eq!(backend_get(&b, "z").unwrap().len(), 3_000_000);
    let du: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert_eq!(du, 6 + 8 + 3_000_000, "du -sb counts the bytes written");
    // The empty file is stored at its last release, just after close returns.
    wait_for_object(&b, "empty");
    assert_eq!(backend_get(&b, "empty").unwrap(), b"");
    let used = df_used() - before;
    assert!(
        (3_000_000..3_000_000 + 4 * 4096).contains(&used),
        "df counts what was written: {used}"
    );
}
