//! transfer-launch-probe: what this process learns from its launcher, and
//! the rendezvous list every rank gets.
//!
//! `srun -N2 transfer-launch-probe` (or under mpirun, torchrun-style or
//! explicit variables) checks a cluster's launch before a real job; the
//! integration tests run it as N local processes. Each rank sends
//! `rank<R>@<host>/pid<P>` and prints the list it got back, one line per
//! rank, after a `list` line, so the outputs of all ranks compare equal.

use std::process::ExitCode;
use std::time::Duration;

use transfer_launch::{LaunchInfo, Options, rendezvous};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("transfer-launch-probe: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), transfer_launch::LaunchError> {
    let info = LaunchInfo::from_env()?;
    let mut opts = Options::default();
    // Tests and impatient users shorten the deadline; garbage keeps the default.
    if let Some(secs) = std::env::var("TRANSFER_RENDEZVOUS_TIMEOUT")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
    {
        opts.timeout = Duration::from_secs_f64(secs.min(86_400.0));
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    println!(
        "rank {} of {} ({}) local_rank {} rendezvous {} job {}",
        info.rank,
        info.world_size,
        info.convention.name(),
        info.local_rank
            .map_or_else(|| "-".into(), |r| r.to_string()),
        info.rendezvous,
        info.job
    );
    let blob = format!("rank{}@{host}/pid{}", info.rank, std::process::id());
    let all = rendezvous(&info, blob.as_bytes(), &opts)?;
    println!("list");
    for (r, b) in all.iter().enumerate() {
        println!("{r} {}", String::from_utf8_lossy(b));
    }
    Ok(())
}
