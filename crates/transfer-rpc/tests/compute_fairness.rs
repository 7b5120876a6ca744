//! Sessions share a device: a graph's work is bounded
//! (`ServerConfig::max_graph_work`) and sessions take turns graph by
//! graph, so one session flooding the device with heavy graphs (GRAPH_COMPUTE
//! then GRAPH_RECOMPUTE frames sent back to back, a 9-byte frame each)
//! delays another session's one-node graph by about one of its graphs.
#![cfg(feature = "ggml")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use transfer_rpc::client::Client;
use transfer_rpc::protocol::{GraphPayload, RpcTensor};
use transfer_rpc::server::{GgmlCpuBackend, Server, ServerConfig, ServerHandle};
use transfer_rpc::validate::GraphLimits;

/// Side of the hog's square matrices: one product is 512^3 multiply-adds
/// (tens of ms on one core).
const SIDE: u32 = 512;

/// `graph_work` of one 512x512 product node: output + inputs, plus output
/// times the contracted length.
fn product_work() -> u64 {
    let n = u64::from(SIDE) * u64::from(SIDE);
    3 * n + n * u64::from(SIDE)
}

fn start(max_graph_work: u64) -> ServerHandle {
    Server::bind(
        ServerConfig {
            bind: "127.0.0.1:0".into(),
            memory_quota: 64 << 20,
            max_buffer_size: 64 << 20,
            threads: 1,
            max_graph_work,
            ..ServerConfig::default()
        },
        Arc::new(GgmlCpuBackend::new(1, 1, GraphLimits::default())),
    )
    .unwrap()
    .spawn()
    .unwrap()
}

/// A graph listing one 512x512 matrix product `repeats` times.
fn hog_graph(c: &mut Client, repeats: usize) -> (GraphPayload, RpcTensor) {
    let n = u64::from(SIDE) * u64::from(SIDE) * 4;
    let (b, base) = alloc(c, 3 * n + 4096);
    let a = mat(1, b, base, 0, SIDE, SIDE);
    let x = mat(2, b, base, n, SIDE, SIDE);
    let mut p = mat(3, b, base, 2 * n, SIDE, SIDE);
    p.op = 29;
    p.src[0] = 1;
    p.src[1] = 2;
    p.flags = 16;
    let ones = f32_bytes(&vec![0.5; (SIDE * SIDE) as usize]);
    c.set_tensor(&a, 0, &ones).unwrap();
    c.set_tensor(&x, 0, &ones).unwrap();
    (
        GraphPayload {
            device: 0,
            nodes: vec![3; repeats],
            tensors: vec![a, x, p.clone()],
        },
        p,
    )
}

/// One ADD of 8 floats; returns how long compute + read-back took.
fn small_graph(c: &mut Client) -> Duration {
    let (b, base) = alloc(c, 4096);
    let x = f32_tensor(1, b, base, 0, 8);
    let y = f32_tensor(2, b, base, 64, 8);
    let mut s = f32_tensor(3, b, base, 128, 8);
    s.op = 2;
    s.src[0] = 1;
    s.src[1] = 2;
    s.flags = 16;
    let xv: Vec<f32> = (0..8).map(|i| i as f32).collect();
    c.set_tensor(&x, 0, &f32_bytes(&xv)).unwrap();
    c.set_tensor(&y, 0, &f32_bytes(&xv)).unwrap();
    let g = GraphPayload {
        device: 0,
        nodes: vec![3],
        tensors: vec![x, y, s.clone()],
    };
    let t = Instant::now();
    c.graph_compute(&g).unwrap();
    let got = floats(&c.get_tensor(&s, 0, 32).unwrap());
    let took = t.elapsed();
    let want: Vec<f32> = xv.iter().map(|v| 2.0 * v).collect();
    assert_eq!(got, want);
    took
}

#[test]
fn a_graph_over_the_work_cap_is_refused_before_it_runs() {
    // Four products allowed; 4096 (minutes of compute) refused at once.
    let h = start(4 * product_work());
    let mut hog = connect(&h);
    let (g, _) = hog_graph(&mut hog, 4096);
    let t = Instant::now();
    hog.graph_compute(&g).unwrap();
    assert!(is_closed(&mut hog), "the graph was not refused");
    println!("refused in {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(10));
    // Within the cap it runs.
    let mut ok = connect(&h);
    let (g, p) = hog_graph(&mut ok, 4);
    ok.graph_compute(&g).unwrap();
    let v = floats(&ok.get_tensor(&p, 0, 16).unwrap());
    assert_eq!(v, vec![0.25 * SIDE as f32; 4]);
}

#[test]
fn a_session_flooding_the_device_leaves_others_their_turn() {
    let h = start(8 * product_work());
    let mut hog = connect(&h);
    let (g, p) = hog_graph(&mut hog, 8);
    // One graph alone, for the figures.
    let t = Instant::now();
    hog.graph_compute(&g).unwrap();
    hog.get_tensor(&p, 0, 4).unwrap();
    let one = t.elapsed();
    // Then a flood: 60 more graphs of the same (seconds of compute), sent
    // without waiting.
    let flood = 60;
    let t = Instant::now();
    for _ in 0..flood {
        hog.graph_recompute(0).unwrap();
    }
    let hog_thread = std::thread::spawn(move || {
        hog.get_tensor(&p, 0, 4).unwrap();
        hog
    });
    std::thread::sleep(Duration::from_millis(100).max(one));
    let mut victim = connect(&h);
    let waited = small_graph(&mut victim);
    let hog = hog_thread.join().unwrap();
    let flood_took = t.elapsed();
    println!(
        "one hog graph {one:?}; the flood of {flood} {flood_took:?}; \
         the other session's one-node graph {waited:?}"
    );
    drop(hog);
    assert!(
        waited < Duration::from_secs(2),
        "the one-node graph waited {waited:?} (one hog graph: {one:?})"
    );
}
