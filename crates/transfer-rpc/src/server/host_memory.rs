//! Host memory of one server buffer: its own anonymous mapping between two
//! inaccessible guard pages.
//!
//! Why a mapping of its own and not a `Vec`:
//! - RSS comes back when the buffer is freed. glibc serves a large `malloc`
//!   from its heap once its dynamic mmap threshold has grown past the size
//!   (it grows on every free of a mapped chunk, up to 32 MiB), and heap
//!   memory is not returned to the kernel reliably; `munmap` always is.
//! - The memory is handed to NICs (engine registrations) and to ggml's
//!   kernels as raw pointers, and a NIC may write it at any time. No Rust
//!   reference (`&[u8]` / `&mut [u8]`) is ever formed over it: every access
//!   here is a raw copy, so a concurrent device write cannot break the
//!   aliasing rules a reference would promise.
//! - A kernel that runs off the end (or start) of its buffer faults on a
//!   guard page instead of silently corrupting a neighbouring allocation.
//! - The pages live in a memfd, so a compute worker process can map the
//!   same buffer ([`HostMemory::share_fd`], [`HostMemory::map_shared`]):
//!   graph compute can then run outside the server process, where a crash
//!   of a ggml kernel cannot take the server down (`server::isolated`).

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

const PAGE: usize = 4096;

/// One buffer's memory. Zero-filled at creation (fresh anonymous pages).
#[derive(Debug)]
pub struct HostMemory {
    /// Start of the usable bytes (one page into the mapping).
    ptr: NonNull<u8>,
    /// Usable bytes.
    len: usize,
    /// The whole mapping, guard pages included.
    map: NonNull<u8>,
    map_len: usize,
    /// The memfd holding the pages.
    fd: OwnedFd,
}

// SAFETY: the mapping is owned by this value alone and only reached through
// raw-pointer copies whose callers serialise them (the registry's per-buffer
// lock); moving or sharing the owner between threads is sound.
unsafe impl Send for HostMemory {}
// SAFETY: as above; `&HostMemory` gives no way to mutate without the caller
// holding the buffer's lock.
unsafe impl Sync for HostMemory {}

impl HostMemory {
    /// `len` zeroed bytes, page aligned, or `None` when the memfd or the
    /// mapping cannot be made (never aborts).
    pub fn zeroed(len: usize) -> Option<HostMemory> {
        let body = len.max(1).checked_next_multiple_of(PAGE)?;
        // SAFETY: the name is a NUL-terminated literal; the result is checked.
        let raw = unsafe { libc::memfd_create(c"transfer-rpc-buffer".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return None;
        }
        // SAFETY: `raw` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain syscall on our descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), i64::try_from(body).ok()?) } != 0 {
            return None;
        }
        Self::map_shared(fd, len)
    }

    /// Maps `len` bytes of the memfd `fd` (made by [`HostMemory::zeroed`],
    /// at least `len` rounded up to a page long) between two guard pages.
    pub fn map_shared(fd: OwnedFd, len: usize) -> Option<HostMemory> {
        let body = len.max(1).checked_next_multiple_of(PAGE)?;
        let map_len = body.checked_add(2 * PAGE)?;
        // SAFETY: a fresh private anonymous reservation; no existing memory
        // is touched. The result is checked against MAP_FAILED.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return None;
        }
        let map = NonNull::new(map.cast::<u8>())?;
        // SAFETY: `map + PAGE .. map + PAGE + body` lies inside the
        // reservation just made (map_len = body + 2 pages).
        let body_ptr = unsafe { map.as_ptr().add(PAGE) };
        // SAFETY: replaces the middle of our own reservation (MAP_FIXED on
        // memory we just reserved) with the memfd's pages.
        let shared = unsafe {
            libc::mmap(
                body_ptr.cast(),
                body,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd.as_raw_fd(),
                0,
            )
        };
        let mem = HostMemory {
            ptr: NonNull::new(body_ptr)?,
            len,
            map,
            map_len,
            fd,
        };
        // On failure `mem` unmaps the reservation on drop.
        (shared == body_ptr.cast::<libc::c_void>()).then_some(mem)
    }

    /// A second descriptor of the memfd, to hand to a compute worker.
    pub fn share_fd(&self) -> Option<OwnedFd> {
        self.fd.as_fd().try_clone_to_owned().ok()
    }

    /// Usable length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-byte buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start of the usable bytes (valid for `len` bytes while `self` lives).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    fn span(&self, offset: usize, len: usize) -> Option<*mut u8> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        // SAFETY: offset <= len, so the result is inside (or one past) the
        // usable range of our mapping.
        Some(unsafe { self.ptr.as_ptr().add(offset) })
    }

    /// Copies `data` to `offset`; `false` when it does not fit. The caller
    /// holds the buffer's write lock.
    pub fn copy_in(&self, offset: usize, data: &[u8]) -> bool {
        let Some(dst) = self.span(offset, data.len()) else {
            return false;
        };
        // SAFETY: `dst..dst+len` is inside the usable range (checked by
        // `span`); `data` is a distinct Rust allocation, so they cannot
        // overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
        true
    }

    /// Copies `out.len()` bytes from `offset` into `out`; `false` when the
    /// range does not fit. The caller holds the buffer's lock.
    pub fn copy_out(&self, offset: usize, out: &mut [u8]) -> bool {
        let Some(src) = self.span(offset, out.len()) else {
            return false;
        };
        // SAFETY: as in `copy_in`, the other way round.
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
        true
    }

    /// Sets `len` bytes at `offset` to `value`; `false` when out of range.
    pub fn fill(&self, offset: usize, len: usize, value: u8) -> bool {
        let Some(dst) = self.span(offset, len) else {
            return false;
        };
        // SAFETY: inside the usable range (checked by `span`).
        unsafe { std::ptr::write_bytes(dst, value, len) };
        true
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping created in `zeroed`; nothing refers to
        // it once its owner is dropped (registrations and compute hold an
        // `Arc` of the owning buffer).
        unsafe {
            libc::munmap(self.map.as_ptr().cast(), self.map_len);
        }
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_bounded_and_memory_starts_zeroed() {
        let m = HostMemory::zeroed(10).expect("map");
        let mut out = [9u8; 10];
        assert!(m.copy_out(0, &mut out));
        assert_eq!(out, [0; 10]);
        assert!(m.copy_in(6, &[1, 2, 3, 4]));
        assert!(!m.copy_in(7, &[1, 2, 3, 4]));
        assert!(!m.copy_in(usize::MAX, &[1]));
        assert!(m.fill(0, 2, 7));
        assert!(!m.fill(9, 2, 7));
        assert!(m.copy_out(0, &mut out));
        assert_eq!(out, [7, 7, 0, 0, 0, 0, 1, 2, 3, 4]);
        assert_eq!(m.as_ptr() as usize % PAGE, 0);
        let empty = HostMemory::zeroed(0).expect("map");
        assert!(empty.is_empty());
        assert!(empty.copy_in(0, &[]));
    }
}
