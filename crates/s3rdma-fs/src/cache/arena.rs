//! The cache's memory: one anonymous mapping cut into fixed-size blocks. For RDMA it is mlocked
//! and registered with cuObject once per slab (a slab never exceeds the registration limit);
//! without RDMA nothing is locked, and the kernel gives the mapping pages only as blocks are
//! first written, so a mount that reads little holds little, and blocks left unused for a while
//! give their pages back (`give_back`).

use std::ptr::NonNull;
use std::sync::Arc;

use cuobj_ffi::Registration;

/// One registered stretch of the arena.
struct Slab {
    start: usize,
    len: usize,
    reg: Option<Arc<Registration>>,
}

pub struct Arena {
    base: NonNull<u8>,
    len: usize,
    block_size: usize,
    blocks: usize,
    pinned: bool,
    slabs: Vec<Slab>,
}

// SAFETY: the arena owns its mapping; concurrent access to blocks is governed by the cache's
// slot states (one filler or many readers per block, never both).
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

impl Arena {
    /// Map `blocks * block_size` bytes; with `register` (RDMA), pin them and register each slab
    /// with cuObject. A failed mlock leaves the memory unpinned (`pinned() == false`); a failed
    /// registration leaves that slab without RDMA. Without `register` nothing is pinned: pages
    /// come as blocks are first used.
    pub fn new(block_size: usize, blocks: usize, register: bool) -> Result<Arena, String> {
        if block_size == 0 || blocks == 0 {
            return Err("the cache needs at least one block".into());
        }
        let len = block_size
            .checked_mul(blocks)
            .ok_or_else(|| "cache size overflows".to_string())?;
        let base =
            cuobj_ffi::map_anonymous(len).map_err(|e| format!("cannot map the cache: {e}"))?;
        let p = base.as_ptr().cast::<libc::c_void>();
        // SAFETY: locking our own mapping. Only RDMA needs it (registered memory must stay).
        let pinned = register && unsafe { libc::mlock(p, len) } == 0;
        let mut arena = Arena {
            base,
            len,
            block_size,
            blocks,
            pinned,
            slabs: Vec::new(),
        };
        let max = cuobj_ffi::max_registration_size();
        let per_slab = (max / block_size).max(1) * block_size;
        let mut start = 0;
        while start < len {
            let slab_len = per_slab.min(len - start);
            let reg = if register {
                match cuobj_ffi::client() {
                    // SAFETY: the slab lies in our mapping, which outlives the registration
                    // (dropped first in Drop), and is registered once.
                    Ok(c) => match unsafe { c.register(base.as_ptr().add(start), slab_len) } {
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
                }
            } else {
                None
            };
            arena.slabs.push(Slab {
                start,
                len: slab_len,
                reg,
            });
            start += slab_len;
        }
        Ok(arena)
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

    /// Whether the memory is mlocked.
    pub fn pinned(&self) -> bool {
        self.pinned
    }

    /// Whether every slab is registered for RDMA.
    pub fn registered(&self) -> bool {
        self.slabs.iter().all(|s| s.reg.is_some())
    }

    /// The registration holding block `i` and the block's offset in it.
    pub fn registration_of(&self, i: usize) -> Option<(&Arc<Registration>, usize)> {
        let off = i * self.block_size;
        let slab = self
            .slabs
            .iter()
            .find(|s| off >= s.start && off < s.start + s.len)?;
        slab.reg.as_ref().map(|r| (r, off - slab.start))
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
    /// and reads as zeros until written again. Nothing happens on a pinned arena (RDMA keeps
    /// its registered memory); returns whether the pages went.
    ///
    /// # Safety
    /// No one may hold a slice of these blocks, nor take one until this returns.
    pub unsafe fn give_back(&self, i: usize, n: usize) -> bool {
        assert!(i + n <= self.blocks);
        if self.pinned {
            return false;
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

impl Drop for Arena {
    fn drop(&mut self) {
        // Registrations go before the memory does.
        self.slabs.clear();
        // SAFETY: unmapping our own mapping (munmap also unlocks it).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}
