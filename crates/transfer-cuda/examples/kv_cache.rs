//! Layer-by-layer KV-cache transfer (the seed's pattern).
//!
//! A kernel writes layer `L` of the KV cache, then a second kernel on the
//! same stream bumps watcher slot `L`; the watcher's callback submits that
//! layer's pages as one paged write carrying an immediate; the receiver's
//! immediate counter completes when every layer has arrived, and the
//! received bytes are checked.
//!
//! Backend, honestly: transfer-core's in-process test domain (two engines
//! in this process; bytes are copied by the CPU). No RDMA backend is wired
//! into this example yet, so the KV cache lives in pinned host memory
//! mapped into the GPU (the CPU must be able to read what the test domain
//! copies). With a real backend, the cache would be device memory registered
//! through `register_device_memory` (dma-buf).
//!
//! Without a CUDA driver or GPU it prints why and exits with code 2.
//!
//! Usage: `kv_cache [--layers N] [--pages-per-layer N] [--page-bytes N]`

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use transfer_core::testing::{TestFabric, TestFabricConfig};
use transfer_core::{MemoryLocation, MemorySpan, Pages, TransferEngine, WriteShape};
use transfer_cuda::{
    CudaContext, CudaError, DeviceKernels, LayerPages, LayerSender, MemoryProvider,
    PinnedHostMemory, Stream, Watcher, WatcherConfig,
};

const IMM: u32 = 0x4b56_0001;

struct Args {
    layers: usize,
    pages: u32,
    page_bytes: usize,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        layers: 32,
        pages: 16,
        page_bytes: 16 * 1024,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value"))?
            .parse::<usize>()
            .map_err(|e| format!("{flag}: {e}"))?;
        match flag.as_str() {
            "--layers" => a.layers = value,
            "--pages-per-layer" => a.pages = u32::try_from(value).map_err(|e| e.to_string())?,
            "--page-bytes" => a.page_bytes = value,
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    if a.layers == 0 || a.pages == 0 || a.page_bytes == 0 || a.page_bytes % 4 != 0 {
        return Err(
            "layers, pages and page bytes must be positive; page bytes a multiple of 4".into(),
        );
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("kv_cache: {e}");
            return ExitCode::from(64);
        }
    };
    let ctx = match CudaContext::new(0) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("kv_cache: cannot run: this example needs a CUDA GPU and driver: {e}");
            return ExitCode::from(if e.is_no_gpu() { 2 } else { 1 });
        }
    };
    match run(&ctx, &args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kv_cache: failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(ctx: &Arc<CudaContext>, args: &Args) -> Result<(), CudaError> {
    let layer_bytes = args.pages as usize * args.page_bytes;
    let total = args.layers * layer_bytes;
    println!(
        "GPU: {} | {} layers x {} pages x {} B = {} MiB",
        ctx.name()?,
        args.layers,
        args.pages,
        args.page_bytes,
        total >> 20
    );
    println!(
        "backend: transfer-core test domain (in-process, CPU copies); KV cache in pinned host memory mapped into the GPU"
    );

    // Declared first, so dropped last, after the engines that registered it.
    let kv = PinnedHostMemory::new(ctx.clone()).alloc_zeroed(total)?;
    let fabric = TestFabric::new(TestFabricConfig::default());
    let sender = Arc::new(TransferEngine::builder().group(fabric.domains(2)).build()?);
    let receiver = TransferEngine::builder().group(fabric.domains(2)).build()?;

    let span = MemorySpan {
        ptr: kv.host_ptr().as_ptr(),
        len: total,
        location: MemoryLocation::Host,
        dmabuf_fd: None,
    };
    // SAFETY: `kv` outlives both engines (declared before them, dropped after).
    let src = unsafe { sender.register_raw(span, 0) }?;
    let dst = receiver.alloc_host(total, 0)?;
    let peer = sender.peer(receiver.address())?;
    let target = sender.remote(&peer, dst.remote().clone())?;

    // Layer L occupies pages [L * pages, (L + 1) * pages) on both sides.
    let plan = (0..args.layers)
        .map(|l| {
            let pages = Pages {
                indices: (0..args.pages).map(|p| l as u32 * args.pages + p).collect(),
                stride: args.page_bytes as u64,
                offset: 0,
            };
            LayerPages {
                src_pages: pages.clone(),
                dst_pages: pages,
                page_len: args.page_bytes as u64,
            }
        })
        .collect();
    let watcher = Watcher::pinned(ctx.clone(), WatcherConfig::default())?;
    let layers = LayerSender::start(&watcher, sender.clone(), src, target, plan, IMM)?;
    let per_layer = receiver.expected_imms(
        sender.address(),
        0,
        0,
        WriteShape::Paged {
            pages: args.pages as usize,
        },
    )?;
    println!(
        "watcher: {} slots in {} ({} page(s)); receiver expects {} immediates per layer",
        args.layers,
        watcher.provider_kind(),
        watcher.pages(),
        per_layer
    );

    let kernels = DeviceKernels::load(ctx)?;
    let stream = Stream::new(ctx)?;
    let words = u32::try_from(layer_bytes / 4)
        .map_err(|_| CudaError::invalid("kv_cache", "layer too large"))?;
    let t0 = Instant::now();
    for l in 0..args.layers {
        let layer = kv.device_addr() + (l * layer_bytes) as u64;
        let slot = layers
            .slot(l)
            .ok_or_else(|| CudaError::invalid("kv_cache", "missing slot"))?;
        // SAFETY: the layer lies inside `kv`; the slot belongs to `watcher`;
        // both outlive the stream (synchronised below).
        unsafe {
            kernels.fill_u32(&stream, layer, words, (l as u32) << 20)?;
            kernels.slot_add(&stream, slot.device, 1)?;
        }
    }
    let launched = t0.elapsed();
    receiver.wait_imm(IMM, per_layer * args.layers as u64, Duration::from_secs(60))?;
    let arrived = t0.elapsed();
    stream.synchronize()?;
    println!(
        "launched {} layer kernels in {launched:?}; every layer arrived after {arrived:?} ({:.2} GB/s end to end)",
        args.layers,
        total as f64 / arrived.as_secs_f64() / 1e9
    );
    if let Some((l, e)) = layers.errors().into_iter().next() {
        return Err(CudaError::invalid(
            "kv_cache",
            format!("layer {l} failed: {e}"),
        ));
    }
    let got = dst.to_vec()?;
    for l in 0..args.layers {
        for i in 0..words as usize {
            let off = l * layer_bytes + i * 4;
            let v = got
                .get(off..off + 4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_le_bytes);
            if v != Some(((l as u32) << 20) + i as u32) {
                return Err(CudaError::invalid(
                    "kv_cache",
                    format!("layer {l} word {i}: got {v:?}"),
                ));
            }
        }
    }
    println!(
        "received KV cache verified: {total} bytes, {} layers",
        args.layers
    );
    Ok(())
}
