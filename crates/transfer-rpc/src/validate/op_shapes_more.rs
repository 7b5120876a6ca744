//! Op rules for the second batch of issue 11 (coverage): the element-wise
//! ops LOG, SIN, COS, ADD1, LEAKY_RELU, FILL, TRI, CUMSUM, the norms
//! GROUP_NORM, the counters COUNT_EQUAL, the generators ARANGE and
//! TIMESTEP_EMBEDDING, and the shape ops PAD_REFLECT_1D and ROLL. As in
//! `op_shapes.rs`, each rule is what the op's ggml-cpu kernel (ops.cpp,
//! unary-ops.cpp of the vendored llama.cpp) asserts, aborts on, or needs
//! to stay inside its tensors.

use super::op_shapes::{
    f32_param, float, is_contiguous, nelements, refuse, rows_contiguous, same_type_flat_map,
};
use super::types::{GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_I32, GGML_TYPE_I64};
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
pub(super) const OP_SSM_CONV: u32 = 76;
pub(super) const OP_SSM_SCAN: u32 = 77;

/// Checks one node of an op of this module; `None` for other ops.
pub(super) fn check(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Option<Result<()>> {
    let checked = match r.op {
        OP_ARANGE => check_arange(r),
        OP_ADD1 => check_add1(r, s),
        OP_COUNT_EQUAL => check_count_equal(r, s),
        OP_SSM_CONV => check_ssm_conv(r, s),
        OP_SSM_SCAN => check_ssm_scan(r, s),
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
                _ => return super::op_shapes_vision::check(r, s),
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
    if !types_ok || r.ne != a.ne || !rows_contiguous(r) || !rows_contiguous(a) {
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
        || !rows_contiguous(r)
        || !rows_contiguous(a)
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
    if !same_type_flat_map(r, a) {
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
    if !matches!(a.ty, GGML_TYPE_F32 | GGML_TYPE_F16) || r.ty != a.ty || !rows_contiguous(r) {
        return refuse(r.op, "fill shapes/types");
    }
    Ok(())
}

/// Packed rows: `nb[0]` the F32 element, `nb[1]` one row of `ne[0]`.
fn f32_rows_packed(t: &RpcTensor) -> bool {
    t.ty == GGML_TYPE_F32 && t.nb[0] == 4 && u64::from(t.nb[1]) == 4 * u64::from(t.ne[0])
}

const INT_MAX: u64 = i32::MAX as u64;

/// SSM_CONV: `_ssm_conv_f32` (F32 src0 only, GGML_ABORT otherwise).
fn check_ssm_conv(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
    let op = r.op;
    let (Some(a), Some(c)) = (s[0], s[1]) else {
        return refuse(op, "ssm_conv needs two sources");
    };
    // nc = d_conv = c->ne[0], ncs = a->ne[0], nr = d_inner = a->ne[1],
    // n_t = dst->ne[1], n_s = dst->ne[2]. GGML_ASSERT(dst->ne[0] == nr),
    // a->nb[0] == c->nb[0] == 4, a->nb[1] == ncs * 4. For token i2 of
    // sequence i3 it reads a at `i3 * nb02 + i2 * 4 + (i0 + i1 * ncs) *
    // 4` (i0 < nc, i1 < nr): windows inside a when n_t + nc - 1 <= ncs
    // and n_s <= a->ne[2]; c at `(i0 + i1 * nc) * 4` (packed rows of nc);
    // dst at `i1 * 4 + i2 * nb1 + i3 * nb2`. Those flat offsets are ints.
    let (nc, ncs, nr) = (u64::from(c.ne[0]), u64::from(a.ne[0]), u64::from(a.ne[1]));
    let (n_t, n_s) = (u64::from(r.ne[1]), u64::from(r.ne[2]));
    let shapes_ok = u64::from(r.ne[0]) == nr
        && u64::from(c.ne[1]) >= nr
        && n_s <= u64::from(a.ne[2])
        && nc >= 1
        && n_t + nc - 1 <= ncs;
    if !f32_rows_packed(a)
        || !f32_rows_packed(c)
        || r.ty != GGML_TYPE_F32
        || r.nb[0] != 4
        || !shapes_ok
        || ncs * nr > INT_MAX
        || nc * nr > INT_MAX
    {
        return refuse(op, "ssm_conv shapes/types");
    }
    Ok(())
}

/// SSM_SCAN: `_ssm_scan_f32` (F32 src0 only, GGML_ABORT otherwise). Its
/// sequence ids (src6) are range-checked at run time against src0's
/// `ne[3]` states (graph.rs), like GET_ROWS indices.
fn check_ssm_scan(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
    let op = r.op;
    let (Some(st), Some(x), Some(dt), Some(am), Some(b), Some(c), Some(ids)) =
        (s[0], s[1], s[2], s[3], s[4], s[5], s[6])
    else {
        return refuse(op, "ssm_scan needs seven sources");
    };
    let ne = |t: &RpcTensor, d: usize| u64::from(t.ne[d]);
    let (nc, nr, nh) = (ne(st, 0), ne(st, 1), ne(st, 2));
    let (nt, ns, ng) = (ne(x, 2), ne(x, 3), ne(b, 1));
    let k = i64::from(r.op_params[0]);
    // GGML_ASSERT: K >= 1, every nb[0] the element size, nh % ng == 0 (ng
    // 0 divides by zero), src3->ne[0] == 1 || K == 1, and
    // nelements(x) + K * nc * nr * nh * ns == nelements(dst).
    // ggml_ssm_scan's shapes: x [nr, nh, nt, ns], dt [nh, nt, ns], A [1 or
    // nc, nh], B and C [nc, ng, nt, ns], ids [ns] I32; all F32.
    let all_f32 = [st, x, dt, am, b, c].iter().all(|t| t.ty == GGML_TYPE_F32);
    let state = nc.saturating_mul(nr).saturating_mul(nh);
    let shapes_ok = ne(x, 0) == nr
        && ne(x, 1) == nh
        && dt.ne == [x.ne[1], x.ne[2], x.ne[3], 1]
        && (ne(am, 0) == 1 || (ne(am, 0) == nc && k == 1))
        && ne(am, 1) == nh
        && am.ne[2] == 1
        && am.ne[3] == 1
        && b.ne == c.ne
        && ne(b, 0) == nc
        && ne(b, 2) == nt
        && ne(b, 3) == ns
        && ng >= 1
        && nh % ng == 0
        && ids.ty == GGML_TYPE_I32
        && ids.nb[0] == 4
        && ne(ids, 0) == ns
        && ids.ne[1..] == [1, 1, 1];
    let want = (k >= 1)
        .then(|| nelements(x).saturating_add(state.saturating_mul(ns).saturating_mul(k as u64)));
    if !all_f32 || r.ty != GGML_TYPE_F32 || !shapes_ok || want != Some(nelements(r)) {
        return refuse(op, "ssm_scan shapes/types");
    }
    // Layouts the kernel walks flat: the state of sequence ids[i3] as nc *
    // nr * nh packed floats at `ids[i3] * nb03` (and the result's states
    // at `i3 * nb03`, snapshots at `(slot * ns + i3) * nb03 + h * nb02`,
    // past the y part); x rows `ii = i1 + h * nr` packed per (token,
    // sequence); dt[h]; A[h] or A[i0 + h * nc] from A's start; B and C at
    // `i0 + g * nc`; y written at `(ii + (i2 + i3 * nt) * nh * nr) * 4`.
    // So the result is one packed run, and `ii * nc + i0` (an int) fits.
    let st_packed = is_contiguous(st) && u64::from(st.nb[3]) == 4 * state;
    let x_packed = x.nb[0] == 4 && u64::from(x.nb[1]) == 4 * nr;
    let dt_rows = dt.nb[0] == 4;
    if !st_packed
        || !x_packed
        || !dt_rows
        || !is_contiguous(am)
        || !f32_rows_packed(b)
        || !f32_rows_packed(c)
        || !is_contiguous(r)
        || state > INT_MAX
    {
        return refuse(op, "ssm_scan layouts");
    }
    Ok(())
}
