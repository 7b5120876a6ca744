//! Pooling and resampling: POOL_1D, POOL_2D, UPSCALE (all modes and flags).
//! POOL_2D_BACK is a training op (`train.rs`) that shares `pool_output`.

use super::common::*;

/// `ggml_calc_pool_output_size` with the window rules both pool kernels
/// need: `k >= 1`, `s >= 1`, `0 <= p <= ins` (the kernels compute
/// `ow * s - p` in int and loop `k` times per output: with `k <= ins + 2 * p`,
/// ggml's `ne > 0`, both stay within a few times the row); `None` when a
/// rule fails.
pub(super) fn pool_output(ins: u32, k: i32, s: i32, p: i32) -> Option<i64> {
    let ins = i64::from(ins);
    let (k, s, p) = (i64::from(k), i64::from(s), i64::from(p));
    if k < 1 || s < 1 || p < 0 || p > ins || k > ins + 2 * p || ins > i64::from(i32::MAX) / 4 {
        return None;
    }
    Some((ins + 2 * p - k) / s + 1)
}

/// POOL_1D: `ggml_compute_forward_pool_1d_ksp` (one thread): op_params
/// [op, k0, s0, p0], POOL_COUNT GGML_ABORTs (and other values leave the
/// accumulator unset); F32 or F16 rows read packed at `ir * nb1` for
/// `ggml_nrows(src)` rows, dst rows written as floats at `ir * nb1`: both
/// walk flat. ggml_pool_1d: dst F32 [out(ne0), ne1, ne2, ne3].
pub(super) fn check_pool_1d(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    let op = r.op;
    let p = &r.op_params;
    if !matches!(p[0], POOL_MAX | POOL_AVG)
        || !matches!(a.ty, GGML_TYPE_F32 | GGML_TYPE_F16)
        || r.ty != GGML_TYPE_F32
        || !flat_walk(a)
        || !flat_walk(r)
        || r.ne[1..] != a.ne[1..]
        || pool_output(a.ne[0], p[1], p[2], p[3]) != Some(ne(r, 0))
    {
        return refuse(
            op,
            format!("pool_1d {:?} of {:?} into {:?}", &p[..4], a.ne, r.ne),
        );
    }
    Ok(())
}

/// POOL_2D: `ggml_compute_forward_pool_2d` (one thread): op_params [op,
/// k0, k1, s0, s1, p0, p1]; it walks planes from `src->data` by `nb[2]`
/// while below `src->data + ggml_nbytes(src)` (`nb[2]` 0 never ends, a
/// small one reads and writes extra planes), rows at `nb[1]`, packed F32
/// or F16 elements; dst planes are written packed, `ne0 * ne1` floats
/// each, from dst's start. Hence a contiguous source with `nb[2]` its
/// plane size and no empty dimension, a contiguous F32 dst of
/// ggml_pool_2d's shape, the window rules of `pool_output` and `int ka =
/// k0 * k1`.
pub(super) fn check_pool_2d(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    let op = r.op;
    let p = &r.op_params;
    let plane = u64::from(a.ne[0]) * u64::from(a.ne[1]) * type_size(a.ty);
    if !matches!(p[0], POOL_MAX | POOL_AVG)
        || !matches!(a.ty, GGML_TYPE_F32 | GGML_TYPE_F16)
        || r.ty != GGML_TYPE_F32
        || !is_contiguous(a)
        || !is_contiguous(r)
        || nelements(a) == 0
        || u64::from(a.nb[2]) != plane
        || r.ne[2..] != a.ne[2..]
        || pool_output(a.ne[0], p[1], p[3], p[5]) != Some(ne(r, 0))
        || pool_output(a.ne[1], p[2], p[4], p[6]) != Some(ne(r, 1))
        || p[1].checked_mul(p[2]).is_none()
    {
        return refuse(
            op,
            format!("pool_2d {:?} of {:?} into {:?}", &p[..7], a.ne, r.ne),
        );
    }
    Ok(())
}

/// UPSCALE: `ggml_compute_forward_upscale_f32` (F32 source only,
/// GGML_ABORT otherwise; dst written as floats). op_params[0] = mode |
/// flags: NEAREST, BILINEAR, BICUBIC (GGML_ABORT on another mode),
/// ALIGN_CORNERS, ANTIALIAS with BILINEAR only (ggml_interpolate's
/// asserts; no other bits). Bilinear and bicubic clamp their x / y
/// indices into the source (an empty source would read its element 0);
/// every mode picks dims 2 and 3, and NEAREST dims 0 and 1 too, as
/// `(int64) (i / sf)` with the f32 scale `sf = ne / ne_src` (`(ne - 1) /
/// (ne_src - 1)` for dims 0, 1 under ALIGN_CORNERS): rounding must keep
/// the last such index inside the source, checked here with the kernel's
/// f32 arithmetic.
pub(super) fn check_upscale(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
    let op = r.op;
    let flags = r.op_params[0];
    let mode = flags & 0xFF;
    let known = flags & !0xFF & !(SCALE_FLAG_ALIGN_CORNERS | SCALE_FLAG_ANTIALIAS) == 0;
    let aa = flags & SCALE_FLAG_ANTIALIAS != 0;
    if !(0..=SCALE_MODE_BICUBIC).contains(&mode) || !known || (aa && mode != SCALE_MODE_BILINEAR) {
        return refuse(op, format!("upscale mode/flags {flags:#x}"));
    }
    if a.ty != GGML_TYPE_F32 || r.ty != GGML_TYPE_F32 || nelements(a) == 0 {
        return refuse(op, "upscale types or empty source");
    }
    let align = flags & SCALE_FLAG_ALIGN_CORNERS != 0;
    let nearest_dims = if mode == 0 { 0 } else { 2 };
    for d in nearest_dims..4 {
        let (n, ns) = (ne(r, d), ne(a, d));
        if n == 0 {
            continue;
        }
        let mut sf = n as f32 / ns as f32;
        if align && d < 2 && n > 1 && ns > 1 {
            sf = (n - 1) as f32 / (ns - 1) as f32;
        }
        let last = ((n - 1) as f32 / sf) as i64;
        if !(0..ns).contains(&last) {
            return refuse(
                op,
                format!(
                    "upscale of {:?} to {:?} picks index {last} of dim {d}",
                    a.ne, r.ne
                ),
            );
        }
    }
    Ok(())
}
