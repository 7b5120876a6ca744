//! llama.cpp itself (llama.h, ggml's RPC client) offloads every layer of a
//! tiny random-weight llama model (a GGUF written here) to our server; its
//! logits and greedy tokens must match llama.cpp on its own CPU backend.
//!
//! Run with:
//! `GGML_RPC=ON GGML_RPC_RDMA=OFF CARGO_TARGET_DIR=/work/target-rpc-up \
//!  cargo test -p transfer-rpc --features upstream-rpc --test upstream_llama`
#![cfg(feature = "upstream-rpc")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::CString;
use std::os::raw::c_char;
use std::path::Path;
use std::sync::Arc;

use llama_cpp_sys_2 as sys;
use transfer_rpc::pipeline::GgufWriter;
use transfer_rpc::server::{GgmlCpuBackend, Server, ServerConfig};
use transfer_rpc::validate::GraphLimits;

unsafe extern "C" {
    fn ggml_backend_rpc_add_server(endpoint: *const c_char) -> sys::ggml_backend_reg_t;
}

const N_EMBD: u64 = 64;
const N_HEAD: u32 = 4;
const N_HEAD_KV: u32 = 2;
const N_FF: u64 = 128;
const N_VOCAB: u64 = 128;
const N_LAYER: u32 = 2;

/// The crate's GGUF writer, with this test's deterministic weights.
struct Gguf(GgufWriter);

impl Gguf {
    fn new() -> Self {
        Gguf(GgufWriter::new())
    }
    fn u32(&mut self, k: &str, v: u32) {
        self.0.add_u32(k, v);
    }
    fn f32(&mut self, k: &str, v: f32) {
        self.0.add_f32(k, v);
    }
    fn str(&mut self, k: &str, v: &str) {
        self.0.add_str(k, v);
    }
    fn tensor(&mut self, name: &str, dims: &[u64], seed: f32, scale: f32, offset: f32) {
        let n: u64 = dims.iter().product();
        let data: Vec<f32> = (0..n)
            .map(|i| offset + scale * ((i as f32) * 0.6180339 + seed).sin())
            .collect();
        self.0.add_tensor_f32(name, dims, &data).unwrap();
    }
    fn write(&self, path: &Path) {
        self.0.write(path).unwrap();
    }
}

fn write_model(path: &Path) {
    let mut g = Gguf::new();
    g.str("general.architecture", "llama");
    g.str("general.name", "tiny-random");
    g.u32("llama.context_length", 256);
    g.u32("llama.embedding_length", N_EMBD as u32);
    g.u32("llama.block_count", N_LAYER);
    g.u32("llama.feed_forward_length", N_FF as u32);
    g.u32("llama.attention.head_count", N_HEAD);
    g.u32("llama.attention.head_count_kv", N_HEAD_KV);
    g.f32("llama.attention.layer_norm_rms_epsilon", 1e-5);
    g.u32("llama.vocab_size", N_VOCAB as u32);
    g.str("tokenizer.ggml.model", "none");
    let kv = N_EMBD / u64::from(N_HEAD) * u64::from(N_HEAD_KV);
    g.tensor("token_embd.weight", &[N_EMBD, N_VOCAB], 0.1, 0.5, 0.0);
    g.tensor("output_norm.weight", &[N_EMBD], 0.2, 0.1, 1.0);
    g.tensor("output.weight", &[N_EMBD, N_VOCAB], 0.3, 0.3, 0.0);
    for l in 0..N_LAYER {
        let s = l as f32;
        g.tensor(
            &format!("blk.{l}.attn_norm.weight"),
            &[N_EMBD],
            s + 0.4,
            0.1,
            1.0,
        );
        g.tensor(
            &format!("blk.{l}.attn_q.weight"),
            &[N_EMBD, N_EMBD],
            s + 0.5,
            0.2,
            0.0,
        );
        g.tensor(
            &format!("blk.{l}.attn_k.weight"),
            &[N_EMBD, kv],
            s + 0.6,
            0.2,
            0.0,
        );
        g.tensor(
            &format!("blk.{l}.attn_v.weight"),
            &[N_EMBD, kv],
            s + 0.7,
            0.2,
            0.0,
        );
        g.tensor(
            &format!("blk.{l}.attn_output.weight"),
            &[N_EMBD, N_EMBD],
            s + 0.8,
            0.2,
            0.0,
        );
        g.tensor(
            &format!("blk.{l}.ffn_norm.weight"),
            &[N_EMBD],
            s + 0.9,
            0.1,
            1.0,
        );
        g.tensor(
            &format!("blk.{l}.ffn_gate.weight"),
            &[N_EMBD, N_FF],
            s + 1.0,
            0.2,
            0.0,
        );
        g.tensor(
            &format!("blk.{l}.ffn_up.weight"),
            &[N_EMBD, N_FF],
            s + 1.1,
            0.2,
            0.0,
        );
        g.tensor(
            &format!("blk.{l}.ffn_down.weight"),
            &[N_FF, N_EMBD],
            s + 1.2,
            0.2,
            0.0,
        );
    }
    g.write(path);
}

/// Greedy decode of `steps` tokens after `prompt`; returns tokens and the
/// logits of every step.
///
/// SAFETY of the block: llama.h used as documented; every pointer checked.
fn decode(
    path: &Path,
    rpc_dev: Option<sys::ggml_backend_dev_t>,
    prompt: &[i32],
    steps: usize,
) -> (Vec<i32>, Vec<Vec<f32>>) {
    // SAFETY: see the function comment.
    unsafe {
        let mut mp = sys::llama_model_default_params();
        let mut devs = [
            rpc_dev.unwrap_or(std::ptr::null_mut()),
            std::ptr::null_mut(),
        ];
        if rpc_dev.is_some() {
            mp.devices = devs.as_mut_ptr();
            mp.n_gpu_layers = 99;
        } else {
            mp.devices = devs[1..].as_mut_ptr();
            mp.n_gpu_layers = 0;
        }
        let cpath = CString::new(path.to_str().unwrap()).unwrap();
        let model = sys::llama_model_load_from_file(cpath.as_ptr(), mp);
        assert!(!model.is_null(), "model load");
        let mut cp = sys::llama_context_default_params();
        cp.n_ctx = 64;
        cp.n_batch = 16;
        cp.n_ubatch = 16;
        cp.n_threads = 1;
        cp.n_threads_batch = 1;
        let ctx = sys::llama_init_from_model(model, cp);
        assert!(!ctx.is_null(), "context");
        let mut tokens = prompt.to_vec();
        let mut all_logits = Vec::new();
        let mut batch_tokens = prompt.to_vec();
        for _ in 0..steps {
            let batch =
                sys::llama_batch_get_one(batch_tokens.as_mut_ptr(), batch_tokens.len() as i32);
            assert_eq!(sys::llama_decode(ctx, batch), 0, "decode");
            let logits = sys::llama_get_logits_ith(ctx, -1);
            assert!(!logits.is_null());
            let l = std::slice::from_raw_parts(logits, N_VOCAB as usize).to_vec();
            let next = l
                .iter()
                .enumerate()
                .fold(
                    (0usize, f32::MIN),
                    |b, (i, &v)| if v > b.1 { (i, v) } else { b },
                )
                .0 as i32;
            all_logits.push(l);
            tokens.push(next);
            batch_tokens = vec![next];
        }
        sys::llama_free(ctx);
        sys::llama_model_free(model);
        (tokens, all_logits)
    }
}

#[test]
fn llama_offloads_all_layers_to_our_server() {
    let dir = std::env::temp_dir().join(format!("trpc-llama-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tiny.gguf");
    write_model(&path);

    let server = Server::bind(
        ServerConfig {
            bind: "127.0.0.1:0".into(),
            memory_quota: 256 << 20,
            max_buffer_size: 256 << 20,
            ..ServerConfig::default()
        },
        Arc::new(GgmlCpuBackend::new(1, 1, GraphLimits::default())),
    )
    .unwrap()
    .spawn()
    .unwrap();
    let ep = CString::new(server.endpoint()).unwrap();
    // SAFETY: registers the RPC backend for our endpoint; checked for null.
    let dev = unsafe {
        sys::llama_backend_init();
        let reg = ggml_backend_rpc_add_server(ep.as_ptr());
        assert!(!reg.is_null());
        sys::ggml_backend_register(reg);
        let d = sys::ggml_backend_reg_dev_get(reg, 0);
        assert!(!d.is_null());
        d
    };
    let prompt = [1, 17, 42, 99, 5];
    let (remote_tokens, remote_logits) = decode(&path, Some(dev), &prompt, 8);
    let (local_tokens, local_logits) = decode(&path, None, &prompt, 8);
    assert_eq!(remote_tokens, local_tokens, "greedy tokens");
    let mut max_diff = 0f32;
    for (r, l) in remote_logits.iter().zip(&local_logits) {
        for (a, b) in r.iter().zip(l) {
            max_diff = max_diff.max((a - b).abs());
        }
    }
    println!("tokens {remote_tokens:?}, max |logit diff| {max_diff:e}");
    assert!(max_diff <= 1e-5, "max logit difference {max_diff}");
    assert_eq!(server.shared().refused_connections(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}
