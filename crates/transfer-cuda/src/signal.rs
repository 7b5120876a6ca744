//! Signalling a watcher slot from a stream: a PTX kernel (default) or a
//! stream memory operation (`cuStreamWriteValue64`).
//!
//! The kernel is the default: it works on every driver and device from
//! `sm_60` on (no capability attribute to check), it can *add* (so the slot
//! is a counter and the producer needs no host-side bookkeeping), it fences
//! system-wide before the bump, and a kernel launch is always capturable
//! into a CUDA graph. `cuStreamWriteValue64` needs no module and no SM, but
//! it only stores an absolute value, needs
//! `CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS`, and is capturable
//! only on recent drivers (batch mem-op graph nodes).

use std::sync::Arc;

use crate::context::CudaContext;
use crate::device::Stream;
use crate::driver::attr;
use crate::error::{CudaError, Result};
use crate::kernels::DeviceKernels;

/// How a stream writes a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SignalMethod {
    /// The embedded PTX kernels (`transfer_slot_add` / `transfer_slot_set`).
    #[default]
    Kernel,
    /// `cuStreamWriteValue64` (absolute values only).
    StreamWriteValue,
}

/// Writes watcher slots from streams of one device.
pub struct SlotSignal {
    ctx: Arc<CudaContext>,
    method: SignalMethod,
    kernels: Option<DeviceKernels>,
}

impl std::fmt::Debug for SlotSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotSignal")
            .field("device", &self.ctx.ordinal())
            .field("method", &self.method)
            .finish()
    }
}

impl SlotSignal {
    /// Prepares `method` on `ctx`'s device: loads the kernels, or checks
    /// that stream memory operations are available.
    pub fn new(ctx: &Arc<CudaContext>, method: SignalMethod) -> Result<Self> {
        const CALL: &str = "SlotSignal::new";
        let kernels = match method {
            SignalMethod::Kernel => Some(DeviceKernels::load(ctx)?),
            SignalMethod::StreamWriteValue => {
                if !ctx.driver().has_stream_write_value() {
                    return Err(CudaError::unsupported(
                        CALL,
                        "the driver has no cuStreamWriteValue64",
                    ));
                }
                if ctx.attribute(attr::CAN_USE_64_BIT_STREAM_MEM_OPS)? == 0 {
                    return Err(CudaError::unsupported(
                        CALL,
                        "the device cannot use 64-bit stream memory operations",
                    ));
                }
                None
            }
        };
        Ok(Self {
            ctx: ctx.clone(),
            method,
            kernels,
        })
    }

    /// The method in use.
    pub fn method(&self) -> SignalMethod {
        self.method
    }

    /// Queues `*slot += delta` on `stream` (kernel method only).
    ///
    /// # Safety
    /// `slot` must be a device address of 8 writable, 8-aligned bytes (e.g.
    /// [`crate::SlotAddr::device`]) that stays valid until the stream ran it.
    pub unsafe fn add(&self, stream: &Stream, slot: u64, delta: u64) -> Result<()> {
        match &self.kernels {
            // SAFETY: forwarded contract.
            Some(k) => unsafe { k.slot_add(stream, slot, delta) },
            None => Err(CudaError::unsupported(
                "SlotSignal::add",
                "cuStreamWriteValue64 can only store absolute values; use set",
            )),
        }
    }

    /// Queues `*slot = value` on `stream`.
    ///
    /// # Safety
    /// As for [`SlotSignal::add`].
    pub unsafe fn set(&self, stream: &Stream, slot: u64, value: u64) -> Result<()> {
        match &self.kernels {
            // SAFETY: forwarded contract.
            Some(k) => unsafe { k.slot_set(stream, slot, value) },
            None => {
                let d = self.ctx.driver();
                let Some(write) = d.api.stream_write_value64 else {
                    return Err(CudaError::unsupported(
                        "SlotSignal::set",
                        "the driver has no cuStreamWriteValue64",
                    ));
                };
                self.ctx.bind()?;
                // SAFETY: `stream` is a stream of this context; the caller
                // vouches for `slot`; flags 0 = CU_STREAM_WRITE_VALUE_DEFAULT.
                d.check("cuStreamWriteValue64", unsafe {
                    write(stream.raw(), slot, value, 0)
                })
            }
        }
    }
}
