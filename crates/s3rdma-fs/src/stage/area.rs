//! The staging area: where staged files keep their bytes on local disk, within
//! `--staging-size`, and where bytes that could not be stored are kept for the user.
//!
//! Layout under the staging directory: `lock` (flock: one mount per directory), `files/N.data`
//! (a staged file's bytes, sparse) with `files/N.meta` (bucket, key, base ETag, when), and
//! `conflicts/` (files whose commit found the object changed on the server, and files an
//! earlier mount left behind when it ended without storing them: same two files each, the
//! meta saying why). Nothing in `conflicts/` is ever uploaded or removed by the mount.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::{error, info, warn};

use crate::setup::SetupError;

/// Counters of staged files, readable by the user (`s3rdma stats`).
#[derive(Debug, Default)]
pub struct StageStats {
    /// Staged files open now.
    pub files: AtomicU64,
    /// Versions of staged files stored.
    pub commits: AtomicU64,
    /// Bytes of staged files sent to S3 (UploadPart or PutObject).
    pub bytes_sent: AtomicU64,
    /// Bytes copied on the server from the base version (UploadPartCopy, CopyObject).
    pub bytes_copied: AtomicU64,
    /// Bytes fetched from the base version on demand.
    pub bytes_fetched: AtomicU64,
    /// Commits refused because the object changed on the server (bytes kept in conflicts/).
    pub conflicts: AtomicU64,
    /// Staged files an earlier mount left behind (moved to conflicts/ at start).
    pub recovered: AtomicU64,
    /// Writes refused because the staging area was full.
    pub full: AtomicU64,
}

pub struct StagingArea {
    dir: PathBuf,
    limit: u64,
    used: AtomicU64,
    next: AtomicU64,
    pub stats: StageStats,
    _lock: File,
}

/// What a staged file's `.meta` says.
pub struct Label<'a> {
    pub bucket: &'a str,
    pub key: &'a str,
    pub base_etag: &'a str,
}

impl StagingArea {
    /// Use `dir` (created if missing) for at most `limit` bytes. Staged files left there by an
    /// earlier mount are moved to `conflicts/` and reported, never uploaded.
    pub fn open(dir: &Path, limit: u64) -> Result<StagingArea, SetupError> {
        for sub in ["files", "conflicts"] {
            let path = dir.join(sub);
            std::fs::create_dir_all(&path).map_err(|source| SetupError::Dir {
                flag: "staging-dir",
                path,
                source,
            })?;
        }
        let lock = crate::dirlock::lock(dir, "staging-dir", dir)?;
        let area = StagingArea {
            dir: dir.to_path_buf(),
            limit,
            used: AtomicU64::new(0),
            next: AtomicU64::new(1),
            stats: StageStats::default(),
            _lock: lock,
        };
        area.recover();
        Ok(area)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// A new, empty staged file labelled with what it stages.
    pub fn create(&self, label: &Label<'_>) -> std::io::Result<(u64, File)> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let data = self.path(id, "data");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&data)?;
        write_meta(&self.path(id, "meta"), label, None)?;
        self.stats.files.fetch_add(1, Ordering::Relaxed);
        Ok((id, file))
    }

    /// Take `n` more bytes of the area; false (nothing taken) if that would pass the limit.
    pub fn charge(&self, n: u64) -> bool {
        let r = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                (u + n <= self.limit).then_some(u + n)
            });
        if r.is_err() {
            self.stats.full.fetch_add(1, Ordering::Relaxed);
        }
        r.is_ok()
    }

    pub fn uncharge(&self, n: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                Some(u.saturating_sub(n))
            });
    }

    /// A staged file is done with: its bytes go.
    pub fn remove(&self, id: u64, charged: u64) {
        for ext in ["data", "meta"] {
            let _ = std::fs::remove_file(self.path(id, ext));
        }
        self.uncharge(charged);
        self.stats.files.fetch_sub(1, Ordering::Relaxed);
    }

    /// A staged file whose bytes could not be stored: move them to `conflicts/` (they no
    /// longer count against the limit) and return where they are.
    pub fn keep(&self, id: u64, charged: u64, label: &Label<'_>, why: &str) -> PathBuf {
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let name = format!("{stamp}-{}-{id}", std::process::id());
        let to = self.dir.join("conflicts").join(format!("{name}.data"));
        if let Err(e) = std::fs::rename(self.path(id, "data"), &to) {
            warn!(path = %to.display(), error = %e, "cannot move the staged bytes to the conflicts directory; they stay in files/");
        }
        let _ = std::fs::remove_file(self.path(id, "meta"));
        let _ = write_meta(
            &self.dir.join("conflicts").join(format!("{name}.meta")),
            label,
            Some(why),
        );
        self.uncharge(charged);
        self.stats.files.fetch_sub(1, Ordering::Relaxed);
        to
    }

    fn path(&self, id: u64, ext: &str) -> PathBuf {
        self.dir.join("files").join(format!("{id}.{ext}"))
    }

    /// Staged files of an earlier mount that ended without storing them: moved to
    /// `conflicts/`, logged and counted, never uploaded.
    fn recover(&self) {
        let Ok(entries) = std::fs::read_dir(self.dir.join("files")) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "data") {
                if path.extension().is_some_and(|e| e == "meta")
                    && !path.with_extension("data").exists()
                {
                    let _ = std::fs::remove_file(&path);
                }
                continue;
            }
            let meta = std::fs::read_to_string(path.with_extension("meta")).unwrap_or_default();
            let stem = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            let name = format!("recovered-{}-{stem}", std::process::id());
            let to = self.dir.join("conflicts").join(format!("{name}.data"));
            if std::fs::rename(&path, &to).is_err() {
                continue;
            }
            let mut m = meta.clone();
            m.push_str(
                "reason=\"an earlier mount ended before this file was stored; not uploaded\"\n",
            );
            let _ = std::fs::write(to.with_extension("meta"), m);
            let _ = std::fs::remove_file(path.with_extension("meta"));
            let key = meta
                .lines()
                .find_map(|l| l.strip_prefix("key="))
                .unwrap_or("?")
                .to_string();
            self.stats.recovered.fetch_add(1, Ordering::Relaxed);
            error!(key, path = %to.display(), "a staged file an earlier mount did not store was found; it was NOT uploaded: check its bytes and copy it into place yourself");
        }
        let kept = std::fs::read_dir(self.dir.join("conflicts"))
            .map(|d| {
                d.flatten()
                    .filter(|e| e.path().extension().is_some_and(|x| x == "data"))
                    .count()
            })
            .unwrap_or(0);
        if kept > 0 {
            info!(dir = %self.dir.join("conflicts").display(), files = kept, "the staging directory keeps files that could not be stored");
        }
    }

    /// The staging area's counters (see [`s3rdma_metrics::Report`]).
    pub fn report(&self, out: &mut dyn s3rdma_metrics::Sink) {
        use s3rdma_metrics::{load, Value};
        let (c, g) = (Value::counter, Value::gauge);
        let s = &self.stats;
        out.value(g("staged_files", "Files staged now.", load(&s.files)));
        out.value(g(
            "staged_bytes",
            "Bytes the staging area holds now.",
            self.used(),
        ));
        out.value(
            g(
                "staged_limit",
                "The staging area's limit in bytes.",
                self.limit,
            )
            .exported("staged_limit_bytes", &[]),
        );
        out.value(c(
            "staged_commits",
            "Staged files stored (at fsync or close).",
            load(&s.commits),
        ));
        out.value(c(
            "staged_bytes_sent",
            "Bytes of staged files sent to S3.",
            load(&s.bytes_sent),
        ));
        out.value(c(
            "staged_bytes_copied",
            "Bytes of staged files copied on the server (UploadPartCopy).",
            load(&s.bytes_copied),
        ));
        out.value(c(
            "staged_bytes_fetched",
            "Bytes of base versions fetched into staged files.",
            load(&s.bytes_fetched),
        ));
        out.value(c(
            "staged_conflicts",
            "Staged files kept in conflicts/ (changed on the server, or not stored).",
            load(&s.conflicts),
        ));
        out.value(c(
            "staged_recovered",
            "Staged files an earlier mount left, reported at start.",
            load(&s.recovered),
        ));
        out.value(c(
            "staged_full",
            "Writes refused because the staging area was full.",
            load(&s.full),
        ));
    }
}

fn write_meta(path: &Path, label: &Label<'_>, why: Option<&str>) -> std::io::Result<()> {
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut f = File::create(path)?;
    // The key as the Rust string literal of it: one line whatever it holds.
    writeln!(f, "bucket={:?}", label.bucket)?;
    writeln!(f, "key={:?}", label.key)?;
    writeln!(f, "base_etag={:?}", label.base_etag)?;
    writeln!(f, "created={created}")?;
    if let Some(why) = why {
        writeln!(f, "reason={why:?}")?;
    }
    Ok(())
}
