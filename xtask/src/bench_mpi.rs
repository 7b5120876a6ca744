//! `cargo xtask bench --mpi`: the Open MPI baseline of the workloads (kv,
//! weights, moe of crates/transfer-bench's WORKLOADS spec), a C program
//! (`src/mpi/`) built with mpicc and run under mpirun on this machine, over
//! Open MPI's same-host path (`shm`) and its tcp BTL on loopback (`tcp`),
//! or across the namespace hosts of `bench --workload --netns`
//! ([`run_netns`]: `netns-tcp`).
//! It writes the spec's JSON Lines (`openmpi-<workload>-<transport>.jsonl`)
//! next to ours; `transfer-bench workloads report` reads them all.
//!
//! Also the MPI smoke pass of `cargo xtask test` ([`smoke`]).
//!
//! Command plans are pure functions (unit-tested); execution is separate.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Instant, SystemTime};

use crate::{deps, step};

/// The C sources (one concern each), under `xtask/src/mpi/`.
const SOURCES: [&str; 7] = [
    "common.h",
    "common.c",
    "main.c",
    "selftest.c",
    "kv.c",
    "weights.c",
    "moe.c",
];

/// Name of the built program under `<target>/mpi/`.
const PROGRAM: &str = "transfer-mpi-workloads";

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Workload {
    Kv,
    Weights,
    Moe,
}

impl Workload {
    const ALL: [Workload; 3] = [Workload::Kv, Workload::Weights, Workload::Moe];

    fn name(self) -> &'static str {
        match self {
            Workload::Kv => "kv",
            Workload::Weights => "weights",
            Workload::Moe => "moe",
        }
    }
}

/// Sizes of a run: the spec's quick / default / full, and the test's smoke.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Size {
    Smoke,
    Quick,
    Default,
    Full,
}

/// An Open MPI transport configuration and its label in the records.
#[derive(Debug, PartialEq)]
pub struct Transport {
    pub label: &'static str,
    /// mpirun's MCA options.
    mca: &'static [&'static str],
    /// The configuration in words (the records' "config").
    words: &'static str,
    /// Why the one-sided rows are not like for like (kv, weights), or empty.
    rma_note: &'static str,
}

/// Open MPI's default same-host path, named: pml ob1 over the vader
/// (shared memory) BTL. Debian's openmpi-mca-params.conf already excludes
/// pml ucx and osc ucx/pt2pt, so osc rdma over vader serves MPI_Put
/// (checked with `--mca btl_base_verbose 100`: "Using vader btl", and
/// osc_base_verbose: "rdma component ... window").
pub const SHM: Transport = Transport {
    label: "shm",
    mca: &[
        "--mca",
        "pml",
        "ob1",
        "--mca",
        "btl",
        "vader,self",
        "--mca",
        "oob_tcp_if_include",
        "lo",
    ],
    words: "pml ob1, btl vader,self (single copy: CMA), osc rdma over vader (the same-host \
            default), busy polling, no progress thread",
    rma_note: "",
};

/// The tcp BTL on loopback. osc rdma refuses btl tcp in Open MPI 4.1.4
/// (MPI_Win_allocate aborts), and left to itself Open MPI falls to osc sm,
/// plain shared memory, for one-host windows; osc pt2pt emulates MPI_Put
/// with active messages over the tcp BTL, the only way to keep the puts on
/// tcp.
pub const TCP: Transport = Transport {
    label: "tcp",
    mca: &[
        "--mca",
        "pml",
        "ob1",
        "--mca",
        "btl",
        "tcp,self",
        "--mca",
        "osc",
        "pt2pt",
        "--mca",
        "btl_tcp_if_include",
        "lo",
        "--mca",
        "oob_tcp_if_include",
        "lo",
    ],
    words: "pml ob1, btl tcp,self on lo, osc pt2pt, busy polling, no progress thread",
    rma_note: "MPI_Put over tcp is emulated (osc pt2pt: active messages over the tcp BTL, \
               progressed only inside MPI calls); Open MPI 4.1.4's osc rdma refuses btl tcp",
};

/// Options of `cargo xtask bench --mpi`.
#[derive(Debug, PartialEq)]
pub struct MpiArgs {
    pub workloads: Vec<Workload>,
    pub size: Size,
    pub transports: Vec<&'static Transport>,
    pub out_dir: PathBuf,
    pub repeats: Option<u32>,
    /// kv's notification after each layer's flush: send (default) or put.
    pub kv_notify: Option<String>,
}

/// The default output directory (the workloads' common one).
pub const OUT_DIR: &str = "target/bench/workloads";

pub fn parse(args: &[String]) -> Result<MpiArgs, String> {
    let mut out = MpiArgs {
        workloads: Workload::ALL.to_vec(),
        size: Size::Default,
        transports: vec![&TCP, &SHM],
        out_dir: PathBuf::from(OUT_DIR),
        repeats: None,
        kv_notify: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("bench --mpi: {name} needs a value"))
        };
        match a.as_str() {
            "--mpi" => {}
            "--quick" => out.size = Size::Quick,
            "--full" => out.size = Size::Full,
            "--smoke" => out.size = Size::Smoke,
            "--workload" => {
                out.workloads = match value("--workload")?.as_str() {
                    "kv" => vec![Workload::Kv],
                    "weights" => vec![Workload::Weights],
                    "moe" => vec![Workload::Moe],
                    "all" => Workload::ALL.to_vec(),
                    other => {
                        return Err(format!(
                            "bench --mpi: --workload takes kv, weights, moe or all, got `{other}`"
                        ));
                    }
                }
            }
            "--transport" => {
                out.transports = match value("--transport")?.as_str() {
                    "tcp" => vec![&TCP],
                    "shm" => vec![&SHM],
                    "all" => vec![&TCP, &SHM],
                    other => {
                        return Err(format!(
                            "bench --mpi: --transport takes tcp, shm or all, got `{other}`"
                        ));
                    }
                }
            }
            "--out-dir" => out.out_dir = PathBuf::from(value("--out-dir")?),
            "--repeats" => {
                let n: u32 = value("--repeats")?
                    .parse()
                    .map_err(|_| "bench --mpi: --repeats takes a number".to_string())?;
                if !(1..=1000).contains(&n) {
                    return Err("bench --mpi: --repeats takes 1 to 1000".into());
                }
                out.repeats = Some(n);
            }
            "--kv-notify" => {
                let v = value("--kv-notify")?;
                if v != "send" && v != "put" {
                    return Err(format!(
                        "bench --mpi: --kv-notify takes send or put, got `{v}`"
                    ));
                }
                out.kv_notify = Some(v);
            }
            other => return Err(format!("bench --mpi: unknown option `{other}`")),
        }
    }
    Ok(out)
}

/// Ranks and program options of a workload at a size (the spec's params).
pub fn workload_args(w: Workload, size: Size) -> (usize, Vec<String>) {
    let v: Vec<&str> = match (w, size) {
        (Workload::Kv, Size::Smoke) => vec![
            "--layers",
            "2",
            "--pages-per-layer",
            "4",
            "--requests",
            "1",
            "--compute-us",
            "50",
        ],
        (Workload::Kv, Size::Quick) => vec!["--layers", "8", "--requests", "2"],
        (Workload::Kv, _) => vec![],
        (Workload::Weights, Size::Smoke) => {
            vec!["--inference", "2", "--total-bytes", "1048576"]
        }
        (Workload::Weights, Size::Quick) => vec!["--total-bytes", "33554432"],
        (Workload::Weights, Size::Default) => vec!["--total-bytes", "268435456"],
        (Workload::Weights, Size::Full) => vec!["--total-bytes", "2147483648"],
        (Workload::Moe, Size::Smoke) => vec!["--tokens", "1,8"],
        (Workload::Moe, Size::Quick) => vec!["--tokens", "1,32"],
        (Workload::Moe, Size::Default) => vec!["--tokens", "1,8,32,128"],
        (Workload::Moe, Size::Full) => vec!["--tokens", "1,8,32,128,4096"],
    };
    let ranks = match (w, size) {
        (Workload::Kv, _) => 2,
        (Workload::Weights, Size::Smoke) => 4,
        (Workload::Weights, _) => 6,
        (Workload::Moe, _) => 4,
    };
    (ranks, v.into_iter().map(String::from).collect())
}

/// Seconds mpirun may run one workload before it kills the job.
fn time_limit(size: Size) -> u32 {
    match size {
        Size::Smoke => 60,
        Size::Quick | Size::Default => 600,
        Size::Full => 3600,
    }
}

/// Where a run writes its records.
pub fn out_file(dir: &Path, w: Workload, t: &Transport) -> PathBuf {
    dir.join(format!("openmpi-{}-{}.jsonl", w.name(), t.label))
}

/// One run: mpirun's command line.
#[allow(clippy::too_many_arguments)]
pub fn command(
    bin: &Path,
    w: Workload,
    size: Size,
    t: &Transport,
    out: &Path,
    version: &str,
    a_repeats: Option<u32>,
    kv_notify: Option<&str>,
    root: bool,
) -> Vec<String> {
    let (ranks, args) = workload_args(w, size);
    let mut v: Vec<String> = vec!["mpirun".into()];
    if root {
        v.push("--allow-run-as-root".into());
    }
    v.extend([
        "--oversubscribe".into(),
        "--timeout".into(),
        time_limit(size).to_string(),
        "-np".into(),
        ranks.to_string(),
    ]);
    v.extend(t.mca.iter().map(|s| s.to_string()));
    v.push(bin.display().to_string());
    v.push(w.name().into());
    v.extend(args);
    let repeats = a_repeats.unwrap_or(if size == Size::Smoke { 2 } else { 5 });
    v.extend(["--repeats".into(), repeats.to_string()]);
    if let (Workload::Kv, Some(n)) = (w, kv_notify) {
        v.extend(["--notify".into(), n.into()]);
    }
    v.extend([
        "--transport".into(),
        t.label.into(),
        "--config".into(),
        format!("Open MPI {version}: {}", t.words),
    ]);
    if w != Workload::Moe && !t.rma_note.is_empty() {
        v.extend(["--note".into(), t.rma_note.into()]);
    }
    v.extend(["--out".into(), out.display().to_string()]);
    v
}

fn workspace_root() -> PathBuf {
    let xtask = Path::new(env!("CARGO_MANIFEST_DIR"));
    xtask.parent().unwrap_or(xtask).to_path_buf()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace_root().join("target"), PathBuf::from)
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// Builds the program with `mpicc -O2` when a source is newer than it.
pub fn build() -> Result<PathBuf, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/mpi");
    let dir = target_dir().join("mpi");
    let bin = dir.join(PROGRAM);
    let newest = SOURCES
        .iter()
        .map(|s| mtime(&src.join(s)).ok_or_else(|| format!("missing {}", src.join(s).display())))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .max();
    if mtime(&bin).is_some_and(|b| newest.is_some_and(|n| n <= b)) {
        return Ok(bin);
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let tmp = dir.join(format!("{PROGRAM}.tmp"));
    let mut cmd = Command::new("mpicc");
    cmd.args(["-O2", "-Wall", "-Wextra", "-o"]).arg(&tmp);
    for s in SOURCES.iter().filter(|s| s.ends_with(".c")) {
        cmd.arg(src.join(s));
    }
    step::run("build the Open MPI workloads (mpicc)", &mut cmd)?;
    std::fs::rename(&tmp, &bin).map_err(|e| format!("rename to {}: {e}", bin.display()))?;
    Ok(bin)
}

/// `mpirun --version`'s version number ("4.1.4"), or "(version unknown)".
fn version() -> String {
    Command::new("mpirun")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            let first = text.lines().next()?.to_string();
            first.rsplit(' ').next().map(String::from)
        })
        .unwrap_or_else(|| "(version unknown)".into())
}

fn run_one(name: &str, argv: &[String], cwd: &Path) -> Result<(), String> {
    let (prog, args) = argv.split_first().ok_or("empty command")?;
    step::run(name, Command::new(prog).args(args).current_dir(cwd))
}

/// `cargo xtask bench --mpi [--workload W] [--transport T] [--quick|--full]`.
pub fn run(args: &[String]) -> Result<(), String> {
    let a = parse(args)?;
    deps::ensure(&deps::OPENMPI)?;
    let bin = build()?;
    let root = workspace_root();
    let out_dir = if a.out_dir.is_absolute() {
        a.out_dir.clone()
    } else {
        std::env::current_dir()
            .map_err(|e| format!("current directory: {e}"))?
            .join(&a.out_dir)
    };
    std::fs::create_dir_all(&out_dir).map_err(|e| format!("{}: {e}", out_dir.display()))?;
    let version = version();
    for w in &a.workloads {
        for t in &a.transports {
            let out = out_file(&out_dir, *w, t);
            let argv = command(
                &bin,
                *w,
                a.size,
                t,
                &out,
                &version,
                a.repeats,
                a.kv_notify.as_deref(),
                deps::is_root(),
            );
            run_one(
                &format!("openmpi {} over {}", w.name(), t.label),
                &argv,
                &root,
            )?;
        }
    }
    eprintln!("==> openmpi records in {}", out_dir.display());
    Ok(())
}

/// The namespace hosts of a `--netns` run: (namespace, address) of each.
pub type NetnsHosts = [(String, String)];

/// The rsh agent mpirun starts its daemons with on namespace hosts: Open
/// MPI's rsh launcher runs `<agent> <host> orted ...` for every host but
/// its own; here `<host>` is a host's address and the agent runs the
/// command in that host's namespace (`ip netns exec`), as ssh would on a
/// real host. mpirun itself runs in the first host's namespace, so its own
/// address is local to it and its rank starts without the agent.
pub fn netns_agent_script(hosts: &NetnsHosts) -> String {
    let mut s = String::from(
        "#!/bin/sh\n# Written by cargo xtask bench (bench_mpi.rs): Open MPI's rsh agent \
         for namespace hosts.\nhost=$1\nshift\ncase \"$host\" in\n",
    );
    for (ns, ip) in hosts {
        s.push_str(&format!("  {ip}) ns={ns} ;;\n"));
    }
    s.push_str(
        "  *) echo \"netns agent: unknown host $host\" >&2; exit 1 ;;\nesac\n\
         exec ip netns exec \"$ns\" sh -c \"$*\"\n",
    );
    s
}

/// One slot per namespace host: rank i runs on host i, as ours does.
pub fn netns_hostfile(hosts: &NetnsHosts) -> String {
    hosts
        .iter()
        .map(|(_, ip)| format!("{ip} slots=1\n"))
        .collect()
}

/// The transport label of the netns rows (ours writes `netns-<provider>`).
pub const NETNS_LABEL: &str = "netns-tcp";

/// One run across namespace hosts: mpirun in the first host's namespace,
/// its tcp BTL and out-of-band channel restricted to the hosts' subnet
/// (the veth links, shaped like ours), one rank per host.
#[allow(clippy::too_many_arguments)]
pub fn netns_command(
    bin: &Path,
    w: Workload,
    size: Size,
    hosts: &NetnsHosts,
    subnet: &str,
    files: (&Path, &Path),
    out: &Path,
    config: &str,
    repeats: Option<u32>,
    root: bool,
) -> Vec<String> {
    let (agent, hostfile) = files;
    let (ranks, args) = workload_args(w, size);
    let first = hosts.first().map_or("", |(ns, _)| ns.as_str());
    let mut v: Vec<String> = ["ip", "netns", "exec", first, "mpirun"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    if root {
        v.push("--allow-run-as-root".into());
    }
    v.extend([
        "--timeout".into(),
        time_limit(size).to_string(),
        "--hostfile".into(),
        hostfile.display().to_string(),
        "-np".into(),
        ranks.to_string(),
        // Each namespace host looks like a node of its own to mpirun, which
        // would pin every rank to its node's first core: all on core 0.
        "--bind-to".into(),
        "none".into(),
        "--mca".into(),
        "plm_rsh_agent".into(),
        agent.display().to_string(),
        // The agent starts every daemon from mpirun's namespace.
        "--mca".into(),
        "plm_rsh_no_tree_spawn".into(),
        "1".into(),
    ]);
    for (k, val) in [
        ("pml", "ob1"),
        ("btl", "tcp,self"),
        ("osc", "pt2pt"),
        ("btl_tcp_if_include", subnet),
        ("oob_tcp_if_include", subnet),
    ] {
        v.extend(["--mca".into(), k.into(), val.into()]);
    }
    v.push(bin.display().to_string());
    v.push(w.name().into());
    v.extend(args);
    let repeats = repeats.unwrap_or(if size == Size::Smoke { 2 } else { 5 });
    v.extend([
        "--repeats".into(),
        repeats.to_string(),
        "--transport".into(),
        NETNS_LABEL.into(),
        "--config".into(),
        config.into(),
    ]);
    if w != Workload::Moe {
        v.extend(["--note".into(), TCP.rma_note.into()]);
    }
    v.extend(["--out".into(), out.display().to_string()]);
    v
}

/// `bench --mpi` options (as [`parse`] takes them) run across the namespace
/// hosts `hosts` that `cargo xtask bench --workload W --netns N` made
/// (they must exist): the openmpi rows of the report's netns-tcp table.
pub fn run_netns(
    args: &[String],
    hosts: &NetnsHosts,
    subnet: &str,
    link_rate: Option<&str>,
) -> Result<(), String> {
    let a = parse(args)?;
    deps::ensure(&deps::OPENMPI)?;
    let bin = build()?;
    let root = workspace_root();
    // Relative to where ours wrote its records (the current directory).
    let out_dir = std::env::current_dir()
        .map_err(|e| format!("current directory: {e}"))?
        .join(&a.out_dir);
    std::fs::create_dir_all(&out_dir).map_err(|e| format!("{}: {e}", out_dir.display()))?;
    let (agent, hostfile) = write_netns_files(&target_dir().join("mpi/netns"), hosts)?;
    let version = version();
    for w in &a.workloads {
        let (ranks, _) = workload_args(*w, a.size);
        if ranks > hosts.len() {
            return Err(format!(
                "openmpi {} across namespaces: {ranks} ranks need {ranks} hosts, have {}",
                w.name(),
                hosts.len()
            ));
        }
        let config = format!(
            "Open MPI {version}: pml ob1, btl tcp,self on the namespace links \
             (btl_tcp_if_include {subnet}), osc pt2pt, busy polling, no progress thread; \
             {ranks} ranks on {ranks} namespace hosts{}; mpirun in {} starts each host's \
             daemon through an `ip netns exec` rsh agent",
            link_rate
                .map(|r| format!(", links shaped to {r}"))
                .unwrap_or_default(),
            hosts.first().map_or("", |(ns, _)| ns.as_str()),
        );
        let out = out_dir.join(format!("openmpi-{}-{NETNS_LABEL}.jsonl", w.name()));
        let argv = netns_command(
            &bin,
            *w,
            a.size,
            hosts,
            subnet,
            (&agent, &hostfile),
            &out,
            &config,
            a.repeats,
            deps::is_root(),
        );
        run_one(
            &format!("openmpi {} across {ranks} namespace hosts", w.name()),
            &argv,
            &root,
        )?;
    }
    Ok(())
}

/// Prefix of the smoke pass's namespaces: its own, so that neither it nor
/// a `cargo xtask bench --netns` run (which clears every `xtb-*`) removes
/// the other's.
const SMOKE_NS: &str = "xtm";

/// The smoke pass's two namespace hosts, joined by one veth pair.
pub fn smoke_lab() -> (Vec<Vec<String>>, Vec<(String, String)>) {
    let h = |i: usize| format!("{SMOKE_NS}-h{i}");
    let ip = |i: usize| format!("10.79.0.{}", i + 1);
    let mut cmds: Vec<String> = Vec::new();
    for i in 0..2 {
        cmds.push(format!("ip netns add {}", h(i)));
        cmds.push(format!("ip -n {} link set lo up", h(i)));
    }
    cmds.push(format!(
        "ip link add eth0 netns {} type veth peer name eth1 netns {}",
        h(0),
        h(1)
    ));
    for i in 0..2 {
        cmds.push(format!("ip -n {} addr add {}/24 dev eth{i}", h(i), ip(i)));
        cmds.push(format!("ip -n {} link set eth{i} up", h(i)));
    }
    let cmds = cmds.iter().map(|l| crate::netns::words(l)).collect();
    (cmds, (0..2).map(|i| (h(i), ip(i))).collect())
}

/// Deletes the smoke pass's namespaces when dropped (any exit path).
struct SmokeLab(Vec<String>);

impl Drop for SmokeLab {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

/// kv of the Open MPI program across two namespace hosts, launched the way
/// `bench --workload --netns` launches it (the rsh agent, btl tcp on the
/// veth subnet): records verified.
fn netns_smoke(bin: &Path, dir: &Path, version: &str) -> Result<(), String> {
    let start = Instant::now();
    let (setup, hosts) = smoke_lab();
    for (ns, _) in &hosts {
        // Left over by a killed run.
        let _ = Command::new("ip")
            .args(["netns", "del", ns])
            .stderr(std::process::Stdio::null())
            .status();
    }
    let _lab = SmokeLab(hosts.iter().map(|(ns, _)| ns.clone()).collect());
    for cmd in &setup {
        crate::netns::run_cmd(cmd)?;
    }
    let (agent, hostfile) = write_netns_files(&dir.join("netns"), &hosts)?;
    let out = dir.join(format!("openmpi-kv-{NETNS_LABEL}.jsonl"));
    let argv = netns_command(
        bin,
        Workload::Kv,
        Size::Smoke,
        &hosts,
        "10.79.0.0/24",
        (&agent, &hostfile),
        &out,
        &format!("Open MPI {version}: smoke across two namespaces"),
        None,
        true,
    );
    run_one(
        "openmpi smoke: kv across two network namespaces",
        &argv,
        &workspace_root(),
    )?;
    if !has_verified_record(&out) {
        return Err(format!(
            "openmpi smoke: {} wrote no verified record",
            out.display()
        ));
    }
    eprintln!(
        "==> openmpi kv across two network namespaces: verified ({:.1} s with the namespaces)",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Writes the rsh agent and the hostfile of `hosts` into `dir`.
fn write_netns_files(dir: &Path, hosts: &NetnsHosts) -> Result<(PathBuf, PathBuf), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let agent = dir.join("agent.sh");
    let hostfile = dir.join("hostfile");
    std::fs::write(&agent, netns_agent_script(hosts))
        .map_err(|e| format!("write {}: {e}", agent.display()))?;
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("chmod {}: {e}", agent.display()))?;
    }
    std::fs::write(&hostfile, netns_hostfile(hosts))
        .map_err(|e| format!("write {}: {e}", hostfile.display()))?;
    Ok((agent, hostfile))
}

/// Whether `path` holds at least one verified record of the run.
fn has_verified_record(path: &Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|s| {
        s.lines()
            .any(|l| l.contains("\"engine\":\"openmpi\"") && l.contains("\"verified\":true"))
    })
}

/// The smoke pass of `cargo xtask test`: the program's selftest, each
/// workload at a tiny size under
/// mpirun over tcp and shm, then our
/// own `transfer-bench launch` (`bench`, already built) as an mpirun job of
/// two ranks, and kv through `transfer-bench workloads launch` the same way. Skipped, with the reason, where Open MPI cannot be installed.
pub fn smoke(bench: &Path) -> Result<(), String> {
    let start = Instant::now();
    if let Err(e) = deps::ensure(&deps::OPENMPI) {
        eprintln!("==> skipped: the Open MPI smoke pass (Open MPI missing): {e}");
        return Ok(());
    }
    let bin = build()?;
    let root = workspace_root();
    // The RNG and the fill pattern against the spec (no mpirun).
    step::run(
        "openmpi smoke: selftest",
        Command::new(&bin).arg("selftest"),
    )?;
    let dir = target_dir().join("mpi/smoke");
    // Only this run's records count.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let version = version();
    // Every pair: at these sizes a run takes under a second here.
    for (w, t) in Workload::ALL.iter().flat_map(|w| [(*w, &TCP), (*w, &SHM)]) {
        let out = out_file(&dir, w, t);
        let argv = command(
            &bin,
            w,
            Size::Smoke,
            t,
            &out,
            &version,
            None,
            None,
            deps::is_root(),
        );
        run_one(
            &format!("openmpi smoke: {} over {}", w.name(), t.label),
            &argv,
            &root,
        )?;
        if !has_verified_record(&out) {
            return Err(format!(
                "openmpi smoke: {} wrote no verified record",
                out.display()
            ));
        }
    }
    for t in [&TCP, &SHM] {
        check_transport(&bin, t, &dir, &version)?;
    }
    let bench = std::fs::canonicalize(bench).map_err(|e| {
        format!(
            "the Open MPI smoke pass runs {} (built by the tests step): {e}",
            bench.display()
        )
    })?;
    let launch_out = dir.join("launch");
    let argv = launch_command(&bench, &launch_out, deps::is_root());
    run_one("transfer-bench launch under mpirun -np 2", &argv, &root)?;
    let wrote = std::fs::read_dir(&launch_out).is_ok_and(|mut d| d.next().is_some());
    if !wrote {
        return Err(format!(
            "transfer-bench launch under mpirun wrote nothing into {}",
            launch_out.display()
        ));
    }
    let wl_out = dir.join("workloads-launch");
    let argv = workloads_launch_command(&bench, &wl_out, deps::is_root());
    let wl_start = Instant::now();
    run_one(
        "transfer-bench workloads launch (kv) under mpirun -np 2",
        &argv,
        &root,
    )?;
    let kv = wl_out.join("ours-kv-tcp.jsonl");
    let text = std::fs::read_to_string(&kv).map_err(|e| {
        format!(
            "workloads launch under mpirun wrote no kv records ({}): {e}",
            kv.display()
        )
    })?;
    check_launched_kv(&text).map_err(|e| format!("{}: {e}", kv.display()))?;
    eprintln!(
        "==> workloads launch (kv) under mpirun -np 2: verified records of both ranks ({:.1} s)",
        wl_start.elapsed().as_secs_f64()
    );
    if deps::is_root() {
        netns_smoke(&bin, &dir, &version)?;
    } else {
        eprintln!(
            "==> skipped: Open MPI kv across two network namespaces (creating namespaces needs root)"
        );
    }
    eprintln!(
        "==> the Open MPI smoke pass: ok ({:.1} s)",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// What Open MPI's BTL selection prints (`btl_base_verbose`) when the ranks
/// talk over transport `t`, and what it must not print then.
pub fn transport_evidence(t: &Transport) -> (&'static str, &'static str) {
    if t.label == "tcp" {
        ("Using tcp btl for send", "Using vader btl")
    } else {
        ("Using vader btl for send", "Using tcp btl")
    }
}

/// Runs the kv smoke once more with the BTL selection printed and checks the
/// ranks reach each other over the transport the records claim.
fn check_transport(bin: &Path, t: &Transport, dir: &Path, version: &str) -> Result<(), String> {
    let out = dir.join(format!("transport-check-{}.jsonl", t.label));
    let mut argv = command(
        bin,
        Workload::Kv,
        Size::Smoke,
        t,
        &out,
        version,
        None,
        None,
        deps::is_root(),
    );
    // After mpirun's own options, before the program.
    let at = argv.iter().position(|a| a == "-np").map_or(1, |i| i + 2);
    for (i, a) in ["--mca", "btl_base_verbose", "100"].iter().enumerate() {
        argv.insert(at + i, a.to_string());
    }
    let (prog, args) = argv.split_first().ok_or("empty command")?;
    let o = Command::new(prog)
        .args(args)
        .current_dir(workspace_root())
        .output()
        .map_err(|e| format!("openmpi transport check: could not start {prog}: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let (must, must_not) = transport_evidence(t);
    if !o.status.success() || !text.contains(must) || text.contains(must_not) {
        return Err(format!(
            "openmpi transport check over {}: expected `{must}` and no `{must_not}` in the \
             BTL selection ({}); output:\n{text}",
            t.label, o.status
        ));
    }
    eprintln!(
        "==> openmpi transport check: {} ranks use {must:?}",
        t.label
    );
    Ok(())
}

/// `mpirun` running `bench` as a two-rank job on this host (loopback
/// out-of-band channel), killed after `timeout_s`; `root` adds the flag
/// Open MPI needs to run as root.
fn two_rank_mpirun(bench: &Path, root: bool, timeout_s: u32) -> Vec<String> {
    let mut v: Vec<String> = vec!["mpirun".into()];
    if root {
        v.push("--allow-run-as-root".into());
    }
    v.extend(
        [
            "--oversubscribe",
            // mpirun pins two ranks to one core each by default; the
            // engine's progress then competes with its caller on one core
            // (the smoke run took 22.8 s pinned, 11.5 s unpinned here).
            "--bind-to",
            "none",
            "--timeout",
            &timeout_s.to_string(),
            "-np",
            "2",
            "--mca",
            "oob_tcp_if_include",
            "lo",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    v.push(bench.display().to_string());
    v
}

/// Our bench as a two-rank mpirun job: rank 0 drives, rank 1 serves
/// (`transfer-bench launch` reads OMPI_COMM_WORLD_*; one host, so the
/// rendezvous is 127.0.0.1 on a port derived from the job id).
pub fn launch_command(bench: &Path, out: &Path, root: bool) -> Vec<String> {
    let mut v = two_rank_mpirun(bench, root, 300);
    v.extend(
        [
            "launch",
            "--mode",
            "smoke",
            "--provider",
            "tcp",
            "--rendezvous-timeout",
            "60",
            "--max-time",
            "240",
            "--out",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    v.push(out.display().to_string());
    v
}

/// kv as a two-rank mpirun job of our `transfer-bench workloads launch`
/// (smoke size, tcp): rank 0 coordinates and runs prefill, rank 1 decode,
/// each found through OMPI_COMM_WORLD_* (one host: the rendezvous is
/// 127.0.0.1 on a port derived from the job id). The smoke size, not the
/// quick one: measured here (debug build, load ~12 on 2 cores) 2.6 s
/// against 12.5 s for `--quick --repeats 1`, whose memcpy bound and byte
/// checks of 16 MiB per iteration dominate. The bytes are checked either way.
pub fn workloads_launch_command(bench: &Path, out_dir: &Path, root: bool) -> Vec<String> {
    let mut v = two_rank_mpirun(bench, root, 120);
    v.extend(
        [
            "workloads",
            "launch",
            "--workload",
            "kv",
            "--smoke",
            "--provider",
            "tcp",
            "--rendezvous-timeout",
            "60",
            "--out-dir",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    v.push(out_dir.display().to_string());
    v
}

/// Checks the kv records of a launched two-rank job: both metrics there,
/// every record verified (the decode rank checked every page's bytes), and
/// the configuration names the Open MPI launch with both ranks (so the
/// job really was mpirun's, not a lone rank).
pub fn check_launched_kv(text: &str) -> Result<(), String> {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return Err("no records".into());
    }
    for m in ["ttll_us", "kv_gbps"] {
        if !lines
            .iter()
            .any(|l| l.contains(&format!("\"metric\":\"{m}\"")))
        {
            return Err(format!("no {m} record"));
        }
    }
    for l in &lines {
        if !l.contains("\"engine\":\"ours\"") || !l.contains("\"verified\":true") {
            return Err(format!("a record of ours not verified: {l}"));
        }
        if !l.contains("launched job (openmpi), 2 ranks") {
            return Err(format!("a record not from a two-rank Open MPI job: {l}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn parses_workloads_sizes_and_transports() {
        let a = parse(&s(&["--mpi"]));
        assert_eq!(
            a.as_ref()
                .map(|a| (a.workloads.len(), a.size, a.transports.len())),
            Ok((3, Size::Default, 2))
        );
        let a = parse(&s(&[
            "--mpi",
            "--workload",
            "moe",
            "--quick",
            "--transport",
            "shm",
        ]));
        assert_eq!(
            a.as_ref()
                .map(|a| (a.workloads.clone(), a.size, a.transports[0].label)),
            Ok((vec![Workload::Moe], Size::Quick, "shm"))
        );
        assert!(parse(&s(&["--workload", "kvx"])).is_err());
        assert!(parse(&s(&["--workload"])).is_err());
        assert!(parse(&s(&["--transport", "ucx"])).is_err());
        assert!(parse(&s(&["--repeats", "0"])).is_err());
        assert!(parse(&s(&["--kv-notify", "flag"])).is_err());
        assert!(parse(&s(&["--bogus"])).is_err());
    }

    #[test]
    fn commands_name_the_transport_and_the_spec_params() {
        let bin = Path::new("/b/prog");
        let out = Path::new("/o/openmpi-kv-tcp.jsonl");
        let c = command(
            bin,
            Workload::Kv,
            Size::Default,
            &TCP,
            out,
            "4.1.4",
            None,
            Some("put"),
            true,
        )
        .join(" ");
        assert!(
            c.starts_with("mpirun --allow-run-as-root --oversubscribe"),
            "{c}"
        );
        assert!(c.contains("-np 2 "), "{c}");
        assert!(c.contains("--mca btl tcp,self --mca osc pt2pt"), "{c}");
        assert!(
            c.contains("/b/prog kv --repeats 5 --notify put --transport tcp"),
            "{c}"
        );
        assert!(c.contains("--note MPI_Put over tcp is emulated"), "{c}");
        assert!(c.ends_with("--out /o/openmpi-kv-tcp.jsonl"), "{c}");
        let m = command(
            bin,
            Workload::Moe,
            Size::Full,
            &SHM,
            out,
            "4.1.4",
            Some(3),
            Some("put"),
            false,
        )
        .join(" ");
        assert!(
            m.starts_with("mpirun --oversubscribe --timeout 3600 -np 4"),
            "{m}"
        );
        assert!(m.contains("--mca btl vader,self"), "{m}");
        assert!(
            m.contains("moe --tokens 1,8,32,128,4096 --repeats 3 --transport shm"),
            "{m}"
        );
        assert!(!m.contains("--notify") && !m.contains("--note"), "{m}");
        assert_eq!(transport_evidence(&TCP).0, "Using tcp btl for send");
        assert_eq!(transport_evidence(&SHM).1, "Using tcp btl");
        let (ranks, w) = workload_args(Workload::Weights, Size::Default);
        assert_eq!((ranks, w), (6, s(&["--total-bytes", "268435456"])));
        assert_eq!(
            out_file(Path::new("d"), Workload::Weights, &SHM),
            Path::new("d/openmpi-weights-shm.jsonl")
        );
    }

    #[test]
    fn launch_runs_two_ranks_of_our_bench() {
        let c = launch_command(Path::new("/t/transfer-bench"), Path::new("/o"), false).join(" ");
        assert!(
            c.starts_with("mpirun --oversubscribe --bind-to none --timeout 300 -np 2"),
            "{c}"
        );
        assert!(
            c.contains("/t/transfer-bench launch --mode smoke --provider tcp"),
            "{c}"
        );
        assert!(c.ends_with("--out /o"), "{c}");
        let w = workloads_launch_command(Path::new("/t/tb"), Path::new("/o"), true).join(" ");
        assert!(
            w.starts_with("mpirun --allow-run-as-root --oversubscribe --bind-to none"),
            "{w}"
        );
        assert!(w.contains("-np 2 "), "{w}");
        assert!(
            w.contains("/t/tb workloads launch --workload kv --smoke --provider tcp"),
            "{w}"
        );
        assert!(w.ends_with("--out-dir /o"), "{w}");
    }

    #[test]
    fn netns_runs_place_one_rank_per_namespace_host() {
        let hosts = vec![
            ("xtb-h0".to_string(), "10.77.0.1".to_string()),
            ("xtb-h1".to_string(), "10.77.0.2".to_string()),
        ];
        let agent = netns_agent_script(&hosts);
        assert!(agent.contains("  10.77.0.2) ns=xtb-h1 ;;"), "{agent}");
        assert!(agent.contains("exec ip netns exec \"$ns\""), "{agent}");
        assert_eq!(
            netns_hostfile(&hosts),
            "10.77.0.1 slots=1\n10.77.0.2 slots=1\n"
        );
        let c = netns_command(
            Path::new("/b/prog"),
            Workload::Kv,
            Size::Quick,
            &hosts,
            "10.77.0.0/24",
            (Path::new("/a.sh"), Path::new("/hf")),
            Path::new("/o/openmpi-kv-netns-tcp.jsonl"),
            "cfg",
            None,
            true,
        )
        .join(" ");
        assert!(
            c.starts_with("ip netns exec xtb-h0 mpirun --allow-run-as-root"),
            "{c}"
        );
        assert!(c.contains("--hostfile /hf -np 2 --bind-to none"), "{c}");
        assert!(c.contains("--mca plm_rsh_agent /a.sh"), "{c}");
        assert!(c.contains("--mca btl tcp,self"), "{c}");
        assert!(c.contains("--mca btl_tcp_if_include 10.77.0.0/24"), "{c}");
        assert!(c.contains("--mca oob_tcp_if_include 10.77.0.0/24"), "{c}");
        assert!(
            c.contains("/b/prog kv --layers 8 --requests 2 --repeats 5 --transport netns-tcp"),
            "{c}"
        );
        assert!(c.contains("--note MPI_Put over tcp is emulated"), "{c}");
        assert!(c.ends_with("--out /o/openmpi-kv-netns-tcp.jsonl"), "{c}");
    }

    #[test]
    fn the_smoke_lab_is_two_hosts_on_one_veth_pair() {
        let (cmds, hosts) = smoke_lab();
        let text: Vec<String> = cmds.iter().map(|c| c.join(" ")).collect();
        assert!(text.contains(
            &"ip link add eth0 netns xtm-h0 type veth peer name eth1 netns xtm-h1".to_string()
        ));
        assert!(text.contains(&"ip -n xtm-h1 addr add 10.79.0.2/24 dev eth1".to_string()));
        assert_eq!(hosts[1], ("xtm-h1".to_string(), "10.79.0.2".to_string()));
        assert!(!hosts[0].0.starts_with(crate::netns::NS_PREFIX));
    }

    #[test]
    fn launched_kv_records_must_be_verified_and_from_both_ranks() {
        let rec = |m: &str, verified: bool, config: &str| {
            format!(
                "{{\"workload\":\"kv\",\"engine\":\"ours\",\"config\":\"{config}\",\
                 \"metric\":\"{m}\",\"verified\":{verified}}}\n"
            )
        };
        let good = "ours: tcp; launched job (openmpi), 2 ranks";
        let ok = rec("ttll_us", true, good) + &rec("kv_gbps", true, good);
        assert_eq!(check_launched_kv(&ok), Ok(()));
        assert!(check_launched_kv("").is_err());
        assert!(check_launched_kv(&rec("ttll_us", true, good)).is_err());
        let unverified = rec("ttll_us", true, good) + &rec("kv_gbps", false, good);
        assert!(check_launched_kv(&unverified).is_err());
        let torchrun = "ours: tcp; launched job (torchrun), 2 ranks";
        let other = rec("ttll_us", true, good) + &rec("kv_gbps", true, torchrun);
        assert!(check_launched_kv(&other).is_err());
    }
}
