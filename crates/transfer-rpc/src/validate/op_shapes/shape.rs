//! Ops that rearrange data into a new shape: REPEAT, CONCAT, PAD,
//! PAD_REFLECT_1D, ROLL, DIAG, TRI.

use super::common::*;

/// REPEAT: `_repeat_f16` (F16, BF16, I16) and `_repeat_f32` (F32, I32),
/// GGML_ABORT on other types.
pub(super) fn check_repeat(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    // GGML_ASSERT(ggml_can_repeat(src0, dst)) (a non-empty src0 whose
    // dims divide dst's), GGML_ASSERT(nb0 == nb00 == element size); dst
    // has src0's type (ggml_repeat); rows of ne00 packed elements.
    let type_ok = matches!(
        a.ty,
        GGML_TYPE_F16 | GGML_TYPE_BF16 | GGML_TYPE_I16 | GGML_TYPE_F32 | GGML_TYPE_I32
    );
    if !type_ok || r.ty != a.ty || !can_repeat(a, r) || !rows_contiguous(a) || !rows_contiguous(r) {
        return refuse(r.op, "repeat shapes/types");
    }
    Ok(())
}

/// CONCAT: `_concat_{f32,f16,i8}` element by element (F32 / I32, F16 /
/// BF16 / I16, I8), `_concat_any` by rows for every other type.
pub(super) fn check_concat(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
    let op = r.op;
    let (Some(a), Some(b)) = (s[0], s[1]) else {
        return refuse(op, "concat needs two sources");
    };
    // GGML_ASSERT(dim >= 0 && dim < 4); ggml_concat: same types, equal dims
    // but `dim`, which adds up. Each kernel reads src1 at (i - o) for dst
    // positions past src0's extent: the shapes must be exactly these.
    let dim = r.op_params[0];
    let Ok(d) = usize::try_from(dim) else {
        return refuse(op, format!("concat dim {dim}"));
    };
    if d >= 4 {
        return refuse(op, format!("concat dim {dim}"));
    }
    let shape_ok = (0..4).all(|i| {
        if i == d {
            u64::from(r.ne[i]) == u64::from(a.ne[i]) + u64::from(b.ne[i])
        } else {
            r.ne[i] == a.ne[i] && r.ne[i] == b.ne[i]
        }
    });
    if a.ty != b.ty || r.ty != a.ty || !shape_ok {
        return refuse(op, "concat shapes/types");
    }
    let element_wise = matches!(
        a.ty,
        GGML_TYPE_F32
            | GGML_TYPE_I32
            | GGML_TYPE_F16
            | GGML_TYPE_BF16
            | GGML_TYPE_I16
            | GGML_TYPE_I8
    );
    // concat_any: GGML_ASSERT(ggml_is_contiguous_rows(src0), (src1)); it
    // memcpys packed source rows into dst rows, which must be packed too.
    let rows_packed = rows_contiguous(a) && rows_contiguous(b) && rows_contiguous(r);
    if !(element_wise || rows_packed) {
        return refuse(op, "concat of this type needs packed rows");
    }
    Ok(())
}

/// PAD: `_pad_f32<circular>`: dst written by its flat element index (it
/// must be contiguous), src0 read at `i - lp` per dim (plain) or at `(i -
/// lp + ne0x) % ne0x` (circular, op_params[8]).
pub(super) fn check_pad(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    let op = r.op;
    if a.ty != GGML_TYPE_F32 || r.ty != GGML_TYPE_F32 || !is_contiguous(r) || r.nb[0] != 4 {
        return refuse(op, "pad shapes/types");
    }
    let circular = r.op_params[8] != 0;
    for d in 0..4 {
        let (lp, rp) = (r.op_params[2 * d], r.op_params[2 * d + 1]);
        // ggml_pad_ext: ne = a->ne + lp + rp. Then the plain kernel reads
        // src0 at i - lp for lp <= i < ne - rp, i.e. below a->ne (negative
        // pads crop); a wider dst would read past src0.
        let expected = i64::from(a.ne[d]) + i64::from(lp) + i64::from(rp);
        if i64::from(r.ne[d]) != expected {
            return refuse(op, format!("pad dim {d}: {lp} + {} + {rp}", a.ne[d]));
        }
        // Circular: `(i - lp + ne0x) % ne0x` divides by zero for an empty
        // source and is negative (a read before src0) when lp > ne0x.
        if circular && (a.ne[d] == 0 || i64::from(lp) > i64::from(a.ne[d])) {
            return refuse(op, format!("circular pad dim {d}: {lp} of {}", a.ne[d]));
        }
    }
    Ok(())
}

/// PAD_REFLECT_1D: `ggml_compute_forward_pad_reflect_1d`.
pub(super) fn check_pad_reflect_1d(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    let op = r.op;
    // GGML_ASSERT(src0, dst F32). ggml_pad_reflect_1d: 0 <= p0, p1 <
    // a->ne[0], a contiguous, result [ne00 + p0 + p1, ne01, ne02, ne03].
    // The kernel copies ne00 packed floats of each source row to dst
    // column p0, then mirrors p0 values left of it (left[-i] = left[i])
    // and p1 right of column ne0 - p1 - 1: all inside the dst row only
    // for these shapes.
    let (p0, p1) = (r.op_params[0], r.op_params[1]);
    let in_row = |p: i32| p >= 0 && i64::from(p) < i64::from(a.ne[0]);
    if a.ty != GGML_TYPE_F32 || r.ty != GGML_TYPE_F32 || !in_row(p0) || !in_row(p1) {
        return refuse(op, format!("pad_reflect_1d pads {p0}, {p1} of {}", a.ne[0]));
    }
    let ne0 = u64::from(a.ne[0]) + p0 as u64 + p1 as u64;
    if u64::from(r.ne[0]) != ne0 || r.ne[1..] != a.ne[1..] || r.nb[0] != 4 || a.nb[0] != 4 {
        return refuse(op, "pad_reflect_1d shapes");
    }
    Ok(())
}

/// ROLL: `_roll_f32` (F32 only, GGML_ABORT otherwise).
pub(super) fn check_roll(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    let op = r.op;
    // ggml_roll: same shape and type (ggml_dup_tensor), a->nb[0] == type
    // size, |shift_d| < ne[d]. The kernel wraps `i - shift` once
    // (ggml_wrap_index), so a larger shift reads outside the source; it
    // copies two runs of packed floats into each dst row.
    if a.ty != GGML_TYPE_F32
        || r.ty != GGML_TYPE_F32
        || r.ne != a.ne
        || a.nb[0] != 4
        || r.nb[0] != 4
    {
        return refuse(op, "roll shapes/types");
    }
    for d in 0..4 {
        let shift = i64::from(r.op_params[d]);
        if shift.abs() >= i64::from(a.ne[d]) {
            return refuse(op, format!("roll shift {shift} of dim {d} of {}", a.ne[d]));
        }
    }
    Ok(())
}

/// TRI: `_tri_f32` (F32 only, GGML_ABORT otherwise).
pub(super) fn check_tri(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    let op = r.op;
    // GGML_ASSERT(ggml_is_contiguous(src0)); rows of src0 read, dst rows
    // (same shape: ggml_dup_tensor) written as ne0 packed floats.
    if a.ty != GGML_TYPE_F32
        || r.ty != GGML_TYPE_F32
        || r.ne != a.ne
        || !is_contiguous(a)
        || a.nb[0] != 4
        || r.nb[0] != 4
    {
        return refuse(op, "tri shapes/types");
    }
    // GGML_ABORT("invalid tri type") past GGML_TRI_TYPE_LOWER (3).
    if !(0..4).contains(&r.op_params[0]) {
        return refuse(op, format!("tri type {}", r.op_params[0]));
    }
    Ok(())
}

/// DIAG: `ggml_compute_forward_diag_f32` (F32 source, GGML_ABORT
/// otherwise; dst written as floats). GGML_ASSERT: ne00 = ne0 = ne1, ne01
/// = 1, ne02 = ne2, ne03 = ne3, nb00 = nb0 = 4; element i1 of the source
/// row is read for every dst row i1.
pub(super) fn check_diag(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
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
