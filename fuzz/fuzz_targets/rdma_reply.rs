//! The RDMA reply headers and the verdicts built on them. No input panics; a parsed reply code
//! is in 100..=599; a byte count is never above what was asked; a GET is judged done only with
//! a well-formed reply and at most the bytes asked; a PUT only on HTTP 200 with an ETag and a
//! reply that is absent, 200 or 204.
#![no_main]

use libfuzzer_sys::fuzz_target;

use s3rdma_proto::reply;

use reply::*;

fuzz_target!(|data: &[u8]| {
    if data.len() < 11 {
        return;
    }
    let flags = data[0];
    let status = u16::from_le_bytes([data[1], data[2]]) % 700;
    let asked = u64::from_le_bytes(data[3..11].try_into().unwrap_or([0; 8])) >> (flags % 64);
    let text = String::from_utf8_lossy(&data[11..]);
    let mut parts = text.splitn(3, '\n');
    // Bits 1..3 of the flags: whether each header is present at all.
    let present = |bit: u8| flags & (1 << bit) != 0;
    let r = parts.next().filter(|_| present(1));
    let b = parts.next().filter(|_| present(2));
    let e = parts.next().filter(|_| present(3));
    let code = parse_reply(r);
    if let Reply::Code(c) = code {
        assert!((100..=599).contains(&c), "reply {c} out of range");
    }
    if let Ok(n) = parse_bytes_transferred(b, asked) {
        assert!(n <= asked, "{n} bytes transferred of {asked} asked");
    }
    if let Verdict::Done(n) = judge_get(status, r, b, asked, flags & 1 == 1) {
        assert!(n <= asked, "GET done with {n} of {asked} bytes");
        assert!(matches!(code, Reply::Code(_)), "GET done with reply {r:?}");
        assert!(matches!(status, 200 | 206), "GET done on HTTP {status}");
    }
    if let Verdict::Done(_) = judge_put(status, r, e) {
        assert_eq!(status, 200);
        assert!(e.is_some_and(|e| !e.is_empty()), "PUT done without an ETag");
        assert!(
            matches!(code, Reply::Absent | Reply::Code(200) | Reply::Code(204)),
            "PUT done with reply {r:?}"
        );
    }
});
