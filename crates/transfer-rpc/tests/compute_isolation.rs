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
use transfer_rpc::validate::GraphLimits;

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
        limits: GraphLimits::default(),
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

fn isolated_with(limits: GraphLimits) -> (ServerHandle, Arc<IsolatedBackend>) {
    let backend = Arc::new(IsolatedBackend::new(IsolatedConfig {
        program: env!("CARGO_BIN_EXE_transfer-rpc-compute").into(),
        devices: 1,
        threads: 1,
        timeout: Duration::from_secs(30),
        env: Vec::new(),
        limits,
    }));
    let h = Server::bind(
        ServerConfig {
            bind: "127.0.0.1:0".into(),
            memory_quota: 64 << 20,
            max_buffer_size: 64 << 20,
            graph_limits: limits,
            ..ServerConfig::default()
        },
        Arc::clone(&backend) as Arc<dyn ComputeBackend>,
    )
    .unwrap()
    .spawn()
    .unwrap();
    (h, backend)
}

/// GET_ROWS of `rows` rows (index `i % 16`) from a 4x16 f32 table.
fn get_rows(c: &mut Client, rows: u32) -> (GraphPayload, RpcTensor) {
    let (b, base) = alloc(c, 4096);
    let table = mat(1, b, base, 0, 4, 16);
    let mut idx = f32_tensor(2, b, base, 512, rows);
    idx.ty = 26; // I32
    let mut out = mat(3, b, base, 1024, 4, rows);
    out.op = 40; // GET_ROWS
    out.src[0] = 1;
    out.src[1] = 2;
    out.flags = 16;
    let tv: Vec<f32> = (0..64).map(|i| i as f32).collect();
    c.set_tensor(&table, 0, &f32_bytes(&tv)).unwrap();
    let iv: Vec<u8> = (0..rows).flat_map(|i| (i % 16).to_le_bytes()).collect();
    c.set_tensor(&idx, 0, &iv).unwrap();
    (
        GraphPayload {
            device: 0,
            nodes: vec![3],
            tensors: vec![table, idx, out.clone()],
        },
        out,
    )
}

#[test]
fn the_worker_validates_with_the_servers_limits() {
    // The server allows 4 index elements per graph (default: 2^24); the
    // worker, which checks them, must apply the same.
    let limits = GraphLimits {
        max_index_elements: 4,
        ..GraphLimits::default()
    };
    let (h, backend) = isolated_with(limits);
    let mut ok = connect(&h);
    let (g, out) = get_rows(&mut ok, 4);
    ok.graph_compute(&g).unwrap();
    let got = floats(&ok.get_tensor(&out, 0, 64).unwrap());
    assert_eq!(got[4..8], [4.0, 5.0, 6.0, 7.0]);
    let mut over = connect(&h);
    let (g, _) = get_rows(&mut over, 8);
    over.graph_compute(&g).unwrap();
    assert!(is_closed(&mut over), "8 index elements were not refused");
    // A refusal, not a worker failure.
    assert_eq!(backend.restarts(), 0);
}

#[test]
fn a_buffer_freed_while_its_graph_waits_is_that_graphs_error_not_the_workers() {
    use transfer_rpc::server::BufferRegistry;
    use transfer_rpc::validate::validate_graph;
    let registry = Arc::new(BufferRegistry::new(256 << 20));
    let limits = GraphLimits::default();
    let backend = Arc::new(IsolatedBackend::new(IsolatedConfig {
        program: env!("CARGO_BIN_EXE_transfer-rpc-compute").into(),
        devices: 1,
        threads: 1,
        timeout: Duration::from_secs(120),
        env: Vec::new(),
        limits,
    }));
    // A long graph (a 512^3 product listed 480 times) holds the worker for
    // seconds: 48 products took ~0.3 s once ggml was built -O3, so the small
    // graph ran before its buffer was freed and the race went untested.
    let side = 512u32;
    let n = u64::from(side * side * 4);
    let big = registry.alloc(1, 0, 3 * n).unwrap();
    let a = mat(1, big.handle, big.base, 0, side, side);
    let x = mat(2, big.handle, big.base, n, side, side);
    let mut p = mat(3, big.handle, big.base, 2 * n, side, side);
    p.op = 29;
    p.src[0] = 1;
    p.src[1] = 2;
    p.flags = 16;
    let long = GraphPayload {
        device: 0,
        nodes: vec![3; 480],
        tensors: vec![a, x, p],
    };
    let long = validate_graph(long, 1, registry.as_ref(), &limits).unwrap();
    // A small graph on another session's buffer.
    let small = registry.alloc(2, 0, 4096).unwrap();
    let x = f32_tensor(1, small.handle, small.base, 0, 8);
    let y = f32_tensor(2, small.handle, small.base, 64, 8);
    let mut s = f32_tensor(3, small.handle, small.base, 128, 8);
    s.op = 2;
    s.src[0] = 1;
    s.src[1] = 2;
    s.flags = 16;
    let add = GraphPayload {
        device: 0,
        nodes: vec![3],
        tensors: vec![x, y, s],
    };
    let add = validate_graph(add, 1, registry.as_ref(), &limits).unwrap();
    let handle = small.handle;
    drop(small);

    let (b, r) = (Arc::clone(&backend), Arc::clone(&registry));
    let first = std::thread::spawn(move || b.compute(&long, r.as_ref()));
    // The worker is busy with the long graph (seconds; it starts within
    // milliseconds)...
    std::thread::sleep(Duration::from_millis(400));
    // ...when the small graph looks its buffer up and waits for the worker,
    let (b, r) = (Arc::clone(&backend), Arc::clone(&registry));
    let second = std::thread::spawn(move || b.compute(&add, r.as_ref()));
    std::thread::sleep(Duration::from_millis(300));
    // and its buffer is freed meanwhile.
    assert!(
        !first.is_finished() && !second.is_finished(),
        "the long graph must still hold the worker when the buffer is freed (make it longer)"
    );
    registry.free(2, handle).unwrap();
    let pid = backend.worker_pids();
    let refused = second.join().unwrap();
    first.join().unwrap().unwrap();
    let e = refused
        .expect_err("the small graph's buffer is gone")
        .to_string();
    println!("{e}");
    assert!(
        e.contains("freed") || e.contains("unknown handle"),
        "unexpected error: {e}"
    );
    assert_eq!(backend.restarts(), 0, "the worker was blamed: {e}");
    assert_eq!(backend.worker_pids(), pid, "the worker was replaced");
}

/// Both compute backends: in-process ggml-cpu and a worker process.
fn both_backends() -> Vec<(&'static str, ServerHandle)> {
    vec![("in-process", start_ggml()), ("isolated", isolated(&[]).0)]
}

/// RMS_NORM of x (4x2), then MUL by a weight row w; the norm's result is
/// prefilled with 7.0 and its use count (as llama.cpp's client sends it)
/// is `uses`. Returns the graph, the norm and the MUL's result.
fn rms_mul(c: &mut Client, uses: i32) -> (GraphPayload, RpcTensor, RpcTensor) {
    let (b, base) = alloc(c, 4096);
    let x = mat(1, b, base, 0, 4, 2);
    let w = mat(2, b, base, 256, 4, 1);
    let mut norm = mat(3, b, base, 512, 4, 2);
    norm.op = 25; // RMS_NORM
    norm.src[0] = 1;
    norm.op_params[0] = 1e-6f32.to_bits() as i32;
    norm.flags = 16;
    norm.use_count = uses;
    let mut out = mat(4, b, base, 1024, 4, 2);
    out.op = 7; // MUL
    out.src[0] = 3;
    out.src[1] = 2;
    out.flags = 16;
    out.use_count = 0;
    let xs = [1.0f32, 2.0, 3.0, 4.0, -1.0, 0.5, 0.0, 2.0];
    c.set_tensor(&x, 0, &f32_bytes(&xs)).unwrap();
    c.set_tensor(&w, 0, &f32_bytes(&[0.5, -1.0, 2.0, 1.0]))
        .unwrap();
    c.set_tensor(&norm, 0, &f32_bytes(&[7.0; 8])).unwrap();
    let graph = GraphPayload {
        device: 0,
        nodes: vec![3, 4],
        tensors: vec![x, w, norm.clone(), out.clone()],
    };
    (graph, norm, out)
}

fn rms_mul_reference() -> (Vec<f32>, Vec<f32>) {
    let xs = [1.0f32, 2.0, 3.0, 4.0, -1.0, 0.5, 0.0, 2.0];
    let w = [0.5f32, -1.0, 2.0, 1.0];
    let mut norm = Vec::new();
    for row in xs.chunks(4) {
        let mean = row.iter().map(|v| v * v).sum::<f32>() / 4.0;
        let scale = 1.0 / (mean + 1e-6).sqrt();
        norm.extend(row.iter().map(|v| v * scale));
    }
    let out = norm.iter().enumerate().map(|(i, v)| v * w[i % 4]).collect();
    (norm, out)
}

fn close(got: &[f32], want: &[f32]) -> bool {
    got.len() == want.len() && got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-4)
}

/// The use counts llama.cpp's client sends reach ggml as upstream's server
/// hands them over: an RMS_NORM whose one consumer is the next node, a
/// MUL, runs fused (its own result is never written, as on upstream's
/// rpc-server); with two uses it is computed on its own. Before, every
/// count was 0 and nothing fused.
#[test]
fn rms_norm_then_mul_fuses_as_upstream_does() {
    let (want_norm, want_out) = rms_mul_reference();
    for (name, h) in both_backends() {
        let mut c = connect(&h);
        let (g, norm, out) = rms_mul(&mut c, 1);
        c.graph_compute(&g).unwrap();
        let got = floats(&c.get_tensor(&out, 0, 32).unwrap());
        assert!(close(&got, &want_out), "{name}: {got:?} != {want_out:?}");
        assert_eq!(
            floats(&c.get_tensor(&norm, 0, 32).unwrap()),
            vec![7.0; 8],
            "{name}: fused, the norm's own result is not written"
        );
        let (g, norm, out) = rms_mul(&mut c, 2);
        c.graph_compute(&g).unwrap();
        let got = floats(&c.get_tensor(&out, 0, 32).unwrap());
        assert!(close(&got, &want_out), "{name}: {got:?}");
        let got = floats(&c.get_tensor(&norm, 0, 32).unwrap());
        assert!(
            close(&got, &want_norm),
            "{name}: two uses, not fused: {got:?}"
        );
    }
}

/// A GRAPH_COMPUTE of the graph the session already keeps runs that graph
/// again (what the backends built for it is reused): it reads the inputs
/// as they are now, survives other buffers being freed, and is refused
/// once one of its own buffers is gone.
#[test]
fn the_same_graph_sent_again_reads_new_inputs_and_sees_freed_buffers() {
    for (name, h) in both_backends() {
        let mut c = connect(&h);
        let (b, base) = alloc(&mut c, 1 << 16);
        let mut g = add_graph(b, base, 64);
        g.tensors[2].flags = 16;
        let x = g.tensors[0].clone();
        let out = g.tensors[2].clone();
        let expect = |c: &mut Client, v: f32, what: &str| {
            c.set_tensor(&x, 0, &f32_bytes(&[v; 64])).unwrap();
            c.graph_compute(&g).unwrap();
            let got = floats(&c.get_tensor(&out, 0, 256).unwrap());
            let y = floats(&c.get_tensor(&g.tensors[1], 0, 256).unwrap());
            let want: Vec<f32> = y.iter().map(|y| v + y).collect();
            assert_eq!(got, want, "{name}: {what}");
        };
        expect(&mut c, 1.0, "first");
        expect(&mut c, 2.0, "sent again");
        // A buffer of another session freed meanwhile.
        let mut other = connect(&h);
        let (ob, _) = alloc(&mut other, 4096);
        other.free_buffer(ob).unwrap();
        expect(&mut c, 3.0, "after another buffer was freed");
        // Another session sending the same bytes (a handle is a
        // capability) computes its own graph, not this session's.
        other.graph_compute(&g).unwrap();
        other.get_tensor(&out, 0, 4).unwrap();
        expect(&mut c, 4.0, "after the other session's graph");
        c.free_buffer(b).unwrap();
        assert!(
            c.graph_compute(&g).is_err() || c.get_tensor(&out, 0, 4).is_err(),
            "{name}: its buffer is gone"
        );
        // The server goes on.
        let mut d = connect(&h);
        let (b2, base2) = alloc(&mut d, 1 << 16);
        let mut g2 = add_graph(b2, base2, 64);
        g2.tensors[2].flags = 16;
        d.set_tensor(&g2.tensors[0], 0, &f32_bytes(&[1.0; 64]))
            .unwrap();
        d.graph_compute(&g2).unwrap();
    }
}
