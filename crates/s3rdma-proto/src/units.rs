//! Parsers for sizes, durations, modes, booleans and `-o` option lists, shared by flags and
//! `-o` options. Std only; the fuzz targets in `fuzz/` drive them through `s3rdma-proto`.

use std::time::Duration;

/// `8388608`, `8M`, `8MiB`, `512KiB`, `1G`, `1.5GiB` (binary units); `8MB` = 8,000,000.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| {
        format!("{s:?} is not a size; write bytes or a number with a unit, e.g. 8MiB, 512K, 1G")
    })?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "{s:?} has an unknown size unit {other:?}; use B, K/KiB, M/MiB, G/GiB, T/TiB or KB/MB/GB/TB"
            ))
        }
    };
    let bytes = value * mult as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(bytes.round() as u64)
}

/// `1s`, `500ms`, `2m`, `1h`, `0`, a plain number of seconds (`1.5`), or `indefinite`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("indefinite") {
        return Ok(Duration::MAX);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration; write e.g. 1s, 500ms, 5m or indefinite"))?;
    let secs = match unit.trim() {
        "" | "s" => value,
        "ms" => value / 1e3,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        other => {
            return Err(format!(
                "{s:?} has an unknown time unit {other:?}; use ms, s, m or h"
            ))
        }
    };
    Duration::try_from_secs_f64(secs).map_err(|_| format!("{s:?} is out of range"))
}

/// An octal permission mode: `0644`, `644`, `0o755`.
pub fn parse_mode(s: &str) -> Result<u16, String> {
    let t = s.trim();
    let digits = t.strip_prefix("0o").unwrap_or(t);
    match u16::from_str_radix(digits, 8) {
        Ok(m) if m <= 0o7777 => Ok(m),
        _ => Err(format!(
            "{s:?} is not an octal mode; write e.g. 0644 or 0755"
        )),
    }
}

/// `true/false`, `yes/no`, `1/0`, `on/off`.
pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "true" | "yes" | "1" | "on" => Ok(true),
        "false" | "no" | "0" | "off" => Ok(false),
        _ => Err(format!("{s:?} is not a boolean; write true or false")),
    }
}

/// Split `a,b=c\,d` into `["a", "b=c,d"]`.
pub fn split_options(s: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let (Some(n), Some(o)) = (chars.next(), out.last_mut()) {
                    o.push(n);
                }
            }
            ',' => out.push(String::new()),
            c => {
                if let Some(o) = out.last_mut() {
                    o.push(c);
                }
            }
        }
    }
    out.into_iter().map(|o| o.trim().to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8388608"), Ok(8 << 20));
        assert_eq!(parse_size("8M"), Ok(8 << 20));
        assert_eq!(parse_size("8MiB"), Ok(8 << 20));
        assert_eq!(parse_size("512mib"), Ok(512 << 20));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("8MB"), Ok(8_000_000));
        assert_eq!(parse_size("4 KiB"), Ok(4096));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("8XB").unwrap_err().contains("unknown size unit"));
        assert!(parse_size("").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("indefinite"), Ok(Duration::MAX));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("3d").is_err());
    }

    #[test]
    fn modes_and_bools() {
        assert_eq!(parse_mode("0644"), Ok(0o644));
        assert_eq!(parse_mode("755"), Ok(0o755));
        assert_eq!(parse_mode("0o700"), Ok(0o700));
        assert!(parse_mode("0999").is_err());
        assert!(parse_mode("17777").is_err());
        assert_eq!(parse_bool("yes"), Ok(true));
        assert_eq!(parse_bool("0"), Ok(false));
        assert!(parse_bool("maybe").is_err());
    }
}
