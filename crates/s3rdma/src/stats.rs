//! `s3rdma stats MOUNTPOINT`: print a mount's live counters (cache hits and misses, bytes over
//! RDMA and HTTP, declines and fallbacks, uploads, open files), read from the extended
//! attribute `user.s3rdma.stats` of the mount's root, which the daemon answers.

use std::ffi::CString;

use s3rdma_proto::xattr::STATS as STATS_XATTR;

const USAGE: &str = "usage: s3rdma stats MOUNTPOINT   (the live counters of an s3rdma mount)";

/// Run the subcommand; returns the exit status.
pub fn run(args: &[String]) -> i32 {
    let [mountpoint] = args else {
        eprintln!("{USAGE}");
        return 2;
    };
    match read(mountpoint) {
        Ok(text) => {
            print!("{text}");
            0
        }
        Err(msg) => {
            eprintln!("s3rdma: error: {msg}");
            1
        }
    }
}

/// The counters of the mount at `mountpoint`, one `name value` per line.
pub fn read(mountpoint: &str) -> Result<String, String> {
    let path = CString::new(mountpoint).map_err(|_| "the path has a NUL byte".to_string())?;
    let name = CString::new(STATS_XATTR).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 64 << 10];
    // SAFETY: valid C strings; the buffer is writable for its length.
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EOPNOTSUPP) | Some(libc::ENODATA) => {
                format!("{mountpoint} is not the root of an s3rdma mount")
            }
            _ => format!("cannot read the counters of {mountpoint}: {e}"),
        });
    }
    buf.truncate(n as usize);
    String::from_utf8(buf).map_err(|_| "the counters are not text".to_string())
}
