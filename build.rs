//! Build script: records the git commit for `s3rdma --version`; with NVIDIA's cuObject library
//! (feature `nvidia`), writes the library's directory into the binaries as an RPATH (see
//! cuobj-ffi's build.rs: its own link arguments cannot reach this crate's binaries).

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=S3RDMA_COMMIT={commit}");
    println!("cargo:rerun-if-env-changed=DEP_S3RDMA_CUOBJ_RPATH");
    if let Some(dir) = std::env::var_os("DEP_S3RDMA_CUOBJ_RPATH") {
        // An RPATH, not a RUNPATH: it also covers libcuobjclient's own libcufile.so.0.
        println!("cargo:rustc-link-arg=-Wl,--disable-new-dtags");
        println!(
            "cargo:rustc-link-arg=-Wl,-rpath,{}",
            std::path::Path::new(&dir).display()
        );
    }
}
