//! The GPU checks, shared by `tests/gpu.rs` (real GPU; skipped without
//! one) and `tests/fake_driver.rs` (a dry run against a fake libcuda).
//! Latencies are printed, never asserted.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use transfer_core::testing::{TestFabric, TestFabricConfig};
use transfer_core::{IdlePolicy, MemoryLocation, Pages, TransferEngine, WriteRequest, WriteShape};
use transfer_cuda::dmabuf::dmabuf_unsupported_reason;
use transfer_cuda::driver::attr;
use transfer_cuda::{
    CudaContext, DeviceBuffer, DeviceKernels, FlagBackend, GpuFlag, LayerPages, LayerSender,
    MappedBlock, MemoryProvider, PinnedHostMemory, RegistrationPath, SignalMethod, SlotSignal,
    Stream, WatchControl, Watcher, WatcherConfig, driver, export_dmabuf, register_device_memory,
    set_flag_on_imm,
};

/// Guard against hangs (a kernel that never runs); not a performance bound.
const GUARD: Duration = Duration::from_secs(60);
/// Kernels waiting on the CPU give up after this long.
const KERNEL_TIMEOUT_NS: u64 = 20_000_000_000;

/// Spins (for latency) for 100 µs, then yields (oversubscribed CPUs).
fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        let waited = start.elapsed();
        assert!(waited < GUARD, "timed out waiting for {what}");
        if waited < Duration::from_micros(100) {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

fn word(block: &dyn MappedBlock) -> &AtomicU64 {
    // SAFETY: blocks from providers are at least 8 bytes, page aligned, and
    // outlive every use in these tests.
    unsafe { &*block.host_ptr().as_ptr().cast::<AtomicU64>() }
}

fn summary(name: &str, mut v: Vec<Duration>) -> Duration {
    v.sort();
    let n = v.len();
    let median = v[n / 2];
    let p99 = v[(n * 99 / 100).min(n - 1)];
    println!(
        "{name}: n={n} min={:?} median={median:?} p99={p99:?} max={:?}",
        v[0],
        v[n - 1]
    );
    median
}

fn busy() -> WatcherConfig {
    WatcherConfig {
        idle: IdlePolicy::busy_poll(),
        ..WatcherConfig::default()
    }
}

/// Events per latency measurement: `TRANSFER_CUDA_LATENCY_EVENTS`, default 2000.
fn latency_events() -> usize {
    std::env::var("TRANSFER_CUDA_LATENCY_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
        .max(1)
}

/// Events discarded before measuring (JIT, first touches, wake-ups).
fn warmup() -> usize {
    (latency_events() / 10).min(100)
}

/// The `device_report` GPU check.
pub fn device_report(ctx: &Arc<CudaContext>) {
    let d = driver().unwrap();
    println!(
        "device 0: {} | driver CUDA {} ({}) | sm_{}{}",
        ctx.name().unwrap(),
        d.version(),
        d.library(),
        ctx.attribute(attr::COMPUTE_CAPABILITY_MAJOR).unwrap(),
        ctx.attribute(attr::COMPUTE_CAPABILITY_MINOR).unwrap()
    );
    for (name, a) in [
        ("can map host memory", attr::CAN_MAP_HOST_MEMORY),
        ("unified addressing", attr::UNIFIED_ADDRESSING),
        ("host-native atomics", attr::HOST_NATIVE_ATOMIC_SUPPORTED),
        ("64-bit stream mem ops", attr::CAN_USE_64_BIT_STREAM_MEM_OPS),
        ("GPUDirect RDMA", attr::GPU_DIRECT_RDMA_SUPPORTED),
        ("dma-buf", attr::DMA_BUF_SUPPORTED),
    ] {
        println!("  {name}: {:?}", ctx.attribute(a));
    }
    println!(
        "  cuMemGetHandleForAddressRange: {}, cuStreamWriteValue64: {}",
        d.has_dmabuf_export(),
        d.has_stream_write_value()
    );
    match transfer_cuda::gdr::gdr() {
        Ok(_) => println!("  GDRCopy: available"),
        Err(e) => println!("  GDRCopy: {e}"),
    }
    assert_eq!(ctx.attribute(attr::CAN_MAP_HOST_MEMORY).unwrap(), 1);
}

/// Launch of the bump kernel to the watcher callback, over many events.
fn launch_to_callback(ctx: &Arc<CudaContext>, name: &str, config: WatcherConfig) {
    let watcher = Watcher::pinned(ctx.clone(), config).unwrap();
    let base = Instant::now();
    let seen = Arc::new(AtomicU64::new(0));
    let at = Arc::new(AtomicU64::new(0));
    let (s2, a2) = (seen.clone(), at.clone());
    let slot = watcher
        .watch(move |ev| {
            a2.store(base.elapsed().as_nanos() as u64, Ordering::Release);
            s2.store(ev.new, Ordering::Release);
            WatchControl::Keep
        })
        .unwrap();
    let signal = SlotSignal::new(ctx, SignalMethod::Kernel).unwrap();
    let stream = Stream::new(ctx).unwrap();
    let mut lat = Vec::with_capacity(latency_events());
    for i in 1..=(warmup() + latency_events()) as u64 {
        let t0 = base.elapsed().as_nanos() as u64;
        // SAFETY: the slot belongs to the live watcher's pinned pages.
        unsafe { signal.add(&stream, slot.device, 1) }.unwrap();
        wait_until("the watcher callback", || seen.load(Ordering::Acquire) >= i);
        assert_eq!(
            seen.load(Ordering::Acquire),
            i,
            "exactly one bump per launch"
        );
        if i > warmup() as u64 {
            lat.push(Duration::from_nanos(
                at.load(Ordering::Acquire).saturating_sub(t0),
            ));
        }
    }
    stream.synchronize().unwrap();
    summary(name, lat);
}

/// The `watcher_latency_from_kernel_launch` GPU check.
pub fn watcher_latency_from_kernel_launch(ctx: &Arc<CudaContext>) {
    launch_to_callback(ctx, "launch->callback, busy-poll watcher", busy());
    launch_to_callback(
        ctx,
        "launch->callback, spin-then-park watcher (default policy)",
        WatcherConfig::default(),
    );
}

/// A resident kernel answers the CPU's "go" with a slot write: the round
/// trip through the watcher, and the same round trip with the CPU spinning
/// on the slot itself, give the watcher's one-way latency (kernel write to
/// callback) without a kernel launch in the way.
/// The `watcher_latency_from_kernel_write` GPU check.
pub fn watcher_latency_from_kernel_write(ctx: &Arc<CudaContext>) {
    let kernels = DeviceKernels::load(ctx).unwrap();
    let stream = Stream::new(ctx).unwrap();
    let pinned = PinnedHostMemory::new(ctx.clone());
    let rounds = (warmup() + latency_events()) as u64;

    // Raw: the CPU spins on the slot word directly.
    let go = pinned.alloc_zeroed(4096).unwrap();
    let slot = pinned.alloc_zeroed(4096).unwrap();
    // SAFETY: both words are pinned, mapped and outlive the kernel (synchronised below).
    unsafe {
        kernels.pingpong(
            &stream,
            go.device_addr(),
            slot.device_addr(),
            rounds,
            KERNEL_TIMEOUT_NS,
        )
    }
    .unwrap();
    let mut raw = Vec::new();
    for i in 1..=rounds {
        let t0 = Instant::now();
        word(go.as_ref()).store(i, Ordering::Release);
        wait_until("the kernel's answer", || {
            word(slot.as_ref()).load(Ordering::Acquire) >= i
        });
        let dt = t0.elapsed();
        assert_eq!(
            word(slot.as_ref()).load(Ordering::Acquire),
            i,
            "kernel timed out"
        );
        if i > warmup() as u64 {
            raw.push(dt);
        }
    }
    stream.synchronize().unwrap();

    // Through the watcher.
    let watcher = Watcher::pinned(ctx.clone(), busy()).unwrap();
    let base = Instant::now();
    let seen = Arc::new(AtomicU64::new(0));
    let at = Arc::new(AtomicU64::new(0));
    let (s2, a2) = (seen.clone(), at.clone());
    let wslot = watcher
        .watch(move |ev| {
            a2.store(base.elapsed().as_nanos() as u64, Ordering::Release);
            s2.store(ev.new, Ordering::Release);
            WatchControl::Keep
        })
        .unwrap();
    let go2 = pinned.alloc_zeroed(4096).unwrap();
    // SAFETY: as above; the watcher slot lives as long as `watcher`.
    unsafe {
        kernels.pingpong(
            &stream,
            go2.device_addr(),
            wslot.device,
            rounds,
            KERNEL_TIMEOUT_NS,
        )
    }
    .unwrap();
    let mut watched = Vec::new();
    for i in 1..=rounds {
        let t0 = base.elapsed().as_nanos() as u64;
        word(go2.as_ref()).store(i, Ordering::Release);
        wait_until("the watcher callback", || seen.load(Ordering::Acquire) >= i);
        assert_eq!(seen.load(Ordering::Acquire), i, "kernel timed out");
        if i > warmup() as u64 {
            watched.push(Duration::from_nanos(
                at.load(Ordering::Acquire).saturating_sub(t0),
            ));
        }
    }
    stream.synchronize().unwrap();
    let raw_median = summary("round trip CPU->kernel->CPU spin (raw)", raw);
    let w_median = summary("round trip CPU->kernel->watcher callback", watched);
    let one_way = w_median.saturating_sub(raw_median / 2);
    println!(
        "estimated watcher latency, kernel write -> callback (median): {one_way:?} \
         (watcher round trip minus half the raw round trip; goal < 5 µs)"
    );
}

/// 8 streams, each running a kernel that bumps its own 512 slots 200 times:
/// every slot's events chain from 0 to 200 and each callback stops itself.
fn concurrent_kernels(ctx: &Arc<CudaContext>, config: WatcherConfig) {
    const STREAMS: usize = 8;
    const PER: usize = 512;
    const ROUNDS: u64 = 200;
    let watcher = Watcher::pinned(ctx.clone(), config).unwrap();
    let kernels = DeviceKernels::load(ctx).unwrap();
    type Log = Arc<Mutex<Vec<(u64, u64)>>>;
    let logs: Vec<Log> = (0..STREAMS * PER).map(|_| Arc::default()).collect();
    let done = Arc::new(AtomicU64::new(0));
    let mut slots = Vec::new();
    for log in &logs {
        let (log, done) = (log.clone(), done.clone());
        slots.push(
            watcher
                .watch(move |ev| {
                    log.lock().unwrap().push((ev.old, ev.new));
                    if ev.new == ROUNDS {
                        done.fetch_add(1, Ordering::AcqRel);
                        WatchControl::Stop
                    } else {
                        WatchControl::Keep
                    }
                })
                .unwrap(),
        );
    }
    assert_eq!(watcher.pages(), STREAMS * PER / 512);
    let streams: Vec<Stream> = (0..STREAMS).map(|_| Stream::new(ctx).unwrap()).collect();
    for (k, s) in streams.iter().enumerate() {
        let mine = &slots[k * PER..(k + 1) * PER];
        for w in mine.windows(2) {
            assert_eq!(
                w[1].device,
                w[0].device + 8,
                "a page's slots are contiguous"
            );
        }
        // SAFETY: PER contiguous slots of a live watcher page.
        unsafe { kernels.bump_each(s, mine[0].device, PER as u32, ROUNDS as u32) }.unwrap();
    }
    for s in &streams {
        s.synchronize().unwrap();
    }
    wait_until("every slot's final value", || {
        done.load(Ordering::Acquire) == (STREAMS * PER) as u64
    });
    let mut events = 0;
    for (i, log) in logs.iter().enumerate() {
        let log = log.lock().unwrap();
        events += log.len();
        assert_eq!(log[0].0, 0, "slot {i}: first event starts at 0");
        for w in log.windows(2) {
            assert_eq!(w[1].0, w[0].1, "slot {i}: events chain");
            assert!(w[1].1 > w[0].1, "slot {i}: counters only grow");
        }
        assert_eq!(log.last().unwrap().1, ROUNDS, "slot {i}: final value");
    }
    println!(
        "{} slots x {ROUNDS} bumps from {STREAMS} concurrent kernels: {events} events \
         (bumps coalesce between scans), all slots correct; watcher stats {:?}",
        STREAMS * PER,
        watcher.stats()
    );
    wait_until("stopped slots freed", || watcher.watched() == 0);
}

/// The `every_slot_under_concurrent_kernels` GPU check.
pub fn every_slot_under_concurrent_kernels(ctx: &Arc<CudaContext>) {
    concurrent_kernels(ctx, busy());
    concurrent_kernels(ctx, WatcherConfig::default());
}

/// The `stream_write_value_signals_a_slot` GPU check.
pub fn stream_write_value_signals_a_slot(ctx: &Arc<CudaContext>) {
    let signal = match SlotSignal::new(ctx, SignalMethod::StreamWriteValue) {
        Ok(s) => s,
        Err(e) => {
            println!("skipped: cuStreamWriteValue64: {e}");
            return;
        }
    };
    let watcher = Watcher::pinned(ctx.clone(), busy()).unwrap();
    let seen = Arc::new(AtomicU64::new(0));
    let s2 = seen.clone();
    let slot = watcher
        .watch(move |ev| {
            s2.store(ev.new, Ordering::Release);
            WatchControl::Keep
        })
        .unwrap();
    let stream = Stream::new(ctx).unwrap();
    for v in [5u64, 6, 1 << 40] {
        // SAFETY: the slot belongs to the live watcher's pinned pages.
        unsafe { signal.set(&stream, slot.device, v) }.unwrap();
        wait_until("the stream write", || seen.load(Ordering::Acquire) == v);
    }
    // SAFETY: refused before anything is queued (no kernel for this method).
    let add = unsafe { signal.add(&stream, slot.device, 1) };
    assert!(add.is_err(), "add needs the kernel");
    println!("cuStreamWriteValue64 reaches the watcher");
}

/// A kernel polls the flag; the CPU sets it; the kernel reports into pinned memory.
fn flag_round(ctx: &Arc<CudaContext>, flag: &GpuFlag, value: u64) -> Duration {
    let kernels = DeviceKernels::load(ctx).unwrap();
    let stream = Stream::new(ctx).unwrap();
    let out = PinnedHostMemory::new(ctx.clone())
        .alloc_zeroed(4096)
        .unwrap();
    // SAFETY: flag and out outlive the kernel (synchronised below).
    unsafe {
        kernels.flag_wait(
            &stream,
            flag.device_addr(),
            value,
            out.device_addr(),
            KERNEL_TIMEOUT_NS,
        )
    }
    .unwrap();
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(
        word(out.as_ref()).load(Ordering::Acquire),
        0,
        "kernel waits for the flag"
    );
    let t0 = Instant::now();
    flag.set(value).unwrap();
    wait_until("the kernel to see the flag", || {
        word(out.as_ref()).load(Ordering::Acquire) != 0
    });
    let dt = t0.elapsed();
    assert_eq!(
        word(out.as_ref()).load(Ordering::Acquire),
        1,
        "kernel saw the flag"
    );
    stream.synchronize().unwrap();
    assert_eq!(flag.get().unwrap(), value);
    dt
}

/// The `flags_are_seen_by_a_polling_kernel` GPU check.
pub fn flags_are_seen_by_a_polling_kernel(ctx: &Arc<CudaContext>) {
    let flag = GpuFlag::new(ctx).unwrap();
    match flag.backend() {
        FlagBackend::GdrCopy => println!("GpuFlag::new uses GDRCopy"),
        FlagBackend::HostMapped => println!(
            "GpuFlag::new fell back to host-mapped memory: {}",
            flag.fallback_reason().unwrap_or("?")
        ),
    }
    let dt = flag_round(ctx, &flag, 0xabcdef);
    println!(
        "{}: CPU set -> kernel saw -> CPU saw: {dt:?}",
        flag.backend()
    );
    let mapped = GpuFlag::host_mapped(&PinnedHostMemory::new(ctx.clone())).unwrap();
    let dt = flag_round(ctx, &mapped, 42);
    println!(
        "{}: CPU set -> kernel saw -> CPU saw: {dt:?}",
        mapped.backend()
    );
    match GpuFlag::gdrcopy(ctx) {
        Ok(g) => {
            let dt = flag_round(ctx, &g, 7);
            println!("GDRCopy flag: CPU set -> kernel saw -> CPU saw: {dt:?}");
        }
        Err(e) => println!("skipped: GDRCopy flag: {e}"),
    }
}

/// The `an_immediate_counter_sets_a_gpu_flag` GPU check.
pub fn an_immediate_counter_sets_a_gpu_flag(ctx: &Arc<CudaContext>) {
    let fabric = TestFabric::new(TestFabricConfig::default());
    let a = TransferEngine::builder()
        .group(fabric.domains(2))
        .build()
        .unwrap();
    let b = TransferEngine::builder()
        .group(fabric.domains(2))
        .build()
        .unwrap();
    let flag = Arc::new(GpuFlag::new(ctx).unwrap());
    let kernels = DeviceKernels::load(ctx).unwrap();
    let stream = Stream::new(ctx).unwrap();
    let out = PinnedHostMemory::new(ctx.clone())
        .alloc_zeroed(4096)
        .unwrap();
    // SAFETY: flag and out outlive the kernel (synchronised below).
    unsafe {
        kernels.flag_wait(
            &stream,
            flag.device_addr(),
            1,
            out.device_addr(),
            KERNEL_TIMEOUT_NS,
        )
    }
    .unwrap();
    let src = a.alloc_host(1 << 20, 0).unwrap();
    let dst = b.alloc_host(1 << 20, 0).unwrap();
    let peer = a.peer(b.address()).unwrap();
    let t = a.remote(&peer, dst.remote().clone()).unwrap();
    let per = b
        .expected_imms(a.address(), 0, 0, WriteShape::Single { len: 1 << 20 })
        .unwrap();
    let arm = set_flag_on_imm(&b, 9, 4 * per, flag.clone(), 1);
    for _ in 0..4 {
        a.write(WriteRequest {
            src: &src,
            src_offset: 0,
            dst: &t,
            dst_offset: 0,
            len: 1 << 20,
            imm: Some(9),
        })
        .unwrap()
        .wait_timeout(GUARD)
        .unwrap();
    }
    wait_until("the kernel to see the flag", || {
        word(out.as_ref()).load(Ordering::Acquire) != 0
    });
    assert_eq!(word(out.as_ref()).load(Ordering::Acquire), 1);
    assert!(arm.is_fired() && arm.error().is_none());
    stream.synchronize().unwrap();
    println!("immediate counter -> {} flag -> kernel: ok", flag.backend());
}

/// The `dmabuf_export_and_registration` GPU check.
pub fn dmabuf_export_and_registration(ctx: &Arc<CudaContext>) {
    let fabric = TestFabric::new(TestFabricConfig::default());
    let engine = TransferEngine::builder()
        .group(fabric.domains(2))
        .build()
        .unwrap();
    let len = 4 << 20;
    let buf = DeviceBuffer::zeroed(ctx, len).unwrap();
    match dmabuf_unsupported_reason(ctx) {
        Some(reason) => println!("skipped: dma-buf export: {reason}"),
        None => {
            let d = export_dmabuf(ctx, buf.device_addr(), len).unwrap();
            // SAFETY: fstat on a descriptor we own.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: `st` is a valid out-buffer.
            assert_eq!(unsafe { libc::fstat(d.raw_fd(), &mut st) }, 0);
            println!("dma-buf export: fd {} for {len} bytes", d.raw_fd());
            assert!(
                export_dmabuf(ctx, buf.device_addr() + 1, 4096).is_err(),
                "unaligned"
            );
        }
    }
    // SAFETY: `buf` outlives the registration (unregistered below).
    let r = unsafe { register_device_memory(&engine, ctx, buf.device_addr(), len, 0) }.unwrap();
    assert_eq!(r.region.location(), MemoryLocation::Cuda { device: 0 });
    match &r.path {
        RegistrationPath::DmaBuf => assert!(r.dmabuf.is_some()),
        RegistrationPath::Plain { reason } => println!("plain registration: {reason}"),
    }
    println!("registered {len} bytes of device memory via {:?}", r.path);
    engine.unregister(&r.region).unwrap();
}

/// The KV-cache pattern with real kernels: each layer is written by a fill
/// kernel, then its slot is bumped from the same stream; the watcher
/// submits the layer's pages; the receiver counts them all.
/// The `kv_cache_layers_from_kernels` GPU check.
pub fn kv_cache_layers_from_kernels(ctx: &Arc<CudaContext>) {
    const LAYERS: usize = 16;
    const PAGES: u32 = 8;
    const PAGE: usize = 4096;
    const IMM: u32 = 0x4b56;
    let fabric = TestFabric::new(TestFabricConfig::default());
    let a = Arc::new(
        TransferEngine::builder()
            .group(fabric.domains(2))
            .build()
            .unwrap(),
    );
    let b = TransferEngine::builder()
        .group(fabric.domains(2))
        .build()
        .unwrap();
    // The test domain copies with the CPU, so the KV cache lives in pinned
    // host memory that kernels write through its device mapping.
    let total = LAYERS * PAGES as usize * PAGE;
    let kv = PinnedHostMemory::new(ctx.clone())
        .alloc_zeroed(total)
        .unwrap();
    let span = transfer_core::MemorySpan {
        ptr: kv.host_ptr().as_ptr(),
        len: total,
        location: MemoryLocation::Host,
        dmabuf_fd: None,
    };
    // SAFETY: `kv` outlives both engines (dropped last).
    let src = unsafe { a.register_raw(span, 0) }.unwrap();
    let dst = b.alloc_host(total, 0).unwrap();
    let peer = a.peer(b.address()).unwrap();
    let t = a.remote(&peer, dst.remote().clone()).unwrap();
    let plan = (0..LAYERS)
        .map(|l| {
            let idx: Vec<u32> = (0..PAGES).map(|p| l as u32 * PAGES + p).collect();
            let pages = Pages {
                indices: idx,
                stride: PAGE as u64,
                offset: 0,
            };
            LayerPages {
                src_pages: pages.clone(),
                dst_pages: pages,
                page_len: PAGE as u64,
            }
        })
        .collect();
    let watcher = Watcher::pinned(ctx.clone(), WatcherConfig::default()).unwrap();
    let sender = LayerSender::start(&watcher, a.clone(), src, t, plan, IMM).unwrap();
    let per = b
        .expected_imms(
            a.address(),
            0,
            0,
            WriteShape::Paged {
                pages: PAGES as usize,
            },
        )
        .unwrap();
    let kernels = DeviceKernels::load(ctx).unwrap();
    let stream = Stream::new(ctx).unwrap();
    let words = (PAGES as usize * PAGE / 4) as u32;
    let t0 = Instant::now();
    for l in 0..LAYERS {
        let layer_addr = kv.device_addr() + (l * PAGES as usize * PAGE) as u64;
        // SAFETY: the layer lies inside `kv`; the slot in the live watcher.
        unsafe {
            kernels
                .fill_u32(&stream, layer_addr, words, (l as u32) << 20)
                .unwrap();
            kernels
                .slot_add(&stream, sender.slot(l).unwrap().device, 1)
                .unwrap();
        }
    }
    b.wait_imm(IMM, per * LAYERS as u64, GUARD).unwrap();
    println!(
        "{LAYERS} layers produced by kernels and received in {:?}",
        t0.elapsed()
    );
    stream.synchronize().unwrap();
    assert!(sender.errors().is_empty());
    let got = dst.to_vec().unwrap();
    for l in 0..LAYERS {
        for i in 0..words as usize {
            let off = l * PAGES as usize * PAGE + i * 4;
            let v = u32::from_le_bytes(got[off..off + 4].try_into().unwrap());
            assert_eq!(v, ((l as u32) << 20) + i as u32, "layer {l} word {i}");
        }
    }
    println!("KV cache: {LAYERS} layers received and verified");
    drop(watcher);
    drop(a);
    drop(b);
    drop(kv);
}
