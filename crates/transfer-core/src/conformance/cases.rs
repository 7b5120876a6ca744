//! The cases of the conformance suite.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use super::util::{block_on, pattern};
use super::{Case, Harness};
use crate::addr::{BackendKind, EngineAddress, NicAddress};
use crate::completion::{DoneFlag, Notify};
use crate::engine::TransferEngine;
use crate::error::TransferError;
use crate::memory::RemoteRegion;
use crate::peer::RemoteTarget;
use crate::region::LocalRegion;
use crate::request::{PagedWriteRequest, Pages, Slice, WriteRequest};
use crate::shard::WriteShape;

type R = std::result::Result<(), String>;

/// Failure guard for every wait; never a performance assertion.
const GUARD: Duration = Duration::from_secs(60);

fn ctx<E: std::fmt::Display>(what: &'static str) -> impl FnOnce(E) -> String {
    move |e| format!("{what}: {e}")
}

/// Every case, in the order the macro lists them.
pub static CASES: &[Case] = &[
    Case {
        name: "write_single",
        run: write_single,
    },
    Case {
        name: "write_with_imm",
        run: write_with_imm,
    },
    Case {
        name: "zero_byte_imm_write",
        run: zero_byte_imm_write,
    },
    Case {
        name: "write_sharded_multi_nic",
        run: write_sharded_multi_nic,
    },
    Case {
        name: "paged_write",
        run: paged_write,
    },
    Case {
        name: "paged_write_multi_nic",
        run: paged_write_multi_nic,
    },
    Case {
        name: "paged_layer_imm_after_pages",
        run: paged_layer_imm_after_pages,
    },
    Case {
        name: "scatter_group",
        run: scatter_group,
    },
    Case {
        name: "barrier_group",
        run: barrier_group,
    },
    Case {
        name: "send_recv_pool",
        run: send_recv_pool,
    },
    Case {
        name: "imm_expect_before_and_after",
        run: imm_expect_before_and_after,
    },
    Case {
        name: "many_threads",
        run: many_threads,
    },
    Case {
        name: "flag_and_future_notifications",
        run: flag_and_future_notifications,
    },
    Case {
        name: "refused_requests",
        run: refused_requests,
    },
    Case {
        name: "unregister_rules",
        run: unregister_rules,
    },
    Case {
        name: "malformed_wire_input",
        run: malformed_wire_input,
    },
    Case {
        name: "drop_with_transfers_in_flight",
        run: drop_with_transfers_in_flight,
    },
];

fn engines(
    h: &dyn Harness,
    n: usize,
    nics: usize,
) -> std::result::Result<Vec<TransferEngine>, String> {
    let v = h.engines(n, nics).map_err(ctx("building engines"))?;
    ensure!(
        v.len() == n,
        "harness built {} engines, {n} wanted",
        v.len()
    );
    Ok(v)
}

fn filled(
    e: &TransferEngine,
    len: usize,
    seed: u64,
) -> std::result::Result<(LocalRegion, Vec<u8>), String> {
    let r = e.alloc_host(len, 0).map_err(ctx("alloc_host"))?;
    let data = pattern(len, seed);
    r.write_at(0, &data).map_err(ctx("write_at"))?;
    Ok((r, data))
}

fn target(
    from: &TransferEngine,
    to: &TransferEngine,
    region: &LocalRegion,
) -> std::result::Result<RemoteTarget, String> {
    // Go through the wire encodings, as real peers do.
    let addr = EngineAddress::from_bytes(&to.address().to_bytes().map_err(ctx("encode address"))?)
        .map_err(ctx("decode address"))?;
    let desc = RemoteRegion::from_bytes(
        &region
            .remote()
            .to_bytes()
            .map_err(ctx("encode descriptor"))?,
    )
    .map_err(ctx("decode descriptor"))?;
    let peer = from.peer(&addr).map_err(ctx("peer"))?;
    from.remote(&peer, desc).map_err(ctx("remote"))
}

fn check_bytes(region: &LocalRegion, offset: usize, expect: &[u8], what: &str) -> R {
    let mut got = vec![0; expect.len()];
    region.read_at(offset, &mut got).map_err(ctx("read_at"))?;
    if got != expect {
        let first = got
            .iter()
            .zip(expect)
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        return Err(format!(
            "{what}: data differs at byte {first} of {}",
            expect.len()
        ));
    }
    Ok(())
}

fn single_write_case(nics: usize, len: usize, imm: Option<u32>) -> impl Fn(&dyn Harness) -> R {
    move |h| {
        let v = engines(h, 2, nics)?;
        let (a, b) = (&v[0], &v[1]);
        let (src, data) = filled(a, len + 64, 11)?;
        let dst = b.alloc_host(len + 64, 0).map_err(ctx("alloc dst"))?;
        let t = target(a, b, &dst)?;
        let req = WriteRequest {
            src: &src,
            src_offset: 7,
            dst: &t,
            dst_offset: 5,
            len: len as u64,
            imm,
        };
        a.write(req)
            .map_err(ctx("submit"))?
            .wait_timeout(GUARD)
            .map_err(ctx("write"))?;
        if let Some(imm) = imm {
            let n = b
                .expected_imms(a.address(), 0, 0, WriteShape::Single { len: len as u64 })
                .map_err(ctx("expected_imms"))?;
            let sent = a
                .imms_delivered(&t, 0, WriteShape::Single { len: len as u64 })
                .map_err(ctx("imms_delivered"))?;
            ensure!(
                sent == n,
                "sender counts {sent} immediates, receiver expects {n}"
            );
            b.wait_imm(imm, n, GUARD).map_err(ctx("wait_imm"))?;
            ensure!(
                b.imm_value(imm) == 0,
                "{} extra immediates arrived",
                b.imm_value(imm)
            );
        }
        check_bytes(&dst, 5, &data[7..7 + len], "write")?;
        check_bytes(&dst, 0, &[0; 5], "bytes before the write")?;
        check_bytes(&dst, 5 + len, &[0; 59], "bytes after the write")
    }
}

fn write_single(h: &dyn Harness) -> R {
    single_write_case(1, 1 << 20, None)(h)?;
    single_write_case(1, 1, None)(h)
}

fn write_with_imm(h: &dyn Harness) -> R {
    single_write_case(1, 65_537, Some(42))(h)
}

fn zero_byte_imm_write(h: &dyn Harness) -> R {
    single_write_case(1, 0, Some(7))(h)
}

fn write_sharded_multi_nic(h: &dyn Harness) -> R {
    if !h.multi_nic() {
        eprintln!("write_sharded_multi_nic: skipped, harness has one NIC per engine");
        return Ok(());
    }
    for nics in [2, 3, 4] {
        // An odd length: the last shard carries a remainder.
        let len = 3 * (1 << 20) + 12_345;
        single_write_case(nics, len, Some(1000 + nics as u32))(h)
            .map_err(|e| format!("{nics} NICs: {e}"))?;
    }
    Ok(())
}

fn paged_case(h: &dyn Harness, nics: usize, pages: usize) -> R {
    let v = engines(h, 2, nics)?;
    let (a, b) = (&v[0], &v[1]);
    let page_len = 4000u64;
    let src_pages = Pages {
        indices: (0..pages as u32).rev().map(|i| i * 2).collect(),
        stride: 4096,
        offset: 100,
    };
    let dst_pages = Pages {
        indices: (0..pages as u32).map(|i| i * 3 + 1).collect(),
        stride: 4096,
        offset: 0,
    };
    let src_len = 100 + 2 * pages * 4096 + 4096;
    let dst_len = (3 * pages + 2) * 4096;
    let (src, data) = filled(a, src_len, 21)?;
    let dst = b.alloc_host(dst_len, 0).map_err(ctx("alloc dst"))?;
    let t = target(a, b, &dst)?;
    let imm = 9_000 + nics as u32;
    let req = PagedWriteRequest {
        src: &src,
        src_pages: src_pages.clone(),
        dst: &t,
        dst_pages: dst_pages.clone(),
        page_len,
        imm: Some(imm),
    };
    a.paged_write(req)
        .map_err(ctx("submit"))?
        .wait_timeout(GUARD)
        .map_err(ctx("paged write"))?;
    let n = b
        .expected_imms(a.address(), 0, 0, WriteShape::Paged { pages })
        .map_err(ctx("expected_imms"))?;
    b.wait_imm(imm, n, GUARD).map_err(ctx("wait_imm"))?;
    for i in 0..pages {
        let s = (100 + u64::from(src_pages.indices[i]) * 4096) as usize;
        let d = (u64::from(dst_pages.indices[i]) * 4096) as usize;
        check_bytes(&dst, d, &data[s..s + page_len as usize], "page")?;
    }
    ensure!(
        b.imm_value(imm) == 0,
        "{} extra immediates",
        b.imm_value(imm)
    );
    Ok(())
}

fn paged_write(h: &dyn Harness) -> R {
    paged_case(h, 1, 37)
}

fn paged_write_multi_nic(h: &dyn Harness) -> R {
    if !h.multi_nic() {
        eprintln!("paged_write_multi_nic: skipped, harness has one NIC per engine");
        return Ok(());
    }
    paged_case(h, 3, 100)?;
    paged_case(h, 4, 3)
}

/// A layer's immediates never arrive before its pages: the KV-cache
/// pattern (many pages per layer, several layers in flight, scattered
/// destination pages), with the receiver checking every byte of a layer
/// the moment its counter reaches the expected count, while later layers
/// are still moving. Each round writes new bytes, so a page left from an
/// earlier round does not pass.
fn paged_layer_imm_after_pages(h: &dyn Harness) -> R {
    let mut nics = vec![1];
    if h.multi_nic() {
        nics.push(2);
    }
    for nics in nics {
        layers_case(h, nics).map_err(|e| format!("{nics} NICs: {e}"))?;
    }
    Ok(())
}

fn layers_case(h: &dyn Harness, nics: usize) -> R {
    const LAYERS: usize = 6;
    const PAGES: usize = 48;
    const PAGE: usize = 16 * 1024;
    const ROUNDS: u64 = 2;
    let v = engines(h, 2, nics)?;
    let (a, b) = (&v[0], &v[1]);
    let src = a
        .alloc_host(LAYERS * PAGES * PAGE, 0)
        .map_err(ctx("alloc src"))?;
    let dst = b
        .alloc_host(LAYERS * PAGES * PAGE, 0)
        .map_err(ctx("alloc dst"))?;
    let t = target(a, b, &dst)?;
    let n = b
        .expected_imms(
            a.address(),
            0,
            0,
            WriteShape::PagedSized {
                pages: PAGES,
                page_len: PAGE as u64,
            },
        )
        .map_err(ctx("expected_imms"))?;
    // Destination page of (layer, page): a fixed scatter over the pool.
    let slot = |l: usize, p: usize| ((l * PAGES + p) * 7919) % (LAYERS * PAGES);
    for round in 0..ROUNDS {
        let data = pattern(LAYERS * PAGES * PAGE, 1000 + round);
        src.write_at(0, &data).map_err(ctx("write_at"))?;
        let imm = |l: usize| 20_000 + (round as u32) * 100 + l as u32;
        let mut pending = Vec::with_capacity(LAYERS);
        for l in 0..LAYERS {
            let req = PagedWriteRequest {
                src: &src,
                src_pages: Pages {
                    indices: (0..PAGES).map(|p| (l * PAGES + p) as u32).collect(),
                    stride: PAGE as u64,
                    offset: 0,
                },
                dst: &t,
                dst_pages: Pages {
                    indices: (0..PAGES).map(|p| slot(l, p) as u32).collect(),
                    stride: PAGE as u64,
                    offset: 0,
                },
                page_len: PAGE as u64,
                imm: Some(imm(l)),
            };
            pending.push(a.paged_write(req).map_err(ctx("submit"))?);
        }
        for l in 0..LAYERS {
            b.wait_imm(imm(l), n, GUARD).map_err(ctx("wait_imm"))?;
            for p in 0..PAGES {
                let s = (l * PAGES + p) * PAGE;
                let what = format!("round {round} layer {l} page {p} when its immediates arrived");
                check_bytes(&dst, slot(l, p) * PAGE, &data[s..s + PAGE], &what)?;
            }
        }
        for p in pending {
            p.wait_timeout(GUARD).map_err(ctx("paged write"))?;
        }
        for l in 0..LAYERS {
            ensure!(
                b.imm_value(imm(l)) == 0,
                "layer {l}: {} extra immediates",
                b.imm_value(imm(l))
            );
        }
    }
    Ok(())
}

fn scatter_group(h: &dyn Harness) -> R {
    let v = engines(h, 5, 1)?;
    let a = &v[0];
    let slice = 70_001usize;
    let (src, data) = filled(a, 4 * slice, 31)?;
    let mut members = Vec::new();
    let mut dsts = Vec::new();
    for b in &v[1..] {
        let d = b.alloc_host(slice + 16, 0).map_err(ctx("alloc dst"))?;
        members.push(target(a, b, &d)?);
        dsts.push(d);
    }
    let group = a.add_group(members);
    let slices: Vec<Slice> = (0..4)
        .map(|i| Slice {
            src_offset: (i * slice) as u64,
            dst_offset: 16,
            len: slice as u64,
        })
        .collect();
    let (n, p) = Notify::pending();
    a.submit_group_scatter(&src, &group, &slices, Some(55), n)
        .map_err(ctx("scatter"))?;
    p.wait_timeout(GUARD).map_err(ctx("scatter"))?;
    for (i, (b, d)) in v[1..].iter().zip(&dsts).enumerate() {
        let n = b
            .expected_imms(a.address(), 0, 0, WriteShape::Single { len: slice as u64 })
            .map_err(ctx("expected"))?;
        b.wait_imm(55, n, GUARD).map_err(ctx("wait_imm"))?;
        check_bytes(d, 16, &data[i * slice..(i + 1) * slice], "scatter slice")?;
    }
    Ok(())
}

fn barrier_group(h: &dyn Harness) -> R {
    let v = engines(h, 5, 1)?;
    let a = &v[0];
    let mut members = Vec::new();
    let mut keep = Vec::new();
    for b in &v[1..] {
        let d = b.alloc_host(64, 0).map_err(ctx("alloc"))?;
        members.push(target(a, b, &d)?);
        keep.push(d);
    }
    let group = a.add_group(members.clone());
    for round in 0..3u32 {
        a.barrier(&group, 77)
            .map_err(ctx("barrier"))?
            .wait_timeout(GUARD)
            .map_err(ctx("barrier"))?;
        for b in &v[1..] {
            let n = b
                .expected_imms(a.address(), 0, 0, WriteShape::Barrier)
                .map_err(ctx("expected"))?;
            b.wait_imm(77, n, GUARD)
                .map_err(|e| format!("round {round}: {e}"))?;
        }
    }
    // The same to an ad-hoc list.
    let (n, p) = Notify::pending();
    a.submit_barrier(&members[1..3], 78, n)
        .map_err(ctx("barrier list"))?;
    p.wait_timeout(GUARD).map_err(ctx("barrier list"))?;
    for b in &v[2..4] {
        b.wait_imm(78, 1, GUARD).map_err(ctx("ad-hoc barrier"))?;
    }
    ensure!(
        v[1].imm_value(78) == 0 && v[4].imm_value(78) == 0,
        "barrier reached a non-member"
    );
    Ok(())
}

fn send_recv_pool(h: &dyn Harness) -> R {
    let v = engines(h, 2, 1)?;
    let (a, b) = (&v[0], &v[1]);
    let got = Arc::new(Mutex::new(Vec::<Vec<u8>>::new()));
    let sink = got.clone();
    b.start_recv_pool(4, 512, move |bytes| {
        if let Ok(mut g) = sink.lock() {
            g.push(bytes.to_vec());
        }
    })
    .map_err(ctx("start_recv_pool"))?;
    let peer = a.peer(b.address()).map_err(ctx("peer"))?;
    let mut sent = Vec::new();
    let mut pendings = Vec::new();
    for i in 0..24u64 {
        let mut msg = pattern(1 + (i as usize * 37) % 512, 100 + i);
        pendings.push(a.send(&peer, &msg).map_err(ctx("send"))?);
        // The message was copied: reusing the buffer at once is allowed.
        sent.push(msg.clone());
        msg.fill(0);
    }
    for p in pendings {
        p.wait_timeout(GUARD).map_err(ctx("send"))?;
    }
    let deadline = Instant::now() + GUARD;
    loop {
        let n = got.lock().map(|g| g.len()).unwrap_or(0);
        if n >= sent.len() {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "only {n} of {} messages arrived",
            sent.len()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut got = got.lock().map_err(|_| "poisoned".to_string())?.clone();
    got.sort();
    sent.sort();
    ensure!(got == sent, "received messages differ from those sent");
    Ok(())
}

fn imm_expect_before_and_after(h: &dyn Harness) -> R {
    let v = engines(h, 2, 1)?;
    let (a, b) = (&v[0], &v[1]);
    let (src, _) = filled(a, 4096, 41)?;
    let dst = b.alloc_host(4096, 0).map_err(ctx("alloc"))?;
    let t = target(a, b, &dst)?;
    let write = |imm: u32| {
        a.write(WriteRequest {
            src: &src,
            src_offset: 0,
            dst: &t,
            dst_offset: 0,
            len: 128,
            imm: Some(imm),
        })
    };
    // Before: the expectation waits for the arrivals.
    let (tx, rx) = mpsc::channel();
    b.expect_imm(5, 3, move || {
        let _ = tx.send(());
    });
    for _ in 0..3 {
        write(5)
            .map_err(ctx("write"))?
            .wait_timeout(GUARD)
            .map_err(ctx("write"))?;
    }
    rx.recv_timeout(GUARD)
        .map_err(|_| "expectation set before arrival never fired".to_string())?;
    // After: arrivals wait for the expectation.
    for _ in 0..3 {
        write(6)
            .map_err(ctx("write"))?
            .wait_timeout(GUARD)
            .map_err(ctx("write"))?;
    }
    let deadline = Instant::now() + GUARD;
    while b.imm_value(6) < 3 {
        ensure!(
            Instant::now() < deadline,
            "counter stuck at {}",
            b.imm_value(6)
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let (tx, rx) = mpsc::channel();
    b.expect_imm(6, 3, move || {
        let _ = tx.send(());
    });
    rx.recv_timeout(GUARD)
        .map_err(|_| "expectation set after arrival never fired".to_string())?;
    // Consecutive expectations on one value are served in order; surplus carries over.
    let (tx, rx) = mpsc::channel();
    let tx2 = tx.clone();
    b.expect_imm(8, 2, move || {
        let _ = tx.send(2);
    });
    for _ in 0..5 {
        write(8)
            .map_err(ctx("write"))?
            .wait_timeout(GUARD)
            .map_err(ctx("write"))?;
    }
    b.expect_imm(8, 3, move || {
        let _ = tx2.send(3);
    });
    let order: Vec<i32> = (0..2).filter_map(|_| rx.recv_timeout(GUARD).ok()).collect();
    ensure!(order == vec![2, 3], "expectations fired as {order:?}");
    ensure!(
        b.imm_value(8) == 0 && b.imm_value(6) == 0 && b.imm_value(5) == 0,
        "arrivals left over"
    );
    Ok(())
}

fn many_threads(h: &dyn Harness) -> R {
    let v = engines(h, 2, 1)?;
    let (a, b) = (&v[0], &v[1]);
    let threads = 4usize;
    let per = 50usize;
    let chunk = 1024usize;
    let (src, data) = filled(a, threads * per * chunk, 51)?;
    let dst = b
        .alloc_host(threads * per * chunk, 0)
        .map_err(ctx("alloc"))?;
    let t = target(a, b, &dst)?;
    let failures = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|th| {
                let (src, t) = (&src, &t);
                s.spawn(move || -> R {
                    let mut ps = Vec::new();
                    for i in 0..per {
                        let off = ((th * per + i) * chunk) as u64;
                        let req = WriteRequest {
                            src,
                            src_offset: off,
                            dst: t,
                            dst_offset: off,
                            len: chunk as u64,
                            imm: Some(200 + th as u32),
                        };
                        ps.push(a.write(req).map_err(ctx("submit"))?);
                    }
                    for p in ps {
                        p.wait_timeout(GUARD).map_err(ctx("write"))?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| h.join().ok().and_then(Result::err))
            .collect::<Vec<_>>()
    });
    ensure!(failures.is_empty(), "threads failed: {failures:?}");
    for th in 0..threads {
        b.wait_imm(200 + th as u32, per as u64, GUARD)
            .map_err(ctx("wait_imm"))?;
    }
    check_bytes(&dst, 0, &data, "many threads")
}

fn flag_and_future_notifications(h: &dyn Harness) -> R {
    let v = engines(h, 2, 1)?;
    let (a, b) = (&v[0], &v[1]);
    let (src, data) = filled(a, 8192, 61)?;
    let dst = b.alloc_host(8192, 0).map_err(ctx("alloc"))?;
    let t = target(a, b, &dst)?;
    let req = |off: u64, imm| WriteRequest {
        src: &src,
        src_offset: off,
        dst: &t,
        dst_offset: off,
        len: 2048,
        imm,
    };
    let flag = DoneFlag::new();
    a.submit_write(req(0, None), Notify::Flag(flag.clone()))
        .map_err(ctx("flag write"))?;
    let deadline = Instant::now() + GUARD;
    while !flag.is_done() {
        ensure!(Instant::now() < deadline, "flag never set");
        std::hint::spin_loop();
    }
    ensure!(
        flag.result() == Some(Ok(())),
        "flag result {:?}",
        flag.result()
    );
    block_on(a.write(req(2048, Some(3))).map_err(ctx("future write"))?)
        .map_err(ctx("awaited write"))?;
    block_on(b.imm_future(3, 1)).map_err(ctx("imm future"))?;
    let (tx, rx) = mpsc::channel();
    a.submit_write(
        req(4096, None),
        Notify::callback(move |r| {
            let _ = tx.send(r);
        }),
    )
    .map_err(ctx("callback write"))?;
    rx.recv_timeout(GUARD)
        .map_err(|_| "callback never ran".to_string())?
        .map_err(ctx("callback result"))?;
    check_bytes(&dst, 0, &data[..6144], "notifications")
}

fn refused_requests(h: &dyn Harness) -> R {
    let v = engines(h, 2, 1)?;
    let (a, b) = (&v[0], &v[1]);
    let (src, data) = filled(a, 4096, 71)?;
    let dst = b.alloc_host(4096, 0).map_err(ctx("alloc"))?;
    let t = target(a, b, &dst)?;
    let bad = [
        WriteRequest {
            src: &src,
            src_offset: 4000,
            dst: &t,
            dst_offset: 0,
            len: 200,
            imm: None,
        },
        WriteRequest {
            src: &src,
            src_offset: 0,
            dst: &t,
            dst_offset: 4000,
            len: 200,
            imm: None,
        },
        WriteRequest {
            src: &src,
            src_offset: u64::MAX,
            dst: &t,
            dst_offset: 0,
            len: 2,
            imm: None,
        },
    ];
    for r in bad {
        ensure!(
            matches!(a.write(r), Err(TransferError::InvalidArgument { .. })),
            "out-of-range write was not refused"
        );
    }
    let peer = a.peer(b.address()).map_err(ctx("peer"))?;
    let mut foreign = dst.remote().clone();
    foreign.backend = if foreign.backend == BackendKind::Verbs {
        BackendKind::Libfabric
    } else {
        BackendKind::Verbs
    };
    ensure!(
        matches!(
            a.remote(&peer, foreign),
            Err(TransferError::BackendMismatch { .. })
        ),
        "foreign descriptor accepted"
    );
    let mut wrong_nics = dst.remote().clone();
    wrong_nics.nics.push(wrong_nics.nics[0]);
    ensure!(
        a.remote(&peer, wrong_nics).is_err(),
        "descriptor with extra NICs accepted"
    );
    // A wrong key passes local checks; the failure comes back as a
    // completion and the engine keeps working.
    let mut wrong_key = dst.remote().clone();
    for n in &mut wrong_key.nics {
        n.key.0 ^= 0x5a5a_0000;
    }
    let wt = a.remote(&peer, wrong_key).map_err(ctx("remote"))?;
    let r = a
        .write(WriteRequest {
            src: &src,
            src_offset: 0,
            dst: &wt,
            dst_offset: 0,
            len: 64,
            imm: None,
        })
        .map_err(ctx("submit"))?
        .wait_timeout(GUARD);
    ensure!(r.is_err(), "write with a wrong key succeeded");
    // A descriptor whose length lies makes the NIC refuse the range.
    let mut long = dst.remote().clone();
    long.len *= 1024;
    let lt = a.remote(&peer, long).map_err(ctx("remote"))?;
    let r = a
        .write(WriteRequest {
            src: &src,
            src_offset: 0,
            dst: &lt,
            dst_offset: 1 << 20,
            len: 64,
            imm: None,
        })
        .map_err(ctx("submit"))?
        .wait_timeout(GUARD);
    ensure!(r.is_err(), "write outside the real region succeeded");
    a.write(WriteRequest {
        src: &src,
        src_offset: 0,
        dst: &t,
        dst_offset: 0,
        len: 4096,
        imm: None,
    })
    .map_err(ctx("submit"))?
    .wait_timeout(GUARD)
    .map_err(ctx("write after failures"))?;
    check_bytes(&dst, 0, &data, "write after failures")
}

fn unregister_rules(h: &dyn Harness) -> R {
    let v = engines(h, 2, 1)?;
    let (a, b) = (&v[0], &v[1]);
    let (src, _) = filled(a, 1 << 20, 81)?;
    let dst = b.alloc_host(1 << 20, 0).map_err(ctx("alloc"))?;
    let t = target(a, b, &dst)?;
    let mut ps = Vec::new();
    for _ in 0..16 {
        ps.push(
            a.write(WriteRequest {
                src: &src,
                src_offset: 0,
                dst: &t,
                dst_offset: 0,
                len: 1 << 20,
                imm: None,
            })
            .map_err(ctx("submit"))?,
        );
    }
    match a.unregister(&src) {
        Err(TransferError::RegionBusy { in_flight }) => {
            ensure!(in_flight > 0, "busy with zero in flight")
        }
        Ok(()) => {
            return Err(
                "unregister succeeded while 16 writes were submitted and not waited for".into(),
            );
        }
        Err(e) => return Err(format!("unexpected unregister error {e}")),
    }
    for p in ps {
        p.wait_timeout(GUARD).map_err(ctx("write"))?;
    }
    a.unregister(&src).map_err(ctx("unregister when idle"))?;
    ensure!(
        matches!(
            a.write(WriteRequest {
                src: &src,
                src_offset: 0,
                dst: &t,
                dst_offset: 0,
                len: 8,
                imm: None
            }),
            Err(TransferError::RegionUnregistered { .. })
        ),
        "write from an unregistered region was not refused"
    );
    ensure!(a.unregister(&src).is_err(), "double unregister accepted");
    Ok(())
}

fn malformed_wire_input(h: &dyn Harness) -> R {
    let v = engines(h, 2, 1)?;
    let (a, b) = (&v[0], &v[1]);
    let bytes = b.address().to_bytes().map_err(ctx("encode"))?;
    ensure!(
        EngineAddress::from_bytes(&bytes).map_err(ctx("decode"))? == *b.address(),
        "address round trip differs"
    );
    for cut in 0..bytes.len() {
        // Truncations must be errors or (rarely) other valid values, never a crash.
        let _ = EngineAddress::from_bytes(&bytes[..cut]);
    }
    let mut x = 0x1234_5678u64;
    for _ in 0..2000 {
        let mut m = bytes.clone();
        for _ in 0..3 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let i = (x as usize) % m.len().max(1);
            m[i] ^= (x >> 32) as u8 | 1;
        }
        if let Ok(addr) = EngineAddress::from_bytes(&m) {
            // A corrupted but decodable address must fail cleanly on use.
            if let Ok(p) = a.peer(&addr) {
                let _ = a.forget_peer(&p);
            }
        }
    }
    ensure!(
        EngineAddress::from_bytes(&[0xff; 70_000]).is_err(),
        "oversized address accepted"
    );
    let dst = b.alloc_host(4096, 0).map_err(ctx("alloc"))?;
    let d = dst.remote().to_bytes().map_err(ctx("encode desc"))?;
    for cut in 0..d.len() {
        let _ = RemoteRegion::from_bytes(&d[..cut]);
    }
    ensure!(
        RemoteRegion::from_bytes(&[]).is_err(),
        "empty descriptor accepted"
    );
    // A well-formed address whose NIC bytes are garbage: the write fails, the engine lives.
    let mut garbage = b.address().clone();
    for g in &mut garbage.groups {
        for n in &mut g.nics {
            *n = NicAddress(vec![0xAB; 3]);
        }
    }
    let peer = a.peer(&garbage).map_err(ctx("peer"))?;
    let t = a
        .remote(&peer, dst.remote().clone())
        .map_err(ctx("remote"))?;
    let (src, _) = filled(a, 4096, 91)?;
    let r = a
        .write(WriteRequest {
            src: &src,
            src_offset: 0,
            dst: &t,
            dst_offset: 0,
            len: 16,
            imm: None,
        })
        .map_err(ctx("submit"))?
        .wait_timeout(GUARD);
    ensure!(r.is_err(), "write to a garbage NIC address succeeded");
    let good = target(a, b, &dst)?;
    a.write(WriteRequest {
        src: &src,
        src_offset: 0,
        dst: &good,
        dst_offset: 0,
        len: 16,
        imm: None,
    })
    .map_err(ctx("submit"))?
    .wait_timeout(GUARD)
    .map_err(ctx("write after garbage"))
}

fn drop_with_transfers_in_flight(h: &dyn Harness) -> R {
    let mut v = engines(h, 2, 1)?;
    let b = v.pop().ok_or("no engine")?;
    let a = v.pop().ok_or("no engine")?;
    let (src, _) = filled(&a, 1 << 20, 101)?;
    let dst = b.alloc_host(1 << 20, 0).map_err(ctx("alloc"))?;
    let t = target(&a, &b, &dst)?;
    let done = Arc::new(AtomicUsize::new(0));
    let bad = Arc::new(Mutex::new(Vec::new()));
    let n = 200;
    for i in 0..n {
        let (done, bad) = (done.clone(), bad.clone());
        let off = (i % 16) * 65_536;
        let req = WriteRequest {
            src: &src,
            src_offset: off,
            dst: &t,
            dst_offset: off,
            len: 65_536,
            imm: None,
        };
        a.submit_write(
            req,
            Notify::callback(move |r| {
                match r {
                    Ok(()) | Err(TransferError::Shutdown { .. }) => {}
                    Err(e) => {
                        if let Ok(mut b) = bad.lock() {
                            b.push(e.to_string());
                        }
                    }
                }
                done.fetch_add(1, Ordering::SeqCst);
            }),
        )
        .map_err(ctx("submit"))?;
    }
    drop(a);
    let got = done.load(Ordering::SeqCst);
    ensure!(
        got == n as usize,
        "after drop only {got} of {n} notifications ran"
    );
    let bad = bad.lock().map_err(|_| "poisoned")?.clone();
    ensure!(bad.is_empty(), "unexpected errors: {bad:?}");
    drop(b);
    Ok(())
}
