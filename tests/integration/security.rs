//! Security: secrets never reach the log, other users are kept out unless `--allow-other`,
//! and then the kernel enforces file modes (`default_permissions`); the loopback endpoint
//! serves loopback only.

use std::process::Command;

use crate::common::*;

/// Run `args` as user nobody (65534); (succeeded, stderr).
fn as_nobody(args: &[&str]) -> (bool, String) {
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .args(args)
        .output()
        .expect("setpriv");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// [S-SEC-SECRETS] The secret key appears nowhere in the daemon's debug log or stderr, after
/// reads, writes and a failed request.
#[test]
fn the_secret_key_never_reaches_the_log() {
    let b = bucket("sec-secret");
    put(&b, "r", pattern(1 << 20, 1));
    let m = Mount::new(&b, &[]);
    assert!(std::fs::read(m.join("r")).is_ok());
    std::fs::write(m.join("w"), b"written").unwrap();
    let _ = std::fs::read(m.join("missing"));
    let stderr_path = m.path.with_extension("stderr");
    let log = m.stop();
    let stderr = std::fs::read_to_string(stderr_path).unwrap_or_default();
    assert!(log.contains("s3 request"), "debug log is empty");
    assert!(!log.contains(SECRET_KEY), "the secret key is in the log");
    assert!(!stderr.contains(SECRET_KEY), "the secret key is on stderr");
}

/// [S-SEC-ALLOW-OTHER] Without `--allow-other` no other user can even look into the mount;
/// with it, the kernel checks file modes: a 0600 file of root's is refused to nobody, a 0644
/// one is readable, and nobody cannot create files in root's 0755 directories.
#[test]
fn other_users_are_kept_out_unless_allow_other_and_then_modes_hold() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to switch users");
        return;
    }
    let b = bucket("sec-other");
    put(&b, "open.txt", b"public".to_vec());
    put(&b, "secret.txt", b"private".to_vec());
    let m = Mount::new(&b, &[]);
    let (ok, err) = as_nobody(&["cat", &m.join("open.txt").to_string_lossy()]);
    assert!(!ok, "nobody read a file without --allow-other");
    assert!(err.contains("Permission denied"), "{err}");
    drop(m);

    let m = Mount::new(&b, &["--allow-other"]);
    // chmod is stored with the object; root keeps access, nobody loses it.
    let secret = m.join("secret.txt");
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let (ok, err) = as_nobody(&["cat", &m.join("open.txt").to_string_lossy()]);
    assert!(
        ok,
        "nobody cannot read a 0644 file with --allow-other: {err}"
    );
    let (ok, err) = as_nobody(&["cat", &secret.to_string_lossy()]);
    assert!(!ok, "nobody read a 0600 file of root's");
    assert!(err.contains("Permission denied"), "{err}");
    let (ok, err) = as_nobody(&["touch", &m.join("new.txt").to_string_lossy()]);
    assert!(!ok, "nobody created a file in root's 0755 directory");
    assert!(err.contains("Permission denied"), "{err}");
    assert!(backend_get(&b, "new.txt").is_none());
    assert_eq!(std::fs::read(&secret).unwrap(), b"private");
}

/// [S-SEC-ENDPOINT] The loopback endpoint refuses to listen on anything but loopback.
#[test]
fn the_loopback_endpoint_listens_on_loopback_only() {
    let out = Command::new(endpoint_bin())
        .args([
            "--listen",
            "0.0.0.0:0",
            "--backend",
            &server().endpoint,
            "--access-key",
            ACCESS_KEY,
            "--secret-key",
            SECRET_KEY,
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a loopback address"), "{err}");
}

/// A loopback token naming process `pid` (live: its start time and this boot's id), with a
/// window of 4 KiB at an address that is not mapped.
fn token_for(pid: u32) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let start: u64 = rest.split(' ').nth(19).unwrap().parse().unwrap();
    let boot: String = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap()
        .chars()
        .filter(|c| c.is_ascii_hexdigit())
        .take(16)
        .collect();
    format!("0000000000001000:00001000:{pid:08x}:0000:000001:1:{start:016x}{boot}")
}

/// A signed GET carrying `token`, sent by curl as root or as nobody; returns the HTTP status.
fn signed_get_with_token(url: &str, token: &str, nobody: bool) -> String {
    let mut cmd = if nobody {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "curl",
        ]);
        c
    } else {
        Command::new("curl")
    };
    let out = cmd
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "20",
        ])
        .args(["--aws-sigv4", "aws:amz:us-east-1:s3", "--user"])
        .arg(format!("{ACCESS_KEY}:{SECRET_KEY}"))
        .arg("-H")
        .arg(format!("x-amz-rdma-token: {token}"))
        // The cuObject request rules: UNSIGNED-PAYLOAD and an explicit empty body.
        .args([
            "-H",
            "x-amz-content-sha256: UNSIGNED-PAYLOAD",
            "-H",
            "Content-Length: 0",
        ])
        .arg(url)
        .output()
        .expect("curl");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

// [S-SEC-TOKEN]
/// The loopback endpoint moves bytes only to and from processes the connecting user may
/// access itself: user nobody presenting a token that names a root process is refused (403,
/// logged) before any memory is touched; the same token from root reaches the transfer (which
/// then fails on the unmapped window, 500) — so the refusal is the user check, not the token.
#[test]
fn rdma_tokens_are_served_only_for_processes_the_peer_may_access() {
    let ep = RdmaEndpoint::start();
    let b = bucket("token-owner");
    put(&b, "k", pattern(4096, 71));
    // A root process of this test's own, named by the token.
    let mut victim = Command::new("sleep").arg("60").spawn().unwrap();
    let token = token_for(victim.id());
    let url = format!("{}/{b}/k", ep.url);
    let as_nobody = signed_get_with_token(&url, &token, true);
    let as_root = signed_get_with_token(&url, &token, false);
    let _ = victim.kill();
    let _ = victim.wait();
    assert_eq!(as_nobody, "403", "nobody was not refused");
    assert_eq!(as_root, "500", "root's request did not reach the transfer");
    let log = std::fs::read_to_string(ep.fault_file.with_file_name("endpoint.log")).unwrap();
    assert!(
        log.contains("refusing an RDMA token") && log.contains("may not access"),
        "{}",
        tail(&log, 2000)
    );
}
