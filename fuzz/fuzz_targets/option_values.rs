//! Option values and `-o` lists: sizes, durations, modes, booleans and the `-o` splitter. No
//! input panics; what parses is well-formed (a mode is ≤ 0o7777, a size written back in bytes
//! parses to itself, the splitter never yields more pieces than commas + 1).
#![no_main]

use libfuzzer_sys::fuzz_target;

use s3rdma_proto::units;

use units::*;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(n) = parse_size(s) {
        assert_eq!(parse_size(&n.to_string()), Ok(n), "{s:?}");
    }
    if let Ok(d) = parse_duration(s) {
        let _ = d.as_millis();
    }
    if let Ok(m) = parse_mode(s) {
        assert!(m <= 0o7777, "{s:?} gave mode {m:o}");
    }
    let _ = parse_bool(s);
    let pieces = split_options(s);
    assert!(pieces.len() <= s.matches(',').count() + 1, "{s:?}");
    for p in &pieces {
        assert_eq!(p.trim(), p, "{s:?}");
    }
});
