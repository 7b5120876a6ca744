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
    match transfer_rpc::server::compute_worker::serve(sock, cli.devices, cli.threads) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("transfer-rpc-compute (device {}): {e}", cli.device_index);
            ExitCode::FAILURE
        }
    }
}
