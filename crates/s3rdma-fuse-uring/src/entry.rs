//! One ring entry: the two buffers it registers with the kernel (the header area and the
//! payload), page-aligned in one anonymous mapping that never moves while the kernel may
//! write into it (and whose pages exist only once written: an idle mount does not hold a
//! megabyte per entry), and the `iovec` pair REGISTER points at.

use std::io;
use std::ptr::NonNull;

use crate::abi::ReqHeader;

const PAGE: usize = 4096;

/// The buffers of one entry of queue `qid`.
pub struct Entry {
    base: NonNull<u8>,
    len: usize,
    payload_len: usize,
    iov: Box<[libc::iovec; 2]>,
    pub qid: u16,
}

// SAFETY: the entry owns its allocation; the kernel writes into it only between a command's
// submission and its completion, while the worker that owns the entry waits for it.
unsafe impl Send for Entry {}

impl Entry {
    /// An entry of queue `qid` with `payload_len` bytes of payload (at least what the
    /// kernel asks: `max(8 KiB, max_write, max_pages × page)`).
    pub fn new(qid: u16, payload_len: usize) -> io::Result<Self> {
        let payload_len = payload_len.next_multiple_of(PAGE);
        let len = PAGE + payload_len;
        // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base =
            NonNull::new(raw.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        let iov = Box::new([
            libc::iovec {
                iov_base: base.as_ptr().cast(),
                iov_len: std::mem::size_of::<ReqHeader>(),
            },
            libc::iovec {
                // SAFETY: PAGE is within the allocation.
                iov_base: unsafe { base.as_ptr().add(PAGE) }.cast(),
                iov_len: payload_len,
            },
        ]);
        Ok(Entry {
            base,
            len,
            payload_len,
            iov,
            qid,
        })
    }

    /// What REGISTER's `addr` points at: the two buffers.
    pub fn iovecs(&self) -> *const libc::iovec {
        self.iov.as_ptr()
    }

    /// Pointers to the header area and the payload (and its length), for the reply sink.
    pub fn raw_parts(&self) -> (*mut ReqHeader, *mut u8, usize) {
        let base = self.base.as_ptr();
        // SAFETY: PAGE is within the allocation.
        (base.cast(), unsafe { base.add(PAGE) }, self.payload_len)
    }

    /// The header area and the payload, for the worker that owns the entry while the kernel
    /// does not (between a completion and the next command).
    pub fn parts(&mut self) -> (&mut ReqHeader, &mut [u8]) {
        let (header, area, front) = self.header_and_area();
        (header, &mut area[front..])
    }

    /// The header, and the rest of the entry past it up to the end of the payload (the gap
    /// left in the header page, then the payload), with the payload's offset in it: where a
    /// request is read in place (`frame::request`).
    pub fn header_and_area(&mut self) -> (&mut ReqHeader, &mut [u8], usize) {
        const AFTER: usize = std::mem::size_of::<ReqHeader>();
        // SAFETY: the header lies at the start of the page-aligned allocation (ReqHeader is
        // repr(C) of plain bytes and integers: any bytes are a valid value), the area from
        // just past it to the end of the payload (one page on): disjoint, both borrowed
        // through `&mut self`, so nothing else in this process touches them, and the kernel
        // does not while the entry is the worker's.
        unsafe {
            let base = self.base.as_ptr();
            let header = &mut *base.cast::<ReqHeader>();
            let area =
                std::slice::from_raw_parts_mut(base.add(AFTER), PAGE - AFTER + self.payload_len);
            (header, area, PAGE - AFTER)
        }
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        // SAFETY: mapped in `new` with this length; the kernel let go of the entry when its
        // last command completed (the worker drops entries only after that, or never
        // registered them).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}
