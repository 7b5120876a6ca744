//! Graph compute in worker processes (run with `--features ggml`): results
//! equal in-process compute; a crash inside compute closes only the
//! session that sent the graph, the server and the other sessions go on
//! (the next graph starts a new worker); freed buffers leave the worker.
#![cfg(feature = "ggml")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use transfer_rpc::client::Client;
use transfer_rpc::protocol::{GraphPayload, RpcTensor};
use transfer_rpc::server::compute_worker::{CRASH_ENV, CRASH_MARKER};
use transfer_rpc::server::isolated::{IsolatedBackend, IsolatedConfig};
use transfer_rpc::server::{ComputeBackend, Server, ServerConfig, ServerHandle};

fn isolated(env: &[(&str, &str)]) -> (ServerHandle, Arc<IsolatedBackend>) {
    let backend = Arc::new(IsolatedBackend::new(IsolatedConfig {
        program: env!("CARGO_BIN_EXE_transfer-rpc-compute").into(),
        devices: 1,
        threads: 2,
        timeout: Duration::from_secs(30),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }));
    let h = Server::bind(
        ServerConfig {
            bind: "127.0.0.1:0".into(),
            memory_quota: 256 << 20,
            max_buffer_size: 128 << 20,
            ..ServerConfig::default()
        },
        Arc::clone(&backend) as Arc<dyn ComputeBackend>,
    )
    .unwrap()
    .spawn()
    .unwrap();
    (h, backend)
}

/// out = a x b + bias over a buffer of the session; returns the tensors.
struct MatMul {
    a: RpcTensor,
    x: RpcTensor,
    bias: RpcTensor,
    graph: GraphPayload,
    out: RpcTensor,
}

fn matmul(c: &mut Client, k: u32, m: u32, n: u32) -> MatMul {
    let size = 4 * u64::from(k * m + k * n + m + 2 * m * n) + 4096;
    let (b, base) = alloc(c, size);
    let a = mat(1, b, base, 0, k, m);
    let x = mat(2, b, base, u64::from(4 * k * m), k, n);
    let bias = mat(3, b, base, u64::from(4 * (k * m + k * n)), m, 1);
    let mut mm = mat(4, b, base, u64::from(4 * (k * m + k * n + m)), m, n);
    mm.op = 29;
    mm.src[0] = 1;
    mm.src[1] = 2;
    mm.flags = 16;
    let mut out = mat(5, b, base, u64::from(4 * (k * m + k * n + m + m * n)), m, n);
    out.op = 2;
    out.src[0] = 4;
    out.src[1] = 3;
    out.flags = 16;
    let graph = GraphPayload {
        device: 0,
        nodes: vec![4, 5],
        tensors: vec![a.clone(), x.clone(), bias.clone(), mm, out.clone()],
    };
    MatMul {
        a,
        x,
        bias,
        graph,
        out,
    }
}

fn run_and_check(c: &mut Client, g: &MatMul, k: u32, m: u32, n: u32, seed: f32, recompute: bool) {
    let av: Vec<f32> = (0..k * m).map(|i| (i % 7) as f32 * 0.25 - seed).collect();
    let xv: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.5 + seed).collect();
    let bv: Vec<f32> = (0..m).map(|i| i as f32).collect();
    c.set_tensor(&g.a, 0, &f32_bytes(&av)).unwrap();
    c.set_tensor(&g.x, 0, &f32_bytes(&xv)).unwrap();
    c.set_tensor(&g.bias, 0, &f32_bytes(&bv)).unwrap();
    if recompute {
        c.graph_recompute(0).unwrap();
    } else {
        c.graph_compute(&g.graph).unwrap();
    }
    let got = floats(&c.get_tensor(&g.out, 0, u64::from(4 * m * n)).unwrap());
    let (k, m) = (k as usize, m as usize);
    for j in 0..n as usize {
        for i in 0..m {
            let want: f32 = (0..k).map(|q| av[q + k * i] * xv[q + k * j]).sum::<f32>() + bv[i];
            let g = got[i + m * j];
            assert!(
                (g - want).abs() <= 1e-3 * want.abs().max(1.0),
                "{g} vs {want}"
            );
        }
    }
}

#[test]
fn worker_results_equal_the_reference_and_recompute_sees_new_inputs() {
    let (h, backend) = isolated(&[]);
    let mut c = connect(&h);
    let g = matmul(&mut c, 64, 16, 4);
    run_and_check(&mut c, &g, 64, 16, 4, 0.5, false);
    run_and_check(&mut c, &g, 64, 16, 4, -1.5, true);
    assert_eq!(backend.restarts(), 0);
    assert_eq!(backend.worker_pids().len(), 1);
}

#[test]
fn a_crash_in_compute_closes_only_its_session() {
    let (h, backend) = isolated(&[(CRASH_ENV, "1")]);
    let mut victim = connect(&h);
    let g = matmul(&mut victim, 64, 16, 4);
    run_and_check(&mut victim, &g, 64, 16, 4, 0.25, false);
    let first_worker = backend.worker_pids();

    // The attacker's graph crashes the worker (abort inside compute).
    let mut attacker = connect(&h);
    let mut bad = matmul(&mut attacker, 8, 4, 2);
    let marker = &mut bad.graph.tensors[4].name;
    marker[..CRASH_MARKER.len()].copy_from_slice(CRASH_MARKER);
    attacker.graph_compute(&bad.graph).unwrap();
    assert!(is_closed(&mut attacker), "the crashing session is closed");
    assert_eq!(backend.restarts(), 1);

    // The server and the victim's session go on; a new worker maps the
    // victim's buffers again.
    run_and_check(&mut victim, &g, 64, 16, 4, 2.0, true);
    run_and_check(&mut victim, &g, 64, 16, 4, -3.0, false);
    assert_ne!(backend.worker_pids(), first_worker);
    let mut fresh = connect(&h);
    let g2 = matmul(&mut fresh, 32, 8, 3);
    run_and_check(&mut fresh, &g2, 32, 8, 3, 1.0, false);
    assert_eq!(backend.restarts(), 1);
}

fn rss_of(pid: u32) -> u64 {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).unwrap_or_default();
    statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse::<u64>().ok())
        .unwrap_or(0)
        * 4096
}

#[test]
fn freed_buffers_leave_the_worker_and_compute_cost_is_measured() {
    let (h, backend) = isolated(&[]);
    let mut c = connect(&h);
    // A 64 MiB weight the worker touches.
    let (k, m, n) = (4096u32, 4096u32, 1u32);
    let g = matmul(&mut c, k, m, n);
    run_and_check(&mut c, &g, k, m, n, 0.5, false);
    let pid = backend.worker_pids()[0];
    let with = rss_of(pid);
    // Cost of a small graph through the worker vs in-process.
    let small = matmul(&mut c, 64, 16, 4);
    let t0 = Instant::now();
    for i in 0..50 {
        run_and_check(&mut c, &small, 64, 16, 4, i as f32 * 0.01, i > 0);
    }
    let worker_time = t0.elapsed() / 50;
    let inproc = start_ggml();
    let mut d = connect(&inproc);
    let small2 = matmul(&mut d, 64, 16, 4);
    let t0 = Instant::now();
    for i in 0..50 {
        run_and_check(&mut d, &small2, 64, 16, 4, i as f32 * 0.01, i > 0);
    }
    let inproc_time = t0.elapsed() / 50;
    println!(
        "set+compute+get of a 64x16x4 matmul: worker {worker_time:?}, in-process {inproc_time:?}"
    );
    drop(c);
    let t0 = Instant::now();
    loop {
        let now = rss_of(pid);
        if now + (48 << 20) < with {
            println!(
                "worker rss {} MiB with the buffers, {} MiB after",
                with >> 20,
                now >> 20
            );
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "worker still holds {} MiB (had {} MiB)",
            now >> 20,
            with >> 20
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What the worker costs per graph: GRAPH_RECOMPUTE of a one-node graph
/// (16 floats), each followed by a DEVICE_COUNT round trip so that the
/// compute has finished, in-process vs worker. A measurement, not a test:
/// `cargo test --features ggml --test compute_isolation -- --ignored --nocapture`.
#[test]
#[ignore = "measurement"]
fn measure_worker_overhead_per_graph() {
    fn median_us(h: &ServerHandle) -> f64 {
        let mut c = connect(h);
        let g = matmul(&mut c, 4, 2, 2);
        c.graph_compute(&g.graph).unwrap();
        let mut samples: Vec<f64> = (0..2000)
            .map(|_| {
                let t0 = Instant::now();
                c.graph_recompute(0).unwrap();
                c.device_count().unwrap();
                t0.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        samples.sort_by(f64::total_cmp);
        samples[samples.len() / 2]
    }
    let (worker, _) = isolated(&[]);
    let inproc = start_ggml();
    let (w, i) = (median_us(&worker), median_us(&inproc));
    println!(
        "recompute + round trip, median of 2000: worker {w:.1} us, in-process {i:.1} us, worker adds {:.1} us",
        w - i
    );
}
