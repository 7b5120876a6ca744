//! ggml's own RPC client (the code llama.cpp uses to offload) against our
//! server: a graph of the ops a llama layer uses (RMS_NORM, MUL, MUL_MAT,
//! ADD with broadcast, RESHAPE, ROPE, PERMUTE, CONT, SCALE, SOFT_MAX with
//! and without mask, GET_ROWS, SWIGLU, SET_ROWS, VIEW of F16 caches,
//! FLASH_ATTN_EXT, CPY F32->F16), built with ggml's op builders, computed
//! through RPC on our server and locally on ggml's CPU backend; the outputs
//! must agree within 1e-5 (F16 outputs are compared bit for bit).
//!
//! Run with:
//! `GGML_RPC=ON GGML_RPC_RDMA=OFF CARGO_TARGET_DIR=/work/target-rpc-up \
//!  cargo test -p transfer-rpc --features upstream-rpc --test upstream_client`
#![cfg(feature = "upstream-rpc")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::CString;
use std::os::raw::c_char;
use std::sync::Arc;

use llama_cpp_sys_2 as sys;
use transfer_rpc::server::{GgmlCpuBackend, Server, ServerConfig};
use transfer_rpc::validate::GraphLimits;

unsafe extern "C" {
    fn ggml_backend_rpc_init(endpoint: *const c_char, device: u32) -> sys::ggml_backend_t;
}

fn fill(n: usize, seed: f32) -> Vec<f32> {
    (0..n)
        .map(|i| (i as f32 * 0.37 + seed).sin() * 0.8)
        .collect()
}

/// Builds, allocates on `backend`, computes and reads back the outputs.
fn run(backend: sys::ggml_backend_t) -> Vec<Vec<f32>> {
    // SAFETY: plain ggml API use; every pointer comes from ggml and lives
    // until `ggml_free` / `ggml_backend_buffer_free` at the end; host slices
    // passed to tensor_set/get have exactly the tensor's byte size.
    unsafe {
        let params = sys::ggml_init_params {
            mem_size: 64 * sys::ggml_tensor_overhead() + sys::ggml_graph_overhead(),
            mem_buffer: std::ptr::null_mut(),
            no_alloc: true,
        };
        let ctx = sys::ggml_init(params);
        assert!(!ctx.is_null());
        let f32t = sys::GGML_TYPE_F32;
        let x = sys::ggml_new_tensor_2d(ctx, f32t, 8, 4);
        let wn = sys::ggml_new_tensor_1d(ctx, f32t, 8);
        let wq = sys::ggml_new_tensor_2d(ctx, f32t, 8, 8);
        let pos = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_I32, 4);
        let emb = sys::ggml_new_tensor_2d(ctx, f32t, 8, 10);
        let ids = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_I32, 3);
        let wgu = sys::ggml_new_tensor_2d(ctx, f32t, 8, 16);
        let kv = sys::ggml_new_tensor_2d(ctx, f32t, 8, 6);
        let rows_ix = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_I64, 4);
        let f16t = sys::GGML_TYPE_F16;
        let bias = sys::ggml_new_tensor_1d(ctx, f32t, 8);
        let kcache = sys::ggml_new_tensor_2d(ctx, f16t, 8, 6);
        let vcache = sys::ggml_new_tensor_2d(ctx, f16t, 8, 6);
        let fa_mask = sys::ggml_new_tensor_2d(ctx, f16t, 6, 4);
        let sm_mask = sys::ggml_new_tensor_2d(ctx, f16t, 4, 4);
        let store = sys::ggml_new_tensor_2d(ctx, f16t, 8, 4);

        let h = sys::ggml_mul(ctx, sys::ggml_rms_norm(ctx, x, 1e-5), wn);
        let q = sys::ggml_add(ctx, sys::ggml_mul_mat(ctx, wq, h), bias);
        let q3 = sys::ggml_reshape_3d(ctx, q, 4, 2, 4);
        let qr = sys::ggml_rope(ctx, q3, pos, 4, 0);
        let qc = sys::ggml_cont(ctx, sys::ggml_permute(ctx, qr, 0, 2, 1, 3));
        let kq = sys::ggml_mul_mat(ctx, qc, qc);
        let sm = sys::ggml_soft_max(ctx, sys::ggml_scale(ctx, kq, 0.5));
        let rows = sys::ggml_get_rows(ctx, emb, ids);
        let act = sys::ggml_swiglu(ctx, sys::ggml_mul_mat(ctx, wgu, h));
        let cache = sys::ggml_set_rows(ctx, kv, h, rows_ix);
        // Flash attention over F16 cache views, as llama builds it.
        let qp = sys::ggml_permute(ctx, qr, 0, 2, 1, 3);
        let kv3 = |c: *mut sys::ggml_tensor| {
            let v = sys::ggml_view_3d(ctx, c, 4, 2, 6, 8, 16, 0);
            sys::ggml_permute(ctx, v, 0, 2, 1, 3)
        };
        let fa =
            sys::ggml_flash_attn_ext(ctx, qp, kv3(kcache), kv3(vcache), fa_mask, 0.5, 0.0, 0.0);
        let sm2 = sys::ggml_soft_max_ext(ctx, kq, sm_mask, 0.25, 0.0);
        let stored = sys::ggml_cpy(ctx, h, store);
        let outs = [sm, rows, act, cache, fa, sm2, stored];
        let graph = sys::ggml_new_graph(ctx);
        for &o in &outs {
            sys::ggml_set_output(o);
            sys::ggml_build_forward_expand(graph, o);
        }
        let buf = sys::ggml_backend_alloc_ctx_tensors(ctx, backend);
        assert!(!buf.is_null(), "allocation on the backend");

        let set_f32 = |t: *mut sys::ggml_tensor, v: &[f32]| {
            assert_eq!(sys::ggml_nbytes(t), v.len() * 4);
            sys::ggml_backend_tensor_set(t, v.as_ptr().cast(), 0, v.len() * 4);
        };
        set_f32(x, &fill(32, 0.1));
        set_f32(wn, &fill(8, 0.2));
        set_f32(wq, &fill(64, 0.3));
        set_f32(emb, &fill(80, 0.4));
        set_f32(wgu, &fill(128, 0.5));
        set_f32(kv, &fill(48, 0.6));
        set_f32(bias, &fill(8, 0.7));
        let set_f16 = |t: *mut sys::ggml_tensor, v: &[f32]| {
            let mut h = vec![0u16; v.len()];
            sys::ggml_fp32_to_fp16_row(v.as_ptr(), h.as_mut_ptr(), v.len() as i64);
            assert_eq!(sys::ggml_nbytes(t), h.len() * 2);
            sys::ggml_backend_tensor_set(t, h.as_ptr().cast(), 0, h.len() * 2);
        };
        set_f16(kcache, &fill(48, 0.8));
        set_f16(vcache, &fill(48, 0.9));
        // Causal-style masks: -inf above the diagonal.
        let mask = |cols: usize, rows: usize| -> Vec<f32> {
            (0..cols * rows)
                .map(|i| {
                    if i % cols > i / cols + 2 {
                        f32::NEG_INFINITY
                    } else {
                        0.0
                    }
                })
                .collect()
        };
        set_f16(fa_mask, &mask(6, 4));
        set_f16(sm_mask, &mask(4, 4));
        let p: [i32; 4] = [0, 1, 2, 3];
        sys::ggml_backend_tensor_set(pos, p.as_ptr().cast(), 0, 16);
        let i: [i32; 3] = [9, 0, 4];
        sys::ggml_backend_tensor_set(ids, i.as_ptr().cast(), 0, 12);
        let r: [i64; 4] = [5, 1, 3, 0];
        sys::ggml_backend_tensor_set(rows_ix, r.as_ptr().cast(), 0, 32);

        let status = sys::ggml_backend_graph_compute(backend, graph);
        assert_eq!(status, sys::GGML_STATUS_SUCCESS);
        let mut results = Vec::new();
        for &o in &outs {
            if (*o).type_ == f16t {
                let n = sys::ggml_nbytes(o) / 2;
                let mut v = vec![0u16; n];
                sys::ggml_backend_tensor_get(o, v.as_mut_ptr().cast(), 0, n * 2);
                results.push(v.iter().map(|&b| f32::from(b)).collect());
            } else {
                let n = sys::ggml_nbytes(o) / 4;
                let mut v = vec![0f32; n];
                sys::ggml_backend_tensor_get(o, v.as_mut_ptr().cast(), 0, n * 4);
                results.push(v);
            }
        }
        sys::ggml_backend_buffer_free(buf);
        sys::ggml_free(ctx);
        results
    }
}

#[test]
fn ggml_rpc_client_computes_on_our_server() {
    let server = Server::bind(
        ServerConfig {
            bind: "127.0.0.1:0".into(),
            memory_quota: 64 << 20,
            max_buffer_size: 64 << 20,
            ..ServerConfig::default()
        },
        Arc::new(GgmlCpuBackend::new(1, 1, GraphLimits::default())),
    )
    .unwrap()
    .spawn()
    .unwrap();
    let ep = CString::new(server.endpoint()).unwrap();
    // SAFETY: plain constructors; null checked.
    let (rpc, cpu) = unsafe {
        (
            ggml_backend_rpc_init(ep.as_ptr(), 0),
            sys::ggml_backend_cpu_init(),
        )
    };
    assert!(!rpc.is_null() && !cpu.is_null());
    let remote = run(rpc);
    let local = run(cpu);
    assert_eq!(remote.len(), local.len());
    for (k, (r, l)) in remote.iter().zip(&local).enumerate() {
        assert_eq!(r.len(), l.len());
        for (a, b) in r.iter().zip(l) {
            assert!((a - b).abs() <= 1e-5, "output {k}: {a} vs {b}");
        }
    }
    assert!(remote[3].iter().any(|&v| v != 0.0));
    // SAFETY: both backends are live and freed once.
    unsafe {
        sys::ggml_backend_free(rpc);
        sys::ggml_backend_free(cpu);
    }
    assert_eq!(server.shared().refused_connections(), 0);
}
