//! The op rules of issue 11 (coverage) over a real server computing on
//! ggml's CPU backend (run with `--features ggml`), in the pattern of
//! `validator_crashes.rs`: each graph here passes the wire checks but
//! would make a ggml-cpu kernel abort the process (GGML_ASSERT /
//! GGML_ABORT, a null function pointer, a division by zero) or touch
//! memory outside its tensors (tensors sit at the end of their buffer, so
//! a write or read past them faults on the guard page). Each must be
//! refused: that connection closes, the server keeps serving and computes
//! a valid graph afterwards. Next to the refusals, valid forms of the same
//! ops compute (the rules may not refuse what ggml computes; the
//! differential test checks their values against ggml-cpu).
#![cfg(feature = "ggml")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::crash_harness::*;
use common::*;
use transfer_rpc::client::Client;
use transfer_rpc::protocol::{GraphPayload, RpcTensor};
use transfer_rpc::server::ServerHandle;

const F32: u32 = 0;
const F16: u32 = 1;
const Q8_0: u32 = 8;
const Q8_1: u32 = 9;
const Q4_K: u32 = 12;
const Q8_K: u32 = 15;
const IQ2_XXS: u32 = 16;
const I16: u32 = 25;
const I32: u32 = 26;
const I64: u32 = 27;
const BF16: u32 = 30;

const OP_DUP: u32 = 1;
const OP_MUL_MAT: u32 = 29;
const OP_CPY: u32 = 34;
const OP_CONT: u32 = 35;
const OP_SET_ROWS: u32 = 42;
const OP_SOFT_MAX: u32 = 46;
const OP_ROPE: u32 = 48;
const OP_FLASH_ATTN_EXT: u32 = 74;

/// A copy node `op` of `a` into `r` (for CPY, `r` is also the
/// destination source, as ggml_cpy's view of it).
fn copy_graph(op: u32, a: RpcTensor, r: RpcTensor) -> GraphPayload {
    if op == OP_CPY {
        let mut dst = r.clone();
        dst.id = 90;
        let r = node(r, op, &[a.id, 90]);
        one_node(vec![a, dst, r])
    } else {
        let r = node(r, op, &[a.id]);
        one_node(vec![a, r])
    }
}

#[test]
fn copies_refuse_the_paths_that_abort_or_overrun() {
    let h = start_ggml();
    // dup_bytes, a Q8_0 source with dims 1 and 2 swapped into a
    // contiguous result of another shape: the row path copies ne00 *
    // type_size = 64 blocks per row of 2: 13 KiB into 408 bytes at the
    // buffer's end.
    refused(&h, "Q8_0 copy by rows of the wrong size", |b, base| {
        let a = tensor(1, Q8_0, [64, 3, 2, 1], [34, 136, 68, 408], b, base, 0);
        copy_graph(OP_CONT, a, at_end(2, Q8_0, [64, 6, 1, 1], b, base))
    });
    // dup_to_q to I32 from F16: a from_float exists, but the plan sizes no
    // work buffer for it (null wdata).
    refused(&h, "F16 to I32", |b, base| {
        let a = packed(1, F16, [64, 2, 1, 1], b, base, 0);
        copy_graph(OP_CPY, a, packed(2, I32, [64, 2, 1, 1], b, base, 4096))
    });
    // dup_to_q converts each 256-element source row into a work buffer
    // the plan sized by the result's 32-element rows.
    refused(&h, "quantizing rows longer than the result's", |b, base| {
        let a = packed(1, F32, [256, 1, 1, 1], b, base, 0);
        copy_graph(OP_CPY, a, packed(2, Q8_0, [32, 8, 1, 1], b, base, 4096))
    });
    // dup_to_q: iq2_xxs has no from_float: GGML_ABORT("not implemented").
    refused(&h, "F32 to IQ2_XXS", |b, base| {
        let a = packed(1, F32, [256, 1, 1, 1], b, base, 0);
        copy_graph(OP_DUP, a, packed(2, IQ2_XXS, [256, 1, 1, 1], b, base, 4096))
    });
    // dup_from_q reads src1, which DUP does not have (null dereference).
    refused(&h, "DUP of Q8_0 into F32", |b, base| {
        let a = packed(1, Q8_0, [64, 2, 1, 1], b, base, 0);
        copy_graph(OP_DUP, a, packed(2, F32, [64, 2, 1, 1], b, base, 4096))
    });
    // Quantized to anything but F32 or itself, I32 to F16, I64 to F32:
    // GGML_ABORT("fatal error") / ("not implemented").
    for (from, to, ne0) in [(Q8_0, F16, 64), (I32, F16, 64), (I64, F32, 64)] {
        refused(&h, &format!("copy {from} to {to}"), |b, base| {
            let a = packed(1, from, [ne0, 2, 1, 1], b, base, 0);
            copy_graph(OP_CPY, a, packed(2, to, [ne0, 2, 1, 1], b, base, 4096))
        });
    }
    // q8_1 has no to_float: dequantizing it calls a null pointer.
    refused(&h, "Q8_1 to F32", |b, base| {
        let a = packed(1, Q8_1, [64, 2, 1, 1], b, base, 0);
        copy_graph(OP_CPY, a, packed(2, F32, [64, 2, 1, 1], b, base, 4096))
    });

    let (mut c, b, base) = session(&h);
    // The same shapes computed by ggml: Q8_0 copied by rows (same shape),
    // F32 -> Q8_0 -> F32, F32 <-> I32, I16 transposed.
    let q_perm = tensor(1, Q8_0, [64, 3, 2, 1], [34, 136, 68, 408], b, base, 0);
    computes(
        &mut c,
        "Q8_0 by rows",
        &copy_graph(OP_CONT, q_perm, at_end(2, Q8_0, [64, 3, 2, 1], b, base)),
    );
    let x: Vec<f32> = (0..64).map(|i| i as f32 - 32.0).collect();
    let a = packed(1, F32, [64, 1, 1, 1], b, base, 0);
    c.set_tensor(&a, 0, &f32_bytes(&x)).unwrap();
    let q = packed(2, Q8_0, [64, 1, 1, 1], b, base, 1024);
    computes(&mut c, "F32 to Q8_0", &copy_graph(OP_CPY, a, q.clone()));
    let back = packed(3, F32, [64, 1, 1, 1], b, base, 2048);
    computes(&mut c, "Q8_0 to F32", &copy_graph(OP_CPY, q, back.clone()));
    let got = read(&mut c, &back, 64);
    assert!(
        got.iter().zip(&x).all(|(g, w)| (g - w).abs() < 0.2),
        "{got:?}"
    );
    let i = packed(4, I32, [64, 1, 1, 1], b, base, 4096);
    let a = packed(1, F32, [64, 1, 1, 1], b, base, 0);
    computes(&mut c, "F32 to I32", &copy_graph(OP_CPY, a, i.clone()));
    let f = packed(5, F32, [64, 1, 1, 1], b, base, 8192);
    computes(&mut c, "I32 to F32", &copy_graph(OP_CPY, i, f.clone()));
    assert_eq!(read(&mut c, &f, 64), x);
    let t = tensor(6, I16, [3, 4, 1, 1], [8, 2, 24, 24], b, base, 12288);
    computes(
        &mut c,
        "I16 transposed",
        &copy_graph(OP_CONT, t, packed(7, I16, [3, 4, 1, 1], b, base, 16384)),
    );
}

/// MUL_MAT of a Q4_K [256, 16] matrix by Q8_K activations `x` into a
/// packed F32 result.
fn q4k_by_q8k(x: RpcTensor, b: u64, base: u64) -> GraphPayload {
    let w = packed(1, Q4_K, [256, 16, 1, 1], b, base, 0);
    let ne = [16, x.ne[1], x.ne[2], x.ne[3]];
    let r = node(packed(3, F32, ne, b, base, 8192), OP_MUL_MAT, &[1, x.id]);
    one_node(vec![w, x, r])
}

#[test]
fn mul_mat_src1_types_and_tiled_rows() {
    let h = start_ggml();
    // BF16 weights by F16 activations: the kernel widens a src1 that is
    // not its vec_dot type only for an F32 vec_dot type
    // (GGML_ASSERT(!widen || vec_dot_type == GGML_TYPE_F32)).
    refused(&h, "BF16 x F16", |b, base| {
        let w = packed(1, BF16, [64, 4, 1, 1], b, base, 0);
        let x = packed(2, F16, [64, 2, 1, 1], b, base, 1024);
        let r = node(
            packed(3, F32, [4, 2, 1, 1], b, base, 2048),
            OP_MUL_MAT,
            &[1, 2],
        );
        one_node(vec![w, x, r])
    });
    // The tiled Q4_K driver (8 or more src1 rows) reads a Q8_K src1 at
    // flat row * nb[1]: 16 rows of 292 bytes from a [256, 8, 2] src1
    // whose batches overlap (nb[2] = nb[1]) and that ends at the buffer's
    // end: 7 rows past it.
    refused(&h, "Q4_K x Q8_K with rows not nb[1] apart", |b, base| {
        let x = tensor(
            2,
            Q8_K,
            [256, 8, 2, 1],
            [292, 292, 292, 584],
            b,
            base,
            BUF - 2628,
        );
        q4k_by_q8k(x, b, base)
    });

    let (mut c, b, base) = session(&h);
    // Packed Q8_K activations (zeros: d = 0) are multiplied.
    let x = at_end(2, Q8_K, [256, 8, 2, 1], b, base);
    computes(&mut c, "Q4_K x Q8_K", &q4k_by_q8k(x, b, base));
    for (ta, tb) in [(F16, F16), (BF16, BF16), (F32, BF16)] {
        let w = packed(1, ta, [64, 4, 1, 1], b, base, 0);
        let x = packed(2, tb, [64, 2, 1, 1], b, base, 1024);
        let r = node(
            packed(3, F32, [4, 2, 1, 1], b, base, 2048),
            OP_MUL_MAT,
            &[1, 2],
        );
        computes(&mut c, "mul_mat", &one_node(vec![w, x, r]));
    }
}

/// ROPE `mode` of an F32 [64, 2, 3] source with `n_dims`, `sections`,
/// `n_pos` positions (at the buffer's end) into a packed result.
fn rope_graph(
    mode: i32,
    n_dims: i32,
    sections: [i32; 4],
    n_pos: u32,
    b: u64,
    base: u64,
) -> GraphPayload {
    let a = packed(1, F32, [64, 2, 3, 1], b, base, 0);
    let pos = at_end(2, I32, [n_pos, 1, 1, 1], b, base);
    let mut r = node(
        packed(3, F32, [64, 2, 3, 1], b, base, 4096),
        OP_ROPE,
        &[1, 2],
    );
    r.op_params[1] = n_dims;
    r.op_params[2] = mode;
    r.op_params[4] = 4096;
    set_f32(&mut r, 5, 10000.0);
    set_f32(&mut r, 6, 1.0);
    set_f32(&mut r, 8, 1.0);
    set_f32(&mut r, 9, 32.0);
    set_f32(&mut r, 10, 1.0);
    r.op_params[11..15].copy_from_slice(&sections);
    one_node(vec![a, pos, r])
}

#[test]
fn rope_multi_modes_sections_and_positions() {
    let h = start_ggml();
    // The kernel's switch: GGML_ABORT("rope type not supported").
    refused(&h, "rope mode 10", |b, base| {
        rope_graph(10, 64, [16, 8, 8, 0], 12, b, base)
    });
    // GGML_ASSERT(sections[0] > 0 || sections[1] > 0 || sections[2] > 0).
    refused(&h, "mrope without sections", |b, base| {
        rope_graph(8, 64, [0, 0, 0, 8], 12, b, base)
    });
    // sect_dims = 0: `(i0 / 2) % sect_dims` divides by zero.
    refused(&h, "mrope sections summing to 0", |b, base| {
        rope_graph(8, 64, [16, -16, 0, 0], 12, b, base)
    });
    // GGML_ASSERT(sect_dims <= ne0).
    refused(&h, "mrope sections past the row", |b, base| {
        rope_graph(40, 64, [32, 32, 8, 0], 12, b, base)
    });
    // GGML_ASSERT(n_dims == ne0 / 2) for vision.
    refused(&h, "vision rope n_dims", |b, base| {
        rope_graph(24, 64, [8, 8, 0, 0], 12, b, base)
    });
    // Multi-rope reads pos[i2 + 3 * ne2]: 12 positions from 3 at the
    // buffer's end.
    refused(&h, "mrope with one position per token", |b, base| {
        rope_graph(8, 64, [16, 8, 8, 0], 3, b, base)
    });

    let (mut c, b, base) = session(&h);
    for (mode, n_dims, sections) in [
        (8, 64, [16, 8, 8, 0]),
        (40, 32, [11, 11, 10, 0]),
        (24, 32, [8, 8, 0, 0]),
    ] {
        computes(
            &mut c,
            &format!("rope mode {mode}"),
            &rope_graph(mode, n_dims, sections, 12, b, base),
        );
    }
}

/// SOFT_MAX of an F32 [16, 4, 8] source with `sinks` (at the buffer's end).
fn soft_max_sinks(ty: u32, n: u32, b: u64, base: u64) -> GraphPayload {
    let a = packed(1, F32, [16, 4, 8, 1], b, base, 0);
    let s = at_end(2, ty, [n, 1, 1, 1], b, base);
    let mut r = node(
        packed(3, F32, [16, 4, 8, 1], b, base, 4096),
        OP_SOFT_MAX,
        &[1, 0, 2],
    );
    set_f32(&mut r, 0, 1.0);
    one_node(vec![a, s, r])
}

/// FLASH_ATTN_EXT of one F32 query per head (4 heads) over 8 keys of
/// `kv_ty` (2 KV heads), with `n_sinks` F32 sinks at the buffer's end.
fn flash_attn(kv_ty: u32, n_sinks: u32, b: u64, base: u64) -> GraphPayload {
    let q = packed(1, F32, [64, 1, 4, 1], b, base, 0);
    let k = packed(2, kv_ty, [64, 8, 2, 1], b, base, 4096);
    let v = packed(3, kv_ty, [64, 8, 2, 1], b, base, 12288);
    let mut tensors = vec![q, k, v];
    let mut srcs = vec![1, 2, 3, 0];
    if n_sinks > 0 {
        tensors.push(at_end(4, F32, [n_sinks, 1, 1, 1], b, base));
        srcs.push(4);
    }
    let mut r = node(
        packed(5, F32, [64, 4, 1, 1], b, base, 20480),
        OP_FLASH_ATTN_EXT,
        &srcs,
    );
    set_f32(&mut r, 0, 0.125);
    tensors.push(r);
    one_node(tensors)
}

#[test]
fn sinks_and_attention_types() {
    let h = start_ggml();
    // sk[i02] for 8 heads: 2 sinks at the buffer's end are read past it.
    refused(&h, "soft_max with 2 sinks for 8 heads", |b, base| {
        soft_max_sinks(F32, 2, b, base)
    });
    refused(&h, "soft_max with F16 sinks", |b, base| {
        soft_max_sinks(F16, 8, b, base)
    });
    refused(&h, "flash_attn_ext with 1 sink for 4 heads", |b, base| {
        flash_attn(F16, 1, b, base)
    });
    // q8_1 K: type_traits_cpu gives it no vec_dot (a null call); Q8_0's
    // from_float exists, so no assert stops it.
    refused(&h, "flash_attn_ext with Q8_1 K/V", |b, base| {
        flash_attn(Q8_1, 0, b, base)
    });

    let (mut c, b, base) = session(&h);
    computes(&mut c, "soft_max sinks", &soft_max_sinks(F32, 8, b, base));
    for ty in [F16, F32, BF16, Q8_0] {
        computes(
            &mut c,
            &format!("flash_attn_ext {ty} with sinks"),
            &flash_attn(ty, 4, b, base),
        );
    }
}

/// SET_ROWS of 2 F32 rows of 256 into a `ty` destination of 4 rows at the
/// buffer's end, I64 indices [0, 3].
fn set_rows(ty: u32, c: &mut Client, b: u64, base: u64) -> GraphPayload {
    let rows = packed(1, F32, [256, 2, 1, 1], b, base, 0);
    let idx = packed(2, I64, [2, 1, 1, 1], b, base, 4096);
    let bytes: Vec<u8> = [0i64, 3].iter().flat_map(|v| v.to_le_bytes()).collect();
    c.set_tensor(&idx, 0, &bytes).unwrap();
    let dst = at_end(3, ty, [256, 4, 1, 1], b, base);
    let mut r = node(dst.clone(), OP_SET_ROWS, &[1, 2, 3]);
    r.id = 4;
    r.view_src = 3;
    one_node(vec![rows, idx, dst, r])
}

#[test]
fn set_rows_destinations_need_a_from_float() {
    let h = start_ggml();
    // I16 rows: type_traits_cpu has no from_float (a null call).
    let before = h.shared().refused_connections();
    let (mut c, b, base) = session(&h);
    let g = set_rows(I16, &mut c, b, base);
    c.graph_compute(&g).unwrap();
    assert!(is_closed(&mut c), "SET_ROWS into I16 was not refused");
    wait_refused(&h, before + 1);
    server_still_computes(&h);

    let (mut c, b, base) = session(&h);
    for ty in [Q8_0, Q4_K, BF16, I32] {
        let g = set_rows(ty, &mut c, b, base);
        computes(&mut c, &format!("set_rows into {ty}"), &g);
    }
}

const OP_ADD_ID: u32 = 3;
const OP_ACC: u32 = 5;
const OP_SQR: u32 = 9;
const OP_SUM_ROWS: u32 = 15;
const OP_ARGMAX: u32 = 18;
const OP_REPEAT: u32 = 20;
const OP_CONCAT: u32 = 22;
const OP_L2_NORM: u32 = 28;
const OP_MUL_MAT_ID: u32 = 30;
const OP_SET: u32 = 33;
const OP_DIAG_MASK_INF: u32 = 44;
const OP_CLAMP: u32 = 50;
const OP_PAD: u32 = 64;
const OP_ARGSORT: u32 = 69;
const OP_TOP_K: u32 = 70;

fn i32_bytes(vals: &[i32]) -> Vec<u8> {
    vals.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// MUL_MAT_ID of 4 F32 experts [16, 8] (ending at the buffer's end: an
/// expert id of 4 or more reads past it) by [16, 2, 3] activations with
/// I32 ids [2, 3] at 4096 (written: `ids`), into [8, 2, 3] at 8192.
fn moe(c: &mut Client, ids: &[i32], b: u64, base: u64) -> GraphPayload {
    let experts = at_end(1, F32, [16, 8, 4, 1], b, base);
    let x = packed(2, F32, [16, 2, 3, 1], b, base, 0);
    let idx = packed(3, I32, [2, 3, 1, 1], b, base, 4096);
    c.set_tensor(&idx, 0, &i32_bytes(ids)).unwrap();
    let r = node(
        packed(4, F32, [8, 2, 3, 1], b, base, 8192),
        OP_MUL_MAT_ID,
        &[1, 2, 3],
    );
    one_node(vec![experts, x, idx, r])
}

/// Sends `g` on a fresh session (set up by `prepare`): refused, server alive.
fn refused_with(
    h: &ServerHandle,
    what: &str,
    prepare: impl FnOnce(&mut Client, u64, u64) -> GraphPayload,
) {
    let before = h.shared().refused_connections();
    let (mut c, b, base) = session(h);
    let g = prepare(&mut c, b, base);
    c.graph_compute(&g).unwrap();
    assert!(is_closed(&mut c), "{what}: was not refused");
    wait_refused(h, before + 1);
    server_still_computes(h);
}

#[test]
fn expert_ids_are_checked_on_every_run() {
    let h = start_ggml();
    for bad in [4, -1, i32::MAX] {
        refused_with(&h, &format!("expert id {bad}"), |c, b, base| {
            moe(c, &[0, 1, 2, bad, 3, 0], b, base)
        });
    }
    // ADD_ID of a bias row past the 5 of src1 (at the buffer's end).
    refused_with(&h, "add_id bias row 5 of 5", |c, b, base| {
        let a = packed(1, F32, [8, 2, 3, 1], b, base, 0);
        let bias = at_end(2, F32, [8, 5, 1, 1], b, base);
        let idx = packed(3, I32, [2, 3, 1, 1], b, base, 4096);
        c.set_tensor(&idx, 0, &i32_bytes(&[0, 1, 2, 3, 4, 5]))
            .unwrap();
        let r = node(
            packed(4, F32, [8, 2, 3, 1], b, base, 8192),
            OP_ADD_ID,
            &[1, 2, 3],
        );
        one_node(vec![a, bias, idx, r])
    });

    // Valid ids compute, then another session rewrites them between
    // GRAPH_COMPUTE and GRAPH_RECOMPUTE: the recompute is refused.
    let before = h.shared().refused_connections();
    let (mut c, b, base) = session(&h);
    let g = moe(&mut c, &[0, 1, 2, 3, 3, 0], b, base);
    computes(&mut c, "mul_mat_id", &g);
    let mut other = connect(&h);
    other
        .set_tensor(&g.tensors[2], 0, &i32_bytes(&[0, 1, 2, 9, 3, 0]))
        .unwrap();
    assert_eq!(
        other.get_tensor(&g.tensors[2], 0, 24).unwrap(),
        i32_bytes(&[0, 1, 2, 9, 3, 0])
    );
    c.graph_recompute(0).unwrap();
    assert!(is_closed(&mut c), "recompute with expert 9 was not refused");
    wait_refused(&h, before + 1);
    server_still_computes(&h);

    // The same MUL_MAT_ID listed twice, a CPY between the two runs
    // writing 9.0 (as I32) over the ids: checked before each run, the
    // second is refused.
    refused_with(&h, "ids rewritten between two runs", |c, b, base| {
        let mut g = moe(c, &[0, 1, 2, 3, 3, 0], b, base);
        let nines = packed(5, F32, [6, 1, 1, 1], b, base, 12288);
        c.set_tensor(&nines, 0, &f32_bytes(&[9.0; 6])).unwrap();
        let mut ids6 = g.tensors[2].clone();
        ids6.id = 6;
        ids6.ne = [6, 1, 1, 1];
        ids6.nb = [4, 24, 24, 24];
        let mut cpy = node(ids6.clone(), OP_CPY, &[5, 6]);
        cpy.id = 7;
        g.tensors.extend([nines, ids6, cpy]);
        g.nodes = vec![4, 7, 4];
        g
    });
    // Listed twice without a writer between: both runs compute.
    let (mut c, b, base) = session(&h);
    let mut g = moe(&mut c, &[0, 1, 2, 3, 3, 0], b, base);
    g.nodes = vec![4, 4];
    computes(&mut c, "mul_mat_id twice", &g);
}

/// A graph of one node `op` of `t` over the packed F32 [8, 4, 3]
/// source at 0 (id 1).
fn over_src(op: u32, t: RpcTensor, b: u64, base: u64, params: &[(usize, i32)]) -> GraphPayload {
    let a = packed(1, F32, [8, 4, 3, 1], b, base, 0);
    let mut r = node(t, op, &[1]);
    for &(i, v) in params {
        r.op_params[i] = v;
    }
    one_node(vec![a, r])
}

#[test]
fn new_ops_refuse_what_ggml_cpu_cannot_take() {
    let h = start_ggml();
    // MUL_MAT_ID: F16 src1 for F32 experts, GGML_ASSERT(src1->type ==
    // GGML_TYPE_F32) when converting to the vec_dot type.
    refused_with(&h, "mul_mat_id F32 x F16", |c, b, base| {
        let mut g = moe(c, &[0; 6], b, base);
        g.tensors[1] = packed(2, F16, [16, 2, 3, 1], b, base, 0);
        g
    });
    // A row map of 2^20 experts x 4 slots x 8192 tokens x 8 bytes (256
    // GiB): ggml_graph_plan's work buffer, new[] fails: std::terminate.
    {
        // In an 8 MiB buffer: 4 MiB of experts, valid (zero) ids.
        let before = h.shared().refused_connections();
        let mut c = connect(&h);
        let (b, base) = alloc(&mut c, 8 << 20);
        let experts = packed(1, F32, [1, 1, 1 << 20, 1], b, base, 0);
        let x = packed(2, F32, [1, 4, 1 << 13, 1], b, base, 4 << 20);
        let idx = packed(3, I32, [4, 1 << 13, 1, 1], b, base, 5 << 20);
        let r = node(
            packed(4, F32, [1, 4, 1 << 13, 1], b, base, 6 << 20),
            OP_MUL_MAT_ID,
            &[1, 2, 3],
        );
        c.graph_compute(&one_node(vec![experts, x, idx, r]))
            .unwrap();
        assert!(is_closed(&mut c), "a 256 GiB row map was not refused");
        wait_refused(&h, before + 1);
        server_still_computes(&h);
    }
    // ACC / SET: negative strides / offsets become huge size_t values
    // whose sums wrap (offset -4: dst at the buffer's start, one element
    // before it); a view whose last element starts inside dst but ends
    // past it (SET's `<= nbytes`), dst at the buffer's end.
    refused(&h, "acc at offset -4", |b, base| {
        let a = packed(1, F32, [8, 4, 1, 1], b, base, 1024);
        let x = packed(2, F32, [2, 1, 1, 1], b, base, 2048);
        let mut r = node(packed(3, F32, [8, 4, 1, 1], b, base, 0), OP_ACC, &[1, 2]);
        r.op_params[..4].copy_from_slice(&[32, 128, 128, -4]);
        one_node(vec![a, x, r])
    });
    refused(&h, "set ending 2 bytes past dst", |b, base| {
        let a = packed(1, F32, [8, 4, 1, 1], b, base, 1024);
        let x = packed(2, F32, [2, 1, 1, 1], b, base, 2048);
        let mut r = node(at_end(3, F32, [8, 4, 1, 1], b, base), OP_SET, &[1, 2]);
        r.op_params[..4].copy_from_slice(&[32, 128, 128, 122]);
        one_node(vec![a, x, r])
    });
    // CONCAT: GGML_ASSERT(dim >= 0 && dim < 4); a second source smaller
    // than the result leaves (at the buffer's end) is read past.
    refused(&h, "concat dim 4", |b, base| {
        let a = packed(1, F32, [8, 4, 1, 1], b, base, 0);
        let x = packed(2, F32, [8, 4, 1, 1], b, base, 1024);
        let mut r = node(
            packed(3, F32, [16, 4, 1, 1], b, base, 2048),
            OP_CONCAT,
            &[1, 2],
        );
        r.op_params[0] = 4;
        one_node(vec![a, x, r])
    });
    refused(&h, "concat reading past its second source", |b, base| {
        let a = packed(1, F32, [8, 4, 1, 1], b, base, 0);
        let x = at_end(2, F32, [8, 1, 1, 1], b, base);
        let mut r = node(
            packed(3, F32, [8, 8, 1, 1], b, base, 2048),
            OP_CONCAT,
            &[1, 2],
        );
        r.op_params[0] = 1;
        one_node(vec![a, x, r])
    });
    // REPEAT of Q8_0, CLAMP of BF16, ARGMAX of F16, SQR of I32: the
    // kernels' type switches GGML_ABORT.
    refused(&h, "repeat of Q8_0", |b, base| {
        let a = packed(1, Q8_0, [32, 2, 1, 1], b, base, 0);
        let r = node(
            packed(2, Q8_0, [32, 4, 1, 1], b, base, 1024),
            OP_REPEAT,
            &[1],
        );
        one_node(vec![a, r])
    });
    for (op, ty, out) in [
        (OP_CLAMP, BF16, BF16),
        (OP_ARGMAX, F16, I32),
        (OP_SQR, I32, I32),
    ] {
        refused(&h, &format!("op {op} of type {ty}"), |b, base| {
            let a = packed(1, ty, [8, 4, 1, 1], b, base, 0);
            let ne = if op == OP_ARGMAX {
                [4, 1, 1, 1]
            } else {
                [8, 4, 1, 1]
            };
            let r = node(packed(2, out, ne, b, base, 1024), op, &[1]);
            one_node(vec![a, r])
        });
    }
    // ARGSORT: GGML_ABORT("invalid sort order"); indices written at
    // `i * nb1` for all 12 rows, into a result whose dims 2 are not
    // packed after dim 1 (rows of 3 heads 1 MiB apart are written 32
    // bytes apart: fine; here dims 1 and 2 swap roles: 12 rows of 32
    // bytes written past a [8, 1, 12] result of nb1 = 64 KiB).
    refused(&h, "argsort order 2", |b, base| {
        over_src(
            OP_ARGSORT,
            packed(2, I32, [8, 4, 3, 1], b, base, 4096),
            b,
            base,
            &[(0, 2)],
        )
    });
    refused(&h, "argsort rows not one run of nb1", |b, base| {
        let a = packed(1, F32, [8, 1, 12, 1], b, base, 0);
        let r = tensor(2, I32, [8, 1, 12, 1], [4, 1 << 16, 32, 384], b, base, 4096);
        one_node(vec![a, node(r, OP_ARGSORT, &[1])])
    });
    // TOP_K: k above the row length (std::partial_sort past its range).
    refused(&h, "top_k k > ne0", |b, base| {
        over_src(
            OP_TOP_K,
            packed(2, I32, [9, 4, 3, 1], b, base, 4096),
            b,
            base,
            &[],
        )
    });
    // PAD: a result wider than src0 plus its pads reads src0 (at the
    // buffer's end) past its rows; circular pads larger than src0 take a
    // negative modulus (src0 at the buffer's start); an empty circular
    // source divides by zero.
    refused(
        &h,
        "pad result wider than its source and pads",
        |b, base| {
            let a = at_end(1, F32, [8, 4, 3, 1], b, base);
            let mut r = node(packed(2, F32, [17, 4, 3, 1], b, base, 0), OP_PAD, &[1]);
            r.op_params[1] = 1;
            one_node(vec![a, r])
        },
    );
    refused(&h, "circular pad of 9 on rows of 8", |b, base| {
        over_src(
            OP_PAD,
            packed(2, F32, [17, 4, 3, 1], b, base, 4096),
            b,
            base,
            &[(0, 9), (8, 1)],
        )
    });
    refused(&h, "circular pad of an empty source", |b, base| {
        let a = tensor(1, F32, [0, 4, 3, 1], [4, 32, 128, 384], b, base, 0);
        let mut r = node(packed(2, F32, [2, 4, 3, 1], b, base, 4096), OP_PAD, &[1]);
        r.op_params[1] = 2;
        r.op_params[8] = 1;
        one_node(vec![a, r])
    });
    // DIAG_MASK_INF: GGML_ASSERT(n_past >= 0). SUM_ROWS:
    // GGML_ASSERT(src0->nb[0] == sizeof(float)) whatever ne[0].
    // L2_NORM: GGML_ASSERT(eps >= 0.0f), which NaN fails.
    refused(&h, "diag_mask_inf n_past -1", |b, base| {
        over_src(
            OP_DIAG_MASK_INF,
            packed(2, F32, [8, 4, 3, 1], b, base, 4096),
            b,
            base,
            &[(0, -1)],
        )
    });
    refused(&h, "sum_rows of nb0 = 8", |b, base| {
        let a = tensor(1, F32, [1, 4, 3, 1], [8, 8, 32, 96], b, base, 0);
        let r = node(
            packed(2, F32, [1, 4, 3, 1], b, base, 4096),
            OP_SUM_ROWS,
            &[1],
        );
        one_node(vec![a, r])
    });
    refused(&h, "l2_norm eps NaN", |b, base| {
        over_src(
            OP_L2_NORM,
            packed(2, F32, [8, 4, 3, 1], b, base, 4096),
            b,
            base,
            &[(0, f32::NAN.to_bits() as i32)],
        )
    });

    // The valid forms compute.
    let (mut c, b, base) = session(&h);
    let x: Vec<f32> = (0..96).map(|i| ((i * 37) % 96) as f32 - 48.0).collect();
    c.set_tensor(&packed(1, F32, [8, 4, 3, 1], b, base, 0), 0, &f32_bytes(&x))
        .unwrap();
    let sorted = packed(2, I32, [8, 4, 3, 1], b, base, 4096);
    computes(
        &mut c,
        "argsort",
        &over_src(OP_ARGSORT, sorted.clone(), b, base, &[(0, 1)]),
    );
    let got: Vec<i32> = c
        .get_tensor(&sorted, 0, 32)
        .unwrap()
        .chunks_exact(4)
        .map(|v| i32::from_le_bytes([v[0], v[1], v[2], v[3]]))
        .collect();
    let mut want: Vec<i32> = (0..8).collect();
    want.sort_by(|&p, &q| x[q as usize].total_cmp(&x[p as usize]));
    assert_eq!(got, want, "argsort descending");
    for (op, t, params) in [
        (
            OP_TOP_K,
            packed(2, I32, [3, 4, 3, 1], b, base, 4096),
            vec![],
        ),
        (
            OP_PAD,
            packed(2, F32, [17, 4, 3, 1], b, base, 4096),
            vec![(0, 8), (1, 1), (8, 1)],
        ),
        (
            OP_PAD,
            packed(2, F32, [9, 5, 3, 1], b, base, 4096),
            vec![(0, 1), (3, 1)],
        ),
        (
            OP_DIAG_MASK_INF,
            packed(2, F32, [8, 4, 3, 1], b, base, 4096),
            vec![(0, 2)],
        ),
        (
            OP_L2_NORM,
            packed(2, F32, [8, 4, 3, 1], b, base, 4096),
            vec![(0, 0)],
        ),
        (
            OP_CLAMP,
            packed(2, F32, [8, 4, 3, 1], b, base, 4096),
            vec![],
        ),
        (
            OP_SUM_ROWS,
            packed(2, F32, [1, 4, 3, 1], b, base, 4096),
            vec![],
        ),
    ] {
        computes(
            &mut c,
            &format!("op {op}"),
            &over_src(op, t, b, base, &params),
        );
    }
    let a = packed(1, F32, [8, 4, 1, 1], b, base, 0);
    let xs = packed(2, F32, [2, 1, 1, 1], b, base, 2048);
    let mut r = node(at_end(3, F32, [8, 4, 1, 1], b, base), OP_SET, &[1, 2]);
    r.op_params[..4].copy_from_slice(&[32, 128, 128, 120]);
    computes(&mut c, "set at the end", &one_node(vec![a, xs, r]));
}

const OP_ADD1: u32 = 4;
const OP_LOG: u32 = 11;
const OP_CUMSUM: u32 = 16;
const OP_COUNT_EQUAL: u32 = 19;
const OP_GROUP_NORM: u32 = 27;
const OP_PAD_REFLECT_1D: u32 = 65;
const OP_ROLL: u32 = 66;
const OP_ARANGE: u32 = 67;
const OP_TIMESTEP_EMBEDDING: u32 = 68;
const OP_LEAKY_RELU: u32 = 71;
const OP_TRI: u32 = 72;
const OP_FILL: u32 = 73;

#[test]
fn batch2_ops_refuse_what_ggml_cpu_cannot_take() {
    let h = start_ggml();
    // Type switches that GGML_ABORT: LOG of I32 (unary_op), CUMSUM of
    // F16, LEAKY_RELU of BF16, FILL of BF16.
    for (op, ty) in [
        (OP_LOG, I32),
        (OP_CUMSUM, F16),
        (OP_LEAKY_RELU, BF16),
        (OP_FILL, BF16),
    ] {
        refused(&h, &format!("op {op} of type {ty}"), |b, base| {
            let a = packed(1, ty, [8, 4, 1, 1], b, base, 0);
            let r = node(packed(2, ty, [8, 4, 1, 1], b, base, 1024), op, &[1]);
            one_node(vec![a, r])
        });
    }
    // ADD1: GGML_ASSERT(ggml_is_scalar(src1)).
    refused(&h, "add1 of a vector", |b, base| {
        let a = packed(1, F32, [8, 4, 1, 1], b, base, 0);
        let x = packed(2, F32, [8, 1, 1, 1], b, base, 1024);
        let r = node(
            packed(3, F32, [8, 4, 1, 1], b, base, 2048),
            OP_ADD1,
            &[1, 2],
        );
        one_node(vec![a, x, r])
    });
    // COUNT_EQUAL: GGML_ASSERT(dst->type == GGML_TYPE_I64); a [8, 4, 3]
    // source (at the buffer's end) has its last row read at row 13 of 12.
    refused(&h, "count_equal into I32", |b, base| {
        let a = packed(1, I32, [8, 4, 1, 1], b, base, 0);
        let x = packed(2, I32, [8, 4, 1, 1], b, base, 1024);
        let r = node(
            packed(3, I32, [1, 1, 1, 1], b, base, 2048),
            OP_COUNT_EQUAL,
            &[1, 2],
        );
        one_node(vec![a, x, r])
    });
    refused(&h, "count_equal of [8, 4, 3]", |b, base| {
        let a = packed(1, I32, [8, 4, 3, 1], b, base, 0);
        let x = at_end(2, I32, [8, 4, 3, 1], b, base);
        let r = node(
            packed(3, I64, [1, 1, 1, 1], b, base, 2048),
            OP_COUNT_EQUAL,
            &[1, 2],
        );
        one_node(vec![a, x, r])
    });
    // GROUP_NORM of 0 groups: an int division by zero (SIGFPE).
    refused(&h, "group_norm of 0 groups", |b, base| {
        over_src(
            OP_GROUP_NORM,
            packed(2, F32, [8, 4, 3, 1], b, base, 4096),
            b,
            base,
            &[(0, 0)],
        )
    });
    // PAD_REFLECT_1D with p0 = -1: each row is copied one float before
    // its dst row (dst at the buffer's start).
    refused(&h, "pad_reflect_1d p0 -1", |b, base| {
        let a = packed(1, F32, [8, 4, 3, 1], b, base, 4096);
        let mut r = node(
            packed(2, F32, [8, 4, 3, 1], b, base, 0),
            OP_PAD_REFLECT_1D,
            &[1],
        );
        r.op_params[..2].copy_from_slice(&[-1, 1]);
        one_node(vec![a, r])
    });
    // ROLL: a shift of ne1 + 4 wraps once to row -4 (src0 at the
    // buffer's start).
    refused(&h, "roll by 8 of 4 rows", |b, base| {
        over_src(
            OP_ROLL,
            packed(2, F32, [8, 4, 3, 1], b, base, 4096),
            b,
            base,
            &[(1, 8)],
        )
    });
    // ARANGE: GGML_ASSERT(ggml_nelements(dst) == steps).
    refused(&h, "arange of 10 steps into 8", |b, base| {
        let mut r = node(packed(1, F32, [8, 1, 1, 1], b, base, 0), OP_ARANGE, &[]);
        set_f32(&mut r, 1, 10.0);
        set_f32(&mut r, 2, 1.0);
        one_node(vec![r])
    });
    // TIMESTEP_EMBEDDING: dim 64 written into rows of 8 (dst at the
    // buffer's end); dim -3 writes column -2 (dst at its start).
    for (dim, at_start) in [(64, false), (-3, true)] {
        refused(&h, &format!("timestep_embedding dim {dim}"), |b, base| {
            let t = packed(1, F32, [4, 1, 1, 1], b, base, 4096);
            let out = if at_start {
                packed(2, F32, [8, 4, 1, 1], b, base, 0)
            } else {
                at_end(2, F32, [8, 4, 1, 1], b, base)
            };
            let mut r = node(out, OP_TIMESTEP_EMBEDDING, &[1]);
            r.op_params[0] = dim;
            r.op_params[1] = 10000;
            one_node(vec![t, r])
        });
    }
    // TRI: GGML_ABORT("invalid tri type").
    refused(&h, "tri type 4", |b, base| {
        let a = packed(1, F32, [8, 8, 1, 1], b, base, 0);
        let mut r = node(packed(2, F32, [8, 8, 1, 1], b, base, 1024), OP_TRI, &[1]);
        r.op_params[0] = 4;
        one_node(vec![a, r])
    });

    // The valid forms compute.
    let (mut c, b, base) = session(&h);
    let x: Vec<f32> = (0..96).map(|i| (i as f32) * 0.25 - 8.0).collect();
    c.set_tensor(&packed(1, F32, [8, 4, 3, 1], b, base, 0), 0, &f32_bytes(&x))
        .unwrap();
    for (op, ne, params) in [
        (OP_GROUP_NORM, [8, 4, 3, 1], vec![(0, 3)]),
        (OP_ROLL, [8, 4, 3, 1], vec![(0, -7), (1, 3), (2, -2)]),
        (OP_PAD_REFLECT_1D, [15, 4, 3, 1], vec![(0, 7), (1, 0)]),
        (OP_CUMSUM, [8, 4, 3, 1], vec![]),
        (OP_LEAKY_RELU, [8, 4, 3, 1], vec![]),
        (OP_FILL, [8, 4, 3, 1], vec![]),
        (OP_LOG, [8, 4, 3, 1], vec![]),
    ] {
        let t = packed(2, F32, ne, b, base, 4096);
        computes(
            &mut c,
            &format!("op {op}"),
            &over_src(op, t, b, base, &params),
        );
    }
    let rolled = read(&mut c, &packed(2, F32, [8, 4, 3, 1], b, base, 4096), 1);
    assert!(rolled[0].is_nan(), "log of a negative value");
    let t = packed(1, F32, [4, 1, 1, 1], b, base, 0);
    let mut r = node(
        at_end(2, F32, [8, 4, 1, 1], b, base),
        OP_TIMESTEP_EMBEDDING,
        &[1],
    );
    r.op_params[0] = 8;
    r.op_params[1] = 10000;
    computes(&mut c, "timestep_embedding dim 8", &one_node(vec![t, r]));
    let mut r = node(packed(2, F32, [10, 1, 1, 1], b, base, 4096), OP_ARANGE, &[]);
    set_f32(&mut r, 1, 10.0);
    set_f32(&mut r, 2, 1.0);
    computes(&mut c, "arange", &one_node(vec![r.clone()]));
    assert_eq!(
        read(&mut c, &r, 10),
        (0..10).map(|i| i as f32).collect::<Vec<_>>()
    );
}

const OP_SSM_CONV: u32 = 76;
const OP_SSM_SCAN: u32 = 77;

/// A Mamba-2 SSM_SCAN of 2 sequences, one token, 2 heads of 2, d_state
/// 4, `ng` groups, states [4, 2, 2, 1] whose `nb[3]` is `st_nb3`, the
/// sequence ids `ids`; the result (id 8, 40 floats) ends at the buffer's
/// end.
fn ssm_scan(c: &mut Client, b: u64, base: u64, ng: u32, ids: &[i32], st_nb3: u32) -> GraphPayload {
    let mut st = packed(1, F32, [4, 2, 2, 1], b, base, 0);
    st.nb[3] = st_nb3;
    let x = packed(2, F32, [2, 2, 1, 2], b, base, 1024);
    let dt = packed(3, F32, [2, 1, 2, 1], b, base, 2048);
    let a = packed(4, F32, [1, 2, 1, 1], b, base, 3072);
    // Strides of one group whatever ng (an empty B / C keeps them).
    let nb = [4, 16, 16 * ng.max(1), 16 * ng.max(1)];
    let bm = tensor(5, F32, [4, ng, 1, 2], nb, b, base, 4096);
    let cm = tensor(6, F32, [4, ng, 1, 2], nb, b, base, 5120);
    let idx = packed(7, I32, [2, 1, 1, 1], b, base, 6144);
    c.set_tensor(&idx, 0, &i32_bytes(ids)).unwrap();
    let mut r = node(
        at_end(8, F32, [40, 1, 1, 1], b, base),
        OP_SSM_SCAN,
        &[1, 2, 3, 4, 5, 6, 7],
    );
    r.op_params[0] = 1;
    one_node(vec![st, x, dt, a, bm, cm, idx, r])
}

#[test]
fn ssm_ops_refuse_what_ggml_cpu_cannot_take() {
    let h = start_ggml();
    // SSM_CONV: 4 tokens of windows of 4 over rows of 4 (source at the
    // buffer's end: the last row's windows read 3 floats past it); F16
    // sources (GGML_ABORT).
    refused(&h, "ssm_conv windows past the source", |b, base| {
        let sx = at_end(1, F32, [4, 8, 1, 1], b, base);
        let w = packed(2, F32, [4, 8, 1, 1], b, base, 0);
        let r = node(
            packed(3, F32, [8, 4, 1, 1], b, base, 1024),
            OP_SSM_CONV,
            &[1, 2],
        );
        one_node(vec![sx, w, r])
    });
    refused(&h, "ssm_conv of F16", |b, base| {
        let sx = packed(1, F16, [4, 8, 1, 1], b, base, 2048);
        let w = packed(2, F32, [4, 8, 1, 1], b, base, 0);
        let r = node(
            packed(3, F32, [8, 1, 1, 1], b, base, 1024),
            OP_SSM_CONV,
            &[1, 2],
        );
        one_node(vec![sx, w, r])
    });
    // SSM_SCAN: a sequence id 2^20 states past src0; 0 groups
    // (`nh % ng`: SIGFPE); states 1 KiB apart (ne[3] = 1, so
    // ggml_is_contiguous ignores it) written past the result.
    refused_with(&h, "ssm_scan sequence id 2^20", |c, b, base| {
        ssm_scan(c, b, base, 1, &[0, 1 << 20], 64)
    });
    refused_with(&h, "ssm_scan of 0 groups", |c, b, base| {
        ssm_scan(c, b, base, 0, &[0, 0], 64)
    });
    refused_with(&h, "ssm_scan states 1 KiB apart", |c, b, base| {
        ssm_scan(c, b, base, 1, &[0, 0], 1024)
    });
    // The valid forms compute.
    let (mut c, b, base) = session(&h);
    let g = ssm_scan(&mut c, b, base, 1, &[0, 0], 64);
    computes(&mut c, "ssm_scan", &g);
    let g = ssm_scan(&mut c, b, base, 2, &[0, 0], 64);
    computes(&mut c, "ssm_scan of 2 groups", &g);
    let sx = packed(1, F32, [4, 8, 1, 1], b, base, 0);
    let w = packed(2, F32, [4, 8, 1, 1], b, base, 1024);
    let r = node(at_end(3, F32, [8, 1, 1, 1], b, base), OP_SSM_CONV, &[1, 2]);
    computes(&mut c, "ssm_conv", &one_node(vec![sx, w, r]));
}

const OP_CONV_TRANSPOSE_1D: u32 = 51;
const OP_IM2COL: u32 = 52;
const OP_IM2COL_3D: u32 = 54;
const OP_CONV_TRANSPOSE_2D: u32 = 59;
const OP_CONV_2D: u32 = 56;
const OP_CONV_3D: u32 = 57;
const OP_CONV_2D_DW: u32 = 58;
const OP_POOL_1D: u32 = 60;
const OP_POOL_2D: u32 = 61;
const OP_UPSCALE: u32 = 63;

/// A 2D IM2COL of a [3, 3, 3] kernel over an image [4, 4, 3] (stride,
/// pad, dilation 1) into `r`.
fn im2col(image: RpcTensor, r: RpcTensor, b: u64, base: u64) -> GraphPayload {
    let k = packed(1, F32, [3, 3, 3, 1], b, base, 0);
    let mut r = node(r, OP_IM2COL, &[1, 2]);
    r.op_params[..7].copy_from_slice(&[1, 1, 1, 1, 1, 1, 1]);
    one_node(vec![k, image, r])
}

/// A CONV_2D_DW of a [3, 3, 1, kc] kernel over an image [6, 6, 4]
/// (stride, pad, dilation 1) into `r`.
fn conv_2d_dw(kc: u32, image: RpcTensor, r: RpcTensor, b: u64, base: u64) -> GraphPayload {
    let k = packed(1, F32, [3, 3, 1, kc], b, base, 0);
    let mut r = node(r, OP_CONV_2D_DW, &[1, 2]);
    r.op_params[..6].copy_from_slice(&[1, 1, 1, 1, 1, 1]);
    one_node(vec![k, image, r])
}

#[test]
fn vision_ops_refuse_what_ggml_cpu_cannot_take() {
    let h = start_ggml();
    // IM2COL: a result one column wide at the buffer's end (the kernel
    // writes IC * KH * KW = 27 per output position: 1.7 KiB past it); an
    // image of 16 x 16 with rows 4 bytes apart (read as packed rows: 900
    // bytes past its end); a BF16 result (GGML_ABORT).
    refused(&h, "im2col result narrower than its columns", |b, base| {
        let i = packed(2, F32, [4, 4, 3, 1], b, base, 1024);
        im2col(i, at_end(3, F32, [1, 4, 4, 1], b, base), b, base)
    });
    refused(&h, "im2col of overlapping image rows", |b, base| {
        let i = tensor(2, F32, [16, 16, 3, 1], [4, 4, 124, 372], b, base, BUF - 372);
        im2col(i, packed(3, F32, [27, 16, 16, 1], b, base, 4096), b, base)
    });
    refused(&h, "im2col into BF16", |b, base| {
        let i = packed(2, F32, [4, 4, 3, 1], b, base, 1024);
        im2col(i, packed(3, BF16, [27, 4, 4, 1], b, base, 2048), b, base)
    });
    // CONV_2D_DW: a result of one channel of four at the buffer's end
    // (the WHCN path writes 4 planes of 36 floats: 432 bytes past it); a
    // kernel of 3 channels (GGML_ASSERT); an image with dims 0 and 1
    // swapped (neither layout: GGML_ABORT).
    refused(&h, "conv_2d_dw result of one channel of four", |b, base| {
        let i = packed(2, F32, [6, 6, 4, 1], b, base, 1024);
        conv_2d_dw(4, i, at_end(3, F32, [6, 6, 1, 1], b, base), b, base)
    });
    refused(&h, "conv_2d_dw kernel of 3 channels", |b, base| {
        let i = packed(2, F32, [6, 6, 4, 1], b, base, 1024);
        conv_2d_dw(3, i, packed(3, F32, [6, 6, 4, 1], b, base, 4096), b, base)
    });
    refused(&h, "conv_2d_dw of a transposed image", |b, base| {
        let i = tensor(2, F32, [6, 6, 4, 1], [24, 4, 144, 576], b, base, 1024);
        conv_2d_dw(4, i, packed(3, F32, [6, 6, 4, 1], b, base, 4096), b, base)
    });
    // POOL_1D: a result of one row for 8 (rows written at ir * nb1: 224
    // bytes past it); POOL_COUNT (GGML_ABORT).
    let pool_1d = |op: i32, r: RpcTensor, b, base| {
        let a = packed(1, F32, [8, 8, 1, 1], b, base, 0);
        let mut r = node(r, OP_POOL_1D, &[1]);
        r.op_params[..4].copy_from_slice(&[op, 1, 1, 0]);
        one_node(vec![a, r])
    };
    refused(&h, "pool_1d result of one row for 8", |b, base| {
        let mut r = at_end(2, F32, [8, 1, 1, 1], b, base);
        r.nb[1] = 32;
        pool_1d(0, r, b, base)
    });
    refused(&h, "pool_1d POOL_COUNT", |b, base| {
        pool_1d(2, packed(2, F32, [8, 8, 1, 1], b, base, 1024), b, base)
    });
    // POOL_2D: a one-plane source with nb[2] = 4 (ggml_is_contiguous
    // ignores it; the kernel walks 16 planes: 960 bytes past the result);
    // POOL_COUNT (GGML_ABORT).
    let pool_2d = |op: i32, nb2: u32, r: RpcTensor, b, base| {
        let a = tensor(1, F32, [4, 4, 1, 1], [4, 16, nb2, 64], b, base, 0);
        let mut r = node(r, OP_POOL_2D, &[1]);
        r.op_params[..7].copy_from_slice(&[op, 1, 1, 1, 1, 0, 0]);
        one_node(vec![a, r])
    };
    refused(&h, "pool_2d planes 4 bytes apart", |b, base| {
        pool_2d(0, 4, at_end(2, F32, [4, 4, 1, 1], b, base), b, base)
    });
    refused(&h, "pool_2d POOL_COUNT", |b, base| {
        pool_2d(2, 64, packed(2, F32, [4, 4, 1, 1], b, base, 1024), b, base)
    });
    // UPSCALE: mode 3 (GGML_ABORT); an F16 source (GGML_ABORT).
    let upscale = |mode: i32, a: RpcTensor, b, base| {
        let mut r = node(
            packed(2, F32, [8, 8, 1, 1], b, base, 1024),
            OP_UPSCALE,
            &[1],
        );
        r.op_params[0] = mode;
        one_node(vec![a, r])
    };
    refused(&h, "upscale mode 3", |b, base| {
        upscale(3, packed(1, F32, [4, 4, 1, 1], b, base, 0), b, base)
    });
    refused(&h, "upscale of F16", |b, base| {
        upscale(1, packed(1, F16, [4, 4, 1, 1], b, base, 0), b, base)
    });
    // The valid forms compute.
    let (mut c, b, base) = session(&h);
    let i = packed(2, F32, [4, 4, 3, 1], b, base, 1024);
    let g = im2col(i, at_end(3, F32, [27, 4, 4, 1], b, base), b, base);
    computes(&mut c, "im2col", &g);
    let i = packed(2, F32, [6, 6, 4, 1], b, base, 1024);
    let g = conv_2d_dw(4, i, at_end(3, F32, [6, 6, 4, 1], b, base), b, base);
    computes(&mut c, "conv_2d_dw", &g);
    let g = pool_1d(1, at_end(2, F32, [8, 8, 1, 1], b, base), b, base);
    computes(&mut c, "pool_1d", &g);
    let g = pool_2d(1, 64, at_end(2, F32, [4, 4, 1, 1], b, base), b, base);
    computes(&mut c, "pool_2d", &g);
    let g = upscale(2, packed(1, F32, [4, 4, 1, 1], b, base, 0), b, base);
    computes(&mut c, "upscale", &g);
    assert_eq!(read(&mut c, &g.tensors[1], 1).len(), 1);
}

/// A transposed convolution (`op`) of `kernel` (id 1) over `source` (id
/// 2) into `r`, stride 1 (1D: pad 0, dilation 1).
fn conv_transpose(op: u32, kernel: RpcTensor, source: RpcTensor, r: RpcTensor) -> GraphPayload {
    let mut r = node(r, op, &[1, 2]);
    r.op_params[..3].copy_from_slice(&[1, 0, 1]);
    one_node(vec![kernel, source, r])
}

#[test]
fn transposed_convolutions_refuse_what_ggml_cpu_cannot_take() {
    let h = start_ggml();
    // 1D: a result of rows of 2 for 258 columns (row 1, the buffer's
    // last 8 bytes, written 1 KiB on); a BF16 kernel (GGML_ABORT); a
    // source of 2 planes (ggml_graph_plan's GGML_ASSERT).
    refused(&h, "conv_transpose_1d rows of 2 of 258", |b, base| {
        let k = packed(1, F32, [3, 2, 1, 1], b, base, 0);
        let i = packed(2, F32, [256, 1, 1, 1], b, base, 1024);
        let mut r = at_end(3, F32, [2, 2, 1, 1], b, base);
        r.nb[1] = 8;
        conv_transpose(OP_CONV_TRANSPOSE_1D, k, i, r)
    });
    refused(&h, "conv_transpose_1d of a BF16 kernel", |b, base| {
        let k = packed(1, BF16, [3, 2, 1, 1], b, base, 0);
        let i = packed(2, F32, [8, 1, 1, 1], b, base, 1024);
        let r = packed(3, F32, [10, 2, 1, 1], b, base, 2048);
        conv_transpose(OP_CONV_TRANSPOSE_1D, k, i, r)
    });
    refused(
        &h,
        "conv_transpose_1d of a source of 2 planes",
        |b, base| {
            let k = packed(1, F32, [3, 2, 1, 1], b, base, 0);
            let i = packed(2, F32, [8, 1, 2, 1], b, base, 1024);
            let r = packed(3, F32, [10, 2, 1, 1], b, base, 2048);
            conv_transpose(OP_CONV_TRANSPOSE_1D, k, i, r)
        },
    );
    // 2D: a result plane of 2 x 2 for 18 x 18 at the buffer's end (written
    // 200 bytes past it); a result plane with rows 4 bytes apart (100
    // bytes past it); a BF16 kernel (ggml_graph_plan's GGML_ASSERT).
    let k2 = |ty: u32, b, base| packed(1, ty, [3, 3, 1, 1], b, base, 0);
    refused(&h, "conv_transpose_2d plane of 2 x 2", |b, base| {
        let i = packed(2, F32, [16, 16, 1, 1], b, base, 1024);
        let r = at_end(3, F32, [2, 2, 1, 1], b, base);
        conv_transpose(OP_CONV_TRANSPOSE_2D, k2(F32, b, base), i, r)
    });
    refused(&h, "conv_transpose_2d rows 4 bytes apart", |b, base| {
        let i = packed(2, F32, [4, 4, 1, 1], b, base, 1024);
        let r = tensor(3, F32, [6, 6, 1, 1], [4, 4, 44, 44], b, base, BUF - 44);
        conv_transpose(OP_CONV_TRANSPOSE_2D, k2(F32, b, base), i, r)
    });
    refused(&h, "conv_transpose_2d of a BF16 kernel", |b, base| {
        let i = packed(2, F32, [4, 4, 1, 1], b, base, 1024);
        let r = packed(3, F32, [6, 6, 1, 1], b, base, 2048);
        conv_transpose(OP_CONV_TRANSPOSE_2D, k2(BF16, b, base), i, r)
    });
    // The valid forms compute.
    let (mut c, b, base) = session(&h);
    let k = packed(1, F32, [3, 2, 1, 1], b, base, 0);
    let i = packed(2, F32, [256, 1, 1, 1], b, base, 1024);
    let r = at_end(3, F32, [258, 2, 1, 1], b, base);
    computes(
        &mut c,
        "conv_transpose_1d",
        &conv_transpose(OP_CONV_TRANSPOSE_1D, k, i, r),
    );
    let i = packed(2, F32, [16, 16, 1, 1], b, base, 4096);
    let r = at_end(3, F32, [18, 18, 1, 1], b, base);
    let g = conv_transpose(OP_CONV_TRANSPOSE_2D, k2(F16, b, base), i, r);
    computes(&mut c, "conv_transpose_2d", &g);
}

#[test]
fn direct_convolutions_refuse_what_ggml_cpu_cannot_take() {
    let h = start_ggml();
    let conv_2d = |k: RpcTensor, i: RpcTensor, r: RpcTensor| {
        let mut r = node(r, OP_CONV_2D, &[1, 2]);
        r.op_params[..6].copy_from_slice(&[1, 1, 0, 0, 1, 1]);
        one_node(vec![k, i, r])
    };
    // CONV_2D: a kernel of 3 input channels over an image of 2
    // (GGML_ASSERT); a result of one
    // channel for the kernel's 4 at the buffer's end (channels written at
    // nb[2]: 192 bytes past it).
    refused(&h, "conv_2d of 3 kernel channels over 2", |b, base| {
        let k = packed(1, F32, [3, 3, 3, 4], b, base, 0);
        let i = packed(2, F32, [6, 6, 2, 1], b, base, 1024);
        conv_2d(k, i, packed(3, F32, [4, 4, 4, 1], b, base, 2048))
    });
    refused(&h, "conv_2d result of one channel of four", |b, base| {
        let k = packed(1, F32, [3, 3, 2, 4], b, base, 0);
        let i = packed(2, F32, [6, 6, 2, 1], b, base, 1024);
        conv_2d(k, i, at_end(3, F32, [4, 4, 1, 1], b, base))
    });
    // CONV_3D: n = 2 batches over an image of one (c = 1) at the buffer's
    // end (batch 1 read 128 bytes past it).
    let conv_3d = |n: i32, i: RpcTensor, b, base| {
        let k = packed(1, F32, [1, 1, 1, 1], b, base, 0);
        let mut r = node(
            packed(3, F32, [4, 4, 2, 2], b, base, 2048),
            OP_CONV_3D,
            &[1, 2],
        );
        r.op_params[..12].copy_from_slice(&[1, 1, 1, 0, 0, 0, 1, 1, 1, 1, n, 1]);
        one_node(vec![k, i, r])
    };
    refused(
        &h,
        "conv_3d of 2 batches over an image of one",
        |b, base| conv_3d(2, at_end(2, F32, [4, 4, 2, 1], b, base), b, base),
    );
    // The valid forms compute.
    let (mut c, b, base) = session(&h);
    let k = packed(1, F16, [3, 3, 2, 4], b, base, 0);
    let i = packed(2, F32, [6, 6, 2, 1], b, base, 1024);
    computes(
        &mut c,
        "conv_2d",
        &conv_2d(k, i, at_end(3, F32, [4, 4, 4, 1], b, base)),
    );
    let g = conv_3d(2, packed(2, F32, [4, 4, 2, 2], b, base, 1024), b, base);
    computes(&mut c, "conv_3d", &g);
}

/// An IM2COL_3D of a [2, 2, 2, 1] kernel over an image [4, 4, 4, 1] with
/// op_params IC `ic` (stride, dilation 1, pad 0) into `r`.
fn im2col_3d(ic: i32, r: RpcTensor, b: u64, base: u64) -> GraphPayload {
    let k = packed(1, F32, [2, 2, 2, 1], b, base, 0);
    let i = packed(2, F32, [4, 4, 4, 1], b, base, 1024);
    let mut r = node(r, OP_IM2COL_3D, &[1, 2]);
    r.op_params[..10].copy_from_slice(&[1, 1, 1, 0, 0, 0, 1, 1, 1, ic]);
    one_node(vec![k, i, r])
}

#[test]
fn im2col_3d_refuses_what_ggml_cpu_cannot_take() {
    let h = start_ggml();
    // IC 0 and IC 2 of a one-plane image (`ne13 / IC`, then `ne3 / N`:
    // SIGFPE); a result one column wide for 8 at the buffer's end (1.8 KiB
    // written past it).
    refused(&h, "im2col_3d of IC 0", |b, base| {
        im2col_3d(0, packed(3, F32, [8, 3, 3, 3], b, base, 4096), b, base)
    });
    refused(&h, "im2col_3d of IC 2 over one plane", |b, base| {
        im2col_3d(2, packed(3, F32, [16, 3, 3, 3], b, base, 4096), b, base)
    });
    refused(
        &h,
        "im2col_3d result narrower than its columns",
        |b, base| im2col_3d(1, at_end(3, F32, [1, 4, 4, 4], b, base), b, base),
    );
    // The valid form computes.
    let (mut c, b, base) = session(&h);
    let g = im2col_3d(1, at_end(3, F32, [8, 3, 3, 3], b, base), b, base);
    computes(&mut c, "im2col_3d", &g);
}

const OP_OUT_PROD: u32 = 31;

#[test]
fn out_prod_refuses_what_ggml_cpu_cannot_take() {
    let h = start_ggml();
    let out_prod = |a: RpcTensor, bt: RpcTensor, r: RpcTensor| {
        one_node(vec![a, bt, node(r, OP_OUT_PROD, &[1, 2])])
    };
    // src0 of 64 rows by src1 of 2 at the buffer's end (src1 rows i11 =
    // i01 read 1 KiB past it); a result of overlapping rows at the
    // buffer's end (zeroed flat: 900 bytes past it); an empty src0 dim 2
    // (`ne2 % ne02`: SIGFPE).
    refused(&h, "out_prod of 64 rows by 2", |b, base| {
        let a = packed(1, F32, [4, 64, 1, 1], b, base, 0);
        let bt = at_end(2, F32, [4, 2, 1, 1], b, base);
        out_prod(a, bt, packed(3, F32, [4, 4, 1, 1], b, base, 2048))
    });
    refused(&h, "out_prod into overlapping rows", |b, base| {
        let a = packed(1, F32, [16, 4, 1, 1], b, base, 0);
        let bt = packed(2, F32, [16, 4, 1, 1], b, base, 1024);
        let r = tensor(3, F32, [16, 16, 1, 1], [4, 4, 124, 124], b, base, BUF - 124);
        out_prod(a, bt, r)
    });
    refused(&h, "out_prod of an empty src0 dim 2", |b, base| {
        let a = packed(1, F32, [4, 4, 0, 1], b, base, 0);
        let bt = packed(2, F32, [4, 4, 2, 1], b, base, 1024);
        out_prod(a, bt, packed(3, F32, [4, 4, 2, 1], b, base, 2048))
    });
    // The valid forms compute.
    let (mut c, b, base) = session(&h);
    let a = packed(1, F32, [4, 64, 1, 1], b, base, 0);
    let bt = packed(2, F32, [4, 64, 2, 1], b, base, 2048);
    let g = out_prod(a, bt.clone(), at_end(3, F32, [4, 4, 2, 1], b, base));
    computes(&mut c, "out_prod", &g);
    let a = packed(1, F16, [4, 64, 2, 1], b, base, 0);
    let g = out_prod(a, bt, at_end(3, F32, [4, 4, 2, 1], b, base));
    computes(&mut c, "out_prod of F16", &g);
}

const OP_RWKV_WKV6: u32 = 82;
const OP_GATED_LINEAR_ATTN: u32 = 83;
const OP_RWKV_WKV7: u32 = 84;

/// A linear-attention node `op` over `srcs` (ids 1..) into `r`.
fn linear_attn(op: u32, mut srcs: Vec<RpcTensor>, r: RpcTensor) -> GraphPayload {
    let ids: Vec<u64> = srcs.iter().map(|t| t.id).collect();
    srcs.push(node(r, op, &ids));
    one_node(srcs)
}

#[test]
fn linear_attention_refuses_what_ggml_cpu_cannot_take() {
    let h = start_ggml();
    // WKV6 of S 8, H 2, T 1; state [128, n_seqs] and result `r`.
    let wkv6 = |n_seqs: u32, r: RpcTensor, b, base| {
        let mut v: Vec<RpcTensor> = (0..5)
            .map(|i| packed(i + 1, F32, [8, 2, 1, 1], b, base, 256 * i))
            .collect();
        v.push(packed(6, F32, [128, n_seqs, 1, 1], b, base, 2048));
        linear_attn(OP_RWKV_WKV6, v, r)
    };
    // WKV6: a state of 0 sequences (`T / n_seqs`: SIGFPE); a result of the
    // outputs only at the buffer's end (the new state written 512 bytes
    // past it).
    refused(&h, "rwkv_wkv6 of 0 sequences", |b, base| {
        wkv6(0, packed(7, F32, [16, 9, 1, 1], b, base, 4096), b, base)
    });
    refused(&h, "rwkv_wkv6 result without its state rows", |b, base| {
        wkv6(1, at_end(7, F32, [16, 1, 1, 1], b, base), b, base)
    });
    // GLA: v of 0 heads (`C / HEADS`: SIGFPE).
    refused(&h, "gated_linear_attn of 0 heads", |b, base| {
        let mut v: Vec<RpcTensor> = (0..4)
            .map(|i| packed(i + 1, F32, [8, 2, 1, 1], b, base, 256 * i))
            .collect();
        v[1].ne[1] = 0;
        v.push(packed(5, F32, [128, 1, 1, 1], b, base, 2048));
        linear_attn(
            OP_GATED_LINEAR_ATTN,
            v,
            packed(6, F32, [16, 9, 1, 1], b, base, 4096),
        )
    });
    // WKV7 of head size 8 (the SIMD path reads and writes 32-float chunks:
    // past `b` at the buffer's end).
    refused(&h, "rwkv_wkv7 of head size 8", |b, base| {
        let mut v: Vec<RpcTensor> = (0..5)
            .map(|i| packed(i + 1, F32, [8, 1, 1, 1], b, base, 256 * i))
            .collect();
        v.push(at_end(6, F32, [8, 1, 1, 1], b, base));
        v.push(packed(7, F32, [64, 1, 1, 1], b, base, 2048));
        linear_attn(OP_RWKV_WKV7, v, packed(8, F32, [8, 9, 1, 1], b, base, 4096))
    });
    // The valid form computes.
    let (mut c, b, base) = session(&h);
    let g = wkv6(1, at_end(7, F32, [16, 9, 1, 1], b, base), b, base);
    computes(&mut c, "rwkv_wkv6", &g);
}

const OP_REPEAT_BACK: u32 = 21;
const OP_SILU_BACK: u32 = 23;
const OP_RMS_NORM_BACK: u32 = 26;
const OP_DIAG: u32 = 43;
const OP_DIAG_MASK_ZERO: u32 = 45;
const OP_SOFT_MAX_BACK: u32 = 47;
const OP_IM2COL_BACK: u32 = 53;
const OP_COL2IM_1D: u32 = 55;
const OP_POOL_2D_BACK: u32 = 62;
const OP_ROPE_BACK: u32 = 49;
const OP_WIN_PART: u32 = 78;
const OP_WIN_UNPART: u32 = 79;
const OP_GET_REL_POS: u32 = 80;
const OP_ADD_REL_POS: u32 = 81;
const OP_SOLVE_TRI: u32 = 85;
const OP_GATED_DELTA_NET: u32 = 86;
const OP_LIGHTNING_INDEXER: u32 = 87;
const OP_DSV4_HC_COMB: u32 = 88;
const OP_DSV4_HC_PRE: u32 = 89;
const OP_DSV4_HC_POST: u32 = 90;
const OP_CROSS_ENTROPY_LOSS: u32 = 96;
const OP_CROSS_ENTROPY_LOSS_BACK: u32 = 97;
const OP_OPT_STEP_ADAMW: u32 = 98;
const OP_OPT_STEP_SGD: u32 = 99;

/// A node `op` over `srcs` (ids 1.. in order) into `r` (id after them);
/// `None` sources leave their slot empty.
fn over(
    op: u32,
    srcs: Vec<Option<RpcTensor>>,
    r: RpcTensor,
    params: &[(usize, i32)],
) -> GraphPayload {
    let ids: Vec<u64> = srcs
        .iter()
        .map(|t| t.as_ref().map_or(0, |t| t.id))
        .collect();
    let mut r = node(r, op, &ids);
    for &(i, v) in params {
        r.op_params[i] = v;
    }
    let mut tensors: Vec<RpcTensor> = srcs.into_iter().flatten().collect();
    tensors.push(r);
    one_node(tensors)
}

/// GATED_DELTA_NET of head size 4, one head, one token: q, k, v, g, beta,
/// state at fixed offsets, q's heads `q_heads`, K slots `k_slots`.
fn gated_delta_net(q_heads: u32, k_slots: i32, r: RpcTensor, b: u64, base: u64) -> GraphPayload {
    let srcs = vec![
        Some(packed(1, F32, [4, q_heads, 1, 1], b, base, 0)),
        Some(packed(2, F32, [4, 1, 1, 1], b, base, 256)),
        Some(packed(3, F32, [4, 1, 1, 1], b, base, 512)),
        Some(packed(4, F32, [1, 1, 1, 1], b, base, 768)),
        Some(packed(5, F32, [1, 1, 1, 1], b, base, 1024)),
        Some(packed(6, F32, [4, 4, 1, 1], b, base, 1280)),
    ];
    over(OP_GATED_DELTA_NET, srcs, r, &[(0, k_slots)])
}

#[test]
fn solvers_and_window_ops_refuse_what_ggml_cpu_cannot_take() {
    let h = start_ggml();
    // SOLVE_TRI of a 4 x 4 A (at the buffer's end) for B of 64 rows: the
    // kernel indexes A by B's rows (`A[i00 * 64 + t]`), 16 KiB past it;
    // its own asserts (A square, X of B's shape) all hold.
    refused(&h, "solve_tri of A smaller than B's rows", |b, base| {
        let a = at_end(1, F32, [4, 4, 1, 1], b, base);
        let bt = packed(2, F32, [1, 64, 1, 1], b, base, 0);
        let r = packed(3, F32, [1, 64, 1, 1], b, base, 1024);
        over(OP_SOLVE_TRI, vec![Some(a), Some(bt)], r, &[])
    });
    // GATED_DELTA_NET: q of 0 heads (`h % neq1`: SIGFPE); a result of the
    // attention rows only at the buffer's end (the state written 64 bytes
    // past it); K = 0 (GGML_ASSERT).
    refused(&h, "gated_delta_net of q with 0 heads", |b, base| {
        gated_delta_net(0, 1, packed(7, F32, [4, 5, 1, 1], b, base, 2048), b, base)
    });
    refused(&h, "gated_delta_net result without its state", |b, base| {
        gated_delta_net(1, 1, at_end(7, F32, [4, 1, 1, 1], b, base), b, base)
    });
    refused(&h, "gated_delta_net K 0", |b, base| {
        gated_delta_net(1, 0, packed(7, F32, [4, 5, 1, 1], b, base, 2048), b, base)
    });
    // DIAG of a row of 4 into rows of 8 (GGML_ASSERT(ne00 == ne0)).
    refused(&h, "diag into longer rows", |b, base| {
        let a = packed(1, F32, [4, 1, 1, 1], b, base, 0);
        over(
            OP_DIAG,
            vec![Some(a)],
            packed(2, F32, [8, 8, 1, 1], b, base, 1024),
            &[],
        )
    });
    // DIAG_MASK_ZERO of F16 (GGML_ABORT in the type switch).
    refused(&h, "diag_mask_zero of F16", |b, base| {
        let a = packed(1, F16, [4, 4, 2, 1], b, base, 0);
        let r = packed(2, F16, [4, 4, 2, 1], b, base, 1024);
        over(OP_DIAG_MASK_ZERO, vec![Some(a)], r, &[])
    });
    // WIN_PART: 12 windows of 4 x 4 (npx 4, npy 3 of a 13 x 11 image) into
    // a result of one window at the buffer's end; w = -4 (the second row of
    // windows reads 4 rows before the image, at the buffer's start).
    refused(&h, "win_part into one window", |b, base| {
        let a = packed(1, F32, [8, 13, 11, 1], b, base, 0);
        let r = at_end(2, F32, [8, 4, 4, 1], b, base);
        over(OP_WIN_PART, vec![Some(a)], r, &[(0, 4), (1, 3), (2, 4)])
    });
    refused(&h, "win_part w -4", |b, base| {
        let a = packed(1, F32, [8, 13, 11, 1], b, base, 0);
        let r = packed(2, F32, [8, 4, 4, 12], b, base, 8192);
        over(OP_WIN_PART, vec![Some(a)], r, &[(0, 4), (1, 3), (2, -4)])
    });
    // WIN_UNPART with w = 0 (`ne1 % w`: SIGFPE).
    refused(&h, "win_unpart w 0", |b, base| {
        let a = packed(1, F32, [8, 4, 4, 12], b, base, 0);
        let r = packed(2, F32, [8, 13, 11, 1], b, base, 8192);
        over(OP_WIN_UNPART, vec![Some(a)], r, &[(0, 0)])
    });
    // GET_REL_POS of a table of 3 rows (at the buffer's end) into 5 x 5
    // positions: rows up to 8 read, up to 96 bytes past it.
    refused(&h, "get_rel_pos of too few rows", |b, base| {
        let a = at_end(1, F16, [8, 3, 1, 1], b, base);
        let r = packed(2, F16, [8, 5, 5, 1], b, base, 0);
        over(OP_GET_REL_POS, vec![Some(a)], r, &[])
    });
    // ADD_REL_POS with pw / ph of 2 heads into a result of one (at the
    // buffer's end): 64 bytes written past it.
    refused(
        &h,
        "add_rel_pos of more heads than the result",
        |b, base| {
            let a = packed(1, F32, [4, 4, 1, 1], b, base, 0);
            let pw = packed(2, F32, [2, 2, 2, 2], b, base, 1024);
            let ph = packed(3, F32, [2, 2, 2, 2], b, base, 2048);
            let r = at_end(4, F32, [4, 4, 1, 1], b, base);
            over(OP_ADD_REL_POS, vec![Some(a), Some(pw), Some(ph)], r, &[])
        },
    );
    // The valid forms compute.
    let (mut c, b, base) = session(&h);
    let g = gated_delta_net(1, 1, at_end(7, F32, [4, 5, 1, 1], b, base), b, base);
    computes(&mut c, "gated_delta_net", &g);
    let a = packed(1, F32, [8, 13, 11, 1], b, base, 0);
    let r = at_end(2, F32, [8, 4, 4, 12], b, base);
    let g = over(OP_WIN_PART, vec![Some(a)], r, &[(0, 4), (1, 3), (2, 4)]);
    computes(&mut c, "win_part", &g);
    let a = packed(1, F32, [4, 4, 1, 1], b, base, 0);
    let r = at_end(4, F32, [4, 4, 1, 1], b, base);
    let pw = packed(2, F32, [2, 2, 2, 1], b, base, 1024);
    let ph = packed(3, F32, [2, 2, 2, 1], b, base, 2048);
    let g = over(OP_ADD_REL_POS, vec![Some(a), Some(pw), Some(ph)], r, &[]);
    computes(&mut c, "add_rel_pos", &g);
}

#[test]
fn deepseek_v4_ops_refuse_what_ggml_cpu_cannot_take() {
    let h = start_ggml();
    // DSV4_HC_COMB with n_iter 0; DSV4_HC_PRE gated with weights of the
    // plain form; DSV4_HC_POST with a comb of 3 x 3: each a GGML_ASSERT.
    let comb = |n_iter: i32, b: u64, base: u64| {
        let srcs = vec![
            Some(packed(1, F32, [24, 5, 1, 1], b, base, 0)),
            Some(packed(2, F32, [3, 1, 1, 1], b, base, 1024)),
            Some(packed(3, F32, [24, 1, 1, 1], b, base, 2048)),
        ];
        let r = at_end(4, F32, [4, 4, 5, 1], b, base);
        over(OP_DSV4_HC_COMB, srcs, r, &[(1, n_iter)])
    };
    refused(&h, "dsv4_hc_comb n_iter 0", |b, base| comb(0, b, base));
    refused(&h, "dsv4_hc_pre gated with plain weights", |b, base| {
        let x = packed(1, F32, [32, 4, 5, 1], b, base, 0);
        let w = packed(2, F32, [4, 5, 1, 1], b, base, 4096);
        let r = at_end(3, F32, [32, 5, 1, 1], b, base);
        over(OP_DSV4_HC_PRE, vec![Some(x), Some(w)], r, &[(1, 1)])
    });
    let post = |comb_ne: [u32; 4], b: u64, base: u64| {
        let srcs = vec![
            Some(packed(1, F32, [32, 5, 1, 1], b, base, 0)),
            Some(packed(2, F32, [32, 4, 5, 1], b, base, 1024)),
            Some(packed(3, F32, [4, 5, 1, 1], b, base, 4096)),
            Some(packed(4, F32, comb_ne, b, base, 8192)),
        ];
        over(
            OP_DSV4_HC_POST,
            srcs,
            at_end(5, F32, [32, 4, 5, 1], b, base),
            &[],
        )
    };
    refused(&h, "dsv4_hc_post comb 3 x 3", |b, base| {
        post([3, 3, 5, 1], b, base)
    });
    // LIGHTNING_INDEXER: a mask of 0 streams (`s % nem3`: SIGFPE); F32
    // keys of 4 values for q rows of 64 (the dot reads 240 bytes past the
    // keys at the buffer's end).
    let indexer = |k: RpcTensor, mask_streams: u32, b: u64, base: u64| {
        let srcs = vec![
            Some(packed(1, F32, [64, 4, 3, 1], b, base, 0)),
            Some(k),
            Some(packed(3, F32, [4, 3, 1, 1], b, base, 8192)),
            Some(packed(4, F16, [10, 3, 1, mask_streams], b, base, 9216)),
        ];
        let r = packed(5, F32, [10, 3, 1, 1], b, base, 10240);
        over(OP_LIGHTNING_INDEXER, srcs, r, &[])
    };
    refused(&h, "lightning_indexer of a mask of 0 streams", |b, base| {
        indexer(packed(2, F32, [64, 1, 10, 1], b, base, 4096), 0, b, base)
    });
    refused(&h, "lightning_indexer of short keys", |b, base| {
        indexer(at_end(2, F32, [4, 1, 10, 1], b, base), 1, b, base)
    });
    // OUT_PROD of Q8_1 (no to_float: GGML_ABORT in the type switch).
    refused(&h, "out_prod of q8_1", |b, base| {
        let a = packed(1, Q8_1, [32, 4, 1, 1], b, base, 0);
        let bt = packed(2, F32, [4, 4, 1, 1], b, base, 1024);
        over(
            OP_OUT_PROD,
            vec![Some(a), Some(bt)],
            packed(3, F32, [32, 4, 1, 1], b, base, 2048),
            &[],
        )
    });
    // The valid forms compute.
    let (mut c, b, base) = session(&h);
    computes(&mut c, "dsv4_hc_comb", &comb(3, b, base));
    computes(&mut c, "dsv4_hc_post", &post([4, 4, 5, 1], b, base));
    let g = indexer(at_end(2, Q8_0, [64, 1, 10, 1], b, base), 1, b, base);
    computes(&mut c, "lightning_indexer of Q8_0 keys", &g);
    let a = packed(1, Q8_0, [32, 4, 1, 1], b, base, 0);
    let bt = packed(2, F32, [4, 4, 1, 1], b, base, 1024);
    let g = over(
        OP_OUT_PROD,
        vec![Some(a), Some(bt)],
        at_end(3, F32, [32, 4, 1, 1], b, base),
        &[],
    );
    computes(&mut c, "out_prod of q8_0", &g);
}

#[test]
fn backward_and_optimizer_ops_refuse_what_ggml_cpu_cannot_take() {
    let h = start_ggml();
    // SILU_BACK of a gradient of one row (at the buffer's end) for x of 4:
    // rows of x's count read from the gradient, 768 bytes past it.
    refused(&h, "silu_back of a short gradient", |b, base| {
        let g = at_end(1, F32, [64, 1, 1, 1], b, base);
        let x = packed(2, F32, [64, 4, 1, 1], b, base, 0);
        over(
            OP_SILU_BACK,
            vec![Some(g), Some(x)],
            packed(3, F32, [64, 4, 1, 1], b, base, 1024),
            &[],
        )
    });
    // RMS_NORM_BACK of F16 x (GGML_ASSERT(nb10 == sizeof(float))).
    refused(&h, "rms_norm_back of F16 x", |b, base| {
        let dz = packed(1, F32, [64, 4, 1, 1], b, base, 0);
        let x = packed(2, F16, [64, 4, 1, 1], b, base, 1024);
        over(
            OP_RMS_NORM_BACK,
            vec![Some(dz), Some(x)],
            packed(3, F32, [64, 4, 1, 1], b, base, 2048),
            &[],
        )
    });
    // SOFT_MAX_BACK (F16 y or max_bias != 0 already fail ggml-cpu's
    // supports_op): an F16 result at the buffer's end (rows of 64 floats
    // written 128 bytes apart: the last one 128 bytes past it); y of one
    // row in 4 planes, `ggml_is_contiguous` but with nb1 = 1024 (rows read
    // at `i1 * nb1`: 2 KiB past its 1 KiB at the buffer's end).
    refused(&h, "soft_max_back into F16", |b, base| {
        let dy = packed(1, F32, [64, 4, 1, 1], b, base, 0);
        let y = packed(2, F32, [64, 4, 1, 1], b, base, 1024);
        let r = at_end(3, F16, [64, 4, 1, 1], b, base);
        over(OP_SOFT_MAX_BACK, vec![Some(dy), Some(y)], r, &[])
    });
    refused(&h, "soft_max_back of rows walked by nb1", |b, base| {
        let dy = packed(1, F32, [64, 1, 4, 1], b, base, 0);
        let y = tensor(
            2,
            F32,
            [64, 1, 4, 1],
            [4, 1024, 256, 1024],
            b,
            base,
            BUF - 1024,
        );
        let r = packed(3, F32, [64, 1, 4, 1], b, base, 2048);
        over(OP_SOFT_MAX_BACK, vec![Some(dy), Some(y)], r, &[])
    });
    // ROPE_BACK of mode 5 (GGML_ABORT "rope type not supported").
    refused(&h, "rope_back mode 5", |b, base| {
        let a = packed(1, F32, [64, 4, 3, 1], b, base, 0);
        let pos = packed(2, I32, [3, 1, 1, 1], b, base, 4096);
        let r = packed(3, F32, [64, 4, 3, 1], b, base, 8192);
        over(
            OP_ROPE_BACK,
            vec![Some(a), Some(pos)],
            r,
            &[(1, 64), (2, 5)],
        )
    });
    // REPEAT_BACK of 4 columns into 3 (GGML_ASSERT(ggml_can_repeat)).
    refused(&h, "repeat_back of 4 columns into 3", |b, base| {
        let a = packed(1, F32, [4, 2, 1, 1], b, base, 0);
        over(
            OP_REPEAT_BACK,
            vec![Some(a)],
            packed(2, F32, [3, 2, 1, 1], b, base, 1024),
            &[],
        )
    });
    // CROSS_ENTROPY_LOSS of labels whose planes overlap (same shape, 160
    // bytes at the buffer's end; six rows read at 40-byte steps: 80 bytes
    // past it).
    refused(
        &h,
        "cross_entropy_loss of overlapping label planes",
        |b, base| {
            let a = packed(1, F32, [10, 2, 3, 1], b, base, 0);
            let l = tensor(2, F32, [10, 2, 3, 1], [4, 40, 40, 120], b, base, BUF - 160);
            let r = packed(3, F32, [1, 1, 1, 1], b, base, 1024);
            over(OP_CROSS_ENTROPY_LOSS, vec![Some(a), Some(l)], r, &[])
        },
    );
    // CROSS_ENTROPY_LOSS_BACK of an F16 gradient (GGML_ABORT).
    refused(
        &h,
        "cross_entropy_loss_back of an F16 gradient",
        |b, base| {
            let g = packed(1, F16, [1, 1, 1, 1], b, base, 0);
            let a = packed(2, F32, [10, 4, 1, 1], b, base, 1024);
            let l = packed(3, F32, [10, 4, 1, 1], b, base, 2048);
            let r = packed(4, F32, [10, 4, 1, 1], b, base, 4096);
            over(
                OP_CROSS_ENTROPY_LOSS_BACK,
                vec![Some(g), Some(a), Some(l)],
                r,
                &[],
            )
        },
    );
    // OPT_STEP_ADAMW / _SGD: weights with rows 128 bytes apart, a packed
    // gradient of their shape at the buffer's end: the kernels read it at
    // the weights' offsets (192 bytes past it).
    let step = |op: u32, b: u64, base: u64| {
        let strided = |id: u64, offset: u64| {
            tensor(id, F32, [16, 4, 1, 1], [4, 128, 512, 512], b, base, offset)
        };
        let mut srcs = vec![
            Some(strided(1, 0)),
            Some(at_end(2, F32, [16, 4, 1, 1], b, base)),
        ];
        let n_params = if op == OP_OPT_STEP_ADAMW {
            srcs.push(Some(strided(3, 1024)));
            srcs.push(Some(strided(4, 2048)));
            7
        } else {
            2
        };
        srcs.push(Some(packed(5, F32, [n_params, 1, 1, 1], b, base, 4096)));
        over(op, srcs, strided(6, 8192), &[])
    };
    for op in [OP_OPT_STEP_ADAMW, OP_OPT_STEP_SGD] {
        refused(
            &h,
            "optimizer step of a gradient of other strides",
            |b, base| step(op, b, base),
        );
    }
    // The valid forms compute.
    let (mut c, b, base) = session(&h);
    let g = at_end(1, F32, [64, 4, 1, 1], b, base);
    let x = packed(2, F32, [64, 4, 1, 1], b, base, 0);
    let s = over(
        OP_SILU_BACK,
        vec![Some(g), Some(x)],
        packed(3, F32, [64, 4, 1, 1], b, base, 1024),
        &[],
    );
    computes(&mut c, "silu_back", &s);
    let a = packed(1, F32, [10, 2, 3, 1], b, base, 0);
    let l = at_end(2, F32, [10, 2, 3, 1], b, base);
    let r = packed(3, F32, [1, 1, 1, 1], b, base, 1024);
    computes(
        &mut c,
        "cross_entropy_loss",
        &over(OP_CROSS_ENTROPY_LOSS, vec![Some(a), Some(l)], r, &[]),
    );
    let w = packed(1, F32, [16, 4, 1, 1], b, base, 0);
    let gr = at_end(2, F32, [16, 4, 1, 1], b, base);
    let p = packed(3, F32, [2, 1, 1, 1], b, base, 4096);
    let r = packed(4, F32, [16, 4, 1, 1], b, base, 8192);
    computes(
        &mut c,
        "opt_step_sgd",
        &over(OP_OPT_STEP_SGD, vec![Some(w), Some(gr), Some(p)], r, &[]),
    );
}

#[test]
fn col2im_and_backward_vision_ops_refuse_what_ggml_cpu_cannot_take() {
    let h = start_ggml();
    // COL2IM_1D of OC 0 (`K_OC / OC`: SIGFPE) and of stride 0 (`/ s0`).
    let col2im = |params: &[(usize, i32)], b: u64, base: u64| {
        let a = packed(1, F32, [12, 10, 1, 1], b, base, 0);
        let r = packed(2, F32, [20, 3, 1, 1], b, base, 1024);
        over(OP_COL2IM_1D, vec![Some(a)], r, params)
    };
    refused(&h, "col2im_1d of OC 0", |b, base| {
        col2im(&[(0, 2), (1, 0), (2, 1)], b, base)
    });
    refused(&h, "col2im_1d of stride 0", |b, base| {
        col2im(&[(0, 0), (1, 3), (2, 1)], b, base)
    });
    // IM2COL_BACK: stride 0 (`% s0`: SIGFPE); a gradient of one image of
    // two (at the buffer's end: the second image's columns read past it).
    let im2col_back = |g: RpcTensor, s: i32, b: u64, base: u64| {
        let k = packed(2, F32, [3, 3, 3, 1], b, base, 0);
        let r = packed(3, F32, [10, 10, 3, 2], b, base, 1024);
        let p = [(0, s), (1, s), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1)];
        over(OP_IM2COL_BACK, vec![Some(g), Some(k)], r, &p)
    };
    refused(&h, "im2col_back of stride 0", |b, base| {
        im2col_back(packed(1, F32, [27, 10, 10, 2], b, base, 8192), 0, b, base)
    });
    refused(&h, "im2col_back of one image's gradient", |b, base| {
        im2col_back(at_end(1, F32, [27, 10, 10, 1], b, base), 1, b, base)
    });
    // POOL_2D_BACK: a gradient of one plane of three (at the buffer's end,
    // read plane by plane past it); an F16 forward input (read with the F32
    // result's strides, past its end).
    let pool_back = |g: RpcTensor, f: RpcTensor, b: u64, base: u64| {
        let r = packed(3, F32, [10, 10, 3, 1], b, base, 0);
        let p = [(0, 0), (1, 1), (2, 1), (3, 1), (4, 1), (5, 0), (6, 0)];
        over(OP_POOL_2D_BACK, vec![Some(g), Some(f)], r, &p)
    };
    refused(&h, "pool_2d_back of one gradient plane", |b, base| {
        let f = packed(2, F32, [10, 10, 3, 1], b, base, 4096);
        pool_back(at_end(1, F32, [10, 10, 1, 1], b, base), f, b, base)
    });
    refused(&h, "pool_2d_back of an F16 forward input", |b, base| {
        let g = packed(1, F32, [10, 10, 3, 1], b, base, 4096);
        pool_back(g, at_end(2, F16, [10, 10, 3, 1], b, base), b, base)
    });
    // The valid forms compute.
    let (mut c, b, base) = session(&h);
    computes(
        &mut c,
        "col2im_1d",
        &col2im(&[(0, 2), (1, 3), (2, 1)], b, base),
    );
    let g = at_end(1, F32, [27, 10, 10, 2], b, base);
    computes(&mut c, "im2col_back", &im2col_back(g, 1, b, base));
    let f = packed(2, F32, [10, 10, 3, 1], b, base, 4096);
    let g = at_end(1, F32, [10, 10, 3, 1], b, base);
    computes(&mut c, "pool_2d_back", &pool_back(g, f, b, base));
}

const OP_GET_ROWS_BACK: u32 = 41;

/// GET_ROWS_BACK of the F32 gradient `grad` (id 1) by 4 I32 rows `rows`
/// (id 2 at 4096, written) into `r` (id 3): rows index `r`'s rows.
fn get_rows_back_of(
    c: &mut Client,
    grad: RpcTensor,
    rows: &[i32],
    r: RpcTensor,
    b: u64,
    base: u64,
) -> GraphPayload {
    let idx = packed(2, I32, [4, 1, 1, 1], b, base, 4096);
    c.set_tensor(&idx, 0, &i32_bytes(rows)).unwrap();
    over(OP_GET_ROWS_BACK, vec![Some(grad), Some(idx)], r, &[])
}

/// [`get_rows_back_of`] a packed [16, 4] gradient at 0 into an F32
/// [16, 5] result at the buffer's end: a row of 5 or more is added past
/// it (GGML_ASSERT(r >= 0 && r < dst->ne[1]) aborts first).
fn get_rows_back(c: &mut Client, rows: &[i32], b: u64, base: u64) -> GraphPayload {
    let grad = packed(1, F32, [16, 4, 1, 1], b, base, 0);
    let r = at_end(3, F32, [16, 5, 1, 1], b, base);
    get_rows_back_of(c, grad, rows, r, b, base)
}

#[test]
fn get_rows_back_rows_are_checked_on_every_run() {
    let h = start_ggml();
    for bad in [5, -1, i32::MAX, i32::MIN] {
        refused_with(&h, &format!("get_rows_back row {bad}"), |c, b, base| {
            get_rows_back(c, &[0, 4, bad, 1], b, base)
        });
    }
    // Rows of a strided view [2, 2] (nb1 = 16): the range check walks
    // elements 0, 1, 4, 5 (in range), the kernel reads 0..4 flat (9 is
    // past the 5 result rows).
    refused_with(&h, "get_rows_back of strided rows", |c, b, base| {
        let mut g = get_rows_back(c, &[0, 1, 9, 9], b, base);
        let idx = &mut g.tensors[1];
        idx.ne = [2, 2, 1, 1];
        idx.nb = [4, 16, 32, 32];
        c.set_tensor(idx, 0, &i32_bytes(&[0, 1, 9, 9, 2, 3]))
            .unwrap();
        g
    });
    // An F16 result [16, 5] at the buffer's end: the kernel adds rows of
    // 16 floats at `r * nb1` (row 4: 32 bytes past it).
    refused_with(&h, "get_rows_back into F16", |c, b, base| {
        let grad = packed(1, F32, [16, 4, 1, 1], b, base, 0);
        let r = at_end(3, F16, [16, 5, 1, 1], b, base);
        get_rows_back_of(c, grad, &[0, 1, 2, 4], r, b, base)
    });
    // A gradient of 2 rows for 4 indices (at the buffer's end): rows 2 and
    // 3 are read past it.
    refused_with(&h, "get_rows_back of a short gradient", |c, b, base| {
        let grad = at_end(1, F32, [16, 2, 1, 1], b, base);
        let r = packed(3, F32, [16, 5, 1, 1], b, base, 8192);
        get_rows_back_of(c, grad, &[0, 1, 2, 3], r, b, base)
    });

    // Valid rows compute (one row twice: its gradients add), then another
    // session rewrites them between GRAPH_COMPUTE and GRAPH_RECOMPUTE: the
    // recompute is refused.
    let before = h.shared().refused_connections();
    let (mut c, b, base) = session(&h);
    let g = get_rows_back(&mut c, &[4, 0, 4, 2], b, base);
    c.set_tensor(&g.tensors[0], 0, &f32_bytes(&[1.0; 64]))
        .unwrap();
    computes(&mut c, "get_rows_back", &g);
    let sums = read(&mut c, &g.tensors[2], 80);
    let row = |i: usize| sums[16 * i];
    assert_eq!(
        [row(0), row(1), row(2), row(3), row(4)],
        [1.0, 0.0, 1.0, 0.0, 2.0]
    );
    let mut other = connect(&h);
    other
        .set_tensor(&g.tensors[1], 0, &i32_bytes(&[4, 0, 5, 2]))
        .unwrap();
    // SET_TENSOR has no answer: read the rows back so the write has
    // landed before the recompute.
    assert_eq!(
        other.get_tensor(&g.tensors[1], 0, 16).unwrap(),
        i32_bytes(&[4, 0, 5, 2])
    );
    c.graph_recompute(0).unwrap();
    assert!(is_closed(&mut c), "recompute with row 5 was not refused");
    wait_refused(&h, before + 1);
    server_still_computes(&h);

    // The same node listed twice, a CPY between the two runs writing 7.0
    // (as I32) over the rows: checked before each run, the second is
    // refused.
    refused_with(&h, "rows rewritten between two runs", |c, b, base| {
        let mut g = get_rows_back(c, &[0, 1, 2, 3], b, base);
        let sevens = packed(5, F32, [4, 1, 1, 1], b, base, 12288);
        c.set_tensor(&sevens, 0, &f32_bytes(&[7.0; 4])).unwrap();
        let mut rows6 = g.tensors[1].clone();
        rows6.id = 6;
        let mut cpy = node(rows6.clone(), OP_CPY, &[5, 6]);
        cpy.id = 7;
        g.tensors.extend([sevens, rows6, cpy]);
        g.nodes = vec![3, 7, 3];
        g
    });
    // Listed twice without a writer between: both runs compute.
    let (mut c, b, base) = session(&h);
    let mut g = get_rows_back(&mut c, &[0, 1, 2, 3], b, base);
    g.nodes = vec![3, 3];
    computes(&mut c, "get_rows_back twice", &g);
}

const OP_ADD: u32 = 2;
const OP_MUL: u32 = 7;
const OP_SUM: u32 = 14;
const OP_NORM: u32 = 24;
const OP_RMS_NORM: u32 = 25;
const OP_GLU: u32 = 100;
const OP_SCALE: u32 = 32;
const GLU_SWIGLU: i32 = 2;

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-4, "{what}: got {got:?}, want {want:?}");
    }
}

/// F16 bits of `v` (exact for the small integers used here).
fn f16_bits(v: f32) -> u16 {
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    if v == 0.0 {
        return sign;
    }
    let exp = ((bits >> 23) & 0xff) as i32 - 127 + 15;
    let mant = ((bits >> 13) & 0x3ff) as u16;
    sign | ((exp as u16) << 10) | mant
}

fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|&x| f16_bits(x).to_le_bytes()).collect()
}

fn f16_floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(2)
        .map(|c| {
            let h = u16::from_le_bytes([c[0], c[1]]);
            let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
            let exp = i32::from((h >> 10) & 0x1f);
            let mant = f32::from(h & 0x3ff);
            if exp == 0 {
                sign * mant * 2f32.powi(-24)
            } else {
                sign * (1.0 + mant / 1024.0) * 2f32.powi(exp - 15)
            }
        })
        .collect()
}

/// Issue 22 (coverage): the forms of test-backend-ops that ggml-cpu
/// computes and the rules refused (a src1 of binary ops with rows not
/// packed, NORM of non-packed rows, GLU of an odd row, SUM of a permuted
/// source) now compute, with ggml-cpu's values; the neighbouring forms
/// whose kernels GGML_ASSERT stay refused.
#[test]
fn issue_22_forms_compute_and_their_asserting_neighbours_stay_refused() {
    let h = start_ggml();
    // apply_binary_op (binary-ops.cpp): GGML_ASSERT(nb00 == sizeof(src0_t))
    // and GGML_ASSERT(nb0 == sizeof(dst_t)): a permuted src0 or result
    // aborts (only src1 is read by its strides).
    refused(&h, "add of a permuted src0", |b, base| {
        let a = tensor(1, F32, [4, 3, 1, 1], [12, 4, 48, 48], b, base, 0);
        let y = packed(2, F32, [4, 3, 1, 1], b, base, 1024);
        let r = node(packed(3, F32, [4, 3, 1, 1], b, base, 2048), OP_ADD, &[1, 2]);
        one_node(vec![a, y, r])
    });
    refused(&h, "mul into a permuted result", |b, base| {
        let a = packed(1, F32, [4, 3, 1, 1], b, base, 0);
        let y = packed(2, F32, [4, 3, 1, 1], b, base, 1024);
        let r = tensor(3, F32, [4, 3, 1, 1], [12, 4, 48, 48], b, base, 2048);
        one_node(vec![a, y, node(r, OP_MUL, &[1, 2])])
    });
    // rms_norm_f32 (ops.cpp): GGML_ASSERT(src0->nb[0] == sizeof(float));
    // NORM of the same source computes (below).
    refused(&h, "rms_norm of a permuted source", |b, base| {
        let a = tensor(1, F32, [4, 3, 1, 1], [12, 4, 48, 48], b, base, 0);
        let mut r = node(
            packed(2, F32, [4, 3, 1, 1], b, base, 1024),
            OP_RMS_NORM,
            &[1],
        );
        set_f32(&mut r, 0, 1e-5);
        one_node(vec![a, r])
    });

    let (mut c, b, base) = session(&h);
    // x: a [3, 4] matrix stored packed; its transpose [4, 3] is the
    // permuted view (nb = [12, 4]) test-backend-ops makes.
    let x: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let stored = packed(1, F32, [3, 4, 1, 1], b, base, 0);
    c.set_tensor(&stored, 0, &f32_bytes(&x)).unwrap();
    let view = tensor(1, F32, [4, 3, 1, 1], [12, 4, 48, 48], b, base, 0);
    // view element (i0, i1) lies at i0 * 12 + i1 * 4 bytes: x[i0 * 3 + i1].
    let view_rows: Vec<Vec<f32>> = (0..3)
        .map(|i1| (0..4).map(|i0| x[i0 * 3 + i1]).collect())
        .collect();

    // ADD of a packed src0 and the permuted src1, F32.
    let a = packed(2, F32, [4, 3, 1, 1], b, base, 1024);
    let ones: Vec<f32> = (0..12).map(|i| 100.0 * i as f32).collect();
    c.set_tensor(&a, 0, &f32_bytes(&ones)).unwrap();
    let r = node(packed(3, F32, [4, 3, 1, 1], b, base, 2048), OP_ADD, &[2, 1]);
    computes(
        &mut c,
        "add of a permuted src1",
        &one_node(vec![view.clone(), a, r.clone()]),
    );
    let want: Vec<f32> = view_rows
        .iter()
        .flatten()
        .zip(&ones)
        .map(|(v, o)| v + o)
        .collect();
    assert_close(&read(&mut c, &r, 12), &want, "add of a permuted src1");

    // F16: src0 packed F16, src1 the permuted F16 view of a [3, 4] store.
    let stored16 = packed(4, F16, [3, 4, 1, 1], b, base, 4096);
    c.set_tensor(&stored16, 0, &f16_bytes(&x)).unwrap();
    let view16 = tensor(4, F16, [4, 3, 1, 1], [6, 2, 24, 24], b, base, 4096);
    let a16 = packed(5, F16, [4, 3, 1, 1], b, base, 5120);
    c.set_tensor(&a16, 0, &f16_bytes(&ones)).unwrap();
    let r16 = node(packed(6, F16, [4, 3, 1, 1], b, base, 6144), OP_MUL, &[5, 4]);
    computes(
        &mut c,
        "f16 mul of a permuted src1",
        &one_node(vec![view16, a16, r16.clone()]),
    );
    let got = f16_floats(&c.get_tensor(&r16, 0, 24).unwrap());
    let want: Vec<f32> = view_rows
        .iter()
        .flatten()
        .zip(&ones)
        .map(|(v, o)| v * o)
        .collect();
    for (g, w) in got.iter().zip(&want) {
        assert!(
            (g - w).abs() <= w.abs() / 512.0,
            "f16 mul: got {got:?}, want {want:?}"
        );
    }

    // NORM of the permuted view: rows of 4 elements 12 bytes apart.
    let mut n = node(packed(7, F32, [4, 3, 1, 1], b, base, 7168), OP_NORM, &[1]);
    set_f32(&mut n, 0, 1e-5);
    computes(
        &mut c,
        "norm of permuted rows",
        &one_node(vec![view.clone(), n.clone()]),
    );
    let want: Vec<f32> = view_rows
        .iter()
        .flat_map(|row| {
            let mean = row.iter().sum::<f32>() / 4.0;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / 4.0;
            let scale = 1.0 / (var + 1e-5).sqrt();
            row.iter()
                .map(move |v| (v - mean) * scale)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_close(&read(&mut c, &n, 12), &want, "norm of permuted rows");

    // SWIGLU of rows of 5 (odd): nc = 2, halves [0, 2) and [2, 4); the
    // fifth element is never read.
    let g5 = packed(8, F32, [5, 2, 1, 1], b, base, 8192);
    let v5 = [0.5f32, -1.0, 2.0, 3.0, 99.0, 1.0, 2.0, -0.5, 4.0, 99.0];
    c.set_tensor(&g5, 0, &f32_bytes(&v5)).unwrap();
    let mut s = node(packed(9, F32, [2, 2, 1, 1], b, base, 9216), OP_GLU, &[8]);
    s.op_params[0] = GLU_SWIGLU;
    computes(&mut c, "swiglu of odd rows", &one_node(vec![g5, s.clone()]));
    let silu = |v: f32| v / (1.0 + (-v).exp());
    let want = [
        silu(0.5) * 2.0,
        silu(-1.0) * 3.0,
        silu(1.0) * -0.5,
        silu(2.0) * 4.0,
    ];
    assert_close(&read(&mut c, &s, 4), &want, "swiglu of odd rows");

    // SCALE of BF16 (scale_bf16: 2 x + 1, bf16 out) computes; F16 has no
    // kernel (GGML_ABORT in ggml_compute_forward_scale) and stays refused.
    let x16 = packed(11, BF16, [4, 2, 1, 1], b, base, 11264);
    let bf16 = |v: f32| ((v.to_bits() >> 16) as u16).to_le_bytes();
    let xs = [1.0f32, 2.0, -3.0, 0.5, 4.0, 8.0, -1.0, 0.0];
    let bytes: Vec<u8> = xs.iter().flat_map(|&v| bf16(v)).collect();
    c.set_tensor(&x16, 0, &bytes).unwrap();
    let mut sc = node(
        packed(12, BF16, [4, 2, 1, 1], b, base, 12288),
        OP_SCALE,
        &[11],
    );
    set_f32(&mut sc, 0, 2.0);
    set_f32(&mut sc, 1, 1.0);
    computes(&mut c, "scale of bf16", &one_node(vec![x16, sc.clone()]));
    let got: Vec<f32> = c
        .get_tensor(&sc, 0, 16)
        .unwrap()
        .chunks_exact(2)
        .map(|h| f32::from_bits(u32::from(u16::from_le_bytes([h[0], h[1]])) << 16))
        .collect();
    let want: Vec<f32> = xs.iter().map(|v| 2.0 * v + 1.0).collect();
    assert_close(&got, &want, "scale of bf16");
    refused(&h, "scale of f16", |b, base| {
        let a = packed(1, F16, [4, 2, 1, 1], b, base, 0);
        let mut r = node(packed(2, F16, [4, 2, 1, 1], b, base, 1024), OP_SCALE, &[1]);
        set_f32(&mut r, 0, 2.0);
        one_node(vec![a, r])
    });

    // IM2COL_3D of IC 3 over a one-plane image: N = 0, so the builder's
    // result is empty and ggml never computes it (test-backend-ops' v = 1
    // views); the same with a non-empty result divides by N = 0 and stays
    // refused (im2col_3d_refuses_what_ggml_cpu_cannot_take).
    let g = im2col_3d(3, packed(13, F32, [24, 3, 3, 0], b, base, 13312), b, base);
    computes(&mut c, "im2col_3d with an empty result", &g);

    // SUM of the permuted view: ggml-cpu sums ne00 = 4 packed floats from
    // each row's start (row i1 at 4 * i1 bytes): x[i1..i1 + 4].
    let sum = node(packed(10, F32, [1, 1, 1, 1], b, base, 10240), OP_SUM, &[1]);
    computes(
        &mut c,
        "sum of a permuted source",
        &one_node(vec![view, sum.clone()]),
    );
    let want: f32 = (0..3).map(|i1| x[i1..i1 + 4].iter().sum::<f32>()).sum();
    assert_close(&read(&mut c, &sum, 1), &[want], "sum of a permuted source");
}
