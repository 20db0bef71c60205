//! `mount-s3-bench`: mountpoint-s3 (the peer users pick first) for scripts/bench, built from its
//! published library crates (mountpoint-s3-fs 0.11.0, the library of `mount-s3` 1.24). It
//! mounts the way `mount-s3` 1.24 does with default options
//! (mountpoint-s3/src/run.rs and cli.rs of that release: the same memory pool, client, part
//! sizes, metadata caching, FUSE threads, allocator and allocator settings), with only what a
//! loopback SeaweedFS needs set: endpoint, path-style addressing, region. Unlike `mount-s3` it
//! stays in the foreground (the bench runs it as a child and finds its RSS by its pid) and
//! never asks EC2's instance metadata service (no network but loopback): throughput target and
//! region take the values `mount-s3` uses when that service does not answer.
//!
//!     mount-s3-bench BUCKET DIRECTORY --endpoint-url URL [--force-path-style] [--region R]
//!                    [--allow-delete] [--allow-overwrite] [--cache DIR]
//!
//! Prints one line once mounted; exits when the directory is unmounted.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use mountpoint_s3_client::config::{AddressingStyle, S3ClientAuthConfig};
use mountpoint_s3_client::user_agent::UserAgent;
use mountpoint_s3_fs::data_cache::{
    CacheLimit, DataCacheConfig, DiskDataCacheConfig, ManagedCacheDir,
};
use mountpoint_s3_fs::fs::{
    CacheConfig, ServerSideEncryption, TimeToLive, UploadChecksumAlgorithm,
};
use mountpoint_s3_fs::fuse::config::{FuseOptions, FuseSessionConfig, MountPoint};
use mountpoint_s3_fs::logging::{LoggingConfig, init_logging};
use mountpoint_s3_fs::memory::{
    CandidateSize, MINIMUM_MEM_LIMIT, PagedPool, effective_total_memory,
};
use mountpoint_s3_fs::s3::config::{
    ClientConfig, MemoryLimitSetting, PartConfig, Region, TargetThroughputSetting,
};
use mountpoint_s3_fs::s3::{Bucket, Prefix, S3Path, S3Personality};
use mountpoint_s3_fs::{
    MountpointConfig, Runtime, S3FilesystemConfig, Superblock, SuperblockConfig, metrics,
};
use tikv_jemallocator::Jemalloc;

#[global_allocator]
static GLOBAL: Jemalloc = Jemalloc;

/// `mount-s3`'s compiled-in jemalloc settings (its main.rs).
// SAFETY: overrides jemalloc's weak `_rjem_malloc_conf` symbol, read once at initialisation as a
// NUL-terminated options string; the value is NUL-terminated.
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static MALLOC_CONF: &[u8] = b"abort_conf:true,background_thread:true,narenas:32\0";

#[derive(Parser)]
struct Args {
    bucket: String,
    mount_point: PathBuf,
    #[arg(long)]
    endpoint_url: String,
    #[arg(long)]
    force_path_style: bool,
    #[arg(long, default_value = "us-east-1")]
    region: String,
    #[arg(long)]
    allow_delete: bool,
    #[arg(long)]
    allow_overwrite: bool,
    /// mount-s3's local disk cache (`--cache DIR`): default size limit, 1 MiB blocks, and
    /// metadata cached for 60 s, as mount-s3 sets when a data cache is on.
    #[arg(long)]
    cache: Option<PathBuf>,
}

/// `mount-s3`'s defaults (cli.rs).
const PART_SIZE: usize = 8 * 1024 * 1024;
const MAX_THREADS: usize = 16;
const CACHE_BLOCK_SIZE: usize = 1024 * 1024;

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _logging = init_logging(LoggingConfig {
        log_file: None,
        log_to_stdout: true,
        default_filter: format!(
            "warn,mountpoint_s3=info,awscrt=off,{}=off",
            metrics::TARGET_NAME
        ),
    })
    .context("failed to initialize logging")?;
    let _metrics = metrics::install(None).context("failed to initialize metrics")?;

    let memory_limit = MemoryLimitSetting::Default(
        ((effective_total_memory() as f64 * 0.95) as usize).max(MINIMUM_MEM_LIMIT),
    );
    let part_config = PartConfig::with_part_size(PART_SIZE).validate(memory_limit)?;
    let pool = PagedPool::config()
        .with_candidate_sizes([
            CandidateSize::prunable(CACHE_BLOCK_SIZE),
            CandidateSize::prunable(part_config.read_size_bytes),
            CandidateSize::new(part_config.write_size_bytes),
        ])
        .with_memory_limit(memory_limit.bytes())
        .with_maintenance_interval(Duration::from_secs(60))
        .build();

    let client_config = ClientConfig {
        region: Region::new_user_specified(args.region.clone()),
        endpoint_url: Some(args.endpoint_url.clone()),
        addressing_style: if args.force_path_style {
            AddressingStyle::Path
        } else {
            AddressingStyle::Automatic
        },
        dual_stack: false,
        transfer_acceleration: false,
        auth_config: S3ClientAuthConfig::Default,
        requester_pays: false,
        expected_bucket_owner: None,
        throughput_target: TargetThroughputSetting::Default,
        bind: None,
        part_config,
        user_agent: UserAgent::new(Some("mountpoint-s3/1.24.0-bench".to_string())),
        tls_config: None,
    };
    let s3_path = S3Path::new(Bucket::new(args.bucket.clone())?, Prefix::empty());
    let client = client_config
        .create_client(pool.clone(), Some(&s3_path))
        .context("Failed to create S3 client")?;
    let runtime = Runtime::new(client.event_loop_group());
    let personality = S3Personality::infer_from_bucket(&s3_path.bucket, &client.endpoint_config());

    let fs_config = S3FilesystemConfig {
        allow_delete: args.allow_delete,
        allow_overwrite: args.allow_overwrite,
        s3_personality: personality,
        server_side_encryption: ServerSideEncryption::new(None, None),
        cache_config: CacheConfig::new(if args.cache.is_some() {
            TimeToLive::Duration(Duration::from_secs(60))
        } else {
            TimeToLive::Minimal
        }),
        upload_checksum_algorithm: personality
            .supports_additional_checksums()
            .then_some(UploadChecksumAlgorithm::Crc32c),
        ..Default::default()
    };

    let fuse_config = FuseSessionConfig::new(
        MountPoint::new(&args.mount_point).context("Failed to create mount point")?,
        FuseOptions::default(),
        MAX_THREADS,
    )?;
    let superblock = Superblock::new(
        client.clone(),
        s3_path,
        SuperblockConfig {
            cache_config: fs_config.cache_config.clone(),
            s3_personality: personality,
        },
    );
    let managed = match &args.cache {
        Some(dir) => Some(
            ManagedCacheDir::new_from_parent_with_cache_key(dir, None, true)
                .context("failed to create cache directory")?,
        ),
        None => None,
    };
    let disk_cache_config = managed.as_ref().map(|m| DiskDataCacheConfig {
        cache_directory: m.as_path_buf(),
        block_size: CACHE_BLOCK_SIZE as u64,
        limit: CacheLimit::default(),
    });
    let data_cache = DataCacheConfig {
        disk_cache_config,
        express_cache_config: None,
    };
    let mut session = MountpointConfig::new(fuse_config, fs_config, data_cache)?
        .create_fuse_session(superblock, client, runtime, pool)?;
    if let Some(m) = managed {
        session.run_on_close(Box::new(move || drop(m)));
    }
    println!(
        "{} is mounted at {}",
        args.bucket,
        args.mount_point.display()
    );
    session.join().context("failed to join session")?;
    Ok(())
}
