//! Faults on the HTTP data path, injected by `s3rdma-endpoint` in front of SeaweedFS (the mount
//! uses `--rdma off` through it): a connection reset in the middle of a body, a trickling body,
//! throttling, and an outage of the endpoint during a read and during a write. A read returns
//! the right bytes, or EIO after a bounded time; a write is stored whole or not at all.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use crate::common::*;

fn via(ep: &RdmaEndpoint, b: &str, extra: &[&str]) -> Mount {
    let mut args = vec!["--rdma", "off"];
    args.extend_from_slice(extra);
    Mount::new_at(&ep.url, b, &args)
}

fn read_file(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    std::fs::File::open(path)?.read_to_end(&mut out)?;
    Ok(out)
}

/// [S-FAULT-READ] A body cut off half-way (connection reset) is fetched again: the bytes are
/// right.
#[test]
fn a_connection_reset_mid_body_is_retried_and_the_bytes_are_right() {
    let ep = RdmaEndpoint::start();
    let b = bucket("fault-reset");
    let data = pattern(24 << 20, 11);
    put(&b, "f", data.clone());
    let m = via(&ep, &b, &[]);
    ep.fault_text("reset 3 op=GetObject");
    let got = read_file(&m.join("f")).expect("read after resets");
    assert!(got == data, "wrong bytes after resets");
}

/// [S-FAULT-READ] A body that trickles (16 KiB every 300 ms) misses its deadline (the request
/// timeout plus a second per MiB) and is fetched again.
#[test]
fn a_trickling_body_times_out_and_is_fetched_again() {
    let ep = RdmaEndpoint::start();
    let b = bucket("fault-trickle");
    let data = pattern(8 << 20, 12);
    put(&b, "f", data.clone());
    let m = via(&ep, &b, &["--request-timeout", "2s"]);
    ep.fault_text("trickle:300 1 op=GetObject");
    let start = Instant::now();
    let got = read_file(&m.join("f")).expect("read after a stalled body");
    assert!(got == data, "wrong bytes after a stall");
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
}

/// [S-FAULT-READ] SlowDown (503) is retried with backoff.
#[test]
fn throttling_is_retried() {
    let ep = RdmaEndpoint::start();
    let b = bucket("fault-throttle");
    let data = pattern(3 << 20, 13);
    put(&b, "f", data.clone());
    let m = via(&ep, &b, &[]);
    ep.fault_text("throttle 3 op=GetObject");
    assert!(read_file(&m.join("f")).expect("read") == data);
}

/// [S-FAULT-OUTAGE] The endpoint failing every data request for 10 s: a read started in the
/// outage completes with the right bytes when the retries outlast it, and fails with EIO
/// within seconds when they do not (`--max-attempts 2`).
#[test]
fn an_outage_during_a_read_is_ridden_out_or_fails_with_eio_in_bounded_time() {
    let ep = RdmaEndpoint::start();
    let b = bucket("fault-outage-r");
    let data = pattern(16 << 20, 14);
    put(&b, "f", data.clone());

    let m = via(&ep, &b, &["--max-attempts", "12"]);
    ep.fault_text("error op=any for=10000");
    let start = Instant::now();
    let got = read_file(&m.join("f")).expect("read through the outage");
    assert!(got == data, "wrong bytes after the outage");
    assert!(start.elapsed() >= Duration::from_secs(5), "no outage seen");
    drop(m);

    let m = via(&ep, &b, &["--max-attempts", "2"]);
    let _ = std::fs::metadata(m.join("f")).expect("stat before the outage");
    // A different text: the endpoint starts a window when the fault file changes.
    ep.fault_text("error op=any for=10001");
    let start = Instant::now();
    let e = read_file(&m.join("f")).expect_err("read in an outage with 2 attempts");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "{:?}",
        start.elapsed()
    );
    let log = m.stop();
    assert!(
        log.contains("key=f") || log.contains("key=\"f\""),
        "the failed read is not logged with its key"
    );
}

/// [S-FAULT-OUTAGE] An outage of 10 s in the middle of a 40 MiB write (every request fails
/// meanwhile, the abort too): the file is stored whole when the retries outlast it; with too
/// few retries `close` fails with EIO and nothing is stored, and the multipart upload is
/// aborted once the endpoint is back. Never a partial object, never a multipart upload left.
#[test]
fn an_outage_during_a_write_stores_the_file_whole_or_not_at_all() {
    let ep = RdmaEndpoint::start();
    let data = pattern(40 << 20, 15);
    for (attempts, must_succeed) in [("12", true), ("2", false)] {
        let b = bucket("fault-outage-w");
        let m = via(
            &ep,
            &b,
            &["--max-attempts", attempts, "--write-part-size", "5MiB"],
        );
        ep.fault_text("none");
        let mut f = std::fs::File::create(m.join("w")).unwrap();
        let mut result = Ok(());
        for (i, chunk) in data.chunks(1 << 20).enumerate() {
            if i == 10 {
                // Distinct text per run: a window starts when the fault file changes.
                ep.fault_text(&format!("error op=any for=10000 run={attempts}"));
            }
            if let Err(e) = f.write_all(chunk) {
                result = Err(e.raw_os_error());
                break;
            }
        }
        let closed = close_file(f);
        if let (Ok(()), Err(e)) = (&result, closed) {
            result = Err(e.raw_os_error());
        }
        ep.fault_text("none");
        let stored = backend_get(&b, "w");
        match &result {
            Ok(()) => assert!(stored.as_deref() == Some(&data[..]), "stored bytes differ"),
            Err(errno) => {
                assert_eq!(*errno, Some(libc::EIO));
                assert!(stored.is_none(), "a failed write left an object");
            }
        }
        // The abort itself fails during the outage; it is retried in the background until the
        // endpoint answers again.
        let deadline = Instant::now() + Duration::from_secs(30);
        while open_uploads(&b) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
        }
        assert_eq!(open_uploads(&b), 0, "a multipart upload was left");
        if must_succeed {
            assert!(
                result.is_ok(),
                "12 attempts did not ride out 10 s: {result:?}"
            );
        } else {
            assert!(result.is_err(), "2 attempts rode out a 10 s outage");
        }
        drop(m);
    }
}

/// [S-WRITE-EXCL] Two mounts of one bucket create the same new key at the same time, each
/// writing 12 MiB (multipart): exactly one `close` succeeds, the other fails with EEXIST, the
/// object is the winner's bytes whole, and no multipart upload is left.
#[test]
fn two_mounts_creating_one_key_one_wins_whole_the_other_gets_eexist() {
    let b = bucket("two-mounts");
    let a = Mount::new(&b, &["--write-part-size", "5MiB"]);
    let c = Mount::new(&b, &["--write-part-size", "5MiB"]);
    let data_a = pattern(12 << 20, 21);
    let data_c = pattern(12 << 20, 22);
    let write = |path: std::path::PathBuf, data: Vec<u8>| {
        std::thread::spawn(move || -> Result<(), Option<i32>> {
            let mut f = std::fs::File::create(&path).map_err(|e| e.raw_os_error())?;
            for chunk in data.chunks(1 << 20) {
                f.write_all(chunk).map_err(|e| e.raw_os_error())?;
            }
            close_file(f).map_err(|e| e.raw_os_error())
        })
    };
    let ta = write(a.join("k"), data_a.clone());
    let tc = write(c.join("k"), data_c.clone());
    let (ra, rc) = (ta.join().unwrap(), tc.join().unwrap());
    let stored = backend_get(&b, "k").expect("no object stored");
    match (&ra, &rc) {
        (Ok(()), Err(e)) => {
            assert_eq!(*e, Some(libc::EEXIST));
            assert!(stored == data_a, "the object is not the winner's bytes");
        }
        (Err(e), Ok(())) => {
            assert_eq!(*e, Some(libc::EEXIST));
            assert!(stored == data_c, "the object is not the winner's bytes");
        }
        other => panic!("expected one success and one EEXIST, got {other:?}"),
    }
    assert_eq!(open_uploads(&b), 0);
}

/// [S-WRITE-OVERWRITE] Another client deletes the object while this mount rewrites it
/// (O_TRUNC, multipart): `close` fails with ESTALE, nothing is stored under the name, and no
/// multipart upload is left.
#[test]
fn an_object_deleted_during_a_multipart_rewrite_fails_close_and_stores_nothing() {
    let b = bucket("del-during-write");
    put(&b, "k", pattern(1 << 20, 31));
    let m = Mount::new(&b, &["--write-part-size", "5MiB"]);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(m.join("k"))
        .unwrap();
    let data = pattern(12 << 20, 32);
    f.write_all(&data[..6 << 20]).unwrap();
    delete(&b, "k");
    f.write_all(&data[6 << 20..]).unwrap();
    let err = close_file(f).expect_err("close succeeded although the object was deleted");
    assert_eq!(err.raw_os_error(), Some(libc::ESTALE), "{err}");
    assert!(backend_get(&b, "k").is_none(), "an object was stored");
    assert_eq!(open_uploads(&b), 0);
}

/// [S-READ-PINNED] An object replaced between `open` and the first `read`: the read fails with
/// ESTALE (the handle is pinned to the version it opened) and never returns the new bytes.
#[test]
fn an_object_replaced_between_open_and_first_read_is_estale() {
    let b = bucket("replace-before-read");
    let v1 = pattern(4 << 20, 33);
    put(&b, "k", v1.clone());
    let m = Mount::new(&b, &[]);
    let mut f = std::fs::File::open(m.join("k")).unwrap();
    put(&b, "k", pattern(4 << 20, 34));
    let mut buf = vec![0u8; 65536];
    match f.read_exact(&mut buf) {
        Ok(()) => assert!(
            buf[..] == v1[..65536],
            "the first read returned the new version"
        ),
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}"),
    }
}

/// [S-FAULT-MALFORMED] Answers without an ETag header: a read is still pinned — the version
/// comes from the listing and every GET carries If-Match, which the server checks — so the bytes
/// are right, and an object replaced after `open` still gives ESTALE, never the new bytes.
#[test]
fn answers_without_an_etag_keep_reads_pinned() {
    let ep = RdmaEndpoint::start();
    let b = bucket("noetag-r");
    let data = pattern(2 << 20, 41);
    put(&b, "f", data.clone());
    let m = via(&ep, &b, &["--metadata-ttl", "0"]);
    ep.fault_text("noetag op=any");
    assert!(read_file(&m.join("f")).expect("read without ETag headers") == data);
    let mut f = std::fs::File::open(m.join("f")).unwrap();
    put(&b, "f", pattern(2 << 20, 44));
    let mut buf = vec![0u8; 65536];
    match f.read_exact(&mut buf) {
        Ok(()) => assert!(buf[..] == data[..65536], "the new version was read"),
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}"),
    }
}

/// [S-FAULT-MALFORMED] A PutObject answer without an ETag: the object was stored (HTTP 200 with
/// its checksum checked by the server), so `close` succeeds, a warning is logged, and the next
/// open learns the version from the server.
#[test]
fn a_put_answer_without_an_etag_still_stores_the_file() {
    let ep = RdmaEndpoint::start();
    let b = bucket("noetag-w");
    let m = via(&ep, &b, &["--metadata-ttl", "0"]);
    ep.fault_text("noetag op=PutObject");
    let data = pattern(1 << 20, 42);
    std::fs::write(m.join("w"), &data).expect("write");
    ep.fault_text("none");
    assert!(backend_get(&b, "w").as_deref() == Some(&data[..]));
    assert!(read_file(&m.join("w")).expect("read back") == data);
}

/// [S-FAULT-MALFORMED] Bodies that are not XML: a listing fails with EIO (the mount keeps
/// working once answers are sane again); a CreateMultipartUpload answer that cannot be read
/// fails the write with EIO and stores nothing; a CompleteMultipartUpload answer that cannot be
/// read is checked with HEAD (the size written and an ETag), so the write succeeds only when the
/// whole file is there. Nothing panics.
#[test]
fn answers_that_are_not_xml_fail_cleanly() {
    let ep = RdmaEndpoint::start();
    let b = bucket("garbage");
    put(&b, "d/x", b"x".to_vec());
    let m = via(
        &ep,
        &b,
        &["--metadata-ttl", "0", "--write-part-size", "5MiB"],
    );
    ep.fault_text("garbage op=ListObjectsV2");
    let e = std::fs::read_dir(m.join("d"))
        .and_then(|d| d.collect::<Result<Vec<_>, _>>())
        .map(|v| v.len())
        .expect_err("listing with a garbage answer");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    ep.fault_text("none");
    assert_eq!(std::fs::read_dir(m.join("d")).unwrap().count(), 1);

    let data = pattern(12 << 20, 43);
    for (n, op) in ["CreateMultipartUpload", "CompleteMultipartUpload"]
        .iter()
        .enumerate()
    {
        let name = format!("w{n}");
        ep.fault_text(&format!("garbage op={op}"));
        let r = std::fs::File::create(m.join(&name))
            .and_then(|mut f| f.write_all(&data).map(|()| f))
            .and_then(close_file);
        ep.fault_text("none");
        let stored = backend_get(&b, &name);
        if n == 0 {
            let e = r.map(|_| name.clone()).expect_err(op);
            assert_eq!(e.raw_os_error(), Some(libc::EIO), "{op}: {e}");
            assert!(stored.is_none(), "{op}: an object was stored");
        } else {
            r.unwrap_or_else(|e| panic!("{op}: the upload completed, but close failed: {e}"));
            assert!(stored == Some(data.clone()), "{op}: not the whole file");
            assert!(read_file(&m.join(&name)).expect("read back") == data);
        }
    }
    let log = m.stop();
    assert!(!log.contains("panicked"), "a panic: {}", tail(&log, 2000));
    assert!(log.contains("without an ETag; checking the object with HEAD"));
}

/// Read `path` 1 MiB at a time, pausing `pause` between reads.
fn slow_read(path: std::path::PathBuf, pause: Duration) -> std::io::Result<Vec<u8>> {
    let mut f = std::fs::File::open(path)?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(out);
        }
        out.extend_from_slice(&buf[..n]);
        std::thread::sleep(pause);
    }
}

/// Write `data` to `path` 1 MiB at a time, pausing `pause` between writes; `close` included.
fn slow_write(path: std::path::PathBuf, data: &[u8], pause: Duration) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    for chunk in data.chunks(1 << 20) {
        f.write_all(chunk)?;
        std::thread::sleep(pause);
    }
    close_file(f)
}

/// [S-FAULT-SERVER] The S3 server itself killed (SIGKILL) in the middle of a read and of a
/// write on each of two mounts, and started again: with retries that outlast the restart the
/// read returns the right bytes and the file is stored whole; with 2 attempts the read and
/// the write fail with EIO, nothing is stored, and the multipart upload is aborted once the
/// server is back. Every request kind meets the dead server here (HEAD, LIST, multipart
/// create, parts, abort), not only those the endpoint faults.
#[test]
fn the_s3_server_killed_and_restarted_mid_read_and_mid_write() {
    use sha2::{Digest, Sha256};
    let mut srv = OwnServer::start("restart");
    let c = srv.client();
    let b = "restart-test";
    let data = pattern(24 << 20, 61);
    rt().block_on(async {
        c.create_bucket().bucket(b).send().await.expect("bucket");
        c.put_object()
            .bucket(b)
            .key("r")
            .body(data.clone().into())
            .send()
            .await
            .expect("put");
    });
    let args = |attempts: &'static str| {
        vec![
            "--max-attempts",
            attempts,
            "--read-part-size",
            "1MiB",
            "--max-prefetch",
            "1MiB",
            "--direct-io",
            "--write-part-size",
            "5MiB",
            "--metadata-ttl",
            "0",
        ]
    };
    let patient = Mount::new_at(&srv.endpoint, b, &args("14"));
    let hasty = Mount::new_at(&srv.endpoint, b, &args("2"));
    let pause = Duration::from_millis(100);
    let mut jobs = Vec::new();
    for (m, name) in [(&patient, "ok"), (&hasty, "fail")] {
        let (rp, wp, d) = (m.join("r"), m.join(name), data.clone());
        jobs.push((
            std::thread::spawn(move || slow_read(rp, pause).map(|v| Sha256::digest(&v))),
            std::thread::spawn(move || slow_write(wp, &d, pause)),
        ));
    }
    std::thread::sleep(Duration::from_millis(800));
    srv.kill();
    let killed = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    srv.restart();
    eprintln!("server down for {:?}", killed.elapsed());
    let want = Sha256::digest(&data);
    let mut results = Vec::new();
    for (r, w) in jobs {
        results.push((r.join().unwrap(), w.join().unwrap()));
    }
    let (read_ok, write_ok) = &results[0];
    assert!(
        read_ok.as_ref().expect("patient read") == &want,
        "patient read: wrong bytes"
    );
    write_ok.as_ref().expect("patient write");
    let stored = get_from(&c, b, "ok").expect("patient write stored");
    assert!(
        Sha256::digest(&stored) == want,
        "patient write: wrong bytes stored"
    );

    let (read_fail, write_fail) = &results[1];
    let e = read_fail
        .as_ref()
        .expect_err("hasty read survived a restart");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    let e = write_fail
        .as_ref()
        .expect_err("hasty write survived a restart");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert!(
        get_from(&c, b, "fail").is_none(),
        "a failed write left an object"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while uploads_in(&c, b) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(uploads_in(&c, b), 0, "a multipart upload was left");
    drop(hasty);
    drop(patient);
}
