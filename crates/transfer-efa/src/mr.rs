//! Memory registration wrapper (`fi_mr_reg`, bound and enabled when the
//! provider uses FI_MR_ENDPOINT).

use std::ffi::c_void;
use std::ptr;

use transfer_core::Result;

use crate::endpoint::Endpoint;
use crate::fabric::{FiDomain, bind_fid, close_fid, enable_fid};
use crate::sys;

/// Access flags every registration gets: local source of writes and sends,
/// local target of receives, remote target of writes.
pub(crate) const ACCESS: u64 = sys::FI_REMOTE_WRITE | sys::FI_WRITE | sys::FI_SEND | sys::FI_RECV;

/// A registered memory region, closed on drop.
pub(crate) struct MemoryRegistration {
    pub(crate) ptr: *mut sys::fid_mr,
    /// First byte of the registered span.
    pub(crate) addr: usize,
    /// Length of the registered span.
    pub(crate) len: usize,
}

impl MemoryRegistration {
    /// Registers `[addr, addr + len)` with `requested_key` (ignored by
    /// FI_MR_PROV_KEY providers). With `endpoint` (FI_MR_ENDPOINT mode) the
    /// region is bound to it and enabled.
    pub(crate) fn register(
        domain: &FiDomain,
        addr: *const u8,
        len: usize,
        requested_key: u64,
        endpoint: Option<&Endpoint>,
    ) -> Result<Self> {
        let mut mr: *mut sys::fid_mr = ptr::null_mut();
        // SAFETY: the domain is live; the caller vouches that the span is
        // memory it owns for the registration's lifetime.
        let ret = unsafe {
            match (*domain.ptr).mr.as_ref().and_then(|o| o.reg) {
                Some(f) => f(
                    domain.ptr.cast(),
                    addr.cast(),
                    len,
                    ACCESS,
                    0,
                    requested_key,
                    0,
                    &mut mr,
                    ptr::null_mut(),
                ),
                None => -sys::FI_ENOSYS,
            }
        };
        if ret != 0 || mr.is_null() {
            return Err(domain.lib.error("fi_mr_reg", ret.min(-1) as isize));
        }
        Self::finish(domain, mr, addr, len, endpoint)
    }

    /// Wraps a fresh MR, binding and enabling it for FI_MR_ENDPOINT.
    fn finish(
        domain: &FiDomain,
        mr: *mut sys::fid_mr,
        addr: *const u8,
        len: usize,
        endpoint: Option<&Endpoint>,
    ) -> Result<Self> {
        let reg = Self {
            ptr: mr,
            addr: addr as usize,
            len,
        };
        if let Some(ep) = endpoint {
            // SAFETY: MR and endpoint are live objects of the same domain.
            let ret = unsafe { bind_fid(mr.cast(), ep.ptr.cast(), 0) };
            if ret != 0 {
                return Err(domain.lib.error("fi_mr_bind", ret as isize));
            }
            // SAFETY: the MR is live and bound.
            let ret = unsafe { enable_fid(mr.cast()) };
            if ret != 0 {
                return Err(domain.lib.error("fi_mr_enable", ret as isize));
            }
        }
        Ok(reg)
    }

    /// Registers CUDA device memory of `device` with `fi_mr_regattr`
    /// (`FI_HMEM_CUDA`); needs a domain opened with FI_HMEM.
    pub(crate) fn register_cuda(
        domain: &FiDomain,
        addr: *const u8,
        len: usize,
        device: u32,
        requested_key: u64,
        endpoint: Option<&Endpoint>,
    ) -> Result<Self> {
        let iov = libc::iovec {
            iov_base: addr.cast_mut().cast(),
            iov_len: len,
        };
        let attr = sys::fi_mr_attr {
            mr_iov: &iov,
            iov_count: 1,
            access: ACCESS,
            offset: 0,
            requested_key,
            context: ptr::null_mut(),
            auth_key_size: 0,
            auth_key: ptr::null_mut(),
            iface: sys::FI_HMEM_CUDA,
            device: u64::from(device),
        };
        let mut mr: *mut sys::fid_mr = ptr::null_mut();
        // SAFETY: the domain is live; `attr` and the iovec it points to are
        // valid for the call; the caller vouches for the device span.
        let ret = unsafe {
            match (*domain.ptr).mr.as_ref().and_then(|o| o.regattr) {
                Some(f) => f(domain.ptr.cast(), &attr, 0, &mut mr),
                None => -sys::FI_ENOSYS,
            }
        };
        if ret != 0 || mr.is_null() {
            return Err(domain.lib.error("fi_mr_regattr", ret.min(-1) as isize));
        }
        Self::finish(domain, mr, addr, len, endpoint)
    }

    /// `fi_mr_desc`: the local descriptor for FI_MR_LOCAL providers.
    pub(crate) fn desc(&self) -> *mut c_void {
        // SAFETY: the MR is live.
        unsafe { (*self.ptr).mem_desc }
    }

    /// `fi_mr_key`: the remote key.
    pub(crate) fn key(&self) -> u64 {
        // SAFETY: the MR is live.
        unsafe { (*self.ptr).key }
    }

    /// Whether `[ptr, ptr + len)` lies inside the region.
    pub(crate) fn contains(&self, ptr: usize, len: usize) -> bool {
        ptr >= self.addr
            && ptr
                .checked_add(len)
                .is_some_and(|end| end <= self.addr.saturating_add(self.len))
    }
}

impl Drop for MemoryRegistration {
    fn drop(&mut self) {
        // SAFETY: registered by fi_mr_reg, closed once before the domain.
        unsafe { close_fid(self.ptr.cast()) };
    }
}
