//! Endpoint wrapper (FI_EP_RDM): open, bind, enable, name, and the three
//! data-path calls this crate posts (`fi_recv`, `fi_send`, `fi_writemsg`).

use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;

use transfer_core::Result;

use crate::av::AddressVector;
use crate::cq::CompletionQueue;
use crate::devinfo::OwnedInfo;
use crate::fabric::{FiDomain, bind_fid, close_fid, enable_fid};
use crate::library::Library;
use crate::posting::MAX_SEGMENTS;
use crate::sys;

/// An enabled RDM endpoint, closed on drop (before its CQ and AV).
pub(crate) struct Endpoint {
    lib: Arc<Library>,
    pub(crate) ptr: *mut sys::fid_ep,
}

impl Endpoint {
    /// Opens an endpoint of `info`, binds `cq` for transmit and receive
    /// completions and `av`, and enables it.
    pub(crate) fn open(
        domain: &FiDomain,
        info: &OwnedInfo,
        cq: &CompletionQueue,
        av: &AddressVector,
    ) -> Result<Self> {
        let lib = domain.lib.clone();
        let mut ep: *mut sys::fid_ep = ptr::null_mut();
        // SAFETY: the domain is live; `info` is a valid fi_info.
        let ret = unsafe {
            match (*domain.ptr).ops.as_ref().and_then(|o| o.endpoint) {
                Some(f) => f(domain.ptr, info.as_ptr(), &mut ep, ptr::null_mut()),
                None => -sys::FI_ENOSYS,
            }
        };
        if ret != 0 || ep.is_null() {
            return Err(lib.error("fi_endpoint", ret.min(-1) as isize));
        }
        let endpoint = Self { lib, ptr: ep };
        // SAFETY: endpoint, CQ and AV are live objects of one domain.
        let ret = unsafe { bind_fid(ep.cast(), cq.ptr.cast(), sys::FI_TRANSMIT | sys::FI_RECV) };
        if ret != 0 {
            return Err(endpoint.lib.error("fi_ep_bind(cq)", ret as isize));
        }
        // SAFETY: as above.
        let ret = unsafe { bind_fid(ep.cast(), av.ptr.cast(), 0) };
        if ret != 0 {
            return Err(endpoint.lib.error("fi_ep_bind(av)", ret as isize));
        }
        // SAFETY: the endpoint is live and bound.
        let ret = unsafe { enable_fid(ep.cast()) };
        if ret != 0 {
            return Err(endpoint.lib.error("fi_enable", ret as isize));
        }
        Ok(endpoint)
    }

    /// `fi_getname`: this endpoint's raw provider address.
    pub(crate) fn name(&self) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; 256];
        loop {
            let mut len = buf.len();
            // SAFETY: the endpoint is live; `buf` has `len` writable bytes.
            let ret = unsafe {
                match (*self.ptr).cm.as_ref().and_then(|o| o.getname) {
                    Some(f) => f(self.ptr.cast(), buf.as_mut_ptr().cast(), &mut len),
                    None => -sys::FI_ENOSYS,
                }
            };
            if ret == -sys::FI_ETOOSMALL && len > buf.len() && len <= 64 * 1024 {
                buf.resize(len, 0);
                continue;
            }
            if ret != 0 {
                return Err(self.lib.error("fi_getname", ret as isize));
            }
            buf.truncate(len);
            return Ok(buf);
        }
    }

    /// `fi_recv`. Returns the raw status (0, or a negative code).
    ///
    /// # Safety
    /// `buf` must stay valid and unused until the completion for `context`
    /// is read; `desc` must describe it on FI_MR_LOCAL providers; `context`
    /// must point to a live `fi_context2` until then.
    pub(crate) unsafe fn recv(
        &mut self,
        buf: *mut u8,
        len: usize,
        desc: *mut c_void,
        context: *mut c_void,
    ) -> isize {
        // SAFETY: the endpoint is live; the rest is the caller's contract.
        unsafe {
            match (*self.ptr).msg.as_ref().and_then(|o| o.recv) {
                Some(f) => f(
                    self.ptr,
                    buf.cast(),
                    len,
                    desc,
                    sys::FI_ADDR_UNSPEC,
                    context,
                ),
                None => -(sys::FI_ENOSYS as isize),
            }
        }
    }

    /// `fi_send`. Returns the raw status.
    ///
    /// # Safety
    /// As for [`Self::recv`], for the source buffer.
    pub(crate) unsafe fn send(
        &mut self,
        buf: *const u8,
        len: usize,
        desc: *mut c_void,
        dest: sys::fi_addr_t,
        context: *mut c_void,
    ) -> isize {
        // SAFETY: the endpoint is live; the rest is the caller's contract.
        unsafe {
            match (*self.ptr).msg.as_ref().and_then(|o| o.send) {
                Some(f) => f(self.ptr, buf.cast(), len, desc, dest, context),
                None => -(sys::FI_ENOSYS as isize),
            }
        }
    }

    /// `fi_writemsg` of local segments `(address, len)` (all in the
    /// registration `desc` describes) to remote segments `(address, len)`
    /// under one key, with `FI_REMOTE_CQ_DATA` when `imm` is set, plus
    /// `extra_flags` (e.g. `FI_DELIVERY_COMPLETE`). Both lists hold the same
    /// number of bytes and at most [`MAX_SEGMENTS`] entries (within the
    /// provider's `iov_limit` and `rma_iov_limit`). Returns the raw status.
    ///
    /// # Safety
    /// As for [`Self::send`], for every local segment; `dest` must come
    /// from this endpoint's AV.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn write(
        &mut self,
        local: &[(usize, usize)],
        desc: *mut c_void,
        dest: sys::fi_addr_t,
        remote: &[(u64, usize)],
        remote_key: u64,
        imm: Option<u32>,
        context: *mut c_void,
        extra_flags: u64,
    ) -> isize {
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        let mut iov = [empty; MAX_SEGMENTS];
        let mut descs = [desc; MAX_SEGMENTS];
        let mut rma_iov = [sys::fi_rma_iov {
            addr: 0,
            len: 0,
            key: remote_key,
        }; MAX_SEGMENTS];
        let (locals, remotes) = (
            local.len().min(MAX_SEGMENTS),
            remote.len().min(MAX_SEGMENTS),
        );
        for (slot, &(at, len)) in iov.iter_mut().zip(local) {
            slot.iov_base = at as *mut c_void;
            slot.iov_len = len;
        }
        for (slot, &(addr, len)) in rma_iov.iter_mut().zip(remote) {
            slot.addr = addr;
            slot.len = len;
        }
        let msg = sys::fi_msg_rma {
            msg_iov: iov.as_ptr(),
            desc: descs.as_mut_ptr(),
            iov_count: locals,
            addr: dest,
            rma_iov: rma_iov.as_ptr(),
            rma_iov_count: remotes,
            context,
            data: u64::from(imm.unwrap_or(0)),
        };
        let flags = sys::FI_COMPLETION
            | extra_flags
            | if imm.is_some() {
                sys::FI_REMOTE_CQ_DATA
            } else {
                0
            };
        // SAFETY: the endpoint is live; `msg` and the arrays it points to
        // are valid for the call (providers copy them); buffers and context
        // are the caller's contract.
        unsafe {
            match (*self.ptr).rma.as_ref().and_then(|o| o.writemsg) {
                Some(f) => f(self.ptr, &msg, flags),
                None => -(sys::FI_ENOSYS as isize),
            }
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // SAFETY: opened by fi_endpoint, closed once before CQ, AV and domain.
        unsafe { close_fid(self.ptr.cast()) };
    }
}
