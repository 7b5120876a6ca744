//! Same-host wake-up on shm: an engine whose worker went to sleep blocks
//! on its doorbell (not on a timer), and a peer's write rings it awake:
//! a plain write (no immediate, no event at the target: only the target's
//! progress completes it), a write with an immediate, a 16 MiB write (its
//! later segments come from the provider's progress, not from a post) and
//! a message. Its blocks and parks last up to two minutes: only the
//! doorbell can wake it within the guard.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use transfer_core::{Domain, IdlePolicy, TransferEngine, WriteRequest};
use transfer_efa::Provider;

/// Well past the spin window (200 µs): the worker is asleep.
const NAP: Duration = Duration::from_millis(300);
const WAKE: Duration = Duration::from_secs(20);

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u64).wrapping_mul(31) ^ seed) as u8)
        .collect()
}

fn engine(idle: IdlePolicy) -> Option<TransferEngine> {
    let domains = common::open(Provider::Shm, 1)?;
    Some(
        TransferEngine::builder()
            .idle_policy(idle)
            .group(domains)
            .build()
            .unwrap(),
    )
}

/// Naps, then checks the worker blocked (never parked) since `before`.
fn asleep(e: &TransferEngine, before: u64) -> u64 {
    std::thread::sleep(NAP);
    let (blocked, parked) = e.idle_stats()[0];
    assert!(
        blocked > before && parked == 0,
        "idle worker: blocked {before} then {blocked}, parked {parked}"
    );
    blocked
}

#[test]
fn a_sleeping_shm_worker_is_rung_awake() {
    let Some(d) = common::open(Provider::Shm, 1) else {
        return;
    };
    assert!(d[0].wait_fd().is_some(), "an shm domain without a doorbell");
    drop(d);
    let idle = IdlePolicy {
        max_block: Duration::from_secs(120),
        max_park: Duration::from_secs(120),
        ..IdlePolicy::default()
    };
    let (Some(b), Some(a)) = (engine(idle), engine(IdlePolicy::default())) else {
        return;
    };
    const BIG: usize = 16 << 20;
    let dst = b.alloc_host(BIG, 0).unwrap();
    let src = a.alloc_host(BIG, 0).unwrap();
    let peer = a.peer(b.address()).unwrap();
    let t = a.remote(&peer, dst.remote().clone()).unwrap();
    let write = |len: usize, seed: u64, imm: Option<u32>| {
        let data = pattern(len, seed);
        src.write_at(0, &data).unwrap();
        let t0 = Instant::now();
        a.write(WriteRequest {
            src: &src,
            src_offset: 0,
            dst: &t,
            dst_offset: 0,
            len: len as u64,
            imm,
        })
        .unwrap()
        .wait_timeout(WAKE)
        .unwrap();
        if let Some(imm) = imm {
            b.wait_imm(imm, 1, WAKE).unwrap();
        }
        let took = t0.elapsed();
        let mut got = vec![0u8; len];
        dst.read_at(0, &mut got).unwrap();
        assert!(got == data, "{len} bytes did not land");
        took
    };
    // Connects the two (the first write sets up the shm peer).
    write(64, 1, Some(1));

    let n = asleep(&b, 0);
    let plain = write(8, 2, None);
    let n = asleep(&b, n);
    let with_imm = write(64, 3, Some(2));
    let n = asleep(&b, n);
    let big = write(BIG, 4, None);
    let n = asleep(&b, n);

    // A message into a posted receive.
    let (tx, rx) = std::sync::mpsc::channel();
    b.start_recv_pool(4, 4096, move |bytes| {
        let _ = tx.send(bytes.to_vec());
    })
    .unwrap();
    asleep(&b, n);
    let t0 = Instant::now();
    a.send(&peer, &pattern(100, 5))
        .unwrap()
        .wait_timeout(WAKE)
        .unwrap();
    assert_eq!(rx.recv_timeout(WAKE).unwrap(), pattern(100, 5));
    let msg = t0.elapsed();
    eprintln!(
        "a blocked shm worker, rung awake: 8 B write {plain:?}, 64 B + imm {with_imm:?}, \
         16 MiB write {big:?}, 100 B message {msg:?}"
    );
    assert_eq!(b.idle_stats()[0].1, 0, "the worker never parked");
}

/// Thread-mode engines over shm with and without the doorbell
/// (`LibfabricConfig::wait_fd`), interleaved: 8 B write latency to an idle
/// target, and write bandwidth with 16 writes in flight.
#[test]
#[ignore = "measurement; run with --ignored --nocapture"]
fn measure_doorbell_on_and_off() {
    use transfer_core::Pending;
    use transfer_efa::LibfabricConfig;
    let pair = |bell: bool| {
        let cfg = LibfabricConfig {
            wait_fd: bell,
            ..LibfabricConfig::loopback(Provider::Shm)
        };
        let open = || {
            TransferEngine::builder()
                .group(common::open_with(cfg.clone(), 1).unwrap())
                .build()
                .unwrap()
        };
        (open(), open())
    };
    const LEN: usize = 16 << 20;
    for round in 0..3 {
        for bell in [false, true] {
            let (a, b) = pair(bell);
            let src = a.alloc_host(LEN, 0).unwrap();
            let dst = b.alloc_host(LEN, 0).unwrap();
            let peer = a.peer(b.address()).unwrap();
            let t = a.remote(&peer, dst.remote().clone()).unwrap();
            let req = |len: usize| WriteRequest {
                src: &src,
                src_offset: 0,
                dst: &t,
                dst_offset: 0,
                len: len as u64,
                imm: None,
            };
            a.write(req(8)).unwrap().wait_timeout(WAKE).unwrap();
            let mut lat = Vec::new();
            for _ in 0..50 {
                // An idle target: past the spin window.
                std::thread::sleep(Duration::from_millis(2));
                let t0 = Instant::now();
                a.write(req(8)).unwrap().wait_timeout(WAKE).unwrap();
                lat.push(t0.elapsed());
            }
            lat.sort();
            let mut line = format!(
                "round {round} doorbell {bell}: 8 B to an idle target p50 {:?}",
                lat[lat.len() / 2]
            );
            for size in [64 << 10, 1 << 20, 16 << 20] {
                let count = ((256usize << 20) / size).clamp(16, 4096);
                let t0 = Instant::now();
                let mut q: std::collections::VecDeque<Pending> = Default::default();
                for _ in 0..count {
                    if q.len() >= 16 {
                        q.pop_front().unwrap().wait_timeout(WAKE).unwrap();
                    }
                    q.push_back(a.write(req(size)).unwrap());
                }
                for p in q {
                    p.wait_timeout(WAKE).unwrap();
                }
                let gbs = (size * count) as f64 / t0.elapsed().as_secs_f64() / 1e9;
                line += &format!(", {} KiB {gbs:.2} GB/s", size >> 10);
            }
            std::thread::sleep(Duration::from_millis(500));
            let cpu = b.idle_stats()[0];
            eprintln!("{line}; target blocked/parked {cpu:?}");
        }
    }
}
