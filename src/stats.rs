//! `s3rdma stats MOUNTPOINT`: print a mount's live counters (cache hits and misses, bytes over
//! RDMA and HTTP, declines and fallbacks, uploads, open files), read from the extended
//! attribute `user.s3rdma.stats` of the mount's root, which the daemon answers.

use std::ffi::CString;

use crate::cli::StatsArgs;

use s3rdma_proto::xattr::STATS as STATS_XATTR;

/// Run the subcommand; returns the exit status.
pub fn run(args: &StatsArgs) -> i32 {
    let mountpoint = &args.mountpoint;
    if args.watch {
        return watch_loop(mountpoint);
    }
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

/// `name value` lines as pairs (lines that are not are left out).
fn parse(text: &str) -> Vec<(&str, u64)> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k, v.trim().parse().ok()?))
        })
        .collect()
}

/// One screen of `--watch`: every value, and its change per second since `before` (a
/// counter's rate; blank when unchanged).
fn screen(now: &str, before: Option<&str>, seconds: f64) -> String {
    use std::fmt::Write;
    let before: std::collections::HashMap<&str, u64> = before
        .map(|b| parse(b).into_iter().collect())
        .unwrap_or_default();
    let mut out = String::new();
    let _ = writeln!(out, "{:<40} {:>20} {:>16}", "name", "value", "change/s");
    for (k, v) in parse(now) {
        let rate = match before.get(k) {
            Some(&b) if b != v && seconds > 0.0 => {
                format!("{:.1}", (v as f64 - b as f64) / seconds)
            }
            _ => String::new(),
        };
        let _ = writeln!(out, "{k:<40} {v:>20} {rate:>16}");
    }
    out
}

/// Print the counters every second until interrupted (or the mount goes away).
fn watch_loop(mountpoint: &str) -> i32 {
    let mut before: Option<(String, std::time::Instant)> = None;
    loop {
        let text = match read(mountpoint) {
            Ok(t) => t,
            Err(msg) => {
                eprintln!("s3rdma: error: {msg}");
                return 1;
            }
        };
        let now = std::time::Instant::now();
        let seconds = before
            .as_ref()
            .map_or(0.0, |(_, t)| now.duration_since(*t).as_secs_f64());
        // Home the cursor and clear the screen, then draw.
        print!(
            "\x1b[H\x1b[2J{mountpoint}\n{}",
            screen(&text, before.as_ref().map(|(b, _)| b.as_str()), seconds)
        );
        before = Some((text, now));
        std::thread::sleep(std::time::Duration::from_secs(1));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_shows_the_change_per_second_of_what_changed() {
        let s = screen("a 10\nb 5\nc_p50_le_us 250\n", Some("a 4\nb 5\n"), 2.0);
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            ["a", "10", "3.0"]
        );
        assert_eq!(lines[2].split_whitespace().collect::<Vec<_>>(), ["b", "5"]);
        assert_eq!(
            lines[3].split_whitespace().collect::<Vec<_>>(),
            ["c_p50_le_us", "250"]
        );
        assert!(screen("a 1\n", None, 0.0).contains("a"));
    }
}
