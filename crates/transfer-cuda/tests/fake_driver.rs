//! A dry run of the GPU checks against a fake `libcuda.so.1`
//! (`tests/fake-libcuda/fake_cuda.c`: host memory as "device" memory, the
//! PTX kernels re-implemented on the CPU; and a fake libgdrapi). It exercises everything on the
//! Rust side of the GPU path (driver loading, every entry point, kernel
//! argument marshalling, watchers on "pinned" memory, flags, dma-buf
//! export, the KV-cache flow) on machines without a GPU. It proves nothing
//! about real GPU behaviour or latency; `tests/gpu.rs` on a GPU does.
//!
//! Needs a C compiler (`cc`); prints "skipped" without one. The parent test
//! compiles the fake and re-runs this binary with `LD_LIBRARY_PATH` pointing
//! at it (the loader reads that variable only at start-up).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "common/gpu_checks.rs"]
mod checks;

use std::path::PathBuf;
use std::process::Command;

use transfer_cuda::CudaContext;

const CHILD: &str = "TRANSFER_CUDA_FAKE_DRIVER_CHILD";

fn build_fake() -> Option<PathBuf> {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fake-libcuda/fake_cuda.c");
    let dir = std::env::temp_dir().join(format!("transfer-cuda-fake-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let gdr_src = src.with_file_name("fake_gdrapi.c");
    for (source, lib) in [(&src, "libcuda.so.1"), (&gdr_src, "libgdrapi.so.2")] {
        let out = Command::new("cc")
            .args([
                "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", "-o",
            ])
            .arg(dir.join(lib))
            .arg(source)
            .arg("-lpthread")
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => panic!(
                "the fake {lib} does not compile: {}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => {
                println!("skipped: no C compiler to build the fake libcuda ({e})");
                return None;
            }
        }
    }
    // A stand-in for /dev/gdrdrv, so the fake libgdrapi is used.
    std::fs::write(dir.join("gdrdrv"), b"").unwrap();
    Some(dir)
}

fn run_child(dir: &PathBuf, extra_env: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("LD_LIBRARY_PATH", dir)
        .env("TRANSFER_CUDA_LATENCY_EVENTS", "50");
    if !extra_env.iter().any(|(k, _)| *k == "NO_FAKE_GDR") {
        cmd.env("TRANSFER_CUDA_GDRDRV", dir.join("gdrdrv"));
    }
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn gpu_checks_run_against_a_fake_driver() {
    let Some(dir) = build_fake() else {
        return;
    };
    let (ok, text) = run_child(&dir, &[]);
    println!("{text}");
    assert!(ok, "the GPU checks failed against the fake driver");
    assert!(text.contains("fake CUDA device"), "the fake was loaded");
    assert!(text.contains("received and verified"), "the KV flow ran");
    assert!(
        text.contains("GpuFlag::new uses GDRCopy"),
        "the GDRCopy path ran"
    );
    assert!(
        text.contains("GDRCopy flag: CPU set"),
        "the explicit GDRCopy flag ran"
    );
    // Without gdrdrv: the host-mapped fallback, with its reason.
    let (ok, text) = run_child(&dir, &[("NO_FAKE_GDR", "1")]);
    assert!(ok, "{text}");
    assert!(text.contains("fell back to host-mapped memory"), "{text}");
    // cuInit failing (library present, no device) is a typed, skippable error.
    let (ok, text) = run_child(&dir, &[("FAKE_CUDA_NO_DEVICE", "1")]);
    println!("{text}");
    assert!(ok);
    assert!(text.contains("no GPU: cuInit failed: CUDA_ERROR_NO_DEVICE (100)"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs only when re-executed by the test above.
#[test]
fn child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let ctx = match CudaContext::new(0) {
        Ok(c) => c,
        Err(e) => {
            assert!(e.is_no_gpu(), "{e:?}");
            println!("no GPU: {e}");
            return;
        }
    };
    checks::device_report(&ctx);
    checks::watcher_latency_from_kernel_launch(&ctx);
    checks::watcher_latency_from_kernel_write(&ctx);
    checks::every_slot_under_concurrent_kernels(&ctx);
    checks::stream_write_value_signals_a_slot(&ctx);
    checks::flags_are_seen_by_a_polling_kernel(&ctx);
    checks::an_immediate_counter_sets_a_gpu_flag(&ctx);
    checks::dmabuf_export_and_registration(&ctx);
    checks::kv_cache_layers_from_kernels(&ctx);
}
