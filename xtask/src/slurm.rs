//! `cargo xtask slurm-smoke`: one real `srun -N2` job of
//! `transfer-bench launch` on a throwaway Slurm cluster on this machine.
//!
//! Opt-in (root; installs `slurmctld slurmd slurm-client munge`): it
//! starts munged when none answers, one slurmctld and two slurmd emulating
//! nodes `n1` and `n2` (`slurmd -N`; Debian builds Slurm with multiple
//! slurmd support) on free loopback ports, all from a config under
//! `target/slurm-smoke/`, runs the job, and stops everything it started.
//! The emulated node names resolve nowhere, so the job passes
//! `TRANSFER_RENDEZVOUS=127.0.0.1` (host only: rank, world size, job id and
//! the port still come from Slurm's variables); on a real cluster the
//! first node's name is used as is.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::deps::{self, Package};

/// What the smoke needs besides the bench's runtime packages.
const SLURM: [Package; 4] = [
    Package {
        name: "munge",
        probes: &["/usr/sbin/munged"],
        why: "Slurm's authentication daemon",
    },
    Package {
        name: "slurmctld",
        probes: &["/usr/sbin/slurmctld"],
        why: "the Slurm controller",
    },
    Package {
        name: "slurmd",
        probes: &["/usr/sbin/slurmd"],
        why: "the Slurm node daemon (two, emulating two nodes)",
    },
    Package {
        name: "slurm-client",
        probes: &["/usr/bin/srun"],
        why: "srun and sinfo",
    },
];

/// Emulated nodes.
const NODES: [&str; 2] = ["n1", "n2"];
/// How long the daemons get to report both nodes idle.
const CLUSTER_UP: Duration = Duration::from_secs(60);
/// How long the job may run (quick mode in release: ~30 s here).
const JOB_LIMIT: Duration = Duration::from_secs(900);

/// Options of `slurm-smoke`.
#[derive(Debug, PartialEq)]
struct Args {
    mode: String,
    bin: Option<PathBuf>,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut a = Args {
        mode: "quick".into(),
        bin: None,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--mode" => a.mode = it.next().ok_or("--mode needs a value")?.clone(),
            "--quick" => a.mode = "quick".into(),
            "--smoke" => a.mode = "smoke".into(),
            "--bin" => a.bin = Some(it.next().ok_or("--bin needs a path")?.into()),
            other => return Err(format!("slurm-smoke: unknown option `{other}`")),
        }
    }
    Ok(a)
}

/// The cluster's slurm.conf: every path under `dir`, root runs everything,
/// no cgroups (containers rarely delegate them), one CPU per node so
/// `-N2 --ntasks-per-node=1` places one rank on each.
fn slurm_conf(dir: &Path, ctld_port: u16, node_ports: &[u16]) -> String {
    let d = dir.display();
    let mut c = format!(
        "ClusterName=smoke\n\
         SlurmctldHost=localhost\n\
         SlurmUser=root\n\
         SlurmdUser=root\n\
         AuthType=auth/munge\n\
         SlurmctldPort={ctld_port}\n\
         StateSaveLocation={d}/state\n\
         SlurmdSpoolDir={d}/spool-%n\n\
         SlurmctldPidFile={d}/slurmctld.pid\n\
         SlurmdPidFile={d}/slurmd-%n.pid\n\
         SlurmctldLogFile={d}/slurmctld.log\n\
         SlurmdLogFile={d}/slurmd-%n.log\n\
         ProctrackType=proctrack/linuxproc\n\
         TaskPlugin=task/none\n\
         JobAcctGatherType=jobacct_gather/none\n\
         AccountingStorageType=accounting_storage/none\n\
         SelectType=select/cons_tres\n\
         SelectTypeParameters=CR_CPU\n\
         MpiDefault=none\n\
         ReturnToService=2\n\
         SlurmdTimeout=30\n\
         InactiveLimit=0\n\
         KillWait=5\n"
    );
    for (n, port) in NODES.iter().zip(node_ports) {
        c += &format!(
            "NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs=1 \
             RealMemory=1000 State=UNKNOWN\n"
        );
    }
    c += &format!(
        "PartitionName=smoke Nodes={} Default=YES MaxTime=20 State=UP\n",
        NODES.join(",")
    );
    c
}

/// The job: srun's arguments after `srun`.
fn srun_args(bin: &Path, mode: &str, out: &Path) -> Vec<String> {
    [
        "-N2",
        "--ntasks-per-node=1",
        "--time=15",
        "--kill-on-bad-exit=1",
        "--export=ALL,TRANSFER_RENDEZVOUS=127.0.0.1",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([bin.display().to_string()])
    .chain(
        ["launch", "--mode", mode, "--provider", "tcp", "--out"]
            .iter()
            .map(|s| s.to_string()),
    )
    .chain([out.display().to_string()])
    .collect()
}

/// Everything this command started; stopped on every exit path.
#[derive(Default)]
struct Cluster {
    daemons: Vec<(String, Child)>,
    munged_pid: Option<String>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Nodes first, then the controller: slurmd drains its steps on SIGTERM.
        for (name, c) in self.daemons.iter_mut().rev() {
            let _ = Command::new("kill").arg(c.id().to_string()).status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
            }
            let _ = c.wait();
            eprintln!("==> slurm-smoke: stopped {name}");
        }
        if let Some(pid) = &self.munged_pid {
            let _ = Command::new("kill").arg(pid).status();
            eprintln!("==> slurm-smoke: stopped munged ({pid})");
        }
    }
}

fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("pick a free port: {e}"))
}

fn munge_works() -> bool {
    Command::new("sh")
        .args(["-c", "munge -n | unmunge"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Starts munged as the munge user unless one already answers; returns its
/// pid when this command started it.
fn ensure_munged() -> Result<Option<String>, String> {
    if munge_works() {
        return Ok(None);
    }
    if !Path::new("/etc/munge/munge.key").exists() {
        crate::step::run(
            "create the munge key",
            Command::new("runuser").args(["-u", "munge", "--", "mungekey", "-c"]),
        )?;
    }
    std::fs::create_dir_all("/run/munge").map_err(|e| format!("/run/munge: {e}"))?;
    crate::step::run(
        "own /run/munge",
        Command::new("chown").args(["munge:munge", "/run/munge"]),
    )?;
    crate::step::run(
        "start munged",
        Command::new("runuser").args(["-u", "munge", "--", "/usr/sbin/munged"]),
    )?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !munge_works() {
        if Instant::now() > deadline {
            return Err("munged started but `munge -n | unmunge` still fails".into());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(std::fs::read_to_string("/run/munge/munged.pid")
        .ok()
        .map(|p| p.trim().to_string()))
}

fn spawn_daemon(
    cluster: &mut Cluster,
    name: &str,
    cmd: &mut Command,
    log: &Path,
) -> Result<(), String> {
    let out = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out
        .try_clone()
        .map_err(|e| format!("{}: {e}", log.display()))?;
    let child = cmd
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("start {name}: {e}"))?;
    cluster.daemons.push((name.to_string(), child));
    Ok(())
}

/// Polls `sinfo` until every node is idle.
fn wait_idle(conf: &Path, dir: &Path) -> Result<(), String> {
    let deadline = Instant::now() + CLUSTER_UP;
    let mut last = String::new();
    while Instant::now() < deadline {
        if let Ok(o) = Command::new("sinfo")
            .args(["-h", "-N", "-o", "%N %T"])
            .env("SLURM_CONF", conf)
            .output()
        {
            last = String::from_utf8_lossy(&o.stdout).trim().to_string();
            let idle = last.lines().filter(|l| l.ends_with(" idle")).count();
            if idle == NODES.len() {
                eprintln!("==> slurm-smoke: nodes up: {}", last.replace('\n', ", "));
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    Err(format!(
        "the nodes were not idle after {} s (sinfo: {last:?}); logs in {}",
        CLUSTER_UP.as_secs(),
        dir.display()
    ))
}

/// Root or not, asked of `id` (deps' own check is private to it).
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn release_binary() -> Result<PathBuf, String> {
    crate::step::cargo(
        "build transfer-bench",
        &["build", "--release", "-p", "transfer-bench"],
    )?;
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let bin = Path::new(&target).join("release/transfer-bench");
    std::fs::canonicalize(&bin).map_err(|e| format!("{}: {e}", bin.display()))
}

/// Runs the smoke.
pub fn run(args: &[String]) -> Result<(), String> {
    let a = parse(args)?;
    if !is_root() {
        return Err("slurm-smoke runs Slurm's daemons as root; run it as root".into());
    }
    deps::ensure(&deps::RUNTIME)?;
    deps::ensure(&SLURM)?;
    let bin = match &a.bin {
        Some(b) => std::fs::canonicalize(b).map_err(|e| format!("{}: {e}", b.display()))?,
        None => release_binary()?,
    };
    let dir = std::env::current_dir()
        .map_err(|e| format!("current dir: {e}"))?
        .join("target/slurm-smoke");
    // A previous run's state would resurrect its jobs.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("state")).map_err(|e| format!("{}: {e}", dir.display()))?;
    let ports = [free_port()?, free_port()?, free_port()?];
    let conf = dir.join("slurm.conf");
    std::fs::write(&conf, slurm_conf(&dir, ports[0], &ports[1..]))
        .map_err(|e| format!("{}: {e}", conf.display()))?;

    let mut cluster = Cluster::default();
    cluster.munged_pid = ensure_munged()?;
    spawn_daemon(
        &mut cluster,
        "slurmctld",
        Command::new("slurmctld").arg("-D").env("SLURM_CONF", &conf),
        &dir.join("slurmctld.out"),
    )?;
    for n in NODES {
        spawn_daemon(
            &mut cluster,
            &format!("slurmd {n}"),
            Command::new("slurmd")
                .args(["-D", "-N", n])
                .env("SLURM_CONF", &conf),
            &dir.join(format!("slurmd-{n}.out")),
        )?;
    }
    wait_idle(&conf, &dir)?;

    let out = dir.join("out");
    let mut srun = Command::new("srun");
    srun.args(srun_args(&bin, &a.mode, &out))
        .env("SLURM_CONF", &conf);
    eprintln!(
        "==> slurm-smoke: SLURM_CONF={} srun {}",
        conf.display(),
        srun_args(&bin, &a.mode, &out).join(" ")
    );
    let start = Instant::now();
    let mut job = srun.spawn().map_err(|e| format!("start srun: {e}"))?;
    let status = loop {
        if let Some(s) = job.try_wait().map_err(|e| format!("wait for srun: {e}"))? {
            break s;
        }
        if start.elapsed() > JOB_LIMIT {
            let _ = job.kill();
            let _ = job.wait();
            return Err(format!(
                "srun still running after {} s; killed",
                JOB_LIMIT.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    if !status.success() {
        return Err(format!(
            "srun -N2 transfer-bench launch failed ({status}); logs in {}",
            dir.display()
        ));
    }
    eprintln!(
        "==> slurm-smoke: ok: srun -N2 ran transfer-bench launch in {:.1} s; results in {}",
        start.elapsed().as_secs_f64(),
        out.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn options() {
        assert_eq!(parse(&[]).unwrap().mode, "quick");
        let a = parse(&s(&["--mode", "smoke", "--bin", "/b"])).unwrap();
        assert_eq!(
            a,
            Args {
                mode: "smoke".into(),
                bin: Some("/b".into())
            }
        );
        assert!(parse(&s(&["--mode"])).is_err());
        assert!(parse(&s(&["--nodes", "3"])).is_err());
    }

    #[test]
    fn config_names_two_nodes_on_their_own_ports() {
        let c = slurm_conf(Path::new("/x"), 7000, &[7001, 7002]);
        assert!(c.contains("SlurmctldPort=7000\n"));
        assert!(c.contains("NodeName=n1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=7001 "));
        assert!(c.contains("NodeName=n2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=7002 "));
        assert!(c.contains("PartitionName=smoke Nodes=n1,n2 Default=YES"));
        assert!(c.contains("StateSaveLocation=/x/state\n"));
    }

    #[test]
    fn the_job_is_one_rank_per_node_under_the_launch_subcommand() {
        let a = srun_args(Path::new("/b/transfer-bench"), "quick", Path::new("/o"));
        assert_eq!(a[..2], s(&["-N2", "--ntasks-per-node=1"]));
        let tail = a.iter().skip_while(|x| !x.ends_with("transfer-bench"));
        assert_eq!(
            tail.cloned().collect::<Vec<_>>(),
            s(&[
                "/b/transfer-bench",
                "launch",
                "--mode",
                "quick",
                "--provider",
                "tcp",
                "--out",
                "/o"
            ])
        );
    }
}
