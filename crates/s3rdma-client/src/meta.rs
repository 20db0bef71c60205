//! File attributes stored as S3 user metadata, in the names s3fs uses (so either tool reads the
//! other's): `x-amz-meta-mode` (decimal `st_mode`), `x-amz-meta-uid`, `x-amz-meta-gid`,
//! `x-amz-meta-mtime` (seconds since the epoch, with up to nine decimals).

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::xattr::{self, Xattrs};

/// The attributes a file may carry; `None` = not stored (the mount's defaults apply).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileMeta {
    /// Permission bits (`& 0o7777`), plus the file-type bits `S_IFLNK` for a symbolic link
    /// (stored as s3fs stores one: the object's body is the target).
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub mtime: Option<SystemTime>,
    /// User extended attributes (`x-amz-meta-xattr`, see [`crate::xattr`]); `None` = not
    /// known or not changed, `Some` of an empty map = none.
    pub xattrs: Option<Xattrs>,
}

impl FileMeta {
    /// From an object's user metadata (names without `x-amz-meta-`, as the SDK gives them).
    /// Values that do not parse are ignored.
    pub fn from_map(map: Option<&HashMap<String, String>>) -> FileMeta {
        let Some(map) = map else {
            return FileMeta::default();
        };
        let get = |k: &str| {
            map.iter()
                .find(|(name, _)| name.eq_ignore_ascii_case(k))
                .map(|(_, v)| v.trim())
        };
        FileMeta {
            mode: get("mode").and_then(|v| v.parse::<u32>().ok()).map(|m| {
                if m & libc::S_IFMT == libc::S_IFLNK {
                    m & (libc::S_IFMT | 0o7777)
                } else {
                    m & 0o7777
                }
            }),
            uid: get("uid").and_then(|v| v.parse().ok()),
            gid: get("gid").and_then(|v| v.parse().ok()),
            mtime: get("mtime").and_then(parse_time),
            xattrs: get(xattr::HEADER).map(xattr::decode),
        }
    }

    /// As user metadata (empty when nothing is stored).
    pub fn to_map(&self) -> HashMap<String, String> {
        let mut m = HashMap::new();
        if let Some(mode) = self.mode {
            let kind = match mode & libc::S_IFMT {
                0 => libc::S_IFREG,
                t => t,
            };
            m.insert("mode".into(), (kind | (mode & 0o7777)).to_string());
        }
        if let Some(uid) = self.uid {
            m.insert("uid".into(), uid.to_string());
        }
        if let Some(gid) = self.gid {
            m.insert("gid".into(), gid.to_string());
        }
        if let Some(t) = self.mtime {
            m.insert("mtime".into(), format_time(t));
        }
        if let Some(h) = self.xattrs.as_ref().and_then(xattr::encode) {
            m.insert(xattr::HEADER.into(), h);
        }
        m
    }

    /// The attributes of a symbolic link (s3fs's format: `mode` with `S_IFLNK`).
    pub fn symlink(uid: Option<u32>, gid: Option<u32>) -> FileMeta {
        FileMeta {
            mode: Some(libc::S_IFLNK | 0o777),
            uid,
            gid,
            mtime: None,
            xattrs: None,
        }
    }

    /// Whether these are the attributes of a symbolic link.
    pub fn is_symlink(&self) -> bool {
        self.mode.is_some_and(|m| m & libc::S_IFMT == libc::S_IFLNK)
    }

    pub fn is_empty(&self) -> bool {
        *self == FileMeta::default()
    }

    /// `self` with every attribute `other` sets replaced.
    pub fn merged(&self, other: &FileMeta) -> FileMeta {
        FileMeta {
            mode: other.mode.or(self.mode),
            uid: other.uid.or(self.uid),
            gid: other.gid.or(self.gid),
            mtime: other.mtime.or(self.mtime),
            xattrs: other.xattrs.clone().or_else(|| self.xattrs.clone()),
        }
    }

    /// Bytes of user metadata these attributes take when stored (names without the
    /// `x-amz-meta-` prefix plus values, as S3 counts them against its 2 KiB limit).
    pub fn stored_len(&self) -> usize {
        self.to_map().iter().map(|(k, v)| k.len() + v.len()).sum()
    }
}

fn parse_time(v: &str) -> Option<SystemTime> {
    let (secs, frac) = v.split_once('.').unwrap_or((v, ""));
    let secs: u64 = secs.parse().ok()?;
    let digits: String = frac.chars().take(9).collect();
    let nanos = if digits.is_empty() {
        0
    } else {
        if !digits.chars().all(|c| c.is_ascii_digit()) {
            return None;
        }
        format!("{digits:0<9}").parse::<u32>().ok()?
    };
    UNIX_EPOCH.checked_add(Duration::new(secs, nanos))
}

fn format_time(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    if d.subsec_nanos() == 0 {
        d.as_secs().to_string()
    } else {
        format!("{}.{:09}", d.as_secs(), d.subsec_nanos())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_s3fs_values() {
        let m = FileMeta {
            mode: Some(0o640),
            uid: Some(1000),
            gid: Some(0),
            mtime: Some(UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789)),
            xattrs: Some([("user.k".to_string(), b"v".to_vec())].into()),
        };
        let map = m.to_map();
        assert_eq!(map["mode"], "33184");
        assert_eq!(map["mtime"], "1700000000.123456789");
        assert_eq!(FileMeta::from_map(Some(&map)), m);
        // s3fs writes whole seconds; unknown or malformed values are ignored.
        let s3fs: HashMap<String, String> = [
            ("Mode", "33261"),
            ("mtime", "1700000000"),
            ("uid", "x"),
            ("other", "1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let got = FileMeta::from_map(Some(&s3fs));
        assert_eq!(got.mode, Some(0o755));
        assert_eq!(
            got.mtime,
            Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000))
        );
        assert_eq!(got.uid, None);
        assert_eq!(
            parse_time("1.5"),
            Some(UNIX_EPOCH + Duration::from_millis(1500))
        );
        assert_eq!(parse_time("1.x"), None);
        assert!(FileMeta::default().to_map().is_empty());
        let merged = m.merged(&FileMeta {
            mode: Some(0o600),
            ..Default::default()
        });
        assert_eq!((merged.mode, merged.uid), (Some(0o600), Some(1000)));
    }
}
