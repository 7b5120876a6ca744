//! Engine integration on transfer-core's in-memory test domain (no GPU):
//! flags set by immediate counters, Cuda-located registrations, and the
//! layer-by-layer KV-cache pattern with CPU threads standing in for kernels.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use transfer_core::testing::{TestFabric, TestFabricConfig};
use transfer_core::{MemoryLocation, Pages, TransferEngine, WriteRequest, WriteShape};
use transfer_cuda::{
    DmaBuf, FlagBackend, GpuFlag, LayerPages, LayerSender, PlainHostMemory, Watcher, WatcherConfig,
    register_cuda_span, set_flag_on_imm,
};

const GUARD: Duration = Duration::from_secs(60);

fn pair(nics: usize, reorder: bool) -> (TestFabric, Arc<TransferEngine>, Arc<TransferEngine>) {
    let fabric = TestFabric::new(TestFabricConfig {
        reorder,
        ..TestFabricConfig::default()
    });
    let build = || {
        Arc::new(
            TransferEngine::builder()
                .group(fabric.domains(nics))
                .build()
                .unwrap(),
        )
    };
    let (a, b) = (build(), build());
    (fabric, a, b)
}

fn wait_until(mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + GUARD;
    while !f() {
        assert!(
            std::time::Instant::now() < deadline,
            "condition not reached"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn an_immediate_counter_sets_a_host_mapped_flag() {
    let (_f, a, b) = pair(2, true);
    let flag = Arc::new(GpuFlag::host_mapped(&PlainHostMemory).unwrap());
    assert_eq!(flag.backend(), FlagBackend::HostMapped);
    assert_eq!(flag.fallback_reason(), None);
    let src = a.alloc_host(64 * 1024, 0).unwrap();
    let dst = b.alloc_host(64 * 1024, 0).unwrap();
    let peer = a.peer(b.address()).unwrap();
    let t = a.remote(&peer, dst.remote().clone()).unwrap();
    let writes = 3u64;
    let shape = WriteShape::Single { len: 64 * 1024 };
    let per_write = b.expected_imms(a.address(), 0, 0, shape).unwrap();
    let arm = set_flag_on_imm(&b, 77, writes * per_write, flag.clone(), 0xfeed);
    for _ in 0..writes {
        assert_eq!(flag.get().unwrap(), 0, "not before every write arrived");
        a.write(WriteRequest {
            src: &src,
            src_offset: 0,
            dst: &t,
            dst_offset: 0,
            len: 64 * 1024,
            imm: Some(77),
        })
        .unwrap()
        .wait_timeout(GUARD)
        .unwrap();
    }
    wait_until(|| arm.is_fired());
    assert_eq!(flag.get().unwrap(), 0xfeed);
    assert!(arm.error().is_none());
}

#[test]
fn cuda_spans_register_with_their_device_and_dmabuf() {
    let (_f, a, _b) = pair(2, false);
    // Host memory stands in for device memory: the test domain never
    // touches bytes at registration; a memfd stands in for the dma-buf.
    let backing = transfer_core::HostBuffer::new(1 << 20).unwrap();
    let addr = backing.as_ptr() as u64;
    let memfd = {
        // SAFETY: memfd_create with a static NUL-terminated name.
        let fd = unsafe { libc::memfd_create(c"transfer-cuda-test".as_ptr(), 0) };
        assert!(fd >= 0);
        // SAFETY: fresh descriptor owned by nobody else.
        unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) }
    };
    let dmabuf = DmaBuf::from_fd(memfd, addr, 1 << 20);
    // SAFETY: `backing` outlives the engine's use (unregistered below).
    let r = unsafe { register_cuda_span(&a, addr, 1 << 20, 3, Some(&dmabuf), 0) }.unwrap();
    assert_eq!(r.location(), MemoryLocation::Cuda { device: 3 });
    assert_eq!(r.len(), 1 << 20);
    assert_eq!(r.remote().nics.len(), 2);
    assert!(
        r.write_at(0, &[1]).is_err(),
        "device memory is not host-accessible"
    );
    a.unregister(&r).unwrap();
    // A dma-buf for another range is refused before reaching the backend.
    // SAFETY: refused before registration.
    let bad = unsafe { register_cuda_span(&a, addr + 4096, 4096, 3, Some(&dmabuf), 0) };
    assert!(bad.is_err());
    // Without a dma-buf: the plain path.
    // SAFETY: as above.
    let plain = unsafe { register_cuda_span(&a, addr, 4096, 0, None, 0) }.unwrap();
    assert_eq!(plain.location(), MemoryLocation::Cuda { device: 0 });
    a.unregister(&plain).unwrap();
}

/// The KV-cache pattern with CPU "kernels": layers are written in random
/// order, each bumps its slot, the watcher submits that layer's pages, and
/// the receiver's counter completes only when every layer has arrived.
fn kv_pattern(nics: usize, reorder: bool, layers: usize, pages_per_layer: u32) {
    const PAGE: usize = 4096;
    const IMM: u32 = 0x4b56;
    let (_f, a, b) = pair(nics, reorder);
    let total_pages = layers * pages_per_layer as usize;
    let src = a.alloc_host(total_pages * PAGE, 0).unwrap();
    // The receiver's cache is laid out the other way round (reverse page order).
    let dst = b.alloc_host(total_pages * PAGE, 0).unwrap();
    let peer = a.peer(b.address()).unwrap();
    let t = a.remote(&peer, dst.remote().clone()).unwrap();
    let plan: Vec<LayerPages> = (0..layers)
        .map(|l| {
            let first = l as u32 * pages_per_layer;
            let src_idx: Vec<u32> = (first..first + pages_per_layer).collect();
            let dst_idx: Vec<u32> = src_idx
                .iter()
                .map(|&p| total_pages as u32 - 1 - p)
                .collect();
            LayerPages {
                src_pages: Pages {
                    indices: src_idx,
                    stride: PAGE as u64,
                    offset: 0,
                },
                dst_pages: Pages {
                    indices: dst_idx,
                    stride: PAGE as u64,
                    offset: 0,
                },
                page_len: PAGE as u64,
            }
        })
        .collect();
    let per_layer = b
        .expected_imms(
            a.address(),
            0,
            0,
            WriteShape::Paged {
                pages: pages_per_layer as usize,
            },
        )
        .unwrap();
    let watcher = Watcher::new(PlainHostMemory, WatcherConfig::default()).unwrap();
    let sender = LayerSender::start(&watcher, a.clone(), src.clone(), t, plan, IMM).unwrap();
    let arrived = b.imm_future(IMM, per_layer * layers as u64);
    let mut order: Vec<usize> = (0..layers).collect();
    use rand::seq::SliceRandom;
    order.shuffle(&mut rand::thread_rng());
    for &l in &order {
        assert_eq!(
            b.imm_value(IMM),
            0,
            "expectation consumes; nothing leaks early"
        );
        let first = l * pages_per_layer as usize;
        for p in first..first + pages_per_layer as usize {
            src.write_at(p * PAGE, &vec![(p % 251) as u8 + 1; PAGE])
                .unwrap();
        }
        let slot = sender.slot(l).unwrap();
        // SAFETY: the slot belongs to the live watcher.
        unsafe { (*slot.host).fetch_add(1, std::sync::atomic::Ordering::Release) };
    }
    poll_ready(arrived).expect("every layer arrives").unwrap();
    wait_until(|| sender.completed() == layers as u64);
    assert_eq!(sender.submitted(), layers as u64);
    assert!(sender.errors().is_empty());
    let got = dst.to_vec().unwrap();
    for p in 0..total_pages {
        let d = total_pages - 1 - p;
        assert!(
            got[d * PAGE..(d + 1) * PAGE]
                .iter()
                .all(|&x| x == (p % 251) as u8 + 1),
            "page {p} landed at {d}"
        );
    }
}

/// Drives a future on this thread (no executor needed); `None` after [`GUARD`].
fn poll_ready<F: std::future::Future>(f: F) -> Option<F::Output> {
    use std::task::{Context, Poll, Wake, Waker};
    struct ThreadWaker(std::thread::Thread);
    impl Wake for ThreadWaker {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    let deadline = std::time::Instant::now() + GUARD;
    while std::time::Instant::now() < deadline {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return Some(v);
        }
        std::thread::park_timeout(Duration::from_millis(10));
    }
    None
}

#[test]
fn kv_cache_layers_one_nic_in_order() {
    kv_pattern(1, false, 8, 4);
}

#[test]
fn kv_cache_layers_four_nics_unordered() {
    kv_pattern(4, true, 32, 7);
}
