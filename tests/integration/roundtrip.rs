//! A tree written on one mount reads back the same on the next, byte for byte and type for
//! type: each test writes with real tools, unmounts, mounts again (a later job sees only what
//! S3 holds) and reads back with other real tools.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;

fn sh(script: &str) -> String {
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .output()
        .expect("bash");
    assert!(
        out.status.success(),
        "{script} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A local tree with files, nested directories, an empty one and relative links.
fn local_tree(tag: &str) -> PathBuf {
    let root = work_dir().join(format!("rt-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let r = root.display();
    sh(&format!(
        "mkdir -p {r}/a/b {r}/empty/inner && cd {r} && head -c 300000 /dev/urandom > f1.bin \
         && printf three > f3.bin && printf x > a/b/one && ln -s ../f3.bin a/b/link3 \
         && ln -s a/b top-link && ln -s /nowhere dangling"
    ));
    root
}

// [S-NS-TYPE] [S-NS-TREE-TOOLS]
#[test]
fn tar_then_a_fresh_mount_keeps_links_and_empty_directories() {
    let b = bucket("rt-tar");
    let src = local_tree("tar");
    let tarball = src.with_extension("tgz");
    sh(&format!(
        "tar -czf {} -C {} .",
        tarball.display(),
        src.display()
    ));
    let m = Mount::new(&b, &[]);
    sh(&format!(
        "tar -xzf {} -C {}",
        tarball.display(),
        m.path.display()
    ));
    drop(m);
    // tar's own comparison of the archive with the tree, first thing on a fresh mount:
    // contents, types, link targets, modes and mtimes. (tar -d lists a directory before it
    // looks at its files; within the metadata TTL a listing shows S3's time for a file of
    // 4 KiB or more not looked up yet [S-NS-READDIRPLUS], so the TTL is 0 here.)
    let m = Mount::new(&b, &["--metadata-ttl", "0"]);
    sh(&format!(
        "tar -dzf {} -C {}",
        tarball.display(),
        m.path.display()
    ));
    drop(m);
    let m = Mount::new(&b, &[]);
    // The first thing this mount does is a walk by readdir (os.walk, then lstat).
    let walk = sh(&format!(
        "python3 -c 'import os,stat,sys\nfor d,ds,fs in os.walk(sys.argv[1]):\n for n in sorted(ds+fs):\n  p=os.path.join(d,n); print(os.path.relpath(p,sys.argv[1]), stat.filemode(os.lstat(p).st_mode)[0])' {}",
        m.path.display()
    ));
    assert!(walk.contains("a/b/link3 l"), "{walk}");
    assert!(
        walk.contains("top-link l") && walk.contains("dangling l"),
        "{walk}"
    );
    assert!(walk.contains("empty/inner d"), "{walk}");
    let links = sh(&format!("cd {} && find . -type l | sort", m.path.display()));
    assert_eq!(links, "./a/b/link3\n./dangling\n./top-link\n");
    drop(m);
    let _ = std::fs::remove_dir_all(&src);
    let _ = std::fs::remove_file(&tarball);
}

// [S-NS-TYPE]
#[test]
fn cp_a_and_rsync_a_out_of_a_fresh_mount_keep_links() {
    let b = bucket("rt-copy");
    let src = local_tree("copy");
    let m = Mount::new(&b, &[]);
    sh(&format!("cp -a {}/. {}/", src.display(), m.path.display()));
    drop(m);
    let m = Mount::new(&b, &[]);
    let out = work_dir().join(format!("rt-copy-out-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    sh(&format!(
        "cp -a {m}/. {o}-cp/ 2>/dev/null || (mkdir -p {o}-cp && cp -a {m}/. {o}-cp/)",
        m = m.path.display(),
        o = out.display()
    ));
    drop(m);
    let m = Mount::new(&b, &[]);
    sh(&format!(
        "rsync -a {}/ {}-rsync/",
        m.path.display(),
        out.display()
    ));
    for copy in ["cp", "rsync"] {
        let dir = format!("{}-{copy}", out.display());
        assert_eq!(
            std::fs::read_link(Path::new(&dir).join("a/b/link3")).unwrap(),
            Path::new("../f3.bin"),
            "{copy}"
        );
        sh(&format!("diff -r --no-dereference {} {dir}", src.display()));
        assert!(Path::new(&dir).join("empty/inner").is_dir(), "{copy}");
        let _ = std::fs::remove_dir_all(&dir);
    }
    let _ = std::fs::remove_dir_all(&src);
}

// [S-NS-DIR-RENAME]
#[test]
fn os_rename_of_a_checkpoint_directory() {
    let b = bucket("rt-rename");
    let m = Mount::new(&b, &[]);
    let p = m.path.display();
    sh(&format!(
        "mkdir -p {p}/tmp-checkpoint-100/shards && for i in $(seq 0 99); do \
         head -c $((1000 + i)) /dev/urandom > {p}/tmp-checkpoint-100/shards/s$i; done \
         && ln -s shards/s0 {p}/tmp-checkpoint-100/latest && mkdir {p}/tmp-checkpoint-100/empty \
         && cd {p}/tmp-checkpoint-100 && sha256sum shards/* > ../sums"
    ));
    sh(&format!(
        "python3 -c 'import os,sys; os.rename(sys.argv[1]+\"/tmp-checkpoint-100\", sys.argv[1]+\"/checkpoint-100\")' {p}"
    ));
    assert!(!m.join("tmp-checkpoint-100").exists());
    sh(&format!(
        "cd {p}/checkpoint-100 && sha256sum -c --quiet ../sums"
    ));
    drop(m);
    let m = Mount::new(&b, &[]);
    let p = m.path.display();
    sh(&format!(
        "cd {p}/checkpoint-100 && sha256sum -c --quiet ../sums"
    ));
    assert_eq!(
        std::fs::read_link(m.join("checkpoint-100/latest")).unwrap(),
        Path::new("shards/s0")
    );
    assert!(m.join("checkpoint-100/empty").is_dir());
    assert!(!m.join("tmp-checkpoint-100").exists());
    // Not listed either (SeaweedFS lists a directory whose marker went before its keys).
    let top: Vec<String> = std::fs::read_dir(&m.path)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!top.contains(&"tmp-checkpoint-100".to_string()), "{top:?}");
    assert_eq!(
        std::fs::read_dir(m.join("checkpoint-100/shards"))
            .unwrap()
            .count(),
        100
    );
    // Past --max-dir-rename-keys: EXDEV, and mv still moves it.
    drop(m);
    let m = Mount::new(&b, &["--max-dir-rename-keys", "10"]);
    let e = std::fs::rename(m.join("checkpoint-100"), m.join("c")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EXDEV));
    sh(&format!(
        "mv {p}/checkpoint-100 {p}/c",
        p = m.path.display()
    ));
    sh(&format!(
        "cd {}/c && sha256sum -c --quiet ../sums",
        m.path.display()
    ));
}

// [S-ATTR-XATTR]
#[test]
fn rsync_with_xattrs_round_trip() {
    let b = bucket("rt-xattr");
    let src = work_dir().join(format!("rt-xattr-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&src);
    std::fs::create_dir_all(&src).unwrap();
    let s = src.display();
    sh(&format!(
        "printf data > {s}/f && printf more > {s}/g && python3 -c 'import os,sys; \
         os.setxattr(sys.argv[1]+\"/f\", \"user.origin\", b\"run-7\"); \
         os.setxattr(sys.argv[1]+\"/f\", \"user.bin\", bytes(range(256))[:100])' {s}"
    ));
    let m = Mount::new(&b, &[]);
    sh(&format!("rsync -aX {s}/ {}/t/", m.path.display()));
    drop(m);
    let m = Mount::new(&b, &[]);
    let back = work_dir().join(format!("rt-xattr-back-{}", std::process::id()));
    sh(&format!(
        "rsync -aX {}/t/ {}/",
        m.path.display(),
        back.display()
    ));
    let got = sh(&format!(
        "python3 -c 'import os,sys; print(sorted(os.listxattr(sys.argv[1])), os.getxattr(sys.argv[1], \"user.origin\"), os.getxattr(sys.argv[1], \"user.bin\") == bytes(range(100)))' {}/f",
        back.display()
    ));
    assert_eq!(got.trim(), "['user.bin', 'user.origin'] b'run-7' True");
    // A namespace S3 cannot hold: ENOTSUP.
    let e = sh(&format!(
        "python3 -c 'import os,sys\ntry:\n os.setxattr(sys.argv[1], \"trusted.x\", b\"1\")\nexcept OSError as e: print(e.errno)' {}/t/g",
        m.path.display()
    ));
    assert!(
        e.trim() == libc::EOPNOTSUPP.to_string() || e.trim() == libc::EPERM.to_string(),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&src);
    let _ = std::fs::remove_dir_all(&back);
}

// [S-NS-MKDIR]
#[test]
fn git_init_and_commit_survive_a_remount() {
    let b = bucket("rt-git");
    let m = Mount::new(&b, &[]);
    let p = m.path.display();
    sh(&format!(
        "cd {p} && git init -q repo && cd repo && git config user.email t@t && git config user.name t \
         && printf hello > a.txt && mkdir -p src && printf 'fn main() {{}}' > src/main.rs \
         && git add -A && git commit -qm first && git rev-parse HEAD > ../head"
    ));
    drop(m);
    let m = Mount::new(&b, &[]);
    let p = m.path.display();
    sh(&format!("cd {p}/repo && git fsck --strict && test \"$(git rev-parse HEAD)\" = \"$(cat ../head)\" && git status --porcelain | (! grep .)"));
    assert!(m.join("repo/.git/refs/tags").is_dir());
    assert!(m.join("repo/.git/objects/info").is_dir());
}
