//! `#[repr(C)]` mirrors of the ggml structs the plugin reads or builds
//! (`ggml.h`, `ggml-backend.h`, `ggml/src/ggml-backend-impl.h` of ggml
//! 0.25.x / 0.26.x). The backend structs are not a stable ABI: which of them
//! the host uses is decided once, by [`crate::host`], before any is handed
//! over. The ones that differ between the known hosts (the buffer-type
//! interface) have one mirror per layout.

use std::ffi::{c_char, c_int, c_void};

/// `enum ggml_status`: success.
pub const GGML_STATUS_SUCCESS: c_int = 0;
/// `enum ggml_status`: failure.
pub const GGML_STATUS_FAILED: c_int = -1;
/// `GGML_BACKEND_DEVICE_TYPE_GPU`: what llama.cpp offloads layers to.
pub const DEVICE_TYPE_GPU: c_int = 1;
/// `GGML_BACKEND_BUFFER_USAGE_WEIGHTS`.
pub const BUFFER_USAGE_WEIGHTS: c_int = 1;
/// `GGML_LOG_LEVEL_INFO`.
pub const LOG_INFO: c_int = 2;
/// `GGML_LOG_LEVEL_WARN`.
pub const LOG_WARN: c_int = 3;
/// `GGML_LOG_LEVEL_ERROR`.
pub const LOG_ERROR: c_int = 4;

/// `struct ggml_tensor` (unchanged for both known hosts; 336 bytes, checked
/// at probe time through `ggml_tensor_overhead` and a real tensor).
#[repr(C)]
#[derive(Debug)]
pub struct GgmlTensor {
    /// `enum ggml_type`.
    pub ty: c_int,
    /// The buffer holding the data.
    pub buffer: *mut GgmlBuffer,
    /// Elements per dimension.
    pub ne: [i64; 4],
    /// Strides in bytes.
    pub nb: [usize; 4],
    /// `enum ggml_op`.
    pub op: c_int,
    /// Op parameters.
    pub op_params: [i32; 16],
    /// `ggml_tensor_flag` bits.
    pub flags: i32,
    /// Sources.
    pub src: [*mut GgmlTensor; 10],
    /// The tensor this one views.
    pub view_src: *mut GgmlTensor,
    /// Offset of the view.
    pub view_offs: usize,
    /// Data address (for our buffers: the server's address).
    pub data: *mut c_void,
    /// NUL-terminated name.
    pub name: [c_char; 64],
    /// Backend extra.
    pub extra: *mut c_void,
    /// Padding.
    pub padding: [u8; 8],
}

/// Expected `sizeof(struct ggml_object) + sizeof(struct ggml_tensor)`,
/// what `ggml_tensor_overhead()` answers on a host with this layout.
pub const TENSOR_OVERHEAD: usize = 32 + std::mem::size_of::<GgmlTensor>();

/// A buffer handle.
pub type BufT = *mut GgmlBuffer;

/// `struct ggml_backend_buffer_i` with the 2D slots (llama/19378, ggml
/// 0.10.0 and later; both known hosts).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct BufferI {
    /// Frees the buffer's resources (not the struct: the host deletes it).
    pub free_buffer: Option<unsafe extern "C" fn(BufT)>,
    /// Base address.
    pub get_base: Option<unsafe extern "C" fn(BufT) -> *mut c_void>,
    /// Tensor initialization.
    pub init_tensor: Option<unsafe extern "C" fn(BufT, *mut GgmlTensor) -> c_int>,
    /// Memset of a tensor range.
    pub memset_tensor: Option<unsafe extern "C" fn(BufT, *mut GgmlTensor, u8, usize, usize)>,
    /// Write of a tensor range.
    pub set_tensor:
        Option<unsafe extern "C" fn(BufT, *mut GgmlTensor, *const c_void, usize, usize)>,
    /// Read of a tensor range.
    pub get_tensor:
        Option<unsafe extern "C" fn(BufT, *const GgmlTensor, *mut c_void, usize, usize)>,
    /// 2D write (optional).
    pub set_tensor_2d: Option<
        unsafe extern "C" fn(
            BufT,
            *mut GgmlTensor,
            *const c_void,
            usize,
            usize,
            usize,
            usize,
            usize,
        ),
    >,
    /// 2D read (optional).
    pub get_tensor_2d: Option<
        unsafe extern "C" fn(
            BufT,
            *const GgmlTensor,
            *mut c_void,
            usize,
            usize,
            usize,
            usize,
            usize,
        ),
    >,
    /// Copy into this buffer (optional).
    pub cpy_tensor: Option<unsafe extern "C" fn(BufT, *const GgmlTensor, *mut GgmlTensor) -> bool>,
    /// Fill the whole buffer.
    pub clear: Option<unsafe extern "C" fn(BufT, u8)>,
    /// Reset (optional).
    pub reset: Option<unsafe extern "C" fn(BufT)>,
}

/// Number of pointer slots of [`BufferI`].
pub const BUFFER_I_SLOTS: usize = std::mem::size_of::<BufferI>() / std::mem::size_of::<usize>();

/// `struct ggml_backend_buffer`.
#[repr(C)]
pub struct GgmlBuffer {
    /// Interface.
    pub iface: BufferI,
    /// Buffer type.
    pub buft: *mut c_void,
    /// Backend context.
    pub context: *mut c_void,
    /// Size in bytes.
    pub size: usize,
    /// `enum ggml_backend_buffer_usage`.
    pub usage: c_int,
}

/// A buffer-type handle (layout depends on the host: see [`BuftV2`], [`BuftV3`]).
pub type BuftT = *mut c_void;

type GetName = unsafe extern "C" fn(BuftT) -> *const c_char;
type AllocBuffer = unsafe extern "C" fn(BuftT, usize) -> BufT;
type GetSize = unsafe extern "C" fn(BuftT) -> usize;
type GetAllocSize = unsafe extern "C" fn(BuftT, *const GgmlTensor) -> usize;
type IsHost = unsafe extern "C" fn(BuftT) -> bool;

/// `struct ggml_backend_buffer_type` of backend API 2 (ggml 0.25.x).
#[repr(C)]
pub struct BuftV2 {
    /// Name.
    pub get_name: Option<GetName>,
    /// Allocation.
    pub alloc_buffer: Option<AllocBuffer>,
    /// Alignment.
    pub get_alignment: Option<GetSize>,
    /// Largest buffer.
    pub get_max_size: Option<GetSize>,
    /// Size a tensor needs.
    pub get_alloc_size: Option<GetAllocSize>,
    /// Host memory?
    pub is_host: Option<IsHost>,
    /// Device.
    pub device: *mut GgmlDevice,
    /// Context.
    pub context: *mut c_void,
}

/// `struct ggml_backend_buffer_type` of backend API 3 (ggml 0.26.x:
/// `alloc_buffer_n` and `get_alloc_size_n` inserted).
#[repr(C)]
pub struct BuftV3 {
    /// Name.
    pub get_name: Option<GetName>,
    /// Allocation.
    pub alloc_buffer: Option<AllocBuffer>,
    /// Allocation of a tensor list (optional).
    pub alloc_buffer_n: Option<unsafe extern "C" fn(BuftT, *mut *mut GgmlTensor, c_int) -> BufT>,
    /// Alignment.
    pub get_alignment: Option<GetSize>,
    /// Largest buffer.
    pub get_max_size: Option<GetSize>,
    /// Size a tensor needs.
    pub get_alloc_size: Option<GetAllocSize>,
    /// Size of a tensor list (optional).
    pub get_alloc_size_n: Option<unsafe extern "C" fn(BuftT, *mut *mut GgmlTensor, c_int) -> usize>,
    /// Host memory?
    pub is_host: Option<IsHost>,
    /// Device.
    pub device: *mut GgmlDevice,
    /// Context.
    pub context: *mut c_void,
}

/// A backend (stream) handle.
pub type BackendT = *mut GgmlBackend;
/// An event handle.
pub type EventT = *mut GgmlEvent;
/// A graph (opaque: read only through `ggml_graph_n_nodes`/`ggml_graph_node`).
pub type GraphT = *mut c_void;

/// `struct ggml_backend_i` (same on both known hosts).
#[repr(C)]
pub struct BackendI {
    /// Name.
    pub get_name: Option<unsafe extern "C" fn(BackendT) -> *const c_char>,
    /// Frees the backend (and its struct: we allocated it).
    pub free: Option<unsafe extern "C" fn(BackendT)>,
    /// Asynchronous write.
    pub set_tensor_async:
        Option<unsafe extern "C" fn(BackendT, *mut GgmlTensor, *const c_void, usize, usize)>,
    /// Asynchronous read.
    pub get_tensor_async:
        Option<unsafe extern "C" fn(BackendT, *const GgmlTensor, *mut c_void, usize, usize)>,
    /// 2D write (optional).
    pub set_tensor_2d_async: Option<
        unsafe extern "C" fn(
            BackendT,
            *mut GgmlTensor,
            *const c_void,
            usize,
            usize,
            usize,
            usize,
            usize,
        ),
    >,
    /// 2D read (optional).
    pub get_tensor_2d_async: Option<
        unsafe extern "C" fn(
            BackendT,
            *const GgmlTensor,
            *mut c_void,
            usize,
            usize,
            usize,
            usize,
            usize,
        ),
    >,
    /// Copy between backends (optional).
    pub cpy_tensor_async: Option<
        unsafe extern "C" fn(BackendT, BackendT, *const GgmlTensor, *mut GgmlTensor) -> bool,
    >,
    /// Waits for everything queued.
    pub synchronize: Option<unsafe extern "C" fn(BackendT)>,
    /// Graph plans (unused).
    pub graph_plan_create: Option<unsafe extern "C" fn(BackendT, GraphT) -> *mut c_void>,
    /// Graph plans (unused).
    pub graph_plan_free: Option<unsafe extern "C" fn(BackendT, *mut c_void)>,
    /// Graph plans (unused).
    pub graph_plan_update: Option<unsafe extern "C" fn(BackendT, *mut c_void, GraphT)>,
    /// Graph plans (unused).
    pub graph_plan_compute: Option<unsafe extern "C" fn(BackendT, *mut c_void) -> c_int>,
    /// Graph compute (asynchronous).
    pub graph_compute: Option<unsafe extern "C" fn(BackendT, GraphT) -> c_int>,
    /// Records an event on this stream.
    pub event_record: Option<unsafe extern "C" fn(BackendT, EventT)>,
    /// Makes this stream wait for an event.
    pub event_wait: Option<unsafe extern "C" fn(BackendT, EventT)>,
    /// Graph optimization (optional).
    pub graph_optimize: Option<unsafe extern "C" fn(BackendT, GraphT, *mut c_void)>,
}

/// `struct ggml_backend`.
#[repr(C)]
pub struct GgmlBackend {
    /// Identity of the backend kind.
    pub guid: *mut [u8; 16],
    /// Interface.
    pub iface: BackendI,
    /// Device.
    pub device: *mut GgmlDevice,
    /// Context.
    pub context: *mut c_void,
}

/// `struct ggml_backend_event`.
#[repr(C)]
pub struct GgmlEvent {
    /// Device.
    pub device: *mut GgmlDevice,
    /// Context.
    pub context: *mut c_void,
}

/// `struct ggml_backend_dev_caps` (`mmap_support` falls into what older
/// hosts have as padding).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DevCaps {
    /// Asynchronous operations.
    pub async_ops: bool,
    /// Pinned host buffer.
    pub host_buffer: bool,
    /// Buffers from host pointers.
    pub buffer_from_host_ptr: bool,
    /// Events.
    pub events: bool,
    /// mmap loading.
    pub mmap_support: bool,
}

/// `struct ggml_backend_dev_props`.
#[repr(C)]
pub struct DevProps {
    /// Name.
    pub name: *const c_char,
    /// Description.
    pub description: *const c_char,
    /// Free memory.
    pub memory_free: usize,
    /// Total memory.
    pub memory_total: usize,
    /// `enum ggml_backend_dev_type`.
    pub ty: c_int,
    /// PCI id or NULL.
    pub device_id: *const c_char,
    /// Capabilities.
    pub caps: DevCaps,
}

/// A device handle.
pub type DevT = *mut GgmlDevice;

/// `struct ggml_backend_device_i`.
#[repr(C)]
pub struct DeviceI {
    /// Name.
    pub get_name: Option<unsafe extern "C" fn(DevT) -> *const c_char>,
    /// Description.
    pub get_description: Option<unsafe extern "C" fn(DevT) -> *const c_char>,
    /// Memory.
    pub get_memory: Option<unsafe extern "C" fn(DevT, *mut usize, *mut usize)>,
    /// Type.
    pub get_type: Option<unsafe extern "C" fn(DevT) -> c_int>,
    /// Properties.
    pub get_props: Option<unsafe extern "C" fn(DevT, *mut DevProps)>,
    /// Backend (stream) creation.
    pub init_backend: Option<unsafe extern "C" fn(DevT, *const c_char) -> BackendT>,
    /// Buffer type.
    pub get_buffer_type: Option<unsafe extern "C" fn(DevT) -> BuftT>,
    /// Host buffer type (optional).
    pub get_host_buffer_type: Option<unsafe extern "C" fn(DevT) -> BuftT>,
    /// Buffer from host pointer (optional).
    pub buffer_from_host_ptr: Option<unsafe extern "C" fn(DevT, *mut c_void, usize, usize) -> BufT>,
    /// Op support.
    pub supports_op: Option<unsafe extern "C" fn(DevT, *const GgmlTensor) -> bool>,
    /// Buffer-type support.
    pub supports_buft: Option<unsafe extern "C" fn(DevT, BuftT) -> bool>,
    /// Offload wish (optional).
    pub offload_op: Option<unsafe extern "C" fn(DevT, *const GgmlTensor) -> bool>,
    /// Event creation.
    pub event_new: Option<unsafe extern "C" fn(DevT) -> EventT>,
    /// Event release.
    pub event_free: Option<unsafe extern "C" fn(DevT, EventT)>,
    /// Event wait (host side).
    pub event_synchronize: Option<unsafe extern "C" fn(DevT, EventT)>,
}

/// `struct ggml_backend_device`.
#[repr(C)]
pub struct GgmlDevice {
    /// Interface.
    pub iface: DeviceI,
    /// Registry it belongs to.
    pub reg: RegT,
    /// Context.
    pub context: *mut c_void,
}

/// A registry handle.
pub type RegT = *mut GgmlReg;

/// `struct ggml_backend_reg_i`.
#[repr(C)]
pub struct RegI {
    /// Name.
    pub get_name: Option<unsafe extern "C" fn(RegT) -> *const c_char>,
    /// Device count.
    pub get_device_count: Option<unsafe extern "C" fn(RegT) -> usize>,
    /// Device by index.
    pub get_device: Option<unsafe extern "C" fn(RegT, usize) -> DevT>,
    /// Extra entry points by name.
    pub get_proc_address: Option<unsafe extern "C" fn(RegT, *const c_char) -> *mut c_void>,
}

/// `struct ggml_backend_reg`.
#[repr(C)]
pub struct GgmlReg {
    /// `GGML_BACKEND_API_VERSION` the host was built with (2 or 3).
    pub api_version: c_int,
    /// Interface.
    pub iface: RegI,
    /// Context.
    pub context: *mut c_void,
}

/// `struct ggml_init_params`.
#[repr(C)]
pub struct InitParams {
    /// Arena size.
    pub mem_size: usize,
    /// Caller memory or NULL.
    pub mem_buffer: *mut c_void,
    /// Do not allocate tensor data.
    pub no_alloc: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// Offsets of `ggml.h` / `ggml-backend-impl.h` on x86-64 (both hosts).
    #[test]
    fn layouts() {
        assert_eq!(size_of::<GgmlTensor>(), 336);
        assert_eq!(offset_of!(GgmlTensor, op), 80);
        assert_eq!(offset_of!(GgmlTensor, src), 152);
        assert_eq!(offset_of!(GgmlTensor, data), 248);
        assert_eq!(offset_of!(GgmlTensor, name), 256);
        assert_eq!(BUFFER_I_SLOTS, 11);
        assert_eq!(offset_of!(GgmlBuffer, buft), 88);
        assert_eq!(offset_of!(GgmlBuffer, size), 104);
        assert_eq!(size_of::<BuftV2>(), 64);
        assert_eq!(size_of::<BuftV3>(), 80);
        assert_eq!(size_of::<BackendI>(), 16 * 8);
        assert_eq!(offset_of!(GgmlBackend, device), 8 + 16 * 8);
        assert_eq!(size_of::<DeviceI>(), 15 * 8);
        assert_eq!(offset_of!(DevProps, caps), 48);
        assert_eq!(offset_of!(GgmlReg, iface), 8);
        assert_eq!(size_of::<GgmlReg>(), 48);
    }
}
