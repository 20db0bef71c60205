//! One ring worker: its own io_uring holding one entry of one kernel queue. It waits for a
//! request, serves it on its own thread (the file system's handlers block, as on the
//! `/dev/fuse` path), puts the reply into the entry and commits it together with the next
//! wait: one `io_uring_enter` per request where `/dev/fuse` takes a `read` and a `writev`.

use std::io;
use std::io::IoSlice;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

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
    entry: Entry,
    /// Where fuser sends the reply of the request being served.
    sink: Arc<Sink>,
    /// Where a request that cannot be read in place is put back together.
    buf: RequestBuf,
}

/// How a request is served: fuser's `Dispatcher` on a mount (a closure in the tests).
pub trait Serve {
    fn serve(&self, request: &[u8], sink: Arc<dyn fuser::ReplySink>) -> io::Result<()>;
}

impl<FS: fuser::Filesystem> Serve for fuser::Dispatcher<FS> {
    fn serve(&self, request: &[u8], sink: Arc<dyn fuser::ReplySink>) -> io::Result<()> {
        self.dispatch(request, sink)
    }
}

/// The kernel no longer holds the entry (its last completion came), or still may.
enum End {
    Released,
    Held,
}

impl Ring {
    /// A ring with one entry of `payload` bytes of the kernel queue `qid`.
    pub fn new(qid: u16, payload: usize) -> io::Result<Ring> {
        let uring = IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(2)?;
        let entry = Entry::new(qid, payload)?;
        let sink = Arc::new(Sink::new(&entry));
        Ok(Ring {
            uring,
            entry,
            sink,
            buf: RequestBuf::new(4096),
        })
    }

    /// Register the entry on the connection `dev` and serve its requests until the
    /// connection ends.
    pub fn serve(mut self, dev: &OwnedFd, server: &impl Serve, stats: &Stats) -> io::Result<()> {
        let fd = types::Fd(dev.as_raw_fd());
        stay_on(self.entry.qid);
        let (end, result) = self.run(fd, server, stats);
        if let End::Held = end {
            // The kernel may still write into the entry: its memory is never freed.
            warn!("a ring worker stopped while the kernel held its entry");
            std::mem::forget(self.entry);
        }
        result
    }

    fn run(&mut self, fd: types::Fd, server: &impl Serve, stats: &Stats) -> (End, io::Result<()>) {
        let mut next = register(fd, &self.entry);
        loop {
            if let Err(e) = self.push(&next) {
                return (End::Held, Err(e));
            }
            let res = match self.wait() {
                Ok(res) => res,
                Err(e) => return (End::Held, Err(e)),
            };
            next = if res == 0 {
                commit_sqe(fd, self.answer(server, stats))
            } else if res == -libc::EAGAIN || res == -libc::EINTR {
                register(fd, &self.entry)
            } else {
                ended(res, stats);
                return (End::Released, Ok(()));
            };
        }
    }

    /// Submit what is queued and wait for the entry's completion; its result.
    fn wait(&mut self) -> io::Result<i32> {
        loop {
            match self.uring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
            if let Some(c) = self.uring.completion().next() {
                return Ok(c.result());
            }
        }
    }

    fn push(&mut self, sqe: &squeue::Entry128) -> io::Result<()> {
        // SAFETY: the SQE points at memory of this ring's entry (its iovecs and buffers),
        // which outlives the command: the entry is freed only after its last completion.
        while unsafe { self.uring.submission().push(sqe) }.is_err() {
            self.uring.submit()?;
        }
        Ok(())
    }

    /// Serve the request the entry holds; the id its reply commits.
    fn answer(&mut self, server: &impl Serve, stats: &Stats) -> CmdReq {
        let qid = self.entry.qid;
        let (header, area, front) = self.entry.header_and_area();
        let commit_id = header.ent.commit_id;
        let commit = CmdReq {
            commit_id,
            qid,
            ..CmdReq::default()
        };
        stats.requests.fetch_add(1, Ordering::Relaxed);
        let request = match frame::request(header, area, front, &mut self.buf) {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %e, "a ring request could not be read; answered EIO");
                fail(self.entry.parts().0, commit_id, libc::EIO);
                return commit;
            }
        };
        let deferred = request.holds_payload;
        self.sink.arm(deferred);
        // A handler that panics must not unwind through the ring (the kernel holds the
        // entry, whose memory must outlive it), and the request needs an answer.
        let sink = self.sink.clone();
        let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            server.serve(request.bytes, sink)
        }));
        if served.is_err() {
            error!(
                "a FUSE handler panicked on a ring request (answered EIO unless it had replied)"
            );
        }
        let (header, payload) = self.entry.parts();
        let answered = self.sink.disarm();
        let put = match answered {
            true if deferred => frame::reply(header, payload, &[IoSlice::new(&self.sink.staged())])
                .map_err(|e| warn!(error = %e, "a ring reply does not fit; answered EIO")),
            true => Ok(()),
            false => Err(()),
        };
        if put.is_err() {
            // Not answered while it was served (an invalid request, a reply too large for
            // the entry, a panic): the kernel still needs an answer.
            debug!(
                ?served,
                answered, "a ring request was not answered; answered EIO"
            );
            fail(header, commit_id, libc::EIO);
        }
        commit
    }
}

/// Keep the calling thread on CPU `cpu`, whose callers the kernel queue of that id serves (as
/// libfuse does): a request is then served on the CPU its caller runs on, without a wake-up
/// across CPUs. Where that CPU is not this process's to use (offline, another cpuset), the
/// thread stays free to run anywhere.
fn stay_on(cpu: u16) {
    let cpu = usize::from(cpu);
    if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
        return;
    }
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET writes bit `cpu` inside it (checked
    // above); sched_setaffinity reads the set and changes only this thread's affinity.
    let done = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if done != 0 {
        debug!(cpu, error = %io::Error::last_os_error(), "a ring worker runs unpinned");
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

/// Where fuser sends the reply of a ring request: into the entry it came in, or, for a
/// request read in place with its payload (whose bytes the handler may still hold while it
/// replies), aside until the handler returns (such replies are small: a WRITE's count).
#[derive(Debug)]
struct Sink {
    header: *mut ReqHeader,
    payload: *mut u8,
    payload_len: usize,
    state: AtomicU8,
    deferred: AtomicBool,
    staged: Mutex<Vec<u8>>,
}

// SAFETY: the pointers are written only by `send` while the sink is armed and not deferred:
// during `dispatch` on the worker that owns the entry, while the request being served lies
// elsewhere (a copy, or the gap before the payload, which the reply does not touch).
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
            deferred: AtomicBool::new(false),
            staged: Mutex::new(Vec::new()),
        }
    }

    /// Ready for one reply: into the entry, or aside (`deferred`).
    fn arm(&self, deferred: bool) {
        self.deferred.store(deferred, Ordering::Relaxed);
        self.state.store(ARMED, Ordering::Release);
    }

    /// Back to idle; whether the request was answered.
    fn disarm(&self) -> bool {
        self.state.swap(IDLE, Ordering::AcqRel) == REPLIED
    }

    /// The reply set aside (deferred).
    fn staged(&self) -> MutexGuard<'_, Vec<u8>> {
        self.staged.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl fuser::ReplySink for Sink {
    fn send(&self, data: &[io::IoSlice<'_>]) -> io::Result<()> {
        if self.state.load(Ordering::Acquire) != ARMED {
            return Err(io::Error::other(
                "a ring request was answered after its handler returned",
            ));
        }
        if self.deferred.load(Ordering::Relaxed) {
            let mut staged = self.staged();
            staged.clear();
            data.iter().for_each(|d| staged.extend_from_slice(d));
        } else {
            // SAFETY: armed and not deferred: this runs inside `dispatch` on the worker that
            // owns the entry, and the request being served does not lie where the reply goes
            // (see the Send note).
            let (header, payload) = unsafe {
                (
                    &mut *self.header,
                    std::slice::from_raw_parts_mut(self.payload, self.payload_len),
                )
            };
            frame::reply(header, payload, data).map_err(|e| io::Error::other(e.to_string()))?;
        }
        self.state.store(REPLIED, Ordering::Release);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use fuser::ReplySink;

    use super::*;
    use crate::abi::OUT_HEADER_LEN;
    use crate::frame::tests::{as_kernel_sends, unhex, RECORDED};

    /// A handler that is a closure.
    struct Handler<F>(F);

    impl<F: Fn(&[u8], Arc<dyn fuser::ReplySink>) -> io::Result<()>> Serve for Handler<F> {
        fn serve(&self, request: &[u8], sink: Arc<dyn fuser::ReplySink>) -> io::Result<()> {
            (self.0)(request, sink)
        }
    }

    /// A ring whose entry holds recorded request `i`, as the kernel would have put it there;
    /// the request's unique id.
    fn ring_holding(i: usize) -> (Ring, u64) {
        let mut ring = Ring::new(0, 8192).expect("io_uring (kernel.io_uring_disabled = 0)");
        let (_, op_len, request_hex, _) = RECORDED[i];
        let (h, payload) = as_kernel_sends(&unhex(request_hex), op_len);
        let (header, area) = ring.entry.parts();
        *header = h;
        area[..payload.len()].copy_from_slice(&payload);
        (ring, h.ent.commit_id)
    }

    /// A ring whose entry holds the recorded GETATTR.
    fn ring_holding_a_request() -> (Ring, u64) {
        ring_holding(0)
    }

    /// The entry's reply: its `fuse_out_header` (len, error, unique) and payload length.
    fn reply_of(ring: &mut Ring) -> (u32, i32, u64, u32) {
        let (h, _) = ring.entry.parts();
        let word = |at: usize| h.in_out[at..at + 4].try_into().expect("4 bytes");
        let unique = u64::from_ne_bytes(h.in_out[8..16].try_into().expect("8 bytes"));
        let len = u32::from_ne_bytes(word(0));
        (len, i32::from_ne_bytes(word(4)), unique, h.ent.payload_sz)
    }

    #[test]
    fn a_reply_sent_while_serving_lands_in_the_entry() {
        let (mut ring, unique) = ring_holding_a_request();
        let (_, _, request_hex, reply_hex) = RECORDED[0];
        let seen = std::sync::Mutex::new(Vec::new());
        let handler = Handler(|request: &[u8], sink: Arc<dyn fuser::ReplySink>| {
            seen.lock().expect("lock").extend_from_slice(request);
            sink.send(&[IoSlice::new(&unhex(reply_hex))])
        });
        let commit = ring.answer(&handler, &Stats::default());
        assert_eq!(commit.commit_id, unique);
        assert_eq!(*seen.lock().expect("lock"), unhex(request_hex));
        let wire = unhex(reply_hex);
        let (len, error, got_unique, payload) = reply_of(&mut ring);
        assert_eq!((len as usize, error, got_unique), (wire.len(), 0, unique));
        assert_eq!(payload as usize, wire.len() - OUT_HEADER_LEN);
    }

    #[test]
    fn a_handler_that_panics_is_answered_eio_and_the_worker_goes_on() {
        let (mut ring, unique) = ring_holding_a_request();
        let handler = Handler(|_: &[u8], _: Arc<dyn fuser::ReplySink>| -> io::Result<()> {
            panic!("a handler bug")
        });
        let stats = Stats::default();
        let commit = ring.answer(&handler, &stats);
        assert_eq!(commit.commit_id, unique);
        let (len, error, got_unique, payload) = reply_of(&mut ring);
        assert_eq!(
            (len as usize, error, got_unique, payload),
            (OUT_HEADER_LEN, -libc::EIO, unique, 0)
        );
        // The sink is idle again: a late reply is refused, and the next request is served.
        assert!(ring.sink.send(&[IoSlice::new(&[0u8; 16])]).is_err());
        let (mut ring, unique) = ring_holding_a_request();
        let ok = Handler(|_: &[u8], sink: Arc<dyn fuser::ReplySink>| {
            let mut out = [0u8; 16];
            out[0] = 16;
            out[8..16].copy_from_slice(&unique.to_ne_bytes());
            sink.send(&[IoSlice::new(&out)])
        });
        ring.answer(&ok, &stats);
        assert_eq!(reply_of(&mut ring).1, 0);
        assert_eq!(stats.requests(), 2);
    }

    #[test]
    fn a_request_left_unanswered_or_unreadable_is_answered_eio() {
        let (mut ring, unique) = ring_holding_a_request();
        let silent = Handler(|_: &[u8], _: Arc<dyn fuser::ReplySink>| Ok(()));
        ring.answer(&silent, &Stats::default());
        assert_eq!(reply_of(&mut ring).1, -libc::EIO);
        let (mut ring, _) = ring_holding_a_request();
        ring.entry.parts().0.ent.payload_sz = 1 << 30;
        let never = Handler(|_: &[u8], _: Arc<dyn fuser::ReplySink>| -> io::Result<()> {
            unreachable!("a request that does not add up is not served")
        });
        ring.answer(&never, &Stats::default());
        let (_, error, got_unique, _) = reply_of(&mut ring);
        assert_eq!((error, got_unique), (-libc::EIO, unique));
    }

    #[test]
    fn a_write_is_read_in_place_and_its_reply_waits_for_the_handler() {
        const WRITE: usize = 4;
        let (mut ring, unique) = ring_holding(WRITE);
        let (_, _, request_hex, reply_hex) = RECORDED[WRITE];
        let payload_at = ring.entry.raw_parts().1 as usize;
        // (A panic in the handler after its reply would be caught: what it saw is kept.)
        let seen = std::sync::Mutex::new((0, Vec::new()));
        let handler = Handler(|request: &[u8], sink: Arc<dyn fuser::ReplySink>| {
            let end = request.as_ptr() as usize + request.len();
            sink.send(&[IoSlice::new(&unhex(reply_hex))])?;
            *seen.lock().expect("lock") = (end, request.to_vec());
            Ok(())
        });
        let commit = ring.answer(&handler, &Stats::default());
        assert_eq!(commit.commit_id, unique);
        let (end, after_reply) = seen.into_inner().expect("lock");
        // The data is the entry's payload itself ("written through fuse"), not a copy, and
        // replying did not write over the request the handler still held.
        assert_eq!(end, payload_at + 20);
        assert_eq!(after_reply, unhex(request_hex));
        let wire = unhex(reply_hex);
        let (len, error, got_unique, payload) = reply_of(&mut ring);
        assert_eq!((len as usize, error, got_unique), (wire.len(), 0, unique));
        assert_eq!(payload as usize, wire.len() - OUT_HEADER_LEN);
        assert_eq!(&ring.entry.parts().1[..8], &wire[OUT_HEADER_LEN..]);
    }
}
