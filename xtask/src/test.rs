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
    let start = std::time::Instant::now();
    let result = run_steps(args);
    step::print_summary(start);
    result
}

fn run_steps(args: &[String]) -> Result<(), String> {
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
    // The llama.cpp tree of the ggml step (its largest build) fills the
    // CPU time the steps before it leave idle; joined before its first use.
    let llama = if ggml {
        deps::ensure(&deps::GGML_BUILD)?;
        crate::llama_tree::prepare_tools()?;
        Some(crate::llama_tree::start_background_build())
    } else {
        None
    };
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
    if let Some(llama) = llama {
        rpc_against_llama_cpp(llama)?;
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
/// in a fresh build directory, so this build has its own. Absolute: the
/// paths under it are handed to tests, which run in their crate's folder
/// (a relative `target/rpc-upstream/...` made the plugin's host tests miss
/// the server and ggml's static libraries).
fn rpc_target_dir() -> std::path::PathBuf {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = root.parent().unwrap_or(root);
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        // cargo reads a relative CARGO_TARGET_DIR from the current folder.
        Some(t) => std::env::current_dir()
            .map_or_else(|_| std::path::PathBuf::from(&t), |cwd| cwd.join(&t)),
        None => root.join("target"),
    };
    target.join("rpc-upstream")
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
fn rpc_against_llama_cpp(llama: crate::llama_tree::Background) -> Result<(), String> {
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
    llama.join()?;
    backend_ops::run_ci(&server)?;
    // The ggml backend plugin loaded into unmodified llama.cpp programs
    // (the llama-cpp-python 0.3.36 tree) and into the ggml above.
    crate::plugin::run_ci()
}

/// The verbs conformance suite, unchanged, on a real soft-RoCE stack: a
/// qemu VM booting Debian's kernel with rdma_rxe (this kernel has no RDMA).
///
/// Everything it copies into the VM comes out of the tests step's build
/// (`cargo test --workspace` with [`WORKSPACE_FEATURES`]): the test
/// binaries and the debug transfer-bench. It used to build its own
/// (`cargo test -p transfer-verbs` and `-p transfer-rpc --features engine`,
/// whose narrower feature sets recompiled transfer-core, -efa, -verbs, -rpc
/// and the test binaries: see the commit message for the CPU seconds) and a
/// release transfer-bench (every dependency again, optimised: 252.6 CPU s
/// here) for a smoke run that checks function, not speed. The debug
/// bench's smoke run takes longer under emulation (~120 s of VM time
/// against ~45 s, measured when the release build was chosen; 100.5 CPU s
/// for a whole run.sh boot with only the smoke run, here) but far less
/// than that build.
pub fn verbs_vm() -> Result<(), String> {
    deps::ensure(&deps::VERBS_VM)?;
    deps::ensure(&bench_vm::PERFTEST)?;
    let mut bins = workspace_test_binaries(&VM_TESTS)?;
    let bench = bench_binary();
    let bench = std::fs::canonicalize(&bench).map_err(|e| {
        format!(
            "{}: {e} (the tests step builds it; `cargo xtask test` runs that step first)",
            bench.display()
        )
    })?;
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
    bins.push(bench);
    for b in without_debug_info(&bins) {
        cmd.arg("--bin").arg(b);
    }
    // The bench's smoke run goes into the same VM boot, next to perftest.
    for program in bench_vm::PERFTEST_PROGRAMS {
        cmd.arg("--bin").arg(bench_vm::find_program(program)?);
    }
    // The transfer-rpc engine link runs there too, over the native verbs
    // backend: the pipeline's engine arm on RC QPs, not only on libfabric.
    // Only the cases that need no libfabric and no host binaries.
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

/// Copies of `bins` without their DWARF sections (`objcopy
/// --strip-debug`, symbols kept) under `<target>/vm-bins`, same file
/// names: the debug builds are 148 MB (transfer-bench alone 69 MB), 31 MB
/// without, which run.sh packs (gzip) into the initramfs and the emulated
/// guest unpacks at boot. A binary objcopy cannot strip goes in as it is.
fn without_debug_info(bins: &[PathBuf]) -> Vec<PathBuf> {
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let dir = Path::new(&target).join("vm-bins");
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!(
            "==> {}: {e}; the binaries go in with debug info",
            dir.display()
        );
        return bins.to_vec();
    }
    bins.iter()
        .map(|b| {
            let Some(name) = b.file_name() else {
                return b.clone();
            };
            let out = dir.join(name);
            let stripped = Command::new("objcopy")
                .arg("--strip-debug")
                .arg(b)
                .arg(&out)
                .status()
                .is_ok_and(|s| s.success());
            if stripped {
                out
            } else {
                eprintln!(
                    "==> objcopy --strip-debug {} failed: it goes in with debug info",
                    b.display()
                );
                b.clone()
            }
        })
        .collect()
}

/// The test binaries the VM runs: (package, integration test target).
const VM_TESTS: [(&str, &str); 3] = [
    ("transfer-verbs", "conformance"),
    ("transfer-verbs", "verbs_device"),
    ("transfer-rpc", "engine_link"),
];

/// The executables of `tests` as the tests step builds them: `cargo test
/// --workspace` with its features, `--no-run`, only those test targets (and
/// transfer-bench's `launch`, which makes cargo build the transfer-bench
/// binary the VM also runs). Features are resolved over the whole workspace
/// whatever targets are named, so after the tests step every unit is fresh
/// and nothing is compiled.
fn workspace_test_binaries(tests: &[(&str, &str)]) -> Result<Vec<PathBuf>, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.args([
        "test",
        "--workspace",
        "--features",
        WORKSPACE_FEATURES,
        "--no-run",
        "--message-format=json-render-diagnostics",
    ])
    .env(REQUIRE_ENV, REQUIRE_HOST);
    for (_, t) in tests.iter().chain(&[("transfer-bench", "launch")]) {
        cmd.args(["--test", t]);
    }
    eprintln!("==> test binaries for the VM: {}", step::describe(&cmd));
    let start = std::time::Instant::now();
    let out = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("could not start `{}`: {e}", step::describe(&cmd)))?;
    if !out.status.success() {
        return Err(format!(
            "`{}` failed ({})",
            step::describe(&cmd),
            out.status
        ));
    }
    let found = test_executables(&String::from_utf8_lossy(&out.stdout));
    let mut bins = Vec::new();
    for (package, test) in tests {
        let exe = found
            .iter()
            .find(|(p, t, _)| p == package && t == test)
            .map(|(_, _, e)| e.clone())
            .ok_or_else(|| format!("cargo built no test `{test}` of {package}"))?;
        bins.push(exe);
    }
    let secs = start.elapsed().as_secs_f64();
    step::record("test binaries for the VM", secs, true);
    eprintln!("==> test binaries for the VM: ok ({secs:.1} s)");
    Ok(bins)
}

/// `(package, test target, executable)` of every integration-test artifact
/// in cargo's `--message-format=json` output. Std-only: the few fields
/// are read from the one-line messages by name; a path with an escape in
/// it is passed over (cargo writes our paths without any).
fn test_executables(json: &str) -> Vec<(String, String, PathBuf)> {
    fn string_after<'a>(line: &'a str, key: &str) -> Option<&'a str> {
        let rest = &line[line.find(key)? + key.len()..];
        let value = &rest[..rest.find('"')?];
        (!value.contains('\\')).then_some(value)
    }
    json.lines()
        .filter(|l| l.contains("\"reason\":\"compiler-artifact\""))
        .filter(|l| l.contains("\"kind\":[\"test\"]"))
        .filter_map(|l| {
            let exe = string_after(l, "\"executable\":\"")?;
            let id = string_after(l, "\"package_id\":\"")?;
            let target = &l[l.find("\"target\":{")?..];
            let name = string_after(target, "\"name\":\"")?;
            Some((package_name(id)?, name.to_string(), PathBuf::from(exe)))
        })
        .collect()
}

/// A package's name from its cargo package id: `path+file:///…/name#0.1.0`,
/// `path+file:///…/dir#name@0.1.0` or the older `name 0.1.0 (path+…)`.
fn package_name(id: &str) -> Option<String> {
    if let Some((url, frag)) = id.split_once('#') {
        return Some(match frag.split_once('@') {
            Some((name, _)) => name.to_string(),
            None => url.rsplit('/').next()?.to_string(),
        });
    }
    id.split_whitespace().next().map(str::to_string)
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
    step::record(
        "python package tests (pytest)",
        secs,
        status.code() == Some(0),
    );
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_executables_are_read_from_cargo_json() {
        let json = concat!(
            r#"{"reason":"compiler-artifact","package_id":"path+file:///w/crates/transfer-verbs#0.1.0","manifest_path":"/w/crates/transfer-verbs/Cargo.toml","target":{"kind":["test"],"crate_types":["bin"],"name":"conformance","src_path":"/w/crates/transfer-verbs/tests/conformance.rs"},"profile":{},"features":[],"filenames":["/w/target/debug/deps/conformance-0a1b"],"executable":"/w/target/debug/deps/conformance-0a1b","fresh":true}"#,
            "\n",
            r#"{"reason":"compiler-artifact","package_id":"path+file:///w/crates/rpc#transfer-rpc@0.1.0","target":{"kind":["test"],"name":"engine_link"},"executable":"/w/target/debug/deps/engine_link-ff","fresh":true}"#,
            "\n",
            r#"{"reason":"compiler-artifact","package_id":"path+file:///w/crates/transfer-bench#0.1.0","target":{"kind":["bin"],"name":"transfer-bench"},"executable":"/w/target/debug/transfer-bench","fresh":true}"#,
            "\n",
            r#"{"reason":"compiler-artifact","package_id":"transfer-core 0.1.0 (path+file:///w/crates/transfer-core)","target":{"kind":["test"],"name":"teardown"},"executable":null,"fresh":true}"#,
            "\n",
            r#"{"reason":"build-finished","success":true}"#,
        );
        let got = test_executables(json);
        assert_eq!(
            got,
            vec![
                (
                    "transfer-verbs".to_string(),
                    "conformance".to_string(),
                    PathBuf::from("/w/target/debug/deps/conformance-0a1b")
                ),
                (
                    "transfer-rpc".to_string(),
                    "engine_link".to_string(),
                    PathBuf::from("/w/target/debug/deps/engine_link-ff")
                ),
            ]
        );
        assert_eq!(
            package_name("transfer-core 0.1.0 (path+file:///w)").as_deref(),
            Some("transfer-core")
        );
    }
}
