//! `cargo xtask test`: what CI runs.

use crate::{deps, step};

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
    let (mut ggml, mut vm) = (true, true);
    for a in args {
        match a.as_str() {
            "--no-vm" => vm = false,
            "--no-ggml" => ggml = false,
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

/// transfer-rpc's compute backend and its tests against the real thing
/// (ggml's RPC client and server, llama.cpp offloading a model to our
/// server). GGML_* options reach cmake only in a fresh build directory, so
/// this build has its own target directory.
fn rpc_against_llama_cpp() -> Result<(), String> {
    deps::ensure(&deps::GGML_BUILD)?;
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let dir = std::path::Path::new(&target).join("rpc-upstream");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let rpc_cargo = |args: &[&str]| {
        let mut cmd = std::process::Command::new(&cargo);
        cmd.args(args)
            .env("GGML_RPC", "ON")
            .env("GGML_RPC_RDMA", "OFF")
            .env("GGML_NO_BACKTRACE", "1")
            .env("CARGO_TARGET_DIR", &dir)
            .env(REQUIRE_ENV, REQUIRE_HOST);
        cmd
    };
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
    )
}

/// The verbs conformance suite, unchanged, on a real soft-RoCE stack: a
/// qemu VM booting Debian's kernel with rdma_rxe (this kernel has no RDMA).
pub fn verbs_vm() -> Result<(), String> {
    deps::ensure(&deps::VERBS_VM)?;
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
        "--",
        "conformance && verbs_device && verbs_device --ignored --exact drop_releases_every_kernel_object \
         && TRANSFER_RPC_TEST_ENGINE=ibverbs engine_link steps_land pipelined refusals lanes_unique \
         free_buffer session_end dead_destination",
    ]);
    step::run(
        "transfer-verbs conformance and the transfer-rpc engine link over soft-RoCE (qemu VM)",
        &mut cmd,
    )
}
