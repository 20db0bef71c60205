//! The command line: flags, the mount-helper `-o` form (`options`), and the resolved
//! [`Settings`].

mod options;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, CommandFactory, FromArgMatches, Parser};
use fuser::MountOption;

use s3rdma_client::{RdmaMode, S3Options};
use s3rdma_fs::fs::names;
use s3rdma_fs::fs::FsConfig;
use s3rdma_fs::read::ReadConfig;
use s3rdma_proto::units::{parse_duration, parse_mode, parse_size};

/// Version and commit, e.g. "0.1.0 (commit 1a2b3c4d5e6f)".
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("S3RDMA_COMMIT"),
    ")"
);

const ABOUT: &str = "Mount an S3 bucket (or a prefix of it) as a file system.";

const LONG_ABOUT: &str = "\
Mount an S3 bucket (or a prefix of it) as a file system.

Keys are files, '/' separates directories (implied by the keys under them, or by 'dir/' marker
objects). Every open file is pinned to the ETag it had when opened: reads never mix two versions
of an object, and a file replaced while open fails reads on the old handle with ESTALE.

Every option can also be given mount(8)-style as '-o name[=value],...', with '_' for '-'
(e.g. '-o endpoint_url=http://127.0.0.1:8333,force_path_style,ro'), so that
'mount -t fuse.s3rdma bucket /mnt -o ...' and /etc/fstab work. Sizes take B/K/M/G/T (binary,
also KiB/MiB/...) or KB/MB/GB (decimal); durations take ms/s/m/h or 'indefinite'.

Credentials come from the standard AWS chain: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, the
profile (--profile or AWS_PROFILE), web identity, ECS, and EC2 instance metadata.";

const AFTER_HELP: &str = "\
Examples:
  s3rdma my-bucket /mnt/data
  s3rdma my-bucket:datasets/imagenet/ /mnt/imagenet --read-only
  s3rdma s3://my-bucket/ckpt/ /mnt/ckpt --endpoint-url http://127.0.0.1:8333 --force-path-style
  s3rdma my-bucket /mnt/data -o endpoint_url=http://127.0.0.1:8333,force_path_style,allow_other
  mount -t fuse.s3rdma my-bucket /mnt/data -o endpoint_url=http://127.0.0.1:8333,force_path_style";

/// What the command line asks for: a mount (the default), or a subcommand.
#[derive(Debug)]
pub enum Invocation {
    Mount(Box<Cli>),
    Stats(StatsArgs),
    Warm(WarmArgs),
}

/// Print the live counters of a mount (cache, S3 requests, RDMA, uploads, FUSE).
#[derive(Args, Debug, Clone)]
pub struct StatsArgs {
    /// Print them every second, with the change per second of each
    #[arg(long)]
    pub watch: bool,

    /// The root of an s3rdma mount
    pub mountpoint: String,
}

/// Read every file under each PATH once, so that the mount's disk cache holds them (files
/// already cached are skipped).
#[derive(Args, Debug, Clone)]
pub struct WarmArgs {
    /// Files read at once, 1 to 256
    #[arg(short, long, value_name = "N", default_value_t = 8,
          value_parser = clap::value_parser!(u16).range(1..=256))]
    pub jobs: u16,

    /// Files or directories on an s3rdma mount with --cache-dir
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
}

/// The whole command line: the mount's flags, and the subcommands beside them (a first
/// argument that names one is that subcommand; a bucket of that name mounts as s3://NAME).
pub fn command() -> clap::Command {
    // (Each subcommand's text is its arguments' doc comment.)
    let (stats, warm) = (clap::Command::new("stats"), clap::Command::new("warm"));
    Cli::command()
        .args_override_self(true)
        .args_conflicts_with_subcommands(true)
        .subcommand_negates_reqs(true)
        .subcommand(StatsArgs::augment_args(stats))
        .subcommand(WarmArgs::augment_args(warm))
}

/// Parse `args` (the program's name first); `--help` and `--version` print and exit 0, a bad
/// command line exits 2 with one line naming the problem.
pub fn parse<I, T>(args: I) -> Invocation
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    try_parse(args).unwrap_or_else(|e| {
        if !e.use_stderr() {
            e.exit()
        }
        eprintln!("s3rdma: error: {}", one_line(&e));
        std::process::exit(2)
    })
}

/// A clap error as one line: its message (up to the usage), and where to look.
pub fn one_line(e: &clap::Error) -> String {
    let text = e.to_string();
    let message: Vec<&str> = text
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect();
    let message = message.join(" ");
    let message = message.strip_prefix("error: ").unwrap_or(&message);
    format!("{message} (see 's3rdma --help')")
}

/// As [`parse`], returning clap's error.
pub fn try_parse<I, T>(args: I) -> Result<Invocation, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    let mut cmd = command();
    // The mount-helper form (`-o`) is the flags it spells; subcommands take none.
    let sub = args.get(1).is_some_and(|a| a == "stats" || a == "warm");
    let args = match sub {
        true => args,
        false => options::expand(args, &cmd)
            .map_err(|e| cmd.error(clap::error::ErrorKind::ValueValidation, e))?,
    };
    let m = cmd.try_get_matches_from(args)?;
    Ok(match m.subcommand() {
        Some(("stats", s)) => Invocation::Stats(StatsArgs::from_arg_matches(s)?),
        Some(("warm", s)) => Invocation::Warm(WarmArgs::from_arg_matches(s)?),
        _ => Invocation::Mount(Box::new(Cli::from_arg_matches(&m)?)),
    })
}

/// Command-line arguments, as parsed by clap (before `-o` options are applied).
#[derive(Parser, Debug, Clone)]
#[command(name = "s3rdma", version = VERSION, about = ABOUT, long_about = LONG_ABOUT, after_help = AFTER_HELP)]
pub struct Cli {
    /// What to mount: BUCKET, BUCKET:PREFIX or s3://BUCKET/PREFIX
    #[arg(value_name = "BUCKET[:PREFIX] | s3://BUCKET/PREFIX")]
    pub source: String,

    /// An empty directory to mount on
    pub mountpoint: PathBuf,

    /// Options, comma separated, mount(8) style: any flag below as name[=value] with '_' for '-',
    /// plus ro, rw and the standard mount options. May be repeated
    #[arg(short = 'o', value_name = "OPT[,OPT=VALUE]...")]
    pub options: Vec<String>,

    // ---- S3 ----
    /// S3 endpoint URL, e.g. http://127.0.0.1:8333 (default: AWS, or AWS_ENDPOINT_URL)
    #[arg(long, value_name = "URL", help_heading = "S3")]
    pub endpoint_url: Option<String>,

    /// Region of the bucket (default: from the AWS config, else us-east-1)
    #[arg(long, value_name = "REGION", help_heading = "S3")]
    pub region: Option<String>,

    /// Named profile from ~/.aws/config and ~/.aws/credentials
    #[arg(long, value_name = "NAME", help_heading = "S3")]
    pub profile: Option<String>,

    /// Path-style addressing (http://host/bucket/key), needed by most self-hosted servers
    #[arg(long, help_heading = "S3")]
    pub force_path_style: bool,

    /// Send unsigned requests (public buckets); no credentials are looked up
    #[arg(long, help_heading = "S3")]
    pub no_sign_request: bool,

    /// Mount only the keys under this prefix (also BUCKET:PREFIX); a trailing '/' is implied
    #[arg(long, value_name = "PREFIX", help_heading = "S3")]
    pub prefix: Option<String>,

    /// Attempts per S3 request, retried with jittered exponential backoff on throttling,
    /// 5xx and connection errors
    #[arg(long, value_name = "N", help_heading = "S3", default_value = "6")]
    pub max_attempts: u32,

    /// Time limit for one attempt of an S3 request, and for a stall of a response body
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, help_heading = "S3", default_value = "30s")]
    pub request_timeout: Duration,

    /// Move object data over S3-over-RDMA (cuObject): 'auto' uses RDMA and moves a request the
    /// endpoint declines over HTTP (counted, logged); 'required' fails it instead; 'off' never
    /// mints tokens. The loopback provider (no NVIDIA SDK) is used only with a loopback
    /// endpoint
    #[arg(long, value_name = "MODE", value_parser = parse_rdma, help_heading = "S3", default_value = "auto")]
    pub rdma: RdmaMode,

    /// How long constructing the cuObject client may take at start-up (only on a host with an
    /// RDMA port up; cuFile can spin when the device does not answer): past it, rdma=auto
    /// mounts over HTTP and rdma=required refuses to start; 100ms to 10min
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, help_heading = "S3", default_value = "10s")]
    pub rdma_init_timeout: Duration,

    /// Accept Ceph RGW's x-amz-rdma-reply 200 on an HTTP 206 ranged GET
    #[arg(long, help_heading = "S3")]
    pub rdma_accept_206_200: bool,

    // ---- Mount ----
    /// Mount read-only (-o ro): every write fails with EROFS
    #[arg(long, help_heading = "Mount")]
    pub read_only: bool,

    /// Owner of every file and directory [default: the user who mounts]
    #[arg(long, value_name = "UID", help_heading = "Mount")]
    pub uid: Option<u32>,

    /// Group of every file and directory [default: the group of the user who mounts]
    #[arg(long, value_name = "GID", help_heading = "Mount")]
    pub gid: Option<u32>,

    /// Permission bits of files, octal
    #[arg(long, value_name = "MODE", value_parser = parse_mode, help_heading = "Mount", default_value = "0644")]
    pub file_mode: u16,

    /// Permission bits of directories, octal
    #[arg(long, value_name = "MODE", value_parser = parse_mode, help_heading = "Mount", default_value = "0755")]
    pub dir_mode: u16,

    /// Let every user access the mount (needs user_allow_other in /etc/fuse.conf unless root)
    #[arg(long, help_heading = "Mount")]
    pub allow_other: bool,

    /// Let root access the mount too
    #[arg(long, help_heading = "Mount")]
    pub allow_root: bool,

    /// Unmount automatically when the daemon exits, even if it is killed (needs --allow-root
    /// or --allow-other)
    #[arg(long, help_heading = "Mount")]
    pub auto_unmount: bool,

    /// Stay in the foreground instead of daemonizing once the mount is ready
    #[arg(short = 'f', long, help_heading = "Mount")]
    pub foreground: bool,

    /// FUSE worker threads: the most file system requests served at once
    #[arg(long, value_name = "N", help_heading = "Mount", default_value = "16")]
    pub max_threads: usize,

    /// How FUSE requests reach the daemon: `uring` (io_uring rings, Linux 6.14+, switched on by
    /// /sys/module/fuse/parameters/enable_uring; refuses to mount without), `dev` (/dev/fuse),
    /// `auto` (/dev/fuse until the rings measure ahead of it)
    #[arg(
        long,
        value_name = "MODE",
        value_enum,
        help_heading = "Mount",
        default_value = "auto"
    )]
    pub fuse_transport: FuseTransport,

    /// With the io_uring transport: ring entries (each with its worker thread) per kernel
    /// queue, one queue per CPU [default: --max-threads shared among the queues, at least 1]
    #[arg(long, value_name = "N", help_heading = "Mount")]
    pub fuse_queue_depth: Option<usize>,

    /// Threads that move data to and from S3: requests, responses copied into the cache,
    /// replies to reads [default: half the CPUs, 2 to 8]
    #[arg(long, value_name = "N", help_heading = "Mount")]
    pub io_threads: Option<usize>,

    /// On SIGTERM/SIGINT: how long files open for writing get to be closed (and stored) before
    /// their uploads are aborted and the mount is detached
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, help_heading = "Mount", default_value = "30s")]
    pub shutdown_grace: Duration,

    // ---- Caching and reads ----
    /// How long file attributes and directory entries are trusted before S3 is asked again
    /// (0 = always ask; 'indefinite' = never)
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, help_heading = "Caching and reads", default_value = "1s")]
    pub metadata_ttl: Duration,

    /// Let `open` use attributes younger than --metadata-ttl (from a lookup or a listing)
    /// instead of asking S3 for the current version: for data that does not change while
    /// mounted (with --cache-dir and a long TTL, an epoch over cached files sends no request
    /// per file)
    #[arg(long, help_heading = "Caching and reads")]
    pub open_trusts_metadata: bool,

    /// How long a name found missing is remembered [default: the metadata TTL]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, help_heading = "Caching and reads")]
    pub negative_metadata_ttl: Option<Duration>,

    /// Size of each ranged GET of a sequential reader
    #[arg(long, value_name = "SIZE", value_parser = parse_size, help_heading = "Caching and reads", default_value = "8MiB")]
    pub read_part_size: u64,

    /// Size of the page cache, cut into blocks of the read part size: taken as used over HTTP;
    /// with RDMA one mlocked, registered arena [default: min(1GiB, 1/8 of RAM)]
    #[arg(long, value_name = "SIZE", value_parser = parse_size, help_heading = "Caching and reads")]
    pub cache_size: Option<u64>,

    /// Cache blocks and write buffers unused this long give their memory back to the system
    /// (without RDMA; registered memory stays pinned); 0s keeps it
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, help_heading = "Caching and reads", default_value = "60s")]
    pub memory_idle_timeout: Duration,

    /// The most ranged GETs in flight for the whole mount
    #[arg(
        long,
        value_name = "N",
        help_heading = "Caching and reads",
        default_value = "32"
    )]
    pub max_inflight_reads: usize,

    /// Kernel read-ahead of the mount (its bdi read_ahead_kb; root only); the kernel's own
    /// default of 128 KiB makes buffered reads arrive in 128 KiB requests
    #[arg(
        long,
        value_name = "KIB",
        help_heading = "Caching and reads",
        default_value = "1024"
    )]
    pub read_ahead_kb: u32,

    /// Open files with direct I/O: no kernel page cache, every read goes to s3rdma's cache
    #[arg(long, help_heading = "Caching and reads")]
    pub direct_io: bool,

    /// Keep whole objects read through the mount in this local directory (keyed by bucket,
    /// key and ETag, checked by CRC, kept across remounts); an open file fully there is read
    /// from it — by the kernel itself (FUSE passthrough) where it can
    #[arg(long, value_name = "DIR", help_heading = "Caching and reads")]
    pub cache_dir: Option<PathBuf>,

    /// Most bytes kept in --cache-dir, least recently used evicted first [default: half the
    /// free space of its file system]
    #[arg(long, value_name = "SIZE", value_parser = parse_size, help_heading = "Caching and reads")]
    pub cache_dir_size: Option<u64>,

    /// Serve files in --cache-dir through the daemon, never by FUSE passthrough
    #[arg(long, help_heading = "Caching and reads")]
    pub no_passthrough: bool,

    /// The most data fetched ahead of a sequential reader, per open file [default: 64MiB, at
    /// most half the cache]
    #[arg(long, value_name = "SIZE", value_parser = parse_size, help_heading = "Caching and reads")]
    pub max_prefetch: Option<u64>,

    // ---- Writing ----
    /// Size of the parts a written file is uploaded in (5MiB..5GiB); parts double in size every
    /// 1000 parts, so large files stay within S3's 10,000 parts
    #[arg(long, value_name = "SIZE", value_parser = parse_size, help_heading = "Writing", default_value = "16MiB")]
    pub write_part_size: u64,

    /// Memory for files being written: one pinned, RDMA-registered pool of parts; a writer waits
    /// while uploads fill it [default: min(256MiB, 1/16 of RAM), at least 2 parts]
    #[arg(long, value_name = "SIZE", value_parser = parse_size, help_heading = "Writing")]
    pub write_buffer_size: Option<u64>,

    /// Where staged files (opened read-write, appended to, edited in place, truncated) keep
    /// their bytes until stored; files that could not be stored are kept in its conflicts/
    /// [default: s3rdma-staging-v1 under --cache-dir, else a directory of this mount under
    /// /var/tmp/s3rdma-staging]
    #[arg(long, value_name = "DIR", help_heading = "Writing")]
    pub staging_dir: Option<PathBuf>,

    /// Most bytes staged files may hold at once; a write past it fails with ENOSPC [default:
    /// half the free space of the staging directory's file system]
    #[arg(long, value_name = "SIZE", value_parser = parse_size, help_heading = "Writing")]
    pub staging_size: Option<u64>,

    /// Do not ask HeadObject for the mode, owner and mtime stored with a file (one request less
    /// per first lookup of a file; stat then shows the mount's defaults and S3's time)
    #[arg(long, help_heading = "Writing")]
    pub no_file_metadata: bool,

    /// mkdir stores no 'dir/' marker object: an empty directory made here then lives in this
    /// mount only, until a file is written in it (by default it is stored, so it exists for
    /// other clients and after a remount)
    #[arg(long, help_heading = "Writing")]
    pub no_dir_markers: bool,

    /// A directory rename moves at most this many keys (copied on the server, then the
    /// sources deleted); a larger directory's rename fails with EXDEV, so that mv copies and
    /// deletes it file by file (0: every directory rename does)
    #[arg(
        long,
        value_name = "N",
        help_heading = "Writing",
        default_value = "10000"
    )]
    pub max_dir_rename_keys: usize,

    /// Markers are the default now; kept so that older command lines still mount
    #[arg(long, hide = true, conflicts_with = "no_dir_markers")]
    pub dir_markers: bool,

    /// Copies (rename, attribute changes) of objects above this size use UploadPartCopy
    #[arg(long, value_name = "SIZE", value_parser = parse_size, help_heading = "Writing", hide = true, default_value = "5GiB")]
    pub multipart_copy_threshold: u64,

    /// The most parts uploaded at once, for the whole mount
    #[arg(long, value_name = "N", help_heading = "Writing", default_value = "8")]
    pub upload_concurrency: usize,

    // ---- Logging ----
    /// error, warn, info, debug or trace (debug logs every S3 request); or a tracing filter
    /// such as 's3rdma=debug'
    #[arg(
        long,
        value_name = "LEVEL",
        help_heading = "Logging",
        default_value = "info"
    )]
    pub log_level: String,

    /// Append logs to this file (a daemon without it logs nowhere after start-up)
    #[arg(long, value_name = "PATH", help_heading = "Logging")]
    pub log_file: Option<PathBuf>,

    /// Rewrite this file every second with the live counters (cache hits/misses, read-ahead,
    /// bytes over RDMA and HTTP, declines, fallbacks), one `name value` per line
    #[arg(long, value_name = "PATH", help_heading = "Logging")]
    pub stats_file: Option<PathBuf>,

    /// Serve Prometheus metrics at http://ADDR:PORT/metrics (off by default; a loopback
    /// address unless --metrics-allow-remote)
    #[arg(long, value_name = "ADDR:PORT", help_heading = "Logging")]
    pub metrics_addr: Option<String>,

    /// Let --metrics-addr listen on an address other hosts can reach
    #[arg(long, help_heading = "Logging")]
    pub metrics_allow_remote: bool,

    /// Kernel mount flags from -o (exec/noexec, dev/nodev, suid/nosuid), in order.
    #[arg(long, hide = true, value_name = "FLAG", action = clap::ArgAction::Append,
          value_parser = clap::builder::PossibleValuesParser::new(options::KERNEL_FLAGS))]
    pub kernel_flag: Vec<String>,
}

/// A kernel mount flag by its `-o` name (one of [`options::KERNEL_FLAGS`]).
fn kernel_flag(name: &str) -> MountOption {
    match name {
        "exec" => MountOption::Exec,
        "noexec" => MountOption::NoExec,
        "dev" => MountOption::Dev,
        "nodev" => MountOption::NoDev,
        "suid" => MountOption::Suid,
        _ => MountOption::NoSuid,
    }
}

fn parse_rdma(s: &str) -> Result<RdmaMode, String> {
    s.parse()
}

/// Everything the daemon needs, resolved and validated.
#[derive(Clone, Debug)]
pub struct Settings {
    pub bucket: String,
    /// Normalised: "" or ending in '/'.
    pub prefix: String,
    pub mountpoint: PathBuf,
    pub s3: S3Options,
    /// The deadline of the cuObject client's construction (`--rdma-init-timeout`).
    pub rdma_init_timeout: Duration,
    pub fs: FsConfig,
    pub kernel: Kernel,
    pub process: Process,
    pub memory: Memory,
    pub local: LocalDirs,
}

/// What the kernel mount is given.
#[derive(Clone, Debug)]
pub struct Kernel {
    pub read_only: bool,
    pub allow_other: bool,
    pub allow_root: bool,
    pub auto_unmount: bool,
    /// FUSE worker threads.
    pub max_threads: usize,
    pub fuse_transport: FuseTransport,
    /// Ring entries per kernel queue (`--fuse-queue-depth`); None: from `max_threads`.
    pub fuse_queue_depth: Option<usize>,
    pub kernel_flags: Vec<MountOption>,
}

/// How FUSE requests reach the daemon (`--fuse-transport`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FuseTransport {
    /// /dev/fuse, until the rings measure ahead of it (then: the rings where offered).
    Auto,
    /// io_uring rings (FUSE over io_uring), or no mount.
    Uring,
    /// /dev/fuse.
    Dev,
}

/// The daemon process: how it runs, logs and reports.
#[derive(Clone, Debug)]
pub struct Process {
    pub foreground: bool,
    /// The I/O runtime's threads (`--io-threads`).
    pub io_threads: usize,
    /// How long files being written get at SIGTERM/SIGINT before they are aborted.
    pub shutdown_grace: Duration,
    pub log_level: String,
    pub log_file: Option<PathBuf>,
    pub stats_file: Option<PathBuf>,
    /// Where `/metrics` is served (`--metrics-addr`), checked: loopback unless allowed.
    pub metrics_addr: Option<std::net::SocketAddr>,
}

/// The memory a mount takes: its page cache and write buffers.
#[derive(Clone, Debug)]
pub struct Memory {
    pub cache_size: u64,
    /// Idle cache blocks and write buffers give their memory back after this (0: never).
    pub memory_idle_timeout: Duration,
    pub max_inflight_reads: usize,
    pub read_ahead_kb: u32,
    pub write_part_size: u64,
    pub write_buffer_size: u64,
    pub upload_concurrency: usize,
}

/// The local directories a mount uses.
#[derive(Clone, Debug)]
pub struct LocalDirs {
    /// The disk cache: its directory, its size (None: the default), passthrough wanted.
    pub cache_dir: Option<PathBuf>,
    pub cache_dir_size: Option<u64>,
    pub passthrough: bool,
    /// Where staged files keep their bytes, and how many (None: the default).
    pub staging_dir: PathBuf,
    pub staging_size: Option<u64>,
}

/// The staging directory of a mount without `--staging-dir` or `--cache-dir`: on local disk
/// (`/var/tmp` survives reboots, unlike `/tmp` on many systems), one per user, bucket and
/// mount point, so the next mount of the same bucket at the same place finds what a crashed
/// one left.
fn default_staging_dir(source: &str, mountpoint: &std::path::Path) -> PathBuf {
    let at = std::fs::canonicalize(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in source
        .bytes()
        .chain([0])
        .chain(at.as_os_str().as_encoded_bytes().iter().copied())
    {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    let uid = nix::unistd::getuid();
    PathBuf::from("/var/tmp/s3rdma-staging").join(format!("{uid}-{h:016x}"))
}

/// Physical memory (8 GiB if it cannot be read).
fn ram() -> u64 {
    use nix::unistd::{sysconf, SysconfVar};
    let value = |v| sysconf(v).ok().flatten().filter(|&n| n > 0);
    match (value(SysconfVar::_PHYS_PAGES), value(SysconfVar::PAGE_SIZE)) {
        (Some(pages), Some(page)) => pages as u64 * page as u64,
        _ => 8 << 30,
    }
}

/// min(1 GiB, 1/8 of physical memory).
pub fn default_cache_size() -> u64 {
    (1u64 << 30).min(ram() / 8)
}

/// Check the write options; returns (part size, pool size rounded down to whole parts).
fn write_sizes(part: u64, pool: Option<u64>) -> Result<(u64, u64), String> {
    let max_reg = cuobj_ffi::max_registration_size() as u64;
    let max_part = s3rdma_fs::upload::MAX_PART_BYTES.min(max_reg);
    if !(s3rdma_fs::upload::MIN_PART_BYTES..=max_part).contains(&part) {
        return Err(format!(
            "write part size {part} is out of range; use 5MiB (S3's smallest part) to {max_part} bytes"
        ));
    }
    let pool = pool.unwrap_or_else(|| (256u64 << 20).min(ram() / 16).max(2 * part).min(max_reg));
    if pool < 2 * part {
        return Err(format!(
            "write buffer size {pool} holds fewer than 2 parts of {part} bytes; raise --write-buffer-size or lower --write-part-size"
        ));
    }
    if pool > max_reg {
        return Err(format!(
            "write buffer size {pool} is above the RDMA registration limit of {max_reg} bytes; lower --write-buffer-size"
        ));
    }
    Ok((part, pool / part * part))
}

/// `value` (or `default`) if within `lo..=hi`, else an error naming the option and its range.
fn in_range<T>(what: &str, v: T, lo: T, hi: T) -> Result<T, String>
where
    T: PartialOrd + std::fmt::Display + Copy,
{
    if (lo..=hi).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{what} {v} is out of range; use {lo} to {hi}"))
    }
}

/// Parse `BUCKET`, `BUCKET:PREFIX` or `s3://BUCKET/PREFIX` into (bucket, raw prefix).
pub fn parse_source(source: &str) -> Result<(String, String), String> {
    let (bucket, prefix) = if let Some(rest) = source.strip_prefix("s3://") {
        rest.split_once('/').unwrap_or((rest, ""))
    } else if source.contains("://") {
        return Err(format!(
            "{source:?} is not a bucket: write BUCKET, BUCKET:PREFIX or s3://BUCKET/PREFIX (the endpoint goes in --endpoint-url)"
        ));
    } else {
        source.split_once(':').unwrap_or((source, ""))
    };
    names::check_bucket(bucket)?;
    Ok((bucket.to_string(), prefix.to_string()))
}

/// The bucket and the normalised prefix (from the source or `--prefix`, not both), and a
/// well-formed endpoint URL.
fn bucket_and_prefix(cli: &Cli) -> Result<(String, String), String> {
    let (bucket, src_prefix) = parse_source(&cli.source)?;
    let raw_prefix = match (&cli.prefix, src_prefix.is_empty()) {
        (Some(p), true) => p.clone(),
        (Some(p), false) if *p != src_prefix => {
            return Err(format!(
                "two prefixes given: {src_prefix:?} in {:?} and --prefix {p:?}; give one",
                cli.source
            ))
        }
        _ => src_prefix,
    };
    let prefix = names::normalize_prefix(&raw_prefix)?;
    if let Some(url) = &cli.endpoint_url {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!(
                "endpoint URL {url:?} must start with http:// or https://, e.g. http://127.0.0.1:8333"
            ));
        }
    }
    Ok((bucket, prefix))
}

/// The cache size and the read-ahead per file, checked against the read part size.
fn read_memory(cli: &Cli) -> Result<(u64, u64), String> {
    let read_part_size = cli.read_part_size;
    let max_part = cuobj_ffi::max_registration_size() as u64;
    if !(64 << 10..=max_part).contains(&read_part_size) {
        return Err(format!(
            "read part size {read_part_size} is out of range; use 64KiB to {max_part} bytes (the RDMA registration limit)"
        ));
    }
    let cache_size = cli.cache_size.unwrap_or_else(default_cache_size);
    if cache_size < 2 * read_part_size {
        return Err(format!(
            "cache size {cache_size} holds fewer than 2 read parts of {read_part_size} bytes; raise --cache-size or lower --read-part-size"
        ));
    }
    let max_prefetch = cli.max_prefetch.unwrap_or((64 << 20).min(cache_size / 2));
    if max_prefetch > cache_size / 2 {
        return Err(format!(
            "max prefetch {max_prefetch} is above half the cache ({cache_size} bytes): data fetched ahead would push out what is being read; lower --max-prefetch or raise --cache-size"
        ));
    }
    Ok((cache_size, max_prefetch))
}

/// The I/O runtime's size when `--io-threads` is not given: half the CPUs, 2 to 8. Each
/// thread receives responses at several GB/s; more than the work needs only adds wake-ups
/// and cache traffic on the cores the FUSE threads and readers use (on 2 CPUs, 2 threads
/// instead of 4 took about 5 % less CPU per GiB read).
fn default_io_threads() -> usize {
    let cpus = std::thread::available_parallelism().map_or(2, usize::from);
    (cpus / 2).clamp(2, 8)
}

/// Counts, times and ids within their ranges.
fn check_ranges(cli: &Cli) -> Result<(), String> {
    in_range("max threads", cli.max_threads, 1, 1024)?;
    if let Some(depth) = cli.fuse_queue_depth {
        in_range("fuse queue depth", depth, 1, 256)?;
    }
    if let Some(n) = cli.io_threads {
        in_range("io threads", n, 1, 256)?;
    }
    in_range("max attempts", cli.max_attempts, 1, 100)?;
    in_range("max inflight reads", cli.max_inflight_reads, 1, 1024)?;
    in_range("read ahead (KiB)", cli.read_ahead_kb, 0, 1 << 20)?;
    in_range("upload concurrency", cli.upload_concurrency, 1, 256)?;
    // 0: every directory rename fails with EXDEV (mv copies).
    in_range(
        "max dir rename keys",
        cli.max_dir_rename_keys,
        0,
        10_000_000,
    )?;
    let ms = Duration::from_millis;
    let times = [
        (
            "memory idle timeout",
            cli.memory_idle_timeout,
            ms(0),
            "0s (keep memory) to 7d",
            7 * 24 * 3600,
        ),
        (
            "shutdown grace",
            cli.shutdown_grace,
            ms(0),
            "0s to 24h",
            24 * 3600,
        ),
        (
            "rdma init timeout",
            cli.rdma_init_timeout,
            ms(100),
            "100ms to 10min",
            600,
        ),
        (
            "request timeout",
            cli.request_timeout,
            ms(100),
            "100ms to 1h",
            3600,
        ),
    ];
    for (what, t, lo, range, hi) in times {
        if !(lo..=Duration::from_secs(hi)).contains(&t) {
            return Err(format!("{what} {t:?} is out of range; use {range}"));
        }
    }
    for (name, id) in [("uid", cli.uid), ("gid", cli.gid)] {
        if id == Some(u32::MAX) {
            return Err(format!(
                "{name} 4294967295 is not an id (it means \"no change\" to the kernel); give a real {name}"
            ));
        }
    }
    let threshold = cli.multipart_copy_threshold;
    if !(5u64 << 20..=5 << 30).contains(&threshold) {
        return Err(format!(
            "multipart copy threshold {threshold} is out of range; use 5MiB to 5GiB (S3's CopyObject limit)"
        ));
    }
    Ok(())
}

/// The disk cache's and the staging area's settings checked; the staging directory.
fn local_dirs(cli: &Cli) -> Result<PathBuf, String> {
    if cli.cache_dir.is_none() && (cli.cache_dir_size.is_some() || cli.no_passthrough) {
        return Err("--cache-dir-size and --no-passthrough need --cache-dir DIR".into());
    }
    if let Some(size) = cli.cache_dir_size.filter(|&s| s < 64 << 20) {
        return Err(format!(
            "cache dir size {size} is below 64MiB; give more, or leave --cache-dir out"
        ));
    }
    if cli
        .cache_dir
        .as_ref()
        .is_some_and(|d| d.as_os_str().is_empty())
    {
        return Err("cache dir is empty; give a directory on a local disk".into());
    }
    if cli
        .staging_dir
        .as_ref()
        .is_some_and(|d| d.as_os_str().is_empty())
    {
        return Err("staging dir is empty; give a directory on a local disk".into());
    }
    if let Some(size) = cli.staging_size.filter(|&s| s < 1 << 20) {
        return Err(format!(
            "staging size {size} is below 1MiB; give more (staged files keep the bytes written to them until stored)"
        ));
    }
    Ok(match (&cli.staging_dir, &cli.cache_dir) {
        (Some(d), _) => d.clone(),
        (None, Some(c)) => c.join("s3rdma-staging-v1"),
        (None, None) => default_staging_dir(&cli.source, &cli.mountpoint),
    })
}

/// Logging, region, who may use the mount and the metrics endpoint, checked; the metrics
/// address.
fn access(cli: &Cli) -> Result<Option<std::net::SocketAddr>, String> {
    crate::logging::filter(&cli.log_level)?;
    if cli.region.as_deref().is_some_and(|r| r.trim().is_empty()) {
        return Err("region is empty; give one such as us-east-1, or leave it out".into());
    }
    let metrics_addr = match &cli.metrics_addr {
        Some(a) => Some(crate::metrics::check_addr(a, cli.metrics_allow_remote)?),
        None => None,
    };
    if cli.auto_unmount && !(cli.allow_other || cli.allow_root) {
        return Err(
            "--auto-unmount needs --allow-root or --allow-other (fusermount3 implements it only then)".into(),
        );
    }
    if cli.allow_other && cli.allow_root {
        return Err(
            "give one of --allow-other and --allow-root (allow-other already includes root)".into(),
        );
    }
    Ok(metrics_addr)
}

fn s3_options(cli: &Cli, bucket: &str) -> S3Options {
    S3Options {
        bucket: bucket.to_string(),
        endpoint_url: cli.endpoint_url.clone(),
        region: cli.region.clone(),
        profile: cli.profile.clone(),
        force_path_style: cli.force_path_style,
        no_sign_request: cli.no_sign_request,
        max_attempts: cli.max_attempts,
        connect_timeout: Duration::from_secs(5),
        request_timeout: cli.request_timeout,
        rdma: cli.rdma,
        rdma_accept_206_200: cli.rdma_accept_206_200,
        static_credentials: None,
    }
}

fn fs_config(cli: &Cli, max_prefetch: u64) -> FsConfig {
    let (uid, gid) = (
        nix::unistd::getuid().as_raw(),
        nix::unistd::getgid().as_raw(),
    );
    FsConfig {
        uid: cli.uid.unwrap_or(uid),
        gid: cli.gid.unwrap_or(gid),
        file_mode: cli.file_mode,
        dir_mode: cli.dir_mode,
        metadata_ttl: cli.metadata_ttl,
        negative_ttl: cli.negative_metadata_ttl.unwrap_or(cli.metadata_ttl),
        read: ReadConfig {
            part_size: cli.read_part_size,
            max_prefetch,
        },
        direct_io: cli.direct_io,
        read_only: cli.read_only,
        file_metadata: !cli.no_file_metadata,
        dir_markers: !cli.no_dir_markers,
        max_dir_rename_keys: cli.max_dir_rename_keys,
        multipart_copy_threshold: cli.multipart_copy_threshold,
        open_trusts_metadata: cli.open_trusts_metadata,
        // Set by the mount once it has made the rings (see mount.rs).
        ring_max_write: None,
    }
}

impl Settings {
    pub fn from_cli(cli: Cli) -> Result<Settings, String> {
        let (bucket, prefix) = bucket_and_prefix(&cli)?;
        let (cache_size, max_prefetch) = read_memory(&cli)?;
        check_ranges(&cli)?;
        let staging_dir = local_dirs(&cli)?;
        let metrics_addr = access(&cli)?;
        let (write_part_size, write_buffer_size) =
            write_sizes(cli.write_part_size, cli.write_buffer_size)?;
        let memory = ram();
        if cache_size.saturating_add(write_buffer_size) > memory {
            return Err(format!(
                "cache size {cache_size} plus write buffer {write_buffer_size} bytes exceed this machine's memory ({memory} bytes); both are pinned: lower --cache-size or --write-buffer-size"
            ));
        }
        Ok(Settings {
            s3: s3_options(&cli, &bucket),
            rdma_init_timeout: cli.rdma_init_timeout,
            fs: fs_config(&cli, max_prefetch),
            bucket,
            prefix,
            mountpoint: cli.mountpoint,
            kernel: Kernel {
                read_only: cli.read_only,
                allow_other: cli.allow_other,
                allow_root: cli.allow_root,
                auto_unmount: cli.auto_unmount,
                max_threads: cli.max_threads,
                fuse_transport: cli.fuse_transport,
                fuse_queue_depth: cli.fuse_queue_depth,
                kernel_flags: cli.kernel_flag.iter().map(|f| kernel_flag(f)).collect(),
            },
            process: Process {
                foreground: cli.foreground,
                io_threads: cli.io_threads.unwrap_or_else(default_io_threads),
                shutdown_grace: cli.shutdown_grace,
                log_level: cli.log_level,
                log_file: cli.log_file,
                stats_file: cli.stats_file,
                metrics_addr,
            },
            memory: Memory {
                cache_size,
                memory_idle_timeout: cli.memory_idle_timeout,
                max_inflight_reads: cli.max_inflight_reads,
                read_ahead_kb: cli.read_ahead_kb,
                write_part_size,
                write_buffer_size,
                upload_concurrency: cli.upload_concurrency,
            },
            local: LocalDirs {
                passthrough: !cli.no_passthrough,
                cache_dir: cli.cache_dir,
                cache_dir_size: cli.cache_dir_size,
                staging_dir,
                staging_size: cli.staging_size,
            },
        })
    }

    /// The source as shown in /proc/mounts.
    pub fn fsname(&self) -> String {
        if self.prefix.is_empty() {
            self.bucket.clone()
        } else {
            format!("{}:{}", self.bucket, self.prefix)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn settings(args: &[&str]) -> Result<Settings, String> {
        match try_parse(args.iter().copied()).map_err(|e| e.to_string())? {
            Invocation::Mount(cli) => Settings::from_cli(*cli),
            other => panic!("{args:?} is not a mount: {other:?}"),
        }
    }

    #[test]
    fn subcommands_parse_beside_the_mount_and_each_has_its_help() {
        let parse = |a: &[&str]| try_parse(a.iter().copied());
        // (`parse` exits; its one line is `one_line` of these errors.)
        assert!(
            matches!(parse(&["s3rdma", "b", "/mnt"]), Ok(Invocation::Mount(c)) if c.source == "b")
        );
        assert!(matches!(
            parse(&["s3rdma", "s3://stats", "/mnt"]),
            Ok(Invocation::Mount(c)) if c.source == "s3://stats"
        ));
        assert!(matches!(
            parse(&["s3rdma", "stats", "--watch", "/mnt"]),
            Ok(Invocation::Stats(StatsArgs { watch: true, .. }))
        ));
        assert!(matches!(
            parse(&["s3rdma", "warm", "-j", "3", "/a", "/b"]),
            Ok(Invocation::Warm(w)) if w.jobs == 3 && w.paths.len() == 2
        ));
        for help in [
            &["s3rdma", "--help"][..],
            &["s3rdma", "stats", "--help"],
            &["s3rdma", "warm", "--help"],
        ] {
            let e = parse(help).unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp, "{help:?}");
        }
        let top = parse(&["s3rdma", "--help"]).unwrap_err().to_string();
        assert!(top.contains("stats") && top.contains("warm"), "{top}");
        let warm = parse(&["s3rdma", "warm", "--help"])
            .unwrap_err()
            .to_string();
        assert!(
            warm.contains("--jobs") && warm.contains("[default: 8]"),
            "{warm}"
        );
        for (bad, needle) in [
            (
                &["s3rdma", "warm"][..],
                "required arguments were not provided: <PATH>...",
            ),
            (
                &["s3rdma", "warm", "-j", "0", "/a"],
                "invalid value '0' for '--jobs <N>'",
            ),
            (&["s3rdma", "stats"], "<MOUNTPOINT>"),
            (
                &["s3rdma", "b", "/m", "--no-such"],
                "unexpected argument '--no-such'",
            ),
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad:?}");
            let line = one_line(&e);
            assert!(
                line.contains(needle) && !line.contains('\n'),
                "{bad:?}: {line}"
            );
        }
    }

    /// The option table (docs/options.md) has a row for every flag and none more, and each
    /// default it gives is the one clap applies (written once, in `Cli`).
    #[test]
    fn the_option_table_in_docs_is_the_flags_with_their_defaults() {
        let readme = include_str!("../../docs/options.md");
        let table = readme
            .split("| Flag | `-o` | Default | What it does |")
            .nth(1)
            .expect("the option table (docs/options.md)");
        let mut rows = std::collections::BTreeMap::new();
        for row in table.lines().skip(2).take_while(|l| l.starts_with('|')) {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let defaults: Vec<&str> = cells[3].split(" / ").collect();
            for (i, flag) in cells[1].split(" / ").enumerate() {
                let long = flag.split("--").nth(1).expect(row);
                let long = long.split([' ', '`']).next().unwrap_or_default();
                let default = defaults.get(i).unwrap_or(&defaults[0]).replace('`', "");
                rows.insert(long.to_string(), default);
            }
        }
        let cmd = Cli::command();
        let flags: Vec<_> = cmd.get_arguments().filter(|a| !a.is_hide_set()).collect();
        for arg in &flags {
            let Some(long) = arg.get_long() else { continue };
            if matches!(long, "help" | "version") {
                continue;
            }
            let row = rows.get(long);
            let row =
                row.unwrap_or_else(|| panic!("the option table (docs/options.md) has no --{long}"));
            if let Some(default) = arg.get_default_values().first() {
                assert_eq!(
                    row,
                    &default.to_string_lossy(),
                    "--{long}'s default in docs/options.md"
                );
            }
        }
        for long in rows.keys() {
            assert!(
                flags.iter().any(|a| a.get_long() == Some(long)),
                "the option table (docs/options.md) has --{long}, which is no flag"
            );
        }
    }

    #[test]
    fn sources() {
        assert_eq!(parse_source("bkt").unwrap(), ("bkt".into(), "".into()));
        assert_eq!(
            parse_source("bkt:a/b").unwrap(),
            ("bkt".into(), "a/b".into())
        );
        assert_eq!(
            parse_source("s3://bkt/a/b/").unwrap(),
            ("bkt".into(), "a/b/".into())
        );
        assert_eq!(parse_source("s3://bkt").unwrap(), ("bkt".into(), "".into()));
        assert!(parse_source("http://host/bkt")
            .unwrap_err()
            .contains("--endpoint-url"));
        assert!(parse_source("Bad Bucket").is_err());
    }

    #[test]
    fn flags_and_o_options_agree() {
        let a = settings(&[
            "s3rdma",
            "b1b",
            "/mnt",
            "--endpoint-url",
            "http://127.0.0.1:1",
            "--force-path-style",
            "--read-only",
            "--uid",
            "7",
            "--file-mode",
            "0600",
            "--metadata-ttl",
            "5s",
            "--read-part-size",
            "4MiB",
            "--max-threads",
            "4",
            "--prefix",
            "p",
        ])
        .unwrap();
        let b = settings(&[
            "s3rdma", "b1b", "/mnt", "-o",
            "endpoint_url=http://127.0.0.1:1,force_path_style,ro,uid=7,file_mode=0600",
            "-o", "metadata_ttl=5s,read_part_size=4M,max_threads=4,io_threads=3,prefix=p,_netdev,nofail,x-systemd.automount",
        ])
        .unwrap();
        assert_eq!(format!("{:?}", a.s3), format!("{:?}", b.s3));
        assert_eq!(format!("{:?}", a.fs), format!("{:?}", b.fs));
        assert_eq!(a.prefix, "p/");
        assert!(a.kernel.read_only && b.kernel.read_only);
        assert_eq!(b.kernel.max_threads, 4);
        assert_eq!(b.process.io_threads, 3);
        assert!((2..=8).contains(&a.process.io_threads));
    }

    #[test]
    fn every_flag_has_an_o_spelling() {
        let cmd = Cli::command();
        for arg in cmd.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if matches!(long, "help" | "version") {
                continue;
            }
            if arg.is_hide_set() {
                continue;
            }
            let key = long.replace('-', "_");
            // Flags take no value; options take one that parses for their type.
            let sample = match key.as_str() {
                "file_mode" | "dir_mode" => Some("0644"),
                "metadata_ttl"
                | "negative_metadata_ttl"
                | "request_timeout"
                | "memory_idle_timeout"
                | "rdma_init_timeout" => Some("1s"),
                "read_part_size"
                | "max_prefetch"
                | "cache_size"
                | "write_part_size"
                | "write_buffer_size"
                | "multipart_copy_threshold" => Some("8MiB"),
                "endpoint_url" => Some("http://127.0.0.1:1"),
                "metrics_addr" => Some("127.0.0.1:9100"),
                "rdma" => Some("auto"),
                "fuse_transport" => Some("dev"),
                _ if arg.get_action().takes_values() => Some("1"),
                _ => None,
            };
            let opt = match sample {
                Some(v) => format!("{key}={v}"),
                None => key.clone(),
            };
            let args = ["s3rdma", "bkt", "/m", "-o", &opt];
            let Invocation::Mount(cli) =
                try_parse(args).unwrap_or_else(|e| panic!("--{long} has no -o {key}: {e}"))
            else {
                panic!("-o {opt} is not a mount");
            };
            let Invocation::Mount(flag) = try_parse(
                ["s3rdma", "bkt", "/m", &format!("--{long}")]
                    .into_iter()
                    .chain(sample),
            )
            .unwrap_or_else(|e| panic!("--{long}: {e}")) else {
                panic!("--{long} is not a mount");
            };
            assert_eq!(format!("{cli:?}"), format!("{flag:?}"), "-o {opt}");
        }
    }

    #[test]
    fn rejects_bad_input_with_a_hint() {
        let e = settings(&["s3rdma", "bkt", "/m", "-o", "colour=blue"]).unwrap_err();
        assert!(e.contains("unknown mount option 'colour'"), "{e}");
        let e = settings(&["s3rdma", "bkt", "/m", "-o", "uid"]).unwrap_err();
        assert!(e.contains("needs a value"), "{e}");
        let e = settings(&["s3rdma", "bkt:a//b", "/m"]).unwrap_err();
        assert!(e.contains("empty path segment"), "{e}");
        let e = settings(&["s3rdma", "bkt:a", "/m", "--prefix", "b"]).unwrap_err();
        assert!(e.contains("two prefixes"), "{e}");
        let e = settings(&["s3rdma", "bkt", "/m", "--endpoint-url", "127.0.0.1:9000"]).unwrap_err();
        assert!(e.contains("http://"), "{e}");
        let e = settings(&["s3rdma", "bkt", "/m", "--auto-unmount"]).unwrap_err();
        assert!(e.contains("--allow-root"), "{e}");
        let e = settings(&["s3rdma", "bkt", "/m", "-o", "read_part_size=12XB"]).unwrap_err();
        assert!(e.contains("--read-part-size") && e.contains("unit"), "{e}");
        let e = settings(&["s3rdma", "bkt", "/m", "--write-part-size", "1MiB"]).unwrap_err();
        assert!(e.contains("5MiB"), "{e}");
        let e = settings(&[
            "s3rdma",
            "bkt",
            "/m",
            "-o",
            "write_part_size=16M,write_buffer_size=20M",
        ])
        .unwrap_err();
        assert!(e.contains("fewer than 2 parts"), "{e}");
        let e = settings(&["s3rdma", "bkt", "/m", "--write-buffer-size", "8GiB"]).unwrap_err();
        assert!(e.contains("registration limit"), "{e}");
        let e = settings(&["s3rdma", "bkt", "/m", "-o", "upload_concurrency=0"]).unwrap_err();
        assert!(e.contains("upload concurrency"), "{e}");
        let e = settings(&["s3rdma", "bkt", "/m", "-o", "shutdown_grace=25h"]).unwrap_err();
        assert!(e.contains("shutdown grace"), "{e}");
        let s = settings(&["s3rdma", "bkt", "/m", "--shutdown-grace", "2s"]).unwrap();
        assert_eq!(s.process.shutdown_grace, Duration::from_secs(2));
        let s = settings(&["s3rdma", "bkt", "/m"]).unwrap();
        assert_eq!(s.process.shutdown_grace, Duration::from_secs(30));
        let s = settings(&["s3rdma", "bkt", "/m", "-o", "write_buffer_size=100M"]).unwrap();
        assert_eq!(
            (s.memory.write_part_size, s.memory.write_buffer_size),
            (16 << 20, 96 << 20)
        );
    }

    /// Normalise an option name or message for comparison: `--max-attempts`, `max_attempts`
    /// and "max attempts" all read "max attempts".
    fn norm(s: &str) -> String {
        s.to_lowercase().replace(['-', '_'], " ")
    }

    /// [S-START-ARGS] Every option that takes a value refuses malformed and out-of-range values,
    /// given as a flag and as `-o`, with a message that names it; every boolean option refuses
    /// a value that is not a boolean. An option added later without a row here fails the test.
    #[test]
    fn every_option_refuses_bad_values_by_name() {
        // (option, bad value, what the message must contain, option name normalised).
        let rows: &[(&str, &str, &str)] = &[
            ("endpoint_url", "localhost:9000", "must start with http://"),
            ("endpoint_url", "s3.example.com", "must start with http://"),
            ("region", "", "region is empty"),
            ("region", " ", "region is empty"),
            ("prefix", "/abs", "starts with '/'"),
            ("prefix", "a//b", "empty path segment"),
            ("rdma", "sometimes", "rdma"),
            ("rdma", "", "rdma"),
            ("max_attempts", "0", "max attempts"),
            ("max_attempts", "101", "max attempts"),
            ("max_attempts", "-1", "max attempts"),
            ("max_attempts", "4294967297", "max attempts"),
            ("request_timeout", "0s", "request timeout"),
            ("request_timeout", "50ms", "request timeout"),
            ("request_timeout", "2h", "request timeout"),
            ("request_timeout", "soon", "request timeout"),
            ("rdma_init_timeout", "0s", "rdma init timeout"),
            ("rdma_init_timeout", "11min", "rdma init timeout"),
            ("rdma_init_timeout", "soon", "rdma init timeout"),
            ("uid", "4294967295", "uid"),
            ("uid", "4294967296", "uid"),
            ("uid", "root", "uid"),
            ("gid", "4294967295", "gid"),
            ("gid", "-1", "gid"),
            ("file_mode", "0888", "file mode"),
            ("file_mode", "17777", "file mode"),
            ("dir_mode", "rwx", "dir mode"),
            ("max_threads", "0", "max threads"),
            ("max_threads", "1025", "max threads"),
            ("max_threads", "18446744073709551616", "max threads"),
            ("shutdown_grace", "25h", "shutdown grace"),
            ("memory_idle_timeout", "8d", "memory idle timeout"),
            ("memory_idle_timeout", "soon", "memory idle timeout"),
            ("shutdown_grace", "-1s", "shutdown grace"),
            ("metadata_ttl", "forever", "metadata ttl"),
            (
                "negative_metadata_ttl",
                "1 fortnight",
                "negative metadata ttl",
            ),
            ("read_part_size", "32KiB", "read part size"),
            ("read_part_size", "12XB", "read part size"),
            ("read_part_size", "8GiB", "read part size"),
            ("cache_size", "1MiB", "cache size"),
            ("cache_size", "100TiB", "cache size"),
            ("max_inflight_reads", "0", "max inflight reads"),
            ("max_inflight_reads", "5000", "max inflight reads"),
            ("read_ahead_kb", "2000000", "read ahead"),
            ("read_ahead_kb", "-5", "read ahead"),
            ("max_prefetch", "1TiB", "max prefetch"),
            ("max_prefetch", "lots", "max prefetch"),
            ("write_part_size", "1MiB", "write part size"),
            ("write_part_size", "6GiB", "write part size"),
            ("write_buffer_size", "20MiB", "write buffer size"),
            ("write_buffer_size", "8GiB", "write buffer size"),
            (
                "multipart_copy_threshold",
                "1MiB",
                "multipart copy threshold",
            ),
            (
                "multipart_copy_threshold",
                "6GiB",
                "multipart copy threshold",
            ),
            ("upload_concurrency", "0", "upload concurrency"),
            ("upload_concurrency", "257", "upload concurrency"),
            ("max_dir_rename_keys", "10000001", "max dir rename keys"),
            ("max_dir_rename_keys", "many", "max dir rename keys"),
            ("log_level", "s3rdma=loud", "log level"),
            ("fuse_transport", "fast", "fuse transport"),
            ("fuse_queue_depth", "0", "fuse queue depth"),
            ("fuse_queue_depth", "257", "fuse queue depth"),
            ("io_threads", "0", "io threads"),
            ("io_threads", "257", "io threads"),
            ("cache_dir", "", "cache dir"),
            ("cache_dir_size", "1MiB", "cache dir size"),
            ("cache_dir_size", "lots", "cache dir size"),
            ("staging_dir", "", "staging dir"),
            ("staging_size", "1KiB", "staging size"),
            ("metrics_addr", "localhost", "metrics address"),
            ("metrics_addr", "10.1.2.3:9100", "--metrics-allow-remote"),
        ];
        // Options whose values are checked when the daemon starts, not here: named files and
        // the AWS profile (tests/integration/startup.rs covers them).
        let at_startup = ["log_file", "stats_file", "profile"];
        let cmd = Cli::command();
        for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
            let Some(long) = arg.get_long() else { continue };
            if matches!(long, "help" | "version") {
                continue;
            }
            let key = long.replace('-', "_");
            if arg.get_action().takes_values() {
                assert!(
                    at_startup.contains(&key.as_str()) || rows.iter().any(|r| r.0 == key),
                    "--{long} has no bad-value row"
                );
            } else {
                // A boolean: -o key=maybe is refused by name; key=no is accepted.
                let e = settings(&["s3rdma", "bkt", "/m", "-o", &format!("{key}=maybe")])
                    .expect_err(&key);
                assert!(norm(&e).contains(&norm(&key)), "{key}: {e}");
                let off = [
                    "s3rdma",
                    "bkt",
                    "/m",
                    &format!("--{long}"),
                    "-o",
                    &format!("{key}=no"),
                ];
                let Ok(Invocation::Mount(off)) = try_parse(off) else {
                    panic!("-o {key}=no");
                };
                let Ok(Invocation::Mount(none)) = try_parse(["s3rdma", "bkt", "/m"]) else {
                    panic!("a bare mount");
                };
                assert_eq!(
                    format!("{off:?}"),
                    format!("{none:?}"),
                    "-o {key}=no undoes --{long}"
                );
            }
        }
        for (key, bad, needle) in rows {
            let flag = format!("--{}={bad}", key.replace('_', "-"));
            let opt = format!("{key}={bad}");
            for args in [
                vec!["s3rdma", "bkt", "/m", flag.as_str()],
                vec!["s3rdma", "bkt", "/m", "-o", opt.as_str()],
            ] {
                let e = match settings(&args) {
                    Ok(_) => panic!("{args:?} was accepted"),
                    Err(e) => e,
                };
                assert!(norm(&e).contains(&norm(needle)), "{args:?}: {e}");
                assert!(!e.contains("panicked"), "{args:?}: {e}");
            }
        }
    }

    #[test]
    fn escaped_commas_and_ro_rw_order() {
        assert_eq!(
            s3rdma_proto::units::split_options(r"a,b=c\,d, e"),
            ["a", "b=c,d", "e"]
        );
        let s = settings(&["s3rdma", "bkt", "/m", "-o", "ro,rw"]).unwrap();
        assert!(!s.kernel.read_only);
        let s = settings(&[
            "s3rdma", "bkt", "/m", "-o", "rw", "-o", "ro", "-o", "noexec",
        ])
        .unwrap();
        assert!(s.kernel.read_only);
        assert_eq!(s.kernel.kernel_flags, vec![MountOption::NoExec]);
    }
}
