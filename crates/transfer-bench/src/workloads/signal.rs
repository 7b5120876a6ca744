//! The receiver's "it has landed" signal and the workloads' other waits.
//!
//! On the host, a receiver blocks on the engine's own expectation
//! ([`TransferEngine::imm_future`]): the worker that counts the last
//! immediate wakes the waiting thread directly. The GPU form instead arms
//! transfer-cuda's `set_flag_on_imm` with a `GpuFlag` (GDRCopy or
//! host-mapped memory) and lets a kernel poll it; not built here (no GPU on
//! this machine). An earlier host form armed `set_flag_on_imm` with a host
//! flag and polled it with `yield_now`: each arrival then went worker ->
//! callback thread -> polling thread, and the 2-6 polling threads of the
//! ranks took the cores from the engine workers that had to move the bytes
//! (figures at [`progress_mode`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use transfer_core::{DoneFlag, ImmFuture, ProgressMode, TransferEngine};

use crate::backend::{BackendOpts, GUARD};
use crate::error::{Result, protocol};

/// Wakes the thread that blocks in [`block_on`].
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// How long a caller-driven wait yields on every idle round before it
/// naps instead ([`idle_round`]).
const YIELD_FOR: Duration = Duration::from_micros(50);

/// One nap of a caller-driven wait past [`YIELD_FOR`] (the thread's timer
/// slack is set to 1 µs at its first nap, so it lasts about this long).
const NAP: Duration = Duration::from_micros(20);

/// One idle round of a caller-driven wait that began at `since`: the core
/// is given away, by `sched_yield` for the first [`YIELD_FOR`], then by a
/// short sleep.
///
/// Why not yield throughout (Open MPI's way when oversubscribed): on this
/// machine's kernel (6.18, EEVDF) a rank that yields on every idle round
/// keeps its core. Traced (moe E=4 T=1 shm, per-poll timestamps): waiting
/// ranks polled every ~7 µs for 0.7-1.5 ms while the rank that had the
/// data to process, or the one the coordinator had just woken, went
/// 160-1500 µs without a core. Measured interleaved with Open MPI
/// (`workloads run --workload moe --provider shm`, 4 rounds of 40
/// repeats, load 15-17 on 2 cores from other jobs; medians of the rounds'
/// medians, yield-only -> yield 50 µs then 20 µs naps, Open MPI):
/// T=8 dispatch 6144 -> 2018 us (2052), combine 8334 -> 2508 us (4456);
/// T=1 dispatch 823 -> 387 us (80), combine 480 -> 446 us (190).
fn idle_round(since: Instant) {
    if since.elapsed() < YIELD_FOR {
        std::thread::yield_now();
        return;
    }
    thread_local! {
        // Timer slack is per thread: set once on each thread that naps.
        static SLACK: () = {
            // SAFETY: PR_SET_TIMERSLACK takes a plain integer (nanoseconds)
            // and only changes this thread's timer slack; a failure leaves
            // the default slack (50 µs), i.e. longer naps.
            unsafe {
                libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong);
            }
        };
    }
    SLACK.with(|()| ());
    std::thread::sleep(NAP);
}

/// Blocks this thread (parked, not spinning) until `f` resolves or
/// `deadline` passes (`None`).
///
/// With caller-driven progress (`caller`) each poll drives the NICs and
/// the future wakes itself (a busy poll, as MPI's waits are) and every
/// idle round gives the core away ([`idle_round`]): a shm write moves only
/// while its target polls, so 4-6 ranks on 2 cores must take turns
/// quickly. Yielding every 64th idle round instead left moe E=4 T=1 ranks
/// ~180 µs apart (a staircase 20/400/580/770 µs over the 4 ranks, shm,
/// load ~5); every round: 80/200/230/300 µs. With worker threads the
/// worker that counts the last immediate unparks this thread.
fn block_on<F: Future + Unpin>(f: &mut F, deadline: Instant, caller: bool) -> Option<F::Output> {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let since = Instant::now();
    loop {
        if let Poll::Ready(v) = Pin::new(&mut *f).poll(&mut cx) {
            return Some(v);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        if caller {
            idle_round(since);
        } else {
            std::thread::yield_now();
        }
        std::thread::park_timeout(deadline - now);
    }
}

/// One armed counter: met once `count` immediates `imm` arrived.
pub struct Armed {
    fut: ImmFuture,
    what: &'static str,
    caller: bool,
}

/// Arms a counter on `engine`: met once `count` immediates `imm` have
/// arrived (consumed, as expectations are; arrivals before the arming are
/// held by the engine and count).
pub fn arm(engine: &TransferEngine, imm: u32, count: u64, what: &'static str) -> Armed {
    Armed {
        fut: engine.imm_future(imm, count),
        what,
        caller: engine.progress_mode() == ProgressMode::Caller,
    }
}

impl Armed {
    /// Blocks until the counter reached its target or `deadline` passed.
    pub fn wait(&mut self, deadline: Instant) -> Result<()> {
        if self.wait_until(deadline)? {
            Ok(())
        } else {
            Err(protocol(
                "workloads: wait",
                format!("{} never arrived", self.what),
            ))
        }
    }

    /// Blocks until the counter reached its target (true) or `deadline`
    /// passed (false: still armed, wait again).
    pub fn wait_until(&mut self, deadline: Instant) -> Result<bool> {
        match block_on(&mut self.fut, deadline, self.caller) {
            Some(r) => r.map(|()| true).map_err(Into::into),
            None => Ok(false),
        }
    }
}

/// Waits until `n` immediates `imm` arrived (blocking), consuming them.
pub fn wait_imms(
    engine: &TransferEngine,
    imm: u32,
    n: u64,
    deadline: Instant,
    what: &'static str,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    arm(engine, imm, n, what).wait(deadline)
}

/// Waits for local completions. Caller-driven: drives the engine (nothing
/// else does), giving the core away on every idle pass ([`idle_round`]).
/// Worker threads: a few yields, then sleeps growing to 200 µs, so the waiter does not take the cores from the
/// workers that still move bytes (only buffer reuse waits on these; no
/// metric ends here).
pub fn wait_flags(engine: &TransferEngine, flags: &[Arc<DoneFlag>]) -> Result<()> {
    let deadline = Instant::now() + GUARD;
    let caller = engine.progress_mode() == ProgressMode::Caller;
    let since = Instant::now();
    for f in flags {
        let mut nap = Duration::from_micros(5);
        let mut rounds = 0u32;
        while !f.is_done() {
            if Instant::now() > deadline {
                return Err(protocol("workloads: wait", "completion never arrived"));
            }
            rounds = rounds.wrapping_add(1);
            if caller {
                if !engine.progress() {
                    idle_round(since);
                }
            } else if rounds < 16 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(nap);
                nap = (nap * 2).min(Duration::from_micros(200));
            }
        }
        f.result().unwrap_or(Ok(()))?;
    }
    Ok(())
}

/// How the workloads' engines make progress: caller-driven on shm, worker
/// threads elsewhere; `TRANSFER_WORKLOADS_PROGRESS=thread|caller` forces one
/// (for comparison).
///
/// Measured with both, interleaved with Open MPI (`--quick`, release,
/// 2 cores, load 4-5): on shm caller-driven progress took kv's
/// time-to-last-layer from 6.4 ms to 0.79 ms (kv_gbps 1.7 -> 2.3) and moe
/// T=1 dispatch from 250-660 µs to 300-350 µs; libfabric's shm moves a
/// write only while its target polls, and with worker threads every
/// arrival crossed worker -> waiter on cores shared by 4-6 ranks. On tcp
/// it made things worse (kv ttll 27 -> 73 ms, moe T=32 dispatch 10 -> 19
/// ms): the sockets then drain only while a rank is inside a wait, while
/// the worker keeps them moving in the background. Again across two
/// namespace hosts on a 1 Gbit/s tbf link (kv --quick, debug, load 8-11,
/// interleaved): ours/bound 0.45-0.65 with worker threads, 0.28-0.34
/// caller-driven. A caller-driven wait naps 20 µs between rounds that
/// report no event, and a target's pass that only places bytes reports
/// none; not restarting the nap clock after busy rounds lifted loopback
/// tcp only from 0.16-0.18 to 0.20-0.22 GB/s (threads 0.32-0.67, load ~8).
pub fn progress_mode(opts: &BackendOpts) -> Result<ProgressMode> {
    Ok(
        match std::env::var("TRANSFER_WORKLOADS_PROGRESS").as_deref() {
            Ok("thread") => ProgressMode::Thread,
            Ok("caller") => ProgressMode::Caller,
            _ if opts.provider()?.starts_with("shm") => ProgressMode::Caller,
            _ => ProgressMode::Thread,
        },
    )
}
