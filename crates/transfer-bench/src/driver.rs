//! The `run` role: connects to servers and holds what the sweeps share.

use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use transfer::AnyDomain;
use transfer_core::{
    Domain, EngineAddress, LocalRegion, MemoryLocation, MemorySpan, PeerId, RemoteRegion,
    RemoteTarget, TransferEngine,
    rawloop::{RawParams, RawPath, RawRun},
};

use crate::backend::{BackendOpts, GUARD};
use crate::caller::{CallerDriver, CallerSide};
use crate::error::{BenchError, Result, io, protocol};
use crate::plan::Plan;
use crate::proto::{Channel, Request, Response};
use crate::verify::{checksum, fill};

/// One connected server.
pub struct ServerConn {
    /// Its side channel.
    pub chan: Channel,
    /// One target per server engine.
    pub targets: Vec<RemoteTarget>,
}

/// A target anywhere in the run: (server index, engine index, target).
pub type AnyTarget = (usize, usize, RemoteTarget);

/// The driver's state.
pub struct Driver {
    /// The engine under test.
    pub engine: Arc<TransferEngine>,
    /// Source region, filled with a known pattern.
    pub src: LocalRegion,
    /// A copy of the pattern (to compute expected checksums).
    pub pattern: Vec<u8>,
    /// Connected servers.
    pub servers: Vec<ServerConn>,
    /// Messages received back (send/recv round trip).
    pub recv_count: Arc<AtomicU64>,
    /// Checksum of the last message received back.
    pub recv_sum: Arc<AtomicU64>,
    /// Provider name.
    pub provider: String,
    /// Backend options (for the raw baseline's bare domain).
    pub opts: BackendOpts,
    /// The caller-driven engine pair with server 0 (latency rows), when
    /// both sides could open one.
    pub caller: Option<CallerDriver>,
    next_imm: u32,
    pattern_seed: u64,
}

/// The raw baseline's bare domain and the sink it writes to.
pub struct RawSetup {
    domain: AnyDomain,
    peer: PeerId,
    mr: transfer_core::DomainMr,
    base: u64,
    key: u64,
}

impl Driver {
    /// Connects to every server address and exchanges engine addresses.
    pub fn connect(peers: &[String], opts: &BackendOpts, plan: &Plan) -> Result<Self> {
        let engine = Arc::new(opts.engine()?);
        let len = usize::try_from(plan.region_len)
            .map_err(|_| BenchError::Usage("region too large".into()))?;
        let src = engine.alloc_host(len, 0)?;
        let mut pattern = vec![0u8; len];
        fill(&mut pattern, 0xB0B);
        src.write_at(0, &pattern)?;
        // Where servers write echo replies; the engine keeps it registered.
        let inbox = engine.alloc_host(4096, 0)?;
        let recv_count = Arc::new(AtomicU64::new(0));
        let recv_sum = Arc::new(AtomicU64::new(0));
        let (c, s) = (recv_count.clone(), recv_sum.clone());
        engine.start_recv_pool(64, 64 * 1024, move |bytes| {
            s.store(checksum(bytes), Ordering::Release);
            c.fetch_add(1, Ordering::Release);
        })?;
        let mut mine = match CallerSide::open(opts, false) {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("no caller-driven engine, its latency rows are left out: {e}");
                None
            }
        };
        let mut caller = None;
        let mut servers = Vec::new();
        let mut provider = String::new();
        for p in peers {
            let stream = connect_retry(p)?;
            let mut chan = Channel::new(stream)?;
            let hello = Request::Hello {
                driver_addr: engine.address().to_bytes()?,
                driver_region: inbox.remote().to_bytes()?,
                driver_caller: match (&mine, servers.is_empty()) {
                    (Some(c), true) => Some(c.describe()?),
                    _ => None,
                },
            };
            let Response::Engines {
                engines,
                provider: prov,
                caller: theirs,
            } = chan.call(&hello)?
            else {
                return Err(protocol("hello", "unexpected answer"));
            };
            if let (true, Some((addr, region))) = (servers.is_empty(), theirs) {
                if let Some(side) = mine.take() {
                    let target = side.set_peer(&addr, &region)?;
                    caller = Some(CallerDriver { side, target });
                }
            }
            provider = prov;
            let mut targets = Vec::new();
            for (addr, desc) in engines {
                let peer = engine.peer(&EngineAddress::from_bytes(&addr)?)?;
                targets.push(engine.remote(&peer, RemoteRegion::from_bytes(&desc)?)?);
            }
            servers.push(ServerConn { chan, targets });
        }
        if servers.is_empty() {
            return Err(BenchError::Usage("no server to run against".into()));
        }
        Ok(Self {
            engine,
            src,
            pattern,
            servers,
            recv_count,
            recv_sum,
            provider,
            opts: opts.clone(),
            caller,
            next_imm: 1,
            pattern_seed: 0xB0B,
        })
    }

    /// A fresh immediate value, so sweeps never see each other's arrivals.
    pub fn imm(&mut self) -> u32 {
        self.next_imm += 1;
        self.next_imm
    }

    /// Engine 0 of server 0: the point-to-point peer.
    pub fn first(&self) -> Result<RemoteTarget> {
        self.servers
            .first()
            .and_then(|s| s.targets.first())
            .cloned()
            .ok_or_else(|| protocol("run", "server has no engine"))
    }

    /// Every engine of every server.
    pub fn all_targets(&self) -> Vec<AnyTarget> {
        self.servers
            .iter()
            .enumerate()
            .flat_map(|(si, s)| {
                s.targets
                    .iter()
                    .enumerate()
                    .map(move |(ei, t)| (si, ei, t.clone()))
            })
            .collect()
    }

    /// Asks server `s` for the checksum of a range of its engine's region.
    pub fn remote_checksum(
        &mut self,
        s: usize,
        engine: usize,
        offset: u64,
        len: u64,
    ) -> Result<u64> {
        let chan = &mut self
            .servers
            .get_mut(s)
            .ok_or_else(|| protocol("checksum", "no server"))?
            .chan;
        match chan.call(&Request::Checksum {
            engine,
            offset,
            len,
        })? {
            Response::Checksum(c) => Ok(c),
            other => Err(protocol("checksum", format!("unexpected {other:?}"))),
        }
    }

    /// Gives `src[..len]` a pattern no earlier run used, so that verifying
    /// after a timed run proves the timed writes landed (a warm-up or an
    /// earlier point left the previous pattern at the destination).
    pub fn fresh_pattern(&mut self, len: u64) -> Result<()> {
        let len = (len as usize).min(self.pattern.len());
        self.pattern_seed = self.pattern_seed.wrapping_add(1);
        let seed = self.pattern_seed;
        let prefix = self
            .pattern
            .get_mut(..len)
            .ok_or_else(|| protocol("pattern", "length"))?;
        crate::verify::fill(prefix, seed);
        self.src.write_at(0, prefix)?;
        Ok(())
    }

    /// Checks that engine 0 of server 0 holds `src[0..len]` at offset 0.
    pub fn verify_prefix(&mut self, sweep: &str, len: u64) -> Result<()> {
        let want = checksum(&self.pattern[..len as usize]);
        let got = self.remote_checksum(0, 0, 0, len)?;
        if want != got {
            return Err(BenchError::Verify {
                sweep: sweep.into(),
                detail: format!("checksum of {len} bytes differs"),
            });
        }
        Ok(())
    }

    /// Waits on the server until `count` immediates `imm` reached each engine.
    pub fn remote_wait_imm(
        &mut self,
        s: usize,
        engines: Vec<usize>,
        imm: u32,
        count: u64,
    ) -> Result<()> {
        let chan = &mut self
            .servers
            .get_mut(s)
            .ok_or_else(|| protocol("wait", "no server"))?
            .chan;
        match chan.call(&Request::WaitImm {
            engines,
            imm,
            count,
        })? {
            Response::Done => Ok(()),
            other => Err(protocol("wait_imm", format!("unexpected {other:?}"))),
        }
    }

    /// Starts a raw sink on server 0 (`busy`: polled without pause, else
    /// driven like an engine's worker) and opens a bare local domain to it.
    pub fn raw_setup(&mut self, busy: bool) -> Result<RawSetup> {
        let len = self.src.len() as u64;
        let chan = &mut self
            .servers
            .get_mut(0)
            .ok_or_else(|| protocol("raw", "no server"))?
            .chan;
        let Response::RawSink { nic, base, key } = chan.call(&Request::RawStart { len, busy })?
        else {
            return Err(protocol("raw", "unexpected answer to RawStart"));
        };
        let mut domain = self.opts.bare_domain()?;
        let peer = domain.resolve_peer(&transfer_core::NicAddress(nic))?;
        let span = MemorySpan {
            ptr: self.src.as_ptr(),
            len: self.src.len(),
            location: MemoryLocation::Host,
            dmabuf_fd: None,
        };
        let mr = domain.register(span)?.mr;
        Ok(RawSetup {
            domain,
            peer,
            mr,
            base,
            key,
        })
    }

    /// Stops the raw sink and verifies it holds `src[0..verify_len]`.
    pub fn raw_finish(&mut self, mut raw: RawSetup, sweep: &str, verify_len: u64) -> Result<()> {
        let _ = raw.domain.unregister(raw.mr);
        drop(raw);
        let chan = &mut self
            .servers
            .get_mut(0)
            .ok_or_else(|| protocol("raw", "no server"))?
            .chan;
        let Response::Checksum(got) = chan.call(&Request::RawStop { len: verify_len })? else {
            return Err(protocol("raw", "unexpected answer to RawStop"));
        };
        if got != checksum(&self.pattern[..verify_len as usize]) {
            return Err(BenchError::Verify {
                sweep: format!("{sweep} (raw baseline)"),
                detail: "sink data differs".into(),
            });
        }
        Ok(())
    }

    /// Ends every session.
    pub fn bye(&mut self) {
        for s in &mut self.servers {
            let _ = s.chan.call(&Request::Bye);
        }
    }
}

impl Driver {
    /// One raw-baseline point: a fresh sink on server 0 (so no sink
    /// thread competes with the engine's measurements), driven as the
    /// engine's target of the same row is (`busy`: the caller-progress
    /// rows), one untimed warm-up write (a fresh domain's first write sets
    /// up its connection), `count` timed writes of `size` bytes with
    /// `window` in flight, then the sink's data verified.
    pub fn raw_point(
        &mut self,
        sweep: &str,
        size: usize,
        count: usize,
        window: usize,
        imm: Option<u32>,
        busy: bool,
    ) -> Result<RawRun> {
        let mut raw = self.raw_setup(busy)?;
        let src = self.src.clone();
        let params = RawParams {
            imm,
            limit: GUARD,
            ..RawParams::new(size, count, window)
        };
        let run = transfer_core::rawloop::run(&mut raw.path(&src), &params, || {});
        self.raw_finish(raw, sweep, if run.is_ok() { size as u64 } else { 0 })?;
        Ok(run?)
    }
}

impl RawSetup {
    /// The write path for [`transfer_core::rawloop::run`].
    pub fn path<'a>(&'a mut self, src: &LocalRegion) -> RawPath<'a, AnyDomain> {
        RawPath {
            domain: &mut self.domain,
            peer: self.peer,
            mr: self.mr,
            src: src.as_ptr(),
            base: self.base,
            key: self.key,
        }
    }
}

fn connect_retry(addr: &str) -> Result<TcpStream> {
    let mut last = None;
    for _ in 0..100 {
        match TcpStream::connect(addr) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(io("connect to server")(
        last.unwrap_or_else(|| std::io::Error::other("no attempt")),
    ))
}
