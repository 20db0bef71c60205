//! The layout is the architecture, checked from the source: no import circle between the
//! top-level modules of any crate (Cargo already refuses one between crates), and no HTTP
//! server among the daemon's dependencies (only `s3rdma-endpoint` may have one).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::common::repo_root;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read_dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without comments and without its test module.
fn code_of(text: &str) -> String {
    if text.contains("#![cfg(test)]") {
        return String::new();
    }
    let text = text.split("#[cfg(test)]").next().unwrap_or("");
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The identifiers named right after each occurrence of `crate::`, including the members of
/// `use crate::{a, b::c}` groups.
fn crate_refs(code: &str) -> BTreeSet<String> {
    let mut refs = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inner = group.split('}').next().unwrap_or("");
            for item in inner.split(',') {
                refs.insert(ident(item));
            }
        } else {
            refs.insert(ident(rest));
        }
    }
    refs.remove("");
    refs
}

/// Items a crate root re-exports, by the module they come from (`pub use error::{S3Error}`).
fn reexports(lib: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    for line in lib
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub use "))
    {
        let Some((module, items)) = line.split_once("::") else {
            continue;
        };
        let items = items
            .trim_end_matches(';')
            .trim_matches(|c| c == '{' || c == '}');
        for item in items.split(',') {
            let name = item.split(" as ").last().unwrap_or("").trim();
            let name = name.rsplit("::").next().unwrap_or("").to_string();
            if !name.is_empty() {
                map.insert(name, module.trim().to_string());
            }
        }
    }
    map
}

/// Top-level module → the top-level modules its files use.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap_or_default();
    let via = reexports(&lib);
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(src).expect("under src");
        let top = rel
            .components()
            .next()
            .map(|c| {
                c.as_os_str()
                    .to_string_lossy()
                    .trim_end_matches(".rs")
                    .to_string()
            })
            .unwrap_or_default();
        if matches!(top.as_str(), "lib" | "main" | "bin") {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(&f).expect("read"));
        let uses = graph.entry(top.clone()).or_default();
        for r in crate_refs(&code) {
            let module = via.get(&r).cloned().unwrap_or(r);
            if module != top {
                uses.insert(module);
            }
        }
    }
    graph
}

/// A cycle in `graph`, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut cycle = path[i..].to_vec();
            cycle.push(n.to_string());
            return Some(cycle);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for next in graph.get(n).into_iter().flatten() {
            if graph.contains_key(next) {
                if let Some(c) = visit(next, graph, path, done) {
                    return Some(c);
                }
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_import_circle_between_the_modules_of_any_crate() {
    let root = repo_root();
    let mut crates: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .map(|e| e.expect("entry").path())
        .collect();
    crates.push(root.join("cuobj-ffi"));
    crates.push(root.clone());
    let mut checked = 0;
    for c in crates {
        let graph = module_graph(&c.join("src"));
        checked += graph.len();
        if let Some(cycle) = find_cycle(&graph) {
            panic!(
                "{}: modules import each other: {}",
                c.display(),
                cycle.join(" -> ")
            );
        }
    }
    assert!(checked >= 20, "only {checked} modules found");
    // The checker sees a circle when there is one.
    let mut g = BTreeMap::new();
    g.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    g.insert("b".to_string(), BTreeSet::from(["a".to_string()]));
    assert!(find_cycle(&g).is_some());
    assert_eq!(
        crate_refs("use crate::{cache::Cache, read};\nlet x = crate::upload::f();"),
        BTreeSet::from(["cache".into(), "read".into(), "upload".into()])
    );
}

/// The `[dependencies]` of a workspace crate's manifest, by name.
fn dependencies(manifest: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(manifest).expect("Cargo.toml");
    let mut deps = Vec::new();
    let mut in_deps = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
        } else if in_deps && !line.is_empty() && !line.starts_with('#') {
            let name = line.split(['=', '.']).next().unwrap_or("").trim();
            deps.push(name.to_string());
        }
    }
    deps
}

#[test]
fn the_daemon_links_no_http_server() {
    let root = repo_root();
    let manifest_of = |name: &str| -> PathBuf {
        if name == "cuobj-ffi" {
            root.join("cuobj-ffi/Cargo.toml")
        } else if name == "s3rdma" {
            root.join("Cargo.toml")
        } else {
            root.join("crates").join(name).join("Cargo.toml")
        }
    };
    let mut seen = BTreeSet::new();
    let mut todo = vec!["s3rdma".to_string()];
    while let Some(krate) = todo.pop() {
        if !seen.insert(krate.clone()) {
            continue;
        }
        for dep in dependencies(&manifest_of(&krate)) {
            assert!(
                !matches!(
                    dep.as_str(),
                    "s3s" | "s3s-aws" | "hyper" | "hyper-util" | "s3rdma-endpoint"
                ),
                "{krate} depends on {dep}: only s3rdma-endpoint may have an HTTP server"
            );
            if dep.starts_with("s3rdma") || dep == "cuobj-ffi" {
                todo.push(dep);
            }
        }
    }
    assert!(seen.contains("s3rdma-client") && seen.contains("s3rdma-proto"));
}

#[test]
fn the_top_level_is_the_binary_package_and_the_libraries_are_under_crates() {
    let root = repo_root();
    for path in [
        "Cargo.toml",
        "build.rs",
        "src/main.rs",
        "src/lib.rs",
        "tests/integration/main.rs",
        "cuobj-ffi/Cargo.toml",
        "scripts/test.sh",
        "scripts/demo.sh",
        "README.md",
        "docs/options.md",
    ] {
        assert!(
            root.join(path).exists(),
            "{path} is missing at the top level"
        );
    }
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    assert!(
        manifest.contains("[package]\nname = \"s3rdma\"") && manifest.contains("[workspace]"),
        "the root manifest is both the workspace and the s3rdma package"
    );
    for entry in std::fs::read_dir(root.join("crates")).expect("crates/") {
        let name = entry.expect("entry").file_name();
        let name = name.to_string_lossy();
        assert!(
            name.starts_with("s3rdma-"),
            "crates/{name}: a library's name"
        );
    }
}

/// The GitHub anchor of a Markdown heading's text.
fn slug(heading: &str) -> String {
    let kept: String = heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .collect();
    kept.replace(' ', "-")
}

/// The anchors of a Markdown file's headings (outside code blocks).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut fence = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        fence ^= line.starts_with("```");
        if let Some(h) = line.strip_prefix('#').filter(|_| !fence) {
            out.insert(slug(h.trim_start_matches('#')));
        }
    }
    out
}

#[test]
fn every_link_in_the_readme_and_the_docs_resolves() {
    let root = repo_root();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("entry").path())
        .collect();
    docs.push(root.join("README.md"));
    let mut checked = 0;
    for doc in docs {
        let text = std::fs::read_to_string(&doc).expect("doc");
        for link in text.split("](").skip(1) {
            let target = link.split([')', ' ']).next().unwrap_or_default();
            if target.contains("://") {
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
            let file = match path {
                "" => doc.clone(),
                p => doc.parent().expect("dir").join(p),
            };
            assert!(file.exists(), "{}: {target} does not exist", doc.display());
            if !anchor.is_empty() {
                let text = std::fs::read_to_string(&file).expect("linked doc");
                assert!(
                    anchors(&text).contains(anchor),
                    "{}: {target} names no heading",
                    doc.display()
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 20, "only {checked} links");
}
