//! `cargo xtask bench llama-rpc`: unmodified `llama-bench --rpc` over two
//! of our `transfer-rpc-server`s against two stock `rpc-server`s of the
//! llama.cpp build it comes from, and against two of ggml's rpc-servers
//! built from the ggml ours computes with, side by side in one run (rounds
//! rotate over the three, so machine load hits all alike), at each thread
//! count asked for. Prints tokens/s per test, ours/stock and
//! ours/same-ggml.
//!
//! It needs a llama.cpp build with `llama-bench` and `rpc-server` (e.g.
//! `cmake -DGGML_RPC=ON -DGGML_BACKEND_DL=ON ...`), given by `--llama-bin`.
//! The model is a small random-weight llama GGUF written by
//! `transfer-rpc-pipeline make-model` unless `--model` names one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::step;

struct Args {
    llama_bin: PathBuf,
    model: Option<PathBuf>,
    /// `None`: each side's default.
    threads: Vec<Option<usize>>,
    rounds: usize,
    /// Build our server in release (default), or in the dev profile with
    /// transfer-rpc itself optimised (reuses a dev build of ggml).
    dev: bool,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut out = Args {
        llama_bin: PathBuf::from("/work/llama-build/bin"),
        model: None,
        threads: vec![None],
        rounds: 3,
        dev: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().cloned().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--llama-bin" => out.llama_bin = value("--llama-bin")?.into(),
            "--model" => out.model = Some(value("--model")?.into()),
            "--rounds" => {
                out.rounds = value("--rounds")?
                    .parse()
                    .map_err(|e| format!("--rounds: {e}"))?;
            }
            "--threads" => {
                out.threads = value("--threads")?
                    .split(',')
                    .map(|t| match t {
                        "default" => Ok(None),
                        n => n
                            .parse()
                            .map(Some)
                            .map_err(|e| format!("--threads {n}: {e}")),
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--dev" => out.dev = true,
            other => return Err(format!("bench llama-rpc: unknown argument `{other}`")),
        }
    }
    Ok(out)
}

/// Kills its servers on drop.
struct Servers(Vec<Child>);

impl Drop for Servers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("a free port: {e}"))
}

/// Starts `program [lead...] -H 127.0.0.1 -p PORT [-t threads]`.
fn start(program: &Path, lead: &[&str], threads: Option<usize>) -> Result<(Child, String), String> {
    let port = free_port()?;
    let mut cmd = Command::new(program);
    cmd.args(lead)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(t) = threads {
        cmd.args(["-t", &t.to_string()]);
    }
    let child = cmd
        .spawn()
        .map_err(|e| format!("{}: {e}", program.display()))?;
    let ep = format!("127.0.0.1:{port}");
    let t = Instant::now();
    while std::net::TcpStream::connect(&ep).is_err() {
        if t.elapsed() > Duration::from_secs(20) {
            return Err(format!("{} did not listen on {ep}", program.display()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok((child, ep))
}

/// The fields of one CSV line (quoted fields may hold commas).
pub(crate) fn csv_fields(line: &str) -> Vec<String> {
    let (mut out, mut cur, mut quoted) = (Vec::new(), String::new(), false);
    for ch in line.chars() {
        match ch {
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// `(test, tokens/s)` rows of one `llama-bench -o csv` run.
fn llama_bench(
    bin: &Path,
    model: &Path,
    rpc: &str,
    threads: Option<usize>,
) -> Result<Vec<(String, f64)>, String> {
    let mut cmd = Command::new(bin.join("llama-bench"));
    cmd.arg("-m").arg(model).args([
        "--rpc", rpc, "-ngl", "99", "-p", "64", "-n", "64", "-r", "3", "-o", "csv",
    ]);
    if let Some(t) = threads {
        cmd.args(["-t", &t.to_string()]);
    }
    let out = cmd.output().map_err(|e| format!("llama-bench: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "llama-bench failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    rates(&String::from_utf8_lossy(&out.stdout))
}

pub fn run(args: &[String]) -> Result<(), String> {
    let a = parse(args)?;
    for need in ["llama-bench", "rpc-server"] {
        let p = a.llama_bin.join(need);
        let alt = a.llama_bin.join(format!("ggml-{need}"));
        if !p.is_file() && !alt.is_file() {
            return Err(format!("{} is missing (--llama-bin)", p.display()));
        }
    }
    let stock = ["rpc-server", "ggml-rpc-server"]
        .iter()
        .map(|n| a.llama_bin.join(n))
        .find(|p| p.is_file())
        .ok_or("no rpc-server")?;
    // Built exactly as `cargo xtask test` builds transfer-rpc with ggml
    // (same target directory, GGML_* environment and features), so that
    // its ggml build is reused: another feature set rebuilds ggml.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), PathBuf::from)
        .join("rpc-upstream");
    let mut build = vec![
        "build",
        "-p",
        "transfer-rpc",
        "--features",
        "upstream-rpc,engine",
        "--bins",
    ];
    // `--dev`: transfer-rpc optimised as in release, debug assertions and
    // overflow checks included: with them on, every `Vec::resize` in the
    // frame path is a checked byte loop (perf, llama-bench tg64 through one
    // server: 26 % of the server's samples in `Vec::extend_with` under
    // SET_TENSOR; ours/stock tg 0.6x with them, ~1x without).
    if a.dev {
        build.extend([
            "--config",
            "profile.dev.package.transfer-rpc.opt-level=3",
            "--config",
            "profile.dev.package.transfer-rpc.debug-assertions=false",
            "--config",
            "profile.dev.package.transfer-rpc.overflow-checks=false",
        ]);
    } else {
        build.push("--release");
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    step::run(
        "build transfer-rpc-server (ggml)",
        Command::new(cargo)
            .args(&build)
            .env("GGML_RPC", "ON")
            .env("GGML_RPC_RDMA", "OFF")
            .env("GGML_NO_BACKTRACE", "1")
            .env("CARGO_TARGET_DIR", &dir),
    )?;
    let target = dir.join(if a.dev { "debug" } else { "release" });
    let ours = target.join("transfer-rpc-server");
    let model = match &a.model {
        Some(m) => m.clone(),
        None => {
            let m = std::env::temp_dir().join("xtask-llama-rpc.gguf");
            step::run(
                "write the model",
                Command::new(target.join("transfer-rpc-pipeline"))
                    .args(["make-model", "--out"])
                    .arg(&m)
                    .args([
                        "--n-embd",
                        "256",
                        "--n-layer",
                        "8",
                        "--n-ff",
                        "768",
                        "--n-vocab",
                        "256",
                    ]),
            )?;
            m
        }
    };
    println!(
        "model {}; {} rounds, alternating",
        model.display(),
        a.rounds
    );
    // Three sides, rounds alternating: the llama.cpp tree's own
    // rpc-server (its ggml), ggml's rpc-server compiled from the ggml ours
    // computes with (`transfer-rpc-pipeline upstream-server`), and ours.
    // ours / same-ggml is the server's own cost; stock / same-ggml is the
    // difference between the two ggml versions.
    let pipeline = target.join("transfer-rpc-pipeline");
    let sides: [(&str, &Path, &[&str]); 3] = [
        ("stock", stock.as_path(), &[]),
        ("same-ggml", pipeline.as_path(), &["upstream-server"]),
        ("ours", ours.as_path(), &[]),
    ];
    println!(
        "stock = {}; same-ggml = ggml's rpc-server built from the ggml ours computes with",
        stock.display()
    );
    println!(
        "{:>8} {:>6} {:>12} {:>12} {:>12} {:>11} {:>15}",
        "threads", "test", "stock t/s", "same-ggml", "ours t/s", "ours/stock", "ours/same-ggml"
    );
    for &threads in &a.threads {
        let mut children = Servers(Vec::new());
        let mut eps: [Vec<String>; 3] = Default::default();
        for (side, (_, program, lead)) in sides.iter().enumerate() {
            for _ in 0..2 {
                let (c, ep) = start(program, lead, threads)?;
                children.0.push(c);
                eps[side].push(ep);
            }
        }
        // test -> samples per side
        let mut got: BTreeMap<String, [Vec<f64>; 3]> = BTreeMap::new();
        let label = threads.map_or("default".to_string(), |t| t.to_string());
        for round in 0..a.rounds {
            // Each round's figures and the load average it ran at, so that
            // a low round can be told apart from a slow server. The order
            // of the sides rotates per round.
            let mut line = format!("  {label} round {round}:");
            for k in 0..sides.len() {
                let side = (round + k) % sides.len();
                line.push_str(&format!(" | {}", sides[side].0));
                for (test, v) in llama_bench(&a.llama_bin, &model, &eps[side].join(","), threads)? {
                    line.push_str(&format!(" {test} {v:.1}"));
                    got.entry(test).or_default()[side].push(v);
                }
            }
            println!("{line} | load {}", load_average());
        }
        drop(children);
        for (test, samples) in &got {
            let med = |v: &[f64]| {
                let mut v = v.to_vec();
                v.sort_by(f64::total_cmp);
                v.get(v.len() / 2).copied().unwrap_or(0.0)
            };
            let [s, g, o] = [med(&samples[0]), med(&samples[1]), med(&samples[2])];
            let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
            println!(
                "{label:>8} {test:>6} {s:>12.1} {g:>12.1} {o:>12.1} {:>10.2}x {:>14.2}x",
                ratio(o, s),
                ratio(o, g)
            );
        }
    }
    Ok(())
}

/// The 1-minute load average (`/proc/loadavg`), or `?`.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// The (test, tokens/s) rows of llama-bench's `-o csv` output: `ppN` for a
/// prompt run, `tgN` for a generation run, from its `avg_ts` column.
pub fn rates(text: &str) -> Result<Vec<(String, f64)>, String> {
    let mut lines = text.lines();
    let header = csv_fields(lines.next().ok_or("llama-bench printed nothing")?);
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .ok_or(format!("llama-bench csv has no {name}"))
    };
    let (np, ng, ts) = (col("n_prompt")?, col("n_gen")?, col("avg_ts")?);
    let mut rows = Vec::new();
    for line in lines {
        let f = csv_fields(line);
        let get = |i: usize| f.get(i).map_or("", String::as_str);
        let test = if get(ng) == "0" {
            format!("pp{}", get(np))
        } else {
            format!("tg{}", get(ng))
        };
        let v: f64 = get(ts)
            .parse()
            .map_err(|e| format!("avg_ts {}: {e}", get(ts)))?;
        rows.push((test, v));
    }
    Ok(rows)
}
