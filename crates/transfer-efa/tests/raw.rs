//! The raw libfabric write loop (benchmark baseline), and an ignored
//! measurement that prints raw vs. Domain-path bandwidth on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::{Buf, Seen, drive, open};
use transfer_core::{Domain, OpToken};
use transfer_efa::raw::{RawParams, write_bandwidth};
use transfer_efa::{LibfabricDomain, Provider};

fn small_loop(p: Provider) {
    let Some(mut d) = open(p, 2) else { return };
    let (a, b) = d.split_at_mut(1);
    for imm in [false, true] {
        let params = RawParams {
            size: 64 << 10,
            count: 64,
            window: 8,
            imm,
            limit: Duration::from_secs(60),
        };
        let r = write_bandwidth(&mut a[0], &mut b[0], &params).unwrap();
        assert_eq!(r.writes, 64);
        assert_eq!(r.bytes, 64 * (64 << 10));
        assert!(r.bytes_per_sec > 0.0);
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

/// Writes `count` writes of `size` bytes through the Domain trait, one
/// submit per write, `window` submits in flight; returns bytes/s.
fn domain_path(
    a: &mut LibfabricDomain,
    b: &mut LibfabricDomain,
    size: usize,
    count: usize,
    window: usize,
) -> f64 {
    let src = Buf::new(a, size, |i| i as u8);
    let dst = Buf::new(b, size, |_| 0);
    let peer = a.resolve_peer(&b.address()).unwrap();
    let mut seen = Seen::default();
    let start = Instant::now();
    let mut submitted = 0usize;
    while seen.completed.len() < count {
        while submitted < count && submitted - seen.completed.len() < window {
            a.submit_writes(
                OpToken(submitted as u64),
                &[src.write_to(0, size, peer, &dst, 0, None)],
            );
            submitted += 1;
        }
        let before = seen.completed.len();
        drive(&mut [&mut *a, &mut *b], &mut seen, |s| {
            s.completed.len() > before
        });
    }
    let elapsed = start.elapsed();
    assert!(seen.completed.iter().all(|(_, r)| r.is_ok()));
    (size * count) as f64 / elapsed.as_secs_f64()
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
                size: 4 << 20,
                count: 128,
                window,
                imm: false,
                limit: Duration::from_secs(300),
            };
            let raw = write_bandwidth(&mut a[0], &mut b[0], &params).unwrap();
            let eng = domain_path(&mut a[0], &mut b[0], 4 << 20, 128, window);
            eprintln!(
                "{p}: 4 MiB writes, window {window}: raw {:.2} GB/s, Domain path {:.2} GB/s (delivery-complete: {})",
                raw.bytes_per_sec / 1e9,
                eng / 1e9,
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
