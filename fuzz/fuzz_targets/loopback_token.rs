//! Loopback RDMA tokens, as the endpoint reads them from `x-amz-rdma-token`. No input panics,
//! and a token that parses is exactly 81 lowercase-hex-and-colon characters whose fields give
//! back what was parsed.
#![no_main]

use libfuzzer_sys::fuzz_target;

use s3rdma_proto::loopback_token as loopback;

fuzz_target!(|data: &[u8]| {
    let s = String::from_utf8_lossy(data);
    if let Some(t) = loopback::LoopbackToken::parse(&s) {
        assert_eq!(s.len(), 81);
        assert!(s
            .bytes()
            .all(|b| b == b':' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        let again = format!(
            "{:016x}:{:08x}:{:08x}:{}:{:06x}:1:{:016x}{}",
            t.addr,
            t.size,
            t.pid,
            &s[35..39],
            t.registration,
            t.start_time,
            t.boot
        );
        assert_eq!(again, s);
    }
});
