//! The pinned page cache: correctness under concurrency, eviction, tiny caches, bounded memory.

use std::io::{Read, Seek, SeekFrom};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::common::*;

fn read_all(path: &std::path::Path) -> Vec<u8> {
    let mut f = std::fs::File::open(path).unwrap();
    let mut out = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&buf[..n]);
    }
}

/// Run `jobs` on threads, each bounded by `limit` in all: a hang fails the test instead of
/// blocking it.
fn run_bounded(jobs: Vec<Box<dyn FnOnce() + Send>>, limit: Duration) {
    let (tx, rx) = mpsc::channel();
    let n = jobs.len();
    for job in jobs {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
            let _ = tx.send(r.is_ok());
        });
    }
    let deadline = Instant::now() + limit;
    for _ in 0..n {
        let left = deadline.saturating_duration_since(Instant::now());
        let ok = rx
            .recv_timeout(left)
            .expect("readers did not finish in time (deadlock?)");
        assert!(ok, "a reader failed");
    }
}

fn concurrent_readers(transport: &[&str], endpoint: &str) {
    let b = bucket("cache-conc");
    let len = 24 << 20;
    let files: Vec<Vec<u8>> = (0..3).map(|i| pattern(len, 40 + i)).collect();
    for (i, f) in files.iter().enumerate() {
        put(&b, &format!("f{i}"), f.clone());
    }
    let mut args = vec![
        "--cache-size",
        "32MiB",
        "--read-part-size",
        "2MiB",
        "--max-prefetch",
        "8MiB",
    ];
    args.extend_from_slice(transport);
    let m = Mount::new_at(endpoint, &b, &args);
    let mut jobs: Vec<Box<dyn FnOnce() + Send>> = Vec::new();
    for (i, want) in files.iter().enumerate() {
        // A sequential reader of each file, and a second one of f0.
        let (path, want) = (m.join(&format!("f{i}")), want.clone());
        jobs.push(Box::new(move || {
            assert!(read_all(&path) == want, "sequential f{i}")
        }));
    }
    let (p0, w0) = (m.join("f0"), files[0].clone());
    jobs.push(Box::new(move || {
        assert!(read_all(&p0) == w0, "second reader of f0")
    }));
    for (i, want) in files.iter().enumerate() {
        let (path, want) = (m.join(&format!("f{i}")), want.clone());
        jobs.push(Box::new(move || {
            let mut f = std::fs::File::open(&path).unwrap();
            let mut x = 77u64 + i as u64;
            for _ in 0..60 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let off = (x >> 20) as usize % len;
                let n = (1 << 20usize).min(len - off);
                f.seek(SeekFrom::Start(off as u64)).unwrap();
                let mut got = vec![0u8; n];
                f.read_exact(&mut got).unwrap();
                assert!(got == want[off..off + n], "random read of f{i} at {off}");
            }
        }));
    }
    run_bounded(jobs, Duration::from_secs(180));
    let log = m.stop();
    // 72 MiB of files through a 32 MiB cache: blocks were evicted and refilled.
    assert!(
        unmount_counter(&log, "evictions") > 0,
        "{}",
        tail(&log, 600)
    );
    let rdma = unmount_counter(&log, "rdma_bytes_read");
    if transport.contains(&"required") {
        assert!(rdma > 0);
    } else {
        assert_eq!(rdma, 0);
    }
}

// [S-CACHE-CONCURRENT]
#[test]
fn concurrent_sequential_and_random_readers_over_http() {
    concurrent_readers(&["--rdma", "off"], &server().endpoint);
}

// [S-CACHE-CONCURRENT]
#[test]
fn concurrent_sequential_and_random_readers_over_rdma() {
    let ep = RdmaEndpoint::start();
    concurrent_readers(&["--rdma", "required"], &ep.url);
}

// [S-CACHE-EVICT]
#[test]
fn a_file_larger_than_the_cache_reads_correctly() {
    let b = bucket("cache-large");
    let data = pattern(40 << 20, 50);
    put(&b, "big", data.clone());
    let m = Mount::new(&b, &["--cache-size", "8MiB", "--read-part-size", "2MiB"]);
    assert!(read_all(&m.join("big")) == data);
    // Read again: nothing stale or mixed after the blocks were recycled.
    assert!(read_all(&m.join("big")) == data);
    let log = m.stop();
    assert!(
        unmount_counter(&log, "evictions") >= 16,
        "{}",
        tail(&log, 600)
    );
}

// [S-CACHE-TINY]
#[test]
fn many_readers_share_a_tiny_cache_without_deadlock() {
    let b = bucket("cache-tiny");
    let files: Vec<Vec<u8>> = (0..12)
        .map(|i| pattern((5 << 20) + i * 1000, 60 + i as u64))
        .collect();
    for (i, f) in files.iter().enumerate() {
        put(&b, &format!("f{i:02}"), f.clone());
    }
    // Two blocks for twelve readers.
    let m = Mount::new(
        &b,
        &[
            "--cache-size",
            "2MiB",
            "--read-part-size",
            "1MiB",
            "--max-threads",
            "16",
        ],
    );
    let jobs = files
        .iter()
        .enumerate()
        .map(|(i, want)| {
            let (path, want) = (m.join(&format!("f{i:02}")), want.clone());
            Box::new(move || assert!(read_all(&path) == want, "f{i:02}"))
                as Box<dyn FnOnce() + Send>
        })
        .collect();
    run_bounded(jobs, Duration::from_secs(180));
    let log = m.stop();
    assert!(unmount_counter(&log, "evictions") > 0);
}

/// A field of the process's /proc/PID/smaps_rollup, in KiB.
fn smaps_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

// [S-MEM-IDLE]
#[test]
fn an_http_mount_takes_memory_as_it_is_used() {
    let b = bucket("idle-rss");
    let data = pattern(48 << 20, 5);
    put(&b, "f", data.clone());
    let m = Mount::new(
        &b,
        &[
            "--rdma",
            "off",
            "--cache-size",
            "512MiB",
            "--write-buffer-size",
            "256MiB",
            "--memory-idle-timeout",
            "3s",
        ],
    );
    std::thread::sleep(Duration::from_millis(500));
    let idle = rss_kib(m.pid());
    eprintln!(
        "idle RSS {} MiB with a 512 MiB cache and 256 MiB of write buffers",
        idle >> 10
    );
    assert!(idle < 32 << 10, "an idle HTTP mount holds {idle} KiB");
    assert!(read_all(&m.join("f")) == data);
    let used = rss_kib(m.pid());
    assert!(
        used > idle + (32 << 10) && used < 512 << 10,
        "after reading 48 MiB: {used} KiB (idle {idle} KiB)"
    );
    // The cache's pages are huge where the kernel has them (transparent huge pages not off).
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled");
    if thp.is_ok_and(|s| !s.contains("[never]")) {
        let huge = smaps_kib(m.pid(), "AnonHugePages:");
        assert!(
            huge >= 32 << 10,
            "after reading 48 MiB: {huge} KiB in huge pages"
        );
    }
    // `s3rdma stats` says so: nothing pinned, resident what the kernel counts.
    let stats = mount_stats(&m.path);
    assert_eq!(stat_value(&stats, "cache_pinned_bytes"), 0);
    assert_eq!(stat_value(&stats, "write_pinned_bytes"), 0);
    let resident = stat_value(&stats, "resident_bytes") >> 10;
    assert!(
        resident > used / 2 && resident < used * 2,
        "resident_bytes {resident} KiB, VmRSS {used} KiB"
    );
    // Written: the write buffers take memory too.
    std::fs::write(m.join("w"), &data[..40 << 20]).unwrap();
    let peak = rss_kib(m.pid());
    // [S-MEM-GIVE-BACK] Quiet for the idle timeout: the memory goes back, toward idle.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut now = peak;
    while now - idle > (peak - idle) / 4 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        now = rss_kib(m.pid());
    }
    eprintln!("RSS idle {idle} KiB, after reading 48 MiB {used} KiB, after writing 40 MiB {peak} KiB, quiet {now} KiB");
    // What stays is the FUSE worker threads' request buffers (up to 1 MiB each that took a
    // write) and the allocator's bookkeeping: well under a third of what was taken.
    assert!(
        now - idle <= (peak - idle) / 3,
        "RSS {now} KiB after a quiet period (idle {idle} KiB, peak {peak} KiB)"
    );
    assert!(stat_value(&mount_stats(&m.path), "cache_given_back_bytes") >= 32 << 20);
    // Given back, the data reads again (fetched anew).
    assert!(read_all(&m.join("f")) == data);
}

// [S-CACHE-MEMORY]
#[test]
fn daemon_memory_stays_within_the_cache_and_write_buffers() {
    let b = bucket("cache-rss");
    let (cache_mib, write_mib) = (64u64, 32u64);
    let data = pattern(256 << 20, 70);
    put(&b, "huge", data.clone());
    let m = Mount::new(
        &b,
        &[
            "--cache-size",
            "64MiB",
            "--read-part-size",
            "8MiB",
            "--write-buffer-size",
            "32MiB",
        ],
    );
    let pid = m.pid();
    let (done_tx, done_rx) = mpsc::channel();
    let (src, dst) = (m.join("huge"), m.join("copy"));
    // Read 4x the cache, then write 8x the write buffers.
    let worker = std::thread::spawn(move || {
        let ok = read_all(&src) == data;
        std::fs::write(&dst, &data).expect("write");
        let _ = done_tx.send(());
        ok
    });
    let mut peak = 0;
    let deadline = Instant::now() + Duration::from_secs(180);
    while done_rx.try_recv().is_err() && Instant::now() < deadline {
        peak = peak.max(rss_kib(pid));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(worker.join().unwrap(), "content");
    peak = peak.max(rss_kib(pid));
    // The cache and the write buffers (pinned, so fully resident) plus a generous fixed
    // overhead; moving many times their size must not grow the daemon beyond it.
    let pinned = cache_mib + write_mib;
    let bound = (pinned + 96) << 10;
    eprintln!(
        "daemon peak RSS {} MiB with a {cache_mib} MiB cache and {write_mib} MiB of write buffers",
        peak >> 10
    );
    assert!(
        peak > pinned << 10,
        "the pinned cache and write buffers must be resident ({peak} KiB)"
    );
    assert!(peak < bound, "peak RSS {peak} KiB exceeds {bound} KiB");
    // This mount uses RDMA (loopback provider, endpoint on this host): both are pinned.
    let stats = mount_stats(&m.path);
    assert_eq!(stat_value(&stats, "cache_pinned_bytes"), cache_mib << 20);
    assert_eq!(stat_value(&stats, "write_pinned_bytes"), write_mib << 20);
    assert_eq!(
        backend_get(&b, "copy").map(|c| c.len()),
        Some(256 << 20),
        "written"
    );
}

// [S-CACHE-STATS]
#[test]
fn the_stats_file_shows_live_counters() {
    let b = bucket("cache-stats");
    let data = pattern(10 << 20, 90);
    put(&b, "f", data.clone());
    let stats = mountpoint().with_extension("stats");
    let stats_arg = stats.to_string_lossy().to_string();
    let m = Mount::new(
        &b,
        &[
            "--rdma",
            "off",
            "--read-part-size",
            "1MiB",
            "--stats-file",
            &stats_arg,
        ],
    );
    assert!(read_all(&m.join("f")) == data);
    let read = |name: &str| -> u64 {
        let text = std::fs::read_to_string(&stats).unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    // Rewritten every second while mounted.
    let deadline = Instant::now() + Duration::from_secs(10);
    while read("http_bytes_read") < data.len() as u64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(read("http_bytes_read"), data.len() as u64);
    assert_eq!(read("rdma_bytes_read"), 0);
    assert!(
        read("cache_misses") + read("prefetches") >= 10,
        "{}",
        std::fs::read_to_string(&stats).unwrap_or_default()
    );
    drop(m);
}

// [S-CACHE-SCAN]
#[test]
fn a_sequential_scan_does_not_evict_blocks_that_are_read_again() {
    let b = bucket("cache-scan");
    let hot = pattern(1 << 20, 91);
    let scan = pattern(24 << 20, 92);
    put(&b, "hot", hot.clone());
    put(&b, "scan", scan.clone());
    // Eight 1 MiB blocks; direct I/O so that every read reaches the daemon's cache.
    let m = Mount::new(
        &b,
        &[
            "--cache-size",
            "8MiB",
            "--read-part-size",
            "1MiB",
            "--max-prefetch",
            "2MiB",
            "--direct-io",
        ],
    );
    assert!(read_all(&m.join("hot")) == hot);
    assert!(read_all(&m.join("scan")) == scan);
    assert!(read_all(&m.join("hot")) == hot);
    let hot_gets = m
        .log_text()
        .lines()
        .filter(|l| {
            l.contains("s3 request") && l.contains("op=\"GetObject\"") && l.contains("key=\"hot\"")
        })
        .count();
    assert_eq!(hot_gets, 1, "the hot block survived the scan (drop-behind)");
}

// [S-STATS-CMD]
#[test]
fn s3rdma_stats_shows_the_bytes_a_read_just_moved() {
    let b = bucket("stats-cmd");
    let data = pattern(3 << 20, 71);
    put(&b, "f", data.clone());
    let m = Mount::new(&b, &[]);
    assert!(std::fs::read(m.join("f")).unwrap() == data);
    let text = mount_stats(&m.path);
    let get = |name: &str| stat_value(&text, name);
    assert!(
        get("rdma_bytes_read") + get("http_bytes_read") >= data.len() as u64,
        "{text}"
    );
    assert!(get("cache_misses") >= 1);
    let _ = get("parts_uploaded");
    // Not a mount: a clear error.
    let out = Command::new(bin())
        .arg("stats")
        .arg(work_dir())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not the root of an s3rdma mount"));
}
