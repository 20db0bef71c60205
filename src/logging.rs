//! Logging: `tracing`, filtered by `--log-level`, to one of
//! - a file (`--log-file`), with timestamps;
//! - stderr in the foreground;
//! - when daemonized without a log file: stderr if it is connected to the systemd journal
//!   (`JOURNAL_STREAM`, as under a systemd mount unit), each line prefixed with its syslog
//!   priority (`<3>` error … `<7>` debug) so journald files it at the right level; else the
//!   local syslog socket (`/dev/log`, served by journald or rsyslog); else nowhere.

use std::io::Write;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};

use tracing::{Level, Metadata};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

/// The local syslog socket.
const SYSLOG_SOCKET: &str = "/dev/log";

/// Where the log goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    File(PathBuf),
    Stderr,
    /// Stderr connected to the journal: syslog priority prefixes, no timestamps.
    Journal,
    /// Datagrams to a syslog socket.
    Syslog(PathBuf),
    Nowhere,
}

impl Target {
    /// Choose the target for a process that is (`daemon`) or is not detaching from its terminal.
    pub fn choose(file: Option<&Path>, daemon: bool) -> Target {
        if let Some(f) = file {
            return Target::File(f.to_path_buf());
        }
        if !daemon {
            return Target::Stderr;
        }
        if stderr_is_journal() {
            return Target::Journal;
        }
        if Path::new(SYSLOG_SOCKET).exists() {
            return Target::Syslog(SYSLOG_SOCKET.into());
        }
        Target::Nowhere
    }

    /// Whether the log needs the process's stderr kept open after daemonizing.
    pub fn uses_stderr(&self) -> bool {
        matches!(self, Target::Stderr | Target::Journal)
    }
}

/// systemd sets `JOURNAL_STREAM=dev:ino` for the stream it connected stdout/stderr to.
fn stderr_is_journal() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(v) = std::env::var("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = v.split_once(':') else {
        return false;
    };
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else {
        return false;
    };
    dev.parse() == Ok(meta.dev()) && ino.parse() == Ok(meta.ino())
}

/// The filter for `--log-level`: a level name (applied to s3rdma; other crates log errors only)
/// or a full tracing filter.
pub fn filter(level: &str) -> Result<EnvFilter, String> {
    let directive = match level {
        "error" | "warn" | "info" | "debug" | "trace" => format!("error,s3rdma={level}"),
        other => other.to_string(),
    };
    EnvFilter::try_new(&directive).map_err(|e| {
        format!("log level {level:?} is not valid ({e}); use error, warn, info, debug or trace")
    })
}

/// Install the subscriber. `level` is a level name (applied to s3rdma; other crates log errors
/// only) or a full filter.
pub fn init(level: &str, target: &Target) -> Result<(), String> {
    let filter = filter(level)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    let done = match target {
        Target::File(path) => {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| format!("cannot open log file {}: {e}", path.display()))?;
            builder
                .with_ansi(false)
                .with_writer(std::sync::Mutex::new(f))
                .try_init()
        }
        // Colours only for a terminal: stderr redirected to a file stays plain text.
        Target::Stderr => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_writer(std::io::stderr)
            .try_init(),
        Target::Journal => builder
            .with_ansi(false)
            .without_time()
            .with_writer(Prioritised::journal())
            .try_init(),
        Target::Syslog(path) => builder
            .with_ansi(false)
            .without_time()
            .with_writer(Prioritised::syslog(path)?)
            .try_init(),
        Target::Nowhere => builder.with_writer(std::io::sink).try_init(),
    };
    done.map_err(|e| e.to_string())
}

/// Writes each event as one record carrying its syslog priority.
pub struct Prioritised {
    /// None: stderr, as `<N>line`; Some: datagrams `<facility|N>s3rdma[pid]: line`.
    socket: Option<UnixDatagram>,
}

impl Prioritised {
    fn journal() -> Self {
        Prioritised { socket: None }
    }

    /// Send to the syslog socket at `path`.
    pub fn syslog(path: &Path) -> Result<Self, String> {
        let s = UnixDatagram::unbound()
            .and_then(|s| s.connect(path).map(|()| s))
            .map_err(|e| {
                format!(
                    "cannot connect to the syslog socket {}: {e}",
                    path.display()
                )
            })?;
        Ok(Prioritised { socket: Some(s) })
    }
}

/// syslog severity of a tracing level.
fn severity(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// The `daemon` facility.
const FACILITY_DAEMON: u8 = 3;

/// One event, sent when dropped (the formatter writes it in pieces).
pub struct Record<'a> {
    out: &'a Prioritised,
    severity: u8,
    buf: Vec<u8>,
}

impl Write for Record<'_> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Record<'_> {
    fn drop(&mut self) {
        let text = String::from_utf8_lossy(&self.buf);
        let text = text.trim_end_matches('\n');
        if text.is_empty() {
            return;
        }
        match &self.out.socket {
            None => {
                // One write per record, so lines from threads do not interleave.
                let mut line = String::with_capacity(text.len() + 5);
                for l in text.lines() {
                    line.push_str(&format!("<{}>{l}\n", self.severity));
                }
                let _ = std::io::stderr().lock().write_all(line.as_bytes());
            }
            Some(s) => {
                let pri = FACILITY_DAEMON * 8 + self.severity;
                let msg = format!("<{pri}>s3rdma[{}]: {text}", std::process::id());
                let _ = s.send(msg.as_bytes());
            }
        }
    }
}

impl<'a> MakeWriter<'a> for Prioritised {
    type Writer = Record<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        Record {
            out: self,
            severity: 6,
            buf: Vec::new(),
        }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> Self::Writer {
        Record {
            out: self,
            severity: severity(meta.level()),
            buf: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syslog_records_carry_facility_priority_and_pid() {
        let dir = std::env::temp_dir().join(format!("s3rdma-syslog-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("log.sock");
        let _ = std::fs::remove_file(&path);
        let server = UnixDatagram::bind(&path).unwrap();
        let out = Prioritised::syslog(&path).unwrap();
        {
            let mut r = Record {
                out: &out,
                severity: severity(&Level::WARN),
                buf: Vec::new(),
            };
            write!(r, " WARN write failed").unwrap();
            writeln!(r, " key=a/b").unwrap();
        }
        let mut buf = [0u8; 512];
        let n = server.recv(&mut buf).unwrap();
        let got = std::str::from_utf8(&buf[..n]).unwrap();
        assert_eq!(
            got,
            format!(
                "<28>s3rdma[{}]:  WARN write failed key=a/b",
                std::process::id()
            )
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn targets() {
        assert_eq!(
            Target::choose(Some(Path::new("/tmp/x.log")), true),
            Target::File("/tmp/x.log".into())
        );
        assert_eq!(Target::choose(None, false), Target::Stderr);
        assert!(Target::Journal.uses_stderr());
        assert!(!Target::Syslog("/dev/log".into()).uses_stderr());
        assert_eq!(severity(&Level::ERROR), 3);
        assert_eq!(severity(&Level::DEBUG), 7);
    }
}
