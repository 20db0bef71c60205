//! The kernel's FUSE-over-io_uring ABI (`include/uapi/linux/fuse.h`, protocol 7.42): the
//! command an SQE carries, the header area each ring entry registers, and the two commands.
//! Sizes and offsets are checked at compile time against the kernel's.

use std::mem::{offset_of, size_of};

/// `IORING_OP_URING_CMD` command: hand the kernel an entry to fill with requests.
pub const CMD_REGISTER: u32 = 1;
/// `IORING_OP_URING_CMD` command: the reply of the entry's request, and fetch the next one.
pub const CMD_COMMIT_AND_FETCH: u32 = 2;
/// `fuse_in_header`: the start of every request.
pub const IN_HEADER_LEN: usize = 40;
/// `fuse_out_header`: the start of every reply.
pub const OUT_HEADER_LEN: usize = 16;
/// The least payload area an entry registers (`FUSE_MIN_READ_BUFFER`).
pub const MIN_PAYLOAD: usize = 8192;

/// `struct fuse_uring_cmd_req`: what the 80-byte command area of an SQE128 carries.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CmdReq {
    pub flags: u64,
    /// The request being answered (COMMIT_AND_FETCH): the `commit_id` it came with.
    pub commit_id: u64,
    /// The kernel queue (one per possible CPU) the entry serves.
    pub qid: u16,
    pub padding: [u8; 6],
}

impl CmdReq {
    /// The SQE's command area.
    pub fn to_cmd(self) -> [u8; 80] {
        let mut cmd = [0u8; 80];
        cmd[0..8].copy_from_slice(&self.flags.to_ne_bytes());
        cmd[8..16].copy_from_slice(&self.commit_id.to_ne_bytes());
        cmd[16..18].copy_from_slice(&self.qid.to_ne_bytes());
        cmd
    }
}

/// `struct fuse_uring_ent_in_out`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct EntInOut {
    pub flags: u64,
    /// The request's `unique`, to be given back with its reply.
    pub commit_id: u64,
    /// Request: bytes of payload the kernel wrote. Reply: bytes of reply after the header.
    pub payload_sz: u32,
    pub padding: u32,
    pub reserved: u64,
}

/// `struct fuse_uring_req_header`: the first of the two buffers an entry registers.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ReqHeader {
    /// Request: `fuse_in_header`. Reply: `fuse_out_header`.
    pub in_out: [u8; 128],
    /// The request's first argument (its per-opcode header, e.g. `fuse_write_in`).
    pub op_in: [u8; 128],
    pub ent: EntInOut,
}

impl Default for ReqHeader {
    fn default() -> Self {
        ReqHeader {
            in_out: [0; 128],
            op_in: [0; 128],
            ent: EntInOut::default(),
        }
    }
}

const _: () = {
    assert!(size_of::<CmdReq>() == 24);
    assert!(offset_of!(CmdReq, commit_id) == 8);
    assert!(offset_of!(CmdReq, qid) == 16);
    assert!(size_of::<EntInOut>() == 32);
    assert!(offset_of!(EntInOut, commit_id) == 8);
    assert!(offset_of!(EntInOut, payload_sz) == 16);
    assert!(size_of::<ReqHeader>() == 288);
    assert!(offset_of!(ReqHeader, op_in) == 128);
    assert!(offset_of!(ReqHeader, ent) == 256);
};
