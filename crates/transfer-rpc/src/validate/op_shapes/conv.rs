//! Convolutions: IM2COL, IM2COL_3D, COL2IM_1D, CONV_2D, CONV_3D, CONV_2D_DW,
//! CONV_TRANSPOSE_1D, CONV_TRANSPOSE_2D. The transposed convolutions size
//! the graph plan's work buffer from their shapes (bounded here), CONV_2D /
//! CONV_3D use a fixed 16 MiB one.

use super::common::*;

/// COL2IM_1D: `ggml_compute_forward_col2im_1d_impl` by the source's type
/// (F32, F16, BF16; GGML_ABORT otherwise), dst read and written as that
/// type. GGML_ASSERT: both contiguous. op_params [s0, OC, p0]: `K_OC /
/// OC` and `/ s0` (SIGFPE on 0). It reads columns flat at `oc * K + k +
/// t_in * K_OC` (k < K, t_in < T_in) and writes dst flat at `t_out + oc *
/// T_out` for oc < OC, t_out < dst ne0: ggml_col2im_1d's shapes (a matrix
/// [K * OC, T_in], K >= 1, s0 >= 1, p0 >= 0, dst [(T_in - 1) * s0 + K - 2 *
/// p0, OC] of its type).
pub(super) fn check_col2im_1d(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
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

/// IM2COL: `ggml_compute_forward_im2col_{f32,f16}` by dst's type
/// (GGML_ABORT otherwise): F32 dst from an F32 image, F16 dst from an F16
/// or F32 image (GGML_ASSERT); the kernel (src0) gives only its shape.
/// GGML_ASSERT(nb10 == type size). Each image channel is read as
/// `src_data[iih * IW + iiw]` from `in * ofs0 + iic * ofs1` (`int ofs0 =
/// nb13 or nb12`, `ofs1 = nb12 or nb11`: the rows of a 2D channel must be
/// packed, the strides fit an int); dst is written as `N * OH * OW` packed
/// runs of `IC * KH * KW` elements from its start (contiguous, the
/// builder's shape). Strides, pads and dilations only move reads, which
/// the kernel bounds by IH / IW.
pub(super) fn check_im2col(r: &RpcTensor, a: &RpcTensor, b: &RpcTensor) -> Result<()> {
    let op = r.op;
    let types_ok = match r.ty {
        GGML_TYPE_F32 => b.ty == GGML_TYPE_F32,
        GGML_TYPE_F16 => matches!(b.ty, GGML_TYPE_F16 | GGML_TYPE_F32),
        _ => false,
    };
    if !types_ok || !rows_contiguous(b) || !is_contiguous(r) {
        return refuse(op, "im2col types/layout");
    }
    let is_2d = r.op_params[6] == 1;
    // ggml_im2col: 2D: a->ne[2] == b->ne[2]; 1D: b->ne[1] == a->ne[1],
    // b->ne[3] == 1. Result [IC * KH * KW, OW, OH or N, N or 1].
    let (n, ic, ih, kh, oh, ofs0, ofs1) = if is_2d {
        (
            ne(b, 3),
            ne(b, 2),
            ne(b, 1),
            ne(a, 1),
            ne(r, 2),
            b.nb[3],
            b.nb[2],
        )
    } else {
        (ne(b, 2), ne(b, 1), 1, 1, 1, b.nb[2], b.nb[1])
    };
    let kernel_ok = if is_2d {
        a.ne[2] == b.ne[2]
    } else {
        a.ne[1] == b.ne[1] && b.ne[3] == 1
    };
    let want = if is_2d {
        [ic * kh * ne(a, 0), ne(r, 1), oh, n]
    } else {
        [ic * ne(a, 0), ne(r, 1), n, 1]
    };
    let packed_rows = ih <= 1 || u64::from(b.nb[1]) == u64::from(b.ne[0]) * type_size(b.ty);
    let int_strides = i32::try_from(ofs0).is_ok() && i32::try_from(ofs1).is_ok();
    if !kernel_ok || (0..4).any(|d| ne(r, d) != want[d]) || !packed_rows || !int_strides {
        return refuse(
            op,
            format!(
                "im2col of kernel {:?}, image {:?} into {:?}",
                a.ne, b.ne, r.ne
            ),
        );
    }
    Ok(())
}

/// IM2COL_3D: `ggml_compute_forward_im2col_3d_{f32,f16}` by dst's type
/// (GGML_ABORT otherwise); GGML_ASSERT: image F32, nb10 = 4. op_params[9]
/// is IC: `N = ne13 / IC` and `OD = ne3 / N` divide by zero when IC is 0
/// or above ne13. The image is read by its strides at planes `in * IC +
/// iic` (inside it when ne13 = N * IC); dst is written flat, one run of
/// `IC * KD * KH * KW` elements per output position (contiguous,
/// ggml_im2col_3d's shape [KW * KH * KD * IC, OW, OH, OD * N]).
pub(super) fn check_im2col_3d(r: &RpcTensor, a: &RpcTensor, b: &RpcTensor) -> Result<()> {
    let op = r.op;
    // An empty result is never computed (ggml_compute_forward skips empty
    // nodes, and the graph plan gives IM2COL_3D no work buffer): the
    // builder makes one when the image has fewer planes than IC (N = 0),
    // as test-backend-ops' views of a 3-plane image with IC = 3 do.
    if nelements(r) == 0 {
        return Ok(());
    }
    let ic = i64::from(r.op_params[9]);
    if !matches!(r.ty, GGML_TYPE_F32 | GGML_TYPE_F16)
        || b.ty != GGML_TYPE_F32
        || b.nb[0] != 4
        || !is_contiguous(r)
        || ic < 1
        || ne(b, 3) % ic != 0
        || ne(b, 3) < ic
    {
        return refuse(op, format!("im2col_3d of IC {ic} types/layout"));
    }
    let n = ne(b, 3) / ic;
    let cols = (nelements(a) / u64::from(a.ne[3].max(1))).saturating_mul(ic as u64);
    if u64::from(r.ne[0]) != cols || ne(r, 3) % n != 0 {
        return refuse(
            op,
            format!(
                "im2col_3d of kernel {:?}, image {:?} into {:?}",
                a.ne, b.ne, r.ne
            ),
        );
    }
    Ok(())
}

/// CONV_2D_DW: `ggml_compute_forward_conv_2d_dw`. GGML_ASSERT: kernel F32
/// or F16, kernel ne[3] == channels (src ne[2]), dst ne[3] == batch; the
/// image is read and dst written as floats (F32; ggml_conv_2d_dw_direct
/// builds dst as the image's type, kernel [KW, KH, 1, C]). A contiguous
/// image takes the WHCN path: image, kernel and dst walked flat (plane i
/// at `i * W * H`, kernel `(i % C) * KW * KH`, dst `i * OW * OH`); one
/// with contiguous channels (`nb0 > nb2`, `nb1 > nb0`, `nb2` = 4) the
/// CWHN path: each walked as packed [C, W, H, N] (dst as the builder's
/// [C, OW, OH, N], kernel [C, KW, KH], GGML_ASSERT(kernel nb0 >= nb2 &&
/// nb1 >= nb0)); any other layout GGML_ABORTs. Strides, pads and
/// dilations only move reads the kernel bounds by the image's size.
pub(super) fn check_conv_2d_dw(r: &RpcTensor, a: &RpcTensor, b: &RpcTensor) -> Result<()> {
    let op = r.op;
    let c = b.ne[2];
    if !matches!(a.ty, GGML_TYPE_F32 | GGML_TYPE_F16)
        || b.ty != GGML_TYPE_F32
        || r.ty != GGML_TYPE_F32
        || a.ne[2] != 1
        || a.ne[3] != c
        || r.ne[2] != c
        || r.ne[3] != b.ne[3]
    {
        return refuse(
            op,
            format!(
                "conv_2d_dw of kernel {:?}, image {:?} into {:?}",
                a.ne, b.ne, r.ne
            ),
        );
    }
    let layout_ok = if is_contiguous(b) {
        is_contiguous(a) && is_contiguous(r)
    } else if b.nb[0] > b.nb[2] && b.nb[1] > b.nb[0] && b.nb[2] == 4 {
        // Packed [C, x, y, N] strides of a tensor [x, y, C, N].
        let cwhn = |t: &RpcTensor, es: u64| {
            let nb0 = es * u64::from(c);
            let nb1 = nb0 * u64::from(t.ne[0]);
            let nb3 = nb1 * u64::from(t.ne[1]);
            [nb0, nb1, es, nb3] == t.nb.map(u64::from)
        };
        let es = type_size(a.ty);
        let kernel_ok = u64::from(a.nb[3]) == es
            && u64::from(a.nb[0]) == es * u64::from(c)
            && u64::from(a.nb[1]) == es * u64::from(c) * u64::from(a.ne[0])
            && a.nb[0] >= a.nb[2]
            && a.nb[1] >= a.nb[0];
        cwhn(b, 4) && cwhn(r, 4) && kernel_ok
    } else {
        false
    };
    if !layout_ok {
        return refuse(
            op,
            "conv_2d_dw layout is neither packed WHCN nor packed CWHN",
        );
    }
    Ok(())
}

/// CONV_2D / CONV_3D: `ggml_compute_forward_conv_{2d,3d}_impl`, by the
/// kernel's type. GGML_ASSERT: kernel contiguous (the GEMM reads it as a
/// packed [KW * KH (* KD) * IC, OC] matrix), F16 or F32; CONV_2D IC =
/// kernel ne[2] = image ne[2]; `patches_per_batch > 0`, i.e. one patch
/// (`knl_n * type size + OC * 4` bytes) fits the 16 MiB work buffer. The
/// image is read and dst written as floats (F32; the builders make dst
/// F32 / the image's type), each element by its strides: image channels
/// `ic < IC` and batches below dst's (2D: ne[3]; 3D: `n`, image planes
/// `batch * c + ic`), dst channels `oc < OC` (2D: kernel ne[3]; 3D:
/// op_params[11], dst planes `batch * oc + ioc`). Hence the builders'
/// channel and batch counts (3D: `c`, `n`, `oc` from op_params[9..12]
/// positive, kernel ne[3] = c * oc, image ne[3] = c * n, dst ne[3] = n *
/// oc). Strides, pads, dilations only move reads the kernel bounds by the
/// image's size.
pub(super) fn check_conv_direct(r: &RpcTensor, a: &RpcTensor, b: &RpcTensor) -> Result<()> {
    let op = r.op;
    if !matches!(a.ty, GGML_TYPE_F32 | GGML_TYPE_F16)
        || !is_contiguous(a)
        || b.ty != GGML_TYPE_F32
        || r.ty != GGML_TYPE_F32
    {
        return refuse(op, "conv types/layout");
    }
    let (channels_ok, knl_n, oc) = if op == OP_CONV_2D {
        let ok = a.ne[2] == b.ne[2] && r.ne[2] == a.ne[3] && r.ne[3] == b.ne[3];
        (ok, nelements(a) / u64::from(a.ne[3].max(1)), ne(a, 3))
    } else {
        let p = &r.op_params;
        let (c, n, oc) = (i64::from(p[9]), i64::from(p[10]), i64::from(p[11]));
        let ok = c >= 1
            && n >= 1
            && oc >= 1
            && ne(a, 3) == c * oc
            && ne(b, 3) == c * n
            && ne(r, 3) == n * oc;
        (
            ok,
            (nelements(a) / u64::from(a.ne[3].max(1))).saturating_mul(c as u64),
            oc,
        )
    };
    let patch = knl_n
        .saturating_mul(type_size(a.ty))
        .saturating_add(oc as u64 * 4);
    if !channels_ok || patch > IM2COL_WORK_SIZE {
        return refuse(
            op,
            format!(
                "conv of kernel {:?}, image {:?} into {:?} (patch {patch} bytes)",
                a.ne, b.ne, r.ne
            ),
        );
    }
    Ok(())
}

/// CONV_TRANSPOSE_1D / _2D: `ggml_compute_forward_conv_transpose_1d_
/// {f16_f32,f32}` and `_2d_impl` by the kernel's type (F16 or F32,
/// GGML_ABORT otherwise); GGML_ASSERT: source and dst F32, nb00 = the
/// kernel's element size, nb10 = 4. ggml_graph_plan GGML_ASSERTs (1D)
/// kernel ne[3] = 1, source ne[2] = ne[3] = 1. Thread 0 copies the kernel
/// ([K, Cout, Cin] or [KW, KH, Cout, Cin], rows packed: the 2D copy reads
/// `src[i01 * ne00 + i00]` of each plane) and the source channel-last into
/// the work buffer, which the dot products then read Cin (kernel ne[2] /
/// ne[3]) at a time at source-channel strides (source ne[1] / ne[2]): the
/// two must be equal. dst (zeroed by ggml_nbytes) is written at `i10 * s +
/// i00` of each row (1D: rows `i1 * nb1` for i1 < ne1, the kernel's Cout)
/// and `(i11 * s + i01) * ne0 + i10 * s + i00` of each packed plane
/// (2D: Cout planes at nb2, batches at nb3 from the source's): ggml's
/// builders' shapes `(L - 1) * s + K` (1D: p0 = 0, d0 = 1) with s >= 1.
pub(super) fn check_conv_transpose(r: &RpcTensor, a: &RpcTensor, b: &RpcTensor) -> Result<()> {
    let op = r.op;
    let es = type_size(a.ty);
    if !matches!(a.ty, GGML_TYPE_F32 | GGML_TYPE_F16)
        || b.ty != GGML_TYPE_F32
        || r.ty != GGML_TYPE_F32
        || u64::from(a.nb[0]) != es
        || b.nb[0] != 4
        || r.nb[0] != 4
    {
        return refuse(op, "conv_transpose types/layout");
    }
    let s = r.op_params[0];
    let out = |ins: u32, k: u32| (i64::from(ins) - 1) * i64::from(s) + i64::from(k);
    let shape_ok = if op == OP_CONV_TRANSPOSE_1D {
        a.ne[3] == 1
            && b.ne[2] == 1
            && b.ne[3] == 1
            && a.ne[2] == b.ne[1]
            && r.op_params[1] == 0
            && r.op_params[2] == 1
            && [ne(r, 0), ne(r, 1), ne(r, 2), ne(r, 3)] == [out(b.ne[0], a.ne[0]), ne(a, 1), 1, 1]
    } else {
        let packed_plane = r.ne[1] <= 1 || u64::from(r.nb[1]) == 4 * u64::from(r.ne[0]);
        let kernel_rows = a.ne[1] <= 1 || u64::from(a.nb[1]) == es * u64::from(a.ne[0]);
        a.ne[3] == b.ne[2]
            && packed_plane
            && kernel_rows
            && [ne(r, 0), ne(r, 1), ne(r, 2), ne(r, 3)]
                == [
                    out(b.ne[0], a.ne[0]),
                    out(b.ne[1], a.ne[1]),
                    ne(a, 2),
                    ne(b, 3),
                ]
    };
    if s < 1 || !shape_ok || nelements(b) == 0 {
        return refuse(
            op,
            format!(
                "conv_transpose stride {s} of kernel {:?}, source {:?} into {:?}",
                a.ne, b.ne, r.ne
            ),
        );
    }
    let work = es.saturating_mul(nelements(a).saturating_add(nelements(b)));
    if work > MAX_CONV_TRANSPOSE_WORK || u64::from(r.ne[0]) * u64::from(r.ne[1]) > i32::MAX as u64 {
        return refuse(op, format!("conv_transpose work buffer of {work} bytes"));
    }
    Ok(())
}
