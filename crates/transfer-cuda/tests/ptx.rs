//! The embedded PTX: every entry point is there, the text is NUL-terminated
//! for `cuModuleLoadData`, and, where `ptxas` is available (`PTXAS=path`,
//! on `PATH`, or in `/usr/local/cuda/bin`), it assembles for Pascal,
//! Ampere and Hopper. Without `ptxas` that part prints "skipped".

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::Command;

use transfer_cuda::kernels::{ENTRY_POINTS, PTX};

#[test]
fn every_entry_point_is_defined_and_the_text_is_nul_terminated() {
    assert!(PTX.ends_with('\0'));
    assert_eq!(PTX.matches('\0').count(), 1, "exactly one NUL, at the end");
    for e in ENTRY_POINTS {
        assert!(
            PTX.contains(&format!(".visible .entry {e}(")),
            "{e} missing"
        );
    }
    assert!(
        PTX.contains(".target sm_60"),
        "JIT-able on every GPU from Pascal on"
    );
}

fn ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PTXAS") {
        return Some(PathBuf::from(p));
    }
    let on_path = Command::new("ptxas").arg("--version").output();
    if on_path.is_ok_and(|o| o.status.success()) {
        return Some(PathBuf::from("ptxas"));
    }
    let cuda = PathBuf::from("/usr/local/cuda/bin/ptxas");
    cuda.exists().then_some(cuda)
}

#[test]
fn ptxas_accepts_the_ptx() {
    let Some(ptxas) = ptxas() else {
        println!("skipped: no ptxas (set PTXAS=/path/to/ptxas to check the PTX offline)");
        return;
    };
    let dir = std::env::temp_dir().join(format!("transfer-cuda-ptx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("kernels.ptx");
    std::fs::write(&src, PTX.trim_end_matches('\0')).unwrap();
    for arch in ["sm_60", "sm_80", "sm_90"] {
        let out = Command::new(&ptxas)
            .args(["--gpu-name", arch, "--warn-on-spills", "-o"])
            .arg(dir.join(format!("{arch}.cubin")))
            .arg(&src)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ptxas {arch}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.stderr.is_empty(),
            "ptxas {arch} warned: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        println!("ptxas {arch}: ok");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
