//! Op rules for the vision-encoder ops of issue 11: IM2COL, IM2COL_3D, CONV_2D,
//! CONV_3D, CONV_2D_DW, CONV_TRANSPOSE_1D, CONV_TRANSPOSE_2D, POOL_1D, POOL_2D and UPSCALE (all
//! modes and flags), OUT_PROD, and the linear-attention ops RWKV_WKV6,
//! GATED_LINEAR_ATTN, RWKV_WKV7. As in `op_shapes.rs`, each rule is what the op's
//! ggml-cpu kernel (ops.cpp of the vendored llama.cpp) asserts, aborts
//! on, or needs to stay inside its tensors; the transposed convolutions
//! size the graph plan's work buffer from their shapes (bounded here),
//! CONV_2D / CONV_3D use a fixed 16 MiB one.

use super::cpu_types;
use super::op_shapes::{flat_walk, is_contiguous, nelements, refuse, rows_contiguous, type_size};
use super::types::{GGML_TYPE_F16, GGML_TYPE_F32};
use crate::error::Result;
use crate::protocol::tensor::{MAX_SRC, RpcTensor};

/// `GGML_OP_*` of the ops checked here.
pub(super) const OP_RWKV_WKV6: u32 = 82;
pub(super) const OP_GATED_LINEAR_ATTN: u32 = 83;
pub(super) const OP_RWKV_WKV7: u32 = 84;
pub(super) const OP_OUT_PROD: u32 = 31;
pub(super) const OP_CONV_TRANSPOSE_1D: u32 = 51;
pub(super) const OP_IM2COL: u32 = 52;
pub(super) const OP_IM2COL_3D: u32 = 54;
pub(super) const OP_CONV_2D: u32 = 56;
pub(super) const OP_CONV_3D: u32 = 57;
pub(super) const OP_CONV_2D_DW: u32 = 58;
pub(super) const OP_CONV_TRANSPOSE_2D: u32 = 59;
pub(super) const OP_POOL_1D: u32 = 60;
pub(super) const OP_POOL_2D: u32 = 61;
pub(super) const OP_UPSCALE: u32 = 63;

/// `GGML_OP_POOL_MAX`, `GGML_OP_POOL_AVG` (`GGML_OP_POOL_COUNT` aborts).
pub(super) const POOL_MAX: i32 = 0;
pub(super) const POOL_AVG: i32 = 1;
/// `GGML_SCALE_MODE_BICUBIC` (NEAREST 0, BILINEAR 1), the flags.
const SCALE_MODE_BILINEAR: i32 = 1;
const SCALE_MODE_BICUBIC: i32 = 2;
const SCALE_FLAG_ALIGN_CORNERS: i32 = 1 << 8;
const SCALE_FLAG_ANTIALIAS: i32 = 1 << 9;

/// Largest work buffer a transposed convolution may ask for, in bytes.
/// `ggml_graph_plan` (ggml-cpu.c) sizes it as the kernel plus the source,
/// both in the kernel's element size, and the CPU backend allocates it
/// with `new[]`, which aborts the process when it fails; the kernels also
/// index it with `int`. 256 MiB, as for MUL_MAT_ID's row map.
pub const MAX_CONV_TRANSPOSE_WORK: u64 = 256 << 20;

/// `GGML_IM2COL_WORK_SIZE` (ggml-cpu/ops.h): the work buffer
/// ggml_graph_plan gives CONV_2D and CONV_3D.
const IM2COL_WORK_SIZE: u64 = 16 << 20;

/// Longest OUT_PROD row of an F16 `src0` accepted: ggml_graph_plan gives
/// each thread `ne00` floats of work buffer to widen a row into (1M
/// floats: 4 MiB a thread, 256 MiB for 64 threads).
pub const MAX_OUT_PROD_F16_ROW: u32 = 1 << 20;

fn ne(t: &RpcTensor, d: usize) -> i64 {
    i64::from(t.ne[d])
}

/// Checks one node of an op of this module; `None` for other ops.
pub(super) fn check(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Option<Result<()>> {
    let checked = match r.op {
        OP_IM2COL | OP_CONV_2D_DW => match (s[0], s[1]) {
            (Some(a), Some(b)) if r.op == OP_IM2COL => check_im2col(r, a, b),
            (Some(a), Some(b)) => check_conv_2d_dw(r, a, b),
            _ => refuse(r.op, "needs two sources"),
        },
        OP_RWKV_WKV6 | OP_GATED_LINEAR_ATTN | OP_RWKV_WKV7 => check_linear_attn(r, s),
        OP_OUT_PROD => match (s[0], s[1]) {
            (Some(a), Some(b)) => check_out_prod(r, a, b),
            _ => refuse(r.op, "needs two sources"),
        },
        OP_IM2COL_3D => match (s[0], s[1]) {
            (Some(a), Some(b)) => check_im2col_3d(r, a, b),
            _ => refuse(r.op, "needs two sources"),
        },
        OP_CONV_2D | OP_CONV_3D => match (s[0], s[1]) {
            (Some(a), Some(b)) => check_conv_direct(r, a, b),
            _ => refuse(r.op, "needs two sources"),
        },
        OP_CONV_TRANSPOSE_1D | OP_CONV_TRANSPOSE_2D => match (s[0], s[1]) {
            (Some(a), Some(b)) => check_conv_transpose(r, a, b),
            _ => refuse(r.op, "needs two sources"),
        },
        OP_POOL_1D | OP_POOL_2D | OP_UPSCALE => match s[0] {
            Some(a) if r.op == OP_POOL_1D => check_pool_1d(r, a),
            Some(a) if r.op == OP_POOL_2D => check_pool_2d(r, a),
            Some(a) => check_upscale(r, a),
            None => refuse(r.op, "missing source 0"),
        },
        _ => return super::op_shapes_misc::check(r, s),
    };
    Some(checked)
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
fn check_linear_attn(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
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

/// OUT_PROD: `ggml_compute_forward_out_prod_{f32,f16_f32,q_f32}` by
/// src0's type (GGML_ABORT on other types).
/// GGML_ASSERT: src1 and dst F32, ne0 = ne00, ne1 = ne10, ne2 = ne12, ne3
/// = ne13, nb00 = src0's element size, nb0 = 4; F32: ne2 % ne02 == 0, ne3
/// % ne03 == 0 (a modulo by an empty dim is SIGFPE); F16 and quantized:
/// ne02 = ne12, ne03 = ne13. Thread 0 zeroes `ne0 * ne1 * ne2 * ne3` floats from dst's
/// start (contiguous); rows i01 < ne01 of src0 pair with rows i11 = i01 of
/// src1 (ggml_can_out_prod: ne01 = ne11). The F16 and quantized paths'
/// work buffer (one widened row per thread) is bounded by
/// `MAX_OUT_PROD_F16_ROW`.
fn check_out_prod(r: &RpcTensor, a: &RpcTensor, b: &RpcTensor) -> Result<()> {
    let op = r.op;
    let broadcast_ok = match a.ty {
        GGML_TYPE_F32 => {
            a.ne[2] >= 1 && a.ne[3] >= 1 && r.ne[2] % a.ne[2] == 0 && r.ne[3] % a.ne[3] == 0
        }
        // The quantized path (`out_prod_q_f32`, every block type with a
        // `to_float`: q8_1 and q8_K have none and GGML_ABORT) asserts what
        // the F16 one does and dequantizes each src0 row into the same
        // per-thread work buffer.
        t if t == GGML_TYPE_F16 || cpu_types::quantized_with_to_float(t) => {
            a.ne[2..] == b.ne[2..] && a.ne[0] <= MAX_OUT_PROD_F16_ROW
        }
        _ => false,
    };
    if !broadcast_ok
        || b.ty != GGML_TYPE_F32
        || r.ty != GGML_TYPE_F32
        || u64::from(a.nb[0]) != type_size(a.ty)
        || r.nb[0] != 4
        || !is_contiguous(r)
        || r.ne[0] != a.ne[0]
        || r.ne[1] != b.ne[0]
        || r.ne[2..] != b.ne[2..]
        || a.ne[1] != b.ne[1]
    {
        return refuse(
            op,
            format!("out_prod of {:?} and {:?} into {:?}", a.ne, b.ne, r.ne),
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
fn check_im2col(r: &RpcTensor, a: &RpcTensor, b: &RpcTensor) -> Result<()> {
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
fn check_im2col_3d(r: &RpcTensor, a: &RpcTensor, b: &RpcTensor) -> Result<()> {
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
fn check_conv_2d_dw(r: &RpcTensor, a: &RpcTensor, b: &RpcTensor) -> Result<()> {
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
fn check_conv_direct(r: &RpcTensor, a: &RpcTensor, b: &RpcTensor) -> Result<()> {
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
fn check_conv_transpose(r: &RpcTensor, a: &RpcTensor, b: &RpcTensor) -> Result<()> {
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
fn check_pool_1d(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
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
fn check_pool_2d(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
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
fn check_upscale(r: &RpcTensor, a: &RpcTensor) -> Result<()> {
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
