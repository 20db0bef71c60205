//! The cache's memory: one anonymous mapping cut into fixed-size blocks. For RDMA each slab
//! (at most the registration limit, and at most the caller's slab size) is mlocked and
//! registered with cuObject when a block of it is first used — the first slab at once, which
//! proves pinning and registration work — so an RDMA mount's resident memory follows its
//! working set up to the cap. Without RDMA nothing is locked, and the kernel gives the mapping
//! pages only as blocks are first written, so a mount that reads little holds little, and
//! blocks left unused for a while give their pages back (`give_back`). Those pages are huge
//! (2 MiB, `MADV_HUGEPAGE`) where the kernel has them: a block is populated with four faults
//! instead of 2,048, and the kernel pins a read's source pages for its copy per huge page; a
//! sequential read measured about a quarter less CPU per GiB. Memory still comes as used, in
//! 2 MiB steps (small files are packed from the arena's start).

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use cuobj_ffi::Registration;

use crate::setup::SetupError;

/// The slab size of the page cache: what an RDMA mount pins at a time as its cache fills.
pub const CACHE_SLAB: usize = 64 << 20;

/// One registered stretch of the arena.
struct Slab {
    start: usize,
    len: usize,
    /// Pinned and registered when a block of it is first used (RDMA only).
    state: OnceLock<SlabState>,
}

struct SlabState {
    locked: bool,
    reg: Option<Arc<Registration>>,
}

pub struct Arena {
    base: NonNull<u8>,
    len: usize,
    block_size: usize,
    blocks: usize,
    /// For RDMA: register slabs as they come into use.
    register: bool,
    /// For RDMA, and locking is allowed: slabs are mlocked as they come into use.
    pinned: bool,
    slabs: Vec<Slab>,
    /// One bit per block: it may hold pages (populated or written since it last gave them
    /// back). A fill of blocks that all do skips populating; giving back skips those that don't.
    used: Vec<AtomicU64>,
}

// SAFETY: the arena owns its mapping; concurrent access to blocks is governed by the cache's
// slot states (one filler or many readers per block, never both).
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

/// Whether this process may lock `len` more bytes: RLIMIT_MEMLOCK allows it, or it has
/// CAP_IPC_LOCK (which ignores the limit).
fn may_lock(len: usize) -> bool {
    use nix::sys::resource::{getrlimit, Resource};
    let soft = getrlimit(Resource::RLIMIT_MEMLOCK).map(|(soft, _)| soft);
    if soft.is_ok_and(|s| s == libc::RLIM_INFINITY || s >= len as u64) {
        return true;
    }
    const CAP_IPC_LOCK: u32 = 14;
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let hex = s
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))?
                .trim()
                .to_string();
            u64::from_str_radix(&hex, 16).ok()
        })
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// The huge page size of x86-64 and of arm64 with 4 KiB pages.
const HUGE_PAGE: usize = 2 << 20;

/// `len` bytes of anonymous memory from a huge-page boundary (so every whole 2 MiB of it can
/// be a huge page, wherever the kernel would have put it), asked to use huge pages unless it
/// is to be registered for RDMA (the NIC's registration is left as it was measured).
fn map(len: usize, register: bool) -> Result<NonNull<u8>, SetupError> {
    let padded = len.checked_add(HUGE_PAGE).ok_or(SetupError::Size {
        what: "memory",
        fix: "give it less",
    })?;
    let raw = cuobj_ffi::map_anonymous(padded).map_err(|source| SetupError::Map {
        what: "memory",
        source,
    })?;
    let start = raw.as_ptr() as usize;
    let head = start.next_multiple_of(HUGE_PAGE) - start;
    let tail = HUGE_PAGE - head;
    // SAFETY: the unused ends of our own fresh mapping, whole pages (mmap returns page-aligned
    // memory, so `head` and `tail` are multiples of the page size); the rest stays mapped.
    unsafe {
        if head > 0 {
            libc::munmap(raw.as_ptr().cast(), head);
        }
        if tail > 0 {
            libc::munmap(raw.as_ptr().add(head + len).cast(), tail);
        }
    }
    // SAFETY: `head` bytes into the mapping, which is `len + HUGE_PAGE` long.
    let base = unsafe { NonNull::new_unchecked(raw.as_ptr().add(head)) };
    if !register {
        // SAFETY: advice on our own mapping; it changes no data. A kernel without transparent
        // huge pages refuses it, and the arena keeps 4 KiB pages.
        unsafe { libc::madvise(base.as_ptr().cast(), len, libc::MADV_HUGEPAGE) };
    }
    Ok(base)
}

impl Arena {
    /// Map `blocks * block_size` bytes, in slabs of at most `slab_bytes` (and the registration
    /// limit), each a whole number of `align` bytes (a multiple of `block_size`: the longest
    /// aligned run of blocks a user takes, which so never straddles two slabs). With `register` (RDMA) each slab is pinned and registered with
    /// cuObject when first used, the first one now: if locking is not allowed (RLIMIT_MEMLOCK)
    /// or fails, the memory stays unpinned (`pinned() == false`); a failed registration leaves
    /// that slab without RDMA. Without `register` nothing is pinned: pages come as blocks are
    /// first used.
    pub fn new(
        block_size: usize,
        blocks: usize,
        register: bool,
        slab_bytes: usize,
        align: usize,
    ) -> Result<Arena, SetupError> {
        let size = SetupError::Size {
            what: "memory",
            fix: "give it at least one block",
        };
        if block_size == 0 || blocks == 0 || !align.is_multiple_of(block_size) {
            return Err(size);
        }
        let len = block_size.checked_mul(blocks).ok_or(size)?;
        let base = map(len, register)?;
        let max = cuobj_ffi::max_registration_size().min(slab_bytes);
        let per_slab = (max / align).max(1) * align;
        let mut slabs = Vec::new();
        let mut start = 0;
        while start < len {
            let slab_len = per_slab.min(len - start);
            slabs.push(Slab {
                start,
                len: slab_len,
                state: OnceLock::new(),
            });
            start += slab_len;
        }
        let mut arena = Arena {
            base,
            len,
            block_size,
            blocks,
            register,
            pinned: register && may_lock(len),
            slabs,
            used: (0..blocks.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
        };
        if register {
            // The first slab now: pinning and registration are known to work (or not) at start.
            let first = arena.activate(0);
            if !first.locked {
                arena.pinned = false;
            }
        }
        Ok(arena)
    }

    /// Slab `i`, pinned and registered on its first use (RDMA).
    fn activate(&self, i: usize) -> &SlabState {
        let slab = &self.slabs[i];
        slab.state.get_or_init(|| {
            if !self.register {
                return SlabState {
                    locked: false,
                    reg: None,
                };
            }
            // SAFETY: the slab lies in our own mapping.
            let p = unsafe { self.base.as_ptr().add(slab.start) };
            // SAFETY: locking part of our own mapping. Only RDMA needs it (registered memory
            // must stay put).
            let locked = self.pinned && unsafe { libc::mlock(p.cast(), slab.len) } == 0;
            if self.pinned && !locked {
                tracing::warn!(
                    bytes = slab.len,
                    "cannot mlock a cache slab (RLIMIT_MEMLOCK too low?); it stays unpinned; raise ulimit -l or LimitMEMLOCK="
                );
            }
            let reg = match cuobj_ffi::client() {
                // SAFETY: the slab lies in our mapping, which outlives the registration
                // (dropped first in Drop), and is registered once (OnceLock).
                Ok(c) => match unsafe { c.register(p, slab.len) } {
                    Ok(r) => Some(Arc::new(r)),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot register a cache slab with cuObject; its blocks use HTTP");
                        None
                    }
                },
                Err(e) => {
                    tracing::warn!(error = %e, "no cuObject client; the cache uses HTTP");
                    None
                }
            };
            SlabState { locked, reg }
        })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn blocks(&self) -> usize {
        self.blocks
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether an RDMA arena pins its slabs (locking allowed and the first one locked).
    pub fn pinned(&self) -> bool {
        self.pinned
    }

    /// Whether slabs are registered for RDMA as they come into use (their memory then stays).
    pub fn registering(&self) -> bool {
        self.register
    }

    /// Bytes mlocked now (slabs in use, with RDMA).
    pub fn pinned_bytes(&self) -> usize {
        self.slabs
            .iter()
            .filter(|s| s.state.get().is_some_and(|st| st.locked))
            .map(|s| s.len)
            .sum()
    }

    /// Whether every slab in use is registered for RDMA (and one is).
    pub fn registered(&self) -> bool {
        let mut used = self.slabs.iter().filter_map(|s| s.state.get()).peekable();
        used.peek().is_some() && used.all(|st| st.reg.is_some())
    }

    /// The registration holding block `i` and the block's offset in it; the slab is pinned and
    /// registered now if this is its first use.
    pub fn registration_of(&self, i: usize) -> Option<(&Arc<Registration>, usize)> {
        if !self.register {
            return None;
        }
        let off = i * self.block_size;
        // Every slab but the last has the first one's length.
        let idx = off / self.slabs.first()?.len;
        let start = self.slabs.get(idx)?.start;
        self.activate(idx).reg.as_ref().map(|r| (r, off - start))
    }

    /// Fault in the pages of the first `len` bytes from block `i` in one call before they are
    /// filled (an unpinned arena gets its pages as first written: one fault per 4 KiB page
    /// otherwise, in the middle of copying a response). Blocks used before are not asked for
    /// again: populating pages already there still walks the page table per 4 KiB page
    /// (several per cent of a sequential read's CPU once the cache has wrapped). A kernel without
    /// MADV_POPULATE_WRITE (before 5.14) faults pages in as usual.
    pub fn prefault(&self, i: usize, len: usize) {
        if self.pinned || len == 0 {
            return; // mlocked: already resident
        }
        assert!(i < self.blocks && len <= (self.blocks - i) * self.block_size);
        let n = len.div_ceil(self.block_size);
        if (i..i + n).all(|b| self.holds_pages(b)) {
            return;
        }
        let page = 4096;
        let len = len.div_ceil(page) * page;
        // SAFETY: in bounds of our own mapping (blocks are page-aligned and page-sized
        // multiples); populating only maps zero pages where none are, and changes no data.
        unsafe {
            libc::madvise(
                self.base.as_ptr().add(i * self.block_size).cast(),
                len.min((self.blocks - i) * self.block_size),
                libc::MADV_POPULATE_WRITE,
            );
        }
        self.note_used(i, len);
    }

    /// The blocks holding the first `len` bytes from block `i` are about to be written (so
    /// may hold pages until given back).
    pub fn note_used(&self, i: usize, len: usize) {
        for b in i..i + len.div_ceil(self.block_size).max(1) {
            self.used[b / 64].fetch_or(1 << (b % 64), Ordering::Relaxed);
        }
    }

    /// Whether block `b` may hold pages: written since it last gave them back.
    pub fn holds_pages(&self, b: usize) -> bool {
        self.used[b / 64].load(Ordering::Relaxed) & (1 << (b % 64)) != 0
    }

    /// Block `i`'s memory.
    ///
    /// # Safety
    /// The caller must hold the block exclusively (it is being filled) for as long as the
    /// slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn block_mut(&self, i: usize, len: usize) -> &mut [u8] {
        assert!(i < self.blocks && len <= self.block_size);
        // SAFETY: in bounds of our mapping; exclusivity is the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr().add(i * self.block_size), len) }
    }

    /// Block `i`'s first `len` bytes, for readers.
    ///
    /// # Safety
    /// No one may be writing the block while the slice lives.
    pub unsafe fn block(&self, i: usize, len: usize) -> &[u8] {
        assert!(i < self.blocks && len <= self.block_size);
        // SAFETY: in bounds; the caller promises no concurrent writer.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(i * self.block_size), len) }
    }
}

impl Arena {
    /// `len` bytes from the start of block `i` (a run of adjacent blocks), to write.
    ///
    /// # Safety
    /// The caller must hold every block of the run exclusively while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn block_mut_run(&self, i: usize, len: usize) -> &mut [u8] {
        assert!(i < self.blocks && len <= (self.blocks - i) * self.block_size);
        // SAFETY: in bounds of our mapping; exclusivity is the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr().add(i * self.block_size), len) }
    }

    /// `len` bytes from the start of block `i` (a run of adjacent blocks), to read.
    ///
    /// # Safety
    /// No one may be writing the run while the slice lives.
    pub unsafe fn block_run(&self, i: usize, len: usize) -> &[u8] {
        assert!(i < self.blocks && len <= (self.blocks - i) * self.block_size);
        // SAFETY: in bounds; the caller promises no concurrent writer.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(i * self.block_size), len) }
    }
}

impl Arena {
    /// Give the pages of `n` blocks from block `i` back to the system: the memory stays mapped
    /// and reads as zeros until written again. Nothing happens on an RDMA arena (registered
    /// memory stays); returns whether the pages went.
    ///
    /// # Safety
    /// No one may hold a slice of these blocks, nor take one until this returns.
    pub unsafe fn give_back(&self, i: usize, n: usize) -> bool {
        assert!(i + n <= self.blocks);
        // Registered memory keeps its pages (the NIC may hold them), pinned or not.
        if self.register || self.pinned {
            return false;
        }
        for b in i..i + n {
            self.used[b / 64].fetch_and(!(1 << (b % 64)), Ordering::Relaxed);
        }
        // SAFETY: in bounds of our own unlocked mapping; the caller promises no one uses the
        // blocks. MADV_DONTNEED on private anonymous memory drops the pages (zero-filled on
        // next touch).
        unsafe {
            libc::madvise(
                self.base.as_ptr().add(i * self.block_size).cast(),
                n * self.block_size,
                libc::MADV_DONTNEED,
            ) == 0
        }
    }
}

impl Arena {
    /// Give back the pages of the blocks in `sorted` (ascending), one `madvise` per run of
    /// adjacent blocks; returns how many blocks gave their pages back.
    ///
    /// # Safety
    /// As [`Arena::give_back`], for every block listed.
    pub unsafe fn give_back_blocks(&self, sorted: &[usize]) -> usize {
        let mut done = 0;
        let mut k = 0;
        while k < sorted.len() {
            let start = sorted[k];
            let mut n = 1;
            while k + n < sorted.len() && sorted[k + n] == start + n {
                n += 1;
            }
            // SAFETY: the caller's promise, for each block of the run.
            if unsafe { self.give_back(start, n) } {
                done += n;
            }
            k += n;
        }
        done
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // Registrations go before the memory does.
        self.slabs.clear();
        // SAFETY: unmapping our own mapping (munmap also unlocks it).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages of `len` bytes from `p` resident now (mincore).
    fn resident(p: *const u8, len: usize) -> usize {
        let mut v = vec![0u8; len.div_ceil(4096)];
        // SAFETY: `p` is page-aligned in our mapping; `v` has one byte per page.
        let r = unsafe { libc::mincore(p as *mut _, len, v.as_mut_ptr()) };
        assert_eq!(r, 0);
        v.iter().filter(|b| **b & 1 == 1).count()
    }

    #[test]
    fn prefault_brings_in_exactly_the_block_about_to_be_filled_and_give_back_takes_it_away() {
        // Blocks of a huge page each, which the arena starts on a boundary of.
        const BS: usize = HUGE_PAGE;
        let a = Arena::new(BS, 4, false, CACHE_SLAB, BS).unwrap();
        assert_eq!(a.base.as_ptr() as usize % HUGE_PAGE, 0);
        // SAFETY: every index used is within the 4-block mapping.
        let block = |i: usize| unsafe { a.base.as_ptr().add(i * BS) as *const u8 };
        assert_eq!(resident(block(1), BS), 0);
        a.prefault(1, BS - 100);
        assert_eq!(resident(block(1), BS), BS / 4096);
        assert_eq!(resident(block(0), BS) + resident(block(2), BS), 0);
        assert!(a.holds_pages(1) && !a.holds_pages(0) && !a.holds_pages(2));
        // SAFETY: no one holds these blocks.
        assert_eq!(unsafe { a.give_back_blocks(&[0, 1, 3]) }, 3);
        assert_eq!(resident(block(1), BS), 0);
        assert!(!a.holds_pages(1));
    }

    #[test]
    fn a_block_used_before_is_not_populated_again_until_it_gave_its_pages_back() {
        const BS: usize = HUGE_PAGE;
        let a = Arena::new(BS, 2, false, CACHE_SLAB, BS).unwrap();
        let block = a.base.as_ptr() as *mut libc::c_void;
        a.prefault(0, BS);
        // Drop the pages behind the arena's back: a second prefault must not look.
        // SAFETY: block 0 of our own mapping, which no one else uses.
        assert_eq!(unsafe { libc::madvise(block, BS, libc::MADV_DONTNEED) }, 0);
        a.prefault(0, BS);
        assert_eq!(resident(block as *const u8, BS), 0);
        // SAFETY: no one holds block 0.
        assert!(unsafe { a.give_back(0, 1) });
        a.prefault(0, BS);
        assert_eq!(resident(block as *const u8, BS), BS / 4096);
    }
}
