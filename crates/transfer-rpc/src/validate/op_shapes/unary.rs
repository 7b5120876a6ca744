//! Unary element-wise ops: UNARY (every `ggml_unary_op`), SQR, SQRT, LOG,
//! SIN, COS, SCALE, CLAMP, LEAKY_RELU, FILL.

use super::common::*;

/// SCALE: `ggml_compute_forward_scale` (ops.cpp).
pub(super) fn check_scale(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
    let op = r.op;
    let src = |i: usize| source(s, op, i);
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

/// UNARY (every `ggml_unary_op`): `unary_op` (unary-ops.cpp) and ops.cpp.
pub(super) fn check_unary(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
    let op = r.op;
    let src = |i: usize| source(s, op, i);
    let a = src(0)?;
    // unary_op / unary_op_params (unary-ops.cpp) and the gelu,
    // gelu_erf, gelu_quick, silu kernels (ops.cpp) take F32, F16
    // and BF16 with dst of the source type; apply_unary_op
    // GGML_ASSERTs ggml_is_contiguous_rows of both, nb0 ==
    // sizeof(dst_t), nb00 == sizeof(src0_t), same shape.
    if r.ne != a.ne || r.ty != a.ty || !float(a.ty) || !rows_contiguous(a) || !rows_contiguous(r) {
        return refuse(op, "unary shapes/types");
    }
    // XIELU goes through apply_unary_op_functor, which
    // GGML_ASSERTs ggml_is_contiguous_1(src0) and (dst).
    if r.op_params[0] == UNARY_XIELU && (!is_contiguous_1(a) || !is_contiguous_1(r)) {
        return refuse(op, "xielu source and result must be contiguous past dim 1");
    }
    Ok(())
}

/// SQR / SQRT: `unary_op` (unary-ops.cpp).
pub(super) fn check_sqr(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
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

/// CLAMP: `_clamp_f32` / `_clamp_f16` (GGML_ABORT on other types): rows
/// `j < ggml_nrows(src0)` at `j * nb01` / `j * nb1`, one flat run.
pub(super) fn check_clamp(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    // GGML_ASSERT(nb0 == nb00 == element size); dst of src0's shape and
    // type (ggml_clamp); min / max are plain floats (MAX(MIN(x, max), min)).
    if !same_type_flat_map(r, a) {
        return refuse(r.op, "clamp shapes/types");
    }
    Ok(())
}

/// LOG, SIN, COS: `unary_op` (unary-ops.cpp), as SQR / SQRT: (src0, dst)
/// types F32/F32, F16/F16, BF16/BF16, BF16/F32, F16/F32, GGML_ABORT
/// otherwise; apply_unary_op GGML_ASSERTs same shape, nb0 ==
/// sizeof(dst_t), nb00 == sizeof(src0_t); rows by their strides.
pub(super) fn check_unary_op(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    let types_ok = r.ty == a.ty && float(a.ty)
        || (r.ty == GGML_TYPE_F32 && matches!(a.ty, GGML_TYPE_F16 | GGML_TYPE_BF16));
    if !types_ok || r.ne != a.ne || !rows_contiguous(r) || !rows_contiguous(a) {
        return refuse(r.op, "log/sin/cos shapes/types");
    }
    Ok(())
}

/// LEAKY_RELU: `_leaky_relu_{f32,f16}` (GGML_ABORT on other types): dst
/// written as the source type, `ggml_nrows` rows of ne0 packed elements
/// at `i * nb1` / `i * nb01` (one flat run, asserts compiled out).
pub(super) fn check_leaky_relu(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    if !same_type_flat_map(r, a) {
        return refuse(r.op, "leaky_relu shapes/types");
    }
    Ok(())
}

/// FILL: `_fill_{f32,f16}` by src0's type (GGML_ABORT otherwise): dst
/// rows of ne0 packed elements of that type set to op_params[0].
pub(super) fn check_fill(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    if !matches!(a.ty, GGML_TYPE_F32 | GGML_TYPE_F16) || r.ty != a.ty || !rows_contiguous(r) {
        return refuse(r.op, "fill shapes/types");
    }
    Ok(())
}
