//! Address vector wrapper (`fi_av_open`, insert, remove).

use std::ptr;
use std::sync::Arc;

use transfer_core::Result;

use crate::fabric::{FiDomain, close_fid};
use crate::library::Library;
use crate::sys;

/// An address vector, closed on drop.
pub(crate) struct AddressVector {
    lib: Arc<Library>,
    pub(crate) ptr: *mut sys::fid_av,
}

impl AddressVector {
    /// Opens an AV of `av_type` (FI_AV_TABLE when the provider left it open).
    pub(crate) fn open(domain: &FiDomain, av_type: i32) -> Result<Self> {
        let mut attr = sys::fi_av_attr {
            type_: if av_type == sys::FI_AV_MAP {
                sys::FI_AV_MAP
            } else {
                sys::FI_AV_TABLE
            },
            rx_ctx_bits: 0,
            count: 0,
            ep_per_node: 0,
            name: ptr::null(),
            map_addr: ptr::null_mut(),
            flags: 0,
        };
        let mut av: *mut sys::fid_av = ptr::null_mut();
        // SAFETY: `domain` is live; attr and out-pointer are valid.
        let ret = unsafe {
            match (*domain.ptr).ops.as_ref().and_then(|o| o.av_open) {
                Some(f) => f(domain.ptr, &mut attr, &mut av, ptr::null_mut()),
                None => -sys::FI_ENOSYS,
            }
        };
        if ret != 0 || av.is_null() {
            return Err(domain.lib.error("fi_av_open", ret.min(-1) as isize));
        }
        Ok(Self {
            lib: domain.lib.clone(),
            ptr: av,
        })
    }

    /// Inserts one raw provider address. The caller checked its length and
    /// format against this provider's (see [`crate::address`]).
    pub(crate) fn insert(&mut self, raw: &[u8]) -> Result<sys::fi_addr_t> {
        let mut fi_addr: sys::fi_addr_t = sys::FI_ADDR_NOTAVAIL;
        // SAFETY: the AV is live; `raw` holds one address of this provider's
        // format and length (validated by the caller); synchronous insert
        // (no EQ bound), so `fi_addr` is written before return.
        let ret = unsafe {
            match (*self.ptr).ops.as_ref().and_then(|o| o.insert) {
                Some(f) => f(
                    self.ptr,
                    raw.as_ptr().cast(),
                    1,
                    &mut fi_addr,
                    0,
                    ptr::null_mut(),
                ),
                None => -sys::FI_ENOSYS,
            }
        };
        if ret != 1 || fi_addr == sys::FI_ADDR_NOTAVAIL {
            let code = if ret < 0 {
                ret as isize
            } else {
                -(libc::EINVAL as isize)
            };
            return Err(self.lib.error("fi_av_insert", code));
        }
        Ok(fi_addr)
    }

    /// Removes one address.
    pub(crate) fn remove(&mut self, mut fi_addr: sys::fi_addr_t) -> Result<()> {
        // SAFETY: the AV is live; `fi_addr` came from insert on this AV.
        let ret = unsafe {
            match (*self.ptr).ops.as_ref().and_then(|o| o.remove) {
                Some(f) => f(self.ptr, &mut fi_addr, 1, 0),
                None => -sys::FI_ENOSYS,
            }
        };
        if ret != 0 {
            return Err(self.lib.error("fi_av_remove", ret as isize));
        }
        Ok(())
    }
}

impl Drop for AddressVector {
    fn drop(&mut self) {
        // SAFETY: opened by fi_av_open, closed once after the endpoint.
        unsafe { close_fid(self.ptr.cast()) };
    }
}
