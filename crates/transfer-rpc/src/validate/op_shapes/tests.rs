use super::*;
use crate::validate::types::GGML_TYPE_Q4_0;

const Q8_0: u32 = 8;
const Q8_1: u32 = 9;
const Q8_K: u32 = 15;
const Q4_K: u32 = 12;

/// A packed tensor of `ty` with `ne`.
fn packed(ty: u32, ne: [u32; 4]) -> RpcTensor {
    let i = type_info(ty).map_or((1, 4), |i| (i.block_size, i.type_size));
    let row = u64::from(ne[0]) / i.0 * i.1;
    let nb1 = row as u32;
    RpcTensor {
        ty,
        ne,
        nb: [i.1 as u32, nb1, nb1 * ne[1], nb1 * ne[1] * ne[2]],
        ..RpcTensor::default()
    }
}

fn srcs<'a>(a: &'a RpcTensor, b: Option<&'a RpcTensor>) -> [Option<&'a RpcTensor>; MAX_SRC] {
    let mut s = [None; MAX_SRC];
    s[0] = Some(a);
    s[1] = b;
    s
}

/// MUL_MAT of a `ty` matrix [256, 8] by F32 activations [256, 3], as
/// ggml_mul_mat builds it.
fn mul_mat(ty: u32) -> Result<()> {
    let w = packed(ty, [256, 8, 1, 1]);
    let x = packed(GGML_TYPE_F32, [256, 3, 1, 1]);
    let mut r = packed(GGML_TYPE_F32, [8, 3, 1, 1]);
    r.op = OP_MUL_MAT;
    check_node(&r, &srcs(&w, Some(&x)), None)
}

/// GET_ROWS of 2 rows of a `ty` table [256, 8] into F32, as
/// ggml_get_rows builds it.
fn get_rows(ty: u32) -> Result<()> {
    let table = packed(ty, [256, 8, 1, 1]);
    let idx = packed(GGML_TYPE_I32, [2, 1, 1, 1]);
    let mut r = packed(GGML_TYPE_F32, [256, 2, 1, 1]);
    r.op = GGML_OP_GET_ROWS;
    check_node(&r, &srcs(&table, Some(&idx)), None)
}

#[test]
fn quantized_weights_are_multiplied_and_read() {
    for ty in [GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q4_0, Q8_0, Q4_K] {
        assert!(mul_mat(ty).is_ok(), "mul_mat src0 type {ty}");
        assert!(get_rows(ty).is_ok(), "get_rows type {ty}");
    }
    // A quantized matrix whose rows are not packed blocks is refused.
    let mut w = packed(Q8_0, [256, 8, 1, 1]);
    w.nb[0] = 4;
    let x = packed(GGML_TYPE_F32, [256, 3, 1, 1]);
    let mut r = packed(GGML_TYPE_F32, [8, 3, 1, 1]);
    r.op = OP_MUL_MAT;
    assert!(check_node(&r, &srcs(&w, Some(&x)), None).is_err());
}

#[test]
fn types_without_cpu_row_kernels_are_refused() {
    // ggml-cpu would call a null vec_dot / to_float or abort on these.
    for ty in [Q8_1, Q8_K, 24, 25, GGML_TYPE_I32, 27, 28] {
        assert!(mul_mat(ty).is_err(), "mul_mat src0 type {ty}");
    }
    for ty in [Q8_1, Q8_K, 24, 25, 27, 28] {
        assert!(get_rows(ty).is_err(), "get_rows type {ty}");
    }
}

fn f32_bits(v: f32) -> i32 {
    v.to_bits() as i32
}

fn node(ty: u32, ne: [u32; 4], op: u32) -> RpcTensor {
    let mut r = packed(ty, ne);
    r.op = op;
    r
}

#[test]
fn norm_eps_must_be_a_non_negative_number() {
    let a = packed(GGML_TYPE_F32, [4, 2, 1, 1]);
    for op in [OP_NORM, OP_RMS_NORM] {
        let mut r = node(GGML_TYPE_F32, [4, 2, 1, 1], op);
        for (eps, ok) in [
            (1e-5f32, true),
            (0.0, true),
            (-1e-5, false),
            (f32::NAN, false),
        ] {
            r.op_params[0] = f32_bits(eps);
            assert_eq!(
                check_node(&r, &srcs(&a, None), None).is_ok(),
                ok,
                "{op} {eps}"
            );
        }
    }
}

#[test]
fn scale_rows_must_be_flat() {
    let a = packed(GGML_TYPE_F32, [4, 1, 3, 1]);
    let r = node(GGML_TYPE_F32, [4, 1, 3, 1], OP_SCALE);
    assert!(check_node(&r, &srcs(&a, None), None).is_ok());
    // Contiguous for ggml (ne[1] == 1), but rows are walked by nb[1].
    let mut wide = r.clone();
    wide.nb[1] = 1 << 20;
    assert!(is_contiguous(&wide));
    assert!(check_node(&wide, &srcs(&a, None), None).is_err());
    let mut padded = a.clone();
    padded.ne = [4, 3, 1, 1];
    padded.nb = [4, 32, 96, 96];
    let r = node(GGML_TYPE_F32, [4, 3, 1, 1], OP_SCALE);
    assert!(check_node(&r, &srcs(&padded, None), None).is_err());
}

#[test]
fn contiguous_1_frees_dim_1_only() {
    let mut t = packed(GGML_TYPE_F32, [4, 2, 3, 1]);
    assert!(is_contiguous_1(&t));
    t.nb = [4, 32, 64, 192];
    assert!(is_contiguous_1(&t) && !is_contiguous(&t));
    t.nb = [4, 16, 64, 192];
    assert!(!is_contiguous_1(&t));
}

#[test]
fn glu_types_limits_and_layout() {
    let glu = |ty: u32, op: i32, limit: f32, a_nb: Option<[u32; 4]>| {
        let mut a = packed(ty, [8, 2, 3, 1]);
        if let Some(nb) = a_nb {
            a.nb = nb;
        }
        let mut r = node(ty, [4, 2, 3, 1], GGML_OP_GLU);
        r.op_params[0] = op;
        r.op_params[3] = f32_bits(limit);
        check_node(&r, &srcs(&a, None), None).is_ok()
    };
    assert!(glu(GGML_TYPE_F32, 3, 7.0, None));
    assert!(!glu(GGML_TYPE_F16, 3, 7.0, None));
    assert!(!glu(GGML_TYPE_F32, 3, -7.0, None));
    assert!(!glu(GGML_TYPE_F32, 6, f32::NAN, None));
    assert!(glu(GGML_TYPE_F16, 6, 7.0, None));
    assert!(!glu(GGML_TYPE_BF16, 6, 7.0, None));
    assert!(glu(GGML_TYPE_BF16, 2, 0.0, None));
    assert!(!glu(GGML_TYPE_F32, 2, 0.0, Some([4, 32, 128, 384])));
    assert!(glu(GGML_TYPE_F32, 2, 0.0, Some([4, 64, 128, 384])));
}

fn rope(ty: u32, ne0: u32, n_dims: i32, n_offs: i32, pos_nb0: u32) -> Result<()> {
    let a = packed(ty, [ne0, 2, 3, 1]);
    let mut pos = packed(GGML_TYPE_I32, [3, 1, 1, 1]);
    pos.nb[0] = pos_nb0;
    let mut r = node(ty, [ne0, 2, 3, 1], OP_ROPE);
    r.op_params[1] = n_dims;
    r.op_params[15] = n_offs;
    check_node(&r, &srcs(&a, Some(&pos)), None)
}

#[test]
fn rope_params_types_and_rows() {
    assert!(rope(GGML_TYPE_F32, 8, 4, 0, 4).is_ok());
    assert!(rope(GGML_TYPE_F16, 8, 4, 4, 4).is_ok());
    assert!(rope(GGML_TYPE_BF16, 8, 4, 0, 4).is_err());
    for n_offs in [1, -2, 6] {
        assert!(rope(GGML_TYPE_F32, 8, 4, n_offs, 4).is_err(), "{n_offs}");
    }
    assert!(rope(GGML_TYPE_F32, 7, 4, 0, 4).is_err());
    assert!(rope(GGML_TYPE_F32, 8, 4, 0, 8).is_err());
}

#[test]
fn mul_mat_result_strides_and_hadamard_hint() {
    let w = packed(GGML_TYPE_F32, [4, 3, 1, 1]);
    let x = packed(GGML_TYPE_F32, [4, 2, 1, 1]);
    let mut r = node(GGML_TYPE_F32, [3, 2, 1, 1], OP_MUL_MAT);
    assert!(check_node(&r, &srcs(&w, Some(&x)), None).is_ok());
    for nb in [[4, 12, 4, 4], [4, 12, 24, 16]] {
        let mut bad = r.clone();
        bad.nb = nb;
        assert!(is_contiguous(&bad));
        assert!(
            check_node(&bad, &srcs(&w, Some(&x)), None).is_err(),
            "{nb:?}"
        );
    }
    // K = 4 with 3 result rows, K = 6: refused with the hint.
    r.op_params[1] = HINT_SRC0_IS_HADAMARD;
    assert!(check_node(&r, &srcs(&w, Some(&x)), None).is_err());
    let h = packed(GGML_TYPE_F32, [4, 4, 1, 1]);
    let r4 = {
        let mut r = node(GGML_TYPE_F32, [4, 2, 1, 1], OP_MUL_MAT);
        r.op_params[1] = HINT_SRC0_IS_HADAMARD;
        r
    };
    assert!(check_node(&r4, &srcs(&h, Some(&x)), None).is_ok());
    // F16 activations: ggml-cpu's FWHT reads them (no vec_dot, which
    // an F32 src0 would need F32 or BF16 for); without the hint, and
    // BF16 with it (FWHT aborts), refused.
    let x16 = packed(GGML_TYPE_F16, [4, 2, 1, 1]);
    assert!(check_node(&r4, &srcs(&h, Some(&x16)), None).is_ok());
    let mut plain = r4.clone();
    plain.op_params[1] = 0;
    assert!(check_node(&plain, &srcs(&h, Some(&x16)), None).is_err());
    let xbf = packed(GGML_TYPE_BF16, [4, 2, 1, 1]);
    assert!(check_node(&plain, &srcs(&h, Some(&xbf)), None).is_ok());
    assert!(check_node(&r4, &srcs(&h, Some(&xbf)), None).is_err());
    let h6 = packed(GGML_TYPE_F32, [6, 6, 1, 1]);
    let x6 = packed(GGML_TYPE_F32, [6, 2, 1, 1]);
    let mut r6 = node(GGML_TYPE_F32, [6, 2, 1, 1], OP_MUL_MAT);
    r6.op_params[1] = HINT_SRC0_IS_HADAMARD;
    assert!(check_node(&r6, &srcs(&h6, Some(&x6)), None).is_err());
}

#[test]
fn flash_attn_ext_result_precision_and_head_size() {
    let fa = |nb1: u32, prec: i32, dk: u32| {
        let q = packed(GGML_TYPE_F32, [dk, 1, 1, 1]);
        let k = packed(GGML_TYPE_F16, [dk, 2, 1, 1]);
        let v = packed(GGML_TYPE_F16, [4, 2, 1, 1]);
        let mut r = node(GGML_TYPE_F32, [4, 1, 1, 1], OP_FLASH_ATTN_EXT);
        r.nb = [4, nb1, nb1, nb1];
        r.op_params[3] = prec;
        let mut s = srcs(&q, Some(&k));
        s[2] = Some(&v);
        check_node(&r, &s, None).is_ok()
    };
    assert!(fa(16, PREC_DEFAULT, 8));
    assert!(fa(16, PREC_F32, 8));
    assert!(!fa(16, 5, 8));
    assert!(!fa(4096, PREC_DEFAULT, 8));
    assert!(!fa(16, PREC_DEFAULT, MAX_FLASH_ATTN_HEAD * 2));
}

#[test]
fn get_rows_source_rows_must_be_packed() {
    assert!(get_rows(GGML_TYPE_F16).is_ok());
    let mut table = packed(GGML_TYPE_F32, [256, 8, 1, 1]);
    table.nb[0] = 8;
    let idx = packed(GGML_TYPE_I32, [2, 1, 1, 1]);
    let r = node(GGML_TYPE_F32, [256, 2, 1, 1], GGML_OP_GET_ROWS);
    assert!(check_node(&r, &srcs(&table, Some(&idx)), None).is_err());
}

#[test]
fn rows_and_row_counts_must_fit_an_int() {
    // Shapes only (strides of overlapping rows): no memory behind them.
    let t = |ne: [u32; 4], op: u32| RpcTensor {
        ty: GGML_TYPE_F32,
        ne,
        nb: [4, 4 * ne[0].min(4), 4 * ne[0].min(4), 4 * ne[0].min(4)],
        op,
        ..RpcTensor::default()
    };
    let scale = |ne: [u32; 4]| {
        let a = t(ne, 0);
        check_node(&t(ne, OP_SCALE), &srcs(&a, None), None).is_ok()
    };
    // flat_rows fails these anyway for nrows > 1; check the int guard
    // on a single long row and on many one-element rows.
    assert!(!scale([1 << 31, 1, 1, 1]));
    let glu = |ne: [u32; 4]| {
        let a = t(ne, 0);
        let mut r = t(ne, GGML_OP_GLU);
        r.op_params[0] = 2;
        check_node(&r, &srcs(&a, Some(&a)), None).is_ok()
    };
    assert!(!glu([1 << 31, 1, 1, 1]));
    assert!(!glu([1, 1 << 31, 1, 1]));
    assert!(glu([(1 << 31) - 1, 1, 1, 1]));
}

/// A copy node `op` of `a` into a packed `to` tensor of shape `ne`
/// (for CPY, the destination is that tensor too).
fn copy(op: u32, a: &RpcTensor, to: u32, ne: [u32; 4]) -> bool {
    let b = packed(to, ne);
    let r = node(to, ne, op);
    check_node(&r, &srcs(a, (op == OP_CPY).then_some(&b)), None).is_ok()
}

#[test]
fn copies_follow_the_dup_paths() {
    let f32s = packed(GGML_TYPE_F32, [64, 2, 3, 1]);
    let mut permuted = f32s.clone();
    permuted.ne = [64, 3, 2, 1];
    permuted.nb = [4, 512, 256, 1536];
    // Same type: any type, any layout (dup_bytes)...
    for ty in [GGML_TYPE_I32, 24, 25, 27, 28, GGML_TYPE_F16] {
        let a = packed(ty, [64, 2, 3, 1]);
        assert!(copy(OP_CONT, &a, ty, [64, 2, 3, 1]), "{ty}");
        assert!(copy(OP_DUP, &a, ty, [64, 6, 1, 1]), "{ty}");
    }
    // ...but a block type copied into a contiguous result of another
    // shape from a non-contiguous source takes the row path that
    // copies ne00 * block bytes per row.
    let q = packed(Q8_0, [64, 2, 3, 1]);
    assert!(copy(OP_CPY, &q, Q8_0, [64, 6, 1, 1]));
    let mut q_perm = q.clone();
    q_perm.ne = [64, 3, 2, 1];
    q_perm.nb = [34, 136, 68, 408];
    assert!(copy(OP_CONT, &q_perm, Q8_0, [64, 3, 2, 1]));
    assert!(!copy(OP_CONT, &q_perm, Q8_0, [64, 6, 1, 1]));
    // Float conversions and the two integer ones.
    for (from, to) in [(0, 1), (1, 30), (30, 0), (0, 26), (26, 0)] {
        let a = packed(from, [64, 2, 3, 1]);
        assert!(copy(OP_CPY, &a, to, [64, 2, 3, 1]), "{from}->{to}");
    }
    for (from, to) in [(1, 26), (30, 26), (26, 1), (24, 0), (27, 0)] {
        let a = packed(from, [64, 2, 3, 1]);
        assert!(!copy(OP_CPY, &a, to, [64, 2, 3, 1]), "{from}->{to}");
    }
    // Quantizing: a from_float, contiguous result, packed source rows
    // of whole blocks no longer than the result's rows.
    assert!(copy(OP_CPY, &f32s, Q8_0, [64, 2, 3, 1]));
    let short_rows = packed(GGML_TYPE_F32, [64, 4, 1, 1]);
    assert!(!copy(OP_CPY, &short_rows, Q4_K, [256, 1, 1, 1]));
    assert!(copy(OP_CPY, &permuted, Q8_0, [64, 3, 2, 1]));
    assert!(!copy(OP_CPY, &f32s, 16, [64, 2, 3, 1])); // iq2_xxs
    assert!(!copy(OP_CPY, &f32s, Q8_0, [32, 12, 1, 1])); // wdata overrun
    let mut strided = f32s.clone();
    strided.nb[0] = 8;
    strided.nb[1] = 512;
    strided.nb[2] = 1024;
    strided.nb[3] = 3072;
    assert!(!copy(OP_CPY, &strided, Q8_0, [64, 2, 3, 1]));
    // Dequantizing: CPY into F32 only (DUP / CONT have no src1).
    assert!(copy(OP_CPY, &q, GGML_TYPE_F32, [64, 2, 3, 1]));
    assert!(!copy(OP_DUP, &q, GGML_TYPE_F32, [64, 2, 3, 1]));
    assert!(!copy(OP_CPY, &q, GGML_TYPE_F16, [64, 2, 3, 1]));
    assert!(!copy(
        OP_CPY,
        &packed(Q8_1, [64, 2, 3, 1]),
        0,
        [64, 2, 3, 1]
    ));
    // Element counts must agree; CPY's result is its destination.
    assert!(!copy(OP_CPY, &f32s, 0, [64, 2, 2, 1]));
    let b = packed(GGML_TYPE_F32, [64, 2, 3, 1]);
    let mut r = node(GGML_TYPE_F32, [64, 2, 3, 1], OP_CPY);
    r.nb[1] = 1024;
    assert!(check_node(&r, &srcs(&f32s, Some(&b)), None).is_err());
}

#[test]
fn mul_mat_src1_is_f32_or_the_vec_dot_type() {
    let case = |wa: u32, wb: u32| {
        let w = packed(wa, [256, 8, 1, 1]);
        let x = packed(wb, [256, 3, 1, 1]);
        let r = node(GGML_TYPE_F32, [8, 3, 1, 1], OP_MUL_MAT);
        check_node(&r, &srcs(&w, Some(&x)), None).is_ok()
    };
    for (a, b) in [(1, 1), (30, 30), (0, 30), (2, 8), (3, 9), (12, 15), (1, 0)] {
        assert!(case(a, b), "{a} x {b}");
    }
    for (a, b) in [(0, 1), (30, 1), (1, 30), (2, 9), (12, 8), (2, 2)] {
        assert!(!case(a, b), "{a} x {b}");
    }
    // A Q8_K src1 for a tiled K-quant is walked by nb[1].
    let w = packed(Q4_K, [256, 8, 1, 1]);
    let mut x = packed(Q8_K, [256, 1, 3, 1]);
    x.nb[1] = 1 << 20;
    let r = node(GGML_TYPE_F32, [8, 1, 3, 1], OP_MUL_MAT);
    assert!(check_node(&r, &srcs(&w, Some(&x)), None).is_err());
    x.nb[1] = 292;
    assert!(check_node(&r, &srcs(&w, Some(&x)), None).is_ok());
}

fn rope_multi(mode: i32, ne0: u32, n_dims: i32, sections: [i32; 4], n_pos: u32) -> bool {
    let a = packed(GGML_TYPE_F32, [ne0, 2, 3, 1]);
    let pos = packed(GGML_TYPE_I32, [n_pos, 1, 1, 1]);
    let mut r = node(GGML_TYPE_F32, [ne0, 2, 3, 1], OP_ROPE);
    r.op_params[1] = n_dims;
    r.op_params[2] = mode;
    r.op_params[11..15].copy_from_slice(&sections);
    check_node(&r, &srcs(&a, Some(&pos)), None).is_ok()
}

#[test]
fn rope_modes_sections_and_positions() {
    assert!(rope_multi(8, 64, 64, [16, 8, 8, 0], 12));
    assert!(rope_multi(40, 64, 64, [11, 11, 10, 0], 12));
    assert!(rope_multi(24, 64, 32, [8, 8, 0, 0], 12));
    // One position per token is not enough for multi-rope.
    assert!(!rope_multi(8, 64, 64, [16, 8, 8, 0], 3));
    // Modes the kernel's switch aborts on.
    for mode in [1, 4, 10, 16, 26, 32] {
        assert!(!rope_multi(mode, 64, 64, [16, 8, 8, 0], 12), "{mode}");
    }
    // No section among the first three, a sum of 0, past the row.
    assert!(!rope_multi(8, 64, 64, [0, 0, 0, 8], 12));
    assert!(!rope_multi(8, 64, 64, [16, -16, 8, 0], 12));
    assert!(!rope_multi(8, 64, 64, [32, 32, 8, 0], 12));
    // Vision: n_dims = ne0 / 2.
    assert!(!rope_multi(24, 64, 64, [8, 8, 0, 0], 12));
    // Plain rope with 4 positions per token: the builder's shape.
    assert!(!rope_multi(0, 64, 64, [0; 4], 12));
}

#[test]
fn sinks_are_one_f32_per_head() {
    let a = packed(GGML_TYPE_F32, [16, 4, 8, 1]);
    let r = node(GGML_TYPE_F32, [16, 4, 8, 1], OP_SOFT_MAX);
    let soft_max = |k: &RpcTensor| {
        let mut s = srcs(&a, None);
        s[2] = Some(k);
        check_node(&r, &s, None).is_ok()
    };
    assert!(soft_max(&packed(GGML_TYPE_F32, [8, 1, 1, 1])));
    assert!(!soft_max(&packed(GGML_TYPE_F32, [4, 1, 1, 1])));
    assert!(!soft_max(&packed(GGML_TYPE_F16, [8, 1, 1, 1])));
    let mut spread = packed(GGML_TYPE_F32, [8, 1, 1, 1]);
    spread.nb[0] = 8;
    assert!(!soft_max(&spread));

    let fa = |k_ty: u32, sinks: Option<RpcTensor>| {
        let q = packed(GGML_TYPE_F32, [256, 1, 4, 1]);
        let k = packed(k_ty, [256, 8, 2, 1]);
        let v = packed(k_ty, [256, 8, 2, 1]);
        let mut r = node(GGML_TYPE_F32, [256, 4, 1, 1], OP_FLASH_ATTN_EXT);
        r.nb = [4, 1024, 4096, 4096];
        let mut s = srcs(&q, Some(&k));
        s[2] = Some(&v);
        s[4] = sinks.as_ref();
        check_node(&r, &s, None).is_ok()
    };
    for ty in [0, 1, 30, Q8_0, GGML_TYPE_Q4_0, Q4_K] {
        assert!(fa(ty, None), "{ty}");
    }
    for ty in [Q8_1, Q8_K, GGML_TYPE_I32] {
        assert!(!fa(ty, None), "{ty}");
    }
    assert!(fa(1, Some(packed(GGML_TYPE_F32, [4, 1, 1, 1]))));
    assert!(!fa(1, Some(packed(GGML_TYPE_F32, [2, 1, 1, 1]))));
}

#[test]
fn set_rows_destinations_need_a_from_float() {
    let rows = packed(GGML_TYPE_F32, [256, 2, 1, 1]);
    let idx = packed(27, [2, 1, 1, 1]);
    for (ty, ok) in [
        (0, true),
        (30, true),
        (Q8_0, true),
        (Q4_K, true),
        (26, true),
    ] {
        let r = node(ty, [256, 4, 1, 1], GGML_OP_SET_ROWS);
        assert_eq!(
            check_node(&r, &srcs(&rows, Some(&idx)), None).is_ok(),
            ok,
            "{ty}"
        );
    }
    for ty in [16, 17, 18, 19, 21, 22, 29, 24, 25, 27, 28] {
        let r = node(ty, [256, 4, 1, 1], GGML_OP_SET_ROWS);
        assert!(
            check_node(&r, &srcs(&rows, Some(&idx)), None).is_err(),
            "{ty}"
        );
    }
}
