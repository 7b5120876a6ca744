//! Where watcher slots and flags live: memory that the CPU reads and GPU
//! code writes, behind a trait so the slot allocator and watcher run on
//! plain host memory in tests without a GPU.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

use transfer_core::HostBuffer;

use crate::context::CudaContext;
use crate::driver::{CuDevicePtr, MEMHOSTALLOC_DEVICEMAP, MEMHOSTALLOC_PORTABLE};
use crate::error::{CudaError, Result};

/// A block of zeroed memory visible to the CPU at [`MappedBlock::host_ptr`]
/// and to GPU code at [`MappedBlock::device_addr`]. It stays valid, at the
/// same addresses, until dropped.
pub trait MappedBlock: Send + Sync + 'static {
    /// First byte, as the CPU sees it (8-byte aligned at least).
    fn host_ptr(&self) -> NonNull<u8>;
    /// First byte, as GPU code sees it.
    fn device_addr(&self) -> u64;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the block is empty (never, for blocks from a provider).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Allocates [`MappedBlock`]s.
pub trait MemoryProvider: Send + Sync + 'static {
    /// Allocates `len` zeroed bytes (`len > 0`).
    fn alloc_zeroed(&self, len: usize) -> Result<Box<dyn MappedBlock>>;
    /// What kind of memory this is, for logs and reports.
    fn kind(&self) -> &'static str;
}

/// Ordinary page-aligned host memory; its "device address" is the host
/// address. For tests and for CPU-only producers: no GPU can write it.
#[derive(Debug, Clone, Copy, Default)]
pub struct PlainHostMemory;

struct PlainBlock(HostBuffer);

impl MappedBlock for PlainBlock {
    fn host_ptr(&self) -> NonNull<u8> {
        // A HostBuffer's pointer is never null; dangling is unreachable.
        NonNull::new(self.0.as_ptr()).unwrap_or(NonNull::dangling())
    }
    fn device_addr(&self) -> u64 {
        self.0.as_ptr() as u64
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

impl MemoryProvider for PlainHostMemory {
    fn alloc_zeroed(&self, len: usize) -> Result<Box<dyn MappedBlock>> {
        Ok(Box::new(PlainBlock(HostBuffer::new(len)?)))
    }
    fn kind(&self) -> &'static str {
        "plain host memory"
    }
}

/// Pinned host memory mapped into the device's address space
/// (`cuMemHostAlloc` with `DEVICEMAP | PORTABLE`): GPU stores reach it over
/// PCIe/NVLink-C2C, the CPU reads it from its own caches.
#[derive(Debug, Clone)]
pub struct PinnedHostMemory {
    ctx: Arc<CudaContext>,
}

impl PinnedHostMemory {
    /// A provider allocating through `ctx`.
    pub fn new(ctx: Arc<CudaContext>) -> Self {
        Self { ctx }
    }
}

struct PinnedBlock {
    ctx: Arc<CudaContext>,
    host: NonNull<u8>,
    device: CuDevicePtr,
    len: usize,
}

// SAFETY: the block uniquely owns its pinned allocation; it is plain bytes
// accessed through raw pointers and atomics only.
unsafe impl Send for PinnedBlock {}
// SAFETY: see Send.
unsafe impl Sync for PinnedBlock {}

impl MappedBlock for PinnedBlock {
    fn host_ptr(&self) -> NonNull<u8> {
        self.host
    }
    fn device_addr(&self) -> u64 {
        self.device
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for PinnedBlock {
    fn drop(&mut self) {
        let d = self.ctx.driver();
        if self.ctx.bind().is_ok() {
            // SAFETY: allocated by cuMemHostAlloc in `alloc_zeroed`, freed once.
            let _ = unsafe { (d.api.mem_free_host)(self.host.as_ptr().cast::<c_void>()) };
        }
    }
}

impl MemoryProvider for PinnedHostMemory {
    fn alloc_zeroed(&self, len: usize) -> Result<Box<dyn MappedBlock>> {
        const CALL: &str = "PinnedHostMemory::alloc_zeroed";
        if len == 0 {
            return Err(CudaError::invalid(CALL, "length must be non-zero"));
        }
        self.ctx.bind()?;
        let d = self.ctx.driver();
        let mut raw: *mut c_void = std::ptr::null_mut();
        // SAFETY: the out-pointer is a valid local; the context is current.
        d.check("cuMemHostAlloc", unsafe {
            (d.api.mem_host_alloc)(
                &mut raw,
                len,
                MEMHOSTALLOC_DEVICEMAP | MEMHOSTALLOC_PORTABLE,
            )
        })?;
        let host = NonNull::new(raw.cast::<u8>()).ok_or_else(|| CudaError::OutOfMemory {
            call: CALL,
            reason: "cuMemHostAlloc returned null".into(),
        })?;
        let mut block = PinnedBlock {
            ctx: self.ctx.clone(),
            host,
            device: 0,
            len,
        };
        // SAFETY: `raw` is a fresh allocation of `len` bytes.
        unsafe { std::ptr::write_bytes(host.as_ptr(), 0, len) };
        // SAFETY: `raw` was allocated with DEVICEMAP; flags must be 0.
        d.check("cuMemHostGetDevicePointer", unsafe {
            (d.api.mem_host_get_device_pointer)(&mut block.device, raw, 0)
        })?;
        Ok(Box::new(block))
    }
    fn kind(&self) -> &'static str {
        "pinned host memory mapped into the device (cuMemHostAlloc DEVICEMAP|PORTABLE)"
    }
}
