//! The FUSE transport (`--fuse-transport`): FUSE over io_uring where the kernel offers it,
//! `/dev/fuse` otherwise. The rest of the suite runs on whichever `S3RDMA_IT_FUSE_TRANSPORT`
//! names (`scripts/test.sh` runs it on both); these tests check what depends on the kernel's
//! switch, whichever way it is set now — `scripts/test.sh` runs them with it off and on.

use std::time::Duration;

use crate::common::*;

const SWITCH: &str = "/sys/module/fuse/parameters/enable_uring";

/// Whether the kernel offers FUSE over io_uring to a mount made now.
fn offered() -> bool {
    std::fs::read_to_string(SWITCH).is_ok_and(|v| matches!(v.trim(), "Y" | "1"))
        && std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
            .map_or(true, |v| v.trim() == "0")
}

fn served_by_rings(m: &Mount) -> bool {
    stat_value(&mount_stats(&m.path), "fuse_over_io_uring") == 1
}

/// The kernel's FUSE queues: one per possible CPU (the highest id plus one).
fn kernel_queues() -> usize {
    let list = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    let top = list
        .trim()
        .split([',', '-'])
        .filter_map(|n| n.parse::<usize>().ok())
        .max();
    top.unwrap() + 1
}

/// The CPUs each of the daemon's `fuse-ring-*` threads (one per ring entry) may run on, as
/// `/proc` lists them (`0-1`, `3`).
fn ring_threads(m: &Mount) -> Vec<String> {
    let tasks = std::fs::read_dir(format!("/proc/{}/task", m.pid())).unwrap();
    tasks
        .filter_map(|t| {
            let dir = t.ok()?.path();
            let comm = std::fs::read_to_string(dir.join("comm")).ok()?;
            let status = std::fs::read_to_string(dir.join("status")).ok()?;
            let cpus = status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
            comm.starts_with("fuse-ring-")
                .then(|| cpus.trim().to_string())
        })
        .collect()
}

/// [S-FUSE-TRANSPORT] `uring` serves every request of a small workload through the rings
/// (the counters say so) where the kernel offers them, with `--fuse-queue-depth` entries (and
/// threads) per kernel queue, and refuses to mount, in one line naming the switch, where it
/// does not.
#[test]
fn uring_serves_through_the_rings_or_refuses_naming_the_switch() {
    let b = bucket("transport-uring");
    put(&b, "a", pattern(3 << 20, 1));
    if !offered() {
        let mnt = mountpoint();
        let mut cmd = s3rdma();
        cmd.arg(&b)
            .arg(&mnt)
            .args(["--endpoint-url", &server().endpoint, "--force-path-style"])
            .args(["--foreground", "--fuse-transport", "uring"]);
        let (code, err) = run_to_end(cmd, Duration::from_secs(60));
        assert_eq!(code, 1, "{err}");
        let lines: Vec<&str> = err
            .lines()
            .filter(|l| l.contains("s3rdma: error:"))
            .collect();
        assert_eq!(lines.len(), 1, "{err}");
        assert!(
            lines[0].contains(SWITCH) || lines[0].contains("io_uring"),
            "{err}"
        );
        assert!(!is_mounted(&mnt));
        return;
    }
    let m = Mount::new(
        &b,
        &["--fuse-transport", "uring", "--fuse-queue-depth", "3"],
    );
    // `depth` threads per queue, each kept on its queue's CPU (where this process may run
    // on every CPU the kernel has queues for).
    let threads = ring_threads(&m);
    assert_eq!(threads.len(), kernel_queues() * 3, "{threads:?}");
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    let ours = std::fs::read_to_string("/proc/self/status").unwrap();
    let ours = ours
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"));
    let every = format!("0-{}", kernel_queues() - 1);
    if kernel_queues() > 1 && online.trim() == every && ours.map(str::trim) == Some(&every) {
        for cpu in 0..kernel_queues() {
            let on = threads.iter().filter(|c| **c == cpu.to_string()).count();
            assert_eq!(on, 3, "CPU {cpu}: {threads:?}");
        }
    }
    assert_eq!(std::fs::read(m.join("a")).unwrap(), pattern(3 << 20, 1));
    std::fs::write(m.join("w"), pattern(5 << 20, 2)).unwrap();
    std::fs::create_dir(m.join("d")).unwrap();
    let names: Vec<_> = std::fs::read_dir(&m.path)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
    let stats = mount_stats(&m.path);
    assert!(served_by_rings(&m), "{stats}");
    // Every request of the workload came through the rings (FORGET and INTERRUPT do not count
    // as requests there; the /dev/fuse threads see only those and what came before the rings).
    assert!(stat_value(&stats, "fuse_ring_requests") >= 20, "{stats}");
    assert_eq!(
        stat_value(&stats, "fuse_ring_entries_refused"),
        0,
        "{stats}"
    );
    let log = m.stop();
    assert!(log.contains("FUSE over io_uring"), "{}", tail(&log, 2000));
    assert_eq!(backend_get(&b, "w"), Some(pattern(5 << 20, 2)));
}

/// [S-FUSE-TRANSPORT] `auto` serves over /dev/fuse (the rings do not measure ahead of it
/// yet) and says why in one INFO line — the switch when the kernel does not offer the rings;
/// `dev` never takes them.
#[test]
fn auto_and_dev_serve_over_dev_fuse_and_auto_says_why() {
    let b = bucket("transport-auto");
    put(&b, "a", b"auto".to_vec());
    let auto = Mount::new(&b, &["--fuse-transport", "auto"]);
    assert_eq!(std::fs::read(auto.join("a")).unwrap(), b"auto");
    assert!(!served_by_rings(&auto));
    let log = auto.stop();
    let why: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("go over /dev/fuse"))
        .collect();
    assert_eq!(why.len(), 1, "{}", tail(&log, 2000));
    assert!(why[0].contains("INFO"), "{}", why[0]);
    let named = if offered() {
        "--fuse-transport uring"
    } else {
        SWITCH
    };
    assert!(why[0].contains(named), "{}", why[0]);
    let dev = Mount::new(&b, &["--fuse-transport", "dev"]);
    assert_eq!(std::fs::read(dev.join("a")).unwrap(), b"auto");
    let stats = mount_stats(&dev.path);
    assert_eq!(stat_value(&stats, "fuse_over_io_uring"), 0, "{stats}");
    assert_eq!(stat_value(&stats, "fuse_ring_requests"), 0, "{stats}");
    dev.stop();
}
