//! `fid_fabric` and `fid_domain` wrappers.
//!
//! Ownership rule for every wrapper of this crate: a child object (domain,
//! CQ, AV, endpoint, MR) must be dropped before the object it was opened
//! from. [`crate::LibfabricDomain`] guarantees it by field order; the
//! wrappers are crate-private so nothing else can break it.

use std::ptr;
use std::sync::Arc;

use transfer_core::Result;

use crate::devinfo::OwnedInfo;
use crate::library::Library;
use crate::sys;

/// Closes a fid through its vtable; returns the libfabric status. A NULL
/// fid (an object deliberately leaked, see `LibfabricDomain`'s Drop) is
/// left alone.
///
/// # Safety
/// `fid` must be NULL or a live object of a libfabric class, closed at
/// most once.
pub(crate) unsafe fn close_fid(fid: *mut sys::fid) -> i32 {
    if fid.is_null() {
        return 0;
    }
    // SAFETY: the caller guarantees `fid` is live; every fid has ops->close.
    unsafe {
        match (*fid).ops.as_ref().and_then(|ops| ops.close) {
            Some(close) => close(fid),
            None => -sys::FI_ENOSYS,
        }
    }
}

/// Calls `fid->ops->bind`.
///
/// # Safety
/// Both fids must be live objects of the same domain.
pub(crate) unsafe fn bind_fid(fid: *mut sys::fid, bfid: *mut sys::fid, flags: u64) -> i32 {
    // SAFETY: guaranteed live by the caller.
    unsafe {
        match (*fid).ops.as_ref().and_then(|ops| ops.bind) {
            Some(bind) => bind(fid, bfid, flags),
            None => -sys::FI_ENOSYS,
        }
    }
}

/// Calls `fid->ops->control(FI_ENABLE)`.
///
/// # Safety
/// `fid` must be a live endpoint or MR.
pub(crate) unsafe fn enable_fid(fid: *mut sys::fid) -> i32 {
    // SAFETY: guaranteed live by the caller.
    unsafe {
        match (*fid).ops.as_ref().and_then(|ops| ops.control) {
            Some(control) => control(fid, sys::FI_ENABLE, ptr::null_mut()),
            None => -sys::FI_ENOSYS,
        }
    }
}

/// An open fabric (`fi_fabric`), closed on drop.
pub(crate) struct Fabric {
    pub(crate) lib: Arc<Library>,
    pub(crate) ptr: *mut sys::fid_fabric,
}

impl Fabric {
    /// Opens the fabric of `info`.
    pub(crate) fn open(info: &OwnedInfo) -> Result<Self> {
        let lib = info.library().clone();
        let mut fabric: *mut sys::fid_fabric = ptr::null_mut();
        // SAFETY: `info` is a valid fi_info whose fabric_attr is valid.
        let ret =
            unsafe { (lib.fabric)((*info.as_ptr()).fabric_attr, &mut fabric, ptr::null_mut()) };
        if ret != 0 || fabric.is_null() {
            return Err(lib.error("fi_fabric", ret.min(-1) as isize));
        }
        Ok(Self { lib, ptr: fabric })
    }
}

impl Fabric {
    /// `fi_trywait` on one CQ: true when the caller may block on the CQ's
    /// wait fd, false when completions or progress are due (or the provider
    /// cannot tell).
    pub(crate) fn trywait(&self, cq: *mut sys::fid_cq) -> bool {
        let mut fids: [*mut sys::fid; 1] = [cq.cast()];
        // SAFETY: fabric and CQ are live objects of this fabric; `fids`
        // holds one valid fid pointer for the call.
        let ret = unsafe {
            match (*self.ptr).ops.as_ref().and_then(|o| o.trywait) {
                Some(f) => f(self.ptr, fids.as_mut_ptr(), 1),
                None => -sys::FI_ENOSYS,
            }
        };
        ret == 0
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        // SAFETY: opened by fi_fabric and closed once, after its children.
        unsafe { close_fid(self.ptr.cast()) };
    }
}

/// An open access domain (`fi_domain`), closed on drop.
pub(crate) struct FiDomain {
    pub(crate) lib: Arc<Library>,
    pub(crate) ptr: *mut sys::fid_domain,
}

impl FiDomain {
    /// Opens the domain of `info` on `fabric`.
    pub(crate) fn open(fabric: &Fabric, info: &OwnedInfo) -> Result<Self> {
        let lib = fabric.lib.clone();
        let mut dom: *mut sys::fid_domain = ptr::null_mut();
        // SAFETY: `fabric` is live; its ops vtable has `domain`.
        let ret = unsafe {
            match (*fabric.ptr).ops.as_ref().and_then(|o| o.domain) {
                Some(f) => f(fabric.ptr, info.as_ptr(), &mut dom, ptr::null_mut()),
                None => -sys::FI_ENOSYS,
            }
        };
        if ret != 0 || dom.is_null() {
            return Err(lib.error("fi_domain", ret.min(-1) as isize));
        }
        Ok(Self { lib, ptr: dom })
    }
}

impl Drop for FiDomain {
    fn drop(&mut self) {
        // SAFETY: opened by fi_domain and closed once, after its children.
        unsafe { close_fid(self.ptr.cast()) };
    }
}
