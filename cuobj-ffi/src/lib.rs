//! Safe binding of NVIDIA cuObject's client (S3-over-RDMA), through a C++ shim.
//!
//! One client per process ([`client`]); memory is registered ([`Registration`], deregistered on
//! drop) and tokens are minted for sub-ranges of a registration ([`Token`], freed on drop). The
//! provider is chosen at build time: NVIDIA's libcuobjclient when its SDK is found, else the
//! project's loopback implementation (its token format is `s3rdma_proto::loopback_token`), with
//! the same API.

#![cfg_attr(test, allow(clippy::too_many_lines))]

use std::ffi::CStr;
use std::fmt;
use std::marker::PhantomData;
use std::os::raw::c_char;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

static LIVE_REGISTRATIONS: AtomicUsize = AtomicUsize::new(0);
static LIVE_REGISTERED_BYTES: AtomicUsize = AtomicUsize::new(0);
static LIVE_TOKENS: AtomicUsize = AtomicUsize::new(0);

/// What this process holds of cuObject right now: registrations (and their bytes) not yet
/// deregistered, tokens not yet freed. All three are 0 once everything is released.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Live {
    pub registrations: usize,
    pub registered_bytes: usize,
    pub tokens: usize,
}

/// The registrations and tokens alive in this process.
pub fn live() -> Live {
    Live {
        registrations: LIVE_REGISTRATIONS.load(Ordering::Relaxed),
        registered_bytes: LIVE_REGISTERED_BYTES.load(Ordering::Relaxed),
        tokens: LIVE_TOKENS.load(Ordering::Relaxed),
    }
}

mod init;
pub use init::{client_within, library, rdma_device, ASSUME_DEVICE_ENV, DEFAULT_DEADLINE};

#[allow(non_camel_case_types, non_upper_case_globals, dead_code)]
mod sys {
    include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
}

/// Which implementation of cuObjClient is linked in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    /// NVIDIA's libcuobjclient: real RDMA over a ConnectX NIC.
    Nvidia,
    /// The project's loopback provider, understood only by `s3rdma-endpoint`.
    Loopback,
}

impl Provider {
    pub fn name(self) -> &'static str {
        match self {
            Provider::Nvidia => "nvidia",
            Provider::Loopback => "loopback",
        }
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The provider this build uses.
pub fn provider() -> Provider {
    // SAFETY: returns a static NUL-terminated string.
    let name = unsafe { CStr::from_ptr(sys::s3rdma_cuobj_provider()) };
    if name.to_bytes() == b"nvidia" {
        Provider::Nvidia
    } else {
        Provider::Loopback
    }
}

/// The largest registration (and token window): min(CUOBJ_MAX_MEMORY_REG_SIZE, 4 GiB - 64 KiB)
/// — library 1.2+ refuses more than 0xFFFF0000 bytes whatever its header says (1.0's says
/// 4 GiB), and a header without the macro gets that limit too.
pub fn max_registration_size() -> usize {
    // SAFETY: no arguments, no state.
    let n = unsafe { sys::s3rdma_cuobj_max_registration_size() };
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// Direction of a transfer, from the client's point of view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// The server writes into our memory (GetObject).
    Get,
    /// The server reads from our memory (PutObject, UploadPart).
    Put,
}

/// Where a pointer's memory lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryType {
    System,
    CudaManaged,
    CudaDevice,
    Unknown,
    Invalid,
}

/// The memory type of `ptr` as cuObject sees it.
pub fn memory_type(ptr: *const u8) -> MemoryType {
    // SAFETY: the call only inspects the pointer value.
    match unsafe { sys::s3rdma_cuobj_memory_type(ptr.cast()) } as u32 {
        sys::S3RDMA_CUOBJ_MEM_SYSTEM => MemoryType::System,
        sys::S3RDMA_CUOBJ_MEM_CUDA_MANAGED => MemoryType::CudaManaged,
        sys::S3RDMA_CUOBJ_MEM_CUDA_DEVICE => MemoryType::CudaDevice,
        sys::S3RDMA_CUOBJ_MEM_UNKNOWN => MemoryType::Unknown,
        _ => MemoryType::Invalid,
    }
}

/// A failed cuObject call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error(pub String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

/// The process's cuObject client.
pub struct Client {
    raw: NonNull<sys::s3rdma_cuobj_client>,
}

// SAFETY: cuObjClient is documented for use from many threads (callbacks run on others); the
// shim serialises nothing itself, and the loopback provider locks its own state.
unsafe impl Send for Client {}
// SAFETY: as above.
unsafe impl Sync for Client {}

/// The one client of this process, constructed on first use (never twice: per-call
/// construction is racy in the real library) within [`DEFAULT_DEADLINE`]; see [`client_within`].
pub fn client() -> Result<&'static Client, Error> {
    client_within(DEFAULT_DEADLINE)
}

impl Client {
    /// Whether a usable RDMA device was found (for the loopback provider: whether this process
    /// can identify itself to the loopback endpoint).
    pub fn is_connected(&self) -> bool {
        // SAFETY: valid client pointer.
        unsafe { sys::s3rdma_cuobj_is_connected(self.raw.as_ptr()) == 1 }
    }

    /// Register (pin) `len` bytes at `ptr`.
    ///
    /// # Safety
    /// The memory must stay mapped and valid until the returned [`Registration`] is dropped,
    /// and must not be registered twice.
    pub unsafe fn register(&'static self, ptr: *mut u8, len: usize) -> Result<Registration, Error> {
        if ptr.is_null() || len == 0 {
            return Err(Error("cannot register an empty buffer".into()));
        }
        let max = max_registration_size();
        if len > max {
            return Err(Error(format!(
                "buffer of {len} bytes exceeds the cuObject registration limit of {max} bytes; split it"
            )));
        }
        // SAFETY: the caller guarantees the memory; the client pointer is valid.
        let rc = unsafe { sys::s3rdma_cuobj_register(self.raw.as_ptr(), ptr.cast(), len) };
        if rc as u32 != sys::S3RDMA_CUOBJ_OK {
            return Err(Error(format!(
                "cuMemObjGetDescriptor failed for {len} bytes at {ptr:p} (memory type {:?}; RLIMIT_MEMLOCK may be too low)",
                memory_type(ptr)
            )));
        }
        LIVE_REGISTRATIONS.fetch_add(1, Ordering::Relaxed);
        LIVE_REGISTERED_BYTES.fetch_add(len, Ordering::Relaxed);
        Ok(Registration {
            client: self,
            ptr,
            len,
        })
    }
}

/// Registered memory; deregistered on drop. Drop it only once no transfer uses it.
pub struct Registration {
    client: &'static Client,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a registration is an address range plus the process-wide client.
unsafe impl Send for Registration {}
// SAFETY: minting tokens from several threads is allowed.
unsafe impl Sync for Registration {}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Registration({:p}, {} bytes)", self.ptr, self.len)
    }
}

impl Registration {
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Mint a token for `len` bytes at `offset` into the registration.
    pub fn token(&self, offset: usize, len: usize, op: Op) -> Result<Token<'_>, Error> {
        if len == 0 || offset.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(Error(format!(
                "token window {offset}+{len} is outside the {}-byte registration",
                self.len
            )));
        }
        let kind = match op {
            Op::Get => sys::S3RDMA_CUOBJ_GET,
            Op::Put => sys::S3RDMA_CUOBJ_PUT,
        } as i32;
        let mut out: *mut c_char = std::ptr::null_mut();
        // SAFETY: valid client, registered pointer, out-pointer to a local.
        let rc = unsafe {
            sys::s3rdma_cuobj_get_token(
                self.client.raw.as_ptr(),
                self.ptr.cast(),
                len,
                offset,
                kind,
                &mut out,
            )
        };
        if rc as u32 != sys::S3RDMA_CUOBJ_OK || out.is_null() {
            return Err(Error(format!(
                "cuMemObjGetRDMAToken failed for {offset}+{len}"
            )));
        }
        // SAFETY: the library returned a NUL-terminated string it owns until put_token.
        let text = unsafe { CStr::from_ptr(out) }.to_str().map(str::to_owned);
        match text {
            Ok(text) => {
                LIVE_TOKENS.fetch_add(1, Ordering::Relaxed);
                Ok(Token {
                    client: self.client,
                    raw: out,
                    text,
                    _reg: PhantomData,
                })
            }
            Err(_) => {
                // SAFETY: returning the string we were given.
                unsafe { sys::s3rdma_cuobj_put_token(self.client.raw.as_ptr(), out) };
                Err(Error("cuObject returned a token that is not ASCII".into()))
            }
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // SAFETY: the pointer is the start of a live registration.
        unsafe { sys::s3rdma_cuobj_deregister(self.client.raw.as_ptr(), self.ptr.cast()) };
        LIVE_REGISTRATIONS.fetch_sub(1, Ordering::Relaxed);
        LIVE_REGISTERED_BYTES.fetch_sub(self.len, Ordering::Relaxed);
    }
}

/// A token (RDMA descriptor) for one transfer; freed on drop. Send it verbatim in
/// `x-amz-rdma-token`.
pub struct Token<'r> {
    client: &'static Client,
    raw: *mut c_char,
    text: String,
    _reg: PhantomData<&'r Registration>,
}

// SAFETY: the token string is owned by this value until drop.
unsafe impl Send for Token<'_> {}
// SAFETY: only read through &self.
unsafe impl Sync for Token<'_> {}

impl Token<'_> {
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl fmt::Debug for Token<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({})", self.text)
    }
}

impl Drop for Token<'_> {
    fn drop(&mut self) {
        // SAFETY: the original pointer from get_token, freed once.
        unsafe { sys::s3rdma_cuobj_put_token(self.client.raw.as_ptr(), self.raw) };
        LIVE_TOKENS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A token that keeps its registration alive: for holders that must be `'static` (an SDK
/// interceptor that mints a fresh token on every attempt).
pub struct OwnedToken {
    // Field order matters: the token is freed before the registration may go.
    token: Token<'static>,
    _reg: std::sync::Arc<Registration>,
}

impl OwnedToken {
    /// Mint a token for `len` bytes at `offset` into `reg`.
    pub fn mint(
        reg: &std::sync::Arc<Registration>,
        offset: usize,
        len: usize,
        op: Op,
    ) -> Result<Self, Error> {
        let token = reg.token(offset, len, op)?;
        // SAFETY: the token borrows the registration, which the Arc stored beside it keeps alive
        // for as long as the token exists (fields drop in declaration order).
        let token: Token<'static> =
            unsafe { std::mem::transmute::<Token<'_>, Token<'static>>(token) };
        Ok(OwnedToken {
            token,
            _reg: reg.clone(),
        })
    }

    pub fn as_str(&self) -> &str {
        self.token.as_str()
    }
}

impl fmt::Debug for OwnedToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.token.fmt(f)
    }
}

/// Map `len` zeroed, page-aligned bytes of anonymous private memory (unmap with `munmap`):
/// the memory that registrations are made of.
pub fn map_anonymous(len: usize) -> Result<NonNull<u8>, Error> {
    // SAFETY: anonymous private mapping; checked for MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(Error(format!(
            "mmap of {len} bytes failed: {}",
            std::io::Error::last_os_error()
        )));
    }
    NonNull::new(p.cast::<u8>()).ok_or_else(|| Error("mmap returned NULL".into()))
}

/// Page-aligned anonymous memory, registered with cuObject; unmapped after deregistration.
/// Drop it only when no transfer into it is in flight.
pub struct RegisteredBuffer {
    reg: Option<std::sync::Arc<Registration>>,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: owns its mapping.
unsafe impl Send for RegisteredBuffer {}
// SAFETY: shared access is read-only through &self.
unsafe impl Sync for RegisteredBuffer {}

impl RegisteredBuffer {
    /// Map and register `len` zeroed bytes.
    pub fn new(len: usize) -> Result<Self, Error> {
        let client = client()?;
        if len == 0 {
            return Err(Error("cannot register an empty buffer".into()));
        }
        let ptr = map_anonymous(len)?;
        let p = ptr.as_ptr().cast::<libc::c_void>();
        // SAFETY: the mapping lives until Drop, after the registration is dropped.
        match unsafe { client.register(ptr.as_ptr(), len) } {
            Ok(reg) => Ok(RegisteredBuffer {
                reg: Some(std::sync::Arc::new(reg)),
                ptr,
                len,
            }),
            Err(e) => {
                // SAFETY: unmapping what we mapped.
                unsafe { libc::munmap(p, len) };
                Err(e)
            }
        }
    }

    pub fn registration(&self) -> &std::sync::Arc<Registration> {
        self.reg.as_ref().expect("registration lives until drop")
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is valid for len bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The registration and the writable bytes, borrowed together (for an RDMA GET into it).
    pub fn split_for_write(&mut self) -> (&std::sync::Arc<Registration>, &mut [u8]) {
        let reg = self.reg.as_ref().expect("registration lives until drop");
        // SAFETY: unique access through &mut self; the registration is a separate field.
        let slice = unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) };
        (reg, slice)
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: unique access through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl AsRef<[u8]> for RegisteredBuffer {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl Drop for RegisteredBuffer {
    fn drop(&mut self) {
        drop(self.reg.take());
        // SAFETY: unmapping our own mapping after deregistration.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The live counters are process-wide: tests that register run one at a time.
    #[cfg(cuobj_provider = "loopback")]
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[cfg(cuobj_provider = "loopback")]
    fn serial() -> std::sync::MutexGuard<'static, ()> {
        SERIAL.lock().unwrap_or_else(|e| e.into_inner())
    }

    // Registration needs a client: with NVIDIA's library, an RDMA device (none in CI).
    #[cfg(cuobj_provider = "loopback")]
    #[test]
    fn live_counts_follow_registrations_and_tokens() {
        let _s = serial();
        let before = live();
        let buf = RegisteredBuffer::new(1 << 16).expect("register");
        let t1 = buf.registration().token(0, 4096, Op::Get).expect("token");
        let t2 = OwnedToken::mint(buf.registration(), 4096, 4096, Op::Put).expect("token");
        let now = live();
        assert_eq!(now.registrations, before.registrations + 1);
        assert_eq!(now.registered_bytes, before.registered_bytes + (1 << 16));
        assert_eq!(now.tokens, before.tokens + 2);
        drop(t1);
        drop(buf);
        // The owned token keeps its registration alive until it is freed.
        assert_eq!(live().registrations, before.registrations + 1);
        drop(t2);
        assert_eq!(live(), before);
    }

    #[cfg(cuobj_provider = "nvidia")]
    #[test]
    fn nvidia_library_loaded_and_no_client_without_a_device() {
        assert_eq!(provider(), Provider::Nvidia);
        let (path, version) = library().expect("libcuobjclient is loaded");
        assert!(
            path.to_string_lossy().contains("libcuobjclient.so"),
            "{path:?}"
        );
        assert!(version.starts_with("1."), "{version}");
        if let Err(why) = rdma_device() {
            let started = std::time::Instant::now();
            let Err(e) = client() else {
                panic!("a client without a device: {why}");
            };
            assert_eq!(e.0, why);
            assert!(started.elapsed() < std::time::Duration::from_secs(1));
        }
    }

    #[test]
    fn limits_and_provider() {
        assert_eq!(max_registration_size(), 4 * 1024 * 1024 * 1024 - 64 * 1024);
        #[cfg(cuobj_provider = "loopback")]
        assert_eq!(provider(), Provider::Loopback);
        assert_eq!(memory_type(std::ptr::null()), MemoryType::Invalid);
        let x = 0u8;
        assert_eq!(memory_type(&x), MemoryType::System);
    }

    #[cfg(cuobj_provider = "loopback")]
    #[test]
    fn loopback_tokens_have_the_dc_v1_shape_and_window() {
        let _s = serial();
        let c = client().expect("client");
        assert!(c.is_connected());
        let mut buf = RegisteredBuffer::new(1 << 20).expect("register");
        buf.as_mut_slice()[4096] = 7;
        let reg = buf.registration();
        let t = reg.token(4096, 8192, Op::Get).expect("token");
        let s = t.as_str();
        assert_eq!(s.len(), 81, "{s}");
        let fields: Vec<&str> = s.split(':').collect();
        assert_eq!(fields.len(), 7);
        assert_eq!(
            fields.iter().map(|f| f.len()).collect::<Vec<_>>(),
            [16, 8, 8, 4, 6, 1, 32]
        );
        assert!(s
            .chars()
            .all(|c| c == ':' || c.is_ascii_digit() || ('a'..='f').contains(&c)));
        let parsed = s3rdma_proto::loopback_token::LoopbackToken::parse(s).expect("parse");
        assert_eq!(parsed.addr, reg.as_ptr() as u64 + 4096);
        assert_eq!(parsed.size, 8192);
        assert_eq!(parsed.pid, std::process::id());
        assert!(parsed.is_live_process());
        // Windows outside the registration are refused, by us and by the provider.
        assert!(reg.token(0, 0, Op::Put).is_err());
        assert!(reg.token((1 << 20) - 10, 11, Op::Put).is_err());
        assert!(reg.token(usize::MAX, 2, Op::Put).is_err());
    }

    #[cfg(cuobj_provider = "loopback")]
    #[test]
    fn oversized_and_double_registrations_fail() {
        let _s = serial();
        let c = client().expect("client");
        let mut v = vec![0u8; 4096];
        // SAFETY: no registration is created (size check fails first).
        let e = unsafe { c.register(v.as_mut_ptr(), max_registration_size() + 1) }.unwrap_err();
        assert!(e.0.contains("split"), "{e}");
        let buf = RegisteredBuffer::new(8192).expect("register");
        // SAFETY: the second registration must be refused; nothing is left registered.
        let again = unsafe { c.register(buf.registration().as_ptr(), 4096) };
        #[cfg(cuobj_provider = "loopback")]
        assert!(again.is_err(), "overlapping registration accepted");
        drop(again);
    }
}
