//! `cargo xtask test`'s step for transfer-ggml-plugin (issue 19): the
//! plugin loaded into unmodified llama.cpp programs over our servers.
//!
//! What it runs (`crates/transfer-ggml-plugin/tests/{hosts,llama}.rs`,
//! their `#[ignore]`d cases included):
//! - a host exporting an unknown ggml_version: refusal, no crash;
//! - ggml 0.25.3 (llama-cpp-python 0.3.36's llama.cpp, built by
//!   llama_tree, GGML_BACKEND_DL): a C host computing on plugin devices,
//!   and `llama-completion --rpc` over 2 and 3 transfer-rpc-servers with the
//!   plugin as `libggml-rpc-trpc.so`: greedy text equal to the CPU-only
//!   run, one COPY_TENSOR_TO per boundary per step and no activation
//!   GET_TENSOR (then the TRANSFER_RPC_P2P=0 hub run for contrast);
//!   `llama-server --rpc a,b`: HTTP `/completion` bytes equal to that CPU
//!   run; upstream's `ggml-rpc-server` next to ours: the same text through
//!   the client, logged once; two servers with engines (`--engine tcp` on
//!   lo): ENGINE_WRITE/ENGINE_WAIT per boundary per step instead of
//!   COPY_TENSOR_TO; a stopped server: an error after the timeout;
//! - ggml 0.26.0 (llama-cpp-sys-2 0.1.161's static build from the
//!   transfer-rpc ggml step): the same C host, and the unmodified `simple`
//!   example with the plugin loaded by ggml_backend_load.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{llama_tree, step};

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// llama-cpp-sys-2's cmake output with the static libraries the 0.26 host
/// links (`out/lib/libllama.a`, `libggml*.a`), and its source tree, read
/// from that build's CMakeCache.txt.
fn sys_build(rpc_target: &Path) -> Result<(PathBuf, PathBuf), String> {
    let build = rpc_target.join("debug/build");
    let mut best: Option<(std::time::SystemTime, PathBuf)> = None;
    let entries =
        std::fs::read_dir(&build).map_err(|e| format!("reading {}: {e}", build.display()))?;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let out = e.path().join("out");
        let lib = out.join("lib");
        if !name.starts_with("llama-cpp-sys-2-")
            || !lib.join("libllama.a").is_file()
            || !lib.join("libggml-rpc.a").is_file()
        {
            continue;
        }
        let t = std::fs::metadata(lib.join("libllama.a"))
            .and_then(|m| m.modified())
            .map_err(|e| format!("{}: {e}", lib.display()))?;
        if best.as_ref().is_none_or(|(b, _)| t > *b) {
            best = Some((t, out));
        }
    }
    let out = best.map(|(_, o)| o).ok_or_else(|| {
        format!(
            "no llama-cpp-sys-2 build with RPC under {}",
            build.display()
        )
    })?;
    let cache = out.join("build/CMakeCache.txt");
    let text =
        std::fs::read_to_string(&cache).map_err(|e| format!("reading {}: {e}", cache.display()))?;
    let src = text
        .lines()
        .find_map(|l| l.strip_prefix("CMAKE_HOME_DIRECTORY:INTERNAL="))
        .map(PathBuf::from)
        .ok_or_else(|| format!("no CMAKE_HOME_DIRECTORY in {}", cache.display()))?;
    Ok((out, src))
}

/// The llama.cpp source tree next to llama_tree's build (`src/*/vendor/llama.cpp`).
fn llama_source(bin: &Path) -> Result<PathBuf, String> {
    let root = bin
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| format!("{} has no llama_tree root", bin.display()))?;
    let src = root.join("src");
    std::fs::read_dir(&src)
        .map_err(|e| format!("reading {}: {e}", src.display()))?
        .flatten()
        .map(|e| e.path().join("vendor/llama.cpp"))
        .find(|p| p.join("CMakeLists.txt").is_file())
        .ok_or_else(|| format!("no vendor/llama.cpp under {}", src.display()))
}

/// The plugin's tests against both hosts.
pub fn run_ci() -> Result<(), String> {
    // llama-server: its HTTP /completion through the plugin; ggml-rpc-server:
    // upstream's server in the stock-server mix.
    let bin = llama_tree::ensure_built(&[
        "llama-completion",
        "llama-server",
        "ggml-rpc-server",
        "ggml-rpc",
        "ggml-cpu",
    ])?;
    let llama_src = llama_source(&bin)?;
    // The very build (same command, same environment) as the ggml step's
    // before test-backend-ops, so cargo finds it fresh. This step used to
    // build without GGML_NO_BACKTRACE: llama-cpp-sys-2's build script
    // declares `rerun-if-env-changed` for every GGML_* variable present,
    // so the missing one re-ran it (bindgen, cmake configure and install)
    // and rebuilt llama-cpp-sys-2 and transfer-rpc a second time per run.
    let server = crate::test::build_rpc_server()?;
    let rpc_target = server
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| format!("{} is not in <target>/debug", server.display()))?
        .to_path_buf();
    let (sys_out, sys_src) = sys_build(&rpc_target)?;
    let llama_build = bin
        .parent()
        .ok_or_else(|| format!("{} has no parent", bin.display()))?;
    let mut test = Command::new(cargo());
    test.args([
        "test",
        "-p",
        "transfer-ggml-plugin",
        "--test",
        "hosts",
        "--test",
        "llama",
        "--",
        "--include-ignored",
        // Servers and llama programs share 2 cores: one case at a time.
        "--test-threads",
        "1",
    ])
    .env("TRANSFER_LLAMA_BUILD", llama_build)
    .env("TRANSFER_LLAMA_SRC", &llama_src)
    .env("TRANSFER_LLAMA_SYS_OUT", &sys_out)
    .env("TRANSFER_LLAMA_SYS_SRC", &sys_src)
    .env(
        "TRANSFER_RPC_SERVER_BIN",
        rpc_target.join("debug/transfer-rpc-server"),
    )
    .env(
        "TRANSFER_RPC_PIPELINE_BIN",
        rpc_target.join("debug/transfer-rpc-pipeline"),
    )
    .env("GGML_NO_BACKTRACE", "1");
    step::run(
        "transfer-ggml-plugin in llama.cpp (ggml 0.25.3 and 0.26.0 hosts)",
        &mut test,
    )
}
