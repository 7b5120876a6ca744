//! Op rules for the ops issue 11 (coverage) added to the allowlist: the
//! MoE ops (MUL_MAT_ID, ADD_ID; their expert ids are range-checked at run
//! time like GET_ROWS indices, see `graph.rs`), the reductions (SUM,
//! SUM_ROWS, MEAN, ARGMAX), sorting (ARGSORT, TOP_K), shape ops (CONCAT,
//! REPEAT, PAD), element-wise ops (CLAMP, SQR, SQRT, L2_NORM), the strided
//! writes into a copy (ACC, SET) and DIAG_MASK_INF. As in `op_shapes.rs`,
//! each rule is what the op's ggml-cpu kernel (ops.cpp, unary-ops.cpp,
//! ggml-cpu.c, tiled/tiled.cpp of the vendored llama.cpp) asserts, aborts
//! on, or needs to stay inside its tensors.

use super::cpu_types;
use super::op_shapes::{
    can_repeat, cpu_mul_mat_src0, divides, f32_param, flat_walk, float, is_contiguous, nelements,
    refuse, rows_contiguous, same_type_flat_map, strides_ordered,
};
use super::types::{GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_I32};
use crate::error::Result;
use crate::protocol::tensor::{MAX_SRC, RpcTensor};

const GGML_TYPE_BF16: u32 = 30;
const GGML_TYPE_I8: u32 = 24;
const GGML_TYPE_I16: u32 = 25;

/// `GGML_OP_*` of the ops checked here.
pub(super) const OP_ADD_ID: u32 = 3;
pub(super) const OP_ACC: u32 = 5;
pub(super) const OP_SQR: u32 = 9;
pub(super) const OP_SQRT: u32 = 10;
pub(super) const OP_SUM: u32 = 14;
pub(super) const OP_SUM_ROWS: u32 = 15;
pub(super) const OP_MEAN: u32 = 17;
pub(super) const OP_ARGMAX: u32 = 18;
pub(super) const OP_REPEAT: u32 = 20;
pub(super) const OP_CONCAT: u32 = 22;
pub(super) const OP_L2_NORM: u32 = 28;
pub(super) const OP_MUL_MAT_ID: u32 = 30;
pub(super) const OP_SET: u32 = 33;
pub(super) const OP_DIAG_MASK_INF: u32 = 44;
pub(super) const OP_CLAMP: u32 = 50;
pub(super) const OP_PAD: u32 = 64;
pub(super) const OP_ARGSORT: u32 = 69;
pub(super) const OP_TOP_K: u32 = 70;

/// Largest MUL_MAT_ID row map accepted, in bytes. `ggml_graph_plan`
/// sizes the work buffer with `n_as * ids->ne[0] * ids->ne[1] *
/// sizeof(mmid_row_mapping)` (8 bytes) plus a cache line per expert, and
/// the CPU backend allocates it with `new[]`, which aborts the process
/// when it fails: a tiny expert tensor (`n_as` matrices of one row) and a
/// large id tensor would ask for terabytes. 256 MiB covers 256 experts,
/// 8 per token, 16384 tokens.
pub const MAX_MUL_MAT_ID_MAP: u64 = 256 << 20;

/// Checks one node of an op of this module; `None` for other ops.
pub(super) fn check(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Option<Result<()>> {
    let op = r.op;
    let checked = match op {
        OP_ADD_ID => check_add_id(r, s),
        OP_MUL_MAT_ID => check_mul_mat_id(r, s),
        OP_ACC | OP_SET => check_acc_set(r, s),
        OP_SQR | OP_SQRT => with_src(r, s, check_sqr),
        OP_SUM => with_src(r, s, check_sum),
        OP_SUM_ROWS | OP_MEAN => with_src(r, s, check_sum_rows),
        OP_ARGMAX => with_src(r, s, check_argmax),
        OP_REPEAT => with_src(r, s, check_repeat),
        OP_CONCAT => check_concat(r, s),
        OP_L2_NORM => with_src(r, s, check_l2_norm),
        OP_DIAG_MASK_INF => with_src(r, s, check_diag_mask_inf),
        OP_CLAMP => with_src(r, s, check_clamp),
        OP_PAD => with_src(r, s, check_pad),
        OP_ARGSORT | OP_TOP_K => with_src(r, s, check_sort),
        _ => return super::op_shapes_more::check(r, s),
    };
    Some(checked)
}

fn with_src(
    r: &RpcTensor,
    s: &[Option<&RpcTensor>; MAX_SRC],
    f: fn(&RpcTensor, &RpcTensor) -> Result<()>,
) -> Result<()> {
    match s[0] {
        Some(a) => f(r, a),
        None => refuse(r.op, "missing source 0"),
    }
}

/// ADD_ID: `ggml_compute_forward_add_id_f32`. dst row (i1, i2) = src0
/// row plus src1 row `ids[i1, i2]` (range-checked at run time against
/// src1's rows, graph.rs).
fn check_add_id(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
    let op = r.op;
    let (Some(a), Some(b), Some(ids)) = (s[0], s[1], s[2]) else {
        return refuse(op, "add_id needs three sources");
    };
    // GGML_ASSERT: dst, src0, src1 F32, src2 I32; src0->nb[0], src1->nb[0],
    // nb0 == sizeof(float). Rows are counted over src0 and split by dst's
    // ne1 / ne2 (same shape: ggml_dup_tensor); each adds ne0 floats of a
    // src1 row (ggml_add_id: a->ne[0] == b->ne[0]); ids are read at
    // (i1, i2) < (ne1, ne2) (a->ne[1] == ids->ne[0], a->ne[2] == ids->ne[1]).
    if r.ty != GGML_TYPE_F32
        || a.ty != GGML_TYPE_F32
        || b.ty != GGML_TYPE_F32
        || ids.ty != GGML_TYPE_I32
        || !rows_contiguous(r)
        || !rows_contiguous(a)
        || !rows_contiguous(b)
        || r.ne != a.ne
        || b.ne[0] != a.ne[0]
        || ids.ne[0] != a.ne[1]
        || ids.ne[1] != a.ne[2]
    {
        return refuse(op, "add_id shapes/types");
    }
    Ok(())
}

/// MUL_MAT_ID: `ggml_compute_forward_mul_mat_id` (ggml-cpu.c) and its
/// tiled per-expert path. Expert ids are range-checked at run time
/// against src0's `ne[2]` matrices (graph.rs).
fn check_mul_mat_id(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
    let op = r.op;
    let (Some(a), Some(b), Some(ids)) = (s[0], s[1], s[2]) else {
        return refuse(op, "mul_mat_id needs three sources");
    };
    // ggml_mul_mat_id: !transposed(as), ids I32 2-D, as and b 3-D,
    // ids->ne[1] == b->ne[2], as->ne[0] == b->ne[0], ids->ne[0] % b->ne[1]
    // == 0 (the kernel takes src1 row `id % ne11`), result F32 [as->ne[1],
    // ids->ne[0], b->ne[2], 1]. Kernel: GGML_ASSERT(nb00 == type size),
    // (nb10 == type size), (nb0 == sizeof(float)), nb0 <= nb1 <= nb2 <=
    // nb3; src0 needs a vec_dot; a src1 that is not the vec_dot type is
    // converted with GGML_ASSERT(src1->type == GGML_TYPE_F32).
    let src1_ok = b.ty == GGML_TYPE_F32 || Some(b.ty) == cpu_types::vec_dot_type(a.ty);
    if !cpu_mul_mat_src0(a.ty)
        || !rows_contiguous(a)
        || a.nb[0] > a.nb[1]
        || a.ne[3] != 1
        || !src1_ok
        || !rows_contiguous(b)
        || b.ne[3] != 1
        || b.ne[0] != a.ne[0]
        || ids.ty != GGML_TYPE_I32
        || ids.ne[2] != 1
        || ids.ne[3] != 1
        || ids.ne[1] != b.ne[2]
        || !divides(b.ne[1], ids.ne[0])
        || r.ty != GGML_TYPE_F32
        || r.ne != [a.ne[1], ids.ne[0], b.ne[2], 1]
        || r.nb[0] != 4
        || !strides_ordered(r)
    {
        return refuse(op, "mul_mat_id shapes/types");
    }
    // The tiled path (K-quant / iq experts, tiled/tiled.cpp) reads a src1
    // that already is Q8_K at `(i11 + i12 * ne11) * nb11`.
    if cpu_types::tiled_mul_mat_src0(a.ty) && b.ty != GGML_TYPE_F32 && !flat_walk(b) {
        return refuse(
            op,
            "mul_mat_id of a tiled type by Q8_K needs src1 rows nb[1] apart",
        );
    }
    let map = u64::from(a.ne[2])
        .saturating_mul(u64::from(ids.ne[0]).saturating_mul(u64::from(ids.ne[1])))
        .saturating_mul(8)
        .saturating_add(u64::from(a.ne[2]).saturating_mul(72));
    if map > MAX_MUL_MAT_ID_MAP {
        return refuse(
            op,
            format!("mul_mat_id row map of {map} bytes exceeds {MAX_MUL_MAT_ID_MAP}"),
        );
    }
    Ok(())
}

/// ACC (`ggml_compute_forward_acc_f32`) and SET (`_set_f32`, `_set_i32`):
/// dst = copy of src0, then src1 added / copied into the view of dst with
/// strides op_params[0..3] (int32 cast to size_t) at byte offset
/// op_params[3].
fn check_acc_set(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
    let op = r.op;
    let (Some(a), Some(b)) = (s[0], s[1]) else {
        return refuse(op, "acc/set needs two sources");
    };
    // ACC: F32 only (GGML_ABORT otherwise, ggml_acc asserts F32 operands);
    // SET: F32 or I32, src1 read as the same element type.
    // GGML_ASSERT(ggml_are_same_shape(src0, dst)), both contiguous (the
    // memcpy of nbytes), GGML_ASSERT(nb10 == element size).
    let type_ok = match op {
        OP_ACC => a.ty == GGML_TYPE_F32,
        _ => matches!(a.ty, GGML_TYPE_F32 | GGML_TYPE_I32),
    };
    if !type_ok
        || b.ty != a.ty
        || r.ty != a.ty
        || r.ne != a.ne
        || !is_contiguous(r)
        || !is_contiguous(a)
        || b.nb[0] != 4
    {
        return refuse(op, "acc/set shapes/types");
    }
    // Negative op_params become huge size_t strides / offsets whose sums
    // wrap past the kernels' bound asserts. Those asserts bound the start
    // of the last element (`< nbytes` for ACC, `<= nbytes` for SET), not
    // its end: the view's last element must end inside dst.
    let p: [i32; 4] = [
        r.op_params[0],
        r.op_params[1],
        r.op_params[2],
        r.op_params[3],
    ];
    if p.iter().any(|&v| v < 0) {
        return refuse(op, format!("acc/set strides and offset {p:?} must be >= 0"));
    }
    let nb = [4u64, p[0] as u64, p[1] as u64, p[2] as u64];
    let last = (0..4).fold(p[3] as u64, |acc, d| {
        acc + u64::from(b.ne[d].saturating_sub(1)) * nb[d]
    });
    let dst_bytes = nelements(r).saturating_mul(4);
    if last + 4 > dst_bytes {
        return refuse(
            op,
            format!(
                "acc/set view ends at byte {}, past the {dst_bytes} bytes of dst",
                last + 4
            ),
        );
    }
    Ok(())
}

/// SQR / SQRT: `unary_op` (unary-ops.cpp).
fn check_sqr(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    // (src0, dst) types F32/F32, F16/F16, BF16/BF16, BF16/F32, F16/F32,
    // GGML_ABORT otherwise; apply_unary_op GGML_ASSERTs same shape, nb0 ==
    // sizeof(dst_t), nb00 == sizeof(src0_t); rows by their strides.
    let types_ok = r.ty == a.ty && float(a.ty)
        || (r.ty == GGML_TYPE_F32 && matches!(a.ty, GGML_TYPE_F16 | GGML_TYPE_BF16));
    if !types_ok || r.ne != a.ne || !rows_contiguous(r) || !rows_contiguous(a) {
        return refuse(r.op, "sqr/sqrt shapes/types");
    }
    Ok(())
}

/// SUM: `ggml_compute_forward_sum_{f32,f16,bf16}`: one value of the
/// source type written at dst->data[0], rows of ne00 packed elements
/// read by their strides.
fn check_sum(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    // Each row is summed as ne00 packed elements from the row's start
    // (ggml_vec_sum_*_ggf; the `nb[0] == sizeof` check there is a plain
    // assert, compiled out). Any nb[0] is safe: the last row starts at
    // sum_{i>=1} (ne[i] - 1) nb[i] and its packed read ends ne00 elements
    // later, which is within the tensor's extent (that offset plus
    // (ne00 - 1) nb[0] + one element) because check_shape makes nb[0]
    // at least one element wide whenever ne00 > 1. A permuted source
    // (test_sum's `{1, 0, 2, 3}`) is summed as ggml-cpu sums it.
    if !float(a.ty) || r.ty != a.ty || r.ne != [1, 1, 1, 1] {
        return refuse(r.op, "sum shapes/types");
    }
    Ok(())
}

/// SUM_ROWS (`_sum_rows_f32`) and MEAN (`_mean_f32`): F32 only (GGML_ABORT
/// otherwise), one float per source row written at dst (i1, i2, i3).
fn check_sum_rows(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    // sum_rows GGML_ASSERTs src0->nb[0] == dst->nb[0] == sizeof(float),
    // ne0 == 1 and ne1..3 equal (ggml_sum_rows / ggml_mean's shape); mean
    // reads packed rows the same way.
    if a.ty != GGML_TYPE_F32
        || r.ty != GGML_TYPE_F32
        || r.ne != [1, a.ne[1], a.ne[2], a.ne[3]]
        || a.nb[0] != 4
        || r.nb[0] != 4
    {
        return refuse(r.op, "sum_rows/mean shapes/types");
    }
    Ok(())
}

/// ARGMAX: `_argmax_f32`: the I32 index of each row's maximum, row i1 of
/// src0 (a matrix: ggml_argmax) written at `i1 * dst->nb[0]`.
fn check_argmax(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    if a.ty != GGML_TYPE_F32
        || r.ty != GGML_TYPE_I32
        || a.ne[2] != 1
        || a.ne[3] != 1
        || r.ne != [a.ne[1], 1, 1, 1]
        || a.nb[0] != 4
        || r.nb[0] != 4
    {
        return refuse(r.op, "argmax shapes/types");
    }
    Ok(())
}

/// REPEAT: `_repeat_f16` (F16, BF16, I16) and `_repeat_f32` (F32, I32),
/// GGML_ABORT on other types.
fn check_repeat(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    // GGML_ASSERT(ggml_can_repeat(src0, dst)) (a non-empty src0 whose
    // dims divide dst's), GGML_ASSERT(nb0 == nb00 == element size); dst
    // has src0's type (ggml_repeat); rows of ne00 packed elements.
    let type_ok = matches!(
        a.ty,
        GGML_TYPE_F16 | GGML_TYPE_BF16 | GGML_TYPE_I16 | GGML_TYPE_F32 | GGML_TYPE_I32
    );
    if !type_ok || r.ty != a.ty || !can_repeat(a, r) || !rows_contiguous(a) || !rows_contiguous(r) {
        return refuse(r.op, "repeat shapes/types");
    }
    Ok(())
}

/// CONCAT: `_concat_{f32,f16,i8}` element by element (F32 / I32, F16 /
/// BF16 / I16, I8), `_concat_any` by rows for every other type.
fn check_concat(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
    let op = r.op;
    let (Some(a), Some(b)) = (s[0], s[1]) else {
        return refuse(op, "concat needs two sources");
    };
    // GGML_ASSERT(dim >= 0 && dim < 4); ggml_concat: same types, equal dims
    // but `dim`, which adds up. Each kernel reads src1 at (i - o) for dst
    // positions past src0's extent: the shapes must be exactly these.
    let dim = r.op_params[0];
    let Ok(d) = usize::try_from(dim) else {
        return refuse(op, format!("concat dim {dim}"));
    };
    if d >= 4 {
        return refuse(op, format!("concat dim {dim}"));
    }
    let shape_ok = (0..4).all(|i| {
        if i == d {
            u64::from(r.ne[i]) == u64::from(a.ne[i]) + u64::from(b.ne[i])
        } else {
            r.ne[i] == a.ne[i] && r.ne[i] == b.ne[i]
        }
    });
    if a.ty != b.ty || r.ty != a.ty || !shape_ok {
        return refuse(op, "concat shapes/types");
    }
    let element_wise = matches!(
        a.ty,
        GGML_TYPE_F32
            | GGML_TYPE_I32
            | GGML_TYPE_F16
            | GGML_TYPE_BF16
            | GGML_TYPE_I16
            | GGML_TYPE_I8
    );
    // concat_any: GGML_ASSERT(ggml_is_contiguous_rows(src0), (src1)); it
    // memcpys packed source rows into dst rows, which must be packed too.
    let rows_packed = rows_contiguous(a) && rows_contiguous(b) && rows_contiguous(r);
    if !(element_wise || rows_packed) {
        return refuse(op, "concat of this type needs packed rows");
    }
    Ok(())
}

/// L2_NORM: `_l2_norm_f32`: F32 only, GGML_ASSERT(same shape),
/// GGML_ASSERT(eps >= 0.0f); any strides.
fn check_l2_norm(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    if a.ty != GGML_TYPE_F32 || r.ty != GGML_TYPE_F32 || r.ne != a.ne {
        return refuse(r.op, "l2_norm shapes/types");
    }
    let eps = f32_param(r, 0);
    if eps.is_nan() || eps < 0.0 {
        return refuse(r.op, format!("l2_norm eps {eps} is negative or NaN"));
    }
    Ok(())
}

/// DIAG_MASK_INF (and DIAG_MASK_ZERO, the same kernel): `_diag_mask_f32`.
/// Not in place, dst = copy of src0 (GGML_ASSERT same element count, both
/// contiguous); then -inf written at `k * nb2 + j * nb1 + i * nb0` for k <
/// ne2 * ne3: dims 2 and 3 are walked as one run of nb2 steps.
pub(super) fn check_diag_mask_inf(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    let op = r.op;
    let in_place = r.buffer == a.buffer && r.data == a.data;
    let walk_ok = |t: &RpcTensor| {
        t.ne[3] <= 1 || u64::from(t.nb[3]) == u64::from(t.ne[2]) * u64::from(t.nb[2])
    };
    if a.ty != GGML_TYPE_F32
        || r.ty != GGML_TYPE_F32
        || r.ne != a.ne
        || r.nb[0] != 4
        || a.nb[0] != 4
        || !walk_ok(r)
        || !(in_place || (is_contiguous(r) && is_contiguous(a)))
    {
        return refuse(op, "diag_mask_inf shapes/types");
    }
    // GGML_ASSERT(n_past >= 0); `i > n_past + j` in int for j < ne1.
    let n_past = i64::from(r.op_params[0]);
    if n_past < 0 || n_past + i64::from(a.ne[1]) > i64::from(i32::MAX) {
        return refuse(op, format!("diag_mask_inf n_past {n_past}"));
    }
    Ok(())
}

/// CLAMP: `_clamp_f32` / `_clamp_f16` (GGML_ABORT on other types): rows
/// `j < ggml_nrows(src0)` at `j * nb01` / `j * nb1`, one flat run.
fn check_clamp(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    // GGML_ASSERT(nb0 == nb00 == element size); dst of src0's shape and
    // type (ggml_clamp); min / max are plain floats (MAX(MIN(x, max), min)).
    if !same_type_flat_map(r, a) {
        return refuse(r.op, "clamp shapes/types");
    }
    Ok(())
}

/// PAD: `_pad_f32<circular>`: dst written by its flat element index (it
/// must be contiguous), src0 read at `i - lp` per dim (plain) or at `(i -
/// lp + ne0x) % ne0x` (circular, op_params[8]).
fn check_pad(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    let op = r.op;
    if a.ty != GGML_TYPE_F32 || r.ty != GGML_TYPE_F32 || !is_contiguous(r) || r.nb[0] != 4 {
        return refuse(op, "pad shapes/types");
    }
    let circular = r.op_params[8] != 0;
    for d in 0..4 {
        let (lp, rp) = (r.op_params[2 * d], r.op_params[2 * d + 1]);
        // ggml_pad_ext: ne = a->ne + lp + rp. Then the plain kernel reads
        // src0 at i - lp for lp <= i < ne - rp, i.e. below a->ne (negative
        // pads crop); a wider dst would read past src0.
        let expected = i64::from(a.ne[d]) + i64::from(lp) + i64::from(rp);
        if i64::from(r.ne[d]) != expected {
            return refuse(op, format!("pad dim {d}: {lp} + {} + {rp}", a.ne[d]));
        }
        // Circular: `(i - lp + ne0x) % ne0x` divides by zero for an empty
        // source and is negative (a read before src0) when lp > ne0x.
        if circular && (a.ne[d] == 0 || i64::from(lp) > i64::from(a.ne[d])) {
            return refuse(op, format!("circular pad dim {d}: {lp} of {}", a.ne[d]));
        }
    }
    Ok(())
}

/// ARGSORT (`_argsort_f32`) and TOP_K (`_top_k_f32`): F32 rows `i <
/// ggml_nrows(src0)` read at `i * nb01` and I32 indices written at `i *
/// nb1`, each one flat run; GGML_ASSERT(nb0 == sizeof(float)).
fn check_sort(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    let op = r.op;
    let shape_ok = if op == OP_ARGSORT {
        r.ne == a.ne
    } else {
        // ggml_top_k: [k, ne1, ne2, ne3] with k <= ne00
        // (std::partial_sort's middle within the row).
        r.ne[0] <= a.ne[0] && r.ne[1..] == a.ne[1..]
    };
    if a.ty != GGML_TYPE_F32
        || r.ty != GGML_TYPE_I32
        || !shape_ok
        || r.nb[0] != 4
        || a.nb[0] != 4
        || !flat_walk(r)
        || !flat_walk(a)
    {
        return refuse(op, "argsort/top_k shapes/types");
    }
    // argsort: switch (order) ASC 0 / DESC 1, GGML_ABORT("invalid sort
    // order") otherwise.
    if op == OP_ARGSORT && !matches!(r.op_params[0], 0 | 1) {
        return refuse(op, format!("argsort order {}", r.op_params[0]));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::types::type_info;

    fn packed(ty: u32, ne: [u32; 4]) -> RpcTensor {
        let (bs, ts) = type_info(ty).map_or((1, 4), |i| (i.block_size, i.type_size));
        let row = (u64::from(ne[0]) / bs * ts) as u32;
        RpcTensor {
            ty,
            ne,
            nb: [ts as u32, row, row * ne[1], row * ne[1] * ne[2]],
            ..RpcTensor::default()
        }
    }

    fn node(ty: u32, ne: [u32; 4], op: u32) -> RpcTensor {
        let mut r = packed(ty, ne);
        r.op = op;
        r
    }

    fn run(r: &RpcTensor, srcs: &[&RpcTensor]) -> bool {
        let mut s = [None; MAX_SRC];
        for (slot, t) in s.iter_mut().zip(srcs) {
            *slot = Some(*t);
        }
        matches!(check(r, &s), Some(Ok(())))
    }

    #[test]
    fn mul_mat_id_shapes_types_and_map_bound() {
        let ok = |a_ty: u32, b_ty: u32, b_ne1: u32, n_as: u32, tokens: u32| {
            let a = packed(a_ty, [256, 16, n_as, 1]);
            let b = packed(b_ty, [256, b_ne1, tokens, 1]);
            let ids = packed(GGML_TYPE_I32, [4, tokens, 1, 1]);
            let r = node(GGML_TYPE_F32, [16, 4, tokens, 1], OP_MUL_MAT_ID);
            run(&r, &[&a, &b, &ids])
        };
        assert!(ok(GGML_TYPE_F32, GGML_TYPE_F32, 4, 8, 3));
        assert!(ok(GGML_TYPE_F16, GGML_TYPE_F32, 1, 8, 3));
        assert!(ok(GGML_TYPE_F16, GGML_TYPE_F16, 4, 8, 3));
        assert!(ok(8, 8, 4, 8, 3)); // q8_0 x q8_0
        // F16 src1 for F32 experts: GGML_ASSERT(src1->type == F32).
        assert!(!ok(GGML_TYPE_F32, GGML_TYPE_F16, 4, 8, 3));
        assert!(!ok(GGML_TYPE_BF16, GGML_TYPE_F16, 4, 8, 3));
        // ids.ne0 % b.ne1.
        assert!(!ok(GGML_TYPE_F32, GGML_TYPE_F32, 3, 8, 3));
        assert!(!ok(9, GGML_TYPE_F32, 4, 8, 3)); // q8_1: no vec_dot
        // 2^20 experts x 4 x 2^13 tokens: a 256 GiB row map.
        let a = packed(GGML_TYPE_F32, [1, 1, 1 << 20, 1]);
        let b = packed(GGML_TYPE_F32, [1, 4, 1 << 13, 1]);
        let ids = packed(GGML_TYPE_I32, [4, 1 << 13, 1, 1]);
        let r = node(GGML_TYPE_F32, [1, 4, 1 << 13, 1], OP_MUL_MAT_ID);
        assert!(!run(&r, &[&a, &b, &ids]));
    }

    #[test]
    fn add_id_shapes() {
        let a = packed(GGML_TYPE_F32, [32, 4, 3, 1]);
        let b = packed(GGML_TYPE_F32, [32, 8, 1, 1]);
        let ids = packed(GGML_TYPE_I32, [4, 3, 1, 1]);
        let r = node(GGML_TYPE_F32, [32, 4, 3, 1], OP_ADD_ID);
        assert!(run(&r, &[&a, &b, &ids]));
        let short_ids = packed(GGML_TYPE_I32, [4, 2, 1, 1]);
        assert!(!run(&r, &[&a, &b, &short_ids]));
        let f16 = packed(GGML_TYPE_F16, [32, 8, 1, 1]);
        assert!(!run(&r, &[&a, &f16, &ids]));
    }

    #[test]
    fn acc_and_set_views_end_inside_dst() {
        let a = packed(GGML_TYPE_F32, [8, 4, 1, 1]);
        let b = packed(GGML_TYPE_F32, [4, 2, 1, 1]);
        let view = |op: u32, ty: u32, nb1: i32, offset: i32| {
            let a = packed(ty, a.ne);
            let b = packed(ty, b.ne);
            let mut r = node(ty, [8, 4, 1, 1], op);
            r.op_params[..4].copy_from_slice(&[nb1, 32 * 4, 32 * 4, offset]);
            run(&r, &[&a, &b])
        };
        assert!(view(OP_ACC, GGML_TYPE_F32, 32, 0));
        assert!(view(OP_SET, GGML_TYPE_I32, 32, 16));
        // Last element starts at 16 + 4 * 3 + 96 = 124 < 128: ends at 128.
        assert!(view(OP_SET, GGML_TYPE_F32, 96, 16));
        // Starts at 125 (passes `<= nbytes`), ends past dst.
        assert!(!view(OP_SET, GGML_TYPE_F32, 96, 17));
        assert!(!view(OP_ACC, GGML_TYPE_F32, -32, 128));
        assert!(!view(OP_ACC, GGML_TYPE_I32, 32, 0));
        assert!(!view(OP_SET, GGML_TYPE_F16, 32, 0));
    }

    #[test]
    fn reductions_sorts_and_shapes() {
        let a = packed(GGML_TYPE_F32, [16, 4, 3, 1]);
        assert!(run(&node(GGML_TYPE_F32, [1, 1, 1, 1], OP_SUM), &[&a]));
        assert!(!run(&node(GGML_TYPE_F32, [2, 1, 1, 1], OP_SUM), &[&a]));
        assert!(run(&node(GGML_TYPE_F32, [1, 4, 3, 1], OP_SUM_ROWS), &[&a]));
        assert!(run(&node(GGML_TYPE_F32, [1, 4, 3, 1], OP_MEAN), &[&a]));
        assert!(!run(&node(GGML_TYPE_F32, [1, 4, 2, 1], OP_MEAN), &[&a]));
        let m = packed(GGML_TYPE_F32, [16, 4, 1, 1]);
        assert!(run(&node(GGML_TYPE_I32, [4, 1, 1, 1], OP_ARGMAX), &[&m]));
        assert!(!run(&node(GGML_TYPE_I32, [4, 1, 1, 1], OP_ARGMAX), &[&a]));
        let mut sort = node(GGML_TYPE_I32, [16, 4, 3, 1], OP_ARGSORT);
        assert!(run(&sort, &[&a]));
        sort.op_params[0] = 2;
        assert!(!run(&sort, &[&a]));
        assert!(run(&node(GGML_TYPE_I32, [5, 4, 3, 1], OP_TOP_K), &[&a]));
        assert!(!run(&node(GGML_TYPE_I32, [17, 4, 3, 1], OP_TOP_K), &[&a]));
        // Rows walked as one run: dim 2 not packed after dim 1.
        let mut gap = node(GGML_TYPE_I32, [16, 4, 3, 1], OP_ARGSORT);
        gap.nb[2] *= 2;
        gap.nb[3] *= 2;
        assert!(!run(&gap, &[&a]));
    }

    #[test]
    fn concat_repeat_pad_rules() {
        let a = packed(GGML_TYPE_F32, [8, 4, 3, 1]);
        let b = packed(GGML_TYPE_F32, [8, 2, 3, 1]);
        let mut r = node(GGML_TYPE_F32, [8, 6, 3, 1], OP_CONCAT);
        r.op_params[0] = 1;
        assert!(run(&r, &[&a, &b]));
        r.op_params[0] = 4;
        assert!(!run(&r, &[&a, &b]));
        r.op_params[0] = 0;
        assert!(!run(&r, &[&a, &b]));
        assert!(run(&node(GGML_TYPE_F32, [16, 8, 3, 2], OP_REPEAT), &[&a]));
        assert!(!run(&node(GGML_TYPE_F32, [12, 8, 3, 2], OP_REPEAT), &[&a]));
        let q = packed(8, [64, 2, 1, 1]);
        assert!(!run(&node(8, [64, 4, 1, 1], OP_REPEAT), &[&q]));
        let pad = |params: [i32; 9], ne: [u32; 4]| {
            let mut r = node(GGML_TYPE_F32, ne, OP_PAD);
            r.op_params[..9].copy_from_slice(&params);
            run(&r, &[&a])
        };
        assert!(pad([1, 2, 0, 1, 0, 0, 0, 0, 0], [11, 5, 3, 1]));
        assert!(pad([1, 2, 0, 1, 0, 0, 0, 0, 1], [11, 5, 3, 1]));
        // Negative pads crop.
        assert!(pad([-1, 4, 0, 1, 0, 0, 0, 0, 0], [11, 5, 3, 1]));
        assert!(pad([-2, -1, 0, 0, 0, 0, 0, 0, 1], [5, 4, 3, 1]));
        assert!(!pad([9, 0, 0, 0, 0, 0, 0, 0, 1], [17, 4, 3, 1]));
        assert!(!pad([1, 2, 0, 1, 0, 0, 0, 0, 0], [12, 5, 3, 1]));
    }

    #[test]
    fn element_wise_ops() {
        let a = packed(GGML_TYPE_F16, [8, 4, 1, 1]);
        assert!(run(&node(GGML_TYPE_F16, [8, 4, 1, 1], OP_SQR), &[&a]));
        assert!(run(&node(GGML_TYPE_F32, [8, 4, 1, 1], OP_SQRT), &[&a]));
        assert!(!run(&node(GGML_TYPE_BF16, [8, 4, 1, 1], OP_SQRT), &[&a]));
        assert!(run(&node(GGML_TYPE_F16, [8, 4, 1, 1], OP_CLAMP), &[&a]));
        let b = packed(GGML_TYPE_BF16, [8, 4, 1, 1]);
        assert!(!run(&node(GGML_TYPE_BF16, [8, 4, 1, 1], OP_CLAMP), &[&b]));
        let f = packed(GGML_TYPE_F32, [8, 4, 1, 1]);
        let mut l2 = node(GGML_TYPE_F32, [8, 4, 1, 1], OP_L2_NORM);
        assert!(run(&l2, &[&f]));
        l2.op_params[0] = f32::NAN.to_bits() as i32;
        assert!(!run(&l2, &[&f]));
        let mut mask = node(GGML_TYPE_F32, [8, 4, 1, 1], OP_DIAG_MASK_INF);
        mask.data = 4096;
        assert!(run(&mask, &[&f]));
        mask.op_params[0] = -1;
        assert!(!run(&mask, &[&f]));
        // dims 2, 3 walked by nb2: nb3 must follow.
        let g = packed(GGML_TYPE_F32, [8, 4, 1, 3]);
        let mut m = node(GGML_TYPE_F32, [8, 4, 1, 3], OP_DIAG_MASK_INF);
        m.nb[2] = 1 << 20;
        assert!(!run(&m, &[&g]));
    }
}
