//! Normalisations: NORM, RMS_NORM, L2_NORM, GROUP_NORM (RMS_NORM_BACK is a
//! training op, `train.rs`).

use super::common::*;

/// NORM, RMS_NORM: `ggml_compute_forward_norm` / `rms_norm` (ops.cpp).
pub(super) fn check_norm(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
    let op = r.op;
    let src = |i: usize| source(s, op, i);
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

/// L2_NORM: `_l2_norm_f32`: F32 only, GGML_ASSERT(same shape),
/// GGML_ASSERT(eps >= 0.0f); any strides.
pub(super) fn check_l2_norm(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    if a.ty != GGML_TYPE_F32 || r.ty != GGML_TYPE_F32 || r.ne != a.ne {
        return refuse(r.op, "l2_norm shapes/types");
    }
    let eps = f32_param(r, 0);
    if eps.is_nan() || eps < 0.0 {
        return refuse(r.op, format!("l2_norm eps {eps} is negative or NaN"));
    }
    Ok(())
}

/// GROUP_NORM: `_group_norm_f32` (F32 only, GGML_ABORT otherwise).
pub(super) fn check_group_norm(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
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
