//! Compiles the C++ shim over cuObjClient against one of two providers, and generates the Rust
//! declarations of the shim's C header with bindgen.
//!
//! Provider choice: with feature `nvidia`, NVIDIA's SDK is required; with feature `loopback`,
//! the loopback provider is used; otherwise NVIDIA's SDK when found, else loopback. The SDK is
//! looked for in `CUOBJ_HOME/{include,lib}`, then `CUDA_HOME` / `CUDA_PATH`
//! `targets/<x86_64-linux|sbsa-linux>/{include,lib}`.

use std::env;
use std::path::{Path, PathBuf};

fn sdk_dirs() -> Option<(PathBuf, PathBuf)> {
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let triple = if arch == "aarch64" {
        "sbsa-linux"
    } else {
        "x86_64-linux"
    };
    let mut candidates = Vec::new();
    if let Some(home) = env::var_os("CUOBJ_HOME") {
        let home = PathBuf::from(home);
        candidates.push((home.join("include"), home.join("lib")));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = env::var_os(var) {
            let t = PathBuf::from(home).join("targets").join(triple);
            candidates.push((t.join("include"), t.join("lib")));
        }
    }
    candidates
        .into_iter()
        .find(|(inc, _)| inc.join("cuobjclient.h").is_file())
}

fn main() {
    for var in ["CUOBJ_HOME", "CUDA_HOME", "CUDA_PATH"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=csrc");
    let want_nvidia = env::var_os("CARGO_FEATURE_NVIDIA").is_some();
    let want_loopback = env::var_os("CARGO_FEATURE_LOOPBACK").is_some();
    if want_nvidia && want_loopback {
        panic!("cuobj-ffi: features `nvidia` and `loopback` exclude each other; enable one");
    }
    let sdk = if want_loopback { None } else { sdk_dirs() };
    if want_nvidia && sdk.is_none() {
        panic!(
            "cuobj-ffi: feature `nvidia` needs NVIDIA's cuObject SDK (cuobjclient.h and libcuobjclient.so.1), \
             which was not found: set CUOBJ_HOME to a directory with include/ and lib/, or CUDA_HOME \
             to a CUDA Toolkit >= 13.1.1 (targets/<triple>/include/cuobjclient.h)"
        );
    }

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++17")
        .flag("-fvisibility=hidden")
        .warnings(true)
        .include("csrc")
        .file("csrc/cuobj_shim.cc");
    let provider = match &sdk {
        Some((inc, lib)) => {
            build.include(inc);
            build.define("S3RDMA_CUOBJ_PROVIDER", "\"nvidia\"");
            println!("cargo:rustc-link-search=native={}", lib.display());
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
            for l in [
                "cuobjclient",
                "cufile",
                "ibverbs",
                "rdmacm",
                "numa",
                "pthread",
                "dl",
                "rt",
            ] {
                println!("cargo:rustc-link-lib=dylib={l}");
            }
            "nvidia"
        }
        None => {
            build.include("csrc/loopback");
            build.file("csrc/loopback/cuobjclient.cc");
            build.define("S3RDMA_CUOBJ_PROVIDER", "\"loopback\"");
            "loopback"
        }
    };
    build.compile("s3rdma_cuobj");
    println!("cargo:rustc-link-lib=dylib=stdc++");
    println!("cargo:rustc-cfg=cuobj_provider=\"{provider}\"");
    println!("cargo:rustc-check-cfg=cfg(cuobj_provider, values(\"nvidia\", \"loopback\"))");

    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    bindgen::Builder::default()
        .header(Path::new("csrc/cuobj_shim.h").to_string_lossy())
        .allowlist_function("s3rdma_cuobj_.*")
        .allowlist_type("s3rdma_cuobj_.*")
        .allowlist_var("S3RDMA_CUOBJ_.*")
        .opaque_type("s3rdma_cuobj_client")
        .generate()
        .expect("bindgen could not parse csrc/cuobj_shim.h (is libclang-dev installed?)")
        .write_to_file(out.join("bindings.rs"))
        .expect("write bindings.rs");
}
