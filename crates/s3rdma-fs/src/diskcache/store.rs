//! The disk cache's files: names, the meta format, atomic commit, verification, the lock.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use s3rdma_proto::checksum::crc64nvme;

/// What is known of a cached object, as kept in its `.meta` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meta {
    pub bucket: String,
    pub key: String,
    pub etag: String,
    pub size: u64,
    pub block_size: u64,
    /// CRC-64/NVME of each block.
    pub crcs: Vec<u64>,
}

impl Meta {
    pub fn new(bucket: &str, key: &str, etag: &str, size: u64, block_size: u64) -> Meta {
        Meta {
            bucket: bucket.into(),
            key: key.into(),
            etag: etag.into(),
            size,
            block_size,
            crcs: vec![0; size.div_ceil(block_size) as usize],
        }
    }

    pub fn is(&self, bucket: &str, key: &str, etag: &str) -> bool {
        self.bucket == bucket && self.key == key && self.etag == etag
    }

    /// Text form: one `name value` per line; strings hex-encoded (keys may hold any byte).
    pub fn to_text(&self) -> String {
        let crcs: Vec<String> = self.crcs.iter().map(|c| format!("{c:016x}")).collect();
        format!(
            "s3rdma-cache 1\nbucket {}\nkey {}\netag {}\nsize {}\nblock {}\ncrcs {}\n",
            hex(&self.bucket),
            hex(&self.key),
            hex(&self.etag),
            self.size,
            self.block_size,
            crcs.join(",")
        )
    }

    pub fn parse(text: &str) -> Option<Meta> {
        let mut lines = text.lines();
        if lines.next()? != "s3rdma-cache 1" {
            return None;
        }
        let mut field = |name: &str| -> Option<String> {
            let line = lines.next()?;
            line.strip_prefix(name)?
                .strip_prefix(' ')
                .map(str::to_string)
        };
        let bucket = unhex(&field("bucket")?)?;
        let key = unhex(&field("key")?)?;
        let etag = unhex(&field("etag")?)?;
        let size = field("size")?.parse().ok()?;
        let block_size: u64 = field("block")?.parse().ok()?;
        let crcs_text = field("crcs")?;
        if block_size == 0 {
            return None;
        }
        let crcs: Vec<u64> = if crcs_text.is_empty() {
            Vec::new()
        } else {
            crcs_text
                .split(',')
                .map(|c| u64::from_str_radix(c, 16).ok())
                .collect::<Option<_>>()?
        };
        if crcs.len() as u64 != u64::div_ceil(size, block_size) {
            return None;
        }
        Some(Meta {
            bucket,
            key,
            etag,
            size,
            block_size,
            crcs,
        })
    }
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

/// The file name of an object version: two CRC-64s, of (bucket, key) and of (ETag, key).
pub fn entry_name(bucket: &str, key: &str, etag: &str) -> String {
    let a = crc64nvme(format!("{bucket}\0{key}").as_bytes());
    let b = crc64nvme(format!("{etag}\0{key}\0{bucket}").as_bytes());
    format!("{a:016x}{b:016x}")
}

pub fn entry_path(root: &Path, name: &str, ext: &str) -> PathBuf {
    root.join(&name[..2]).join(format!("{name}.{ext}"))
}

/// Take the directory's lock: one mount per cache directory.
pub fn lock_dir(root: &Path) -> Result<File, crate::setup::SetupError> {
    crate::dirlock::lock(root, "cache-dir", root.parent().unwrap_or(root))
}

/// Entries found under `root` (name → meta) and the bytes they hold. Files being filled when
/// an earlier mount ended, and data without a valid meta (or of another size), are removed.
pub fn scan(root: &Path) -> (Vec<(String, Meta)>, u64) {
    let mut found = Vec::new();
    let mut used = 0u64;
    let Ok(dirs) = std::fs::read_dir(root) else {
        return (found, 0);
    };
    for d in dirs.flatten() {
        if !d.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Ok(files) = std::fs::read_dir(d.path()) else {
            continue;
        };
        for f in files.flatten() {
            let path = f.path();
            let Some(ext) = path.extension().and_then(|e| e.to_str()) else {
                continue;
            };
            let Some(name) = path
                .file_stem()
                .and_then(|s| s.to_str())
                .map(str::to_string)
            else {
                continue;
            };
            match ext {
                "meta" => {
                    let meta = std::fs::read_to_string(&path)
                        .ok()
                        .and_then(|t| Meta::parse(&t));
                    let data_len = std::fs::metadata(entry_path(root, &name, "data"))
                        .map(|m| m.len())
                        .ok();
                    match meta {
                        Some(m) if data_len == Some(m.size) && name.len() == 32 => {
                            used += m.size;
                            found.push((name, m));
                        }
                        _ => remove(root, &name),
                    }
                }
                "data" => {
                    if !entry_path(root, &name, "meta").exists() {
                        let _ = std::fs::remove_file(&path);
                    }
                }
                _ => {
                    // .part (filling ended with the mount), .tmp (an unfinished commit).
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
    }
    (found, used)
}

/// Bytes available to us on the file system holding `root`.
pub fn available(root: &Path) -> Option<u64> {
    let st = nix::sys::statvfs::statvfs(root).ok()?;
    Some(st.blocks_available() as u64 * st.fragment_size() as u64)
}

/// A new `.part` file of `size` bytes, allocated up front (blocks arrive in any order: the
/// file still lies contiguous on disk, and a full disk is found here, before any block).
pub fn create_part(root: &Path, name: &str, size: u64) -> std::io::Result<File> {
    let path = entry_path(root, name, "part");
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)?;
    use std::os::fd::AsRawFd;
    // SAFETY: fallocate on an fd we own.
    let r = unsafe { libc::posix_fallocate(f.as_raw_fd(), 0, size as libc::off_t) };
    match r {
        0 => {}
        libc::EOPNOTSUPP | libc::EINVAL => f.set_len(size)?,
        e => {
            drop(f);
            let _ = std::fs::remove_file(&path);
            return Err(std::io::Error::from_raw_os_error(e));
        }
    }
    Ok(f)
}

pub fn write_block(file: &File, offset: u64, data: &[u8]) -> std::io::Result<()> {
    file.write_all_at(data, offset)
}

/// The object is complete: write its meta, then make both visible (`.part` → `.data` last, so
/// a crash leaves either nothing or an entry that verification judges).
pub fn commit(root: &Path, name: &str, meta: &Meta) -> std::io::Result<()> {
    let tmp = entry_path(root, name, "tmp");
    let mut f = File::create(&tmp)?;
    f.write_all(meta.to_text().as_bytes())?;
    drop(f);
    std::fs::rename(&tmp, entry_path(root, name, "meta"))?;
    std::fs::rename(
        entry_path(root, name, "part"),
        entry_path(root, name, "data"),
    )
}

/// Remove the files of an object being filled (never those of a complete entry).
pub fn remove_unfinished(root: &Path, name: &str) {
    for ext in ["part", "tmp"] {
        let _ = std::fs::remove_file(entry_path(root, name, ext));
    }
}

/// Remove every file of an entry.
pub fn remove(root: &Path, name: &str) {
    for ext in ["data", "meta", "part", "tmp"] {
        let _ = std::fs::remove_file(entry_path(root, name, ext));
    }
}

/// Check the file against the meta: its length, and each block's CRC.
pub fn verify(file: &File, meta: &Meta) -> Result<(), String> {
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    if len != meta.size {
        return Err(format!("{len} bytes, {} expected", meta.size));
    }
    let mut buf = vec![0u8; meta.block_size.min(meta.size) as usize];
    for (i, want) in meta.crcs.iter().enumerate() {
        let off = i as u64 * meta.block_size;
        let n = meta.block_size.min(meta.size - off) as usize;
        file.read_exact_at(&mut buf[..n], off)
            .map_err(|e| format!("block {i}: {e}"))?;
        let got = crc64nvme(&buf[..n]);
        if got != *want {
            return Err(format!("block {i}: CRC {got:016x}, {want:016x} expected"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_round_trips_and_rejects_damage() {
        let mut m = Meta::new("bkt", "a/b c\nd", "\"e-2\"", 20, 8);
        m.crcs = vec![1, 2, u64::MAX];
        let t = m.to_text();
        assert_eq!(Meta::parse(&t), Some(m.clone()));
        assert!(Meta::parse(&t.replace("size 20", "size 30")).is_none());
        assert!(Meta::parse(&t.replace("s3rdma-cache 1", "s3rdma-cache 2")).is_none());
        let without_crcs = &t[..t.find("crcs").unwrap()];
        assert!(Meta::parse(without_crcs).is_none());
        assert!(Meta::parse(&t.replace(",ffffffffffffffff", "")).is_none());
        assert!(Meta::parse("").is_none());
        let empty = Meta::new("bkt", "k", "e", 0, 8);
        assert_eq!(Meta::parse(&empty.to_text()), Some(empty));
        assert_ne!(entry_name("b", "k", "e1"), entry_name("b", "k", "e2"));
        assert_ne!(entry_name("b", "k", "e"), entry_name("c", "k", "e"));
        assert_eq!(entry_name("b", "k", "e").len(), 32);
    }
}
