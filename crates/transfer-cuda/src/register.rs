//! Registering device memory with the engine: a dma-buf export when the
//! driver and device allow it, plain registration (the NIC driver's
//! peer-memory path) otherwise. The engine records the device
//! (`MemoryLocation::Cuda`) for routing; backends read `dmabuf_fd`.

use std::sync::Arc;

use transfer_core::{LocalRegion, MemoryLocation, MemorySpan, TransferEngine};

use crate::context::CudaContext;
use crate::dmabuf::{DmaBuf, export_dmabuf, host_page_size};
use crate::error::{CudaError, Result};

/// How a device region was handed to the backends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistrationPath {
    /// With a dma-buf descriptor (`ibv_reg_dmabuf_mr`, `FI_MR_DMABUF`).
    DmaBuf,
    /// Without one: the backend registers the address (peer-memory module).
    Plain {
        /// Why no dma-buf was used.
        reason: String,
    },
}

/// A registered device region and the dma-buf that backs it (kept open as
/// long as the registration may need it).
#[derive(Debug)]
pub struct DeviceRegion {
    /// The engine's handle.
    pub region: LocalRegion,
    /// The exported dma-buf, when one was used.
    pub dmabuf: Option<DmaBuf>,
    /// Which path was taken.
    pub path: RegistrationPath,
}

/// Registers `[device_addr, device_addr + len)` of CUDA device `device`
/// with every NIC of `group`, passing `dmabuf`'s descriptor when given.
///
/// # Safety
/// The range must be device memory of `device` that stays allocated until
/// the region is unregistered or the engine dropped (peers may write it at
/// any time), and `dmabuf`, when given, must export exactly that range.
pub unsafe fn register_cuda_span(
    engine: &TransferEngine,
    device_addr: u64,
    len: usize,
    device: u32,
    dmabuf: Option<&DmaBuf>,
    group: usize,
) -> Result<LocalRegion> {
    if let Some(b) = dmabuf {
        if b.device_addr() != device_addr || b.len() != len {
            return Err(CudaError::invalid(
                "register_cuda_span",
                "the dma-buf does not cover exactly the registered range",
            ));
        }
    }
    let span = MemorySpan {
        ptr: device_addr as usize as *mut u8,
        len,
        location: MemoryLocation::Cuda { device },
        dmabuf_fd: dmabuf.map(DmaBuf::raw_fd),
    };
    // SAFETY: forwarded contract: the span stays valid while registered.
    Ok(unsafe { engine.register_raw(span, group) }?)
}

/// Registers device memory of `ctx`'s device, exporting a dma-buf for it
/// when possible and falling back to plain registration otherwise
/// ([`DeviceRegion::path`] says which, and why).
///
/// # Safety
/// As for [`register_cuda_span`].
pub unsafe fn register_device_memory(
    engine: &TransferEngine,
    ctx: &Arc<CudaContext>,
    device_addr: u64,
    len: usize,
    group: usize,
) -> Result<DeviceRegion> {
    let page = host_page_size() as u64;
    let export = if device_addr % page != 0 || len as u64 % page != 0 {
        Err(format!(
            "range {device_addr:#x}+{len} is not aligned to the {page}-byte page (MemorySpan has no dma-buf offset)"
        ))
    } else {
        export_dmabuf(ctx, device_addr, len).map_err(|e| e.to_string())
    };
    let device = ctx.ordinal();
    match export {
        Ok(buf) => {
            // SAFETY: forwarded contract; `buf` exports exactly this range.
            let region =
                unsafe { register_cuda_span(engine, device_addr, len, device, Some(&buf), group) }?;
            Ok(DeviceRegion {
                region,
                dmabuf: Some(buf),
                path: RegistrationPath::DmaBuf,
            })
        }
        Err(reason) => {
            // SAFETY: forwarded contract.
            let region =
                unsafe { register_cuda_span(engine, device_addr, len, device, None, group) }?;
            Ok(DeviceRegion {
                region,
                dmabuf: None,
                path: RegistrationPath::Plain { reason },
            })
        }
    }
}
