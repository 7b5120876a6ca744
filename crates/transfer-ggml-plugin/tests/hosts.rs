//! The plugin loaded into real ggml hosts: a host it does not know (refused,
//! no crash), ggml 0.25.3 (llama.cpp of llama-cpp-python 0.3.36, backend
//! API 2) and ggml 0.26.0 (llama-cpp-sys-2 0.1.161, backend API 3), each
//! computing a small graph on our servers through the plugin.
//!
//! The last two need those builds; `cargo xtask test` provides them (env
//! in `common`), so they are `#[ignore]`d in the plain workspace run.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::Command;

use common::*;

#[test]
fn unknown_host_is_refused() {
    let dir = scratch("unknown");
    let exe = dir.join("unknown");
    compile("unknown.c", &exe, &["-rdynamic", "-ldl"]);
    // An unknown release, and a known one whose ggml-base functions are
    // missing (the layout cannot be confirmed): both refused, never guessed.
    for (why, args) in [("0.99.0", vec![]), ("no `ggml_", vec!["0.25.3"])] {
        let out = Command::new(&exe)
            .arg(plugin_so())
            .args(&args)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        eprintln!("{stdout}{stderr}");
        assert!(out.status.success(), "the plugin did not refuse cleanly");
        assert!(stdout.contains("score 0 init (nil) (nil)"), "{stdout}");
        // One line saying why, however often the loader asks.
        assert_eq!(stderr.matches("not loading").count(), 1, "{stderr}");
        assert!(stderr.contains(why), "{stderr}");
    }
}

fn run_smoke(exe: &std::path::Path, servers: &[&Server], want_version: &str) {
    let list: Vec<&str> = servers.iter().map(|s| s.endpoint.as_str()).collect();
    let out = Command::new(exe)
        .arg(plugin_so())
        .env("TRANSFER_RPC_SERVERS", list.join(","))
        .env("GGML_NO_BACKTRACE", "1")
        .env("TRANSFER_RPC_TIMEOUT_S", "60")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "smoke host failed");
    let ok = stdout
        .lines()
        .find_map(|l| l.strip_prefix("OK "))
        .unwrap_or_else(|| panic!("no OK line: {stdout}"));
    let (version, n) = ok.split_once(' ').unwrap();
    assert!(version.starts_with(want_version), "{ok}");
    assert_eq!(n.trim(), servers.len().to_string(), "{ok}");
}

#[test]
#[ignore = "needs the llama.cpp build (cargo xtask test)"]
fn loads_into_ggml_0_25_api_2() {
    let build = env_path(ENV_LLAMA_BUILD).join("bin");
    let src = env_path(ENV_LLAMA_SRC);
    let server = env_path(ENV_SERVER_BIN);
    let dir = scratch("host025");
    let exe = dir.join("smoke");
    let inc = format!("-I{}", src.join("ggml/include").display());
    let lib = format!("-L{}", build.display());
    let rpath = format!("-Wl,-rpath,{}", build.display());
    compile(
        "smoke.c",
        &exe,
        &[&inc, &lib, "-lggml", "-lggml-base", "-lm", &rpath],
    );
    let a = Server::start(&server, &["--compute-in-process"]);
    let b = Server::start(&server, &["--compute-in-process"]);
    run_smoke(&exe, &[&a, &b], "0.25.");
}

#[test]
#[ignore = "needs llama-cpp-sys-2's ggml build (cargo xtask test)"]
fn loads_into_ggml_0_26_api_3() {
    let out = env_path(ENV_SYS_OUT).join("lib");
    let src = env_path(ENV_SYS_SRC);
    let server = env_path(ENV_SERVER_BIN);
    let dir = scratch("host026");
    let exe = dir.join("smoke");
    let inc = format!("-I{}", src.join("ggml/include").display());
    let a = |n: &str| out.join(n).display().to_string();
    // Static ggml: -rdynamic puts its symbols where the plugin's
    // dlsym(RTLD_DEFAULT) finds them; ggml-base whole, as a shared build
    // would export it. C++ runtime and OpenMP for ggml-cpu.
    // Its registry links the static RPC backend too (GGML_USE_RPC).
    let (base, ggml, cpu, rpc) = (
        a("libggml-base.a"),
        a("libggml.a"),
        a("libggml-cpu.a"),
        a("libggml-rpc.a"),
    );
    compile(
        "smoke.c",
        &exe,
        &[
            &inc,
            "-rdynamic",
            "-Wl,--whole-archive",
            &base,
            "-Wl,--no-whole-archive",
            &ggml,
            &rpc,
            &cpu,
            &base,
            "-lstdc++",
            "-lgomp",
            "-lpthread",
            "-lm",
            "-ldl",
        ],
    );
    let a = Server::start(&server, &["--compute-in-process"]);
    run_smoke(&exe, &[&a], "0.26.");
}
