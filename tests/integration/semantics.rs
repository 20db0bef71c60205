//! SEMANTICS.md is kept true: every statement carries a tag like `[S-READ-PINNED]`, and every
//! tag is exercised by a test that names it (an integration test here, or a unit test in src/) (and no test names a tag that
//! SEMANTICS.md lacks).

use std::collections::BTreeSet;

fn tags(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("[S-") {
        rest = &rest[i + 1..];
        if let Some(end) = rest.find(']') {
            let tag = &rest[..end];
            if tag
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '-')
            {
                out.insert(tag.to_string());
            }
        }
    }
    out
}

#[test]
fn every_semantics_statement_is_tested() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("SEMANTICS.md")).expect("SEMANTICS.md");
    let documented = tags(&doc);
    assert!(
        documented.len() >= 20,
        "SEMANTICS.md has only {} tagged statements",
        documented.len()
    );
    let mut tested = BTreeSet::new();
    let mut dirs = vec![
        root.join("crates"),
        root.join("cuobj-ffi/src"),
        root.join("src"),
        root.join("tests"),
    ];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs")
                && !path.ends_with("tests/integration/semantics.rs")
            {
                let text = std::fs::read_to_string(&path).unwrap();
                // Only tags inside test code count: files under a src/ must hold them in a test
                // module (or be test-only modules, `#![cfg(test)]`).
                let is_src = path.components().any(|c| c.as_os_str() == "src");
                let text = if is_src && !text.contains("#![cfg(test)]") {
                    text.split_once("#[cfg(test)]")
                        .map(|(_, t)| t.to_string())
                        .unwrap_or_default()
                } else {
                    text
                };
                tested.extend(tags(&text));
            }
        }
    }
    let untested: Vec<_> = documented.difference(&tested).collect();
    assert!(
        untested.is_empty(),
        "SEMANTICS.md statements without a test: {untested:?}"
    );
    let undocumented: Vec<_> = tested.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "tests name tags SEMANTICS.md lacks: {undocumented:?}"
    );
}
