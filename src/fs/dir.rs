//! Directory listings: one full ListObjectsV2 walk (delimiter `/`) turned into sorted entries.

use std::collections::BTreeMap;

use crate::fs::names::{self, BadName, Entry};
use crate::s3::{ListPage, ObjectInfo};

/// One entry of a listed directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listed {
    File(ObjectInfo),
    Dir,
}

/// A key the listing could not show, and why.
#[derive(Debug, PartialEq, Eq)]
pub struct Hidden {
    pub key: String,
    pub why: &'static str,
}

/// Accumulates listing pages of the directory `prefix` into entries sorted by name.
///
/// Rules: a name that is both a file and a directory is the directory (the file is hidden);
/// the directory's own marker object is not an entry; keys that are not valid names are hidden.
#[derive(Debug, Default)]
pub struct DirBuilder {
    prefix: String,
    entries: BTreeMap<String, Listed>,
    hidden: Vec<Hidden>,
}

impl DirBuilder {
    pub fn new(prefix: &str) -> Self {
        DirBuilder {
            prefix: prefix.to_string(),
            ..Default::default()
        }
    }

    pub fn add_page(&mut self, page: ListPage) {
        for p in page.prefixes {
            match names::prefix_entry(&self.prefix, &p) {
                Ok(Entry::Dir(name)) => {
                    let name = name.to_string();
                    if let Some(Listed::File(f)) = self.entries.insert(name, Listed::Dir) {
                        self.hide(f.key, "a directory of the same name exists");
                    }
                }
                Ok(_) => {}
                Err(why) => self.hide_bad(p, why),
            }
        }
        for o in page.objects {
            match names::object_entry(&self.prefix, &o.key) {
                Ok(Entry::File(name)) => {
                    if self.entries.get(name) == Some(&Listed::Dir) {
                        let key = o.key.clone();
                        self.hide(key, "a directory of the same name exists");
                    } else {
                        self.entries.insert(name.to_string(), Listed::File(o));
                    }
                }
                Ok(_) => {}
                Err(why) => {
                    let key = o.key.clone();
                    self.hide_bad(key, why)
                }
            }
        }
    }

    fn hide_bad(&mut self, key: String, why: BadName) {
        self.hide(key, why.describe());
    }

    fn hide(&mut self, key: String, why: &'static str) {
        self.hidden.push(Hidden { key, why });
    }

    /// The entries, sorted by name, and the keys that were hidden.
    pub fn finish(self) -> (Vec<(String, Listed)>, Vec<Hidden>) {
        (self.entries.into_iter().collect(), self.hidden)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn obj(key: &str, size: u64) -> ObjectInfo {
        ObjectInfo {
            key: key.into(),
            size,
            etag: "\"x\"".into(),
            last_modified: SystemTime::UNIX_EPOCH,
            meta: None,
        }
    }

    // [S-NS-HIDDEN] [S-NS-CLASH]
    #[test]
    fn merges_pages_and_applies_rules() {
        let mut b = DirBuilder::new("d/");
        b.add_page(ListPage {
            objects: vec![obj("d/", 0), obj("d/a", 1), obj("d/clash", 2)],
            prefixes: vec!["d/sub/".into()],
            next_token: Some("t".into()),
        });
        // The directory "clash/" arrives on a later page than the file "clash".
        b.add_page(ListPage {
            objects: vec![obj("d/z z", 3), obj("d/..", 4)],
            prefixes: vec!["d/clash/".into(), "d//".into()],
            next_token: None,
        });
        let (entries, hidden) = b.finish();
        let names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a", "clash", "sub", "z z"]);
        assert_eq!(entries[1].1, Listed::Dir);
        assert_eq!(entries[0].1, Listed::File(obj("d/a", 1)));
        let hidden_keys: Vec<&str> = hidden.iter().map(|h| h.key.as_str()).collect();
        assert_eq!(hidden_keys.len(), 3, "{hidden:?}");
        assert!(hidden_keys.contains(&"d/clash"));
        assert!(hidden_keys.contains(&"d/.."));
        assert!(hidden_keys.contains(&"d//"));
    }

    #[test]
    fn file_after_dir_is_hidden() {
        let mut b = DirBuilder::new("");
        b.add_page(ListPage {
            objects: vec![obj("x", 1)],
            prefixes: vec!["x/".into()],
            next_token: None,
        });
        let (entries, hidden) = b.finish();
        assert_eq!(entries, vec![("x".to_string(), Listed::Dir)]);
        assert_eq!(hidden[0].key, "x");
    }
}
