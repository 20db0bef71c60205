//! The soak: concurrent readers, writers and listers on one mount (over loopback RDMA, with a
//! small cache and write pool so that eviction and back-pressure happen all the time), every
//! byte checked; afterwards no file descriptor, RDMA registration, token, request or upload
//! left over, and memory within its bounds. 120 s in CI; `scripts/soak` runs it longer
//! (`S3RDMA_SOAK_SECS`).

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::common::*;

/// The daemon's open descriptors: (sockets, everything else). Sockets come and go with the
/// HTTP connection pool (bounded by the concurrency); anything else must not grow.
fn fd_count(pid: u32) -> (usize, usize) {
    let mut sockets = 0;
    let mut other = 0;
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
    {
        match std::fs::read_link(e.path()) {
            Ok(t) if t.to_string_lossy().starts_with("socket:") => sockets += 1,
            Ok(_) => other += 1,
            Err(_) => {}
        }
    }
    (sockets, other)
}

fn rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        / 1024
}

/// A tiny deterministic generator (xorshift), so every thread's choices are reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

#[test]
fn soak_readers_writers_and_listers_lose_nothing_and_leak_nothing() {
    let secs: u64 = std::env::var("S3RDMA_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(120);
    let ep = RdmaEndpoint::start();
    let b = bucket("soak");
    let objects: Vec<(String, Vec<u8>)> = (0..16u64)
        .map(|i| {
            let len = ((i * 1_700_003) % (24 << 20)) as usize + 1;
            (format!("data/o{i:02}"), pattern(len, 100 + i))
        })
        .collect();
    for (k, d) in &objects {
        put(&b, k, d.clone());
    }
    let sums: Arc<Vec<(String, Vec<u8>)>> = Arc::new(
        objects
            .iter()
            .map(|(k, d)| (k.clone(), Sha256::digest(d).to_vec()))
            .collect(),
    );
    let m = Mount::new_at(
        &ep.url,
        &b,
        &[
            "--rdma",
            "required",
            "--cache-size",
            "64MiB",
            "--read-part-size",
            "4MiB",
            "--write-buffer-size",
            "32MiB",
            "--write-part-size",
            "8MiB",
            // Every read reaches the daemon (no kernel page cache between epochs).
            "--direct-io",
        ],
    );
    let pid = m.pid();
    // Warm up once (connections, threads), then take the baseline.
    let _ = std::fs::read_dir(m.join("data")).unwrap().count();
    let fds_before = fd_count(pid);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let stop = Arc::new(AtomicBool::new(false));
    let (bytes_read, bytes_written, files_written) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let mut handles = Vec::new();
    for t in 0..4u64 {
        let (root, sums, stop, bytes_read) = (
            m.path.clone(),
            sums.clone(),
            stop.clone(),
            bytes_read.clone(),
        );
        handles.push(std::thread::spawn(move || {
            let mut rng = Rng(0x9E37_79B9 + t);
            while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
                let (key, want) = &sums[rng.next(sums.len() as u64) as usize];
                let mut f = std::fs::File::open(root.join(key)).expect("open");
                let mut h = Sha256::new();
                let mut buf = vec![0u8; 1 << 20];
                let mut n = 0u64;
                loop {
                    let k = f.read(&mut buf).expect("read");
                    if k == 0 {
                        break;
                    }
                    h.update(&buf[..k]);
                    n += k as u64;
                }
                assert_eq!(&h.finalize().to_vec(), want, "{key}: wrong bytes");
                bytes_read.fetch_add(n, Ordering::Relaxed);
            }
        }));
    }
    for t in 0..2u64 {
        let (root, stop, bytes_written, files_written, bkt) = (
            m.path.clone(),
            stop.clone(),
            bytes_written.clone(),
            files_written.clone(),
            b.clone(),
        );
        handles.push(std::thread::spawn(move || {
            let mut rng = Rng(0x51ED_2701 + t);
            let mut i = 0u64;
            // The server keeps deleted bytes on disk until the bucket goes: bound what is written.
            let budget = secs * (8 << 20);
            while Instant::now() < deadline
                && !stop.load(Ordering::Relaxed)
                && bytes_written.load(Ordering::Relaxed) < budget
            {
                let len = rng.next(20 << 20) as usize;
                let data = pattern(len, 1000 * t + i);
                let name = format!("w{t}-{i}");
                let mut f = std::fs::File::create(root.join(&name)).expect("create");
                for c in data.chunks(256 << 10) {
                    f.write_all(c).expect("write");
                }
                drop(f);
                let stored = backend_get(&bkt, &name).expect("written file not stored");
                assert!(stored == data, "{name}: stored bytes differ");
                std::fs::remove_file(root.join(&name)).expect("unlink");
                bytes_written.fetch_add(len as u64, Ordering::Relaxed);
                files_written.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        }));
    }
    {
        let (root, stop) = (m.path.clone(), stop.clone());
        handles.push(std::thread::spawn(move || {
            while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
                let out = std::process::Command::new("ls")
                    .arg("-lR")
                    .arg(&root)
                    .output()
                    .expect("ls");
                assert!(out.status.success(), "ls -lR failed");
                std::thread::sleep(Duration::from_millis(200));
            }
        }));
    }
    let mut peak_rss = 0;
    while handles.iter().any(|h| !h.is_finished()) {
        peak_rss = peak_rss.max(rss_mib(pid));
        std::thread::sleep(Duration::from_millis(250));
        assert!(
            Instant::now() < deadline + Duration::from_secs(120),
            "the soak did not end"
        );
    }
    for h in handles {
        if let Err(e) = h.join() {
            stop.store(true, Ordering::Relaxed);
            std::panic::resume_unwind(e);
        }
    }
    // Idle again: nothing in flight, nothing held.
    std::thread::sleep(Duration::from_millis(500));
    let s = mount_stats(&m.path);
    assert_eq!(stat_value(&s, "rdma_tokens_live"), 0, "{s}");
    assert_eq!(stat_value(&s, "requests_in_flight"), 0, "{s}");
    assert_eq!(stat_value(&s, "files_being_written"), 0, "{s}");
    assert_eq!(stat_value(&s, "parts_in_flight"), 0, "{s}");
    assert_eq!(stat_value(&s, "uploads_failed"), 0, "{s}");
    assert!(stat_value(&s, "rdma_bytes_read") > 0, "{s}");
    let fds_after = fd_count(pid);
    assert!(
        fds_after.1 <= fds_before.1,
        "non-socket descriptors grew from {} to {}",
        fds_before.1,
        fds_after.1
    );
    // The connection pool: at most one per request the mount may have in flight.
    assert!(fds_after.0 <= 64, "{} sockets open", fds_after.0);
    // Pinned cache + write pool + fixed overhead.
    assert!(peak_rss <= 64 + 32 + 96, "peak RSS {peak_rss} MiB");
    assert_eq!(open_uploads(&b), 0);
    let read = bytes_read.load(Ordering::Relaxed) >> 20;
    let written = bytes_written.load(Ordering::Relaxed) >> 20;
    eprintln!(
        "soak {secs} s: read {read} MiB, wrote {written} MiB in {} files, peak RSS {peak_rss} MiB, (sockets, other fds) {fds_before:?} -> {fds_after:?}",
        files_written.load(Ordering::Relaxed)
    );
    assert!(read > 0 && written > 0);
    let log = m.stop();
    assert!(
        log.contains("released every RDMA registration and token registrations=0 tokens=0"),
        "{}",
        tail(&log, 3000)
    );
}
