//! The key ↔ path mapping.
//!
//! A directory at path `a/b` is the key prefix `<mount prefix>a/b/`; a file at `a/b/c` is the key
//! `<mount prefix>a/b/c`. `/` is the only separator. Keys that cannot be file names are hidden:
//! a segment that is empty (`a//b`), `.` or `..`, longer than 255 bytes, or holding a NUL.

/// The longest file name Linux accepts (NAME_MAX).
pub const NAME_MAX: usize = 255;

/// Why a key (or a name the kernel asked about) is not a usable file name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadName {
    Empty,
    Dot,
    TooLong,
    HasSlash,
    HasNul,
}

impl BadName {
    pub fn describe(self) -> &'static str {
        match self {
            BadName::Empty => "it has an empty path segment",
            BadName::Dot => "a segment is '.' or '..'",
            BadName::TooLong => "a segment is longer than 255 bytes",
            BadName::HasSlash => "it contains '/'",
            BadName::HasNul => "it contains a NUL byte",
        }
    }
}

impl crate::errno::ToErrno for BadName {
    /// The errno for a lookup of such a name.
    fn to_errno(&self) -> i32 {
        match self {
            BadName::TooLong => libc::ENAMETOOLONG,
            _ => libc::EINVAL,
        }
    }
}

/// Check one path segment.
pub fn check_name(name: &str) -> Result<(), BadName> {
    if name.is_empty() {
        Err(BadName::Empty)
    } else if name == "." || name == ".." {
        Err(BadName::Dot)
    } else if name.len() > NAME_MAX {
        Err(BadName::TooLong)
    } else if name.contains('/') {
        Err(BadName::HasSlash)
    } else if name.contains('\0') {
        Err(BadName::HasNul)
    } else {
        Ok(())
    }
}

/// What a listing entry under `dir_prefix` stands for.
#[derive(Debug, PartialEq, Eq)]
pub enum Entry<'a> {
    /// A file named `.0` in the directory.
    File(&'a str),
    /// A subdirectory named `.0`.
    Dir(&'a str),
    /// The directory's own marker object (`dir/`): not an entry.
    SelfMarker,
}

/// Map an object key found by listing `dir_prefix` (with delimiter `/`) to a directory entry.
pub fn object_entry<'a>(dir_prefix: &str, key: &'a str) -> Result<Entry<'a>, BadName> {
    let Some(rest) = key.strip_prefix(dir_prefix) else {
        return Err(BadName::Empty);
    };
    if rest.is_empty() {
        return Ok(Entry::SelfMarker);
    }
    check_name(rest)?;
    Ok(Entry::File(rest))
}

/// Map a common prefix found by listing `dir_prefix` to a directory entry.
pub fn prefix_entry<'a>(dir_prefix: &str, prefix: &'a str) -> Result<Entry<'a>, BadName> {
    let Some(rest) = prefix.strip_prefix(dir_prefix) else {
        return Err(BadName::Empty);
    };
    let name = rest.strip_suffix('/').unwrap_or(rest);
    check_name(name)?;
    Ok(Entry::Dir(name))
}

/// The key of the child `name` in the directory whose prefix is `dir_prefix`.
pub fn child_key(dir_prefix: &str, name: &str) -> String {
    let mut key = String::with_capacity(dir_prefix.len() + name.len());
    key.push_str(dir_prefix);
    key.push_str(name);
    key
}

/// The prefix of the directory whose key is `key`.
pub fn dir_prefix_of(key: &str) -> String {
    let mut p = String::with_capacity(key.len() + 1);
    p.push_str(key);
    p.push('/');
    p
}

/// Normalise a mount prefix: no leading `/`, every segment a valid name, a trailing `/`
/// (empty means the whole bucket).
pub fn normalize_prefix(prefix: &str) -> Result<String, String> {
    if prefix.is_empty() {
        return Ok(String::new());
    }
    if prefix.starts_with('/') {
        return Err(format!(
            "prefix {prefix:?} starts with '/'; S3 keys have no leading slash, write it as {:?}",
            prefix.trim_start_matches('/')
        ));
    }
    let trimmed = prefix.strip_suffix('/').unwrap_or(prefix);
    for seg in trimmed.split('/') {
        if let Err(why) = check_name(seg) {
            return Err(format!(
                "prefix {prefix:?} cannot be mounted: {}; use a prefix like \"datasets/imagenet/\"",
                why.describe()
            ));
        }
    }
    Ok(format!("{trimmed}/"))
}

/// Check a bucket name against S3's rules (3–63 characters of letters, digits, `.`, `-`, `_`,
/// starting and ending with a letter or digit).
pub fn check_bucket(bucket: &str) -> Result<(), String> {
    let fix = "bucket names are 3-63 characters of lowercase letters, digits, '.' and '-', starting and ending with a letter or digit";
    if bucket.len() < 3 || bucket.len() > 63 {
        return Err(format!(
            "bucket name {bucket:?} has {} characters; {fix}",
            bucket.len()
        ));
    }
    if let Some(c) = bucket
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')))
    {
        return Err(format!("bucket name {bucket:?} contains {c:?}; {fix}"));
    }
    let first = bucket.as_bytes()[0];
    let last = bucket.as_bytes()[bucket.len() - 1];
    if !first.is_ascii_alphanumeric() || !last.is_ascii_alphanumeric() || bucket.contains("..") {
        return Err(format!("bucket name {bucket:?} is malformed; {fix}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errno::ToErrno;

    #[test]
    fn names() {
        assert_eq!(check_name("a b%+ü.txt"), Ok(()));
        assert_eq!(check_name(""), Err(BadName::Empty));
        assert_eq!(check_name("."), Err(BadName::Dot));
        assert_eq!(check_name(".."), Err(BadName::Dot));
        assert_eq!(check_name("..."), Ok(()));
        assert_eq!(check_name(&"x".repeat(255)), Ok(()));
        assert_eq!(check_name(&"x".repeat(256)), Err(BadName::TooLong));
        assert_eq!(check_name("a/b"), Err(BadName::HasSlash));
        assert_eq!(check_name("a\0b"), Err(BadName::HasNul));
        assert_eq!(BadName::TooLong.to_errno(), libc::ENAMETOOLONG);
    }

    // [S-NS-HIDDEN]
    #[test]
    fn listing_entries() {
        assert_eq!(object_entry("d/", "d/f"), Ok(Entry::File("f")));
        assert_eq!(object_entry("d/", "d/"), Ok(Entry::SelfMarker));
        assert_eq!(object_entry("", "top"), Ok(Entry::File("top")));
        assert_eq!(object_entry("d/", "d/."), Err(BadName::Dot));
        assert_eq!(object_entry("d/", "e/f"), Err(BadName::Empty));
        assert_eq!(prefix_entry("d/", "d/sub/"), Ok(Entry::Dir("sub")));
        // "d//x" lists as the common prefix "d//": an empty segment, hidden.
        assert_eq!(prefix_entry("d/", "d//"), Err(BadName::Empty));
        assert_eq!(prefix_entry("", "../"), Err(BadName::Dot));
        let long = format!("d/{}/", "y".repeat(300));
        assert_eq!(prefix_entry("d/", &long), Err(BadName::TooLong));
    }

    #[test]
    fn keys() {
        assert_eq!(child_key("", "a"), "a");
        assert_eq!(child_key("p/q/", "a b"), "p/q/a b");
        assert_eq!(dir_prefix_of("p/q"), "p/q/");
    }

    #[test]
    fn prefixes() {
        assert_eq!(normalize_prefix("").unwrap(), "");
        assert_eq!(normalize_prefix("a").unwrap(), "a/");
        assert_eq!(normalize_prefix("a/b/").unwrap(), "a/b/");
        assert!(normalize_prefix("/a")
            .unwrap_err()
            .contains("starts with '/'"));
        assert!(normalize_prefix("a//b")
            .unwrap_err()
            .contains("empty path segment"));
        assert!(normalize_prefix("a/../b")
            .unwrap_err()
            .contains("'.' or '..'"));
        assert!(normalize_prefix("/").is_err());
    }

    #[test]
    fn buckets() {
        assert!(check_bucket("my-bucket.1").is_ok());
        assert!(check_bucket("ab").is_err());
        assert!(check_bucket(&"a".repeat(64)).is_err());
        assert!(check_bucket("has space").unwrap_err().contains("' '"));
        assert!(check_bucket("a/b").is_err());
        assert!(check_bucket("-abc").is_err());
        assert!(check_bucket("abc-").is_err());
        assert!(check_bucket("a..b").is_err());
    }
}
