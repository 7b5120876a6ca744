//! Processes of a workload run: the coordinator (no engine) spawns or
//! accepts W rank processes (one engine each), hands them the job over the
//! side channel, exchanges engine addresses and region descriptors, and
//! steps them through the iterations. All data moves through the engines;
//! the side channel only carries control and each rank's own timings.

use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use transfer_core::{
    DoneFlag, EngineAddress, LocalRegion, Notify, ProgressMode, RemoteRegion, RemoteTarget,
    TransferEngine,
};

use crate::backend::{BackendOpts, GUARD};
use crate::error::{BenchError, Result, io, protocol};
use crate::proto::Channel;
use crate::workloads::signal::{self, wait_flags};

/// What every rank runs (the same for all).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Job {
    /// kv, weights or moe.
    pub workload: String,
    /// Ranks in the job.
    pub world: usize,
}

/// Coordinator -> rank.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ToRank {
    /// The job.
    Job(Job),
    /// Allocate for this params point (the workload's params as JSON); answer Ready.
    Setup(serde_json::Value),
    /// Per rank (index = rank): engine address and region descriptor; answer Connected.
    Peers(Vec<(Vec<u8>, Vec<u8>)>),
    /// Run iteration `it` (0 is the warm-up); answer Done.
    Go(u64),
    /// Send `bytes` over a plain TCP stream to `addr` (link probe); answer Done.
    ProbeSend {
        /// Where rank `to` listens.
        addr: String,
        /// Bytes.
        bytes: u64,
    },
    /// Listen for a probe; answer Probe with the address, then Done with the rate.
    ProbeRecv,
    /// End.
    Bye,
}

/// Rank -> coordinator.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum FromRank {
    /// First message: who this is.
    Hello {
        /// The rank.
        rank: usize,
    },
    /// Answer to Setup.
    Ready {
        /// Engine address bytes.
        addr: Vec<u8>,
        /// Region descriptor bytes.
        region: Vec<u8>,
    },
    /// Answer to Peers.
    Connected,
    /// Where the probe listener is.
    Probe(String),
    /// Answer to Go (this rank's measurements; empty when it measures nothing).
    Done(Vec<f64>),
    /// The rank failed.
    Error(String),
}

/// One other rank, as this rank's engine sees it.
pub struct Remote {
    /// Its engine address.
    pub addr: EngineAddress,
    /// Its region of this point.
    pub target: RemoteTarget,
}

/// What a rank's workload code gets.
pub struct Ctx {
    /// This rank's engine.
    pub engine: Arc<TransferEngine>,
    /// This rank.
    pub rank: usize,
    /// Ranks in the job.
    pub world: usize,
}

/// Immediate values (distinct per purpose; the low byte of a barrier's is the iteration).
pub mod imm {
    /// Barrier of phase `p` (0..16) of iteration `it`.
    pub fn barrier(p: u32, it: u64) -> u32 {
        0x0100_0000 | (p << 16) | (it & 0xFFFF) as u32
    }
    /// kv: request r, layer l.
    pub fn kv(r: u64, l: u64, layers: u64) -> u32 {
        0x0200_0000 | (r * layers + l) as u32
    }
    /// Acknowledgements (kv decode -> prefill, weights inference -> trainer 0).
    pub const ACK: u32 = 0x0300_0000;
    /// weights: trainer m's data.
    pub fn weights(m: usize) -> u32 {
        0x0400_0000 | m as u32
    }
    /// moe dispatch rows.
    pub const DISPATCH: u32 = 0x0500_0000;
    /// moe combine rows.
    pub const COMBINE: u32 = 0x0600_0000;
}

impl Ctx {
    /// Zero-byte immediate writes to every other rank, then waits for
    /// theirs: nobody leaves before everybody arrived.
    pub fn barrier(&self, peers: &[Option<Remote>], imm: u32) -> Result<()> {
        match self.barrier_then(peers, imm)? {
            Some(flag) => wait_flags(&self.engine, &[flag]),
            None => Ok(()),
        }
    }

    /// [`Ctx::barrier`] that leaves its own writes' completion to the
    /// caller (returned, to wait with its other flags once the timed part
    /// is over; `None` without peers). Everybody arrived when it returns; waiting for our own
    /// notices to complete as well made the rank that arrived last leave
    /// a round trip after the others (moe T=1: ranks left the barrier a
    /// median 51-68 us apart, as long as Open MPI's whole dispatch).
    pub fn barrier_then(
        &self,
        peers: &[Option<Remote>],
        imm: u32,
    ) -> Result<Option<Arc<DoneFlag>>> {
        let targets: Vec<RemoteTarget> = peers.iter().flatten().map(|p| p.target.clone()).collect();
        if targets.is_empty() {
            return Ok(None);
        }
        let flag = DoneFlag::new();
        self.engine
            .submit_barrier(&targets, imm, Notify::Flag(flag.clone()))?;
        // Blocking, not yielding: a yielding waiter takes the cores from
        // the workers of the ranks that have yet to arrive.
        signal::wait_imms(
            &self.engine,
            imm,
            targets.len() as u64,
            Instant::now() + GUARD,
            "a rank at the barrier",
        )?;
        Ok(Some(flag))
    }

    /// Blocks until `n` immediates `imm` arrived, consuming them.
    pub fn take_imms(&self, imm: u32, n: u64, what: &'static str) -> Result<()> {
        signal::wait_imms(&self.engine, imm, n, Instant::now() + GUARD, what)
    }

    /// A zero-byte write carrying `imm` to `to`.
    pub fn notify(&self, src: &LocalRegion, to: &RemoteTarget, imm: u32) -> Result<Arc<DoneFlag>> {
        let flag = DoneFlag::new();
        self.engine.submit_write(
            transfer_core::WriteRequest {
                src,
                src_offset: 0,
                dst: to,
                dst_offset: 0,
                len: 0,
                imm: Some(imm),
            },
            Notify::Flag(flag.clone()),
        )?;
        Ok(flag)
    }
}

/// A workload's rank side for one params point.
pub trait RankWork {
    /// This rank's registered memory of the point (peers write into it).
    fn region(&self) -> &LocalRegion;
    /// Runs iteration `it`: fill, barrier, timed part, checks; returns
    /// this rank's measurements.
    fn iterate(&mut self, ctx: &Ctx, peers: &[Option<Remote>], it: u64) -> Result<Vec<f64>>;
}

/// Opens a workload's rank side for one params point.
pub type Setup = fn(&Ctx, &serde_json::Value) -> Result<Box<dyn RankWork>>;

/// The rank process: connects to the coordinator at `coord`, runs what it is told.
pub fn rank_main(
    coord: &str,
    rank: usize,
    opts: &BackendOpts,
    setup_of: fn(&str) -> Option<Setup>,
) -> Result<()> {
    let stream = connect_retry(coord, Duration::from_secs(30))?;
    stream
        .set_read_timeout(Some(GUARD))
        .map_err(io("workloads rank: set_read_timeout"))?;
    let mut chan = Channel::new(stream)?;
    chan.send(&FromRank::Hello { rank })?;
    let result = rank_loop(&mut chan, rank, opts, setup_of);
    if let Err(e) = &result {
        let _ = chan.send(&FromRank::Error(format!("rank {rank}: {e}")));
    }
    result
}

fn rank_loop(
    chan: &mut Channel,
    rank: usize,
    opts: &BackendOpts,
    setup_of: fn(&str) -> Option<Setup>,
) -> Result<()> {
    let Some(ToRank::Job(job)) = chan.recv::<ToRank>()? else {
        return Err(protocol("workloads rank", "expected the job"));
    };
    let setup = setup_of(&job.workload)
        .ok_or_else(|| BenchError::Usage(format!("unknown workload {:?}", job.workload)))?;
    // Before the engine: its threads inherit the binding.
    let bound = crate::workloads::pin::pin_rank(rank, job.world);
    let mode = signal::progress_mode(opts)?;
    if bound.is_some() && mode == ProgressMode::Caller {
        crate::workloads::pin::no_wakeup_preemption();
    }
    let ctx = Ctx {
        engine: Arc::new(
            opts.backend()?
                .engine_with(|b| b.idle_policy(crate::backend::idle_policy()).progress(mode))?,
        ),
        rank,
        world: job.world,
    };
    let mut work: Option<Box<dyn RankWork>> = None;
    let mut peers: Vec<Option<Remote>> = Vec::new();
    while let Some(msg) = chan.recv::<ToRank>()? {
        match msg {
            ToRank::Job(_) => return Err(protocol("workloads rank", "a second job")),
            ToRank::Setup(params) => {
                peers.clear();
                if let Some(old) = work.take() {
                    let _ = ctx.engine.unregister(old.region());
                }
                let w = setup(&ctx, &params)?;
                chan.send(&FromRank::Ready {
                    addr: ctx.engine.address().to_bytes()?,
                    region: w.region().remote().to_bytes()?,
                })?;
                work = Some(w);
            }
            ToRank::Peers(list) => {
                if list.len() != ctx.world {
                    return Err(protocol("workloads rank", "peer list of the wrong length"));
                }
                peers.clear();
                for (i, (addr, region)) in list.iter().enumerate() {
                    if i == rank {
                        peers.push(None);
                        continue;
                    }
                    let addr = EngineAddress::from_bytes(addr)?;
                    let peer = ctx.engine.peer(&addr)?;
                    let target = ctx
                        .engine
                        .remote(&peer, RemoteRegion::from_bytes(region)?)?;
                    peers.push(Some(Remote { addr, target }));
                }
                chan.send(&FromRank::Connected)?;
            }
            ToRank::Go(it) => {
                let w = work
                    .as_mut()
                    .ok_or_else(|| protocol("workloads rank", "Go before Setup"))?;
                let values = w.iterate(&ctx, &peers, it)?;
                chan.send(&FromRank::Done(values))?;
            }
            ToRank::ProbeRecv => {
                let ip = opts.bind.clone().unwrap_or_else(|| "127.0.0.1".into());
                let l = TcpListener::bind((ip.as_str(), 0)).map_err(io("link probe: bind"))?;
                let a = l.local_addr().map_err(io("link probe: local_addr"))?;
                chan.send(&FromRank::Probe(a.to_string()))?;
                let rate = crate::workloads::bound::probe_recv(&l)?;
                chan.send(&FromRank::Done(vec![rate]))?;
            }
            ToRank::ProbeSend { addr, bytes } => {
                crate::workloads::bound::probe_send(&addr, bytes)?;
                chan.send(&FromRank::Done(Vec::new()))?;
            }
            ToRank::Bye => return Ok(()),
        }
    }
    Ok(())
}

fn connect_retry(addr: &str, within: Duration) -> Result<TcpStream> {
    let deadline = Instant::now() + within;
    loop {
        let target = addr
            .to_socket_addrs()
            .map_err(io("workloads rank: resolve the coordinator"))?
            .next()
            .ok_or_else(|| BenchError::Usage(format!("{addr} resolves to nothing")))?;
        match TcpStream::connect_timeout(&target, Duration::from_secs(2)) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() > deadline => {
                return Err(io("workloads rank: connect to the coordinator")(e));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Kills the rank process on every exit path.
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// Where one rank runs: this machine's loopback, or a network namespace with its address.
#[derive(Debug, Clone, Default)]
pub struct Place {
    /// `ip netns exec` this namespace (None: here).
    pub netns: Option<String>,
    /// The rank's bind address (None: loopback).
    pub ip: Option<String>,
}

/// The coordinator's connections to every rank (index = rank).
pub struct Ranks {
    chans: Vec<Channel>,
    _children: Vec<ChildGuard>,
}

impl Ranks {
    /// Spawns `places.len()` rank processes of this executable and accepts them.
    pub fn spawn(opts: &BackendOpts, places: &[Place], listen_ip: &str) -> Result<Self> {
        let listener =
            TcpListener::bind((listen_ip, 0)).map_err(io("workloads: bind the coordinator"))?;
        let addr = listener
            .local_addr()
            .map_err(io("workloads: coordinator address"))?
            .to_string();
        let exe = std::env::current_exe().map_err(io("current_exe"))?;
        let mut children = Vec::new();
        for (rank, place) in places.iter().enumerate() {
            let mut cmd = match &place.netns {
                Some(ns) => {
                    let mut c = Command::new("ip");
                    c.args(["netns", "exec", ns]).arg(&exe);
                    c
                }
                None => Command::new(&exe),
            };
            cmd.args([
                "workloads",
                "rank",
                "--coord",
                &addr,
                "--rank",
                &rank.to_string(),
            ])
            .args(["--nics", &opts.nics.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit());
            let explicit = [
                ("--backend", &opts.backend),
                ("--provider", &opts.provider),
                ("--verbs-device", &opts.verbs_device),
                ("--bind", &place.ip),
            ];
            for (flag, value) in explicit {
                if let Some(v) = value {
                    cmd.args([flag, v]);
                }
            }
            children.push(ChildGuard(
                cmd.spawn().map_err(io("workloads: spawn a rank"))?,
            ));
        }
        let chans = accept_ranks(
            &listener,
            places.len(),
            Duration::from_secs(60),
            &mut children,
        )?;
        Ok(Self {
            chans,
            _children: children,
        })
    }

    /// Ranks that connected on their own (launched jobs), in rank order.
    pub fn accepted(listener: &TcpListener, world: usize, within: Duration) -> Result<Self> {
        Ok(Self {
            chans: accept_ranks(listener, world, within, &mut Vec::new())?,
            _children: Vec::new(),
        })
    }

    /// Ranks.
    pub fn world(&self) -> usize {
        self.chans.len()
    }

    /// Sends `msg` to every rank.
    pub fn broadcast(&mut self, msg: &ToRank) -> Result<()> {
        self.chans.iter_mut().try_for_each(|c| c.send(msg))
    }

    /// Sends to one rank.
    pub fn send(&mut self, rank: usize, msg: &ToRank) -> Result<()> {
        self.chans
            .get_mut(rank)
            .ok_or_else(|| protocol("workloads", format!("no rank {rank}")))?
            .send(msg)
    }

    /// One message from `rank` (its Error turned into an error).
    pub fn recv(&mut self, rank: usize) -> Result<FromRank> {
        let chan = self
            .chans
            .get_mut(rank)
            .ok_or_else(|| protocol("workloads", format!("no rank {rank}")))?;
        match chan.recv::<FromRank>()? {
            Some(FromRank::Error(e)) => Err(protocol("workloads rank", e)),
            Some(m) => Ok(m),
            None => Err(protocol("workloads", format!("rank {rank} left"))),
        }
    }

    /// One message from every rank, in rank order.
    pub fn gather(&mut self) -> Result<Vec<FromRank>> {
        (0..self.world()).map(|r| self.recv(r)).collect()
    }

    /// Ends every rank.
    pub fn bye(&mut self) {
        let _ = self.broadcast(&ToRank::Bye);
        for c in &mut self._children {
            let deadline = Instant::now() + Duration::from_secs(10);
            while let Ok(None) = c.0.try_wait() {
                if Instant::now() > deadline {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

fn accept_ranks(
    listener: &TcpListener,
    world: usize,
    within: Duration,
    children: &mut [ChildGuard],
) -> Result<Vec<Channel>> {
    listener
        .set_nonblocking(true)
        .map_err(io("workloads: listener nonblocking"))?;
    let deadline = Instant::now() + within;
    let mut slots: Vec<Option<Channel>> = (0..world).map(|_| None).collect();
    let mut got = 0;
    while got < world {
        for c in children.iter_mut() {
            if let Ok(Some(status)) = c.0.try_wait() {
                return Err(BenchError::Usage(format!(
                    "a rank exited early with {status}"
                )));
            }
        }
        match listener.accept() {
            Ok((stream, _)) => {
                stream
                    .set_nonblocking(false)
                    .map_err(io("workloads: stream blocking"))?;
                stream
                    .set_read_timeout(Some(GUARD))
                    .map_err(io("workloads: set_read_timeout"))?;
                let mut chan = Channel::new(stream)?;
                let Some(FromRank::Hello { rank }) = chan.recv::<FromRank>()? else {
                    return Err(protocol("workloads", "a rank did not say hello"));
                };
                let slot = slots
                    .get_mut(rank)
                    .ok_or_else(|| protocol("workloads", format!("rank {rank} of {world}")))?;
                if slot.is_some() {
                    return Err(protocol("workloads", format!("rank {rank} twice")));
                }
                *slot = Some(chan);
                got += 1;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err(protocol(
                        "workloads",
                        format!("{got} of {world} ranks connected"),
                    ));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(io("workloads: accept")(e)),
        }
    }
    Ok(slots.into_iter().flatten().collect())
}
