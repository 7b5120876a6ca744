//! Run-time access to the CUDA driver API (`libcuda.so.1`).
//!
//! The library is opened with `dlopen` the first time a GPU feature is
//! used, so the crate builds and links with no CUDA toolkit and runs on
//! machines without a GPU. Every entry point is resolved up front: a
//! missing library or symbol is a [`CudaError`], never a panic, and every
//! `CUresult` is read as a plain integer (a driver newer than this code may
//! return codes it does not know).
//!
//! Why not `cudarc` with `dynamic-loading`: its loader panics when the
//! library or a symbol is missing (it can only be guarded indirectly), and
//! its `CUresult` is a Rust enum, so an error code unknown to the bindings
//! would be undefined behaviour. The handful of calls needed here are
//! declared below with their C signatures.

use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong, c_void};
use std::sync::OnceLock;

use libloading::Library;

use crate::error::{CudaError, Result};

/// `CUdevice`.
pub type CuDevice = c_int;
/// `CUdeviceptr`: a device (or host-mapped) address.
pub type CuDevicePtr = u64;
/// `CUcontext`.
pub type CuContext = *mut c_void;
/// `CUmodule`.
pub type CuModule = *mut c_void;
/// `CUfunction`.
pub type CuFunction = *mut c_void;
/// `CUstream` (null is the legacy default stream).
pub type CuStream = *mut c_void;
type CuResult = c_int;

/// Device attributes used by this crate (`CUdevice_attribute` values).
pub mod attr {
    /// `CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY`.
    pub const CAN_MAP_HOST_MEMORY: i32 = 19;
    /// `CU_DEVICE_ATTRIBUTE_PCI_BUS_ID`.
    pub const PCI_BUS_ID: i32 = 33;
    /// `CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING`.
    pub const UNIFIED_ADDRESSING: i32 = 41;
    /// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR`.
    pub const COMPUTE_CAPABILITY_MAJOR: i32 = 75;
    /// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR`.
    pub const COMPUTE_CAPABILITY_MINOR: i32 = 76;
    /// `CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED`.
    pub const HOST_NATIVE_ATOMIC_SUPPORTED: i32 = 86;
    /// `CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS`.
    pub const CAN_USE_64_BIT_STREAM_MEM_OPS: i32 = 93;
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED`.
    pub const GPU_DIRECT_RDMA_SUPPORTED: i32 = 116;
    /// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`.
    pub const DMA_BUF_SUPPORTED: i32 = 124;
}

/// `CU_MEMHOSTALLOC_PORTABLE`.
pub(crate) const MEMHOSTALLOC_PORTABLE: c_uint = 0x01;
/// `CU_MEMHOSTALLOC_DEVICEMAP`.
pub(crate) const MEMHOSTALLOC_DEVICEMAP: c_uint = 0x02;
/// `CU_STREAM_NON_BLOCKING`.
pub(crate) const STREAM_NON_BLOCKING: c_uint = 0x01;
/// `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS`.
pub(crate) const POINTER_ATTRIBUTE_SYNC_MEMOPS: c_int = 6;
/// `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`.
pub(crate) const MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD: c_int = 1;

/// The resolved driver entry points. Fields are the C functions, with the
/// signatures of `cuda.h` (the `_v2` names where the header maps to them).
#[allow(missing_docs)]
pub(crate) struct Api {
    pub init: unsafe extern "C" fn(c_uint) -> CuResult,
    pub driver_get_version: unsafe extern "C" fn(*mut c_int) -> CuResult,
    pub get_error_name: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    pub device_get_count: unsafe extern "C" fn(*mut c_int) -> CuResult,
    pub device_get: unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult,
    pub device_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, CuDevice) -> CuResult,
    pub device_get_name: unsafe extern "C" fn(*mut c_char, c_int, CuDevice) -> CuResult,
    pub primary_ctx_retain: unsafe extern "C" fn(*mut CuContext, CuDevice) -> CuResult,
    pub primary_ctx_release: unsafe extern "C" fn(CuDevice) -> CuResult,
    pub ctx_set_current: unsafe extern "C" fn(CuContext) -> CuResult,
    pub ctx_synchronize: unsafe extern "C" fn() -> CuResult,
    pub mem_host_alloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CuResult,
    pub mem_host_get_device_pointer:
        unsafe extern "C" fn(*mut CuDevicePtr, *mut c_void, c_uint) -> CuResult,
    pub mem_free_host: unsafe extern "C" fn(*mut c_void) -> CuResult,
    pub mem_alloc: unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult,
    pub mem_free: unsafe extern "C" fn(CuDevicePtr) -> CuResult,
    pub memset_d8: unsafe extern "C" fn(CuDevicePtr, u8, usize) -> CuResult,
    pub memcpy_htod: unsafe extern "C" fn(CuDevicePtr, *const c_void, usize) -> CuResult,
    pub memcpy_dtoh: unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize) -> CuResult,
    pub pointer_set_attribute: unsafe extern "C" fn(*const c_void, c_int, CuDevicePtr) -> CuResult,
    pub module_load_data: unsafe extern "C" fn(*mut CuModule, *const c_void) -> CuResult,
    pub module_get_function:
        unsafe extern "C" fn(*mut CuFunction, CuModule, *const c_char) -> CuResult,
    pub module_unload: unsafe extern "C" fn(CuModule) -> CuResult,
    #[allow(clippy::type_complexity)]
    pub launch_kernel: unsafe extern "C" fn(
        CuFunction,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        CuStream,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> CuResult,
    pub stream_create: unsafe extern "C" fn(*mut CuStream, c_uint) -> CuResult,
    pub stream_destroy: unsafe extern "C" fn(CuStream) -> CuResult,
    pub stream_synchronize: unsafe extern "C" fn(CuStream) -> CuResult,
    /// CUDA >= 11.7; absent on older drivers.
    pub mem_get_handle_for_address_range: Option<
        unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize, c_int, c_ulonglong) -> CuResult,
    >,
    /// `cuStreamWriteValue64_v2`, else `cuStreamWriteValue64`.
    pub stream_write_value64:
        Option<unsafe extern "C" fn(CuStream, CuDevicePtr, u64, c_uint) -> CuResult>,
}

/// The loaded, initialised CUDA driver.
pub struct Driver {
    pub(crate) api: Api,
    version: i32,
    library: &'static str,
    // Keeps the entry points in `api` valid; never unloaded.
    _lib: Library,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("library", &self.library)
            .field("version", &self.version)
            .finish()
    }
}

/// Names tried in order: the driver's soname, then the development symlink.
const LIBRARY_NAMES: [&str; 2] = ["libcuda.so.1", "libcuda.so"];

macro_rules! required {
    ($lib:expr, $name:literal) => {{
        // SAFETY: the symbol is declared with its cuda.h signature by the
        // field it is assigned to; the library outlives the copy (kept in Driver).
        let sym = unsafe { $lib.get(concat!($name, "\0").as_bytes()) }
            .map_err(|_| CudaError::MissingSymbol { symbol: $name })?;
        *sym
    }};
}

macro_rules! optional {
    ($lib:expr, $name:literal) => {{
        // SAFETY: as in `required!`.
        let sym = unsafe { $lib.get(concat!($name, "\0").as_bytes()) };
        sym.ok().map(|s| *s)
    }};
}

impl Driver {
    fn load() -> Result<Self> {
        let mut reasons = Vec::new();
        let mut found = None;
        for name in LIBRARY_NAMES {
            // SAFETY: loading the NVIDIA driver library runs its initialisers,
            // which have no preconditions.
            match unsafe { Library::new(name) } {
                Ok(lib) => {
                    found = Some((name, lib));
                    break;
                }
                Err(e) => reasons.push(e.to_string()),
            }
        }
        let Some((library, lib)) = found else {
            return Err(CudaError::DriverNotFound {
                reason: reasons.join("; "),
            });
        };
        let api = Api {
            init: required!(lib, "cuInit"),
            driver_get_version: required!(lib, "cuDriverGetVersion"),
            get_error_name: required!(lib, "cuGetErrorName"),
            device_get_count: required!(lib, "cuDeviceGetCount"),
            device_get: required!(lib, "cuDeviceGet"),
            device_get_attribute: required!(lib, "cuDeviceGetAttribute"),
            device_get_name: required!(lib, "cuDeviceGetName"),
            primary_ctx_retain: required!(lib, "cuDevicePrimaryCtxRetain"),
            primary_ctx_release: required!(lib, "cuDevicePrimaryCtxRelease_v2"),
            ctx_set_current: required!(lib, "cuCtxSetCurrent"),
            ctx_synchronize: required!(lib, "cuCtxSynchronize"),
            mem_host_alloc: required!(lib, "cuMemHostAlloc"),
            mem_host_get_device_pointer: required!(lib, "cuMemHostGetDevicePointer_v2"),
            mem_free_host: required!(lib, "cuMemFreeHost"),
            mem_alloc: required!(lib, "cuMemAlloc_v2"),
            mem_free: required!(lib, "cuMemFree_v2"),
            memset_d8: required!(lib, "cuMemsetD8_v2"),
            memcpy_htod: required!(lib, "cuMemcpyHtoD_v2"),
            memcpy_dtoh: required!(lib, "cuMemcpyDtoH_v2"),
            pointer_set_attribute: required!(lib, "cuPointerSetAttribute"),
            module_load_data: required!(lib, "cuModuleLoadData"),
            module_get_function: required!(lib, "cuModuleGetFunction"),
            module_unload: required!(lib, "cuModuleUnload"),
            launch_kernel: required!(lib, "cuLaunchKernel"),
            stream_create: required!(lib, "cuStreamCreate"),
            stream_destroy: required!(lib, "cuStreamDestroy_v2"),
            stream_synchronize: required!(lib, "cuStreamSynchronize"),
            mem_get_handle_for_address_range: optional!(lib, "cuMemGetHandleForAddressRange"),
            stream_write_value64: optional!(lib, "cuStreamWriteValue64_v2")
                .or(optional!(lib, "cuStreamWriteValue64")),
        };
        let mut driver = Self {
            api,
            version: 0,
            library,
            _lib: lib,
        };
        // SAFETY: cuInit has no preconditions; 0 is the only valid flag value.
        driver.check("cuInit", unsafe { (driver.api.init)(0) })?;
        let mut version = 0;
        // SAFETY: the out-pointer is a valid local.
        driver.check("cuDriverGetVersion", unsafe {
            (driver.api.driver_get_version)(&mut version)
        })?;
        driver.version = version;
        Ok(driver)
    }

    /// The CUDA version the driver supports, as `cuDriverGetVersion`
    /// reports it (e.g. 12080 for 12.8).
    pub fn version(&self) -> i32 {
        self.version
    }

    /// The library file that was loaded.
    pub fn library(&self) -> &'static str {
        self.library
    }

    /// Number of CUDA devices.
    pub fn device_count(&self) -> Result<u32> {
        let mut n = 0;
        // SAFETY: the out-pointer is a valid local.
        self.check("cuDeviceGetCount", unsafe {
            (self.api.device_get_count)(&mut n)
        })?;
        Ok(u32::try_from(n).unwrap_or(0))
    }

    /// Whether `cuMemGetHandleForAddressRange` exists (CUDA >= 11.7).
    pub fn has_dmabuf_export(&self) -> bool {
        self.api.mem_get_handle_for_address_range.is_some()
    }

    /// Whether `cuStreamWriteValue64` exists.
    pub fn has_stream_write_value(&self) -> bool {
        self.api.stream_write_value64.is_some()
    }

    /// Turns a `CUresult` into a `Result`, naming the failed call.
    pub(crate) fn check(&self, call: &'static str, code: CuResult) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        Err(CudaError::Driver {
            call,
            code,
            name: self.error_name(code),
        })
    }

    fn error_name(&self, code: CuResult) -> String {
        let mut ptr: *const c_char = std::ptr::null();
        // SAFETY: the out-pointer is a valid local; the driver returns a
        // pointer to a static string or an error for unknown codes.
        let rc = unsafe { (self.api.get_error_name)(code, &mut ptr) };
        if rc != 0 || ptr.is_null() {
            return format!("CUDA error {code}");
        }
        // SAFETY: a non-null result is a NUL-terminated static string.
        unsafe { CStr::from_ptr(ptr) }
            .to_string_lossy()
            .into_owned()
    }
}

/// The process-wide driver: loaded and initialised on first use. Fails (the
/// same way on every call) when there is no driver or `cuInit` fails, e.g.
/// with `CUDA_ERROR_NO_DEVICE` on a machine with the library but no GPU.
pub fn driver() -> Result<&'static Driver> {
    static DRIVER: OnceLock<Result<Driver>> = OnceLock::new();
    DRIVER
        .get_or_init(Driver::load)
        .as_ref()
        .map_err(Clone::clone)
}
