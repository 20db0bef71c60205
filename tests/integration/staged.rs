//! Staged files through the mount, with the tools that need them: checkpoint formats that seek
//! back (zip, safetensors), databases (sqlite in both journal modes), appends, edits in place,
//! truncation, writable mmap, locks; conflicts, a full staging area and a crash. Bytes are
//! checked through the mount and on the server.

use std::io::{Seek, SeekFrom, Write};
use std::process::Command;
use std::time::Duration;

use crate::common::*;

const MIB: usize = 1 << 20;

/// Run a Python script (bounded in time); panics with its output if it fails.
fn python(script: &str) -> String {
    let mut cmd = Command::new("timeout");
    cmd.args(["300", "python3", "-c", script]);
    let out = cmd.output().expect("python3");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "python failed:\n{text}");
    text
}

fn sh(script: &str) -> String {
    let out = Command::new("timeout")
        .args(["120", "bash", "-c", script])
        .output()
        .expect("bash");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{script} failed:\n{text}");
    text
}

// [S-STAGE-TOOLS]
#[test]
fn checkpoint_formats_databases_and_logs_write_through_the_mount() {
    let b = bucket("tools");
    let m = Mount::new(&b, &["--write-part-size", "5MiB"]);
    let local = m.path.with_extension("local");
    let _ = std::fs::remove_dir_all(&local);
    std::fs::create_dir_all(&local).unwrap();
    // Each tool writes the same thing to the mount and to a local directory.
    let script = format!(
        r#"
import os, sys, zipfile, sqlite3, numpy as np
from safetensors.numpy import save_file, load_file
M, L = {m:?}, {l:?}
rng = np.random.default_rng(7)
big = rng.integers(0, 255, 12 << 20, dtype=np.uint8).tobytes()
tensors = {{"w": rng.random((700, 1000), dtype=np.float32), "b": np.arange(1000, dtype=np.int64)}}
for d in (M, L):
    with zipfile.ZipFile(f"{{d}}/a.zip", "w") as z:
        # Fixed times: the two copies must be byte for byte the same.
        z.writestr(zipfile.ZipInfo("big.bin", (2020, 1, 1, 0, 0, 0)), big)
        z.writestr(zipfile.ZipInfo("small.txt", (2020, 1, 1, 0, 0, 0)), "hello")
    save_file(tensors, f"{{d}}/model.safetensors")
    for epoch in range(3):
        with open(f"{{d}}/train.log", "a") as f:
            f.write(f"epoch {{epoch}} loss {{1.0 / (epoch + 1)}}\n")
np.savez_compressed(f"{{M}}/arrays.npz", a=rng.random(2_000_000), b=np.arange(10))
with zipfile.ZipFile(f"{{M}}/a.zip") as z:
    assert z.read("big.bin") == big and z.read("small.txt") == b"hello"
got = load_file(f"{{M}}/model.safetensors")
assert all((got[k] == tensors[k]).all() for k in tensors)
z = np.load(f"{{M}}/arrays.npz")
assert z["a"].shape == (2_000_000,) and list(z["b"]) == list(range(10))
for mode in ("DELETE", "WAL"):
    p = f"{{M}}/db-{{mode}}.sqlite"
    c = sqlite3.connect(p)
    assert c.execute(f"pragma journal_mode={{mode}}").fetchone()[0].upper() == mode
    c.execute("create table t (x integer, s text)")
    for i in range(5):
        with c:
            c.executemany("insert into t values (?, ?)", [(j, "x" * 100) for j in range(i * 200, (i + 1) * 200)])
    c.close()
    c = sqlite3.connect(p)
    assert c.execute("select count(*), sum(x) from t").fetchone() == (1000, 499500), mode
    c.close()
print("ok")
"#,
        m = m.path.display().to_string(),
        l = local.display().to_string()
    );
    assert!(python(&script).contains("ok"));
    for key in ["a.zip", "model.safetensors", "train.log"] {
        let want = std::fs::read(local.join(key)).unwrap();
        assert!(
            backend_get(&b, key).unwrap() == want,
            "{key} on the server is what the tool wrote"
        );
    }
    assert_eq!(
        String::from_utf8(backend_get(&b, "train.log").unwrap())
            .unwrap()
            .lines()
            .count(),
        3
    );
    // tar appends to an archive in place.
    let out = sh(&format!(
        "cd {l} && echo one > f1 && echo two > f2 && tar -cf {m}/a.tar f1 && tar -rf {m}/a.tar f2 && tar -tf {m}/a.tar",
        l = local.display(),
        m = m.path.display()
    ));
    assert_eq!(out.lines().collect::<Vec<_>>(), ["f1", "f2"]);
    let stats = mount_stats(&m.path);
    assert!(stat_value(&stats, "staged_commits") >= 6, "{stats}");
    assert_eq!(stat_value(&stats, "staged_files"), 0, "{stats}");
    assert_eq!(open_uploads(&b), 0);
    let _ = std::fs::remove_dir_all(&local);
}

// [S-STAGE-EDIT]
#[test]
fn an_edit_in_the_middle_sends_only_the_parts_it_touches() {
    let b = bucket("edit");
    let mut want = pattern(64 * MIB, 5);
    put(&b, "big", want.clone());
    let m = Mount::new(&b, &[]);
    let before = mount_stats(&m.path);
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.join("big"))
        .unwrap();
    f.seek(SeekFrom::Start(30 * MIB as u64)).unwrap();
    f.write_all(&[b'E'; 4096]).unwrap();
    close_file(f).unwrap();
    want[30 * MIB..30 * MIB + 4096].fill(b'E');
    assert!(backend_get(&b, "big").unwrap() == want);
    assert!(std::fs::read(m.join("big")).unwrap() == want);
    let after = mount_stats(&m.path);
    let sent = stat_value(&after, "staged_bytes_sent") - stat_value(&before, "staged_bytes_sent");
    let copied =
        stat_value(&after, "staged_bytes_copied") - stat_value(&before, "staged_bytes_copied");
    assert!(sent <= 2 * 16 * MIB as u64, "sent {sent}");
    assert_eq!(sent + copied, 64 * MIB as u64);
    // dd conv=notrunc edits in place; truncate shrinks and grows.
    sh(&format!(
        "printf XYZ | dd of={p} bs=1 seek=100 conv=notrunc status=none && truncate -s 200 {p} && truncate -s 300 {p}",
        p = m.join("big").display()
    ));
    let mut small = want[..200].to_vec();
    small[100..103].copy_from_slice(b"XYZ");
    small.resize(300, 0);
    assert_eq!(backend_get(&b, "big").unwrap(), small);
    assert_eq!(std::fs::metadata(m.join("big")).unwrap().len(), 300);
    assert_eq!(open_uploads(&b), 0);
}

// [S-STAGE-SHARED] [S-STAGE-MMAP] [S-STAGE-LOCKS]
#[test]
fn handles_share_a_staged_file_mmap_writes_and_locks_hold_between_processes() {
    let b = bucket("shared");
    put(&b, "f", vec![b'.'; 8192]);
    let m = Mount::new(&b, &[]);
    let p = m.join("f").display().to_string();
    let script = format!(
        r#"
import mmap, os, fcntl, subprocess
p = {p:?}
w = open(p, "r+b")
w.seek(10); w.write(b"writer"); w.flush()
with open(p, "rb") as r:
    r.seek(10); assert r.read(6) == b"writer", "a reader sees the writer's bytes"
with open(p, "r+b") as w2:
    w2.seek(20); w2.write(b"second")
m = mmap.mmap(w.fileno(), 8192)
m[100:105] = b"mmap!"
m.flush()
with open(p, "rb") as r:
    r.seek(100); assert r.read(5) == b"mmap!", "read() sees what msync wrote"
with open(p, "r+b") as w3:
    w3.seek(200); w3.write(b"direct")
assert m[200:206] == b"direct", "the mapping sees a write through another handle"
m.close()
w.close()
with open(p, "rb") as r:
    d = r.read()
assert d[10:16] == b"writer" and d[20:26] == b"second" and d[100:105] == b"mmap!", d[:120]
fd = os.open(p, os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
assert subprocess.run(["flock", "-n", p, "true"]).returncode == 1, "flock held"
fcntl.flock(fd, fcntl.LOCK_UN)
assert subprocess.run(["flock", "-n", p, "true"]).returncode == 0, "flock released"
fcntl.lockf(fd, fcntl.LOCK_EX)
code = f"import fcntl, os\nfd = os.open({{p!r}}, os.O_RDWR)\ntry:\n    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n    print('got')\nexcept OSError:\n    print('held')"
assert subprocess.run(["python3", "-c", code], capture_output=True, text=True).stdout.strip() == "held"
os.close(fd)
print("ok")
"#
    );
    assert!(python(&script).contains("ok"));
    let d = backend_get(&b, "f").unwrap();
    assert_eq!(&d[10..16], b"writer");
    assert_eq!(&d[20..26], b"second");
    assert_eq!(&d[100..105], b"mmap!");
    assert_eq!(&d[200..206], b"direct");
    assert_eq!(d.len(), 8192);
}

// [S-STAGE-CONFLICT]
#[test]
fn a_remote_change_during_a_staged_edit_fails_with_estale_and_keeps_the_bytes() {
    let b = bucket("conflict");
    put(&b, "c", b"original".to_vec());
    let m = Mount::new(&b, &[]);
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.join("c"))
        .unwrap();
    f.seek(SeekFrom::Start(2)).unwrap();
    f.write_all(b"MINE").unwrap();
    put(&b, "c", b"theirs!!".to_vec());
    assert_eq!(
        close_file(f).unwrap_err().raw_os_error(),
        Some(libc::ESTALE)
    );
    assert_eq!(backend_get(&b, "c").unwrap(), b"theirs!!", "theirs stays");
    let stats = mount_stats(&m.path);
    assert_eq!(stat_value(&stats, "staged_conflicts"), 1);
    let conflicts = m.path.with_extension("staging").join("conflicts");
    let kept: Vec<_> = std::fs::read_dir(&conflicts)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let data = kept
        .iter()
        .find(|p| p.extension().is_some_and(|e| e == "data"))
        .expect("the bytes are kept");
    assert_eq!(&std::fs::read(data).unwrap()[2..6], b"MINE");
    let meta = std::fs::read_to_string(data.with_extension("meta")).unwrap();
    assert!(meta.contains("key=\"c\""), "{meta}");
    assert!(m.log_text().contains("NOT stored"));
}

// [S-STAGE-FULL]
#[test]
fn a_full_staging_area_gives_enospc_and_stores_nothing() {
    let b = bucket("full");
    let m = Mount::new(&b, &["--staging-size", "8MiB"]);
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.join("big"))
        .unwrap();
    let mut err = None;
    for chunk in pattern(9 * MIB, 1).chunks(MIB) {
        if let Err(e) = f.write_all(chunk) {
            err = Some(e);
            break;
        }
    }
    assert_eq!(err.and_then(|e| e.raw_os_error()), Some(libc::ENOSPC));
    assert_eq!(
        close_file(f).unwrap_err().raw_os_error(),
        Some(libc::ENOSPC)
    );
    assert_eq!(backend_get(&b, "big"), None, "nothing partial is stored");
    let stats = mount_stats(&m.path);
    assert!(stat_value(&stats, "staged_full") >= 1);
    assert_eq!(stat_value(&stats, "staged_bytes"), 0, "{stats}");
    // Smaller files still fit.
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.join("small"))
        .unwrap();
    f.write_all(b"fits").unwrap();
    close_file(f).unwrap();
    assert_eq!(backend_get(&b, "small").unwrap(), b"fits");
}

// [S-STAGE-CRASH]
#[test]
fn staged_bytes_survive_a_crash_and_the_next_mount_reports_them_without_uploading() {
    let b = bucket("crash");
    put(&b, "f", b"stored version".to_vec());
    let staging = mountpoint().with_extension("crash-staging");
    let _ = std::fs::remove_dir_all(&staging);
    let dir = staging.display().to_string();
    let mut m = Mount::new(&b, &["--staging-dir", &dir]);
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.join("f"))
        .unwrap();
    f.write_all(b"UNSAVED").unwrap();
    m.signal(libc::SIGKILL);
    m.wait_exit(Duration::from_secs(10));
    drop(f);
    let _ = Command::new("umount").arg("-l").arg(&m.path).status();
    drop(m);
    let m = Mount::new(&b, &["--staging-dir", &dir]);
    let stats = mount_stats(&m.path);
    assert_eq!(stat_value(&stats, "staged_recovered"), 1, "{stats}");
    assert!(m.log_text().contains("NOT uploaded"));
    assert_eq!(backend_get(&b, "f").unwrap(), b"stored version");
    let kept = std::fs::read_dir(staging.join("conflicts"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "data"))
        .expect("kept");
    assert!(std::fs::read(kept).unwrap().starts_with(b"UNSAVED"));
    drop(m);
    let _ = std::fs::remove_dir_all(&staging);
}

// [S-NS-SYMLINK]
#[test]
fn symbolic_links_are_stored_as_s3fs_stores_them_and_copy_with_cp_and_rsync() {
    let b = bucket("links");
    // A link another tool (s3fs) stored.
    let c = client();
    rt().block_on(async {
        c.put_object()
            .bucket(&b)
            .key("ext/link")
            .body(b"../data/f".to_vec().into())
            .metadata("mode", "41471")
            .send()
            .await
            .expect("PUT link")
    });
    let m = Mount::new(&b, &[]);
    let src = m.path.with_extension("src");
    let _ = std::fs::remove_dir_all(&src);
    sh(&format!(
        "mkdir -p {s}/data && echo hello > {s}/data/f && ln -s data/f {s}/rel && ln -s /nonexistent/x {s}/dangling",
        s = src.display()
    ));
    let mnt = m.path.display().to_string();
    sh(&format!(
        "mkdir -p {mnt}/data && echo hello > {mnt}/data/f && ln -s data/f {mnt}/mine"
    ));
    assert_eq!(
        std::fs::read_link(m.join("mine")).unwrap(),
        std::path::Path::new("data/f")
    );
    assert_eq!(
        std::fs::read(m.join("mine")).unwrap(),
        b"hello\n",
        "followed"
    );
    let st = std::fs::symlink_metadata(m.join("mine")).unwrap();
    assert!(st.file_type().is_symlink());
    assert_eq!(st.len(), 6);
    assert_eq!(
        backend_get(&b, "mine").unwrap(),
        b"data/f",
        "the body is the target"
    );
    let mode = rt().block_on(async {
        c.head_object()
            .bucket(&b)
            .key("mine")
            .send()
            .await
            .expect("HEAD")
    });
    assert_eq!(
        mode.metadata().and_then(|m| m.get("mode")).unwrap(),
        "41471"
    );
    // The s3fs link, looked up before any listing.
    assert_eq!(
        std::fs::read_link(m.join("ext/link")).unwrap(),
        std::path::Path::new("../data/f")
    );
    assert_eq!(std::fs::read(m.join("ext/link")).unwrap(), b"hello\n");
    // cp -a and rsync -a of a tree with links; a second rsync sends nothing.
    sh(&format!(
        "cp -a {s} {mnt}/cpa && rsync -a {s}/ {mnt}/rs/",
        s = src.display()
    ));
    for dir in ["cpa", "rs"] {
        assert_eq!(
            std::fs::read_link(m.join(&format!("{dir}/rel"))).unwrap(),
            std::path::Path::new("data/f")
        );
        assert_eq!(
            std::fs::read_link(m.join(&format!("{dir}/dangling"))).unwrap(),
            std::path::Path::new("/nonexistent/x")
        );
        assert_eq!(
            std::fs::read(m.join(&format!("{dir}/rel"))).unwrap(),
            b"hello\n"
        );
    }
    let again = sh(&format!("rsync -ai {s}/ {mnt}/rs/", s = src.display()));
    assert!(again.trim().is_empty(), "rsync sent again: {again}");
    // rename and unlink of a link; hard links are refused.
    std::fs::rename(m.join("mine"), m.join("moved")).unwrap();
    assert_eq!(
        std::fs::read_link(m.join("moved")).unwrap(),
        std::path::Path::new("data/f")
    );
    wait_for_delete(&b, "mine");
    std::fs::remove_file(m.join("moved")).unwrap();
    assert_eq!(backend_get(&b, "moved"), None);
    let e = std::fs::hard_link(m.join("data/f"), m.join("hard")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM));
    let _ = std::fs::remove_dir_all(&src);
}
