//! The latency rows with caller-driven progress ([`ProgressMode::Caller`]):
//! one more engine on each side, driven only by the thread that measures
//! (driver) or echoes (server), as `fi_pingpong` drives its endpoint. The
//! worker-thread rows next to them show what the thread hand-offs cost.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Instant;

use indicatif::ProgressBar;
use transfer_core::{
    DoneFlag, EngineAddress, LocalRegion, Notify, Peer, ProgressMode, RemoteRegion, RemoteTarget,
    TransferEngine, WriteRequest,
};

use crate::backend::{BackendOpts, GUARD, idle_policy};
use crate::driver::Driver;
use crate::error::{BenchError, Result, protocol};
use crate::plan::{Plan, human_size};
use crate::proto::{Request, Response};
use crate::results::{Metric, Row};
use crate::sweeps::{fig, lat_fig};
use crate::verify::checksum;

/// Receive buffers of the caller-driven engines (one message in flight).
const RECV_BUFFERS: usize = 8;
const RECV_LEN: usize = 64 * 1024;

/// One side's caller-driven engine.
pub struct CallerSide {
    /// The engine (shared with its receive callback, weakly).
    pub engine: Arc<TransferEngine>,
    /// Its region: the source of replies, the target of the peer's writes.
    pub region: LocalRegion,
    /// Messages received.
    pub recv_count: Arc<AtomicU64>,
    /// Checksum of the last message received.
    pub recv_sum: Arc<AtomicU64>,
    /// Where received messages are echoed to (server side), once known.
    echo_to: Arc<Mutex<Option<Peer>>>,
}

impl CallerSide {
    /// Opens a caller-driven engine over `opts`' provider. `echo`: echo
    /// every received message back to the peer set by [`Self::set_peer`].
    pub fn open(opts: &BackendOpts, echo: bool) -> Result<Self> {
        let engine = Arc::new(
            opts.backend()?
                .engine_with(|b| b.idle_policy(idle_policy()).progress(ProgressMode::Caller))?,
        );
        let region = engine.alloc_host(4096, 0)?;
        let recv_count = Arc::new(AtomicU64::new(0));
        let recv_sum = Arc::new(AtomicU64::new(0));
        let echo_to: Arc<Mutex<Option<Peer>>> = Arc::default();
        let (c, sum, to) = (recv_count.clone(), recv_sum.clone(), echo_to.clone());
        let weak: Weak<TransferEngine> = Arc::downgrade(&engine);
        // Runs inside `progress` on the measuring thread: no thread hop.
        engine.start_recv_pool(RECV_BUFFERS, RECV_LEN, move |bytes| {
            sum.store(checksum(bytes), Ordering::Release);
            c.fetch_add(1, Ordering::Release);
            if !echo {
                return;
            }
            let peer = to.lock().unwrap_or_else(PoisonError::into_inner).clone();
            if let (Some(e), Some(p)) = (weak.upgrade(), peer) {
                // A failed echo shows on the driver as a missing reply.
                let _ = e.submit_send(&p, bytes, Notify::callback(|_| {}));
            }
        })?;
        Ok(Self {
            engine,
            region,
            recv_count,
            recv_sum,
            echo_to,
        })
    }

    /// Address and region descriptor, for the Hello exchange.
    pub fn describe(&self) -> Result<(Vec<u8>, Vec<u8>)> {
        Ok((
            self.engine.address().to_bytes()?,
            self.region.remote().to_bytes()?,
        ))
    }

    /// The peer's caller-driven engine from its Hello bytes: the target of
    /// writes, and where messages are echoed.
    pub fn set_peer(&self, addr: &[u8], region: &[u8]) -> Result<RemoteTarget> {
        let peer = self.engine.peer(&EngineAddress::from_bytes(addr)?)?;
        let target = self
            .engine
            .remote(&peer, RemoteRegion::from_bytes(region)?)?;
        *self.echo_to.lock().unwrap_or_else(PoisonError::into_inner) = Some(peer);
        Ok(target)
    }

    /// Polls `done` with progress until it holds or the guard passes.
    fn drive_until(&self, what: &str, mut done: impl FnMut() -> bool) -> Result<()> {
        let deadline = Instant::now() + GUARD;
        while !done() {
            self.engine.progress();
            if Instant::now() > deadline {
                return Err(protocol("caller progress", format!("{what} never came")));
            }
        }
        Ok(())
    }

    fn zero_byte(&self, to: &RemoteTarget, imm: u32, flag: &Arc<DoneFlag>) -> Result<()> {
        self.engine.submit_write(
            WriteRequest {
                src: &self.region,
                src_offset: 0,
                dst: to,
                dst_offset: 0,
                len: 0,
                imm: Some(imm),
            },
            Notify::Flag(flag.clone()),
        )?;
        Ok(())
    }
}

/// Where the driver's 8 B writes land in the server's region.
pub const WRITE_OFFSET: usize = 64;

/// Server side of [`Request::CallerServe`]: echoes immediates and messages
/// on this thread until `stop_imm` arrives; returns the checksum of the 8
/// bytes the driver's timed writes put at [`WRITE_OFFSET`].
pub fn serve_phase(
    side: &CallerSide,
    reply: &RemoteTarget,
    imm: u32,
    reply_imm: u32,
    stop_imm: u32,
) -> Result<u64> {
    // A whole phase is a few thousand round trips; the guard only ends a
    // phase whose driver vanished.
    let deadline = Instant::now() + GUARD;
    let mut flags = Vec::new();
    loop {
        side.engine.progress();
        if side.engine.take_imm(imm, 1) == 1 {
            let flag = DoneFlag::new();
            side.zero_byte(reply, reply_imm, &flag)?;
            flags.push(flag);
        }
        if side.engine.take_imm(stop_imm, 1) == 1 {
            break;
        }
        if Instant::now() > deadline {
            return Err(protocol("caller serve", "the driver never ended the phase"));
        }
    }
    for f in &flags {
        side.drive_until("a reply completion", || f.is_done())?;
        f.result().unwrap_or(Ok(()))?;
    }
    let mut landed = [0u8; 8];
    side.region.read_at(WRITE_OFFSET, &mut landed)?;
    Ok(checksum(&landed))
}

/// The caller-progress latency rows: 0-byte immediate ping-pong, 8 B write
/// completion, 64 B send/recv round trip, each next to its baseline.
pub fn caller_latency(d: &mut Driver, plan: &Plan, pb: &ProgressBar) -> Result<Vec<Row>> {
    let Some(side) = d.caller.take() else {
        return Ok(Vec::new());
    };
    let result = measure(d, &side, plan, pb);
    d.caller = Some(side);
    result
}

fn measure(d: &mut Driver, side: &CallerDriver, plan: &Plan, pb: &ProgressBar) -> Result<Vec<Row>> {
    pb.set_message("latency, caller-driven progress");
    // Baselines first: the server's session thread is busy during the phase.
    // The raw sink polls without pause, as the server's caller-driven
    // engine does during the phase.
    let raw8 = d.raw_point("write_lat", 8, plan.lat_iters, 1, None, true)?;
    let pp0 = crate::sweeps::fi_pingpong(d, 1, plan.pingpong_iters);
    let pp64 = crate::sweeps::fi_pingpong(d, 64, plan.pingpong_iters);
    let (imm, reply, stop) = (d.imm(), d.imm(), d.imm());
    let chan = &mut d
        .servers
        .first_mut()
        .ok_or_else(|| protocol("caller", "no server"))?
        .chan;
    chan.send(&Request::CallerServe {
        imm,
        reply_imm: reply,
        stop_imm: stop,
    })?;
    let (s, to) = (&side.side, &side.target);
    let mut rows = Vec::new();

    // Zero-byte immediate ping-pong.
    let mut samples = Vec::with_capacity(plan.pingpong_iters);
    let mut flags = Vec::with_capacity(plan.pingpong_iters);
    for _ in 0..plan.pingpong_iters {
        let flag = DoneFlag::new();
        let t0 = Instant::now();
        s.zero_byte(to, imm, &flag)?;
        s.drive_until("the echoed immediate", || s.engine.take_imm(reply, 1) == 1)?;
        samples.push(t0.elapsed());
        flags.push(flag);
    }
    for f in &flags {
        s.drive_until("a completion", || f.is_done())?;
        f.result().unwrap_or(Ok(()))?;
    }
    let mut row = Row::new(
        "imm_pingpong",
        "0 B + imm RTT, caller".into(),
        0,
        Metric::Latency,
        lat_fig(&samples),
    )
    .no_data()
    .with_target("<= 1.2");
    if let Some(pp) = &pp0 {
        row = row.with_baseline("fi_pingpong 1 B RTT", fig(pp.rtt_us));
    }
    rows.push(row);
    pb.inc(1);

    // 8 B write, submit to completion; the last one's bytes are checked.
    let seed = u8::try_from(imm & 0x7F).unwrap_or(1);
    let payload: Vec<u8> = (0..8u8).map(|i| i.wrapping_mul(37) ^ seed).collect();
    s.region.write_at(0, &payload)?;
    let mut samples = Vec::with_capacity(plan.lat_iters);
    for _ in 0..plan.lat_iters {
        let flag = DoneFlag::new();
        let t0 = Instant::now();
        s.engine.submit_write(
            WriteRequest {
                src: &s.region,
                src_offset: 0,
                dst: to,
                dst_offset: WRITE_OFFSET as u64,
                len: 8,
                imm: None,
            },
            Notify::Flag(flag.clone()),
        )?;
        s.drive_until("a write completion", || flag.is_done())?;
        samples.push(t0.elapsed());
        flag.result().unwrap_or(Ok(()))?;
    }
    rows.push(
        Row::new(
            "write_lat",
            "8 B, caller".into(),
            8,
            Metric::Latency,
            lat_fig(&samples),
        )
        .with_baseline("raw provider loop", lat_fig(&raw8.samples))
        .with_target("<= 1.3"),
    );
    pb.inc(1);

    // 64 B send / echo / receive.
    let msg: Vec<u8> = (0..64u8).map(|i| i ^ 0x5A).collect();
    let want = checksum(&msg);
    let mut samples = Vec::with_capacity(plan.pingpong_iters);
    for _ in 0..plan.pingpong_iters {
        let before = s.recv_count.load(Ordering::Acquire);
        let flag = DoneFlag::new();
        let t0 = Instant::now();
        s.engine
            .submit_send(&to.peer().clone(), &msg, Notify::Flag(flag.clone()))?;
        s.drive_until("the echoed message", || {
            s.recv_count.load(Ordering::Acquire) != before
        })?;
        samples.push(t0.elapsed());
        s.drive_until("a send completion", || flag.is_done())?;
        if s.recv_sum.load(Ordering::Acquire) != want {
            return Err(BenchError::Verify {
                sweep: "send_recv".into(),
                detail: "echoed message differs".into(),
            });
        }
    }
    let mut row = Row::new(
        "send_recv",
        format!("{} RTT, caller", human_size(64)),
        64,
        Metric::Latency,
        lat_fig(&samples),
    )
    .verified()
    .with_target("<= 1.3");
    if let Some(pp) = &pp64 {
        row = row.with_baseline("fi_pingpong RTT", fig(pp.rtt_us));
    }
    rows.push(row);
    pb.inc(1);

    // End the phase; the server checks its reply completions.
    let flag = DoneFlag::new();
    s.zero_byte(to, stop, &flag)?;
    s.drive_until("the stop write's completion", || flag.is_done())?;
    let chan = &mut d
        .servers
        .first_mut()
        .ok_or_else(|| protocol("caller", "no server"))?
        .chan;
    // The timed 8 B writes landed: the server's region holds their bytes
    // (a pattern no earlier write put there).
    match chan.recv::<Response>()? {
        Some(Response::Checksum(c)) if c == checksum(&payload) => {}
        Some(Response::Checksum(_)) => {
            return Err(BenchError::Verify {
                sweep: "write_lat".into(),
                detail: "the caller-driven 8 B writes did not land".into(),
            });
        }
        other => return Err(protocol("caller serve", format!("unexpected {other:?}"))),
    }
    if let Some(r) = rows.iter_mut().find(|r| r.sweep == "write_lat") {
        r.verified = true;
    }
    Ok(rows)
}

/// The driver's caller-driven engine and the server's, as a target.
pub struct CallerDriver {
    /// This side.
    pub side: CallerSide,
    /// The server's caller-driven engine and region.
    pub target: RemoteTarget,
}
