//! What every op rule shares: the op and parameter numbers of ggml.h, the
//! bounds an operator can read in the docs, the refusal, and the layout
//! predicates (contiguity, packed rows, broadcast) the rules are written in.

pub(super) use super::super::cpu_types;
pub(super) use super::super::graph::ValidatedGraph;
pub(super) use super::super::ops::{GGML_OP_COUNT, GGML_OP_NONE, GGML_OP_VIEW, is_view_op};
// The tests build nodes of these ops.
#[cfg(test)]
pub(super) use super::super::ops::{GGML_OP_GET_ROWS, GGML_OP_GLU, GGML_OP_SET_ROWS};
pub(super) use super::super::types::{
    GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_I32, GGML_TYPE_I64, TypeInfo, type_info,
};
pub(super) use crate::error::{Result, RpcError};
pub(super) use crate::protocol::tensor::{MAX_SRC, RpcTensor};

pub(super) const CALL: &str = "GRAPH_COMPUTE op check";
pub(super) const GGML_TYPE_BF16: u32 = 30;

/// `enum ggml_op` (ggml.h), every value: the rules and `RULES` (mod.rs)
/// name ops by these.
pub(super) const OP_NONE: u32 = 0;
pub(super) const OP_DUP: u32 = 1;
pub(super) const OP_ADD: u32 = 2;
pub(super) const OP_ADD_ID: u32 = 3;
pub(super) const OP_ADD1: u32 = 4;
pub(super) const OP_ACC: u32 = 5;
pub(super) const OP_SUB: u32 = 6;
pub(super) const OP_MUL: u32 = 7;
pub(super) const OP_DIV: u32 = 8;
pub(super) const OP_SQR: u32 = 9;
pub(super) const OP_SQRT: u32 = 10;
pub(super) const OP_LOG: u32 = 11;
pub(super) const OP_SIN: u32 = 12;
pub(super) const OP_COS: u32 = 13;
pub(super) const OP_SUM: u32 = 14;
pub(super) const OP_SUM_ROWS: u32 = 15;
pub(super) const OP_CUMSUM: u32 = 16;
pub(super) const OP_MEAN: u32 = 17;
pub(super) const OP_ARGMAX: u32 = 18;
pub(super) const OP_COUNT_EQUAL: u32 = 19;
pub(super) const OP_REPEAT: u32 = 20;
pub(super) const OP_REPEAT_BACK: u32 = 21;
pub(super) const OP_CONCAT: u32 = 22;
pub(super) const OP_SILU_BACK: u32 = 23;
pub(super) const OP_NORM: u32 = 24;
pub(super) const OP_RMS_NORM: u32 = 25;
pub(super) const OP_RMS_NORM_BACK: u32 = 26;
pub(super) const OP_GROUP_NORM: u32 = 27;
pub(super) const OP_L2_NORM: u32 = 28;
pub(super) const OP_MUL_MAT: u32 = 29;
pub(super) const OP_MUL_MAT_ID: u32 = 30;
pub(super) const OP_OUT_PROD: u32 = 31;
pub(super) const OP_SCALE: u32 = 32;
pub(super) const OP_SET: u32 = 33;
pub(super) const OP_CPY: u32 = 34;
pub(super) const OP_CONT: u32 = 35;
pub(super) const OP_RESHAPE: u32 = 36;
pub(super) const OP_VIEW: u32 = 37;
pub(super) const OP_PERMUTE: u32 = 38;
pub(super) const OP_TRANSPOSE: u32 = 39;
pub(super) const OP_GET_ROWS: u32 = 40;
pub(super) const OP_GET_ROWS_BACK: u32 = 41;
pub(super) const OP_SET_ROWS: u32 = 42;
pub(super) const OP_DIAG: u32 = 43;
pub(super) const OP_DIAG_MASK_INF: u32 = 44;
pub(super) const OP_DIAG_MASK_ZERO: u32 = 45;
pub(super) const OP_SOFT_MAX: u32 = 46;
pub(super) const OP_SOFT_MAX_BACK: u32 = 47;
pub(super) const OP_ROPE: u32 = 48;
pub(super) const OP_ROPE_BACK: u32 = 49;
pub(super) const OP_CLAMP: u32 = 50;
pub(super) const OP_CONV_TRANSPOSE_1D: u32 = 51;
pub(super) const OP_IM2COL: u32 = 52;
pub(super) const OP_IM2COL_BACK: u32 = 53;
pub(super) const OP_IM2COL_3D: u32 = 54;
pub(super) const OP_COL2IM_1D: u32 = 55;
pub(super) const OP_CONV_2D: u32 = 56;
pub(super) const OP_CONV_3D: u32 = 57;
pub(super) const OP_CONV_2D_DW: u32 = 58;
pub(super) const OP_CONV_TRANSPOSE_2D: u32 = 59;
pub(super) const OP_POOL_1D: u32 = 60;
pub(super) const OP_POOL_2D: u32 = 61;
pub(super) const OP_POOL_2D_BACK: u32 = 62;
pub(super) const OP_UPSCALE: u32 = 63;
pub(super) const OP_PAD: u32 = 64;
pub(super) const OP_PAD_REFLECT_1D: u32 = 65;
pub(super) const OP_ROLL: u32 = 66;
pub(super) const OP_ARANGE: u32 = 67;
pub(super) const OP_TIMESTEP_EMBEDDING: u32 = 68;
pub(super) const OP_ARGSORT: u32 = 69;
pub(super) const OP_TOP_K: u32 = 70;
pub(super) const OP_LEAKY_RELU: u32 = 71;
pub(super) const OP_TRI: u32 = 72;
pub(super) const OP_FILL: u32 = 73;
pub(super) const OP_FLASH_ATTN_EXT: u32 = 74;
pub(super) const OP_FLASH_ATTN_BACK: u32 = 75;
pub(super) const OP_SSM_CONV: u32 = 76;
pub(super) const OP_SSM_SCAN: u32 = 77;
pub(super) const OP_WIN_PART: u32 = 78;
pub(super) const OP_WIN_UNPART: u32 = 79;
pub(super) const OP_GET_REL_POS: u32 = 80;
pub(super) const OP_ADD_REL_POS: u32 = 81;
pub(super) const OP_RWKV_WKV6: u32 = 82;
pub(super) const OP_GATED_LINEAR_ATTN: u32 = 83;
pub(super) const OP_RWKV_WKV7: u32 = 84;
pub(super) const OP_SOLVE_TRI: u32 = 85;
pub(super) const OP_GATED_DELTA_NET: u32 = 86;
pub(super) const OP_LIGHTNING_INDEXER: u32 = 87;
pub(super) const OP_DSV4_HC_COMB: u32 = 88;
pub(super) const OP_DSV4_HC_PRE: u32 = 89;
pub(super) const OP_DSV4_HC_POST: u32 = 90;
pub(super) const OP_UNARY: u32 = 91;
pub(super) const OP_MAP_CUSTOM1: u32 = 92;
pub(super) const OP_MAP_CUSTOM2: u32 = 93;
pub(super) const OP_MAP_CUSTOM3: u32 = 94;
pub(super) const OP_CUSTOM: u32 = 95;
pub(super) const OP_CROSS_ENTROPY_LOSS: u32 = 96;
pub(super) const OP_CROSS_ENTROPY_LOSS_BACK: u32 = 97;
pub(super) const OP_OPT_STEP_ADAMW: u32 = 98;
pub(super) const OP_OPT_STEP_SGD: u32 = 99;
pub(super) const OP_GLU: u32 = 100;

/// `GGML_ROPE_TYPE_*` (ggml.h).
pub(super) const ROPE_NORMAL: i32 = 0;
pub(super) const ROPE_NEOX: i32 = 2;
pub(super) const ROPE_MROPE: i32 = 8;
pub(super) const ROPE_VISION: i32 = 24;
pub(super) const ROPE_IMROPE: i32 = 40;

/// `GGML_UNARY_OP_XIELU`.
pub(super) const UNARY_XIELU: i32 = 17;
/// `GGML_GLU_OP_SWIGLU_OAI`.
pub(super) const GLU_SWIGLU_OAI: i32 = 3;
/// `GGML_GLU_OP_SWIGLU_CLAMP`.
pub(super) const GLU_SWIGLU_CLAMP: i32 = 6;
/// `GGML_HINT_SRC0_IS_HADAMARD` (MUL_MAT `op_params[1]`).
pub(super) const HINT_SRC0_IS_HADAMARD: i32 = 1;
/// `GGML_PREC_DEFAULT` and `GGML_PREC_F32` (FLASH_ATTN_EXT `op_params[3]`).
pub(super) const PREC_DEFAULT: i32 = 0;
pub(super) const PREC_F32: i32 = 10;
/// Largest FLASH_ATTN_EXT head size (K and V row length) accepted.
/// `ggml_graph_plan` (ggml-cpu.c) sizes the work buffer at about
/// `512 * (DK + DV)` bytes per thread (64-row Q and KV tiles), and the CPU
/// backend allocates it with `new[]`, which aborts the process when it
/// fails: a head size bounded only by the buffer quota would turn a 1 MiB
/// K row into a 128 MiB-per-thread allocation. Real models use at most a
/// few hundred.
pub const MAX_FLASH_ATTN_HEAD: u32 = 4096;

pub(super) fn refuse<T>(op: u32, reason: impl Into<String>) -> Result<T> {
    Err(RpcError::refused(
        CALL,
        format!("op {op}: {}", reason.into()),
    ))
}

pub(super) fn info(t: &RpcTensor) -> Result<TypeInfo> {
    type_info(t.ty).ok_or_else(|| RpcError::refused(CALL, "invalid type"))
}

pub(super) fn nelements(t: &RpcTensor) -> u64 {
    t.ne.iter().map(|&n| u64::from(n)).product()
}

/// `ggml_nrows`: rows of `ne[0]` elements.
pub(super) fn nrows(t: &RpcTensor) -> u64 {
    t.ne[1..]
        .iter()
        .fold(1u64, |acc, &n| acc.saturating_mul(u64::from(n)))
}

/// Bytes of one row (`ggml_row_size(type, ne[0])`).
pub(super) fn row_bytes(t: &RpcTensor) -> u64 {
    type_info(t.ty).map_or(u64::MAX, |i| {
        (u64::from(t.ne[0]) / i.block_size).saturating_mul(i.type_size)
    })
}

/// `op_params[i]` read as the f32 a kernel `memcpy`s out of it.
pub(super) fn f32_param(r: &RpcTensor, i: usize) -> f32 {
    f32::from_bits(r.op_params[i] as u32)
}

/// Bytes of one block of `ty` (0 for an unknown type, which
/// `check_tensor` has refused before any op rule runs).
pub(super) fn type_size(ty: u32) -> u64 {
    type_info(ty).map_or(0, |i| i.type_size)
}

/// An F32 or F16 map of one source into a result of its type and shape,
/// for kernels that walk `ggml_nrows` rows of packed elements at
/// `i * nb1` / `i * nb01` (one flat run) and GGML_ABORT on other types
/// (CLAMP, LEAKY_RELU).
pub(super) fn same_type_flat_map(r: &RpcTensor, a: &RpcTensor) -> bool {
    matches!(a.ty, GGML_TYPE_F32 | GGML_TYPE_F16)
        && r.ty == a.ty
        && r.ne == a.ne
        && rows_contiguous(r)
        && rows_contiguous(a)
        && flat_walk(r)
        && flat_walk(a)
}

/// Rows are contiguous: the first dimension is packed.
pub(super) fn rows_contiguous(t: &RpcTensor) -> bool {
    type_info(t.ty).is_some_and(|i| u64::from(t.nb[0]) == i.type_size)
}

/// `ggml_is_contiguous`: packed in all dimensions (size-1 dims ignored).
pub fn is_contiguous(t: &RpcTensor) -> bool {
    let Some(i) = type_info(t.ty) else {
        return false;
    };
    let mut next = i.type_size;
    if t.ne[0] != 1 && u64::from(t.nb[0]) != next {
        return false;
    }
    next = next.saturating_mul(u64::from(t.ne[0]) / i.block_size);
    for d in 1..4 {
        if t.ne[d] != 1 {
            if u64::from(t.nb[d]) != next {
                return false;
            }
            next = next.saturating_mul(u64::from(t.ne[d]));
        }
    }
    true
}

/// `ggml_is_contiguous_1`: rows packed, dimensions 2 and 3 packed after
/// dimension 1 (whose stride is free); size-1 dims ignored. Then row
/// `i` (counted over dims 1..3 as one run) lies at `i * nb[1]`.
pub fn is_contiguous_1(t: &RpcTensor) -> bool {
    let Some(i) = type_info(t.ty) else {
        return false;
    };
    if u64::from(t.ne[0]) != i.block_size && u64::from(t.nb[0]) != i.type_size {
        return false;
    }
    let mut next = u64::from(t.ne[1]).saturating_mul(u64::from(t.nb[1]));
    for d in 2..4 {
        if t.ne[d] != 1 && u64::from(t.nb[d]) != next {
            return false;
        }
        next = next.saturating_mul(u64::from(t.ne[d]));
    }
    true
}

/// Strides never decrease (`!ggml_is_permuted`, size-1 dims included):
/// what the "dst cannot be transposed or permuted" asserts check.
pub(super) fn strides_ordered(t: &RpcTensor) -> bool {
    t.nb[0] <= t.nb[1] && t.nb[1] <= t.nb[2] && t.nb[2] <= t.nb[3]
}

/// Contiguous, and its rows counted over dims 1..3 as one run lie at
/// `i * nb[1]`: for kernels that walk `ggml_nrows` rows by `nb[1]` alone.
/// `ggml_is_contiguous` leaves `nb[1]` free when `ne[1] == 1`, so it must
/// be the row size whenever there is more than one row.
pub(super) fn flat_rows(t: &RpcTensor) -> bool {
    is_contiguous(t) && (nrows(t) <= 1 || u64::from(t.nb[1]) == row_bytes(t))
}

/// Row length and row count fit the `int` many kernels narrow them to:
/// scale_f32 `const int nc = src0->ne[0]` then `memcpy(.., nc *
/// sizeof(float))` (a negative nc is a huge size); every glu kernel
/// `const int nc`, `const int nr = ggml_nrows(src0)` then
/// GGML_ASSERT(dst->ne[0] == nc), GGML_ASSERT(ggml_nrows(dst) == nr);
/// flash_attn_ext's `int ir0, ir1` row ranges; rope's `int nr`. Real
/// graphs stay far below (2^31 elements per row or rows).
pub(super) fn fits_int(t: &RpcTensor) -> bool {
    let max = i32::MAX as u64;
    u64::from(t.ne[0]) <= max && nrows(t) <= max
}

pub(super) fn float(ty: u32) -> bool {
    matches!(ty, GGML_TYPE_F32 | GGML_TYPE_F16 | GGML_TYPE_BF16)
}

/// Types ggml-cpu has no row kernels for: `type_traits_cpu` (ggml-cpu.c)
/// gives them no `vec_dot`, so MUL_MAT would call a null pointer, and
/// `ggml_compute_forward_get_rows` (ops.cpp) aborts on them or, for q8_1
/// (no `to_float`), calls a null pointer. Every other known type has both.
pub(super) const CPU_NO_ROW_KERNELS: [&str; 7] = ["q8_1", "q8_K", "i8", "i16", "i32", "i64", "f64"];

/// A MUL_MAT `src0` type ggml-cpu multiplies (it has a `vec_dot`).
pub(super) fn cpu_mul_mat_src0(ty: u32) -> bool {
    type_info(ty).is_some_and(|i| !CPU_NO_ROW_KERNELS.contains(&i.name))
}

/// A GET_ROWS source ggml-cpu reads: the MUL_MAT types plus I32 (copied
/// by the f32 path).
pub(super) fn cpu_get_rows_src(ty: u32) -> bool {
    ty == GGML_TYPE_I32 || cpu_mul_mat_src0(ty)
}

/// MUL_MAT / MUL_MAT_ID src1 types for a `src0` of type `a`: F32
/// (converted to the vec_dot type with its from_float), the vec_dot type
/// itself, or BF16 / F16 widened to F32 when the vec_dot type is F32.
/// `ggml_backend_cpu_device_supports_op` accepts F32, the vec_dot type
/// and (vec_dot F32) BF16; the kernel GGML_ASSERTs that a src1 it must
/// convert is F32 or (vec_dot F32) F16 / BF16.
pub(super) fn mul_mat_src1_ok(a: u32, b: u32) -> bool {
    let Some(vdt) = cpu_types::vec_dot_type(a) else {
        return false;
    };
    b == GGML_TYPE_F32 || b == vdt || (b == GGML_TYPE_BF16 && vdt == GGML_TYPE_F32)
}

/// Rows packed and dims 2, 3 packed after dim 1: row `i` counted over
/// dims 1..3 as one run lies at `i * nb[1]`, for kernels that walk
/// `ggml_nrows` rows by `nb[1]` alone.
pub(super) fn flat_walk(t: &RpcTensor) -> bool {
    (t.ne[0] <= 1 || rows_contiguous(t)) && is_contiguous_1(t)
}

pub(super) fn divides(small: u32, big: u32) -> bool {
    small != 0 && big % small == 0
}

pub(super) fn can_repeat(b: &RpcTensor, a: &RpcTensor) -> bool {
    (0..4).all(|i| divides(b.ne[i], a.ne[i]))
}

pub(super) const GGML_TYPE_I8: u32 = 24;
pub(super) const GGML_TYPE_I16: u32 = 25;

/// Largest MUL_MAT_ID row map accepted, in bytes. `ggml_graph_plan`
/// sizes the work buffer with `n_as * ids->ne[0] * ids->ne[1] *
/// sizeof(mmid_row_mapping)` (8 bytes) plus a cache line per expert, and
/// the CPU backend allocates it with `new[]`, which aborts the process
/// when it fails: a tiny expert tensor (`n_as` matrices of one row) and a
/// large id tensor would ask for terabytes. 256 MiB covers 256 experts,
/// 8 per token, 16384 tokens.
pub const MAX_MUL_MAT_ID_MAP: u64 = 256 << 20;

/// Largest GATED_DELTA_NET head size (S_v) accepted. `ggml_graph_plan`
/// gives each thread `S_v + S_v * S_v` floats of work buffer when K > 1
/// (a private copy of one head's state), allocated with `new[]`, which
/// aborts the process when it fails; S_v comes from `v` alone, so an empty
/// `v` with a huge ne[0] would ask for exabytes. Real models use 64-256.
pub const MAX_DELTA_NET_HEAD: u32 = 1024;

/// Longest LIGHTNING_INDEXER key row accepted: the plan gives each thread
/// one row of `n_embd` floats to dequantize K into (1M floats: 4 MiB a
/// thread), sized from K's ne[0] alone.
pub const MAX_INDEXER_ROW: u32 = 1 << 20;

/// DeepSeek-V4's hyper-connection count, fixed in the kernels (`hc = 4`,
/// mixes of `(2 + hc) * hc` values per token).
pub(super) const DSV4_HC: u32 = 4;

pub(super) fn ne(t: &RpcTensor, d: usize) -> i64 {
    i64::from(t.ne[d])
}

/// Longest CROSS_ENTROPY_LOSS row accepted: ggml_graph_plan gives each
/// thread a row of `ne00` floats of work buffer (the log-softmax), sized
/// from the row length alone and allocated with `new[]`, which aborts
/// when it fails. 1M floats (4 MiB a thread) is four times the largest
/// vocabulary in use.
pub const MAX_CROSS_ENTROPY_ROW: u32 = 1 << 20;

/// `GGML_OP_POOL_MAX`, `GGML_OP_POOL_AVG` (`GGML_OP_POOL_COUNT` aborts).
pub(super) const POOL_MAX: i32 = 0;
pub(super) const POOL_AVG: i32 = 1;
/// `GGML_SCALE_MODE_BICUBIC` (NEAREST 0, BILINEAR 1), the flags.
pub(super) const SCALE_MODE_BILINEAR: i32 = 1;
pub(super) const SCALE_MODE_BICUBIC: i32 = 2;
pub(super) const SCALE_FLAG_ALIGN_CORNERS: i32 = 1 << 8;
pub(super) const SCALE_FLAG_ANTIALIAS: i32 = 1 << 9;

/// Largest work buffer a transposed convolution may ask for, in bytes.
/// `ggml_graph_plan` (ggml-cpu.c) sizes it as the kernel plus the source,
/// both in the kernel's element size, and the CPU backend allocates it
/// with `new[]`, which aborts the process when it fails; the kernels also
/// index it with `int`. 256 MiB, as for MUL_MAT_ID's row map.
pub const MAX_CONV_TRANSPOSE_WORK: u64 = 256 << 20;

/// `GGML_IM2COL_WORK_SIZE` (ggml-cpu/ops.h): the work buffer
/// ggml_graph_plan gives CONV_2D and CONV_3D.
pub(super) const IM2COL_WORK_SIZE: u64 = 16 << 20;

/// Longest OUT_PROD row of an F16 `src0` accepted: ggml_graph_plan gives
/// each thread `ne00` floats of work buffer to widen a row into (1M
/// floats: 4 MiB a thread, 256 MiB for 64 threads).
pub const MAX_OUT_PROD_F16_ROW: u32 = 1 << 20;

/// Source `i` of a node, or the refusal of a node that lacks it.
pub(super) fn source<'a>(
    s: &[Option<&'a RpcTensor>; MAX_SRC],
    op: u32,
    i: usize,
) -> Result<&'a RpcTensor> {
    s[i].ok_or_else(|| RpcError::refused(CALL, format!("op {op}: missing source {i}")))
}
