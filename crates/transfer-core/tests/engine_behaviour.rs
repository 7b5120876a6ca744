//! Engine behaviour beyond the conformance suite: slow callbacks, full
//! queues, injected failures, dead peers and random arrival orders, all over
//! the seeded in-memory test domain.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use transfer_core::testing::{TestFabric, TestFabricConfig};
use transfer_core::{
    DoneFlag, Notify, ProgressMode, RemoteTarget, TransferEngine, TransferError, WriteRequest,
    WriteShape,
};

const GUARD: Duration = Duration::from_secs(60);

fn pair(
    config: TestFabricConfig,
    nics: usize,
    capacity: usize,
) -> (TestFabric, TransferEngine, TransferEngine) {
    let fabric = TestFabric::new(config);
    let build = || {
        TransferEngine::builder()
            .queue_capacity(capacity)
            .group(fabric.domains(nics))
            .build()
            .unwrap()
    };
    let (a, b) = (build(), build());
    (fabric, a, b)
}

fn target(a: &TransferEngine, b: &TransferEngine, r: &transfer_core::LocalRegion) -> RemoteTarget {
    let peer = a.peer(b.address()).unwrap();
    a.remote(&peer, r.remote().clone()).unwrap()
}

#[test]
fn slow_callback_does_not_stall_the_worker() {
    let (_f, a, b) = pair(TestFabricConfig::default(), 1, 64);
    let src = a.alloc_host(4096, 0).unwrap();
    let dst = b.alloc_host(4096, 0).unwrap();
    let t = target(&a, &b, &dst);
    let req = || WriteRequest {
        src: &src,
        src_offset: 0,
        dst: &t,
        dst_offset: 0,
        len: 64,
        imm: None,
    };
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let (entered_tx, entered_rx) = mpsc::channel::<()>();
    a.submit_write(
        req(),
        Notify::callback(move |_| {
            let _ = entered_tx.send(());
            // Blocks the callback thread until the test has seen later completions.
            let _ = release_rx.recv_timeout(GUARD);
        }),
    )
    .unwrap();
    entered_rx.recv_timeout(GUARD).unwrap();
    for _ in 0..20 {
        let flag = DoneFlag::new();
        a.submit_write(req(), Notify::Flag(flag.clone())).unwrap();
        let deadline = std::time::Instant::now() + GUARD;
        while !flag.is_done() {
            assert!(
                std::time::Instant::now() < deadline,
                "worker stalled behind a slow callback"
            );
            std::thread::yield_now();
        }
        a.write(req()).unwrap().wait_timeout(GUARD).unwrap();
    }
    release_tx.send(()).unwrap();
}

#[test]
fn full_queue_and_submits_from_callbacks_never_deadlock() {
    let (_f, a, b) = pair(TestFabricConfig::default(), 2, 2);
    let a = Arc::new(a);
    let src = a.alloc_host(1 << 16, 0).unwrap();
    let dst = b.alloc_host(1 << 16, 0).unwrap();
    let t = target(&a, &b, &dst);
    let done = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = mpsc::channel();
    for i in 0..200u64 {
        let (a2, src2, t2, done2, tx2) =
            (a.clone(), src.clone(), t.clone(), done.clone(), tx.clone());
        let req = WriteRequest {
            src: &src,
            src_offset: i * 64,
            dst: &t,
            dst_offset: i * 64,
            len: 64,
            imm: Some(1),
        };
        a.submit_write(
            req,
            Notify::callback(move |r| {
                r.unwrap();
                // A callback that submits again while the queue (capacity 2) is full.
                let req = WriteRequest {
                    src: &src2,
                    src_offset: 0,
                    dst: &t2,
                    dst_offset: 0,
                    len: 64,
                    imm: Some(2),
                };
                a2.submit_write(
                    req,
                    Notify::callback(move |r| {
                        r.unwrap();
                        if done2.fetch_add(1, Ordering::SeqCst) + 1 == 200 {
                            let _ = tx2.send(());
                        }
                    }),
                )
                .unwrap();
            }),
        )
        .unwrap();
    }
    rx.recv_timeout(GUARD)
        .expect("callbacks that submit deadlocked");
    b.wait_imm(1, 200, GUARD).unwrap();
    b.wait_imm(2, 200, GUARD).unwrap();
}

#[test]
fn injected_failure_reaches_the_notification_and_the_engine_goes_on() {
    let (fabric, a, b) = pair(TestFabricConfig::default(), 1, 64);
    let src = a.alloc_host(4096, 0).unwrap();
    let dst = b.alloc_host(4096, 0).unwrap();
    let t = target(&a, &b, &dst);
    let req = || WriteRequest {
        src: &src,
        src_offset: 0,
        dst: &t,
        dst_offset: 0,
        len: 64,
        imm: None,
    };
    fabric.fail_next_writes(1);
    let err = a.write(req()).unwrap().wait_timeout(GUARD).unwrap_err();
    assert!(
        matches!(err, TransferError::Backend { code: 5, .. }),
        "{err}"
    );
    a.write(req()).unwrap().wait_timeout(GUARD).unwrap();
}

#[test]
fn dead_peer_fails_fast_and_a_new_peer_works() {
    let (fabric, a, b) = pair(TestFabricConfig::default(), 1, 64);
    let src = a.alloc_host(4096, 0).unwrap();
    let dst = b.alloc_host(4096, 0).unwrap();
    let t = target(&a, &b, &dst);
    fabric.kill(&b.address().groups[0].nics[0]).unwrap();
    let req = WriteRequest {
        src: &src,
        src_offset: 0,
        dst: &t,
        dst_offset: 0,
        len: 64,
        imm: None,
    };
    let err = a.write(req).unwrap().wait_timeout(GUARD).unwrap_err();
    assert!(
        matches!(
            err,
            TransferError::PeerUnreachable {
                cause: transfer_core::PeerLoss::Dead,
                ..
            }
        ),
        "{err}"
    );
    a.forget_peer(t.peer()).unwrap();
    // A restarted peer: a new engine on the same fabric.
    let c = TransferEngine::builder()
        .group(fabric.domains(1))
        .build()
        .unwrap();
    let dst2 = c.alloc_host(4096, 0).unwrap();
    let t2 = target(&a, &c, &dst2);
    let req = WriteRequest {
        src: &src,
        src_offset: 0,
        dst: &t2,
        dst_offset: 0,
        len: 64,
        imm: Some(3),
    };
    a.write(req).unwrap().wait_timeout(GUARD).unwrap();
    c.wait_imm(3, 1, GUARD).unwrap();
}

/// Random completion orders (many seeds) with expectations set before and
/// after the writes: every expectation fires exactly once.
#[test]
fn immediates_counted_under_random_orders() {
    for seed in 0..12u64 {
        let config = TestFabricConfig {
            seed,
            reorder: true,
            ops_per_poll: 1 + (seed as usize % 4),
            virt_addr: seed % 2 == 0,
            wait_fd: seed % 3 != 0,
            max_write_size: u64::MAX,
            ..TestFabricConfig::default()
        };
        let (_f, a, b) = pair(config, 1 + (seed as usize % 3), 64);
        let len = 1u64 << 20;
        let src = a.alloc_host(len as usize, 0).unwrap();
        let dst = b.alloc_host(len as usize, 0).unwrap();
        let t = target(&a, &b, &dst);
        let per = b
            .expected_imms(a.address(), 0, 0, WriteShape::Single { len })
            .unwrap();
        let fired = Arc::new(AtomicUsize::new(0));
        for imm in 0..4u32 {
            if imm % 2 == 0 {
                let f = fired.clone();
                b.expect_imm(imm, 3 * per, move || {
                    f.fetch_add(1, Ordering::SeqCst);
                });
            }
        }
        let mut ps = Vec::new();
        for round in 0..3 {
            for imm in 0..4u32 {
                let req = WriteRequest {
                    src: &src,
                    src_offset: 0,
                    dst: &t,
                    dst_offset: 0,
                    len,
                    imm: Some(imm),
                };
                ps.push(a.write(req).unwrap());
                let _ = round;
            }
        }
        for p in ps {
            p.wait_timeout(GUARD).unwrap();
        }
        for imm in (0..4u32).filter(|i| i % 2 == 1) {
            b.wait_imm(imm, 3 * per, GUARD).unwrap();
        }
        let deadline = std::time::Instant::now() + GUARD;
        while fired.load(Ordering::SeqCst) < 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "seed {seed}: expectation did not fire"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        for imm in 0..4 {
            assert_eq!(
                b.imm_value(imm),
                0,
                "seed {seed}: leftover arrivals for {imm}"
            );
        }
    }
}

/// With wait descriptors on every NIC an idle worker blocks on them (and
/// arrivals still wake it); without, it parks on timers.
#[test]
fn idle_workers_block_on_wait_fds_when_offered() {
    for wait_fd in [true, false] {
        let config = TestFabricConfig {
            wait_fd,
            ..TestFabricConfig::default()
        };
        let (_f, a, b) = pair(config, 2, 64);
        let src = a.alloc_host(4096, 0).unwrap();
        let dst = b.alloc_host(4096, 0).unwrap();
        let t = target(&a, &b, &dst);
        for i in 0..5 {
            // Idle long enough to pass the spin phase, then deliver.
            std::thread::sleep(Duration::from_millis(20));
            let req = WriteRequest {
                src: &src,
                src_offset: 0,
                dst: &t,
                dst_offset: 0,
                len: 8,
                imm: Some(i),
            };
            a.write(req).unwrap().wait_timeout(GUARD).unwrap();
            b.wait_imm(i, 1, GUARD).unwrap();
        }
        let (blocked, parked) = b.idle_stats()[0];
        if wait_fd {
            assert!(
                blocked > 0 && parked == 0,
                "blocked {blocked}, parked {parked}"
            );
        } else {
            assert!(
                blocked == 0 && parked > 0,
                "blocked {blocked}, parked {parked}"
            );
        }
    }
}

#[test]
fn device_memory_is_routed_to_its_device_group() {
    let fabric = TestFabric::new(TestFabricConfig::default());
    let e = TransferEngine::builder()
        .group(fabric.domains(1))
        .group_on_device(3, fabric.domains(2))
        .build()
        .unwrap();
    assert_eq!(e.group_of(transfer_core::MemoryLocation::Host).unwrap(), 0);
    assert_eq!(
        e.group_of(transfer_core::MemoryLocation::Cuda { device: 3 })
            .unwrap(),
        1
    );
    assert!(
        e.group_of(transfer_core::MemoryLocation::Cuda { device: 0 })
            .is_err()
    );
    // "Device" memory stood in for by host memory: the test domain only copies bytes.
    let mut buf = vec![0u8; 4096];
    let span = transfer_core::MemorySpan {
        ptr: buf.as_mut_ptr(),
        len: buf.len(),
        location: transfer_core::MemoryLocation::Cuda { device: 3 },
        dmabuf_fd: None,
    };
    // SAFETY: buf outlives the engine (dropped below first).
    let r = unsafe { e.register(span) }.unwrap();
    assert_eq!(r.group(), 1);
    assert_eq!(r.remote().nics.len(), 2);
    drop(e);
    drop(buf);
}

/// Unregister is refused while transfers from the region are in flight
/// (held on the fabric, so "in flight" is certain), and accepted once they
/// finished, with either progress mode.
#[test]
fn unregister_is_refused_while_transfers_are_in_flight() {
    for mode in [ProgressMode::Thread, ProgressMode::Caller] {
        let fabric = TestFabric::new(TestFabricConfig::default());
        let engine = |f: &TestFabric| {
            TransferEngine::builder()
                .progress(mode)
                .group(f.domains(1))
                .build()
                .unwrap()
        };
        let (a, b) = (engine(&fabric), engine(&fabric));
        transfer_core::testing::drive_in_background(&b);
        let src = a.alloc_host(1 << 16, 0).unwrap();
        let dst = b.alloc_host(1 << 16, 0).unwrap();
        let t = target(&a, &b, &dst);
        fabric.hold(true);
        let ps: Vec<_> = (0..4)
            .map(|_| {
                a.write(WriteRequest {
                    src: &src,
                    src_offset: 0,
                    dst: &t,
                    dst_offset: 0,
                    len: 1 << 16,
                    imm: None,
                })
                .unwrap()
            })
            .collect();
        assert!(
            matches!(
                a.unregister(&src),
                Err(TransferError::RegionBusy { in_flight: 4 })
            ),
            "{mode}"
        );
        fabric.hold(false);
        for p in ps {
            p.wait_timeout(Duration::from_secs(30)).unwrap();
        }
        a.unregister(&src).unwrap();
    }
}

/// A NIC that refuses to release a registration (transfers it cannot
/// cancel): the region stays allocated and refused for new transfers, and
/// unregister can be retried.
#[test]
fn refused_unregister_keeps_the_memory_and_can_be_retried() {
    let (fabric, a, b) = pair(TestFabricConfig::default(), 2, 64);
    let src = a.alloc_host(4096, 0).unwrap();
    let dst = b.alloc_host(4096, 0).unwrap();
    let t = target(&a, &b, &dst);
    fabric.refuse_next_unregisters(1);
    assert!(matches!(
        a.unregister(&src),
        Err(TransferError::RegionBusy { .. })
    ));
    let req = WriteRequest {
        src: &src,
        src_offset: 0,
        dst: &t,
        dst_offset: 0,
        len: 8,
        imm: None,
    };
    assert!(matches!(
        a.write(req),
        Err(TransferError::RegionUnregistered { .. })
    ));
    // The memory is still there and readable.
    assert_eq!(src.to_vec().unwrap().len(), 4096);
    a.unregister(&src).unwrap();
    assert!(a.unregister(&src).is_err());
}

/// Issue 12: a dropped [`transfer_core::ImmFuture`] (given up, or cut by
/// an executor's timeout) withdraws its expectation, so the arrivals it
/// would have consumed stay for the next expectation on that immediate.
#[test]
fn dropped_imm_future_consumes_nothing() {
    let (_f, a, b) = pair(TestFabricConfig::default(), 1, 64);
    let src = a.alloc_host(4096, 0).unwrap();
    let dst = b.alloc_host(4096, 0).unwrap();
    let t = target(&a, &b, &dst);
    drop(b.imm_future(5, 2));
    for _ in 0..2 {
        let req = WriteRequest {
            src: &src,
            src_offset: 0,
            dst: &t,
            dst_offset: 0,
            len: 8,
            imm: Some(5),
        };
        a.write(req).unwrap().wait_timeout(GUARD).unwrap();
    }
    b.wait_imm(5, 2, GUARD)
        .expect("the dropped future's expectation consumed the arrivals");
    assert_eq!(b.imm_value(5), 0);
}

/// Issue 12: a region registered with `register_raw` only promises its
/// memory until `unregister`; host access through the handle is refused
/// from then on (the memory may be freed), while a refused unregister
/// (see below) keeps it readable.
#[test]
fn raw_region_refuses_host_access_after_unregister() {
    let (_f, a, _b) = pair(TestFabricConfig::default(), 1, 64);
    let mut buf = vec![0u8; 4096];
    let span = transfer_core::MemorySpan {
        ptr: buf.as_mut_ptr(),
        len: buf.len(),
        location: transfer_core::MemoryLocation::Host,
        dmabuf_fd: None,
    };
    // SAFETY: buf outlives the region's registration (freed at the end).
    let r = unsafe { a.register_raw(span, 0) }.unwrap();
    r.write_at(0, &[1, 2, 3]).unwrap();
    let mut back = [0u8; 3];
    r.read_at(0, &mut back).unwrap();
    assert_eq!(back, [1, 2, 3]);
    a.unregister(&r).unwrap();
    assert!(matches!(
        r.write_at(0, &[9]),
        Err(TransferError::RegionUnregistered { .. })
    ));
    assert!(matches!(
        r.read_at(0, &mut back),
        Err(TransferError::RegionUnregistered { .. })
    ));
    assert!(matches!(
        r.to_vec(),
        Err(TransferError::RegionUnregistered { .. })
    ));
    assert_eq!(buf[..3], [1, 2, 3], "nothing written after unregister");
    drop(buf);
}

/// Issue 12: a peer sending ever new immediate values cannot grow the
/// receiver's memory: beyond `max_unexpected_imms` distinct unexpected
/// values, arrivals are dropped and counted; expected values still count.
#[test]
fn unexpected_immediates_are_bounded_and_counted() {
    let fabric = TestFabric::new(TestFabricConfig::default());
    let a = TransferEngine::builder()
        .group(fabric.domains(1))
        .build()
        .unwrap();
    let b = TransferEngine::builder()
        .max_unexpected_imms(3)
        .group(fabric.domains(1))
        .build()
        .unwrap();
    let src = a.alloc_host(4096, 0).unwrap();
    let dst = b.alloc_host(4096, 0).unwrap();
    let t = target(&a, &b, &dst);
    // Expected before it is sent: an unexpected 1000 would be dropped like
    // 3..8 (the cap is reached), whenever b's worker counts it before the
    // test thread could set the expectation.
    let (tx, last) = mpsc::channel();
    b.expect_imm(1000, 1, move || {
        let _ = tx.send(());
    });
    for imm in (0..8).chain([1000]) {
        let req = WriteRequest {
            src: &src,
            src_offset: 0,
            dst: &t,
            dst_offset: 0,
            len: 8,
            imm: Some(imm),
        };
        a.write(req).unwrap().wait_timeout(GUARD).unwrap();
    }
    // The expected value was counted, so every arrival before it was handled.
    last.recv_timeout(GUARD).unwrap();
    assert_eq!(b.imm_dropped(), 5);
    let held: u64 = (0..8).map(|i| b.imm_value(i)).sum();
    assert_eq!(held, 3);
}

/// Issue 12: NICs that refuse writes above `max_write_size` (as libfabric
/// does) get every write split by the engine: single writes (sharded over
/// NICs or not), pages longer than the limit and scatter items. The bytes
/// land, and the receiver's `expected_imms` matches what arrives, exactly
/// (no surplus left), in order and out of order.
#[test]
fn writes_are_split_by_max_write_size() {
    const MAX: u64 = 4096 + 17;
    for (reorder, nics) in [(true, 1), (true, 2), (false, 1), (false, 3)] {
        let config = TestFabricConfig {
            reorder,
            max_write_size: MAX,
            ..TestFabricConfig::default()
        };
        let (_f, a, b) = pair(config, nics, 64);
        let len = 1usize << 20;
        let src = a.alloc_host(len, 0).unwrap();
        let dst = b.alloc_host(len, 0).unwrap();
        let pattern: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4099) as u8).collect();
        src.write_at(0, &pattern).unwrap();
        let t = target(&a, &b, &dst);
        let case = format!("reorder {reorder}, {nics} NICs");

        // A single write (sharded over the NICs when there are several).
        let wlen = len as u64 - 5;
        let req = WriteRequest {
            src: &src,
            src_offset: 5,
            dst: &t,
            dst_offset: 0,
            len: wlen,
            imm: Some(1),
        };
        a.write(req).unwrap().wait_timeout(GUARD).expect(&case);
        let per = b
            .expected_imms(a.address(), 0, 0, WriteShape::Single { len: wlen })
            .unwrap();
        let sent = a
            .imms_delivered(&t, 0, WriteShape::Single { len: wlen })
            .unwrap();
        assert_eq!(per, sent, "{case}");
        b.wait_imm(1, per, GUARD).expect(&case);
        assert_eq!(
            dst.to_vec().unwrap()[..wlen as usize],
            pattern[5..],
            "{case}"
        );

        // Pages longer than the limit.
        let page_len = 3 * MAX - 100;
        let pages = 5usize;
        let req = transfer_core::PagedWriteRequest {
            src: &src,
            src_pages: transfer_core::Pages {
                indices: (0..pages as u32).rev().collect(),
                stride: page_len,
                offset: 0,
            },
            dst: &t,
            dst_pages: transfer_core::Pages {
                indices: (0..pages as u32).collect(),
                stride: page_len,
                offset: 0,
            },
            page_len,
            imm: Some(2),
        };
        a.paged_write(req)
            .unwrap()
            .wait_timeout(GUARD)
            .expect(&case);
        let shape = WriteShape::PagedSized { pages, page_len };
        let per = b.expected_imms(a.address(), 0, 0, shape).unwrap();
        assert_eq!(per, a.imms_delivered(&t, 0, shape).unwrap(), "{case}");
        b.wait_imm(2, per, GUARD).expect(&case);
        let got = dst.to_vec().unwrap();
        let pl = page_len as usize;
        for p in 0..pages {
            let s = (pages - 1 - p) * pl;
            assert_eq!(
                got[p * pl..(p + 1) * pl],
                pattern[s..s + pl],
                "{case}: page {p}"
            );
        }

        // Scatter items, one above the limit and one below.
        let items = vec![
            transfer_core::ScatterItem {
                dst: t.clone(),
                src_offset: 0,
                dst_offset: 0,
                len: 300_000,
            },
            transfer_core::ScatterItem {
                dst: t.clone(),
                src_offset: 0,
                dst_offset: 400_000,
                len: 100,
            },
        ];
        a.scatter(&src, items, Some(3))
            .unwrap()
            .wait_timeout(GUARD)
            .expect(&case);
        let per: u64 = [300_000u64, 100]
            .iter()
            .map(|&len| {
                b.expected_imms(a.address(), 0, 0, WriteShape::Single { len })
                    .unwrap()
            })
            .sum();
        b.wait_imm(3, per, GUARD).expect(&case);
        let got = dst.to_vec().unwrap();
        assert_eq!(got[..300_000], pattern[..300_000], "{case}");
        assert_eq!(got[400_000..400_100], pattern[..100], "{case}");

        // Nothing beyond what the receiver was told to expect arrived.
        std::thread::sleep(Duration::from_millis(50));
        for imm in 1..=3 {
            assert_eq!(b.imm_value(imm), 0, "{case}: surplus immediates {imm}");
        }
    }
}

#[test]
fn one_submit_takes_every_request_type() {
    use transfer_core::{
        BarrierRequest, PagedWriteRequest, Pages, Request, ScatterItem, ScatterRequest, SendRequest,
    };
    let (_f, a, b) = pair(TestFabricConfig::default(), 2, 64);
    let src = a.alloc_host(8192, 0).unwrap();
    let dst = b.alloc_host(8192, 0).unwrap();
    src.write_at(0, &[7; 8192]).unwrap();
    let t = target(&a, &b, &dst);
    let (tx, rx) = mpsc::channel();
    b.start_recv_pool(2, 64, move |m| {
        let _ = tx.send(m.to_vec());
    })
    .unwrap();
    let pages = |indices: Vec<u32>| Pages {
        indices,
        stride: 1024,
        offset: 0,
    };
    let peer = a.peer(b.address()).unwrap();
    let requests: Vec<Request<'_>> = vec![
        WriteRequest {
            src: &src,
            src_offset: 0,
            dst: &t,
            dst_offset: 0,
            len: 1024,
            imm: Some(1),
        }
        .into(),
        PagedWriteRequest {
            src: &src,
            src_pages: pages(vec![1, 2]),
            dst: &t,
            dst_pages: pages(vec![2, 1]),
            page_len: 1024,
            imm: Some(2),
        }
        .into(),
        ScatterRequest {
            src: &src,
            items: vec![ScatterItem {
                dst: t.clone(),
                src_offset: 3072,
                dst_offset: 3072,
                len: 1024,
            }],
            imm: Some(3),
        }
        .into(),
        BarrierRequest::to(std::slice::from_ref(&t), 4).into(),
        SendRequest {
            peer: &peer,
            data: b"hello",
        }
        .into(),
    ];
    for r in requests {
        a.transfer(r).unwrap();
    }
    assert_eq!(rx.recv_timeout(GUARD).unwrap(), b"hello");
    // Receivers count what senders delivered, whatever the entry point.
    for imm in 1..=4 {
        b.wait_imm(imm, 1, GUARD).unwrap();
    }
    assert_eq!(&dst.to_vec().unwrap()[..4096], &[7; 4096][..]);
    // A refused request reaches both the caller and the notification.
    let flag = DoneFlag::new();
    let bad = WriteRequest {
        src: &src,
        src_offset: 8000,
        dst: &t,
        dst_offset: 0,
        len: 1024,
        imm: None,
    };
    assert!(matches!(
        a.submit(bad, Notify::Flag(flag.clone())),
        Err(TransferError::InvalidArgument { .. })
    ));
    assert!(matches!(flag.result(), Some(Err(_))));
}

/// A scatter's items go to the NICs in contiguous runs, as a paged
/// write's pages do: with two NICs, the first half of 16 adjacent rows
/// leaves from one NIC and the second half from the other, so each NIC's
/// rows stay adjacent (libfabric domains merge adjacent rows into one
/// multi-segment write; round robin gave each NIC every other row). The
/// bytes land and the receiver's count is exact.
#[test]
fn scatter_items_go_to_the_nics_in_contiguous_runs() {
    const ROW: usize = 4096;
    const ROWS: usize = 16;
    let (fabric, a, b) = pair(TestFabricConfig::default(), 2, 64);
    let src = a.alloc_host(ROW * ROWS, 0).unwrap();
    let dst = b.alloc_host(ROW * ROWS, 0).unwrap();
    let pattern: Vec<u8> = (0..ROW * ROWS).map(|i| (i * 13 + i / 4093) as u8).collect();
    src.write_at(0, &pattern).unwrap();
    let t = target(&a, &b, &dst);
    let items = (0..ROWS)
        .map(|i| transfer_core::ScatterItem {
            dst: t.clone(),
            src_offset: (i * ROW) as u64,
            dst_offset: (i * ROW) as u64,
            len: ROW as u64,
        })
        .collect();
    a.scatter(&src, items, Some(9))
        .unwrap()
        .wait_timeout(GUARD)
        .unwrap();
    let per = b
        .expected_imms(a.address(), 0, 0, WriteShape::Single { len: ROW as u64 })
        .unwrap();
    b.wait_imm(9, per * ROWS as u64, GUARD).unwrap();
    assert_eq!(dst.to_vec().unwrap(), pattern);

    // NIC i of `a` writes through NIC i of `b`, whose base is the region's
    // byte 0 there.
    let nics = &a.address().groups[0].nics;
    assert_eq!(nics.len(), 2);
    let mut runs: Vec<Vec<usize>> = nics
        .iter()
        .zip(&dst.remote().nics)
        .map(|(nic, remote)| {
            fabric
                .writes_posted(nic)
                .iter()
                .map(|&(addr, len)| {
                    assert_eq!(len, ROW);
                    ((addr - remote.base) as usize) / ROW
                })
                .collect()
        })
        .collect();
    runs.sort();
    assert_eq!(
        runs,
        vec![
            (0..ROWS / 2).collect::<Vec<_>>(),
            (ROWS / 2..ROWS).collect()
        ]
    );
}
