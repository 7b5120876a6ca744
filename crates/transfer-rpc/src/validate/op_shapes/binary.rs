//! Binary element-wise ops: ADD, SUB, MUL, DIV (src1 broadcast over
//! src0), ADD1, ADD_ID (MoE: its expert ids are range-checked at run time
//! like GET_ROWS indices, see `graph.rs`), and the strided writes into a
//! copy ACC and SET.

use super::common::*;

/// ADD, SUB, MUL, DIV: `binary_op` (binary-ops.cpp).
pub(super) fn check_binary(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
    let op = r.op;
    let src = |i: usize| source(s, op, i);
    let (a, b) = (src(0)?, src(1)?);
    // binary_op (binary-ops.cpp) has kernels for these (dst, src0,
    // src1) types only and GGML_ABORTs on any other: all F32, all
    // F16, all BF16, and F16 / BF16 with an F32 src1 (dst = src0).
    if r.ne != a.ne || r.ty != a.ty || !float(a.ty) || !(b.ty == a.ty || b.ty == GGML_TYPE_F32) {
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

/// ADD_ID: `ggml_compute_forward_add_id_f32`. dst row (i1, i2) = src0
/// row plus src1 row `ids[i1, i2]` (range-checked at run time against
/// src1's rows, graph.rs).
pub(super) fn check_add_id(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
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

/// ACC (`ggml_compute_forward_acc_f32`) and SET (`_set_f32`, `_set_i32`):
/// dst = copy of src0, then src1 added / copied into the view of dst with
/// strides op_params[0..3] (int32 cast to size_t) at byte offset
/// op_params[3].
pub(super) fn check_acc_set(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
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

/// ADD1: `ggml_compute_forward_add1_{f32,f16_f32,f16_f16,bf16_f32,
/// bf16_bf16}`: dst = src0 + the scalar `*(src1_t *) src1->data`. Each
/// GGML_ASSERTs same shape (src0, dst), ggml_is_scalar(src1), nb0 ==
/// nb00 == element size; rows by their strides. The F32 kernel reads the
/// scalar as a float whatever src1's type (4 bytes of a 2-byte tensor):
/// an F32 src0 needs an F32 scalar. Quantized src0 (add1_q_f32) is not
/// served: ggml_add1 builds the result as src0's type, which the q path
/// then writes with from_float per row (llama.cpp never builds it).
pub(super) fn check_add1(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
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
