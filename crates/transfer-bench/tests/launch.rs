//! `transfer-bench launch` as a launcher would start it: two processes
//! with torchrun-style variables over the tcp provider on loopback. Rank 0
//! must drive rank 1 through every sweep and write its results.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{Guard, wait};

const BENCH: &str = env!("CARGO_BIN_EXE_transfer-bench");

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn tcp_available() -> bool {
    match transfer_efa::Library::load() {
        Ok(_) => true,
        Err(e) => {
            transfer_core::testing::skip_or_fail("tcp", e);
            false
        }
    }
}

/// Starts both ranks (rank 1 first: it must wait for rank 0) and returns
/// rank 0's stdout.
fn launch(mode: &str, out: &Path, limit: Duration) -> String {
    let port = free_port().to_string();
    let spawn = |rank: &str| {
        let c = Command::new(BENCH)
            .args(["launch", "--mode", mode, "--provider", "tcp"])
            .args(["--rendezvous-timeout", "60"])
            .arg("--out")
            .arg(out)
            .env("RANK", rank)
            .env("WORLD_SIZE", "2")
            .env("LOCAL_RANK", rank)
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", &port)
            // The children must not pick up a launcher this test runs under.
            .env_remove("TRANSFER_RANK")
            .env_remove("TRANSFER_WORLD_SIZE")
            .env_remove("TRANSFER_RENDEZVOUS")
            .env_remove("TORCHELASTIC_USE_AGENT_STORE")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Guard(Some(c))
    };
    let server = spawn("1");
    std::thread::sleep(Duration::from_millis(300));
    let driver = spawn("0");
    let deadline = Instant::now() + limit;
    let d = wait(driver, deadline, "rank 0");
    let s = wait(server, deadline, "rank 1");
    let text = |o: &Output| {
        format!(
            "{}\n--- stderr ---\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    assert!(d.status.success(), "rank 0: {}\n{}", d.status, text(&d));
    assert!(s.status.success(), "rank 1: {}\n{}", s.status, text(&s));
    let err = String::from_utf8_lossy(&s.stderr);
    assert!(err.contains("rank 1 of 2 (torchrun)"), "{err}");
    String::from_utf8_lossy(&d.stdout).into_owned()
}

fn check(stdout: &str, out: &Path) {
    assert!(
        stdout.contains("launch (torchrun): driver + 1 server rank(s)"),
        "{stdout}"
    );
    for sweep in [
        "write_bw",
        "write_lat",
        "paged",
        "scatter",
        "barrier",
        "send_recv",
    ] {
        assert!(stdout.contains(sweep), "no {sweep} row:\n{stdout}");
    }
    let json = std::fs::read_to_string(out.join("results.json")).unwrap();
    assert!(json.contains("\"layout\": \"launch (torchrun)"), "{json}");
}

fn out_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("transfer-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// The CI check: `--mode smoke` (about 20 s here in a debug build).
#[test]
fn two_ranks_torchrun_style_over_tcp() {
    if !tcp_available() {
        return;
    }
    let out = out_dir("launch-smoke");
    let stdout = launch("smoke", &out, Duration::from_secs(240));
    check(&stdout, &out);
    let _ = std::fs::remove_dir_all(&out);
}

/// `--quick` proper: 58-85 s in a debug build on this 2-core machine, at
/// or over the ~60 s a CI test may take; run it with `--ignored`.
#[test]
#[ignore = "58-85 s in a debug build here; the smoke-mode test covers the launch path"]
fn two_ranks_quick_mode() {
    if !tcp_available() {
        return;
    }
    let out = out_dir("launch-quick");
    let stdout = launch("quick", &out, Duration::from_secs(600));
    check(&stdout, &out);
    let _ = std::fs::remove_dir_all(&out);
}

/// A rank whose rank 0 never comes up fails within its rendezvous deadline
/// and says what it waited for; a world of one is refused up front.
#[test]
fn lonely_ranks_fail_clearly() {
    if !tcp_available() {
        return;
    }
    let port = free_port().to_string();
    let run = |rank: &str, world: &str| {
        let start = Instant::now();
        let c = Command::new(BENCH)
            .args(["launch", "--mode", "smoke", "--provider", "tcp"])
            .args(["--rendezvous-timeout", "2"])
            .env("TRANSFER_RANK", rank)
            .env("TRANSFER_WORLD_SIZE", world)
            .env("TRANSFER_RENDEZVOUS", format!("127.0.0.1:{port}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = wait(Guard(Some(c)), start + Duration::from_secs(60), "rank");
        assert!(!out.status.success());
        (
            String::from_utf8_lossy(&out.stderr).into_owned(),
            start.elapsed(),
        )
    };
    let (err, took) = run("1", "2");
    assert!(err.contains("connect to rank 0"), "{err}");
    assert!(took < Duration::from_secs(30), "{took:?}");
    let (err, _) = run("0", "2");
    assert!(err.contains("missing ranks [1]"), "{err}");
    let (err, _) = run("0", "1");
    assert!(
        err.contains("needs a driver and at least one server"),
        "{err}"
    );
}
