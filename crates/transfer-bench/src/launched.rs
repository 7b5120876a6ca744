//! `transfer-bench launch`: the same command on every rank of a launcher
//! (`srun`, `mpirun`, torchrun-style or explicit `TRANSFER_*` variables).
//!
//! Rank 0 drives, ranks 1.. serve (`serve --once`). Each server binds its
//! side channel on an ephemeral port before the rendezvous, so the address
//! it hands out is already accepting when the driver gets the list; the
//! driver then runs the ordinary `run --peer` sweeps against all of them.
//! Nothing here changes `serve` or `run`: this file only wires the
//! launcher's environment to them.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::path::PathBuf;
use std::time::Duration;

use transfer_launch::{LaunchInfo, Options};

use crate::backend::BackendOpts;
use crate::error::{BenchError, Result, io, protocol};
use crate::plan::{ModeArgs, Plan};

/// `transfer-bench launch` options (the same on every rank).
#[derive(clap::Args)]
pub struct LaunchCmd {
    #[command(flatten)]
    pub(crate) common: crate::Common,
    #[command(flatten)]
    mode: ModeArgs,
    /// Engines per server rank (each is one scatter / barrier peer).
    #[arg(long, default_value_t = 1)]
    engines: usize,
    /// Output directory of the driver (rank 0).
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// Seconds every rank waits for the rendezvous at rank 0.
    #[arg(long, default_value_t = 120.0)]
    rendezvous_timeout: f64,
    /// Seconds a rank may run in all; a server whose driver vanished exits then.
    #[arg(long, default_value_t = 3600.0)]
    max_time: f64,
}

impl LaunchCmd {
    /// The resolved arguments.
    pub fn args(&self) -> LaunchArgs {
        LaunchArgs {
            plan: Plan::new(self.mode.mode()),
            engines: self.engines.max(1),
            out: self.out.clone(),
            rendezvous_timeout: secs(self.rendezvous_timeout),
            max_time: secs(self.max_time),
        }
    }
}

/// Seconds from the command line; nonsense (negative, NaN) becomes one
/// second rather than a panic in `Duration`.
fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s.clamp(1.0, 7.0 * 86_400.0)).unwrap_or(Duration::from_secs(1))
}

/// What `launch` needs besides the backend options.
pub struct LaunchArgs {
    /// The run's plan (every rank derives region sizes from the same mode).
    pub plan: Plan,
    /// Engines per server rank.
    pub engines: usize,
    /// Output directory of the driver.
    pub out: PathBuf,
    /// Deadline of the rendezvous.
    pub rendezvous_timeout: Duration,
    /// Longest a rank may live; a server whose driver died exits then.
    pub max_time: Duration,
}

/// Runs this process's role in a launched job.
pub fn run(opts: &BackendOpts, args: &LaunchArgs) -> Result<()> {
    let info = LaunchInfo::from_env().map_err(|e| BenchError::Usage(format!("launch: {e}")))?;
    if info.world_size < 2 {
        return Err(BenchError::Usage(format!(
            "launch: {} rank(s) from {}; the bench needs a driver and at least one server \
             (e.g. srun -N2 --ntasks-per-node=1, mpirun -np 2)",
            info.world_size,
            info.convention.name()
        )));
    }
    start_watchdog(args.max_time, info.rank);
    let ropts = Options {
        timeout: args.rendezvous_timeout,
        ..Options::default()
    };
    eprintln!(
        "transfer-bench launch: rank {} of {} ({}), rendezvous {}",
        info.rank,
        info.world_size,
        info.convention.name(),
        info.rendezvous
    );
    if info.rank == 0 {
        drive(&info, opts, args, &ropts)
    } else {
        serve(&info, opts, args, &ropts)
    }
}

fn serve(info: &LaunchInfo, opts: &BackendOpts, args: &LaunchArgs, ropts: &Options) -> Result<()> {
    let ip = match &opts.bind {
        Some(b) => b
            .parse::<IpAddr>()
            .map_err(|_| BenchError::Usage(format!("--bind {b:?} is not an IP address")))?,
        None => route_to(&info.rendezvous.host, info.rendezvous.port)?,
    };
    let opts = with_bind(opts, ip);
    // Listening before the rendezvous: the driver may connect as soon as it has the list.
    let listener = TcpListener::bind(SocketAddr::new(unspecified(ip), 0))
        .map_err(io("launch: bind the side channel"))?;
    let port = listener
        .local_addr()
        .map_err(io("launch: side channel address"))?
        .port();
    let me = SocketAddr::new(ip, port).to_string();
    transfer_launch::rendezvous(info, me.as_bytes(), ropts)
        .map_err(|e| protocol("rendezvous", e.to_string()))?;
    eprintln!("transfer-bench launch: rank {} serving at {me}", info.rank);
    crate::server::serve(&listener, &opts, args.engines, args.plan.region_len, true)
}

fn drive(info: &LaunchInfo, opts: &BackendOpts, args: &LaunchArgs, ropts: &Options) -> Result<()> {
    let list = transfer_launch::rendezvous(info, b"driver", ropts)
        .map_err(|e| protocol("rendezvous", e.to_string()))?;
    let peers = server_addrs(&list)?;
    let first = peers
        .first()
        .ok_or_else(|| protocol("rendezvous", "no server rank"))?;
    let opts = match &opts.bind {
        Some(_) => opts.clone(),
        None => with_bind(opts, route_to(&first.ip().to_string(), first.port())?),
    };
    let names: Vec<String> = peers.iter().map(SocketAddr::to_string).collect();
    let layout = format!(
        "launch ({}): driver + {} server rank(s)",
        info.convention.name(),
        names.len()
    );
    let result = crate::run::drive(&names, &opts, &args.plan, &args.out, &layout);
    if result.is_err() {
        // `serve --once` waits for its driver; a connection that closes at
        // once ends its session, so no server outlives a failed driver.
        for p in &peers {
            let _ = TcpStream::connect_timeout(p, Duration::from_secs(1));
        }
    }
    result.map(|_| ())
}

/// Parses the servers' side-channel addresses out of the rendezvous list
/// (rank 0's own entry skipped); the network wrote them, so each is checked.
fn server_addrs(list: &[Vec<u8>]) -> Result<Vec<SocketAddr>> {
    list.iter()
        .enumerate()
        .skip(1)
        .map(|(rank, b)| {
            std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse::<SocketAddr>().ok())
                .ok_or_else(|| {
                    protocol(
                        "rendezvous",
                        format!(
                            "rank {rank} sent {:?}, not a side-channel address",
                            String::from_utf8_lossy(&b[..b.len().min(64)])
                        ),
                    )
                })
        })
        .collect()
}

/// The local IP the kernel would use to reach `host` (no packet is sent:
/// connecting a UDP socket only picks the route).
pub(crate) fn route_to(host: &str, port: u16) -> Result<IpAddr> {
    let target = (host, port)
        .to_socket_addrs()
        .map_err(io("launch: resolve the rendezvous host"))?
        .next()
        .ok_or_else(|| BenchError::Usage(format!("launch: {host} resolves to no address")))?;
    let local = match target {
        SocketAddr::V4(_) => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
        SocketAddr::V6(_) => SocketAddr::new(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), 0),
    };
    let sock = UdpSocket::bind(local).map_err(io("launch: route probe"))?;
    sock.connect(target).map_err(io("launch: route probe"))?;
    Ok(sock.local_addr().map_err(io("launch: route probe"))?.ip())
}

/// Endpoints bind where the side channel is reachable; loopback keeps the
/// bench's default (no `--bind`).
pub(crate) fn with_bind(opts: &BackendOpts, ip: IpAddr) -> BackendOpts {
    let mut o = opts.clone();
    o.bind = bind_for(o.bind.take(), ip);
    o
}

fn bind_for(given: Option<String>, ip: IpAddr) -> Option<String> {
    given.or_else(|| (!ip.is_loopback()).then(|| ip.to_string()))
}

fn unspecified(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
    }
}

/// Ends the process after `max`: a server whose driver vanished (killed,
/// node lost) would otherwise wait in `accept` for ever.
fn start_watchdog(max: Duration, rank: usize) {
    std::thread::spawn(move || {
        std::thread::sleep(max);
        eprintln!(
            "transfer-bench launch: rank {rank} still running after {:.0} s (--max-time); exiting",
            max.as_secs_f64()
        );
        std::process::exit(3);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_addresses_are_checked() {
        let ok = vec![
            b"driver".to_vec(),
            b"10.0.0.2:7000".to_vec(),
            b"[::1]:9".to_vec(),
        ];
        let a = server_addrs(&ok).unwrap();
        assert_eq!(a[0].to_string(), "10.0.0.2:7000");
        assert_eq!(a[1].port(), 9);
        let bad = vec![b"driver".to_vec(), vec![0xff, 0, 1]];
        assert!(server_addrs(&bad).is_err());
        let bad = vec![b"driver".to_vec(), b"host-without-port".to_vec()];
        assert!(
            server_addrs(&bad)
                .unwrap_err()
                .to_string()
                .contains("rank 1")
        );
    }

    #[test]
    fn loopback_keeps_the_default_bind() {
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        assert_eq!(bind_for(None, lo), None);
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(bind_for(None, ip).as_deref(), Some("10.1.2.3"));
        assert_eq!(
            bind_for(Some("10.9.9.9".into()), ip).as_deref(),
            Some("10.9.9.9")
        );
        assert_eq!(route_to("127.0.0.1", 9).unwrap(), lo);
    }
}
