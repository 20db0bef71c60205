//! Compiles the C++ shim over cuObjClient against one of two providers, and generates the Rust
//! declarations of the shim's C header with bindgen.
//!
//! Provider choice: with feature `nvidia`, NVIDIA's SDK is required; with feature `loopback`,
//! the loopback provider is used; otherwise NVIDIA's SDK when found, else loopback.
//!
//! The SDK is looked for in `CUOBJ_HOME` (`include/`, and `lib/<arch>`, `lib/` or `lib64/`),
//! then `CUDA_HOME`, `CUDA_PATH` and `/usr/local/cuda` (`targets/<x86_64|sbsa>-linux/`, then
//! the toolkit's own `include/` and `lib64/`). It needs the headers `cuobjclient.h`,
//! `cuobjtelem.h`, `cufile.h`, `cuda.h`, and the libraries `libcuobjclient` and `libcufile`; with feature
//! `nvidia` a missing piece fails the build with one message naming it and every place looked.
//!
//! Only `cuobjclient` and `cufile` are linked, by SONAME: the library brings its own
//! dependencies (libibverbs, librdmacm, libnuma: runtime packages, no `-dev`). Its directory
//! goes into the binary as an RPATH (`--disable-new-dtags`), not a RUNPATH: a RUNPATH covers
//! only the binary's own dependencies, and libcuobjclient's own `libcufile.so.0` would not be
//! found. A library's build script cannot give link arguments to the binaries that use it, so
//! the directory is passed on as `DEP_S3RDMA_CUOBJ_RPATH` and the binary's `build.rs` writes
//! it. An SDK whose symbolic links were flattened into text files is linked through a
//! directory of real links in `OUT_DIR` (see [`runtime_dir`]).

use std::env;
use std::path::{Path, PathBuf};

const HEADERS: [&str; 4] = ["cuobjclient.h", "cuobjtelem.h", "cufile.h", "cuda.h"];
const LIBS: [(&str, &str); 2] = [("cuobjclient", "1"), ("cufile", "0")];

/// One place the SDK may be: its include directory and library directories.
struct Place {
    include: PathBuf,
    libs: Vec<PathBuf>,
}

/// What `place` lacks, or the library directory holding both libraries.
fn check(place: &Place) -> Result<PathBuf, Vec<String>> {
    let mut missing: Vec<String> = HEADERS
        .iter()
        .filter(|h| !place.include.join(h).is_file())
        .map(|h| place.include.join(h).display().to_string())
        .collect();
    let lib = place
        .libs
        .iter()
        .find(|d| LIBS.iter().all(|(l, so)| lib_file(d, l, so).is_some()));
    if lib.is_none() {
        let dirs: Vec<String> = place.libs.iter().map(|d| d.display().to_string()).collect();
        missing.push(format!(
            "libcuobjclient.so.1 and libcufile.so.0 in one of {}",
            dirs.join(", ")
        ));
    }
    match lib {
        Some(l) if missing.is_empty() => Ok(l.clone()),
        _ => Err(missing),
    }
}

/// The library `lib<name>.so.<soname>` in `dir`, as the ELF file it names (see [`resolve`]).
fn lib_file(dir: &Path, name: &str, soname: &str) -> Option<PathBuf> {
    resolve(&dir.join(format!("lib{name}.so.{soname}")))
}

fn is_elf(p: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(p)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && magic == *b"\x7fELF"
}

/// The ELF file `p` stands for: itself, the target of a symbolic link, or — in an SDK copied
/// by a tool that turns symbolic links into small text files holding the target's name (the CI
/// fixture is such a copy) — the file that text names in the same directory.
fn resolve(p: &Path) -> Option<PathBuf> {
    let mut p = std::fs::canonicalize(p).ok()?;
    for _ in 0..4 {
        if is_elf(&p) {
            return Some(p);
        }
        let meta = std::fs::metadata(&p).ok()?;
        if meta.len() > 255 {
            return None;
        }
        let name = std::fs::read_to_string(&p).ok()?;
        let name = name.trim();
        if name.is_empty() || name.contains('/') {
            return None;
        }
        p = std::fs::canonicalize(p.parent()?.join(name)).ok()?;
    }
    None
}

/// The directory to link from and write into the binary's RPATH: `lib` itself when its
/// libraries are real files or symbolic links; else (links flattened into text files, which the
/// dynamic loader cannot follow) a directory in `OUT_DIR` holding a symbolic link, under each
/// library's name, to the ELF file it stands for.
fn runtime_dir(lib: &Path) -> PathBuf {
    let sonames: Vec<PathBuf> = std::fs::read_dir(lib)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    let libs: Vec<&PathBuf> = sonames
        .iter()
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().contains(".so"))
        })
        .collect();
    let flattened = libs.iter().any(|p| !is_elf(p) && resolve(p).is_some());
    if !flattened {
        return lib.to_path_buf();
    }
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR")).join("sdk-lib");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).expect("create OUT_DIR/sdk-lib");
    for p in libs {
        if let (Some(name), Some(target)) = (p.file_name(), resolve(p)) {
            std::os::unix::fs::symlink(&target, out.join(name))
                .expect("symlink in OUT_DIR/sdk-lib");
        }
    }
    println!(
        "cargo:warning=cuobj-ffi: the libraries in {} are text files naming their targets (symbolic links flattened by a copy); the binary's RPATH points at {} instead, which lives as long as this target directory",
        lib.display(),
        out.display()
    );
    out
}

fn places() -> Vec<(String, Place)> {
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let triple = if arch == "aarch64" {
        "sbsa-linux"
    } else {
        "x86_64-linux"
    };
    let mut out = Vec::new();
    if let Some(home) = env::var_os("CUOBJ_HOME") {
        let home = PathBuf::from(home);
        out.push((
            format!("CUOBJ_HOME={}", home.display()),
            Place {
                include: home.join("include"),
                libs: vec![
                    home.join("lib").join(&arch),
                    home.join("lib"),
                    home.join("lib64"),
                ],
            },
        ));
    }
    let mut toolkits: Vec<(String, PathBuf)> = ["CUDA_HOME", "CUDA_PATH"]
        .into_iter()
        .filter_map(|v| {
            env::var_os(v).map(|h| {
                (
                    format!("{v}={}", PathBuf::from(&h).display()),
                    PathBuf::from(h),
                )
            })
        })
        .collect();
    toolkits.push(("/usr/local/cuda".into(), PathBuf::from("/usr/local/cuda")));
    for (what, home) in toolkits {
        let t = home.join("targets").join(triple);
        out.push((
            what.clone(),
            Place {
                include: t.join("include"),
                libs: vec![t.join("lib"), t.join("lib64")],
            },
        ));
        out.push((
            what,
            Place {
                include: home.join("include"),
                libs: vec![home.join("lib64"), home.join("lib")],
            },
        ));
    }
    out
}

/// The SDK's include and library directories, or what each place lacks.
fn find_sdk() -> Result<(PathBuf, PathBuf), Vec<String>> {
    let mut report = Vec::new();
    for (what, place) in places() {
        // A place without cuobjclient.h is not an SDK at all; one with it must be whole.
        match check(&place) {
            Ok(lib) => return Ok((place.include, lib)),
            Err(missing) => report.push(format!("{what}: missing {}", missing.join(", "))),
        }
    }
    Err(report)
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
    let sdk = if want_loopback {
        None
    } else {
        match find_sdk() {
            Ok(dirs) => Some(dirs),
            Err(report) if want_nvidia => panic!(
                "cuobj-ffi: feature `nvidia` needs NVIDIA's cuObject SDK (headers {} and libraries libcuobjclient.so.1, libcufile.so.0), not found; set CUOBJ_HOME to a directory with include/ and lib/ (or lib/<arch>), or CUDA_HOME to a CUDA Toolkit >= 13.1. Looked in: {}",
                HEADERS.join(", "),
                report.join("; ")
            ),
            Err(_) => None,
        }
    };
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
            build.define("S3RDMA_CUOBJ_NVIDIA", "1");
            let dir = runtime_dir(lib);
            println!("cargo:rustc-link-search=native={}", dir.display());
            // By exact SONAME: no `-dev` symbolic link (`libcuobjclient.so`) is needed.
            for (l, so) in LIBS {
                println!("cargo:rustc-link-lib=dylib:+verbatim=lib{l}.so.{so}");
            }
            // Link arguments of a library's build script reach only its own tests: the
            // binaries that link this crate read the RPATH from `DEP_S3RDMA_CUOBJ_RPATH`.
            println!("cargo:rpath={}", dir.display());
            println!("cargo:rustc-link-arg=-Wl,--disable-new-dtags");
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
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
