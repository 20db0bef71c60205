//! A ring entry's request and reply in the `/dev/fuse` wire format. The kernel splits a
//! request over the entry's header area (`fuse_in_header`, then the first argument) and its
//! payload (the rest); `request` puts the pieces back together, byte for byte what
//! `read(/dev/fuse)` returns, so the same parser serves both transports. `reply` does the
//! opposite with the reply: `fuse_out_header` in the header area, the rest in the payload.

use std::io::IoSlice;

use crate::abi::{ReqHeader, IN_HEADER_LEN, OUT_HEADER_LEN};

/// Why an entry's request or reply does not fit the wire format.
#[derive(Debug, PartialEq, Eq)]
pub enum FrameError {
    /// The lengths the kernel wrote do not add up (a kernel this code does not know).
    BadRequest { len: usize, payload: usize },
    /// A reply larger than the entry's payload area (`max_write` too small for it).
    ReplyTooLarge { len: usize, room: usize },
    /// A reply shorter than its header.
    ShortReply(usize),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::BadRequest { len, payload } => write!(
                f,
                "a ring request of {len} bytes with {payload} bytes of payload does not add up"
            ),
            FrameError::ReplyTooLarge { len, room } => write!(
                f,
                "a reply of {len} bytes does not fit the ring entry's {room}-byte payload area"
            ),
            FrameError::ShortReply(len) => write!(f, "a reply of {len} bytes has no header"),
        }
    }
}

/// Where a request is put back together when it cannot be read in place: 8-byte aligned, as
/// the request parser wants it.
pub struct RequestBuf {
    words: Vec<u64>,
}

impl RequestBuf {
    /// Room for a request of up to `len` bytes.
    pub fn new(len: usize) -> Self {
        RequestBuf {
            words: vec![0; len.div_ceil(8)],
        }
    }

    fn bytes_mut(&mut self, len: usize) -> &mut [u8] {
        if self.words.len() * 8 < len {
            self.words.resize(len.div_ceil(8), 0);
        }
        // SAFETY: `words` holds at least `len` initialised bytes (u64s are plain bytes), and
        // the returned slice borrows `self` mutably for its life.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast::<u8>(), len) }
    }
}

/// A request in the `/dev/fuse` format.
pub struct Framed<'a> {
    pub bytes: &'a [u8],
    /// The request lies in the entry, payload included (read in place): its reply, which goes
    /// where the payload is, must wait until the handler is done with the request.
    pub holds_payload: bool,
}

/// The request an entry holds, in the `/dev/fuse` format and in one piece. `area` is the
/// entry's memory from past its header to the end of the payload, which starts `front` bytes
/// in: the request's header and first argument are copied into the end of that gap, so the
/// request, payload and all, is read where the kernel wrote it (a WRITE's data is not copied).
/// Where that would not be 8-byte aligned (a first argument of odd size: no kernel sends one
/// today) the request is put back together in `out` instead.
pub fn request<'a>(
    h: &ReqHeader,
    area: &'a mut [u8],
    front: usize,
    out: &'a mut RequestBuf,
) -> Result<Framed<'a>, FrameError> {
    let len = u32::from_ne_bytes([h.in_out[0], h.in_out[1], h.in_out[2], h.in_out[3]]) as usize;
    let sent = h.ent.payload_sz as usize;
    // The first argument's length is what the total leaves after the header and payload.
    let op_len = len
        .checked_sub(IN_HEADER_LEN + sent)
        .filter(|&n| n <= h.op_in.len() && front + sent <= area.len())
        .ok_or(FrameError::BadRequest { len, payload: sent })?;
    let head = IN_HEADER_LEN + op_len;
    let aligned = |at: usize| (area.as_ptr() as usize + at).is_multiple_of(8);
    let Some(at) = front.checked_sub(head).filter(|&at| aligned(at)) else {
        let buf = out.bytes_mut(len);
        buf[head..].copy_from_slice(&area[front..front + sent]);
        put_head(buf, h, op_len);
        return Ok(Framed {
            bytes: buf,
            holds_payload: false,
        });
    };
    let buf = &mut area[at..front + sent];
    put_head(buf, h, op_len);
    Ok(Framed {
        bytes: buf,
        holds_payload: sent > 0,
    })
}

/// The request's header and first argument, at the start of `buf`.
fn put_head(buf: &mut [u8], h: &ReqHeader, op_len: usize) {
    buf[..IN_HEADER_LEN].copy_from_slice(&h.in_out[..IN_HEADER_LEN]);
    buf[IN_HEADER_LEN..IN_HEADER_LEN + op_len].copy_from_slice(&h.op_in[..op_len]);
}

/// Put the reply `data` (`fuse_out_header` first, as written to `/dev/fuse`) into the entry:
/// the header in the header area, the rest in the payload, its length in `payload_sz`.
pub fn reply(
    h: &mut ReqHeader,
    payload: &mut [u8],
    data: &[IoSlice<'_>],
) -> Result<(), FrameError> {
    let len: usize = data.iter().map(|s| s.len()).sum();
    if len < OUT_HEADER_LEN {
        return Err(FrameError::ShortReply(len));
    }
    if len - OUT_HEADER_LEN > payload.len() {
        return Err(FrameError::ReplyTooLarge {
            len,
            room: payload.len(),
        });
    }
    let mut at = 0;
    for s in data {
        let mut s: &[u8] = s;
        if at < OUT_HEADER_LEN {
            let n = s.len().min(OUT_HEADER_LEN - at);
            h.in_out[at..at + n].copy_from_slice(&s[..n]);
            at += n;
            s = &s[n..];
            if s.is_empty() {
                continue;
            }
        }
        let p = at - OUT_HEADER_LEN;
        payload[p..p + s.len()].copy_from_slice(s);
        at += s.len();
    }
    h.ent.payload_sz = (len - OUT_HEADER_LEN) as u32;
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Requests and their replies as a 6.18 kernel and s3rdma exchanged them over `/dev/fuse`
    /// (recorded with strace on a mount: `cat`, `stat`, `printf > new.txt`, `mkdir`), with the
    /// length of each request's first argument (its per-opcode header: what the kernel puts in
    /// `op_in`; the rest goes to the payload).
    pub(crate) const RECORDED: &[(&str, usize, &str, &str)] = &[
        ("GETATTR", 16, "3800000003000000040000000000000001000000000000000000000000000000c37400000000000000000000000000000000000000000000",
         "78000000000000000400000000000000010000000000000000000000000000000100000000000000000000000000000000000000000000002a0c176b000000002a0c176b000000002a0c176b0000000025d5dd1725d5dd1725d5dd17ed410000020000000000000000000000000000000000100000000000"),
        ("LOOKUP", 0, "3200000001000000060000000000000001000000000000000000000000000000c37400000000000068656c6c6f2e74787400",
         "900000000000000006000000000000000200000000000000000000000000000001000000000000000100000000000000000000000000000002000000000000000b0000000000000001000000000000002a0c176b000000002a0c176b000000002a0c176b00000000000000000000000000000000a4810000010000000000000000000000000000000000100000000000"),
        ("READ", 40, "500000000f0000000a0000000000000002000000000000000000000000000000c37400000000000001000000000000000000000000000000001000000000000000000000000000000080000000000000",
         "1b000000000000000a0000000000000068656c6c6f2072696e670a"),
        ("CREATE", 16, "4000000023000000100000000000000001000000000000000000000000000000647400000000000041820000a481000012000000000000006e65772e74787400",
         "a0000000000000001000000000000000030000000000000000000000000000000100000000000000010000000000000000000000000000000300000000000000000000000000000000000000000000002e0c176b000000002e0c176b000000002e0c176b00000000a28e9513a28e9513a28e9513a481000001000000000000000000000000000000000010000000000002000000000000000100000000000000"),
        ("WRITE", 40, "640000001000000014000000000000000300000000000000000000000000000064740000000000000200000000000000000000000000000014000000020000005e1d6c13064097d401800000000000007772697474656e207468726f7567682066757365",
         "180000000000000014000000000000001400000000000000"),
        ("MKDIR", 8, "32000000090000001e0000000000000001000000000000000000000000000000c974000000000000ed010000120000006400",
         "90000000000000001e00000000000000040000000000000000000000000000000100000000000000010000000000000000000000000000000400000000000000000000000000000000000000000000002a0c176b000000002a0c176b000000002a0c176b0000000025d5dd1725d5dd1725d5dd17ed410000020000000000000000000000000000000000100000000000"),
    ];

    pub(crate) fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }

    /// What the kernel puts into an entry for `wire` (`fuse_uring_args_to_ring`).
    pub(crate) fn as_kernel_sends(wire: &[u8], op_len: usize) -> (ReqHeader, Vec<u8>) {
        let mut h = ReqHeader::default();
        h.in_out[..IN_HEADER_LEN].copy_from_slice(&wire[..IN_HEADER_LEN]);
        h.op_in[..op_len].copy_from_slice(&wire[IN_HEADER_LEN..IN_HEADER_LEN + op_len]);
        let rest = &wire[IN_HEADER_LEN + op_len..];
        let mut payload = vec![0xAA; 8192];
        payload[..rest.len()].copy_from_slice(rest);
        h.ent.payload_sz = rest.len() as u32;
        h.ent.commit_id = u64::from_ne_bytes(wire[8..16].try_into().expect("unique"));
        (h, payload)
    }

    /// An entry's area past its header as the kernel leaves it: a gap of `front` bytes, then
    /// the payload; 8-byte aligned, as the page-aligned entry is.
    fn area_of(payload: &[u8], front: usize) -> Vec<u64> {
        let mut words = vec![0u64; (front + payload.len()).div_ceil(8)];
        bytes_of(&mut words)[front..front + payload.len()].copy_from_slice(payload);
        words
    }

    fn bytes_of(words: &mut [u64]) -> &mut [u8] {
        // SAFETY: u64s are plain bytes; the view covers exactly the allocation's words.
        unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), words.len() * 8) }
    }

    /// The front gap of a real entry: the header page past the header.
    const FRONT: usize = 4096 - std::mem::size_of::<ReqHeader>();

    #[test]
    fn recorded_requests_are_read_in_place_byte_for_byte() {
        let mut buf = RequestBuf::new(16);
        for &(op, op_len, request_hex, _) in RECORDED {
            let wire = unhex(request_hex);
            let (h, payload) = as_kernel_sends(&wire, op_len);
            let mut words = area_of(&payload, FRONT);
            let area = bytes_of(&mut words);
            let area_at = area.as_ptr() as usize;
            let got = request(&h, area, FRONT, &mut buf).expect(op);
            assert_eq!(got.bytes, &wire[..], "{op}");
            assert_eq!(got.bytes.as_ptr() as usize % 8, 0, "{op}: 8-byte aligned");
            // In the entry: it ends where the payload the kernel wrote ends, not in `buf`.
            let end = got.bytes.as_ptr() as usize + got.bytes.len();
            assert_eq!(end, area_at + FRONT + h.ent.payload_sz as usize, "{op}");
            assert_eq!(got.holds_payload, h.ent.payload_sz > 0, "{op}");
        }
        // Kernels before 6.15 put LOOKUP's name in `op_in` (its first argument): the same.
        let (_, _, lookup, _) = RECORDED[1];
        let wire = unhex(lookup);
        let (h, payload) = as_kernel_sends(&wire, wire.len() - IN_HEADER_LEN);
        let mut words = area_of(&payload, FRONT);
        let got = request(&h, bytes_of(&mut words), FRONT, &mut buf).expect("lookup");
        assert_eq!(got.bytes, &wire[..]);
    }

    #[test]
    fn a_request_that_cannot_be_aligned_in_place_is_put_together_aside() {
        let mut buf = RequestBuf::new(16);
        for &(op, op_len, request_hex, _) in RECORDED {
            let wire = unhex(request_hex);
            let (h, payload) = as_kernel_sends(&wire, op_len);
            // A payload 4 bytes off alignment: the header cannot go in front of it aligned.
            let mut words = area_of(&payload, FRONT + 4);
            let got = request(&h, bytes_of(&mut words), FRONT + 4, &mut buf).expect(op);
            assert_eq!(got.bytes, &wire[..], "{op}");
            assert_eq!(got.bytes.as_ptr() as usize % 8, 0, "{op}: 8-byte aligned");
            assert!(!got.holds_payload, "{op}");
        }
    }

    #[test]
    fn recorded_replies_split_into_the_header_and_the_payload() {
        for &(op, _, _, reply_hex) in RECORDED {
            let wire = unhex(reply_hex);
            let mut h = ReqHeader::default();
            let mut payload = vec![0u8; 8192];
            // Sent as fuser sends it: the header, then the rest (split once more, to be sure a
            // slice may straddle the header).
            let (a, b) = wire.split_at(OUT_HEADER_LEN - 4);
            let slices = [IoSlice::new(a), IoSlice::new(b)];
            reply(&mut h, &mut payload, &slices).expect(op);
            assert_eq!(h.in_out[..OUT_HEADER_LEN], wire[..OUT_HEADER_LEN], "{op}");
            let n = wire.len() - OUT_HEADER_LEN;
            assert_eq!(h.ent.payload_sz as usize, n, "{op}");
            assert_eq!(payload[..n], wire[OUT_HEADER_LEN..], "{op}");
        }
    }

    #[test]
    fn lengths_that_do_not_add_up_are_refused() {
        let (_, op_len, request_hex, _) = RECORDED[4];
        let wire = unhex(request_hex);
        let (mut h, payload) = as_kernel_sends(&wire, op_len);
        h.ent.payload_sz = wire.len() as u32;
        let mut buf = RequestBuf::new(16);
        let mut words = area_of(&payload, FRONT);
        assert!(matches!(
            request(&h, bytes_of(&mut words), FRONT, &mut buf),
            Err(FrameError::BadRequest { .. })
        ));
        let mut small = vec![0u8; 4];
        let big = [0u8; 64];
        let mut h = ReqHeader::default();
        assert_eq!(
            reply(&mut h, &mut small, &[IoSlice::new(&big)]),
            Err(FrameError::ReplyTooLarge { len: 64, room: 4 })
        );
        assert_eq!(
            reply(&mut h, &mut small, &[IoSlice::new(&big[..8])]),
            Err(FrameError::ShortReply(8))
        );
    }
}
