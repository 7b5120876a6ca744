//! Ops of no larger family: the generators ARANGE and TIMESTEP_EMBEDDING,
//! the triangular solver SOLVE_TRI, and DeepSeek-V4's hyper-connection ops
//! DSV4_HC_COMB / _PRE / _POST.

use super::common::*;

/// ARANGE: `_arange_f32` (dst F32, GGML_ABORT otherwise).
pub(super) fn check_arange(r: &RpcTensor) -> Result<()> {
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
pub(super) fn check_timestep_embedding(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
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

/// SOLVE_TRI: `ggml_compute_forward_solve_tri_f32` (GGML_ABORT unless A
/// and B are F32). GGML_ASSERT: dst F32, ne00 = ne01, ne0 = ne10, ne1 =
/// ne11, batch dims equal. Within a batch it reads A as `A[i00 * n + t]`
/// and B, X as `[i00 * k + i01]` with `n = ne11`, `k = ne10`: packed
/// rows and matrices (ggml_solve_tri asserts A and B contiguous; X is
/// written the same way), and A's side equal to B's rows (n indexes A).
pub(super) fn check_solve_tri(r: &RpcTensor, a: &RpcTensor, b: &RpcTensor) -> Result<()> {
    if a.ty != GGML_TYPE_F32
        || b.ty != GGML_TYPE_F32
        || r.ty != GGML_TYPE_F32
        || !is_contiguous(a)
        || !is_contiguous(b)
        || !is_contiguous(r)
        || a.ne[0] != a.ne[1]
        || a.ne[1] != b.ne[1]
        || r.ne != b.ne
        || a.ne[2..] != b.ne[2..]
    {
        return refuse(
            r.op,
            format!("solve_tri of A {:?}, B {:?} into {:?}", a.ne, b.ne, r.ne),
        );
    }
    Ok(())
}

/// DSV4_HC_COMB (mixes, scale, base), _PRE (x, weights), _POST (x,
/// residual, post, comb or none): `ggml_compute_forward_dsv4_hc_*_f32`
/// (F32 src0, GGML_ABORT otherwise; every tensor read and dst written as
/// floats by its strides). The kernels' GGML_ASSERTs are the builders'
/// shapes, which keep every index inside its tensor: COMB mixes [24, T],
/// scale ne[0] >= 3 (element 2 read), base [24], dst [4, 4, T], n_iter
/// (op_params[1]) >= 1; PRE x [E, hc, T], weights [E, hc, T] when gated
/// (op_params[1] != 0) else [hc, T], dst [E, T]; POST x [E, T], residual
/// [E, hc, T], post [hc, T], comb [hc, hc, T], dst [E, hc, T].
pub(super) fn check_dsv4_hc(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
    let op = r.op;
    let n_src = if op == OP_DSV4_HC_PRE { 2 } else { 3 };
    let mut srcs = Vec::with_capacity(4);
    for slot in s.iter().take(n_src) {
        match slot {
            Some(t) if t.ty == GGML_TYPE_F32 => srcs.push(*t),
            _ => return refuse(op, "dsv4_hc sources must be F32"),
        }
    }
    let comb = s[3];
    if r.ty != GGML_TYPE_F32 || comb.is_some_and(|c| op != OP_DSV4_HC_POST || c.ty != GGML_TYPE_F32)
    {
        return refuse(op, "dsv4_hc types");
    }
    let shape = |t: &RpcTensor| [ne(t, 0), ne(t, 1), ne(t, 2), ne(t, 3)];
    let hc = i64::from(DSV4_HC);
    let mix = (2 + hc) * hc;
    let ok = match op {
        OP_DSV4_HC_COMB => {
            let (mixes, scale, base) = (srcs[0], srcs[1], srcs[2]);
            let t = ne(mixes, 1);
            shape(mixes) == [mix, t, 1, 1]
                && scale.ne[0] >= 3
                && scale.ne[1..] == [1, 1, 1]
                && shape(base) == [mix, 1, 1, 1]
                && shape(r) == [hc, hc, t, 1]
                && r.op_params[1] >= 1
        }
        OP_DSV4_HC_PRE => {
            let (x, w) = (srcs[0], srcs[1]);
            let (e, hc, t) = (ne(x, 0), ne(x, 1), ne(x, 2));
            let w_shape = if r.op_params[1] != 0 {
                [e, hc, t, 1]
            } else {
                [hc, t, 1, 1]
            };
            hc >= 1 && x.ne[3] == 1 && shape(w) == w_shape && shape(r) == [e, t, 1, 1]
        }
        _ => {
            let (x, residual, post) = (srcs[0], srcs[1], srcs[2]);
            let (e, t, hc) = (ne(x, 0), ne(x, 1), ne(residual, 1));
            hc >= 1
                && shape(x) == [e, t, 1, 1]
                && shape(residual) == [e, hc, t, 1]
                && shape(post) == [hc, t, 1, 1]
                && comb.is_none_or(|c| shape(c) == [hc, hc, t, 1])
                && shape(r) == [e, hc, t, 1]
        }
    };
    if !ok {
        let shapes: Vec<[u32; 4]> = srcs.iter().map(|t| t.ne).collect();
        return refuse(
            op,
            format!(
                "dsv4_hc of {shapes:?} into {:?} (params {:?})",
                r.ne,
                &r.op_params[..2]
            ),
        );
    }
    Ok(())
}
