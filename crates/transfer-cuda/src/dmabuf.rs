//! dma-buf export of device memory (`cuMemGetHandleForAddressRange`), the
//! handle RDMA stacks register GPU memory with (`ibv_reg_dmabuf_mr`,
//! libfabric `FI_MR_DMABUF`) instead of the legacy peer-memory module.

use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::context::CudaContext;
use crate::driver::{MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, attr};
use crate::error::{CudaError, Result};

/// A dma-buf file descriptor for a range of device memory; closed on drop.
#[derive(Debug)]
pub struct DmaBuf {
    fd: OwnedFd,
    device_addr: u64,
    len: usize,
}

impl DmaBuf {
    /// Wraps a descriptor obtained elsewhere (and, in tests, any descriptor).
    pub fn from_fd(fd: OwnedFd, device_addr: u64, len: usize) -> Self {
        Self {
            fd,
            device_addr,
            len,
        }
    }

    /// The raw descriptor (valid while `self` lives).
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Device address of the exported range.
    pub fn device_addr(&self) -> u64 {
        self.device_addr
    }

    /// Length of the exported range.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the range is empty (never for an export).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The host page size, to which dma-buf ranges must be aligned.
pub fn host_page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(v).ok().filter(|&p| p > 0).unwrap_or(4096)
}

/// Why dma-buf export is not possible on `ctx`'s device, or `None` when it is.
pub fn dmabuf_unsupported_reason(ctx: &CudaContext) -> Option<String> {
    if !ctx.driver().has_dmabuf_export() {
        return Some("the driver has no cuMemGetHandleForAddressRange (CUDA < 11.7)".into());
    }
    match ctx.attribute(attr::DMA_BUF_SUPPORTED) {
        Ok(0) => Some(
            "CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0 (needs Linux >= 5.12 and the open kernel modules or driver >= 515)".into(),
        ),
        Ok(_) => None,
        Err(e) => Some(e.to_string()),
    }
}

/// Exports `[device_addr, device_addr + len)` of `ctx`'s device as a dma-buf.
/// Both must be multiples of the host page size.
pub fn export_dmabuf(ctx: &CudaContext, device_addr: u64, len: usize) -> Result<DmaBuf> {
    const CALL: &str = "export_dmabuf";
    let page = host_page_size();
    if len == 0 || len % page != 0 || device_addr % page as u64 != 0 {
        return Err(CudaError::invalid(
            CALL,
            format!(
                "address {device_addr:#x} and length {len} must be non-zero multiples of the {page}-byte page"
            ),
        ));
    }
    if let Some(reason) = dmabuf_unsupported_reason(ctx) {
        return Err(CudaError::unsupported(CALL, reason));
    }
    let d = ctx.driver();
    let Some(get_handle) = d.api.mem_get_handle_for_address_range else {
        return Err(CudaError::unsupported(
            CALL,
            "no cuMemGetHandleForAddressRange",
        ));
    };
    ctx.bind()?;
    let mut fd: c_int = -1;
    // SAFETY: for the DMA_BUF_FD type the handle is an int the driver
    // fills; the range is checked by the driver against its allocations.
    d.check("cuMemGetHandleForAddressRange", unsafe {
        get_handle(
            (&mut fd as *mut c_int).cast::<c_void>(),
            device_addr,
            len,
            MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
            0,
        )
    })?;
    if fd < 0 {
        return Err(CudaError::unsupported(
            CALL,
            "the driver returned no descriptor",
        ));
    }
    // SAFETY: the driver handed us a fresh descriptor that nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(DmaBuf::from_fd(fd, device_addr, len))
}
