//! Logging: `tracing` to stderr or to a file, filtered by `--log-level`.

use std::path::Path;

use tracing_subscriber::EnvFilter;

/// `level` is a level name (applied to s3rdma; other crates log errors only) or a full filter.
pub fn init(level: &str, file: Option<&Path>) -> Result<(), String> {
    let directive = match level {
        "error" | "warn" | "info" | "debug" | "trace" => format!("error,s3rdma={level}"),
        other => other.to_string(),
    };
    let filter = EnvFilter::try_new(&directive).map_err(|e| {
        format!("log level {level:?} is not valid ({e}); use error, warn, info, debug or trace")
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    match file {
        Some(path) => {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| format!("cannot open log file {}: {e}", path.display()))?;
            builder
                .with_ansi(false)
                .with_writer(std::sync::Mutex::new(f))
                .try_init()
                .map_err(|e| e.to_string())
        }
        None => builder
            .with_writer(std::io::stderr)
            .try_init()
            .map_err(|e| e.to_string()),
    }
}
