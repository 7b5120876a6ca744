//! Load and faults on a computing server (run with `--features ggml`):
//! 32 clients at once, each computing its own MUL_MAT + ADD and checking
//! the result against a reference; clients killed mid-session give their
//! buffers back; the server serves a fresh client afterwards.
#![cfg(feature = "ggml")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use transfer_rpc::client::Client;
use transfer_rpc::protocol::GraphPayload;
use transfer_rpc::server::{GgmlCpuBackend, Server, ServerConfig};
use transfer_rpc::validate::GraphLimits;

const CLIENTS: usize = 32;
const ROUNDS: usize = 6;

/// One client's session: `ROUNDS` graphs with inputs of its own; returns
/// the largest error against the reference.
fn session(c: &mut Client, seed: u32) -> f32 {
    let (b, base) = alloc(c, 1 << 16);
    let (k, m, n) = (16u32, 8u32, 4u32);
    let a = mat(1, b, base, 0, k, m);
    let x = mat(2, b, base, 4096, k, n);
    let bias = mat(3, b, base, 8192, m, 1);
    let mut mm = mat(4, b, base, 12288, m, n);
    mm.op = 29; // MUL_MAT
    mm.src[0] = 1;
    mm.src[1] = 2;
    mm.flags = 16;
    let mut out = mat(5, b, base, 16384, m, n);
    out.op = 2; // ADD
    out.src[0] = 4;
    out.src[1] = 3;
    out.flags = 16;
    let mut worst = 0f32;
    for round in 0..ROUNDS as u32 {
        let s = seed * 131 + round * 7;
        let av: Vec<f32> = (0..k * m)
            .map(|i| ((i + s) % 13) as f32 * 0.125 - 0.5)
            .collect();
        let xv: Vec<f32> = (0..k * n)
            .map(|i| ((i * 3 + s) % 11) as f32 * 0.25 - 1.0)
            .collect();
        let bv: Vec<f32> = (0..m).map(|i| (i + s) as f32 * 0.01).collect();
        c.set_tensor(&a, 0, &f32_bytes(&av)).unwrap();
        c.set_tensor(&x, 0, &f32_bytes(&xv)).unwrap();
        c.set_tensor(&bias, 0, &f32_bytes(&bv)).unwrap();
        c.graph_compute(&GraphPayload {
            device: 0,
            nodes: vec![4, 5],
            tensors: vec![a.clone(), x.clone(), bias.clone(), mm.clone(), out.clone()],
        })
        .unwrap();
        let got = floats(&c.get_tensor(&out, 0, u64::from(m * n) * 4).unwrap());
        for j in 0..n as usize {
            for i in 0..m as usize {
                let k = k as usize;
                let dot: f32 = (0..k).map(|q| av[q + k * i] * xv[q + k * j]).sum();
                let want = dot + bv[i];
                worst = worst.max((got[i + m as usize * j] - want).abs());
            }
        }
    }
    worst
}

#[test]
fn thirty_two_clients_compute_correct_results_and_killed_ones_give_memory_back() {
    let h = Server::bind(
        ServerConfig {
            bind: "127.0.0.1:0".into(),
            memory_quota: 64 << 20,
            max_buffer_size: 16 << 20,
            ..ServerConfig::default()
        },
        std::sync::Arc::new(GgmlCpuBackend::new(1, 2, GraphLimits::default())),
    )
    .unwrap()
    .spawn()
    .unwrap();
    let t0 = Instant::now();
    let threads: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let endpoint = h.endpoint();
            std::thread::spawn(move || {
                let mut c = Client::connect(&endpoint, Default::default()).unwrap();
                session(&mut c, i as u32)
            })
        })
        .collect();
    let worst = threads
        .into_iter()
        .map(|t| t.join().unwrap())
        .fold(0f32, f32::max);
    println!(
        "{CLIENTS} clients x {ROUNDS} graphs in {:?}, max error {worst}",
        t0.elapsed()
    );
    assert!(worst < 1e-4, "max error {worst}");

    // Clients killed mid-session: a buffer written, then the socket
    // dropped in the middle of a frame (a SET_TENSOR header promising more
    // bytes than ever come).
    for _ in 0..8 {
        let mut c = connect(&h);
        let (b, base) = alloc(&mut c, 4 << 20);
        c.set_tensor(&mat(1, b, base, 0, 1024, 1024), 0, &vec![1u8; 4 << 20])
            .unwrap();
        drop(c);
        let mut raw = TcpStream::connect(h.addr()).unwrap();
        raw.write_all(&[14, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap();
        drop(raw);
    }
    let t0 = Instant::now();
    while !h.shared().registry.is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{} bytes still allocated",
            h.shared().registry.used()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(h.shared().registry.used(), 0);
    // And the server still computes for a fresh client.
    let mut c = connect(&h);
    assert!(session(&mut c, 99) < 1e-4);
}
