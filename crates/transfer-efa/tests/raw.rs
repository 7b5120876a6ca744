//! The shared raw write loop (`transfer_core::rawloop`, the benchmarks'
//! baseline) on libfabric domains, and ignored measurements that print its
//! bandwidth on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::{Buf, Seen, drive, open};
use transfer_core::rawloop::{RawParams, RawPath, RawRun, run};
use transfer_core::{Domain, DomainEvent, OpToken};
use transfer_efa::{LibfabricDomain, Provider};

/// The raw loop from `a` into a fresh buffer on `b`, `b` polled in the
/// same thread (manual-progress providers move data only while it polls).
fn raw(a: &mut LibfabricDomain, b: &mut LibfabricDomain, params: &RawParams) -> (RawRun, Vec<u8>) {
    let src = Buf::new(a, params.size, |i| (i as u8) ^ 0x5A);
    let dst = Buf::new(b, params.size, |_| 0);
    let peer = a.resolve_peer(&b.address()).unwrap();
    let mut path = RawPath {
        domain: &mut *a,
        peer,
        mr: src.mr,
        src: src.mem.as_ptr(),
        base: dst.remote.base,
        key: dst.remote.key.0,
    };
    let mut sink: Vec<DomainEvent> = Vec::new();
    let r = run(&mut path, params, || {
        sink.clear();
        b.poll(&mut sink);
    })
    .unwrap();
    (r, dst.mem.clone())
}

fn small_loop(p: Provider) {
    let Some(mut d) = open(p, 2) else { return };
    let (a, b) = d.split_at_mut(1);
    for imm in [None, Some(0x5eed)] {
        for window in [1, 8] {
            let params = RawParams {
                imm,
                limit: Duration::from_secs(60),
                ..RawParams::new(64 << 10, 64, window)
            };
            let (r, landed) = raw(&mut a[0], &mut b[0], &params);
            assert_eq!(r.bytes, 64 * (64 << 10));
            assert_eq!(r.samples.len(), if window == 1 { 64 } else { 0 });
            assert!(r.bytes_per_sec() > 0.0);
            assert!(
                landed
                    .iter()
                    .enumerate()
                    .all(|(i, &v)| v == (i as u8) ^ 0x5A)
            );
        }
    }
    assert!(!a[0].has_pending() && !b[0].has_pending());
}

#[test]
fn raw_loop_tcp() {
    small_loop(Provider::Tcp)
}

#[test]
fn raw_loop_shm() {
    small_loop(Provider::Shm)
}

#[test]
#[ignore = "measurement; run with --ignored --nocapture"]
fn measure_4mib() {
    for p in [Provider::Tcp, Provider::Shm] {
        let Some(mut d) = open(p.clone(), 2) else {
            continue;
        };
        let (a, b) = d.split_at_mut(1);
        for window in [1usize, 4, 16] {
            let params = RawParams {
                limit: Duration::from_secs(300),
                ..RawParams::new(4 << 20, 128, window)
            };
            let (r, _) = raw(&mut a[0], &mut b[0], &params);
            eprintln!(
                "{p}: 4 MiB writes, window {window}: raw loop {:.2} GB/s (delivery-complete: {})",
                r.bytes_per_sec() / 1e9,
                a[0].reports_remote_errors()
            );
        }
    }
}

#[test]
#[ignore = "measurement; run with --ignored --nocapture"]
fn measure_post_batch() {
    use transfer_efa::LibfabricConfig;
    for p in [Provider::Tcp, Provider::Shm] {
        for batch in [1usize, 8, 32, 128] {
            let cfg = LibfabricConfig::loopback(p.clone()).with_post_batch(batch);
            let Some(mut d) = common::open_with(cfg, 2) else {
                return;
            };
            let (a, b) = d.split_at_mut(1);
            let (a, b) = (&mut a[0], &mut b[0]);
            const N: usize = 512;
            const S: usize = 64 << 10;
            let src = Buf::new(a, N * S, |i| i as u8);
            let dst = Buf::new(b, N * S, |_| 0);
            let peer = a.resolve_peer(&b.address()).unwrap();
            let writes: Vec<_> = (0..N)
                .map(|i| src.write_to(i * S, S, peer, &dst, i * S, None))
                .collect();
            let mut seen = Seen::default();
            let start = Instant::now();
            for round in 0..4u64 {
                a.submit_writes(OpToken(round), &writes);
                drive(&mut [&mut *a, &mut *b], &mut seen, |s| {
                    s.completed.len() as u64 > round
                });
            }
            let secs = start.elapsed().as_secs_f64();
            eprintln!(
                "{p}: post_batch {batch}: 4 x {N} x 64 KiB in one submit each: {:.2} GB/s",
                (4 * N * S) as f64 / secs / 1e9
            );
        }
    }
}
