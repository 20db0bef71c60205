//! Start-up and lifetime of one mount: `prepare` (checks, daemonizing, logging), `start` (the
//! S3 client, memory, the file system, the kernel mount; each failure one line for the user),
//! the FUSE session, `teardown` (detach, counters, release of every RDMA resource).

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use fuser::{MountOption, SessionACL};
use tracing::{error, info, warn};

use crate::cli::Settings;
use crate::daemon::{self, Readiness};
use crate::transport::Transport;
use crate::{lifecycle, logging, startup};
use s3rdma_client::{ObjectStore, S3Client};
use s3rdma_fs::cache::Cache;
use s3rdma_fs::diskcache::DiskCache;
use s3rdma_fs::fs::{control::FsControl, S3Fs};
use s3rdma_fs::stage::StagingArea;
use s3rdma_fs::upload::pool::WritePool;
use s3rdma_fs::upload::Uploader;
use s3rdma_metrics::Report;

/// The mount while it is served: what `teardown` releases, in order.
struct Mounted {
    rt: tokio::runtime::Runtime,
    memory: Memory,
    disk: Option<Arc<DiskCache>>,
    control: FsControl<S3Client>,
    report: Arc<dyn Report + Send + Sync>,
    /// The mount's device number in mountinfo (to tell it is still ours at the end).
    dev: Option<String>,
}

/// The pinned (and, with RDMA, registered) memory of the mount.
struct Memory {
    cache: Arc<Cache<S3Client>>,
    /// None on a read-only mount (no write buffers at all).
    uploader: Option<Arc<Uploader<S3Client>>>,
}

/// Mount and serve until unmounted. Never returns: exits 0 after a clean unmount, 1 on failure.
pub fn run(settings: Settings) -> ! {
    let (mountpoint, mut readiness) = prepare(&settings);
    let (mounted, session, transport) = match start(&settings, &mountpoint) {
        Ok(m) => m,
        Err(msg) => readiness.fail(&msg),
    };
    readiness.ready();
    let result = match transport.run(session, &mounted.control) {
        // The kernel reports an ended connection as ECONNABORTED when it was aborted, and at
        // times when the last file of a lazily unmounted mount is closed: the session is over
        // either way; what was lost, if anything, is counted by the aborted uploads below.
        Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => {
            warn!("the kernel ended the FUSE connection");
            Ok(())
        }
        r => r,
    };
    teardown(&settings, &mountpoint, mounted, result)
}

/// The checked mountpoint, the daemon (unless `--foreground`) and its logging: what start-up
/// failures are reported through.
fn prepare(settings: &Settings) -> (PathBuf, Readiness) {
    let mountpoint = match startup::check_mountpoint(&settings.mountpoint) {
        Ok(p) => p,
        Err(msg) => Readiness::foreground().fail(&msg),
    };
    let mut readiness = if settings.process.foreground {
        Readiness::foreground()
    } else {
        match daemon::daemonize() {
            Ok(r) => r,
            Err(e) => Readiness::foreground().fail(&format!("cannot start the daemon: {e}")),
        }
    };
    let log_target = logging::Target::choose(
        settings.process.log_file.as_deref(),
        !settings.process.foreground,
    );
    readiness.keep_stderr = log_target.uses_stderr();
    if let Err(msg) = logging::init(&settings.process.log_level, &log_target) {
        readiness.fail(&msg);
    }
    raise_fd_limit();
    (mountpoint, readiness)
}

/// The FUSE session of a mount.
type Session = fuser::Session<S3Fs<S3Client>>;

/// The runtime that moves data to and from S3, with `threads` workers (`--io-threads`).
fn io_runtime(threads: usize) -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name("s3rdma-io")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the I/O runtime: {e}"))
}

/// Everything up to a mounted FUSE session, each failure one line for the user.
fn start(settings: &Settings, mountpoint: &Path) -> Result<(Mounted, Session, Transport), String> {
    let rt = io_runtime(settings.process.io_threads)?;
    let (s3, rdma) = connect(&rt, settings)?;
    // Catch SIGTERM/SIGINT from before the kernel mount exists: a signal that arrives while
    // mounting is kept, and unmounts as soon as the session is up.
    let signals = {
        use tokio::signal::unix::{signal, SignalKind};
        let _guard = rt.enter();
        signal(SignalKind::terminate())
            .and_then(|t| Ok((t, signal(SignalKind::interrupt())?)))
            .map_err(|e| format!("cannot install signal handlers: {e}"))?
    };
    let memory = memory(&rt, settings, &s3)?;
    let disk = disk_cache(settings)?;
    let transport = Transport::choose(settings)?;
    let mut fs_cfg = settings.fs.clone();
    fs_cfg.ring_max_write = transport.ring_max_write();
    let notifier = Arc::new(OnceLock::new());
    let mut fs = S3Fs::new(
        rt.handle().clone(),
        s3,
        memory.cache.clone(),
        &settings.prefix,
        fs_cfg,
        notifier.clone(),
        memory.uploader.clone(),
    );
    fs.set_transport_report(transport.stats.clone());
    if let Some(d) = &disk {
        fs.set_disk_cache(d.clone(), settings.local.passthrough);
    }
    if memory.uploader.is_some() {
        fs.set_staging(staging(settings)?);
    }
    let (control, report) = (fs.control(), Arc::new(fs.reporter()));
    if let Some(addr) = settings.process.metrics_addr {
        serve_metrics(&rt, settings, addr, rdma, report.clone())?;
    }
    let threads = transport.dev_threads(settings.kernel.max_threads);
    let session = session(fs, mountpoint, settings, threads)?;
    let _ = notifier.set(session.notifier());
    let dev = lifecycle::mount_dev(mountpoint);
    if let Some(dev) = &dev {
        set_read_ahead(dev, settings.memory.read_ahead_kb);
    }
    let shutdown = lifecycle::Shutdown {
        mountpoint: mountpoint.to_path_buf(),
        dev: dev.clone(),
        grace: settings.process.shutdown_grace,
        control: control.clone(),
    };
    rt.spawn(lifecycle::on_signals(signals.0, signals.1, shutdown));
    info!(
        bucket = %settings.bucket,
        prefix = %settings.prefix,
        mountpoint = %mountpoint.display(),
        "mounted"
    );
    let report: Arc<dyn Report + Send + Sync> = report;
    background(&rt, settings, &memory, &report);
    let mounted = Mounted {
        rt,
        memory,
        disk,
        control,
        report,
        dev,
    };
    Ok((mounted, session, transport))
}

/// The disk cache (`--cache-dir`), if any.
fn disk_cache(settings: &Settings) -> Result<Option<Arc<DiskCache>>, String> {
    let Some(dir) = &settings.local.cache_dir else {
        return Ok(None);
    };
    let limit = settings
        .local
        .cache_dir_size
        .unwrap_or_else(|| s3rdma_fs::diskcache::default_size(dir));
    let part = settings.fs.read.part_size;
    let disk = DiskCache::open(dir, limit, &settings.bucket, part).map_err(|e| e.to_string())?;
    Ok(Some(disk))
}

/// The S3 client, with `rdma=` resolved once (auto may become off), once the bucket answers.
fn connect(
    rt: &tokio::runtime::Runtime,
    settings: &Settings,
) -> Result<(S3Client, s3rdma_client::RdmaMode), String> {
    let mut s3_opts = settings.s3.clone();
    s3_opts.rdma = s3rdma_client::mode::resolve_mode(
        s3_opts.rdma,
        s3_opts.endpoint_url.as_deref(),
        settings.rdma_init_timeout,
    )?;
    let s3 = rt.block_on(S3Client::new(&s3_opts));
    rt.block_on(startup::check_bucket(&s3, &settings.prefix))?;
    Ok((s3, s3_opts.rdma))
}

/// The page cache and (unless read-only) the write buffers.
fn memory(
    rt: &tokio::runtime::Runtime,
    settings: &Settings,
    s3: &S3Client,
) -> Result<Memory, String> {
    let part = settings.fs.read.part_size;
    let blocks = (settings.memory.cache_size / part) as usize;
    let cache = Cache::new(
        s3.clone(),
        part as usize,
        blocks,
        settings.memory.max_inflight_reads,
    )
    .map_err(|e| e.to_string())?;
    let cache = Arc::new(cache);
    info!(
        bytes = settings.memory.cache_size,
        blocks,
        block_size = part,
        "page cache ready"
    );
    if settings.kernel.read_only {
        return Ok(Memory {
            cache,
            uploader: None,
        });
    }
    let pool = WritePool::new(
        settings.memory.write_part_size as usize,
        (settings.memory.write_buffer_size / settings.memory.write_part_size) as usize,
        s3.rdma_mode() != s3rdma_client::RdmaMode::Off,
    )
    .map_err(|e| e.to_string())?;
    let uploader = Arc::new(Uploader::new(
        s3.clone(),
        rt.handle().clone(),
        Arc::new(pool),
        settings.memory.upload_concurrency,
    ));
    info!(
        bytes = settings.memory.write_buffer_size,
        part_size = settings.memory.write_part_size,
        max_file_size = uploader.max_file_size(),
        "write buffers ready (mapped by the first write)"
    );
    Ok(Memory {
        cache,
        uploader: Some(uploader),
    })
}

/// The staging area of a writable mount.
fn staging(settings: &Settings) -> Result<Arc<StagingArea>, String> {
    let dir = &settings.local.staging_dir;
    std::fs::create_dir_all(dir).map_err(|e| {
        format!(
            "cannot create the staging directory {}: {e}; give a writable --staging-dir",
            dir.display()
        )
    })?;
    let limit = settings
        .local
        .staging_size
        .unwrap_or_else(|| s3rdma_fs::diskcache::default_size(dir));
    let area = StagingArea::open(dir, limit).map_err(|e| e.to_string())?;
    info!(dir = %dir.display(), limit, "staged files ready");
    Ok(Arc::new(area))
}

/// The Prometheus endpoint (`--metrics-addr`), bound now so that a taken port fails start-up.
fn serve_metrics(
    rt: &tokio::runtime::Runtime,
    settings: &Settings,
    addr: std::net::SocketAddr,
    rdma: s3rdma_client::RdmaMode,
    report: Arc<dyn Report + Send + Sync>,
) -> Result<(), String> {
    let listener = rt.block_on(crate::metrics::bind(addr))?;
    let info = crate::metrics::Info {
        version: crate::cli::VERSION.to_string(),
        provider: cuobj_ffi::provider().to_string(),
        // The mode in effect (auto without an RDMA device runs as off).
        rdma: format!("{rdma:?}").to_lowercase(),
        bucket: settings.bucket.clone(),
        prefix: settings.prefix.clone(),
    };
    rt.spawn(crate::metrics::serve(listener, report, info));
    Ok(())
}

/// The kernel mount and its FUSE session.
fn session(
    fs: S3Fs<S3Client>,
    mountpoint: &Path,
    settings: &Settings,
    threads: usize,
) -> Result<Session, String> {
    let mut config = fuser::Config::default();
    config.mount_options = mount_options(settings);
    config.acl = if settings.kernel.allow_other {
        SessionACL::All
    } else if settings.kernel.allow_root {
        SessionACL::RootAndOwner
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(threads);
    config.clone_fd = true;
    fuser::Session::new(fs, mountpoint, &config).map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::NotFound {
            " (is fusermount3 installed? apt-get install fuse3)"
        } else {
            ""
        };
        format!("cannot mount on {}: {e}{hint}", mountpoint.display())
    })
}

/// The counters as `name value` lines, for the stats file and the unmount log line.
fn summary(report: &Arc<dyn Report + Send + Sync>) -> String {
    let mut text = s3rdma_metrics::StatsText::default();
    report.report(&mut text);
    text.text
}

/// The mount's background tasks: memory given back when idle, the stats file.
fn background(
    rt: &tokio::runtime::Runtime,
    settings: &Settings,
    memory: &Memory,
    report: &Arc<dyn Report + Send + Sync>,
) {
    // Memory unused for the idle timeout goes back to the system [S-MEM-GIVE-BACK].
    if !settings.memory.memory_idle_timeout.is_zero() {
        let idle = settings.memory.memory_idle_timeout;
        let cache = memory.cache.clone();
        let pool = memory.uploader.as_ref().map(|u| u.pool());
        rt.spawn(async move {
            let mut tick = tokio::time::interval((idle / 4).max(Duration::from_secs(1)));
            loop {
                tick.tick().await;
                let bytes = cache.give_back_idle(idle)
                    + pool.as_ref().map_or(0, |p| p.give_back_idle(idle));
                let _ = tokio::task::spawn_blocking(move || s3rdma_fs::trim_heap(bytes > 0)).await;
                if bytes > 0 {
                    tracing::debug!(
                        bytes,
                        "idle cache blocks and write buffers gave their memory back"
                    );
                }
            }
        });
    }
    if let Some(path) = settings.process.stats_file.clone() {
        let report = report.clone();
        rt.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                write_stats(&path, &summary(&report));
            }
        });
    }
}

/// After the session: detach a mount the kernel left behind, log the counters, release every
/// RDMA resource, and exit (1 if the session failed or files being written were lost).
fn teardown(
    settings: &Settings,
    mountpoint: &Path,
    mounted: Mounted,
    result: std::io::Result<()>,
) -> ! {
    // From here the process must end, whatever is stuck.
    lifecycle::watchdog(Duration::from_secs(60), "final release");
    if let Err(e) = &result {
        error!(error = %e, "FUSE session ended with an error");
    }
    // A connection ended by the kernel leaves its mount behind ("Transport endpoint is not
    // connected"): detach it, if it is still ours.
    if lifecycle::is_mounted(mountpoint, mounted.dev.as_deref()) {
        match lifecycle::unmount(mountpoint, true) {
            Ok(()) => {
                info!(mountpoint = %mountpoint.display(), "detached the mount left by the ended connection")
            }
            Err(e) => warn!(error = %e, "cannot detach the ended mount; run fusermount3 -uz on it"),
        }
    }
    let summary_text = summary(&mounted.report);
    if let Some(path) = &settings.process.stats_file {
        write_stats(path, &summary_text);
    }
    let one_line: Vec<String> = summary_text
        .lines()
        .map(|l| l.replacen(' ', "=", 1))
        .collect();
    info!(mountpoint = %mountpoint.display(), stats = %one_line.join(" "), "unmounted");
    let aborted = mounted.control.aborted();
    release(mounted);
    if aborted > 0 {
        error!(
            files = aborted,
            "exiting with an error: files being written were not stored (see the log above)"
        );
    }
    std::process::exit(if result.is_err() || aborted > 0 { 1 } else { 0 })
}

/// Release everything registered with cuObject: the disk cache first (its writer may be
/// fetching a block on the runtime), then the tasks (they hold blocks and tokens), then the
/// cache and the write buffers; and say whether anything is still held.
fn release(mounted: Mounted) {
    let Mounted {
        rt,
        memory,
        disk,
        report,
        ..
    } = mounted;
    if let Some(d) = disk {
        d.close();
    }
    rt.shutdown_timeout(Duration::from_secs(5));
    drop(report);
    drop(memory);
    let live = cuobj_ffi::live();
    if live == cuobj_ffi::Live::default() {
        info!(
            registrations = live.registrations,
            tokens = live.tokens,
            "released every RDMA registration and token"
        );
    } else {
        warn!(
            registrations = live.registrations,
            registered_bytes = live.registered_bytes,
            tokens = live.tokens,
            "RDMA resources still held at exit; the process exit releases them"
        );
    }
}

/// Raise the soft limit on open files to the hard one, as Go programs do and systemd advises for
/// programs that need many (the soft limit is often 1024, kept low for select(), which the
/// daemon does not use): the disk cache keeps up to a quarter of the limit open, one file per
/// entry.
fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    if soft >= hard {
        return;
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => info!(
            from = soft,
            to = hard,
            "raised the open-file limit to its hard limit"
        ),
        Err(e) => warn!(limit = soft, error = %e, "cannot raise the open-file limit"),
    }
}

/// Replace `path` (atomically, by rename) with the counters, one `name value` per line.
fn write_stats(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    if let Err(e) = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path)) {
        tracing::debug!(path = %path.display(), error = %e, "cannot write the stats file");
    }
}

/// Raise the kernel's read-ahead for this mount (its bdi `read_ahead_kb`, by the device number
/// from mountinfo: a stat of the mountpoint would ask this very file system, which does not
/// serve requests yet), so buffered reads arrive in large requests. Needs root; otherwise the
/// kernel default stays.
fn set_read_ahead(dev: &str, kb: u32) {
    let path = format!("/sys/class/bdi/{dev}/read_ahead_kb");
    match std::fs::write(&path, kb.to_string()) {
        Ok(()) => tracing::debug!(path, kb, "kernel read-ahead set"),
        Err(e) => {
            tracing::info!(path, error = %e, "cannot set the kernel read-ahead (needs root); buffered reads stay at the kernel default")
        }
    }
}

fn mount_options(s: &Settings) -> Vec<MountOption> {
    let mut opts = vec![
        MountOption::FSName(s.fsname()),
        MountOption::Subtype("s3rdma".into()),
        MountOption::DefaultPermissions,
        MountOption::NoAtime,
    ];
    if s.kernel.read_only {
        // The kernel refuses writes with EROFS up front.
        opts.push(MountOption::RO);
    }
    let user_set =
        |a: &MountOption, b: &MountOption| s.kernel.kernel_flags.iter().any(|f| f == a || f == b);
    if !user_set(&MountOption::Dev, &MountOption::NoDev) {
        opts.push(MountOption::NoDev);
    }
    if !user_set(&MountOption::Suid, &MountOption::NoSuid) {
        opts.push(MountOption::NoSuid);
    }
    opts.extend(s.kernel.kernel_flags.iter().cloned());
    if s.kernel.auto_unmount {
        opts.push(MountOption::AutoUnmount);
    }
    opts
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_io_runtime_has_the_threads_asked_for() {
        for n in [1, 3] {
            let rt = super::io_runtime(n).unwrap();
            assert_eq!(rt.metrics().num_workers(), n);
        }
    }
}
