//! transfer-bench: the TransferEngine measured next to the raw provider.
//!
//! `local` (what `cargo xtask bench` runs) starts a `serve` child on this
//! machine and drives it; `serve` / `run --peer` are the two roles for real
//! clusters, exchanging addresses over a TCP side channel.

mod backend;
mod baseline;
mod caller;
mod cpu;
mod cpu_cost;
mod driver;
mod error;
mod launched;
mod local;
mod plan;
mod plot;
mod proto;
mod report;
mod results;
mod run;
mod server;
mod stats;
mod sweeps;
mod verify;
mod workloads;

use std::io::Write as _;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use transfer::BackendFamily;
use transfer_core::Domain;

use crate::backend::BackendOpts;
use crate::error::{Result, io};
use crate::plan::{Mode, ModeArgs, Plan};

#[derive(Parser)]
#[command(
    name = "transfer-bench",
    about = "TransferEngine benchmarks next to raw-provider baselines"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args, Clone)]
struct Common {
    /// libfabric or verbs; default: TRANSFER_BACKEND, else efa if present, else a verbs device that opens, else tcp.
    #[arg(long)]
    backend: Option<String>,
    /// libfabric provider (tcp, shm, efa, udp, ...); default: TRANSFER_PROVIDER, else efa if present, else tcp.
    #[arg(long)]
    provider: Option<String>,
    /// verbs device (mlx5_0, rxe0, ...); default: TRANSFER_VERBS_DEVICE, else the first with an active port.
    #[arg(long)]
    verbs_device: Option<String>,
    /// NICs (domains) per engine.
    #[arg(long, default_value_t = 1)]
    nics: usize,
    /// IP address to bind endpoints to (multi-host runs); default loopback.
    #[arg(long)]
    bind: Option<String>,
}

impl Common {
    /// The options with the backend detected once (see [`BackendOpts::resolved`]).
    fn opts(&self) -> Result<BackendOpts> {
        BackendOpts {
            backend: self.backend.clone(),
            provider: self.provider.clone(),
            verbs_device: self.verbs_device.clone(),
            bind: self.bind.clone(),
            nics: self.nics,
        }
        .resolved()
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// The NICs and provider this machine offers.
    Info {
        #[command(flatten)]
        common: Common,
    },
    /// Two processes on this machine: a server child and this driver.
    Local {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        mode: ModeArgs,
        /// Engines in the server process (the G of scatter and barrier).
        #[arg(long, default_value_t = 4)]
        peers: usize,
        /// Output directory.
        #[arg(long, default_value = "target/bench")]
        out: PathBuf,
    },
    /// Server role: engines that receive and echo (run on every host but the driver's).
    Serve {
        #[command(flatten)]
        common: Common,
        /// Side-channel address to listen on.
        #[arg(long, default_value = "0.0.0.0:7470")]
        listen: String,
        /// Engines to start (each is one scatter / barrier peer).
        #[arg(long, default_value_t = 1)]
        engines: usize,
        /// The driver's mode (sets the region size per engine).
        #[arg(long, value_enum, default_value_t = Mode::Default)]
        mode: Mode,
        /// Region size per engine in bytes (default: what --mode needs).
        #[arg(long)]
        region_len: Option<u64>,
        /// Exit after the first driver leaves.
        #[arg(long)]
        once: bool,
    },
    /// Driver role: runs the sweeps against one or more servers.
    Run {
        #[command(flatten)]
        common: Common,
        /// Side-channel address of a server (repeat for several hosts).
        #[arg(long = "peer", required = true)]
        peers: Vec<String>,
        /// quick, default or full.
        #[arg(long, value_enum, default_value_t = Mode::Default)]
        mode: Mode,
        /// Output directory.
        #[arg(long, default_value = "target/bench")]
        out: PathBuf,
    },
    /// One rank of a launched job (srun, mpirun, torchrun-style or TRANSFER_* variables): rank 0 drives, the others serve.
    Launch(launched::LaunchCmd),
    /// The paper's workloads (kv, weights, moe) over the engine, the bound next to them, and the report.
    #[command(subcommand)]
    Workloads(workloads::Cmd),
}

fn main() -> ExitCode {
    match real_main(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("transfer-bench: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn real_main(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Info { common } => info(&common.opts()?),
        Cmd::Local {
            common,
            mode,
            peers,
            out,
        } => local::run(&common.opts()?, &Plan::new(mode.mode()), peers.max(1), &out).map(|_| ()),
        Cmd::Serve {
            common,
            listen,
            engines,
            mode,
            region_len,
            once,
        } => {
            let region_len = region_len.unwrap_or(Plan::new(mode).region_len);
            let listener = TcpListener::bind(&listen).map_err(io("serve: bind"))?;
            let addr = listener.local_addr().map_err(io("serve: local_addr"))?;
            println!("listening {addr}");
            std::io::stdout().flush().map_err(io("serve: stdout"))?;
            server::serve(&listener, &common.opts()?, engines, region_len, once)
        }
        Cmd::Run {
            common,
            peers,
            mode,
            out,
        } => {
            let layout = format!("driver + {} server host(s)", peers.len());
            run::drive(&peers, &common.opts()?, &Plan::new(mode), &out, &layout).map(|_| ())
        }
        Cmd::Launch(cmd) => launched::run(&cmd.common.opts()?, &cmd.args()),
        Cmd::Workloads(cmd) => workloads::main(cmd),
    }
}

fn info(opts: &BackendOpts) -> Result<()> {
    let backend = opts.backend()?;
    println!("backend: {} ({})", backend.family(), backend.name());
    if backend.family() == BackendFamily::Verbs {
        for d in &transfer::verbs::devices()? {
            println!("verbs device: {d}");
        }
        let domain = opts.bare_domain()?;
        let info = domain.info();
        println!(
            "domain: {} ordering {:?} max write {} B numa {}",
            info.name,
            info.ordering,
            info.max_write_size,
            info.numa_node
                .map_or_else(|| "unknown".into(), |n| n.to_string())
        );
        return Ok(());
    }
    let config = backend
        .libfabric_config()
        .ok_or_else(|| error::BenchError::Usage("not a libfabric backend".into()))?;
    let lib = transfer_efa::Library::load()?;
    println!("libfabric {} ({})", lib.version_string(), lib.path());
    let domains = transfer_efa::open_domains(&config)?;
    for (i, d) in domains.iter().enumerate() {
        let info = d.info();
        let speed = if info.link_speed_bps > 0 {
            format!("{:.0} Gb/s", info.link_speed_bps as f64 / 1e9)
        } else {
            "unknown".into()
        };
        println!(
            "domain {i}: {} provider {} api {} link {speed} mr_mode {:#x} ({}) numa {} ordering {:?} max write {} B",
            info.name,
            info.provider,
            d.api_version(),
            d.mr_mode(),
            if d.virt_addr() {
                "virtual addresses"
            } else {
                "offsets"
            },
            info.numa_node
                .map_or_else(|| "unknown".into(), |n| n.to_string()),
            info.ordering,
            info.max_write_size
        );
    }
    Ok(())
}
