//! Graphs that pass the wire checks but would make a ggml-cpu kernel abort
//! the process (GGML_ASSERT / GGML_ABORT) or write outside its tensor, each
//! sent as a hand-made GRAPH_COMPUTE to a real server computing on ggml's
//! CPU backend (run with `--features ggml`). Each must be refused: that
//! connection closes, the server keeps serving and computes a valid graph
//! afterwards. Next to each refusal, the valid form of the same op must
//! still compute (the op_shapes rules may not refuse what ggml computes).
//! The server runs in this process: a kernel abort fails the whole binary.
#![cfg(feature = "ggml")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::crash_harness::*;
use common::*;
use transfer_rpc::protocol::{GraphPayload, RpcTensor};

const F32: u32 = 0;
const F16: u32 = 1;
const I32: u32 = 26;
const BF16: u32 = 30;

const OP_NORM: u32 = 24;
const OP_RMS_NORM: u32 = 25;
const OP_MUL_MAT: u32 = 29;
const OP_SCALE: u32 = 32;
const OP_ROPE: u32 = 48;
const OP_FLASH_ATTN_EXT: u32 = 74;
const OP_UNARY: u32 = 91;
const OP_GLU: u32 = 100;

const UNARY_XIELU: i32 = 17;
const GLU_SWIGLU: i32 = 2;
const GLU_SWIGLU_OAI: i32 = 3;
const GLU_SWIGLU_CLAMP: i32 = 6;

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-4, "{what}: got {got:?}, want {want:?}");
    }
}

/// NORM / RMS_NORM of a [4, 2] F32 matrix with eps `eps`.
fn norm_graph(op: u32, eps: f32, b: u64, base: u64) -> GraphPayload {
    let a = packed(1, F32, [4, 2, 1, 1], b, base, 0);
    let mut r = node(packed(2, F32, [4, 2, 1, 1], b, base, 1024), op, &[1]);
    set_f32(&mut r, 0, eps);
    one_node(vec![a, r])
}

#[test]
fn norm_eps_must_be_non_negative() {
    let h = start_ggml();
    // ggml_compute_forward_norm_f32 / rms_norm_f32: GGML_ASSERT(eps >= 0.0f).
    for op in [OP_NORM, OP_RMS_NORM] {
        for eps in [-1e-5f32, f32::NAN, f32::NEG_INFINITY] {
            refused(&h, &format!("op {op} eps {eps}"), |b, base| {
                norm_graph(op, eps, b, base)
            });
        }
    }
    // eps = 1e-5 computes (and so does 0).
    let (mut c, b, base) = session(&h);
    let x = [1.0f32, 2.0, 3.0, 4.0, -1.0, 1.0, -1.0, 1.0];
    for (op, eps) in [(OP_RMS_NORM, 1e-5f32), (OP_NORM, 1e-5), (OP_RMS_NORM, 0.0)] {
        let g = norm_graph(op, eps, b, base);
        c.set_tensor(&g.tensors[0], 0, &f32_bytes(&x)).unwrap();
        computes(&mut c, "norm", &g);
        let want: Vec<f32> = x
            .chunks(4)
            .flat_map(|row| {
                let mean = if op == OP_NORM {
                    row.iter().sum::<f32>() / 4.0
                } else {
                    0.0
                };
                let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / 4.0;
                let scale = 1.0 / (var + eps).sqrt();
                row.iter()
                    .map(move |v| (v - mean) * scale)
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_close(&read(&mut c, &g.tensors[1], 8), &want, "norm");
    }
}

#[test]
fn scale_needs_contiguous_tensors_with_flat_rows() {
    let h = start_ggml();
    // ggml_compute_forward_scale_f32: GGML_ASSERT(ggml_is_contiguous(src0)):
    // rows padded to 32 bytes.
    refused(&h, "scale of a non-contiguous source", |b, base| {
        let a = tensor(1, F32, [4, 3, 1, 1], [4, 32, 96, 96], b, base, 0);
        let mut r = node(packed(2, F32, [4, 3, 1, 1], b, base, 1024), OP_SCALE, &[1]);
        set_f32(&mut r, 0, 2.0);
        one_node(vec![a, r])
    });
    refused(&h, "scale into a non-contiguous result", |b, base| {
        let a = packed(1, F32, [4, 3, 1, 1], b, base, 0);
        let r = tensor(2, F32, [4, 3, 1, 1], [4, 32, 96, 96], b, base, 1024);
        one_node(vec![a, node(r, OP_SCALE, &[1])])
    });
    // Contiguous for ggml (ne[1] == 1 leaves nb[1] free), but the kernel
    // writes row i of the 3 at i * nb[1]: 1 MiB and 2 MiB into a 64 KiB
    // buffer.
    refused(&h, "scale with nb[1] of a size-1 dim", |b, base| {
        let a = packed(1, F32, [4, 1, 3, 1], b, base, 0);
        let r = tensor(2, F32, [4, 1, 3, 1], [4, 1 << 20, 16, 48], b, base, 1024);
        one_node(vec![a, node(r, OP_SCALE, &[1])])
    });
    refused(&h, "scale reading nb[1] of a size-1 dim", |b, base| {
        let a = tensor(1, F32, [4, 1, 3, 1], [4, 1 << 20, 16, 48], b, base, 0);
        let r = packed(2, F32, [4, 1, 3, 1], b, base, 1024);
        one_node(vec![a, node(r, OP_SCALE, &[1])])
    });
    // Packed tensors compute s * x + bias, with and without bias, and with
    // a size-1 dim 1 whose nb[1] is the row size.
    let (mut c, b, base) = session(&h);
    let x: Vec<f32> = (0..12).map(|i| i as f32).collect();
    for (ne, bias) in [
        ([4, 3, 1, 1], 0.0f32),
        ([4, 3, 1, 1], 1.0),
        ([4, 1, 3, 1], 0.5),
    ] {
        let a = packed(1, F32, ne, b, base, 0);
        c.set_tensor(&a, 0, &f32_bytes(&x)).unwrap();
        let mut r = node(packed(2, F32, ne, b, base, 1024), OP_SCALE, &[1]);
        set_f32(&mut r, 0, 2.0);
        set_f32(&mut r, 1, bias);
        computes(&mut c, "scale", &one_node(vec![a, r.clone()]));
        let want: Vec<f32> = x.iter().map(|v| 2.0 * v + bias).collect();
        assert_close(&read(&mut c, &r, 12), &want, "scale");
    }
}

/// SWIGLU(a) of an F32 `[8, 2, 3]` source laid out with strides `nb`, into
/// a packed `[4, 2, 3]` result.
fn swiglu_split(nb: [u32; 4], b: u64, base: u64) -> GraphPayload {
    let a = tensor(1, F32, [8, 2, 3, 1], nb, b, base, 0);
    let mut r = node(packed(2, F32, [4, 2, 3, 1], b, base, 4096), OP_GLU, &[1]);
    r.op_params[0] = GLU_SWIGLU;
    one_node(vec![a, r])
}

#[test]
fn unary_and_glu_need_dims_past_1_packed() {
    let h = start_ggml();
    // apply_unary_op_functor (XIELU): GGML_ASSERT(ggml_is_contiguous_1(src0)
    // && ggml_is_contiguous_1(dst)); dim 2 here starts 64 bytes apart, not
    // ne1 * nb1 = 32.
    let xielu = |a: RpcTensor, r: RpcTensor| {
        let mut r = node(r, OP_UNARY, &[1]);
        r.op_params[0] = UNARY_XIELU;
        set_f32(&mut r, 1, 0.8);
        set_f32(&mut r, 2, 0.8);
        set_f32(&mut r, 3, 0.5);
        set_f32(&mut r, 4, -1e-6);
        one_node(vec![a, r])
    };
    refused(&h, "xielu of a source with dim 2 not packed", |b, base| {
        xielu(
            tensor(1, F32, [4, 2, 3, 1], [4, 16, 64, 192], b, base, 0),
            packed(2, F32, [4, 2, 3, 1], b, base, 1024),
        )
    });
    refused(
        &h,
        "xielu into a result with dim 2 not packed",
        |b, base| {
            xielu(
                packed(1, F32, [4, 2, 3, 1], b, base, 0),
                tensor(2, F32, [4, 2, 3, 1], [4, 16, 64, 192], b, base, 1024),
            )
        },
    );
    // Every glu kernel: GGML_ASSERT(ggml_is_contiguous_1(src0)), (src1), (dst).
    refused(&h, "swiglu of a source with dim 2 not packed", |b, base| {
        swiglu_split([4, 32, 128, 384], b, base)
    });
    refused(
        &h,
        "swiglu into a result with dim 2 not packed",
        |b, base| {
            let a = packed(1, F32, [8, 2, 3, 1], b, base, 0);
            let r = tensor(2, F32, [4, 2, 3, 1], [4, 16, 64, 192], b, base, 4096);
            let mut r = node(r, OP_GLU, &[1]);
            r.op_params[0] = GLU_SWIGLU;
            one_node(vec![a, r])
        },
    );
    refused(
        &h,
        "swiglu with a gate whose dim 2 is not packed",
        |b, base| {
            let a = packed(1, F32, [4, 2, 3, 1], b, base, 0);
            let g = tensor(2, F32, [4, 2, 3, 1], [4, 16, 64, 192], b, base, 1024);
            let mut r = node(packed(3, F32, [4, 2, 3, 1], b, base, 4096), OP_GLU, &[1, 2]);
            r.op_params[0] = GLU_SWIGLU;
            one_node(vec![a, g, r])
        },
    );

    let (mut c, b, base) = session(&h);
    // Packed XIELU computes; so does a source whose dim 1 alone is padded
    // (rows 32 bytes apart, dim 2 at ne1 * nb1): contiguous_1 frees dim 1.
    for a in [
        packed(1, F32, [4, 2, 3, 1], b, base, 0),
        tensor(1, F32, [4, 2, 3, 1], [4, 32, 64, 192], b, base, 0),
    ] {
        computes(
            &mut c,
            "xielu",
            &xielu(a, packed(2, F32, [4, 2, 3, 1], b, base, 1024)),
        );
    }
    // SWIGLU of a packed source, and of one with padded rows: silu(x) * g.
    let x: Vec<f32> = (0..48).map(|i| (i as f32 - 24.0) / 8.0).collect();
    for nb in [[4, 32, 64, 192], [4, 64, 128, 384]] {
        let g = swiglu_split(nb, b, base);
        let a = &g.tensors[0];
        // Write the 6 rows of 8 at their strided places.
        for row in 0..6u64 {
            let vals = &x[row as usize * 8..row as usize * 8 + 8];
            let mut t = a.clone();
            t.ne = [8, 1, 1, 1];
            t.nb = [4, 32, 32, 32];
            t.data = a.data + row * u64::from(nb[1]);
            c.set_tensor(&t, 0, &f32_bytes(vals)).unwrap();
        }
        computes(&mut c, "swiglu", &g);
        let want: Vec<f32> = x
            .chunks(8)
            .flat_map(|row| {
                (0..4)
                    .map(|k| row[k] / (1.0 + (-row[k]).exp()) * row[k + 4])
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_close(&read(&mut c, &g.tensors[1], 24), &want, "swiglu");
    }
}

/// A GLU `glu` of `ty` over a [8, 2] source into [4, 2], limit `limit`.
fn glu_graph(glu: i32, ty: u32, limit: f32, b: u64, base: u64) -> GraphPayload {
    let a = packed(1, ty, [8, 2, 1, 1], b, base, 0);
    let mut r = node(packed(2, ty, [4, 2, 1, 1], b, base, 1024), OP_GLU, &[1]);
    r.op_params[0] = glu;
    set_f32(&mut r, 2, 1.702);
    set_f32(&mut r, 3, limit);
    one_node(vec![a, r])
}

/// ROPE of an F32 or F16 `[ne0, 2, 3]` source (3 positions 0, 1, 2 at
/// 2048), `n_dims`, `mode`, `n_offs`, optional frequency factors (`[n]` at
/// `ff_offset`), into a result at the end of the buffer.
#[allow(clippy::too_many_arguments)]
fn rope_graph(
    ty: u32,
    ne0: u32,
    n_dims: i32,
    mode: i32,
    n_offs: i32,
    ff: Option<(u32, u64)>,
    b: u64,
    base: u64,
) -> GraphPayload {
    let a = packed(1, ty, [ne0, 2, 3, 1], b, base, 0);
    let pos = packed(2, I32, [3, 1, 1, 1], b, base, 2048);
    let mut tensors = vec![a, pos];
    let mut srcs = vec![1, 2];
    if let Some((n, offset)) = ff {
        tensors.push(packed(3, F32, [n, 1, 1, 1], b, base, offset));
        srcs.push(3);
    }
    // The result ends where the buffer ends: a write past it faults.
    let r_offset = BUF - u64::from(ne0 * 6 * layout(ty).1);
    let mut r = node(
        packed(4, ty, [ne0, 2, 3, 1], b, base, r_offset),
        OP_ROPE,
        &srcs,
    );
    r.op_params[1] = n_dims;
    r.op_params[2] = mode;
    r.op_params[4] = 4096;
    set_f32(&mut r, 5, 10000.0);
    set_f32(&mut r, 6, 1.0);
    set_f32(&mut r, 8, 1.0);
    set_f32(&mut r, 9, 32.0);
    set_f32(&mut r, 10, 1.0);
    r.op_params[15] = n_offs;
    tensors.push(r);
    one_node(tensors)
}

#[test]
fn ops_without_a_kernel_for_the_type_are_refused() {
    let h = start_ggml();
    // ggml_compute_forward_swiglu_oai: F32 only, GGML_ABORT otherwise;
    // swiglu_clamp: F32 and F16.
    refused(&h, "swiglu_oai on F16", |b, base| {
        glu_graph(GLU_SWIGLU_OAI, F16, 7.0, b, base)
    });
    refused(&h, "swiglu_oai on BF16", |b, base| {
        glu_graph(GLU_SWIGLU_OAI, BF16, 7.0, b, base)
    });
    refused(&h, "swiglu_clamp on BF16", |b, base| {
        glu_graph(GLU_SWIGLU_CLAMP, BF16, 7.0, b, base)
    });
    // std::clamp(x, -limit, limit) needs -limit <= limit.
    for limit in [-1.0f32, f32::NAN] {
        for glu in [GLU_SWIGLU_OAI, GLU_SWIGLU_CLAMP] {
            refused(&h, &format!("glu {glu} limit {limit}"), |b, base| {
                glu_graph(glu, F32, limit, b, base)
            });
        }
    }
    // ggml_compute_forward_rope: F16 and F32 only, GGML_ABORT on BF16.
    refused(&h, "rope on BF16", |b, base| {
        rope_graph(BF16, 8, 4, 0, 0, None, b, base)
    });

    let (mut c, b, base) = session(&h);
    // swiglu_oai F32: min(x, limit) * sigmoid(alpha x) * (clamp(g) + 1).
    let x: Vec<f32> = (0..16).map(|i| (i as f32 - 8.0) / 4.0).collect();
    let g = glu_graph(GLU_SWIGLU_OAI, F32, 7.0, b, base);
    c.set_tensor(&g.tensors[0], 0, &f32_bytes(&x)).unwrap();
    computes(&mut c, "swiglu_oai", &g);
    let want: Vec<f32> = x
        .chunks(8)
        .flat_map(|row| {
            (0..4)
                .map(|k| {
                    let v = row[k].min(7.0);
                    v / (1.0 + (-1.702 * v).exp()) * (row[k + 4].clamp(-7.0, 7.0) + 1.0)
                })
                .collect::<Vec<_>>()
        })
        .collect();
    assert_close(&read(&mut c, &g.tensors[1], 8), &want, "swiglu_oai");
    for (glu, ty) in [
        (GLU_SWIGLU_CLAMP, F32),
        (GLU_SWIGLU_CLAMP, F16),
        (GLU_SWIGLU, BF16),
    ] {
        computes(&mut c, "glu", &glu_graph(glu, ty, 7.0, b, base));
    }
    for ty in [F32, F16] {
        computes(&mut c, "rope", &rope_graph(ty, 8, 4, 0, 0, None, b, base));
    }
}

#[test]
fn rope_offsets_row_length_and_frequency_factors() {
    let h = start_ggml();
    // GGML_ASSERT(n_offs >= 0), (n_offs % 2 == 0), (n_offs + n_dims <= ne0).
    for (n_offs, mode) in [(1, 0), (3, 2), (-2, 0), (6, 0), (6, 2)] {
        refused(
            &h,
            &format!("rope n_offs {n_offs} mode {mode}"),
            |b, base| rope_graph(F32, 8, 4, mode, n_offs, None, b, base),
        );
    }
    // n_dims odd or past the row (GGML_ASSERT(n_dims % 2 == 0), (n_dims <= ne0)).
    for n_dims in [3, 10] {
        refused(&h, &format!("rope n_dims {n_dims}"), |b, base| {
            rope_graph(F32, 8, n_dims, 0, 0, None, b, base)
        });
    }
    // Odd rows: the pass that copies the unrotated channels by pairs writes
    // one element past each row, the last one past the buffer's end.
    refused(&h, "rope of rows of odd length", |b, base| {
        rope_graph(F32, 7, 4, 0, 0, None, b, base)
    });
    // Multi-rope and vision modes without sections (GGML_ASSERT(sections[0]
    // > 0 || ...)) and with one position per token (they read four):
    // served forms in validator_crashes_ops.rs.
    for mode in [8, 24, 40] {
        refused(&h, &format!("rope mode {mode}"), |b, base| {
            rope_graph(F32, 8, 4, mode, 0, None, b, base)
        });
    }
    // The cache init reads ne0 / 2 = 4 frequency factors whatever n_dims;
    // 2 factors (n_dims / 2) in the last 8 bytes of the buffer: it would
    // read past the buffer's end.
    refused(
        &h,
        "rope frequency factors at the buffer's end",
        |b, base| rope_graph(F32, 8, 4, 0, 0, Some((2, BUF - 8)), b, base),
    );

    let (mut c, b, base) = session(&h);
    let x: Vec<f32> = (0..48).map(|i| i as f32 * 0.25 - 3.0).collect();
    let pos: Vec<u8> = [0i32, 1, 2].iter().flat_map(|p| p.to_le_bytes()).collect();
    c.set_tensor(&packed(2, I32, [3, 1, 1, 1], b, base, 2048), 0, &pos)
        .unwrap();
    let ff = packed(3, F32, [2, 1, 1, 1], b, base, 3072);
    c.set_tensor(&ff, 0, &f32_bytes(&[1.0, 1.0])).unwrap();
    // n_offs 2 with n_dims 4 of 8: channels 0, 1, 6, 7 are copied, the
    // rest rotated (identity at position 0); partial-rotary frequency
    // factors (n_dims / 2 of them) inside the buffer are fine.
    for (mode, n_offs, ff) in [
        (0, 2, None),
        (2, 2, None),
        (0, 4, None),
        (2, 0, Some((2, 3072))),
    ] {
        let g = rope_graph(F32, 8, 4, mode, n_offs, ff, b, base);
        c.set_tensor(&g.tensors[0], 0, &f32_bytes(&x)).unwrap();
        computes(&mut c, "rope", &g);
        let got = read(&mut c, g.tensors.last().unwrap(), 48);
        for (i, (g, w)) in got.iter().zip(&x).enumerate() {
            let (ch, token) = (i % 8, i / 16);
            let rotated = (n_offs as usize..n_offs as usize + 4).contains(&ch);
            if !rotated || token == 0 {
                assert!((g - w).abs() < 1e-6, "mode {mode} n_offs {n_offs}: {got:?}");
            }
        }
        let moved = got.iter().zip(&x).any(|(g, w)| (g - w).abs() > 1e-3);
        assert!(moved, "mode {mode} n_offs {n_offs}: nothing rotated");
    }
}

/// MUL_MAT of an F32 `[k, m]` matrix (at 0) by `[k, 2]` (at 8192) into a
/// result with strides `nb` at `r_offset`; `hint` in op_params[1].
fn mul_mat_graph(
    k: u32,
    m: u32,
    nb: Option<[u32; 4]>,
    r_offset: u64,
    hint: i32,
    b: u64,
    base: u64,
) -> GraphPayload {
    let a = packed(1, F32, [k, m, 1, 1], b, base, 0);
    let x = packed(2, F32, [k, 2, 1, 1], b, base, 8192);
    let r = match nb {
        Some(nb) => tensor(3, F32, [m, 2, 1, 1], nb, b, base, r_offset),
        None => packed(3, F32, [m, 2, 1, 1], b, base, r_offset),
    };
    let mut r = node(r, OP_MUL_MAT, &[1, 2]);
    r.op_params[1] = hint;
    one_node(vec![a, x, r])
}

#[test]
fn mul_mat_hadamard_hint_needs_a_square_power_of_two() {
    let h = start_ggml();
    // ggml_compute_forward_fwht: GGML_ASSERT((n & (n - 1)) == 0), n = K.
    refused(&h, "hadamard mul_mat with K = 6", |b, base| {
        mul_mat_graph(6, 6, None, 16384, 1, b, base)
    });
    // K = 16 floats written into each result row of 4: the last row's
    // write runs past the buffer's end.
    refused(
        &h,
        "hadamard mul_mat with K past the result row",
        |b, base| mul_mat_graph(16, 4, None, BUF - 32, 1, b, base),
    );
    // The same shapes without the hint are an ordinary product.
    let (mut c, b, base) = session(&h);
    computes(
        &mut c,
        "mul_mat",
        &mul_mat_graph(16, 4, None, BUF - 32, 0, b, base),
    );
    // A 4 x 4 Hadamard product is the Walsh-Hadamard transform of each
    // row of src1 scaled by 1/2 (src0's values are not read).
    let g = mul_mat_graph(4, 4, None, 16384, 1, b, base);
    c.set_tensor(
        &g.tensors[1],
        0,
        &f32_bytes(&[1.0, 2.0, 3.0, 4.0, 1.0, 1.0, 1.0, 1.0]),
    )
    .unwrap();
    computes(&mut c, "hadamard mul_mat", &g);
    assert_close(
        &read(&mut c, &g.tensors[2], 8),
        &[5.0, -1.0, -2.0, 0.0, 2.0, 0.0, 0.0, 0.0],
        "hadamard",
    );
}

/// FLASH_ATTN_EXT of one F32 query [4] over 2 F32 keys / values, scale 1,
/// precision `prec`, into a result with strides `nb` at `r_offset`.
fn flash_attn_graph(
    nb: [u32; 4],
    ne: [u32; 4],
    r_offset: u64,
    prec: i32,
    b: u64,
    base: u64,
) -> GraphPayload {
    let q = packed(1, F32, [4, 1, ne[1], 1], b, base, 0);
    let k = packed(2, F32, [4, 2, 1, 1], b, base, 1024);
    let v = packed(3, F32, [4, 2, 1, 1], b, base, 2048);
    let mut r = node(
        tensor(4, F32, ne, nb, b, base, r_offset),
        OP_FLASH_ATTN_EXT,
        &[1, 2, 3],
    );
    set_f32(&mut r, 0, 1.0);
    r.op_params[3] = prec;
    one_node(vec![q, k, v, r])
}

#[test]
fn result_strides_of_size_one_dims_are_checked() {
    let h = start_ggml();
    // ggml_compute_forward_mul_mat: GGML_ASSERT(nb0 == sizeof(float)),
    // (nb0 <= nb1), (nb1 <= nb2), (nb2 <= nb3), whatever the sizes;
    // ggml_is_contiguous ignores the strides of size-1 dims.
    for nb in [[4, 12, 4, 4], [4, 12, 24, 16], [4, 12, 24, 0]] {
        refused(&h, &format!("mul_mat result strides {nb:?}"), |b, base| {
            mul_mat_graph(4, 3, Some(nb), 16384, 0, b, base)
        });
    }
    refused(
        &h,
        "mul_mat result of one column with nb0 = 8",
        |b, base| mul_mat_graph(4, 1, Some([8, 4, 8, 8]), 16384, 0, b, base),
    );
    // flash_attn_ext: the same asserts, and each result row is stored with
    // a memcpy of nb[1] bytes: one head (ne[1] == 1) with nb[1] = 4096 at
    // the end of the buffer would write 4 KiB past it (strides ordered, so
    // no assert stops it).
    refused(&h, "flash_attn_ext result row of nb[1] bytes", |b, base| {
        flash_attn_graph([4, 4096, 4096, 4096], [4, 1, 1, 1], BUF - 16, 0, b, base)
    });
    refused(&h, "flash_attn_ext result with nb2 < nb1", |b, base| {
        flash_attn_graph([4, 16, 8, 32], [4, 2, 1, 1], 8192, 0, b, base)
    });
    // switch (dst->op_params[3]): GGML_PREC_DEFAULT or GGML_PREC_F32, else
    // GGML_ABORT.
    refused(&h, "flash_attn_ext precision 5", |b, base| {
        flash_attn_graph([4, 16, 16, 16], [4, 1, 1, 1], 8192, 5, b, base)
    });

    let (mut c, b, base) = session(&h);
    // Ordered strides of size-1 dims are fine: mul_mat with nb[2] and nb[3]
    // past the end, flash attention in both precisions.
    let g = mul_mat_graph(4, 3, Some([4, 12, 24, 48]), 16384, 0, b, base);
    c.set_tensor(&g.tensors[0], 0, &f32_bytes(&[1.0; 12]))
        .unwrap();
    c.set_tensor(
        &g.tensors[1],
        0,
        &f32_bytes(&[1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 1.0]),
    )
    .unwrap();
    computes(&mut c, "mul_mat", &g);
    assert_close(
        &read(&mut c, &g.tensors[2], 6),
        &[10.0, 10.0, 10.0, 1.0, 1.0, 1.0],
        "mul_mat",
    );
    for prec in [0, 10] {
        let g = flash_attn_graph([4, 16, 16, 16], [4, 1, 1, 1], 8192, prec, b, base);
        c.set_tensor(&g.tensors[0], 0, &f32_bytes(&[1.0, 0.0, 0.0, 0.0]))
            .unwrap();
        c.set_tensor(
            &g.tensors[1],
            0,
            &f32_bytes(&[1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]),
        )
        .unwrap();
        c.set_tensor(
            &g.tensors[2],
            0,
            &f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]),
        )
        .unwrap();
        computes(&mut c, "flash_attn_ext", &g);
        let e = 1.0f32.exp();
        let (w0, w1) = (e / (e + 1.0), 1.0 / (e + 1.0));
        let want: Vec<f32> = (0..4)
            .map(|d| w0 * (d as f32 + 1.0) + w1 * (d as f32 + 5.0))
            .collect();
        assert_close(&read(&mut c, &g.tensors[3], 4), &want, "flash_attn_ext");
    }
}

#[test]
fn flash_attn_ext_head_size_is_bounded() {
    let h = start_ggml();
    // ggml_graph_plan sizes the work buffer at ~512 * (DK + DV) bytes per
    // thread and the CPU backend allocates it with new[] (abort on failure):
    // head sizes past MAX_FLASH_ATTN_HEAD are refused.
    refused(&h, "flash_attn_ext with K rows of 8192", |b, base| {
        let q = packed(1, F32, [8192, 1, 1, 1], b, base, 0);
        let k = packed(2, F16, [8192, 1, 1, 1], b, base, 32768);
        let v = packed(3, F16, [4, 1, 1, 1], b, base, 49152);
        let r = packed(4, F32, [4, 1, 1, 1], b, base, 50176);
        one_node(vec![q, k, v, node(r, OP_FLASH_ATTN_EXT, &[1, 2, 3])])
    });
}
