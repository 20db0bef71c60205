//! What S3 holds under one name: the object `key`, the directory `key/`, both, or neither.
//!
//! A lookup must answer both questions, because a directory hides a file of the same name. One
//! `ListObjectsV2(prefix = key, delimiter = "/")` answers both at once: the object `key` comes
//! back in the contents (with its size, ETag and mtime, all that a stat needs), and any key
//! under `key/` rolls up into the common prefix `key/`. Other names that merely start with
//! `key` (`key.bak`, `key-2`) come back too; when there are so many of them that the page is
//! truncated before the answer is certain, the lookup asks the two exact questions instead
//! (HeadObject `key` and a one-key listing of `key/`, concurrently), as it also does on
//! servers that refuse a listing prefix that does not end in the delimiter (S3 directory
//! buckets).

use s3rdma_client::{ListPage, ObjectInfo};

/// The answer for one name.
#[derive(Debug, PartialEq, Eq)]
pub struct Probe {
    /// The object `key`, if it exists.
    pub file: Option<ObjectInfo>,
    /// Whether any key starts with `key/`.
    pub dir: bool,
}

/// Keys asked for in the one-request probe: the name itself, its directory, and room for
/// siblings that share its spelling.
pub const PROBE_MAX_KEYS: i32 = 100;

/// The answer a probe listing of `key` gives, or `None` when the page was truncated before it
/// could be sure (neither the directory nor the end of the listing was reached).
pub fn answer(page: ListPage, key: &str, dir_prefix: &str) -> Option<Probe> {
    let dir = page.prefixes.iter().any(|p| p == dir_prefix);
    // With a delimiter, keys under `key/` are rolled up, but an S3-compatible server might
    // still list them; either way they make `key` a directory.
    let dir = dir || page.objects.iter().any(|o| o.key.starts_with(dir_prefix));
    if page.next_token.is_some() && !dir {
        return None;
    }
    let file = page.objects.into_iter().find(|o| o.key == key);
    Some(Probe { file, dir })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn obj(key: &str) -> ObjectInfo {
        ObjectInfo {
            key: key.into(),
            size: 3,
            etag: "\"e\"".into(),
            last_modified: SystemTime::UNIX_EPOCH,
            meta: None,
        }
    }

    fn page(objects: &[&str], prefixes: &[&str], truncated: bool) -> ListPage {
        ListPage {
            objects: objects.iter().map(|k| obj(k)).collect(),
            prefixes: prefixes.iter().map(|p| p.to_string()).collect(),
            next_token: truncated.then(|| "t".to_string()),
        }
    }

    // [S-NS-LOOKUP-ONE]
    #[test]
    fn one_listing_answers_file_dir_both_and_neither() {
        let r = answer(page(&["d/a", "d/a.bak"], &[], false), "d/a", "d/a/").unwrap();
        assert_eq!(r.file.map(|f| f.key), Some("d/a".to_string()));
        assert!(!r.dir);

        let r = answer(page(&["d/a-1"], &["d/a/"], false), "d/a", "d/a/").unwrap();
        assert_eq!(
            r,
            Probe {
                file: None,
                dir: true
            }
        );

        let r = answer(page(&["d/a"], &["d/a/"], false), "d/a", "d/a/").unwrap();
        assert!(r.dir && r.file.is_some());

        // Only siblings: the name does not exist.
        let r = answer(page(&["d/ab", "d/a.x"], &["d/ab/"], false), "d/a", "d/a/").unwrap();
        assert_eq!(
            r,
            Probe {
                file: None,
                dir: false
            }
        );

        // A server that does not roll up keys under the delimiter.
        let r = answer(page(&["d/a/x"], &[], false), "d/a", "d/a/").unwrap();
        assert!(r.dir);
    }

    // [S-NS-LOOKUP-ONE]
    #[test]
    fn a_truncated_page_is_an_answer_only_once_the_directory_is_seen() {
        assert_eq!(
            answer(page(&["d/a", "d/a.1"], &[], true), "d/a", "d/a/"),
            None
        );
        let r = answer(page(&["d/a.1"], &["d/a/"], true), "d/a", "d/a/").unwrap();
        assert!(r.dir);
    }
}
