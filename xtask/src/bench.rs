//! `cargo xtask bench`: the local two-process run (default), a run across
//! network-namespace hosts on this machine (`--netns N`), or across real
//! hosts over ssh (`--hosts h1,h2,...`).
//!
//! Command plans are pure functions (unit-tested); execution is separate.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::netns::{Children, Lab, cleanup_namespaces, host_ip, ns, run_cmd};
use crate::{deps, netns as lab, step};

/// Options of `cargo xtask bench`.
#[derive(Debug, Default, PartialEq)]
pub struct BenchArgs {
    /// Options handed to transfer-bench unchanged (--quick, --full, --provider, ...).
    pub passthrough: Vec<String>,
    /// Number of namespace hosts.
    pub netns: Option<usize>,
    /// tc rate of every namespace link (e.g. `1gbit`).
    pub link_rate: Option<String>,
    /// Extra delay of every namespace link (e.g. `1ms`; needs sch_netem).
    pub link_delay: Option<String>,
    /// Real hosts (first one drives).
    pub hosts: Vec<String>,
    /// quick / default / full for multi-host runs.
    pub mode: String,
    /// Run inside the soft-RoCE VM over the native verbs backend.
    pub vm: bool,
    /// The paper's workloads (kv, weights, moe or all) instead of the primitives.
    pub workload: Option<String>,
}

pub fn parse(args: &[String]) -> Result<BenchArgs, String> {
    let mut out = BenchArgs {
        mode: "default".into(),
        ..BenchArgs::default()
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("bench: {name} needs a value"))
        };
        match a.as_str() {
            "--netns" => {
                let n: usize = value("--netns")?
                    .parse()
                    .map_err(|_| "bench: --netns takes a number of hosts".to_string())?;
                if !(2..=32).contains(&n) {
                    return Err("bench: --netns needs 2 to 32 hosts".into());
                }
                out.netns = Some(n);
            }
            "--link-rate" => out.link_rate = Some(value("--link-rate")?),
            "--link-delay" => out.link_delay = Some(value("--link-delay")?),
            "--hosts" => {
                out.hosts = value("--hosts")?
                    .split(',')
                    .map(str::trim)
                    .filter(|h| !h.is_empty())
                    .map(String::from)
                    .collect();
                if out.hosts.len() < 2 {
                    return Err(
                        "bench: --hosts needs at least two hosts (the first one drives)".into(),
                    );
                }
            }
            "--vm" => out.vm = true,
            "--workload" => {
                let w = value("--workload")?;
                if !["kv", "weights", "moe", "all"].contains(&w.as_str()) {
                    return Err(format!(
                        "bench: --workload takes kv, weights, moe or all, not {w:?}"
                    ));
                }
                out.workload = Some(w);
            }
            "--quick" => {
                out.mode = "quick".into();
                out.passthrough.push(a.clone());
            }
            "--full" => {
                out.mode = "full".into();
                out.passthrough.push(a.clone());
            }
            _ => out.passthrough.push(a.clone()),
        }
    }
    if out.vm && (out.netns.is_some() || !out.hosts.is_empty()) {
        return Err("bench: --vm runs inside one VM; it excludes --netns and --hosts".into());
    }
    if out.workload.is_some() && (out.vm || !out.hosts.is_empty()) {
        return Err(
            "bench: --workload runs on this machine or on --netns hosts (not --vm / --hosts yet; \
             across real hosts use `transfer-bench workloads launch` under srun / mpirun)"
                .into(),
        );
    }
    if out.netns.is_some() && !out.hosts.is_empty() {
        return Err("bench: --netns and --hosts exclude each other".into());
    }
    if out.netns.is_none() && (out.link_rate.is_some() || out.link_delay.is_some()) {
        return Err("bench: --link-rate / --link-delay shape --netns links only".into());
    }
    Ok(out)
}

/// Side-channel port of the servers.
pub const PORT: u16 = 7470;

/// Commands that build `n` namespace hosts joined by a bridge in a switch
/// namespace, links shaped with tc.
pub fn netns_setup(n: usize, rate: Option<&str>, delay: Option<&str>) -> Vec<Vec<String>> {
    let mut cmds = lab::switch();
    for i in 0..n {
        let h = ns(i);
        cmds.extend(lab::host_link(i));
        cmds.extend(lab::shape(&h, &format!("eth{i}"), rate, delay));
    }
    cmds
}

/// The server command of namespace host `i` and the driver command on host 0.
pub fn netns_roles(
    bin: &str,
    n: usize,
    mode: &str,
    out: &str,
    extra: &[String],
) -> (Vec<Vec<String>>, Vec<String>) {
    let servers = (1..n)
        .map(|i| {
            let mut v: Vec<String> = [
                "ip",
                "netns",
                "exec",
                &ns(i),
                bin,
                "serve",
                "--once",
                "--engines",
                "1",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            v.extend([
                "--listen".into(),
                format!("{}:{PORT}", host_ip(i)),
                "--bind".into(),
                host_ip(i),
                "--mode".into(),
                mode.into(),
            ]);
            v.extend(extra.iter().cloned());
            v
        })
        .collect();
    let mut driver: Vec<String> = ["ip", "netns", "exec", &ns(0), bin, "run", "--bind"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    driver.push(host_ip(0));
    for i in 1..n {
        driver.extend(["--peer".into(), format!("{}:{PORT}", host_ip(i))]);
    }
    driver.extend(["--mode".into(), mode.into(), "--out".into(), out.into()]);
    driver.extend(extra.iter().cloned());
    (servers, driver)
}

/// ssh plan for real hosts: copy, serve on every host but the first, drive from the first, fetch results.
pub fn hosts_plan(bin: &str, hosts: &[String], mode: &str, extra: &[String]) -> Vec<Vec<String>> {
    let remote_bin = "/tmp/transfer-bench";
    let mut plan = Vec::new();
    for h in hosts {
        plan.push(vec![
            "scp".into(),
            "-q".into(),
            bin.into(),
            format!("{h}:{remote_bin}"),
        ]);
    }
    for h in hosts.iter().skip(1) {
        let mut cmd =
            format!("{remote_bin} serve --once --engines 1 --listen 0.0.0.0:{PORT} --mode {mode}");
        for e in extra {
            cmd.push(' ');
            cmd.push_str(e);
        }
        plan.push(vec![
            "ssh".into(),
            "-f".into(),
            h.clone(),
            format!("nohup {cmd} > /tmp/transfer-bench-serve.log 2>&1 &"),
        ]);
    }
    if let Some(driver) = hosts.first() {
        let mut cmd = format!("{remote_bin} run --mode {mode} --out /tmp/transfer-bench-out");
        for h in hosts.iter().skip(1) {
            cmd.push_str(&format!(" --peer {h}:{PORT}"));
        }
        for e in extra {
            cmd.push(' ');
            cmd.push_str(e);
        }
        plan.push(vec!["ssh".into(), driver.clone(), cmd]);
        plan.push(vec![
            "scp".into(),
            "-q".into(),
            "-r".into(),
            format!("{driver}:/tmp/transfer-bench-out/."),
            "target/bench/hosts/".into(),
        ]);
    }
    plan
}

fn release_binary() -> Result<PathBuf, String> {
    step::cargo(
        "build transfer-bench",
        &["build", "--release", "-p", "transfer-bench"],
    )?;
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let bin = Path::new(&target).join("release/transfer-bench");
    std::fs::canonicalize(&bin).map_err(|e| format!("{}: {e}", bin.display()))
}

fn netns(a: &BenchArgs, n: usize) -> Result<(), String> {
    lab::catch_ctrl_c();
    let bin = release_binary()?;
    let bin = bin.to_string_lossy().into_owned();
    cleanup_namespaces();
    let lab = Lab;
    for cmd in netns_setup(n, a.link_rate.as_deref(), a.link_delay.as_deref()) {
        run_cmd(&cmd).map_err(|e| {
            if cmd.iter().any(|w| w == "netem") {
                format!("{e}\n(--link-delay needs the sch_netem kernel module, which this kernel lacks; --link-rate alone uses tbf)")
            } else {
                e
            }
        })?;
    }
    let mut extra = vec!["--provider".to_string(), "tcp".to_string()];
    extra.extend(
        a.passthrough
            .iter()
            .filter(|p| !matches!(p.as_str(), "--quick" | "--full"))
            .cloned(),
    );
    if extra.iter().filter(|e| *e == "--provider").count() > 1 {
        extra.drain(0..2);
    }
    let (servers, driver) = netns_roles(&bin, n, &a.mode, "target/bench/netns", &extra);
    let mut children = Children::default();
    for s in &servers {
        let (prog, args) = s.split_first().ok_or("empty command")?;
        children.0.push(
            Command::new(prog)
                .args(args)
                .stdout(std::process::Stdio::null())
                .spawn()
                .map_err(|e| format!("{prog}: {e}"))?,
        );
    }
    let (prog, args) = driver.split_first().ok_or("empty command")?;
    let result = step::run(
        &format!("bench across {n} namespace hosts"),
        Command::new(prog).args(args),
    );
    drop(children);
    drop(lab);
    if lab::interrupted() {
        return Err("interrupted; namespaces removed".into());
    }
    result
}

/// Where the workloads' JSON Lines files, report and plots go (the Open
/// MPI and Python runs write theirs there too; the report merges them).
pub const WORKLOADS_DIR: &str = "target/bench/workloads";

/// The `transfer-bench workloads run` argument lists of a local run: one per
/// provider (tcp and shm unless `--provider` was given), each without its
/// own report (one report over the whole directory comes last).
pub fn workload_runs(a: &BenchArgs, workload: &str) -> Vec<Vec<String>> {
    let given = a.passthrough.iter().any(|p| p == "--provider");
    let providers: Vec<Option<&str>> = if given {
        vec![None]
    } else {
        vec![Some("tcp"), Some("shm")]
    };
    providers
        .into_iter()
        .map(|p| {
            let mut v: Vec<String> = ["workloads", "run", "--workload", workload, "--out-dir"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            v.push(WORKLOADS_DIR.into());
            v.push("--no-report".into());
            if let Some(p) = p {
                v.extend(["--provider".into(), p.into()]);
            }
            v.extend(a.passthrough.iter().filter(|p| *p != "--no-mpi").cloned());
            v
        })
        .collect()
}

/// The `bench --mpi` options that run the Open MPI baseline next to a local
/// workloads run: the same workload, size and transports (tcp and shm, or
/// the one `--provider` names; none for a provider Open MPI has no
/// counterpart of here). `--no-mpi` leaves it out.
pub fn mpi_baseline_args(a: &BenchArgs, workload: &str) -> Option<Vec<String>> {
    if a.passthrough.iter().any(|p| p == "--no-mpi") {
        return None;
    }
    let provider = a
        .passthrough
        .iter()
        .position(|p| p == "--provider")
        .and_then(|i| a.passthrough.get(i + 1));
    let transport = match provider.map(String::as_str) {
        None => "all",
        Some("tcp") => "tcp",
        Some("shm") => "shm",
        Some(_) => return None,
    };
    let mut v: Vec<String> = ["--mpi", "--workload", workload, "--transport", transport]
        .iter()
        .map(|s| s.to_string())
        .collect();
    match a.mode.as_str() {
        "quick" => v.push("--quick".into()),
        "full" => v.push("--full".into()),
        _ => {}
    }
    v.extend(["--out-dir".into(), WORKLOADS_DIR.into()]);
    Some(v)
}

/// The `bench --mpi` options of the Open MPI baseline across namespace
/// hosts: as [`mpi_baseline_args`], over tcp (the only transport that
/// crosses namespaces); none for another provider or with `--no-mpi`.
pub fn mpi_netns_args(a: &BenchArgs, workload: &str) -> Option<Vec<String>> {
    let v = mpi_baseline_args(a, workload)?;
    let i = v.iter().position(|p| p == "--transport")?;
    match v.get(i + 1).map(String::as_str) {
        Some("tcp") | Some("all") => {
            let mut v = v;
            v[i + 1] = "tcp".into();
            Some(v)
        }
        _ => None,
    }
}

/// The netns form: the coordinator runs in host 0's namespace and starts
/// each rank in a namespace host (round-robin), over tcp on the bridge.
pub fn workload_netns_run(bin: &str, a: &BenchArgs, n: usize, workload: &str) -> Vec<String> {
    let hosts: Vec<String> = (0..n)
        .map(|i| format!("{}={}", ns(i), host_ip(i)))
        .collect();
    let mut v: Vec<String> = ["ip", "netns", "exec", &ns(0), bin, "workloads", "run"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    v.extend([
        "--workload".into(),
        workload.into(),
        "--out-dir".into(),
        WORKLOADS_DIR.into(),
        "--no-report".into(),
        "--netns-hosts".into(),
        hosts.join(","),
    ]);
    if let Some(r) = &a.link_rate {
        v.extend(["--link-rate".into(), r.clone()]);
    }
    if !a.passthrough.iter().any(|p| p == "--provider") {
        v.extend(["--provider".into(), "tcp".into()]);
    }
    v.extend(a.passthrough.iter().filter(|p| *p != "--no-mpi").cloned());
    v
}

/// Namespace hosts of a workload run: at least one per rank of the
/// largest workload asked for (kv 2, moe 4, weights 2 + 4), so that every
/// rank has its own host and link, as the bound assumes.
pub fn workload_hosts(workload: &str, asked: usize) -> usize {
    let ranks = match workload {
        "kv" => 2,
        "moe" => 4,
        _ => 6,
    };
    if asked < ranks {
        eprintln!(
            "bench: --workload {workload} runs {ranks} ranks, each on its own host: {ranks} namespace hosts instead of {asked}"
        );
    }
    asked.max(ranks)
}

/// `cargo xtask bench --workload W`: transfer-bench runs the workloads,
/// then its report reads every file in the directory.
fn workloads(a: &BenchArgs, workload: &str) -> Result<(), String> {
    let bin = release_binary()?;
    let bin_s = bin.to_string_lossy().into_owned();
    std::fs::create_dir_all(WORKLOADS_DIR).map_err(|e| format!("{WORKLOADS_DIR}: {e}"))?;
    if let Some(n) = a.netns {
        let n = workload_hosts(workload, n);
        lab::catch_ctrl_c();
        cleanup_namespaces();
        let lab = Lab;
        for cmd in netns_setup(n, a.link_rate.as_deref(), a.link_delay.as_deref()) {
            run_cmd(&cmd)?;
        }
        let cmd = workload_netns_run(&bin_s, a, n, workload);
        let (prog, args) = cmd.split_first().ok_or("empty command")?;
        let mut result = step::run(
            &format!("workloads across {n} namespace hosts"),
            Command::new(prog).args(args),
        );
        // Open MPI over the same namespace hosts and shaped links, before
        // they go: the same workload, size, one rank per host (tcp only:
        // no other transport crosses namespaces).
        if let (Ok(()), Some(mpi_args)) = (&result, mpi_netns_args(a, workload)) {
            let hosts: Vec<(String, String)> = (0..n).map(|i| (ns(i), host_ip(i))).collect();
            result =
                crate::bench_mpi::run_netns(&mpi_args, &hosts, lab::SUBNET, a.link_rate.as_deref());
        }
        drop(lab);
        result?;
    } else {
        for args in workload_runs(a, workload) {
            step::run("workloads", Command::new(&bin).args(&args))?;
        }
        // Open MPI side by side in the same run (the issue's baseline): the
        // same workload, size and transports, records into the same folder.
        if let Some(mpi_args) = mpi_baseline_args(a, workload) {
            crate::bench_mpi::run(&mpi_args)?;
        }
    }
    step::run(
        "workloads report",
        Command::new(&bin).args(["workloads", "report", "--dir", WORKLOADS_DIR]),
    )
}

fn hosts(a: &BenchArgs) -> Result<(), String> {
    let bin = release_binary()?;
    std::fs::create_dir_all("target/bench/hosts").map_err(|e| e.to_string())?;
    for cmd in hosts_plan(&bin.to_string_lossy(), &a.hosts, &a.mode, &a.passthrough) {
        let (prog, args) = cmd.split_first().ok_or("empty command")?;
        step::run(prog, Command::new(prog).args(args))?;
    }
    Ok(())
}

/// The mode of a `--vm` run: quick or full when asked, else the smoke run
/// (software emulation moves ~20 MB/s, so the default mode would take an
/// hour).
pub fn vm_mode(a: &BenchArgs) -> &str {
    match a.mode.as_str() {
        "quick" | "full" => &a.mode,
        _ => "smoke",
    }
}

pub fn run(args: &[String]) -> Result<(), String> {
    // The Open MPI baseline of the workloads has its own options (bench_mpi.rs).
    if args.iter().any(|a| a == "--mpi") {
        return crate::bench_mpi::run(args);
    }
    let a = parse(args)?;
    if a.vm {
        return crate::bench_vm::run(vm_mode(&a));
    }
    deps::ensure(&deps::RUNTIME)?;
    if let Some(w) = &a.workload {
        return workloads(&a, w);
    }
    if let Some(n) = a.netns {
        return netns(&a, n);
    }
    if !a.hosts.is_empty() {
        return hosts(&a);
    }
    let mut cmd = vec![
        "run",
        "--release",
        "--quiet",
        "-p",
        "transfer-bench",
        "--",
        "local",
    ];
    cmd.extend(a.passthrough.iter().map(String::as_str));
    step::cargo("bench", &cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn open_mpi_runs_across_namespaces_over_tcp_only() {
        let a = parse(&s(&["--workload", "kv", "--netns", "2"])).unwrap();
        let v = mpi_netns_args(&a, "kv").unwrap();
        assert!(v.windows(2).any(|w| w == ["--transport", "tcp"]), "{v:?}");
        let a = parse(&s(&[
            "--workload",
            "kv",
            "--netns",
            "2",
            "--provider",
            "tcp",
        ]))
        .unwrap();
        assert!(mpi_netns_args(&a, "kv").is_some());
        let a = parse(&s(&[
            "--workload",
            "kv",
            "--netns",
            "2",
            "--provider",
            "shm",
        ]))
        .unwrap();
        assert_eq!(mpi_netns_args(&a, "kv"), None);
        let a = parse(&s(&["--workload", "kv", "--netns", "2", "--no-mpi"])).unwrap();
        assert_eq!(mpi_netns_args(&a, "kv"), None);
    }

    #[test]
    fn workloads_run_open_mpi_alongside() {
        let a = parse(&s(&["--workload", "moe", "--quick"])).unwrap();
        let v = mpi_baseline_args(&a, "moe").unwrap();
        assert_eq!(
            v,
            s(&[
                "--mpi",
                "--workload",
                "moe",
                "--transport",
                "all",
                "--quick",
                "--out-dir",
                WORKLOADS_DIR
            ])
        );
        let a = parse(&s(&["--workload", "kv", "--provider", "shm"])).unwrap();
        assert!(
            mpi_baseline_args(&a, "kv")
                .unwrap()
                .windows(2)
                .any(|w| w == ["--transport", "shm"])
        );
        let a = parse(&s(&["--workload", "kv", "--provider", "udp"])).unwrap();
        assert_eq!(mpi_baseline_args(&a, "kv"), None);
        let a = parse(&s(&["--workload", "kv", "--no-mpi"])).unwrap();
        assert_eq!(mpi_baseline_args(&a, "kv"), None);
        assert!(!workload_runs(&a, "kv")[0].iter().any(|p| p == "--no-mpi"));
    }

    #[test]
    fn workloads_pass_through_to_transfer_bench() {
        let a = parse(&s(&["--workload", "kv", "--quick"])).unwrap();
        let runs = workload_runs(&a, "kv");
        assert_eq!(runs.len(), 2, "tcp and shm");
        let text: Vec<String> = runs.iter().map(|r| r.join(" ")).collect();
        assert!(
            text[0].starts_with("workloads run --workload kv --out-dir target/bench/workloads")
        );
        assert!(text[0].contains("--provider tcp") && text[0].ends_with("--quick"));
        assert!(text[1].contains("--provider shm"));
        let a = parse(&s(&["--workload", "moe", "--provider", "shm"])).unwrap();
        assert_eq!(workload_runs(&a, "moe").len(), 1);
        assert!(parse(&s(&["--workload", "nope"])).is_err());
        assert!(parse(&s(&["--workload", "kv", "--vm"])).is_err());
        let a = parse(&s(&[
            "--workload",
            "all",
            "--netns",
            "3",
            "--link-rate",
            "1gbit",
        ]))
        .unwrap();
        let cmd = workload_netns_run("/b", &a, 3, "all").join(" ");
        assert!(
            cmd.starts_with("ip netns exec xtb-h0 /b workloads run --workload all"),
            "{cmd}"
        );
        assert!(cmd.contains("--netns-hosts xtb-h0=10.77.0.1,xtb-h1=10.77.0.2,xtb-h2=10.77.0.3"));
        assert!(cmd.contains("--link-rate 1gbit") && cmd.contains("--provider tcp"));
        assert_eq!(workload_hosts("kv", 2), 2);
        assert_eq!(workload_hosts("all", 3), 6);
        assert_eq!(workload_hosts("moe", 8), 8);
    }

    #[test]
    fn vm_runs_the_smoke_mode_unless_asked() {
        let a = parse(&s(&["--vm"]));
        assert_eq!(a.as_ref().map(|a| (a.vm, vm_mode(a))), Ok((true, "smoke")));
        let a = parse(&s(&["--vm", "--quick"]));
        assert_eq!(a.as_ref().map(vm_mode), Ok("quick"));
        assert!(parse(&s(&["--vm", "--netns", "2"])).is_err());
    }

    #[test]
    fn parses_modes_and_labs() {
        assert_eq!(
            parse(&s(&["--quick"])).map(|a| (a.mode, a.passthrough)),
            Ok(("quick".into(), s(&["--quick"])))
        );
        let a = parse(&s(&[
            "--netns",
            "3",
            "--link-rate",
            "1gbit",
            "--link-delay",
            "1ms",
        ]));
        assert_eq!(a.as_ref().map(|a| a.netns), Ok(Some(3)));
        assert_eq!(
            a.as_ref().map(|a| a.link_rate.clone()),
            Ok(Some("1gbit".into()))
        );
        assert!(parse(&s(&["--netns", "1"])).is_err());
        assert!(parse(&s(&["--netns", "x"])).is_err());
        assert!(parse(&s(&["--netns"])).is_err());
        assert!(
            parse(&s(&["--link-rate", "1gbit"])).is_err(),
            "shaping without --netns"
        );
        assert!(parse(&s(&["--hosts", "a"])).is_err(), "one host");
        assert!(parse(&s(&["--hosts", "a,b", "--netns", "2"])).is_err());
        assert_eq!(
            parse(&s(&["--hosts", "a, b,c"])).map(|a| a.hosts),
            Ok(s(&["a", "b", "c"]))
        );
    }

    #[test]
    fn netns_plan_builds_every_host_and_only_ours() {
        let cmds = netns_setup(3, Some("1gbit"), None);
        let text: Vec<String> = cmds.iter().map(|c| c.join(" ")).collect();
        for i in 0..3 {
            assert!(text.contains(&format!("ip netns add xtb-h{i}")));
            assert!(text.contains(&format!(
                "ip -n xtb-h{i} addr add 10.77.0.{}/24 dev eth{i}",
                i + 1
            )));
            assert!(
                text.iter()
                    .any(|t| t.contains(&format!("tc qdisc add dev eth{i} root tbf rate 1gbit")))
            );
        }
        // Every command touches only namespaces of this tool.
        for c in &cmds {
            assert!(c.iter().any(|w| w.starts_with("xtb-")), "{c:?}");
        }
        let delayed = netns_setup(2, Some("1gbit"), Some("1ms"));
        assert!(
            delayed
                .iter()
                .any(|c| c.join(" ").ends_with("netem delay 1ms rate 1gbit"))
        );
    }

    #[test]
    fn roles_connect_the_driver_to_every_server() {
        let (servers, driver) = netns_roles("/b", 4, "quick", "out", &s(&["--provider", "tcp"]));
        assert_eq!(servers.len(), 3);
        assert_eq!(
            servers[0][..6],
            s(&["ip", "netns", "exec", "xtb-h1", "/b", "serve"])
        );
        let d = driver.join(" ");
        for i in 2..=4 {
            assert!(d.contains(&format!("--peer 10.77.0.{i}:7470")), "{d}");
        }
        assert!(d.starts_with("ip netns exec xtb-h0 /b run --bind 10.77.0.1"));
        let plan = hosts_plan("/b", &s(&["h1", "h2", "h3"]), "default", &[]);
        let text: Vec<String> = plan.iter().map(|c| c.join(" ")).collect();
        assert_eq!(
            text.iter().filter(|t| t.starts_with("scp -q /b")).count(),
            3
        );
        assert_eq!(text.iter().filter(|t| t.contains(" serve ")).count(), 2);
        assert!(
            text.iter()
                .any(|t| t.starts_with("ssh h1 ") && t.contains("--peer h2:7470 --peer h3:7470"))
        );
    }
}
