//! GLU: every `ggml_glu_op` (SWIGLU, GEGLU, REGLU, SWIGLU_OAI, ...), with
//! the gate as a second source or the two halves of one row.

use super::common::*;

/// GLU (every `ggml_glu_op`): `ggml_compute_forward_glu` (ops.cpp).
pub(super) fn check_glu(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
    let op = r.op;
    let src = |i: usize| source(s, op, i);
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
