//! Rank, world size and rendezvous address from the launcher's environment.
//!
//! Conventions, first match wins:
//!
//! 1. explicit: `TRANSFER_RANK`, `TRANSFER_WORLD_SIZE`, `TRANSFER_RENDEZVOUS`
//!    (`host:port`), optional `TRANSFER_LOCAL_RANK`;
//! 2. torchrun-style: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`,
//!    `MASTER_PORT` (under real torchrun, whose agent already holds
//!    `MASTER_PORT` when `TORCHELASTIC_USE_AGENT_STORE=True`, the next port);
//! 3. Open MPI: `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`,
//!    `OMPI_COMM_WORLD_LOCAL_RANK`; rank 0's host from `TRANSFER_RENDEZVOUS`,
//!    else the first host of a surrounding Slurm allocation, else loopback
//!    when every rank is on this node;
//! 4. Slurm: `SLURM_PROCID`, `SLURM_STEP_NUM_TASKS` / `SLURM_NTASKS`,
//!    `SLURM_LOCALID`, rank 0's host the first of `SLURM_STEP_NODELIST` /
//!    `SLURM_JOB_NODELIST` (Slurm places rank 0 on the step's first node).
//!
//! Open MPI comes before Slurm because `mpirun` inside an allocation
//! inherits the batch step's `SLURM_PROCID=0` in every rank; torchrun before
//! both because it sets per-worker ranks under either.
//!
//! `TRANSFER_JOB_SECRET` (same on every rank, 16 bytes or more) authenticates
//! the rendezvous. No launcher offers a per-job secret to take instead:
//! Slurm's and torchrun's variables are all public (job ids, addresses),
//! and Open MPI's `OMPI_MCA_orte_precondition_transports` is random under
//! `mpirun` but derived from the job id under `srun` direct launch.
//!
//! `TRANSFER_RENDEZVOUS` (`host`, `host:port`, `[v6]:port`) overrides the
//! rendezvous address under every convention and `TRANSFER_JOB_ID` the job
//! token. Without a port, the port is [`DEFAULT_PORT`] plus a hash of the
//! job id modulo [`PORT_SPREAD`], so two jobs sharing a node rarely collide;
//! when they do, the token keeps their ranks apart (see `rendezvous`).

use crate::auth::{JobSecret, SECRET_ENV};
use crate::error::{LaunchError, Result};
use crate::hostlist;

/// Base of the rendezvous port when the environment names none.
pub const DEFAULT_PORT: u16 = 29_600;

/// Ports above [`DEFAULT_PORT`] that the job-id hash spreads over.
pub const PORT_SPREAD: u16 = 1000;

/// Largest world size the environment may announce (a bound on everything
/// sized by it; [`crate::Limits`] may lower it further).
pub const MAX_WORLD: usize = 65_536;

/// Which launcher the values came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Convention {
    /// `TRANSFER_RANK` / `TRANSFER_WORLD_SIZE` / `TRANSFER_RENDEZVOUS`.
    Explicit,
    /// `RANK` / `WORLD_SIZE` / `MASTER_ADDR` / `MASTER_PORT`.
    Torchrun,
    /// `OMPI_COMM_WORLD_*`.
    OpenMpi,
    /// `SLURM_*`.
    Slurm,
}

impl Convention {
    /// Lower-case name, used in tokens and messages.
    pub fn name(self) -> &'static str {
        match self {
            Convention::Explicit => "explicit",
            Convention::Torchrun => "torchrun",
            Convention::OpenMpi => "openmpi",
            Convention::Slurm => "slurm",
        }
    }
}

/// A host and port (the host may be a name, resolved when connecting).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Host name or IP literal (IPv6 without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// What a process learns from its launcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchInfo {
    /// The launcher.
    pub convention: Convention,
    /// This process's rank, `0..world_size`.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Rank on this node, when the launcher says.
    pub local_rank: Option<usize>,
    /// Where rank 0 listens.
    pub rendezvous: Endpoint,
    /// Job token: ranks with another token are refused at rank 0.
    pub job: String,
    /// The job's nodes, when the launcher lists them (Slurm).
    pub hosts: Vec<String>,
    /// The job secret (`TRANSFER_JOB_SECRET`) that authenticates the
    /// rendezvous; `None` leaves it open to whoever reaches the port.
    pub secret: Option<JobSecret>,
}

impl LaunchInfo {
    /// [`detect`] over this process's environment.
    pub fn from_env() -> Result<Self> {
        detect(|k| std::env::var(k).ok())
    }
}

/// Reads the launcher's variables through `get` (the process environment,
/// or a map in tests).
pub fn detect(get: impl Fn(&str) -> Option<String>) -> Result<LaunchInfo> {
    let get = |k: &str| get(k).map(|v| v.trim().to_string());
    let over = match get("TRANSFER_RENDEZVOUS").filter(|v| !v.is_empty()) {
        Some(v) => Some(parse_endpoint("TRANSFER_RENDEZVOUS", &v)?),
        None => None,
    };
    let job_override = get("TRANSFER_JOB_ID").filter(|v| !v.is_empty());
    let mut info = if get("TRANSFER_RANK").is_some() || get("TRANSFER_WORLD_SIZE").is_some() {
        explicit(&get, over.as_ref())?
    } else if get("RANK").is_some() && get("WORLD_SIZE").is_some() {
        torchrun(&get, over.as_ref())?
    } else if get("OMPI_COMM_WORLD_RANK").is_some() {
        openmpi(&get, over.as_ref())?
    } else if get("SLURM_PROCID").is_some() {
        slurm(&get, over.as_ref())?
    } else {
        return Err(LaunchError::NoLauncher);
    };
    if let Some(j) = job_override {
        info.job = j;
    }
    // Set but empty is refused too: it would look like protection and be none.
    info.secret = get(SECRET_ENV).map(JobSecret::new).transpose()?;
    // Room for the convention's name in the wire token; a long id becomes its hash.
    if info.job.len() > crate::wire::MAX_TOKEN - 32 {
        info.job = format!("{:016x}", fnv1a(info.job.as_bytes()));
    }
    Ok(info)
}

type Get<'a> = dyn Fn(&str) -> Option<String> + 'a;

fn explicit(get: &Get, over: Option<&(String, Option<u16>)>) -> Result<LaunchInfo> {
    let (rank, world_size) = rank_world(get, "TRANSFER_RANK", "TRANSFER_WORLD_SIZE")?;
    let job = "explicit".to_string();
    let (host, port) = over.cloned().ok_or(LaunchError::Env {
        var: "TRANSFER_RENDEZVOUS",
        reason: "not set (host:port of rank 0), needed with TRANSFER_RANK".into(),
    })?;
    Ok(LaunchInfo {
        convention: Convention::Explicit,
        rank,
        world_size,
        local_rank: opt_num(get, "TRANSFER_LOCAL_RANK")?,
        rendezvous: Endpoint {
            port: port.unwrap_or_else(|| derived_port(&job)),
            host,
        },
        job,
        hosts: Vec::new(),
        secret: None,
    })
}

fn torchrun(get: &Get, over: Option<&(String, Option<u16>)>) -> Result<LaunchInfo> {
    let (rank, world_size) = rank_world(get, "RANK", "WORLD_SIZE")?;
    let rendezvous = match over {
        Some((h, p)) => {
            let port = match p {
                Some(p) => *p,
                None => torch_port(get)?,
            };
            Endpoint {
                host: h.clone(),
                port,
            }
        }
        None => Endpoint {
            host: required(get, "MASTER_ADDR")?,
            port: torch_port(get)?,
        },
    };
    let job = get("TORCHELASTIC_RUN_ID")
        .unwrap_or_else(|| format!("{}:{}", rendezvous.host, rendezvous.port));
    Ok(LaunchInfo {
        convention: Convention::Torchrun,
        rank,
        world_size,
        local_rank: opt_num(get, "LOCAL_RANK")?,
        rendezvous,
        job,
        hosts: Vec::new(),
        secret: None,
    })
}

fn torch_port(get: &Get) -> Result<u16> {
    let port = parse_port("MASTER_PORT", &required(get, "MASTER_PORT")?)?;
    // Real torchrun's agent serves its own store on MASTER_PORT.
    if get("TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return port.checked_add(1).ok_or(LaunchError::Env {
            var: "MASTER_PORT",
            reason: "65535 leaves no port next to torchrun's store".into(),
        });
    }
    Ok(port)
}

fn openmpi(get: &Get, over: Option<&(String, Option<u16>)>) -> Result<LaunchInfo> {
    let (rank, world_size) = rank_world(get, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")?;
    let job = get("PMIX_NAMESPACE")
        .or_else(|| get("OMPI_MCA_ess_base_jobid"))
        .or_else(|| get("OMPI_MCA_orte_ess_jobid"))
        .unwrap_or_else(|| "mpirun".into());
    let hosts = slurm_hosts(get)?;
    let local_size = opt_num(get, "OMPI_COMM_WORLD_LOCAL_SIZE")?;
    let (host, port) = match over {
        Some(o) => o.clone(),
        None => match hosts.first() {
            Some(h) => (h.clone(), None),
            None if local_size == Some(world_size) => ("127.0.0.1".into(), None),
            None => {
                return Err(LaunchError::Env {
                    var: "TRANSFER_RENDEZVOUS",
                    reason: "mpirun over several nodes without Slurm: set it to rank 0's host \
                             and pass it on (mpirun -x TRANSFER_RENDEZVOUS)"
                        .into(),
                });
            }
        },
    };
    Ok(LaunchInfo {
        convention: Convention::OpenMpi,
        rank,
        world_size,
        local_rank: opt_num(get, "OMPI_COMM_WORLD_LOCAL_RANK")?,
        rendezvous: Endpoint {
            port: port.unwrap_or_else(|| derived_port(&job)),
            host,
        },
        job,
        hosts,
        secret: None,
    })
}

fn slurm(get: &Get, over: Option<&(String, Option<u16>)>) -> Result<LaunchInfo> {
    let world_var = ["SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"]
        .into_iter()
        .find(|v| get(v).is_some())
        .ok_or(LaunchError::Env {
            var: "SLURM_NTASKS",
            reason: "not set next to SLURM_PROCID".into(),
        })?;
    let (rank, world_size) = rank_world(get, "SLURM_PROCID", world_var)?;
    let job = match (
        get("SLURM_JOB_ID").or_else(|| get("SLURM_JOBID")),
        get("SLURM_STEP_ID"),
    ) {
        (Some(j), Some(s)) => format!("{j}.{s}"),
        (Some(j), None) => j,
        (None, _) => "slurm".into(),
    };
    let hosts = slurm_hosts(get)?;
    let (host, port) = match over {
        Some(o) => o.clone(),
        None => (
            hosts.first().cloned().ok_or(LaunchError::Env {
                var: "SLURM_STEP_NODELIST",
                reason: "neither it nor SLURM_JOB_NODELIST names a node".into(),
            })?,
            None,
        ),
    };
    Ok(LaunchInfo {
        convention: Convention::Slurm,
        rank,
        world_size,
        local_rank: opt_num(get, "SLURM_LOCALID")?,
        rendezvous: Endpoint {
            port: port.unwrap_or_else(|| derived_port(&job)),
            host,
        },
        job,
        hosts,
        secret: None,
    })
}

/// The step's nodes, else the job's; empty outside Slurm.
fn slurm_hosts(get: &Get) -> Result<Vec<String>> {
    match [
        "SLURM_STEP_NODELIST",
        "SLURM_JOB_NODELIST",
        "SLURM_NODELIST",
    ]
    .into_iter()
    .find_map(get)
    {
        Some(list) => hostlist::expand(&list),
        None => Ok(Vec::new()),
    }
}

fn required(get: &Get, var: &'static str) -> Result<String> {
    get(var).filter(|v| !v.is_empty()).ok_or(LaunchError::Env {
        var,
        reason: "not set".into(),
    })
}

fn num(var: &'static str, v: &str) -> Result<usize> {
    v.parse::<usize>().map_err(|_| LaunchError::Env {
        var,
        reason: format!("{v:?} is not a non-negative integer"),
    })
}

fn opt_num(get: &Get, var: &'static str) -> Result<Option<usize>> {
    get(var).map(|v| num(var, &v)).transpose()
}

fn rank_world(
    get: &Get,
    rank_var: &'static str,
    world_var: &'static str,
) -> Result<(usize, usize)> {
    let rank = num(rank_var, &required(get, rank_var)?)?;
    let world = num(world_var, &required(get, world_var)?)?;
    if world == 0 || world > MAX_WORLD {
        return Err(LaunchError::Env {
            var: world_var,
            reason: format!("{world} is outside 1..={MAX_WORLD}"),
        });
    }
    if rank >= world {
        return Err(LaunchError::Env {
            var: rank_var,
            reason: format!("rank {rank} is out of range for world size {world}"),
        });
    }
    Ok((rank, world))
}

fn parse_port(var: &'static str, v: &str) -> Result<u16> {
    match v.parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(LaunchError::Env {
            var,
            reason: format!("{v:?} is not a TCP port (1..=65535)"),
        }),
    }
}

/// Parses `host`, `host:port`, `[v6]` or `[v6]:port`; a bare IPv6 literal
/// (several colons, no brackets) is a host without port.
pub fn parse_endpoint(var: &'static str, v: &str) -> Result<(String, Option<u16>)> {
    let bad = |reason: &str| LaunchError::Env {
        var,
        reason: format!("{v:?}: {reason}"),
    };
    let (host, port) = if let Some(rest) = v.strip_prefix('[') {
        let (h, tail) = rest.split_once(']').ok_or_else(|| bad("'[' without ']'"))?;
        match tail {
            "" => (h, None),
            t => (
                h,
                Some(
                    t.strip_prefix(':')
                        .ok_or_else(|| bad("expected ':' after ']'"))?,
                ),
            ),
        }
    } else if v.matches(':').count() == 1 {
        let (h, p) = v.split_once(':').ok_or_else(|| bad("expected host:port"))?;
        (h, Some(p))
    } else {
        (v, None)
    };
    if host.is_empty() {
        return Err(bad("empty host"));
    }
    if host.chars().any(|c| c.is_whitespace() || c == '/') {
        return Err(bad("not a host name"));
    }
    let port = port.map(|p| parse_port(var, p)).transpose()?;
    Ok((host.to_string(), port))
}

/// The default port of `job`: stable across ranks, spread across jobs.
pub fn derived_port(job: &str) -> u16 {
    // PORT_SPREAD fits u16, so the remainder does too.
    DEFAULT_PORT + (fnv1a(job.as_bytes()) % u64::from(PORT_SPREAD)) as u16
}

/// FNV-1a: a stable hash (std's is seeded per process, ranks must agree).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Result<LaunchInfo> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        detect(|k| m.get(k).cloned())
    }

    #[test]
    fn nothing_set_names_every_option() {
        let e = env(&[]).unwrap_err();
        assert!(matches!(e, LaunchError::NoLauncher));
        assert!(e.to_string().contains("TRANSFER_RANK"));
    }

    #[test]
    fn explicit_needs_all_three() {
        let i = env(&[
            ("TRANSFER_RANK", "2"),
            ("TRANSFER_WORLD_SIZE", "4"),
            ("TRANSFER_RENDEZVOUS", "10.0.0.1:5000"),
            ("TRANSFER_LOCAL_RANK", "0"),
        ])
        .unwrap();
        assert_eq!(i.convention, Convention::Explicit);
        assert_eq!((i.rank, i.world_size, i.local_rank), (2, 4, Some(0)));
        assert_eq!(i.rendezvous.to_string(), "10.0.0.1:5000");
        let e = env(&[("TRANSFER_RANK", "0"), ("TRANSFER_WORLD_SIZE", "2")]).unwrap_err();
        assert!(e.to_string().contains("TRANSFER_RENDEZVOUS"), "{e}");
        let e = env(&[("TRANSFER_RANK", "0"), ("TRANSFER_RENDEZVOUS", "h:1")]).unwrap_err();
        assert!(e.to_string().contains("TRANSFER_WORLD_SIZE"), "{e}");
    }

    #[test]
    fn the_job_secret_is_read_under_every_convention_and_short_ones_refused() {
        let slurm = [
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_NODELIST", "n1"),
        ];
        assert_eq!(env(&slurm).unwrap().secret, None);
        let mut with = slurm.to_vec();
        with.push(("TRANSFER_JOB_SECRET", "0123456789abcdef0123"));
        let i = env(&with).unwrap();
        assert_eq!(
            i.secret,
            Some(JobSecret::new("0123456789abcdef0123").unwrap())
        );
        // Debug (and so any log of the info) does not show it.
        assert!(!format!("{i:?}").contains("0123456789"));
        for short in ["", "guessable"] {
            let mut with = slurm.to_vec();
            with.push(("TRANSFER_JOB_SECRET", short));
            let e = env(&with).unwrap_err().to_string();
            assert!(e.contains("TRANSFER_JOB_SECRET") && e.contains("16"), "{e}");
        }
    }

    #[test]
    fn out_of_range_and_garbage_are_refused_by_name() {
        let e = env(&[
            ("TRANSFER_RANK", "4"),
            ("TRANSFER_WORLD_SIZE", "4"),
            ("TRANSFER_RENDEZVOUS", "h:1"),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("TRANSFER_RANK") && e.contains("out of range"),
            "{e}"
        );
        for (r, w) in [("-1", "2"), ("x", "2"), ("0", "0"), ("0", "99999999")] {
            assert!(
                env(&[
                    ("RANK", r),
                    ("WORLD_SIZE", w),
                    ("MASTER_ADDR", "h"),
                    ("MASTER_PORT", "1")
                ])
                .is_err(),
                "{r} of {w}"
            );
        }
        for port in ["0", "65536", "http", ""] {
            assert!(
                env(&[
                    ("RANK", "0"),
                    ("WORLD_SIZE", "1"),
                    ("MASTER_ADDR", "h"),
                    ("MASTER_PORT", port)
                ])
                .is_err(),
                "{port:?}"
            );
        }
    }

    #[test]
    fn torchrun_style() {
        let base = [
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "node01"),
            ("MASTER_PORT", "29500"),
        ];
        let i = env(&base).unwrap();
        assert_eq!(i.convention, Convention::Torchrun);
        assert_eq!((i.rank, i.world_size, i.local_rank), (1, 2, Some(1)));
        assert_eq!(i.rendezvous.to_string(), "node01:29500");
        let mut agent = base.to_vec();
        agent.push(("TORCHELASTIC_USE_AGENT_STORE", "True"));
        assert_eq!(env(&agent).unwrap().rendezvous.port, 29501);
        let e = env(&base[..2]).unwrap_err().to_string();
        assert!(e.contains("MASTER_ADDR"), "{e}");
    }

    #[test]
    fn slurm_first_node_of_the_step_hosts_rank_0() {
        let i = env(&[
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_JOB_ID", "77"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_JOB_NODELIST", "big[01-09]"),
            ("SLURM_STEP_NODELIST", "node[02-03,07],gpu5"),
        ])
        .unwrap();
        assert_eq!(i.convention, Convention::Slurm);
        assert_eq!((i.rank, i.world_size, i.local_rank), (3, 4, Some(1)));
        assert_eq!(i.hosts, ["node02", "node03", "node07", "gpu5"]);
        assert_eq!(i.rendezvous.host, "node02");
        assert_eq!(i.job, "77.0");
        assert_eq!(i.rendezvous.port, derived_port("77.0"));
        assert!((DEFAULT_PORT..DEFAULT_PORT + PORT_SPREAD).contains(&i.rendezvous.port));
        assert_ne!(derived_port("77.0"), derived_port("78.0"));
        let long = "j".repeat(500);
        let i = env(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
            ("SLURM_NODELIST", "a"),
            ("SLURM_JOB_ID", &long),
        ])
        .unwrap();
        assert_eq!(i.job.len(), 16, "hashed: {}", i.job);
        let e = env(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")]).unwrap_err();
        assert!(e.to_string().contains("NODELIST"), "{e}");
        let e = env(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_NODELIST", "n["),
        ])
        .unwrap_err();
        assert!(matches!(e, LaunchError::Hostlist { .. }), "{e}");
    }

    #[test]
    fn openmpi_beats_an_inherited_slurm_rank() {
        let i = env(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("PMIX_NAMESPACE", "prterun-x-123@1"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
            ("SLURM_JOB_NODELIST", "a[1-2]"),
        ])
        .unwrap();
        assert_eq!(i.convention, Convention::OpenMpi);
        assert_eq!((i.rank, i.world_size), (1, 2));
        assert_eq!(i.rendezvous.host, "a1");
        assert_eq!(i.job, "prterun-x-123@1");
    }

    #[test]
    fn openmpi_on_one_node_or_with_an_override() {
        let one = [
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ];
        assert_eq!(env(&one).unwrap().rendezvous.host, "127.0.0.1");
        let spread = [
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "1"),
        ];
        let e = env(&spread).unwrap_err().to_string();
        assert!(e.contains("mpirun -x TRANSFER_RENDEZVOUS"), "{e}");
        let mut with = spread.to_vec();
        with.push(("TRANSFER_RENDEZVOUS", "[fe80::1]:7000"));
        with.push(("TRANSFER_JOB_ID", "mine"));
        let i = env(&with).unwrap();
        assert_eq!(i.rendezvous.host, "fe80::1");
        assert_eq!(i.rendezvous.to_string(), "[fe80::1]:7000");
        assert_eq!(i.job, "mine");
    }

    #[test]
    fn endpoints() {
        let p = |s| parse_endpoint("X", s);
        assert_eq!(p("h").unwrap(), ("h".into(), None));
        assert_eq!(p("h:80").unwrap(), ("h".into(), Some(80)));
        assert_eq!(p("::1").unwrap(), ("::1".into(), None));
        assert_eq!(p("[::1]").unwrap(), ("::1".into(), None));
        assert_eq!(p("[::1]:9").unwrap(), ("::1".into(), Some(9)));
        for bad in [":80", "h:", "h:x", "[::1", "[::1]9", "a b:1", "[]:1"] {
            assert!(p(bad).is_err(), "{bad:?}");
        }
    }
}
