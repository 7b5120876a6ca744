//! GPU checks. Every test prints "skipped (cuda): <reason>" and returns when
//! there is no CUDA driver or GPU, so this binary runs (and passes) anywhere,
//! unless `TRANSFER_REQUIRE` names `cuda` (`transfer_core::testing::REQUIRE_ENV`):
//! then no GPU is a failure, as for every other provider. On a GPU machine
//! it measures and checks the real thing. Build it once with
//! `crates/transfer-cuda/gpu-check.sh` (no CUDA toolkit needed) and run it
//! on the GPU machine with `crates/transfer-cuda/gpu-check.sh run`.
//!
//! Latencies (median and p99 over `TRANSFER_CUDA_LATENCY_EVENTS`, default
//! 2000, events) are printed, never asserted. The checks themselves live in
//! `common/gpu_checks.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "common/gpu_checks.rs"]
mod checks;

use std::process::Command;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use transfer_core::testing::{REQUIRE_ENV, skip_or_fail};
use transfer_cuda::CudaContext;

/// GPU tests share one device: run them one at a time even without
/// `--test-threads=1`, so that latencies are not disturbed.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The GPU, or `None` after printing why the test is skipped; fails the
/// test instead when `TRANSFER_REQUIRE` names `cuda`.
fn gpu(test: &str) -> Option<Arc<CudaContext>> {
    match CudaContext::new(0) {
        Ok(ctx) => Some(ctx),
        Err(e) if e.is_no_gpu() => {
            skip_or_fail("cuda", format!("{test}: {e}"));
            None
        }
        Err(e) => panic!("{test}: CUDA is present but failed: {e}"),
    }
}

#[test]
fn device_report() {
    let _s = serial();
    if let Some(ctx) = gpu("device_report") {
        checks::device_report(&ctx);
    }
}

#[test]
fn watcher_latency_from_kernel_launch() {
    let _s = serial();
    if let Some(ctx) = gpu("watcher_latency_from_kernel_launch") {
        checks::watcher_latency_from_kernel_launch(&ctx);
    }
}

#[test]
fn watcher_latency_from_kernel_write() {
    let _s = serial();
    if let Some(ctx) = gpu("watcher_latency_from_kernel_write") {
        checks::watcher_latency_from_kernel_write(&ctx);
    }
}

#[test]
fn every_slot_under_concurrent_kernels() {
    let _s = serial();
    if let Some(ctx) = gpu("every_slot_under_concurrent_kernels") {
        checks::every_slot_under_concurrent_kernels(&ctx);
    }
}

#[test]
fn stream_write_value_signals_a_slot() {
    let _s = serial();
    if let Some(ctx) = gpu("stream_write_value_signals_a_slot") {
        checks::stream_write_value_signals_a_slot(&ctx);
    }
}

#[test]
fn flags_are_seen_by_a_polling_kernel() {
    let _s = serial();
    if let Some(ctx) = gpu("flags_are_seen_by_a_polling_kernel") {
        checks::flags_are_seen_by_a_polling_kernel(&ctx);
    }
}

#[test]
fn an_immediate_counter_sets_a_gpu_flag() {
    let _s = serial();
    if let Some(ctx) = gpu("an_immediate_counter_sets_a_gpu_flag") {
        checks::an_immediate_counter_sets_a_gpu_flag(&ctx);
    }
}

#[test]
fn dmabuf_export_and_registration() {
    let _s = serial();
    if let Some(ctx) = gpu("dmabuf_export_and_registration") {
        checks::dmabuf_export_and_registration(&ctx);
    }
}

#[test]
fn kv_cache_layers_from_kernels() {
    let _s = serial();
    if let Some(ctx) = gpu("kv_cache_layers_from_kernels") {
        checks::kv_cache_layers_from_kernels(&ctx);
    }
}

/// Issue 22: without a GPU these tests passed as "skipped" even where one
/// was required. Runs `device_report` again, in a child of this very test
/// binary, with `TRANSFER_REQUIRE=cuda`: it must fail here when there is no
/// GPU (and pass where there is one), so the requirement cannot silently
/// stop working.
#[test]
fn required_cuda_fails_without_a_gpu() {
    let _s = serial();
    let has_gpu = match CudaContext::new(0) {
        Ok(_) => true,
        Err(e) if e.is_no_gpu() => false,
        Err(e) => panic!("CUDA is present but failed: {e}"),
    };
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args(["--exact", "device_report", "--test-threads=1"])
        .env(REQUIRE_ENV, "cuda")
        .output()
        .unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The child ran exactly the one test (not zero, which would also pass).
    assert!(text.contains("device_report"), "{text}");
    if has_gpu {
        assert!(out.status.success(), "with a GPU: {text}");
    } else {
        assert!(
            !out.status.success(),
            "TRANSFER_REQUIRE=cuda passed without a GPU: {text}"
        );
        assert!(
            text.contains("provider cuda is required"),
            "failed for another reason: {text}"
        );
    }
}
