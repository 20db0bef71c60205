//! One ring worker: its own io_uring holding its entries (one, where the workers are at least
//! as many as the kernel's queues). It waits for a
//! request, serves it on its own thread (the file system's handlers block, as on the
//! `/dev/fuse` path), puts the reply into the entry and commits it together with the next
//! wait: one `io_uring_enter` per request where `/dev/fuse` takes a `read` and a `writev`.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use tracing::{debug, error, warn};

use crate::abi::{self, CmdReq, ReqHeader};
use crate::entry::Entry;
use crate::frame::{self, RequestBuf};
use crate::Stats;

/// A worker's ring, made before the mount asks the kernel for the transport (a mount that
/// asks and then cannot register its entries would hang).
pub struct Ring {
    uring: IoUring<squeue::Entry128, cqueue::Entry>,
    entries: Vec<Slot>,
}

/// An entry and the sink its requests reply through.
struct Slot {
    entry: Entry,
    sink: Arc<Sink>,
}

impl Ring {
    /// A ring with one entry of `payload` bytes for each of the kernel queues `qids`.
    pub fn new(qids: &[u16], payload: usize) -> io::Result<Ring> {
        let depth = (qids.len() as u32 * 2).next_power_of_two();
        let uring = IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(depth)?;
        let entries = qids
            .iter()
            .map(|&q| {
                let entry = Entry::new(q, payload)?;
                let sink = Arc::new(Sink::new(&entry));
                Ok(Slot { entry, sink })
            })
            .collect::<io::Result<_>>()?;
        Ok(Ring { uring, entries })
    }

    /// Register the entries on the connection `dev` and serve its requests until the
    /// connection ends.
    pub fn serve<FS: fuser::Filesystem>(
        mut self,
        dev: &OwnedFd,
        dispatcher: &fuser::Dispatcher<FS>,
        stats: &Stats,
    ) -> io::Result<()> {
        let fd = types::Fd(dev.as_raw_fd());
        for i in 0..self.entries.len() {
            let sqe = register(fd, &self.entries[i].entry).user_data(i as u64);
            self.push(&sqe)?;
        }
        let mut live = self.entries.len();
        let mut buf = RequestBuf::new(64 << 10);
        let mut done: Vec<(usize, i32)> = Vec::with_capacity(self.entries.len());
        let end = loop {
            match self.uring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => break Err(e),
            }
            done.clear();
            done.extend(
                self.uring
                    .completion()
                    .map(|c| (c.user_data() as usize, c.result())),
            );
            for &(i, res) in &done {
                if res == 0 {
                    let commit = self.answer(i, dispatcher, &mut buf, stats);
                    self.push(&commit_sqe(fd, commit).user_data(i as u64))?;
                } else if res == -libc::EAGAIN || res == -libc::EINTR {
                    let sqe = register(fd, &self.entries[i].entry).user_data(i as u64);
                    self.push(&sqe)?;
                } else {
                    live -= 1;
                    ended(res, stats);
                }
            }
            if live == 0 {
                break Ok(());
            }
        };
        if live > 0 {
            // The kernel may still write into entries it holds: their memory is never freed.
            warn!(
                entries = live,
                "a ring worker stopped while the kernel held some of its entries"
            );
            std::mem::forget(self.entries);
        }
        end
    }

    fn push(&mut self, sqe: &squeue::Entry128) -> io::Result<()> {
        // SAFETY: the SQE points at memory of this ring's entries (their iovecs and buffers),
        // which outlives the command: entries are freed only after their last completion.
        while unsafe { self.uring.submission().push(sqe) }.is_err() {
            self.uring.submit()?;
        }
        Ok(())
    }

    /// Serve the request entry `i` holds; the id its reply commits.
    fn answer<FS: fuser::Filesystem>(
        &mut self,
        i: usize,
        dispatcher: &fuser::Dispatcher<FS>,
        buf: &mut RequestBuf,
        stats: &Stats,
    ) -> CmdReq {
        let slot = &mut self.entries[i];
        let qid = slot.entry.qid;
        let (header, payload) = slot.entry.parts();
        let commit_id = header.ent.commit_id;
        let commit = CmdReq {
            commit_id,
            qid,
            ..CmdReq::default()
        };
        stats.requests.fetch_add(1, Ordering::Relaxed);
        let request = match frame::request(header, payload, buf) {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %e, "a ring request could not be read; answered EIO");
                fail(header, commit_id, libc::EIO);
                return commit;
            }
        };
        slot.sink.arm();
        // A handler that panics must not unwind through the ring: the kernel still holds this
        // worker's other entries (their memory must outlive it), and the request needs an
        // answer.
        let sink = slot.sink.clone();
        let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            dispatcher.dispatch(request, sink)
        }));
        if served.is_err() {
            error!("a FUSE handler panicked on a ring request; answered EIO");
        }
        if !slot.sink.disarm() {
            // Not answered while it was served (an invalid request, a reply too large for
            // the entry, a panic): the kernel still needs an answer.
            debug!(?served, "a ring request was not answered; answered EIO");
            let (header, _) = slot.entry.parts();
            fail(header, commit_id, libc::EIO);
        }
        commit
    }
}

/// REGISTER of `entry`: its header area and payload (`addr` → two iovecs, `len` 2).
fn register(fd: types::Fd, entry: &Entry) -> squeue::Entry128 {
    let cmd = CmdReq {
        qid: entry.qid,
        ..CmdReq::default()
    };
    let mut sqe = opcode::UringCmd80::new(fd, abi::CMD_REGISTER)
        .cmd(cmd.to_cmd())
        .addr(Some(entry.iovecs() as u64))
        .build();
    // SAFETY: Entry128 is repr(C), the kernel's 64-byte io_uring_sqe first; its `len` (u32 at
    // byte 24) is the iovec count, which the crate's UringCmd80 does not set.
    unsafe {
        let sqe_bytes = (&mut sqe as *mut squeue::Entry128).cast::<u8>();
        sqe_bytes.add(24).cast::<u32>().write_unaligned(2);
    }
    sqe
}

fn commit_sqe(fd: types::Fd, commit: CmdReq) -> squeue::Entry128 {
    opcode::UringCmd80::new(fd, abi::CMD_COMMIT_AND_FETCH)
        .cmd(commit.to_cmd())
        .build()
}

/// An entry's last completion: the connection ended (unmounted or aborted), or the kernel
/// refused the entry (it then goes on over `/dev/fuse`).
fn ended(res: i32, stats: &Stats) {
    match -res {
        libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED | libc::ENODEV => {
            debug!(errno = -res, "ring entry ended with the connection")
        }
        e => {
            stats.refused.fetch_add(1, Ordering::Relaxed);
            warn!(errno = e, error = %io::Error::from_raw_os_error(e), "the kernel refused a ring entry; its requests go over /dev/fuse")
        }
    }
}

/// An error reply: `fuse_out_header` alone.
fn fail(header: &mut ReqHeader, unique: u64, errno: i32) {
    header.in_out[0..4].copy_from_slice(&(abi::OUT_HEADER_LEN as u32).to_ne_bytes());
    header.in_out[4..8].copy_from_slice(&(-errno).to_ne_bytes());
    header.in_out[8..16].copy_from_slice(&unique.to_ne_bytes());
    header.ent.payload_sz = 0;
}

const IDLE: u8 = 0;
const ARMED: u8 = 1;
const REPLIED: u8 = 2;

/// Where fuser sends the reply of a ring request: into the entry it came in.
#[derive(Debug)]
struct Sink {
    header: *mut ReqHeader,
    payload: *mut u8,
    payload_len: usize,
    state: AtomicU8,
}

// SAFETY: the pointers are written only by `send` while the sink is armed: during `dispatch`
// on the worker that owns the entry, while nothing else touches the entry's buffers.
unsafe impl Send for Sink {}
// SAFETY: as for Send; `state` admits one `send` per arming.
unsafe impl Sync for Sink {}

impl Sink {
    fn new(entry: &Entry) -> Sink {
        let (header, payload, payload_len) = entry.raw_parts();
        Sink {
            header,
            payload,
            payload_len,
            state: AtomicU8::new(IDLE),
        }
    }

    fn arm(&self) {
        self.state.store(ARMED, Ordering::Release);
    }

    /// Back to idle; whether the request was answered.
    fn disarm(&self) -> bool {
        self.state.swap(IDLE, Ordering::AcqRel) == REPLIED
    }
}

impl fuser::ReplySink for Sink {
    fn send(&self, data: &[io::IoSlice<'_>]) -> io::Result<()> {
        if self.state.load(Ordering::Acquire) != ARMED {
            return Err(io::Error::other(
                "a ring request was answered after its handler returned",
            ));
        }
        // SAFETY: armed: this runs inside `dispatch` on the worker that owns the entry (see
        // the Send note), and the request being served was copied out of the entry.
        let (header, payload) = unsafe {
            (
                &mut *self.header,
                std::slice::from_raw_parts_mut(self.payload, self.payload_len),
            )
        };
        frame::reply(header, payload, data).map_err(|e| io::Error::other(e.to_string()))?;
        self.state.store(REPLIED, Ordering::Release);
        Ok(())
    }
}
