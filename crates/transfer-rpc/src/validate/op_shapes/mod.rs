//! Per-op shape, type, stride and parameter rules for graphs that ggml's
//! CPU backend will run. ggml's kernels `GGML_ASSERT` / `GGML_ABORT` (abort
//! the whole process) or index outside a tensor's extent when a node does
//! not meet their preconditions; the wire carries shapes, strides and
//! op_params the client chose. So a backend accepts an allowlist of ops
//! (those llama.cpp's graphs and test-backend-ops use), each checked
//! against what its ggml-cpu forward kernel requires; every other op is
//! refused.
//!
//! [`RULES`] below is the index: every ggml op by number, and the function
//! holding its rule, one module per op family (`binary`, `unary`, `glu`,
//! `norm`, `matmul`, `reduce`, `view`, `shape`, `rows`, `rope`,
//! `attention`, `conv`, `pool`, `recurrent`, `train`, `misc`; what they
//! share is in `common`). [`check_node`] runs exactly that table.
//!
//! The rules cite the kernels of the llama.cpp that llama-cpp-sys-2
//! 0.1.161 vendors: `ggml/src/ggml-cpu/ops.cpp` (most ops),
//! `binary-ops.cpp`, `unary-ops.cpp`, `ggml-cpu.c` (MUL_MAT, the graph
//! plan) and `tiled/tiled.cpp` (K-quant MUL_MAT). Plain `assert()`s there
//! are compiled out (llama-cpp-sys builds Release / RelWithDebInfo, both
//! NDEBUG), but where a kernel indexes memory by the layout such an assert
//! describes, the layout is required here too. Besides the asserts, each
//! op's rule covers the layouts a kernel addresses differently from its
//! tensor's strides (rows walked as one flat run of `nb[1]` steps, rows
//! copied with `nb[1]` bytes): with those, strides of size-1 dimensions,
//! which `ggml_is_contiguous` ignores, decide where it writes.
//!
//! Fused kernels never run: the backend adds nodes with
//! `ggml_graph_add_node`, which records no use counts, so
//! `ggml_cpu_try_fuse_ops` (RMS_NORM + MUL) never matches.

mod attention;
mod binary;
mod common;
mod conv;
mod glu;
mod matmul;
mod misc;
mod norm;
mod pool;
mod recurrent;
mod reduce;
mod rope;
mod rows;
mod shape;
mod train;
mod unary;
mod view;

use common::*;
use rope::check_reads_past_extent;

pub use common::{
    MAX_CONV_TRANSPOSE_WORK, MAX_CROSS_ENTROPY_ROW, MAX_DELTA_NET_HEAD, MAX_FLASH_ATTN_HEAD,
    MAX_INDEXER_ROW, MAX_MUL_MAT_ID_MAP, MAX_OUT_PROD_F16_ROW, is_contiguous, is_contiguous_1,
};

/// A node's sources, as the rules take them.
type Sources<'a> = [Option<&'a RpcTensor>; MAX_SRC];

/// How a rule takes its node. The variants that name sources refuse a node
/// lacking one before the rule runs ("missing source 0", "needs two
/// sources", "needs three sources").
#[derive(Clone, Copy)]
enum Rule {
    /// Not on the compute allowlist.
    Refused,
    /// The result alone.
    Leaf(fn(&RpcTensor) -> Result<()>),
    /// The result and its sources, which the rule reads itself.
    Node(fn(&RpcTensor, &Sources) -> Result<()>),
    /// As `Node`, with the tensor the result is a view of.
    Viewed(fn(&RpcTensor, &Sources, Option<&RpcTensor>) -> Result<()>),
    /// The result and src0.
    Src0(fn(&RpcTensor, &RpcTensor) -> Result<()>),
    /// The result, src0 and src1.
    Src01(fn(&RpcTensor, &RpcTensor, &RpcTensor) -> Result<()>),
    /// The result, src0, src1 and src2.
    Src012(fn(&RpcTensor, &RpcTensor, &RpcTensor, &RpcTensor) -> Result<()>),
}

use Rule::{Leaf, Node, Refused, Src0, Src01, Src012, Viewed};

/// Every `enum ggml_op` value (ggml.h), in order (checked at compile time
/// below: row `i` is op `i`), with its rule. Every node passes
/// [`check_node`]'s common checks first.
#[rustfmt::skip]
const RULES: [(u32, Rule); GGML_OP_COUNT as usize] = [
    (OP_NONE,                    Leaf(view::check_none)),
    (OP_DUP,                     Node(view::check_copy)),
    (OP_ADD,                     Node(binary::check_binary)),
    (OP_ADD_ID,                  Node(binary::check_add_id)),
    (OP_ADD1,                    Node(binary::check_add1)),
    (OP_ACC,                     Node(binary::check_acc_set)),
    (OP_SUB,                     Node(binary::check_binary)),
    (OP_MUL,                     Node(binary::check_binary)),
    (OP_DIV,                     Node(binary::check_binary)),
    (OP_SQR,                     Src0(unary::check_sqr)),
    (OP_SQRT,                    Src0(unary::check_sqr)),
    (OP_LOG,                     Src0(unary::check_unary_op)),
    (OP_SIN,                     Src0(unary::check_unary_op)),
    (OP_COS,                     Src0(unary::check_unary_op)),
    (OP_SUM,                     Src0(reduce::check_sum)),
    (OP_SUM_ROWS,                Src0(reduce::check_sum_rows)),
    (OP_CUMSUM,                  Src0(reduce::check_cumsum)),
    (OP_MEAN,                    Src0(reduce::check_sum_rows)),
    (OP_ARGMAX,                  Src0(reduce::check_argmax)),
    (OP_COUNT_EQUAL,             Node(reduce::check_count_equal)),
    (OP_REPEAT,                  Src0(shape::check_repeat)),
    (OP_REPEAT_BACK,             Src0(train::check_repeat_back)),
    (OP_CONCAT,                  Node(shape::check_concat)),
    (OP_SILU_BACK,               Src01(train::check_silu_back)),
    (OP_NORM,                    Node(norm::check_norm)),
    (OP_RMS_NORM,                Node(norm::check_norm)),
    (OP_RMS_NORM_BACK,           Src01(train::check_rms_norm_back)),
    (OP_GROUP_NORM,              Src0(norm::check_group_norm)),
    (OP_L2_NORM,                 Src0(norm::check_l2_norm)),
    (OP_MUL_MAT,                 Node(matmul::check_mul_mat)),
    (OP_MUL_MAT_ID,              Node(matmul::check_mul_mat_id)),
    (OP_OUT_PROD,                Src01(matmul::check_out_prod)),
    (OP_SCALE,                   Node(unary::check_scale)),
    (OP_SET,                     Node(binary::check_acc_set)),
    (OP_CPY,                     Node(view::check_copy)),
    (OP_CONT,                    Node(view::check_copy)),
    (OP_RESHAPE,                 Viewed(view::check_reshape)),
    (OP_VIEW,                    Viewed(view::check_view)),
    (OP_PERMUTE,                 Viewed(view::check_view)),
    (OP_TRANSPOSE,               Viewed(view::check_view)),
    (OP_GET_ROWS,                Node(rows::check_get_rows)),
    (OP_GET_ROWS_BACK,           Src01(train::check_get_rows_back)),
    (OP_SET_ROWS,                Node(rows::check_set_rows)),
    (OP_DIAG,                    Src0(shape::check_diag)),
    (OP_DIAG_MASK_INF,           Src0(attention::check_diag_mask_inf)),
    // DIAG_MASK_INF's kernel with 0 instead of -INFINITY.
    (OP_DIAG_MASK_ZERO,          Src0(attention::check_diag_mask_inf)),
    (OP_SOFT_MAX,                Node(attention::check_soft_max)),
    (OP_SOFT_MAX_BACK,           Src01(train::check_soft_max_back)),
    (OP_ROPE,                    Node(rope::check_rope)),
    // ROPE's kernel with `forward = false` (only the sine flips).
    (OP_ROPE_BACK,               Node(rope::check_rope)),
    (OP_CLAMP,                   Src0(unary::check_clamp)),
    (OP_CONV_TRANSPOSE_1D,       Src01(conv::check_conv_transpose)),
    (OP_IM2COL,                  Src01(conv::check_im2col)),
    (OP_IM2COL_BACK,             Src01(train::check_im2col_back)),
    (OP_IM2COL_3D,               Src01(conv::check_im2col_3d)),
    (OP_COL2IM_1D,               Src0(conv::check_col2im_1d)),
    (OP_CONV_2D,                 Src01(conv::check_conv_direct)),
    (OP_CONV_3D,                 Src01(conv::check_conv_direct)),
    (OP_CONV_2D_DW,              Src01(conv::check_conv_2d_dw)),
    (OP_CONV_TRANSPOSE_2D,       Src01(conv::check_conv_transpose)),
    (OP_POOL_1D,                 Src0(pool::check_pool_1d)),
    (OP_POOL_2D,                 Src0(pool::check_pool_2d)),
    (OP_POOL_2D_BACK,            Src01(train::check_pool_2d_back)),
    (OP_UPSCALE,                 Src0(pool::check_upscale)),
    (OP_PAD,                     Src0(shape::check_pad)),
    (OP_PAD_REFLECT_1D,          Src0(shape::check_pad_reflect_1d)),
    (OP_ROLL,                    Src0(shape::check_roll)),
    (OP_ARANGE,                  Leaf(misc::check_arange)),
    (OP_TIMESTEP_EMBEDDING,      Src0(misc::check_timestep_embedding)),
    (OP_ARGSORT,                 Src0(reduce::check_sort)),
    (OP_TOP_K,                   Src0(reduce::check_sort)),
    (OP_LEAKY_RELU,              Src0(unary::check_leaky_relu)),
    (OP_TRI,                     Src0(shape::check_tri)),
    (OP_FILL,                    Src0(unary::check_fill)),
    (OP_FLASH_ATTN_EXT,          Node(attention::check_flash_attn_ext)),
    // No ggml-cpu kernel.
    (OP_FLASH_ATTN_BACK,         Refused),
    (OP_SSM_CONV,                Node(recurrent::check_ssm_conv)),
    (OP_SSM_SCAN,                Node(recurrent::check_ssm_scan)),
    (OP_WIN_PART,                Src0(attention::check_win_part)),
    (OP_WIN_UNPART,              Src0(attention::check_win_unpart)),
    (OP_GET_REL_POS,             Src0(attention::check_get_rel_pos)),
    (OP_ADD_REL_POS,             Src012(attention::check_add_rel_pos)),
    (OP_RWKV_WKV6,               Node(recurrent::check_linear_attn)),
    (OP_GATED_LINEAR_ATTN,       Node(recurrent::check_linear_attn)),
    (OP_RWKV_WKV7,               Node(recurrent::check_linear_attn)),
    (OP_SOLVE_TRI,               Src01(misc::check_solve_tri)),
    (OP_GATED_DELTA_NET,         Node(recurrent::check_gated_delta_net)),
    (OP_LIGHTNING_INDEXER,       Node(attention::check_lightning_indexer)),
    (OP_DSV4_HC_COMB,            Node(misc::check_dsv4_hc)),
    (OP_DSV4_HC_PRE,             Node(misc::check_dsv4_hc)),
    (OP_DSV4_HC_POST,            Node(misc::check_dsv4_hc)),
    (OP_UNARY,                   Node(unary::check_unary)),
    // The custom ops' op_params carry host function pointers.
    (OP_MAP_CUSTOM1,             Refused),
    (OP_MAP_CUSTOM2,             Refused),
    (OP_MAP_CUSTOM3,             Refused),
    (OP_CUSTOM,                  Refused),
    (OP_CROSS_ENTROPY_LOSS,      Src01(train::check_cross_entropy_loss)),
    (OP_CROSS_ENTROPY_LOSS_BACK, Src012(train::check_cross_entropy_loss_back)),
    (OP_OPT_STEP_ADAMW,          Node(train::check_opt_step)),
    (OP_OPT_STEP_SGD,            Node(train::check_opt_step)),
    (OP_GLU,                     Node(glu::check_glu)),
];

// Row i of RULES is op i, so the lookup by number cannot pick another row.
const _: () = {
    let mut i = 0;
    while i < RULES.len() {
        assert!(RULES[i].0 as usize == i, "RULES is out of order");
        i += 1;
    }
};

/// Checks every node of a validated graph against the allowlist.
pub fn check_graph_ops(g: &ValidatedGraph) -> Result<()> {
    for &n in &g.nodes {
        let mut srcs: [Option<&RpcTensor>; MAX_SRC] = [None; MAX_SRC];
        for (slot, s) in srcs.iter_mut().zip(g.srcs[n].iter()) {
            *slot = s.map(|i| &g.tensors[i]);
        }
        check_node(&g.tensors[n], &srcs, g.view_src[n].map(|i| &g.tensors[i]))?;
        check_reads_past_extent(g, n)?;
    }
    Ok(())
}

/// Checks one node against the builder rules of its op and the
/// preconditions of its ggml-cpu kernel: the row-size bound every computing
/// op shares, then its op's rule in [`RULES`].
pub fn check_node(
    r: &RpcTensor,
    s: &[Option<&RpcTensor>; MAX_SRC],
    view_src: Option<&RpcTensor>,
) -> Result<()> {
    let op = r.op;
    if op != GGML_OP_NONE && !is_view_op(op) {
        for t in std::iter::once(r).chain(s.iter().flatten().copied()) {
            if !fits_int(t) {
                return refuse(
                    op,
                    format!("a row of {} or {} rows exceed 2^31 - 1", t.ne[0], nrows(t)),
                );
            }
        }
    }
    check_rule(r, s, view_src).unwrap_or_else(|| refuse(op, "not on the compute allowlist"))
}

/// Runs the rule [`RULES`] gives the node's op; `None` for an op it
/// refuses or does not know.
fn check_rule(
    r: &RpcTensor,
    s: &[Option<&RpcTensor>; MAX_SRC],
    view_src: Option<&RpcTensor>,
) -> Option<Result<()>> {
    let op = r.op;
    let (_, rule) = RULES.get(usize::try_from(op).ok()?)?;
    Some(match *rule {
        Refused => return None,
        Leaf(f) => f(r),
        Node(f) => f(r, s),
        Viewed(f) => f(r, s, view_src),
        Src0(f) => match s[0] {
            Some(a) => f(r, a),
            None => refuse(op, "missing source 0"),
        },
        Src01(f) => match (s[0], s[1]) {
            (Some(a), Some(b)) => f(r, a, b),
            _ => refuse(op, "needs two sources"),
        },
        Src012(f) => match (s[0], s[1], s[2]) {
            (Some(a), Some(b), Some(c)) => f(r, a, b, c),
            _ => refuse(op, "needs three sources"),
        },
    })
}

#[cfg(test)]
mod table_tests {
    use super::*;
    use crate::validate::ops;

    /// The ops `ops.rs` names (what `graph.rs` checks) sit at their own
    /// rows, and only FLASH_ATTN_BACK (no ggml-cpu kernel) and the custom
    /// ops (host function pointers) are refused.
    #[test]
    fn rule_table_rows_and_refusals() {
        for op in [
            ops::GGML_OP_NONE,
            ops::GGML_OP_ADD_ID,
            ops::GGML_OP_MUL_MAT_ID,
            ops::GGML_OP_RESHAPE,
            ops::GGML_OP_TRANSPOSE,
            ops::GGML_OP_GET_ROWS_BACK,
            ops::GGML_OP_SET_ROWS,
            ops::GGML_OP_SSM_SCAN,
            ops::GGML_OP_UNARY,
            ops::GGML_OP_CUSTOM,
            ops::GGML_OP_GLU,
        ] {
            assert_eq!(RULES[op as usize].0, op);
        }
        let refused: Vec<u32> = RULES
            .iter()
            .filter(|(_, r)| matches!(r, Refused))
            .map(|(op, _)| *op)
            .collect();
        assert_eq!(
            refused,
            [
                OP_FLASH_ATTN_BACK,
                OP_MAP_CUSTOM1,
                OP_MAP_CUSTOM2,
                OP_MAP_CUSTOM3,
                OP_CUSTOM
            ]
        );
        assert!(
            refused
                .iter()
                .all(|&op| op == OP_FLASH_ATTN_BACK || ops::is_custom(op))
        );
    }
}

#[cfg(test)]
mod tests {
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
}

#[cfg(test)]
mod ext_tests {
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
}
