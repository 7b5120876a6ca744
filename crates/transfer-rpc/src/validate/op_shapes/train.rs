//! Backward and optimizer ops (what ggml's training graphs and
//! test-backend-ops' gradient checks send): SILU_BACK, RMS_NORM_BACK,
//! SOFT_MAX_BACK, REPEAT_BACK, CROSS_ENTROPY_LOSS, CROSS_ENTROPY_LOSS_BACK,
//! OPT_STEP_ADAMW and OPT_STEP_SGD, IM2COL_BACK, POOL_2D_BACK, GET_ROWS_BACK
//! (its indices are range-checked on every run like GET_ROWS', in
//! `graph.rs`; ROPE_BACK runs ROPE's kernel and takes ROPE's rule in
//! `rope.rs`). The optimizer steps write into their sources (the weights
//! and the moments), not into their result.

use super::common::*;
use super::pool::pool_output;

/// SILU_BACK (grad, x): `ggml_compute_forward_silu_back_{f32,f16}` by
/// grad's type (GGML_ABORT on others); x and dst are read and written as
/// that type. Row i1 < `ggml_nrows(x)` of each is `nc = x ne[0]` packed
/// elements at `i1 * nb1`, one flat run (the kernel's asserts, compiled
/// out, name ggml_is_contiguous_1 and equal shapes).
pub(super) fn check_silu_back(r: &RpcTensor, g: &RpcTensor, x: &RpcTensor) -> Result<()> {
    if !same_type_flat_map(r, g) || !same_type_flat_map(r, x) {
        return refuse(
            r.op,
            format!("silu_back of {:?} and {:?} into {:?}", g.ne, x.ne, r.ne),
        );
    }
    Ok(())
}

/// RMS_NORM_BACK (dz, x): `ggml_compute_forward_rms_norm_back_f32` (F32
/// dz, GGML_ABORT otherwise; x read and dst written as floats).
/// GGML_ASSERT: the three of one shape, nb00 = nb10 = 4; dst rows are
/// written as `ne00` packed floats (nb0 = 4 too); rows by their strides.
/// eps (op_params[0]) is a plain float.
pub(super) fn check_rms_norm_back(r: &RpcTensor, dz: &RpcTensor, x: &RpcTensor) -> Result<()> {
    let f32_rows = [r, dz, x]
        .iter()
        .all(|t| t.ty == GGML_TYPE_F32 && t.nb[0] == 4);
    if !f32_rows || r.ne != dz.ne || x.ne != dz.ne {
        return refuse(
            r.op,
            format!(
                "rms_norm_back of {:?} and {:?} into {:?}",
                dz.ne, x.ne, r.ne
            ),
        );
    }
    Ok(())
}

/// SOFT_MAX_BACK (dy, y): `ggml_compute_forward_soft_max_ext_back_f32`
/// (F32 dy, GGML_ABORT otherwise; y read and dst written as floats).
/// GGML_ASSERT: the three contiguous and of one shape, max_bias
/// (op_params[1]) = 0. Row i1 < `ggml_nrows` of each is read at `i1 *
/// nb1` (one flat run: `ggml_is_contiguous` leaves nb1 free when ne1 =
/// 1). scale (op_params[0]) is a plain float.
pub(super) fn check_soft_max_back(r: &RpcTensor, dy: &RpcTensor, y: &RpcTensor) -> Result<()> {
    let op = r.op;
    let flat = [r, dy, y]
        .iter()
        .all(|t| t.ty == GGML_TYPE_F32 && flat_rows(t));
    if !flat || r.ne != dy.ne || y.ne != dy.ne {
        return refuse(
            op,
            format!(
                "soft_max_back of {:?} and {:?} into {:?}",
                dy.ne, y.ne, r.ne
            ),
        );
    }
    let max_bias = f32_param(r, 1);
    if max_bias != 0.0 {
        return refuse(op, format!("soft_max_back max_bias {max_bias}"));
    }
    Ok(())
}

/// REPEAT_BACK: `ggml_compute_forward_repeat_back_f32` (F32 source,
/// GGML_ABORT otherwise; dst written as floats). GGML_ASSERT:
/// ggml_can_repeat(dst, src0), nb0 = nb00 = 4; it divides each source dim
/// by dst's, zeroes dst (flat when contiguous, else row by row) and adds
/// the source's blocks by their strides. An empty dst is never computed
/// (ggml_compute_forward skips empty nodes).
pub(super) fn check_repeat_back(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    if a.ty != GGML_TYPE_F32
        || r.ty != GGML_TYPE_F32
        || a.nb[0] != 4
        || r.nb[0] != 4
        || (nelements(r) != 0 && !can_repeat(r, a))
    {
        return refuse(r.op, format!("repeat_back of {:?} into {:?}", a.ne, r.ne));
    }
    Ok(())
}

/// CROSS_ENTROPY_LOSS (logits, labels):
/// `ggml_compute_forward_cross_entropy_loss_f32`. GGML_ASSERT: both F32
/// with packed rows, one shape, dst an F32 scalar. Row i1 < `ggml_nrows`
/// of each is read at `i1 * nb1` (one flat run). Each thread's log-softmax
/// row lives in the work buffer (`MAX_CROSS_ENTROPY_ROW`).
pub(super) fn check_cross_entropy_loss(r: &RpcTensor, a: &RpcTensor, b: &RpcTensor) -> Result<()> {
    let rows_ok = [a, b]
        .iter()
        .all(|t| t.ty == GGML_TYPE_F32 && rows_contiguous(t) && flat_walk(t));
    if !rows_ok
        || a.ne != b.ne
        || r.ty != GGML_TYPE_F32
        || r.ne != [1, 1, 1, 1]
        || a.ne[0] > MAX_CROSS_ENTROPY_ROW
    {
        return refuse(
            r.op,
            format!(
                "cross_entropy_loss of {:?} and {:?} into {:?}",
                a.ne, b.ne, r.ne
            ),
        );
    }
    Ok(())
}

/// CROSS_ENTROPY_LOSS_BACK (grad, logits, labels):
/// `ggml_compute_forward_cross_entropy_loss_back_f32` (F32 grad,
/// GGML_ABORT otherwise; the rest read and written as floats).
/// GGML_ASSERT: all four contiguous, logits, labels and dst of one shape.
/// It reads `grad[0]` (a non-empty grad) and row i1 < `ggml_nrows` of the
/// others at `i1 * nb1` (one flat run).
pub(super) fn check_cross_entropy_loss_back(
    r: &RpcTensor,
    g: &RpcTensor,
    a: &RpcTensor,
    b: &RpcTensor,
) -> Result<()> {
    let flat = [r, a, b]
        .iter()
        .all(|t| t.ty == GGML_TYPE_F32 && flat_rows(t));
    if !flat
        || g.ty != GGML_TYPE_F32
        || !is_contiguous(g)
        || nelements(g) == 0
        || a.ne != b.ne
        || r.ne != a.ne
    {
        return refuse(
            r.op,
            format!(
                "cross_entropy_loss_back of {:?}, {:?}, {:?} into {:?}",
                g.ne, a.ne, b.ne, r.ne
            ),
        );
    }
    Ok(())
}

/// OPT_STEP_ADAMW (w, grad, m, v, params) / OPT_STEP_SGD (w, grad,
/// params): `ggml_compute_forward_opt_step_{adamw,sgd}_f32` (F32 w,
/// GGML_ABORT otherwise). GGML_ASSERT: grad (and m, v) of w's shape, nb00
/// = 4, 7 (2) parameters. Each row's byte offset is computed from w's
/// strides and used for grad, m and v too, which are read (m, v and w
/// written) as floats: all F32 with w's strides. The parameters are read
/// as a packed float array from their data pointer (`ggml_get_data_f32`):
/// contiguous F32. dst (ggml's view of w) is not touched.
pub(super) fn check_opt_step(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
    let op = r.op;
    let (n_moving, n_params) = if op == OP_OPT_STEP_ADAMW {
        (4, 7)
    } else {
        (2, 2)
    };
    let (Some(w), Some(params)) = (s[0], s[n_moving]) else {
        return refuse(op, "optimizer step sources missing");
    };
    let mut same_layout = true;
    for slot in &s[..n_moving] {
        same_layout &= slot.is_some_and(|t| t.ty == GGML_TYPE_F32 && t.ne == w.ne && t.nb == w.nb);
    }
    if !same_layout
        || w.nb[0] != 4
        || params.ty != GGML_TYPE_F32
        || !is_contiguous(params)
        || nelements(params) != n_params
    {
        return refuse(
            op,
            format!(
                "optimizer step of {:?} (parameters {:?}) needs F32 moments of its layout",
                w.ne, params.ne
            ),
        );
    }
    Ok(())
}

/// IM2COL_BACK (grad, kernel): `ggml_compute_forward_im2col_back_f32`.
/// GGML_ASSERT: grad and dst F32, kernel F32 or F16 (its shape only), nb0
/// = 4. op_params [s0, s1, p0, p1, d0, d1, is_2D]: `% s0` and `% s1`
/// (SIGFPE on 0). The gradient is read flat at
/// `((n * OH + oh) * OW + ow) * IC * KH * KW + (ic * KH + kh) * KW + kw`
/// with N, IC (and IH) from dst, KH, KW from the kernel, OH, OW from the
/// gradient: contiguous, of
/// im2col's shape [IC * KH * KW, OW, OH, N] (1D: [IC * KW, OW, N]). dst
/// channel `ic` of image `n` is written at `n * ofs0 + ic * ofs1` (`int
/// ofs0 = nb3 or nb2`, `ofs1 = nb2 or nb1`), its IH rows packed.
pub(super) fn check_im2col_back(r: &RpcTensor, g: &RpcTensor, k: &RpcTensor) -> Result<()> {
    let op = r.op;
    let p = &r.op_params;
    let is_2d = p[6] == 1;
    if g.ty != GGML_TYPE_F32
        || !is_contiguous(g)
        || !matches!(k.ty, GGML_TYPE_F32 | GGML_TYPE_F16)
        || r.ty != GGML_TYPE_F32
        || r.nb[0] != 4
        || p[0] < 1
        || (is_2d && p[1] < 1)
    {
        return refuse(
            op,
            format!("im2col_back types/layout/strides {:?}", &p[..2]),
        );
    }
    let ne = |t: &RpcTensor, d: usize| u64::from(t.ne[d]);
    let (want, ih, ofs0, ofs1) = if is_2d {
        let cols = ne(r, 2) * ne(k, 1) * ne(k, 0);
        (
            [cols, ne(g, 1), ne(g, 2), ne(r, 3)],
            ne(r, 1),
            r.nb[3],
            r.nb[2],
        )
    } else {
        let cols = ne(r, 1) * ne(k, 0);
        ([cols, ne(g, 1), ne(r, 2), 1], 1, r.nb[2], r.nb[1])
    };
    let packed_rows = ih <= 1 || u64::from(r.nb[1]) == 4 * ne(r, 0);
    let int_strides = i32::try_from(ofs0).is_ok() && i32::try_from(ofs1).is_ok();
    if (0..4).any(|d| ne(g, d) != want[d])
        || (!is_2d && r.ne[3] != 1)
        || !packed_rows
        || !int_strides
    {
        return refuse(
            op,
            format!(
                "im2col_back of {:?} with kernel {:?} into {:?}",
                g.ne, k.ne, r.ne
            ),
        );
    }
    Ok(())
}

/// POOL_2D_BACK (grad, forward input): `ggml_compute_forward_pool_2d_back`
/// (one thread). op_params [op, k0, k1, s0, s1, p0, p1] (GGML_ASSERT on a
/// pool type but MAX and AVG). It zeroes `ggml_nbytes(dst)` and walks dst
/// planes by `nb[2]` while below that end (as POOL_2D: a contiguous dst
/// of F32 or F16 with `nb[2]` its plane size, not empty), reading the
/// forward input with dst's type and strides (so: its type and layout)
/// and one plane of `grad ne0 * ne1` floats per dst plane, flat (a
/// contiguous F32 gradient with dst's planes). Window positions are
/// bounded by dst's rows and columns; the gradient is pool_2d's output of
/// dst's shape (the window rules of POOL_2D).
pub(super) fn check_pool_2d_back(r: &RpcTensor, g: &RpcTensor, f: &RpcTensor) -> Result<()> {
    let op = r.op;
    let p = &r.op_params;
    let plane = u64::from(r.ne[0]) * u64::from(r.ne[1]) * type_size(r.ty);
    if !matches!(p[0], POOL_MAX | POOL_AVG)
        || !matches!(r.ty, GGML_TYPE_F32 | GGML_TYPE_F16)
        || !is_contiguous(r)
        || nelements(r) == 0
        || u64::from(r.nb[2]) != plane
        || f.ty != r.ty
        || f.ne != r.ne
        || f.nb != r.nb
        || g.ty != GGML_TYPE_F32
        || !is_contiguous(g)
        || g.ne[2..] != r.ne[2..]
        || pool_output(r.ne[0], p[1], p[3], p[5]) != Some(i64::from(g.ne[0]))
        || pool_output(r.ne[1], p[2], p[4], p[6]) != Some(i64::from(g.ne[1]))
    {
        return refuse(
            op,
            format!("pool_2d_back {:?} of {:?} into {:?}", &p[..7], g.ne, r.ne),
        );
    }
    Ok(())
}

/// GET_ROWS_BACK (grad, rows): `ggml_compute_forward_get_rows_back_{f32,
/// f32_f16}` by grad's type (GGML_ABORT on others; one thread).
/// GGML_ASSERT: dst contiguous, `dst ne[0]` = grad's `ne[0]` (nc), grad
/// `nb[0]` its type's size. It zeroes `ggml_nbytes(dst)` and adds grad row
/// i, nc elements at `i * nb01`, for every i < `ggml_nelements(rows)`,
/// into dst row `rows[i]` as floats: dst F32, and grad must have that many
/// rows in dim 1 (test-backend-ops sends grads with more rows than indices;
/// ggml_get_rows_back itself checks no count). The indices (contiguous
/// I32, each below dst's `ne[1]`) are checked in `graph.rs`, on every run.
pub(super) fn check_get_rows_back(r: &RpcTensor, g: &RpcTensor, rows: &RpcTensor) -> Result<()> {
    if r.ty != GGML_TYPE_F32
        || !is_contiguous(r)
        || !matches!(g.ty, GGML_TYPE_F32 | GGML_TYPE_F16)
        || u64::from(g.nb[0]) != type_size(g.ty)
        || r.ne[0] != g.ne[0]
        || nelements(rows) > u64::from(g.ne[1])
    {
        return refuse(
            r.op,
            format!(
                "get_rows_back of {:?} by {:?} indices into {:?}",
                g.ne, rows.ne, r.ne
            ),
        );
    }
    Ok(())
}
