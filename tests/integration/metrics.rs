//! The Prometheus endpoint (`--metrics-addr`) of a real mount: scraped before, during and
//! after reads and writes over HTTP and over loopback RDMA, and while 8 readers load the
//! mount; each scrape is checked by Prometheus's own Python parser (`metrics_check.py`: parses,
//! fixed label sets, cumulative histograms whose +Inf bucket is their count, counters that only
//! grow, every metric the Grafana dashboard queries present); byte counters equal the bytes
//! moved; a non-loopback address is refused without `--metrics-allow-remote`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;

/// The port a mount serves /metrics on, from its log. Port 0 lets the kernel pick one: a port
/// picked by the test could be one a SeaweedFS of another test is about to take again after a
/// restart (the test servers' ports lie below the ephemeral range, port 0 within it).
fn metrics_port(m: &Mount) -> u16 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = m.log_text();
        if let Some(rest) = log.split("metrics at http://127.0.0.1:").nth(1) {
            let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
            if let Ok(p) = digits.parse() {
                return p;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no metrics address in the log:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// GET /metrics: the status line and the body.
fn scrape(port: u16) -> (String, String) {
    let mut c = TcpStream::connect(("127.0.0.1", port)).expect("connect to /metrics");
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: text/plain\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).expect("read /metrics");
    let (head, body) = out.split_once("\r\n\r\n").expect("an HTTP answer");
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

/// The value of the series `name{labels}` (labels as written in the exposition, in order).
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no {series} in the exposition"))
}

/// Scrape into a numbered file of `dir` (for metrics_check.py); the body.
fn keep(port: u16, dir: &Path, files: &mut Vec<PathBuf>) -> String {
    let (status, body) = scrape(port);
    assert_eq!(status, "HTTP/1.1 200 OK");
    let taken = std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0);
    let f = dir.join(format!("scrape-{taken:02}.txt"));
    std::fs::write(&f, &body).unwrap();
    files.push(f);
    body
}

fn check(files: &[PathBuf]) {
    let script = repo_root().join("tests/integration/metrics_check.py");
    let dashboard = repo_root().join("scripts/monitoring/s3rdma-dashboard.json");
    let out = Command::new("python3")
        .arg(script)
        .arg("--dashboard")
        .arg(dashboard)
        .args(files)
        .output()
        .expect("python3 (scripts/setup.sh installs prometheus-client)");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "metrics_check.py: {text}");
}

fn read_all(path: &Path) -> usize {
    std::fs::read(path).expect("read through the mount").len()
}

// [S-STATS-METRICS] [S-STATS-CMD]
#[test]
fn the_endpoint_exports_what_the_mount_did_over_http_and_rdma() {
    let b = bucket("metrics");
    let size = 5 << 20;
    put(&b, "in/a", pattern(size, 1));
    let dir = work_dir().join(format!("metrics-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut files = Vec::new();

    // Over HTTP: a read, then a write.
    let m = Mount::new(&b, &["--rdma", "off", "--metrics-addr", "127.0.0.1:0"]);
    let port = metrics_port(&m);
    let before = keep(port, &dir, &mut files);
    assert!(before.contains("s3rdma_build_info{version=\""), "{before}");
    assert!(before.contains("rdma_mode=\"off\""), "{before}");
    assert!(before.contains(&format!(
        "s3rdma_mount_info{{bucket=\"{b}\",prefix=\"\"}} 1"
    )));
    assert_eq!(read_all(&m.join("in/a")), size);
    let read = keep(port, &dir, &mut files);
    let moved = |t: &str, d: &str, tr: &str| {
        value(
            t,
            &format!("s3rdma_transfer_bytes_total{{direction=\"{d}\",transport=\"{tr}\"}}"),
        )
    };
    assert_eq!(moved(&read, "read", "http"), size as f64);
    assert!(
        value(
            &read,
            "s3rdma_s3_request_seconds_count{operation=\"GetObject\",transport=\"http\"}"
        ) >= 1.0
    );
    assert!(value(&read, "s3rdma_fuse_request_seconds_count{opcode=\"read\"}") >= 1.0);
    assert_eq!(value(&read, "s3rdma_read_first_byte_seconds_count"), 1.0);
    assert!(value(&read, "s3rdma_cache_used_bytes") >= size as f64);
    assert_eq!(
        value(&read, "s3rdma_cache_capacity_bytes"),
        (128u64 << 20) as f64
    );
    let written = 3 << 20;
    std::fs::write(m.join("w"), pattern(written, 2)).unwrap();
    let after = keep(port, &dir, &mut files);
    assert_eq!(moved(&after, "written", "http"), written as f64);
    assert_eq!(value(&after, "s3rdma_objects_written_total"), 1.0);
    assert_eq!(value(&after, "s3rdma_s3_requests_in_flight"), 0.0);
    // `s3rdma stats` prints the same report.
    let stats = mount_stats(&m.path);
    assert_eq!(stat_value(&stats, "http_bytes_read"), size as u64);
    assert_eq!(stat_value(&stats, "http_bytes_written"), written as u64);
    assert!(stat_value(&stats, "s3_get_http_count") >= 1);
    // `s3rdma stats --watch` redraws every second, with the change per second.
    let mut watch = Command::new(bin())
        .args(["stats", "--watch"])
        .arg(&m.path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("s3rdma stats --watch");
    std::thread::sleep(Duration::from_millis(2500));
    let _ = watch.kill();
    let out = watch.wait_with_output().expect("watch output");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.matches("change/s").count() >= 2, "{text}");
    assert!(text.contains("http_bytes_read"), "{text}");

    // 8 readers load the mount: the endpoint keeps answering (it reads shared counters, not
    // the file system).
    for i in 0..8 {
        put(&b, &format!("load/{i}"), pattern(16 << 20, i as u64));
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..8)
        .map(|i| {
            let (path, stop) = (m.join(&format!("load/{i}")), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && n < 50 {
                    drop_caches_of(&path);
                    read_all(&path);
                    n += 1;
                }
            })
        })
        .collect();
    for _ in 0..5 {
        let t = Instant::now();
        keep(port, &dir, &mut files);
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "a scrape under load took {:?}",
            t.elapsed()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    keep(port, &dir, &mut files);
    let (status, _) = {
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        (out.lines().next().unwrap_or("").to_string(), ())
    };
    assert_eq!(status, "HTTP/1.1 404 Not Found");
    drop(m);

    // Over loopback RDMA: the bytes are counted under transport="rdma".
    let ep = RdmaEndpoint::start();
    let m = Mount::new_at(
        &ep.url,
        &b,
        &["--rdma", "required", "--metrics-addr", "127.0.0.1:0"],
    );
    let port = metrics_port(&m);
    let mut rdma_files = Vec::new();
    keep(port, &dir, &mut rdma_files);
    assert_eq!(read_all(&m.join("in/a")), size);
    let t = keep(port, &dir, &mut rdma_files);
    assert!(t.contains("rdma_mode=\"required\""));
    assert_eq!(moved(&t, "read", "rdma"), size as f64);
    assert_eq!(moved(&t, "read", "http"), 0.0);
    assert!(
        value(
            &t,
            "s3rdma_s3_request_seconds_count{operation=\"GetObject\",transport=\"rdma\"}"
        ) >= 1.0
    );
    assert!(value(&t, "s3rdma_rdma_registered_bytes") > 0.0);
    drop(m);
    check(&files);
    check(&rdma_files);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Drop the kernel's cached pages of one file (so a reader goes to the daemon again).
fn drop_caches_of(path: &Path) {
    if let Ok(f) = std::fs::File::open(path) {
        use std::os::fd::AsRawFd;
        // SAFETY: a valid open descriptor; the advice only drops cached pages.
        unsafe {
            libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        }
    }
}

// [S-STATS-METRICS]
#[test]
fn a_remote_metrics_address_needs_the_flag() {
    let b = bucket("metrics-remote");
    let start = |addr: &str| {
        let mut cmd = s3rdma();
        cmd.arg(&b)
            .arg(mountpoint())
            .args([
                "--endpoint-url",
                &server().endpoint,
                "--force-path-style",
                "--foreground",
            ])
            .args(["--metrics-addr", addr]);
        run_to_end(cmd, Duration::from_secs(30))
    };
    let (code, err) = start("0.0.0.0:9464");
    assert_ne!(code, 0);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("--metrics-allow-remote"), "{err}");
    // A taken port fails the start-up with one line naming the option.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let (code, err) = start(&format!("127.0.0.1:{port}"));
    assert_ne!(code, 0);
    assert!(err.contains("--metrics-addr"), "{err}");
}
