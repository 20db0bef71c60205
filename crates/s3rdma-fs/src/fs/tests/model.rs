//! Reference-model tests: generated sequences of local operations (write, read, unlink, rename
//! of files and directories,
//! mkdir, rmdir, chmod, utimes, truncate to any size, edits in place and appends (staged files),
//! symbolic links, read handles kept open, a file kept open for writing with fsync and written
//! on after it), another client's PUTs and DELETEs (including keys no Linux path can name and
//! keys that clash with directories), outages during a write, the kernel forgetting its
//! entries (FORGET), and remounts,
//! run on `S3Fs` over the in-memory store with every TTL at 0. After every step the model —
//! the bucket's keys as SEMANTICS.md says each operation leaves them, plus the directories made
//! in this mount — is compared with the bucket and with what the filesystem shows (listings,
//! stat, bytes), and with what the kernel was told: each listed entry has its type (links on a
//! fresh mount too), and no answer contradicts a type handed out earlier [S-NS-TYPE]. A
//! failure shrinks to a minimal sequence.
//!
//! `S3RDMA_MODEL_CASES=N` runs N sequences (CI: the default 48, fixed seed);
//! `S3RDMA_MODEL_SEED=S` picks another seed for a soak.
#![cfg(test)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileType};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};

use super::super::namespace::SetAttr;
use super::{pattern, Fx};

/// Paths the local operations use: files and directories, nested, one that clashes.
const PATHS: &[&str] = &["a", "b", "d", "d/a", "d/b", "d/e", "d/e/a", "x", "x/y"];
/// Keys another client writes: the paths above, a marker, and keys no path can name.
const KEYS: &[&str] = &[
    "a", "b", "d/a", "d/b", "d/e/a", "x", "x/y", "m/", "d//h", "d/../h", "./c",
];
/// File sizes: empty, tiny, a few pages, and one byte over S3's smallest part (multipart).
const SIZES: &[usize] = &[0, 1, 100, 70_000, (5 << 20) + 1];
/// Paths that are often directories (sources of `RenameDir`).
const DIRS: &[&str] = &["d", "x", "d/e"];
/// Symbolic link targets.
const TARGETS: &[&str] = &["a", "../x/y", "d/e"];
/// The stored mode of a symbolic link (s3fs's format).
const LINK_MODE: u32 = libc::S_IFLNK | 0o777;

fn is_link(o: &Obj) -> bool {
    o.mode == Some(LINK_MODE)
}

#[derive(Clone, Debug)]
enum Step {
    Write {
        path: usize,
        size: usize,
        seed: u8,
    },
    Read {
        path: usize,
    },
    Unlink {
        path: usize,
    },
    Rename {
        from: usize,
        to: usize,
    },
    /// A rename whose source is one of the directories (`DIRS`), to any path.
    RenameDir {
        from: usize,
        to: usize,
    },
    Mkdir {
        path: usize,
    },
    Rmdir {
        path: usize,
    },
    Chmod {
        path: usize,
        mode: u32,
    },
    Truncate {
        path: usize,
    },
    RemotePut {
        key: usize,
        size: usize,
        seed: u8,
    },
    RemoteDelete {
        key: usize,
    },
    WriteInOutage {
        path: usize,
        size: usize,
        seed: u8,
    },
    /// Open for reading and keep the handle.
    OpenRead {
        path: usize,
    },
    /// Read 4 KiB at `at`/255 of the file through an open handle.
    ReadOpen {
        slot: usize,
        at: u8,
    },
    CloseRead {
        slot: usize,
    },
    /// Open for writing (`O_TRUNC`/create) and keep the handle (one at a time).
    OpenWrite {
        path: usize,
    },
    /// Append to the file open for writing.
    WriteMore {
        size: usize,
        seed: u8,
    },
    /// Close it: the commit, conditional on what the key was at open.
    CloseWrite,
    /// `fsync` it: the same commit, the handle stays open.
    Fsync,
    /// `utimes`: the mtime stored with the object.
    Utimes {
        path: usize,
        secs: u32,
    },
    /// Open read-write (created if missing), write at `at`/255 of the file, close: staged.
    Edit {
        path: usize,
        at: u8,
        size: usize,
        seed: u8,
    },
    /// Open `O_APPEND` (created if missing), write, close: staged.
    Append {
        path: usize,
        size: usize,
        seed: u8,
    },
    /// `truncate` to any size (longer: zeros).
    TruncateTo {
        path: usize,
        size: usize,
    },
    Symlink {
        path: usize,
        target: usize,
    },
    Remount,
    /// The kernel forgets every entry but those of open files (`drop_caches`) [S-NS-FORGET].
    ForgetAll,
}

fn size() -> impl Strategy<Value = usize> {
    // The multipart size is rare: it costs 5 MiB per step.
    prop_oneof![
        8 => (0..SIZES.len() - 1).prop_map(|i| SIZES[i]),
        1 => Just(SIZES[SIZES.len() - 1]),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    let p = 0..PATHS.len();
    let k = 0..KEYS.len();
    prop_oneof![
        6 => (p.clone(), size(), any::<u8>()).prop_map(|(path, size, seed)| Step::Write { path, size, seed }),
        4 => p.clone().prop_map(|path| Step::Read { path }),
        2 => p.clone().prop_map(|path| Step::Unlink { path }),
        2 => (p.clone(), p.clone()).prop_map(|(from, to)| Step::Rename { from, to }),
        2 => (0..DIRS.len(), p.clone()).prop_map(|(from, to)| Step::RenameDir { from, to }),
        2 => p.clone().prop_map(|path| Step::Mkdir { path }),
        2 => p.clone().prop_map(|path| Step::Rmdir { path }),
        1 => (p.clone(), prop_oneof![Just(0o600u32), Just(0o640), Just(0o755)]).prop_map(|(path, mode)| Step::Chmod { path, mode }),
        1 => p.clone().prop_map(|path| Step::Truncate { path }),
        4 => (k.clone(), size(), any::<u8>()).prop_map(|(key, size, seed)| Step::RemotePut { key, size, seed }),
        2 => k.prop_map(|key| Step::RemoteDelete { key }),
        1 => (p.clone(), size(), any::<u8>()).prop_map(|(path, size, seed)| Step::WriteInOutage { path, size, seed }),
        2 => p.clone().prop_map(|path| Step::OpenRead { path }),
        3 => (0..4usize, any::<u8>()).prop_map(|(slot, at)| Step::ReadOpen { slot, at }),
        1 => (0..4usize).prop_map(|slot| Step::CloseRead { slot }),
        2 => p.prop_map(|path| Step::OpenWrite { path }),
        2 => (size(), any::<u8>()).prop_map(|(size, seed)| Step::WriteMore { size, seed }),
        2 => Just(Step::CloseWrite),
        1 => Just(Step::Fsync),
        1 => (0..PATHS.len(), any::<u32>()).prop_map(|(path, secs)| Step::Utimes { path, secs }),
        1 => Just(Step::Remount),
        2 => Just(Step::ForgetAll),
        3 => (0..PATHS.len(), any::<u8>(), size(), any::<u8>()).prop_map(|(path, at, size, seed)| Step::Edit { path, at, size: size.min(70_000), seed }),
        2 => (0..PATHS.len(), size(), any::<u8>()).prop_map(|(path, size, seed)| Step::Append { path, size: size.min(70_000), seed }),
        1 => (0..PATHS.len(), size()).prop_map(|(path, size)| Step::TruncateTo { path, size }),
        2 => (0..PATHS.len(), 0..TARGETS.len()).prop_map(|(path, target)| Step::Symlink { path, target }),
    ]
}

/// One object as the model expects the bucket to hold it.
#[derive(Clone, Debug, PartialEq)]
struct Obj {
    data: Vec<u8>,
    /// The permission bits stored with it (None: the mount's default applies).
    mode: Option<u32>,
    /// Bumped by every write of the key (a new ETag), even of the same bytes.
    version: u64,
    /// The mtime stored with it by `utimes` (None: not checked).
    mtime: Option<SystemTime>,
}

/// A read handle: what it opened.
#[derive(Debug)]
struct OpenRead {
    fh: u64,
    path: String,
    data: Vec<u8>,
    version: u64,
}

/// The file open for writing.
#[derive(Debug)]
struct Writer {
    fh: u64,
    path: String,
    data: Vec<u8>,
    /// The version of the key at open (None: a new file).
    base: Option<u64>,
    /// Its stored mode, kept by the rewrite.
    mode: Option<u32>,
    /// Committed by `fsync` (Some(true)), or its commit failed (Some(false)): no longer being
    /// written [S-WRITE-FSYNC].
    committed: Option<bool>,
    /// Written on after `fsync`: a staged file now (shared, not busy for others).
    staged: bool,
    /// Unlinked while open: its name is gone, and nothing it writes is stored.
    unlinked: bool,
}

/// The promised state: the bucket's keys, and the directories made in this mount that no key
/// backs (gone at remount with `--no-dir-markers`; with markers, `mkdir` stores `dir/`).
#[derive(Default, Debug)]
struct Model {
    /// `mkdir` stores a marker (the default; `--no-dir-markers` when false).
    markers: bool,
    objects: BTreeMap<String, Obj>,
    local_dirs: BTreeSet<String>,
    reads: Vec<OpenRead>,
    writer: Option<Writer>,
    versions: u64,
}

/// [S-NS-HIDDEN]: a segment no Linux name can be.
fn valid(seg: &str) -> bool {
    !seg.is_empty() && seg != "." && seg != ".." && seg.len() <= 255 && !seg.contains('\0')
}

fn parent(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(p, _)| p)
}

impl Model {
    /// Store `data` under `key` as a new version.
    fn store(&mut self, key: &str, data: Vec<u8>, mode: Option<u32>) {
        self.versions += 1;
        let version = self.versions;
        self.objects.insert(
            key.to_string(),
            Obj {
                data,
                mode,
                version,
                mtime: None,
            },
        );
    }

    /// A new version of `key` with the same bytes (a copy onto itself, a truncate).
    fn touch(&mut self, key: &str, f: impl FnOnce(&mut Obj)) {
        self.versions += 1;
        let version = self.versions;
        if let Some(o) = self.objects.get_mut(key) {
            f(o);
            o.version = version;
        }
    }

    /// Directory `a` renamed to `b`: its keys and the directories made under it move.
    fn rename_dir(&mut self, a: &str, b: &str) {
        let from = format!("{a}/");
        let moved: Vec<String> = self
            .objects
            .keys()
            .filter(|k| k.starts_with(&from))
            .cloned()
            .collect();
        for k in moved {
            let o = self.objects.remove(&k).expect("key");
            let to = format!("{b}/{}", &k[from.len()..]);
            self.store(&to, o.data, o.mode);
            self.touch(&to, |n| n.mtime = o.mtime);
        }
        let dirs: Vec<String> = self.local_dirs.iter().cloned().collect();
        for d in dirs {
            if d == a || d.starts_with(&from) {
                self.local_dirs.remove(&d);
                self.local_dirs.insert(format!("{b}{}", &d[a.len()..]));
            }
        }
    }

    /// The file being written: open for writing and not committed by `fsync`.
    fn writing(&self) -> Option<&Writer> {
        self.writer
            .as_ref()
            .filter(|w| w.committed.is_none() && !w.unlinked)
    }

    /// Whether `path` is the file being written, or lies under it, or holds it.
    fn near_writer(&self, path: &str) -> bool {
        self.writing().is_some_and(|w| {
            w.path == path
                || w.path.starts_with(&format!("{path}/"))
                || path.starts_with(&format!("{}/", w.path))
        })
    }

    /// Directories shown: the root, every prefix of a key up to its first unnameable segment
    /// [S-NS-IMPLICIT] [S-NS-MARKER], those made here and the directories they lie in.
    fn dirs(&self) -> BTreeSet<String> {
        let mut dirs = BTreeSet::from([String::new()]);
        for key in self.objects.keys() {
            let segs: Vec<&str> = key.split('/').collect();
            for i in 1..segs.len() {
                if !valid(segs[i - 1]) {
                    break;
                }
                dirs.insert(segs[..i].join("/"));
            }
        }
        // A directory made here exists, and so do the directories it (or a file being written)
        // lies in.
        let writer_dir = self.writing().map(|w| parent(&w.path).to_string());
        for d in self.local_dirs.iter().chain(writer_dir.iter()) {
            let mut at = d.as_str();
            while !at.is_empty() {
                dirs.insert(at.to_string());
                at = parent(at);
            }
        }
        dirs
    }

    /// Files shown: nameable keys whose path is not also a directory [S-NS-CLASH].
    fn files(&self, dirs: &BTreeSet<String>) -> BTreeMap<String, Obj> {
        self.objects
            .iter()
            .filter(|(k, _)| !k.ends_with('/') && k.split('/').all(valid) && !dirs.contains(*k))
            .filter(|(k, _)| self.writing().is_none_or(|w| &w.path != *k))
            .map(|(k, o)| (k.clone(), o.clone()))
            .collect()
    }

    /// Why the directory `dir` cannot be reached, as path resolution says it: `ENOTDIR` when a
    /// component is a file, `ENOENT` when one is missing.
    fn walk_error(&self, dir: &str) -> Option<Errno> {
        let dirs = self.dirs();
        let files = self.files(&dirs);
        let mut at = String::new();
        for seg in dir.split('/').filter(|s| !s.is_empty()) {
            if !at.is_empty() {
                at.push('/');
            }
            at.push_str(seg);
            if files.contains_key(&at) {
                return Some(Errno::ENOTDIR);
            }
            if !dirs.contains(&at) {
                return Some(Errno::ENOENT);
            }
        }
        None
    }

    /// What `open(O_WRONLY|O_CREAT|O_TRUNC)` of `path` gives: EISDIR for a directory, the
    /// path's resolution error, else success.
    fn open_for_writing(&self, path: &str) -> Result<(), Errno> {
        if self.is_dir(path) {
            Err(Errno::EISDIR)
        } else if self.file(path).is_some_and(|o| is_link(&o)) {
            // The kernel would follow the link; the fixture does not.
            Err(Errno::ELOOP)
        } else if let Some(e) = self.walk_error(parent(path)) {
            Err(e)
        } else {
            Ok(())
        }
    }

    fn is_dir(&self, path: &str) -> bool {
        self.dirs().contains(path)
    }

    fn file(&self, path: &str) -> Option<Obj> {
        let dirs = self.dirs();
        self.files(&dirs).get(path).cloned()
    }

    /// Whether a key (other than `path`'s own marker) lies under `path/`, or a directory made
    /// here does.
    fn has_children(&self, path: &str) -> bool {
        let prefix = format!("{path}/");
        self.objects
            .keys()
            .any(|k| k.starts_with(&prefix) && k.as_str() != prefix)
            || self.local_dirs.iter().any(|d| d.starts_with(&prefix))
            || self.writing().is_some_and(|w| w.path.starts_with(&prefix))
    }
}

fn check(cond: bool, what: impl FnOnce() -> String) -> Result<(), TestCaseError> {
    if cond {
        Ok(())
    } else {
        Err(TestCaseError::fail(what()))
    }
}

/// Apply `step` to the filesystem and the model; compare the outcome where SEMANTICS.md fixes
/// it.
fn apply(fx: &mut Option<Fx>, m: &mut Model, step: &Step) -> Result<(), TestCaseError> {
    let f = fx.as_ref().expect("a mount");
    // While a file is open for writing, what [S-WRITE-WHILE-WRITING] fixes is checked, and
    // steps whose outcome it leaves open (renaming or changing it, keys under it) are skipped.
    if m.writer.as_ref().is_some_and(|w| w.unlinked) && matches!(step, Step::OpenWrite { .. }) {
        close_writer(f, m)?;
    }
    if m.writer.is_some() && matches!(step, Step::OpenWrite { .. }) {
        return Ok(());
    }
    if let Some(w) = m.writing() {
        let wp = w.path.clone();
        match *step {
            // [S-NS-UNLINK]: removed while being written, its name goes (and an older version
            // it was replacing); what it writes is stored nowhere.
            Step::Unlink { path } if PATHS[path] == wp && !w.staged => {
                let got = f.unlink(PATHS[path]);
                check(got.is_ok(), || {
                    format!("unlink of {wp} being written: {got:?}")
                })?;
                m.objects.remove(&wp);
                if let Some(w) = m.writer.as_mut() {
                    w.unlinked = true;
                }
                return Ok(());
            }
            Step::Write { path, .. } | Step::OpenRead { path } | Step::Read { path }
                if PATHS[path] == wp && !w.staged =>
            {
                let got = match *step {
                    Step::Write { .. } => f.write(PATHS[path], b"x"),
                    _ => f
                        .open_read(PATHS[path])
                        .map(|fh| f.fs.run(f.fs.do_release(fh))),
                };
                return check(got == Err(Errno::EBUSY), || {
                    format!("{step:?} on the file being written: {got:?}")
                });
            }
            Step::Rename { from, to } if m.near_writer(PATHS[from]) || m.near_writer(PATHS[to]) => {
                return Ok(())
            }
            Step::RenameDir { from, to }
                if m.near_writer(DIRS[from]) || m.near_writer(PATHS[to]) =>
            {
                return Ok(())
            }
            Step::Write { path, .. }
            | Step::WriteInOutage { path, .. }
            | Step::Mkdir { path }
            | Step::Rmdir { path }
            | Step::Chmod { path, .. }
            | Step::Truncate { path }
            | Step::Unlink { path }
            | Step::Read { path }
            | Step::OpenRead { path }
                if m.near_writer(PATHS[path]) =>
            {
                return Ok(())
            }
            Step::RemotePut { key, .. } | Step::RemoteDelete { key }
                if KEYS[key] != wp && m.near_writer(KEYS[key].trim_end_matches('/')) =>
            {
                return Ok(())
            }
            Step::Utimes { path, .. }
            | Step::Edit { path, .. }
            | Step::Append { path, .. }
            | Step::TruncateTo { path, .. }
            | Step::Symlink { path, .. }
                if m.near_writer(PATHS[path]) =>
            {
                return Ok(())
            }
            _ => {}
        }
    }
    match *step {
        Step::Write { path, size, seed } => {
            let p = PATHS[path];
            let data = pattern(size, seed);
            let got = f.write(p, &data);
            let want = m.open_for_writing(p);
            check(got == want, || {
                format!("write {p}: {got:?}, model says {want:?}")
            })?;
            if got.is_ok() {
                // [S-WRITE-OVERWRITE]: a rewrite keeps the stored mode.
                let mode = m.objects.get(p).and_then(|o| o.mode).or(Some(0o644));
                m.store(p, data, mode);
                // A key under a directory made here now backs it.
            }
        }
        Step::Read { path } => {
            let p = PATHS[path];
            let got = f.read(p);
            match m.file(p) {
                Some(o) if is_link(&o) => check(got == Err(Errno::ELOOP), || {
                    format!("read of link {p}: {:?}", got.map(|v| v.len()))
                })?,
                Some(o) => check(got.as_deref() == Ok(&o.data[..]), || {
                    format!(
                        "read {p}: {:?} bytes, model has {}",
                        got.as_ref().map(Vec::len),
                        o.data.len()
                    )
                })?,
                None if m.is_dir(p) => check(got == Err(Errno::EISDIR), || {
                    format!("read dir {p}: {got:?}")
                })?,
                None => check(
                    matches!(got, Err(Errno::ENOENT) | Err(Errno::ENOTDIR)),
                    || format!("read missing {p}: {:?}", got.map(|v| v.len())),
                )?,
            }
        }
        Step::Unlink { path } => {
            let p = PATHS[path];
            let got = f.unlink(p);
            if m.file(p).is_some() {
                check(got.is_ok(), || format!("unlink {p}: {got:?}"))?;
                m.objects.remove(p);
            } else if m.is_dir(p) {
                check(got == Err(Errno::EISDIR), || {
                    format!("unlink dir {p}: {got:?}")
                })?;
            } else {
                check(got.is_err(), || format!("unlink missing {p} succeeded"))?;
            }
        }
        Step::Rename { from, to } => rename_step(f, m, PATHS[from], PATHS[to])?,
        Step::RenameDir { from, to } => rename_step(f, m, DIRS[from], PATHS[to])?,
        Step::Mkdir { path } => {
            let p = PATHS[path];
            let got = f.mkdir(p);
            if m.is_dir(p) || m.file(p).is_some() {
                check(got == Err(Errno::EEXIST), || {
                    format!("mkdir existing {p}: {got:?}")
                })?;
            } else if !m.is_dir(parent(p)) {
                check(got.is_err(), || {
                    format!("mkdir {p} without parent succeeded")
                })?;
            } else {
                check(got.is_ok(), || format!("mkdir {p}: {got:?}"))?;
                m.local_dirs.insert(p.to_string());
                if m.markers {
                    m.store(&format!("{p}/"), Vec::new(), None);
                }
            }
        }
        Step::Rmdir { path } => {
            let p = PATHS[path];
            let got = f.rmdir(p);
            if !m.is_dir(p) {
                check(got.is_err(), || format!("rmdir non-dir {p} succeeded"))?;
            } else if m.has_children(p) {
                check(got == Err(Errno::ENOTEMPTY), || {
                    format!("rmdir non-empty {p}: {got:?}")
                })?;
            } else {
                check(got.is_ok(), || format!("rmdir empty {p}: {got:?}"))?;
                m.local_dirs.remove(p);
                m.objects.remove(&format!("{p}/"));
            }
        }
        Step::Chmod { path, mode } => {
            let set = SetAttr {
                mode: Some(mode),
                ..Default::default()
            };
            // A link keeps its mode (chmod follows a link; setattr of one leaves it).
            setattr_step(f, m, PATHS[path], set, "chmod", |o| {
                if !is_link(o) {
                    o.mode = Some(mode)
                }
            })?;
        }
        Step::Truncate { path } => {
            let set = SetAttr {
                size: Some(0),
                ..Default::default()
            };
            setattr_step(f, m, PATHS[path], set, "truncate", |o| o.data.clear())?;
        }
        Step::TruncateTo { path, size } => {
            let set = SetAttr {
                size: Some(size as u64),
                ..Default::default()
            };
            setattr_step(f, m, PATHS[path], set, "truncate", |o| {
                o.data.resize(size, 0)
            })?;
        }
        Step::Edit {
            path,
            at,
            size,
            seed,
        } => {
            let p = PATHS[path];
            let data = pattern(size, seed);
            let old = m.file(p);
            let off = old.as_ref().map_or(0, |o| o.data.len() * at as usize / 255);
            let got = f.edit(p, off as u64, &data);
            let want = m.open_for_writing(p);
            check(got == want, || {
                format!("edit {p} at {off}: {got:?}, model says {want:?}")
            })?;
            if got.is_ok() {
                let mut bytes = old.as_ref().map(|o| o.data.clone()).unwrap_or_default();
                if bytes.len() < off + data.len() {
                    bytes.resize(off + data.len(), 0);
                }
                bytes[off..off + data.len()].copy_from_slice(&data);
                // The mode stays; the mtime is the edit's.
                let mode = old.as_ref().and_then(|o| o.mode).or(Some(0o644));
                m.store(p, bytes, mode);
            }
        }
        Step::Append { path, size, seed } => {
            let p = PATHS[path];
            let data = pattern(size, seed);
            let old = m.file(p);
            let got = f.append(p, &data);
            let want = m.open_for_writing(p);
            check(got == want, || {
                format!("append to {p}: {got:?}, model says {want:?}")
            })?;
            if got.is_ok() {
                let mut bytes = old.as_ref().map(|o| o.data.clone()).unwrap_or_default();
                bytes.extend_from_slice(&data);
                // The mode stays; the mtime is the edit's.
                let mode = old.as_ref().and_then(|o| o.mode).or(Some(0o644));
                m.store(p, bytes, mode);
            }
        }
        Step::Symlink { path, target } => {
            let p = PATHS[path];
            let got = f.symlink(p, TARGETS[target]);
            if m.is_dir(p) || m.file(p).is_some() {
                check(got == Err(Errno::EEXIST), || {
                    format!("symlink over existing {p}: {got:?}")
                })?;
            } else if m.walk_error(parent(p)).is_some() {
                check(got.is_err(), || {
                    format!("symlink {p} without parent succeeded")
                })?;
            } else {
                check(got.is_ok(), || format!("symlink {p}: {got:?}"))?;
                m.store(p, TARGETS[target].as_bytes().to_vec(), Some(LINK_MODE));
            }
        }
        Step::RemotePut { key, size, seed } => {
            let data = pattern(size, seed);
            f.mem().put_external(KEYS[key], &data);
            m.store(KEYS[key], data, None);
        }
        Step::RemoteDelete { key } => {
            f.mem().delete_external(KEYS[key]);
            m.objects.remove(KEYS[key]);
        }
        Step::WriteInOutage { path, size, seed } => {
            // [S-WRITE-ALL-OR-NOTHING]: every request fails; nothing changes in the bucket.
            let p = PATHS[path];
            f.store.outage(u64::MAX);
            let got = f.write(p, &pattern(size, seed));
            f.store.clear();
            // EIO where the write would have worked; a name that cannot be written fails as
            // it would anyway (a directory made here is known without asking S3).
            let want = m.open_for_writing(p).and(Err(Errno::EIO));
            check(
                got.is_err() && (got == want || want != Err(Errno::EIO)),
                || format!("write {p} in an outage: {got:?}, model says {want:?}"),
            )?;
        }
        Step::OpenRead { path } => {
            let p = PATHS[path];
            let got = f.open_read(p);
            match m.file(p) {
                Some(o) if is_link(&o) => check(got == Err(Errno::ELOOP), || {
                    format!("open of link {p}: {got:?}")
                })?,
                Some(o) => {
                    let fh = got.map_err(|e| TestCaseError::fail(format!("open {p}: {e:?}")))?;
                    m.reads.push(OpenRead {
                        fh,
                        path: p.to_string(),
                        data: o.data,
                        version: o.version,
                    });
                }
                None => check(got.is_err(), || {
                    format!("open of {p}, absent in the model, succeeded")
                })?,
            }
        }
        Step::ReadOpen { slot, at } => {
            if m.reads.is_empty() {
                return Ok(());
            }
            let h = &m.reads[slot % m.reads.len()];
            let len = h.data.len();
            let off = len * at as usize / 255;
            let end = (off + 4096).min(len);
            let got = f.pread(h.fh, off as u64, 4096);
            let unchanged = m
                .objects
                .get(&h.path)
                .is_some_and(|o| o.version == h.version);
            // [S-READ-PINNED]: the bytes of the version opened, or ESTALE once it is gone.
            match got {
                Ok(bytes) => {
                    check(bytes == h.data[off..end], || {
                        format!("read of {} at {off} through a handle: {} bytes not of the version opened", h.path, bytes.len())
                    })?
                }
                Err(e) => {
                    check(
                        !unchanged && (e == Errno::ESTALE || e == Errno::ENOENT),
                        || {
                            format!("read of {} at {off} through a handle: {e:?} (unchanged: {unchanged})", h.path)
                        },
                    )?
                }
            }
        }
        Step::CloseRead { slot } => {
            if !m.reads.is_empty() {
                let h = m.reads.remove(slot % m.reads.len());
                f.fs.run(f.fs.do_release(h.fh));
            }
        }
        Step::OpenWrite { path } => {
            let p = PATHS[path];
            let got = f.create_or_truncate(p);
            let want = m.open_for_writing(p);
            check(got.map(|_| ()) == want, || {
                format!("open {p} for writing: {got:?}, model says {want:?}")
            })?;
            if let Ok(fh) = got {
                let base = m.objects.get(p);
                m.writer = Some(Writer {
                    fh,
                    path: p.to_string(),
                    data: Vec::new(),
                    base: base.map(|o| o.version),
                    mode: base.and_then(|o| o.mode).or(Some(0o644)),
                    committed: None,
                    staged: false,
                    unlinked: false,
                });
            }
        }
        Step::WriteMore { size, seed } => {
            if let Some(w) = m.writer.as_mut() {
                let data = pattern(size.min(1 << 20), seed);
                let got =
                    f.fs.serve("write", f.fs.do_write(w.fh, w.data.len() as u64, &data));
                match w.committed {
                    None => {
                        check(got == Ok(data.len() as u32), || {
                            format!("write to {}: {got:?}", w.path)
                        })?;
                        w.data.extend_from_slice(&data);
                    }
                    // [S-WRITE-FSYNC]: written on after fsync, the file goes on staged from what
                    // fsync stored; the next close stores the rest.
                    Some(true) => {
                        check(got == Ok(data.len() as u32), || {
                            format!("write after fsync of {}: {got:?}", w.path)
                        })?;
                        w.data.extend_from_slice(&data);
                        w.committed = None;
                        w.staged = true;
                    }
                    Some(false) => check(got.is_err(), || {
                        format!("write after a failed fsync of {}: {got:?}", w.path)
                    })?,
                }
            }
        }
        Step::Fsync => {
            if let Some(w) = m.writing() {
                let got = f.fs.serve("fsync", f.fs.do_fsync(w.fh));
                let stored = commit_outcome(m, got, "fsync")?;
                if let Some(w) = m.writer.as_mut() {
                    w.committed = Some(stored);
                }
            }
        }
        Step::Utimes { path, secs } => {
            let t = UNIX_EPOCH + Duration::new(u64::from(secs), secs % 1_000_000_000);
            let set = SetAttr {
                mtime: Some(t),
                ..Default::default()
            };
            setattr_step(f, m, PATHS[path], set, "utimes", |o| o.mtime = Some(t))?;
        }
        Step::CloseWrite => close_writer(f, m)?,
        // Nothing the user can see changes.
        Step::ForgetAll => f.fs.forget_all_but_open(),
        Step::Remount => {
            close_writer(f, m)?;
            for h in m.reads.drain(..) {
                f.fs.run(f.fs.do_release(h.fh));
            }
            let old = fx.take().expect("a mount");
            *fx = Some(old.remount());
            m.local_dirs.clear();
        }
    }
    Ok(())
}

/// A `setattr` of `p` ([S-NS-SETATTR]): a file takes the change (a copy onto itself: a new
/// version); a directory's attributes live in the mount (not checked); a missing name fails.
/// `rename(a, b)` of anything, checked against the model.
fn rename_step(f: &Fx, m: &mut Model, a: &str, b: &str) -> Result<(), TestCaseError> {
    let got = f.rename(a, b);
    let movable = m.file(a).is_some()
        && !m.is_dir(b)
        && m.is_dir(parent(b))
        && !b.starts_with(&format!("{a}/"));
    if a == b && m.file(a).is_some() {
        check(got.is_ok(), || format!("rename {a} onto itself: {got:?}"))?;
    } else if movable {
        check(got.is_ok(), || format!("rename {a} -> {b}: {got:?}"))?;
        let o = m.objects.remove(a).expect("file");
        m.store(b, o.data, o.mode);
        m.touch(b, |n| n.mtime = o.mtime);
    } else if m.is_dir(a)
        && a != b
        && m.is_dir(parent(b))
        && m.file(b).is_none()
        && !b.starts_with(&format!("{a}/"))
        && !(m.is_dir(b) && m.has_children(b))
    {
        // [S-NS-DIR-RENAME]: every key under it moves, its marker too.
        check(got.is_ok(), || format!("rename dir {a} -> {b}: {got:?}"))?;
        m.rename_dir(a, b);
    } else {
        check(got.is_err() || a == b, || {
            format!("rename {a} -> {b} succeeded; model: not movable")
        })?;
    }
    Ok(())
}

fn setattr_step(
    f: &Fx,
    m: &mut Model,
    p: &str,
    set: SetAttr,
    what: &str,
    change: impl FnOnce(&mut Obj),
) -> Result<(), TestCaseError> {
    let truncates = set.size.is_some();
    let got = f.setattr(p, set).map(|_| ());
    if m.file(p).is_some_and(|o| is_link(&o)) && truncates {
        check(got == Err(Errno::EINVAL), || {
            format!("{what} of link {p}: {got:?}")
        })?;
    } else if m.file(p).is_some() {
        check(got.is_ok(), || format!("{what} {p}: {got:?}"))?;
        m.touch(p, change);
    } else if !m.is_dir(p) {
        check(got.is_err(), || format!("{what} of missing {p} succeeded"))?;
    }
    Ok(())
}

/// Close the file open for writing, if any.
fn close_writer(f: &Fx, m: &mut Model) -> Result<(), TestCaseError> {
    let Some(w) = m.writer.as_ref() else {
        return Ok(());
    };
    let got = f.close(w.fh);
    if w.unlinked {
        check(got.is_ok(), || {
            format!("close of unlinked {}: {got:?}", w.path)
        })?;
        m.writer = None;
        return Ok(());
    }
    match w.committed {
        // [S-WRITE-FSYNC]: the object keeps what fsync stored; the close stores nothing more.
        Some(true) => check(got.is_ok(), || {
            format!("close after fsync of {}: {got:?}", w.path)
        })?,
        Some(false) => {}
        None if w.data.is_empty() => {
            // [S-WRITE-SHELL]: a close before anything was written stores nothing; the empty
            // file is stored at the last release (just after), under the same condition, where
            // an error can only be logged.
            check(got.is_ok(), || {
                format!("close of {} with nothing written: {got:?}", w.path)
            })?;
            if m.objects.get(&w.path).map(|o| o.version) == w.base {
                let (path, mode) = (w.path.clone(), w.mode);
                m.store(&path, Vec::new(), mode);
            }
        }
        None => {
            commit_outcome(m, got, "close")?;
        }
    }
    m.writer = None;
    Ok(())
}

/// Check the outcome of committing the file open for writing ([S-WRITE-EXCL]
/// [S-WRITE-OVERWRITE]): stored if its key is as it was at open, else `EEXIST`/`ESTALE` (or
/// `ENOENT` when deleted) and the other client's object stays. Whether it was stored.
fn commit_outcome(
    m: &mut Model,
    got: Result<(), Errno>,
    what: &str,
) -> Result<bool, TestCaseError> {
    let w = m.writer.as_ref().expect("a writer");
    let now = m.objects.get(&w.path).map(|o| o.version);
    if now == w.base {
        check(got.is_ok(), || format!("{what} of {}: {got:?}", w.path))?;
        let (path, data, mode) = (w.path.clone(), w.data.clone(), w.mode);
        m.store(&path, data, mode);
        let version = m.objects.get(&path).map(|o| o.version);
        if let Some(w) = m.writer.as_mut() {
            w.base = version;
        }
        Ok(true)
    } else {
        let want = match (w.base, now) {
            (None, Some(_)) => vec![Errno::EEXIST],
            (Some(_), Some(_)) => vec![Errno::ESTALE],
            _ => vec![Errno::ENOENT, Errno::ESTALE],
        };
        check(got.as_ref().is_err_and(|e| want.contains(e)), || {
            format!(
                "{what} of {} changed by another client: {got:?}, want one of {want:?}",
                w.path
            )
        })?;
        Ok(false)
    }
}

/// Compare the bucket and the filesystem's view with the model.
fn compare(fx: &Fx, m: &Model) -> Result<(), TestCaseError> {
    // The bucket holds exactly the model's objects, and no upload is left open.
    let keys: Vec<String> = fx.mem().keys();
    let want: Vec<String> = m.objects.keys().cloned().collect();
    check(keys == want, || {
        format!("bucket keys {keys:?}, model {want:?}")
    })?;
    for (k, o) in &m.objects {
        check(fx.mem().data(k).as_ref() == Some(&o.data), || {
            format!("bucket bytes of {k}")
        })?;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while !fx.mem().pending_uploads().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    check(fx.mem().pending_uploads().is_empty(), || {
        format!("uploads left open: {:?}", fx.mem().pending_uploads())
    })?;
    // What the filesystem shows: each directory's entries, each file's size, mode and bytes.
    let dirs = m.dirs();
    let files = m.files(&dirs);
    let writing: Vec<String> = m.writing().iter().map(|w| w.path.clone()).collect();
    for d in &dirs {
        let mut want: Vec<String> = dirs
            .iter()
            .chain(files.keys())
            .chain(writing.iter())
            .filter(|p| !p.is_empty() && parent(p) == d.as_str())
            .map(|p| p.rsplit('/').next().unwrap_or(p).to_string())
            .collect();
        want.sort();
        // [S-NS-TYPE]: each entry listed with its type, links included, whatever came first.
        let want: Vec<(String, FileType)> = want
            .into_iter()
            .map(|n| {
                let p = if d.is_empty() {
                    n.clone()
                } else {
                    format!("{d}/{n}")
                };
                let kind = match files.get(&p) {
                    _ if dirs.contains(&p) => FileType::Directory,
                    Some(o) if is_link(o) => FileType::Symlink,
                    _ => FileType::RegularFile,
                };
                (n, kind)
            })
            .collect();
        let got = fx.ls_typed(d);
        check(got.as_ref() == Ok(&want), || {
            format!("ls {d:?}: {got:?}, model {want:?}")
        })?;
        let a = fx.stat(d);
        check(
            a.as_ref().map(|a| a.kind) == Ok(FileType::Directory),
            || format!("stat dir {d:?}: {a:?}"),
        )?;
    }
    for (p, o) in &files {
        let a = fx
            .stat(p)
            .map_err(|e| TestCaseError::fail(format!("stat {p}: {e:?}")))?;
        let kind = if is_link(o) {
            FileType::Symlink
        } else {
            FileType::RegularFile
        };
        check(a.kind == kind && a.size == o.data.len() as u64, || {
            format!(
                "stat {p}: {:?} {} bytes, model {kind:?} {}",
                a.kind,
                a.size,
                o.data.len()
            )
        })?;
        if is_link(o) {
            let got = fx.readlink(p);
            check(got.as_deref() == Ok(&o.data[..]), || {
                format!("readlink {p}: {got:?}")
            })?;
            continue;
        }
        let mode = o.mode.unwrap_or(0o644) & 0o7777;
        check(u32::from(a.perm) == mode, || {
            format!("mode of {p}: {:o}, model {mode:o}", a.perm)
        })?;
        if let Some(t) = o.mtime {
            check(a.mtime == t, || {
                format!("mtime of {p}: {:?}, model {t:?}", a.mtime)
            })?;
        }
        let got = fx.read(p);
        check(got.as_deref() == Ok(&o.data[..]), || {
            format!("bytes of {p}: {:?}", got.map(|v| v.len()))
        })?;
    }
    // [S-WRITE-WHILE-WRITING]: a file being written shows the bytes written so far.
    if let Some(w) = m.writing() {
        let a = fx.stat(&w.path);
        check(
            a.as_ref().map(|a| a.size) == Ok(w.data.len() as u64),
            || {
                format!(
                    "stat of {} being written: {a:?}, model {} bytes",
                    w.path,
                    w.data.len()
                )
            },
        )?;
    }
    let told = fx.contradictions();
    check(told.is_empty(), || {
        format!("the kernel was told two types: {told:?}")
    })?;
    for p in PATHS {
        if !dirs.contains(*p) && !files.contains_key(*p) && !writing.iter().any(|w| w == p) {
            let got = fx.stat(p);
            check(
                matches!(got, Err(Errno::ENOENT) | Err(Errno::ENOTDIR)),
                || format!("stat of {p}, absent in the model: {got:?}"),
            )?;
        }
    }
    Ok(())
}

fn run(steps: &[Step], markers: bool) -> Result<(), TestCaseError> {
    let mut cfg = super::strict_config();
    cfg.dir_markers = markers;
    let mut fx = Some(Fx::with_config(cfg));
    let mut m = Model {
        markers,
        ..Model::default()
    };
    for (i, step) in steps.iter().enumerate() {
        apply(&mut fx, &mut m, step)
            .and_then(|()| compare(fx.as_ref().expect("a mount"), &m))
            .map_err(|e| TestCaseError::fail(format!("step {i} {step:?}: {e}")))?;
    }
    Ok(())
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

// [S-NS-IMPLICIT] [S-NS-MARKER] [S-NS-HIDDEN] [S-NS-CLASH] [S-NS-MKDIR] [S-NS-UNLINK]
// [S-NS-RENAME] [S-NS-SETATTR] [S-WRITE-OVERWRITE] [S-WRITE-ALL-OR-NOTHING] [S-NS-TTL]
// [S-READ-PINNED] [S-WRITE-EXCL] [S-WRITE-FSYNC] [S-WRITE-SHELL] [S-WRITE-WHILE-WRITING]
// [S-STAGE-EDIT] [S-NS-SYMLINK] [S-NS-TYPE] [S-NS-DIR-RENAME]
#[test]
fn operation_sequences_match_the_reference_model() {
    let cases = env_u64("S3RDMA_MODEL_CASES").unwrap_or(48) as u32;
    let seed = env_u64("S3RDMA_MODEL_SEED").unwrap_or(0x5eed_0001);
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 2048,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(
        config,
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes),
    );
    // Every sequence with and without directory markers.
    let result = runner.run(&proptest::collection::vec(step(), 1..24), |steps| {
        run(&steps, true).and_then(|()| run(&steps, false))
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
