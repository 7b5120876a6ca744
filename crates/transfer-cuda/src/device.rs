//! Device memory and streams (RAII over the driver API).

use std::ffi::c_void;
use std::sync::Arc;

use crate::context::CudaContext;
use crate::driver::{CuDevicePtr, CuStream, STREAM_NON_BLOCKING};
use crate::error::{CudaError, Result};

/// A CUDA stream of one context.
pub struct Stream {
    ctx: Arc<CudaContext>,
    raw: CuStream,
    owned: bool,
}

// SAFETY: streams may be used from any thread; the handle is opaque.
unsafe impl Send for Stream {}
// SAFETY: driver calls on one stream from several threads are thread-safe.
unsafe impl Sync for Stream {}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("raw", &self.raw)
            .field("owned", &self.owned)
            .finish()
    }
}

impl Stream {
    /// Creates a non-blocking stream (it does not synchronise with the
    /// legacy default stream).
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        ctx.bind()?;
        let d = ctx.driver();
        let mut raw: CuStream = std::ptr::null_mut();
        // SAFETY: the out-pointer is a valid local; the context is current.
        d.check("cuStreamCreate", unsafe {
            (d.api.stream_create)(&mut raw, STREAM_NON_BLOCKING)
        })?;
        Ok(Self {
            ctx: ctx.clone(),
            raw,
            owned: true,
        })
    }

    /// Wraps a stream created elsewhere (e.g. by PyTorch); it is not
    /// destroyed on drop.
    ///
    /// # Safety
    /// `raw` must be a stream of `ctx` (or null for the legacy default
    /// stream) that stays valid as long as the returned value.
    pub unsafe fn from_raw(ctx: &Arc<CudaContext>, raw: CuStream) -> Self {
        Self {
            ctx: ctx.clone(),
            raw,
            owned: false,
        }
    }

    /// The raw handle.
    pub fn raw(&self) -> CuStream {
        self.raw
    }

    /// The context the stream belongs to.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Waits until all work queued on the stream has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.bind()?;
        let d = self.ctx.driver();
        // SAFETY: `raw` is a valid stream of the current context.
        d.check("cuStreamSynchronize", unsafe {
            (d.api.stream_synchronize)(self.raw)
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.owned && self.ctx.bind().is_ok() {
            // SAFETY: created in `new`, destroyed once.
            let _ = unsafe { (self.ctx.driver().api.stream_destroy)(self.raw) };
        }
    }
}

/// Device memory from `cuMemAlloc` (256-byte aligned, at least; 2 MiB
/// aligned for large allocations in practice).
pub struct DeviceBuffer {
    ctx: Arc<CudaContext>,
    ptr: CuDevicePtr,
    len: usize,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("device", &self.ctx.ordinal())
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .finish()
    }
}

impl DeviceBuffer {
    /// Allocates `len` zeroed bytes on `ctx`'s device.
    pub fn zeroed(ctx: &Arc<CudaContext>, len: usize) -> Result<Self> {
        if len == 0 {
            return Err(CudaError::invalid(
                "DeviceBuffer::zeroed",
                "length must be non-zero",
            ));
        }
        ctx.bind()?;
        let d = ctx.driver();
        let mut ptr: CuDevicePtr = 0;
        // SAFETY: the out-pointer is a valid local; the context is current.
        d.check("cuMemAlloc", unsafe { (d.api.mem_alloc)(&mut ptr, len) })?;
        let buf = Self {
            ctx: ctx.clone(),
            ptr,
            len,
        };
        // SAFETY: [ptr, ptr + len) was just allocated.
        d.check("cuMemsetD8", unsafe { (d.api.memset_d8)(ptr, 0, len) })?;
        // The memset runs on the legacy default stream, which non-blocking
        // streams (and GDRCopy writes) do not wait for: finish it now.
        // SAFETY: null is the legacy default stream of the current context.
        d.check("cuStreamSynchronize", unsafe {
            (d.api.stream_synchronize)(std::ptr::null_mut())
        })?;
        Ok(buf)
    }

    /// The device address of byte 0.
    pub fn device_addr(&self) -> u64 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: buffers are non-empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The context (and device) it was allocated on.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Copies `src` to byte `offset` (synchronous).
    pub fn copy_from_host(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check_range("DeviceBuffer::copy_from_host", offset, src.len())?;
        self.ctx.bind()?;
        let d = self.ctx.driver();
        // SAFETY: the range lies inside the allocation (checked); `src` is valid.
        d.check("cuMemcpyHtoD", unsafe {
            (d.api.memcpy_htod)(
                self.ptr + offset as u64,
                src.as_ptr().cast::<c_void>(),
                src.len(),
            )
        })
    }

    /// Copies bytes from `offset` into `dst` (synchronous).
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check_range("DeviceBuffer::copy_to_host", offset, dst.len())?;
        self.ctx.bind()?;
        let d = self.ctx.driver();
        // SAFETY: the range lies inside the allocation (checked); `dst` is valid.
        d.check("cuMemcpyDtoH", unsafe {
            (d.api.memcpy_dtoh)(
                dst.as_mut_ptr().cast::<c_void>(),
                self.ptr + offset as u64,
                dst.len(),
            )
        })
    }

    fn check_range(&self, call: &'static str, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(CudaError::invalid(
                call,
                format!("range {offset}+{len} outside {} bytes", self.len),
            )),
        }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: allocated in `zeroed`, freed once.
            let _ = unsafe { (self.ctx.driver().api.mem_free)(self.ptr) };
        }
    }
}
