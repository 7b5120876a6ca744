//! `transfer-rpc-server`: a ggml-rpc (protocol 7.0.0) server with the
//! transfer-rpc extension (direct server-to-server copies).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
#[cfg(not(feature = "ggml"))]
use transfer_rpc::server::RefusingBackend;
use transfer_rpc::server::peer::PeerAllow;
use transfer_rpc::server::{ComputeBackend, Server, ServerConfig};

/// Command line, modelled on llama.cpp's `rpc-server`.
#[derive(Debug, Parser)]
#[command(name = "transfer-rpc-server", version, about)]
struct Cli {
    /// Host to bind (binding a public address exposes the server to anyone).
    #[arg(short = 'H', long, default_value = "127.0.0.1")]
    host: String,
    /// Port to bind.
    #[arg(short, long, default_value_t = 50052)]
    port: u16,
    /// Comma-separated devices to expose (each is a slice of host memory).
    #[arg(short, long, default_value = "CPU", value_delimiter = ',')]
    device: Vec<String>,
    /// Compute threads (default: half the cores, as upstream's rpc-server).
    #[arg(short, long)]
    threads: Option<usize>,
    /// Memory quota in MiB (all buffers together).
    #[arg(short, long, default_value_t = 4096)]
    mem: u64,
    /// Most live buffers one session may own (each is a memfd, two mappings
    /// and at least a page, charged against --mem, whatever its size).
    #[arg(long, default_value_t = 256)]
    max_buffers_per_session: usize,
    /// Most live buffers of all sessions (lowered at start to what the
    /// descriptor limit, `ulimit -n`, holds next to the connections).
    #[arg(long, default_value_t = 16384)]
    max_buffers: usize,
    /// MiB the graphs one session keeps for GRAPH_RECOMPUTE (its last graph
    /// per device) may take; they are charged against --mem too.
    #[arg(long, default_value_t = 64)]
    max_graph_mib: u64,
    /// Peer connections (COPY_TENSOR_TO destinations) one session keeps
    /// open; one more closes the least recently used.
    #[arg(long, default_value_t = 8)]
    max_peer_connections: usize,
    /// SET_TENSOR_HASH cache directory (enables the cache).
    #[arg(short, long)]
    cache: Option<PathBuf>,
    /// Most concurrent sessions (connections past HELLO).
    #[arg(long, default_value_t = 64)]
    max_connections: usize,
    /// Most sessions from one client address.
    #[arg(long, default_value_t = 32)]
    max_connections_per_address: usize,
    /// Seconds a new connection has to send its HELLO.
    #[arg(long, default_value_t = 10)]
    hello_timeout_s: u64,
    /// Seconds a session may stay silent between commands (0 = forever, like
    /// upstream; llama.cpp holds its connection, and so its model, idle).
    #[arg(long, default_value_t = 0)]
    idle_timeout_s: u64,
    /// MiB that request payloads of all sessions may hold at once (outside --mem).
    #[arg(long, default_value_t = 1024)]
    inflight_mib: u64,
    /// MiB of --inflight-mib that the sessions of one client address may
    /// hold together.
    #[arg(long, default_value_t = 512)]
    inflight_per_address_mib: u64,
    /// Seconds a frame may take, first byte to last, in either direction
    /// (a request being read, an answer being taken), plus its size at
    /// --frame-min-rate-mib.
    #[arg(long, default_value_t = 60)]
    frame_timeout_s: u64,
    /// MiB/s a frame is given on top of --frame-timeout-s (0 = none).
    #[arg(long, default_value_t = 8)]
    frame_min_rate_mib: u64,
    /// Most MiB the --cache directory keeps (least recently used evicted).
    #[arg(long, default_value_t = 16384)]
    cache_max_mib: u64,
    /// Largest accepted message in MiB.
    #[arg(long, default_value_t = 4096)]
    max_message_mib: u64,
    /// Disable the extension (behave exactly like an upstream server).
    #[arg(long)]
    no_ext: bool,
    /// Where COPY_TENSOR_TO may connect (repeatable, or comma-separated):
    /// `host:port`, an address or network (`10.0.0.0/24`), `loopback`, or
    /// `any`. None by default: clients then copy through themselves.
    #[arg(long, value_delimiter = ',')]
    peer_allow: Vec<String>,
    /// Log every command.
    #[arg(short, long)]
    verbose: bool,
    /// Compute graphs inside the server process instead of in
    /// `transfer-rpc-compute` worker processes (a crash in a compute kernel
    /// then takes the whole server down).
    #[arg(long)]
    compute_in_process: bool,
    /// Longest a graph may compute before its worker is killed (seconds).
    #[arg(long, default_value_t = 600)]
    compute_timeout_s: u64,
    /// Most work one graph may ask for, in estimated element operations
    /// (output and inputs of each node, times the contracted length for
    /// matrix products, attention and convolutions); larger graphs are
    /// refused. The default (2^47) is about a 70B model's forward pass
    /// over 1,000 tokens.
    #[arg(long, default_value_t = transfer_rpc::server::fair::DEFAULT_MAX_GRAPH_WORK)]
    max_graph_work: u64,
    /// Longest a graph waits for its turn on a device while other
    /// sessions' graphs run (seconds); then it is refused.
    #[arg(long, default_value_t = 600)]
    device_wait_s: u64,
    /// The engine link (only in builds with the `engine` feature, so that
    /// `--help` tells whether this binary can serve ENGINE_*).
    #[cfg(feature = "engine")]
    #[command(flatten)]
    engine: EngineArgs,
}

/// Engine flags.
#[cfg(feature = "engine")]
#[derive(Debug, clap::Args)]
struct EngineArgs {
    /// Start a TransferEngine on this libfabric provider (`tcp`, `shm`,
    /// `efa`, or a raw libfabric name), or `ibverbs` for the native verbs
    /// backend (ConnectX, soft-RoCE), and serve ENGINE_* (off by default).
    #[arg(long, value_name = "PROVIDER")]
    engine: Option<String>,
    /// Source address the engine's endpoints bind to (IP providers): the
    /// address other servers reach this one by, e.g. when servers live in
    /// different network namespaces.
    #[arg(long, value_name = "ADDR", requires = "engine")]
    engine_node: Option<String>,
    /// Only use this libfabric domain: on tcp the network interface (e.g.
    /// `eth0`, `veth1`), on efa the device (e.g. `rdmap16s27`); with
    /// `--engine ibverbs` the verbs device (e.g. `mlx5_0`, `rxe0`; port and
    /// GID index from TRANSFER_VERBS_PORT / TRANSFER_VERBS_GID_INDEX).
    #[arg(long, value_name = "IFACE", requires = "engine")]
    engine_iface: Option<String>,
    /// NICs (libfabric domains) the engine uses; 0 = all the provider offers.
    #[arg(long, default_value_t = 1, requires = "engine")]
    engine_nics: usize,
    /// How long an engine write may stay incomplete before it fails (ms).
    #[arg(long, default_value_t = 5000, requires = "engine")]
    engine_peer_timeout_ms: u64,
}

#[cfg(feature = "ggml")]
fn make_backend(cli: &Cli, config: &ServerConfig) -> Result<Arc<dyn ComputeBackend>, String> {
    use transfer_rpc::server::isolated::{IsolatedBackend, IsolatedConfig};
    if cli.compute_in_process {
        return Ok(Arc::new(transfer_rpc::server::GgmlCpuBackend::new(
            config.devices,
            config.threads,
            config.graph_limits,
        )));
    }
    // The worker ships next to this binary (cargo builds both into one
    // directory).
    let program = std::env::current_exe()
        .map_err(|e| format!("cannot locate this executable: {e}"))?
        .with_file_name("transfer-rpc-compute");
    if !program.is_file() {
        return Err(format!(
            "{} is missing: install transfer-rpc-compute next to transfer-rpc-server \
             (cargo build --features ggml builds both), or pass --compute-in-process",
            program.display()
        ));
    }
    Ok(Arc::new(IsolatedBackend::new(IsolatedConfig {
        program,
        devices: config.devices,
        threads: config.threads,
        timeout: std::time::Duration::from_secs(cli.compute_timeout_s.max(1)),
        env: Vec::new(),
        limits: config.graph_limits,
    })))
}

#[cfg(not(feature = "ggml"))]
fn make_backend(_cli: &Cli, _config: &ServerConfig) -> Result<Arc<dyn ComputeBackend>, String> {
    Ok(Arc::new(RefusingBackend))
}

#[cfg(feature = "engine")]
fn attach_engine(cli: &Cli, config: &mut ServerConfig) -> Result<(), String> {
    use transfer_rpc::engine_link::{EngineLink, EngineLinkConfig};
    let cli = &cli.engine;
    let Some(provider) = cli.engine.as_deref() else {
        return Ok(());
    };
    let mut ec = EngineLinkConfig::new(provider);
    ec.node = cli.engine_node.clone();
    ec.domain = cli.engine_iface.clone();
    ec.nics = cli.engine_nics;
    ec.peer_timeout = std::time::Duration::from_millis(cli.engine_peer_timeout_ms);
    let link = EngineLink::open(ec).map_err(|e| format!("--engine {provider}: {e}"))?;
    eprintln!("transfer-rpc-server: engine: {}", link.description());
    config.engine = Some(link);
    Ok(())
}

#[cfg(not(feature = "engine"))]
fn attach_engine(_cli: &Cli, _config: &mut ServerConfig) -> Result<(), String> {
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let peer_allow = match PeerAllow::parse(&cli.peer_allow) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("transfer-rpc-server: {e}");
            return ExitCode::FAILURE;
        }
    };
    let quota = cli.mem.saturating_mul(1 << 20);
    let mut config = ServerConfig {
        bind: format!("{}:{}", cli.host, cli.port),
        devices: u32::try_from(cli.device.len().max(1)).unwrap_or(1),
        memory_quota: quota,
        max_buffer_size: quota,
        max_buffers_per_session: cli.max_buffers_per_session,
        max_buffers: cli.max_buffers,
        max_graph_bytes_per_session: cli.max_graph_mib.saturating_mul(1 << 20),
        max_peer_connections_per_session: cli.max_peer_connections,
        max_connections: cli.max_connections,
        max_connections_per_address: cli.max_connections_per_address,
        hello_timeout: std::time::Duration::from_secs(cli.hello_timeout_s.max(1)),
        idle_timeout: (cli.idle_timeout_s > 0)
            .then(|| std::time::Duration::from_secs(cli.idle_timeout_s)),
        inflight_budget: cli.inflight_mib.saturating_mul(1 << 20),
        inflight_per_address: cli.inflight_per_address_mib.saturating_mul(1 << 20),
        frame_timeout: std::time::Duration::from_secs(cli.frame_timeout_s.max(1)),
        frame_min_rate: cli.frame_min_rate_mib.saturating_mul(1 << 20),
        cache_max_bytes: cli.cache_max_mib.saturating_mul(1 << 20),
        threads: cli.threads.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
        }),
        max_graph_work: cli.max_graph_work,
        device_wait: std::time::Duration::from_secs(cli.device_wait_s.max(1)),
        cache_dir: cli.cache.clone(),
        extensions: !cli.no_ext,
        peer_allow,
        verbose: cli.verbose,
        ..ServerConfig::default()
    };
    config.limits.max_message_size = cli.max_message_mib.saturating_mul(1 << 20);
    if let Err(e) = attach_engine(&cli, &mut config) {
        eprintln!("transfer-rpc-server: {e}");
        return ExitCode::FAILURE;
    }
    let backend = match make_backend(&cli, &config) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("transfer-rpc-server: {e}");
            return ExitCode::FAILURE;
        }
    };
    let compute = backend.name().to_owned();
    let server = match Server::bind(config, backend) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("transfer-rpc-server: {e}");
            return ExitCode::FAILURE;
        }
    };
    match server.local_addr() {
        Ok(a) => eprintln!(
            "transfer-rpc-server: protocol 7.0.0 (+ext) listening on {a}, devices {:?}, compute: {compute}",
            cli.device
        ),
        Err(e) => eprintln!("transfer-rpc-server: {e}"),
    }
    match server.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("transfer-rpc-server: {e}");
            ExitCode::FAILURE
        }
    }
}
