//! The RDMA data plane against the loopback endpoint (`s3rdma-endpoint`) in front of
//! SeaweedFS: round trips, every misbehaviour, and the mount reading over RDMA.

use std::sync::atomic::Ordering;
use std::time::Duration;

use cuobj_ffi::RegisteredBuffer;
use s3rdma_client::{ObjectStore, PutSource, RdmaMode, S3Client, S3ErrorKind, S3Options};

use crate::common::*;

fn lib_client(endpoint: &str, bucket: &str, mode: RdmaMode) -> S3Client {
    lib_client_with(
        endpoint,
        bucket,
        mode,
        (ACCESS_KEY.into(), SECRET_KEY.into()),
    )
}

fn lib_client_with(
    endpoint: &str,
    bucket: &str,
    mode: RdmaMode,
    creds: (String, String),
) -> S3Client {
    let opts = S3Options {
        bucket: bucket.to_string(),
        endpoint_url: Some(endpoint.to_string()),
        region: Some("us-east-1".into()),
        force_path_style: true,
        max_attempts: 3,
        connect_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(30),
        rdma: mode,
        static_credentials: Some(creds),
        ..Default::default()
    };
    rt().block_on(S3Client::new(&opts))
}

fn filled(len: usize, seed: u64) -> RegisteredBuffer {
    let mut buf = RegisteredBuffer::new(len.max(1)).expect("register");
    buf.as_mut_slice()[..len].copy_from_slice(&pattern(len, seed));
    buf
}

fn put(
    s3: &S3Client,
    key: &str,
    buf: &RegisteredBuffer,
    len: usize,
) -> Result<String, s3rdma_client::S3Error> {
    rt().block_on(s3.put_object(key, PutSource::Registered(buf, len)))
}

fn get(s3: &S3Client, key: &str, len: usize) -> Result<Vec<u8>, s3rdma_client::S3Error> {
    let mut buf = RegisteredBuffer::new(len).expect("register");
    rt().block_on(s3.get_range_rdma(key, "", 0, &mut buf))?;
    Ok(buf.as_slice().to_vec())
}

fn stat(s3: &S3Client) -> std::sync::Arc<s3rdma_client::TransportStats> {
    s3.stats().clone()
}

// [S-RDMA-ROUNDTRIP]
#[test]
fn round_trips_through_the_rdma_transport() {
    let ep = RdmaEndpoint::start();
    let b = bucket("rdma-rt");
    let s3 = lib_client(&ep.url, &b, RdmaMode::Required);
    let sizes = [0usize, 1, 1 << 20, 64 << 20, (8 << 20) + 1];
    let mut moved = 0u64;
    for (i, &len) in sizes.iter().enumerate() {
        let key = format!("obj-{len}");
        let buf = filled(len, i as u64);
        let etag = put(&s3, &key, &buf, len).unwrap_or_else(|e| panic!("put {len}: {e}"));
        assert!(!etag.is_empty());
        // Checked on the backend directly, not through the endpoint.
        let stored = backend_get(&b, &key).expect("stored");
        assert!(stored == pattern(len, i as u64), "backend bytes for {len}");
        if len > 0 {
            let back = get(&s3, &key, len).unwrap_or_else(|e| panic!("get {len}: {e}"));
            assert!(back == pattern(len, i as u64), "read back {len}");
            moved += len as u64;
        }
    }
    let st = stat(&s3);
    assert_eq!(st.rdma_bytes_written.load(Ordering::Relaxed), moved);
    assert_eq!(st.rdma_bytes_read.load(Ordering::Relaxed), moved);
    assert_eq!(st.http_bytes_read.load(Ordering::Relaxed), 0);
    // The empty object is the one PUT that goes over HTTP (a registration cannot be empty).
    assert_eq!(st.http_bytes_written.load(Ordering::Relaxed), 0);
    assert_eq!(st.fallbacks.load(Ordering::Relaxed), 0);
    // A ranged GET of a window inside the object.
    let mut part = RegisteredBuffer::new(4096).unwrap();
    rt().block_on(s3.get_range_rdma("obj-1048576", "", 1000, &mut part))
        .unwrap();
    assert!(part.as_slice() == &pattern(1 << 20, 2)[1000..5096]);
}

// [S-RDMA-DECLINE]
#[test]
fn a_declining_endpoint_falls_back_under_auto_and_fails_under_required() {
    let ep = RdmaEndpoint::start();
    let b = bucket("rdma-decline");
    ep.fault("decline", None);
    let auto = lib_client(&ep.url, &b, RdmaMode::Auto);
    let buf = filled(3 << 20, 7);
    put(&auto, "a", &buf, 3 << 20).expect("auto put falls back");
    assert!(backend_get(&b, "a").unwrap() == pattern(3 << 20, 7));
    assert!(get(&auto, "a", 3 << 20).unwrap() == pattern(3 << 20, 7));
    let st = stat(&auto);
    assert_eq!(st.declines.load(Ordering::Relaxed), 2);
    assert_eq!(st.fallbacks.load(Ordering::Relaxed), 2);
    assert_eq!(st.rdma_bytes_read.load(Ordering::Relaxed), 0);
    assert_eq!(st.http_bytes_read.load(Ordering::Relaxed), 3 << 20);
    // The third decline in a row pauses RDMA: the requests that follow send no token.
    for _ in 0..3 {
        assert!(get(&auto, "a", 3 << 20).unwrap() == pattern(3 << 20, 7));
    }
    assert_eq!(st.declines.load(Ordering::Relaxed), 3);
    assert_eq!(st.rdma_pauses.load(Ordering::Relaxed), 1);
    assert_eq!(st.rdma_paused_requests.load(Ordering::Relaxed), 2);
    assert_eq!(st.http_bytes_read.load(Ordering::Relaxed), 4 * (3 << 20));

    let req = lib_client(&ep.url, &b, RdmaMode::Required);
    let e = put(&req, "r", &buf, 3 << 20).unwrap_err();
    assert_eq!(e.kind, S3ErrorKind::RdmaDeclined, "{e}");
    assert!(
        backend_get(&b, "r").is_none(),
        "nothing stored on a refused PUT"
    );
    let e = get(&req, "a", 3 << 20).unwrap_err();
    assert_eq!(e.kind, S3ErrorKind::RdmaDeclined, "{e}");
}

// [S-RDMA-IGNORED]
#[test]
fn an_endpoint_that_ignores_the_token_never_stores_an_empty_object() {
    let ep = RdmaEndpoint::start();
    let b = bucket("rdma-ignore");
    ep.fault("ignore", None);
    let req = lib_client(&ep.url, &b, RdmaMode::Required);
    let buf = filled(1 << 20, 8);
    let e = put(&req, "x", &buf, 1 << 20).unwrap_err();
    assert_eq!(e.kind, S3ErrorKind::RdmaDeclined, "{e}");
    assert!(
        backend_get(&b, "x").is_none(),
        "no 0-byte object under the file's name"
    );
    let auto = lib_client(&ep.url, &b, RdmaMode::Auto);
    put(&auto, "x", &buf, 1 << 20).expect("auto falls back to HTTP");
    assert!(backend_get(&b, "x").unwrap() == pattern(1 << 20, 8));
    // A GET answered as plain S3 (data in the body, no reply header) is a decline too.
    assert!(get(&auto, "x", 1 << 20).unwrap() == pattern(1 << 20, 8));
    assert!(get(&req, "x", 1 << 20).is_err());
}

// [S-RDMA-CORRUPT]
#[test]
fn corrupt_and_short_transfers_are_errors_and_store_nothing_wrong() {
    let ep = RdmaEndpoint::start();
    let b = bucket("rdma-corrupt");
    let s3 = lib_client(&ep.url, &b, RdmaMode::Required);
    let buf = filled(2 << 20, 9);
    for mode in ["corrupt", "short"] {
        ep.fault(mode, None);
        let key = format!("k-{mode}");
        let e = put(&s3, &key, &buf, 2 << 20).unwrap_err();
        assert!(
            matches!(
                e.kind,
                S3ErrorKind::RdmaDeclined | S3ErrorKind::BadResponse | S3ErrorKind::Other
            ),
            "{mode}: {e}"
        );
        assert!(backend_get(&b, &key).is_none(), "{mode}: nothing stored");
    }
    ep.fault("none", None);
    put(&s3, "good", &buf, 2 << 20).unwrap();
    ep.fault("short", None);
    let e = get(&s3, "good", 2 << 20).unwrap_err();
    assert_eq!(e.kind, S3ErrorKind::BadResponse, "{e}");
    assert!(e.message.contains("delivered"), "{e}");
}

/// Garbage in the RDMA reply headers (`x-amz-rdma-reply: 2x6`, bytes transferred `12abc`) is
/// an error under `required`, never a success with whatever the buffer holds.
#[test]
fn malformed_rdma_reply_headers_are_errors_never_data() {
    let ep = RdmaEndpoint::start();
    let b = bucket("rdma-badreply");
    let s3 = lib_client(&ep.url, &b, RdmaMode::Required);
    let buf = filled(1 << 20, 12);
    put(&s3, "k", &buf, 1 << 20).unwrap();
    ep.fault("badreply", None);
    let e = get(&s3, "k", 1 << 20).unwrap_err();
    assert!(
        matches!(
            e.kind,
            S3ErrorKind::BadResponse | S3ErrorKind::RdmaDeclined | S3ErrorKind::Other
        ),
        "{e}"
    );
    ep.fault("none", None);
    assert!(get(&s3, "k", 1 << 20).unwrap() == buf.as_slice());
}

// [S-RDMA-RETRY]
#[test]
fn retries_mint_a_fresh_token_per_attempt() {
    let ep = RdmaEndpoint::start();
    let b = bucket("rdma-retry");
    let s3 = lib_client(&ep.url, &b, RdmaMode::Required);
    let buf = filled(1 << 20, 10);
    for mode in ["throttle", "drop"] {
        ep.fault(mode, Some(1));
        let before = stat(&s3).tokens_minted.load(Ordering::Relaxed);
        put(&s3, mode, &buf, 1 << 20).unwrap_or_else(|e| panic!("{mode}: {e}"));
        let minted = stat(&s3).tokens_minted.load(Ordering::Relaxed) - before;
        assert_eq!(minted, 2, "{mode}: one token per attempt");
        assert!(backend_get(&b, mode).unwrap() == pattern(1 << 20, 10));
    }
    ep.fault("throttle", Some(1));
    let before = stat(&s3).tokens_minted.load(Ordering::Relaxed);
    assert!(get(&s3, "drop", 1 << 20).unwrap() == pattern(1 << 20, 10));
    assert_eq!(stat(&s3).tokens_minted.load(Ordering::Relaxed) - before, 2);
    ep.fault("delay:200", None);
    assert!(get(&s3, "drop", 1 << 20).unwrap() == pattern(1 << 20, 10));
}

// [S-RDMA-MOUNT]
#[test]
fn the_mount_reads_its_files_over_rdma() {
    let ep = RdmaEndpoint::start();
    let b = bucket("rdma-mount");
    let big = pattern((20 << 20) + 12345, 11);
    put_many_static(&b, "small.txt", b"hello over rdma");
    crate::common::put(&b, "big.bin", big.clone());
    let m = Mount::new_at(&ep.url, &b, &["--rdma", "required"]);
    assert!(std::fs::read(m.join("big.bin")).unwrap() == big);
    assert_eq!(
        std::fs::read(m.join("small.txt")).unwrap(),
        b"hello over rdma"
    );
    let log = m.stop();
    let total = big.len() as u64 + 15;
    assert_eq!(unmount_counter(&log, "rdma_bytes_read"), total);
    assert_eq!(unmount_counter(&log, "http_bytes_read"), 0);

    // The same through rdma=off: every byte over HTTP, no token minted.
    let m = Mount::new_at(&ep.url, &b, &["--rdma", "off"]);
    assert!(std::fs::read(m.join("big.bin")).unwrap() == big);
    let log = m.stop();
    assert_eq!(unmount_counter(&log, "rdma_bytes_read"), 0);
    assert_eq!(unmount_counter(&log, "tokens"), 0);
    assert_eq!(unmount_counter(&log, "http_bytes_read"), big.len() as u64);
}

fn put_many_static(bucket: &str, key: &str, body: &'static [u8]) {
    put_many(bucket, vec![key.to_string()], body);
}

/// The same round trips against a real RDMA endpoint, with NVIDIA's SDK and a NIC:
/// `scripts/rdma-check.sh URL BUCKET` runs it. Reads back over plain HTTP to compare.
#[test]
#[ignore = "needs a real S3-over-RDMA endpoint; run scripts/rdma-check.sh"]
fn real_endpoint_round_trips() {
    let env = |k: &str| {
        std::env::var(k).unwrap_or_else(|_| panic!("{k} must be set (see scripts/rdma-check.sh)"))
    };
    let (url, b) = (env("S3RDMA_CHECK_ENDPOINT"), env("S3RDMA_CHECK_BUCKET"));
    let creds = (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY"));
    assert_eq!(
        cuobj_ffi::provider(),
        cuobj_ffi::Provider::Nvidia,
        "build with --features nvidia"
    );
    let s3 = lib_client_with(&url, &b, RdmaMode::Required, creds.clone());
    let http = lib_client_with(&url, &b, RdmaMode::Off, creds);
    for (i, &len) in [1usize, 1 << 20, 8 << 20, (8 << 20) + 1, 64 << 20]
        .iter()
        .enumerate()
    {
        let key = format!("s3rdma-check/obj-{len}");
        let buf = filled(len, 100 + i as u64);
        put(&s3, &key, &buf, len).unwrap_or_else(|e| panic!("RDMA put {len}: {e}"));
        let mut plain = vec![0u8; len];
        rt().block_on(http.get_range_into(&key, "", 0, &mut plain))
            .expect("HTTP read back");
        assert!(
            plain == pattern(len, 100 + i as u64),
            "stored bytes of {len}"
        );
        let back = get(&s3, &key, len).unwrap_or_else(|e| panic!("RDMA get {len}: {e}"));
        assert!(back == pattern(len, 100 + i as u64), "RDMA read of {len}");
        eprintln!("{len} bytes: RDMA PUT + GET ok");
    }
    let mut counters = s3rdma_metrics::StatsText::default();
    s3rdma_metrics::Report::report(s3.stats().as_ref(), &mut counters);
    eprintln!("counters:\n{}", counters.text);
}

// [S-RDMA-MULTIPART]
#[test]
fn multipart_parts_go_over_rdma_each_with_its_own_token() {
    let ep = RdmaEndpoint::start();
    let b = bucket("rdma-mpu");
    let s3 = lib_client(&ep.url, &b, RdmaMode::Required);
    let (p1, p2) = (filled(5 << 20, 20), filled((1 << 20) + 7, 21));
    let id = rt()
        .block_on(s3.create_multipart("ckpt.bin"))
        .expect("create");
    let e1 = rt()
        .block_on(s3.upload_part("ckpt.bin", &id, 1, PutSource::Registered(&p1, 5 << 20)))
        .expect("part 1");
    let e2 = rt()
        .block_on(s3.upload_part(
            "ckpt.bin",
            &id,
            2,
            PutSource::Registered(&p2, (1 << 20) + 7),
        ))
        .expect("part 2");
    rt().block_on(s3.complete_multipart("ckpt.bin", &id, &[(1, e1), (2, e2)]))
        .expect("complete");
    let mut want = pattern(5 << 20, 20);
    want.extend(pattern((1 << 20) + 7, 21));
    assert!(backend_get(&b, "ckpt.bin").unwrap() == want);
    let st = stat(&s3);
    assert_eq!(
        st.rdma_bytes_written.load(Ordering::Relaxed),
        want.len() as u64
    );
    assert_eq!(st.tokens_minted.load(Ordering::Relaxed), 2);

    // A part the endpoint ignores the token for fails under rdma=required; the upload is
    // aborted and no object appears.
    ep.fault("ignore", None);
    let id = rt()
        .block_on(s3.create_multipart("bad.bin"))
        .expect("create");
    let e = rt()
        .block_on(s3.upload_part("bad.bin", &id, 1, PutSource::Registered(&p1, 5 << 20)))
        .unwrap_err();
    assert_eq!(e.kind, S3ErrorKind::RdmaDeclined, "{e}");
    rt().block_on(s3.abort_multipart("bad.bin", &id))
        .expect("abort");
    assert!(backend_get(&b, "bad.bin").is_none());
}

// [S-FAULT-RDMA]
/// RDMA declines and transfer failures in the middle of large files, through the mount under
/// `--rdma auto`: a declined GET or part is moved over HTTP (counted), a failed transfer is
/// retried with a fresh token; every byte read and stored is right (SHA-256 of the whole file).
#[test]
fn declines_and_transfer_failures_mid_file_through_the_mount() {
    use sha2::{Digest, Sha256};
    let ep = RdmaEndpoint::start();
    let b = bucket("rdma-midfile");
    let data = pattern(40 << 20, 51);
    for i in 0..3 {
        crate::common::put(&b, &format!("big{i}"), data.clone());
    }
    let m = Mount::new_at(
        &ep.url,
        &b,
        &[
            "--rdma",
            "auto",
            "--read-part-size",
            "4MiB",
            "--write-part-size",
            "5MiB",
            "--direct-io",
        ],
    );
    let want = Sha256::digest(&data);
    // Reads: the 3rd..4th RDMA GETs declined (a third in a row would pause RDMA), then the
    // 3rd..4th after that dropped. A file per fault: a file read once is served from the cache.
    for (i, fault) in ["decline 2 after=2", "drop 2 after=2", "throttle 2 after=3"]
        .iter()
        .enumerate()
    {
        ep.fault_text(fault);
        let got =
            std::fs::read(m.join(&format!("big{i}"))).unwrap_or_else(|e| panic!("{fault}: {e}"));
        assert!(Sha256::digest(&got) == want, "{fault}: wrong bytes");
    }
    // Writes: parts declined (sent again over HTTP) and dropped (retried) mid-file.
    for (i, fault) in ["decline 2 after=2", "drop 2 after=1"].iter().enumerate() {
        ep.fault_text(fault);
        let name = format!("w{i}");
        let mut f = std::fs::File::create(m.join(&name)).unwrap();
        for chunk in data.chunks(1 << 20) {
            std::io::Write::write_all(&mut f, chunk).unwrap_or_else(|e| panic!("{fault}: {e}"));
        }
        close_file(f).unwrap_or_else(|e| panic!("{fault}: close: {e}"));
        let stored = backend_get(&b, &name).expect("stored");
        assert!(
            Sha256::digest(&stored) == want,
            "{fault}: wrong bytes stored"
        );
    }
    ep.fault_text("none");
    assert_eq!(open_uploads(&b), 0);
    let log = m.stop();
    assert!(
        unmount_counter(&log, "declines") >= 4,
        "declines not counted"
    );
    assert!(
        unmount_counter(&log, "fallbacks") >= 4,
        "fallbacks not counted"
    );
    assert!(unmount_counter(&log, "rdma_bytes_read") > 0);
    assert!(unmount_counter(&log, "http_bytes_read") > 0);
    let ep_log = std::fs::read_to_string(ep.fault_file.with_file_name("endpoint.log")).unwrap();
    for (fault, least) in [("Decline", 4), ("Drop", 4), ("Throttle", 2)] {
        let n = ep_log.matches(&format!("fault={fault}")).count();
        assert!(n >= least, "{fault} injected {n} times");
    }
}
