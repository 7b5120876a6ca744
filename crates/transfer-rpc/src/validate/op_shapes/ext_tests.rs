use super::*;
use crate::validate::types::type_info;

fn packed(ty: u32, ne: [u32; 4]) -> RpcTensor {
    let (bs, ts) = type_info(ty).map_or((1, 4), |i| (i.block_size, i.type_size));
    let row = (u64::from(ne[0]) / bs * ts) as u32;
    RpcTensor {
        ty,
        ne,
        nb: [ts as u32, row, row * ne[1], row * ne[1] * ne[2]],
        ..RpcTensor::default()
    }
}

fn node(ty: u32, ne: [u32; 4], op: u32) -> RpcTensor {
    let mut r = packed(ty, ne);
    r.op = op;
    r
}

fn run(r: &RpcTensor, srcs: &[&RpcTensor]) -> bool {
    let mut s = [None; MAX_SRC];
    for (slot, t) in s.iter_mut().zip(srcs) {
        *slot = Some(*t);
    }
    matches!(check_rule(r, &s, None), Some(Ok(())))
}

#[test]
fn mul_mat_id_shapes_types_and_map_bound() {
    let ok = |a_ty: u32, b_ty: u32, b_ne1: u32, n_as: u32, tokens: u32| {
        let a = packed(a_ty, [256, 16, n_as, 1]);
        let b = packed(b_ty, [256, b_ne1, tokens, 1]);
        let ids = packed(GGML_TYPE_I32, [4, tokens, 1, 1]);
        let r = node(GGML_TYPE_F32, [16, 4, tokens, 1], OP_MUL_MAT_ID);
        run(&r, &[&a, &b, &ids])
    };
    assert!(ok(GGML_TYPE_F32, GGML_TYPE_F32, 4, 8, 3));
    assert!(ok(GGML_TYPE_F16, GGML_TYPE_F32, 1, 8, 3));
    assert!(ok(GGML_TYPE_F16, GGML_TYPE_F16, 4, 8, 3));
    assert!(ok(8, 8, 4, 8, 3)); // q8_0 x q8_0
    // F16 src1 for F32 experts: GGML_ASSERT(src1->type == F32).
    assert!(!ok(GGML_TYPE_F32, GGML_TYPE_F16, 4, 8, 3));
    assert!(!ok(GGML_TYPE_BF16, GGML_TYPE_F16, 4, 8, 3));
    // ids.ne0 % b.ne1.
    assert!(!ok(GGML_TYPE_F32, GGML_TYPE_F32, 3, 8, 3));
    assert!(!ok(9, GGML_TYPE_F32, 4, 8, 3)); // q8_1: no vec_dot
    // 2^20 experts x 4 x 2^13 tokens: a 256 GiB row map.
    let a = packed(GGML_TYPE_F32, [1, 1, 1 << 20, 1]);
    let b = packed(GGML_TYPE_F32, [1, 4, 1 << 13, 1]);
    let ids = packed(GGML_TYPE_I32, [4, 1 << 13, 1, 1]);
    let r = node(GGML_TYPE_F32, [1, 4, 1 << 13, 1], OP_MUL_MAT_ID);
    assert!(!run(&r, &[&a, &b, &ids]));
}

#[test]
fn add_id_shapes() {
    let a = packed(GGML_TYPE_F32, [32, 4, 3, 1]);
    let b = packed(GGML_TYPE_F32, [32, 8, 1, 1]);
    let ids = packed(GGML_TYPE_I32, [4, 3, 1, 1]);
    let r = node(GGML_TYPE_F32, [32, 4, 3, 1], OP_ADD_ID);
    assert!(run(&r, &[&a, &b, &ids]));
    let short_ids = packed(GGML_TYPE_I32, [4, 2, 1, 1]);
    assert!(!run(&r, &[&a, &b, &short_ids]));
    let f16 = packed(GGML_TYPE_F16, [32, 8, 1, 1]);
    assert!(!run(&r, &[&a, &f16, &ids]));
}

#[test]
fn acc_and_set_views_end_inside_dst() {
    let a = packed(GGML_TYPE_F32, [8, 4, 1, 1]);
    let b = packed(GGML_TYPE_F32, [4, 2, 1, 1]);
    let view = |op: u32, ty: u32, nb1: i32, offset: i32| {
        let a = packed(ty, a.ne);
        let b = packed(ty, b.ne);
        let mut r = node(ty, [8, 4, 1, 1], op);
        r.op_params[..4].copy_from_slice(&[nb1, 32 * 4, 32 * 4, offset]);
        run(&r, &[&a, &b])
    };
    assert!(view(OP_ACC, GGML_TYPE_F32, 32, 0));
    assert!(view(OP_SET, GGML_TYPE_I32, 32, 16));
    // Last element starts at 16 + 4 * 3 + 96 = 124 < 128: ends at 128.
    assert!(view(OP_SET, GGML_TYPE_F32, 96, 16));
    // Starts at 125 (passes `<= nbytes`), ends past dst.
    assert!(!view(OP_SET, GGML_TYPE_F32, 96, 17));
    assert!(!view(OP_ACC, GGML_TYPE_F32, -32, 128));
    assert!(!view(OP_ACC, GGML_TYPE_I32, 32, 0));
    assert!(!view(OP_SET, GGML_TYPE_F16, 32, 0));
}

#[test]
fn reductions_sorts_and_shapes() {
    let a = packed(GGML_TYPE_F32, [16, 4, 3, 1]);
    assert!(run(&node(GGML_TYPE_F32, [1, 1, 1, 1], OP_SUM), &[&a]));
    assert!(!run(&node(GGML_TYPE_F32, [2, 1, 1, 1], OP_SUM), &[&a]));
    assert!(run(&node(GGML_TYPE_F32, [1, 4, 3, 1], OP_SUM_ROWS), &[&a]));
    assert!(run(&node(GGML_TYPE_F32, [1, 4, 3, 1], OP_MEAN), &[&a]));
    assert!(!run(&node(GGML_TYPE_F32, [1, 4, 2, 1], OP_MEAN), &[&a]));
    let m = packed(GGML_TYPE_F32, [16, 4, 1, 1]);
    assert!(run(&node(GGML_TYPE_I32, [4, 1, 1, 1], OP_ARGMAX), &[&m]));
    assert!(!run(&node(GGML_TYPE_I32, [4, 1, 1, 1], OP_ARGMAX), &[&a]));
    let mut sort = node(GGML_TYPE_I32, [16, 4, 3, 1], OP_ARGSORT);
    assert!(run(&sort, &[&a]));
    sort.op_params[0] = 2;
    assert!(!run(&sort, &[&a]));
    assert!(run(&node(GGML_TYPE_I32, [5, 4, 3, 1], OP_TOP_K), &[&a]));
    assert!(!run(&node(GGML_TYPE_I32, [17, 4, 3, 1], OP_TOP_K), &[&a]));
    // Rows walked as one run: dim 2 not packed after dim 1.
    let mut gap = node(GGML_TYPE_I32, [16, 4, 3, 1], OP_ARGSORT);
    gap.nb[2] *= 2;
    gap.nb[3] *= 2;
    assert!(!run(&gap, &[&a]));
}

#[test]
fn concat_repeat_pad_rules() {
    let a = packed(GGML_TYPE_F32, [8, 4, 3, 1]);
    let b = packed(GGML_TYPE_F32, [8, 2, 3, 1]);
    let mut r = node(GGML_TYPE_F32, [8, 6, 3, 1], OP_CONCAT);
    r.op_params[0] = 1;
    assert!(run(&r, &[&a, &b]));
    r.op_params[0] = 4;
    assert!(!run(&r, &[&a, &b]));
    r.op_params[0] = 0;
    assert!(!run(&r, &[&a, &b]));
    assert!(run(&node(GGML_TYPE_F32, [16, 8, 3, 2], OP_REPEAT), &[&a]));
    assert!(!run(&node(GGML_TYPE_F32, [12, 8, 3, 2], OP_REPEAT), &[&a]));
    let q = packed(8, [64, 2, 1, 1]);
    assert!(!run(&node(8, [64, 4, 1, 1], OP_REPEAT), &[&q]));
    let pad = |params: [i32; 9], ne: [u32; 4]| {
        let mut r = node(GGML_TYPE_F32, ne, OP_PAD);
        r.op_params[..9].copy_from_slice(&params);
        run(&r, &[&a])
    };
    assert!(pad([1, 2, 0, 1, 0, 0, 0, 0, 0], [11, 5, 3, 1]));
    assert!(pad([1, 2, 0, 1, 0, 0, 0, 0, 1], [11, 5, 3, 1]));
    // Negative pads crop.
    assert!(pad([-1, 4, 0, 1, 0, 0, 0, 0, 0], [11, 5, 3, 1]));
    assert!(pad([-2, -1, 0, 0, 0, 0, 0, 0, 1], [5, 4, 3, 1]));
    assert!(!pad([9, 0, 0, 0, 0, 0, 0, 0, 1], [17, 4, 3, 1]));
    assert!(!pad([1, 2, 0, 1, 0, 0, 0, 0, 0], [12, 5, 3, 1]));
}

#[test]
fn element_wise_ops() {
    let a = packed(GGML_TYPE_F16, [8, 4, 1, 1]);
    assert!(run(&node(GGML_TYPE_F16, [8, 4, 1, 1], OP_SQR), &[&a]));
    assert!(run(&node(GGML_TYPE_F32, [8, 4, 1, 1], OP_SQRT), &[&a]));
    assert!(!run(&node(GGML_TYPE_BF16, [8, 4, 1, 1], OP_SQRT), &[&a]));
    assert!(run(&node(GGML_TYPE_F16, [8, 4, 1, 1], OP_CLAMP), &[&a]));
    let b = packed(GGML_TYPE_BF16, [8, 4, 1, 1]);
    assert!(!run(&node(GGML_TYPE_BF16, [8, 4, 1, 1], OP_CLAMP), &[&b]));
    let f = packed(GGML_TYPE_F32, [8, 4, 1, 1]);
    let mut l2 = node(GGML_TYPE_F32, [8, 4, 1, 1], OP_L2_NORM);
    assert!(run(&l2, &[&f]));
    l2.op_params[0] = f32::NAN.to_bits() as i32;
    assert!(!run(&l2, &[&f]));
    let mut mask = node(GGML_TYPE_F32, [8, 4, 1, 1], OP_DIAG_MASK_INF);
    mask.data = 4096;
    assert!(run(&mask, &[&f]));
    mask.op_params[0] = -1;
    assert!(!run(&mask, &[&f]));
    // dims 2, 3 walked by nb2: nb3 must follow.
    let g = packed(GGML_TYPE_F32, [8, 4, 1, 3]);
    let mut m = node(GGML_TYPE_F32, [8, 4, 1, 3], OP_DIAG_MASK_INF);
    m.nb[2] = 1 << 20;
    assert!(!run(&m, &[&g]));
}
