//! Start-up and lifetime of one mount: checks, daemonizing, the FUSE session, signals.

use std::sync::{Arc, OnceLock};

use fuser::{MountOption, SessionACL};
use tracing::{error, info, warn};

use crate::cli::Settings;
use crate::daemon::{self, Readiness};
use crate::{lifecycle, logging, startup};
use s3rdma_client::{ObjectStore, S3Client};
use s3rdma_fs::cache::Cache;
use s3rdma_fs::fs::S3Fs;
use s3rdma_fs::upload::pool::WritePool;
use s3rdma_fs::upload::Uploader;

/// Mount and serve until unmounted. Never returns: exits 0 after a clean unmount, 1 on failure.
pub fn run(settings: Settings) -> ! {
    let mountpoint = match startup::check_mountpoint(&settings.mountpoint) {
        Ok(p) => p,
        Err(msg) => Readiness::foreground().fail(&msg),
    };
    let mut readiness = if settings.foreground {
        Readiness::foreground()
    } else {
        match daemon::daemonize() {
            Ok(r) => r,
            Err(e) => Readiness::foreground().fail(&format!("cannot start the daemon: {e}")),
        }
    };
    let log_target = logging::Target::choose(settings.log_file.as_deref(), !settings.foreground);
    readiness.keep_stderr = log_target.uses_stderr();
    if let Err(msg) = logging::init(&settings.log_level, &log_target) {
        readiness.fail(&msg);
    }
    raise_fd_limit();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .thread_name("s3rdma-io")
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => readiness.fail(&format!("cannot start the I/O runtime: {e}")),
    };

    // Resolve rdma= once (auto may become off); the client then runs with what was resolved.
    let mut s3_opts = settings.s3.clone();
    match s3rdma_client::mode::resolve_mode(
        s3_opts.rdma,
        s3_opts.endpoint_url.as_deref(),
        settings.rdma_init_timeout,
    ) {
        Ok(mode) => s3_opts.rdma = mode,
        Err(msg) => readiness.fail(&msg),
    }
    let s3 = rt.block_on(S3Client::new(&s3_opts));
    if let Err(msg) = rt.block_on(startup::check_bucket(&s3, &settings.prefix)) {
        readiness.fail(&msg);
    }

    // Catch SIGTERM/SIGINT from before the kernel mount exists: a signal that arrives while
    // mounting is kept, and unmounts as soon as the session is up.
    let (term, int) = {
        use tokio::signal::unix::{signal, SignalKind};
        let _guard = rt.enter();
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(t), Ok(i)) => (t, i),
            (Err(e), _) | (_, Err(e)) => {
                readiness.fail(&format!("cannot install signal handlers: {e}"))
            }
        }
    };
    let blocks = (settings.cache_size / settings.fs.read.part_size) as usize;
    let cache = match Cache::new(
        s3.clone(),
        settings.fs.read.part_size as usize,
        blocks,
        settings.max_inflight_reads,
    ) {
        Ok(c) => Arc::new(c),
        Err(msg) => readiness.fail(&msg),
    };
    info!(
        bytes = settings.cache_size,
        blocks,
        block_size = settings.fs.read.part_size,
        "page cache ready"
    );
    // A read-only mount has no write buffers at all.
    let uploader = if settings.read_only {
        None
    } else {
        let pool = match WritePool::new(
            settings.write_part_size as usize,
            (settings.write_buffer_size / settings.write_part_size) as usize,
            s3.rdma_mode() != s3rdma_client::RdmaMode::Off,
        ) {
            Ok(p) => Arc::new(p),
            Err(msg) => readiness.fail(&msg),
        };
        let uploader = Arc::new(Uploader::new(
            s3.clone(),
            rt.handle().clone(),
            pool.clone(),
            settings.upload_concurrency,
        ));
        info!(
            bytes = settings.write_buffer_size,
            part_size = settings.write_part_size,
            max_file_size = uploader.max_file_size(),
            "write buffers ready (mapped by the first write)"
        );
        Some(uploader)
    };
    let disk = match &settings.cache_dir {
        Some(dir) => {
            let limit = settings
                .cache_dir_size
                .unwrap_or_else(|| s3rdma_fs::diskcache::default_size(dir));
            match s3rdma_fs::diskcache::DiskCache::open(
                dir,
                limit,
                &settings.bucket,
                settings.fs.read.part_size,
            ) {
                Ok(d) => Some(d),
                Err(msg) => readiness.fail(&msg),
            }
        }
        None => None,
    };
    let notifier = Arc::new(OnceLock::new());
    let mut fs = S3Fs::new(
        rt.handle().clone(),
        s3,
        cache.clone(),
        &settings.prefix,
        settings.fs.clone(),
        notifier.clone(),
        uploader.clone(),
    );
    if let Some(d) = &disk {
        fs.set_disk_cache(d.clone(), settings.passthrough);
    }
    if uploader.is_some() {
        let dir = &settings.staging_dir;
        if let Err(e) = std::fs::create_dir_all(dir) {
            readiness.fail(&format!(
                "cannot create the staging directory {}: {e}; give a writable --staging-dir",
                dir.display()
            ));
        }
        let limit = settings
            .staging_size
            .unwrap_or_else(|| s3rdma_fs::diskcache::default_size(dir));
        match s3rdma_fs::stage::StagingArea::open(dir, limit) {
            Ok(area) => {
                info!(dir = %dir.display(), limit, "staged files ready");
                fs.set_staging(Arc::new(area));
            }
            Err(msg) => readiness.fail(&msg),
        }
    }
    let control = fs.control();
    let report: Arc<dyn s3rdma_metrics::Report + Send + Sync> = Arc::new(fs.reporter());
    if let Some(addr) = settings.metrics_addr {
        match rt.block_on(crate::metrics::bind(addr)) {
            Ok(listener) => {
                let info = crate::metrics::Info {
                    version: crate::cli::VERSION.to_string(),
                    provider: cuobj_ffi::provider().to_string(),
                    // The mode in effect (auto without an RDMA device runs as off).
                    rdma: format!("{:?}", s3_opts.rdma).to_lowercase(),
                    bucket: settings.bucket.clone(),
                    prefix: settings.prefix.clone(),
                };
                rt.spawn(crate::metrics::serve(listener, report.clone(), info));
            }
            Err(msg) => readiness.fail(&msg),
        }
    }
    let mut config = fuser::Config::default();
    config.mount_options = mount_options(&settings);
    config.acl = if settings.allow_other {
        SessionACL::All
    } else if settings.allow_root {
        SessionACL::RootAndOwner
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(settings.max_threads);
    config.clone_fd = true;

    let session = match fuser::Session::new(fs, &mountpoint, &config) {
        Ok(s) => s,
        Err(e) => readiness.fail(&format!(
            "cannot mount on {}: {e}{}",
            mountpoint.display(),
            if e.kind() == std::io::ErrorKind::NotFound {
                " (is fusermount3 installed? apt-get install fuse3)"
            } else {
                ""
            }
        )),
    };
    let _ = notifier.set(session.notifier());
    let dev = lifecycle::mount_dev(&mountpoint);
    if let Some(dev) = &dev {
        set_read_ahead(dev, settings.read_ahead_kb);
    }
    rt.spawn(lifecycle::on_signals(
        term,
        int,
        lifecycle::Shutdown {
            mountpoint: mountpoint.clone(),
            dev: dev.clone(),
            grace: settings.shutdown_grace,
            control: control.clone(),
        },
    ));

    info!(
        bucket = %settings.bucket,
        prefix = %settings.prefix,
        mountpoint = %mountpoint.display(),
        "mounted"
    );
    // The counters as `name value` lines, for the stats file and the unmount log line.
    let summary = {
        let report = report.clone();
        move || {
            let mut text = s3rdma_metrics::StatsText::default();
            report.report(&mut text);
            text.text
        }
    };
    // Memory unused for the idle timeout goes back to the system [S-MEM-GIVE-BACK].
    if !settings.memory_idle_timeout.is_zero() {
        let idle = settings.memory_idle_timeout;
        let cache = cache.clone();
        let pool = uploader.as_ref().map(|u| u.pool());
        rt.spawn(async move {
            let mut tick = tokio::time::interval((idle / 4).max(std::time::Duration::from_secs(1)));
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
    if let Some(path) = settings.stats_file.clone() {
        let summary = summary.clone();
        rt.spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
            loop {
                tick.tick().await;
                write_stats(&path, &summary());
            }
        });
    }
    readiness.ready();
    let result = match session.run() {
        // The kernel reports an ended connection as ECONNABORTED when it was aborted, and at
        // times when the last file of a lazily unmounted mount is closed: the session is over
        // either way; what was lost, if anything, is counted by the aborted uploads below.
        Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => {
            warn!("the kernel ended the FUSE connection");
            Ok(())
        }
        r => r,
    };
    // From here the process must end, whatever is stuck.
    lifecycle::watchdog(std::time::Duration::from_secs(60), "final release");
    if let Err(e) = &result {
        error!(error = %e, "FUSE session ended with an error");
    }
    // A connection ended by the kernel leaves its mount behind ("Transport endpoint is not
    // connected"): detach it, if it is still ours.
    if lifecycle::is_mounted(&mountpoint, dev.as_deref()) {
        match lifecycle::unmount(&mountpoint, true) {
            Ok(()) => {
                info!(mountpoint = %mountpoint.display(), "detached the mount left by the ended connection")
            }
            Err(e) => warn!(error = %e, "cannot detach the ended mount; run fusermount3 -uz on it"),
        }
    }
    let summary_text = summary();
    if let Some(path) = &settings.stats_file {
        write_stats(path, &summary_text);
    }
    let one_line: Vec<String> = summary_text
        .lines()
        .map(|l| l.replacen(' ', "=", 1))
        .collect();
    info!(mountpoint = %mountpoint.display(), stats = %one_line.join(" "), "unmounted");
    // Release everything registered with cuObject: tasks first (they hold blocks and
    // tokens), then the cache and the write buffers.
    // The disk cache first: its writer may be fetching a block on the runtime.
    if let Some(d) = disk {
        d.close();
    }
    rt.shutdown_timeout(std::time::Duration::from_secs(5));
    drop(summary);
    drop(report);
    drop(cache);
    drop(uploader);
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
    let aborted = control.aborted();
    if aborted > 0 {
        error!(
            files = aborted,
            "exiting with an error: files being written were not stored (see the log above)"
        );
    }
    std::process::exit(if result.is_err() || aborted > 0 { 1 } else { 0 })
}

/// Raise the soft limit on open files to the hard one, as Go programs do and systemd advises for
/// programs that need many (the soft limit is often 1024, kept low for select(), which the
/// daemon does not use): the disk cache keeps up to a quarter of the limit open, one file per
/// entry.
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0
        || lim.rlim_cur >= lim.rlim_max
    {
        return;
    }
    let raised = libc::rlimit {
        rlim_cur: lim.rlim_max,
        rlim_max: lim.rlim_max,
    };
    // SAFETY: setrlimit reads the struct we pass.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
        info!(
            from = lim.rlim_cur,
            to = lim.rlim_max,
            "raised the open-file limit to its hard limit"
        );
    } else {
        warn!(
            limit = lim.rlim_cur,
            error = %std::io::Error::last_os_error(),
            "cannot raise the open-file limit"
        );
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
    if s.read_only {
        // The kernel refuses writes with EROFS up front.
        opts.push(MountOption::RO);
    }
    let user_set =
        |a: &MountOption, b: &MountOption| s.kernel_flags.iter().any(|f| f == a || f == b);
    if !user_set(&MountOption::Dev, &MountOption::NoDev) {
        opts.push(MountOption::NoDev);
    }
    if !user_set(&MountOption::Suid, &MountOption::NoSuid) {
        opts.push(MountOption::NoSuid);
    }
    opts.extend(s.kernel_flags.iter().cloned());
    if s.auto_unmount {
        opts.push(MountOption::AutoUnmount);
    }
    opts
}
