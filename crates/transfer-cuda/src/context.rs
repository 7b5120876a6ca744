//! A CUDA device's primary context, bound to whichever thread uses it.

use std::ffi::{c_char, c_int};
use std::sync::Arc;

use crate::driver::{CuContext, CuDevice, Driver, driver};
use crate::error::{CudaError, Result};

/// The primary context of one CUDA device (shared with the CUDA runtime,
/// PyTorch and others in the same process). Every method binds it to the
/// calling thread first, so it can be used from any thread.
pub struct CudaContext {
    driver: &'static Driver,
    device: CuDevice,
    ordinal: u32,
    raw: CuContext,
}

// SAFETY: CUDA contexts may be made current on any thread; the handle is an
// opaque pointer owned by the driver.
unsafe impl Send for CudaContext {}
// SAFETY: driver calls on one context from several threads are thread-safe.
unsafe impl Sync for CudaContext {}

impl std::fmt::Debug for CudaContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaContext")
            .field("ordinal", &self.ordinal)
            .finish()
    }
}

impl CudaContext {
    /// Retains the primary context of device `ordinal`. Fails with a
    /// [`CudaError`] (see [`CudaError::is_no_gpu`]) when there is no driver
    /// or no such device.
    pub fn new(ordinal: u32) -> Result<Arc<Self>> {
        let driver = driver()?;
        let count = driver.device_count()?;
        if ordinal >= count {
            return Err(CudaError::NoDevice { ordinal, count });
        }
        let index = c_int::try_from(ordinal)
            .map_err(|_| CudaError::invalid("CudaContext::new", "device ordinal too large"))?;
        let mut device: CuDevice = 0;
        // SAFETY: the out-pointer is a valid local; the ordinal was checked.
        driver.check("cuDeviceGet", unsafe {
            (driver.api.device_get)(&mut device, index)
        })?;
        let mut raw: CuContext = std::ptr::null_mut();
        // SAFETY: the out-pointer is a valid local; `device` is valid.
        driver.check("cuDevicePrimaryCtxRetain", unsafe {
            (driver.api.primary_ctx_retain)(&mut raw, device)
        })?;
        let ctx = Self {
            driver,
            device,
            ordinal,
            raw,
        };
        ctx.bind()?;
        Ok(Arc::new(ctx))
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// Makes the context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        // SAFETY: `raw` is a retained primary context, valid until drop.
        self.driver.check("cuCtxSetCurrent", unsafe {
            (self.driver.api.ctx_set_current)(self.raw)
        })
    }

    /// A device attribute (see [`crate::driver::attr`]).
    pub fn attribute(&self, attribute: i32) -> Result<i32> {
        let mut v = 0;
        // SAFETY: the out-pointer is a valid local; `device` is valid.
        self.driver.check("cuDeviceGetAttribute", unsafe {
            (self.driver.api.device_get_attribute)(&mut v, attribute, self.device)
        })?;
        Ok(v)
    }

    /// The device's marketing name.
    pub fn name(&self) -> Result<String> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: the buffer is valid for its length; the driver writes a
        // NUL-terminated string no longer than that.
        self.driver.check("cuDeviceGetName", unsafe {
            (self.driver.api.device_get_name)(buf.as_mut_ptr(), 256, self.device)
        })?;
        let bytes: Vec<u8> = buf
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Waits for all work on the device's streams.
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: no arguments; the context is current.
        self.driver.check("cuCtxSynchronize", unsafe {
            (self.driver.api.ctx_synchronize)()
        })
    }

    pub(crate) fn driver(&self) -> &'static Driver {
        self.driver
    }
}

impl Drop for CudaContext {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `new`. A failure leaks a reference
        // to the primary context, which the driver frees at exit.
        let _ = unsafe { (self.driver.api.primary_ctx_release)(self.device) };
    }
}
