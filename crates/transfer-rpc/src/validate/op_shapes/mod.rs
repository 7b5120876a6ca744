//! Per-op shape, type, stride and parameter rules for graphs that ggml's
//! CPU backend will run. ggml's kernels `GGML_ASSERT` / `GGML_ABORT` (abort
//! the whole process) or index outside a tensor's extent when a node does
//! not meet their preconditions; the wire carries shapes, strides and
//! op_params the client chose. So a backend accepts an allowlist of ops
//! (those llama.cpp's dense and MoE graphs and test-backend-ops use), each
//! checked here (and in `op_shapes_ext`, the ops added for issue 11)
//! against what its ggml-cpu forward kernel requires; every other op is
//! refused.
//!
//! The rules cite the kernels of the llama.cpp that llama-cpp-sys-2
//! 0.1.161 vendors: `ggml/src/ggml-cpu/ops.cpp` (most ops),
//! `binary-ops.cpp`, `unary-ops.cpp`, `ggml-cpu.c` (MUL_MAT, the graph
//! plan) and `tiled/tiled.cpp` (K-quant MUL_MAT). Plain `assert()`s there
//! are compiled out (llama-cpp-sys builds Release / RelWithDebInfo, both
//! NDEBUG), but where a kernel indexes memory by the layout such an assert
//! describes, the layout is required here too. Besides the asserts, each
//! op's rule covers the layouts a kernel addresses differently from its
//! tensor's strides (rows walked as one flat run of `nb[1]` steps, rows
//! copied with `nb[1]` bytes): with those, strides of size-1 dimensions,
//! which `ggml_is_contiguous` ignores, decide where it writes.
//!
//! Fused kernels never run: the backend adds nodes with
//! `ggml_graph_add_node`, which records no use counts, so
//! `ggml_cpu_try_fuse_ops` (RMS_NORM + MUL) never matches.

use super::cpu_types;
use super::graph::ValidatedGraph;
use super::op_shapes_ext;
use super::ops::{
    GGML_OP_GET_ROWS, GGML_OP_GLU, GGML_OP_NONE, GGML_OP_PERMUTE, GGML_OP_RESHAPE,
    GGML_OP_SET_ROWS, GGML_OP_TRANSPOSE, GGML_OP_UNARY, GGML_OP_VIEW, is_view_op,
};
use super::types::{GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_I32, TypeInfo, type_info};
use crate::error::{Result, RpcError};
use crate::protocol::tensor::{MAX_SRC, RpcTensor};

const CALL: &str = "GRAPH_COMPUTE op check";
const GGML_TYPE_BF16: u32 = 30;

const OP_DUP: u32 = 1;
const OP_ADD: u32 = 2;
const OP_SUB: u32 = 6;
const OP_MUL: u32 = 7;
const OP_DIV: u32 = 8;
const OP_SCALE: u32 = 32;
const OP_CPY: u32 = 34;
const OP_CONT: u32 = 35;
const OP_NORM: u32 = 24;
const OP_RMS_NORM: u32 = 25;
const OP_MUL_MAT: u32 = 29;
const OP_SOFT_MAX: u32 = 46;
const OP_ROPE: u32 = 48;
const OP_ROPE_BACK: u32 = 49;
const OP_FLASH_ATTN_EXT: u32 = 74;

/// `GGML_ROPE_TYPE_*` (ggml.h).
const ROPE_NORMAL: i32 = 0;
const ROPE_NEOX: i32 = 2;
const ROPE_MROPE: i32 = 8;
const ROPE_VISION: i32 = 24;
const ROPE_IMROPE: i32 = 40;

/// `GGML_UNARY_OP_XIELU`.
const UNARY_XIELU: i32 = 17;
/// `GGML_GLU_OP_SWIGLU_OAI`.
const GLU_SWIGLU_OAI: i32 = 3;
/// `GGML_GLU_OP_SWIGLU_CLAMP`.
const GLU_SWIGLU_CLAMP: i32 = 6;
/// `GGML_HINT_SRC0_IS_HADAMARD` (MUL_MAT `op_params[1]`).
const HINT_SRC0_IS_HADAMARD: i32 = 1;
/// `GGML_PREC_DEFAULT` and `GGML_PREC_F32` (FLASH_ATTN_EXT `op_params[3]`).
const PREC_DEFAULT: i32 = 0;
const PREC_F32: i32 = 10;
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

fn info(t: &RpcTensor) -> Result<TypeInfo> {
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
fn fits_int(t: &RpcTensor) -> bool {
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
const CPU_NO_ROW_KERNELS: [&str; 7] = ["q8_1", "q8_K", "i8", "i16", "i32", "i64", "f64"];

/// A MUL_MAT `src0` type ggml-cpu multiplies (it has a `vec_dot`).
pub(super) fn cpu_mul_mat_src0(ty: u32) -> bool {
    type_info(ty).is_some_and(|i| !CPU_NO_ROW_KERNELS.contains(&i.name))
}

/// A GET_ROWS source ggml-cpu reads: the MUL_MAT types plus I32 (copied
/// by the f32 path).
fn cpu_get_rows_src(ty: u32) -> bool {
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

/// Checks every node of a validated graph against the allowlist.
pub fn check_graph_ops(g: &ValidatedGraph) -> Result<()> {
    for &n in &g.nodes {
        let mut srcs: [Option<&RpcTensor>; MAX_SRC] = [None; MAX_SRC];
        for (slot, s) in srcs.iter_mut().zip(g.srcs[n].iter()) {
            *slot = s.map(|i| &g.tensors[i]);
        }
        check_node(&g.tensors[n], &srcs, g.view_src[n].map(|i| &g.tensors[i]))?;
        check_reads_past_extent(g, n)?;
    }
    Ok(())
}

/// Reads a kernel makes past a source's own extent: they must at least
/// stay inside the source's buffer (the bytes read there are discarded).
fn check_reads_past_extent(g: &ValidatedGraph, n: usize) -> Result<()> {
    let r = &g.tensors[n];
    if !matches!(r.op, OP_ROPE | OP_ROPE_BACK) || nelements(r) == 0 {
        return Ok(());
    }
    let Some(c) = g.srcs[n][2] else {
        return Ok(());
    };
    // ggml_rope_cache_init (ops.cpp) reads freq_factors[i0 / 2] for every
    // even i0 < ne0, not only the n_dims / 2 factors the kernel asserts
    // (`src2->ne[0] >= n_dims / 2`): ne0 / 2 floats from the tensor's
    // start (ne0 is even, see check_node). Partial-rotary models give
    // n_dims / 2 factors, so the read may pass the tensor's end; refuse it
    // only where it would pass the end of the buffer.
    let need = 4 * (u64::from(r.ne[0]) / 2);
    let room = g
        .checked
        .get(c)
        .and_then(|t| t.placement)
        .map_or(0, |(region, off)| region.size.saturating_sub(off));
    if need > room {
        return refuse(
            r.op,
            format!("rope reads {need} bytes of frequency factors, {room} left in their buffer"),
        );
    }
    Ok(())
}

/// Checks one node against the builder rules of its op and the
/// preconditions of its ggml-cpu kernel.
pub fn check_node(
    r: &RpcTensor,
    s: &[Option<&RpcTensor>; MAX_SRC],
    view_src: Option<&RpcTensor>,
) -> Result<()> {
    let op = r.op;
    let src = |i: usize| -> Result<&RpcTensor> {
        s[i].ok_or_else(|| RpcError::refused(CALL, format!("op {op}: missing source {i}")))
    };
    if op != GGML_OP_NONE && !is_view_op(op) {
        for t in std::iter::once(r).chain(s.iter().flatten().copied()) {
            if !fits_int(t) {
                return refuse(
                    op,
                    format!("a row of {} or {} rows exceed 2^31 - 1", t.ne[0], nrows(t)),
                );
            }
        }
    }
    match op {
        GGML_OP_NONE => Ok(()),
        OP_ADD | OP_SUB | OP_MUL | OP_DIV => {
            let (a, b) = (src(0)?, src(1)?);
            // binary_op (binary-ops.cpp) has kernels for these (dst, src0,
            // src1) types only and GGML_ABORTs on any other: all F32, all
            // F16, all BF16, and F16 / BF16 with an F32 src1 (dst = src0).
            if r.ne != a.ne
                || r.ty != a.ty
                || !float(a.ty)
                || !(b.ty == a.ty || b.ty == GGML_TYPE_F32)
            {
                return refuse(op, "binary op shapes/types");
            }
            // apply_binary_op: GGML_ASSERT(ggml_can_repeat(src1, src0) &&
            // ggml_are_same_shape(src0, dst)), GGML_ASSERT(nb0 ==
            // sizeof(dst_t)), GGML_ASSERT(nb00 == sizeof(src0_t)); the
            // broadcast reads `i % ne1x`, so no src1 dim may be 0. src1's
            // nb[0] is free: a src1 whose rows are not packed (a permuted
            // operand, test_bin_bcast's perm1) goes through
            // vec_binary_op_non_contiguous, which reads element i10 <
            // ne10 at `i10 * nb10`, inside src1's own extent.
            if !can_repeat(b, a) || !rows_contiguous(a) || !rows_contiguous(r) {
                return refuse(
                    op,
                    "binary op operand does not broadcast, or src0 / result rows not packed",
                );
            }
            Ok(())
        }
        OP_NORM | OP_RMS_NORM => {
            let a = src(0)?;
            // ggml_compute_forward_norm / rms_norm (ops.cpp): F32 source
            // only (GGML_ABORT otherwise), the result is written as floats;
            // rms_norm GGML_ASSERTs src0->nb[0] == sizeof(float) and
            // memcpys ne00 floats into each dst row. norm_f32 takes any
            // nb00 / nb0: when either is not sizeof(float) it reads and
            // writes element i00 at `i00 * nb00` / `i00 * nb0` (inside each
            // tensor's extent), as for test_norm's noncontig_rows.
            let packed = op == OP_NORM || (rows_contiguous(a) && rows_contiguous(r));
            if r.ne != a.ne || r.ty != GGML_TYPE_F32 || a.ty != GGML_TYPE_F32 || !packed {
                return refuse(op, "norm must be F32, same shape (rms_norm: packed rows)");
            }
            // Both: `memcpy(&eps, dst->op_params, 4); GGML_ASSERT(eps >=
            // 0.0f)`, which NaN fails too.
            let eps = f32_param(r, 0);
            if eps.is_nan() || eps < 0.0 {
                return refuse(op, format!("norm eps {eps} is negative or NaN"));
            }
            Ok(())
        }
        OP_SCALE => {
            let a = src(0)?;
            // ggml_compute_forward_scale_f32 / _bf16 (ops.cpp):
            // GGML_ASSERT(ggml_is_contiguous(src0)),
            // GGML_ASSERT(ggml_is_contiguous(dst)), same shape. It then
            // walks ggml_nrows rows at `i1 * nb1` (dst) and `i1 * nb01`
            // (src0; the bias branch reads src0 with dst's nb1), copying
            // ne0 floats each: a size-1 dim 1 with a large nb[1] would
            // write past the tensor (flat_rows). scale_bf16 has the same
            // asserts and walks rows the same way (bf16 in, bf16 out: the
            // builder's result is a copy of the source's type); any other
            // type GGML_ABORTs.
            if r.ne != a.ne
                || r.ty != a.ty
                || !matches!(a.ty, GGML_TYPE_F32 | GGML_TYPE_BF16)
                || !rows_contiguous(a)
                || !rows_contiguous(r)
            {
                return refuse(op, "scale must be F32 or BF16, same shape, packed rows");
            }
            if !flat_rows(a) || !flat_rows(r) {
                return refuse(
                    op,
                    "scale source and result must be contiguous with rows nb[1] apart",
                );
            }
            Ok(())
        }
        GGML_OP_UNARY => {
            let a = src(0)?;
            // unary_op / unary_op_params (unary-ops.cpp) and the gelu,
            // gelu_erf, gelu_quick, silu kernels (ops.cpp) take F32, F16
            // and BF16 with dst of the source type; apply_unary_op
            // GGML_ASSERTs ggml_is_contiguous_rows of both, nb0 ==
            // sizeof(dst_t), nb00 == sizeof(src0_t), same shape.
            if r.ne != a.ne
                || r.ty != a.ty
                || !float(a.ty)
                || !rows_contiguous(a)
                || !rows_contiguous(r)
            {
                return refuse(op, "unary shapes/types");
            }
            // XIELU goes through apply_unary_op_functor, which
            // GGML_ASSERTs ggml_is_contiguous_1(src0) and (dst).
            if r.op_params[0] == UNARY_XIELU && (!is_contiguous_1(a) || !is_contiguous_1(r)) {
                return refuse(op, "xielu source and result must be contiguous past dim 1");
            }
            Ok(())
        }
        GGML_OP_GLU => {
            let a = src(0)?;
            let glu = r.op_params[0];
            // ggml_compute_forward_glu (ops.cpp): SWIGLU_OAI has an F32
            // kernel only, SWIGLU_CLAMP F32 and F16, the others F32, F16
            // and BF16; GGML_ABORT on any other type. dst is written as
            // the source type.
            let type_ok = match glu {
                GLU_SWIGLU_OAI => a.ty == GGML_TYPE_F32,
                GLU_SWIGLU_CLAMP => matches!(a.ty, GGML_TYPE_F32 | GGML_TYPE_F16),
                _ => float(a.ty),
            };
            if !type_ok || r.ty != a.ty || !rows_contiguous(a) || !rows_contiguous(r) {
                return refuse(op, "glu types");
            }
            // Every glu kernel GGML_ASSERTs ggml_is_contiguous_1(src0),
            // (src1) and (dst) and walks ggml_nrows rows by nb[1] alone.
            if !is_contiguous_1(a) || !is_contiguous_1(r) {
                return refuse(op, "glu source and result must be contiguous past dim 1");
            }
            match s[1] {
                Some(b) => {
                    // GGML_ASSERT(src0->type == src1->type); dst->ne[0] ==
                    // nc and ggml_nrows(dst) == nr (same shape here).
                    if b.ne != a.ne
                        || b.ty != a.ty
                        || r.ne != a.ne
                        || !rows_contiguous(b)
                        || !is_contiguous_1(b)
                    {
                        return refuse(op, "glu with gate: shapes");
                    }
                }
                None => {
                    // Every glu kernel takes `nc = src0->ne[0] / 2` (rounded
                    // down, as ggml_glu_impl's result) and reads the two
                    // halves [0, nc) and [nc, 2 nc) of each row: with an odd
                    // ne[0] the last element is never read.
                    if r.ne != [a.ne[0] / 2, a.ne[1], a.ne[2], a.ne[3]] {
                        return refuse(op, "glu: result must be half of src0");
                    }
                }
            }
            // swiglu_oai / swiglu_clamp: `std::clamp(x, -limit, limit)`
            // with limit = op_params[3]; clamp's lo <= hi is a
            // precondition (undefined behaviour otherwise).
            if matches!(glu, GLU_SWIGLU_OAI | GLU_SWIGLU_CLAMP) {
                let limit = f32_param(r, 3);
                if limit.is_nan() || limit < 0.0 {
                    return refuse(op, format!("glu limit {limit} is negative or NaN"));
                }
            }
            Ok(())
        }
        OP_MUL_MAT => {
            let (a, b) = (src(0)?, src(1)?);
            let ai = info(a)?;
            let transposed = a.nb[0] > a.nb[1];
            let hadamard = r.op_params[1] == HINT_SRC0_IS_HADAMARD;
            // With the Hadamard hint the kernel never reads src0 nor
            // converts src1: ggml_compute_forward_fwht (ops.cpp) reads
            // src1 rows as F32 or F16 (GGML_ABORT on any other type), and
            // ggml_backend_cpu_device_supports_op accepts exactly those two
            // for an F32 src0 and result. Without the hint, src1 must be
            // one the vec_dot path converts.
            let src1_ok = if hadamard {
                a.ty == GGML_TYPE_F32 && matches!(b.ty, GGML_TYPE_F32 | GGML_TYPE_F16)
            } else {
                mul_mat_src1_ok(a.ty, b.ty)
            };
            // ggml_mul_mat's builder rules, and ggml_compute_forward_mul_mat
            // (ggml-cpu.c): GGML_ASSERT(ne0 == ne01, ne1 == ne11, ne2 ==
            // ne12, ne3 == ne13), GGML_ASSERT(nb00 == type size of src0),
            // GGML_ASSERT(nb10 == type size of src1); r2 = ne12 / ne02,
            // r3 = ne13 / ne03 divide; src0 needs a vec_dot.
            if a.ne[0] != b.ne[0]
                || !divides(a.ne[2], b.ne[2])
                || !divides(a.ne[3], b.ne[3])
                || transposed
                || !cpu_mul_mat_src0(a.ty)
                || u64::from(a.nb[0]) != ai.type_size
                || !src1_ok
                || r.ty != GGML_TYPE_F32
                || r.ne != [a.ne[1], b.ne[1], b.ne[2], b.ne[3]]
                || !rows_contiguous(b)
                || !is_contiguous(r)
            {
                return refuse(op, "mul_mat shapes/types");
            }
            // "dst cannot be transposed or permuted": GGML_ASSERT(nb0 ==
            // sizeof(float)), GGML_ASSERT(nb0 <= nb1), (nb1 <= nb2),
            // (nb2 <= nb3), on size-1 dims too (there and in the tiled
            // driver, tiled/tiled.cpp).
            if r.nb[0] != 4 || !strides_ordered(r) {
                return refuse(
                    op,
                    "mul_mat result strides must be nb0 = 4 <= nb1 <= nb2 <= nb3",
                );
            }
            // The tiled K-quant driver (tiled/tiled.cpp) reads a src1 that
            // is already Q8_K at `(flat row) * nb[1]`, counting rows over
            // dims 1..3 as one run.
            if cpu_types::tiled_mul_mat_src0(a.ty) && b.ty != GGML_TYPE_F32 && !flat_walk(b) {
                return refuse(
                    op,
                    "mul_mat of a tiled type by Q8_K needs src1 rows nb[1] apart",
                );
            }
            // op_params[1] == GGML_HINT_SRC0_IS_HADAMARD makes the kernel
            // ignore src0 and run ggml_compute_forward_fwht (ops.cpp): it
            // GGML_ASSERTs (n & (n - 1)) == 0 for n = ne10 and writes n
            // floats into each dst row, whose length is ne0 = ne01. So K
            // must be a power of two and src0 the square K x K Hadamard
            // matrix (as llama_mul_mat_hadamard builds it).
            if hadamard {
                let k = b.ne[0];
                if !k.is_power_of_two() || a.ne[1] != k {
                    return refuse(
                        op,
                        format!(
                            "hadamard mul_mat needs a square src0 of a power-of-two size, \
                             got K = {k}, {} rows",
                            a.ne[1]
                        ),
                    );
                }
            }
            Ok(())
        }
        GGML_OP_RESHAPE => {
            let a = src(0)?;
            if r.ty != a.ty
                || nelements(r) != nelements(a)
                || !is_contiguous(a)
                || !is_contiguous(r)
                || view_src.is_none()
            {
                return refuse(
                    op,
                    "reshape of a non-contiguous tensor or element count change",
                );
            }
            Ok(())
        }
        GGML_OP_VIEW | GGML_OP_PERMUTE | GGML_OP_TRANSPOSE => {
            let a = src(0)?;
            if r.ty != a.ty || view_src.is_none() {
                return refuse(op, "views must keep the type and have a view source");
            }
            if op != GGML_OP_VIEW && nelements(r) != nelements(a) {
                return refuse(op, "permute/transpose must keep the element count");
            }
            Ok(())
        }
        OP_DUP | OP_CONT | OP_CPY => check_copy(r, s),
        GGML_OP_GET_ROWS => {
            let a = src(0)?;
            // ggml_compute_forward_get_rows (ops.cpp): quantized sources
            // dequantize, F16 / BF16 convert, F32 / I32 copy ne00 elements
            // of 4 bytes; every path writes floats (or the I32 bits) into
            // a packed dst row and reads a packed source row (assert(nb00
            // == type size)).
            let ok_type = (r.ty == GGML_TYPE_F32 && cpu_get_rows_src(a.ty))
                || (a.ty == GGML_TYPE_I32 && r.ty == GGML_TYPE_I32);
            if !ok_type || !rows_contiguous(r) || !rows_contiguous(a) {
                return refuse(op, "get_rows types");
            }
            Ok(())
        }
        GGML_OP_SET_ROWS => {
            // ggml_compute_forward_set_rows (ops.cpp): src0 F32 / F16
            // (GGML_ABORT otherwise, checked with the indices in graph.rs),
            // rows of nc = ne00 elements written with the dst type's
            // from_float (called unchecked: null for the iq2 / iq3 / iq1
            // types and the integers but I32) into packed dst rows, read
            // from packed src0 rows. nc is dst's ne[0] (graph.rs), a whole
            // number of dst blocks (check_shape).
            if !cpu_types::has_from_float(r.ty) || !rows_contiguous(r) || !rows_contiguous(src(0)?)
            {
                return refuse(
                    op,
                    "set_rows destination needs a from_float and packed rows",
                );
            }
            Ok(())
        }
        // ROPE_BACK runs ROPE's kernel (ggml_compute_forward_rope_flt with
        // forward = false, which only flips the sine).
        OP_ROPE | OP_ROPE_BACK => check_rope(r, s),
        OP_SOFT_MAX => {
            let a = src(0)?;
            // ggml_compute_forward_soft_max (ops.cpp): F32 only
            // (GGML_ABORT otherwise); reads and writes ne00 packed floats
            // per row; the mask row i01 of ne00 F16/F32 values, broadcast
            // over dims 2 and 3 by `%`. scale and max_bias (op_params 0,
            // 1) are plain floats.
            if a.ty != GGML_TYPE_F32
                || r.ty != GGML_TYPE_F32
                || r.ne != a.ne
                || !is_contiguous(a)
                || !is_contiguous(r)
            {
                return refuse(op, "soft_max shapes/types");
            }
            if let Some(m) = s[1] {
                if !matches!(m.ty, GGML_TYPE_F16 | GGML_TYPE_F32)
                    || !is_contiguous(m)
                    || m.ne[0] != a.ne[0]
                    || m.ne[1] < a.ne[1]
                    || !divides(m.ne[2], a.ne[2])
                    || !divides(m.ne[3], a.ne[3])
                {
                    return refuse(op, "soft_max mask");
                }
            }
            if let Some(k) = s[2] {
                // sinks: `sk[i02]` read as packed floats for every head
                // i02 < ne02 (ggml_soft_max_add_sinks: F32, ne[0] == ne02).
                if k.ty != GGML_TYPE_F32 || k.ne[0] != a.ne[2] || !rows_contiguous(k) {
                    return refuse(op, "soft_max sinks must be F32 with one per head");
                }
            }
            Ok(())
        }
        OP_FLASH_ATTN_EXT => check_flash_attn_ext(r, s),
        _ => {
            op_shapes_ext::check(r, s).unwrap_or_else(|| refuse(op, "not on the compute allowlist"))
        }
    }
}

/// DUP, CONT and CPY: `ggml_compute_forward_dup` (ops.cpp; CPY and CONT
/// call it too), which picks a path by the (src0, dst) types.
fn check_copy(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
    let op = r.op;
    let Some(a) = s[0] else {
        return refuse(op, "copy needs a source");
    };
    // Every path: GGML_ASSERT(ggml_nelements(dst) == ggml_nelements(src0)).
    if nelements(r) != nelements(a) {
        return refuse(op, "copy source and result element counts differ");
    }
    if op == OP_CPY {
        // ggml_cpy's result is a view of src1; the dequantizing path
        // below computes dst offsets from src1's shape and strides.
        let Some(b) = s[1] else {
            return refuse(op, "cpy needs a destination");
        };
        if r.ty != b.ty || r.ne != b.ne || r.nb != b.nb {
            return refuse(op, "cpy result must have its destination's layout");
        }
    }
    let (from, to) = (a.ty, r.ty);
    if from == to {
        // dup_bytes: memcpy of whole blocks, for any type. When dst is
        // contiguous but the pair is neither both contiguous (dup_same_cont)
        // nor same-shaped with packed rows (copy by rows), it copies rows of
        // `ne00 * type_size` bytes: for a block type that is block_size
        // times the row, written past dst's end.
        let flat_dst_path = is_contiguous(r)
            && !is_contiguous(a)
            && !(r.ne == a.ne && rows_contiguous(a) && rows_contiguous(r));
        if cpu_types::is_quantized(from) && flat_dst_path {
            return refuse(
                op,
                "same-type copy of blocks into a contiguous result of another shape \
                 needs a contiguous source",
            );
        }
        return Ok(());
    }
    let float_like = |t: u32| float(t);
    if float_like(from) && float_like(to) {
        // dup_flt between F32 / F16 / BF16: element-wise, any strides.
        return Ok(());
    }
    if (from == GGML_TYPE_F32 && to == GGML_TYPE_I32)
        || (from == GGML_TYPE_I32 && to == GGML_TYPE_F32)
    {
        // dup_flt<float, int32_t> / dup_flt<int32_t, float>.
        return Ok(());
    }
    if float_like(from) && cpu_types::is_quantized(to) {
        // dup_to_q: GGML_ABORT unless dst is contiguous, nb00 ==
        // sizeof(src_t) and dst has a from_float. Each source row of ne00
        // elements is converted into params->wdata at (ne00 +
        // CACHE_LINE_SIZE_F32) * ith floats, which ggml_graph_plan sizes
        // by dst's ne[0]: ne00 may not exceed it. quantize_row_q writes
        // whole blocks: ne00 is a multiple of dst's block size.
        let block = type_info(to).map_or(u64::MAX, |i| i.block_size);
        let a_ts = type_info(from).map_or(0, |i| i.type_size);
        if !cpu_types::has_from_float(to)
            || !is_contiguous(r)
            || u64::from(a.nb[0]) != a_ts
            || a.ne[0] > r.ne[0]
            || u64::from(a.ne[0]) % block != 0
        {
            return refuse(
                op,
                "quantizing copy needs a contiguous destination with a from_float, \
                 packed source rows of whole blocks no longer than the result's",
            );
        }
        return Ok(());
    }
    if cpu_types::quantized_with_to_float(from) && to == GGML_TYPE_F32 {
        // dup_from_q: reads src1 (GGML_TENSOR_BINARY_OP_LOCALS), a null
        // pointer for DUP / CONT; GGML_ASSERT(nb10 == sizeof(float)),
        // GGML_ASSERT(ne10 % qk == 0 || ggml_is_contiguous(dst)).
        let block = type_info(from).map_or(u64::MAX, |i| i.block_size);
        let ok =
            op == OP_CPY && r.nb[0] == 4 && (u64::from(r.ne[0]) % block == 0 || is_contiguous(r));
        if !ok {
            return refuse(
                op,
                "dequantizing copy needs CPY into F32 with packed rows of whole blocks",
            );
        }
        return Ok(());
    }
    // I32 to anything but F32, F16 / BF16 to I32 (dup_to_q with an unsized
    // work buffer), quantized to anything but F32 or itself, and the other
    // integer types: GGML_ABORT or a null call.
    refuse(
        op,
        format!(
            "ggml-cpu has no copy from {} to {}",
            type_info(from).map_or("?", |i| i.name),
            type_info(to).map_or("?", |i| i.name)
        ),
    )
}

/// ROPE and ROPE_BACK: `ggml_compute_forward_rope_flt` (ops.cpp), all five
/// modes.
fn check_rope(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
    let op = r.op;
    let (Some(a), Some(b)) = (s[0], s[1]) else {
        return refuse(op, "rope needs two sources");
    };
    // op_params the kernel reads: [1] n_dims, [2] mode, [4] n_ctx_orig,
    // [5..=10] float yarn parameters (any value: float math only),
    // [11..=14] sections (multi-rope only), [15] n_offs.
    let n_dims = i64::from(r.op_params[1]);
    let mode = r.op_params[2];
    let n_offs = i64::from(r.op_params[15]);
    let ne0 = i64::from(a.ne[0]);
    let vector = b.ne[1] == 1 && b.ne[2] == 1 && b.ne[3] == 1;
    // The kernel's `switch (mode)`: NORMAL 0, NEOX 2, MROPE 8, VISION 24,
    // IMROPE 40; GGML_ABORT("rope type not supported") on any other.
    // `mode & GGML_ROPE_TYPE_MROPE` (8, 24, 40) reads 4 positions per
    // token (pos[i2 + ne2 * k], k < 4) and the sections.
    if !matches!(
        mode,
        ROPE_NORMAL | ROPE_NEOX | ROPE_MROPE | ROPE_VISION | ROPE_IMROPE
    ) {
        return refuse(op, format!("rope mode {mode} is not supported"));
    }
    let multi = mode & ROPE_MROPE != 0;
    let positions = u64::from(a.ne[2]) * if multi { 4 } else { 1 };
    // ggml_compute_forward_rope: F16 / F32 source only (GGML_ABORT on
    // BF16 and the rest), dst of the same type;
    // GGML_ASSERT(src1->type == GGML_TYPE_I32), positions read as a
    // packed int32 array (the builder's `a->ne[2] == b->ne[0]`, times 4
    // for multi-rope, ggml_is_vector(b)); GGML_ASSERT(nb0 == nb00),
    // GGML_ASSERT(nb0 == sizeof(T)).
    if b.ty != GGML_TYPE_I32
        || !vector
        || !rows_contiguous(b)
        || u64::from(b.ne[0]) != positions
        || r.ne != a.ne
        || r.ty != a.ty
        || !matches!(a.ty, GGML_TYPE_F32 | GGML_TYPE_F16)
        || !rows_contiguous(a)
        || !rows_contiguous(r)
    {
        return refuse(op, "rope shapes/types");
    }
    // GGML_ASSERT(n_dims <= ne0), GGML_ASSERT(n_dims % 2 == 0) (n_dims 0
    // makes theta_scale pow(base, -inf): refused as the builder's callers
    // never send it).
    if n_dims <= 0 || n_dims % 2 != 0 || n_dims > ne0 {
        return refuse(op, format!("rope n_dims {n_dims} for rows of {ne0}"));
    }
    // GGML_ASSERT(n_offs >= 0), GGML_ASSERT(n_offs % 2 == 0),
    // GGML_ASSERT(n_offs + n_dims <= ne0).
    if n_offs < 0 || n_offs % 2 != 0 || n_offs + n_dims > ne0 {
        return refuse(
            op,
            format!("rope n_offs {n_offs} with n_dims {n_dims} for rows of {ne0}"),
        );
    }
    // The pass that copies the channels outside [n_offs, n_offs + n_dims)
    // copies pairs dst[i0], dst[i0 + 1] for even i0 < ne0: with ne0 odd
    // (n_dims is even, so some channel is left) its last pair writes one
    // element past the row.
    if ne0 % 2 != 0 {
        return refuse(op, format!("rope rows of odd length {ne0}"));
    }
    if multi {
        // ggml_mrope_cache_init: `sector = (i0 / 2) % sect_dims` over the
        // four sections, GGML_ASSERT(sect_dims <= ne0); the kernel
        // GGML_ASSERTs sections[0] > 0 || sections[1] > 0 || sections[2]
        // > 0. Negative sections could make the sum 0 (division by zero).
        // imrope compares `sector < 3 * sections[k]` in int.
        let sections: [i64; 4] = std::array::from_fn(|k| i64::from(r.op_params[11 + k]));
        let sum: i64 = sections.iter().sum();
        if sections.iter().any(|&x| x < 0)
            || sections[..3].iter().all(|&x| x == 0)
            || sum > ne0
            || sections.iter().any(|&x| 3 * x > i64::from(i32::MAX))
        {
            return refuse(op, format!("rope sections {sections:?} for rows of {ne0}"));
        }
    }
    // VISION rotates pairs (i, i + n_dims) over the whole row:
    // GGML_ASSERT(n_dims == ne0 / 2), GGML_ASSERT(n_offs == 0).
    if mode == ROPE_VISION && (n_dims != ne0 / 2 || n_offs != 0) {
        return refuse(
            op,
            format!("vision rope needs n_dims = ne0 / 2 and no offset, got {n_dims} / {n_offs}"),
        );
    }
    if let Some(c) = s[2] {
        // GGML_ASSERT(src2->type == GGML_TYPE_F32), GGML_ASSERT(src2->ne[0]
        // >= n_dims / 2); read as a packed float array (its reach past
        // the tensor: check_reads_past_extent).
        if c.ty != GGML_TYPE_F32 || i64::from(c.ne[0]) < n_dims / 2 || !rows_contiguous(c) {
            return refuse(op, "rope frequency factors");
        }
    }
    Ok(())
}

/// FLASH_ATTN_EXT: `ggml_compute_forward_flash_attn_ext` and its one-chunk,
/// tiled and split-KV paths (ops.cpp).
fn check_flash_attn_ext(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
    let op = r.op;
    let (Some(q), Some(k), Some(v)) = (s[0], s[1], s[2]) else {
        return refuse(op, "flash_attn_ext needs three sources");
    };
    // GGML_ASSERT(ne0 == DV), (ne2 == N), (nbq0 / nbk0 / nbv0 == type
    // size), (neq0 == DK == nek0); K rows ic < nek1 of V (nev1 == nek1);
    // broadcast rk2 = neq2 / nek2, rv2 = neq2 / nev2, rk3 / rv3 with equal
    // dim 3; Q is read as F32. K: GGML_ASSERT(from_float of its vec_dot
    // type) and an unchecked call of its vec_dot (Q is converted into
    // DK floats of work buffer, room for any vec_dot row). V:
    // GGML_ASSERT(F32 or a to_float). Both sets are the MUL_MAT src0
    // types. The tiled and split-KV paths only run for F32 / F16 K == V.
    if k.ne[0] != q.ne[0]
        || v.ne[1] != k.ne[1]
        || !divides(k.ne[2], q.ne[2])
        || !divides(v.ne[2], q.ne[2])
        || q.ne[3] != k.ne[3]
        || q.ne[3] != v.ne[3]
        || q.ty != GGML_TYPE_F32
        || !cpu_mul_mat_src0(k.ty)
        || !cpu_mul_mat_src0(v.ty)
        || r.ty != GGML_TYPE_F32
        || r.ne != [v.ne[0], q.ne[2], q.ne[1], q.ne[3]]
        || !is_contiguous(r)
        || !rows_contiguous(q)
        || !rows_contiguous(k)
        || !rows_contiguous(v)
    {
        return refuse(op, "flash_attn_ext shapes/types");
    }
    // "dst cannot be transposed or permuted": GGML_ASSERT(nb0 ==
    // sizeof(float)), (nb0 <= nb1), (nb1 <= nb2), (nb2 <= nb3), size-1
    // dims included. Every path then stores a result row with
    // `memcpy(dst + (i3*ne2*ne1 + i2 + i1*ne1)*nb1, VKQ32, nb1)`: nb1
    // bytes per row, rows counted flat; nb1 must be the row size.
    if r.nb[0] != 4 || !strides_ordered(r) || u64::from(r.nb[1]) != row_bytes(r) {
        return refuse(
            op,
            "flash_attn_ext result must be packed, nb0 = 4 <= nb1 = row <= nb2 <= nb3",
        );
    }
    // switch (dst->op_params[3]): GGML_PREC_DEFAULT or GGML_PREC_F32, else
    // GGML_ABORT. op_params 0..=2 (scale, max_bias, softcap) are floats.
    let prec = r.op_params[3];
    if !matches!(prec, PREC_DEFAULT | PREC_F32) {
        return refuse(op, format!("flash_attn_ext precision {prec}"));
    }
    // The chunk loops take q rows as `int` (ir0, ir1 narrowed from
    // int64): past i32::MAX rows they would index from negative rows
    // (refused for every op by fits_int).
    if k.ne[0] > MAX_FLASH_ATTN_HEAD || v.ne[0] > MAX_FLASH_ATTN_HEAD {
        return refuse(
            op,
            format!(
                "flash_attn_ext head sizes {} / {} exceed {MAX_FLASH_ATTN_HEAD}",
                k.ne[0], v.ne[0]
            ),
        );
    }
    if let Some(m) = s[3] {
        // The mask is read as F16 (GGML_CPU_FP16_TO_FP32(mp[ic])) at row
        // iq1 < neq1, ic < nek1, broadcast over dims 2 and 3 by `%`.
        if m.ty != GGML_TYPE_F16
            || !is_contiguous(m)
            || m.ne[0] != k.ne[1]
            || m.ne[1] < q.ne[1]
            || !divides(m.ne[2], q.ne[2])
            || !divides(m.ne[3], q.ne[3])
        {
            return refuse(op, "flash_attn_ext mask");
        }
    }
    if let Some(k) = s[4] {
        // sinks: `((float *) sinks->data)[h]` for every head h < neq2
        // (ggml_flash_attn_ext_add_sinks: F32, ne[0] == neq2).
        if k.ty != GGML_TYPE_F32 || k.ne[0] != q.ne[2] || !rows_contiguous(k) {
            return refuse(op, "flash_attn_ext sinks must be F32 with one per head");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::types::GGML_TYPE_Q4_0;

    const Q8_0: u32 = 8;
    const Q8_1: u32 = 9;
    const Q8_K: u32 = 15;
    const Q4_K: u32 = 12;

    /// A packed tensor of `ty` with `ne`.
    fn packed(ty: u32, ne: [u32; 4]) -> RpcTensor {
        let i = type_info(ty).map_or((1, 4), |i| (i.block_size, i.type_size));
        let row = u64::from(ne[0]) / i.0 * i.1;
        let nb1 = row as u32;
        RpcTensor {
            ty,
            ne,
            nb: [i.1 as u32, nb1, nb1 * ne[1], nb1 * ne[1] * ne[2]],
            ..RpcTensor::default()
        }
    }

    fn srcs<'a>(a: &'a RpcTensor, b: Option<&'a RpcTensor>) -> [Option<&'a RpcTensor>; MAX_SRC] {
        let mut s = [None; MAX_SRC];
        s[0] = Some(a);
        s[1] = b;
        s
    }

    /// MUL_MAT of a `ty` matrix [256, 8] by F32 activations [256, 3], as
    /// ggml_mul_mat builds it.
    fn mul_mat(ty: u32) -> Result<()> {
        let w = packed(ty, [256, 8, 1, 1]);
        let x = packed(GGML_TYPE_F32, [256, 3, 1, 1]);
        let mut r = packed(GGML_TYPE_F32, [8, 3, 1, 1]);
        r.op = OP_MUL_MAT;
        check_node(&r, &srcs(&w, Some(&x)), None)
    }

    /// GET_ROWS of 2 rows of a `ty` table [256, 8] into F32, as
    /// ggml_get_rows builds it.
    fn get_rows(ty: u32) -> Result<()> {
        let table = packed(ty, [256, 8, 1, 1]);
        let idx = packed(GGML_TYPE_I32, [2, 1, 1, 1]);
        let mut r = packed(GGML_TYPE_F32, [256, 2, 1, 1]);
        r.op = GGML_OP_GET_ROWS;
        check_node(&r, &srcs(&table, Some(&idx)), None)
    }

    #[test]
    fn quantized_weights_are_multiplied_and_read() {
        for ty in [GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q4_0, Q8_0, Q4_K] {
            assert!(mul_mat(ty).is_ok(), "mul_mat src0 type {ty}");
            assert!(get_rows(ty).is_ok(), "get_rows type {ty}");
        }
        // A quantized matrix whose rows are not packed blocks is refused.
        let mut w = packed(Q8_0, [256, 8, 1, 1]);
        w.nb[0] = 4;
        let x = packed(GGML_TYPE_F32, [256, 3, 1, 1]);
        let mut r = packed(GGML_TYPE_F32, [8, 3, 1, 1]);
        r.op = OP_MUL_MAT;
        assert!(check_node(&r, &srcs(&w, Some(&x)), None).is_err());
    }

    #[test]
    fn types_without_cpu_row_kernels_are_refused() {
        // ggml-cpu would call a null vec_dot / to_float or abort on these.
        for ty in [Q8_1, Q8_K, 24, 25, GGML_TYPE_I32, 27, 28] {
            assert!(mul_mat(ty).is_err(), "mul_mat src0 type {ty}");
        }
        for ty in [Q8_1, Q8_K, 24, 25, 27, 28] {
            assert!(get_rows(ty).is_err(), "get_rows type {ty}");
        }
    }

    fn f32_bits(v: f32) -> i32 {
        v.to_bits() as i32
    }

    fn node(ty: u32, ne: [u32; 4], op: u32) -> RpcTensor {
        let mut r = packed(ty, ne);
        r.op = op;
        r
    }

    #[test]
    fn norm_eps_must_be_a_non_negative_number() {
        let a = packed(GGML_TYPE_F32, [4, 2, 1, 1]);
        for op in [OP_NORM, OP_RMS_NORM] {
            let mut r = node(GGML_TYPE_F32, [4, 2, 1, 1], op);
            for (eps, ok) in [
                (1e-5f32, true),
                (0.0, true),
                (-1e-5, false),
                (f32::NAN, false),
            ] {
                r.op_params[0] = f32_bits(eps);
                assert_eq!(
                    check_node(&r, &srcs(&a, None), None).is_ok(),
                    ok,
                    "{op} {eps}"
                );
            }
        }
    }

    #[test]
    fn scale_rows_must_be_flat() {
        let a = packed(GGML_TYPE_F32, [4, 1, 3, 1]);
        let r = node(GGML_TYPE_F32, [4, 1, 3, 1], OP_SCALE);
        assert!(check_node(&r, &srcs(&a, None), None).is_ok());
        // Contiguous for ggml (ne[1] == 1), but rows are walked by nb[1].
        let mut wide = r.clone();
        wide.nb[1] = 1 << 20;
        assert!(is_contiguous(&wide));
        assert!(check_node(&wide, &srcs(&a, None), None).is_err());
        let mut padded = a.clone();
        padded.ne = [4, 3, 1, 1];
        padded.nb = [4, 32, 96, 96];
        let r = node(GGML_TYPE_F32, [4, 3, 1, 1], OP_SCALE);
        assert!(check_node(&r, &srcs(&padded, None), None).is_err());
    }

    #[test]
    fn contiguous_1_frees_dim_1_only() {
        let mut t = packed(GGML_TYPE_F32, [4, 2, 3, 1]);
        assert!(is_contiguous_1(&t));
        t.nb = [4, 32, 64, 192];
        assert!(is_contiguous_1(&t) && !is_contiguous(&t));
        t.nb = [4, 16, 64, 192];
        assert!(!is_contiguous_1(&t));
    }

    #[test]
    fn glu_types_limits_and_layout() {
        let glu = |ty: u32, op: i32, limit: f32, a_nb: Option<[u32; 4]>| {
            let mut a = packed(ty, [8, 2, 3, 1]);
            if let Some(nb) = a_nb {
                a.nb = nb;
            }
            let mut r = node(ty, [4, 2, 3, 1], GGML_OP_GLU);
            r.op_params[0] = op;
            r.op_params[3] = f32_bits(limit);
            check_node(&r, &srcs(&a, None), None).is_ok()
        };
        assert!(glu(GGML_TYPE_F32, 3, 7.0, None));
        assert!(!glu(GGML_TYPE_F16, 3, 7.0, None));
        assert!(!glu(GGML_TYPE_F32, 3, -7.0, None));
        assert!(!glu(GGML_TYPE_F32, 6, f32::NAN, None));
        assert!(glu(GGML_TYPE_F16, 6, 7.0, None));
        assert!(!glu(GGML_TYPE_BF16, 6, 7.0, None));
        assert!(glu(GGML_TYPE_BF16, 2, 0.0, None));
        assert!(!glu(GGML_TYPE_F32, 2, 0.0, Some([4, 32, 128, 384])));
        assert!(glu(GGML_TYPE_F32, 2, 0.0, Some([4, 64, 128, 384])));
    }

    fn rope(ty: u32, ne0: u32, n_dims: i32, n_offs: i32, pos_nb0: u32) -> Result<()> {
        let a = packed(ty, [ne0, 2, 3, 1]);
        let mut pos = packed(GGML_TYPE_I32, [3, 1, 1, 1]);
        pos.nb[0] = pos_nb0;
        let mut r = node(ty, [ne0, 2, 3, 1], OP_ROPE);
        r.op_params[1] = n_dims;
        r.op_params[15] = n_offs;
        check_node(&r, &srcs(&a, Some(&pos)), None)
    }

    #[test]
    fn rope_params_types_and_rows() {
        assert!(rope(GGML_TYPE_F32, 8, 4, 0, 4).is_ok());
        assert!(rope(GGML_TYPE_F16, 8, 4, 4, 4).is_ok());
        assert!(rope(GGML_TYPE_BF16, 8, 4, 0, 4).is_err());
        for n_offs in [1, -2, 6] {
            assert!(rope(GGML_TYPE_F32, 8, 4, n_offs, 4).is_err(), "{n_offs}");
        }
        assert!(rope(GGML_TYPE_F32, 7, 4, 0, 4).is_err());
        assert!(rope(GGML_TYPE_F32, 8, 4, 0, 8).is_err());
    }

    #[test]
    fn mul_mat_result_strides_and_hadamard_hint() {
        let w = packed(GGML_TYPE_F32, [4, 3, 1, 1]);
        let x = packed(GGML_TYPE_F32, [4, 2, 1, 1]);
        let mut r = node(GGML_TYPE_F32, [3, 2, 1, 1], OP_MUL_MAT);
        assert!(check_node(&r, &srcs(&w, Some(&x)), None).is_ok());
        for nb in [[4, 12, 4, 4], [4, 12, 24, 16]] {
            let mut bad = r.clone();
            bad.nb = nb;
            assert!(is_contiguous(&bad));
            assert!(
                check_node(&bad, &srcs(&w, Some(&x)), None).is_err(),
                "{nb:?}"
            );
        }
        // K = 4 with 3 result rows, K = 6: refused with the hint.
        r.op_params[1] = HINT_SRC0_IS_HADAMARD;
        assert!(check_node(&r, &srcs(&w, Some(&x)), None).is_err());
        let h = packed(GGML_TYPE_F32, [4, 4, 1, 1]);
        let r4 = {
            let mut r = node(GGML_TYPE_F32, [4, 2, 1, 1], OP_MUL_MAT);
            r.op_params[1] = HINT_SRC0_IS_HADAMARD;
            r
        };
        assert!(check_node(&r4, &srcs(&h, Some(&x)), None).is_ok());
        // F16 activations: ggml-cpu's FWHT reads them (no vec_dot, which
        // an F32 src0 would need F32 or BF16 for); without the hint, and
        // BF16 with it (FWHT aborts), refused.
        let x16 = packed(GGML_TYPE_F16, [4, 2, 1, 1]);
        assert!(check_node(&r4, &srcs(&h, Some(&x16)), None).is_ok());
        let mut plain = r4.clone();
        plain.op_params[1] = 0;
        assert!(check_node(&plain, &srcs(&h, Some(&x16)), None).is_err());
        let xbf = packed(GGML_TYPE_BF16, [4, 2, 1, 1]);
        assert!(check_node(&plain, &srcs(&h, Some(&xbf)), None).is_ok());
        assert!(check_node(&r4, &srcs(&h, Some(&xbf)), None).is_err());
        let h6 = packed(GGML_TYPE_F32, [6, 6, 1, 1]);
        let x6 = packed(GGML_TYPE_F32, [6, 2, 1, 1]);
        let mut r6 = node(GGML_TYPE_F32, [6, 2, 1, 1], OP_MUL_MAT);
        r6.op_params[1] = HINT_SRC0_IS_HADAMARD;
        assert!(check_node(&r6, &srcs(&h6, Some(&x6)), None).is_err());
    }

    #[test]
    fn flash_attn_ext_result_precision_and_head_size() {
        let fa = |nb1: u32, prec: i32, dk: u32| {
            let q = packed(GGML_TYPE_F32, [dk, 1, 1, 1]);
            let k = packed(GGML_TYPE_F16, [dk, 2, 1, 1]);
            let v = packed(GGML_TYPE_F16, [4, 2, 1, 1]);
            let mut r = node(GGML_TYPE_F32, [4, 1, 1, 1], OP_FLASH_ATTN_EXT);
            r.nb = [4, nb1, nb1, nb1];
            r.op_params[3] = prec;
            let mut s = srcs(&q, Some(&k));
            s[2] = Some(&v);
            check_node(&r, &s, None).is_ok()
        };
        assert!(fa(16, PREC_DEFAULT, 8));
        assert!(fa(16, PREC_F32, 8));
        assert!(!fa(16, 5, 8));
        assert!(!fa(4096, PREC_DEFAULT, 8));
        assert!(!fa(16, PREC_DEFAULT, MAX_FLASH_ATTN_HEAD * 2));
    }

    #[test]
    fn get_rows_source_rows_must_be_packed() {
        assert!(get_rows(GGML_TYPE_F16).is_ok());
        let mut table = packed(GGML_TYPE_F32, [256, 8, 1, 1]);
        table.nb[0] = 8;
        let idx = packed(GGML_TYPE_I32, [2, 1, 1, 1]);
        let r = node(GGML_TYPE_F32, [256, 2, 1, 1], GGML_OP_GET_ROWS);
        assert!(check_node(&r, &srcs(&table, Some(&idx)), None).is_err());
    }

    #[test]
    fn rows_and_row_counts_must_fit_an_int() {
        // Shapes only (strides of overlapping rows): no memory behind them.
        let t = |ne: [u32; 4], op: u32| RpcTensor {
            ty: GGML_TYPE_F32,
            ne,
            nb: [4, 4 * ne[0].min(4), 4 * ne[0].min(4), 4 * ne[0].min(4)],
            op,
            ..RpcTensor::default()
        };
        let scale = |ne: [u32; 4]| {
            let a = t(ne, 0);
            check_node(&t(ne, OP_SCALE), &srcs(&a, None), None).is_ok()
        };
        // flat_rows fails these anyway for nrows > 1; check the int guard
        // on a single long row and on many one-element rows.
        assert!(!scale([1 << 31, 1, 1, 1]));
        let glu = |ne: [u32; 4]| {
            let a = t(ne, 0);
            let mut r = t(ne, GGML_OP_GLU);
            r.op_params[0] = 2;
            check_node(&r, &srcs(&a, Some(&a)), None).is_ok()
        };
        assert!(!glu([1 << 31, 1, 1, 1]));
        assert!(!glu([1, 1 << 31, 1, 1]));
        assert!(glu([(1 << 31) - 1, 1, 1, 1]));
    }

    /// A copy node `op` of `a` into a packed `to` tensor of shape `ne`
    /// (for CPY, the destination is that tensor too).
    fn copy(op: u32, a: &RpcTensor, to: u32, ne: [u32; 4]) -> bool {
        let b = packed(to, ne);
        let r = node(to, ne, op);
        check_node(&r, &srcs(a, (op == OP_CPY).then_some(&b)), None).is_ok()
    }

    #[test]
    fn copies_follow_the_dup_paths() {
        let f32s = packed(GGML_TYPE_F32, [64, 2, 3, 1]);
        let mut permuted = f32s.clone();
        permuted.ne = [64, 3, 2, 1];
        permuted.nb = [4, 512, 256, 1536];
        // Same type: any type, any layout (dup_bytes)...
        for ty in [GGML_TYPE_I32, 24, 25, 27, 28, GGML_TYPE_F16] {
            let a = packed(ty, [64, 2, 3, 1]);
            assert!(copy(OP_CONT, &a, ty, [64, 2, 3, 1]), "{ty}");
            assert!(copy(OP_DUP, &a, ty, [64, 6, 1, 1]), "{ty}");
        }
        // ...but a block type copied into a contiguous result of another
        // shape from a non-contiguous source takes the row path that
        // copies ne00 * block bytes per row.
        let q = packed(Q8_0, [64, 2, 3, 1]);
        assert!(copy(OP_CPY, &q, Q8_0, [64, 6, 1, 1]));
        let mut q_perm = q.clone();
        q_perm.ne = [64, 3, 2, 1];
        q_perm.nb = [34, 136, 68, 408];
        assert!(copy(OP_CONT, &q_perm, Q8_0, [64, 3, 2, 1]));
        assert!(!copy(OP_CONT, &q_perm, Q8_0, [64, 6, 1, 1]));
        // Float conversions and the two integer ones.
        for (from, to) in [(0, 1), (1, 30), (30, 0), (0, 26), (26, 0)] {
            let a = packed(from, [64, 2, 3, 1]);
            assert!(copy(OP_CPY, &a, to, [64, 2, 3, 1]), "{from}->{to}");
        }
        for (from, to) in [(1, 26), (30, 26), (26, 1), (24, 0), (27, 0)] {
            let a = packed(from, [64, 2, 3, 1]);
            assert!(!copy(OP_CPY, &a, to, [64, 2, 3, 1]), "{from}->{to}");
        }
        // Quantizing: a from_float, contiguous result, packed source rows
        // of whole blocks no longer than the result's rows.
        assert!(copy(OP_CPY, &f32s, Q8_0, [64, 2, 3, 1]));
        let short_rows = packed(GGML_TYPE_F32, [64, 4, 1, 1]);
        assert!(!copy(OP_CPY, &short_rows, Q4_K, [256, 1, 1, 1]));
        assert!(copy(OP_CPY, &permuted, Q8_0, [64, 3, 2, 1]));
        assert!(!copy(OP_CPY, &f32s, 16, [64, 2, 3, 1])); // iq2_xxs
        assert!(!copy(OP_CPY, &f32s, Q8_0, [32, 12, 1, 1])); // wdata overrun
        let mut strided = f32s.clone();
        strided.nb[0] = 8;
        strided.nb[1] = 512;
        strided.nb[2] = 1024;
        strided.nb[3] = 3072;
        assert!(!copy(OP_CPY, &strided, Q8_0, [64, 2, 3, 1]));
        // Dequantizing: CPY into F32 only (DUP / CONT have no src1).
        assert!(copy(OP_CPY, &q, GGML_TYPE_F32, [64, 2, 3, 1]));
        assert!(!copy(OP_DUP, &q, GGML_TYPE_F32, [64, 2, 3, 1]));
        assert!(!copy(OP_CPY, &q, GGML_TYPE_F16, [64, 2, 3, 1]));
        assert!(!copy(
            OP_CPY,
            &packed(Q8_1, [64, 2, 3, 1]),
            0,
            [64, 2, 3, 1]
        ));
        // Element counts must agree; CPY's result is its destination.
        assert!(!copy(OP_CPY, &f32s, 0, [64, 2, 2, 1]));
        let b = packed(GGML_TYPE_F32, [64, 2, 3, 1]);
        let mut r = node(GGML_TYPE_F32, [64, 2, 3, 1], OP_CPY);
        r.nb[1] = 1024;
        assert!(check_node(&r, &srcs(&f32s, Some(&b)), None).is_err());
    }

    #[test]
    fn mul_mat_src1_is_f32_or_the_vec_dot_type() {
        let case = |wa: u32, wb: u32| {
            let w = packed(wa, [256, 8, 1, 1]);
            let x = packed(wb, [256, 3, 1, 1]);
            let r = node(GGML_TYPE_F32, [8, 3, 1, 1], OP_MUL_MAT);
            check_node(&r, &srcs(&w, Some(&x)), None).is_ok()
        };
        for (a, b) in [(1, 1), (30, 30), (0, 30), (2, 8), (3, 9), (12, 15), (1, 0)] {
            assert!(case(a, b), "{a} x {b}");
        }
        for (a, b) in [(0, 1), (30, 1), (1, 30), (2, 9), (12, 8), (2, 2)] {
            assert!(!case(a, b), "{a} x {b}");
        }
        // A Q8_K src1 for a tiled K-quant is walked by nb[1].
        let w = packed(Q4_K, [256, 8, 1, 1]);
        let mut x = packed(Q8_K, [256, 1, 3, 1]);
        x.nb[1] = 1 << 20;
        let r = node(GGML_TYPE_F32, [8, 1, 3, 1], OP_MUL_MAT);
        assert!(check_node(&r, &srcs(&w, Some(&x)), None).is_err());
        x.nb[1] = 292;
        assert!(check_node(&r, &srcs(&w, Some(&x)), None).is_ok());
    }

    fn rope_multi(mode: i32, ne0: u32, n_dims: i32, sections: [i32; 4], n_pos: u32) -> bool {
        let a = packed(GGML_TYPE_F32, [ne0, 2, 3, 1]);
        let pos = packed(GGML_TYPE_I32, [n_pos, 1, 1, 1]);
        let mut r = node(GGML_TYPE_F32, [ne0, 2, 3, 1], OP_ROPE);
        r.op_params[1] = n_dims;
        r.op_params[2] = mode;
        r.op_params[11..15].copy_from_slice(&sections);
        check_node(&r, &srcs(&a, Some(&pos)), None).is_ok()
    }

    #[test]
    fn rope_modes_sections_and_positions() {
        assert!(rope_multi(8, 64, 64, [16, 8, 8, 0], 12));
        assert!(rope_multi(40, 64, 64, [11, 11, 10, 0], 12));
        assert!(rope_multi(24, 64, 32, [8, 8, 0, 0], 12));
        // One position per token is not enough for multi-rope.
        assert!(!rope_multi(8, 64, 64, [16, 8, 8, 0], 3));
        // Modes the kernel's switch aborts on.
        for mode in [1, 4, 10, 16, 26, 32] {
            assert!(!rope_multi(mode, 64, 64, [16, 8, 8, 0], 12), "{mode}");
        }
        // No section among the first three, a sum of 0, past the row.
        assert!(!rope_multi(8, 64, 64, [0, 0, 0, 8], 12));
        assert!(!rope_multi(8, 64, 64, [16, -16, 8, 0], 12));
        assert!(!rope_multi(8, 64, 64, [32, 32, 8, 0], 12));
        // Vision: n_dims = ne0 / 2.
        assert!(!rope_multi(24, 64, 64, [8, 8, 0, 0], 12));
        // Plain rope with 4 positions per token: the builder's shape.
        assert!(!rope_multi(0, 64, 64, [0; 4], 12));
    }

    #[test]
    fn sinks_are_one_f32_per_head() {
        let a = packed(GGML_TYPE_F32, [16, 4, 8, 1]);
        let r = node(GGML_TYPE_F32, [16, 4, 8, 1], OP_SOFT_MAX);
        let soft_max = |k: &RpcTensor| {
            let mut s = srcs(&a, None);
            s[2] = Some(k);
            check_node(&r, &s, None).is_ok()
        };
        assert!(soft_max(&packed(GGML_TYPE_F32, [8, 1, 1, 1])));
        assert!(!soft_max(&packed(GGML_TYPE_F32, [4, 1, 1, 1])));
        assert!(!soft_max(&packed(GGML_TYPE_F16, [8, 1, 1, 1])));
        let mut spread = packed(GGML_TYPE_F32, [8, 1, 1, 1]);
        spread.nb[0] = 8;
        assert!(!soft_max(&spread));

        let fa = |k_ty: u32, sinks: Option<RpcTensor>| {
            let q = packed(GGML_TYPE_F32, [256, 1, 4, 1]);
            let k = packed(k_ty, [256, 8, 2, 1]);
            let v = packed(k_ty, [256, 8, 2, 1]);
            let mut r = node(GGML_TYPE_F32, [256, 4, 1, 1], OP_FLASH_ATTN_EXT);
            r.nb = [4, 1024, 4096, 4096];
            let mut s = srcs(&q, Some(&k));
            s[2] = Some(&v);
            s[4] = sinks.as_ref();
            check_node(&r, &s, None).is_ok()
        };
        for ty in [0, 1, 30, Q8_0, GGML_TYPE_Q4_0, Q4_K] {
            assert!(fa(ty, None), "{ty}");
        }
        for ty in [Q8_1, Q8_K, GGML_TYPE_I32] {
            assert!(!fa(ty, None), "{ty}");
        }
        assert!(fa(1, Some(packed(GGML_TYPE_F32, [4, 1, 1, 1]))));
        assert!(!fa(1, Some(packed(GGML_TYPE_F32, [2, 1, 1, 1]))));
    }

    #[test]
    fn set_rows_destinations_need_a_from_float() {
        let rows = packed(GGML_TYPE_F32, [256, 2, 1, 1]);
        let idx = packed(27, [2, 1, 1, 1]);
        for (ty, ok) in [
            (0, true),
            (30, true),
            (Q8_0, true),
            (Q4_K, true),
            (26, true),
        ] {
            let r = node(ty, [256, 4, 1, 1], GGML_OP_SET_ROWS);
            assert_eq!(
                check_node(&r, &srcs(&rows, Some(&idx)), None).is_ok(),
                ok,
                "{ty}"
            );
        }
        for ty in [16, 17, 18, 19, 21, 22, 29, 24, 25, 27, 28] {
            let r = node(ty, [256, 4, 1, 1], GGML_OP_SET_ROWS);
            assert!(
                check_node(&r, &srcs(&rows, Some(&idx)), None).is_err(),
                "{ty}"
            );
        }
    }
}
