//! `cargo xtask test`: what CI runs.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{backend_ops, bench_vm, deps, step};

/// Features every workspace build of the tests enables. Not `--all-features`:
/// optional native builds (transfer-rpc's ggml) run as their own step.
const WORKSPACE_FEATURES: &str =
    "transfer-core/test-domain,transfer-core/conformance,transfer-rpc/engine";

/// transfer-rpc's features in the ggml step: compute, the tests against
/// upstream, the pipeline coordinator and its engine arm.
const RPC_FEATURES: &str = "upstream-rpc,engine";

/// Providers that must open on the CI host (`transfer_core::testing::REQUIRE_ENV`):
/// a test that cannot open one fails instead of printing "skipped" and passing.
/// `headers`: the FFI layout tests must find the C headers and a compiler.
const REQUIRE_HOST: &str = "tcp,shm,headers";

/// The same inside the soft-RoCE VM: the native verbs backend on rxe.
const REQUIRE_VM: &str = "verbs";

/// `transfer_core::testing::REQUIRE_ENV` (xtask does not depend on transfer-core).
const REQUIRE_ENV: &str = "TRANSFER_REQUIRE";

pub fn run(args: &[String]) -> Result<(), String> {
    let (mut ggml, mut vm, mut python) = (true, true, true);
    for a in args {
        match a.as_str() {
            "--no-vm" => vm = false,
            "--no-ggml" => ggml = false,
            "--no-python" => python = false,
            // Only the Python package's step, for quick iterations on it.
            "--python-only" => return python_package(),
            other => return Err(format!("test: unknown option `{other}`")),
        }
    }
    deps::ensure(&deps::RUNTIME)?;
    deps::ensure(&deps::FFI_HEADERS)?;
    step::cargo("rustfmt check", &["fmt", "--all", "--", "--check"])?;
    step::cargo(
        "clippy",
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--features",
            WORKSPACE_FEATURES,
            "--",
            "-D",
            "warnings",
        ],
    )?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    step::run(
        "tests",
        std::process::Command::new(&cargo)
            .args([
                "test",
                "--workspace",
                "--features",
                WORKSPACE_FEATURES,
                "--no-fail-fast",
            ])
            .env(REQUIRE_ENV, REQUIRE_HOST),
    )?;
    // The tests step built target/debug/transfer-bench (its launch test needs it).
    crate::bench_mpi::smoke(&bench_binary())?;
    if python {
        python_package()?;
    } else {
        eprintln!("==> skipped (--no-python): the Python package (crates/transfer-py)");
    }
    if ggml {
        rpc_against_llama_cpp()?;
    } else {
        eprintln!("==> skipped (--no-ggml): transfer-rpc against ggml and llama.cpp");
    }
    if vm {
        verbs_vm()?;
    } else {
        eprintln!("==> skipped (--no-vm): transfer-verbs conformance over soft-RoCE");
    }
    eprintln!("==> all checks passed");
    Ok(())
}

/// The debug transfer-bench of the tests step.
pub fn bench_binary() -> std::path::PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    std::path::Path::new(&target).join("debug/transfer-bench")
}

/// The target directory of the ggml step: GGML_* options reach cmake only
/// in a fresh build directory, so this build has its own.
fn rpc_target_dir() -> std::path::PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    std::path::Path::new(&target).join("rpc-upstream")
}

/// `cargo <args>` with the ggml step's environment.
fn rpc_cargo(args: &[&str]) -> std::process::Command {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = std::process::Command::new(&cargo);
    cmd.args(args)
        .env("GGML_RPC", "ON")
        .env("GGML_RPC_RDMA", "OFF")
        .env("GGML_NO_BACKTRACE", "1")
        .env("CARGO_TARGET_DIR", rpc_target_dir())
        .env(REQUIRE_ENV, REQUIRE_HOST);
    cmd
}

/// Builds transfer-rpc-server (and its compute worker) as the ggml step
/// does and returns the server's path.
pub fn build_rpc_server() -> Result<std::path::PathBuf, String> {
    deps::ensure(&deps::GGML_BUILD)?;
    step::run(
        "build transfer-rpc-server (ggml)",
        &mut rpc_cargo(&[
            "build",
            "-p",
            "transfer-rpc",
            "--features",
            RPC_FEATURES,
            "--bins",
        ]),
    )?;
    Ok(rpc_target_dir().join("debug/transfer-rpc-server"))
}

/// transfer-rpc's compute backend and its tests against the real thing
/// (ggml's RPC client and server, llama.cpp offloading a model to our
/// server), then llama.cpp's own op suite against our server.
fn rpc_against_llama_cpp() -> Result<(), String> {
    deps::ensure(&deps::GGML_BUILD)?;
    // The ggml-only code (compute backend, pipeline coordinator) is linted
    // here: the workspace clippy step does not build ggml.
    step::run(
        "clippy, transfer-rpc with ggml",
        &mut rpc_cargo(&[
            "clippy",
            "-p",
            "transfer-rpc",
            "--all-targets",
            "--features",
            RPC_FEATURES,
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    step::run(
        "transfer-rpc against ggml and llama.cpp",
        &mut rpc_cargo(&["test", "-p", "transfer-rpc", "--features", RPC_FEATURES]),
    )?;
    let server = build_rpc_server()?;
    backend_ops::run_ci(&server)?;
    // The ggml backend plugin loaded into unmodified llama.cpp programs
    // (the llama-cpp-python 0.3.36 tree) and into the ggml above.
    crate::plugin::run_ci()
}

/// The verbs conformance suite, unchanged, on a real soft-RoCE stack: a
/// qemu VM booting Debian's kernel with rdma_rxe (this kernel has no RDMA).
pub fn verbs_vm() -> Result<(), String> {
    deps::ensure(&deps::VERBS_VM)?;
    deps::ensure(&bench_vm::PERFTEST)?;
    // The bench's smoke run goes into the same VM boot, next to perftest.
    // A release build (as `cargo xtask bench`'s): under emulation the debug
    // build's run took ~120 s of VM time, the release one ~45 s.
    let bench = bench_vm::build_bench(true)?;
    let mut cmd = std::process::Command::new("crates/transfer-verbs/vm/run.sh");
    // Under TCG on a busy 2-core machine the whole VM run took 91-145 s
    // here; the script's default 280 s limit leaves too little margin for
    // a slower CI host.
    if std::env::var_os("TIMEOUT").is_none() {
        cmd.env("TIMEOUT", "900");
    }
    // run.sh exports VM_ENV inside the VM: there a verbs test that cannot
    // open rxe fails instead of skipping.
    let vm_env = match std::env::var("VM_ENV") {
        Ok(extra) if !extra.trim().is_empty() => format!("{extra} {REQUIRE_ENV}={REQUIRE_VM}"),
        _ => format!("{REQUIRE_ENV}={REQUIRE_VM}"),
    };
    cmd.env("VM_ENV", vm_env);
    // The transfer-rpc engine link runs there too, over the native verbs
    // backend: the pipeline's engine arm on RC QPs, not only on libfabric.
    // Only the cases that need no libfabric and no host binaries.
    cmd.args([
        "--build",
        "--build-test",
        "-p transfer-rpc --features engine --test engine_link",
    ]);
    cmd.args(bench_vm::vm_bins(&bench)?);
    cmd.arg("--").arg(format!(
        "conformance && verbs_device && verbs_device --ignored --exact drop_releases_every_kernel_object \
         && TRANSFER_RPC_TEST_ENGINE=ibverbs engine_link steps_land pipelined refusals lanes_unique \
         free_buffer session_end dead_destination && {}",
        bench_vm::vm_command("smoke")
    ));
    step::run(
        "transfer-verbs conformance, the transfer-rpc engine link and the bench's smoke run over soft-RoCE (qemu VM)",
        &mut cmd,
    )
}

/// What the Python package's step needs from the system: an interpreter
/// (3.11 or newer: the wheel is abi3-py311) with the venv module.
const PYTHON: [deps::Package; 2] = [
    deps::Package {
        name: "python3",
        probes: &["/usr/bin/python3", "/usr/local/bin/python3"],
        why: "builds and tests the Python package (crates/transfer-py)",
    },
    deps::Package {
        name: "python3-venv",
        probes: &[
            "/usr/lib/python3*/ensurepip/__init__.py",
            "/usr/local/lib/python3*/ensurepip/__init__.py",
        ],
        why: "the virtual environment the Python package is tested in",
    },
];

/// What the step installs from PyPI into its virtual environment.
const PY_PACKAGES: [&str; 3] = ["maturin>=1.9.4,<2", "numpy", "pytest"];

/// The Python package: a venv under the target directory, the wheel built
/// with maturin and installed into it, then its pytest suite (two real
/// processes over tcp and shm). `PYTHON` names the interpreter (default
/// `python3` on PATH).
fn python_package() -> Result<(), String> {
    use std::path::Path;
    use std::process::Command;

    deps::ensure(&PYTHON)?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or("xtask has no parent directory")?;
    let crate_dir = root.join("crates/transfer-py");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), std::path::PathBuf::from);
    let venv = target.join("py-venv");
    let py = venv.join("bin/python");
    if !py.exists() {
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        step::run(
            "python venv",
            Command::new(&python).arg("-m").arg("venv").arg(&venv),
        )?;
    }
    let version_ok = Command::new(&py)
        .args(["-c", "import sys; sys.exit(sys.version_info < (3, 11))"])
        .status()
        .is_ok_and(|s| s.success());
    if !version_ok {
        return Err(format!(
            "the Python package needs Python 3.11 or newer; remove {} and set PYTHON to one",
            venv.display()
        ));
    }
    let installed = venv.join("bin/maturin").exists()
        && Command::new(&py)
            .args(["-c", "import numpy, pytest"])
            .status()
            .is_ok_and(|s| s.success());
    if !installed {
        step::run(
            "python packages from PyPI",
            Command::new(&py)
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                ])
                .args(PY_PACKAGES),
        )?;
    }
    let wheel = build_wheel(
        "python wheel (maturin build)",
        &py,
        &crate_dir,
        &target.join("py-wheels"),
        false,
    )?;
    step::run(
        "install the wheel",
        Command::new(&py)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--force-reinstall",
                "--no-deps",
            ])
            .arg(&wheel),
    )?;
    // Not step::run: pytest's exit code 5 (no test collected) must fail
    // with its own message, as any other non-zero code does.
    let mut cmd = Command::new(&py);
    cmd.args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
        .current_dir(&crate_dir);
    eprintln!(
        "==> python package tests: pytest in {}",
        crate_dir.display()
    );
    let start = std::time::Instant::now();
    let status = cmd
        .status()
        .map_err(|e| format!("python package tests: could not start pytest: {e}"))?;
    let secs = start.elapsed().as_secs_f64();
    match status.code() {
        Some(0) => {
            eprintln!("==> python package tests: ok ({secs:.1} s)");
            Ok(())
        }
        Some(5) => Err("python package tests: pytest collected no tests (exit code 5)".into()),
        _ => Err(format!(
            "python package tests failed ({status}) after {secs:.1} s"
        )),
    }
}

/// Builds transfer-py's wheel with the maturin of `py`'s venv into `out`
/// (emptied first, so the one wheel there is this build's) and returns it;
/// `release` for a bench that measures the engine rather than a debug build.
pub fn build_wheel(
    step_name: &str,
    py: &Path,
    crate_dir: &Path,
    out: &Path,
    release: bool,
) -> Result<PathBuf, String> {
    let _ = std::fs::remove_dir_all(out);
    let mut cmd = Command::new(py.with_file_name("maturin"));
    cmd.arg("build");
    if release {
        cmd.arg("--release");
    }
    cmd.arg("--manifest-path")
        .arg(crate_dir.join("Cargo.toml"))
        .arg("--interpreter")
        .arg(py)
        .arg("--out")
        .arg(out);
    step::run(step_name, &mut cmd)?;
    std::fs::read_dir(out)
        .map_err(|e| format!("reading {}: {e}", out.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| format!("maturin left no wheel in {}", out.display()))
}
