//! Completion queue wrapper (`fi_cq_open`, FI_CQ_FORMAT_DATA).

use std::ffi::{CStr, c_char};
use std::ptr;
use std::sync::Arc;

use transfer_core::Result;

use crate::fabric::{FiDomain, close_fid};
use crate::library::Library;
use crate::sys;

/// What one `fi_cq_read` call produced.
pub(crate) enum CqRead {
    /// This many entries were written to the buffer.
    Entries(usize),
    /// Nothing available.
    Empty,
    /// An error entry is waiting: read it with [`CompletionQueue::read_error`].
    ErrorAvailable,
    /// The read itself failed (a negative code other than EAGAIN).
    Failed,
}

/// A completion queue, closed on drop.
pub(crate) struct CompletionQueue {
    lib: Arc<Library>,
    pub(crate) ptr: *mut sys::fid_cq,
    /// The CQ's wait file descriptor, when opened with FI_WAIT_FD.
    pub(crate) wait_fd: Option<i32>,
}

impl CompletionQueue {
    /// Opens a CQ of `size` entries in FI_CQ_FORMAT_DATA. With `wait_fd`
    /// it first asks for an FI_WAIT_FD wait object and falls back to none
    /// when the provider refuses one.
    pub(crate) fn open(domain: &FiDomain, size: usize, wait_fd: bool) -> Result<Self> {
        if wait_fd {
            if let Ok(mut cq) = Self::open_with(domain, size, sys::FI_WAIT_FD) {
                let mut fd: libc::c_int = -1;
                // SAFETY: the CQ is live; FI_GETWAIT on an FI_WAIT_FD CQ
                // writes one int.
                let ret = unsafe {
                    match (*cq.ptr).fid.ops.as_ref().and_then(|o| o.control) {
                        Some(f) => f(
                            cq.ptr.cast(),
                            sys::FI_GETWAIT,
                            (&mut fd as *mut libc::c_int).cast(),
                        ),
                        None => -sys::FI_ENOSYS,
                    }
                };
                if ret == 0 && fd >= 0 {
                    cq.wait_fd = Some(fd);
                    return Ok(cq);
                }
            }
        }
        Self::open_with(domain, size, sys::FI_WAIT_NONE)
    }

    fn open_with(domain: &FiDomain, size: usize, wait_obj: i32) -> Result<Self> {
        let mut attr = sys::fi_cq_attr {
            size,
            flags: 0,
            format: sys::FI_CQ_FORMAT_DATA,
            wait_obj,
            signaling_vector: 0,
            wait_cond: 0,
            wait_set: ptr::null_mut(),
        };
        let mut cq: *mut sys::fid_cq = ptr::null_mut();
        // SAFETY: `domain` is live; attr and out-pointer are valid.
        let ret = unsafe {
            match (*domain.ptr).ops.as_ref().and_then(|o| o.cq_open) {
                Some(f) => f(domain.ptr, &mut attr, &mut cq, ptr::null_mut()),
                None => -sys::FI_ENOSYS,
            }
        };
        if ret != 0 || cq.is_null() {
            return Err(domain.lib.error("fi_cq_open", ret.min(-1) as isize));
        }
        Ok(Self {
            lib: domain.lib.clone(),
            ptr: cq,
            wait_fd: None,
        })
    }

    /// `fi_cq_read` into `buf`.
    pub(crate) fn read(&mut self, buf: &mut [sys::fi_cq_data_entry]) -> CqRead {
        // SAFETY: the CQ is live and was opened with FI_CQ_FORMAT_DATA, so
        // each entry written is one fi_cq_data_entry; `buf` has room for
        // `buf.len()` of them.
        let ret = unsafe {
            match (*self.ptr).ops.as_ref().and_then(|o| o.read) {
                Some(f) => f(self.ptr, buf.as_mut_ptr().cast(), buf.len()),
                None => -(sys::FI_ENOSYS as isize),
            }
        };
        match ret {
            n if n > 0 => CqRead::Entries(n as usize),
            0 => CqRead::Empty,
            n if n == -(sys::FI_EAGAIN as isize) => CqRead::Empty,
            n if n == -(sys::FI_EAVAIL as isize) => CqRead::ErrorAvailable,
            _ => CqRead::Failed,
        }
    }

    /// `fi_cq_readerr`: the next error entry and its provider message, or
    /// `None` when there is none.
    pub(crate) fn read_error(&mut self) -> Option<(sys::fi_cq_err_entry, String)> {
        // SAFETY: fi_cq_err_entry is plain data; all-zero is a valid value
        // (err_data NULL / size 0 asks the provider for its own buffer).
        let mut entry: sys::fi_cq_err_entry = unsafe { std::mem::zeroed() };
        // SAFETY: the CQ is live; `entry` is a valid out-buffer.
        let ret = unsafe {
            match (*self.ptr).ops.as_ref().and_then(|o| o.readerr) {
                Some(f) => f(self.ptr, &mut entry, 0),
                None => -(sys::FI_ENOSYS as isize),
            }
        };
        if ret <= 0 {
            return None;
        }
        let message = self.strerror(&entry);
        Some((entry, message))
    }

    /// `fi_cq_strerror` (provider detail) joined with `fi_strerror(err)`.
    fn strerror(&self, entry: &sys::fi_cq_err_entry) -> String {
        let generic = self.lib.strerror(entry.err);
        let mut buf = [0 as c_char; 256];
        // SAFETY: the CQ is live; err_data is the provider's own buffer,
        // valid until the next read; `buf` has `buf.len()` bytes.
        let p = unsafe {
            match (*self.ptr).ops.as_ref().and_then(|o| o.strerror) {
                Some(f) => f(
                    self.ptr,
                    entry.prov_errno,
                    entry.err_data,
                    buf.as_mut_ptr(),
                    buf.len(),
                ),
                None => ptr::null(),
            }
        };
        if p.is_null() {
            return generic;
        }
        // SAFETY: fi_cq_strerror returns a NUL-terminated string (ours or static).
        let detail = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
        if detail.is_empty() || detail == generic {
            generic
        } else {
            format!("{generic} ({detail}, prov_errno {})", entry.prov_errno)
        }
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: opened by fi_cq_open, closed once after the endpoint.
        unsafe { close_fid(self.ptr.cast()) };
    }
}
