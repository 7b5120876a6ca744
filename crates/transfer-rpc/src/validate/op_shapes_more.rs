//! Op rules for the second batch of issue 11 (coverage): the element-wise
//! ops LOG, SIN, COS, ADD1, LEAKY_RELU, FILL, TRI, CUMSUM, the norms
//! GROUP_NORM, the counters COUNT_EQUAL, the generators ARANGE and
//! TIMESTEP_EMBEDDING, and the shape ops PAD_REFLECT_1D and ROLL. As in
//! `op_shapes.rs`, each rule is what the op's ggml-cpu kernel (ops.cpp,
//! unary-ops.cpp of the vendored llama.cpp) asserts, aborts on, or needs
//! to stay inside its tensors.

use super::op_shapes::{f32_param, flat_walk, float, is_contiguous, nelements, refuse};
use super::types::{GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_I32, GGML_TYPE_I64, type_info};
use crate::error::Result;
use crate::protocol::tensor::{MAX_SRC, RpcTensor};

const GGML_TYPE_BF16: u32 = 30;

/// `GGML_OP_*` of the ops checked here.
pub(super) const OP_ADD1: u32 = 4;
pub(super) const OP_LOG: u32 = 11;
pub(super) const OP_SIN: u32 = 12;
pub(super) const OP_COS: u32 = 13;
pub(super) const OP_CUMSUM: u32 = 16;
pub(super) const OP_COUNT_EQUAL: u32 = 19;
pub(super) const OP_GROUP_NORM: u32 = 27;
pub(super) const OP_PAD_REFLECT_1D: u32 = 65;
pub(super) const OP_ROLL: u32 = 66;
pub(super) const OP_ARANGE: u32 = 67;
pub(super) const OP_TIMESTEP_EMBEDDING: u32 = 68;
pub(super) const OP_LEAKY_RELU: u32 = 71;
pub(super) const OP_TRI: u32 = 72;
pub(super) const OP_FILL: u32 = 73;

fn type_size(ty: u32) -> u64 {
    type_info(ty).map_or(0, |i| i.type_size)
}

/// `nb[0]` is exactly the element size.
fn nb0_is_element(t: &RpcTensor) -> bool {
    u64::from(t.nb[0]) == type_size(t.ty)
}

/// Checks one node of an op of this module; `None` for other ops.
pub(super) fn check(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Option<Result<()>> {
    let checked = match r.op {
        OP_ARANGE => check_arange(r),
        OP_ADD1 => check_add1(r, s),
        OP_COUNT_EQUAL => check_count_equal(r, s),
        op => {
            let f: fn(&RpcTensor, &RpcTensor) -> Result<()> = match op {
                OP_LOG | OP_SIN | OP_COS => check_unary_op,
                OP_CUMSUM => check_cumsum,
                OP_GROUP_NORM => check_group_norm,
                OP_PAD_REFLECT_1D => check_pad_reflect_1d,
                OP_ROLL => check_roll,
                OP_TIMESTEP_EMBEDDING => check_timestep_embedding,
                OP_LEAKY_RELU => check_leaky_relu,
                OP_TRI => check_tri,
                OP_FILL => check_fill,
                _ => return None,
            };
            match s[0] {
                Some(a) => f(r, a),
                None => refuse(op, "missing source 0"),
            }
        }
    };
    Some(checked)
}

/// LOG, SIN, COS: `unary_op` (unary-ops.cpp), as SQR / SQRT: (src0, dst)
/// types F32/F32, F16/F16, BF16/BF16, BF16/F32, F16/F32, GGML_ABORT
/// otherwise; apply_unary_op GGML_ASSERTs same shape, nb0 ==
/// sizeof(dst_t), nb00 == sizeof(src0_t); rows by their strides.
fn check_unary_op(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    let types_ok = r.ty == a.ty && float(a.ty)
        || (r.ty == GGML_TYPE_F32 && matches!(a.ty, GGML_TYPE_F16 | GGML_TYPE_BF16));
    if !types_ok || r.ne != a.ne || !nb0_is_element(r) || !nb0_is_element(a) {
        return refuse(r.op, "log/sin/cos shapes/types");
    }
    Ok(())
}

/// ADD1: `ggml_compute_forward_add1_{f32,f16_f32,f16_f16,bf16_f32,
/// bf16_bf16}`: dst = src0 + the scalar `*(src1_t *) src1->data`. Each
/// GGML_ASSERTs same shape (src0, dst), ggml_is_scalar(src1), nb0 ==
/// nb00 == element size; rows by their strides. The F32 kernel reads the
/// scalar as a float whatever src1's type (4 bytes of a 2-byte tensor):
/// an F32 src0 needs an F32 scalar. Quantized src0 (add1_q_f32) is not
/// served: ggml_add1 builds the result as src0's type, which the q path
/// then writes with from_float per row (llama.cpp never builds it).
fn check_add1(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
    let op = r.op;
    let (Some(a), Some(b)) = (s[0], s[1]) else {
        return refuse(op, "add1 needs two sources");
    };
    let scalar_ok = match a.ty {
        GGML_TYPE_F32 => b.ty == GGML_TYPE_F32,
        GGML_TYPE_F16 => matches!(b.ty, GGML_TYPE_F16 | GGML_TYPE_F32),
        GGML_TYPE_BF16 => matches!(b.ty, GGML_TYPE_BF16 | GGML_TYPE_F32),
        _ => false,
    };
    if !scalar_ok
        || r.ty != a.ty
        || r.ne != a.ne
        || b.ne != [1, 1, 1, 1]
        || !nb0_is_element(r)
        || !nb0_is_element(a)
    {
        return refuse(op, "add1 shapes/types");
    }
    Ok(())
}

/// COUNT_EQUAL: `ggml_compute_forward_count_equal_i32`.
fn check_count_equal(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
    let op = r.op;
    let (Some(a), Some(b)) = (s[0], s[1]) else {
        return refuse(op, "count_equal needs two sources");
    };
    // GGML_ASSERT: src0, src1 I32, same shape; dst an I64 scalar (the
    // work buffer, one dst element per thread, is sized by dst's type).
    if a.ty != GGML_TYPE_I32
        || b.ty != GGML_TYPE_I32
        || a.ne != b.ne
        || r.ty != GGML_TYPE_I64
        || r.ne != [1, 1, 1, 1]
    {
        return refuse(op, "count_equal shapes/types");
    }
    // The kernel splits its flat row index as `i03 = ir / (ne02 * ne01)`,
    // `i02 = (ir - i03 * ne03) / ne01`, `i01 = ir - i03 * ne03 - i02 *
    // ne02`: the row it reads is inside the sources only when dims 2 and
    // 3 are 1 (i01 = ir), or dim 3 is 1 and ne02 == ne01 (i01 = ir %
    // ne01). Other shapes read rows past the sources.
    let rows_in_range = a.ne[3] == 1 && (a.ne[2] == 1 || a.ne[2] == a.ne[1]);
    if !rows_in_range {
        return refuse(
            op,
            format!(
                "count_equal of shape {:?} reads rows past its sources",
                a.ne
            ),
        );
    }
    Ok(())
}

/// CUMSUM: `_cumsum_f32` (GGML_ABORT on other source types):
/// GGML_ASSERT(src0->nb[0] == dst->nb[0] == sizeof(float)), equal
/// shapes; each row's ne00 floats written packed at its dst row.
fn check_cumsum(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    if a.ty != GGML_TYPE_F32
        || r.ty != GGML_TYPE_F32
        || r.ne != a.ne
        || a.nb[0] != 4
        || r.nb[0] != 4
    {
        return refuse(r.op, "cumsum shapes/types");
    }
    Ok(())
}

/// GROUP_NORM: `_group_norm_f32` (F32 only, GGML_ABORT otherwise).
fn check_group_norm(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    let op = r.op;
    // GGML_ASSERT(same shape), GGML_ASSERT(src0->nb[0] == sizeof(float));
    // dst rows are written as ne00 packed floats (y[i00]).
    if a.ty != GGML_TYPE_F32
        || r.ty != GGML_TYPE_F32
        || r.ne != a.ne
        || a.nb[0] != 4
        || r.nb[0] != 4
    {
        return refuse(op, "group_norm shapes/types");
    }
    // `n_channels_per_group = (n_channels + n_groups - 1) / n_groups` in
    // int: n_groups 0 divides by zero. The loop runs over i < n_groups;
    // groups past the channels are empty (start >= n_channels), so a
    // count above ne[2] only spins: refused with the zero.
    let groups = r.op_params[0];
    if groups < 1 || i64::from(groups) > i64::from(a.ne[2]).max(1) {
        return refuse(
            op,
            format!("group_norm of {groups} groups over {} channels", a.ne[2]),
        );
    }
    Ok(())
}

/// PAD_REFLECT_1D: `ggml_compute_forward_pad_reflect_1d`.
fn check_pad_reflect_1d(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    let op = r.op;
    // GGML_ASSERT(src0, dst F32). ggml_pad_reflect_1d: 0 <= p0, p1 <
    // a->ne[0], a contiguous, result [ne00 + p0 + p1, ne01, ne02, ne03].
    // The kernel copies ne00 packed floats of each source row to dst
    // column p0, then mirrors p0 values left of it (left[-i] = left[i])
    // and p1 right of column ne0 - p1 - 1: all inside the dst row only
    // for these shapes.
    let (p0, p1) = (r.op_params[0], r.op_params[1]);
    let in_row = |p: i32| p >= 0 && i64::from(p) < i64::from(a.ne[0]);
    if a.ty != GGML_TYPE_F32 || r.ty != GGML_TYPE_F32 || !in_row(p0) || !in_row(p1) {
        return refuse(op, format!("pad_reflect_1d pads {p0}, {p1} of {}", a.ne[0]));
    }
    let ne0 = u64::from(a.ne[0]) + p0 as u64 + p1 as u64;
    if u64::from(r.ne[0]) != ne0 || r.ne[1..] != a.ne[1..] || r.nb[0] != 4 || a.nb[0] != 4 {
        return refuse(op, "pad_reflect_1d shapes");
    }
    Ok(())
}

/// ROLL: `_roll_f32` (F32 only, GGML_ABORT otherwise).
fn check_roll(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    let op = r.op;
    // ggml_roll: same shape and type (ggml_dup_tensor), a->nb[0] == type
    // size, |shift_d| < ne[d]. The kernel wraps `i - shift` once
    // (ggml_wrap_index), so a larger shift reads outside the source; it
    // copies two runs of packed floats into each dst row.
    if a.ty != GGML_TYPE_F32
        || r.ty != GGML_TYPE_F32
        || r.ne != a.ne
        || a.nb[0] != 4
        || r.nb[0] != 4
    {
        return refuse(op, "roll shapes/types");
    }
    for d in 0..4 {
        let shift = i64::from(r.op_params[d]);
        if shift.abs() >= i64::from(a.ne[d]) {
            return refuse(op, format!("roll shift {shift} of dim {d} of {}", a.ne[d]));
        }
    }
    Ok(())
}

/// ARANGE: `_arange_f32` (dst F32, GGML_ABORT otherwise).
fn check_arange(r: &RpcTensor) -> Result<()> {
    let op = r.op;
    // GGML_ASSERT(dst->nb[0] == sizeof(float)); steps = (int64_t)
    // ceilf((stop - start) / step), GGML_ASSERT(ggml_nelements(dst) ==
    // steps); then `dst->data[i]` for i < steps: a contiguous dst. A
    // quotient that is not finite or not in int64 range makes the cast
    // undefined: refused.
    if r.ty != GGML_TYPE_F32 || r.nb[0] != 4 || !is_contiguous(r) {
        return refuse(op, "arange result must be contiguous F32");
    }
    let (start, stop, step) = (f32_param(r, 0), f32_param(r, 1), f32_param(r, 2));
    let q = ((stop - start) / step).ceil();
    if !q.is_finite() || q < 0.0 || f64::from(q) != nelements(r) as f64 {
        return refuse(
            op,
            format!(
                "arange({start}, {stop}, {step}) is {q} steps, result has {}",
                nelements(r)
            ),
        );
    }
    Ok(())
}

/// TIMESTEP_EMBEDDING: `_timestep_embedding_f32` (F32 source only).
fn check_timestep_embedding(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    let op = r.op;
    // GGML_ASSERT(src0->nb[0] == sizeof(float)); timesteps read as
    // `src0->data[i]`, i < ne00 (packed: a row vector), each written to
    // dst row i (at i * nb1) as floats j and j + half for j < dim / 2, and
    // column 2 * half when dim is odd: columns 0..dim of ne00 rows.
    // ggml_timestep_embedding builds [dim, ne00] F32. A negative odd dim
    // writes before the row.
    let dim = r.op_params[0];
    let rows_ok = a.ne[1] == 1 && a.ne[2] == 1 && a.ne[3] == 1 && r.ne[1] >= a.ne[0];
    if a.ty != GGML_TYPE_F32
        || r.ty != GGML_TYPE_F32
        || a.nb[0] != 4
        || r.nb[0] != 4
        || !rows_ok
        || dim < 0
        || i64::from(dim) > i64::from(r.ne[0])
    {
        return refuse(op, format!("timestep_embedding of dim {dim} shapes/types"));
    }
    Ok(())
}

/// LEAKY_RELU: `_leaky_relu_{f32,f16}` (GGML_ABORT on other types): dst
/// written as the source type, `ggml_nrows` rows of ne0 packed elements
/// at `i * nb1` / `i * nb01` (one flat run, asserts compiled out).
fn check_leaky_relu(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    if !matches!(a.ty, GGML_TYPE_F32 | GGML_TYPE_F16)
        || r.ty != a.ty
        || r.ne != a.ne
        || !nb0_is_element(r)
        || !nb0_is_element(a)
        || !flat_walk(r)
        || !flat_walk(a)
    {
        return refuse(r.op, "leaky_relu shapes/types");
    }
    Ok(())
}

/// TRI: `_tri_f32` (F32 only, GGML_ABORT otherwise).
fn check_tri(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    let op = r.op;
    // GGML_ASSERT(ggml_is_contiguous(src0)); rows of src0 read, dst rows
    // (same shape: ggml_dup_tensor) written as ne0 packed floats.
    if a.ty != GGML_TYPE_F32
        || r.ty != GGML_TYPE_F32
        || r.ne != a.ne
        || !is_contiguous(a)
        || a.nb[0] != 4
        || r.nb[0] != 4
    {
        return refuse(op, "tri shapes/types");
    }
    // GGML_ABORT("invalid tri type") past GGML_TRI_TYPE_LOWER (3).
    if !(0..4).contains(&r.op_params[0]) {
        return refuse(op, format!("tri type {}", r.op_params[0]));
    }
    Ok(())
}

/// FILL: `_fill_{f32,f16}` by src0's type (GGML_ABORT otherwise): dst
/// rows of ne0 packed elements of that type set to op_params[0].
fn check_fill(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    if !matches!(a.ty, GGML_TYPE_F32 | GGML_TYPE_F16) || r.ty != a.ty || !nb0_is_element(r) {
        return refuse(r.op, "fill shapes/types");
    }
    Ok(())
}
