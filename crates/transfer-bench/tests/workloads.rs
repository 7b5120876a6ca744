//! The workloads (WORKLOADS.md) at smoke size as a user runs them: every
//! workload over tcp and shm with one process per rank, kv under a
//! torchrun-style launch, and kv across two network namespaces (root
//! only). A run whose bytes do not check out exits non-zero, so each
//! passing run here also passed its byte checks.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{Guard, wait};

const BENCH: &str = env!("CARGO_BIN_EXE_transfer-bench");

fn provider_available(p: &str) -> bool {
    match transfer_efa::Library::load() {
        Ok(_) => true,
        Err(e) => {
            transfer_core::testing::skip_or_fail(p, e);
            false
        }
    }
}

fn out_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("transfer-bench-wl-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn finish(g: Guard, limit: Duration, what: &str) -> Output {
    let out = wait(g, Instant::now() + limit, what);
    assert!(
        out.status.success(),
        "{what}: {}\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn spawn(cmd: &mut Command) -> Guard {
    Guard(Some(
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ))
}

/// Every record of `engine` for `workload` in `dir`, as JSON values.
fn records(dir: &Path, engine: &str, workload: &str, transport: &str) -> Vec<serde_json::Value> {
    let f = dir.join(format!("{engine}-{workload}-{transport}.jsonl"));
    let text = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn check_ours(dir: &Path, workload: &str, transport: &str, metrics: &[&str]) {
    let ours = records(dir, "ours", workload, transport);
    for m in metrics {
        let r = ours
            .iter()
            .find(|r| r["metric"] == *m)
            .unwrap_or_else(|| panic!("no {m} record in {ours:?}"));
        assert_eq!(r["verified"], true, "{r}");
        assert_eq!(r["transport"], transport, "{r}");
        let v = r["value"].as_f64().unwrap();
        assert!(v.is_finite() && v > 0.0, "{r}");
    }
    let bound = records(dir, "bound", workload, transport);
    assert!(bound.iter().any(|r| r["metric"] == metrics[0]), "{bound:?}");
}

fn run_all(provider: &str) {
    if !provider_available(provider) {
        return;
    }
    let out = out_dir(provider);
    finish(
        spawn(
            Command::new(BENCH)
                .args([
                    "workloads",
                    "run",
                    "--smoke",
                    "--no-report",
                    "--provider",
                    provider,
                ])
                .arg("--out-dir")
                .arg(&out),
        ),
        Duration::from_secs(120),
        "workloads run",
    );
    check_ours(&out, "kv", provider, &["ttll_us", "kv_gbps"]);
    check_ours(&out, "weights", provider, &["update_s", "frac_of_bound"]);
    check_ours(&out, "moe", provider, &["dispatch_us", "combine_us"]);
    // A peer's file in the directory shows up in the report with its ratio.
    std::fs::write(
        out.join("openmpi-moe-tcp.jsonl"),
        "{\"workload\":\"moe\",\"engine\":\"openmpi\",\"transport\":\"tcp\",\"config\":\"btl tcp\",\
         \"params\":{\"experts\":16,\"hidden\":512,\"ranks\":4,\"seed\":1,\"tokens\":8,\"topk\":4},\
         \"metric\":\"dispatch_us\",\"value\":1e9,\"unit\":\"us\",\"p10\":null,\"p90\":null,\
         \"repeats\":5,\"verified\":true,\"note\":\"\"}\n",
    )
    .unwrap();
    let rep = finish(
        spawn(
            Command::new(BENCH)
                .args(["workloads", "report", "--dir"])
                .arg(&out),
        ),
        Duration::from_secs(60),
        "workloads report",
    );
    let text = String::from_utf8_lossy(&rep.stdout);
    for w in ["### kv", "### weights", "### moe"] {
        assert!(text.contains(w), "{text}");
    }
    if provider == "tcp" {
        assert!(text.contains("(openmpi)"), "the peer's ratio: {text}");
    }
    assert!(out.join("report.md").exists());
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn every_workload_over_tcp() {
    run_all("tcp");
}

#[test]
fn every_workload_over_shm() {
    run_all("shm");
}

/// kv as two ranks of a torchrun-style job (rank 0 coordinates too).
#[test]
fn kv_under_a_launcher() {
    if !provider_available("tcp") {
        return;
    }
    let out = out_dir("launch");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let rank = |r: &str| {
        spawn(
            Command::new(BENCH)
                .args([
                    "workloads",
                    "launch",
                    "--workload",
                    "kv",
                    "--smoke",
                    "--provider",
                    "tcp",
                ])
                .arg("--out-dir")
                .arg(&out)
                .env("RANK", r)
                .env("WORLD_SIZE", "2")
                .env("LOCAL_RANK", r)
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .env_remove("TRANSFER_RANK")
                .env_remove("TRANSFER_WORLD_SIZE")
                .env_remove("TRANSFER_RENDEZVOUS")
                .env_remove("TORCHELASTIC_USE_AGENT_STORE"),
        )
    };
    let one = rank("1");
    let zero = rank("0");
    finish(zero, Duration::from_secs(120), "rank 0");
    finish(one, Duration::from_secs(30), "rank 1");
    check_ours(&out, "kv", "tcp", &["ttll_us", "kv_gbps"]);
    let ours = records(&out, "ours", "kv", "tcp");
    assert!(
        ours[0]["config"].as_str().unwrap().contains("torchrun"),
        "{ours:?}"
    );
    let _ = std::fs::remove_dir_all(&out);
}

/// Namespaces of this test, removed on every exit path.
struct Netns(Vec<String>);

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

fn sh(args: &[&str]) -> bool {
    Command::new(args[0])
        .args(&args[1..])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// kv between two network-namespace hosts joined by a veth pair (each
/// rank in its own namespace, the bound probed on that link). Needs root
/// and `ip netns`; skipped with the reason otherwise.
#[test]
fn kv_across_two_namespace_hosts() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: kv over network namespaces needs root");
        return;
    }
    if !sh(&["ip", "netns", "list"]) {
        eprintln!("skipped: no `ip netns` on this machine");
        return;
    }
    if !provider_available("tcp") {
        return;
    }
    let id = std::process::id() % 100_000;
    let (a, b) = (format!("xtw{id}a"), format!("xtw{id}b"));
    let guard = Netns(vec![a.clone(), b.clone()]);
    let (va, vb) = (format!("vw{id}a"), format!("vw{id}b"));
    let net = 100 + id % 100;
    let (ipa, ipb) = (format!("10.79.{net}.1"), format!("10.79.{net}.2"));
    for cmd in [
        vec!["ip", "netns", "add", &a],
        vec!["ip", "netns", "add", &b],
        vec!["ip", "-n", &a, "link", "set", "lo", "up"],
        vec!["ip", "-n", &b, "link", "set", "lo", "up"],
        vec![
            "ip", "link", "add", &va, "netns", &a, "type", "veth", "peer", "name", &vb, "netns", &b,
        ],
    ] {
        assert!(sh(&cmd), "{cmd:?}");
    }
    let ca = format!("{ipa}/24");
    let cb = format!("{ipb}/24");
    for cmd in [
        vec!["ip", "-n", &a, "addr", "add", &ca, "dev", &va],
        vec!["ip", "-n", &b, "addr", "add", &cb, "dev", &vb],
        vec!["ip", "-n", &a, "link", "set", &va, "up"],
        vec!["ip", "-n", &b, "link", "set", &vb, "up"],
    ] {
        assert!(sh(&cmd), "{cmd:?}");
    }
    let out = out_dir("netns");
    let hosts = format!("{a}={ipa},{b}={ipb}");
    finish(
        spawn(
            Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &a,
                    BENCH,
                    "workloads",
                    "run",
                    "--workload",
                    "kv",
                ])
                .args([
                    "--smoke",
                    "--no-report",
                    "--provider",
                    "tcp",
                    "--netns-hosts",
                    &hosts,
                ])
                .arg("--out-dir")
                .arg(&out),
        ),
        Duration::from_secs(120),
        "workloads run over netns",
    );
    check_ours(&out, "kv", "netns-tcp", &["ttll_us", "kv_gbps"]);
    let bound = records(&out, "bound", "kv", "netns-tcp");
    assert!(
        bound[0]["config"].as_str().unwrap().contains("shaped link"),
        "{bound:?}"
    );
    drop(guard);
    let _ = std::fs::remove_dir_all(&out);
}
