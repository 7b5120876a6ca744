//! `cargo xtask bench llama-plugin`: unmodified `llama-bench --rpc` with
//! the stock `libggml-rpc.so` against the same program with our plugin
//! (`libggml-rpc-trpc.so`, stage boundaries server to server), over the
//! same `transfer-rpc-server`s, each on its own network-namespace host, the
//! client's link shaped (tbf `--rate`; `--delay` through this xtask's delay
//! proxy on the client's host, since this kernel lacks sch_netem; the
//! plugin is told where the servers reach each other with
//! TRANSFER_RPC_PEER_MAP). Arms per round, interleaved: stock, ours with
//! COPY_TENSOR_TO (`TRANSFER_RPC_ENGINE=0`; the destination waits on its
//! server for the copy, MARK_WAIT), with `--answered` the same without marks
//! (each copy answered to the client first), and with `--engine` ours over
//! the servers' engines (ENGINE_WRITE). Prints tokens/s (median of the
//! rounds) and ours/stock per test. `--arm-env K=V,...` adds the direct
//! arm with those variables set (an A/B of a switch in the same build),
//! `--trace FILE` writes the timeline of every arm (TRANSFER_RPC_TRACE,
//! servers with `-v`), `XTASK_NETNS_PREFIX` renames the namespaces (two
//! people on one machine).
//!
//! Root (network namespaces). Its namespaces are `xtp-*` on 10.78.0.0/24,
//! apart from `bench rpc`'s `xtb-*`, so the two can run side by side.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::netns::{Children, run_cmd, words};
use crate::step;

/// Prefix of this bench's namespaces; `XTASK_NETNS_PREFIX` overrides it so
/// that two people benchmarking on one machine do not delete each other's.
fn prefix() -> String {
    std::env::var("XTASK_NETNS_PREFIX")
        .ok()
        .filter(|p| !p.is_empty() && p.len() <= 6 && p.chars().all(|c| c.is_ascii_alphanumeric()))
        .unwrap_or_else(|| "xtp".into())
}
const SERVER_PORT: u16 = 50052;
const PROXY_BASE_PORT: u16 = 51000;

fn ns(i: usize) -> String {
    format!("{}-h{i}", prefix())
}

fn sw() -> String {
    format!("{}-sw", prefix())
}

fn ip(i: usize) -> String {
    format!("10.78.0.{}", i + 1)
}

struct Args {
    llama_bin: PathBuf,
    servers: Vec<usize>,
    rate: Option<String>,
    delay: Option<String>,
    rounds: usize,
    engine: bool,
    pp: usize,
    tg: usize,
    reps: usize,
    threads: usize,
    model: Option<PathBuf>,
    plugin: Option<PathBuf>,
    /// Server and plugin in the dev profile with transfer-rpc (and the
    /// plugin) optimised, no debug assertions: reuses `cargo xtask test`'s
    /// ggml build in target/rpc-upstream instead of a release one.
    dev: bool,
    /// Also the COPY_TENSOR_TO arm without marks (`TRANSFER_RPC_MARKS=0`:
    /// each copy answered to the client before the destination goes on).
    answered: bool,
    /// `TRANSFER_RPC_TRACE` for the servers (with `-v`) and llama-bench:
    /// one timeline of every command (see transfer_rpc::client::trace).
    trace: Option<PathBuf>,
    /// `--arm-env K=V[,K=V]`: one more arm, the direct one with these
    /// variables set (an A/B of a plugin or client switch in one build).
    arm_env: Vec<(String, String)>,
}

const USAGE: &str = "bench llama-plugin [--llama-bin DIR] [--servers 2,4] [--rate 100mbit] \
     [--delay 1ms] [--rounds 3] [--engine] [--pp 64] [--tg 32] [--reps 2] [--threads 1] \
     [--model F] [--plugin libtransfer_ggml_plugin.so] [--dev] [--answered] [--trace FILE] [--arm-env K=V,...]";

fn parse(args: &[String]) -> Result<Args, String> {
    let mut a = Args {
        llama_bin: PathBuf::from("/work/llama-build/bin"),
        servers: vec![2, 4],
        rate: None,
        delay: None,
        rounds: 3,
        engine: false,
        pp: 64,
        tg: 32,
        reps: 2,
        threads: 1,
        model: None,
        plugin: None,
        dev: false,
        answered: false,
        trace: None,
        arm_env: Vec::new(),
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if flag == "--engine" {
            a.engine = true;
            continue;
        }
        if flag == "--dev" {
            a.dev = true;
            continue;
        }
        if flag == "--answered" {
            a.answered = true;
            continue;
        }
        let v = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\nusage: {USAGE}"))?;
        let num = |v: &str| v.parse::<usize>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--llama-bin" => a.llama_bin = v.into(),
            "--servers" => {
                a.servers = v.split(',').map(num).collect::<Result<_, _>>()?;
                if a.servers.iter().any(|&n| !(2..=8).contains(&n)) {
                    return Err("--servers: 2..=8 each".into());
                }
            }
            "--rate" => a.rate = Some(v.clone()),
            "--delay" => a.delay = Some(v.clone()),
            "--rounds" => a.rounds = num(v)?.max(1),
            "--pp" => a.pp = num(v)?,
            "--tg" => a.tg = num(v)?,
            "--reps" => a.reps = num(v)?.max(1),
            "--threads" => a.threads = num(v)?.max(1),
            "--model" => a.model = Some(v.into()),
            "--plugin" => a.plugin = Some(v.into()),
            "--trace" => a.trace = Some(v.into()),
            "--arm-env" => {
                for kv in v.split(',').filter(|kv| !kv.is_empty()) {
                    let (k, val) = kv
                        .split_once('=')
                        .ok_or_else(|| format!("--arm-env {kv}: not K=V"))?;
                    a.arm_env.push((k.to_owned(), val.to_owned()));
                }
            }
            other => return Err(format!("unknown option `{other}`\nusage: {USAGE}")),
        }
    }
    Ok(a)
}

/// Removes this bench's namespaces (also stale ones) when dropped.
struct Lab;

fn cleanup() {
    if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
        for l in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some(name) = l.split_whitespace().next()
                && name.starts_with(&format!("{}-", prefix()))
            {
                let _ = run_cmd(&words(&format!("ip netns del {name}")));
            }
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        cleanup();
    }
}

/// Namespaces: the client on host 0, server `s` on host `s`, a bridge; the
/// client's link shaped both ways with `rate` (tbf).
fn setup(n: usize, rate: Option<&str>) -> Vec<Vec<String>> {
    let sw = sw();
    let mut lines = vec![
        format!("ip netns add {sw}"),
        format!("ip -n {sw} link set lo up"),
        format!("ip -n {sw} link add br0 type bridge"),
        format!("ip -n {sw} link set br0 up"),
    ];
    for i in 0..=n {
        let h = ns(i);
        lines.extend([
            format!("ip netns add {h}"),
            format!("ip -n {h} link set lo up"),
            format!("ip link add eth{i} netns {h} type veth peer name port{i} netns {sw}"),
            format!("ip -n {h} addr add {}/24 dev eth{i}", ip(i)),
            format!("ip -n {h} link set eth{i} up"),
            format!("ip -n {sw} link set port{i} master br0"),
            format!("ip -n {sw} link set port{i} up"),
        ]);
    }
    if let Some(r) = rate {
        for (space, dev) in [(ns(0), "eth0"), (sw.clone(), "port0")] {
            lines.push(format!(
                "ip netns exec {space} tc qdisc add dev {dev} root tbf rate {r} burst 256kbit latency 100ms"
            ));
        }
    }
    lines.iter().map(|l| words(l)).collect()
}

/// Waits until host 0 connects to `addr` (deadline 30 s).
fn reachable(addr: &str) -> Result<(), String> {
    let (host, port) = addr.rsplit_once(':').ok_or("bad address")?;
    let t = Instant::now();
    loop {
        let ok = Command::new("ip")
            .args(["netns", "exec", &ns(0), "bash", "-c"])
            .arg(format!("exec 3<>/dev/tcp/{host}/{port}"))
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Ok(());
        }
        if t.elapsed() > Duration::from_secs(30) {
            return Err(format!("{addr} not reachable from {} within 30 s", ns(0)));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Arm {
    Stock,
    Direct,
    Answered,
    Engine,
    /// Direct with `--arm-env`'s variables.
    DirectEnv,
}

impl Arm {
    fn name(self) -> &'static str {
        match self {
            Arm::Stock => "stock",
            Arm::Direct => "direct",
            Arm::Answered => "answered",
            Arm::Engine => "engine",
            Arm::DirectEnv => "direct+env",
        }
    }
}

/// `(test, tokens/s)` of one `llama-bench -o csv` run on host 0, in `cwd`
/// (the loader finds the plugin there, or only the stock library).
fn llama_bench(
    a: &Args,
    model: &Path,
    cwd: &Path,
    rpc: &str,
    env: &[(&str, String)],
    want_plugin: bool,
) -> Result<Vec<(String, f64)>, String> {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &ns(0)])
        .arg(a.llama_bin.join("llama-bench"))
        .current_dir(cwd)
        .arg("-m")
        .arg(model)
        .args(["--rpc", rpc, "-ngl", "99", "-o", "csv"])
        .args(["-p", &a.pp.to_string(), "-n", &a.tg.to_string()])
        .args(["-r", &a.reps.to_string(), "-t", &a.threads.to_string()])
        .env("GGML_NO_BACKTRACE", "1")
        .env("TRANSFER_RPC_TIMEOUT_S", "120");
    if let Some(t) = &a.trace {
        cmd.env("TRANSFER_RPC_TRACE", t);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().map_err(|e| format!("llama-bench: {e}"))?;
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!("llama-bench failed: {}", err.trim()));
    }
    // Which RPC client ran: the loader says which file it loaded.
    let plugin = err.contains("libggml-rpc-trpc.so");
    if plugin != want_plugin {
        return Err(format!(
            "llama-bench in {} loaded the {} RPC client",
            cwd.display(),
            if plugin { "plugin" } else { "stock" }
        ));
    }
    crate::bench_llama::rates(&String::from_utf8_lossy(&out.stdout))
}

fn uptime() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

pub fn run(argv: &[String]) -> Result<(), String> {
    let a = parse(argv)?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // The servers: transfer-rpc-server as `cargo xtask test` builds it (same
    // target directory, features and GGML_* environment: reuses its ggml).
    let rpc_target = target.join("rpc-upstream");
    // `--dev`: as `bench llama-rpc --dev` (see bench_llama.rs: with debug
    // assertions on, the frame path's checked byte loops cost ours 0.6x of
    // stock tg through one server, ~1x without).
    let mut profile: Vec<String> = Vec::new();
    if a.dev {
        for pkg in ["transfer-rpc", "transfer-ggml-plugin"] {
            for setting in [
                "opt-level=3",
                "debug-assertions=false",
                "overflow-checks=false",
            ] {
                profile.push("--config".into());
                profile.push(format!("profile.dev.package.{pkg}.{setting}"));
            }
        }
    }
    step::run(
        "build transfer-rpc-server (ggml)",
        Command::new(&cargo)
            .args([
                "build",
                "-p",
                "transfer-rpc",
                "--features",
                "upstream-rpc,engine",
                "--bins",
            ])
            .args(&profile)
            .env("GGML_RPC", "ON")
            .env("GGML_RPC_RDMA", "OFF")
            .env("GGML_NO_BACKTRACE", "1")
            .env("CARGO_TARGET_DIR", &rpc_target),
    )?;
    let server = rpc_target.join("debug/transfer-rpc-server");
    let plugin = match &a.plugin {
        Some(p) => p.clone(),
        None if a.dev => {
            step::run(
                "build the plugin (dev, optimised)",
                Command::new(&cargo)
                    .args(["build", "-p", "transfer-ggml-plugin"])
                    .args(&profile),
            )?;
            target.join("debug/libtransfer_ggml_plugin.so")
        }
        None => {
            step::run(
                "build the plugin (release)",
                Command::new(&cargo).args(["build", "--release", "-p", "transfer-ggml-plugin"]),
            )?;
            target.join("release/libtransfer_ggml_plugin.so")
        }
    };
    let work = std::env::temp_dir().join("xtask-bench-plugin");
    let (stock_dir, ours_dir) = (work.join("stock"), work.join("ours"));
    for d in [&stock_dir, &ours_dir] {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    std::fs::copy(&plugin, ours_dir.join("libggml-rpc-trpc.so"))
        .map_err(|e| format!("copying {}: {e}", plugin.display()))?;
    let model = match &a.model {
        Some(m) => m.clone(),
        None => {
            let m = work.join("model.gguf");
            step::run(
                "write the model",
                Command::new(rpc_target.join("debug/transfer-rpc-pipeline"))
                    .args(["make-model", "--out"])
                    .arg(&m)
                    .args(["--n-embd", "512", "--n-layer", "8", "--n-ff", "1024"])
                    .args(["--n-vocab", "256"]),
            )?;
            m
        }
    };
    let xtask = std::env::current_exe().map_err(|e| format!("this executable: {e}"))?;
    crate::netns::catch_ctrl_c();
    let link = format!(
        "rate {} delay {}",
        a.rate.as_deref().unwrap_or("none"),
        a.delay.as_deref().unwrap_or("none")
    );
    println!(
        "model {}; {link}; {} rounds interleaved; llama-bench -p {} -n {} -r {} -t {}; load {}",
        model.display(),
        a.rounds,
        a.pp,
        a.tg,
        a.reps,
        a.threads,
        uptime()
    );
    let mut arms = vec![Arm::Stock, Arm::Direct];
    if a.answered {
        arms.push(Arm::Answered);
    }
    if a.engine {
        arms.push(Arm::Engine);
    }
    if !a.arm_env.is_empty() {
        arms.push(Arm::DirectEnv);
        println!("direct+env: direct with {:?}", a.arm_env);
    }
    let mut table = Vec::new();
    for &n in &a.servers {
        cleanup();
        let _lab = Lab;
        for cmd in setup(n, a.rate.as_deref()) {
            run_cmd(&cmd)?;
        }
        let mut children = Children::default();
        for s in 1..=n {
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", &ns(s)])
                .arg(&server)
                .args(["--host", &ip(s), "--port", &SERVER_PORT.to_string()])
                .args(["--threads", &a.threads.to_string(), "--compute-in-process"])
                .args(["--peer-allow", &format!("{}/24", ip(0))])
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if let Some(t) = &a.trace {
                cmd.arg("-v").env("TRANSFER_RPC_TRACE", t);
            }
            if a.engine {
                cmd.args(["--engine", "tcp", "--engine-iface", &format!("eth{s}")])
                    .args(["--engine-node", &ip(s)]);
            }
            children.0.push(
                cmd.spawn()
                    .map_err(|e| format!("{}: {e}", server.display()))?,
            );
        }
        let real: Vec<String> = (1..=n)
            .map(|s| format!("{}:{SERVER_PORT}", ip(s)))
            .collect();
        for r in &real {
            reachable(r)?;
        }
        let (eps, peer_map) = match &a.delay {
            None => (real.clone(), String::new()),
            Some(d) => {
                let proxied: Vec<String> = (1..=n)
                    .map(|s| format!("127.0.0.1:{}", PROXY_BASE_PORT as usize + s))
                    .collect();
                let map: Vec<String> = proxied
                    .iter()
                    .zip(&real)
                    .map(|(p, r)| format!("{p}={r}"))
                    .collect();
                children.0.push(
                    Command::new("ip")
                        .args(["netns", "exec", &ns(0)])
                        .arg(&xtask)
                        .args(["delay-proxy", "--delay", d, "--map", &map.join(",")])
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .map_err(|e| format!("delay proxy: {e}"))?,
                );
                for p in &proxied {
                    reachable(p)?;
                }
                (proxied, map.join(","))
            }
        };
        let rpc = eps.join(",");
        // test -> arm -> samples
        let mut got: BTreeMap<String, BTreeMap<Arm, Vec<f64>>> = BTreeMap::new();
        for round in 0..a.rounds {
            // Interleaved, and each round in another order, so that the
            // machine's load (shared with other work) hits every arm alike.
            let mut order = arms.clone();
            order.rotate_left(round % arms.len());
            for &arm in &order {
                if crate::netns::interrupted() {
                    return Err("interrupted".into());
                }
                let mut env = vec![("TRANSFER_RPC_PEER_MAP", peer_map.clone())];
                let (cwd, want_plugin) = match arm {
                    Arm::Stock => (&stock_dir, false),
                    Arm::Direct => {
                        env.push(("TRANSFER_RPC_ENGINE", "0".into()));
                        (&ours_dir, true)
                    }
                    Arm::Answered => {
                        env.push(("TRANSFER_RPC_ENGINE", "0".into()));
                        env.push(("TRANSFER_RPC_MARKS", "0".into()));
                        (&ours_dir, true)
                    }
                    Arm::Engine => (&ours_dir, true),
                    Arm::DirectEnv => {
                        env.push(("TRANSFER_RPC_ENGINE", "0".into()));
                        for (k, v) in &a.arm_env {
                            env.push((k.as_str(), v.clone()));
                        }
                        (&ours_dir, true)
                    }
                };
                for (test, v) in llama_bench(&a, &model, cwd, &rpc, &env, want_plugin)? {
                    got.entry(test).or_default().entry(arm).or_default().push(v);
                }
            }
        }
        drop(children);
        for (test, per_arm) in got {
            table.push((n, test, per_arm));
        }
    }
    println!("load after: {}", uptime());
    print!("{:>7} {:>6} {:>11}", "servers", "test", "stock t/s");
    for arm in &arms[1..] {
        print!(" {:>11} {:>7}", format!("{} t/s", arm.name()), "ratio");
    }
    println!();
    for (n, test, per_arm) in &table {
        let stock = per_arm.get(&Arm::Stock).map_or(0.0, |v| median(v));
        print!("{n:>7} {test:>6} {stock:>11.1}");
        for arm in &arms[1..] {
            let v = per_arm.get(arm).map_or(0.0, |v| median(v));
            let ratio = if stock > 0.0 { v / stock } else { 0.0 };
            print!(" {v:>11.1} {ratio:>6.2}x");
        }
        println!();
    }
    // The spread behind each median: on a shared machine one round can
    // move a row by tens of percent.
    println!("samples (t/s, per round):");
    for (n, test, per_arm) in &table {
        print!("{n:>7} {test:>6}");
        for arm in &arms {
            let v = per_arm.get(arm).cloned().unwrap_or_default();
            let v: Vec<String> = v.iter().map(|x| format!("{x:.1}")).collect();
            print!("  {}: {}", arm.name(), v.join(" "));
        }
        println!();
    }
    Ok(())
}
