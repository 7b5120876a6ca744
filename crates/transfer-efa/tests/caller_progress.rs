//! Caller-driven progress over a real provider (tcp on loopback) with no
//! helper threads at all: each engine moves only while its own thread is
//! inside it, as in a latency-critical application's loop.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use transfer_core::{
    DoneFlag, Notify, ProgressMode, RemoteTarget, TransferEngine, TransferError, WriteRequest,
};
use transfer_efa::Provider;

use common::GUARD;

fn engine() -> Option<TransferEngine> {
    let domains = common::open(Provider::Tcp, 1)?;
    let e = TransferEngine::builder()
        .progress(ProgressMode::Caller)
        .group(domains)
        .build();
    assert!(e.is_ok(), "{e:?}");
    e.ok()
}

fn target_of(
    from: &TransferEngine,
    to: &TransferEngine,
    region: &transfer_core::LocalRegion,
) -> RemoteTarget {
    let peer = from.peer(to.address()).expect("peer");
    from.remote(&peer, region.remote().clone()).expect("remote")
}

#[test]
fn imm_ping_pong_with_data_one_thread_per_engine() {
    let (Some(a), Some(b)) = (engine(), engine()) else {
        return;
    };
    assert_eq!(a.progress_mode(), ProgressMode::Caller);
    const ITERS: u32 = 300;
    const LEN: usize = 64;
    let ra = a.alloc_host(1 << 16, 0).expect("alloc a");
    let rb = b.alloc_host(1 << 16, 0).expect("alloc b");
    let to_b = target_of(&a, &b, &rb);
    let to_a = target_of(&b, &a, &ra);
    let (ping, pong) = (0x10, 0x20);
    std::thread::scope(|s| {
        let echo = s.spawn(|| {
            let mut buf = [0u8; LEN];
            for i in 0..ITERS {
                b.wait_imm(ping, 1, GUARD).expect("ping");
                // The ping's data landed before its immediate.
                rb.read_at(0, &mut buf).expect("read b");
                assert!(buf.iter().all(|&x| x == i as u8), "round {i}: {buf:?}");
                rb.write_at(LEN, &[!(i as u8); LEN]).expect("fill b");
                let flag = DoneFlag::new();
                b.submit_write(
                    WriteRequest {
                        src: &rb,
                        src_offset: LEN as u64,
                        dst: &to_a,
                        dst_offset: 0,
                        len: LEN as u64,
                        imm: Some(pong),
                    },
                    Notify::Flag(flag.clone()),
                )
                .expect("pong");
                // A flag is polled with progress in the loop.
                let deadline = Instant::now() + GUARD;
                while !flag.is_done() {
                    b.progress();
                    assert!(Instant::now() < deadline, "pong never completed");
                }
                assert!(matches!(flag.result(), Some(Ok(()))));
            }
        });
        let mut buf = [0u8; LEN];
        for i in 0..ITERS {
            ra.write_at(LEN, &[i as u8; LEN]).expect("fill a");
            let p = a
                .write(WriteRequest {
                    src: &ra,
                    src_offset: LEN as u64,
                    dst: &to_b,
                    dst_offset: 0,
                    len: LEN as u64,
                    imm: Some(ping),
                })
                .expect("ping");
            a.wait_imm(pong, 1, GUARD).expect("pong");
            p.wait_timeout(GUARD).expect("ping completion");
            ra.read_at(0, &mut buf).expect("read a");
            assert!(buf.iter().all(|&x| x == !(i as u8)), "round {i}: {buf:?}");
        }
        echo.join().expect("echo thread");
    });
}

#[test]
fn receive_callbacks_run_inside_progress_and_may_submit_but_not_block() {
    let (Some(a), Some(b)) = (engine(), engine()) else {
        return;
    };
    let b = Arc::new(b);
    let a_addr = a.address().clone();
    let blocked: Arc<Mutex<Option<TransferError>>> = Arc::default();
    {
        let weak = Arc::downgrade(&b);
        let blocked = blocked.clone();
        b.start_recv_pool(8, 256, move |bytes| {
            let Some(b) = weak.upgrade() else { return };
            if bytes == b"block" {
                // Would wait for the pass this callback runs in: refused.
                let r = b.wait_imm(0x99, 1, Duration::from_secs(30));
                *blocked.lock().expect("lock") = r.err();
                return;
            }
            let peer = b.peer(&a_addr).expect("peer");
            let mut reply = bytes.to_vec();
            reply.reverse();
            b.submit_send(
                &peer,
                &reply,
                Notify::callback(|r| assert!(r.is_ok(), "{r:?}")),
            )
            .expect("echo");
        })
        .expect("pool b");
    }
    let got: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    {
        let got = got.clone();
        a.start_recv_pool(8, 256, move |bytes| {
            got.lock().expect("lock").push(bytes.to_vec())
        })
        .expect("pool a");
    }
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Acquire) {
                if !b.progress() {
                    std::thread::yield_now();
                }
            }
        });
        let to_b = a.peer(b.address()).expect("peer");
        const N: usize = 50;
        for i in 0..N {
            let msg = format!("message {i:03}");
            a.send(&to_b, msg.as_bytes())
                .expect("send")
                .wait_timeout(GUARD)
                .expect("send done");
        }
        let deadline = Instant::now() + GUARD;
        while got.lock().expect("lock").len() < N {
            a.progress();
            assert!(Instant::now() < deadline, "echoes missing");
        }
        a.send(&to_b, b"block")
            .expect("send")
            .wait_timeout(GUARD)
            .expect("sent");
        let deadline = Instant::now() + GUARD;
        while blocked.lock().expect("lock").is_none() {
            a.progress();
            assert!(
                Instant::now() < deadline,
                "the blocking callback never returned"
            );
        }
        stop.store(true, Ordering::Release);
    });
    let got = got.lock().expect("lock");
    for (i, m) in got.iter().enumerate() {
        let mut want = format!("message {i:03}").into_bytes();
        want.reverse();
        assert_eq!(m, &want);
    }
    let err = blocked.lock().expect("lock").clone().expect("error");
    assert!(err.to_string().contains("receive callback"), "{err}");
}

#[test]
fn pending_future_drives_the_engine_and_drop_fails_what_is_queued() {
    let (Some(a), Some(b)) = (engine(), engine()) else {
        return;
    };
    let ra = a.alloc_host(4096, 0).expect("alloc a");
    let rb = b.alloc_host(4096, 0).expect("alloc b");
    let to_b = target_of(&a, &b, &rb);
    ra.write_at(0, &[7u8; 128]).expect("fill");
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Acquire) {
                b.progress();
            }
        });
        let p = a
            .write(WriteRequest {
                src: &ra,
                src_offset: 0,
                dst: &to_b,
                dst_offset: 64,
                len: 128,
                imm: None,
            })
            .expect("write");
        // A busy-polling future: block_on drives the engine through it.
        transfer_core::conformance::block_on(p).expect("future");
        stop.store(true, Ordering::Release);
    });
    let mut buf = [0u8; 128];
    rb.read_at(64, &mut buf).expect("read");
    assert_eq!(buf, [7u8; 128]);
    // Queued but never posted: dropping the engine fails it, nothing hangs.
    let flag = DoneFlag::new();
    let _ = a.submit_write(
        WriteRequest {
            src: &ra,
            src_offset: 0,
            dst: &to_b,
            dst_offset: 0,
            len: 16,
            imm: None,
        },
        Notify::Flag(flag.clone()),
    );
    drop(a);
    assert!(flag.is_done(), "drop left a transfer unreported");
}

/// Measurement, not a check (`cargo test --release -p transfer-efa --test
/// caller_progress -- --ignored --nocapture`): 8 B write completion latency
/// over tcp of a bare domain (the raw loop) and of a caller-driven engine,
/// each against a target polled by a dedicated thread, in one process.
#[test]
#[ignore = "measurement; prints figures"]
fn measure_small_write_latency_raw_vs_caller() {
    use transfer_core::{Domain, DomainEvent, OpToken};
    const N: usize = 20_000;
    let p50 = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    // Raw: two bare domains.
    let Some(mut ds) = common::open(Provider::Tcp, 2) else {
        return;
    };
    let mut target = ds.pop().expect("target");
    let mut source = ds.pop().expect("source");
    let dst = common::Buf::new(&mut target, 4096, |_| 0);
    let src = common::Buf::new(&mut source, 4096, |i| i as u8);
    let peer = source.resolve_peer(&target.address()).expect("resolve");
    let op = src.write_to(0, 8, peer, &dst, 0, None);
    let stop = AtomicBool::new(false);
    let raw = std::thread::scope(|s| {
        s.spawn(|| {
            let mut ev = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                target.poll(&mut ev);
                ev.clear();
            }
        });
        let mut samples = Vec::with_capacity(N);
        let mut ev: Vec<DomainEvent> = Vec::new();
        for i in 0..N {
            let t0 = Instant::now();
            source.submit_writes(OpToken(i as u64), std::slice::from_ref(&op));
            'wait: loop {
                source.poll(&mut ev);
                for e in ev.drain(..) {
                    if let DomainEvent::Completed { result, .. } = e {
                        result.expect("raw write");
                        break 'wait;
                    }
                }
            }
            samples.push(t0.elapsed());
        }
        stop.store(true, Ordering::Relaxed);
        samples
    });
    // Caller-driven engines.
    let (Some(a), Some(b)) = (engine(), engine()) else {
        return;
    };
    let ra = a.alloc_host(4096, 0).expect("alloc a");
    let rb = b.alloc_host(4096, 0).expect("alloc b");
    let to_b = target_of(&a, &b, &rb);
    let stop = AtomicBool::new(false);
    let eng = std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                b.progress();
            }
        });
        let mut samples = Vec::with_capacity(N);
        for _ in 0..N {
            let flag = DoneFlag::new();
            let t0 = Instant::now();
            a.submit_write(
                WriteRequest {
                    src: &ra,
                    src_offset: 0,
                    dst: &to_b,
                    dst_offset: 0,
                    len: 8,
                    imm: None,
                },
                Notify::Flag(flag.clone()),
            )
            .expect("write");
            while !flag.is_done() {
                a.progress();
            }
            samples.push(t0.elapsed());
        }
        stop.store(true, Ordering::Relaxed);
        samples
    });
    println!(
        "8 B write completion p50: raw {:?}, caller-driven engine {:?}",
        p50(raw),
        p50(eng)
    );
}
