//! The bench over the native verbs backend inside the soft-RoCE VM (the
//! same qemu harness as the verbs test step, `crates/transfer-verbs/vm/run.sh`):
//! `cargo xtask bench --vm`, and a smoke run in `cargo xtask test`'s VM
//! step. perftest's programs go into the VM image the way its other
//! programs do: copied from the host with their libraries (`--bin`).

use std::path::{Path, PathBuf};

use crate::{deps, step};

/// perftest on the host, copied into the VM.
pub const PERFTEST: [deps::Package; 1] = [deps::Package {
    name: "perftest",
    probes: &["/usr/bin/ib_write_lat"],
    why: "the verbs baselines of the bench (ib_write_lat, ib_write_bw, ib_send_lat), run in the soft-RoCE VM",
}];

/// The perftest programs the bench runs (crates/transfer-bench/src/baseline/perftest.rs).
pub const PERFTEST_PROGRAMS: [&str; 3] = ["ib_write_lat", "ib_write_bw", "ib_send_lat"];

/// The shell command run inside the VM: the two-process bench over verbs
/// on rxe0. The progress bars (stderr) would flood the serial console, so
/// stderr is kept in a file and shown only when the bench fails.
pub fn vm_command(mode: &str) -> String {
    // Braced so that it can follow `&&` in a longer command.
    format!(
        "{{ TRANSFER_BACKEND=verbs transfer-bench local --mode {mode} --peers 2 --out /tmp/bench \
         2>/tmp/bench.err || {{ rc=$?; cat /tmp/bench.err; exit $rc; }}; }}"
    )
}

/// `--bin` arguments of run.sh for the bench binary and perftest.
pub fn vm_bins(bench: &Path) -> Result<Vec<String>, String> {
    let mut out = vec!["--bin".to_string(), bench.to_string_lossy().into_owned()];
    for program in PERFTEST_PROGRAMS {
        out.push("--bin".into());
        out.push(find_program(program)?.to_string_lossy().into_owned());
    }
    Ok(out)
}

/// `program`'s path on this host's PATH.
pub fn find_program(program: &str) -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("{program} not found on PATH (install perftest)"))
}

/// Builds transfer-bench (`release` or debug) and returns its path.
pub fn build_bench(release: bool) -> Result<PathBuf, String> {
    let mut args = vec!["build", "-p", "transfer-bench"];
    if release {
        args.push("--release");
    }
    step::cargo("build transfer-bench", &args)?;
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let bin = Path::new(&target)
        .join(if release { "release" } else { "debug" })
        .join("transfer-bench");
    std::fs::canonicalize(&bin).map_err(|e| format!("{}: {e}", bin.display()))
}

/// `cargo xtask bench --vm`: the release bench in the VM, `mode` smoke
/// (default), quick, default or full. The table is printed on the console.
pub fn run(mode: &str) -> Result<(), String> {
    deps::ensure(&deps::VERBS_VM)?;
    deps::ensure(&PERFTEST)?;
    let bench = build_bench(true)?;
    let mut cmd = std::process::Command::new("crates/transfer-verbs/vm/run.sh");
    // Under software emulation the default mode moves ~100x more than the
    // smoke run; the harness's 280 s default would cut it short.
    if std::env::var_os("TIMEOUT").is_none() {
        cmd.env("TIMEOUT", "1800");
    }
    cmd.args(vm_bins(&bench)?).arg("--").arg(vm_command(mode));
    step::run(
        &format!("transfer-bench over verbs in the soft-RoCE VM ({mode} mode)"),
        &mut cmd,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vm_command_runs_the_verbs_bench_and_fails_with_it() {
        let c = vm_command("smoke");
        assert!(c.starts_with("{ TRANSFER_BACKEND=verbs transfer-bench local --mode smoke"));
        assert!(
            c.contains("exit $rc"),
            "a failing bench fails the VM step: {c}"
        );
    }
}
