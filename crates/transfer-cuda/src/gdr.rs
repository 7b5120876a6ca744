//! GDRCopy (`libgdrapi.so.2`), loaded at run time when `/dev/gdrdrv`
//! exists: maps a pinned range of GPU memory into the CPU's address space
//! so that the CPU can write a flag that a kernel polls, without a copy
//! engine or a kernel launch.

use std::ffi::{c_int, c_ulong, c_void};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use libloading::Library;

use crate::context::CudaContext;
use crate::device::DeviceBuffer;
use crate::driver::POINTER_ATTRIBUTE_SYNC_MEMOPS;
use crate::error::{CudaError, Result};

/// GDRCopy pins and maps GPU memory in units of this many bytes.
pub const GPU_PAGE_SIZE: usize = 1 << 16;

/// The device node of the gdrdrv kernel module.
pub const GDRDRV_DEVICE: &str = "/dev/gdrdrv";

/// Environment variable overriding [`GDRDRV_DEVICE`] (for dry runs with a
/// fake libgdrapi; the real library opens `/dev/gdrdrv` itself).
pub const GDRDRV_DEVICE_ENV: &str = "TRANSFER_CUDA_GDRDRV";

type GdrT = *mut c_void;

#[repr(C)]
#[derive(Clone, Copy)]
struct GdrMh {
    h: c_ulong,
}

struct Api {
    open: unsafe extern "C" fn() -> GdrT,
    pin_buffer: unsafe extern "C" fn(GdrT, c_ulong, usize, u64, u32, *mut GdrMh) -> c_int,
    unpin_buffer: unsafe extern "C" fn(GdrT, GdrMh) -> c_int,
    map: unsafe extern "C" fn(GdrT, GdrMh, *mut *mut c_void, usize) -> c_int,
    unmap: unsafe extern "C" fn(GdrT, GdrMh, *mut c_void, usize) -> c_int,
    copy_to_mapping: unsafe extern "C" fn(GdrMh, *mut c_void, *const c_void, usize) -> c_int,
    copy_from_mapping: unsafe extern "C" fn(GdrMh, *mut c_void, *const c_void, usize) -> c_int,
}

/// An open GDRCopy handle (process-wide; never closed).
pub struct Gdr {
    api: Api,
    handle: GdrT,
    /// Serialises pin/map/unmap/unpin on the shared handle.
    lock: Mutex<()>,
    _lib: Library,
}

// SAFETY: the gdr_t handle is used under `lock` for state-changing calls;
// copies through a mapping do not touch it.
unsafe impl Send for Gdr {}
// SAFETY: see Send.
unsafe impl Sync for Gdr {}

macro_rules! sym {
    ($lib:expr, $name:literal) => {{
        // SAFETY: the symbol is declared with its gdrapi.h signature by the
        // field it is assigned to; the library outlives the copy.
        let s = unsafe { $lib.get(concat!($name, "\0").as_bytes()) }.map_err(|e| {
            CudaError::GdrUnavailable {
                reason: format!("libgdrapi.so.2 lacks {}: {e}", $name),
            }
        })?;
        *s
    }};
}

impl Gdr {
    fn open() -> Result<Self> {
        let device = std::env::var_os(GDRDRV_DEVICE_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(GDRDRV_DEVICE));
        if !device.exists() {
            return Err(CudaError::GdrUnavailable {
                reason: format!(
                    "{} does not exist (gdrdrv module not loaded)",
                    device.display()
                ),
            });
        }
        // SAFETY: loading libgdrapi runs no initialiser with preconditions.
        let lib =
            unsafe { Library::new("libgdrapi.so.2") }.map_err(|e| CudaError::GdrUnavailable {
                reason: format!("libgdrapi.so.2: {e}"),
            })?;
        let api = Api {
            open: sym!(lib, "gdr_open"),
            pin_buffer: sym!(lib, "gdr_pin_buffer"),
            unpin_buffer: sym!(lib, "gdr_unpin_buffer"),
            map: sym!(lib, "gdr_map"),
            unmap: sym!(lib, "gdr_unmap"),
            copy_to_mapping: sym!(lib, "gdr_copy_to_mapping"),
            copy_from_mapping: sym!(lib, "gdr_copy_from_mapping"),
        };
        // SAFETY: gdr_open has no preconditions; it returns null on failure.
        let handle = unsafe { (api.open)() };
        if handle.is_null() {
            return Err(CudaError::GdrUnavailable {
                reason: "gdr_open failed (permissions on /dev/gdrdrv?)".into(),
            });
        }
        Ok(Self {
            api,
            handle,
            lock: Mutex::new(()),
            _lib: lib,
        })
    }
}

/// The process-wide GDRCopy handle, opened on first use; the same error
/// on every call when GDRCopy is unusable here.
pub fn gdr() -> Result<&'static Gdr> {
    static GDR: OnceLock<Result<Gdr>> = OnceLock::new();
    GDR.get_or_init(Gdr::open).as_ref().map_err(Clone::clone)
}

/// One GPU page of device memory, pinned and mapped for CPU access.
pub struct GdrMapping {
    gdr: &'static Gdr,
    // Declared before `buf`: unmapped and unpinned (in Drop) before the
    // memory is freed.
    mh: GdrMh,
    map: *mut c_void,
    device: u64,
    buf: DeviceBuffer,
}

// SAFETY: the mapping is plain device memory reached through copies.
unsafe impl Send for GdrMapping {}
// SAFETY: see Send; copies of u64 values are done with gdr_copy_* calls.
unsafe impl Sync for GdrMapping {}

impl std::fmt::Debug for GdrMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GdrMapping")
            .field("device", &format_args!("{:#x}", self.device))
            .field("buf", &self.buf)
            .finish()
    }
}

impl GdrMapping {
    /// Allocates one GPU page on `ctx`'s device, pins and maps it.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        let gdr = gdr()?;
        // Twice the page, so an aligned page fits whatever cuMemAlloc returns.
        let buf = DeviceBuffer::zeroed(ctx, 2 * GPU_PAGE_SIZE)?;
        let device = buf.device_addr().next_multiple_of(GPU_PAGE_SIZE as u64);
        let d = ctx.driver();
        let one: c_int = 1;
        ctx.bind()?;
        // SAFETY: `device` lies in a live allocation of this context; the
        // value is a c_int as the attribute requires. GDRCopy needs
        // SYNC_MEMOPS so that CPU writes are ordered with device copies.
        d.check("cuPointerSetAttribute", unsafe {
            (d.api.pointer_set_attribute)(
                (&one as *const c_int).cast::<c_void>(),
                POINTER_ATTRIBUTE_SYNC_MEMOPS,
                device,
            )
        })?;
        let _guard = gdr.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let mut mh = GdrMh { h: 0 };
        // SAFETY: [device, device + GPU_PAGE_SIZE) lies in `buf`, page aligned.
        let rc = unsafe {
            (gdr.api.pin_buffer)(gdr.handle, device as c_ulong, GPU_PAGE_SIZE, 0, 0, &mut mh)
        };
        if rc != 0 {
            return Err(CudaError::Gdr {
                call: "gdr_pin_buffer",
                code: rc,
            });
        }
        let mut map: *mut c_void = std::ptr::null_mut();
        // SAFETY: `mh` was just pinned with this size.
        let rc = unsafe { (gdr.api.map)(gdr.handle, mh, &mut map, GPU_PAGE_SIZE) };
        if rc != 0 || map.is_null() {
            // SAFETY: pinned above, unpinned once.
            let _ = unsafe { (gdr.api.unpin_buffer)(gdr.handle, mh) };
            return Err(CudaError::Gdr {
                call: "gdr_map",
                code: rc,
            });
        }
        Ok(Self {
            gdr,
            mh,
            map,
            device,
            buf,
        })
    }

    /// Device address of the mapped page.
    pub fn device_addr(&self) -> u64 {
        self.device
    }

    /// Writes `value` at byte `offset` of the page (`offset + 8 <= 64 KiB`).
    pub fn write_u64(&self, offset: usize, value: u64) -> Result<()> {
        self.check(offset)?;
        // SAFETY: the destination lies in the mapped page (checked); the
        // source is a live local.
        let rc = unsafe {
            (self.gdr.api.copy_to_mapping)(
                self.mh,
                self.map.cast::<u8>().add(offset).cast::<c_void>(),
                (&value as *const u64).cast::<c_void>(),
                8,
            )
        };
        if rc != 0 {
            return Err(CudaError::Gdr {
                call: "gdr_copy_to_mapping",
                code: rc,
            });
        }
        Ok(())
    }

    /// Reads the `u64` at byte `offset` of the page (slow: an uncached read over PCIe).
    pub fn read_u64(&self, offset: usize) -> Result<u64> {
        self.check(offset)?;
        let mut v = 0u64;
        // SAFETY: the source lies in the mapped page (checked); the
        // destination is a live local.
        let rc = unsafe {
            (self.gdr.api.copy_from_mapping)(
                self.mh,
                (&mut v as *mut u64).cast::<c_void>(),
                self.map.cast::<u8>().add(offset).cast::<c_void>(),
                8,
            )
        };
        if rc != 0 {
            return Err(CudaError::Gdr {
                call: "gdr_copy_from_mapping",
                code: rc,
            });
        }
        Ok(v)
    }

    fn check(&self, offset: usize) -> Result<()> {
        if offset % 8 != 0 || offset.checked_add(8).is_none_or(|end| end > GPU_PAGE_SIZE) {
            return Err(CudaError::invalid(
                "GdrMapping",
                format!("offset {offset} not an aligned u64 of the page"),
            ));
        }
        Ok(())
    }

    /// The device buffer behind the mapping.
    pub fn buffer(&self) -> &DeviceBuffer {
        &self.buf
    }
}

impl Drop for GdrMapping {
    fn drop(&mut self) {
        let _guard = self.gdr.lock.lock().unwrap_or_else(PoisonError::into_inner);
        // SAFETY: mapped and pinned in `new`, released once, before `buf` is freed.
        unsafe {
            let _ = (self.gdr.api.unmap)(self.gdr.handle, self.mh, self.map, GPU_PAGE_SIZE);
            let _ = (self.gdr.api.unpin_buffer)(self.gdr.handle, self.mh);
        }
    }
}
