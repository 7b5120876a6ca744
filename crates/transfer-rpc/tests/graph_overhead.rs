//! Per-graph cost of our server against ggml's own RPC server (same
//! vendored ggml, same client, same machine, interleaved rounds), for
//! graphs whose compute is negligible (what is measured is the server's own
//! cost per GRAPH_COMPUTE / GRAPH_RECOMPUTE) and for a decode-sized matrix
//! times vector. A benchmark: it prints, asserts only correctness.
//!
//! `GGML_RPC=ON GGML_RPC_RDMA=OFF GGML_NO_BACKTRACE=1 CARGO_TARGET_DIR=target/rpc-upstream \
//!  cargo test -p transfer-rpc --features upstream-rpc,engine --test graph_overhead -- --ignored --nocapture`
#![cfg(feature = "upstream-rpc")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use transfer_rpc::client::{Client, ClientConfig};
use transfer_rpc::protocol::{GraphPayload, RpcTensor};
use transfer_rpc::server::isolated::{IsolatedBackend, IsolatedConfig};
use transfer_rpc::server::{ComputeBackend, GgmlCpuBackend, Server, ServerConfig, ServerHandle};
use transfer_rpc::validate::GraphLimits;

fn start_ours(backend: Arc<dyn ComputeBackend>, threads: usize) -> ServerHandle {
    Server::bind(
        ServerConfig {
            bind: "127.0.0.1:0".into(),
            memory_quota: 1 << 30,
            max_buffer_size: 1 << 30,
            threads,
            ..ServerConfig::default()
        },
        backend,
    )
    .unwrap()
    .spawn()
    .unwrap()
}

fn isolated(threads: usize) -> Arc<dyn ComputeBackend> {
    Arc::new(IsolatedBackend::new(IsolatedConfig {
        program: env!("CARGO_BIN_EXE_transfer-rpc-compute").into(),
        devices: 1,
        threads,
        timeout: Duration::from_secs(60),
        env: Vec::new(),
        limits: GraphLimits::default(),
    }))
}

/// ggml's GGML_TENSOR_FLAG_COMPUTE: nodes without it are skipped.
const COMPUTE: i32 = 16;

/// A graph prepared on one server: the payload and the tensor to read back.
struct Prepared {
    client: Client,
    graph: GraphPayload,
    out: RpcTensor,
}

/// `chain` ADD/MUL nodes over 4096 floats (a decode graph's shape of
/// many small element-wise nodes), or one MUL_MAT `[k] x [k, m]` f32 when
/// `chain` is 0.
fn prepare(ep: &str, chain: usize, m: u32, k: u32) -> Prepared {
    let mut c = Client::connect(ep, ClientConfig::default()).unwrap();
    let n = 4096u32;
    if chain == 0 {
        let size = 4 * (u64::from(m) * u64::from(k) + u64::from(k) + u64::from(m)) + 4096;
        let (b, _) = c.alloc_buffer(0, size).unwrap().unwrap();
        let base = c.buffer_get_base(b).unwrap();
        let w = mat(1, b, base, 0, k, m);
        let x = f32_tensor(2, b, base, 4 * u64::from(m) * u64::from(k), k);
        let mut y = f32_tensor(
            3,
            b,
            base,
            4 * (u64::from(m) * u64::from(k) + u64::from(k)),
            m,
        );
        y.op = 29; // MUL_MAT
        y.src[0] = 1;
        y.src[1] = 2;
        y.flags = COMPUTE;
        c.set_tensor(&x, 0, &f32_bytes(&vec![1.0; k as usize]))
            .unwrap();
        let row: Vec<f32> = (0..k).map(|i| (i % 7) as f32 * 0.01).collect();
        let bytes = f32_bytes(&row);
        // One row at a time keeps the client's frames small.
        for r in 0..u64::from(m) {
            let mut t = w.clone();
            t.ne = [k, 1, 1, 1];
            t.data = w.data + r * 4 * u64::from(k);
            c.set_tensor(&t, 0, &bytes).unwrap();
        }
        return Prepared {
            client: c,
            graph: GraphPayload {
                device: 0,
                nodes: vec![3],
                tensors: vec![w, x, y.clone()],
            },
            out: y,
        };
    }
    let size = 4 * u64::from(n) * (chain as u64 + 2) + 4096;
    let (b, _) = c.alloc_buffer(0, size).unwrap().unwrap();
    let base = c.buffer_get_base(b).unwrap();
    let x = f32_tensor(1, b, base, 0, n);
    let y = f32_tensor(2, b, base, 4 * u64::from(n), n);
    c.set_tensor(&x, 0, &f32_bytes(&vec![1.0; n as usize]))
        .unwrap();
    c.set_tensor(&y, 0, &f32_bytes(&vec![0.0; n as usize]))
        .unwrap();
    let mut tensors = vec![x, y];
    let mut nodes = Vec::new();
    let mut prev = 1u64;
    for i in 0..chain {
        let id = 3 + i as u64;
        let mut t = f32_tensor(id, b, base, 4 * u64::from(n) * (2 + i as u64), n);
        t.op = if i % 2 == 0 { 2 } else { 7 }; // ADD, MUL
        t.src[0] = prev;
        t.src[1] = if i % 2 == 0 { 2 } else { 1 };
        t.flags = COMPUTE;
        nodes.push(id);
        tensors.push(t);
        prev = id;
    }
    let out = tensors.last().cloned().unwrap();
    Prepared {
        client: c,
        graph: GraphPayload {
            device: 0,
            nodes,
            tensors,
        },
        out,
    }
}

/// Median microseconds of one graph (compute or recompute) plus a 4-byte
/// read-back, over `reps` repetitions.
fn time_graph(p: &mut Prepared, recompute: bool, reps: usize) -> f64 {
    p.client.graph_compute(&p.graph).unwrap();
    p.client.get_tensor(&p.out, 0, 4).unwrap();
    let mut v = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        if recompute {
            p.client.graph_recompute(0).unwrap();
        } else {
            p.client.graph_compute(&p.graph).unwrap();
        }
        p.client.get_tensor(&p.out, 0, 4).unwrap();
        v.push(t.elapsed().as_secs_f64() * 1e6);
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
#[ignore = "benchmark: run with --ignored --nocapture"]
fn per_graph_cost_against_upstream() {
    let threads: usize = std::env::var("THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let up = start_upstream(threads);
    let inproc = start_ours(
        Arc::new(GgmlCpuBackend::new(1, threads, GraphLimits::default())),
        threads,
    );
    let iso = start_ours(isolated(threads), threads);
    let cases: [(&str, usize, u32, u32, usize); 3] = [
        ("1 ADD of 4096", 1, 0, 0, 400),
        ("300 ADD/MUL of 4096", 300, 0, 0, 100),
        ("MUL_MAT 1024x4096 f32", 0, 1024, 4096, 100),
    ];
    println!("threads {threads}; median us per graph + 4-byte read-back");
    for (name, chain, m, k, reps) in cases {
        let mut servers = [
            ("upstream", prepare(&up, chain, m, k)),
            ("ours in-process", prepare(&inproc.endpoint(), chain, m, k)),
            ("ours isolated", prepare(&iso.endpoint(), chain, m, k)),
        ];
        let want = {
            let p = &mut servers[0].1;
            p.client.graph_compute(&p.graph).unwrap();
            p.client.get_tensor(&p.out, 0, 16).unwrap()
        };
        let first = f32::from_le_bytes(want[..4].try_into().unwrap());
        let expect = if chain == 0 {
            (0..k).map(|i| (i % 7) as f32 * 0.01).sum::<f32>()
        } else {
            1.0
        };
        assert!(
            (first - expect).abs() <= 1e-3 * expect.abs().max(1.0),
            "{name}: {first} != {expect}"
        );
        for (_, p) in servers.iter_mut().skip(1) {
            p.client.graph_compute(&p.graph).unwrap();
            assert_eq!(p.client.get_tensor(&p.out, 0, 16).unwrap(), want);
        }
        for recompute in [false, true] {
            let mut best = [f64::MAX; 3];
            for _ in 0..rounds {
                for (i, (_, p)) in servers.iter_mut().enumerate() {
                    best[i] = best[i].min(time_graph(p, recompute, reps));
                }
            }
            let what = if recompute { "RECOMPUTE" } else { "COMPUTE" };
            let cells: Vec<String> = servers
                .iter()
                .zip(best)
                .map(|((n, _), us)| {
                    format!(
                        "{n} {us:8.1} us ({:+7.1} us, {:.2}x)",
                        us - best[0],
                        best[0] / us
                    )
                })
                .collect();
            println!("{name:24} {what:9} | {}", cells.join(" | "));
        }
    }
}
