//! `cargo xtask bench rpc`: the transfer-rpc pipeline (a coordinator running
//! a llama-architecture model layer-split over P RPC servers) in three arms
//! — hub, direct, engine — on P+1 network-namespace hosts of this machine,
//! the coordinator's link shaped to be the bottleneck.
//!
//! Plans, schedule and arithmetic are pure (unit-tested in the submodules);
//! this file only executes them.

mod args;
mod delay;
pub mod delay_proxy;
pub mod json;
mod lab;
pub mod link_probe;
mod report;
mod schedule;
mod svg;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::netns::{self, Children, Lab};
use crate::{deps, step};

use args::{Arm, RpcArgs};
use json::Json;
use lab::EngineFlags;
use report::Sample;
use schedule::Run;

/// The workspace root (xtask lives one level below it).
fn workspace() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent().unwrap_or(here).to_path_buf()
}

fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => PathBuf::from(d),
        None => workspace().join("target"),
    }
}

fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// Runs `cmd`, returning its stdout; fails with stderr.
fn output(cmd: &[String]) -> Result<String, String> {
    let (prog, rest) = cmd.split_first().ok_or("empty command")?;
    let out = Command::new(prog)
        .args(rest)
        .output()
        .map_err(|e| format!("{}: {e}", cmd.join(" ")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "`{}` failed ({}): {}",
            cmd.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Fails clearly when netem cannot work on this kernel.
fn check_netem() -> Result<(), String> {
    netns::cleanup_namespaces();
    let result = netns::netem_probe()
        .iter()
        .try_for_each(|c| netns::run_cmd(c));
    netns::cleanup_namespaces();
    result.map_err(|e| {
        format!(
            "--delay-mode netem needs the sch_netem kernel module, and this kernel has none:\n    {e}\n\
             Use --delay-mode proxy (or auto, the default: the user-space delay proxy), run \
             without --delay, or on a kernel with sch_netem (`modprobe sch_netem`)."
        )
    })
}

/// The folder of the release binaries: `bin_dir` as given, or built.
fn build(bin_dir: Option<&str>) -> Result<PathBuf, String> {
    if let Some(dir) = bin_dir {
        return Ok(PathBuf::from(dir));
    }
    eprintln!(
        "==> building transfer-rpc (ggml, engine) in release: the first build compiles \
         the vendored llama.cpp and takes ~5 min on 2 cores"
    );
    step::cargo(
        "build transfer-rpc",
        &[
            "build",
            "--release",
            "-p",
            "transfer-rpc",
            "--features",
            "ggml,engine",
            "--bins",
        ],
    )?;
    Ok(target_dir().join("release"))
}

fn binary(dir: &Path, name: &str) -> Result<PathBuf, String> {
    let p = dir.join(name);
    std::fs::canonicalize(&p).map_err(|e| format!("{}: {e}", p.display()))
}

/// Reads the server's engine flags and refuses the engine arm without them.
fn engine_flags(server: &Path, a: &RpcArgs) -> Result<EngineFlags, String> {
    let help = output(&[path_str(server), "--help".into()])?;
    let flags = EngineFlags::from_help(&help);
    if a.arms.contains(&Arm::Engine) && !flags.engine {
        return Err(format!(
            "{} has no --engine flag (built without the engine link?); \
             run with --arms hub,direct or rebuild it with --features ggml,engine",
            server.display()
        ));
    }
    Ok(flags)
}

/// Retries `cmd` until it succeeds or `within` passes.
fn retry(cmd: &[String], within: Duration) -> Result<(), String> {
    let deadline = Instant::now() + within;
    loop {
        match netns::run_cmd(cmd) {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

fn spawn_logged(cmd: &[String], log: &Path) -> Result<std::process::Child, String> {
    let (prog, rest) = cmd.split_first().ok_or("empty command")?;
    let f = File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let f2 = f
        .try_clone()
        .map_err(|e| format!("{}: {e}", log.display()))?;
    Command::new(prog)
        .args(rest)
        .stdin(Stdio::null())
        .stdout(f)
        .stderr(f2)
        .spawn()
        .map_err(|e| format!("{}: {e}", cmd.join(" ")))
}

/// Measures one direction of a link with the link probe, in bit/s.
fn measure_link(from: usize, to: usize, bytes: u64) -> Result<f64, String> {
    let me = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let (sink, send) = lab::link_probe(&path_str(&me), from, to, bytes);
    let (prog, rest) = sink.split_first().ok_or("empty command")?;
    let sink = Command::new(prog)
        .args(rest)
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("link probe sink: {e}"))?;
    let _guard = Children(vec![sink]);
    let out = output(&send)?;
    link_probe::parse_rate(&out).ok_or_else(|| format!("link probe: odd output `{out}`"))
}

fn mbit(bits: f64) -> String {
    format!("{:.1} Mbit/s", bits / 1e6)
}

/// Measures the shaped link both ways and one unshaped server link.
fn check_links(a: &RpcArgs) -> Result<Json, String> {
    let shaped = lab::rate_bits(&a.rate);
    // About half a second of traffic at the shaped rate, within 1-32 MiB.
    let bytes = shaped
        .map(|b| (b / 8.0 * 0.5) as u64)
        .unwrap_or(8 << 20)
        .clamp(1 << 20, 32 << 20);
    let up = measure_link(0, 1, bytes)?;
    let down = measure_link(1, 0, bytes)?;
    let servers = measure_link(1, 2, 32 << 20)?;
    eprintln!(
        "==> links: coordinator->server {}, server->coordinator {} (shaped to {}); \
         server->server {} (unshaped)",
        mbit(up),
        mbit(down),
        a.rate,
        mbit(servers)
    );
    if let Some(limit) = shaped {
        // tbf lets a burst through; more than 1.3x the rate means no shaping.
        if up > limit * 1.3 || down > limit * 1.3 {
            return Err(format!(
                "the coordinator link is not shaped: measured {} / {} for {}",
                mbit(up),
                mbit(down),
                a.rate
            ));
        }
    }
    let mut m = std::collections::BTreeMap::new();
    m.insert("coordinator_to_server_bits_per_s".into(), Json::Num(up));
    m.insert("server_to_coordinator_bits_per_s".into(), Json::Num(down));
    m.insert("server_to_server_bits_per_s".into(), Json::Num(servers));
    Ok(Json::Obj(m))
}

/// One round-trip probe from host 0 to `addr` (the echo on host 1).
fn round_trips(addr: &str) -> Result<link_probe::RoundTrips, String> {
    let me = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let (_, ping) = lab::round_trip_probe(&path_str(&me), addr, 50);
    let out = output(&ping)?;
    link_probe::parse_round_trips(&out).ok_or_else(|| format!("ping: odd output `{out}`"))
}

/// Puts the delay on the coordinator's link where it is the proxy's job
/// (netem is already in the lab's qdiscs), then proves it with round trips
/// to an echo on host 1. The proxy and the echo stay in `helpers`.
fn apply_delay(
    applied: delay::Applied,
    d: &str,
    stages: usize,
    out: &Path,
    helpers: &mut Children,
) -> Result<Json, String> {
    let one_way = delay_proxy::parse_delay(d)?;
    let me = path_str(&std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?);
    let (echo, _) = lab::round_trip_probe(&me, &lab::echo_addr(), 1);
    helpers
        .0
        .push(spawn_logged(&echo, &out.join("logs/echo.log"))?);
    let direct = round_trips(&lab::echo_addr())?;
    let (undelayed, delayed) = if applied.proxied() {
        helpers.0.push(spawn_logged(
            &lab::delay_proxy(&me, stages, d),
            &out.join("logs/delay-proxy.log"),
        )?);
        for s in 0..=stages {
            let addr = if s == 0 {
                lab::proxied_echo_addr()
            } else {
                lab::proxy_addr(s)
            };
            retry(&lab::reach(0, &addr), Duration::from_secs(20))
                .map_err(|e| format!("delay proxy {addr} unreachable: {e}"))?;
        }
        (Some(direct), round_trips(&lab::proxied_echo_addr())?)
    } else {
        (None, direct)
    };
    let record = delay::check(applied, one_way, undelayed, delayed)?;
    eprintln!(
        "==> delay {d} each way ({}): coordinator <-> server round trip {:.3} ms median \
         ({:.3}-{:.3}){}; expected >= {:.3} ms",
        applied.label(),
        delayed.median,
        delayed.min,
        delayed.max,
        undelayed
            .map(|u| format!(", {:.3} ms without the proxy", u.median))
            .unwrap_or_default(),
        record.num("expected_rtt_ms_at_least").unwrap_or(f64::NAN)
    );
    Ok(record)
}

/// Waits for `child` at most `limit`; kills it after.
fn wait_limited(child: &mut std::process::Child, limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => return Err(format!("exited with {status}")),
            Ok(None) if netns::interrupted() => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("interrupted".into());
            }
            Ok(None) if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("still running after {} s; killed", limit.as_secs()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(format!("wait: {e}")),
        }
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let v: Vec<&str> = text.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

/// The coordinator's distinct fallback reasons in a run's log.
fn fallback_reasons(log: &Path) -> Vec<String> {
    report::fallback_reasons(&std::fs::read_to_string(log).unwrap_or_default())
}

struct Outcome {
    samples: Vec<Sample>,
    failures: Vec<String>,
}

fn run_all(
    a: &RpcArgs,
    pipeline: &Path,
    model: &Path,
    out: &Path,
    servers: &mut Children,
    helpers: &mut Children,
    proxied: bool,
) -> Result<Outcome, String> {
    let runs: Vec<Run> = schedule::schedule(&a.arms, &a.groups, a.repeats);
    let limit = Duration::from_secs(if a.quick { 120 } else { 600 });
    let mut o = Outcome {
        samples: Vec::new(),
        failures: Vec::new(),
    };
    for run in &runs {
        if netns::interrupted() {
            return Err("interrupted".into());
        }
        for (i, c) in servers.0.iter_mut().enumerate() {
            if let Ok(Some(status)) = c.try_wait() {
                return Err(format!(
                    "server {} exited ({status}); its log: {}",
                    i + 1,
                    out.join(format!("logs/server-{}.log", i + 1)).display()
                ));
            }
        }
        if helpers
            .0
            .iter_mut()
            .any(|c| matches!(c.try_wait(), Ok(Some(_))))
        {
            return Err(format!(
                "the delay proxy or the echo exited; logs: {}",
                out.join("logs").display()
            ));
        }
        let name = format!("run-{:02}-{}-g{}", run.index, run.arm.name(), run.groups);
        let json_path = out.join(format!("runs/{name}.json"));
        let log = out.join(format!("logs/{name}.log"));
        let _ = std::fs::remove_file(&json_path);
        let cmd = lab::coordinator(
            &path_str(pipeline),
            a,
            &path_str(model),
            run.arm,
            run.groups,
            &path_str(&json_path),
            proxied,
        );
        let label = format!(
            "[{}/{}] {:<6} groups {} repeat {}",
            run.index + 1,
            runs.len(),
            run.arm.name(),
            run.groups,
            run.repeat + 1
        );
        let mut child = spawn_logged(&cmd, &log)?;
        let result = wait_limited(&mut child, limit)
            .and_then(|()| {
                std::fs::read_to_string(&json_path)
                    .map_err(|e| format!("{}: {e}", json_path.display()))
            })
            .and_then(|text| json::parse(&text))
            .and_then(|j| Sample::from_report(*run, &j));
        match result {
            Ok(s) => {
                eprintln!(
                    "{label}: {:.1} tokens/s, p50 {:.2} ms, coordinator {:.0} B/step, md5 {}{}",
                    s.tokens_per_s,
                    s.ms_p50,
                    s.coordinator_bytes_per_step,
                    s.tokens_md5,
                    if s.arm_used != run.arm.name() {
                        format!("  (FELL BACK to {})", s.arm_used)
                    } else {
                        String::new()
                    }
                );
                if s.fallbacks > 0 {
                    for reason in fallback_reasons(&log) {
                        eprintln!("    {reason}");
                    }
                }
                o.samples.push(s);
            }
            Err(e) => {
                if netns::interrupted() {
                    return Err("interrupted".into());
                }
                let msg = format!(
                    "{label}: FAILED: {e}\n  `{}`\n{}",
                    cmd.join(" "),
                    tail(&log, 15)
                );
                eprintln!("{msg}");
                o.failures.push(msg);
            }
        }
    }
    Ok(o)
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Runs `cargo xtask bench rpc ...`.
pub fn run(argv: &[String]) -> Result<(), String> {
    let a = args::parse(argv)?;
    let cells = schedule::cells(&a.arms, &a.groups);
    eprintln!(
        "==> bench rpc: {} stages, arms {}, groups {:?}, {} repeats ({} runs), coordinator link {}{}, \
         {} streams x n_embd {} = {} B per stage boundary, {} tokens",
        a.stages,
        a.arms
            .iter()
            .map(|x| x.name())
            .collect::<Vec<_>>()
            .join(","),
        a.groups,
        a.repeats,
        cells.len() * a.repeats,
        a.rate,
        a.delay
            .as_deref()
            .map(|d| format!(" + {d} each way"))
            .unwrap_or_default(),
        a.streams,
        a.model.n_embd,
        a.streams * a.model.n_embd as usize * 4,
        a.tokens
    );
    deps::ensure(&deps::RUNTIME)?;
    deps::ensure(&deps::GGML_BUILD)?;
    let applied = match a.delay {
        Some(_) => Some(delay::Applied::choose(a.delay_mode, check_netem)?),
        None => None,
    };
    if let (Some(m), Some(d)) = (applied, &a.delay) {
        eprintln!("==> delay {d} each way: {}", m.label());
    }
    let netem_delay = a
        .delay
        .as_deref()
        .filter(|_| applied == Some(delay::Applied::Netem));
    let proxied = applied.is_some_and(delay::Applied::proxied);
    let bin_dir = build(a.bin_dir.as_deref())?;
    let server_bin = binary(&bin_dir, "transfer-rpc-server")?;
    let flags = engine_flags(&server_bin, &a)?;
    let out = workspace().join("target/bench/rpc");
    for d in ["runs", "logs"] {
        let p = out.join(d);
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    let model = out.join(format!("model-{}-{}stages.gguf", a.model_name, a.stages));
    let pipeline_bin = if a.check_lab {
        PathBuf::new()
    } else {
        let bin = binary(&bin_dir, "transfer-rpc-pipeline")?;
        let mk = lab::make_model(&path_str(&bin), &a, &path_str(&model));
        output(&mk).map_err(|e| format!("make-model: {e}"))?;
        bin
    };

    netns::catch_ctrl_c();
    netns::cleanup_namespaces();
    let lab_guard = Lab;
    for cmd in lab::setup(a.stages, Some(&a.rate), netem_delay, &a.burst) {
        netns::run_cmd(&cmd)?;
    }
    let link_report = check_links(&a)?;
    let mut servers = Children::default();
    for s in 1..=a.stages {
        let cmd = lab::server(&path_str(&server_bin), s, a.threads, flags);
        servers.0.push(spawn_logged(
            &cmd,
            &out.join(format!("logs/server-{s}.log")),
        )?);
    }
    // Every server reachable from the coordinator and from every other server.
    for s in 1..=a.stages {
        for from in 0..=a.stages {
            if from != s {
                retry(
                    &lab::reach(from, &lab::server_addr(s)),
                    Duration::from_secs(20),
                )
                .map_err(|e| format!("server {s} unreachable from host {from}: {e}"))?;
            }
        }
    }
    eprintln!("==> {} servers up and reachable from every host", a.stages);
    let mut helpers = Children::default();
    let delay_report = match (applied, a.delay.as_deref()) {
        (Some(m), Some(d)) => apply_delay(m, d, a.stages, &out, &mut helpers)?,
        _ => Json::Null,
    };
    if a.check_lab {
        eprintln!("==> --check-lab: lab verified; removing it");
        return Ok(());
    }
    let outcome = run_all(
        &a,
        &pipeline_bin,
        &model,
        &out,
        &mut servers,
        &mut helpers,
        proxied,
    );
    drop(helpers);
    drop(servers);
    drop(lab_guard);
    let outcome = outcome?;

    let summary = report::summarize(&cells, &outcome.samples);
    let targets = report::targets(&summary, a.stages);
    let mismatches = report::token_mismatches(&outcome.samples);
    let setup = [
        ("links", link_report),
        (
            "delay_mode",
            applied.map_or(Json::Null, |m| Json::Str(m.label().into())),
        ),
        ("delay_check", delay_report),
        ("engine_flags", Json::Str(format!("{flags:?}"))),
    ];
    let results = report::results_json(
        &a,
        &setup,
        &outcome.samples,
        &summary,
        &targets,
        &mismatches,
    );
    write(&out.join("results.json"), &results)?;
    let delay_text = match (applied, a.delay.as_deref()) {
        (Some(m), Some(d)) => format!(" + {d} each way ({})", m.label()),
        _ => String::new(),
    };
    let title = format!(
        "transfer-rpc pipeline, {} stages, coordinator link {}{delay_text}",
        a.stages, a.rate,
    );
    write(
        &out.join("tokens_per_s.svg"),
        &svg::chart(&summary, &a.arms, &a.groups, &title),
    )?;
    println!("\n{title}\n{}", report::table(&summary, &targets));
    println!(
        "results: {}\nplot:    {}",
        out.join("results.json").display(),
        out.join("tokens_per_s.svg").display()
    );
    if !mismatches.is_empty() {
        eprintln!(
            "\n!!!!!!!! CORRECTNESS FAILURE: runs of one config generated different tokens !!!!!!!!"
        );
        for m in &mismatches {
            eprintln!("  {m}");
        }
        return Err("generated tokens differ between runs of one configuration".into());
    }
    if !outcome.failures.is_empty() {
        return Err(format!(
            "{} of the runs failed (see above)",
            outcome.failures.len()
        ));
    }
    Ok(())
}
