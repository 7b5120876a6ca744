//! `transfer-rpc-server`: a ggml-rpc (protocol 7.0.0) server with the
//! transfer-rpc extension (direct server-to-server copies).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
#[cfg(not(feature = "ggml"))]
use transfer_rpc::server::RefusingBackend;
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
    /// Compute threads.
    #[arg(short, long, default_value_t = 1)]
    threads: usize,
    /// Memory quota in MiB (all buffers together).
    #[arg(short, long, default_value_t = 4096)]
    mem: u64,
    /// SET_TENSOR_HASH cache directory (enables the cache).
    #[arg(short, long)]
    cache: Option<PathBuf>,
    /// Most concurrent connections.
    #[arg(long, default_value_t = 64)]
    max_connections: usize,
    /// Largest accepted message in MiB.
    #[arg(long, default_value_t = 4096)]
    max_message_mib: u64,
    /// Disable the extension (behave exactly like an upstream server).
    #[arg(long)]
    no_ext: bool,
    /// Destinations COPY_TENSOR_TO may reach (`host:port`, repeatable; none = any).
    #[arg(long)]
    peer_allow: Vec<String>,
    /// Log every command.
    #[arg(short, long)]
    verbose: bool,
}

#[cfg(feature = "ggml")]
fn make_backend(config: &ServerConfig) -> Arc<dyn ComputeBackend> {
    Arc::new(transfer_rpc::server::GgmlCpuBackend::new(
        config.devices,
        config.threads,
        config.graph_limits,
    ))
}

#[cfg(not(feature = "ggml"))]
fn make_backend(_config: &ServerConfig) -> Arc<dyn ComputeBackend> {
    Arc::new(RefusingBackend)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let quota = cli.mem.saturating_mul(1 << 20);
    let mut config = ServerConfig {
        bind: format!("{}:{}", cli.host, cli.port),
        devices: u32::try_from(cli.device.len().max(1)).unwrap_or(1),
        memory_quota: quota,
        max_buffer_size: quota,
        max_connections: cli.max_connections,
        threads: cli.threads,
        cache_dir: cli.cache,
        extensions: !cli.no_ext,
        peer_allow: cli.peer_allow,
        verbose: cli.verbose,
        ..ServerConfig::default()
    };
    config.limits.max_message_size = cli.max_message_mib.saturating_mul(1 << 20);
    let backend = make_backend(&config);
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
