//! Checks made before mounting, each failing with one line that names the problem and the fix.

use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use s3rdma_client::{ObjectStore, S3Client, S3Error, S3ErrorKind};

/// Check the mountpoint: it exists, is a directory, is not already a mount, and is empty.
/// Returns its absolute path.
pub fn check_mountpoint(path: &Path) -> Result<PathBuf, String> {
    let shown = path.display();
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return Err(format!("mountpoint {shown} does not exist; create it first: mkdir -p {shown}"))
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            return Err(format!(
                "mountpoint {shown} is a FUSE mount whose daemon is gone; unmount it first: fusermount3 -u {shown}"
            ))
        }
        Err(e) => return Err(format!("cannot access mountpoint {shown}: {e}")),
    };
    if !meta.is_dir() {
        return Err(format!(
            "mountpoint {shown} is not a directory; mount on an empty directory"
        ));
    }
    let abs = std::fs::canonicalize(path)
        .map_err(|e| format!("cannot resolve mountpoint {shown}: {e}"))?;
    if is_mountpoint(&abs, &meta) {
        return Err(format!(
            "{} is already a mountpoint; unmount it first (umount {}) or choose another directory",
            abs.display(),
            abs.display()
        ));
    }
    let mut entries =
        std::fs::read_dir(&abs).map_err(|e| format!("cannot read mountpoint {shown}: {e}"))?;
    if entries.next().is_some() {
        return Err(format!(
            "mountpoint {shown} is not empty; mount on an empty directory (its files would be hidden)"
        ));
    }
    Ok(abs)
}

fn is_mountpoint(abs: &Path, meta: &std::fs::Metadata) -> bool {
    if abs == Path::new("/") {
        return true;
    }
    match abs.parent().map(std::fs::metadata) {
        Some(Ok(parent)) => parent.dev() != meta.dev() || parent.ino() == meta.ino(),
        _ => false,
    }
}

/// Check that the credentials resolve and that the bucket can be listed at `prefix`.
pub async fn check_bucket(s3: &S3Client, prefix: &str) -> Result<(), String> {
    tracing::info!(rdma = ?s3.rdma_mode(), provider = %cuobj_ffi::provider(), "data plane");
    s3.check_credentials()
        .await
        .map_err(|e| explain(s3, prefix, &e))?;
    s3.list_page(prefix, Some("/"), None, 1)
        .await
        .map(|_| ())
        .map_err(|e| explain(s3, prefix, &e))
}

/// One line for a start-up failure.
pub fn explain(s3: &S3Client, prefix: &str, e: &S3Error) -> String {
    let bucket = s3.bucket();
    let endpoint = s3.endpoint();
    match e.kind {
        S3ErrorKind::NoCredentials => format!(
            "no AWS credentials found ({}); set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, pass --profile NAME, or use --no-sign-request for a public bucket",
            e.message
        ),
        S3ErrorKind::BadCredentials => format!(
            "{endpoint} rejected the credentials ({}); check the access key and secret (environment or --profile)",
            e.code.as_deref().unwrap_or("invalid credentials")
        ),
        S3ErrorKind::AccessDenied => format!(
            "access denied listing bucket {bucket:?} at prefix {prefix:?} ({}); grant these credentials s3:ListBucket and s3:GetObject on it",
            e.message
        ),
        S3ErrorKind::NoSuchBucket | S3ErrorKind::NotFound => format!(
            "bucket {bucket:?} does not exist at {endpoint}; check the bucket name, --region and --endpoint-url"
        ),
        S3ErrorKind::Unreachable | S3ErrorKind::Timeout => format!(
            "cannot reach the S3 endpoint {endpoint} ({}); check --endpoint-url and that the server is running",
            e.message
        ),
        _ => format!("cannot list bucket {bucket:?} at {endpoint}: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountpoint_errors() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        assert!(check_mountpoint(&missing)
            .unwrap_err()
            .contains("does not exist"));
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(check_mountpoint(&file)
            .unwrap_err()
            .contains("not a directory"));
        let full = dir.path().join("full");
        std::fs::create_dir(&full).unwrap();
        std::fs::write(full.join("x"), b"x").unwrap();
        assert!(check_mountpoint(&full).unwrap_err().contains("not empty"));
        let empty = dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        assert_eq!(
            check_mountpoint(&empty).unwrap(),
            std::fs::canonicalize(&empty).unwrap()
        );
        assert!(check_mountpoint(Path::new("/"))
            .unwrap_err()
            .contains("already a mountpoint"));
    }
}
