//! The loopback token format, shared by the loopback provider (C++, which mints tokens) and the
//! loopback endpoint (which reads them):
//!
//! `<addr:16>:<size:8>:<pid:8>:<lid:4>:<reg:6>:1:<starttime:16><boot:16>` — 81 lowercase hex
//! characters in 7 fields, the shape of a real DC v1 descriptor. `addr` and `size` are the
//! transfer window; `pid`, the process start time (clock ticks since boot) and the first 16 hex
//! digits of the boot id identify the client process on this host.

/// A parsed loopback token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoopbackToken {
    pub addr: u64,
    pub size: u64,
    pub pid: u32,
    pub registration: u32,
    pub start_time: u64,
    pub boot: String,
}

fn is_hex(field: &str, len: usize) -> bool {
    field.len() == len
        && field
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn hex(field: &str, len: usize) -> Option<u64> {
    if len > 16 || !is_hex(field, len) {
        return None;
    }
    u64::from_str_radix(field, 16).ok()
}

/// Field 22 of /proc/<pid>/stat: the process start time in clock ticks since boot.
pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(19)?.parse().ok()
}

/// The first 16 hex digits of this host's boot id.
pub fn boot_id_prefix() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let hex: String = id
        .chars()
        .filter(|c| c.is_ascii_hexdigit())
        .take(16)
        .collect();
    (hex.len() == 16).then_some(hex)
}

impl LoopbackToken {
    /// Parse a token; `None` if it is not in the loopback shape.
    pub fn parse(token: &str) -> Option<LoopbackToken> {
        if token.len() != 81 {
            return None;
        }
        let f: Vec<&str> = token.split(':').collect();
        if f.len() != 7 || f[5] != "1" {
            return None;
        }
        hex(f[3], 4)?;
        if !is_hex(f[6], 32) {
            return None;
        }
        Some(LoopbackToken {
            addr: hex(f[0], 16)?,
            size: hex(f[1], 8)?,
            pid: u32::try_from(hex(f[2], 8)?).ok()?,
            registration: u32::try_from(hex(f[4], 6)?).ok()?,
            start_time: hex(&f[6][..16], 16)?,
            boot: f[6][16..].to_string(),
        })
    }

    /// Whether the process that minted this token is still the one running under its pid, on
    /// this boot of this host.
    pub fn is_live_process(&self) -> bool {
        process_start_time(self.pid) == Some(self.start_time)
            && boot_id_prefix().as_deref() == Some(self.boot.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let t = "00007f0000001000:00400000:000004d2:0000:000001:1:00000000000012340123456789abcdef";
        assert_eq!(t.len(), 81);
        let p = LoopbackToken::parse(t).unwrap();
        assert_eq!(
            (p.addr, p.size, p.pid, p.registration),
            (0x7f0000001000, 0x400000, 1234, 1)
        );
        assert_eq!(p.start_time, 0x1234);
        assert_eq!(p.boot, "0123456789abcdef");
        assert!(!p.is_live_process());
        for bad in [
            &t[..80],
            "00007f0000001000:00400000:000004d2:0000:000001:0:00000000000012340123456789abcdef",
            "00007F0000001000:00400000:000004d2:0000:000001:1:00000000000012340123456789abcdef",
            "00007f0000001000:00400000:000004d2:0000:000001:1:0000000000001234:123456789abcdef",
        ] {
            assert!(LoopbackToken::parse(bad).is_none(), "{bad}");
        }
        assert!(process_start_time(std::process::id()).is_some());
        assert!(boot_id_prefix().is_some());
    }
}
