//! The three workloads of the TransferEngine paper (kv, weights, moe) over
//! our engine, exactly as `crates/transfer-bench/WORKLOADS.md` defines
//! them, with the bound next to them and a report that merges the rows
//! other engines (Open MPI, NIXL, Mooncake) wrote into the same directory.

pub mod bound;
pub mod coord;
pub mod kv;
pub mod moe;
pub mod pin;
pub mod plot;
pub mod records;
pub mod report;
pub mod runner;
pub mod signal;
pub mod spec;
pub mod unit_io;
pub mod weights;

use std::net::TcpListener;
use std::path::PathBuf;
use std::time::Duration;

use crate::backend::BackendOpts;
use crate::error::{BenchError, Result, io, protocol};
use crate::workloads::bound::Medium;
use crate::workloads::coord::{FromRank, Place, Ranks, Setup, ToRank};
use crate::workloads::runner::{RunInfo, Size};

/// The workloads.
pub const ALL: [&str; 3] = ["kv", "weights", "moe"];

/// Default output directory (WORKLOADS.md).
pub const DEFAULT_DIR: &str = "target/bench/workloads";

/// `transfer-bench workloads ...`
#[derive(clap::Subcommand)]
pub enum Cmd {
    /// Runs workloads: one process per rank on this machine (or on namespace hosts), one engine each.
    Run(RunArgs),
    /// Internal: one rank, started by `run` (or `launch`).
    #[command(hide = true)]
    Rank {
        #[command(flatten)]
        common: crate::Common,
        /// The coordinator's address.
        #[arg(long)]
        coord: String,
        /// This rank.
        #[arg(long)]
        rank: usize,
    },
    /// Tables (ours / best peer, ours / bound) and one SVG per workload from every *.jsonl in DIR.
    Report {
        /// Directory of the JSON Lines files.
        #[arg(long, default_value = DEFAULT_DIR)]
        dir: PathBuf,
    },
    /// One rank of a launched job (srun, mpirun, torchrun-style variables): rank 0 also coordinates.
    Launch(LaunchArgs),
}

/// Options of `workloads run`.
#[derive(clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    common: crate::Common,
    #[command(flatten)]
    sizes: SizeArgs,
    /// kv, weights, moe or all.
    #[arg(long, default_value = "all")]
    workload: String,
    /// Output directory of the JSON Lines files and plots.
    #[arg(long, default_value = DEFAULT_DIR)]
    out_dir: PathBuf,
    /// Namespace hosts as NS=IP,NS=IP,... (ranks placed round-robin; this
    /// process must run in the first one). Set by `cargo xtask bench --netns`.
    #[arg(long)]
    netns_hosts: Option<String>,
    /// The rate the namespace links were shaped to (words for the records).
    #[arg(long)]
    link_rate: Option<String>,
    /// Do not print the report at the end.
    #[arg(long)]
    no_report: bool,
}

/// Sizes and repeats.
#[derive(clap::Args, Clone)]
pub struct SizeArgs {
    /// WORKLOADS.md's quick sizes.
    #[arg(long, conflicts_with_all = ["full", "smoke"])]
    quick: bool,
    /// The large sizes (kv 4096 tokens, weights 2 GiB, moe T=4096).
    #[arg(long, conflicts_with = "smoke")]
    full: bool,
    /// Tiny sizes, one timed iteration (the test suite's smoke pass).
    #[arg(long)]
    smoke: bool,
    /// Timed iterations per point (after one untimed warm-up).
    #[arg(long)]
    repeats: Option<u64>,
}

impl SizeArgs {
    fn size(&self) -> Size {
        if self.smoke {
            Size::Smoke
        } else if self.quick {
            Size::Quick
        } else if self.full {
            Size::Full
        } else {
            Size::Default
        }
    }

    fn repeats(&self) -> u64 {
        self.repeats
            .unwrap_or(if self.smoke { 1 } else { 5 })
            .clamp(1, 1000)
    }
}

/// Options of `workloads launch`.
#[derive(clap::Args)]
pub struct LaunchArgs {
    #[command(flatten)]
    common: crate::Common,
    #[command(flatten)]
    sizes: SizeArgs,
    /// kv, weights or moe (the job's rank count must be the workload's).
    #[arg(long)]
    workload: String,
    /// Output directory (rank 0).
    #[arg(long, default_value = DEFAULT_DIR)]
    out_dir: PathBuf,
    /// Seconds every rank waits for the rendezvous.
    #[arg(long, default_value_t = 120)]
    rendezvous_timeout: u64,
}

/// The rank side of every workload.
fn setup_of(workload: &str) -> Option<Setup> {
    match workload {
        "kv" => Some(kv::setup),
        "weights" => Some(weights::setup),
        "moe" => Some(moe::setup),
        _ => None,
    }
}

/// Runs a `workloads` command.
pub fn main(cmd: Cmd) -> Result<()> {
    match cmd {
        Cmd::Run(a) => run(&a),
        Cmd::Rank {
            common,
            coord,
            rank,
        } => coord::rank_main(&coord, rank, &common.opts()?, setup_of),
        Cmd::Report { dir } => report::print(&dir).map(|_| ()),
        Cmd::Launch(a) => launch(&a),
    }
}

fn selected(workload: &str) -> Result<Vec<&'static str>> {
    if workload == "all" {
        return Ok(ALL.to_vec());
    }
    ALL.iter()
        .find(|w| **w == workload)
        .map(|w| vec![*w])
        .ok_or_else(|| {
            BenchError::Usage(format!(
                "unknown workload {workload:?} (kv, weights, moe or all)"
            ))
        })
}

/// Words for our engine's configuration (the records' `config`).
fn config(opts: &BackendOpts, layout: &str) -> Result<String> {
    Ok(format!(
        "ours: {}, {} NIC(s) per engine, one engine per process, {}; {layout}",
        opts.provider()?,
        opts.nics,
        match crate::workloads::signal::progress_mode(opts)? {
            transfer_core::ProgressMode::Caller => "caller-driven progress (no worker thread: \
                 the thread that submits posts, the thread that waits polls, yielding on idle \
                 polls for its first 50 µs, then napping 20 µs; kv prefill drives progress \
                 during its compute), receivers \
                 wait on imm_future expectations"
                .to_string(),
            transfer_core::ProgressMode::Thread => format!(
                "worker-thread progress, idle policy {}, receivers block on imm_future \
                 expectations (woken by the worker)",
                crate::backend::idle_policy()
            ),
        }
    ))
}

fn parse_hosts(s: &str) -> Result<Vec<Place>> {
    s.split(',')
        .filter(|h| !h.trim().is_empty())
        .map(|h| {
            let (ns, ip) = h
                .split_once('=')
                .ok_or_else(|| BenchError::Usage(format!("--netns-hosts: {h:?} is not NS=IP")))?;
            ip.parse::<std::net::IpAddr>().map_err(|_| {
                BenchError::Usage(format!("--netns-hosts: {ip:?} is not an IP address"))
            })?;
            Ok(Place {
                netns: Some(ns.trim().to_string()),
                ip: Some(ip.trim().to_string()),
            })
        })
        .collect()
}

fn run(a: &RunArgs) -> Result<()> {
    let opts = a.common.opts()?;
    let workloads = selected(&a.workload)?;
    let hosts = a.netns_hosts.as_deref().map(parse_hosts).transpose()?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let transport = match &hosts {
        Some(_) => format!(
            "netns-{}",
            opts.provider.clone().unwrap_or_else(|| "tcp".into())
        ),
        None => opts.provider.clone().unwrap_or_else(|| "tcp".into()),
    };
    let mut files = Vec::new();
    for w in workloads {
        let points = runner::points(w, a.sizes.size())?;
        let first = points
            .first()
            .ok_or_else(|| protocol("workloads", "no points"))?;
        let n = runner::ranks(w, first)?;
        let (places, listen, layout) = match &hosts {
            Some(h) if !h.is_empty() => {
                let places: Vec<Place> = (0..n).map(|i| h[i % h.len()].clone()).collect();
                let listen = h[0].ip.clone().unwrap_or_else(|| "127.0.0.1".into());
                let layout = format!(
                    "{n} ranks on {} namespace hosts, {}{}",
                    h.len().min(n),
                    pin::words(),
                    a.link_rate
                        .as_ref()
                        .map(|r| format!(", links shaped to {r}"))
                        .unwrap_or_default()
                );
                (places, listen, layout)
            }
            _ => (
                vec![Place::default(); n],
                "127.0.0.1".to_string(),
                format!(
                    "{n} processes on this machine ({cores} cores), {}",
                    pin::words()
                ),
            ),
        };
        let mut ranks = Ranks::spawn(&opts, &places, &listen)?;
        runner::start(&mut ranks, w)?;
        let medium = match &hosts {
            Some(h) if h.len() >= 2 && n >= 2 => Medium::Link {
                rate: link_probe(&mut ranks, 1)?,
            },
            _ => Medium::Memcpy {
                rate: bound::memcpy_rate(memcpy_len(w, first)),
                cores,
            },
        };
        let note = match &hosts {
            Some(h) if h.len() < n => format!(
                "{n} ranks share {} namespace hosts (and their links); the bound assumes one rank per host",
                h.len()
            ),
            _ => String::new(),
        };
        let info = RunInfo {
            transport: transport.clone(),
            config: config(&opts, &layout)?,
            medium,
            repeats: a.sizes.repeats(),
            note,
        };
        let result = runner::run_workload(&mut ranks, w, &points, &info, &a.out_dir);
        ranks.bye();
        files.extend(result?);
    }
    for f in &files {
        println!("wrote {}", f.display());
    }
    if !a.no_report {
        report::print(&a.out_dir)?;
    }
    Ok(())
}

/// The buffer the memcpy bound is measured on: the workload's S (weights),
/// its bytes per iteration otherwise, capped at 256 MiB.
fn memcpy_len(workload: &str, point: &serde_json::Value) -> usize {
    let get = |k: &str| {
        point
            .get(k)
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0)
    };
    let bytes = match workload {
        "weights" => get("total_bytes"),
        "kv" => get("requests") * get("layers") * get("pages_per_layer") * get("page_bytes"),
        _ => 64 << 20,
    };
    bytes.clamp(64 << 20, 256 << 20) as usize
}

/// The rate of one link: rank 0 streams to rank `to` over plain TCP.
fn link_probe(ranks: &mut Ranks, to: usize) -> Result<f64> {
    ranks.send(to, &ToRank::ProbeRecv)?;
    let FromRank::Probe(addr) = ranks.recv(to)? else {
        return Err(protocol("link probe", "expected the probe address"));
    };
    // 64 MiB: a few hundred ms at 1 Gbit/s, long enough that tbf's burst does not count.
    ranks.send(
        0,
        &ToRank::ProbeSend {
            addr,
            bytes: 64 << 20,
        },
    )?;
    let _ = ranks.recv(0)?;
    match ranks.recv(to)? {
        FromRank::Done(v) => v
            .first()
            .copied()
            .filter(|r| *r > 0.0)
            .ok_or_else(|| protocol("link probe", "no rate")),
        other => Err(protocol("link probe", format!("unexpected {other:?}"))),
    }
}

/// A workload as one rank of a launched job: rank 0 hands out the address
/// of a coordinator it runs on a thread; every rank (0 too) then connects
/// to it as an ordinary rank.
fn launch(a: &LaunchArgs) -> Result<()> {
    use transfer_launch::{LaunchInfo, Options};
    let opts = a.common.opts()?;
    let info = LaunchInfo::from_env().map_err(|e| BenchError::Usage(format!("launch: {e}")))?;
    let points = runner::points(&a.workload, a.sizes.size())?;
    let first = points
        .first()
        .ok_or_else(|| protocol("workloads", "no points"))?;
    let need = runner::ranks(&a.workload, first)?;
    if info.world_size != need {
        return Err(BenchError::Usage(format!(
            "launch: {} runs on {need} ranks; the job has {} (e.g. mpirun -np {need})",
            a.workload, info.world_size
        )));
    }
    let ropts = Options {
        timeout: Duration::from_secs(a.rendezvous_timeout.clamp(1, 86_400)),
        ..Options::default()
    };
    // The address the other ranks reach this host at (loopback when the
    // rendezvous is local), and the engines bound there.
    let ip = match &opts.bind {
        Some(b) => b.clone(),
        None => crate::launched::route_to(&info.rendezvous.host, info.rendezvous.port)?.to_string(),
    };
    let opts = match ip.parse() {
        Ok(addr) => crate::launched::with_bind(&opts, addr),
        Err(_) => opts,
    };
    let listener = if info.rank == 0 {
        Some(TcpListener::bind((ip.as_str(), 0)).map_err(io("launch: bind the coordinator"))?)
    } else {
        None
    };
    let me = match &listener {
        Some(l) => l
            .local_addr()
            .map_err(io("launch: coordinator address"))?
            .to_string(),
        None => String::new(),
    };
    let list = transfer_launch::rendezvous(&info, me.as_bytes(), &ropts)
        .map_err(|e| protocol("rendezvous", e.to_string()))?;
    let coord_addr = list
        .first()
        .and_then(|b| std::str::from_utf8(b).ok())
        .and_then(|s| s.parse::<std::net::SocketAddr>().ok())
        .ok_or_else(|| protocol("rendezvous", "rank 0 sent no coordinator address"))?
        .to_string();
    let Some(listener) = listener else {
        return coord::rank_main(&coord_addr, info.rank, &opts, setup_of);
    };
    let rank0 = {
        let (opts, addr) = (opts.clone(), coord_addr.clone());
        std::thread::spawn(move || coord::rank_main(&addr, 0, &opts, setup_of))
    };
    let coordinate = || -> Result<()> {
        let mut ranks = Ranks::accepted(&listener, need, Duration::from_secs(120))?;
        runner::start(&mut ranks, &a.workload)?;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let info_run = RunInfo {
            transport: opts.provider.clone().unwrap_or_else(|| "tcp".into()),
            config: config(
                &opts,
                &format!("launched job ({}), {need} ranks", info.convention.name()),
            )?,
            medium: Medium::Memcpy {
                rate: bound::memcpy_rate(memcpy_len(&a.workload, first)),
                cores,
            },
            repeats: a.sizes.repeats(),
            note: "launched job: the bound is rank 0 host's memcpy rate (right on one host; across hosts it should be a link's rate)".into(),
        };
        let r = runner::run_workload(&mut ranks, &a.workload, &points, &info_run, &a.out_dir);
        ranks.bye();
        for f in r? {
            println!("wrote {}", f.display());
        }
        Ok(())
    };
    let result = coordinate();
    let joined = rank0
        .join()
        .map_err(|_| protocol("launch", "rank 0's thread panicked"))?;
    result.and(joined)?;
    report::print(&a.out_dir).map(|_| ())
}
