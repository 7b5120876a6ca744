//! Graph compute on ggml's CPU backend (run with `--features ggml`).
#![cfg(feature = "ggml")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use transfer_rpc::client::Client;
use transfer_rpc::protocol::{GraphPayload, RpcTensor};

const COMPUTE: i32 = 16;

#[test]
fn mul_mat_add_matches_reference_and_recompute_sees_new_inputs() {
    let h = start_ggml();
    let mut c = connect(&h);
    let (b, base) = alloc(&mut c, 1 << 16);
    let (k, m, n) = (4u32, 3u32, 2u32);
    let a = mat(1, b, base, 0, k, m);
    let x = mat(2, b, base, 256, k, n);
    let bias = mat(3, b, base, 512, m, 1);
    let mut mm = mat(4, b, base, 1024, m, n);
    mm.op = 29;
    mm.src[0] = 1;
    mm.src[1] = 2;
    mm.flags = COMPUTE;
    let mut out = mat(5, b, base, 2048, m, n);
    out.op = 2;
    out.src[0] = 4;
    out.src[1] = 3;
    out.flags = COMPUTE;
    let av: Vec<f32> = (0..k * m).map(|i| i as f32 * 0.25 - 1.0).collect();
    let bv: Vec<f32> = vec![0.5, -1.0, 2.0];
    let reference = |xv: &[f32]| -> Vec<f32> {
        let mut r = Vec::new();
        for j in 0..n as usize {
            for i in 0..m as usize {
                let dot: f32 = (0..k as usize).map(|q| av[q + 4 * i] * xv[q + 4 * j]).sum();
                r.push(dot + bv[i]);
            }
        }
        r
    };
    c.set_tensor(&a, 0, &f32_bytes(&av)).unwrap();
    c.set_tensor(&bias, 0, &f32_bytes(&bv)).unwrap();
    let xv: Vec<f32> = (0..k * n).map(|i| 1.0 + i as f32).collect();
    c.set_tensor(&x, 0, &f32_bytes(&xv)).unwrap();
    c.graph_compute(&GraphPayload {
        device: 0,
        nodes: vec![4, 5],
        tensors: vec![a, x.clone(), bias, mm, out.clone()],
    })
    .unwrap();
    let got = floats(&c.get_tensor(&out, 0, 24).unwrap());
    for (g, w) in got.iter().zip(reference(&xv)) {
        assert!((g - w).abs() < 1e-5, "{got:?}");
    }
    let xv2: Vec<f32> = (0..k * n).map(|i| 0.5 - i as f32).collect();
    c.set_tensor(&x, 0, &f32_bytes(&xv2)).unwrap();
    c.graph_recompute(0).unwrap();
    let got = floats(&c.get_tensor(&out, 0, 24).unwrap());
    for (g, w) in got.iter().zip(reference(&xv2)) {
        assert!((g - w).abs() < 1e-5, "{got:?}");
    }
}

fn get_rows_setup(
    c: &mut Client,
    idx: [i32; 2],
    computed_index: bool,
) -> (GraphPayload, RpcTensor) {
    let (b, base) = alloc(c, 1 << 16);
    let emb = mat(1, b, base, 0, 4, 5);
    let ev: Vec<f32> = (0..20).map(|i| i as f32).collect();
    c.set_tensor(&emb, 0, &f32_bytes(&ev)).unwrap();
    let mut leaf = mat(2, b, base, 512, 2, 1);
    leaf.ty = 26;
    let ib: Vec<u8> = idx.iter().flat_map(|v| v.to_le_bytes()).collect();
    c.set_tensor(&leaf, 0, &ib).unwrap();
    let mut tensors = vec![emb, leaf.clone()];
    let mut nodes = vec![];
    let mut ix_id = 2;
    if computed_index {
        let mut v = leaf.clone();
        v.id = 6;
        v.op = 37; // VIEW
        v.src[0] = 2;
        v.view_src = 2;
        v.flags = COMPUTE;
        tensors.push(v);
        nodes.push(6);
        ix_id = 6;
    }
    let mut r = mat(3, b, base, 1024, 4, 2);
    r.op = 40;
    r.src[0] = 1;
    r.src[1] = ix_id;
    r.flags = COMPUTE;
    tensors.push(r.clone());
    nodes.push(3);
    (
        GraphPayload {
            device: 0,
            nodes,
            tensors,
        },
        r,
    )
}

#[test]
fn get_rows_in_memory_and_computed_indices() {
    let h = start_ggml();
    for computed in [false, true] {
        let mut c = connect(&h);
        let (g, r) = get_rows_setup(&mut c, [4, 1], computed);
        c.graph_compute(&g).unwrap();
        let got = floats(&c.get_tensor(&r, 0, 32).unwrap());
        assert_eq!(got, vec![16.0, 17.0, 18.0, 19.0, 4.0, 5.0, 6.0, 7.0]);
        // Out of range: refused before the kernel runs, only this connection closes.
        let mut bad = connect(&h);
        let (g, _) = get_rows_setup(&mut bad, [5, 0], computed);
        bad.graph_compute(&g).unwrap();
        assert!(is_closed(&mut bad), "computed={computed}");
        assert_eq!(c.get_tensor(&r, 0, 32).unwrap().len(), 32);
    }
}

#[test]
fn ops_outside_the_allowlist_and_bad_shapes_are_refused() {
    let h = start_ggml();
    let mut c = connect(&h);
    let (b, base) = alloc(&mut c, 1 << 16);
    let a = mat(1, b, base, 0, 4, 3);
    let x = mat(2, b, base, 256, 4, 2);
    // MUL_MAT whose result claims more rows than the product has.
    let mut mm = mat(4, b, base, 1024, 8, 2);
    mm.op = 29;
    mm.src[0] = 1;
    mm.src[1] = 2;
    mm.flags = COMPUTE;
    c.graph_compute(&GraphPayload {
        device: 0,
        nodes: vec![4],
        tensors: vec![a.clone(), x, mm],
    })
    .unwrap();
    assert!(is_closed(&mut c));
    // CUMSUM (op 16) is not on the allowlist.
    let mut c = connect(&h);
    let (b, base) = alloc(&mut c, 1 << 16);
    let a = mat(1, b, base, 0, 4, 3);
    let mut s = mat(2, b, base, 256, 1, 1);
    s.op = 16;
    s.src[0] = 1;
    s.flags = COMPUTE;
    c.graph_compute(&GraphPayload {
        device: 0,
        nodes: vec![2],
        tensors: vec![a, s],
    })
    .unwrap();
    assert!(is_closed(&mut c));
    assert_eq!(connect(&h).device_count().unwrap(), 1);
}
