//! Recurrent and linear-attention state ops: SSM_CONV, SSM_SCAN (its
//! sequence ids are range-checked at run time, `graph.rs`), RWKV_WKV6,
//! GATED_LINEAR_ATTN, RWKV_WKV7, GATED_DELTA_NET.

use super::common::*;

/// Packed rows: `nb[0]` the F32 element, `nb[1]` one row of `ne[0]`.
pub(super) fn f32_rows_packed(t: &RpcTensor) -> bool {
    t.ty == GGML_TYPE_F32 && t.nb[0] == 4 && u64::from(t.nb[1]) == 4 * u64::from(t.ne[0])
}

pub(super) const INT_MAX: u64 = i32::MAX as u64;

/// SSM_CONV: `_ssm_conv_f32` (F32 src0 only, GGML_ABORT otherwise).
pub(super) fn check_ssm_conv(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
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
pub(super) fn check_ssm_scan(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
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
pub(super) fn check_gated_delta_net(
    r: &RpcTensor,
    s: &[Option<&RpcTensor>; MAX_SRC],
) -> Result<()> {
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

/// RWKV_WKV6 (k, v, r, tf, td, state), GATED_LINEAR_ATTN (k, v, q, g,
/// state), RWKV_WKV7 (r, w, k, v, a, b, state):
/// `ggml_compute_forward_{rwkv_wkv6,gla,rwkv_wkv7}_f32` (F32 only,
/// GGML_ABORT otherwise). Every source is read flat from its data
/// pointer: token t, head h, element i at `t * C + h * S + i`, states at
/// `S * C * seq + h * S * S + i * S + j`, WKV6's tf at `h * S + i`; dst is
/// written flat, `T` rows of `C = ne0` outputs then the new states. The
/// kernels take `HEADS` and `T` from src1, `n_seqs` from the state's ne[1]
/// and divide by both (`C / HEADS`, `t % (T / n_seqs)`: SIGFPE on 0).
/// Hence the builders' shapes (per-token sources [S, H, T], tf [S, H],
/// state S * S * H * n_seqs elements, dst [S * H, T + S * n_seqs]), all
/// contiguous F32, S, H, n_seqs >= 1, n_seqs dividing T. WKV7's SIMD path
/// walks each head in GGML_F32_STEP chunks (up to 64 floats) with no
/// remainder loop: S a multiple of 64.
pub(super) fn check_linear_attn(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
    let op = r.op;
    let (n_src, k_slot, tf_slot) = match op {
        OP_RWKV_WKV6 => (6, 0, Some(3)),
        OP_GATED_LINEAR_ATTN => (5, 0, None),
        _ => (7, 2, None),
    };
    let mut srcs = Vec::with_capacity(n_src);
    for slot in s.iter().take(n_src) {
        match slot {
            Some(t) if t.ty == GGML_TYPE_F32 && is_contiguous(t) => srcs.push(*t),
            _ => return refuse(op, "linear attention sources must be contiguous F32"),
        }
    }
    let k = srcs[k_slot];
    let state = srcs[n_src - 1];
    let (sz, h, t, n_seqs) = (ne(k, 0), ne(k, 1), ne(k, 2), ne(state, 1));
    let per_token_ok = srcs[..n_src - 1]
        .iter()
        .enumerate()
        .all(|(i, x)| match tf_slot {
            Some(tf) if tf == i => x.ne[..2] == k.ne[..2],
            _ => x.ne[..3] == k.ne[..3] && x.ne[3] == 1,
        });
    let state_ok = u128::from(nelements(state))
        == (sz as u128) * (sz as u128) * (h as u128) * (n_seqs as u128);
    let simd_ok = op != OP_RWKV_WKV7 || sz % 64 == 0;
    if sz < 1
        || h < 1
        || n_seqs < 1
        || t % n_seqs != 0
        || !per_token_ok
        || !state_ok
        || !simd_ok
        || r.ty != GGML_TYPE_F32
        || !is_contiguous(r)
        || [ne(r, 0), ne(r, 1), ne(r, 2), ne(r, 3)] != [sz * h, t + sz * n_seqs, 1, 1]
    {
        return refuse(
            op,
            format!(
                "linear attention of k {:?}, state {:?} into {:?}",
                k.ne, state.ne, r.ne
            ),
        );
    }
    Ok(())
}
