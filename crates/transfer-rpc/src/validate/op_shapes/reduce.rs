//! Reductions, counts and sorts: SUM, SUM_ROWS, MEAN, ARGMAX, COUNT_EQUAL,
//! CUMSUM, ARGSORT, TOP_K.

use super::common::*;

/// SUM: `ggml_compute_forward_sum_{f32,f16,bf16}`: one value of the
/// source type written at dst->data[0], rows of ne00 packed elements
/// read by their strides.
pub(super) fn check_sum(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
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
pub(super) fn check_sum_rows(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
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
pub(super) fn check_argmax(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
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

/// ARGSORT (`_argsort_f32`) and TOP_K (`_top_k_f32`): F32 rows `i <
/// ggml_nrows(src0)` read at `i * nb01` and I32 indices written at `i *
/// nb1`, each one flat run; GGML_ASSERT(nb0 == sizeof(float)).
pub(super) fn check_sort(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
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

/// COUNT_EQUAL: `ggml_compute_forward_count_equal_i32`.
pub(super) fn check_count_equal(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
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
pub(super) fn check_cumsum(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
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
