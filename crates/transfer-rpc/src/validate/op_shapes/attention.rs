//! Attention: SOFT_MAX, DIAG_MASK_INF, DIAG_MASK_ZERO, FLASH_ATTN_EXT,
//! LIGHTNING_INDEXER, and SAM's windowed attention ops WIN_PART,
//! WIN_UNPART, GET_REL_POS, ADD_REL_POS.

use super::common::*;

/// SOFT_MAX: `ggml_compute_forward_soft_max` (ops.cpp).
pub(super) fn check_soft_max(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
    let op = r.op;
    let src = |i: usize| source(s, op, i);
    let a = src(0)?;
    // ggml_compute_forward_soft_max (ops.cpp): F32 only
    // (GGML_ABORT otherwise); reads and writes ne00 packed floats
    // per row; the mask row i01 of ne00 F16/F32 values, broadcast
    // over dims 2 and 3 by `%`. scale and max_bias (op_params 0,
    // 1) are plain floats.
    if a.ty != GGML_TYPE_F32
        || r.ty != GGML_TYPE_F32
        || r.ne != a.ne
        || !is_contiguous(a)
        || !is_contiguous(r)
    {
        return refuse(op, "soft_max shapes/types");
    }
    if let Some(m) = s[1] {
        if !matches!(m.ty, GGML_TYPE_F16 | GGML_TYPE_F32)
            || !is_contiguous(m)
            || m.ne[0] != a.ne[0]
            || m.ne[1] < a.ne[1]
            || !divides(m.ne[2], a.ne[2])
            || !divides(m.ne[3], a.ne[3])
        {
            return refuse(op, "soft_max mask");
        }
    }
    if let Some(k) = s[2] {
        // sinks: `sk[i02]` read as packed floats for every head
        // i02 < ne02 (ggml_soft_max_add_sinks: F32, ne[0] == ne02).
        if k.ty != GGML_TYPE_F32 || k.ne[0] != a.ne[2] || !rows_contiguous(k) {
            return refuse(op, "soft_max sinks must be F32 with one per head");
        }
    }
    Ok(())
}

/// FLASH_ATTN_EXT: `ggml_compute_forward_flash_attn_ext` and its one-chunk,
/// tiled and split-KV paths (ops.cpp).
pub(super) fn check_flash_attn_ext(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
    let op = r.op;
    let (Some(q), Some(k), Some(v)) = (s[0], s[1], s[2]) else {
        return refuse(op, "flash_attn_ext needs three sources");
    };
    // GGML_ASSERT(ne0 == DV), (ne2 == N), (nbq0 / nbk0 / nbv0 == type
    // size), (neq0 == DK == nek0); K rows ic < nek1 of V (nev1 == nek1);
    // broadcast rk2 = neq2 / nek2, rv2 = neq2 / nev2, rk3 / rv3 with equal
    // dim 3; Q is read as F32. K: GGML_ASSERT(from_float of its vec_dot
    // type) and an unchecked call of its vec_dot (Q is converted into
    // DK floats of work buffer, room for any vec_dot row). V:
    // GGML_ASSERT(F32 or a to_float). Both sets are the MUL_MAT src0
    // types. The tiled and split-KV paths only run for F32 / F16 K == V.
    if k.ne[0] != q.ne[0]
        || v.ne[1] != k.ne[1]
        || !divides(k.ne[2], q.ne[2])
        || !divides(v.ne[2], q.ne[2])
        || q.ne[3] != k.ne[3]
        || q.ne[3] != v.ne[3]
        || q.ty != GGML_TYPE_F32
        || !cpu_mul_mat_src0(k.ty)
        || !cpu_mul_mat_src0(v.ty)
        || r.ty != GGML_TYPE_F32
        || r.ne != [v.ne[0], q.ne[2], q.ne[1], q.ne[3]]
        || !is_contiguous(r)
        || !rows_contiguous(q)
        || !rows_contiguous(k)
        || !rows_contiguous(v)
    {
        return refuse(op, "flash_attn_ext shapes/types");
    }
    // "dst cannot be transposed or permuted": GGML_ASSERT(nb0 ==
    // sizeof(float)), (nb0 <= nb1), (nb1 <= nb2), (nb2 <= nb3), size-1
    // dims included. Every path then stores a result row with
    // `memcpy(dst + (i3*ne2*ne1 + i2 + i1*ne1)*nb1, VKQ32, nb1)`: nb1
    // bytes per row, rows counted flat; nb1 must be the row size.
    if r.nb[0] != 4 || !strides_ordered(r) || u64::from(r.nb[1]) != row_bytes(r) {
        return refuse(
            op,
            "flash_attn_ext result must be packed, nb0 = 4 <= nb1 = row <= nb2 <= nb3",
        );
    }
    // switch (dst->op_params[3]): GGML_PREC_DEFAULT or GGML_PREC_F32, else
    // GGML_ABORT. op_params 0..=2 (scale, max_bias, softcap) are floats.
    let prec = r.op_params[3];
    if !matches!(prec, PREC_DEFAULT | PREC_F32) {
        return refuse(op, format!("flash_attn_ext precision {prec}"));
    }
    // The chunk loops take q rows as `int` (ir0, ir1 narrowed from
    // int64): past i32::MAX rows they would index from negative rows
    // (refused for every op by fits_int).
    if k.ne[0] > MAX_FLASH_ATTN_HEAD || v.ne[0] > MAX_FLASH_ATTN_HEAD {
        return refuse(
            op,
            format!(
                "flash_attn_ext head sizes {} / {} exceed {MAX_FLASH_ATTN_HEAD}",
                k.ne[0], v.ne[0]
            ),
        );
    }
    if let Some(m) = s[3] {
        // The mask is read as F16 (GGML_CPU_FP16_TO_FP32(mp[ic])) at row
        // iq1 < neq1, ic < nek1, broadcast over dims 2 and 3 by `%`.
        if m.ty != GGML_TYPE_F16
            || !is_contiguous(m)
            || m.ne[0] != k.ne[1]
            || m.ne[1] < q.ne[1]
            || !divides(m.ne[2], q.ne[2])
            || !divides(m.ne[3], q.ne[3])
        {
            return refuse(op, "flash_attn_ext mask");
        }
    }
    if let Some(k) = s[4] {
        // sinks: `((float *) sinks->data)[h]` for every head h < neq2
        // (ggml_flash_attn_ext_add_sinks: F32, ne[0] == neq2).
        if k.ty != GGML_TYPE_F32 || k.ne[0] != q.ne[2] || !rows_contiguous(k) {
            return refuse(op, "flash_attn_ext sinks must be F32 with one per head");
        }
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

/// WIN_PART: `ggml_compute_forward_win_part_f32` (F32 source, GGML_ABORT
/// otherwise). op_params [npx, npy, w]. Window `py * npx + px`, element
/// (i0, i1, i2) is written flat at dst's
/// `(((py * npx + px) * w + i2) * w + i1) * C + i0` from the source's flat
/// `(py * w + i2) * W * C + (px * w + i1) * C + i0` (or 0 past its edge; a
/// negative w reads before it). Hence contiguous F32 tensors of
/// ggml_win_part's shapes: source [C, W, H, 1], w >= 1, npx = ceil(W / w),
/// npy = ceil(H / w), dst [C, w, w, npx * npy].
pub(super) fn check_win_part(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
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
pub(super) fn check_win_unpart(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
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
pub(super) fn check_get_rel_pos(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
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
pub(super) fn check_add_rel_pos(
    r: &RpcTensor,
    a: &RpcTensor,
    pw: &RpcTensor,
    ph: &RpcTensor,
) -> Result<()> {
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
pub(super) fn check_lightning_indexer(
    r: &RpcTensor,
    s: &[Option<&RpcTensor>; MAX_SRC],
) -> Result<()> {
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
