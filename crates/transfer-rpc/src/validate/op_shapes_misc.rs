//! Op rules for the inference ops of issue 11's last part that no earlier
//! module serves: the linear-attention solvers SOLVE_TRI and
//! GATED_DELTA_NET, DIAG, DIAG_MASK_ZERO, COL2IM_1D, the SAM window ops
//! WIN_PART, WIN_UNPART, GET_REL_POS, ADD_REL_POS, DeepSeek-V4's
//! hyper-connection ops DSV4_HC_COMB / _PRE / _POST and LIGHTNING_INDEXER.
//! As in
//! `op_shapes.rs`, each rule is what the op's ggml-cpu kernel (ops.cpp of
//! the vendored llama.cpp) asserts, aborts on, or needs to stay inside its
//! tensors; most of these kernels read or write some tensor flat from its
//! data pointer, which is why they ask for contiguous tensors of the
//! builder's (ggml.c) shape.

use super::cpu_types;
use super::op_shapes::{divides, is_contiguous, refuse, rows_contiguous, type_size};
use super::types::{GGML_TYPE_F16, GGML_TYPE_F32};
use crate::error::Result;
use crate::protocol::tensor::{MAX_SRC, RpcTensor};

const GGML_TYPE_BF16: u32 = 30;

/// `GGML_OP_*` of the ops checked here.
pub(super) const OP_DIAG: u32 = 43;
pub(super) const OP_DIAG_MASK_ZERO: u32 = 45;
pub(super) const OP_COL2IM_1D: u32 = 55;
pub(super) const OP_WIN_PART: u32 = 78;
pub(super) const OP_WIN_UNPART: u32 = 79;
pub(super) const OP_GET_REL_POS: u32 = 80;
pub(super) const OP_ADD_REL_POS: u32 = 81;
pub(super) const OP_SOLVE_TRI: u32 = 85;
pub(super) const OP_GATED_DELTA_NET: u32 = 86;
pub(super) const OP_LIGHTNING_INDEXER: u32 = 87;
pub(super) const OP_DSV4_HC_COMB: u32 = 88;
pub(super) const OP_DSV4_HC_PRE: u32 = 89;
pub(super) const OP_DSV4_HC_POST: u32 = 90;

/// Largest GATED_DELTA_NET head size (S_v) accepted. `ggml_graph_plan`
/// gives each thread `S_v + S_v * S_v` floats of work buffer when K > 1
/// (a private copy of one head's state), allocated with `new[]`, which
/// aborts the process when it fails; S_v comes from `v` alone, so an empty
/// `v` with a huge ne[0] would ask for exabytes. Real models use 64-256.
pub const MAX_DELTA_NET_HEAD: u32 = 1024;

/// Longest LIGHTNING_INDEXER key row accepted: the plan gives each thread
/// one row of `n_embd` floats to dequantize K into (1M floats: 4 MiB a
/// thread), sized from K's ne[0] alone.
pub const MAX_INDEXER_ROW: u32 = 1 << 20;

/// DeepSeek-V4's hyper-connection count, fixed in the kernels (`hc = 4`,
/// mixes of `(2 + hc) * hc` values per token).
const DSV4_HC: u32 = 4;

fn ne(t: &RpcTensor, d: usize) -> i64 {
    i64::from(t.ne[d])
}

/// Checks one node of an op of this module; `None` for other ops.
pub(super) fn check(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Option<Result<()>> {
    let op = r.op;
    let checked = match op {
        OP_SOLVE_TRI => match (s[0], s[1]) {
            (Some(a), Some(b)) => check_solve_tri(r, a, b),
            _ => refuse(op, "needs two sources"),
        },
        OP_GATED_DELTA_NET => check_gated_delta_net(r, s),
        OP_DIAG => match s[0] {
            Some(a) => check_diag(r, a),
            None => refuse(op, "missing source 0"),
        },
        // The same kernel as DIAG_MASK_INF (ggml_compute_forward_diag_mask_f32)
        // with 0 instead of -INFINITY.
        OP_DIAG_MASK_ZERO => match s[0] {
            Some(a) => super::op_shapes_ext::check_diag_mask_inf(r, a),
            None => refuse(op, "missing source 0"),
        },
        OP_WIN_PART | OP_WIN_UNPART | OP_GET_REL_POS => match s[0] {
            Some(a) if op == OP_WIN_PART => check_win_part(r, a),
            Some(a) if op == OP_WIN_UNPART => check_win_unpart(r, a),
            Some(a) => check_get_rel_pos(r, a),
            None => refuse(op, "missing source 0"),
        },
        OP_ADD_REL_POS => match (s[0], s[1], s[2]) {
            (Some(a), Some(pw), Some(ph)) => check_add_rel_pos(r, a, pw, ph),
            _ => refuse(op, "needs three sources"),
        },
        OP_DSV4_HC_COMB | OP_DSV4_HC_PRE | OP_DSV4_HC_POST => check_dsv4_hc(r, s),
        OP_COL2IM_1D => match s[0] {
            Some(a) => check_col2im_1d(r, a),
            None => refuse(op, "missing source 0"),
        },
        OP_LIGHTNING_INDEXER => check_lightning_indexer(r, s),
        _ => return super::op_shapes_train::check(r, s),
    };
    Some(checked)
}

/// SOLVE_TRI: `ggml_compute_forward_solve_tri_f32` (GGML_ABORT unless A
/// and B are F32). GGML_ASSERT: dst F32, ne00 = ne01, ne0 = ne10, ne1 =
/// ne11, batch dims equal. Within a batch it reads A as `A[i00 * n + t]`
/// and B, X as `[i00 * k + i01]` with `n = ne11`, `k = ne10`: packed
/// rows and matrices (ggml_solve_tri asserts A and B contiguous; X is
/// written the same way), and A's side equal to B's rows (n indexes A).
fn check_solve_tri(r: &RpcTensor, a: &RpcTensor, b: &RpcTensor) -> Result<()> {
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

/// GATED_DELTA_NET (q, k, v, g, beta, state):
/// `ggml_compute_forward_gated_delta_net_one_chunk` (F32 q, GGML_ABORT
/// otherwise; every source is read as floats). GGML_ASSERT: q, k, v rows
/// packed; g, beta, state contiguous; g ne[0] 1 or S_v; beta ne[0] 1; K
/// (op_params[0]) >= 1. For head h of sequence s and token t it reads
/// S_v floats of q row `h % neq1` at `s / (n_seqs / neq3)` (k alike: a
/// modulo and a division by neq1 / neq3), one g and beta value (or S_v
/// of g) at v's indices, and the head's S_v x S_v state flat at `s *
/// nb3 / 4 + h * S_v * S_v`; dst is written flat, the attention rows then
/// K states: the builder's shapes (q, k [S_v, >= 1, T, dividing n_seqs],
/// g, beta [1 or S_v, H, T, n_seqs], state [S_v, S_v, H, n_seqs], dst
/// contiguous [S_v * H, T * n_seqs + K * S_v * n_seqs]). S_v is bounded
/// by `MAX_DELTA_NET_HEAD` (work buffer).
fn check_gated_delta_net(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
    let op = r.op;
    let (Some(q), Some(k), Some(v), Some(g), Some(beta), Some(state)) =
        (s[0], s[1], s[2], s[3], s[4], s[5])
    else {
        return refuse(op, "gated_delta_net needs six sources");
    };
    let all_f32 = [q, k, v, g, beta, state, r]
        .iter()
        .all(|t| t.ty == GGML_TYPE_F32);
    if !all_f32
        || !rows_contiguous(q)
        || !rows_contiguous(k)
        || !rows_contiguous(v)
        || !is_contiguous(g)
        || !is_contiguous(beta)
        || !is_contiguous(state)
        || !is_contiguous(r)
    {
        return refuse(op, "gated_delta_net types/layout");
    }
    let (sv, h, t, n_seqs) = (v.ne[0], v.ne[1], v.ne[2], v.ne[3]);
    let qk_ok =
        |x: &RpcTensor| x.ne[0] == sv && x.ne[1] >= 1 && x.ne[2] == t && divides(x.ne[3], n_seqs);
    let k_slots = i128::from(r.op_params[0]);
    let rows = i128::from(t) * i128::from(n_seqs) + k_slots * i128::from(sv) * i128::from(n_seqs);
    if !qk_ok(q)
        || !qk_ok(k)
        || !(g.ne[0] == 1 || g.ne[0] == sv)
        || g.ne[1..] != v.ne[1..]
        || beta.ne[0] != 1
        || beta.ne[1..] != v.ne[1..]
        || state.ne != [sv, sv, h, n_seqs]
        || k_slots < 1
        || sv > MAX_DELTA_NET_HEAD
        || i128::from(r.ne[0]) != i128::from(sv) * i128::from(h)
        || i128::from(r.ne[1]) != rows
        || r.ne[2] != 1
        || r.ne[3] != 1
    {
        return refuse(
            op,
            format!(
                "gated_delta_net of q {:?}, k {:?}, v {:?}, K {k_slots} into {:?}",
                q.ne, k.ne, v.ne, r.ne
            ),
        );
    }
    Ok(())
}

/// DIAG: `ggml_compute_forward_diag_f32` (F32 source, GGML_ABORT
/// otherwise; dst written as floats). GGML_ASSERT: ne00 = ne0 = ne1, ne01
/// = 1, ne02 = ne2, ne03 = ne3, nb00 = nb0 = 4; element i1 of the source
/// row is read for every dst row i1.
fn check_diag(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    if a.ty != GGML_TYPE_F32
        || r.ty != GGML_TYPE_F32
        || a.nb[0] != 4
        || r.nb[0] != 4
        || a.ne[0] != r.ne[0]
        || a.ne[0] != r.ne[1]
        || a.ne[1] != 1
        || a.ne[2..] != r.ne[2..]
    {
        return refuse(r.op, format!("diag of {:?} into {:?}", a.ne, r.ne));
    }
    Ok(())
}

/// COL2IM_1D: `ggml_compute_forward_col2im_1d_impl` by the source's type
/// (F32, F16, BF16; GGML_ABORT otherwise), dst read and written as that
/// type. GGML_ASSERT: both contiguous. op_params [s0, OC, p0]: `K_OC /
/// OC` and `/ s0` (SIGFPE on 0). It reads columns flat at `oc * K + k +
/// t_in * K_OC` (k < K, t_in < T_in) and writes dst flat at `t_out + oc *
/// T_out` for oc < OC, t_out < dst ne0: ggml_col2im_1d's shapes (a matrix
/// [K * OC, T_in], K >= 1, s0 >= 1, p0 >= 0, dst [(T_in - 1) * s0 + K - 2 *
/// p0, OC] of its type).
fn check_col2im_1d(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    let p = &r.op_params;
    let (s0, oc, p0) = (i64::from(p[0]), i64::from(p[1]), i64::from(p[2]));
    let k = if oc >= 1 { ne(a, 0) / oc } else { 0 };
    let t_out = (ne(a, 1) - 1) * s0 + k - 2 * p0;
    if !matches!(a.ty, GGML_TYPE_F32 | GGML_TYPE_F16 | GGML_TYPE_BF16)
        || r.ty != a.ty
        || !is_contiguous(a)
        || !is_contiguous(r)
        || a.ne[2] != 1
        || a.ne[3] != 1
        || s0 < 1
        || oc < 1
        || p0 < 0
        || k < 1
        || k * oc != ne(a, 0)
        || t_out < 1
        || [ne(r, 0), ne(r, 1), ne(r, 2), ne(r, 3)] != [t_out, oc, 1, 1]
    {
        return refuse(
            r.op,
            format!("col2im_1d {:?} of {:?} into {:?}", &p[..3], a.ne, r.ne),
        );
    }
    Ok(())
}

/// WIN_PART: `ggml_compute_forward_win_part_f32` (F32 source, GGML_ABORT
/// otherwise). op_params [npx, npy, w]. Window `py * npx + px`, element
/// (i0, i1, i2) is written flat at dst's
/// `(((py * npx + px) * w + i2) * w + i1) * C + i0` from the source's flat
/// `(py * w + i2) * W * C + (px * w + i1) * C + i0` (or 0 past its edge; a
/// negative w reads before it). Hence contiguous F32 tensors of
/// ggml_win_part's shapes: source [C, W, H, 1], w >= 1, npx = ceil(W / w),
/// npy = ceil(H / w), dst [C, w, w, npx * npy].
fn check_win_part(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    let p = &r.op_params;
    let (npx, npy, w) = (i64::from(p[0]), i64::from(p[1]), i64::from(p[2]));
    let windows = |n: i64| if w >= 1 { (n + w - 1) / w } else { -1 };
    if a.ty != GGML_TYPE_F32
        || r.ty != GGML_TYPE_F32
        || !is_contiguous(a)
        || !is_contiguous(r)
        || a.ne[3] != 1
        || w < 1
        || npx != windows(ne(a, 1))
        || npy != windows(ne(a, 2))
        || [ne(r, 0), ne(r, 1), ne(r, 2), ne(r, 3)] != [ne(a, 0), w, w, npx * npy]
    {
        return refuse(
            r.op,
            format!("win_part {:?} of {:?} into {:?}", &p[..3], a.ne, r.ne),
        );
    }
    Ok(())
}

/// WIN_UNPART: `ggml_compute_forward_win_unpart_f32` (F32 source,
/// GGML_ABORT otherwise). op_params[0] = w, the divisor of `ne1 % w`
/// (SIGFPE on 0). dst element (i0, i1, i2) is written flat (plane 0 only)
/// from the source's flat `((i2 / w) * npx + i1 / w) * w * w * C + (i2 %
/// w) * w * C + (i1 % w) * C + i0`, npx = ceil(ne1 / w): contiguous F32
/// tensors, source windows [C, w, w, >= npx * npy] (npy = ceil(ne2 / w)),
/// dst [C, W, H, 1] (ggml_win_unpart).
fn check_win_unpart(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    let w = i64::from(r.op_params[0]);
    let windows = |n: i64| if w >= 1 { (n + w - 1) / w } else { 0 };
    if a.ty != GGML_TYPE_F32
        || r.ty != GGML_TYPE_F32
        || !is_contiguous(a)
        || !is_contiguous(r)
        || w < 1
        || ne(a, 1) != w
        || ne(a, 2) != w
        || ne(a, 3) < windows(ne(r, 1)) * windows(ne(r, 2))
        || r.ne[0] != a.ne[0]
        || r.ne[3] != 1
    {
        return refuse(
            r.op,
            format!("win_unpart w {w} of {:?} into {:?}", a.ne, r.ne),
        );
    }
    Ok(())
}

/// GET_REL_POS: `ggml_compute_forward_get_rel_pos_f16` (F16 or BF16
/// source, GGML_ABORT otherwise; 2-byte elements copied as they are).
/// dst element (i0, i1, i2) is written flat from the source's flat
/// `(ne1 - 1 - i1 + i2) * ne00 + i0`: contiguous tensors of
/// ggml_get_rel_pos' shapes (dst F16 [C, k, k, 1], source rows 2k - 1 of
/// C).
fn check_get_rel_pos(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    if !matches!(a.ty, GGML_TYPE_F16 | GGML_TYPE_BF16)
        || r.ty != GGML_TYPE_F16
        || !is_contiguous(a)
        || !is_contiguous(r)
        || r.ne[0] != a.ne[0]
        || r.ne[1] != r.ne[2]
        || r.ne[3] != 1
        || ne(a, 1) != 2 * ne(r, 1) - 1
    {
        return refuse(r.op, format!("get_rel_pos of {:?} into {:?}", a.ne, r.ne));
    }
    Ok(())
}

/// ADD_REL_POS (a, pw, ph): `ggml_compute_forward_add_rel_pos_f32` (F32
/// a, GGML_ABORT otherwise). Unless op_params[0] (inplace) is set, thread
/// 0 copies `ggml_nbytes(dst)` from a; then for every element `jp` of pw
/// and ph (read flat as floats) it adds into dst flat at `jp * ne10 + j`
/// and `jp * ne10 - (ne10 - 1) * i10 + j * ne10`, j < ne10. ggml_add_rel_pos'
/// asserts bound these by a's size: a, pw, ph contiguous F32, pw and ph
/// the same shape, pw ne[3] = a ne[2], pw ne[0]^2 = a ne[0], pw ne[1] * pw
/// ne[2] = a ne[1]; dst contiguous F32 of a's shape.
fn check_add_rel_pos(r: &RpcTensor, a: &RpcTensor, pw: &RpcTensor, ph: &RpcTensor) -> Result<()> {
    let all_f32 = [r, a, pw, ph].iter().all(|t| t.ty == GGML_TYPE_F32);
    let contiguous = [r, a, pw, ph].iter().all(|t| is_contiguous(t));
    if !all_f32
        || !contiguous
        || pw.ne != ph.ne
        || pw.ne[3] != a.ne[2]
        || ne(pw, 0) * ne(pw, 0) != ne(a, 0)
        || ne(pw, 1) * ne(pw, 2) != ne(a, 1)
        || r.ne != a.ne
    {
        return refuse(
            r.op,
            format!(
                "add_rel_pos of {:?} with {:?} / {:?} into {:?}",
                a.ne, pw.ne, ph.ne, r.ne
            ),
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
fn check_dsv4_hc(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
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

/// LIGHTNING_INDEXER (q, k, weights, mask): `ggml_compute_forward_
/// lightning_indexer`. GGML_ASSERT: dst, q, weights F32, mask F16, every
/// nb[0] the element size, K F32 or a type with a `to_float` (else a
/// null call). For stream s, token t and key ik it converts K row `ik *
/// nbk2 + s * nbk3` (n_embd = q ne[0] elements) into the work buffer,
/// dots it with each head's q row (n_head = q ne[1]), weights the heads
/// with `weights[h]` of row t, adds `mask[ik]` of row t (stream `s %
/// mask ne[3]`: SIGFPE on 0) and writes dst[ik] of row t: ggml_lightning_
/// indexer's shapes (k [n_embd, 1, n_kv, S], weights [n_head, T, 1, S],
/// mask [n_kv, T, 1, dividing S], dst [n_kv, T, 1, S]). K rows are
/// bounded by `MAX_INDEXER_ROW` (work buffer).
fn check_lightning_indexer(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
    let op = r.op;
    let (Some(q), Some(k), Some(w), Some(m)) = (s[0], s[1], s[2], s[3]) else {
        return refuse(op, "lightning_indexer needs four sources");
    };
    let k_type_ok = matches!(k.ty, GGML_TYPE_F32 | GGML_TYPE_F16 | GGML_TYPE_BF16)
        || cpu_types::quantized_with_to_float(k.ty);
    let packed = [r, q, k, w, m]
        .iter()
        .all(|t| u64::from(t.nb[0]) == type_size(t.ty));
    if r.ty != GGML_TYPE_F32
        || q.ty != GGML_TYPE_F32
        || w.ty != GGML_TYPE_F32
        || m.ty != GGML_TYPE_F16
        || !k_type_ok
        || !packed
    {
        return refuse(op, "lightning_indexer types/layout");
    }
    let (n_embd, n_head, t, n_stream, n_kv) = (q.ne[0], q.ne[1], q.ne[2], q.ne[3], k.ne[2]);
    if k.ne[0] != n_embd
        || k.ne[1] != 1
        || k.ne[3] != n_stream
        || w.ne != [n_head, t, 1, n_stream]
        || m.ne[0] != n_kv
        || m.ne[1] != t
        || m.ne[2] != 1
        || !divides(m.ne[3], n_stream)
        || r.ne != [n_kv, t, 1, n_stream]
        || n_embd > MAX_INDEXER_ROW
    {
        return refuse(
            op,
            format!(
                "lightning_indexer of q {:?}, k {:?}, weights {:?}, mask {:?} into {:?}",
                q.ne, k.ne, w.ne, m.ne, r.ne
            ),
        );
    }
    Ok(())
}
