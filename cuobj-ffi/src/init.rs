//! Constructing the process's one cuObject client without ever hanging, and telling what was
//! loaded.
//!
//! NVIDIA's library spins inside cuFile when a client is constructed on a host without an RDMA
//! device (seen for more than 60 s), so with the `nvidia` provider:
//! - no client is constructed unless the host has an RDMA port that is up: some
//!   `/sys/class/infiniband/<device>/ports/<n>/state` reads `4: ACTIVE` (what `ibv_devinfo`
//!   reports as `PORT_ACTIVE`; a NIC whose link is down, or no NIC, has none);
//! - the construction runs on a thread of its own, waited for at most a deadline
//!   ([`client_within`]): a device can exist and still not answer. Past the deadline the
//!   caller gets an error (the mount goes on over HTTP, or refuses under `rdma=required`); the
//!   thread is left to finish or spin at the lowest CPU priority, and its client, if it ever
//!   comes, is not used.
//!
//! `S3RDMA_TEST_ASSUME_RDMA_DEVICE=1` skips the device check: a test-only hook that makes the
//! real library spin, to show the deadline holds.

use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Once, OnceLock};
use std::time::{Duration, Instant};

use crate::{provider, sys, Client, Error, Provider};

/// The deadline of [`crate::client`] (callers that do not choose one).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(10);

/// The test-only hook (see the module comment).
pub const ASSUME_DEVICE_ENV: &str = "S3RDMA_TEST_ASSUME_RDMA_DEVICE";

static CLIENT: OnceLock<Result<Client, Error>> = OnceLock::new();
static STARTED: Once = Once::new();
static START: OnceLock<Instant> = OnceLock::new();
static TIMED_OUT: AtomicBool = AtomicBool::new(false);

/// The RDMA port this host has up (`mlx5_0 port 1`), or why there is none. The loopback
/// provider needs none.
pub fn rdma_device() -> Result<String, String> {
    if provider() == Provider::Loopback {
        return Ok("loopback (s3rdma-endpoint on this host)".into());
    }
    if std::env::var_os(ASSUME_DEVICE_ENV).is_some_and(|v| v == "1") {
        return Ok(format!("assumed ({ASSUME_DEVICE_ENV}=1, a test hook)"));
    }
    active_port(Path::new("/sys/class/infiniband"))
}

/// The first port in state ACTIVE under `root` (`/sys/class/infiniband`).
pub(crate) fn active_port(root: &Path) -> Result<String, String> {
    let devices = sorted_entries(root).ok_or_else(|| {
        format!(
            "no RDMA device on this host ({} does not exist: no RDMA NIC, or its driver is not loaded)",
            root.display()
        )
    })?;
    let mut seen = Vec::new();
    for (name, dev) in devices {
        for (n, port) in sorted_entries(&dev.join("ports")).unwrap_or_default() {
            let state = std::fs::read_to_string(port.join("state")).unwrap_or_default();
            if state.contains("ACTIVE") && !state.contains("INACTIVE") {
                return Ok(format!("{name} port {n}"));
            }
            seen.push(format!("{name} port {n}: {}", state.trim()));
        }
    }
    if seen.is_empty() {
        Err(format!(
            "no RDMA device on this host ({} lists none)",
            root.display()
        ))
    } else {
        Err(format!(
            "no RDMA port is up ({}); check the link (ibv_devinfo)",
            seen.join(", ")
        ))
    }
}

/// The entries of `dir` (name, path), sorted by name; `None` if it cannot be read.
fn sorted_entries(dir: &Path) -> Option<Vec<(String, PathBuf)>> {
    let mut v: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
        .collect();
    v.sort();
    Some(v)
}

/// The client, constructed on first use within `deadline` (see the module comment); later
/// calls return the same outcome at once.
pub fn client_within(deadline: Duration) -> Result<&'static Client, Error> {
    if let Some(r) = CLIENT.get() {
        return r.as_ref().map_err(Clone::clone);
    }
    if let Err(why) = rdma_device() {
        return Err(Error(why));
    }
    STARTED.call_once(|| {
        let _ = START.set(Instant::now());
        let spawned = std::thread::Builder::new()
            .name("cuobj-init".into())
            .spawn(|| {
                // SAFETY: changes only this thread's nice value (Linux: `who` 0 is the
                // calling thread); a construction that spins does so at the lowest priority.
                unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) };
                let _ = CLIENT.set(construct());
            });
        if let Err(e) = spawned {
            let _ = CLIENT.set(Err(Error(format!(
                "cannot start the cuObject client's thread: {e}"
            ))));
        }
    });
    if TIMED_OUT.load(Ordering::SeqCst) {
        return Err(timed_out(deadline));
    }
    let start = START.get().copied().unwrap_or_else(Instant::now);
    loop {
        if let Some(r) = CLIENT.get() {
            return r.as_ref().map_err(Clone::clone);
        }
        if start.elapsed() >= deadline {
            TIMED_OUT.store(true, Ordering::SeqCst);
            return Err(timed_out(deadline));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn timed_out(deadline: Duration) -> Error {
    Error(format!(
        "constructing the cuObject client did not return within {deadline:?} (an RDMA device is present but cuFile does not answer: check the NIC, nvidia-fs and the cuFile configuration; --rdma-init-timeout sets this deadline)"
    ))
}

fn construct() -> Result<Client, Error> {
    // SAFETY: plain constructor; NULL on failure.
    let raw = unsafe { sys::s3rdma_cuobj_client_new() };
    NonNull::new(raw).map(|raw| Client { raw }).ok_or_else(|| {
        Error(format!(
            "cuObjClient construction failed ({} provider): missing RDMA NIC, cuFile/cuObject configuration (CUFILE_ENV_PATH_JSON, rdma_dev_addr_list) or version-matched libraries",
            provider()
        ))
    })
}

/// The cuObject library this process loaded: its path and version (from its file name,
/// `libcuobjclient.so.1.2.0`), or `None` with the loopback provider (built in).
pub fn library() -> Option<(PathBuf, String)> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let path = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("libcuobjclient.so"))?;
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| PathBuf::from(path));
    let name = real.file_name()?.to_string_lossy().into_owned();
    let version = name
        .split_once(".so.")
        .map_or_else(|| "unknown".to_string(), |(_, v)| v.to_string());
    Some((real, version))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(root: &Path, dev: &str, n: &str, state: &str) {
        let p = root.join(dev).join("ports").join(n);
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("state"), state).unwrap();
    }

    #[test]
    fn an_rdma_device_is_a_port_in_state_active() {
        let t = std::env::temp_dir().join(format!("cuobj-sysfs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&t);
        let missing = active_port(&t).unwrap_err();
        assert!(missing.contains("does not exist"), "{missing}");
        std::fs::create_dir_all(&t).unwrap();
        assert!(active_port(&t).unwrap_err().contains("lists none"));
        port(&t, "mlx5_0", "1", "1: DOWN\n");
        let down = active_port(&t).unwrap_err();
        assert!(down.contains("mlx5_0 port 1: 1: DOWN"), "{down}");
        port(&t, "mlx5_1", "1", "4: ACTIVE\n");
        assert_eq!(active_port(&t), Ok("mlx5_1 port 1".to_string()));
        let _ = std::fs::remove_dir_all(&t);
    }
}
