//! Tensor record checks: type, shape, strides, flags, name, and the data
//! range inside its buffer, all with overflow-checked arithmetic.

use super::types::{TypeInfo, type_info};
use crate::error::{Result, RpcError};
use crate::protocol::tensor::{MAX_DIMS, RpcTensor};

/// Tensor flag bits ggml 7.0 defines (INPUT, OUTPUT, PARAM, LOSS, COMPUTE).
pub const KNOWN_FLAGS: i32 = 0x1F;

/// Where a buffer lives in the server's remote address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// The buffer handle.
    pub handle: u64,
    /// Remote base address of the buffer.
    pub base: u64,
    /// Size in bytes.
    pub size: u64,
}

/// What validation needs from the buffer registry.
pub trait BufferLookup {
    /// The region of a live buffer handle this server owns, if any.
    fn region(&self, handle: u64) -> Option<Region>;
    /// Reads `len` bytes at `offset` inside a buffer (already range-checked).
    fn read(&self, handle: u64, offset: u64, len: u64) -> Option<Vec<u8>>;
}

/// A tensor whose record passed every check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckedTensor {
    /// Its type's layout.
    pub info: TypeInfo,
    /// `ggml_nbytes` of the tensor.
    pub nbytes: u64,
    /// Buffer and offset of the data, when the tensor has a buffer.
    pub placement: Option<(Region, u64)>,
}

impl CheckedTensor {
    /// Buffer offset of `[offset, offset + size)` of this tensor's data,
    /// refusing ranges outside the tensor or its buffer.
    pub fn range(&self, call: &'static str, offset: u64, size: u64) -> Result<(Region, u64)> {
        let (region, start) = self
            .placement
            .ok_or_else(|| RpcError::refused(call, "tensor has no buffer"))?;
        let end = offset
            .checked_add(size)
            .ok_or_else(|| RpcError::refused(call, "offset + size overflows"))?;
        if end > self.nbytes {
            return Err(RpcError::refused(
                call,
                format!(
                    "range {offset}..{end} is outside the tensor's {} bytes",
                    self.nbytes
                ),
            ));
        }
        let abs = start
            .checked_add(offset)
            .filter(|a| a.checked_add(size).is_some_and(|e| e <= region.size))
            .ok_or_else(|| RpcError::refused(call, "range is outside the buffer"))?;
        Ok((region, abs))
    }
}

fn refuse<T>(call: &'static str, reason: impl Into<String>) -> Result<T> {
    Err(RpcError::refused(call, reason))
}

/// `ggml_nbytes` with checked arithmetic, for a known type.
pub fn nbytes(t: &RpcTensor, info: &TypeInfo) -> Option<u64> {
    if t.ne.contains(&0) {
        return Some(0);
    }
    let mut total = if info.block_size == 1 {
        info.type_size
    } else {
        u64::from(t.ne[0])
            .checked_mul(u64::from(t.nb[0]))?
            .checked_div(info.block_size)?
    };
    let first = usize::from(info.block_size != 1);
    for i in first..MAX_DIMS {
        let step = u64::from(t.ne[i] - 1).checked_mul(u64::from(t.nb[i]))?;
        total = total.checked_add(step)?;
    }
    Some(total)
}

/// Checks everything a record says about itself: known type, `ne[0]` a
/// multiple of the block size, element count within `i64`, strides at
/// least one element wide (a quantized row is contiguous blocks), known
/// flags, NUL-terminated name, computable size.
pub fn check_shape(call: &'static str, t: &RpcTensor) -> Result<(TypeInfo, u64)> {
    let Some(info) = type_info(t.ty) else {
        return refuse(call, format!("invalid ggml type {}", t.ty));
    };
    if u64::from(t.ne[0]) % info.block_size != 0 {
        return refuse(
            call,
            format!(
                "ne[0] = {} is not a multiple of the {} block size {}",
                t.ne[0], info.name, info.block_size
            ),
        );
    }
    let elements =
        t.ne.iter()
            .try_fold(1u64, |acc, &n| acc.checked_mul(u64::from(n)))
            .filter(|&n| n <= i64::MAX as u64);
    if elements.is_none() {
        return refuse(call, "element count overflows");
    }
    if info.block_size != 1 && t.ne[0] > 0 && u64::from(t.nb[0]) != info.type_size {
        return refuse(
            call,
            format!(
                "nb[0] = {} must be the {} block size in bytes",
                t.nb[0], info.name
            ),
        );
    }
    for i in 0..MAX_DIMS {
        if t.ne[i] > 1 && u64::from(t.nb[i]) < info.type_size {
            return refuse(
                call,
                format!("nb[{i}] = {} is narrower than one element", t.nb[i]),
            );
        }
    }
    if t.flags & !KNOWN_FLAGS != 0 {
        return refuse(call, format!("unknown tensor flags {:#x}", t.flags));
    }
    if !t.name.contains(&0) {
        return refuse(call, "name is not NUL-terminated");
    }
    let Some(n) = nbytes(t, &info) else {
        return refuse(call, "tensor size overflows");
    };
    Ok((info, n))
}

/// Full check of a tensor record that will be used to touch memory: shape,
/// then the buffer handle (must be live on this server) and its data range
/// inside that buffer. A tensor without a buffer must have no data address.
pub fn check_tensor(
    call: &'static str,
    t: &RpcTensor,
    lookup: &dyn BufferLookup,
) -> Result<CheckedTensor> {
    let (info, n) = check_shape(call, t)?;
    if t.buffer == 0 {
        if t.data != 0 {
            return refuse(call, "tensor has a data address but no buffer");
        }
        return Ok(CheckedTensor {
            info,
            nbytes: n,
            placement: None,
        });
    }
    let Some(region) = lookup.region(t.buffer) else {
        return refuse(call, format!("unknown buffer handle {:#x}", t.buffer));
    };
    let Some(offset) = t.data.checked_sub(region.base) else {
        return refuse(call, "data address is below its buffer");
    };
    let inside = offset.checked_add(n).is_some_and(|end| end <= region.size);
    if !inside {
        return refuse(
            call,
            format!(
                "data range {offset}+{n} is outside its buffer of {} bytes",
                region.size
            ),
        );
    }
    Ok(CheckedTensor {
        info,
        nbytes: n,
        placement: Some((region, offset)),
    })
}

/// Checks a view against its source: the view's bytes lie inside the
/// source's, and both address the same memory.
pub fn check_view(
    call: &'static str,
    view: &RpcTensor,
    view_checked: &CheckedTensor,
    src: &RpcTensor,
    src_checked: &CheckedTensor,
) -> Result<()> {
    let end = view
        .view_offs
        .checked_add(view_checked.nbytes)
        .ok_or_else(|| RpcError::refused(call, "view offset overflows"))?;
    if end > src_checked.nbytes {
        return refuse(
            call,
            format!(
                "view {}..{end} exceeds its source's {} bytes",
                view.view_offs, src_checked.nbytes
            ),
        );
    }
    if view.buffer != src.buffer {
        return refuse(call, "view and its source are in different buffers");
    }
    if src.buffer != 0 && src.data.checked_add(view.view_offs) != Some(view.data) {
        return refuse(
            call,
            "view data address does not match view_src + view_offs",
        );
    }
    Ok(())
}
