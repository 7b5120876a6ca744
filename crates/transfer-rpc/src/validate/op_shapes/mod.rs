//! Per-op shape, type, stride and parameter rules for graphs that ggml's
//! CPU backend will run. ggml's kernels `GGML_ASSERT` / `GGML_ABORT` (abort
//! the whole process) or index outside a tensor's extent when a node does
//! not meet their preconditions; the wire carries shapes, strides and
//! op_params the client chose. So a backend accepts an allowlist of ops
//! (those llama.cpp's graphs and test-backend-ops use), each checked
//! against what its ggml-cpu forward kernel requires; every other op is
//! refused.
//!
//! `RULES` below is the index: every ggml op by number, and the function
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
//! One fused kernel runs: the backend records each node's use count as
//! upstream's server does (`ggml_backend.rs`, `set_use_counts`), so
//! `ggml_cpu_try_fuse_ops` runs an RMS_NORM whose one consumer is the next
//! node, a MUL, as `rms_norm_mul_fused`. It needs nothing these rules do
//! not already hold: it reads the RMS_NORM's source as `check_norm`
//! requires it (F32, packed rows, eps >= 0), writes the MUL's result rows
//! packed (`check_binary`), and reads the MUL's other operand only where
//! ggml checked it itself (F32, `nb[0]` of 4, `ne[0]` of the norm's),
//! rows `i % ne[1..]` inside its extent; ggml fuses only when the MUL has
//! the RMS_NORM's shape.

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
/// op shares, then its op's rule in `RULES`.
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

/// Runs the rule `RULES` gives the node's op; `None` for an op it
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
mod tests;

#[cfg(test)]
mod ext_tests;
