//! The receive pool: N buffers of L bytes posted for two-sided messages.

use crate::memory::{MemoryLocation, MemorySpan};
use crate::region::HostBuffer;

/// Called with each received message; the buffer is reposted when it returns.
pub type RecvCallback = Box<dyn Fn(&[u8]) + Send + Sync + 'static>;

pub(crate) struct RecvPool {
    buf: HostBuffer,
    count: usize,
    len: usize,
    callback: RecvCallback,
}

impl RecvPool {
    pub(crate) fn new(buf: HostBuffer, count: usize, len: usize, callback: RecvCallback) -> Self {
        Self {
            buf,
            count,
            len,
            callback,
        }
    }

    pub(crate) fn span(&self) -> MemorySpan {
        MemorySpan {
            ptr: self.buf.as_ptr(),
            len: self.buf.len(),
            location: MemoryLocation::Host,
            dmabuf_fd: None,
        }
    }

    pub(crate) fn count(&self) -> usize {
        self.count
    }

    pub(crate) fn buf_len(&self) -> usize {
        self.len
    }

    /// Buffer `token`, if it exists.
    pub(crate) fn buffer(&self, token: u64) -> Option<*mut u8> {
        let t = usize::try_from(token).ok().filter(|&t| t < self.count)?;
        Some(self.buf.as_ptr().wrapping_add(t * self.len))
    }

    /// Runs the user callback on buffer `token` holding `len` bytes.
    pub(crate) fn deliver(&self, token: u64, len: usize) {
        let Some(ptr) = self.buffer(token) else {
            return;
        };
        let len = len.min(self.len);
        // SAFETY: the buffer lies inside `buf` (token < count) and is not
        // posted to the NIC while this runs (it is reposted afterwards), so
        // nothing writes to it concurrently.
        let bytes = unsafe { std::slice::from_raw_parts(ptr, len) };
        (self.callback)(bytes);
    }
}
