//! The local disk cache (`--cache-dir`) and FUSE passthrough: the second epoch of a dataset is
//! read from local files (by the kernel itself where passthrough works), never a stale version,
//! a corrupt entry is dropped and fetched again, a full disk never fails a read, and
//! `s3rdma warm` fills the cache ahead.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::common::*;

/// A fresh cache directory for one test.
fn cache_dir(tag: &str) -> PathBuf {
    let d = work_dir().join(format!("dcache-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn mount_with(b: &str, dir: &Path, extra: &[&str]) -> Mount {
    let mut args = vec![
        "--cache-dir",
        dir.to_str().unwrap(),
        "--read-part-size",
        "4MiB",
    ];
    args.extend_from_slice(extra);
    Mount::new(b, &args)
}

/// `count` files of `size` bytes under `prefix`, each different; returns (key, bytes).
fn dataset(b: &str, prefix: &str, count: usize, size: usize, seed: u64) -> Vec<(String, Vec<u8>)> {
    let files: Vec<(String, Vec<u8>)> = (0..count)
        .map(|i| (format!("{prefix}f{i:03}"), pattern(size, seed + i as u64)))
        .collect();
    for (k, d) in &files {
        put(b, k, d.clone());
    }
    files
}

/// Read every file through the mount and compare its SHA-256.
fn epoch(m: &Mount, files: &[(String, Vec<u8>)]) {
    for (k, want) in files {
        let got = std::fs::read(m.join(k)).unwrap_or_else(|e| panic!("{k}: {e}"));
        assert!(
            Sha256::digest(&got) == Sha256::digest(want),
            "{k}: wrong bytes"
        );
    }
}

/// Wait until the mount's disk cache has stored `n` objects (it writes behind the reads).
fn wait_stored(m: &Mount, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = stat_value(&mount_stats(&m.path), "disk_cache_stored");
        if got >= n {
            return;
        }
        assert!(Instant::now() < deadline, "{got} of {n} objects stored");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn fuse_reads(m: &Mount) -> usize {
    m.log_text()
        .lines()
        .filter(|l| l.contains("op=\"read\"") && l.contains("fuse"))
        .count()
}

// [S-DISK-EPOCH]
/// Epoch 1 fills the disk cache; epoch 2 returns the same bytes with no GET and — through
/// passthrough — no READ reaching the daemon.
#[test]
fn the_second_epoch_is_served_from_local_files_by_the_kernel() {
    let b = bucket("dc-epoch");
    let mut files = dataset(&b, "train/", 12, 256 << 10, 100);
    files.extend(dataset(&b, "big/", 1, (18 << 20) + 4321, 200));
    let dir = cache_dir("epoch");
    let m = mount_with(&b, &dir, &[]);
    epoch(&m, &files);
    wait_stored(&m, files.len() as u64);
    let gets = m.count_requests("GetObject");
    let reads = fuse_reads(&m);
    epoch(&m, &files);
    let stats = mount_stats(&m.path);
    assert_eq!(
        m.count_requests("GetObject"),
        gets,
        "epoch 2 asked S3 for data"
    );
    assert!(
        stat_value(&stats, "disk_cache_hits") >= files.len() as u64,
        "{stats}"
    );
    assert!(
        stat_value(&stats, "passthrough_opens") >= files.len() as u64,
        "passthrough not used: {stats}"
    );
    assert_eq!(fuse_reads(&m), reads, "epoch 2 READs reached the daemon");
    // The kernel's registration of each cache file outlives the opens: a third epoch registers
    // nothing new (each open of epoch 2 and 3 costs one round trip, no ioctls).
    let registered = stat_value(&stats, "passthrough_registrations");
    assert_eq!(registered, files.len() as u64, "{stats}");
    epoch(&m, &files);
    let stats = mount_stats(&m.path);
    assert_eq!(
        stat_value(&stats, "passthrough_registrations"),
        registered,
        "{stats}"
    );
    assert!(stat_value(&stats, "passthrough_opens") >= 2 * files.len() as u64);
    // A file the kernel reads itself from the cache reports the cache file system's preferred
    // I/O size (readers size their buffers by it), not the daemon's 1 MiB. (Past the 1 s
    // metadata TTL, so the kernel asks for the attributes again.)
    std::thread::sleep(Duration::from_millis(1200));
    let cache_blksize = std::fs::metadata(&dir).unwrap().blksize();
    for (k, _) in &files {
        assert_eq!(
            std::fs::metadata(m.join(k)).unwrap().blksize(),
            cache_blksize,
            "{k}"
        );
    }
    // The cache directory holds the objects, with their checksums beside them.
    let metas = walk_files(&dir)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "meta"))
        .count();
    assert_eq!(metas, files.len());
}

// [S-DISK-DAEMON]
/// Without passthrough (`--no-passthrough`, as where the kernel or privileges do not allow
/// it) the daemon serves cached files from disk: right bytes, no GET.
#[test]
fn without_passthrough_the_daemon_serves_cached_files() {
    let b = bucket("dc-nopass");
    let files = dataset(&b, "", 6, (5 << 20) + 17, 300);
    let dir = cache_dir("nopass");
    let m = mount_with(&b, &dir, &["--no-passthrough"]);
    epoch(&m, &files);
    wait_stored(&m, files.len() as u64);
    let gets = m.count_requests("GetObject");
    epoch(&m, &files);
    for (k, _) in &files {
        assert_eq!(
            std::fs::metadata(m.join(k)).unwrap().blksize(),
            1 << 20,
            "{k}"
        );
    }
    let stats = mount_stats(&m.path);
    assert_eq!(
        m.count_requests("GetObject"),
        gets,
        "epoch 2 asked S3 for data"
    );
    assert_eq!(stat_value(&stats, "passthrough_opens"), 0, "{stats}");
    assert!(stat_value(&stats, "disk_cache_hits") >= files.len() as u64);
}

// [S-DISK-ETAG]
/// An object replaced between epochs is read anew (the cache is keyed by ETag, and `open`
/// asks S3 for the current one): the old copy is never served.
#[test]
fn a_replaced_object_is_never_served_from_the_disk_cache() {
    let b = bucket("dc-etag");
    let old = pattern(3 << 20, 401);
    put(&b, "k", old.clone());
    let dir = cache_dir("etag");
    let m = mount_with(&b, &dir, &["--metadata-ttl", "0"]);
    assert!(std::fs::read(m.join("k")).unwrap() == old);
    wait_stored(&m, 1);
    let new = pattern(3 << 20, 402);
    put(&b, "k", new.clone());
    assert!(
        std::fs::read(m.join("k")).unwrap() == new,
        "the stale copy was served"
    );
    wait_stored(&m, 2);
    assert!(std::fs::read(m.join("k")).unwrap() == new);
}

// [S-DISK-REMOUNT]
/// The cache survives a remount: entries are used again after their ETag is confirmed by S3
/// and their blocks' CRCs are checked; a corrupted entry is detected, dropped and read from S3
/// again; a second mount cannot share the directory.
#[test]
fn remount_revalidates_and_a_corrupt_entry_is_fetched_again() {
    let b = bucket("dc-remount");
    let files = dataset(&b, "d/", 5, (4 << 20) + 99, 500);
    let dir = cache_dir("remount");
    let m = mount_with(&b, &dir, &[]);
    epoch(&m, &files);
    wait_stored(&m, files.len() as u64);
    // One directory, one mount.
    let other = mountpoint();
    let mut cmd = s3rdma();
    cmd.arg(&b)
        .arg(&other)
        .args(["--endpoint-url", &server().endpoint, "--force-path-style"])
        .args(["--cache-dir", dir.to_str().unwrap(), "--foreground"]);
    let (code, err) = run_to_end(cmd, Duration::from_secs(60));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("in use by another s3rdma mount"), "{err}");
    drop(m);

    // Flip one byte in the middle of one cached object.
    let data_files: Vec<PathBuf> = walk_files(&dir)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "data"))
        .collect();
    assert_eq!(data_files.len(), files.len());
    let victim = &data_files[0];
    let mut bytes = std::fs::read(victim).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x5a;
    std::fs::write(victim, &bytes).unwrap();

    let m = mount_with(&b, &dir, &[]);
    let gets = m.count_requests("GetObject");
    epoch(&m, &files);
    let stats = mount_stats(&m.path);
    assert_eq!(stat_value(&stats, "disk_cache_corrupt"), 1, "{stats}");
    assert_eq!(
        stat_value(&stats, "disk_cache_hits"),
        files.len() as u64 - 1,
        "{stats}"
    );
    assert!(
        m.count_requests("GetObject") > gets,
        "the corrupt entry was not fetched again"
    );
    assert!(
        m.count_requests("HeadObject") >= files.len(),
        "opens did not ask S3 for the ETag"
    );
    wait_stored(&m, 1);
    let log = m.stop();
    assert!(log.contains("corrupt"), "the corrupt entry was not logged");
}

// [S-DISK-FULL]
/// The cache's file system fills up under it (another program takes the space): writing to
/// the cache fails, the cache shrinks and then turns itself off with a warning, and every read
/// returns the right bytes.
#[test]
fn a_full_disk_turns_the_cache_off_and_reads_never_fail() {
    let b = bucket("dc-full");
    let files = dataset(&b, "", 10, 12 << 20, 600);
    let dir = cache_dir("full");
    let _guard = tmpfs(&dir, "160m");
    let m = mount_with(&b, &dir, &["--cache-dir-size", "150MiB"]);
    // Someone else takes most of the space after the mount sized its cache.
    let filler = dir.join("filler");
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M", "count=130", "status=none"])
        .arg(format!("of={}", filler.display()))
        .status();
    epoch(&m, &files);
    epoch(&m, &files);
    let stats = mount_stats(&m.path);
    assert!(stat_value(&stats, "disk_cache_errors") >= 1, "{stats}");
    let log = m.stop();
    assert!(log.contains("full"), "no warning about the full disk");
}

/// A tmpfs of `size` mounted on `dir` until the guard goes.
fn tmpfs(dir: &Path, size: &str) -> impl Drop {
    let status = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(dir)
        .status()
        .unwrap();
    assert!(status.success(), "cannot mount a tmpfs for the cache");
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    Unmount(dir.to_path_buf())
}

/// Drop the kernel's cached pages of `path`, so that its next read reaches the daemon.
fn forget_pages(path: &Path) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: a valid open descriptor; posix_fadvise touches no memory of ours.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0, "posix_fadvise {}", path.display());
}

/// Bytes in use on the file system of `dir`.
fn used_bytes(dir: &Path) -> u64 {
    let out = Command::new("df")
        .args(["--output=used", "-B1"])
        .arg(dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().nth(1).unwrap().trim().parse().unwrap()
}

// [S-DISK-EVICT]
/// Entries served by passthrough keep their kernel registration between opens, but an evicted
/// entry gives its space back: the kernel's hold on the file goes with the entry.
#[test]
fn evicted_passthrough_entries_give_their_space_back() {
    let b = bucket("dc-evict");
    let files = dataset(&b, "", 10, 12 << 20, 900);
    let dir = cache_dir("evict");
    let _guard = tmpfs(&dir, "200m");
    let m = mount_with(&b, &dir, &["--cache-dir-size", "64MiB"]);
    // Five 12 MiB objects fit in 64 MiB: the last five read stay.
    epoch(&m, &files);
    wait_stored(&m, 10);
    epoch(&m, &files[5..]);
    let stats = mount_stats(&m.path);
    assert!(
        stat_value(&stats, "passthrough_registrations") >= 5,
        "{stats}"
    );
    // The first five come back from S3 (the kernel's pages of them dropped first) and push
    // those five out.
    for (k, _) in &files[..5] {
        forget_pages(&m.join(k));
    }
    epoch(&m, &files[..5]);
    wait_stored(&m, 15);
    let stats = mount_stats(&m.path);
    assert!(stat_value(&stats, "disk_cache_evicted") >= 10, "{stats}");
    let used = used_bytes(&dir);
    assert!(
        used <= 64 << 20,
        "{used} bytes still used on a 64 MiB cache: evicted files are held open; {stats}"
    );
    epoch(&m, &files);
}

/// The daemon raises its soft open-file limit to the hard one, so a start with the common soft
/// limit of 1024 still keeps more than 256 entries' files open (a quarter of the limit).
#[test]
fn the_open_file_limit_is_raised_so_entries_keep_their_files() {
    let b = bucket("dc-nofile");
    let keys: Vec<String> = (0..300).map(|i| format!("s/{i:03}")).collect();
    put_many(&b, keys.clone(), b"a small object of the dataset");
    let dir = cache_dir("nofile");
    let m = Mount::new_under(
        &["prlimit", "--nofile=1024:8192"],
        &server().endpoint,
        &b,
        &["--cache-dir", dir.to_str().unwrap()],
    );
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", m.pid())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    assert_eq!(
        line.split_whitespace().nth(3),
        Some("8192"),
        "soft limit not raised: {line}"
    );
    for k in &keys {
        std::fs::read(m.join(k)).unwrap();
    }
    wait_stored(&m, keys.len() as u64);
    let kept = std::fs::read_dir(format!("/proc/{}/fd", m.pid()))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|p| p.starts_with(&dir) && p.extension().is_some_and(|e| e == "data"))
        .count();
    assert_eq!(kept, keys.len(), "cache files kept open");
}

// [S-DISK-WARM]
/// `s3rdma warm DIR` reads every file once (progress on stderr), after which each is in the
/// disk cache; a second run has nothing to do; a path off such a mount is a clear error.
#[test]
fn warm_fills_the_cache_ahead_of_the_first_epoch() {
    let b = bucket("dc-warm");
    let mut files = dataset(&b, "ds/a/", 20, 128 << 10, 700);
    files.extend(dataset(&b, "ds/b/", 2, (6 << 20) + 5, 800));
    let dir = cache_dir("warm");
    let m = mount_with(&b, &dir, &[]);
    let run = |args: &[&str]| {
        let mut cmd = Command::new(bin());
        cmd.arg("warm").args(args);
        run_to_end(cmd, Duration::from_secs(120))
    };
    let ds = m.join("ds");
    let (code, err) = run(&["--jobs", "4", ds.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("22 files to read"), "{err}");
    assert!(err.contains("22 files now cached"), "{err}");
    for (k, _) in &files {
        assert_eq!(s3rdma::warm::is_cached(&m.join(k)), Some(true), "{k}");
    }
    let (code, err) = run(&[ds.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("0 files to read") && err.contains("22 already cached"),
        "{err}"
    );
    let gets = m.count_requests("GetObject");
    epoch(&m, &files);
    assert_eq!(m.count_requests("GetObject"), gets);
    let (code, err) = run(&[dir.to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--cache-dir"), "{err}");
}

fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

// [S-DISK-TRUST]
/// With `--open-trusts-metadata` and a long TTL, an epoch over cached files sends no request
/// (the listing is reused, its ETags pin the opens); without it, each open asks S3 (one HEAD).
#[test]
fn trusted_metadata_makes_a_cached_epoch_free_of_requests() {
    let b = bucket("dc-trust");
    let files = dataset(&b, "t/", 10, 64 << 10, 900);
    let requests = |m: &Mount| {
        m.log_text()
            .lines()
            .filter(|l| l.contains("s3 request"))
            .count()
    };
    let read_dir_epoch = |m: &Mount| {
        let names = std::fs::read_dir(m.join("t")).unwrap().count();
        assert_eq!(names, files.len());
        epoch(m, &files);
    };
    for trust in [true, false] {
        let dir = cache_dir(&format!("trust-{trust}"));
        let mut args = vec!["--metadata-ttl", "1h"];
        if trust {
            args.push("--open-trusts-metadata");
        }
        let m = mount_with(&b, &dir, &args);
        read_dir_epoch(&m);
        wait_stored(&m, files.len() as u64);
        // Past the 100 ms in which an open reuses the previous open's answer.
        std::thread::sleep(Duration::from_millis(300));
        let before = requests(&m);
        let heads = m.count_requests("HeadObject");
        read_dir_epoch(&m);
        if trust {
            // The directory's listing is younger than the TTL and nothing is asked per file:
            // the epoch sends no request at all.
            assert_eq!(requests(&m), before, "a trusted cached epoch sent requests");
        } else {
            assert_eq!(
                m.count_requests("HeadObject") - heads,
                files.len(),
                "each open should ask S3 once"
            );
            assert_eq!(
                m.count_requests("GetObject"),
                files.len(),
                "data came from S3 twice"
            );
        }
    }
}
