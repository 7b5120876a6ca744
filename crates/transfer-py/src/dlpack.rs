//! DLPack sources: any object with `__dlpack__` (torch CPU tensors, jax,
//! cupy's host arrays, numpy >= 1.22), registered zero-copy.
//!
//! The capsule `__dlpack__()` returns is read, never consumed: it keeps
//! its name `"dltensor"`, so its own destructor frees the managed tensor
//! (and with it the exporter's reference to the tensor) when the last
//! reference goes. Holding the capsule is what keeps the memory alive for
//! as long as it is registered; no deleter is ever called from here, so
//! nothing runs the exporter's code without the GIL.

use std::ffi::c_void;

use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::error::invalid;

/// `kDLCPU` and `kDLCUDAHost` (pinned host memory): the device types whose
/// memory the CPU addresses.
const HOST_DEVICES: [i32; 2] = [1, 3];

/// `DLDevice`.
#[repr(C)]
#[derive(Clone, Copy)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[derive(Clone, Copy)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// `DLTensor` (DLPack <= 0.8 and the unversioned capsule of 1.x).
#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *const i64,
    /// In elements; null means compact row-major.
    strides: *const i64,
    byte_offset: u64,
}

/// `DLManagedTensor`: the tensor, then the exporter's context and deleter
/// (not used here, see the module comment).
#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// Host memory described by a DLPack capsule, and the capsule that keeps it.
pub(crate) struct DlpackSpan {
    pub(crate) ptr: usize,
    pub(crate) len: usize,
    pub(crate) capsule: Py<PyAny>,
}

/// Whether `obj` exports DLPack.
pub(crate) fn exports(obj: &Bound<'_, PyAny>) -> bool {
    obj.hasattr("__dlpack__").unwrap_or(false)
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "object".to_owned(), |n| n.to_string())
}

fn device_name(t: i32) -> &'static str {
    match t {
        1 => "cpu",
        2 => "cuda",
        3 => "cuda_host",
        4 => "opencl",
        7 => "vulkan",
        8 => "metal",
        9 => "vpi",
        10 => "rocm",
        11 => "rocm_host",
        13 => "cuda_managed",
        14 => "oneapi",
        _ => "unknown",
    }
}

fn not_host(call: &'static str, what: &str, t: i32, id: i32) -> PyErr {
    invalid(
        call,
        format!(
            "{what}: DLPack device {} ({t}, {id}) is not host memory; the Python package \
             registers CPU memory only (torch: tensor.cpu())",
            device_name(t)
        ),
    )
}

/// Reads the span of `obj`'s DLPack export: host memory only, C-contiguous,
/// non-empty, whole bytes per element.
pub(crate) fn span(call: &'static str, obj: &Bound<'_, PyAny>) -> PyResult<DlpackSpan> {
    let what = type_name(obj);
    // The device first: a device tensor is refused before it exports.
    if obj.hasattr("__dlpack_device__").unwrap_or(false) {
        let (t, id): (i32, i32) = obj
            .call_method0("__dlpack_device__")
            .and_then(|d| d.extract())
            .map_err(|e| {
                invalid(
                    call,
                    format!("{what}.__dlpack_device__() is not (type, id): {e}"),
                )
            })?;
        if !HOST_DEVICES.contains(&t) {
            return Err(not_host(call, &what, t, id));
        }
    }
    let capsule = obj
        .call_method0("__dlpack__")
        .map_err(|e| invalid(call, format!("{what}.__dlpack__() failed: {e}")))?;
    let cap = capsule
        .cast::<PyCapsule>()
        .map_err(|_| invalid(call, format!("{what}.__dlpack__() returned no capsule")))?;
    let ptr = cap.pointer_checked(Some(c"dltensor")).map_err(|_| {
        invalid(
            call,
            format!(
                "{what}.__dlpack__() returned a capsule that is not an unconsumed \"dltensor\""
            ),
        )
    })?;
    // SAFETY: by the DLPack protocol a capsule named "dltensor" holds a
    // DLManagedTensor that stays valid until the capsule is consumed
    // (renamed) or destroyed; `capsule` is referenced for the whole block
    // and never renamed here.
    let t = unsafe { &ptr.cast::<DlManagedTensor>().as_ref().dl_tensor };
    if !HOST_DEVICES.contains(&t.device.device_type) {
        return Err(not_host(
            call,
            &what,
            t.device.device_type,
            t.device.device_id,
        ));
    }
    let ndim = usize::try_from(t.ndim)
        .map_err(|_| invalid(call, format!("{what}: DLPack ndim {} is negative", t.ndim)))?;
    if ndim > 0 && t.shape.is_null() {
        return Err(invalid(call, format!("{what}: DLPack shape is null")));
    }
    let shape: &[i64] = if ndim == 0 {
        &[]
    } else {
        // SAFETY: a DLTensor's `shape` points at `ndim` int64s (checked
        // non-null above), owned by the managed tensor the capsule keeps.
        unsafe { std::slice::from_raw_parts(t.shape, ndim) }
    };
    let strides: Option<&[i64]> = if ndim == 0 || t.strides.is_null() {
        None
    } else {
        // SAFETY: a non-null `strides` points at `ndim` int64s, as `shape`.
        Some(unsafe { std::slice::from_raw_parts(t.strides, ndim) })
    };
    let bits = u64::from(t.dtype.bits) * u64::from(t.dtype.lanes);
    if bits == 0 || bits % 8 != 0 {
        return Err(invalid(
            call,
            format!(
                "{what}: DLPack dtype (code {}, {} bits x {} lanes) is not a whole number of bytes",
                t.dtype.code, t.dtype.bits, t.dtype.lanes
            ),
        ));
    }
    let mut extents = Vec::with_capacity(ndim);
    for &e in shape {
        extents.push(
            u64::try_from(e)
                .map_err(|_| invalid(call, format!("{what}: DLPack extent {e} is negative")))?,
        );
    }
    // Nothing to register (and an empty tensor's strides mean nothing).
    if extents.contains(&0) {
        return Err(invalid(call, format!("{what}: empty DLPack tensor")));
    }
    // Row-major compact: each stride is the product of the later extents
    // (a dimension of extent 1 may carry any stride, as numpy and torch
    // report them).
    let mut numel: u64 = 1;
    for d in (0..ndim).rev() {
        let extent = extents[d];
        if let Some(s) = strides {
            if extent != 1 && u64::try_from(s[d]).ok() != Some(numel) {
                return Err(invalid(
                    call,
                    format!(
                        "{what} is not C-contiguous (shape {shape:?}, strides {s:?} in elements); \
                         torch: tensor.contiguous(), numpy: np.ascontiguousarray"
                    ),
                ));
            }
        }
        numel = numel
            .checked_mul(extent)
            .ok_or_else(|| invalid(call, format!("{what}: DLPack shape {shape:?} overflows")))?;
    }
    let len = numel
        .checked_mul(bits / 8)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| invalid(call, format!("{what}: DLPack size overflows")))?;
    let base = t.data as usize;
    let ptr = usize::try_from(t.byte_offset)
        .ok()
        .and_then(|o| base.checked_add(o))
        .ok_or_else(|| invalid(call, format!("{what}: DLPack byte_offset overflows")))?;
    if base == 0 || len == 0 {
        return Err(invalid(
            call,
            format!("{what}: empty or null DLPack tensor"),
        ));
    }
    Ok(DlpackSpan {
        ptr,
        len,
        capsule: capsule.unbind(),
    })
}
