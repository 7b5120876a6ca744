//! `transfer-rpc-compute`: the compute worker process a
//! `transfer-rpc-server` starts for each device (not run by hand). It
//! reads its server on file descriptor 3; see
//! `transfer_rpc::server::isolated`.

use std::os::fd::{FromRawFd, OwnedFd};
use std::process::ExitCode;

use clap::Parser;

/// Arguments the server passes.
#[derive(Debug, Parser)]
#[command(name = "transfer-rpc-compute", version, about)]
struct Cli {
    /// Devices the server advertises.
    #[arg(long, default_value_t = 1)]
    devices: u32,
    /// Compute threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// The device this worker serves (for logs).
    #[arg(long, default_value_t = 0)]
    device_index: usize,
    /// The server's graph limit: most nodes.
    #[arg(long)]
    max_nodes: Option<usize>,
    /// The server's graph limit: most tensors.
    #[arg(long)]
    max_tensors: Option<usize>,
    /// The server's graph limit: most index elements read.
    #[arg(long)]
    max_index_elements: Option<u64>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // SAFETY: fd 3 is set up by the server (`isolated::Worker::spawn`)
    // and owned by this process alone.
    if unsafe { libc::fcntl(3, libc::F_GETFD) } < 0 {
        eprintln!("transfer-rpc-compute: started without its server socket on fd 3");
        return ExitCode::FAILURE;
    }
    // SAFETY: checked open above; nothing else owns fd 3 here.
    let sock = unsafe { OwnedFd::from_raw_fd(3) };
    let mut limits = transfer_rpc::validate::GraphLimits::default();
    limits.max_nodes = cli.max_nodes.unwrap_or(limits.max_nodes);
    limits.max_tensors = cli.max_tensors.unwrap_or(limits.max_tensors);
    limits.max_index_elements = cli.max_index_elements.unwrap_or(limits.max_index_elements);
    match transfer_rpc::server::compute_worker::serve(sock, cli.devices, cli.threads, limits) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("transfer-rpc-compute (device {}): {e}", cli.device_index);
            ExitCode::FAILURE
        }
    }
}
