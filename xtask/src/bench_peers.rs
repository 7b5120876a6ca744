//! `cargo xtask bench --peers`: our engine from Python next to NVIDIA NIXL
//! and Mooncake Transfer Engine (issue 20's rows, issue 21's kv workload),
//! two processes per engine on this machine over tcp and shared memory.
//!
//! The peers come from PyPI into a venv of their own, `target/peers-venv`,
//! only when asked: never in `cargo xtask test` (NIXL's wheels alone are
//! ~400 MB). The harness is `crates/transfer-py/bench/peers/run.py`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::step;

/// What the peers venv holds, pinned. `nixl` and `nixl-cu12` go in with
/// `--no-deps`: their declared dependency on torch pulls torch and the
/// CUDA 13 stack (6 GB measured here), which nothing on a host without a
/// GPU loads (NIXL's loader imports `nixl_cu12` when no CUDA is found).
const NO_DEPS: [&str; 2] = ["nixl==1.5.1", "nixl-cu12==1.5.1"];
const WITH_DEPS: [&str; 3] = [
    "mooncake-transfer-engine-non-cuda==0.3.13.post1",
    "numpy==2.4.6",
    "maturin>=1.9.4,<2",
];

/// Options of `cargo xtask bench --peers`: everything else goes to run.py.
#[derive(Debug, PartialEq)]
pub struct PeersArgs {
    pub harness: Vec<String>,
}

pub fn parse(args: &[String]) -> Result<PeersArgs, String> {
    let mut harness = Vec::new();
    for a in args {
        match a.as_str() {
            "--peers" => {}
            "--netns" | "--hosts" | "--vm" | "--link-rate" | "--link-delay" => {
                return Err(format!(
                    "bench --peers runs two processes per engine on this machine; {a} does not apply"
                ));
            }
            _ => harness.push(a.clone()),
        }
    }
    Ok(PeersArgs { harness })
}

/// The pins as one line: the venv is rebuilt when they change.
fn pins() -> String {
    let mut v: Vec<&str> = NO_DEPS.to_vec();
    v.extend(WITH_DEPS);
    v.join(" ")
}

fn pip(py: &Path) -> Command {
    let mut c = Command::new(py);
    c.args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
    ]);
    c
}

/// Creates (or reuses) the venv with the pinned peers; returns its python.
fn venv(target: &Path) -> Result<PathBuf, String> {
    let venv = target.join("peers-venv");
    let py = venv.join("bin/python");
    let stamp = venv.join("peers-pins.txt");
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(pins().as_str()) && py.exists() {
        return Ok(py);
    }
    if !py.exists() {
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        step::run(
            "peers venv",
            Command::new(&python).arg("-m").arg("venv").arg(&venv),
        )?;
    }
    let version_ok = Command::new(&py)
        .args([
            "-c",
            "import sys; sys.exit(sys.version_info[:2] != (3, 11))",
        ])
        .status()
        .is_ok_and(|s| s.success());
    if !version_ok {
        return Err(format!(
            "the peers' wheels (nixl 1.5.1, mooncake 0.3.13) are installed for CPython 3.11; \
             remove {} and set PYTHON to a python3.11",
            venv.display()
        ));
    }
    step::run(
        "peers from PyPI (nixl, nixl-cu12; no torch)",
        pip(&py).arg("--no-deps").args(NO_DEPS),
    )?;
    step::run(
        "peers from PyPI (mooncake-transfer-engine-non-cuda, numpy, maturin)",
        pip(&py).args(WITH_DEPS),
    )?;
    std::fs::write(&stamp, pins()).map_err(|e| format!("writing {}: {e}", stamp.display()))?;
    Ok(py)
}

pub fn run(args: &[String]) -> Result<(), String> {
    let a = parse(args)?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or("xtask has no parent directory")?;
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let py = venv(&target)?;
    let crate_dir = root.join("crates/transfer-py");
    // Release: the bench measures the engine, not a debug build of it.
    let wheel = crate::test::build_wheel(
        "our wheel, release (maturin build --release)",
        &py,
        &crate_dir,
        &target.join("peers-wheels"),
        true,
    )?;
    step::run(
        "install our wheel into the peers venv",
        pip(&py)
            .args(["--force-reinstall", "--no-deps"])
            .arg(&wheel),
    )?;
    eprintln!("==> peers: {}", pins());
    let out = target.join("bench/peers");
    let kv_out = target.join("bench/workloads");
    step::run(
        "bench --peers",
        Command::new(&py)
            .arg(crate_dir.join("bench/peers/run.py"))
            .arg("--out-dir")
            .arg(&out)
            .arg("--kv-out-dir")
            .arg(&kv_out)
            .args(&a.harness)
            .current_dir(root),
    )?;
    eprintln!(
        "==> peers: records in {} and {} (kv)",
        out.display(),
        kv_out.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn harness_gets_the_rest() {
        let a = parse(&s(&["--peers", "--quick", "--repeats", "5"]));
        assert_eq!(
            a,
            Ok(PeersArgs {
                harness: s(&["--quick", "--repeats", "5"])
            })
        );
    }

    #[test]
    fn multi_host_options_are_refused() {
        assert!(parse(&s(&["--peers", "--netns", "2"])).is_err());
        assert!(parse(&s(&["--peers", "--vm"])).is_err());
    }

    #[test]
    fn peers_are_pinned() {
        for p in pins().split(' ').filter(|p| !p.starts_with("maturin")) {
            assert!(p.contains("=="), "{p} is not pinned");
        }
    }
}
