//! The default run: a server child process on this machine, this process as the driver.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::backend::BackendOpts;
use crate::error::{BenchError, Result, io, protocol};
use crate::plan::Plan;
use crate::results::Results;

/// Kills the child on every exit path.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// Starts `transfer-bench serve` as a child and returns its side-channel address.
fn spawn_server(opts: &BackendOpts, plan: &Plan, engines: usize) -> Result<(ChildGuard, String)> {
    let exe = std::env::current_exe().map_err(io("current_exe"))?;
    let mut cmd = Command::new(exe);
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--once",
        "--engines",
        &engines.to_string(),
    ])
    .args([
        "--region-len",
        &plan.region_len.to_string(),
        "--nics",
        &opts.nics.to_string(),
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    // The child opens exactly what this process resolved (no detection).
    let explicit = [
        ("--backend", &opts.backend),
        ("--provider", &opts.provider),
        ("--verbs-device", &opts.verbs_device),
    ];
    for (flag, value) in explicit {
        if let Some(v) = value {
            cmd.args([flag, v]);
        }
    }
    let mut child = cmd.spawn().map_err(io("spawn server"))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| protocol("server", "no stdout"))?;
    let guard = ChildGuard(child);
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(io("read server address"))?;
    let addr = line
        .trim()
        .strip_prefix("listening ")
        .ok_or_else(|| protocol("server", format!("unexpected first line {line:?}")))?
        .to_string();
    Ok((guard, addr))
}

/// Runs the two-process bench on this machine.
pub fn run(opts: &BackendOpts, plan: &Plan, peers: usize, out: &Path) -> Result<Results> {
    let (mut server, addr) = spawn_server(opts, plan, peers)?;
    let res = crate::run::drive(
        &[addr],
        opts,
        plan,
        out,
        "local: 2 processes on this machine",
    )?;
    match server.0.wait() {
        Ok(s) if s.success() => Ok(res),
        Ok(s) => Err(BenchError::Usage(format!("server exited with {s}"))),
        Err(e) => Err(io("wait for server")(e)),
    }
}
